#pragma once
// Ulysses x Ring (USP, as in xDiT): the inner topology levels form Ulysses groups (an
// all-to-all turns "all heads, my tokens" into "my heads, the group's tokens"), the outer
// levels (`usp.ring_levels`, default 1: across nodes) form rings: each ring member holds Q/K/V
// of its group's token chunk for the same heads and passes the K/V chunks around the ring
// (isend/irecv of the next chunk overlapped with attention on the current one). Partial
// results are merged with their log-sum-exp in a fixed order (text keys, then ring members
// 0..R-1), so every ring member computes the text rows bitwise identically. Heads that do not
// divide the Ulysses degree use the uneven split of HeadSplit. With StrategyOptions::shard_text
// the text tokens are sharded over each Ulysses group (and the same on every ring member, as
// xDiT splits them over the Ulysses degree): the Ulysses exchange gathers them, and they stay
// local keys of every ring member, as replicated text does.
//
//   UlyssesRing usp(comm, cfg, options);          // collective: two splits (+ TAPA's)
//   std::vector<Tensor> out = usp.attend(ex, src, shape);

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/communicator.hpp"
#include "dit/attention_strategy.hpp"
#include "dit/model_config.hpp"
#include "dit/parallel/search.hpp"
#include "dit/parallel/tapa.hpp"

namespace cocodiff::dit {

class UlyssesRing final : public AttentionStrategy {
 public:
  UlyssesRing(Communicator& world, const ModelConfig& cfg, const StrategyOptions& options);
  std::string name() const override { return "usp"; }
  int degree() const override { return world_.size(); }
  int index() const override { return world_.rank(); }
  std::vector<Tensor> attend(const Exec& ex, const QkvSource& src,
                             const AttentionShape& shape) override;
  /// Stateless; its exchanges are waited for in a fixed order (no polling), and it measures
  /// nothing: its calls are fixed.
  std::optional<BlockDeps> next_block() const override {
    return BlockDeps{.key = {}, .first_exchange = false, .calls_fixed = true};
  }
  std::optional<TokenShard> text_shard(std::int64_t text_tokens) const override;
  /// Residual exchanges (compress.all_to_all = "residual") match each forward's Ulysses
  /// exchanges with the step before's, and send the blocks themselves in the first step.
  void begin_forward(int step, int pass) override { ulysses_->begin_forward(step, pass); }
  std::string step_key(int step) const override {
    if (!ulysses_->residual()) return {};
    return step == 0 ? "residual exact" : "residual";
  }
  int ulysses_degree() const { return ulysses_comm_->size(); }
  int ring_degree() const { return ring_comm_->size(); }

 private:
  // The ring's blocks and per-round charges for one shape: the same in every block of a kind
  // and every step, so they are worked out once (a ring of 128 members has 128 of each).
  struct RingPlan {
    std::int64_t total = 0, q_rows = 0, q_cols = 0;
    int heads = 0, head_dim = 0, batch = 0;
    std::vector<std::int64_t> chunk_rows;  // per ring member: its chunk's rows
    RingPass pass;                         // counts, work and labels (no data)
  };
  const RingPlan& ring_plan(std::int64_t total, std::int64_t q_rows, std::int64_t q_cols, int heads,
                            int head_dim, int batch);

  struct Layer;  // one attend call: geometry, Q/K/V per stream, where the ring's K/V land
  /// Projects, prepares and (sharded streams) exchanges every stream's Q, K and V.
  void exchange_qkv(Layer& layer);
  /// Passes the image K/V chunks round the ring, charging the plan's work per round.
  void pass_ring(Layer& layer, const RingPlan& plan);
  /// Each stream's output back to its layout (blocking exchanges over the Ulysses group).
  void exchange_outputs(const Layer& layer, std::vector<Tensor>& outs, std::int64_t total);

  Communicator& world_;
  std::unique_ptr<Communicator> ulysses_comm_, ring_comm_;
  std::unique_ptr<SpGroup> ulysses_;
  std::vector<RingPlan> plans_;
  bool shard_text_ = false;
};

/// usp's points for `cocodiff tune` (dit/parallel/search.hpp): rings over the outer levels
/// (nodes; nodes x GPUs; ...), Ulysses over the rest with a flat or (spanning two levels) TAPA
/// exchange, with and without text sharding.
void usp_search(const SearchShape& shape, const SearchEmit& emit);

}  // namespace cocodiff::dit
