// RegionReplay: exact replay of a region of the run that starts from a state already simulated
// (Replay::begin_region).

#include "emulator/detail/region_replay.hpp"

#include <algorithm>
#include <cstdint>
#include <span>
#include <string>

#include "core/errors.hpp"

namespace cocodiff::emu::detail {

namespace {

const char* kind_name(MarkKind k) {
  switch (k) {
    case MarkKind::kRegion:
      return "a region";
    case MarkKind::kPassedRegion:
      return "a passed region";
    case MarkKind::kSpan:
      return "a span";
  }
  return "a mark";
}

}  // namespace

Replay::RegionMark RegionReplay::begin(FiberState& f, std::string_view key, bool may_skip,
                                       MarkKind kind, std::string_view next) {
  if (k_.aborting()) throw Cancelled{};
  COCO_CHECK(f.is_main, "region marks are made by tile fibers");
  arrive_pending(f);  // a mark the tile passed comes first
  TileStats& t = k_.accounting().tile(f.rank);
  if (f.skipping_region) {  // a passed region replayed from its arrivals ends at any mark
    f.skipping = false;
    f.skipping_region = false;
  } else if (f.skipping) {
    if (const std::optional<Replay::RegionMark> inner =
            skip_mark(f, key, kind == MarkKind::kSpan)) {
      ++t.marks;
      return *inner;
    }
  }
  if (kind == MarkKind::kPassedRegion) kind = passed_kind(t.marks, key);
  // While a span records, every mark a tile passes is inside it (its end included); a passed
  // region's recording ends at the next mark. Each ends where its tiles pass its end mark: what
  // they compute from there to their arrival is simulated after a replay, as it was here.
  if (span_rec_.active) note_pass(span_rec_, f, t, kind == MarkKind::kSpan);
  if (region_rec_.active) note_pass(region_rec_, f, t, true);
  hash_value(t.hash, t.region_start.ns());
  hash_value(t.hash, t.inner);
  t.last_inner = t.inner;
  t.inner = kHashBasis;
  t.region_start = f.clock;
  const int m = t.marks++;
  if (kind != MarkKind::kRegion) {  // passed: the tile arrives at its next call (arrive_pending)
    f.pending_span = m;
    f.pending_is_span = kind == MarkKind::kSpan;
    f.pending_key = key;
    f.pending_may_skip = may_skip;
    f.pending_next = next;
    return {};
  }
  return arrive(f, m, key, may_skip, MarkKind::kRegion);
}

void RegionReplay::note_pass(SpanRecording& rec, const FiberState& f, const TileStats& t,
                             bool end) {
  const auto u = static_cast<size_t>(f.rank);
  rec.rec.folds[u].push_back({(t.region_start - rec.from.t0).ns(), t.inner});
  if (!end) return;
  const TileClock& c = t.timing;
  rec.ends[u] = {f.clock, c.host(), c.compute(), c.exposed(), c.host_wait(), t.events};
}

MarkKind RegionReplay::passed_kind(int m, std::string_view key) {
  const auto u = static_cast<size_t>(m);
  if (passed_kind_.size() <= u) passed_kind_.resize(u + 1, kUndecided);
  if (passed_kind_[u] == kUndecided) {
    // A record copies no trace (Accounting::trace_closed): while it takes events, the mark is
    // judged where the tiles pass it, as a region's. So is the first mark of a key, and one
    // whose key's last mark was quiescent there: its region may then be replayed at the mark,
    // its body skipped, rather than from the arrivals with its body run, its calls free. Where
    // the last one was not, the tiles' arrivals may be.
    const auto quiet = quiet_at_pass_.find(key);
    passed_kind_[u] = !k_.accounting().trace_closed()                  ? kAtMarkTrace
                      : quiet == quiet_at_pass_.end() || quiet->second ? kAtMarkQuiet
                                                                       : kAtArrivals;
  }
  return passed_kind_[u] == kAtArrivals ? MarkKind::kPassedRegion : MarkKind::kRegion;
}

Replay::RegionMark RegionReplay::passed_answer(FiberState& f) {
  arrive_pending(f);
  return {f.replayed, f.region_id};  // as the controller judged it (arrive)
}

void RegionReplay::arrive_pending(FiberState& f) {
  if (f.pending_span < 0) return;
  const int m = f.pending_span;
  f.pending_span = -1;
  const std::string key = std::move(f.pending_key);
  const std::string next = std::move(f.pending_next);
  arrive(f, m, key, f.pending_may_skip,
         f.pending_is_span ? MarkKind::kSpan : MarkKind::kPassedRegion, next);
}

Replay::RegionMark RegionReplay::arrive(FiberState& f, int m, std::string_view key, bool may_skip,
                                        MarkKind kind, std::string_view next) {
  const int n = k_.topology().num_ranks();
  std::unique_lock<NullLock> lk(k_.state_lock());
  MarkState& ms = marks_[m];
  if (ms.arrived == 0) {
    ms.key = key;
    ms.next = next;
    ms.kind = kind;
    ms.waiters.swap(spare_waiters_);  // every tile waits here: the last mark's storage fits
  } else if (ms.key != key || ms.next != next) {
    ms.replayable = false;
    span_rec_.mixed = true;  // harmless when none records
    region_rec_.mixed = true;
  }
  COCO_CHECK(ms.kind == kind, "rank " + std::to_string(f.rank) + " marks " + kind_name(kind) +
                                  " where the first rank there marked " + kind_name(ms.kind) +
                                  " (mark " + std::to_string(m) + ")");
  ms.replayable = ms.replayable && may_skip;
  ++ms.arrived;
  f.replayed = false;
  f.region_id = 0;
  if (!ms.broken) {
    ms.waiters.push_back(&f);
    ms.min_clock = std::min(ms.min_clock, f.clock);
    k_.block(f, lk, nullptr, false);
  } else {
    f.region_id = ms.id;
  }
  const Replay::RegionMark res{f.replayed, f.region_id};
  if (const auto it = marks_.find(m); ++it->second.passed == n) {
    spare_waiters_ = std::move(it->second.waiters);
    spare_waiters_.clear();
    marks_.erase(it);
  }
  return res;
}

std::pair<int, SimTime> RegionReplay::next() const {
  // A tile at a region mark waits like a timer at its own clock (it posts nothing earlier).
  std::pair<int, SimTime> first{-1, SimTime::max()};
  for (const auto& [m, ms] : marks_)
    if (!ms.waiters.empty() && ms.min_clock < first.second) first = {m, ms.min_clock};
  return first;
}

void RegionReplay::event(int mark) {
  MarkState& ms = marks_.at(mark);
  // A replayed region's work (its messages still in flight where its tiles passed its end)
  // was over by the next mark's earliest arrival when it was recorded. Earlier, it would be
  // under way here, and the replay would have dropped it: the caller broke a span's or passed
  // region's promise (what the tiles compute after its end mark, up to their first call,
  // differs).
  COCO_CHECK(ms.min_clock >= quiet_until_,
             "mark " + std::to_string(mark) + " ('" + ms.key +
                 "') is reached before the work replayed before it ended: a span's or passed "
                 "region's next must name what its tiles do after its end mark, up to their "
                 "first call");
  // A passed region's mark: whether it was quiescent where the tiles passed it (passed_kind).
  const std::int8_t how = static_cast<size_t>(mark) < passed_kind_.size()
                              ? passed_kind_[static_cast<size_t>(mark)]
                              : kUndecided;
  if (!quiescent(ms)) {
    if (how == kAtMarkQuiet || how == kAtArrivals) quiet_at_pass_[ms.key] = false;
    ms.broken = true;
    rec_.active = false;
    region_rec_.active = false;  // a passed region is kept only between quiescent arrivals
    if (span_rec_.active) {
      if (ms.span()) {
        span_rec_.active = false;  // a span is kept only between quiescent marks
      } else {
        ms.id = next_id_++;  // its blocks are known by it when the span is replayed
        span_rec_.rec.marks.push_back({ms.key, ms.id});
      }
    }
    for (FiberState* w : ms.waiters) w->region_id = ms.id;
    release(ms);
    return;
  }
  const SimTime t0 = clock_offsets();
  const bool judged_at_mark = ms.kind == MarkKind::kRegion;
  // The region that ends here was recorded from the previous mark: keep its effect. Not where
  // it ends at a passed mark: the tiles are at their arrivals there, past its end.
  if (rec_.active && rec_.mark + 1 == mark && judged_at_mark) keep_recorded(t0);
  rec_.active = false;
  // The flows are folded where the mark is quiescent. A passed mark's tiles arrive after it:
  // it folds where it was quiescent already when the first tile passed it (its work ended by
  // the earliest clock there), as a region mark would, and, where what follows may be
  // replayed, at any quiescent arrival (a replay folds from its start). No flow started between
  // a passed mark and the arrivals: they are folded from the earliest clock at the mark itself.
  const SimTime first = mark_clock();
  const bool fold = judged_at_mark || ms.replayable || k_.last_work() <= first;
  if (how == kAtMarkQuiet || how == kAtArrivals)
    quiet_at_pass_[ms.key] = judged_at_mark || k_.last_work() <= first;
  if (region_rec_.active) keep_span(region_rec_, t0);
  if (span_rec_.active && ms.span())
    keep_span(span_rec_, t0);
  else if (span_rec_.active && fold)
    span_rec_.rec.flow_folds.push_back(k_.accounting().open_flows(span_rec_.from.t0));
  if (fold) k_.accounting().fold_flow_hash(judged_at_mark ? t0 : first);
  std::uint64_t id = 0;
  const bool replayable = ms.replayable && k_.options().replay;
  if (ms.span()) {
    // While the trace takes events, a span's record would copy the trace of its every region:
    // its regions replay on their own instead.
    if (replayable && k_.accounting().trace_closed()) replay_or_record_span(ms, t0);
  } else if (!judged_at_mark) {
    if (replayable) id = replay_or_record_region(ms, t0);
  } else if (replayable) {
    id = id_of(region_ids_, ms.key, offsets_);
    const auto rec = records_.find(id);
    if (rec != records_.end())
      replay(rec->second, t0);
    else
      start_recording(mark, id, t0);  // simulated once more, recording what it does
  }
  if (span_rec_.active && !ms.span()) span_rec_.rec.marks.push_back({ms.key, id});
  for (FiberState* w : ms.waiters) w->region_id = id;
  release(ms);
}

std::pair<std::uint64_t, const RegionReplay::SpanRecord*> RegionReplay::find_span(
    const std::string& key, const std::string& next, SimTime t0) {
  const std::vector<std::int64_t>& state = span_state(t0);
  std::uint64_t id = id_of(span_ids_, key, state);
  auto rec = spans_.find(id);
  // One that ended with work in flight was recorded before a given next: before another, it is
  // recorded again, under its key and that next.
  if (rec != spans_.end() && rec->second.tail && rec->second.next != next) {
    id = id_of(span_ids_, key + "\n" + next, state);
    rec = spans_.find(id);
  }
  return {id, rec != spans_.end() ? &rec->second : nullptr};
}

void RegionReplay::replay_or_record_span(const MarkState& ms, SimTime t0) {
  if (const auto [id, rec] = find_span(ms.key, ms.next, t0); rec != nullptr)
    replay_span(*rec, t0);
  else
    start_span(span_rec_, id, t0, ms.next);
}

std::uint64_t RegionReplay::replay_or_record_region(const MarkState& ms, SimTime t0) {
  const auto [id, rec] = find_span("region\n" + ms.key, ms.next, t0);
  if (rec != nullptr)
    replay_region(*rec, t0);
  else
    start_span(region_rec_, id, t0, ms.next);
  return id;
}

void RegionReplay::replay_region(const SpanRecord& r, SimTime t0) {
  replay(r.whole, t0);
  for (int rank = 0; rank < k_.topology().num_ranks(); ++rank) {
    FiberState& f = k_.main_fiber(rank);
    f.skipping = true;
    f.skipping_region = true;
    TileStats& t = k_.accounting().tile(rank);
    const TileFold& open = r.folds[static_cast<size_t>(rank)].back();  // its only one
    t.region_start = t0 + SimTime::from_ns(open.start_ns);
    t.inner = open.inner;
  }
  k_.accounting().replay_flow_folds({}, r.open, t0);
}

std::uint64_t RegionReplay::id_of(
    std::map<std::pair<std::string, std::vector<std::int64_t>>, std::uint64_t>& ids,
    const std::string& key, const std::vector<std::int64_t>& state) {
  const auto [it, added] = ids.try_emplace({key, state}, next_id_);
  if (added) ++next_id_;
  return it->second;
}

void RegionReplay::release(MarkState& ms) {
  for (FiberState* w : ms.waiters) k_.wake(*w);
  ms.waiters.clear();
}

bool RegionReplay::quiescent(const MarkState& ms) const {
  // Every tile waits here and nothing else is under way, so what follows depends only on the
  // tiles' clock offsets and on what they run next (named by the key).
  return ms.arrived == k_.topology().num_ranks() && k_.nothing_under_way();
}

SimTime RegionReplay::clock_offsets() {
  const int n = k_.topology().num_ranks();
  SimTime t0 = SimTime::max();
  for (int r = 0; r < n; ++r) t0 = std::min(t0, k_.main_fiber(r).clock);
  std::vector<std::int64_t>& offsets = offsets_;  // kept between marks: sized once
  offsets.resize(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) offsets[static_cast<size_t>(r)] = (k_.main_fiber(r).clock - t0).ns();
  // With a host model the tiles' hosts are part of the state: their offsets follow the clocks'.
  if (k_.accounting().has_host())
    for (int r = 0; r < n; ++r)
      offsets.push_back((k_.accounting().tile(r).timing.host() - t0).ns());
  return t0;
}

SimTime RegionReplay::mark_clock() const {
  SimTime first = SimTime::max();
  for (int r = 0; r < k_.topology().num_ranks(); ++r)
    first = std::min(first, k_.accounting().tile(r).region_start);
  return first;
}

const std::vector<std::int64_t>& RegionReplay::span_state(SimTime t0) {
  // Beside the clocks and hosts: what the tiles did between the mark and their arrivals, as
  // their hashes hold it (a replayed span folds its inner marks' hashes as recorded).
  span_state_ = offsets_;
  for (int r = 0; r < k_.topology().num_ranks(); ++r) {
    const TileStats& t = k_.accounting().tile(r);
    span_state_.push_back((t.region_start - t0).ns());
    span_state_.push_back(static_cast<std::int64_t>(t.inner));
  }
  return span_state_;
}

void RegionReplay::keep_recorded(SimTime t0) {
  records_.emplace(rec_.id, recorded_since(rec_.from, t0));
}

RegionReplay::RegionRecord RegionReplay::recorded_since(const Accounting::Mark& from,
                                                        SimTime t0) const {
  RegionRecord r;
  r.end_ns = offsets_;
  for (std::int64_t& e : r.end_ns) e += (t0 - from.t0).ns();
  r.quiet_ns = (k_.last_work() - from.t0).ns();
  r.effect = k_.accounting().effect_since(from);
  return r;
}

void RegionReplay::replay(const RegionRecord& r, SimTime t0) {
  // Every tile jumps to where simulating the region would have taken it.
  const int n = k_.topology().num_ranks();
  for (int rank = 0; rank < n; ++rank) {
    const auto u = static_cast<size_t>(rank);
    FiberState& f = k_.main_fiber(rank);
    f.clock = t0 + SimTime::from_ns(r.end_ns[u]);
    if (k_.accounting().has_host())
      k_.accounting().tile(rank).timing.set_host(
          t0 + SimTime::from_ns(r.end_ns[u + static_cast<size_t>(n)]));
    f.replayed = true;
  }
  k_.accounting().apply(r.effect, t0);
  k_.fabric().skip_flows(r.effect.flows);
  quiet_until_ = t0 + SimTime::from_ns(r.quiet_ns);
  k_.work_until(quiet_until_);
  ++replayed_;
}

void RegionReplay::start_recording(int mark, std::uint64_t id, SimTime t0) {
  rec_.active = true;
  rec_.mark = mark;
  rec_.id = id;
  rec_.from = k_.accounting().mark(t0);
}

std::optional<Replay::RegionMark> RegionReplay::skip_mark(FiberState& f, std::string_view key,
                                                          bool span) {
  std::size_t& next = cursor_[static_cast<size_t>(f.rank)];
  if (next == replaying_->marks.size()) {
    COCO_CHECK(span, "rank " + std::to_string(f.rank) + ": region '" + std::string(key) +
                         "' where the replayed span's recording ended at a span mark");
    f.skipping = false;
    return std::nullopt;
  }
  const SpanMark& sm = replaying_->marks[next++];
  COCO_CHECK(!span && key == sm.key, "rank " + std::to_string(f.rank) + ": " +
                                         (span ? "span" : "region") + " '" + std::string(key) +
                                         "' inside a replayed span, whose recording marked "
                                         "region '" +
                                         sm.key + "' there");
  return Replay::RegionMark{true, sm.id};
}

void RegionReplay::start_span(SpanRecording& rec, std::uint64_t id, SimTime t0,
                              const std::string& next) {
  rec.active = true;
  rec.mixed = false;
  rec.id = id;
  rec.from = k_.accounting().mark(t0);
  rec.rec = SpanRecord{};
  rec.rec.next = next;
  rec.rec.folds.resize(static_cast<size_t>(k_.topology().num_ranks()));
  rec.ends.resize(static_cast<size_t>(k_.topology().num_ranks()));
}

void RegionReplay::keep_span(SpanRecording& rec, SimTime t0) {
  rec.active = false;
  if (rec.mixed) return;
  SpanRecord& r = rec.rec;
  r.whole = recorded_since(rec.from, t0);
  // Each tile's part ends where it passed the end mark (its clock, host and counts there).
  const Accounting::Mark& from = rec.from;
  const auto n = static_cast<size_t>(k_.topology().num_ranks());
  Accounting::Effect& e = r.whole.effect;
  for (size_t u = 0; u < n; ++u) {
    const TileEnd& end = rec.ends[u];
    r.whole.end_ns[u] = (end.clock - from.t0).ns();
    if (k_.accounting().has_host()) r.whole.end_ns[u + n] = (end.host - from.t0).ns();
    e.compute[u] = end.compute - from.compute[u];
    e.exposed[u] = end.exposed - from.exposed[u];
    e.host_wait[u] = end.host_wait - from.host_wait[u];
    e.events[u] = end.events - from.events[u];
  }
  r.open = k_.accounting().open_flows(rec.from.t0);
  r.tail = r.whole.quiet_ns >
           *std::min_element(r.whole.end_ns.begin(), r.whole.end_ns.begin() + static_cast<long>(n));
  spans_.emplace(rec.id, std::move(r));
}

void RegionReplay::replay_span(const SpanRecord& r, SimTime t0) {
  // As a region: clocks, hosts, counts, trace and flows' share. The hashes follow.
  replay(r.whole, t0);
  const int n = k_.topology().num_ranks();
  Accounting& acct = k_.accounting();
  cursor_.assign(static_cast<size_t>(n), 0);
  for (int rank = 0; rank < n; ++rank) {
    const auto u = static_cast<size_t>(rank);
    k_.main_fiber(rank).skipping = true;
    // What begin folded at each inner mark, and the region open at the end mark.
    TileStats& t = acct.tile(rank);
    const std::vector<TileFold>& folds = r.folds[u];
    for (std::size_t i = 0; i + 1 < folds.size(); ++i) {
      hash_value(t.hash, (t0 + SimTime::from_ns(folds[i].start_ns)).ns());
      hash_value(t.hash, folds[i].inner);
    }
    t.region_start = t0 + SimTime::from_ns(folds.back().start_ns);
    t.inner = folds.back().inner;
  }
  acct.replay_flow_folds(r.flow_folds, r.open, t0);
  replaying_ = &r;
  replayed_ += r.marks.size();  // its inner regions; replay counted the span
}

}  // namespace cocodiff::emu::detail
