#include "dit/block_replay.hpp"

#include <string>

#include "core/errors.hpp"

namespace cocodiff::dit {

StrategyStats stats_added(const StrategyStats& after, const StrategyStats& before) {
  StrategyStats d = after;
  for (auto& [kind, v] : d.v_first) {
    auto it = before.v_first.find(kind);
    if (it == before.v_first.end()) continue;
    const VFirstKindStats& b = it->second;
    v.layers -= b.layers;
    v.v_proj_s -= b.v_proj_s;
    v.qk_prep_s -= b.qk_prep_s;
    v.v_phase1_s -= b.v_phase1_s;
    v.v_transfer_s -= b.v_transfer_s;
    v.v_exposed_s -= b.v_exposed_s;
    v.condition_held -= b.condition_held;
    v.phase1_hidden -= b.phase1_hidden;
  }
  for (auto& [tier, v] : d.v_major) {
    auto it = before.v_major.find(tier);
    if (it == before.v_major.end()) continue;
    v.full_elements -= it->second.full_elements;
    v.sent_elements -= it->second.sent_elements;
    v.blocks -= it->second.blocks;
    v.active_blocks -= it->second.active_blocks;
  }
  d.v_major_cache_bytes = 0;
  d.ranks = 0;
  return d;
}

BlockReplay::BlockReplay(AttentionStrategy& attn, bool phantom) : attn_(attn), phantom_(phantom) {
  replayed_.ranks = 0;
}

void BlockReplay::run(Communicator& world, std::string_view kind, int attention_layers,
                      const std::function<void()>& body) {
  const std::optional<std::string> state = attn_.block_key();
  std::string key = "block ";
  key += kind;
  if (state) key += " | " + *state;
  const bool counts = attn_.block_counts_cache();
  const auto known = first_cache_.find(key);
  const bool cache_known = known != first_cache_.end();
  const std::string region = counts && !cache_known ? key + " | first exchange" : key;
  const Communicator::RegionMark mark = world.begin_region(region, phantom_ && state.has_value());
  if (mark.replayed) {
    auto it = effects_.find(mark.id);
    COCO_CHECK(it != effects_.end(), "a replayed block was never simulated on this rank");
    replayed_.merge(it->second);
    attn_.skip_layers(attention_layers, counts ? known->second : 0.0);
    return;
  }
  const StrategyStats before = attn_.stats();
  body();
  const StrategyStats after = attn_.stats();
  const double cache = after.v_major_cache_bytes - before.v_major_cache_bytes;
  COCO_CHECK(counts || cache == 0, "a block counted V-Major cache for layers it had seen");
  if (counts && state && !cache_known) first_cache_.emplace(key, cache);
  if (phantom_ && mark.id != 0) effects_[mark.id] = stats_added(after, before);
}

void BlockReplay::end(Communicator& world) { world.begin_region("blocks end", false); }

void run_block(const Exec& ex, std::string_view kind, int attention_layers,
               const std::function<void()>& body) {
  if (ex.blocks == nullptr) {
    body();
    return;
  }
  ex.blocks->run(ex.comm, kind, attention_layers, body);
}

void end_blocks(const Exec& ex) {
  if (ex.blocks != nullptr) BlockReplay::end(ex.comm);
}

}  // namespace cocodiff::dit
