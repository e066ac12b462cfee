#pragma once
// Block all-to-all over a sequence-parallel group, flat or TAPA (tile-aware parallel
// all-to-all). Every member s sends one block to every member d; block (s, d) has a shape both
// sides can compute (BlockShape), so uneven token shards and uneven head splits need no size
// exchange.
//
// TAPA: the group's members differ in some topology levels (tile, gpu, node); phase k is one
// all-to-all among the members that differ only in coordinate k, all such groups at once, so
// every message crosses one direct link. A holder's buffer before phase k is ordered by the
// digits (outermost first) [d_k, d_k+1, ..., d_L-1, s_k-1, ..., s_0] (s_j, d_j: coordinate j
// of a block's source and destination), so each peer's blocks are contiguous; it receives
// [s_k, d_k+1, ..., d_L-1, s_k-1, ..., s_0] and re-packs locally before the next phase. After
// the last phase the order is [s_L-1, ..., s_0]: source rank order, what a flat all-to-all gives.
//
//   SpGroup g(comm, /*tapa=*/true);            // collective: one split per level, cached
//   BlockExchange x(g, shape_fn, phantom, "v_all_to_all");
//   x.start(ex, fill_fn);                      // packs phase 0 and launches it
//   x.progress(ex);                            // between compute steps: next phase if ready
//   x.finish(ex);                              // blocking; x.block(s) = block (s, me)

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/communicator.hpp"
#include "core/tensor.hpp"
#include "dit/exec.hpp"

namespace cocodiff::dit {

class VMajorChannel;

struct BlockShape {
  std::int64_t rows = 0;
  std::int64_t cols = 0;
  std::int64_t numel() const { return rows * cols; }
};

/// The shapes of an exchange's blocks: block (s, d), from member s to member d, has a row count
/// indexed by one end and a column count indexed by the other (sequence -> heads: rows by the
/// source's tokens, columns by the destination's heads; heads -> sequence the other way round).
/// Tables, not a callback: a TAPA exchange asks for every block's shape several times, and at
/// 1,536 tiles that is millions of lookups per layer.
class BlockShapeFn {
 public:
  /// rows[i], cols[j] for i, j < members; rows follow the source when rows_by_source.
  BlockShapeFn(std::vector<std::int64_t> rows, std::vector<std::int64_t> cols, bool rows_by_source)
      : rows_(std::move(rows)), cols_(std::move(cols)), rows_by_source_(rows_by_source) {}
  /// Every block [rows, cols].
  static BlockShapeFn uniform(int members, std::int64_t rows, std::int64_t cols) {
    return BlockShapeFn(std::vector<std::int64_t>(static_cast<size_t>(members), rows),
                        std::vector<std::int64_t>(static_cast<size_t>(members), cols), true);
  }
  BlockShape operator()(int s, int d) const {
    const auto r = static_cast<size_t>(rows_by_source_ ? s : d);
    const auto c = static_cast<size_t>(rows_by_source_ ? d : s);
    return BlockShape{rows_[r], cols_[c]};
  }
  const std::vector<std::int64_t>& rows() const { return rows_; }
  const std::vector<std::int64_t>& cols() const { return cols_; }
  bool rows_by_source() const { return rows_by_source_; }

 private:
  std::vector<std::int64_t> rows_, cols_;
  bool rows_by_source_ = true;
};

/// The SP group and its exchange phases: one (flat) or one per varying topology level (TAPA).
class SpGroup {
 public:
  /// Collective over `group` (borrowed). Its members must be the ranks that differ from this one
  /// only in some topology levels, in rank order (as split() by the other coordinates gives).
  SpGroup(Communicator& group, bool tapa);
  Communicator& comm() const { return group_; }
  /// The exchanges' payload on the wire (StrategyOptions::compress): FP8 when true
  /// (dit/parallel/fp8.hpp), except for exchanges with a V-Major channel.
  void set_fp8(bool on) { fp8_ = on; }
  bool fp8() const { return fp8_; }
  /// Residual exchanges (StrategyOptions::compress = "residual", dit/parallel/fp8.hpp): from the
  /// second step on, each exchange sends its blocks' change since the same exchange of the step
  /// before as 4-bit codes, against the reconstruction both ends keep; the first step sends the
  /// blocks themselves. Not for exchanges with a V-Major channel.
  void set_residual(bool on) { residual_ = on; }
  bool residual() const { return residual_; }
  /// The forward that starts (AttentionStrategy::begin_forward): its exchanges are matched, in
  /// the order they start, with those of the same pass of the step before.
  void begin_forward(int step, int pass) const;
  /// The reconstructions of one exchange of a forward: what this rank sent (phase-0 send order)
  /// and what it received (source order), as both ends hold them.
  struct ResidualSite {
    std::vector<float> sent, received;
  };
  /// The next exchange's site; whether it sends residuals (a step after the first).
  ResidualSite& next_residual_site(bool& coded) const;
  int size() const { return group_.size(); }
  int rank() const { return group_.rank(); }
  bool tapa() const { return tapa_; }

