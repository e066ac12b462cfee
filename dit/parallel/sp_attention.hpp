#pragma once
// Ulysses sequence parallelism with the CoCoDiff mechanisms, each switchable:
//   exchange  flat (one all-to-all over the group) or TAPA (one phase per topology level)
//   v_first   V is projected first and its exchange launched non-blocking; Q/K projection,
//             RMSNorm and RoPE run while it flies, and Q's and K's exchanges are launched
//             non-blocking too (every exchange progresses between compute steps); without it,
//             each exchange blocks (project, prepare, exchange, wait: Q, then K, then V)
//   pipeline  Q/K preparation in `chunks` parts, each part's exchange launched as soon as it is
//             prepared: head groups (within every destination's heads) when every destination
//             has at least `chunks` heads, otherwise token groups (of every rank's tokens), so
//             that one head per rank (FLUX's 24 heads on 24 or more tiles) still pipelines
//   v_major   V is sent selectively on the slow tiers (dit/parallel/v_major.hpp)
// Uneven head counts use DeepSpeed's split (24 heads over 16 ranks: 2 heads on the first 8,
// 1 on the rest); uneven token shards follow shard_tokens. Text tokens are replicated: each rank
// projects its own heads of them; an all_gather (padded to the largest head share) reassembles
// the text output. With StrategyOptions::shard_text they are sharded over the group instead
// (xDiT): each rank holds text_tokens / P of them and they take the image's exchanges.
//
//   SpFeatures f{.tapa = true, .v_first = true, .chunks = 2};
//   SpAttention a("cocodiff", comm, cfg, f, options);   // collective (TAPA splits the group)
//   std::vector<Tensor> out = a.attend(ex, src, shape);

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/communicator.hpp"
#include "dit/attention_strategy.hpp"
#include "dit/model_config.hpp"
#include "dit/parallel/search.hpp"
#include "dit/parallel/tapa.hpp"
#include "dit/parallel/v_major.hpp"

namespace cocodiff::dit {

/// Heads of an SP group of `parts` ranks: rank r owns [begin[r], begin[r] + count[r]); the
/// first heads % parts ranks one more (DeepSpeed-Ulysses' uneven split).
struct HeadSplit {
  HeadSplit(int heads, int parts);
  std::vector<int> begin, count;
  int max_count = 0;
};

struct SpFeatures {
  bool tapa = false;
  bool v_first = false;
  int chunks = 1;  // pipeline: head groups of Q/K preparation (1: off)
  bool v_major = false;
};

class SpAttention final : public AttentionStrategy {
 public:
  /// Collective over `group` (borrowed, must outlive this object).
  SpAttention(std::string name, Communicator& group, const ModelConfig& cfg, SpFeatures features,
              const StrategyOptions& options);
  std::string name() const override { return name_; }
  int degree() const override { return group_.size(); }
  int index() const override { return group_.rank(); }
  std::vector<Tensor> attend(const Exec& ex, const QkvSource& src,
                             const AttentionShape& shape) override;
  void begin_forward(int step, int pass) override;
  StrategyStats stats() const override;
  std::string step_key(int step) const override;
  std::optional<BlockDeps> next_block() const override;
  void skip_layers(int layers, double v_major_cache_bytes) override;
  std::optional<TokenShard> text_shard(std::int64_t text_tokens) const override;

 private:
  struct LayerState;  // one attend call: its exchanges in flight and the Q/K/V they fill
  /// Projects and prepares stream `s`'s part (Q, K, V) and launches its exchanges.
  void launch(LayerState& layer, int part, int s);
  /// Replicated stream (or a group of one): this rank's heads, prepared, no exchange.
  void prepare_local(LayerState& layer, int part, int s, SimTime t0);
  /// All heads of x prepared at once, then one exchange (blocking unless V-First).
  void launch_whole(LayerState& layer, int part, int s, Tensor& x, std::int64_t total, SimTime t0);
  /// Pipelining by heads: each head group of x prepared, then its exchange launched.
  void launch_head_chunks(LayerState& layer, int part, int s, const Tensor& x, std::int64_t total);
  /// Pipelining by tokens: each token group of x prepared, then its exchange launched.
  void launch_token_chunks(LayerState& layer, int part, int s, const Tensor& x, std::int64_t total);
  /// Adds this layer's V-First timings to the statistics of its kind of block.
  void record_v_first(const LayerState& layer);
  /// Writes the finished exchanges into the layer's Q/K/V heads.
  void unpack_all(LayerState& layer);
  /// Attention over this rank's heads, then each stream's output back to its layout.
  std::vector<Tensor> attend_heads(LayerState& layer);

