#include "emulator/detail/kernel.hpp"

#include <algorithm>
#include <bit>
#include <boost/fiber/all.hpp>
#include <chrono>
#include <cmath>
#include <cstring>
#include <new>
#include <string_view>
#include <thread>
#include <type_traits>

#include "core/errors.hpp"
#include "core/hash.hpp"
#include "emulator/detail/fiber_launch.hpp"
#include "emulator/detail/scheduler.hpp"
#include "emulator/emu_comm.hpp"

namespace cocodiff::emu::detail {

namespace {

template <typename T>
void hash_value(std::uint64_t& h, T v) {
  static_assert(std::is_integral_v<T> || std::is_enum_v<T>);
  if constexpr (std::is_enum_v<T>)
    hash_word(h, static_cast<std::uint64_t>(static_cast<std::underlying_type_t<T>>(v)));
  else
    hash_word(h, static_cast<std::uint64_t>(v));
}

/// A string as little-endian words (the last one zero-padded), then its length.
/// (Words are loaded whole where the machine is little-endian: the same values, one load each.)
void hash_bytes(std::uint64_t& h, std::string_view s) {
  const size_t n = s.size();
  const auto bytewise = [&s](size_t i, size_t count) {
    std::uint64_t w = 0;
    for (size_t k = 0; k < count; ++k)
      w |= static_cast<std::uint64_t>(static_cast<unsigned char>(s[i + k])) << (8 * k);
    return w;
  };
  constexpr bool kLittle = std::endian::native == std::endian::little;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    std::uint64_t w = 0;
    if constexpr (kLittle)
      std::memcpy(&w, s.data() + i, 8);
    else
      w = bytewise(i, 8);
    hash_word(h, w);
  }
  std::uint64_t w = 0;
  if (kLittle && n >= 8 && i < n) {
    // The last 8 bytes, shifted down to the ones not hashed yet.
    std::memcpy(&w, s.data() + n - 8, 8);
    w >>= 8 * (8 - (n - i));
  } else {
    w = bytewise(i, n - i);
  }
  hash_word(h, w);
  hash_word(h, n);
}

std::string describe_ranks(const std::vector<int>& ranks) {
  std::string s;
  for (size_t i = 0; i < ranks.size(); ++i) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (!s.empty()) s += ",";
    s += std::to_string(ranks[i]);
    if (j > i) s += "-" + std::to_string(ranks[j]);
    i = j;
  }
  return s;
}

}  // namespace

std::string Group::describe() const {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%llx", static_cast<unsigned long long>(ctx));
  return "group " + std::string(buf) + " (world ranks " + describe_ranks(members) + ")";
}

std::string ReqState::describe() const {
  std::string s;
  switch (op) {
    case Op::kSend:
      s = "send of " + std::to_string(count) + " elements to rank " + std::to_string(peer);
      break;
    case Op::kRecv:
      s = "recv of " + std::to_string(count) + " elements from rank " + std::to_string(peer);
      break;
    case Op::kCollective:
      s = std::string(call) + " #" + std::to_string(call_seq);
      break;
  }
  if (!label.empty()) s += " ('" + label + "')";
  if (group) s += " on " + group->describe();
  return s;
}

std::string_view ReqState::trace_label() const {
  if (!label.empty()) return label;
  switch (op) {
    case Op::kSend:
      return "send";
    case Op::kRecv:
      return "recv";
    case Op::kCollective:
      return call_text;
  }
  return "?";
}

std::size_t Kernel::ChannelKeyHash::operator()(const ChannelKey& k) const noexcept {
  std::uint64_t h = std::get<0>(k) * 0x9e3779b97f4a7c15ull;
  h ^= (static_cast<std::uint64_t>(static_cast<std::uint32_t>(std::get<1>(k))) << 32 |
        static_cast<std::uint32_t>(std::get<2>(k))) +
       0x7f4a7c159e3779b9ull + (h << 6) + (h >> 2);
  h ^= std::get<3>(k) + 0x94d049bb133111ebull + (h << 6) + (h >> 2);
  return static_cast<std::size_t>(h);
}

Kernel::Kernel(const Topology& topo, NetworkModel& net, const DeviceModel& device,
               const EngineOptions& options)
    : topo_(topo),
      net_(net),
      device_(device),
      options_(options),
      main_stacks_(options.stack_bytes),
      comm_stacks_(options.comm_stack_bytes) {
  host_scale_ = 1.0 + device_.host_per_rank_slowdown() * (topo_.ranks_per_node() - 1);
  const double w = options.wire_bytes_per_element;
  if (w >= 1 && w <= 64 && w == std::floor(w)) wire_whole_ = static_cast<std::int64_t>(w);
  // rank_group_[k * ranks + r]: the index of rank r's group at level k (r over the level's
  // stride), so tier() compares table entries instead of dividing once per level per flow.
  const int p = topo_.num_ranks(), levels = topo_.num_levels();
  rank_group_.resize(static_cast<size_t>(levels) * static_cast<size_t>(p));
  int stride = 1;
  for (int k = 0; k < levels; ++k) {
    for (int r = 0; r < p; ++r)
      rank_group_[static_cast<size_t>(k) * static_cast<size_t>(p) + static_cast<size_t>(r)] =
          r / stride;
    stride *= topo_.level(k).size;
  }
}

int Kernel::tier(int a, int b) const {
  const size_t p = static_cast<size_t>(topo_.num_ranks());
  for (int k = topo_.num_levels() - 1; k >= 0; --k) {
    const int* g = rank_group_.data() + static_cast<size_t>(k) * p;
    if (g[a] != g[b]) return k;
  }
  return -1;
}

Kernel::~Kernel() = default;