  struct Phase {
    Communicator* comm = nullptr;  // the phase's all-to-all group (group_ itself when flat)
    int members = 1;
    std::vector<std::pair<int, int>> send;  // (s, d) in send order; member v owns a run of them
    std::vector<int> send_from;             // index of send[i] in the previous order
    std::vector<std::pair<int, int>> recv;  // (s, d) in receive order
    std::vector<int> send_member_begin, recv_member_begin;  // runs per member (size members+1)
    std::vector<int> member_tier;  // topology tier of the link to each member (-1: self)
  };
  const std::vector<Phase>& phases() const { return phases_; }
  /// Topology tier of the link between this rank and group member `m` (-1: itself).
  int tier_to(int m) const;

  /// What a phantom exchange without V-Major needs of its blocks' sizes, in elements on the
  /// wire: per phase, what this rank sends to and receives from each member; and the phase-0
  /// send total, the blocks' elements before encoding, and the elements of the blocks this
  /// rank receives (source order). A function of the block shapes and the wire format alone,
  /// and the same for every exchange of a layer's Q, K and V (and of every layer), so it is
  /// worked out once per shape: at 1,536 tiles each is a sum over the group's 1,536 blocks per
  /// phase, which every exchange of every tile otherwise walks again.
  struct ExchangeCounts {
    struct PhaseCounts {
      std::vector<std::int64_t> send, recv;  // per member of the phase
    };
    std::vector<PhaseCounts> phases;
    std::int64_t send_total = 0;  // phase 0, on the wire
    std::int64_t elements = 0;    // phase 0, before encoding
    std::int64_t received = 0;    // block (s, me) over every s, before encoding
  };
  /// The counts of an exchange of blocks `shape` whose wire format is `wire` (0: floats, 1:
  /// FP8 rows, 2: 4-bit rows); shared with the exchanges that hold it (the group keeps a few).
  std::shared_ptr<const ExchangeCounts> counts(const BlockShapeFn& shape, int wire) const;

 private:
  // Sets the one phase of a flat group: an all-to-all over the whole group.
  void add_flat_phase();

  Communicator& group_;
  bool tapa_;
  bool fp8_ = false;
  bool residual_ = false;
  struct ResidualState {
    int step = 0, pass = 0, next = 0;
    std::map<std::pair<int, int>, ResidualSite> sites;  // by (pass, exchange of the forward)
  };
  std::unique_ptr<ResidualState> residual_state_ = std::make_unique<ResidualState>();
  std::vector<std::unique_ptr<Communicator>> level_comms_;
  std::vector<Phase> phases_;
  // counts(): the shapes seen most recently, newest last. The tables are kept run-length coded
  // (a member's tokens and heads take two or three values): a few bytes a shape, not 2 x 8
  // bytes a member on every tile.
  struct CountsEntry {
    std::vector<std::pair<std::int64_t, int>> rows, cols;  // (value, run length)
    bool rows_by_source = true;
    int wire = 0;
    std::shared_ptr<const ExchangeCounts> counts;
  };
  mutable std::vector<CountsEntry> counts_cache_;
};

/// Allocates like std::allocator but default-initialises: a vector using it grows without
/// zero-filling, for buffers that are written before they are read.
template <class T>
struct DefaultInitAllocator : std::allocator<T> {
  template <class U>
  struct rebind {
    using other = DefaultInitAllocator<U>;
  };
  using std::allocator<T>::allocator;
  template <class U>
  void construct(U* p) noexcept(std::is_nothrow_default_constructible_v<U>) {
    ::new (static_cast<void*>(p)) U;
  }
  template <class U, class... Args>
  void construct(U* p, Args&&... args) {
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }
};

/// An exchange buffer: every element is packed or received before it is read.
using FloatBuffer = std::vector<float, DefaultInitAllocator<float>>;

/// The buffers of one phase, as a V-Major channel sees them. Offsets are per block of the
/// phase's send / receive order (size blocks + 1); the full region of `send` / `recv` holds every
/// block at those offsets, compacted data for selective peers goes after it.
struct PhaseIo {
  const SpGroup::Phase& ph;
  const BlockShapeFn& shape;
  bool phantom;
  FloatBuffer& send;
  const std::vector<std::int64_t>& send_off;
  FloatBuffer& recv;
  const std::vector<std::int64_t>& recv_off;
  AllToAllvLayout& layout;  // of the data exchange
  std::vector<float>& mask_send;
  std::vector<float>& mask_recv;
  AllToAllvLayout& mask_layout;
};

/// One in-flight block all-to-all. Buffers live in the object; keep it alive until finish().
class BlockExchange {
 public:
  using ShapeFn = BlockShapeFn;
  /// Writes block (me, d), a [rows, cols] row-major matrix, into `out`.
  using FillFn = std::function<void(int d, MatMap out)>;

