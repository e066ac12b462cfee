// RegionReplay: exact replay of a region of the run that starts from a state already simulated
// (Replay::begin_region).

#include "emulator/detail/region_replay.hpp"

#include <algorithm>
#include <cstdint>
#include <span>

#include "core/errors.hpp"

namespace cocodiff::emu::detail {

Replay::RegionMark RegionReplay::begin(FiberState& f, std::string_view key, bool may_skip) {
  if (k_.aborting()) throw Cancelled{};
  COCO_CHECK(f.is_main, "region marks are made by tile fibers");
  TileStats& t = k_.accounting().tile(f.rank);
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
    ms.waiters.swap(spare_waiters_);  // every tile waits here: the last mark's storage fits
  } else if (ms.key != key) {
    ms.replayable = false;
  }
  ms.replayable = ms.replayable && may_skip;
  ++ms.arrived;
  f.replayed = false;
  f.region_id = 0;
  if (!ms.broken) {
    ms.waiters.push_back(&f);
    ms.min_clock = std::min(ms.min_clock, f.clock);
    k_.block(f, lk, nullptr, false);
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
    release(ms);
    return;
  }
  const SimTime t0 = clock_offsets();
  // The region that ends here was recorded from the previous mark: keep its effect.
  if (rec_.active && rec_.mark + 1 == mark) keep_recorded(t0);
  rec_.active = false;
  k_.accounting().fold_flow_hash(t0);
  std::uint64_t id = 0;
  if (ms.replayable && k_.options().replay) {
    id = region_ids_.try_emplace({ms.key, offsets_}, region_ids_.size() + 1).first->second;
    const auto rec = records_.find(id);
    if (rec != records_.end())
      replay(rec->second, t0);
    else
      start_recording(mark, id, t0);  // simulated once more, recording what it does
  }
  for (FiberState* w : ms.waiters) w->region_id = id;
  release(ms);
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
  RegionRecord r;
  r.end_ns = offsets_;
  for (std::int64_t& e : r.end_ns) e += (t0 - rec_.from.t0).ns();
  r.effect = k_.accounting().effect_since(rec_.from);
  records_.emplace(rec_.id, std::move(r));
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

}  // namespace cocodiff::emu::detail
