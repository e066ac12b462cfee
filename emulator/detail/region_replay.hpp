#pragma once
// Region marks (Replay::begin_region): every tile waits at a mark; when all have arrived and
// nothing else is under way, what follows depends only on the tiles' clock offsets and on the
// key they passed, so a region seen before from the same offsets is not simulated again: its
// recorded effect on the clocks and counts is applied (Accounting::apply), exactly.

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/replay.hpp"
#include "emulator/detail/event_source.hpp"
#include "emulator/detail/kernel.hpp"

namespace cocodiff::emu::detail {

class RegionReplay final : public EventSource {
 public:
  explicit RegionReplay(Kernel& k) : k_(k) {}

  /// Tile f reaches its next mark (main fibers only): waits there until every tile has, then
  /// learns whether the region that follows was replayed.
  Replay::RegionMark begin(FiberState& f, std::string_view key, bool may_skip);
  /// The mark with tiles waiting at the earliest clock, and that clock; -1 when none has.
  std::pair<int, SimTime> next() const;
  /// The controller reached mark `mark`'s earliest clock: replays, records or releases it.
  void event(int mark);
  /// A tile at a region mark waits like a timer at its own clock (it posts nothing earlier).
  SimTime next_time() const override {
    const auto [mark, t] = next();
    next_mark_ = mark;
    return t;
  }
  /// The mark the latest next_time() named.
  void fire() override { event(next_mark_); }
  /// Regions replayed so far (RunResult::regions_replayed).
  std::uint64_t replayed() const { return replayed_; }

 private:
  Kernel& k_;
  struct MarkState {
    std::string key;
    bool replayable = true;  // every rank passed the same key and may_skip
    bool broken = false;     // released before all ranks arrived or with work in flight
    int arrived = 0, passed = 0;
    SimTime min_clock = SimTime::max();
    std::vector<FiberState*> waiters;
  };
  /// What a region did, relative to its start T0 (the earliest clock at its mark).
  struct RegionRecord {
    std::vector<std::int64_t> end_ns;  // per tile: clock at the next mark - T0 (then hosts')
    Accounting::Effect effect;
  };
  struct Recording {
    bool active = false;
    int mark = 0;
    std::uint64_t id = 0;
    Accounting::Mark from;  // the counts at the region's start, T0 with them
  };
  /// Wakes the tiles waiting at a mark.
  void release(MarkState& ms);
  /// Every tile waits at the mark and nothing else is under way (Kernel::nothing_under_way).
  bool quiescent(const MarkState& ms) const;
  /// The earliest clock T0 of the tiles at a quiescent mark; offsets_ their offsets from it.
  SimTime clock_offsets();
  /// Keeps the effect of the region recorded since the previous mark, whose end starts at t0.
  void keep_recorded(SimTime t0);
  /// Applies a recorded region's effect from t0.
  void replay(const RegionRecord& r, SimTime t0);
  /// Starts recording the region that starts at t0 under `id`.
  void start_recording(int mark, std::uint64_t id, SimTime t0);
  std::map<int, MarkState> marks_;
  std::vector<std::int64_t> offsets_;       // event's clock offsets of the tiles
  std::vector<FiberState*> spare_waiters_;  // a finished mark's waiters, cleared, for the next
  std::map<std::pair<std::string, std::vector<std::int64_t>>, std::uint64_t> region_ids_;
  std::unordered_map<std::uint64_t, RegionRecord> records_;
  Recording rec_;
  std::uint64_t replayed_ = 0;
  mutable int next_mark_ = -1;  // what next_time() found, for fire()
};

}  // namespace cocodiff::emu::detail
