#include "kv_gather.hpp"

#include <algorithm>
#include <cocodiff/extend.hpp>

namespace consumer {

using cocodiff::Tensor;
using cocodiff::dit::QkvPart;
using cocodiff::dit::shard_tokens;

Tensor KvGather::gather(const Tensor& local, std::int64_t total, int batch, bool phantom) {
  const int ranks = comm_.size();
  const std::int64_t cols = local.cols();
  std::int64_t max_tokens = 0;  // shards differ by one token at most: pad to the largest
  for (int r = 0; r < ranks; ++r)
    max_tokens = std::max(max_tokens, shard_tokens(total, ranks, r).count);
  const std::int64_t block = batch * max_tokens * cols;
  Tensor send = Tensor::zeros(batch * max_tokens, cols, phantom);
  Tensor recv = Tensor::zeros(ranks * batch * max_tokens, cols, phantom);
  Tensor full = Tensor::zeros(batch * total, cols, phantom);
  const std::int64_t mine = shard_tokens(total, ranks, comm_.rank()).count;
  if (!phantom)
    for (int b = 0; b < batch; ++b)
      send.mat().middleRows(b * max_tokens, mine) = local.mat().middleRows(b * mine, mine);
  comm_.all_gather(send.data(), recv.data(), block, "kv_gather");
  if (!phantom)
    for (int r = 0; r < ranks; ++r) {
      const cocodiff::dit::TokenShard s = shard_tokens(total, ranks, r);
      for (int b = 0; b < batch; ++b)
        full.mat().middleRows(b * total + s.begin, s.count) =
            recv.mat().middleRows((r * batch + b) * max_tokens, s.count);
    }
  return full;
}

std::vector<Tensor> KvGather::attend(const cocodiff::dit::Exec& ex,
                                     const cocodiff::dit::QkvSource& src,
                                     const cocodiff::dit::AttentionShape& shape) {
  const int streams = src.num_streams();
  std::vector<Tensor> q(static_cast<size_t>(streams)), k(q.size()), v(q.size());
  std::vector<std::int64_t> local_tokens;
  for (int s = 0; s < streams; ++s) {
    const size_t i = static_cast<size_t>(s);
    Tensor* parts[3] = {&q[i], &k[i], &v[i]};
    for (int p = 0; p < 3; ++p) {
      const auto part = static_cast<QkvPart>(p);
      *parts[p] = src.project(ex, s, part, 0, shape.heads);
      src.prepare(ex, s, part, *parts[p], 0, shape.heads, 0);
    }
    local_tokens.push_back(src.rows(s) / shape.batch);
    if (src.sharded(s)) {
      k[i] = gather(k[i], src.total_tokens(s), shape.batch, ex.phantom);
      v[i] = gather(v[i], src.total_tokens(s), shape.batch, ex.phantom);
    }
  }
  std::vector<const Tensor*> qp, kp, vp;
  for (size_t i = 0; i < q.size(); ++i) {
    qp.push_back(&q[i]);
    kp.push_back(&k[i]);
    vp.push_back(&v[i]);
  }
  namespace d = cocodiff::dit;
  const Tensor o = d::attention(ex, d::concat_tokens(ex, qp, shape.batch, "q_concat"),
                                d::concat_tokens(ex, kp, shape.batch, "k_concat"),
                                d::concat_tokens(ex, vp, shape.batch, "v_concat"), shape.heads,
                                shape.head_dim, shape.batch, "attention");
  return d::split_tokens(ex, o, local_tokens, shape.batch, "o_split");
}

}  // namespace consumer
