// Accounting: compute charges, flows and trace events, each folded into the timeline hash, the
// labels they are named by, and a region's effect on them taken and applied again.

#include "emulator/detail/accounting.hpp"

#include <algorithm>
#include <cmath>
#include <tuple>

#include "core/errors.hpp"
#include "core/hash.hpp"

namespace cocodiff::emu::detail {

namespace {
std::size_t u(int i) { return static_cast<std::size_t>(i); }

/// Each rank's factor on its device time: its speed among the ranks (rank_speed_factors) times
/// the device's kernel step factor. Empty when both leave every rank at 1.
std::vector<double> device_speeds(int ranks, const DeviceModel& device) {
  std::vector<double> f = rank_speed_factors(ranks, device.rank_spread());
  const double step = device.kernel_step_factor();
  if (step == 1.0) return f;
  if (f.empty()) f.assign(u(ranks), 1.0);
  for (double& x : f) x *= step;
  return f;
}

/// Trace events from `from` on, shifted by `by`, appended to `to` up to `cap` events.
void shifted(std::span<const TraceEvent> from, SimTime by, bool back, std::vector<TraceEvent>& to,
             std::size_t cap) {
  for (TraceEvent e : from) {
    if (to.size() >= cap) break;
    e.start = back ? e.start - by : e.start + by;
    e.end = back ? e.end - by : e.end + by;
    to.push_back(e);
  }
}
}  // namespace

Accounting::Accounting(const Topology& topo, const DeviceModel& device,
                       const EngineOptions& options)
    : options_(options),
      device_(device),
      ranks_(topo.num_ranks()),
      tiers_(topo.num_tiers()),
      levels_(topo.num_levels()),
      has_host_(device.has_host()),
      overlap_compute_factor_(device.overlap_compute_factor()),
      host_scale_(host_issue_scale(device.host_step_factor(), device.host_per_rank_slowdown(),
                                   device.host_sync_slowdown(), topo.ranks_per_node(),
                                   topo.num_ranks())),
      rank_speed_(device_speeds(topo.num_ranks(), device)) {
  for (int k = 0; k < kNumOpKinds; ++k)
    kind_weight_[u(k)] = device.overlap_kind_weight(static_cast<OpKind>(k));
  overlap_groups_ = device.overlap_groups();
  if (!overlap_groups_.empty()) {
    for (const int g : overlap_groups_)
      slot_compute_.push_back(device.overlap_compute_factor_for(g));
    slot_compute_.push_back(overlap_compute_factor_);
  }
  // rank_group_[k * ranks + r]: the index of rank r's group at level k (r over the level's
  // stride), so tier() compares table entries instead of dividing once per level per flow.
  rank_group_.resize(u(levels_) * u(ranks_));
  int stride = 1;
  for (int k = 0; k < levels_; ++k) {
    for (int r = 0; r < ranks_; ++r) rank_group_[u(k) * u(ranks_) + u(r)] = r / stride;
    stride *= topo.level(k).size;
  }
}

void Accounting::start() {
  tiles_.assign(u(ranks_), TileStats{});
  tile_trace_cap_ = options_.trace_limit / 2 / u(ranks_);
  bytes_by_tier_.assign(u(tiers_), 0);
}

int Accounting::tier(int a, int b) const {
  const size_t p = u(ranks_);
  for (int k = levels_ - 1; k >= 0; --k) {
    const int* g = rank_group_.data() + static_cast<size_t>(k) * p;
    if (g[a] != g[b]) return k;
  }
  return -1;
}

std::uint32_t Accounting::intern(std::string_view label) {
  std::lock_guard<std::mutex> lk(label_mutex_);
  auto it = label_ids_.find(std::string(label));
  if (it != label_ids_.end()) return it->second;
  auto id = static_cast<std::uint32_t>(labels_.size());
  labels_.emplace_back(label);
  label_ids_.emplace(std::string(label), id);
  return id;
}

std::string_view Accounting::keep_label(std::string_view label) {
  std::lock_guard<std::mutex> lk(label_mutex_);
  return *kept_labels_.emplace(label).first;
}

void Accounting::tile_event(int rank, TraceEvent::Kind kind, SimTime start, SimTime end,
                            std::string_view label) {
  TileStats& t = tiles_[static_cast<size_t>(rank)];
  hash_value(t.inner, kind);
  hash_value(t.inner, (start - t.region_start).ns());
  hash_value(t.inner, (end - t.region_start).ns());
  hash_bytes(t.inner, label);
  ++t.events;
  if (options_.trace && t.trace.size() < tile_trace_cap_) {
    TraceEvent e;
    e.kind = kind;
    e.rank = rank;
    e.start = start;
    e.end = end;
    e.label = intern(label);
    t.trace.push_back(e);
  }
}

SimTime Accounting::charge(int rank, SimTime start, SimTime dt, std::string_view label, OpKind kind,
                           KernelClass kernel) {
  // Overlapped compute runs slower: the factor is decided by the tile's own program order
  // (collectives started and not yet waited for), so the timeline stays deterministic.
  TileStats& t = tiles_[static_cast<size_t>(rank)];
  // This rank's device is faster or slower than the mean, and kernels slower inside a step.
  if (!rank_speed_.empty())
    dt = SimTime::from_ns(
        std::llround(static_cast<double>(dt.ns()) * rank_speed_[static_cast<size_t>(rank)]));
  TileClock& c = t.timing;
  if (has_host_) {
    // The host issues ops in program order; the device runs one once it is issued and the
    // compute stream is free.
    SimTime issue = device_.host_issue(label, kernel);
    if (host_scale_ != 1.0)
      issue = SimTime::from_ns(std::llround(static_cast<double>(issue.ns()) * host_scale_));
    start = c.issue(start, issue);
  }
  if (c.overlapping()) {
    double factor = overlap_compute_factor_;
    if (const std::vector<int>& open = c.open_by_slot(); !open.empty()) {
      factor = 1.0;  // the largest factor of the groups open
      for (size_t s = 0; s < open.size(); ++s)
        if (open[s] > 0) factor = std::max(factor, slot_compute_[s]);
    }
    const double w = kind_weight_[static_cast<size_t>(kind)];
    if (w != 1.0) factor = 1.0 + w * (factor - 1.0);
    if (factor != 1.0) dt = SimTime::from_ns(std::llround(static_cast<double>(dt.ns()) * factor));
  }
  c.add_compute(dt);
  const SimTime end = start + dt;
  tile_event(rank, TraceEvent::Kind::kCompute, start, end, label);
  return end;
}

int Accounting::overlap_slot(int ranks) const {
  if (overlap_groups_.empty()) return -1;
  const auto it = std::find(overlap_groups_.begin(), overlap_groups_.end(), ranks);
  return static_cast<int>(it - overlap_groups_.begin());
}

SimTime Accounting::issue_collective(int rank, SimTime clock) {
  if (!has_host_) return clock;
  // Measured with every rank issuing: not scaled.
  return tiles_[u(rank)].timing.issue(clock, device_.collective_issue());
}

void Accounting::block_host(int rank, SimTime clock) {
  if (has_host_) tiles_[u(rank)].timing.block_host(clock);
}

void Accounting::fold_flow_hash(SimTime next_base) {
  hash_value(flow_hash_, flow_base_.ns());
  hash_value(flow_hash_, flow_inner_);
  flow_inner_ = kHashBasis;
  flow_base_ = next_base;
}

void Accounting::replay_flow_folds(std::span<const OpenFlows> folded, const OpenFlows& open,
                                   SimTime t0) {
  for (const OpenFlows& f : folded) {
    hash_value(flow_hash_, (t0 + SimTime::from_ns(f.base_ns)).ns());
    hash_value(flow_hash_, f.inner);
  }
  flow_base_ = t0 + SimTime::from_ns(open.base_ns);
  flow_inner_ = open.inner;
}

void Accounting::flow(SimTime start, SimTime end, int src, int dst, std::int64_t bytes,
                      std::span<const std::uint32_t> labels, bool exclusive) {
  const int copies = static_cast<int>(labels.size());
  if (exclusive) flows_exclusive_ += static_cast<std::uint64_t>(copies);
  const int tier = this->tier(src, dst);
  bytes_by_tier_[static_cast<size_t>(tier)] += bytes * copies;
  if (options_.trace) {
    for (const std::uint32_t label : labels) {
      if (flow_trace_.size() >= options_.trace_limit / 2) break;
      TraceEvent e;
      e.kind = TraceEvent::Kind::kFlow;
      e.rank = src;
      e.peer = dst;
      e.tier = tier;
      e.label = label;
      e.start = start;
      e.end = end;
      e.bytes = bytes;
      flow_trace_.push_back(e);
    }
  }
  flows_ += static_cast<std::uint64_t>(copies);
  std::uint64_t h = kHashBasis;
  hash_value(h, (start - flow_base_).ns());
  hash_value(h, (end - flow_base_).ns());
  hash_value(h, src);
  hash_value(h, dst);
  hash_value(h, bytes);
  // A full avalanche (splitmix64's finaliser) before the sum: no bit of a flow cancels another.
  h ^= h >> 33;
  h *= 0xFF51AFD7ED558CCDull;
  h ^= h >> 33;
  h *= 0xC4CEB9FE1A85EC53ull;
  h ^= h >> 33;
  flow_inner_ += h * static_cast<std::uint64_t>(copies);  // the sum of `copies` equal digests
}

void Accounting::finish(RunResult& res) {
  fold_flow_hash(SimTime{});
  Sha256 digest;
  for (TileStats& t : tiles_) {
    hash_value(t.hash, t.region_start.ns());
    hash_value(t.hash, t.inner);
    res.rank_end.push_back(t.end);
    res.rank_compute.push_back(t.timing.compute());
    res.rank_exposed.push_back(t.timing.exposed());
    res.rank_host_wait.push_back(t.timing.host_wait());
    res.makespan = std::max(res.makespan, t.end);
    res.events += t.events;
    digest.update(std::as_bytes(std::span<const std::uint64_t>(&t.hash, 1)));
    const std::int64_t end_ns = t.end.ns();
    digest.update(std::as_bytes(std::span<const std::int64_t>(&end_ns, 1)));
    if (t.trace.size() >= tile_trace_cap_ && t.events > t.trace.size()) res.trace_truncated = true;
    res.trace.insert(res.trace.end(), t.trace.begin(), t.trace.end());
  }
  digest.update(std::as_bytes(std::span<const std::uint64_t>(&flow_hash_, 1)));
  res.timeline_sha256 = digest.hex();
  res.events += flows_;
  res.flows = flows_;
  res.flows_exclusive = flows_exclusive_;
  if (options_.trace && flow_trace_.size() >= options_.trace_limit / 2) res.trace_truncated = true;
  // Flows in the order they start: the same list whether a flow was timed by the network model
  // or in closed form.
  std::stable_sort(
      flow_trace_.begin(), flow_trace_.end(), [](const TraceEvent& a, const TraceEvent& b) {
        return std::tie(a.start, a.rank, a.peer, a.end) < std::tie(b.start, b.rank, b.peer, b.end);
      });
  res.trace.insert(res.trace.end(), flow_trace_.begin(), flow_trace_.end());
  res.bytes_by_tier = bytes_by_tier_;
  res.labels = labels_;
}

bool Accounting::trace_closed() const {
  if (!options_.trace) return true;
  if (flow_trace_.size() < options_.trace_limit / 2) return false;
  return std::all_of(tiles_.begin(), tiles_.end(),
                     [this](const TileStats& t) { return t.trace.size() >= tile_trace_cap_; });
}

Accounting::Mark Accounting::mark(SimTime t0) const {
  Mark m;
  m.t0 = t0;
  for (const TileStats& t : tiles_) {
    m.compute.push_back(t.timing.compute());
    m.exposed.push_back(t.timing.exposed());
    m.host_wait.push_back(t.timing.host_wait());
    m.events.push_back(t.events);
    m.trace_size.push_back(t.trace.size());
  }
  m.flows = flows_;
  m.bytes_by_tier = bytes_by_tier_;
  m.flow_trace_size = flow_trace_.size();
  return m;
}

Accounting::Effect Accounting::effect_since(const Mark& m) const {
  Effect e;
  // Kept for every simulated region (most never recur): sized exactly, no trace when off.
  const auto un = u(ranks_);
  e.compute.reserve(un);
  e.exposed.reserve(un);
  e.host_wait.reserve(un);
  e.events.reserve(un);
  e.inner.reserve(un);
  if (options_.trace) e.tile_trace.resize(un);
  for (size_t r = 0; r < un; ++r) {
    const TileStats& t = tiles_[r];
    e.compute.push_back(t.timing.compute() - m.compute[r]);
    e.exposed.push_back(t.timing.exposed() - m.exposed[r]);
    e.host_wait.push_back(t.timing.host_wait() - m.host_wait[r]);
    e.events.push_back(t.events - m.events[r]);
    e.inner.push_back(t.last_inner);
    if (options_.trace)
      shifted(std::span(t.trace).subspan(m.trace_size[r]), m.t0, true, e.tile_trace[r], SIZE_MAX);
  }
  e.flow_inner = flow_inner_;
  e.flows = flows_ - m.flows;
  e.bytes_by_tier = bytes_by_tier_;
  for (size_t k = 0; k < e.bytes_by_tier.size(); ++k) e.bytes_by_tier[k] -= m.bytes_by_tier[k];
  shifted(std::span(flow_trace_).subspan(m.flow_trace_size), m.t0, true, e.flow_trace, SIZE_MAX);
  return e;
}

void Accounting::apply(const Effect& e, SimTime t0) {
  for (size_t r = 0; r < u(ranks_); ++r) {
    TileStats& t = tiles_[r];
    t.timing.add_totals(e.compute[r], e.exposed[r], e.host_wait[r]);
    t.events += e.events[r];
    t.inner = e.inner[r];
    if (options_.trace) shifted(e.tile_trace[r], t0, false, t.trace, tile_trace_cap_);
  }
  flow_inner_ = e.flow_inner;
  flows_ += e.flows;
  for (size_t k = 0; k < bytes_by_tier_.size(); ++k) bytes_by_tier_[k] += e.bytes_by_tier[k];
  if (options_.trace) shifted(e.flow_trace, t0, false, flow_trace_, options_.trace_limit / 2);
}

}  // namespace cocodiff::emu::detail
