// RegionReplay: exact replay of a region of the run that starts from a state already simulated
// (Replay::begin_region).

#include "emulator/detail/region_replay.hpp"

#include <algorithm>
#include <cstdint>
#include <span>
#include <string>

#include "core/errors.hpp"

namespace cocodiff::emu::detail {

Replay::RegionMark RegionReplay::begin(FiberState& f, std::string_view key, bool may_skip,
                                       bool span) {
  if (k_.aborting()) throw Cancelled{};
  COCO_CHECK(f.is_main, "region marks are made by tile fibers");
  TileStats& t = k_.accounting().tile(f.rank);
  if (f.skipping)
    if (const std::optional<Replay::RegionMark> inner = skip_mark(f, key, span)) {
      ++t.marks;
      return *inner;
    }
  // While a span records, every mark a tile passes is inside it (its end included).
  if (span_rec_.active)
    span_rec_.rec.folds[static_cast<size_t>(f.rank)].push_back(
        {(t.region_start - span_rec_.from.t0).ns(), t.inner});
  hash_value(t.hash, t.region_start.ns());
  hash_value(t.hash, t.inner);
  t.last_inner = t.inner;
  t.inner = kHashBasis;
  t.region_start = f.clock;
  const int m = t.marks++;
  const int n = k_.topology().num_ranks();
  std::unique_lock<NullLock> lk(k_.state_lock());
  MarkState& ms = marks_[m];
  if (ms.arrived == 0) {
    ms.key = key;
    ms.span = span;
    ms.waiters.swap(spare_waiters_);  // every tile waits here: the last mark's storage fits
  } else if (ms.key != key) {
    ms.replayable = false;
    span_rec_.mixed = true;  // harmless when none records
  }
  COCO_CHECK(ms.span == span, "rank " + std::to_string(f.rank) + " marks a " +
                                  (span ? "span" : "region") + " where rank 0's mark " +
                                  std::to_string(m) + " is a " + (span ? "region" : "span"));
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
  if (!quiescent(ms)) {
    ms.broken = true;
    rec_.active = false;
    if (span_rec_.active) {
      if (ms.span) {
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
  // The region that ends here was recorded from the previous mark: keep its effect.
  if (rec_.active && rec_.mark + 1 == mark) keep_recorded(t0);
  rec_.active = false;
  if (span_rec_.active && ms.span)
    keep_span(t0);
  else if (span_rec_.active)
    span_rec_.rec.flow_folds.push_back(k_.accounting().open_flows(span_rec_.from.t0));
  k_.accounting().fold_flow_hash(t0);
  std::uint64_t id = 0;
  const bool replayable = ms.replayable && k_.options().replay;
  if (ms.span) {
    // While the trace takes events, a span's record would copy the trace of its every region:
    // its regions replay on their own instead.
    if (replayable && k_.accounting().trace_closed()) {
      id = id_of(span_ids_, ms.key);
      const auto rec = spans_.find(id);
      if (rec != spans_.end())
        replay_span(rec->second, t0);
      else
        start_span(id, t0);
    }
  } else if (replayable) {
    id = id_of(region_ids_, ms.key);
    const auto rec = records_.find(id);
    if (rec != records_.end())
      replay(rec->second, t0);
    else
      start_recording(mark, id, t0);  // simulated once more, recording what it does
  }
  if (span_rec_.active && !ms.span) span_rec_.rec.marks.push_back({ms.key, id});
  for (FiberState* w : ms.waiters) w->region_id = id;
  release(ms);
}

std::uint64_t RegionReplay::id_of(
    std::map<std::pair<std::string, std::vector<std::int64_t>>, std::uint64_t>& ids,
    const std::string& key) {
  const auto [it, added] = ids.try_emplace({key, offsets_}, next_id_);
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

void RegionReplay::keep_recorded(SimTime t0) {
  records_.emplace(rec_.id, recorded_since(rec_.from, t0));
}

RegionReplay::RegionRecord RegionReplay::recorded_since(const Accounting::Mark& from,
                                                        SimTime t0) const {
  RegionRecord r;
  r.end_ns = offsets_;
  for (std::int64_t& e : r.end_ns) e += (t0 - from.t0).ns();
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

void RegionReplay::start_span(std::uint64_t id, SimTime t0) {
  span_rec_.active = true;
  span_rec_.mixed = false;
  span_rec_.id = id;
  span_rec_.from = k_.accounting().mark(t0);
  span_rec_.rec = SpanRecord{};
  span_rec_.rec.folds.resize(static_cast<size_t>(k_.topology().num_ranks()));
}

void RegionReplay::keep_span(SimTime t0) {
  span_rec_.active = false;
  if (span_rec_.mixed) return;
  SpanRecord& r = span_rec_.rec;
  r.whole = recorded_since(span_rec_.from, t0);
  r.open = k_.accounting().open_flows(span_rec_.from.t0);
  spans_.emplace(span_rec_.id, std::move(r));
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
