#pragma once
// The sequence-parallel hook of every attention layer. A model hands the strategy a QkvSource
// (how to project Q, K, V of each token stream, and how to prepare Q/K: per-head norm + RoPE);
// the strategy decides the order of projection, preparation, exchanges and the attention
// kernel. Keeping these steps separate lets later strategies reorder them: V-First projects V
// and launches its all-to-all before preparing Q/K; pipelining goes head group by head group.
//
//   SerialAttention serial;                      // one rank: no exchange
//   std::vector<Tensor> out = strategy.attend(ex, qkv_source, {heads, head_dim, batch});
//   // out[s]: [rows(s), heads*head_dim], stream s's local tokens, all heads
//
// Streams: image tokens are sharded along the sequence over the SP group (rank r owns
// shard_tokens(total, P, r)); text tokens are replicated on every rank, or, when the strategy
// shards them (AttentionStrategy::text_shard, `parallel.shard_text`), sharded over its Ulysses
// group as xDiT does, and exchanged with the image tokens.

#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/errors.hpp"
#include "core/tensor.hpp"
#include "dit/exec.hpp"

namespace cocodiff::dit {

enum class QkvPart : std::uint8_t { kQ = 0, kK = 1, kV = 2 };

/// A contiguous range of one sequence's tokens: [begin, begin + count) of `total`.
struct TokenShard {
  std::int64_t begin = 0;
  std::int64_t count = 0;
  std::int64_t total = 0;
};
/// The image tokens of one sample: frames x height x width patches, frame-major, then
/// row-major (token g is frame g / (h w), row g / w % h, column g % w). An image is frames = 1.
struct TokenGrid {
  int frames = 1, height = 0, width = 0;
  std::int64_t tokens() const { return std::int64_t{frames} * height * width; }
  std::int64_t frame_tokens() const { return std::int64_t{height} * width; }
};

/// Rank `index` of `parts` gets total/parts tokens, the first total%parts ranks one more.
/// Inline: phantom exchanges ask it for every member of a group, for every block.
inline TokenShard shard_tokens(std::int64_t total, int parts, int index) {
  COCO_CHECK(parts >= 1 && index >= 0 && index < parts, "shard_tokens index");
  const std::int64_t base = total / parts, rem = total % parts;
  TokenShard s;
  s.total = total;
  s.count = base + (index < rem ? 1 : 0);
  s.begin = index * base + std::min<std::int64_t>(index, rem);
  return s;
}

/// The token streams of one attention layer, in the model's concatenation order.
class QkvSource {
 public:
  virtual ~QkvSource() = default;
  virtual int num_streams() const = 0;
  /// Sharded along the sequence (image; text when the strategy shards it) or replicated on
  /// every rank (text).
  virtual bool sharded(int stream) const = 0;
  /// A text stream (replicated, or sharded over the strategy's Ulysses group: text_shard) rather
  /// than the image.
  virtual bool text(int stream) const { return !sharded(stream); }
  /// Tokens of one batch element over the whole group (all shards).
  virtual std::int64_t total_tokens(int stream) const = 0;
  /// Local rows of the stream: batch * local tokens.
  virtual std::int64_t rows(int stream) const = 0;
  /// False when the model discards this stream's attention output (SD3's last text stream):
  /// a strategy may then skip bringing it back.
  virtual bool wants_output(int /*stream*/) const { return true; }
  /// The projection of heads [h0, h1) of the local tokens: [rows, (h1 - h0) * head_dim].
  virtual Tensor project(const Exec& ex, int stream, QkvPart part, int h0, int h1) const = 0;
  /// Q/K preparation (per-head RMSNorm, RoPE) of heads [h0, h1), in place; V: nothing.
  /// x holds, of every batch element, the local tokens [token0, token0 + x.rows() / batch)
  /// (token0 = 0 and all local tokens unless a strategy prepares them in token chunks).
  virtual void prepare(const Exec& ex, int stream, QkvPart part, Tensor& x, int h0, int h1,
                       std::int64_t token0) const = 0;
};

struct AttentionShape {
  int heads = 1;
  int head_dim = 1;
  int batch = 1;
  /// The kind of attention layer ("flux_double", "flux_single", "sd3_joint", ...): strategy
  /// statistics are reported per kind.
  std::string_view kind = "attention";
};

/// Settings of the strategies beyond their name (config sections [pipeline], [v_major], [usp]).
struct StrategyOptions {
  /// Heads that do not divide the Ulysses degree: false = ConfigError, true = DeepSpeed's uneven
  /// split (the first heads % P ranks get one head more).
  bool uneven_heads = false;
  int pipeline_chunks = 2;  // head groups Q/K preparation is split into (pipeline)
  // V-Major selective communication.
  double v_major_threshold = 0.02;  // a block is sent when ||new - held|| > threshold ||held||
  int v_major_block_tokens = 64;    // rows (batch x tokens) per block
  int v_major_block_heads = 1;      // heads per block
  std::vector<std::string> v_major_tiers = {"inter-node"};  // tiers whose V is selective
  int v_major_warmup_steps = 2;                             // first steps send everything
  int v_major_refresh_every = 10;  // every n-th step sends everything (0: never)
  // Phantom mode: share of blocks sent. Measured, not assumed: at the default threshold the
  // trained models send every block (rates.json of configs/quickstart.toml and configs/video.toml
  // run with cocodiff: 1.0; their V moves 9-12% a step, bench/README.md), so the default saves
  // nothing; a rates file (run.measured_rates) or this key states another model's share.
  double v_major_phantom_active_fraction = 1.0;
  // Ulysses x Ring (usp).
  int usp_ring_levels = 1;  // outermost topology levels the ring spans (the rest: Ulysses)
  bool usp_tapa = false;    // Ulysses part as TAPA phases instead of one flat all-to-all
  /// parallel.shard_text: text tokens sharded over the Ulysses group (xDiT's split of the text
  /// embeddings) instead of replicated; the Ulysses degree must divide them (ConfigError).
  bool shard_text = false;
  /// compress.all_to_all: the Ulysses exchanges' payload on the wire. "none": as computed;
  /// "fp8": FP8 e4m3 with one fp32 scale per row (dit/parallel/fp8.hpp); "residual": from the
  /// second step on, each exchange's change since the step before, 4-bit with one fp32 scale per
  /// row, against a reconstruction both ends keep (SpGroup::set_residual). V-Major's selective V
  /// exchange is V-Major's own and is not compressed.
  std::string compress = "none";
  // PipeFusion (dit/parallel/pipefusion.hpp).
  int pipefusion_degree = 0;        // pipeline stages (parallel.pipefusion_degree); 0: every rank
  int pipefusion_patches = 0;       // patches of the image (pipefusion.patches); 0: the degree
  int pipefusion_warmup_steps = 1;  // first steps run whole, exact (pipefusion.warmup_steps)
};

/// V-First on one kind of layer, summed over layers (and over ranks when merged).
struct VFirstKindStats {
  std::int64_t layers = 0;
  double v_proj_s = 0;              // T(V proj)
  double qk_prep_s = 0;             // T(Q, K prep): projections, norms, RoPE
  double v_phase1_s = 0;            // T(V first phase): launch to its completion
  double v_transfer_s = 0;          // launch to completion of V's whole exchange
  double v_exposed_s = 0;           // time the rank waited for V
  std::int64_t condition_held = 0;  // layers with T(V proj) + T(V phase 1) <= T(Q, K prep)
  std::int64_t phase1_hidden = 0;   // layers whose V phase 1 ended before Q/K prep did
};

/// V-Major traffic on one tier, summed over layers and steps (and ranks when merged).
struct VMajorTierStats {
  double full_elements = 0;  // V elements an exact exchange sends on this tier
  double sent_elements = 0;  // elements actually sent (active blocks + masks)
  std::int64_t blocks = 0;   // blocks considered
  std::int64_t active_blocks = 0;
  /// The blocks of selective exchanges only (after the warm-up, between refreshes): what
  /// `v_major.phantom_active_fraction` stands for, measured (StrategyStats of a real run).
  std::int64_t selective_blocks = 0;
  std::int64_t selective_active_blocks = 0;
};

/// What a strategy measured during a run (rank-local; merge() sums ranks).
struct StrategyStats {
  std::map<std::string, VFirstKindStats> v_first;  // by AttentionShape::kind
  std::map<std::string, VMajorTierStats> v_major;  // by tier name
  double v_major_cache_bytes = 0;  // sender mirrors + receiver caches, bf16 (2 bytes/element)
  bool v_major_phantom = false;    // true: active blocks came from phantom_active_fraction
  double v_major_threshold = 0;
  int ranks = 1;  // ranks merged into these numbers
  void merge(const StrategyStats& o);
};

class AttentionStrategy {
 public:
  virtual ~AttentionStrategy() = default;
  virtual std::string name() const = 0;
  /// Sequence-parallel degree and this rank's place in it (sharding of image tokens).
  virtual int degree() const = 0;
  virtual int index() const = 0;
  /// Joint attention over all streams' tokens; returns per stream [rows(s), heads*head_dim]
  /// for the local tokens. Blocking (every exchange it starts has completed on return).
  virtual std::vector<Tensor> attend(const Exec& ex, const QkvSource& src,
                                     const AttentionShape& shape) = 0;
  /// The text tokens this rank holds when the strategy shards the text stream (of `text_tokens`
  /// per batch element); nullopt: the text is replicated on every rank (the default).
  virtual std::optional<TokenShard> text_shard(std::int64_t /*text_tokens*/) const {
    return std::nullopt;
  }
  /// Called before every transformer pass: denoising step and pass within it (true CFG: 0, 1).
  /// Strategies with state across steps (V-Major caches) key it by (pass, layer in the pass).
  virtual void begin_forward(int /*step*/, int /*pass*/) {}
  /// What the strategy measured so far on this rank.
  virtual StrategyStats stats() const { return {}; }
  // What the strategy's work depends on, stated once for exact replay in phantom mode
  // (BlockReplay, core/replay.hpp): steps with equal step keys, and blocks of one kind with
  // equal block keys, do the same work and leave the strategy in the same state.