std::uint32_t Kernel::intern(std::string_view label) {
  std::lock_guard<std::mutex> lk(label_mutex_);
  auto it = label_ids_.find(std::string(label));
  if (it != label_ids_.end()) return it->second;
  auto id = static_cast<std::uint32_t>(labels_.size());
  labels_.emplace_back(label);
  label_ids_.emplace(std::string(label), id);
  return id;
}

std::string_view Kernel::keep_label(std::string_view label) {
  std::lock_guard<std::mutex> lk(label_mutex_);
  return *kept_labels_.emplace(label).first;
}

void Kernel::record_tile_event(int rank, TraceEvent::Kind kind, SimTime start, SimTime end,
                               std::string_view label) {
  TileStats& t = tiles_[static_cast<size_t>(rank)];
  hash_value(t.inner, kind);
  hash_value(t.inner, (start - t.region_start).ns());
  hash_value(t.inner, (end - t.region_start).ns());
  hash_bytes(t.inner, label);
  ++t.events;
  if (options_.trace && t.trace.size() < tile_trace_cap_) {
    TraceEvent e;
    e.kind = kind;
    e.rank = rank;
    e.start = start;
    e.end = end;
    e.label = intern(label);
    t.trace.push_back(e);
  }
}

// ---------------------------------------------------------------- fiber side

void Kernel::block(FiberState& f, std::unique_lock<NullLock>& lk, const ReqState* req,
                   bool in_test) {
  if (aborting_) throw Cancelled{};
  f.waiting_on = req;
  f.waiting_in_test = in_test;
  f.blocked = true;
  f.blocked_index = blocked_list_.size();
  blocked_list_.push_back(&f);
  if (--runnable_ == 0) controller_cv_.notify_one();
  f.ctx = boost::fibers::context::active();
  lk.unlock();
  while (!f.wake) f.ctx->suspend();  // the next ready fiber runs; wake() makes this one ready
  lk.lock();
  asan_on_stack(f.stack);  // back on this fiber's stack, possibly on another thread
  f.wake = false;
  if (aborting_) throw Cancelled{};
}

void Kernel::wake(FiberState& f) {
  COCO_CHECK(f.blocked, "waking a fiber that is not blocked");
  f.blocked = false;
  FiberState* last = blocked_list_.back();
  blocked_list_[f.blocked_index] = last;
  last->blocked_index = f.blocked_index;
  blocked_list_.pop_back();
  f.wake = true;
  ++runnable_;
  boost::fibers::context::active()->schedule(f.ctx);
}

void Kernel::complete(ReqState& r, SimTime t) {
  COCO_CHECK(!r.done, "request completed twice");
  if (r.owner >= 0) --tiles_[static_cast<size_t>(r.owner)].open_p2p;
  r.done = true;
  r.done_time = t;
  if (r.waiter != nullptr) {
    FiberState* w = r.waiter;
    r.waiter = nullptr;
    if (w->tape_run != nullptr && w->tape_run->waiting.get() == &r)
      ready_runs_.push_back(w->tape_run);  // the engine issues its next calls (run_tape)
    else
      wake(*w);
  }
}

ReqPtr Kernel::post_send(FiberState& f, std::uint64_t ctx, int src, int dst, std::uint64_t tag,
                         std::span<const float> data, std::int64_t count, std::string_view label) {
  auto req = std::make_shared<ReqState>();
  req->op = ReqState::Op::kSend;
  req->peer = dst;
  req->count = count;
  req->label = label;
  std::unique_lock<NullLock> lk(state_lock_);
  req->owner = f.rank;
  ++tiles_[static_cast<size_t>(f.rank)].open_p2p;
  ChannelKey key{ctx, src, dst, tag};
  Channel& ch = channels_[key];
  ch.sends.push_back({req, data, count, f.clock, label});
  match(ch, key, lk);
  return req;
}

ReqPtr Kernel::post_recv(FiberState& f, std::uint64_t ctx, int src, int dst, std::uint64_t tag,
                         std::span<float> data, std::int64_t count, std::string_view label) {
  auto req = std::make_shared<ReqState>();
  req->op = ReqState::Op::kRecv;
  req->peer = src;
  req->count = count;
  req->label = label;
  std::unique_lock<NullLock> lk(state_lock_);
  req->owner = f.rank;
  ++tiles_[static_cast<size_t>(f.rank)].open_p2p;
  ChannelKey key{ctx, src, dst, tag};
  Channel& ch = channels_[key];
  ch.recvs.push_back({req, data, count, f.clock});
  match(ch, key, lk);
  return req;
}

void Kernel::match(Channel& ch, const ChannelKey& key, std::unique_lock<NullLock>& lk) {
  if (ch.sends.empty() || ch.recvs.empty()) return;
  PostedSend s = std::move(ch.sends.front());
  PostedRecv r = std::move(ch.recvs.front());
  ch.sends.erase(ch.sends.begin());
  ch.recvs.erase(ch.recvs.begin());
  const std::uint64_t seq = ch.matched++;
  const int src = std::get<1>(key);
  const int dst = std::get<2>(key);
  if (ch.sends.empty() && ch.recvs.empty()) channels_.erase(key);
  if (s.count != r.count) {
    throw CommError("message size mismatch: rank " + std::to_string(src) + " sends " +
                    std::to_string(s.count) + " elements to rank " + std::to_string(dst) +
                    ", which expects " + std::to_string(r.count) +
                    (s.label.empty() ? "" : " (in '" + std::string(s.label) + "')"));
  }
  const SimTime start = std::max(s.post, r.post);
  // Copy outside the lock: both buffers stay valid until the requests complete, and the
  // controller cannot complete them while this fiber is still running.
  lk.unlock();
  if (!s.data.empty() && !r.data.empty() && s.count > 0)
    std::memcpy(r.data.data(), s.data.data(), static_cast<size_t>(s.count) * sizeof(float));
  lk.lock();
  if (src == dst) {
    complete(*s.req, start);
    complete(*r.req, start);
    return;
  }
  Transfer t;
  t.start = start;
  t.src = src;
  t.dst = dst;
  t.key = key;
  t.seq = seq;
  t.bytes = wire_bytes(s.count);
  t.sink = &point_to_point_;
  t.sreq = std::move(s.req);
  t.rreq = std::move(r.req);
  t.label = options_.trace ? intern(s.label) : 0;
  new_transfers_.push_back(std::move(t));
}

