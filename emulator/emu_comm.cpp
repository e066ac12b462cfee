#include "emulator/emu_comm.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>

#include "core/errors.hpp"
#include "emulator/collectives/collectives.hpp"

namespace cocodiff::emu {

namespace {

std::uint64_t mix(std::uint64_t x) {  // splitmix64 finaliser
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace

detail::ReqPtr Port::isend(std::span<const float> data, std::int64_t count, int peer, int step) {
  return kernel.post_send(fiber, group.ctx, group.members[static_cast<size_t>(me)],
                          group.members[static_cast<size_t>(peer)],
                          detail::collective_tag(seq, step), data, count, label);
}

detail::ReqPtr Port::irecv(std::span<float> data, std::int64_t count, int peer, int step) {
  return kernel.post_recv(fiber, group.ctx, group.members[static_cast<size_t>(peer)],
                          group.members[static_cast<size_t>(me)], detail::collective_tag(seq, step),
                          data, count, label);
}

EmuComm::EmuComm(detail::Kernel& kernel, detail::FiberState& self, detail::Group group,
                 int group_rank)
    : kernel_(kernel),
      self_(self),
      group_(std::make_shared<const detail::Group>(std::move(group))),
      group_rank_(group_rank) {}

Replay::RegionMark EmuComm::begin_region(std::string_view key, bool may_skip) {
  spoil_tape();
  if (size() != kernel_.topology().num_ranks()) return {};
  return kernel_.begin_region(self_, key, may_skip);
}

Replay::RegionMark EmuComm::pass_region(std::string_view key, bool may_skip,
                                        std::string_view next) {
  spoil_tape();
  if (size() != kernel_.topology().num_ranks()) return {};
  return kernel_.pass_region(self_, key, may_skip, next);
}

Replay::RegionMark EmuComm::passed_answer() {
  if (size() != kernel_.topology().num_ranks()) return {};
  return kernel_.passed_answer(self_);
}

void EmuComm::begin_span(std::string_view key, bool may_skip, std::string_view next) {
  spoil_tape();
  if (size() != kernel_.topology().num_ranks()) return;
  kernel_.begin_span(self_, key, may_skip, next);
}

bool EmuComm::host_reference() const { return kernel_.device().host_reference(); }

void EmuComm::compute(const OpCost& cost) {
  if (self_.skipping) return;  // free inside a replayed span; no arrival at a span mark
  if (TapeCall* c = record(TapeCall::Kind::kCompute, 0, {})) {
    // Played as a charge of its device time: the same time and event as Kernel::compute's.
    c->dt = kernel_.device_time(cost);
    c->op_kind = cost.kind;
    c->kernel = cost.shape.kernel;
    c->label = cost.label.empty() ? op_kind_name(cost.kind) : kernel_.keep_label(cost.label);
  }
  kernel_.compute(self_, cost);
}

void EmuComm::run_math(const std::function<void()>& work) {
  spoil_tape();  // arithmetic on data: not a phantom call
  kernel_.run_math(self_, work);
}

bool EmuComm::skipped(std::span<const float> a, std::span<const float> b) {
  kernel_.arrive(self_);
  if (!self_.skipping) return false;
  spoil_tape();  // a region replayed from the arrival the call just made: its calls are not issued
  COCO_CHECK(a.empty() && b.empty(), "a call with data inside a replayed span");
  return true;
}

void EmuComm::spoil_tape() {
  if (self_.tape != nullptr) self_.tape->usable = false;
}

TapeCall* EmuComm::record(TapeCall::Kind kind, std::int64_t count, std::string_view label,
                          std::span<const float> a, std::span<const float> b) {
  EmuTape* t = self_.tape;
  if (t == nullptr) return nullptr;
  if (!a.empty() || !b.empty()) t->usable = false;  // data: a tape moves sizes only
  TapeCall& c = t->calls.emplace_back();
  c.kind = kind;
  c.comm = this;
  c.count = count;
  if (!label.empty()) c.label = kernel_.keep_label(label);
  return &c;
}

std::string_view EmuComm::call_text(std::string_view opening, std::int64_t count) {
  return kernel_.keep_label(std::string(opening) + "count=" + std::to_string(count) + ")");
}

bool EmuComm::begin_tape() {
  if (!kernel_.options().call_tapes || self_.skipping) return false;
  COCO_CHECK(self_.is_main && self_.tape == nullptr, "begin_tape: a tape is already recording");
  recording_ = std::make_unique<EmuTape>();
  self_.tape = recording_.get();
  return true;
}

std::unique_ptr<Replay::CallTape> EmuComm::end_tape() {
  if (recording_ == nullptr) return nullptr;  // nothing records (tapes off)
  COCO_CHECK(self_.tape == recording_.get(), "end_tape on a tape another call began");
  self_.tape = nullptr;
  std::unique_ptr<EmuTape> t = std::move(recording_);
  for (const char w : t->waited) t->usable = t->usable && w != 0;
  if (!t->usable) return nullptr;
  for (const TapeCall& c : t->calls) {
    if (c.kind == TapeCall::Kind::kAllReduce ||
        (c.kind == TapeCall::Kind::kRingPass && c.comm->size() == 1))
      t->engine_runs = false;
  }
  return t;
}

struct EmuComm::PlayRun final : detail::TapeRun {
  EmuComm& self;
  const EmuTape& tape;
  std::size_t pc = 0;
  std::vector<detail::ReqPtr> reqs;
  PlayRun(EmuComm& s, const EmuTape& t) : self(s), tape(t), reqs(static_cast<size_t>(t.requests)) {}
  bool advance() override { return self.issue_calls(tape, pc, reqs, this); }
};

void EmuComm::play_tape(const CallTape& tape) {
  if (skipped()) return;
  const auto& t = dynamic_cast<const EmuTape&>(tape);
  COCO_CHECK(self_.tape == nullptr, "play_tape while a tape records");
  kernel_.tape_played();
  // A tile's tape is read once per block, between all the other tiles' work, so it is rarely
  // in cache: all of its lines are asked for at once.
  const auto prefetch = [](const void* data, size_t bytes) {
    const auto* p = static_cast<const char*>(data);
    for (size_t k = 0; k < bytes; k += 64) __builtin_prefetch(p + k);
  };
  prefetch(t.calls.data(), t.calls.size() * sizeof(TapeCall));
  // Every request a tape starts is waited for within it: none is handed to a caller. With
  // collectives at the collective level, the engine issues the calls and the fiber waits once.
  if (kernel_.options().collective_ops && t.engine_runs) {
    PlayRun run(*this, t);
    kernel_.run_tape(self_, run);
    return;
  }
  std::vector<detail::ReqPtr> reqs(static_cast<size_t>(t.requests));
  std::size_t pc = 0;
  issue_calls(t, pc, reqs, nullptr);
}

bool EmuComm::issue_calls(const EmuTape& t, std::size_t& pc, std::vector<detail::ReqPtr>& reqs,
                          detail::TapeRun* run) {
  for (; pc < t.calls.size(); ++pc) {
    const TapeCall& c = t.calls[pc];
    EmuComm* const g = c.comm;  // none for a wait
    detail::ReqPtr* const r = c.req >= 0 ? &reqs[static_cast<size_t>(c.req)] : nullptr;
    switch (c.kind) {
      case TapeCall::Kind::kCompute:
        kernel_.charge_compute(self_, c.dt, c.label, c.op_kind, c.kernel);
        break;
      case TapeCall::Kind::kAllToAll:
        *r = g->issue_uniform(c.schedule, {}, {}, c.count, c.label, c.call);
        break;
      case TapeCall::Kind::kAllToAllv:
        *r = g->issue_all_to_allv({}, {}, *c.layout, c.label);
        break;
      case TapeCall::Kind::kAllGather:
        *r = g->issue_uniform(c.schedule, {}, {}, c.count, c.label, c.call);
        break;
      case TapeCall::Kind::kAllReduce:
        *r = g->issue_all_reduce({}, c.count, c.op, c.label, c.call);
        break;
      case TapeCall::Kind::kSend:
        *r = kernel_.post_send(self_, g->group_->ctx, g->world_rank(g->group_rank_),
                               g->world_rank(c.peer), static_cast<std::uint64_t>(c.tag), {},
                               c.count, c.label);
        break;
      case TapeCall::Kind::kRecv:
        *r = kernel_.post_recv(self_, g->group_->ctx, g->world_rank(c.peer),
                               g->world_rank(g->group_rank_), static_cast<std::uint64_t>(c.tag), {},
                               c.count, c.label);
        break;
      case TapeCall::Kind::kRingPass:
        if (run == nullptr) {
          g->do_ring_pass(*c.pass);
        } else if (!kernel_.tape_wait(*run, g->start_ring_pass(*c.pass, c.pass_rows), true)) {
          ++pc;
          return false;
        }
        break;
      case TapeCall::Kind::kWait:
        if (run == nullptr) {
          kernel_.wait(self_, **r);
        } else if (!kernel_.tape_wait(*run, *r, false)) {
          ++pc;
          return false;
        }
        break;
    }
  }
  return true;
}

int EmuComm::world_rank(int group_rank) const {
  COCO_CHECK(group_rank >= 0 && group_rank < size(), "group rank out of range");
  return group_->members[static_cast<size_t>(group_rank)];
}

namespace {
struct EmuRequest final : RequestImpl {
  detail::Kernel& kernel;
  detail::FiberState& owner;
  detail::ReqPtr state;
  EmuTape* tape = nullptr;  // the tape that recorded its start, if any
  int tape_index = -1;
  EmuRequest(detail::Kernel& k, detail::FiberState& o, detail::ReqPtr s)
      : kernel(k), owner(o), state(std::move(s)) {}
  void wait() override {
    if (EmuTape* t = owner.tape) {
      if (t == tape) {
        t->waited[static_cast<size_t>(tape_index)] = 1;
        TapeCall& c = t->calls.emplace_back();
        c.kind = TapeCall::Kind::kWait;
        c.req = tape_index;
      } else {
        t->usable = false;  // started before the recording
      }
    }
    kernel.wait(owner, *state);
  }
  bool test() override {
    if (owner.tape != nullptr) owner.tape->usable = false;  // its answer depends on timing
    return kernel.test(owner, *state);
  }
  std::optional<SimTime> completed_at() const override {
    kernel.arrive(owner);  // the answer depends on how far the run is: a call as any other
    return kernel.done_time(*state);
  }
};
}  // namespace

namespace {
// Detaches the tile's tape for the calls a call makes on its own behalf (a ring pass message by
// message, a barrier's or split's collective), which the tape does not record.
class Untaped {
 public:
  explicit Untaped(detail::FiberState& f) : f_(f), tape_(f.tape) { f_.tape = nullptr; }
  ~Untaped() { f_.tape = tape_; }
  Untaped(const Untaped&) = delete;
  Untaped& operator=(const Untaped&) = delete;

 private:
  detail::FiberState& f_;
  EmuTape* tape_;
};
}  // namespace

Request EmuComm::request(detail::ReqPtr state) {
  auto r = std::make_shared<EmuRequest>(kernel_, self_, std::move(state));
  if (EmuTape* t = self_.tape) {
    // The call that starts it was recorded last (record() runs before the call is made).
    COCO_CHECK(!t->calls.empty() && t->calls.back().req < 0, "a taped request without its call");
    r->tape = t;
    r->tape_index = t->requests++;
    t->calls.back().req = r->tape_index;
    t->waited.push_back(0);
  }
  return Request(std::move(r));
}

detail::ReqPtr EmuComm::start_collective(std::string_view call, std::string_view label,
                                         const detail::CollectiveSpec& spec) {
  const std::uint64_t seq = next_seq_++;
  kernel_.register_collective(*group_, group_rank_, seq, call);
  auto req = std::make_shared<detail::ReqState>();
  req->op = detail::ReqState::Op::kCollective;
  req->label = label;
  req->set_call(call, seq);
  req->group = group_;
  if (kernel_.options().collective_ops) {
    kernel_.start_collective_op(self_, group_, group_rank_, seq, req, spec);
    return req;
  }
  // The collective fiber borrows this communicator's group; the user keeps the communicator
  // alive until the request completes, as with MPI.
  kernel_.spawn_comm(
      self_,
      [kernel = &kernel_, group = group_, me = group_rank_, seq, label = std::string(label),
       spec](detail::FiberState& f) {
        Port port{*kernel, f, *group, me, seq, label};
        collectives::run_on_fiber(port, *spec.schedule, spec.sizes, spec.send, spec.recv, spec.op);
      },
      req);
  return req;
}

const collectives::Schedule* EmuComm::schedule(collectives::AlgorithmId a) {
  const auto i = static_cast<std::size_t>(a);
  if (i >= schedules_.size()) schedules_.resize(i + 1, nullptr);
  const collectives::Schedule*& s = schedules_[i];
  if (s == nullptr) {
    s = &kernel_.group_schedule(group_->ctx, a, size(), [&] {
      std::vector<std::vector<int>> coords(static_cast<std::size_t>(size()));
      for (int r = 0; r < size(); ++r) coords[static_cast<std::size_t>(r)] = this->coords(r);
      return coords;
    });
    COCO_CHECK(s->size() == size(), "two groups of one context differ in size");
  }
  return s;
}

collectives::AlgorithmId EmuComm::all_to_all_algorithm(std::int64_t wire_bytes_per_peer) const {
  const detail::Kernel::LibraryAlgorithms& ids = kernel_.algorithms();
  return kernel_.options().library.small_all_to_all(wire_bytes_per_peer) ? ids.all_to_all_small
                                                                         : ids.all_to_all_large;
}

Request EmuComm::do_iall_to_all(std::span<const float> send, std::span<float> recv,
                                std::int64_t count, std::string_view label) {
  if (skipped(send, recv)) return {};
  const std::string_view call = call_text("all_to_all(", count);
  const collectives::Schedule* s = schedule(all_to_all_algorithm(kernel_.wire_bytes(count)));
  if (TapeCall* c = record(TapeCall::Kind::kAllToAll, count, label, send, recv)) {
    c->call = call;
    c->schedule = s;
  }
  return request(issue_uniform(s, send, recv, count, label, call));
}

detail::ReqPtr EmuComm::issue_uniform(const collectives::Schedule* schedule,
                                      std::span<const float> send, std::span<float> recv,
                                      std::int64_t count, std::string_view label,
                                      std::string_view call) {
  detail::CollectiveSpec spec;
  spec.schedule = schedule;
  spec.sizes = collectives::Sizes::uniform(count);
  spec.send = send;
  spec.recv = recv;
  return start_collective(call, label, spec);
}

Request EmuComm::do_iall_to_allv(std::span<const float> send, std::span<float> recv,
                                 const AllToAllvLayout& layout, std::string_view label) {
  if (skipped(send, recv)) return {};
  if (TapeCall* c = record(TapeCall::Kind::kAllToAllv, 0, label, send, recv))
    c->layout = std::make_unique<AllToAllvLayout>(layout);
  return request(issue_all_to_allv(send, recv, layout, label));
}

detail::ReqPtr EmuComm::issue_all_to_allv(std::span<const float> send, std::span<float> recv,
                                          const AllToAllvLayout& layout, std::string_view label) {
  // Ranks know only their own counts, so every size takes the large-message schedule (a rank
  // choosing by its own counts could pair with a peer running another schedule). An algorithm
  // that needs equal counts runs its fallback (Bruck forwards blocks through ranks that do not
  // know their sizes; MPICH's MPI_Alltoallv has no Bruck either).
  const collectives::AlgorithmId a =
      collectives::variable_counts_algorithm(kernel_.algorithms().all_to_all_large);
  detail::CollectiveSpec spec;
  spec.schedule = schedule(a);
  spec.sizes.send_counts = layout.send_counts.data();
  spec.sizes.send_displs = layout.send_displs.data();
  spec.sizes.recv_counts = layout.recv_counts.data();
  spec.sizes.recv_displs = layout.recv_displs.data();
  spec.send = send;
  spec.recv = recv;
  return start_collective("all_to_allv", label, spec);
}

Request EmuComm::do_iall_gather(std::span<const float> send, std::span<float> recv,
                                std::int64_t count, std::string_view label) {
  if (skipped(send, recv)) return {};
  const std::string_view call = call_text("all_gather(", count);
  const collectives::Schedule* s = schedule(kernel_.algorithms().all_gather);
  if (TapeCall* c = record(TapeCall::Kind::kAllGather, count, label, send, recv)) {
    c->call = call;
    c->schedule = s;
  }
  return request(issue_uniform(s, send, recv, count, label, call));
}

Request EmuComm::do_iall_reduce(std::span<float> data, std::int64_t count, ReduceOp op,
                                std::string_view label) {
  if (skipped(data)) return {};
  const std::string_view call =
      call_text(op == ReduceOp::kSum ? "all_reduce(sum, " : "all_reduce(max, ", count);
  if (TapeCall* c = record(TapeCall::Kind::kAllReduce, count, label, data)) {
    c->op = op;
    c->call = call;
  }
  return request(issue_all_reduce(data, count, op, label, call));
}

detail::ReqPtr EmuComm::issue_all_reduce(std::span<float> data, std::int64_t count, ReduceOp op,
                                         std::string_view label, std::string_view call) {
  detail::CollectiveSpec spec;
  spec.schedule = schedule(kernel_.algorithms().all_reduce);
  spec.sizes = collectives::Sizes::uniform(count);
  spec.send = data;
  spec.recv = data;
  spec.op = op;
  return start_collective(call, label, spec);
}

void EmuComm::barrier() {
  if (skipped()) return;
  spoil_tape();
  const Untaped untaped(self_);
  detail::CollectiveSpec spec;
  spec.schedule = schedule(kernel_.algorithms().barrier);
  request(start_collective("barrier", "barrier", spec)).wait();
  // The caller's host waited for the barrier (and, with it, for its device): the next call is
  // issued from here, not from where the host was before.
  kernel_.block_host(self_);
}

namespace {
void check_tag(int tag, int rank) {
  if (tag < 0)
    throw CommError("rank " + std::to_string(rank) + ": point-to-point tags must be >= 0, got " +
                    std::to_string(tag));
}
}  // namespace

Request EmuComm::do_isend(std::span<const float> data, std::int64_t count, int dest, int tag,
                          std::string_view label) {
  if (skipped(data)) return {};
  check_tag(tag, world_rank(group_rank_));
  if (TapeCall* c = record(TapeCall::Kind::kSend, count, label, data)) {
    c->peer = dest;
    c->tag = tag;
  }
  return request(kernel_.post_send(self_, group_->ctx, world_rank(group_rank_), world_rank(dest),
                                   static_cast<std::uint64_t>(tag), data, count, label));
}

Request EmuComm::do_irecv(std::span<float> data, std::int64_t count, int source, int tag,
                          std::string_view label) {
  if (skipped(data)) return {};
  check_tag(tag, world_rank(group_rank_));
  if (TapeCall* c = record(TapeCall::Kind::kRecv, count, label, data)) {
    c->peer = source;
    c->tag = tag;
  }
  return request(kernel_.post_recv(self_, group_->ctx, world_rank(source), world_rank(group_rank_),
                                   static_cast<std::uint64_t>(tag), data, count, label));
}

void EmuComm::do_ring_pass(const RingPass& pass) {
  if (skipped()) {
    COCO_CHECK(!pass.data, "a ring pass with data inside a replayed span");
    return;
  }
  detail::PassRows rows;  // kept with the tape's copy, for this pass too
  if (self_.tape != nullptr) {
    // The tape keeps its own copy of the pass, labels included; the data must be sizes only.
    auto kept = std::make_unique<RingPass>();
    kept->parts = pass.parts;
    kept->counts = pass.counts;
    kept->work = pass.work;
    for (OpCost& w : kept->work) w.label = kernel_.keep_label(w.label);
    for (const std::string_view l : pass.labels) kept->labels.push_back(kernel_.keep_label(l));
    if (pass.data) spoil_tape();  // a pass with buffers moves data
    rows = {&kernel_.pass_costs(kept->work, group_rank_), kernel_.pass_counts(kept->counts)};
    TapeCall& c = *record(TapeCall::Kind::kRingPass, 0, {});
    c.pass_rows = rows;
    c.pass = std::move(kept);
  }
  const Untaped untaped(self_);  // message by message, its calls are the pass's
  const std::uint64_t seq = next_pass_++;
  if (!kernel_.options().collective_ops || size() == 1) {
    Communicator::do_ring_pass(pass);
    return;
  }
  kernel_.ring_pass(self_, group_, group_rank_, seq, pass, rows);
}

detail::ReqPtr EmuComm::start_ring_pass(const RingPass& pass, detail::PassRows kept) {
  const std::uint64_t seq = next_pass_++;
  return kernel_.ring_pass_start(self_, group_, group_rank_, seq, pass, kept);
}

std::unique_ptr<Communicator> EmuComm::split(int color, int key) {
  spoil_tape();  // a tape does not make groups
  COCO_CHECK(!self_.skipping, "split inside a replayed span: groups are made outside spans");
  const Untaped untaped(self_);
  // Exchange (color, key) with an all-gather of their bit patterns.
  const int p = size();
  std::vector<float> mine(2), all(static_cast<size_t>(2 * p));
  mine[0] = std::bit_cast<float>(color);
  mine[1] = std::bit_cast<float>(key);
  const std::uint64_t seq = next_seq_;  // the all-gather's sequence number names the split
  all_gather(mine, all, 2, "split");
  std::vector<std::pair<int, int>> members;  // (key, group rank) of ranks with my color
  for (int r = 0; r < p; ++r) {
    const int c = std::bit_cast<int>(all[2 * static_cast<size_t>(r)]);
    const int k = std::bit_cast<int>(all[2 * static_cast<size_t>(r) + 1]);
    if (c == color) members.emplace_back(k, r);
  }
  std::sort(members.begin(), members.end());
  detail::Group g;
  g.ctx = mix(group_->ctx ^ mix(seq) ^
              mix(static_cast<std::uint64_t>(static_cast<std::uint32_t>(color)) + 0x51ed));
  int my_rank = -1;
  for (size_t i = 0; i < members.size(); ++i) {
    g.members.push_back(group_->members[static_cast<size_t>(members[i].second)]);
    if (members[i].second == group_rank_) my_rank = static_cast<int>(i);
  }
  return std::make_unique<EmuComm>(kernel_, self_, std::move(g), my_rank);
}

}  // namespace cocodiff::emu
