#pragma once
// Region marks (Replay::begin_region): every tile waits at a mark; when all have arrived and
// nothing else is under way, what follows depends only on the tiles' clock offsets and on the
// key they passed, so a region seen before from the same offsets is not simulated again: its
// recorded effect on the clocks and counts is applied (Accounting::apply), exactly.
// A span (Replay::begin_span) runs from its mark to the next span mark, whatever regions it
// holds, quiescent or not. A tile passes a span mark without waiting and arrives there at its
// next call that is not a compute charge (or its next mark, or its end): what it computes
// before touches nothing another tile sees, so the mark is judged where the tiles arrive, and
// work still in flight at the mark may be over by then. Recorded between two quiescent
// arrivals, a span is replayed the same way, its regions' hash folds included, and its tiles
// then pass its inner marks without waiting, their calls free (FiberState::skipping), up to
// its end mark, where the recording took their clocks and counts.
// A passed region (Replay::pass_region) is a region judged where its tiles arrive, as a span
// mark is, once a mark of its key was not quiescent where the tiles passed it (before that, and
// while the trace takes events, it is judged at the mark, as a region's), and recorded and
// replayed as a span that holds no mark: from its arrivals to where its tiles pass the next
// mark, whatever that mark is. A replayed one's tiles run their code up to that mark with every
// call free.