void Kernel::PointToPoint::message_done(Kernel& k, const Transfer& t, SimTime end) {
  k.complete(*t.sreq, end);
  k.complete(*t.rreq, end);
}

void Kernel::wait(FiberState& f, ReqState& req) {
  const SimTime before = f.clock;
  {
    std::unique_lock<NullLock> lk(state_lock_);
    if (!req.done) {
      req.waiter = &f;
      block(f, lk, &req, false);
    }
    COCO_CHECK(req.done, "woken before completion");
  }
  finish_wait(f, req, before);
}

void Kernel::run_tape(FiberState& f, TapeRun& run) {
  COCO_CHECK(f.is_main && f.tape_run == nullptr, "run_tape on a tile already running one");
  run.f = &f;
  ++tapes_run_;
  if (run.advance()) return;
  std::unique_lock<NullLock> lk(state_lock_);
  f.tape_run = &run;
  // The run lives on this fiber's stack: it is detached however the wait ends (a tear-down
  // throws out of block()).
  struct Detach {
    FiberState& f;
    ~Detach() { f.tape_run = nullptr; }
  } const detach{f};
  block(f, lk, run.waiting.get(), false);  // woken when no call is left (run_ready_tapes)
  if (run.error) std::rethrow_exception(run.error);
}

bool Kernel::tape_wait(TapeRun& run, const ReqPtr& req, bool pass) {
  FiberState& f = *run.f;
  if (req->done) {
    finish_tape_wait(f, *req, pass, f.clock);
    return true;
  }
  run.waiting = req;
  run.pass = pass;
  run.before = f.clock;
  req->waiter = &f;
  // From the controller's side the fiber stays blocked: it now waits for this request (what
  // op_waits_alone and a deadlock report read).
  if (f.tape_run != nullptr) f.waiting_on = req.get();
  return false;
}

bool Kernel::run_ready_tapes() {
  if (ready_runs_.empty()) return false;
  // Completions these calls cause may make more runs ready: the list grows while it is read.
  for (size_t i = 0; i < ready_runs_.size(); ++i) {
    TapeRun& run = *ready_runs_[i];
    FiberState& f = *run.f;
    const ReqPtr req = std::move(run.waiting);
    f.waiting_on = nullptr;  // issuing calls, as the fiber would be
    finish_tape_wait(f, *req, run.pass, run.before);
    run.pass = false;
    bool done = true;
    try {
      done = run.advance();
    } catch (...) {
      run.error = std::current_exception();  // rethrown on the tile's fiber
    }
    if (done) wake(f);
  }
  ready_runs_.clear();
  return true;
}

void Kernel::finish_tape_wait(FiberState& f, ReqState& req, bool pass, SimTime before) {
  if (pass)
    f.clock = req.done_time;  // a ring pass's charges and waits are on the tile's accounting
  else
    finish_wait(f, req, before);
}

void Kernel::finish_wait(FiberState& f, ReqState& req, SimTime before) {
  if (f.is_main && req.open)
    req.penalty = transfer_penalty(tiles_[static_cast<size_t>(f.rank)], req);
  f.clock = std::max(f.clock, req.done_time + req.penalty);
  if (f.is_main) {
    TileStats& t = tiles_[static_cast<size_t>(f.rank)];
    close_collective(t, req);
    if (f.clock > before) {
      t.exposed += f.clock - before;
      record_tile_event(f.rank, TraceEvent::Kind::kWait, before, f.clock, req.trace_label());
    }
  }
}

bool Kernel::test(FiberState& f, ReqState& req) {
  std::unique_lock<NullLock> lk(state_lock_);
  if (!req.done) {
    // Whether it completes by f.clock is known only once virtual time reaches f.clock.
    timers_.emplace(f.clock, &f);
    block(f, lk, &req, true);
  }
  if (!req.done) return false;
  TileStats& t = tiles_[static_cast<size_t>(f.rank)];
  const SimTime penalty = f.is_main && req.open ? transfer_penalty(t, req) : req.penalty;
  const bool done = req.done_time + penalty <= f.clock;
  if (done && f.is_main) {
    req.penalty = penalty;
    close_collective(t, req);
  }
  return done;
}

SimTime Kernel::transfer_penalty(const TileStats& t, const ReqState& req) const {
  const double factor = device_.overlap_transfer_factor();
  if (factor == 1.0) return SimTime{};
  // The part of the collective that ran beside this tile's compute runs `factor` times slower:
  // at most the compute issued while it was open, at most the collective's own span.
  const SimTime overlapped = std::min(t.overlapped_compute - req.overlap_mark,
                                      req.done_time - std::min(req.done_time, req.started));
  return SimTime::from_ns(std::llround(static_cast<double>(overlapped.ns()) * (factor - 1.0)));
}

void Kernel::close_collective(TileStats& t, ReqState& req) {
  if (!req.open) return;
  req.open = false;
  --t.open_collectives;
}

std::optional<SimTime> Kernel::done_time(const ReqState& req) {
  std::lock_guard<NullLock> lk(state_lock_);
  if (!req.done) return std::nullopt;
  return req.done_time + req.penalty;
}

void Kernel::compute(FiberState& f, const OpCost& cost) {
  charge_compute(f, device_.time(cost), cost.label.empty() ? op_kind_name(cost.kind) : cost.label);
}

