#pragma once
// Flat Ulysses sequence parallelism (DeepSpeed-Ulysses): image tokens are sharded along the
// sequence over a group of P ranks; before attention one all-to-all per tensor (Q, K, V)
// turns "all heads, n/P tokens" into "H/P heads, all tokens"; one all-to-all brings the output
// back. Uneven token counts use all_to_allv; H must be divisible by P (ConfigError otherwise).
//
// Text tokens (replicated on every rank, as in xDiT): each rank projects only its own H/P heads
// of the text Q/K/V (no exchange needed), attends over [text, all image tokens] on those heads,
// and an all_gather over the group reassembles the text output's heads.
//
//   FlatUlysses sp(comm, model.heads);                 // whole communicator = one SP group
//   std::vector<Tensor> out = sp.attend(ex, src, shape);

#include "core/communicator.hpp"
#include "dit/attention_strategy.hpp"

namespace cocodiff::dit {

/// The exchanges of Ulysses, separate so other strategies can reorder or pipeline them.
class UlyssesExchange {
 public:
  explicit UlyssesExchange(Communicator& group) : group_(group) {}
  int degree() const { return group_.size(); }
  int index() const { return group_.rank(); }
  Communicator& group() const { return group_; }

  /// Scatter heads, gather sequence: x [B*n_r, h*D] (local tokens of `total`, all h heads)
  /// -> [B*total, (h/P)*D] (all tokens, this rank's heads). Starts the all-to-all; `finish`
  /// unpacks. Blocking form: to_heads().
  struct Pending {
    Request request;
    std::vector<float> send, recv;
    std::int64_t rows = 0, cols = 0;
  };
  Pending start_to_heads(const Exec& ex, const Tensor& x, std::int64_t total, int batch,
                         int head_dim, std::string_view label) const;
  Tensor finish_to_heads(const Exec& ex, Pending& p, std::int64_t total, int batch,
                         std::string_view label) const;
  Tensor to_heads(const Exec& ex, const Tensor& x, std::int64_t total, int batch, int head_dim,
                  std::string_view label) const;

  /// Gather heads, scatter sequence: o [B*total, (h/P)*D] -> [B*n_r, h*D]. Blocking.
  Tensor to_sequence(const Exec& ex, const Tensor& o, std::int64_t total, int batch,
                     std::string_view label) const;

  /// Reassembles the heads of a replicated stream: o [rows, (h/P)*D] -> [rows, h*D]. Blocking.
  Tensor gather_heads(const Exec& ex, const Tensor& o, std::string_view label) const;

 private:
  Communicator& group_;
};

class FlatUlysses final : public AttentionStrategy {
 public:
  /// `group` is the SP group (borrowed; must outlive this object).
  FlatUlysses(Communicator& group, int heads);
  std::string name() const override { return "flat"; }
  int degree() const override { return x_.degree(); }
  int index() const override { return x_.index(); }
  std::vector<Tensor> attend(const Exec& ex, const QkvSource& src,
                             const AttentionShape& shape) override;

 private:
  UlyssesExchange x_;
};

}  // namespace cocodiff::dit
