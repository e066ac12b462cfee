#include "dit/parallel/tapa.hpp"

#include <algorithm>
#include <cstring>

#include "core/errors.hpp"
#include "core/hierarchy.hpp"
#include "dit/parallel/fp8.hpp"
#include "dit/parallel/v_major.hpp"

namespace cocodiff::dit {

namespace {

// Whether a phase runs as an all-to-all of one count rather than an all-to-allv: when this
// member sends and receives the same nonzero count to and from every member. Every member of
// the phase then decides alike (its counts are a token share times a head share, so equal
// nonzero counts on one member mean equal shares everywhere); a member with nothing to send or
// receive (no tokens or no heads under an uneven split) cannot tell and runs the all-to-allv.
bool uniform_counts(const std::vector<std::int64_t>& sc, const std::vector<std::int64_t>& rc) {
  if (sc.empty() || sc[0] == 0) return false;
  for (size_t v = 0; v < sc.size(); ++v)
    if (sc[v] != sc[0] || rc[v] != sc[0]) return false;
  return true;
}

double n(std::int64_t v) { return static_cast<double>(v); }

// `v` run-length coded: (value, run length), in order.
std::vector<std::pair<std::int64_t, int>> runs_of(const std::vector<std::int64_t>& v) {
  std::vector<std::pair<std::int64_t, int>> r;
  for (const std::int64_t x : v) {
    if (!r.empty() && r.back().first == x)
      ++r.back().second;
    else
      r.push_back({x, 1});
  }
  return r;
}

// Whether `runs` codes `v`.
bool same_runs(const std::vector<std::pair<std::int64_t, int>>& runs,
               const std::vector<std::int64_t>& v) {
  size_t i = 0;
  for (const auto& [x, len] : runs) {
    if (v.size() - i < static_cast<size_t>(len)) return false;
    for (const size_t end = i + static_cast<size_t>(len); i < end; ++i)
      if (v[i] != x) return false;
  }
  return i == v.size();
}

// Elements of block `b` on the wire (SpGroup::counts' formats; BlockExchange::wire).
std::int64_t wire_numel(BlockShape b, int wire) {
  if (wire == 2) return b.rows * int4_row_words(b.cols);
  if (wire == 1) return b.rows * fp8_row_words(b.cols);
  return b.numel();
}

// Shapes SpGroup::counts keeps (an attention layer has two: to heads, to the sequence; pipelined
// chunks a few more).
constexpr size_t kCountsKept = 8;

// Phase k's send and receive orders, and where each sent block sits in `prev` (the last order).
void order_phase(SpGroup::Phase& ph, const MemberDigits& digits, const std::vector<int>& md, int k,
                 const std::vector<std::pair<int, int>>& prev, int p) {
  const int nl = digits.count();
  ph.send = enumerate_blocks(digits, md, order_before(k, nl));
  ph.recv = enumerate_blocks(digits, md, order_received(k, nl));
  std::vector<std::pair<std::int64_t, int>> index;
  for (size_t i = 0; i < prev.size(); ++i)
    index.push_back({std::int64_t{prev[i].first} * p + prev[i].second, static_cast<int>(i)});
  std::sort(index.begin(), index.end());
  for (const auto& [s, d] : ph.send) {
    const std::int64_t key = std::int64_t{s} * p + d;
    auto it = std::lower_bound(index.begin(), index.end(), std::make_pair(key, -1));
    COCO_CHECK(it != index.end() && it->first == key, "TAPA block order");
    ph.send_from.push_back(it->second);
  }
}

// Phase k's runs of blocks per member and the topology tier of the link to each member.
void set_phase_members(SpGroup::Phase& ph, const Communicator& group, int p) {
  const int me = group.rank();
  const int per = p / ph.members;
  for (int v = 0; v <= ph.members; ++v) {
    ph.send_member_begin.push_back(v * per);
    ph.recv_member_begin.push_back(v * per);
  }
  for (int v = 0; v < ph.members; ++v) {
    const int w = ph.comm->world_rank(v);
    const int my_w = group.world_rank(me);
    ph.member_tier.push_back(w == my_w ? -1 : group.topology().tier(my_w, w));
  }
}

}  // namespace

SpGroup::SpGroup(Communicator& group, bool tapa) : group_(group), tapa_(tapa) {
  const int p = group.size();
  const int me = group.rank();
  const MemberDigits digits = member_digits(group);
  const int nl = digits.count();
  const bool aligned = is_aligned(group, digits);
  if (tapa && !aligned)
    throw ConfigError(
        "TAPA needs a sequence-parallel group that is a full box of the topology "
        "in rank order; this group of " +
        std::to_string(p) + " ranks is not");
  if (!tapa || nl <= 1) {
    add_flat_phase();
    return;
  }
  const std::vector<int> md = digits.of(me);
  std::vector<std::pair<int, int>> prev;
  prev.reserve(static_cast<size_t>(p));
  for (int d = 0; d < p; ++d) prev.push_back({me, d});  // the caller's order: destination rank
  for (int k = 0; k < nl; ++k) {
    Phase ph;
    // One group per combination of the other digits; group rank = digit k.
    std::vector<int> c = md;
    c[static_cast<size_t>(k)] = 0;
    level_comms_.push_back(group_.split(digits.encode(c), md[static_cast<size_t>(k)]));
    ph.comm = level_comms_.back().get();
    ph.members = digits.radix[static_cast<size_t>(k)];
    order_phase(ph, digits, md, k, prev, p);
    set_phase_members(ph, group_, p);
    prev = ph.recv;
    phases_.push_back(std::move(ph));
  }
  for (int s = 0; s < p; ++s)
    COCO_CHECK(prev[static_cast<size_t>(s)] == std::make_pair(s, me), "TAPA final order");
}

// The flat group's one phase: an all-to-all over the whole group, blocks in rank order.
void SpGroup::add_flat_phase() {
  const int p = group_.size();
  const int me = group_.rank();
  tapa_ = false;
  Phase ph;
  ph.comm = &group_;
  ph.members = p;
  for (int d = 0; d < p; ++d) {
    ph.send.push_back({me, d});
    ph.send_from.push_back(d);
    ph.recv.push_back({d, me});
  }
  for (int v = 0; v <= p; ++v) {
    ph.send_member_begin.push_back(v);
    ph.recv_member_begin.push_back(v);
  }
  for (int v = 0; v < p; ++v) ph.member_tier.push_back(tier_to(v));
  phases_.push_back(std::move(ph));
}

void SpGroup::begin_forward(int step, int pass) const {
  residual_state_->step = step;
  residual_state_->pass = pass;
  residual_state_->next = 0;
}

SpGroup::ResidualSite& SpGroup::next_residual_site(bool& coded) const {
  ResidualState& st = *residual_state_;
  coded = st.step > 0;
  return st.sites[{st.pass, st.next++}];
}

std::shared_ptr<const SpGroup::ExchangeCounts> SpGroup::counts(const BlockShapeFn& shape,
                                                               int wire) const {
  for (const CountsEntry& e : counts_cache_)
    if (e.wire == wire && e.rows_by_source == shape.rows_by_source() &&
        same_runs(e.rows, shape.rows()) && same_runs(e.cols, shape.cols()))
      return e.counts;
  auto c = std::make_shared<ExchangeCounts>();
  for (const Phase& ph : phases_) {
    ExchangeCounts::PhaseCounts pc;
    const size_t m = static_cast<size_t>(ph.members);
    pc.send.assign(m, 0);
    pc.recv.assign(m, 0);
    for (size_t v = 0; v < m; ++v) {
      for (int i = ph.send_member_begin[v]; i < ph.send_member_begin[v + 1]; ++i) {
        const auto& [s, d] = ph.send[static_cast<size_t>(i)];
        pc.send[v] += wire_numel(shape(s, d), wire);
      }
      for (int i = ph.recv_member_begin[v]; i < ph.recv_member_begin[v + 1]; ++i) {
        const auto& [s, d] = ph.recv[static_cast<size_t>(i)];
        pc.recv[v] += wire_numel(shape(s, d), wire);
      }
    }
    c->phases.push_back(std::move(pc));
  }
  for (const std::int64_t x : c->phases.front().send) c->send_total += x;
  for (const auto& [s, d] : phases_.front().send) c->elements += shape(s, d).numel();
  for (int s = 0; s < size(); ++s) c->received += shape(s, rank()).numel();
  if (counts_cache_.size() == kCountsKept) counts_cache_.erase(counts_cache_.begin());
  counts_cache_.push_back(
      CountsEntry{runs_of(shape.rows()), runs_of(shape.cols()), shape.rows_by_source(), wire, c});
  return c;
}

int SpGroup::tier_to(int m) const {
  const int a = group_.world_rank(group_.rank()), b = group_.world_rank(m);
  return a == b ? -1 : group_.topology().tier(a, b);
}

BlockExchange::BlockExchange(const SpGroup& g, ShapeFn shape, bool phantom, std::string label,
                             VMajorChannel* v_major)
    : g_(&g),
      shape_(std::move(shape)),
      phantom_(phantom),
      label_(std::move(label)),
      v_major_(v_major),
      fp8_(g.fp8() && v_major == nullptr),
      residual_(g.residual() && v_major == nullptr) {}

BlockShape BlockExchange::wire(int s, int d) const {
  const BlockShape b = shape_(s, d);
  if (int4_) return BlockShape{b.rows, int4_row_words(b.cols)};
  return fp8_ ? BlockShape{b.rows, fp8_row_words(b.cols)} : b;
}

std::int64_t BlockExchange::pack_phase0(const FillFn& fill) {
  const SpGroup::Phase& ph = g_->phases()[0];
  // Phase 0 is packed straight from the caller's tensor in the phase's send order.
  std::int64_t total = 0, elements = 0;
  for (const auto& [s, d] : ph.send) {
    total += wire(s, d).numel();
    elements += shape_(s, d).numel();
  }
  cur_.clear();
  cur_offset_.assign(ph.send.size(), 0);
  if (!phantom_) cur_.resize(static_cast<size_t>(total));
  if (site_ != nullptr && !phantom_ &&
      site_->sent.size() != static_cast<size_t>(elements))  // new, or another shape: from zero
    site_->sent.assign(static_cast<size_t>(elements), 0.0f);
  // cur_ holds the blocks in phase-0 send order; send_from is then the identity.
  std::int64_t at = 0, sent_at = 0;
  Mat staged;  // FP8, residuals: a block before it is encoded
  for (size_t i = 0; i < ph.send.size(); ++i) {
    const BlockShape b = shape_(ph.send[i].first, ph.send[i].second);
    if (!phantom_ && b.numel() > 0 && site_ != nullptr) {
      MatMap sent(site_->sent.data() + sent_at, b.rows, b.cols);
      if (int4_) {
        // The change since the reconstruction both ends hold, coded; the reconstruction moves
        // by what the receiver will decode.
        staged.resize(b.rows, b.cols);
        fill(ph.send[i].second, MatMap(staged.data(), b.rows, b.cols));
        staged -= sent;
        int4_encode(ConstMatMap(staged.data(), b.rows, b.cols), cur_.data() + at);
        int4_decode(cur_.data() + at, MatMap(staged.data(), b.rows, b.cols));
        sent += staged;
      } else {
        fill(ph.send[i].second, MatMap(cur_.data() + at, b.rows, b.cols));
        sent = ConstMatMap(cur_.data() + at, b.rows, b.cols);
      }
    } else if (!phantom_ && b.numel() > 0) {
      if (fp8_) {
        staged.resize(b.rows, b.cols);
        fill(ph.send[i].second, MatMap(staged.data(), b.rows, b.cols));
        fp8_encode(ConstMatMap(staged.data(), b.rows, b.cols), cur_.data() + at);
      } else {
        fill(ph.send[i].second, MatMap(cur_.data() + at, b.rows, b.cols));
      }
    }
    cur_offset_[static_cast<size_t>(ph.send_from[i])] = at;
    at += wire(ph.send[i].first, ph.send[i].second).numel();
    sent_at += b.numel();
  }
  return elements;
}

void BlockExchange::start(const Exec& ex, const FillFn& fill) {
  // Residuals: this exchange's site, matched with the same exchange of the step before.
  int4_ = false;
  site_ = residual_ ? &g_->next_residual_site(int4_) : nullptr;
  // Phantom, without V-Major: the sizes alone, from the group (the same for every exchange of
  // these shapes); nothing is packed.
  counts_ = phantom_ && v_major_ == nullptr ? g_->counts(shape_, int4_  ? 2
                                                                 : fp8_ ? 1
                                                                        : 0)
                                            : nullptr;
  std::int64_t elements = 0;
  if (counts_ != nullptr) {
    elements = counts_->elements;
    cur_.clear();
    cur_offset_.clear();
  } else {
    elements = pack_phase0(fill);
  }
  ex.charge(OpKind::kCopy, 0, 2.0 * n(elements), "a2a_pack",
            memory_shape(KernelClass::kLayoutA2a, elements, 0));
  // Residuals: subtract, a row's absolute maximum, scale, round and pack, decode and add back to
  // the reconstruction (reads the block and the reconstruction, writes both and a nibble).
  if (int4_)
    ex.charge(OpKind::kElementwise, 7.0 * n(elements), 4.25 * n(elements), "residual_quantize",
              memory_shape(KernelClass::kMul, elements, 0));
  // FP8: a row's absolute maximum, then scale, round and pack (reads it twice, writes a byte).
  if (fp8_)
    ex.charge(OpKind::kElementwise, 4.0 * n(elements), 2.5 * n(elements), "fp8_quantize",
              memory_shape(KernelClass::kMul, elements, 0));
  phase_ = 0;
  sub_step_ = 0;
  awaiting_launch_ = false;
  decoded_ready_ = false;
  phase_done_.clear();
  waited_ = SimTime();
  launch_phase(ex);
  launch_time_ = ex.comm.now();
}

PhaseIo BlockExchange::io() {
  return PhaseIo{g_->phases()[static_cast<size_t>(phase_)],
                 shape_,
                 phantom_,
                 send_,
                 send_off_,
                 recv_,
                 recv_off_,
                 layout_,
                 mask_send_,
                 mask_recv_,
                 mask_layout_};
}

void BlockExchange::launch_phase(const Exec& ex) {
  if (counts_ != nullptr) {
    launch_counted_phase(ex);
    return;
  }
  const SpGroup::Phase& ph = g_->phases()[static_cast<size_t>(phase_)];
  const size_t m = static_cast<size_t>(ph.members);
  // Sizes of the send and receive orders.
  send_off_.assign(ph.send.size() + 1, 0);
  recv_off_.assign(ph.recv.size() + 1, 0);
  for (size_t i = 0; i < ph.send.size(); ++i)
    send_off_[i + 1] = send_off_[i] + wire(ph.send[i].first, ph.send[i].second).numel();
  for (size_t i = 0; i < ph.recv.size(); ++i)
    recv_off_[i + 1] = recv_off_[i] + wire(ph.recv[i].first, ph.recv[i].second).numel();
  const std::int64_t send_total = send_off_.back(), recv_total = recv_off_.back();
  // Re-pack the current buffer into this phase's send order (phase 0: start() packed it in
  // this order already, so it becomes the send buffer as it is).
  send_.clear();
  if (!phantom_ && phase_ == 0) {
    send_.swap(cur_);
  } else if (!phantom_) {
    send_.resize(static_cast<size_t>(send_total));
    for (size_t i = 0; i < ph.send.size(); ++i) {
      const std::int64_t len = send_off_[i + 1] - send_off_[i];
      if (len > 0)
        std::memcpy(send_.data() + send_off_[i],
                    cur_.data() + cur_offset_[static_cast<size_t>(ph.send_from[i])],
                    static_cast<size_t>(len) * sizeof(float));
    }
  }
  if (phase_ > 0)
    ex.charge(OpKind::kCopy, 0, 2.0 * n(send_total), "tapa_repack",
              memory_shape(KernelClass::kLayoutA2a, send_total, 0));
  // The layout is filled in place (an all-to-allv reads it until the phase completes).
  std::vector<std::int64_t>& sc = layout_.send_counts;
  std::vector<std::int64_t>& rc = layout_.recv_counts;
  std::vector<std::int64_t>& sdp = layout_.send_displs;
  std::vector<std::int64_t>& rdp = layout_.recv_displs;
  sc.resize(m);
  rc.resize(m);
  sdp.resize(m);
  rdp.resize(m);
  for (size_t v = 0; v < m; ++v) {
    const size_t sb = static_cast<size_t>(ph.send_member_begin[v]);
    const size_t se = static_cast<size_t>(ph.send_member_begin[v + 1]);
    const size_t rb = static_cast<size_t>(ph.recv_member_begin[v]);
    const size_t re = static_cast<size_t>(ph.recv_member_begin[v + 1]);
    sdp[v] = send_off_[sb];
    sc[v] = send_off_[se] - send_off_[sb];
    rdp[v] = recv_off_[rb];
    rc[v] = recv_off_[re] - recv_off_[rb];
  }
  cur_offset_.assign(recv_off_.begin(), recv_off_.end() - 1);
  recv_.clear();
  if (!phantom_) recv_.resize(static_cast<size_t>(recv_total));
  if (v_major_ != nullptr && v_major_->selective(ph)) {
    // V-Major: selective peers get a mask of the active blocks first, then only those blocks.
    PhaseIo pio = io();
    v_major_->pack(ex, phase_, pio);
    sub_step_ = 0;
    request_ = ph.comm->iall_to_allv(mask_send_, mask_recv_, mask_layout_, label_ + "_mask");
    return;
  }
  if (v_major_ != nullptr) {
    PhaseIo pio = io();
    v_major_->record_sent(phase_, pio);
  }
  sub_step_ = 1;
  if (uniform_counts(sc, rc))
    request_ = ph.comm->iall_to_all(send_, recv_, sc[0], label_);
  else
    request_ = ph.comm->iall_to_allv(send_, recv_, layout_, label_);
}

void BlockExchange::launch_counted_phase(const Exec& ex) {
  // launch_phase() in phantom mode without V-Major, from the group's counts: the same charge,
  // layout and call.
  const SpGroup::Phase& ph = g_->phases()[static_cast<size_t>(phase_)];
  const SpGroup::ExchangeCounts::PhaseCounts& pc = counts_->phases[static_cast<size_t>(phase_)];
  const size_t m = static_cast<size_t>(ph.members);
  send_.clear();
  if (phase_ > 0) {
    std::int64_t send_total = 0;
    for (const std::int64_t c : pc.send) send_total += c;
    ex.charge(OpKind::kCopy, 0, 2.0 * n(send_total), "tapa_repack",
              memory_shape(KernelClass::kLayoutA2a, send_total, 0));
  }
  std::vector<std::int64_t>& sc = layout_.send_counts;
  std::vector<std::int64_t>& rc = layout_.recv_counts;
  std::vector<std::int64_t>& sdp = layout_.send_displs;
  std::vector<std::int64_t>& rdp = layout_.recv_displs;
  sc.assign(pc.send.begin(), pc.send.end());
  rc.assign(pc.recv.begin(), pc.recv.end());
  sdp.resize(m);
  rdp.resize(m);
  std::int64_t sat = 0, rat = 0;
  for (size_t v = 0; v < m; ++v) {
    sdp[v] = sat;
    rdp[v] = rat;
    sat += sc[v];
    rat += rc[v];
  }
  recv_.clear();
  sub_step_ = 1;
  if (uniform_counts(sc, rc))
    request_ = ph.comm->iall_to_all(send_, recv_, sc[0], label_);
  else
    request_ = ph.comm->iall_to_allv(send_, recv_, layout_, label_);
}

void BlockExchange::complete_phase(const Exec& ex) {
  const SpGroup::Phase& ph = g_->phases()[static_cast<size_t>(phase_)];
  if (sub_step_ == 0) {
    // V-Major: the mask tells this rank how much each selective peer sends.
    PhaseIo pio = io();
    v_major_->plan_receive(phase_, pio);
    sub_step_ = 1;
    request_ = ph.comm->iall_to_allv(send_, recv_, layout_, label_);
    return;
  }
  if (v_major_ != nullptr) {
    PhaseIo pio = io();
    if (v_major_->selective(ph))
      v_major_->unpack(ex, phase_, pio);
    else
      v_major_->record_received(phase_, pio);
  }
  if (!phantom_) recv_.resize(static_cast<size_t>(recv_off_.back()));
  cur_.swap(recv_);
  phase_done_.push_back(request_.completed_at(ex.comm.now()));
  ++phase_;
  sub_step_ = 0;
  awaiting_launch_ = !done();  // launched by progress() or wait_step()
}

int BlockExchange::issued_phases() const {
  if (done() || awaiting_launch_) return phase_;
  return sub_step_ == 1 ? phase_ + 1 : phase_;
}

bool BlockExchange::progress(const Exec& ex, int launch_limit) {
  while (!done()) {
    if (awaiting_launch_) {
      if (phase_ >= launch_limit) break;
      awaiting_launch_ = false;
      launch_phase(ex);
    }
    if (!request_.test()) break;
    complete_phase(ex);
  }
  return done();
}

void BlockExchange::wait_step(const Exec& ex) {
  if (done()) return;
  if (awaiting_launch_) {
    awaiting_launch_ = false;
    launch_phase(ex);
  }
  const SimTime t0 = ex.comm.now();
  request_.wait();
  waited_ += ex.comm.now() - t0;
  complete_phase(ex);
}

void BlockExchange::finish(const Exec& ex) {
  while (!done()) wait_step(ex);
  send_ = {};
  mask_send_ = {};
  mask_recv_ = {};
  if (site_ != nullptr) {
    finish_residual(ex);
    return;
  }
  if (!fp8_ || decoded_ready_) return;
  decoded_ready_ = true;
  // Every block that arrived, decoded once, in source order.
  const int me = g_->rank(), p = g_->size();
  const std::int64_t elements = counts_ != nullptr ? counts_->received : set_decoded_offsets();
  if (!phantom_) {
    decoded_.resize(static_cast<size_t>(elements));
    for (int s = 0; s < p; ++s) {
      const BlockShape b = shape_(s, me);
      if (b.numel() > 0)
        fp8_decode(cur_.data() + cur_offset_[static_cast<size_t>(s)],
                   MatMap(decoded_.data() + decoded_off_[static_cast<size_t>(s)], b.rows, b.cols));
    }
  }
  ex.charge(OpKind::kElementwise, n(elements), 1.5 * n(elements), "fp8_dequantize",
            memory_shape(KernelClass::kMul, elements, 0));
}

std::int64_t BlockExchange::set_decoded_offsets() {
  const int me = g_->rank(), p = g_->size();
  decoded_off_.assign(static_cast<size_t>(p) + 1, 0);
  for (int s = 0; s < p; ++s)
    decoded_off_[static_cast<size_t>(s) + 1] =
        decoded_off_[static_cast<size_t>(s)] + shape_(s, me).numel();
  return decoded_off_.back();
}

void BlockExchange::finish_residual(const Exec& ex) {
  if (decoded_ready_) return;
  decoded_ready_ = true;
  // What arrived, added to (residuals) or taken as (the first step) the reconstruction of what
  // each source sent; that reconstruction is the exchange's result.
  const int me = g_->rank(), p = g_->size();
  const std::int64_t elements = counts_ != nullptr ? counts_->received : set_decoded_offsets();
  if (!phantom_) {
    std::vector<float>& got = site_->received;
    if (got.size() != static_cast<size_t>(elements))
      got.assign(static_cast<size_t>(elements), 0.0f);
    Mat change;
    for (int s = 0; s < p; ++s) {
      const BlockShape b = shape_(s, me);
      if (b.numel() == 0) continue;
      MatMap recon(got.data() + decoded_off_[static_cast<size_t>(s)], b.rows, b.cols);
      const float* in = cur_.data() + cur_offset_[static_cast<size_t>(s)];
      if (int4_) {
        change.resize(b.rows, b.cols);
        int4_decode(in, MatMap(change.data(), b.rows, b.cols));
        recon += change;
      } else {
        recon = ConstMatMap(in, b.rows, b.cols);
      }
    }
  }
  if (int4_)
    ex.charge(OpKind::kElementwise, 2.0 * n(elements), 2.25 * n(elements), "residual_dequantize",
              memory_shape(KernelClass::kMul, elements, 0));
}

ConstMatMap BlockExchange::block(int s) const {
  COCO_CHECK(done() && !phantom_ && (!(fp8_ || site_ != nullptr) || decoded_ready_),
             "block() before finish() or in phantom mode");
  const int me = g_->rank();
  const BlockShape b = shape_(s, me);
  if (site_ != nullptr)
    return ConstMatMap(site_->received.data() + decoded_off_[static_cast<size_t>(s)], b.rows,
                       b.cols);
  if (fp8_)
    return ConstMatMap(decoded_.data() + decoded_off_[static_cast<size_t>(s)], b.rows, b.cols);
  return ConstMatMap(cur_.data() + cur_offset_[static_cast<size_t>(s)], b.rows, b.cols);
}

}  // namespace cocodiff::dit