void Kernel::charge_compute(FiberState& f, SimTime dt, std::string_view label) {
  if (aborting_) throw Cancelled{};
  f.clock = charge(f.rank, f.clock, dt, label);
}

SimTime Kernel::charge(int rank, SimTime start, SimTime dt, std::string_view label) {
  // Overlapped compute runs slower: the factor is decided by the tile's own program order
  // (collectives started and not yet waited for), so the timeline stays deterministic.
  const double slowdown = device_.overlap_compute_factor();
  TileStats& t = tiles_[static_cast<size_t>(rank)];
  if (device_.has_host()) {
    // The host issues ops in program order; the device runs one once it is issued and the
    // compute stream is free.
    t.host += host_cost(device_.host_issue(label));
    start = std::max(start, t.host);
  }
  if (t.open_collectives > 0) {
    if (slowdown != 1.0)
      dt = SimTime::from_ns(std::llround(static_cast<double>(dt.ns()) * slowdown));
    t.overlapped_compute += dt;
  }
  const SimTime end = start + dt;
  t.compute += dt;
  record_tile_event(rank, TraceEvent::Kind::kCompute, start, end, label);
  return end;
}

void Kernel::issue_call(FiberState& f) {
  if (!f.is_main || !device_.has_host()) return;
  TileStats& t = tiles_[static_cast<size_t>(f.rank)];
  t.host += host_cost(device_.collective_issue());
  f.clock = std::max(f.clock, t.host);
}

void Kernel::spawn_comm(FiberState& parent, std::function<void(FiberState&)> body, ReqPtr req) {
  issue_call(parent);
  auto state = std::make_shared<FiberState>();
  state->rank = parent.rank;
  state->is_main = false;
  state->clock = parent.clock;
  open_collective(parent, *req);
  {
    std::lock_guard<NullLock> lk(state_lock_);
    ++runnable_;
    ++live_;
  }
  launch_fiber(PooledStack(comm_stacks_, state->stack),
               [this, state, body = std::move(body), req = std::move(req)] {
                 asan_on_stack(state->stack);
                 try {
                   body(*state);
                   std::lock_guard<NullLock> lk(state_lock_);
                   complete(*req, state->clock);
                 } catch (const Cancelled&) {
                 } catch (...) {
                   record_error(state->rank, std::current_exception());
                 }
                 std::lock_guard<NullLock> lk(state_lock_);
                 --live_;
                 if (--runnable_ == 0) controller_cv_.notify_one();
               });
}

void Kernel::register_collective(const Group& g, int group_rank, std::uint64_t seq,
                                 std::string_view call) {
  std::lock_guard<NullLock> lk(state_lock_);
  groups_seen_.try_emplace(g.ctx, g);  // copies the group only the first time
  auto key = std::make_pair(g.ctx, seq);
  auto it = collectives_.find(key);
  if (it == collectives_.end()) {
    if (g.members.size() > 1) collectives_.emplace(key, CollectiveEntry{call, group_rank, 1});
    return;
  }
  CollectiveEntry& e = it->second;
  if (e.call != call) {
    const int a = g.members[static_cast<size_t>(e.first_group_rank)];
    const int b = g.members[static_cast<size_t>(group_rank)];
    throw CommError("mismatched collectives on " + g.describe() + ", call #" + std::to_string(seq) +
                    ": rank " + std::to_string(a) + " called " + std::string(e.call) + ", rank " +
                    std::to_string(b) + " called " + std::string(call));
  }
  if (++e.seen == static_cast<int>(g.members.size())) collectives_.erase(it);
}

void Kernel::record_error(int rank, const std::exception_ptr& e) {
  Failure f{rank, SimTime{}, "unknown exception", false};
  try {
    std::rethrow_exception(e);
  } catch (const RankError& ex) {
    f.message = ex.what();
    f.user_error = ex.user_error();
  } catch (const UserError& ex) {
    f.message = ex.what();
    f.user_error = true;
  } catch (const std::bad_alloc&) {  // a resource error, not a bug: the run is too large
    f.message =
        "out of memory while running this tile's share of the model (std::bad_alloc); use "
        "run.math = \"skip\", a smaller model or resolution, or more memory";
    f.user_error = true;
  } catch (const std::exception& ex) {
    f.message = ex.what();
  } catch (...) {
  }
  std::lock_guard<NullLock> lk(state_lock_);
  f.clock = mains_[static_cast<size_t>(rank)]->clock;
  failures_.push_back(std::move(f));
}

void Kernel::fiber_main(FiberState& f, const std::function<void(Communicator&)>& tile_main) {
  asan_on_stack(f.stack);
  try {
    Group world;
    world.ctx = 1;
    world.members.resize(static_cast<size_t>(topo_.num_ranks()));
    for (int i = 0; i < topo_.num_ranks(); ++i) world.members[static_cast<size_t>(i)] = i;
    EmuComm comm(*this, f, std::move(world), f.rank);
    tile_main(comm);
  } catch (const Cancelled&) {
  } catch (...) {
    record_error(f.rank, std::current_exception());
  }
  tiles_[static_cast<size_t>(f.rank)].end = f.clock;
  std::lock_guard<NullLock> lk(state_lock_);
  --live_;
  if (--runnable_ == 0) controller_cv_.notify_one();
}

void Kernel::run_math(FiberState& f, const std::function<void()>& work) {
  if (aborting_) throw Cancelled{};
  math_->run(work, f.stack);
}

// ---------------------------------------------------------------- region marks

