#include "dit/block_replay.hpp"

#include <algorithm>
#include <mutex>
#include <set>
#include <string>
#include <vector>

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
    v.selective_blocks -= it->second.selective_blocks;
    v.selective_active_blocks -= it->second.selective_active_blocks;
  }
  d.v_major_cache_bytes = 0;
  d.ranks = 0;
  return d;
}

namespace {

// True when `s` holds a sum that a replay would add (the maps stats_added and scaled walk).
bool has_sums(const StrategyStats& s) { return !s.v_first.empty() || !s.v_major.empty(); }

// The sums of `s` times n (what n replays of a block add).
StrategyStats scaled(StrategyStats s, std::int64_t n) {
  const double x = static_cast<double>(n);
  for (auto& [kind, v] : s.v_first) {
    v.layers *= n;
    v.v_proj_s *= x;
    v.qk_prep_s *= x;
    v.v_phase1_s *= x;
    v.v_transfer_s *= x;
    v.v_exposed_s *= x;
    v.condition_held *= n;
    v.phase1_hidden *= n;
  }
  for (auto& [tier, v] : s.v_major) {
    v.full_elements *= x;
    v.sent_elements *= x;
    v.blocks *= n;
    v.active_blocks *= n;
    v.selective_blocks *= n;
    v.selective_active_blocks *= n;
  }
  return s;
}

// A block's region key: its kind and what its attention depends on (BlockDeps::key).
std::string block_key(std::string_view kind,
                      const std::optional<AttentionStrategy::BlockDeps>& deps) {
  std::string key = "block ";
  key += kind;
  if (deps) key += " | " + deps->key;
  return key;
}

}  // namespace

BlockReplay::BlockReplay(AttentionStrategy& attn, Replay& replay, bool phantom)
    : attn_(attn), replay_(replay), phantom_(phantom) {}

StrategyStats BlockReplay::replayed() const {
  StrategyStats r;
  r.ranks = 0;
  std::vector<std::uint64_t> ids;  // in id order: the sum does not depend on hashing
  for (const auto& [id, e] : effects_)
    if (e.replays > 0) ids.push_back(id);
  std::sort(ids.begin(), ids.end());
  for (std::uint64_t id : ids) {
    const Effect& e = effects_.at(id);
    r.merge(scaled(e.stats, e.replays));
  }
  if (!has_sums(discount_)) return r;
  for (const auto& [kind, v] : discount_.v_first)
    COCO_CHECK(r.v_first.count(kind) != 0,
               "a block replayed from its arrivals measured what its simulated block did not");
  for (const auto& [tier, v] : discount_.v_major)
    COCO_CHECK(r.v_major.count(tier) != 0,
               "a block replayed from its arrivals measured what its simulated block did not");
  return stats_added(r, discount_);
}

