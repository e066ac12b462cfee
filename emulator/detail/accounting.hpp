#pragma once
// What a run counts: every tile's charges, waits and events, every flow, the labels they are
// named by and the timeline hash they fold into. The engine's mechanisms report here and read
// nothing back but a tile's state; region replay takes a region's effect (effect_since) and
// applies it again (apply), so a replayed region counts and hashes exactly as a simulated one.
// Lives on the controller's thread (labels may be interned from math threads: a mutex).

#include <array>
#include <cstdint>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "core/op_cost.hpp"
#include "core/sim_time.hpp"
#include "core/topology.hpp"
#include "emulator/detail/tile_clock.hpp"
#include "emulator/detail/timeline_hash.hpp"
#include "emulator/engine.hpp"
#include "net_models/device_model.hpp"

namespace cocodiff::emu::detail {

/// Per-tile accounting, written only by the tile's main fiber (and read after the run), and by
/// the controller while every tile waits at a region mark.
struct TileStats {
  /// The tile's events are hashed region by region: `inner` (hash_word in timeline_hash.hpp) over
  /// the current region's events with times relative to `region_start`, folded into `hash` with
  /// region_start when the next region begins. A replayed region thus hashes exactly like a
  /// simulated one.
  std::uint64_t hash = kHashBasis;
  std::uint64_t inner = kHashBasis;
  std::uint64_t last_inner = kHashBasis;  // the region that ended at the latest mark
  SimTime region_start;
  int marks = 0;  // begin_region calls so far
  std::uint64_t events = 0;
  std::vector<TraceEvent> trace;
  /// The tile's host, compute and communication streams and their overlap (its device's
  /// clock is its main fiber's).
  TileClock timing;
  SimTime end;  // its device's clock when its fiber ended
};

class Accounting {
 public:
  Accounting(const Topology& topo, const DeviceModel& device, const EngineOptions& options);

  /// Every tile at zero, before a run.
  void start();
  TileStats& tile(int rank) { return tiles_[static_cast<std::size_t>(rank)]; }
  const TileStats& tile(int rank) const { return tiles_[static_cast<std::size_t>(rank)]; }
  const std::vector<TileStats>& tiles() const { return tiles_; }
  /// Whether the device has a host that issues its ops (DeviceModel::has_host).
  bool has_host() const { return has_host_; }

  /// A compute charge of `dt` (the device's time for an op of `kind` labelled `label`) on
  /// rank's tile from `start`: scaled by the rank's speed (DeviceModel::rank_spread), by the
  /// kernels' pace inside a step (DeviceModel::kernel_step_factor) and by
  /// overlap while the tile has a collective open (as much as the kind takes of it:
  /// DeviceModel::overlap_kind_weight), started no earlier than its host has issued it. The
  /// tile's accounting and event; returns the clock after it.
  SimTime charge(int rank, SimTime start, SimTime dt, std::string_view label, OpKind kind,
                 KernelClass kernel = KernelClass::kNone);
  /// Where the device has overlap factors by group size (DeviceModel::overlap_groups), the slot
  /// of a collective of `ranks` ranks (one per group size, then one for every other size);
  /// compute a tile issues while collectives are open runs the largest of their slots' compute
  /// factors slower. -1 without such factors.
  int overlap_slot(int ranks) const;
  /// The number of overlap slots (TileClock::open).
  std::size_t overlap_slots() const { return slot_compute_.size(); }
  /// A collective call issued by rank's host (DeviceModel::collective_issue) at `clock`:
  /// returns when its kernel may start.
  SimTime issue_collective(int rank, SimTime clock);
  /// Rank's host waits for its device: it issues nothing more before `clock`.
  void block_host(int rank, SimTime clock);
  /// An event of rank's tile, hashed and, with the trace on, kept.
  void tile_event(int rank, TraceEvent::Kind kind, SimTime start, SimTime end,
                  std::string_view label);
  /// A completed flow's share of the statistics, the timeline hash and the trace, once per
  /// label (the parts of one ring pass message travel as one flow each). `exclusive`: timed in
  /// closed form, not by the network model (counted apart for the report).
  void flow(SimTime start, SimTime end, int src, int dst, std::int64_t bytes,
            std::span<const std::uint32_t> labels, bool exclusive = false);
  /// Folds the flows since the last quiescent mark into the hash; times of the next ones are
  /// taken from `next_base`.
  void fold_flow_hash(SimTime next_base);
  /// The flows' part of the hash not yet folded: its base time and digest (a span's recording
  /// keeps it relative to the span's start).
  struct OpenFlows {
    std::int64_t base_ns = 0;
    std::uint64_t inner = kHashBasis;
  };
  /// The open part now, its base relative to t0.
  OpenFlows open_flows(SimTime t0) const { return {(flow_base_ - t0).ns(), flow_inner_}; }
  /// A replayed span's flows from t0: folds the open parts its quiescent marks folded, then
  /// opens `open` (bases relative to t0).
  void replay_flow_folds(std::span<const OpenFlows> folded, const OpenFlows& open, SimTime t0);
  /// The run's per-tile results, flows, bytes by tier, labels, trace and timeline hash (the
  /// digest of every tile's events and end, and of the flows).
  void finish(RunResult& res);