Communicator::RegionMark Kernel::begin_region(FiberState& f, std::string_view key, bool may_skip) {
  if (aborting_) throw Cancelled{};
  COCO_CHECK(f.is_main, "region marks are made by tile fibers");
  TileStats& t = tiles_[static_cast<size_t>(f.rank)];
  hash_value(t.hash, t.region_start.ns());
  hash_value(t.hash, t.inner);
  t.last_inner = t.inner;
  t.inner = kHashBasis;
  t.region_start = f.clock;
  const int m = t.marks++;
  const int n = topo_.num_ranks();
  std::unique_lock<NullLock> lk(state_lock_);
  MarkState& ms = marks_[m];
  if (ms.arrived == 0) {
    ms.key = key;
    ms.waiters.swap(spare_waiters_);  // every tile waits here: the last mark's storage fits
  } else if (ms.key != key) {
    ms.replayable = false;
  }
  ms.replayable = ms.replayable && may_skip;
  ++ms.arrived;
  f.replayed = false;
  f.region_id = 0;
  if (!ms.broken) {
    ms.waiters.push_back(&f);
    ms.min_clock = std::min(ms.min_clock, f.clock);
    block(f, lk, nullptr, false);
  }
  const Communicator::RegionMark res{f.replayed, f.region_id};
  if (const auto it = marks_.find(m); ++it->second.passed == n) {
    spare_waiters_ = std::move(it->second.waiters);
    spare_waiters_.clear();
    marks_.erase(it);
  }
  return res;
}

void Kernel::fold_flow_hash(SimTime next_base) {
  hash_value(flow_hash_, flow_base_.ns());
  hash_value(flow_hash_, flow_inner_);
  flow_inner_ = kHashBasis;
  flow_base_ = next_base;
}

void Kernel::region_event(int mark) {
  MarkState& ms = marks_.at(mark);
  const int n = topo_.num_ranks();
  const auto release = [&ms, this] {
    for (FiberState* w : ms.waiters) wake(*w);
    ms.waiters.clear();
  };
  // Quiescent: every tile waits here and nothing else is under way, so what follows depends
  // only on the tiles' clock offsets and on what they run next (named by the key).
  const bool quiescent = ms.arrived == n && live_ == n && ops_.empty() && passes_.empty() &&
                         closed_pass_messages_.empty() && closed_messages_.empty() &&
                         early_finishes_.empty() && held_.empty() && failures_.empty() &&
                         new_transfers_.empty() && in_flight_.empty() && timers_.empty() &&
                         net_.active_flows() == 0 &&
                         std::all_of(tiles_.begin(), tiles_.end(), [](const TileStats& t) {
                           return t.open_collectives == 0;  // no compute slowed by overlap
                         });
  if (!quiescent) {
    ms.broken = true;
    rec_.active = false;
    release();
    return;
  }
  SimTime t0 = SimTime::max();
  for (const auto& m : mains_) t0 = std::min(t0, m->clock);
  std::vector<std::int64_t>& offsets = offsets_;  // kept between marks: sized once
  offsets.resize(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r)
    offsets[static_cast<size_t>(r)] = (mains_[static_cast<size_t>(r)]->clock - t0).ns();
  // With a host model the tiles' hosts are part of the state: their offsets follow the clocks'.
  if (device_.has_host())
    for (int r = 0; r < n; ++r) offsets.push_back((tiles_[static_cast<size_t>(r)].host - t0).ns());
  // The region that ends here was recorded from the previous mark: keep its effect.
  if (rec_.active && rec_.mark + 1 == mark) {
    RegionRecord r;
    r.end_ns = offsets;
    for (std::int64_t& e : r.end_ns) e += (t0 - rec_.t0).ns();
    // Kept for every simulated region (most never recur): sized exactly, no trace when off.
    const auto un = static_cast<size_t>(n);
    r.compute.reserve(un);
    r.exposed.reserve(un);
    r.events.reserve(un);
    r.inner.reserve(un);
    if (options_.trace) r.tile_trace.resize(un);
    for (int i = 0; i < n; ++i) {
      const auto u = static_cast<size_t>(i);
      const TileStats& t = tiles_[u];
      r.compute.push_back(t.compute - rec_.compute[u]);
      r.exposed.push_back(t.exposed - rec_.exposed[u]);
      r.events.push_back(t.events - rec_.events[u]);
      r.inner.push_back(t.last_inner);
      if (!options_.trace) continue;
      for (std::size_t k = rec_.trace_size[u]; k < t.trace.size(); ++k) {
        TraceEvent e = t.trace[k];
        e.start = e.start - rec_.t0;
        e.end = e.end - rec_.t0;
        r.tile_trace[u].push_back(e);
      }
    }
    r.flow_inner = flow_inner_;
    r.flows = flows_ - rec_.flows;
    r.bytes_by_tier = bytes_by_tier_;
    for (size_t k = 0; k < r.bytes_by_tier.size(); ++k) r.bytes_by_tier[k] -= rec_.bytes_by_tier[k];
    for (std::size_t k = rec_.flow_trace_size; k < flow_trace_.size(); ++k) {
      TraceEvent e = flow_trace_[k];
      e.start = e.start - rec_.t0;
      e.end = e.end - rec_.t0;
      r.flow_trace.push_back(e);
    }
    records_.emplace(rec_.id, std::move(r));
  }
  rec_.active = false;
  fold_flow_hash(t0);
  std::uint64_t id = 0;
  if (ms.replayable && options_.replay) {
    auto [it, fresh] = region_ids_.try_emplace({ms.key, offsets}, region_ids_.size() + 1);
    id = it->second;
    auto rec = records_.find(id);
    if (rec != records_.end()) {
      // Replay: every tile jumps to where simulating the region would have taken it.
      const RegionRecord& r = rec->second;
      for (int i = 0; i < n; ++i) {
        const auto u = static_cast<size_t>(i);
        FiberState& f = *mains_[u];
        TileStats& t = tiles_[u];
        f.clock = t0 + SimTime::from_ns(r.end_ns[u]);
        if (device_.has_host())
          t.host = t0 + SimTime::from_ns(r.end_ns[u + static_cast<size_t>(n)]);
        f.replayed = true;
        t.compute += r.compute[u];
        t.exposed += r.exposed[u];
        t.events += r.events[u];
        t.inner = r.inner[u];
        if (options_.trace)
          for (TraceEvent e : r.tile_trace[u]) {
            if (t.trace.size() >= tile_trace_cap_) break;
            e.start = e.start + t0;
            e.end = e.end + t0;
            t.trace.push_back(e);
          }
      }
      flow_inner_ = r.flow_inner;
      flows_ += r.flows;
      for (size_t k = 0; k < bytes_by_tier_.size(); ++k) bytes_by_tier_[k] += r.bytes_by_tier[k];
      next_flow_id_ += r.flows;
      in_flight_base_ = next_flow_id_;
      if (options_.trace)
        for (TraceEvent e : r.flow_trace) {
          if (flow_trace_.size() >= options_.trace_limit / 2) break;
          e.start = e.start + t0;
          e.end = e.end + t0;
          flow_trace_.push_back(e);
        }
      ++regions_replayed_;
    } else {
      // Simulate it once more, recording what it does.
      rec_.active = true;
      rec_.mark = mark;
      rec_.id = id;
      rec_.t0 = t0;
      rec_.compute.clear();
      rec_.exposed.clear();
      rec_.events.clear();
      rec_.trace_size.clear();
      for (const TileStats& t : tiles_) {
        rec_.compute.push_back(t.compute);
        rec_.exposed.push_back(t.exposed);
        rec_.events.push_back(t.events);
        rec_.trace_size.push_back(t.trace.size());
      }
      rec_.flows = flows_;
      rec_.bytes_by_tier = bytes_by_tier_;
      rec_.flow_trace_size = flow_trace_.size();
    }
  }
  for (FiberState* w : ms.waiters) w->region_id = id;
  release();
}

