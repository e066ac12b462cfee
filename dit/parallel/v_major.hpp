#pragma once
// V-Major selective communication: adjacent denoising steps produce similar V, so on the slow
// tiers (inter-node by default) a TAPA or flat phase sends V only for the blocks (rows x head
// group) whose change since the copy the receiver holds exceeds a threshold:
//   active(b) = ||V_new(b) - V_held(b)||_2 > threshold * ||V_held(b)||_2   (threshold 0: any bit)
// The sender keeps a mirror of what each receiver holds, so both sides agree bitwise; a mask
// all-to-all (one element per block) tells the receiver what follows, then the active blocks
// go, and the receiver patches its cache and hands the full block on. The first
// `warmup_steps` steps and every `refresh_every`-th step send everything (caches refreshed).
// Phantom mode has no values to compare: a fixed share of the blocks
// (`phantom_active_fraction`, spread evenly) is sent instead, and stats say so.
//
//   VMajorCache cache(options, topology);          // per rank, owned by the strategy
//   cache.begin_forward(step, pass);               // before every transformer pass
//   VMajorChannel ch(cache, cache.next_layer(), head_dim);
//   BlockExchange v(group, shape, phantom, "v_all_to_all", &ch);   // V only

#include <cstdint>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "dit/attention_strategy.hpp"
#include "dit/parallel/tapa.hpp"

namespace cocodiff::dit {

struct StrategyMemoryQuery;  // dit/parallel/strategies.hpp

class VMajorCache {
 public:
  /// ConfigError when a tier name is not one of the topology's.
  VMajorCache(const StrategyOptions& options, const Topology& topo, bool phantom);
  void begin_forward(int step, int pass);
  /// The caches one tile keeps, in bytes: for every attention layer, the sender's mirror and
  /// the receiver's copy of the V blocks exchanged over the selective tiers (its share of the
  /// tile's V: the fraction of peers across those tiers).
  static double tile_bytes(const StrategyMemoryQuery& q);
  /// Whether `step` sends everything (a warm-up or refresh step) under `options`.
  static bool full_step_at(const StrategyOptions& options, int step);
  /// Key of the next attention layer of the current pass.
  int next_layer() {
    flag(pass_, layer_) |= kSeen;
    return pass_ * 65536 + layer_++;
  }
  /// Whether the next attention layer of the current pass was exchanged before (its cache
  /// counted); a replayed block's layers are skipped (BlockReplay).
  bool next_layer_seen() const { return (flag_at(pass_, layer_) & kSeen) != 0; }
  /// A replayed block's layers: advanced past, their cache (`cache_bytes`, what a simulated
  /// block of the same key counted) added, and never counted again.
  void skip_layers(int layers, double cache_bytes);
  /// Warm-up and refresh steps send everything.
  bool full_step() const { return full_; }
  bool tier_selected(int tier) const;
  const StrategyOptions& options() const { return opt_; }
  bool phantom() const { return phantom_; }
  /// Statistics so far (v_major fields of StrategyStats).
  void add_to(StrategyStats& s) const;

  // ---- what a VMajorChannel keeps here ----
  /// The statistics of tier `tier` (a Topology tier index).
  VMajorTierStats& tier_stats(int tier) { return tiers_[topo_.tier_name(tier)]; }
  /// The copy of block `key` (`numel` elements) a sender mirrors (held = false) or a receiver
  /// holds (held = true), counted in the cache's size when it is new; in phantom mode an empty
  /// vector, counted when `counting` (the pass's first visit: counts_pass).
  std::vector<float>& block_copy(bool held, std::uint64_t key, std::int64_t numel, bool counting);
  /// Whether a pass over the blocks of layer `layer` (next_layer's key) named by `pass_key`
  /// counts its blocks: always with real values, and in phantom mode on its first visit only
  /// (and never for a layer skip_layers counted).
  bool counts_pass(int layer, std::uint64_t pass_key);

 private:
  StrategyOptions opt_;
  const Topology& topo_;
  bool phantom_;
  std::vector<bool> tier_on_;
  int pass_ = 0, layer_ = 0;
  // Per pass and layer: kSeen (exchanged or skipped), kCountedWhole (phantom: its cache was
  // added by skip_layers).
  static constexpr std::uint8_t kSeen = 1, kCountedWhole = 2;
  std::vector<std::vector<std::uint8_t>> layer_flags_;
  std::uint8_t& flag(int pass, int layer);
  std::uint8_t flag_at(int pass, int layer) const;
  bool full_ = true;
  // (layer, phase, source, destination) -> block values: what each receiver holds (mirror,
  // kept by the sender) and what this rank holds as a receiver.
  std::unordered_map<std::uint64_t, std::vector<float>> mirror_, held_;
  // Phantom mode keeps counts, not caches: the (layer, phase, side) whose blocks were counted
  // in cache_elements_ (one entry per exchange, not per block; no block buffers).
  std::unordered_set<std::uint64_t> phantom_counted_;
  std::map<std::string, VMajorTierStats> tiers_;
  double cache_elements_ = 0;
  std::vector<float> none_;  // phantom: the (always empty) copy of every block
};

/// One V exchange's use of the cache.
class VMajorChannel {
 public:
  VMajorChannel(VMajorCache& cache, int layer, int head_dim)
      : c_(cache), layer_(layer), head_dim_(head_dim) {}
  /// True when this phase compacts some peer's blocks (not on full steps).
  bool selective(const SpGroup::Phase& ph) const;
  /// Sender: masks and compacted active blocks for selective peers; sets io.mask_layout and the
  /// send side of io.layout; the non-selective peers keep their full blocks.
  void pack(const Exec& ex, int phase, PhaseIo& io);
  /// Receiver, after the mask arrived: receive counts of selective peers; sizes io.recv.
  void plan_receive(int phase, PhaseIo& io);
  /// Receiver: patches the held copies and writes the full blocks into io.recv.
  void unpack(const Exec& ex, int phase, PhaseIo& io);
  /// Full steps: the sender's mirror and the receiver's copy take the values sent.
  void record_sent(int phase, PhaseIo& io);
  void record_received(int phase, PhaseIo& io);

 private:
  struct Pack;  // one pack call: sub-block sizes, threshold, compacted blocks, totals
  /// Sender: the mask and compacted active blocks for selective peer v; sets its send count and
  /// displacement and returns its number of sub-blocks.
  std::int64_t pack_member(Pack& pk, int phase, PhaseIo& io, size_t v);
  /// Sender: send block i's sub-blocks into the mask and the compacted blocks (`idx`: the
  /// peer's sub-blocks so far; `phantom_sent`: elements a phantom run counts as sent).
  void pack_block(Pack& pk, int phase, PhaseIo& io, int i, VMajorTierStats& ts, std::int64_t& idx,
                  std::int64_t& phantom_sent);
  bool member_selective(const SpGroup::Phase& ph, int v) const;
  std::uint64_t key(int phase, int s, int d) const;
  std::int64_t subblocks(BlockShape b) const;
  /// Starts one pass over the blocks of `phase` on one side (held: receiver copies); in phantom
  /// mode its blocks count towards the cache size only the first time.
  void begin_pass(int phase, bool held);
  VMajorCache& c_;
  bool counting_ = true;  // phantom: this pass's blocks are not counted yet
  int layer_;
  int head_dim_;
};

}  // namespace cocodiff::dit
