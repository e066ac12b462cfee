#include "dit/attention_strategy.hpp"

#include <algorithm>

#include "dit/layers.hpp"

namespace cocodiff::dit {

std::vector<Tensor> SerialAttention::attend(const Exec& ex, const QkvSource& src,
                                            const AttentionShape& shape) {
  const int streams = src.num_streams();
  std::vector<Tensor> parts[3];
  for (int p = 0; p < 3; ++p) {
    for (int s = 0; s < streams; ++s) {
      Tensor x = src.project(ex, s, static_cast<QkvPart>(p), 0, shape.heads);
      src.prepare(ex, s, static_cast<QkvPart>(p), x, 0, shape.heads, 0);
      parts[p].push_back(std::move(x));
    }
  }
  std::vector<const Tensor*> q, k, v;
  std::vector<std::int64_t> tokens;
  for (int s = 0; s < streams; ++s) {
    q.push_back(&parts[0][static_cast<size_t>(s)]);
    k.push_back(&parts[1][static_cast<size_t>(s)]);
    v.push_back(&parts[2][static_cast<size_t>(s)]);
    tokens.push_back(src.rows(s) / shape.batch);
  }
  const Tensor o = attention(ex, concat_tokens(ex, q, shape.batch, "q_concat"),
                             concat_tokens(ex, k, shape.batch, "k_concat"),
                             concat_tokens(ex, v, shape.batch, "v_concat"), shape.heads,
                             shape.head_dim, shape.batch, "attention");
  return split_tokens(ex, o, tokens, shape.batch, "o_split");
}

void StrategyStats::merge(const StrategyStats& o) {
  for (const auto& [kind, v] : o.v_first) {
    VFirstKindStats& m = v_first[kind];
    m.layers += v.layers;
    m.v_proj_s += v.v_proj_s;
    m.qk_prep_s += v.qk_prep_s;
    m.v_phase1_s += v.v_phase1_s;
    m.v_transfer_s += v.v_transfer_s;
    m.v_exposed_s += v.v_exposed_s;
    m.condition_held += v.condition_held;
    m.phase1_hidden += v.phase1_hidden;
  }
  for (const auto& [tier, v] : o.v_major) {
    VMajorTierStats& m = v_major[tier];
    m.full_elements += v.full_elements;
    m.sent_elements += v.sent_elements;
    m.blocks += v.blocks;
    m.active_blocks += v.active_blocks;
    m.selective_blocks += v.selective_blocks;
    m.selective_active_blocks += v.selective_active_blocks;
  }
  v_major_cache_bytes += o.v_major_cache_bytes;
  v_major_phantom = v_major_phantom || o.v_major_phantom;
  v_major_threshold = std::max(v_major_threshold, o.v_major_threshold);
  ranks += o.ranks;
}

}  // namespace cocodiff::dit
