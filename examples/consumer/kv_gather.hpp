#pragma once
// KV-gather attention: every rank keeps its own queries and gathers the keys and values of all
// image tokens (all heads) from the other ranks, then attends locally. One all-gather of K and
// one of V per layer instead of Ulysses' four all-to-alls; no head count condition.

#include <cocodiff/extend.hpp>

namespace consumer {

class KvGather final : public cocodiff::AttentionStrategy {
 public:
  /// `comm` is borrowed: the rank's communicator, alive for the whole run.
  explicit KvGather(cocodiff::Communicator& comm) : comm_(comm) {}
  std::string name() const override { return "kv_gather"; }
  int degree() const override { return comm_.size(); }
  int index() const override { return comm_.rank(); }
  std::vector<cocodiff::Tensor> attend(const cocodiff::Exec& ex, const cocodiff::QkvSource& src,
                                       const cocodiff::AttentionShape& shape) override;

 private:
  /// [batch * total, C]: every rank's shard of a sharded stream, in token order per batch element.
  cocodiff::Tensor gather(const cocodiff::Tensor& local, std::int64_t total, int batch,
                          bool phantom);
  cocodiff::Communicator& comm_;
};

}  // namespace consumer