#include <cstdint>
#include <map>
#include <optional>
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

  /// Tile f reaches its next mark (main fibers only). At a region mark it waits until every
  /// tile has, then learns whether the region that follows was replayed. A span mark or a
  /// passed region's it passes (FiberState::pending_span), answering {} (inside a replayed
  /// span: the recorded answer). A passed region's mark is judged as a region's while the
  /// trace still takes events or where its key's last mark was quiescent where the tiles passed
  /// it (its first tile decides, for all: passed_kind).
  Replay::RegionMark begin(FiberState& f, std::string_view key, bool may_skip, MarkKind kind,
                           std::string_view next = {});
  /// Tile f's answer for the region it marked last (Replay::passed_answer); it arrives there
  /// first if it has not.
  Replay::RegionMark passed_answer(FiberState& f);
  /// Tile f, which passed a mark, arrives there (at its first call that is not a compute
  /// charge): waits until every tile has. Nothing when it has none pending.
  void arrive_pending(FiberState& f);
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
    std::string key, next;   // a span's or passed region's next
    bool replayable = true;  // every rank passed the same key, next and may_skip
    bool broken = false;     // released before all ranks arrived or with work in flight
    MarkKind kind = MarkKind::kRegion;
    bool span() const { return kind == MarkKind::kSpan; }  // a span's mark (begin_span)
    std::uint64_t id = 0;  // a broken mark's id, for the tiles that arrive after its release
    int arrived = 0, passed = 0;
    SimTime min_clock = SimTime::max();
    std::vector<FiberState*> waiters;
  };
  /// What a region did, relative to its start T0 (the earliest clock at its mark).
  struct RegionRecord {
    std::vector<std::int64_t> end_ns;  // per tile: clock at the next mark - T0 (then hosts')
    std::int64_t quiet_ns = 0;         // its last work's event - T0 (Kernel::last_work)
    Accounting::Effect effect;
  };
  struct Recording {
    bool active = false;
    int mark = 0;
    std::uint64_t id = 0;
    Accounting::Mark from;  // the counts at the region's start, T0 with them
  };
  /// A region mark inside a span, as its recording saw it.
  struct SpanMark {
    std::string key;
    std::uint64_t id = 0;
  };
  /// A tile's region hash at a mark inside a span (what begin folds): its start from T0.
  struct TileFold {
    std::int64_t start_ns = 0;
    std::uint64_t inner = kHashBasis;
  };
  /// What a span did, relative to its start T0.
  struct SpanRecord {
    RegionRecord whole;           // its clocks' ends and effect, as a region's
    std::vector<SpanMark> marks;  // its inner marks, in order
    /// Per tile: one fold per inner mark, then the region open at its end mark.
    std::vector<std::vector<TileFold>> folds;
    std::vector<Accounting::OpenFlows> flow_folds;  // folded at its quiescent inner marks
    Accounting::OpenFlows open;                     // open at its end mark
    std::string next;  // what followed its end (Replay::begin_span, Replay::pass_region)
    /// Its work was still in flight where the first tile passed its end mark: it is replayed
    /// only before the same `next`.
    bool tail = false;
  };
  /// A tile as it passed a recorded span's end mark.
  struct TileEnd {
    SimTime clock, host, compute, exposed, host_wait;  // its clock, host and totals there
    std::uint64_t events = 0;
  };
  struct SpanRecording {
    bool active = false;
    bool mixed = false;  // the tiles passed different keys at an inner mark: not kept
    std::uint64_t id = 0;
    Accounting::Mark from;
    SpanRecord rec;
    std::vector<TileEnd> ends;  // per tile
  };
  /// Tile f arrives at mark m: waits there until the controller judges it.
  Replay::RegionMark arrive(FiberState& f, int m, std::string_view key, bool may_skip,
                            MarkKind kind, std::string_view next = {});
  /// Mark m of kind kPassedRegion, as the first tile passes it: kRegion while the trace takes
  /// events, or where the last mark of its key was quiescent where the tiles passed it.
  MarkKind passed_kind(int m, std::string_view key);
  /// At a quiescent passed region's arrivals: replays the region recorded from the same start
  /// state (one with work in flight at its end only before the same next), or records it.
  /// Returns its id.
  std::uint64_t replay_or_record_region(const MarkState& ms, SimTime t0);
  /// Applies a recorded passed region's effect from t0; its tiles skip to its end mark.
  void replay_region(const SpanRecord& r, SimTime t0);
  /// Tile f passes a mark while a span or a passed region records: what its end keeps.
  static void note_pass(SpanRecording& rec, const FiberState& f, const TileStats& t, bool end);
  /// The record of a span (or passed region) of `key` from the tiles' state at t0, and its id
  /// (one whose work was in flight at its end only before `next`); null where none is.
  std::pair<std::uint64_t, const SpanRecord*> find_span(const std::string& key,
                                                        const std::string& next, SimTime t0);
  /// At a quiescent span mark: replays the span recorded from the same start state before the
  /// same next (where it must be), or starts recording it.
  void replay_or_record_span(const MarkState& ms, SimTime t0);
  /// The earliest clock at which a tile passed the latest mark (TileStats::region_start).
  SimTime mark_clock() const;
  /// What a span's start state is: the clock offsets, then every tile's region open since the
  /// mark (its start from t0, its hash).
  const std::vector<std::int64_t>& span_state(SimTime t0);
  /// Wakes the tiles waiting at a mark.
  void release(MarkState& ms);
  /// Every tile waits at the mark and nothing else is under way (Kernel::nothing_under_way).
  bool quiescent(const MarkState& ms) const;
  /// The earliest clock T0 of the tiles at a quiescent mark; offsets_ their offsets from it.
  SimTime clock_offsets();
  /// Keeps the effect of the region recorded since the previous mark, whose end starts at t0.
  void keep_recorded(SimTime t0);
  /// What the tiles did since `from` (a region's or a span's start), up to the mark at t0.
  RegionRecord recorded_since(const Accounting::Mark& from, SimTime t0) const;
  /// Applies a recorded region's effect from t0.
  void replay(const RegionRecord& r, SimTime t0);
  /// Starts recording the region that starts at t0 under `id`.
  void start_recording(int mark, std::uint64_t id, SimTime t0);
  /// The id of (key, state) in `ids`, a new one if it has none.
  std::uint64_t id_of(
      std::map<std::pair<std::string, std::vector<std::int64_t>>, std::uint64_t>& ids,
      const std::string& key, const std::vector<std::int64_t>& state);
  /// A tile of a replayed span at a mark: the recorded answer of an inner one, nullopt at the
  /// span's end (which it then passes as an ordinary mark).
  std::optional<Replay::RegionMark> skip_mark(FiberState& f, std::string_view key, bool span);
  /// A quiescent mark ends the span (or passed region) `rec` recorded since its start: keeps it.
  void keep_span(SpanRecording& rec, SimTime t0);
  /// Applies a recorded span's effect from t0; its tiles skip to its end.
  void replay_span(const SpanRecord& r, SimTime t0);
  /// Starts recording into `rec` the span (or passed region) that starts at t0 under `id`,
  /// followed by `next`.
  void start_span(SpanRecording& rec, std::uint64_t id, SimTime t0, const std::string& next);
  std::map<int, MarkState> marks_;
  std::vector<std::int64_t> offsets_;       // event's clock offsets of the tiles
  std::vector<std::int64_t> span_state_;    // span_state's, kept between marks
  std::vector<FiberState*> spare_waiters_;  // a finished mark's waiters, cleared, for the next
  std::map<std::pair<std::string, std::vector<std::int64_t>>, std::uint64_t> region_ids_;
  std::unordered_map<std::uint64_t, RegionRecord> records_;
  Recording rec_;
  std::map<std::pair<std::string, std::vector<std::int64_t>>, std::uint64_t> span_ids_;
  std::unordered_map<std::uint64_t, SpanRecord> spans_;
  SpanRecording span_rec_;
  SpanRecording region_rec_;  // a passed region's, from its arrivals to its next mark
  /// By mark, for a passed region's: how it is judged (passed_kind).
  static constexpr std::int8_t kUndecided = -1, kAtMarkTrace = 0, kAtMarkQuiet = 1, kAtArrivals = 2;
  std::vector<std::int8_t> passed_kind_;
  /// By a passed region's key: its last mark was quiescent where the tiles passed it.
  std::map<std::string, bool, std::less<>> quiet_at_pass_;
  const SpanRecord* replaying_ = nullptr;  // the span the tiles are skipping through
  std::vector<std::size_t> cursor_;        // per tile: its next inner mark of replaying_
  std::uint64_t next_id_ = 1;              // regions' and spans' ids (0: none)
  SimTime quiet_until_;                    // the latest replayed region's work ended by then
  std::uint64_t replayed_ = 0;
  mutable int next_mark_ = -1;  // what next_time() found, for fire()
};

}  // namespace cocodiff::emu::detail