  BlockExchange(const SpGroup& g, ShapeFn shape, bool phantom, std::string label,
                VMajorChannel* v_major = nullptr);
  BlockExchange(BlockExchange&&) = default;
  BlockExchange& operator=(BlockExchange&&) = default;

  /// Packs phase 0 (charged as a copy) and launches it.
  void start(const Exec& ex, const FillFn& fill);
  /// Non-blocking: completes the step in flight if it is through and launches the next phase
  /// when its index is below `launch_limit`. Several exchanges in flight on the same phase
  /// communicators must issue their collectives in the same order on every rank: a caller with
  /// exchanges A then B passes B the limit A.issued_phases(), so B's phase k never goes before
  /// A's. Returns true once every phase has completed.
  bool progress(const Exec& ex, int launch_limit = 1 << 30);
  /// Blocks until the step in flight (a phase, or a V-Major mask) completes; launches the next
  /// phase (ignoring any limit: call it on the oldest exchange only). No-op when done.
  void wait_step(const Exec& ex);
  /// Phases whose collectives have all been issued.
  int issued_phases() const;
  /// Blocks until done. Afterwards block(s) is what member s sent to this rank.
  void finish(const Exec& ex);
  bool done() const { return phase_ >= static_cast<int>(g_->phases().size()); }
  ConstMatMap block(int s) const;

  SimTime launch_time() const { return launch_time_; }
  /// When phase k completed: exact on the emulator; on MPI, when it was first seen complete.
  SimTime phase_done(int k) const { return phase_done_.at(static_cast<size_t>(k)); }
  int phases_seen() const { return static_cast<int>(phase_done_.size()); }
  SimTime end_time() const { return phase_done_.empty() ? launch_time_ : phase_done_.back(); }
  /// Time this rank spent blocked in finish().
  SimTime waited() const { return waited_; }

 private:
  // Block (s, d) as it travels: its shape, or its FP8 rows' words.
  BlockShape wire(int s, int d) const;
  // Packs phase 0 from `fill` (phantom: its offsets alone); returns the blocks' elements.
  std::int64_t pack_phase0(const FillFn& fill);
  void launch_phase(const Exec& ex);
  void launch_counted_phase(const Exec& ex);
  void finish_residual(const Exec& ex);
  // decoded_off_: where each source's block starts among what arrived (source order); returns
  // the elements of all of them.
  std::int64_t set_decoded_offsets();
  void complete_phase(const Exec& ex);
  PhaseIo io();

  const SpGroup* g_ = nullptr;
  ShapeFn shape_;
  bool phantom_ = false;
  std::string label_;
  VMajorChannel* v_major_ = nullptr;
  bool fp8_ = false;       // the payload is FP8 (decoded_ holds what arrived)
  bool residual_ = false;  // the group sends residuals (site_ is this exchange's)
  bool int4_ = false;      // this exchange's payload is 4-bit residuals
  SpGroup::ResidualSite* site_ = nullptr;
  // Phantom exchanges without V-Major: the group's counts for this exchange's shapes (sizes
  // alone; no offsets are kept), set by start().
  std::shared_ptr<const SpGroup::ExchangeCounts> counts_;
  bool decoded_ready_ = false;  // FP8: finish() decoded what arrived
  FloatBuffer decoded_;         // FP8: the received blocks, decoded, in source order
  std::vector<std::int64_t> decoded_off_;
  int phase_ = 0;                 // phase in flight (== phases().size() when done)
  int sub_step_ = 0;              // V-Major phases: 0 mask exchange, 1 data exchange
  bool awaiting_launch_ = false;  // phase_ is complete-ready but not launched yet
  Request request_;
  FloatBuffer cur_, send_, recv_;
  std::vector<float> mask_send_, mask_recv_;
  std::vector<std::int64_t> cur_offset_;           // offset of each block of the current order
  std::vector<std::int64_t> send_off_, recv_off_;  // of the phase in flight
  AllToAllvLayout layout_, mask_layout_;
  SimTime launch_time_;
  SimTime waited_;
  std::vector<SimTime> phase_done_;
};

}  // namespace cocodiff::dit