void BlockReplay::run(std::string_view kind, int attention_layers,
                      const std::function<void()>& body) {
  const std::optional<AttentionStrategy::BlockDeps> deps = attn_.next_block();
  const std::string key = block_key(kind, deps);
  const bool counts = deps ? deps->first_exchange : false;
  const auto known = first_cache_.find(key);
  const bool cache_known = known != first_cache_.end();
  const std::string region = counts && !cache_known ? key + " | first exchange" : key;
  // The block before said what follows it: its replay from its arrivals depended on it.
  COCO_CHECK(expected_.empty() || expected_ == key,
             "block '" + key + "' follows a block that named '" + expected_ + "' as its next");
  expected_.clear();
  // Judged where the tiles arrive where what follows the block is known. Not a block whose
  // calls are issued from a tape: a tape starts with the charges before its first call.
  const bool passed = phantom_ && deps.has_value() && next_kind_.has_value() && !deps->calls_fixed;
  if (passed) expected_ = next_kind_->empty() ? "blocks end" : block_key(*next_kind_, deps);
  next_kind_.reset();
  const Replay::RegionMark mark = passed
                                      ? replay_.pass_region(region, true, expected_)
                                      : replay_.begin_region(region, phantom_ && deps.has_value());
  // Inside a replayed span, a block the strategy cannot skip runs, its calls free.
  if (mark.replayed && !deps) {
    body();
    return;
  }
  if (mark.replayed) {
    COCO_CHECK(mark.id < simulated_.size() && simulated_[mark.id],
               "a replayed block was never simulated on this rank");
    auto it = effects_.find(mark.id);
    if (it != effects_.end()) ++it->second.replays;
    // A first exchange replays only under the shared key, i.e. once its figure is known.
    COCO_CHECK(!counts || cache_known, "a first exchange was replayed before one was simulated");
    attn_.skip_layers(attention_layers, counts ? known->second : 0.0);
    return;
  }
  const StrategyStats before = attn_.stats();
  // A block whose calls depend on its key alone: the first one of its key is run and its calls
  // recorded, the next ones issue those calls again without running the block's code.
  const bool tape = phantom_ && deps.has_value() && !counts && deps->calls_fixed;
  const auto taped = tape ? tapes_.find(region) : tapes_.end();
  if (taped != tapes_.end() && taped->second != nullptr) {
    replay_.play_tape(*taped->second);
  } else if (tape && taped == tapes_.end() && replay_.begin_tape()) {
    try {
      body();
    } catch (...) {
      replay_.end_tape();
      throw;
    }
    std::unique_ptr<Replay::CallTape> recorded = replay_.end_tape();
    // A block that measured something cannot be issued again as calls alone.
    if (has_sums(stats_added(attn_.stats(), before))) recorded.reset();
    tapes_.emplace(region, std::move(recorded));
  } else {
    body();
  }
  const StrategyStats after = attn_.stats();
  // A passed block's judgement: replayed from its arrivals (its calls were free), or the id it
  // was simulated under.
  const Replay::RegionMark answer = passed ? replay_.passed_answer() : mark;
  if (answer.replayed) {
    COCO_CHECK(answer.id < simulated_.size() && simulated_[answer.id],
               "a replayed block was never simulated on this rank");
    discount_.merge(stats_added(after, before));
    if (auto it = effects_.find(answer.id); it != effects_.end()) ++it->second.replays;
    COCO_CHECK(!counts || cache_known, "a first exchange was replayed before one was simulated");
    return;
  }
  const double cache = after.v_major_cache_bytes - before.v_major_cache_bytes;
  COCO_CHECK(counts || cache == 0, "a block counted V-Major cache for layers it had seen");
  if (counts && deps && !cache_known) first_cache_.emplace(key, cache);
  if (phantom_ && answer.id != 0) {
    if (simulated_.size() <= answer.id) simulated_.resize(answer.id + 1, false);
    simulated_[answer.id] = true;
    // Most simulated blocks never recur: a block that measured nothing keeps no entry. One
    // simulated again under an id already known (its record was not kept) did the same: the
    // replays counted under that id stay.
    StrategyStats added = stats_added(after, before);
    if (has_sums(added)) effects_.try_emplace(answer.id, Effect{std::move(added), 0});
  }
}

std::string BlockReplay::state_key() const {
  // A block's first exchange is a region of its own key until its figure is known.
  return "first exchanges known " + std::to_string(first_cache_.size());
}

void BlockReplay::then(std::string_view next_kind) { next_kind_ = std::string(next_kind); }

void BlockReplay::end() {
  COCO_CHECK(expected_.empty() || expected_ == "blocks end",
             "a pass's blocks end after a block that named '" + expected_ + "' as its next");
  expected_.clear();
  next_kind_.reset();
  replay_.begin_region("blocks end", false);
}

namespace {

// "model/scope", kept for the run (a charge's label is a view).
std::string_view reference_label(std::string_view model, std::string_view scope) {
  static std::mutex mu;
  static std::set<std::string, std::less<>> labels;
  std::string key = std::string(model) + "/" + std::string(scope);
  const std::lock_guard<std::mutex> lock(mu);
  return *labels.insert(std::move(key)).first;
}

// The host's issue of one block (or of the work outside the blocks) as the model's reference
// implementation issues it, where the rank's host is so modelled.
void charge_reference_host(const Exec& ex, std::string_view scope) {
  if (!ex.comm.host_reference()) return;
  OpCost c;
  c.label = reference_label(ex.model, scope);
  c.shape.kernel = KernelClass::kHostBlock;
  ex.charge(c);
}

}  // namespace

void run_block(const Exec& ex, std::string_view kind, int attention_layers,
               const std::function<void()>& body, std::string_view reference_list) {
  // The reference's ModuleLists: the single-stream blocks of FLUX.1 and FLUX.2, and the rest,
  // unless the model names its own. Charged inside the block, so that a replayed block issues
  // it as the block did.
  const std::string_view scope = !reference_list.empty() ? reference_list
                                 : kind.find("single") != std::string_view::npos
                                     ? "single_transformer_blocks"
                                     : "transformer_blocks";
  const auto block = [&] {
    charge_reference_host(ex, scope);
    body();
  };
  if (ex.blocks == nullptr) {
    block();
    return;
  }
  ex.blocks->run(kind, attention_layers, block);
}

void then_block(const Exec& ex, const BlockKinds& kinds, int i, int n) {
  if (ex.blocks != nullptr && kinds) ex.blocks->then(i + 1 < n ? kinds(i + 1) : std::string());
}

void end_blocks(const Exec& ex) {
  charge_reference_host(ex, "outside");
  if (ex.blocks != nullptr) ex.blocks->end();
}

}  // namespace cocodiff::dit