// ---------------------------------------------------------------- controller side

std::string Kernel::deadlock_report() const {
  std::vector<const FiberState*> b(blocked_list_.begin(), blocked_list_.end());
  std::sort(b.begin(), b.end(), [](const FiberState* x, const FiberState* y) {
    return std::tie(x->rank, y->is_main, x->waiting_on) <
           std::tie(y->rank, x->is_main, y->waiting_on);
  });
  std::string s = "deadlock: no rank can make progress at virtual time " +
                  std::to_string(net_.now().seconds()) + " s; " + std::to_string(b.size()) +
                  " fiber(s) wait:";
  size_t shown = 0;
  for (const FiberState* f : b) {
    if (++shown > 16) {
      s += "\n  ... and " + std::to_string(b.size() - 16) + " more";
      break;
    }
    s += "\n  rank " + std::to_string(f->rank) + (f->is_main ? "" : " (collective)") +
         " waits in " + (f->waiting_in_test ? "test() of " : "") +
         (f->waiting_on ? f->waiting_on->describe() : std::string("?"));
  }
  // Posted operations that nothing matches name the missing partner.
  size_t unmatched = 0;
  std::vector<std::pair<ChannelKey, const Channel*>> open;
  for (const auto& [key, ch] : channels_) open.emplace_back(key, &ch);
  std::sort(open.begin(), open.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  for (const auto& [key, chp] : open) {
    const Channel& ch = *chp;
    const auto& [ctx, src, dst, tag] = key;
    auto g = groups_seen_.find(ctx);
    std::string where =
        g != groups_seen_.end() ? g->second.describe() : "group " + std::to_string(ctx);
    for (size_t i = 0; i < ch.recvs.size() && unmatched < 8; ++i, ++unmatched)
      s += "\n  rank " + std::to_string(dst) + " posted a recv from rank " + std::to_string(src) +
           " on " + where + " that no send matches";
    for (size_t i = 0; i < ch.sends.size() && unmatched < 8; ++i, ++unmatched)
      s += "\n  rank " + std::to_string(src) + " posted a send to rank " + std::to_string(dst) +
           " on " + where + " that no recv matches";
  }
  for (const auto& [key, e] : collectives_) {
    auto g = groups_seen_.find(key.first);
    if (g == groups_seen_.end()) continue;
    s += "\n  collective #" + std::to_string(key.second) + " " + std::string(e.call) + " on " +
         g->second.describe() + ": only " + std::to_string(e.seen) + " of " +
         std::to_string(g->second.members.size()) + " ranks called it";
  }
  return s;
}

void Kernel::account_flow(SimTime start, SimTime end, int src, int dst, std::int64_t bytes,
                          std::span<const std::uint32_t> labels) {
  const int copies = static_cast<int>(labels.size());
  const int tier = this->tier(src, dst);
  bytes_by_tier_[static_cast<size_t>(tier)] += bytes * copies;
  if (options_.trace) {
    for (const std::uint32_t label : labels) {
      if (flow_trace_.size() >= options_.trace_limit / 2) break;
      TraceEvent e;
      e.kind = TraceEvent::Kind::kFlow;
      e.rank = src;
      e.peer = dst;
      e.tier = tier;
      e.label = label;
      e.start = start;
      e.end = end;
      e.bytes = bytes;
      flow_trace_.push_back(e);
    }
  }
  flows_ += static_cast<std::uint64_t>(copies);
  std::uint64_t h = kHashBasis;
  hash_value(h, (start - flow_base_).ns());
  hash_value(h, (end - flow_base_).ns());
  hash_value(h, src);
  hash_value(h, dst);
  hash_value(h, bytes);
  // A full avalanche (splitmix64's finaliser) before the sum: no bit of a flow cancels another.
  h ^= h >> 33;
  h *= 0xFF51AFD7ED558CCDull;
  h ^= h >> 33;
  h *= 0xC4CEB9FE1A85EC53ull;
  h ^= h >> 33;
  flow_inner_ += h * static_cast<std::uint64_t>(copies);  // the sum of `copies` equal digests
}

bool Kernel::deliver_closed_form() {
  if (closed_pass_messages_.empty() && closed_messages_.empty()) return false;
  // Collective messages timed in closed form, and those they lead to (the next rounds'): as the
  // network's completions, the sender's part, then the receiver's; the members they finish are
  // woken at their ends (op_finish).
  while (!closed_messages_.empty()) {
    const ClosedMessage d = closed_messages_.back();
    closed_messages_.pop_back();
    try {
      op_message_done(*d.op, d.src, d.t);  // may finish and free op: dst's part is pending
      op_message_done(*d.op, d.dst, d.t);
    } catch (const CommError& e) {  // a mismatched message of a later round
      failures_.push_back({d.op->group->members[static_cast<size_t>(d.src)], d.t, e.what(), true});
      aborting_ = true;
      closed_messages_.clear();
    }
  }
  if (closed_pass_messages_.empty()) return true;
  // Each completion may finish a member's round, post its next round and match exclusive
  // messages whose completions join the list: the whole of an exclusive ring runs here. The
  // order does not matter: a member acts once all of its round's completions are in.
  while (!closed_pass_messages_.empty()) {
    const ClosedPassMessage d = closed_pass_messages_.back();
    closed_pass_messages_.pop_back();
    try {
      pass_message_done(*d.op, d.member, d.slot, d.t, d.count);
    } catch (const CommError& e) {  // a mismatched message of a later round
      failures_.push_back({d.op->members[static_cast<size_t>(d.member)].rank, d.t, e.what(), true});
      aborting_ = true;
      closed_pass_messages_.clear();
    }
  }
  return true;
}

bool Kernel::controller_step(std::unique_lock<NullLock>& lk) {
  (void)lk;
  // Fibers these completions wake may post before anything the network has next.
  if (run_whole_passes()) return true;
  if (deliver_closed_form()) return true;
  if (settle_undecided()) return true;  // their completions are delivered first
  flush_held();  // unpaired ring pass messages: through the network, from here in order
  // New transfers enter the network in a fixed order, whatever order the fibers matched them.
  if (!new_transfers_.empty()) {
    // Sorted through compact keys: a transfer record is 136 bytes, and each is moved once, in
    // order. (start, src, dst) decide almost every comparison; ties read the records.
    std::vector<TransferOrder>& order = transfer_order_;
    order.resize(new_transfers_.size());
    for (size_t i = 0; i < order.size(); ++i) {
      const Transfer& t = new_transfers_[i];
      order[i] = {t.start.ns(),
                  (static_cast<std::uint64_t>(static_cast<std::uint32_t>(t.src)) << 32) |
                      static_cast<std::uint32_t>(t.dst),
                  static_cast<std::uint32_t>(i)};
    }
    std::sort(order.begin(), order.end(), [this](const TransferOrder& x, const TransferOrder& y) {
      if (x.start != y.start) return x.start < y.start;
      if (x.ends != y.ends) return x.ends < y.ends;
      const Transfer& a = new_transfers_[x.index];
      const Transfer& b = new_transfers_[y.index];
      return std::tie(a.key, a.seq) < std::tie(b.key, b.seq);
    });
    if (in_flight_.size() + order.size() > in_flight_.capacity())
      in_flight_.set_capacity(
          std::max<size_t>({64, 2 * in_flight_.capacity(), in_flight_.size() + order.size()}));
    for (const TransferOrder& o : order) {
      Transfer& t = new_transfers_[o.index];
      const std::uint64_t id = next_flow_id_++;
      net_.add_flow(id, t.src, t.dst, t.bytes, t.start);
      COCO_CHECK(id == in_flight_base_ + in_flight_.size(), "flow ids are sequential");
      in_flight_.push_back(std::move(t));
    }
    new_transfers_.clear();
  }
  // Collective messages timed in closed form end in virtual time order among the network's
  // flows, as they would in the network model: the controller's steps, and so the tiles'
  // progress between them, are the same either way.
  const SimTime t_net = std::min(
      net_.next_event_time(), early_finishes_.empty() ? SimTime::max() : early_finishes_.front().t);
  const SimTime t_timer = timers_.empty() ? SimTime::max() : timers_.begin()->first;
  // A tile at a region mark waits like a timer at its own clock (it posts nothing earlier).
  SimTime t_region = SimTime::max();
  int region_mark = -1;
  for (const auto& [m, ms] : marks_)
    if (!ms.waiters.empty() && ms.min_clock < t_region) {
      t_region = ms.min_clock;
      region_mark = m;
    }
  if (t_net == SimTime::max() && t_timer == SimTime::max() && region_mark < 0)
    return false;  // stuck
  if (region_mark >= 0 && t_region < t_net && t_region < t_timer) {
    region_event(region_mark);
  } else if (t_net <= t_timer) {
    std::vector<std::uint64_t>& done = done_;  // kept between steps: no allocation per event
    done.clear();
    net_.advance_to(t_net, done);
    for (std::uint64_t id : done) {
      COCO_CHECK(id >= in_flight_base_ && id - in_flight_base_ < in_flight_.size(),
                 "unknown flow completed");
      std::optional<Transfer>& slot = in_flight_[id - in_flight_base_];
      COCO_CHECK(slot.has_value(), "flow completed twice");
      Transfer& t = *slot;
      account_flow(t.start, t_net, t.src, t.dst, t.bytes, {&t.label, 1});
      try {
        t.sink->message_done(*this, t, t_net);
      } catch (const CommError& e) {  // a mismatched message of a later round
        failures_.push_back({t.src, t_net, e.what(), true});
        aborting_ = true;
      }
      slot.reset();
      while (!in_flight_.empty() && !in_flight_.front().has_value()) {
        in_flight_.pop_front();
        ++in_flight_base_;
      }
    }
    while (!early_finishes_.empty() && early_finishes_.front().t == t_net) {
      std::pop_heap(early_finishes_.begin(), early_finishes_.end(), EarlyFinish::Later{});
      EarlyFinish w = std::move(early_finishes_.back());
      early_finishes_.pop_back();
      complete(*w.req, w.done);
    }
  } else {
    while (!timers_.empty() && timers_.begin()->first == t_timer) {
      FiberState* f = timers_.begin()->second;
      timers_.erase(timers_.begin());
      wake(*f);
    }
  }
  return true;
}

void Kernel::controller() {
  const StackBounds own_stack = asan_thread_stack();
  std::unique_lock<NullLock> lk(state_lock_);
  while (true) {
    controller_cv_.wait(lk, [this] { return runnable_ == 0; });
    asan_on_stack(own_stack);  // this thread may have run fibers while waiting
    if (live_ == 0) break;
    if (aborting_) {
      // Tear-down: wake everything still blocked; each throws Cancelled and ends.
      ready_runs_.clear();
      while (!blocked_list_.empty()) wake(*blocked_list_.back());
      timers_.clear();
      continue;
    }
    // Tape runs whose request completed issue their next calls, as their fibers would have on
    // waking; the fibers those calls wake run before the controller steps again.
    if (run_ready_tapes()) continue;
    if (!controller_step(lk)) {
      if (failures_.empty()) {
        std::string report = deadlock_report();
        failures_.push_back({-1, net_.now(), report, true});
      }
      aborting_ = true;
    }
  }
}

RunResult Kernel::run(const std::function<void(Communicator&)>& tile_main) {
  const int n = topo_.num_ranks();
  const int workers = options_.workers > 0
                          ? options_.workers
                          : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  tiles_.assign(static_cast<size_t>(n), TileStats{});
  tile_trace_cap_ = options_.trace_limit / 2 / static_cast<size_t>(n);
  bytes_by_tier_.assign(static_cast<size_t>(topo_.num_tiers()), 0);
  for (int r = 0; r < n; ++r) {
    mains_.push_back(std::make_unique<FiberState>());
    mains_.back()->rank = r;
  }
  const auto wall_start = std::chrono::steady_clock::now();

  // Every fiber runs on the controller's thread; the other workers run the tiles' arithmetic.
  MathPool math(workers - 1);
  math_ = &math;
  ThreadWake wake;
  std::thread controller_thread([&] {
    boost::fibers::use_scheduling_algorithm<ThreadQueueAlgorithm>(wake);
    {
      std::lock_guard<NullLock> lk(state_lock_);
      runnable_ = n;
      live_ = n;
    }
    for (int r = 0; r < n; ++r) {
      FiberState* f = mains_[static_cast<size_t>(r)].get();
      launch_fiber(PooledStack(main_stacks_, f->stack),
                   [this, f, &tile_main] { fiber_main(*f, tile_main); });
    }
    controller();
  });
  controller_thread.join();
  math_ = nullptr;

  if (!failures_.empty()) {
    // Report the failure that happened first in virtual time (ties: lowest rank).
    const Failure& f = *std::min_element(
        failures_.begin(), failures_.end(), [](const Failure& a, const Failure& b) {
          return std::tie(a.clock, a.rank) < std::tie(b.clock, b.rank);
        });
    if (f.rank < 0) throw CommError(f.message);
    if (f.message.rfind("rank ", 0) == 0)
      throw RankError(f.rank, f.message.substr(f.message.find(": ") + 2), f.user_error);
    throw RankError(f.rank, f.message, f.user_error);
  }

  RunResult res;
  res.wall_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_start).count();
  fold_flow_hash(SimTime{});
  Sha256 digest;
  for (int r = 0; r < n; ++r) {
    TileStats& t = tiles_[static_cast<size_t>(r)];
    hash_value(t.hash, t.region_start.ns());
    hash_value(t.hash, t.inner);
    res.rank_end.push_back(t.end);
    res.rank_compute.push_back(t.compute);
    res.rank_exposed.push_back(t.exposed);
    res.makespan = std::max(res.makespan, t.end);
    res.events += t.events;
    digest.update(std::as_bytes(std::span<const std::uint64_t>(&t.hash, 1)));
    const std::int64_t end_ns = t.end.ns();
    digest.update(std::as_bytes(std::span<const std::int64_t>(&end_ns, 1)));
    if (t.trace.size() >= tile_trace_cap_ && t.events > t.trace.size()) res.trace_truncated = true;
    res.trace.insert(res.trace.end(), t.trace.begin(), t.trace.end());
  }
  digest.update(std::as_bytes(std::span<const std::uint64_t>(&flow_hash_, 1)));
  res.timeline_sha256 = digest.hex();
  res.events += flows_;
  res.flows = flows_;
  res.flows_exclusive = flows_exclusive_;
  res.passes_whole = passes_whole_;
  res.regions_replayed = regions_replayed_;
  res.tapes_played = tapes_played_;
  res.tapes_run_by_engine = tapes_run_;
  if (options_.trace && flow_trace_.size() >= options_.trace_limit / 2) res.trace_truncated = true;
  // Flows in the order they start: the same list whether a flow was timed by the network model
  // or in closed form.
  std::stable_sort(
      flow_trace_.begin(), flow_trace_.end(), [](const TraceEvent& a, const TraceEvent& b) {
        return std::tie(a.start, a.rank, a.peer, a.end) < std::tie(b.start, b.rank, b.peer, b.end);
      });
  res.trace.insert(res.trace.end(), flow_trace_.begin(), flow_trace_.end());
  res.bytes_by_tier = bytes_by_tier_;
  res.labels = labels_;
  return res;
}

}  // namespace cocodiff::emu::detail
