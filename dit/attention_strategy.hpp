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
// shard_tokens(total, P, r)); text tokens are replicated on every rank.

#include <cstdint>
#include <string>
#include <vector>

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
/// Rank `index` of `parts` gets total/parts tokens, the first total%parts ranks one more.
TokenShard shard_tokens(std::int64_t total, int parts, int index);

/// The token streams of one attention layer, in the model's concatenation order.
class QkvSource {
 public:
  virtual ~QkvSource() = default;
  virtual int num_streams() const = 0;
  /// Sharded over the SP group (image) or replicated on every rank (text).
  virtual bool sharded(int stream) const = 0;
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
  virtual void prepare(const Exec& ex, int stream, QkvPart part, Tensor& x, int h0,
                       int h1) const = 0;
};

struct AttentionShape {
  int heads = 1;
  int head_dim = 1;
  int batch = 1;
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
};

/// The serial reference: project, prepare, concatenate, attend, split. Degree 1.
class SerialAttention final : public AttentionStrategy {
 public:
  std::string name() const override { return "serial"; }
  int degree() const override { return 1; }
  int index() const override { return 0; }
  std::vector<Tensor> attend(const Exec& ex, const QkvSource& src,
                             const AttentionShape& shape) override;
};

}  // namespace cocodiff::dit