  /// The label's number in RunResult::labels (trace events name labels by it).
  std::uint32_t intern(std::string_view label);
  /// One copy of `label` kept for the run: equal labels share it (a tape's labels point there,
  /// so that hashing them reads memory every call of that label reads).
  std::string_view keep_label(std::string_view label);
  /// Topology::tier(a, b), from a table: the tier of every completed flow.
  int tier(int a, int b) const;

  /// Where a region's recording starts: the counts it is measured from.
  struct Mark {
    SimTime t0;
    std::vector<SimTime> compute, exposed, host_wait;
    std::vector<std::uint64_t> events;
    std::vector<std::size_t> trace_size;
    std::uint64_t flows = 0;
    std::vector<std::int64_t> bytes_by_tier;
    std::size_t flow_trace_size = 0;
  };
  /// What a region did to the counts, relative to its start (every tile's and flow's share,
  /// the hash of its events, its trace with times from its start).
  struct Effect {
    std::vector<SimTime> compute, exposed, host_wait;
    std::vector<std::uint64_t> events, inner;
    std::uint64_t flow_inner = kHashBasis;
    std::uint64_t flows = 0;
    std::vector<std::int64_t> bytes_by_tier;
    std::vector<std::vector<TraceEvent>> tile_trace;
    std::vector<TraceEvent> flow_trace;
  };
  /// No further event or flow enters the trace: it is off, or every tile's part and the flows'
  /// part are full (a region recorded now keeps no trace).
  bool trace_closed() const;
  /// The counts now, for a region that starts at t0.
  Mark mark(SimTime t0) const;
  /// The effect of the region recorded since `m` (every tile's inner hash is that of the region
  /// that ended at the latest mark, TileStats::last_inner).
  Effect effect_since(const Mark& m) const;
  /// Adds a recorded region's effect, from t0 (the tiles' clocks and hosts are the caller's).
  void apply(const Effect& e, SimTime t0);

 private:
  const EngineOptions& options_;
  const DeviceModel& device_;
  const int ranks_;
  const int tiers_;
  const int levels_;
  // The device's constant answers, asked once (charge runs for every op of every tile).
  bool has_host_ = false;
  double overlap_compute_factor_ = 1.0;
  std::vector<int> overlap_groups_;   // DeviceModel::overlap_groups
  std::vector<double> slot_compute_;  // each slot's compute factor (the last: other sizes)
  std::array<double, kNumOpKinds> kind_weight_{};  // DeviceModel::overlap_kind_weight
  /// Op issue costs scale with the ranks sharing a node's host and with the hosts each
  /// exchange waits for (host_issue_scale).
  double host_scale_ = 1.0;
  /// Each rank's factor on its device time (DeviceModel::rank_spread x kernel_step_factor);
  /// empty: all alike at 1.
  std::vector<double> rank_speed_;
  std::vector<int> rank_group_;  // see the constructor

  std::vector<TileStats> tiles_;
  std::size_t tile_trace_cap_ = 0;
  std::vector<TraceEvent> flow_trace_;
  std::vector<std::int64_t> bytes_by_tier_;
  std::uint64_t flows_ = 0;
  std::uint64_t flows_exclusive_ = 0;
  // The flows since the last quiescent mark, times relative to its T0 (see TileStats::inner):
  // the sum of one digest per flow, so the hash does not depend on the order flows complete
  // in (exclusive flows are accounted when they are matched).
  std::uint64_t flow_inner_ = kHashBasis;
  SimTime flow_base_;
  std::uint64_t flow_hash_ = kHashBasis;

  std::mutex label_mutex_;
  std::vector<std::string> labels_;
  std::unordered_map<std::string, std::uint32_t> label_ids_;
  std::unordered_set<std::string> kept_labels_;  // keep_label's copies (nodes do not move)
};

}  // namespace cocodiff::emu::detail