  /// What sets denoising step `step` apart from other steps beyond the configuration (V-Major:
  /// a step that sends everything).
  virtual std::string step_key(int /*step*/) const { return {}; }
  /// What the next transformer block's attention depends on.
  struct BlockDeps {
    /// Beyond the configuration and the block's kind: blocks with equal kinds and keys may be
    /// replayed one for another.
    std::string key;
    /// The block exchanges its layers for the first time (V-Major counts their cache then). Its
    /// work and timeline do not depend on it, so it is not part of `key`: only the cache bytes
    /// a replayed block adds do.
    bool first_exchange = false;
    /// The calls the block makes on its communicators are a function of its kind and `key`
    /// alone, whatever its timing (it never polls a request, and what it reads of the clock
    /// changes nothing it calls), and it measures nothing: one block's calls may be recorded
    /// and issued again for the next blocks of that kind and key (Replay::begin_tape),
    /// instead of running their code.
    bool calls_fixed = false;
  };
  /// nullopt: the block must be simulated (the default, for strategies that say nothing of
  /// their state).
  virtual std::optional<BlockDeps> next_block() const { return std::nullopt; }
  /// A replayed block's attention layers were not run: advance as running them would have
  /// (`v_major_cache_bytes`: what the simulated block added to StrategyStats::v_major_cache_bytes).
  virtual void skip_layers(int /*layers*/, double /*v_major_cache_bytes*/) {}
};

/// The serial reference: project, prepare, concatenate, attend, split. Degree 1.
class SerialAttention final : public AttentionStrategy {
 public:
  std::string name() const override { return "serial"; }
  int degree() const override { return 1; }
  int index() const override { return 0; }
  std::vector<Tensor> attend(const Exec& ex, const QkvSource& src,
                             const AttentionShape& shape) override;
  std::optional<BlockDeps> next_block() const override { return BlockDeps{}; }  // stateless
};

}  // namespace cocodiff::dit
