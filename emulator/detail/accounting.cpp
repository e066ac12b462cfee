// Accounting: compute charges, flows and trace events, each folded into the timeline hash, and
// the labels they are named by.

#include "emulator/detail/kernel.hpp"

#include <algorithm>
#include <cmath>

#include "core/errors.hpp"
#include "core/hash.hpp"

namespace cocodiff::emu::detail {

int Kernel::tier(int a, int b) const {
  const size_t p = static_cast<size_t>(topo_.num_ranks());
  for (int k = topo_.num_levels() - 1; k >= 0; --k) {
    const int* g = rank_group_.data() + static_cast<size_t>(k) * p;
    if (g[a] != g[b]) return k;
  }
  return -1;
}

std::uint32_t Kernel::intern(std::string_view label) {
  std::lock_guard<std::mutex> lk(label_mutex_);
  auto it = label_ids_.find(std::string(label));
  if (it != label_ids_.end()) return it->second;
  auto id = static_cast<std::uint32_t>(labels_.size());
  labels_.emplace_back(label);
  label_ids_.emplace(std::string(label), id);
  return id;
}

std::string_view Kernel::keep_label(std::string_view label) {
  std::lock_guard<std::mutex> lk(label_mutex_);
  return *kept_labels_.emplace(label).first;
}

void Kernel::record_tile_event(int rank, TraceEvent::Kind kind, SimTime start, SimTime end,
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

void Kernel::compute(FiberState& f, const OpCost& cost) {
  charge_compute(f, device_.time(cost), cost.label.empty() ? op_kind_name(cost.kind) : cost.label);
}

void Kernel::charge_compute(FiberState& f, SimTime dt, std::string_view label) {
  if (aborting_) throw Cancelled{};
  f.clock = charge(f.rank, f.clock, dt, label);
}

SimTime Kernel::charge(int rank, SimTime start, SimTime dt, std::string_view label) {
  // Overlapped compute runs slower: the factor is decided by the tile's own program order
  // (collectives started and not yet waited for), so the timeline stays deterministic.
  const double slowdown = device_.overlap_compute_factor();
  TileStats& t = tiles_[static_cast<size_t>(rank)];
  if (!rank_speed_.empty())  // this rank's device is faster or slower than the mean
    dt = SimTime::from_ns(
        std::llround(static_cast<double>(dt.ns()) * rank_speed_[static_cast<size_t>(rank)]));
  if (device_.has_host()) {
    // The host issues ops in program order; the device runs one once it is issued and the
    // compute stream is free.
    t.host += host_cost(device_.host_issue(label));
    start = std::max(start, t.host);
  }
  if (t.open_collectives > 0) {
    if (slowdown != 1.0)
      dt = SimTime::from_ns(std::llround(static_cast<double>(dt.ns()) * slowdown));
    t.overlapped_compute += dt;
  }
  const SimTime end = start + dt;
  t.compute += dt;
  record_tile_event(rank, TraceEvent::Kind::kCompute, start, end, label);
  return end;
}

void Kernel::issue_call(FiberState& f) {
  if (!f.is_main || !device_.has_host()) return;
  TileStats& t = tiles_[static_cast<size_t>(f.rank)];
  t.host += device_.collective_issue();  // measured with every rank issuing: not scaled
  f.clock = std::max(f.clock, t.host);
}

void Kernel::fold_flow_hash(SimTime next_base) {
  hash_value(flow_hash_, flow_base_.ns());
  hash_value(flow_hash_, flow_inner_);
  flow_inner_ = kHashBasis;
  flow_base_ = next_base;
}

void Kernel::account_flow(SimTime start, SimTime end, int src, int dst, std::int64_t bytes,
                          std::span<const std::uint32_t> labels) {
  const int copies = static_cast<int>(labels.size());
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

void Kernel::finish_timeline(RunResult& res) {
  fold_flow_hash(SimTime{});
  Sha256 digest;
  for (TileStats& t : tiles_) {
    hash_value(t.hash, t.region_start.ns());
    hash_value(t.hash, t.inner);
    res.rank_end.push_back(t.end);
    res.rank_compute.push_back(t.compute);
    res.rank_exposed.push_back(t.exposed);
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
}

}  // namespace cocodiff::emu::detail