  std::string name_;
  SpGroup group_;
  SpFeatures f_;
  StrategyOptions opt_;
  int step_ = 0, pass_ = 0;
  std::unique_ptr<VMajorCache> v_major_;  // made at the first layer (needs the phantom flag)
  std::map<std::string, VFirstKindStats> v_first_;
};

/// The exchanges of one Ulysses layer over `g`, shared by SpAttention and Ulysses x Ring:
/// x [B*n_me, cols] (this rank's tokens, the columns of every destination) -> the columns of
/// this rank for all tokens of the group. `cols_of(d)`: [first column, count] of destination d.
struct ColumnRange {
  std::int64_t begin = 0, count = 0;
};
/// Part `index` of `count` equal parts of every member's tokens (pipelining by tokens); the
/// default is all of them.
struct TokenChunk {
  int index = 0, count = 1;
  /// The chunk of a member's shard: [begin, begin + count) of the group's tokens.
  TokenShard of(const TokenShard& shard) const {
    return TokenShard{shard.begin + shard.count * index / count, count_of(shard.count),
                      shard.total};
  }
  /// The tokens of this chunk of a shard of `tokens` tokens.
  std::int64_t count_of(std::int64_t tokens) const {
    return tokens * (index + 1) / count - tokens * index / count;
  }
  /// The tokens of this chunk of every member's shard of `total` over `parts` members.
  std::int64_t total_of(std::int64_t total, int parts) const {
    // The shards hold total/parts tokens, the first total%parts one more.
    const std::int64_t base = total / parts, rem = total % parts;
    return rem * count_of(base + 1) + (parts - rem) * count_of(base);
  }
};

/// Sequence -> heads: starts the exchange of x (rows: B x this rank's tokens of `total`, or of
/// their `chunk`).
std::unique_ptr<BlockExchange> start_to_heads(const Exec& ex, const SpGroup& g, const Tensor& x,
                                              std::int64_t total, int batch,
                                              std::vector<ColumnRange> cols, std::string label,
                                              VMajorChannel* v_major = nullptr,
                                              TokenChunk chunk = {});
/// Finishes the exchange and writes it into y [B*total, *], columns [col0, col0 + width) (the
/// rows of every member's `chunk` of tokens).
void unpack_to_heads(const Exec& ex, const SpGroup& g, BlockExchange& x, std::int64_t total,
                     int batch, std::int64_t col0, std::int64_t width, Tensor& y,
                     TokenChunk chunk = {});
/// Heads -> sequence, blocking: o [B*total, width(me)] -> [B*n_me, sum of widths], member s's
/// columns at offset(s).
Tensor to_sequence(const Exec& ex, const SpGroup& g, const Tensor& o, std::int64_t total, int batch,
                   const std::vector<ColumnRange>& cols, std::string label);
/// ConfigError naming parallel.shard_text when `options` shard the text over a Ulysses group of
/// `degree` ranks and the model has no text or the degree does not divide its text tokens.
void check_text_shards(const ModelConfig& cfg, const StrategyOptions& options, int degree);

/// Reassembles a replicated stream's heads over `g`: o [rows, width(me)] -> [rows, total width].
Tensor gather_columns(const Exec& ex, Communicator& g, const Tensor& o,
                      const std::vector<ColumnRange>& cols, std::string_view label);

/// The Ulysses compositions' points for `cocodiff tune` (dit/parallel/search.hpp): flat and,
/// where the group spans two levels, TAPA, each with and without V-First, pipelining (2 or 4
/// chunks) and text sharding, over every rank or CFG-parallel halves; V-Major's composition at
/// each admitted lossy setting where there is an inter-node tier.
void ulysses_search(const SearchShape& shape, const SearchEmit& emit);

/// V-Major's thresholds as `cocodiff tune --lossy` measures them: cocodiff on the trained model at
/// v_major.threshold 0.02, 0.05, 0.1 and 0.2 against 0, and the share of V blocks each sent.
LossyProbe v_major_probe();

}  // namespace cocodiff::dit
