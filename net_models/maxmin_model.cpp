#include "net_models/maxmin_model.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <sstream>

#include "core/errors.hpp"

namespace cocodiff {

namespace {

constexpr std::int64_t kNever = std::numeric_limits<std::int64_t>::max();

/// Whole nanoseconds to move `bytes` at `rate`, rounded up like SimTime::from_seconds (so a
/// lone flow costs exactly what the alpha-beta closed form says), never negative.
std::int64_t transfer_ns(double bytes, double rate_bytes_per_s) {
  if (!(bytes > 0)) return 0;
  constexpr std::int64_t kFar = kNever / 2;  // far future, still safe to add to
  if (!(rate_bytes_per_s > 0)) return kFar;
  const double ns = std::ceil(bytes / rate_bytes_per_s * 1e9 - 1e-6);
  if (ns >= static_cast<double>(kFar)) {
    std::ostringstream os;
    os << "virtual time overflow: a transfer of " << bytes << " bytes at " << rate_bytes_per_s
       << " bytes/s (its share of the slowest link on the route, set by the cluster's "
          "bandwidth_gbytes_per_s keys) ends beyond the representable horizon of 2^62 ns";
    throw TimeOverflowError(os.str());
  }
  return std::max<std::int64_t>(0, static_cast<std::int64_t>(ns));
}

}  // namespace

MaxMinModel::MaxMinModel(std::shared_ptr<const ClusterGraph> graph)
    : routes_(std::move(graph)),
      links_(static_cast<size_t>(routes_.graph().num_links())),
      limited_(static_cast<size_t>(routes_.graph().num_links())) {
  for (int l = 0; l < routes_.graph().num_links(); ++l) {
    links_[static_cast<size_t>(l)].bandwidth_bytes_per_s =
        routes_.graph().link(l).bandwidth_bytes_per_s;
    limited_[static_cast<size_t>(l)] = routes_.graph().link(l).limited() ? 1 : 0;
  }
}

std::unique_ptr<NetworkModel> MaxMinModel::clone_empty() const {
  return std::make_unique<MaxMinModel>(routes_.graph_ptr());
}

void MaxMinModel::add_flow(std::uint64_t id, int src, int dst, std::int64_t bytes, SimTime start) {
  COCO_CHECK(start >= now_, "flow starts in the past");
  COCO_CHECK(src != dst, "flow to self");
  COCO_CHECK(bytes >= 0, "negative flow size");
  if (last_added_ >= 0) {
    // Same ends, so the same route and latency: the same start is the same join.
    Flow& prev = flows_[static_cast<size_t>(last_added_)];
    if (prev.live && !prev.active && prev.src == src && prev.dst == dst && prev.bytes == bytes &&
        prev.start_ns == start.ns()) {
      prev.twins.push_back(id);
      ++prev.weight;
      ++live_;
      return;
    }
  }
  RouteSummary route;
  const std::span<const int> links = routes_.route(src, dst, route);
  const std::int64_t join = (start + route.latency).ns();
  int slot;
  if (free_slots_.empty()) {
    slot = static_cast<int>(flows_.size());
    flows_.emplace_back();
  } else {
    slot = free_slots_.back();
    free_slots_.pop_back();
  }
  Flow& f = flows_[static_cast<size_t>(slot)];
  f.id = id;
  f.twins.clear();
  f.weight = 1;
  f.src = src;
  f.dst = dst;
  f.bytes = bytes;
  f.start_ns = start.ns();
  f.join_ns = join;
  f.remaining_bytes = static_cast<double>(bytes);
  f.rate_bytes_per_s = 0;
  f.live = true;
  f.active = false;
  f.links.clear();
  for (int l : links)
    if (limited_[static_cast<size_t>(l)] != 0) f.links.push_back(l);
  ++live_;
  last_added_ = slot;
  push_pending({join, id, slot}, route.latency.ns());
}

void MaxMinModel::push_pending(const Pending& e, std::int64_t latency_ns) {
  // Flows of one route latency mostly join in the order they are added (their starts rarely
  // go back in time): such a flow goes to the back of its latency's queue, which stays sorted
  // on (join, id); the others go to the heap. The next to join is the least of the queues'
  // fronts and the heap's top, so flows join in the order one heap would give.
  auto lane = std::find_if(lanes_.begin(), lanes_.end(),
                           [&](const Lane& l) { return l.latency_ns == latency_ns; });
  if (lane == lanes_.end() && lanes_.size() < kMaxLanes) {
    lanes_.push_back({latency_ns, boost::circular_buffer<Pending>(64)});
    lane = lanes_.end() - 1;
  }
  if (lane != lanes_.end()) {
    boost::circular_buffer<Pending>& q = lane->queue;
    if (q.empty() || e > q.back()) {
      if (q.full()) q.set_capacity(2 * q.capacity());
      q.push_back(e);
      return;
    }
  }
  pending_.push_back(e);
  std::push_heap(pending_.begin(), pending_.end(), std::greater<>());
}

const MaxMinModel::Pending* MaxMinModel::next_pending() const {
  const Pending* best = pending_.empty() ? nullptr : &pending_.front();
  for (const Lane& l : lanes_)
    if (!l.queue.empty() && (best == nullptr || *best > l.queue.front())) best = &l.queue.front();
  return best;
}

void MaxMinModel::pop_pending(const Pending* p) {
  if (!pending_.empty() && p == &pending_.front()) {
    std::pop_heap(pending_.begin(), pending_.end(), std::greater<>());
    pending_.pop_back();
    return;
  }
  for (Lane& l : lanes_)
    if (!l.queue.empty() && p == &l.queue.front()) {
      l.queue.pop_front();
      return;
    }
  COCO_CHECK(false, "pop of a flow that is not next to join");
}

SimTime MaxMinModel::next_event_time() const {
  std::int64_t t = kNever;
  if (const Pending* p = next_pending()) t = p->join_ns;
  if (!finish_.empty()) t = std::min(t, finish_.front().ns);  // the top is never stale
  return SimTime::from_ns(t);
}

bool MaxMinModel::stale(const Finish& e) const {
  const Flow& f = flows_[static_cast<size_t>(e.slot)];
  return !f.live || f.id != e.id || f.version != e.version;
}

void MaxMinModel::prune_finish_heap() {
  // Every re-solve pushes fresh entries; rebuild when stale ones dominate, so the heap stays
  // proportional to the live flows.
  if (finish_.size() > 4 * live_ + 1024) {
    std::erase_if(finish_, [this](const Finish& e) { return stale(e); });
    std::make_heap(finish_.begin(), finish_.end(), std::greater<>());
  }
  while (!finish_.empty() && stale(finish_.front())) {
    std::pop_heap(finish_.begin(), finish_.end(), std::greater<>());
    finish_.pop_back();
  }
}

void MaxMinModel::activate(int slot, std::vector<std::uint64_t>& completed) {
  Flow& f = flows_[static_cast<size_t>(slot)];
  if (!(f.remaining_bytes > 0) || f.links.empty()) {
    finish(slot, completed);  // nothing to share: done once the latency is paid
    return;
  }
  f.active = true;
  f.updated_ns = now_.ns();
  f.pos.resize(f.links.size());
  bool alone = true;
  for (size_t h = 0; h < f.links.size(); ++h) {
    LinkState& l = links_[static_cast<size_t>(f.links[h])];
    f.pos[h] = static_cast<std::uint32_t>(l.flows.size());
    alone = alone && l.flows.empty();
    l.flows.emplace_back(slot, static_cast<int>(h));
    l.weight += f.weight;
  }
  // A flow that finds its links empty is a component of its own unless a flow activated later
  // at this instant joins one of them, which seeds that link: solve() then finds it in the
  // joiner's component and skips it here.
  if (alone) {
    lone_.push_back(slot);
    return;
  }
  seeds_.insert(seeds_.end(), f.links.begin(), f.links.end());
}

void MaxMinModel::finish(int slot, std::vector<std::uint64_t>& completed) {
  Flow& f = flows_[static_cast<size_t>(slot)];
  if (f.active) {
    for (size_t h = 0; h < f.links.size(); ++h) {
      LinkState& l = links_[static_cast<size_t>(f.links[h])];
      const std::uint32_t i = f.pos[h];
      const std::pair<int, int> moved = l.flows.back();
      l.flows[i] = moved;
      flows_[static_cast<size_t>(moved.first)].pos[static_cast<size_t>(moved.second)] = i;
      l.flows.pop_back();
      l.weight -= f.weight;
      if (!l.flows.empty()) seeds_.push_back(f.links[h]);  // an emptied link has none to re-solve
    }
  }
  completed.push_back(f.id);
  completed.insert(completed.end(), f.twins.begin(), f.twins.end());
  f.live = false;
  f.active = false;
  ++f.version;
  free_slots_.push_back(slot);
  live_ -= static_cast<size_t>(f.weight);
}

void MaxMinModel::advance_to(SimTime t, std::vector<std::uint64_t>& completed) {
  COCO_CHECK(t >= now_ && t <= next_event_time(), "advance beyond the next event");
  now_ = t;
  const size_t first = completed.size();
  while (true) {
    while (!finish_.empty() && finish_.front().ns <= t.ns()) {
      const Finish e = finish_.front();
      std::pop_heap(finish_.begin(), finish_.end(), std::greater<>());
      finish_.pop_back();
      if (!stale(e)) finish(e.slot, completed);
    }
    while (true) {
      const Pending* p = next_pending();
      if (p == nullptr || p->join_ns > t.ns()) break;
      const int slot = p->slot;
      pop_pending(p);
      activate(slot, completed);
    }
    if (seeds_.empty() && lone_.empty()) break;
    solve(t.ns());
    prune_finish_heap();
    // A re-solved flow whose remainder rounds to zero finishes now: loop, never later.
  }
  prune_finish_heap();
  std::sort(completed.begin() + static_cast<std::ptrdiff_t>(first), completed.end());
}

void MaxMinModel::solve(std::int64_t t) {
  // Max-min allocations of disjoint components are independent, so each connected component
  // of the changed links (flows that share a link with a changed flow, transitively) is solved
  // on its own: a ring's hundreds of simultaneous one-entry components each take the lone-entry
  // path, and progressive filling's heap holds one component's links, not every changed link.
  ++epoch_;
  for (size_t i = 0; i < seeds_.size(); ++i) {
    const int seed = seeds_[i];
    if (links_[static_cast<size_t>(seed)].mark == epoch_) continue;  // in a component solved
    solve_component(seed, t);
  }
  seeds_.clear();
  for (int slot : lone_) {
    Flow& f = flows_[static_cast<size_t>(slot)];
    if (!f.live || f.mark == epoch_) continue;  // joined at this instant: solved above
    solve_lone(f, t);
  }
  lone_.clear();
}

void MaxMinModel::solve_lone(Flow& f, std::int64_t t) {
  // A lone entry gets its route's narrowest link over its weight, exactly what progressive
  // filling would give it: each share is bandwidth / weight, and rounded division by one
  // weight keeps the order of bandwidths.
  ++stats_.solves;
  const auto weight = static_cast<std::uint64_t>(f.weight);
  stats_.flows_solved += weight;
  stats_.largest_component = std::max(stats_.largest_component, weight);
  f.remaining_bytes -= f.rate_bytes_per_s * static_cast<double>(t - f.updated_ns) * 1e-9;
  f.updated_ns = t;
  double rate = std::numeric_limits<double>::infinity();
  for (int l : f.links) rate = std::min(rate, links_[static_cast<size_t>(l)].bandwidth_bytes_per_s);
  f.fixed = epoch_;
  f.rate_bytes_per_s = std::max(rate, 0.0) / f.weight;
  ++f.version;
  f.finish_ns = t + transfer_ns(f.remaining_bytes, f.rate_bytes_per_s);
  finish_.push_back({f.finish_ns, f.id, static_cast<int>(&f - flows_.data()), f.version});
  std::push_heap(finish_.begin(), finish_.end(), std::greater<>());
}

void MaxMinModel::solve_component(int seed, std::int64_t t) {
  // 1. The connected component of the seed link.
  std::uint64_t comp_weight = 0;  // flows in the component, twins counted
  comp_links_.clear();
  comp_flows_.clear();
  stack_.clear();
  links_[static_cast<size_t>(seed)].mark = epoch_;
  comp_links_.push_back(seed);
  stack_.push_back(seed);
  while (!stack_.empty()) {
    const int l = stack_.back();
    stack_.pop_back();
    for (const auto& [slot, hop] : links_[static_cast<size_t>(l)].flows) {
      Flow& f = flows_[static_cast<size_t>(slot)];
      if (f.mark == epoch_) continue;
      f.mark = epoch_;
      comp_flows_.push_back(slot);
      comp_weight += static_cast<std::uint64_t>(f.weight);
      for (int m : f.links) {
        LinkState& s = links_[static_cast<size_t>(m)];
        if (s.mark == epoch_) continue;
        s.mark = epoch_;
        comp_links_.push_back(m);
        stack_.push_back(m);
      }
    }
  }
  if (comp_flows_.empty()) return;  // the seed link's last flow ended
  if (comp_flows_.size() == 1) {    // the usual component: 1-2 flows on average
    solve_lone(flows_[static_cast<size_t>(comp_flows_[0])], t);
    return;
  }
  ++stats_.solves;
  stats_.flows_solved += comp_weight;
  stats_.largest_component = std::max(stats_.largest_component, comp_weight);
  // 2. Bring every flow's remainder up to t at its old rate.
  for (int slot : comp_flows_) {
    Flow& f = flows_[static_cast<size_t>(slot)];
    f.remaining_bytes -= f.rate_bytes_per_s * static_cast<double>(t - f.updated_ns) * 1e-9;
    f.updated_ns = t;
  }

  // 3. Progressive filling: the link with the smallest fair share saturates first; its flows
  //    get that share and leave the other links' budgets. Every flow fixed in one step gets
  //    the same share and a link's budget drops by share x (flows fixed on it), so the result
  //    does not depend on the order of any list: only on the set of flows and their routes.
  shares_.clear();
  for (int l : comp_links_) {
    LinkState& s = links_[static_cast<size_t>(l)];
    s.cap_left = s.bandwidth_bytes_per_s;
    s.unfixed = s.weight;
    s.newly_fixed = 0;
    if (s.unfixed > 0) shares_.push_back({s.cap_left / s.unfixed, l});
  }
  std::make_heap(shares_.begin(), shares_.end(), std::greater<>());
  while (!shares_.empty()) {
    const Share top = shares_.front();
    std::pop_heap(shares_.begin(), shares_.end(), std::greater<>());
    shares_.pop_back();
    LinkState& s = links_[static_cast<size_t>(top.link)];
    if (s.unfixed == 0 || std::max(s.cap_left, 0.0) / s.unfixed != top.bytes_per_s) continue;
    const double share = top.bytes_per_s;
    touched_.clear();
    for (const auto& [slot, hop] : s.flows) {
      Flow& f = flows_[static_cast<size_t>(slot)];
      if (f.fixed == epoch_) continue;
      f.fixed = epoch_;
      f.rate_bytes_per_s = share;
      for (int m : f.links) {
        LinkState& o = links_[static_cast<size_t>(m)];
        if (o.newly_fixed == 0) touched_.push_back(m);
        o.newly_fixed += f.weight;
        o.unfixed -= f.weight;
      }
    }
    for (int m : touched_) {
      LinkState& o = links_[static_cast<size_t>(m)];
      o.cap_left -= share * o.newly_fixed;
      o.newly_fixed = 0;
      if (o.unfixed > 0) shares_.push_back({std::max(o.cap_left, 0.0) / o.unfixed, m});
      if (o.unfixed > 0) std::push_heap(shares_.begin(), shares_.end(), std::greater<>());
    }
  }

  // 4. New completion times. A large component is cheaper to heapify at once than to push.
  const bool bulk = comp_flows_.size() > finish_.size() / 4;
  for (int slot : comp_flows_) {
    Flow& f = flows_[static_cast<size_t>(slot)];
    COCO_CHECK(f.fixed == epoch_, "progressive filling left a flow without a rate");
    ++f.version;
    f.finish_ns = t + transfer_ns(f.remaining_bytes, f.rate_bytes_per_s);
    finish_.push_back({f.finish_ns, f.id, slot, f.version});
    if (!bulk) std::push_heap(finish_.begin(), finish_.end(), std::greater<>());
  }
  if (bulk) {
    // The old entries of re-solved flows are stale now: drop them while rebuilding.
    std::erase_if(finish_, [this](const Finish& e) { return stale(e); });
    std::make_heap(finish_.begin(), finish_.end(), std::greater<>());
  }
}

void MaxMinModel::find_link_owners() {
  const ClusterGraph& g = routes_.graph();
  link_src_.assign(static_cast<size_t>(g.num_links()), kNoOwner);
  link_dst_.assign(static_cast<size_t>(g.num_links()), kNoOwner);
  const auto own = [](int& owner, int rank) {
    if (owner == kNoOwner) owner = rank;
    if (owner != rank) owner = kShared;
  };
  // Every route is a path of its source's shortest-path tree (RouteTable::route).
  for (int s = 0; s < g.num_ranks(); ++s) {
    const std::vector<int>& tree = routes_.tree(s);
    for (int d = 0; d < g.num_ranks(); ++d) {
      for (int v = g.rank_vertex(d); v != g.rank_vertex(s);) {
        const int l = tree[static_cast<size_t>(v)];
        if (l < 0) break;  // unreachable (the loader rejects such clusters)
        if (limited_[static_cast<size_t>(l)] != 0) {
          own(link_src_[static_cast<size_t>(l)], s);
          own(link_dst_[static_cast<size_t>(l)], d);
        }
        v = g.link(l).from;
      }
    }
  }
}

std::optional<SimTime> MaxMinModel::exclusive_end(int src, int dst, std::int64_t bytes, int copies,
                                                  SimTime start) {
  COCO_CHECK(src != dst && copies > 0 && bytes >= 0, "exclusive_end: bad flow");
  if (link_src_.empty()) find_link_owners();
  RouteSummary route;
  const std::span<const int> links = routes_.route(src, dst, route);
  double rate = std::numeric_limits<double>::infinity();
  bool limited = false;
  for (int l : links) {
    const auto k = static_cast<size_t>(l);
    if (limited_[k] == 0) continue;
    if (link_src_[k] != src && link_dst_[k] != dst) return std::nullopt;
    rate = std::min(rate, links_[k].bandwidth_bytes_per_s);
    limited = true;
  }
  // As add_flow, activate and solve_lone would time them (one entry of weight `copies`).
  const std::int64_t join = (start + route.latency).ns();
  if (bytes == 0 || !limited) return SimTime::from_ns(join);
  return SimTime::from_ns(join +
                          transfer_ns(static_cast<double>(bytes), std::max(rate, 0.0) / copies));
}

double MaxMinModel::rate_bytes_per_s(std::uint64_t id) const {
  for (const Flow& f : flows_)
    if (f.live && (f.id == id || std::find(f.twins.begin(), f.twins.end(), id) != f.twins.end()))
      return f.active ? f.rate_bytes_per_s : 0;
  return 0;
}

}  // namespace cocodiff
