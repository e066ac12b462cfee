#include "net_models/maxmin_model.hpp"

#include <algorithm>
#include <boost/container/small_vector.hpp>
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
  const std::uint64_t comp_weight = find_component(seed);
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
  // 3. Progressive filling.
  fill_component_rates();
  // 4. New completion times.
  push_component_finishes(t);
}

std::uint64_t MaxMinModel::find_component(int seed) {
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
  return comp_weight;
}

void MaxMinModel::fill_component_rates() {
  // The link with the smallest fair share saturates first; its flows get that share and leave
  // the other links' budgets. Every flow fixed in one step gets the same share and a link's
  // budget drops by share x (flows fixed on it), so the result does not depend on the order of
  // any list: only on the set of flows and their routes.
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
}

void MaxMinModel::push_component_finishes(std::int64_t t) {
  // A large component is cheaper to heapify at once than to push.
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

void MaxMinModel::Owners::add(int rank) {
  if (first == kShared || first == rank || second == rank) return;
  if (first == kNoOwner) {
    first = rank;
  } else if (second == kNoOwner) {
    second = rank;
  } else {
    first = second = kShared;
  }
}

void MaxMinModel::find_link_owners() {
  const ClusterGraph& g = routes_.graph();
  link_src_.assign(static_cast<size_t>(g.num_links()), Owners{});
  link_dst_.assign(static_cast<size_t>(g.num_links()), Owners{});
  // Every route is a path of its source's shortest-path tree (RouteTable::route).
  for (int s = 0; s < g.num_ranks(); ++s) {
    const std::vector<int>& tree = routes_.tree(s);
    for (int d = 0; d < g.num_ranks(); ++d) {
      for (int v = g.rank_vertex(d); v != g.rank_vertex(s);) {
        const int l = tree[static_cast<size_t>(v)];
        if (l < 0) break;  // unreachable (the loader rejects such clusters)
        if (limited_[static_cast<size_t>(l)] != 0) {
          link_src_[static_cast<size_t>(l)].add(s);
          link_dst_[static_cast<size_t>(l)].add(d);
        }
        v = g.link(l).from;
      }
    }
  }
}

const MaxMinModel::HopInfo& MaxMinModel::hop_info(int src, int dst) {
  if (link_src_.empty()) find_link_owners();
  if (hops_.empty()) hops_.resize(static_cast<size_t>(routes_.graph().num_ranks()));
  HopInfo& h = hops_[static_cast<size_t>(src)];
  if (h.dst == dst) return h;
  h = HopInfo{};
  h.dst = dst;
  h.exclusive = true;
  h.narrowest = std::numeric_limits<double>::infinity();
  bool paired = true;  // each limited link not exclusive has two sources or two destinations
  RouteSummary route;
  for (int l : routes_.route(src, dst, route)) {
    const auto k = static_cast<size_t>(l);
    if (limited_[k] == 0) continue;
    h.links.push_back(l);
    h.narrowest = std::min(h.narrowest, links_[k].bandwidth_bytes_per_s);
    if (link_src_[k].only(src) || link_dst_[k].only(dst)) continue;
    h.exclusive = false;
    if (!link_src_[k].two() && !link_dst_[k].two()) paired = false;
    if (h.key < 0) h.key = l;
  }
  if (!paired) h.key = -1;
  h.latency = route.latency;
  return h;
}

std::optional<SimTime> MaxMinModel::exclusive_end(int src, int dst, std::int64_t bytes, int copies,
                                                  SimTime start) {
  COCO_CHECK(src != dst && copies > 0 && bytes >= 0, "exclusive_end: bad flow");
  const auto n = static_cast<size_t>(routes_.graph().num_ranks());
  // As add_flow, activate and solve_lone would time them (one entry of weight `copies`).
  const auto end = [&](SimTime latency, bool empty, double narrowest) {
    const std::int64_t join = (start + latency).ns();
    if (bytes == 0 || empty) return SimTime::from_ns(join);
    return SimTime::from_ns(
        join + transfer_ns(static_cast<double>(bytes), std::max(narrowest, 0.0) / copies));
  };
  if (end_memo_.empty()) {
    end_memo_.resize(n * kEndMemo);
    end_bits_.assign(n * n / 32 + 1, 0);
  }
  EndMemo& e = end_memo_[static_cast<size_t>(src) * kEndMemo + static_cast<size_t>(dst % kEndMemo)];
  if (e.dst != dst) {
    // Two bits per route in one word (known, exclusive): one load tells a route seen before.
    const size_t pair = static_cast<size_t>(src) * n + static_cast<size_t>(dst);
    std::uint64_t& word = end_bits_[pair / 32];
    const unsigned shift = 2 * static_cast<unsigned>(pair % 32);
    if (((word >> shift) & 3u) == 1u) return std::nullopt;  // known, not exclusive
    const HopInfo& h = hop_info(src, dst);
    word |= (h.exclusive ? std::uint64_t{3} : std::uint64_t{1}) << shift;
    const EndClass c{h.exclusive, h.links.empty(), h.latency, h.narrowest};
    const auto same = [&c](const EndClass& x) {
      return x.exclusive == c.exclusive && x.empty == c.empty && x.latency == c.latency &&
             x.narrowest == c.narrowest;
    };
    auto it = std::find_if(end_classes_.begin(), end_classes_.end(), same);
    if (it == end_classes_.end()) it = end_classes_.insert(end_classes_.end(), c);
    e = {dst, static_cast<std::uint32_t>(it - end_classes_.begin())};
  }
  EndClass& m = end_classes_[e.cls];
  if (!m.exclusive) return std::nullopt;
  // The messages of one collective mostly have one size: the last transfer time is kept.
  if (bytes != m.last_bytes || copies != m.last_copies) {
    m.last_bytes = bytes;
    m.last_copies = copies;
    m.last_span = (end(m.latency, m.empty, m.narrowest) - start).ns();
  }
  return start + SimTime::from_ns(m.last_span);
}

std::optional<SimTime> MaxMinModel::empty_end(int src, int dst, SimTime start) {
  COCO_CHECK(src != dst, "empty_end: flow to self");
  const auto n = static_cast<size_t>(routes_.graph().num_ranks());
  if (latency_class_.empty()) latency_class_.assign(n * n, kNoLatency);
  std::uint8_t& c = latency_class_[static_cast<size_t>(src) * n + static_cast<size_t>(dst)];
  if (c == kNoLatency) {
    const SimTime latency = routes_.summary(src, dst).latency;
    auto it = std::find(route_latencies_.begin(), route_latencies_.end(), latency);
    if (it == route_latencies_.end()) {
      if (route_latencies_.size() == kNoLatency) return start + latency;  // not kept
      it = route_latencies_.insert(route_latencies_.end(), latency);
    }
    c = static_cast<std::uint8_t>(it - route_latencies_.begin());
  }
  // As add_flow would join it, and activate end it.
  return start + route_latencies_[c];
}

std::optional<int> MaxMinModel::pair_key(int src, int dst) {
  const HopInfo& h = hop_info(src, dst);
  if (h.key < 0) return std::nullopt;
  return h.key;
}

std::array<std::optional<SimTime>, 2> MaxMinModel::exclusive_pair_ends(const PairFlow& a,
                                                                       const PairFlow& b) {
  COCO_CHECK(a.src != a.dst && b.src != b.dst && a.copies > 0 && b.copies > 0 && a.bytes >= 0 &&
                 b.bytes >= 0,
             "exclusive_pair_ends: bad flow");
  if (a.src == b.src && a.dst == b.dst) return {};
  // Rings in step ask about the same two hops with the same sizes round after round. Only
  // differences of times enter the arithmetic below, so its ends, taken from a's join, are
  // kept for a's source (either way round) and reused while the inputs stay the same.
  const std::int64_t join_a = (a.start + hop_info(a.src, a.dst).latency).ns();
  const std::int64_t join_b = (b.start + hop_info(b.src, b.dst).latency).ns();
  if (pair_memo_.empty()) pair_memo_.resize(static_cast<size_t>(routes_.graph().num_ranks()));
  const auto same = [](const PairMemo& m, const PairFlow& x, const PairFlow& y, std::int64_t dj) {
    return m.x.src == x.src && m.x.dst == x.dst && m.x.bytes == x.bytes && m.x.copies == x.copies &&
           m.y.src == y.src && m.y.dst == y.dst && m.y.bytes == y.bytes && m.y.copies == y.copies &&
           m.dj == dj;
  };
  const auto from = [](std::int64_t base, const std::optional<std::int64_t>& off) {
    return off.has_value() ? std::optional<SimTime>(SimTime::from_ns(base + *off)) : std::nullopt;
  };
  const PairMemo& mine = pair_memo_[static_cast<size_t>(a.src)];
  if (same(mine, a, b, join_b - join_a))
    return {from(join_a, mine.off[0]), from(join_a, mine.off[1])};
  const PairMemo& theirs = pair_memo_[static_cast<size_t>(b.src)];
  if (same(theirs, b, a, join_a - join_b))
    return {from(join_b, theirs.off[1]), from(join_b, theirs.off[0])};
  const std::array<std::optional<SimTime>, 2> ends = pair_ends(a, b);
  PairMemo& m = pair_memo_[static_cast<size_t>(a.src)];
  m.x = a;
  m.y = b;
  m.dj = join_b - join_a;
  for (size_t i = 0; i < 2; ++i)
    m.off[i] =
        ends[i].has_value() ? std::optional<std::int64_t>(ends[i]->ns() - join_a) : std::nullopt;
  return ends;
}

// One entry per flow, as add_flow and activate would make it (its copies are its twins).
struct MaxMinModel::PairEntry {
  std::int64_t join = 0, finish = 0;
  double remaining = 0, rate = 0;
  double narrowest = 0;  // bandwidth of its route's narrowest limited link
  int weight = 1;
  boost::container::small_vector<int, 8> links;  // limited links of its route
  bool occupies() const { return remaining > 0 && !links.empty(); }
  // Alone on its links from `t` (solve_lone): the narrowest link over its weight.
  void fill_alone(std::int64_t t) {
    rate = std::max(narrowest, 0.0) / weight;
    finish = t + transfer_ns(remaining, rate);
  }
};

bool MaxMinModel::pair_entries(const PairFlow& a, const PairFlow& b, std::array<PairEntry, 2>& e) {
  const std::array<const PairFlow*, 2> in = {&a, &b};
  for (size_t i = 0; i < 2; ++i) {
    const HopInfo& h = hop_info(in[i]->src, in[i]->dst);  // copied: the next call may reuse it
    for (int l : h.links) {
      const auto k = static_cast<size_t>(l);
      if (!link_src_[k].within(a.src, b.src) && !link_dst_[k].within(a.dst, b.dst)) return false;
    }
    e[i].links = h.links;
    e[i].narrowest = h.narrowest;
    e[i].join = (in[i]->start + h.latency).ns();
    e[i].remaining = static_cast<double>(in[i]->bytes);
    e[i].weight = in[i]->copies;
  }
  return true;
}

void MaxMinModel::fill_pair_rates(std::array<PairEntry, 2>& e, std::int64_t t) const {
  // As solve_component does it, over the links of both routes.
  struct Budget {
    int link;
    double cap_left;
    int unfixed = 0, newly_fixed = 0;
  };
  boost::container::small_vector<Budget, 16> budget;
  for (PairEntry& x : e)
    for (int l : x.links) {
      auto it =
          std::find_if(budget.begin(), budget.end(), [l](const Budget& g) { return g.link == l; });
      if (it == budget.end())
        it = budget.insert(budget.end(), {l, links_[static_cast<size_t>(l)].bandwidth_bytes_per_s});
      it->unfixed += x.weight;
    }
  std::array<bool, 2> fixed = {false, false};
  while (true) {
    // The link with the smallest fair share (then the smallest index) saturates first.
    Budget* top = nullptr;
    double share = 0;
    for (Budget& g : budget) {
      if (g.unfixed == 0) continue;
      const double s = std::max(g.cap_left, 0.0) / g.unfixed;
      if (top == nullptr || s < share || (s == share && g.link < top->link)) {
        top = &g;
        share = s;
      }
    }
    if (top == nullptr) break;
    const int link = top->link;
    for (size_t i = 0; i < 2; ++i) {
      PairEntry& x = e[i];
      if (fixed[i] || std::find(x.links.begin(), x.links.end(), link) == x.links.end()) continue;
      fixed[i] = true;
      x.rate = share;
      for (int m : x.links)
        for (Budget& g : budget)
          if (g.link == m) {
            g.newly_fixed += x.weight;
            g.unfixed -= x.weight;
          }
    }
    for (Budget& g : budget) {
      if (g.newly_fixed == 0) continue;
      g.cap_left -= share * g.newly_fixed;
      g.newly_fixed = 0;
    }
  }
  for (PairEntry& x : e) x.finish = t + transfer_ns(x.remaining, x.rate);
}

std::array<std::optional<SimTime>, 2> MaxMinModel::pair_ends(const PairFlow& a, const PairFlow& b) {
  std::array<PairEntry, 2> e;
  if (!pair_entries(a, b, e)) return {};
  bool shared = false;
  for (int l : e[0].links)
    shared = shared || std::find(e[1].links.begin(), e[1].links.end(), l) != e[1].links.end();
  const auto at = [](std::int64_t ns) { return std::optional<SimTime>(SimTime::from_ns(ns)); };
  // f joins first (or with s); returns the ends in a's and b's order.
  const size_t f = e[0].join <= e[1].join ? 0 : 1, s = 1 - f;
  PairEntry& first = e[f];
  PairEntry& second = e[s];
  std::array<std::optional<SimTime>, 2> out;
  if (first.join == second.join) {
    if (!first.occupies() || !second.occupies()) {
      // One that occupies nothing ends as it joins, touching no link; the other must be added.
      if (!first.occupies()) out[f] = at(first.join);
      if (!second.occupies()) out[s] = at(second.join);
      return out;
    }
    if (shared) {
      fill_pair_rates(e, first.join);
    } else {
      first.fill_alone(first.join);
      second.fill_alone(second.join);
    }
  } else {
    if (!first.occupies()) {
      out[f] = at(first.join);  // ends before the second joins
      return out;
    }
    first.fill_alone(first.join);
    if (first.finish <= second.join) {  // ends before the second joins: that one is added
      out[f] = at(first.finish);
      return out;
    }
    if (!second.occupies() || !shared) return out;  // overlap without sharing: both added
    // The second joins the first's links: the first's remainder is brought up to then.
    first.remaining -= first.rate * static_cast<double>(second.join - first.join) * 1e-9;
    fill_pair_rates(e, second.join);
  }
  // Final only if they end together: after the first end, its ends may start flows that join
  // the other's links.
  if (first.finish != second.finish) return out;
  out[f] = at(first.finish);
  out[s] = at(second.finish);
  return out;
}

double MaxMinModel::rate_bytes_per_s(std::uint64_t id) const {
  for (const Flow& f : flows_)
    if (f.live && (f.id == id || std::find(f.twins.begin(), f.twins.end(), id) != f.twins.end()))
      return f.active ? f.rate_bytes_per_s : 0;
  return 0;
}

}  // namespace cocodiff
