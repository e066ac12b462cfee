// The network models against closed forms: one flow, k flows on one link, a textbook max-min
// allocation worked by hand, flows that start at different times, and the route-based
// alpha-beta model. Bandwidths are chosen so that rates are whole bytes per ns.

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <optional>
#include <random>

#include "net_models/cluster_graph.hpp"
#include "net_models/maxmin_model.hpp"
#include "net_models/network_model.hpp"

namespace cocodiff {
namespace {

constexpr double kGBps = 1e9;  // 1 GB/s = 1 byte per ns

Topology flat_topo(int ranks) {
  return Topology({{"gpu", ranks, "intra-node"}, {"node", 1, "inter-node"}});
}

// Runs the model until it is idle; returns each flow's completion time in ns.
std::map<std::uint64_t, std::int64_t> drain(NetworkModel& net) {
  std::map<std::uint64_t, std::int64_t> done;
  while (net.active_flows() > 0) {
    const SimTime t = net.next_event_time();
    std::vector<std::uint64_t> ids;
    net.advance_to(t, ids);
    EXPECT_TRUE(std::is_sorted(ids.begin(), ids.end()));
    for (std::uint64_t id : ids) EXPECT_TRUE(done.emplace(id, t.ns()).second) << id;
  }
  EXPECT_EQ(net.next_event_time(), SimTime::max());
  return done;
}

// A flow of the randomised tests, added with add_flow(id, src, dst, bytes, start ns).
struct RandomFlow {
  std::uint64_t id;
  int src, dst;
  std::int64_t bytes, start;
};

// Ranks 0..2 in a line: 0 -a- 1 -b- 2, with the given latencies (ns) and bandwidths (bytes/s).
std::shared_ptr<const ClusterGraph> line(std::int64_t lat_a, double bw_a, std::int64_t lat_b,
                                         double bw_b) {
  auto g = std::make_shared<ClusterGraph>(flat_topo(3));
  const int cls = g->add_link_class("wire", "intra-node");
  g->add_duplex(0, 1, SimTime::from_ns(lat_a), bw_a, cls);
  g->add_duplex(1, 2, SimTime::from_ns(lat_b), bw_b, cls);
  return g;
}

// Rank 0 with a slow uplink to a switch; ranks 1..k with fast links to it.
std::shared_ptr<const ClusterGraph> star(int k, double uplink, double others) {
  auto g = std::make_shared<ClusterGraph>(flat_topo(k + 1));
  const int cls = g->add_link_class("port", "intra-node");
  const int sw = g->add_vertex("switch", VertexKind::kSwitch, 0);
  g->add_duplex(0, sw, SimTime::from_ns(100), uplink, cls);
  for (int r = 1; r <= k; ++r) g->add_duplex(r, sw, SimTime::from_ns(100), others, cls);
  return g;
}

TEST(MaxMin, OneFlowIsLatencyPlusBytesOverBandwidth) {
  // Two hops: latency 1000 + 2000 ns; the bottleneck is the 4 GB/s hop.
  auto g = line(1000, 10 * kGBps, 2000, 4 * kGBps);
  MaxMinModel net(g);
  net.add_flow(7, 0, 2, 10000, SimTime::from_ns(300));
  EXPECT_EQ(net.next_event_time().ns(), 300 + 3000);  // it joins after paying the latency
  auto done = drain(net);
  EXPECT_EQ(done.at(7), 300 + 3000 + 10000 / 4);
  // The route-based alpha-beta model gives the same closed form.
  AlphaBetaModel ab(g);
  EXPECT_EQ(ab.flow_time(0, 2, 10000).ns(), 3000 + 2500);
  ab.add_flow(7, 0, 2, 10000, SimTime::from_ns(300));
  EXPECT_EQ(drain(ab).at(7), 300 + 3000 + 2500);
}

TEST(MaxMin, KEqualFlowsOnOneLinkEachGetOneKth) {
  for (int k : {1, 2, 3, 5, 8}) {
    MaxMinModel net(star(k, 1 * kGBps, 100 * kGBps));
    for (int r = 1; r <= k; ++r) net.add_flow(static_cast<std::uint64_t>(r), 0, r, 6000, SimTime{});
    std::vector<std::uint64_t> ids;
    net.advance_to(net.next_event_time(), ids);  // all join at t = 200 ns
    EXPECT_TRUE(ids.empty());
    for (int r = 1; r <= k; ++r)
      EXPECT_DOUBLE_EQ(net.rate_bytes_per_s(static_cast<std::uint64_t>(r)), kGBps / k) << k;
    auto done = drain(net);
    for (int r = 1; r <= k; ++r)
      EXPECT_EQ(done.at(static_cast<std::uint64_t>(r)), 200 + 6000 * k) << "k=" << k;
  }
}

TEST(MaxMin, TextbookAllocationWithDifferentRoutes) {
  // Links a = 0->1 (10 GB/s) and b = 1->2 (6 GB/s), no latency. Flows:
  //   A: 0->2 (a, b), 8000 B   B: 0->1 (a), 8000 B   C: 1->2 (b), 2000 B   D: 1->2 (b), 12000 B
  // Progressive filling: b's fair share 6/3 = 2 is the smallest (a's is 10/2 = 5), so A, C, D
  // get 2 B/ns; a has 10 - 2 = 8 left for B alone: B gets 8.
  // t = 1000: B (8000 / 8) and C (2000 / 2) finish. A has 6000 left, D 10000. b now carries
  //   A and D at 3 B/ns each (a carries A only, at 3: no longer a bottleneck).
  // t = 3000: A finishes (6000 / 3). D has 10000 - 6000 = 4000 left, alone on b at 6 B/ns.
  // t = 3000 + ceil(4000 / 6) = 3667: D finishes.
  MaxMinModel net(line(0, 10 * kGBps, 0, 6 * kGBps));
  net.add_flow(0, 0, 2, 8000, SimTime{});
  net.add_flow(1, 0, 1, 8000, SimTime{});
  net.add_flow(2, 1, 2, 2000, SimTime{});
  net.add_flow(3, 1, 2, 12000, SimTime{});
  std::vector<std::uint64_t> ids;
  net.advance_to(SimTime{}, ids);
  EXPECT_DOUBLE_EQ(net.rate_bytes_per_s(0), 2 * kGBps);
  EXPECT_DOUBLE_EQ(net.rate_bytes_per_s(1), 8 * kGBps);
  EXPECT_DOUBLE_EQ(net.rate_bytes_per_s(2), 2 * kGBps);
  EXPECT_DOUBLE_EQ(net.rate_bytes_per_s(3), 2 * kGBps);
  auto done = drain(net);
  EXPECT_EQ(done.at(0), 3000);
  EXPECT_EQ(done.at(1), 1000);
  EXPECT_EQ(done.at(2), 1000);
  EXPECT_EQ(done.at(3), 3667);
}

TEST(MaxMin, FlowsThatStartAtDifferentTimes) {
  // One 1 GB/s link with 100 ns latency. A (10000 B) starts at 0 and joins at 100; B (2000 B)
  // starts at 2000 and joins at 2100, when A has 8000 B left. Both then move 0.5 B/ns: B ends
  // at 2100 + 4000 = 6100 with A at 6000 B left, which A then moves alone: 12100.
  auto g = std::make_shared<ClusterGraph>(flat_topo(2));
  g->add_duplex(0, 1, SimTime::from_ns(100), kGBps, g->add_link_class("wire", "intra-node"));
  MaxMinModel net(g);
  net.add_flow(1, 0, 1, 10000, SimTime{});
  std::vector<std::uint64_t> ids;
  net.advance_to(SimTime::from_ns(100), ids);
  EXPECT_EQ(net.next_event_time().ns(), 10100);
  net.add_flow(2, 0, 1, 2000, SimTime::from_ns(2000));  // added later, as the emulator does
  auto done = drain(net);
  EXPECT_EQ(done.at(2), 6100);
  EXPECT_EQ(done.at(1), 12100);
}

TEST(MaxMin, ZeroByteFlowCostsItsLatency) {
  MaxMinModel net(line(700, kGBps, 300, kGBps));
  net.add_flow(3, 2, 0, 0, SimTime::from_ns(50));
  EXPECT_EQ(drain(net).at(3), 50 + 1000);
}

TEST(MaxMin, OneLinkStaysBusyUntilTheLastByte) {
  // Random sizes on one shared 3 GB/s link (rates are not whole bytes per ns): the link is
  // never idle, so the last flow ends at latency + total / bandwidth, give or take the
  // rounding up of each completion to a whole ns; no flow ends late by more than that.
  std::mt19937 rng(3);
  for (int trial = 0; trial < 5; ++trial) {
    const int k = 2 + trial * 3;
    MaxMinModel net(star(k, 3 * kGBps, 1000 * kGBps));
    double total = 0;
    for (int r = 1; r <= k; ++r) {
      const std::int64_t bytes = std::uniform_int_distribution<std::int64_t>(1, 1 << 20)(rng);
      total += static_cast<double>(bytes);
      net.add_flow(static_cast<std::uint64_t>(r), 0, r, bytes, SimTime{});
    }
    auto done = drain(net);
    std::int64_t last = 0;
    for (auto [id, t] : done) last = std::max(last, t);
    const double exact = 200 + total / 3;
    EXPECT_GE(static_cast<double>(last), exact - 1e-6);
    EXPECT_LE(static_cast<double>(last), exact + k);
  }
}

TEST(MaxMin, ResultDoesNotDependOnTheOrderFlowsAreAdded) {
  // All-pairs flows on a 6-rank star: the same set added in two orders (same ids) must give
  // identical completion times, since the allocation is a function of the set of flows.
  auto g = star(5, 2 * kGBps, 3 * kGBps);
  std::vector<RandomFlow> flows;
  for (int s = 0; s < 6; ++s)
    for (int d = 0; d < 6; ++d)
      if (s != d) flows.push_back({flows.size(), s, d, 1000 + 37 * s + 101 * d, 0});
  std::map<std::uint64_t, std::int64_t> first;
  for (int order = 0; order < 3; ++order) {
    std::mt19937 rng(static_cast<unsigned>(order));
    if (order > 0) std::shuffle(flows.begin(), flows.end(), rng);
    MaxMinModel net(g);
    for (const RandomFlow& f : flows) net.add_flow(f.id, f.src, f.dst, f.bytes, SimTime{});
    auto done = drain(net);
    if (order == 0)
      first = done;
    else
      EXPECT_EQ(done, first) << "order " << order;
  }
}

TEST(MaxMin, TwinsShareTheLinkAsTwoFlows) {
  // Flows 1 and 2 are twins (same ends, size and start, added one after the other): with flow
  // 3 on rank 0's 3 GB/s uplink each moves 1 B/ns. Flow 3 ends at 200 + 3000; the twins move
  // their last 3000 B at 1.5 B/ns each.
  MaxMinModel net(star(2, 3 * kGBps, 1000 * kGBps));
  net.add_flow(1, 0, 1, 6000, SimTime{});
  net.add_flow(2, 0, 1, 6000, SimTime{});
  net.add_flow(3, 0, 2, 3000, SimTime{});
  std::vector<std::uint64_t> ids;
  net.advance_to(SimTime::from_ns(200), ids);
  EXPECT_EQ(net.active_flows(), 3u);
  EXPECT_DOUBLE_EQ(net.rate_bytes_per_s(2), 1e9);
  EXPECT_DOUBLE_EQ(net.rate_bytes_per_s(3), 1e9);
  const auto done = drain(net);
  EXPECT_EQ(done.at(3), 3200);
  EXPECT_EQ(done.at(1), 3200 + 2000);
  EXPECT_EQ(done.at(2), 3200 + 2000);
  EXPECT_EQ(net.stats().largest_component, 3u);
}

// Ranks 0 and 1 on switch A, 2 and 3 on switch B, one 2 GB/s link each way between the
// switches; every port 4 GB/s, 100 ns a hop.
std::shared_ptr<const ClusterGraph> dumbbell() {
  auto g = std::make_shared<ClusterGraph>(flat_topo(4));
  const int cls = g->add_link_class("port", "intra-node");
  const int a = g->add_vertex("a", VertexKind::kSwitch, 0);
  const int b = g->add_vertex("b", VertexKind::kSwitch, 0);
  for (int r = 0; r < 4; ++r)
    g->add_duplex(r, r < 2 ? a : b, SimTime::from_ns(100), 4 * kGBps, cls);
  g->add_duplex(a, b, SimTime::from_ns(100), 2 * kGBps, cls);
  return g;
}

TEST(MaxMin, ExclusiveEndIsWhatAddingTheFlowsGives) {
  // 0 -> 1 crosses 0's uplink (only flows from 0 use it) and 1's downlink (only flows to 1):
  // exclusive. 0 -> 2 crosses the link between the switches, which flows from 1 to 3 share.
  MaxMinModel net(dumbbell());
  EXPECT_FALSE(net.exclusive_end(0, 2, 6000, 1, SimTime{}).has_value());
  EXPECT_FALSE(net.exclusive_end(3, 1, 6000, 2, SimTime{}).has_value());
  for (const auto& [bytes, copies] :
       std::vector<std::pair<std::int64_t, int>>{{6000, 1}, {6001, 2}, {12345, 3}, {0, 2}}) {
    const SimTime start = SimTime::from_ns(57);
    const std::optional<SimTime> end = net.exclusive_end(0, 1, bytes, copies, start);
    ASSERT_TRUE(end.has_value());
    EXPECT_EQ(end->ns(), 57 + 200 + (bytes * copies + 3) / 4);  // ceil(bytes x copies / 4 B/ns)
    MaxMinModel added(dumbbell());
    for (int c = 0; c < copies; ++c)
      added.add_flow(static_cast<std::uint64_t>(c), 0, 1, bytes, start);
    for (const auto& [id, t] : drain(added)) EXPECT_EQ(t, end->ns()) << id;
  }
  EXPECT_EQ(net.active_flows(), 0u);  // nothing was added
  // Alpha-beta flows never share: every flow is exclusive, at the model's closed form.
  AlphaBetaModel ab(dumbbell());
  EXPECT_EQ(ab.exclusive_end(0, 2, 6000, 2, SimTime::from_ns(10))->ns(),
            10 + ab.flow_time(0, 2, 6000).ns());
}

TEST(MaxMin, AnEmptyFlowEndsAtItsRoutesLatencyWhateverShares) {
  // 0 -> 2 crosses the link between the switches, which 1 -> 3 loads: a flow of bytes there is
  // not exclusive, but one of no bytes ends at start + latency (three hops) all the same.
  MaxMinModel net(dumbbell());
  net.add_flow(1, 1, 3, 60000, SimTime{});
  net.add_flow(2, 0, 2, 60000, SimTime{});
  const SimTime start = SimTime::from_ns(1234);
  const std::optional<SimTime> end = net.empty_end(0, 2, start);
  ASSERT_TRUE(end.has_value());
  EXPECT_EQ(end->ns(), 1234 + 300);
  EXPECT_EQ(net.active_flows(), 2u);  // nothing was added
  MaxMinModel added(dumbbell());
  added.add_flow(1, 1, 3, 60000, SimTime{});
  added.add_flow(2, 0, 2, 60000, SimTime{});
  std::vector<std::uint64_t> ids;
  while (added.next_event_time() < start) added.advance_to(added.next_event_time(), ids);
  added.advance_to(start, ids);
  EXPECT_TRUE(ids.empty());  // both still run when the empty one starts
  added.add_flow(3, 0, 2, 0, start);
  EXPECT_EQ(drain(added).at(3), end->ns());
  // A model that cannot promise it says so.
  EXPECT_FALSE(AlphaBetaModel(dumbbell()).empty_end(0, 2, start).has_value());
}

// `per_side` ranks on switch a, as many on switch b, one 3 GB/s link each way between the
// switches (two tiles behind one NIC each side, when per_side is 2); every port 4 GB/s except
// rank 1's, 1 GB/s; 100 ns a hop.
std::shared_ptr<const ClusterGraph> two_switches(int per_side) {
  auto g = std::make_shared<ClusterGraph>(flat_topo(2 * per_side));
  const int cls = g->add_link_class("port", "intra-node");
  const int a = g->add_vertex("a", VertexKind::kSwitch, 0);
  const int b = g->add_vertex("b", VertexKind::kSwitch, 0);
  for (int r = 0; r < 2 * per_side; ++r)
    g->add_duplex(r, r < per_side ? a : b, SimTime::from_ns(100), (r == 1 ? 1 : 4) * kGBps, cls);
  g->add_duplex(a, b, SimTime::from_ns(100), 3 * kGBps, cls);
  return g;
}

TEST(MaxMin, ExclusivePairEndsAreWhatAddingTheFlowsGives) {
  // Only flows from ranks 0 and 1 cross the link from a to b, only flows to 2 and 3: 0 -> 2 and
  // 1 -> 3 can be timed as a pair. Rank 1's 1 GB/s port fixes 1 -> 3 first; 0 -> 2 gets the
  // rest of the 3 GB/s link.
  MaxMinModel net(two_switches(2));
  ASSERT_TRUE(net.pair_key(0, 2).has_value());
  EXPECT_EQ(net.pair_key(0, 2), net.pair_key(1, 3));
  EXPECT_EQ(net.pair_key(0, 2), net.pair_key(1, 2));
  EXPECT_FALSE(net.pair_key(0, 1).has_value());  // exclusive: exclusive_end applies
  // In step: 1 -> 3 gets 1 B/ns (its port, tied with the 3 GB/s link's share), each of 0 -> 2's
  // two copies 1 B/ns of the 2 B/ns left. With 1,500 B each they end together: both ends known.
  const auto together = net.exclusive_pair_ends({0, 2, 1500, 2, SimTime::from_ns(50)},
                                                {1, 3, 1500, 1, SimTime::from_ns(50)});
  ASSERT_TRUE(together[0].has_value() && together[1].has_value());
  EXPECT_EQ(together[0]->ns(), 50 + 300 + 1500);
  EXPECT_EQ(together[1]->ns(), 50 + 300 + 1500);
  // With 6,000 B from rank 0, 1 -> 3 ends first and 0 -> 2 speeds up: a flow from rank 1 could
  // then join 0 -> 2's links before it ends, so neither end is final.
  const auto apart = net.exclusive_pair_ends({0, 2, 6000, 2, SimTime::from_ns(50)},
                                             {1, 3, 1500, 1, SimTime::from_ns(50)});
  EXPECT_FALSE(apart[0].has_value() || apart[1].has_value());
  // 1 -> 3 ends (at 50 + 300 + 100) before 0 -> 2 joins at 1,000 + 300: the first end is final,
  // the second flow is added as usual.
  const auto first = net.exclusive_pair_ends({0, 2, 6000, 2, SimTime::from_ns(1000)},
                                             {1, 3, 100, 1, SimTime::from_ns(50)});
  EXPECT_FALSE(first[0].has_value());
  ASSERT_TRUE(first[1].has_value());
  EXPECT_EQ(first[1]->ns(), 50 + 300 + 100);
  // 0 -> 2 joins at 300 alone (3 B/ns), 1 -> 3 at 400; then 2 and 1 B/ns: 2,300 - 300 B and
  // 1,000 B both end at 1,400, as adding them gives.
  const auto staggered =
      net.exclusive_pair_ends({0, 2, 2300, 1, SimTime{}}, {1, 3, 1000, 1, SimTime::from_ns(100)});
  ASSERT_TRUE(staggered[0].has_value() && staggered[1].has_value());
  EXPECT_EQ(staggered[0]->ns(), 1400);
  EXPECT_EQ(staggered[1]->ns(), 1400);
  {
    MaxMinModel added(two_switches(2));
    added.add_flow(0, 0, 2, 2300, SimTime{});
    added.add_flow(1, 1, 3, 1000, SimTime::from_ns(100));
    EXPECT_EQ(drain(added), (std::map<std::uint64_t, std::int64_t>{{0, 1400}, {1, 1400}}));
  }
  // Random pairs (some in step, some apart, some overlapping, empty ones): every end given is
  // the end adding both flows (with their copies) gives; in step with equal sizes, both are.
  std::mt19937 rng(11);
  int both = 0, one = 0, none = 0;
  for (int i = 0; i < 400; ++i) {
    const bool in_step = i % 3 == 0;
    NetworkModel::PairFlow a{0, 2, 0, 1, {}}, b{1, i % 2 == 0 ? 3 : 2, 0, 1, {}};
    if (i % 4 == 1) std::swap(a, b);
    a.bytes = i % 17 == 5 ? 0 : std::uniform_int_distribution<std::int64_t>(1, 20000)(rng);
    b.bytes = in_step ? a.bytes : std::uniform_int_distribution<std::int64_t>(0, 20000)(rng);
    a.copies = std::uniform_int_distribution<int>(1, 3)(rng);
    b.copies = in_step ? a.copies : std::uniform_int_distribution<int>(1, 3)(rng);
    a.start = SimTime::from_ns(std::uniform_int_distribution<std::int64_t>(0, 8000)(rng));
    b.start = in_step ? a.start
                      : SimTime::from_ns(std::uniform_int_distribution<std::int64_t>(0, 8000)(rng));
    const auto ends = net.exclusive_pair_ends(a, b);
    // Asked again later, either way round, the ends move with the starts (the model keeps the
    // last answer per source), as a model that never saw the pair gives them.
    NetworkModel::PairFlow a2 = a, b2 = b;
    const std::int64_t shift = 1 + i * 7919;
    a2.start = a.start + SimTime::from_ns(shift);
    b2.start = b.start + SimTime::from_ns(shift);
    const auto later = net.exclusive_pair_ends(b2, a2);
    MaxMinModel fresh(two_switches(2));
    EXPECT_EQ(later, fresh.exclusive_pair_ends(b2, a2)) << i;
    for (size_t k = 0; k < 2; ++k) {
      ASSERT_EQ(later[1 - k].has_value(), ends[k].has_value()) << i;
      if (ends[k].has_value()) {
        EXPECT_EQ(later[1 - k]->ns(), ends[k]->ns() + shift) << i;
      }
    }
    MaxMinModel added(two_switches(2));
    std::uint64_t id = 0;
    std::vector<std::uint64_t> first, second;
    const NetworkModel::PairFlow& early = a.start <= b.start ? a : b;
    const NetworkModel::PairFlow& late = a.start <= b.start ? b : a;
    for (const NetworkModel::PairFlow* f : {&early, &late})
      for (int c = 0; c < f->copies; ++c) {
        (f == &a ? first : second).push_back(id);
        added.add_flow(id++, f->src, f->dst, f->bytes, f->start);
      }
    const auto done = drain(added);
    for (size_t k = 0; k < 2; ++k) {
      if (!ends[k].has_value()) continue;
      for (std::uint64_t c : k == 0 ? first : second) EXPECT_EQ(done.at(c), ends[k]->ns()) << i;
    }
    (ends[0] && ends[1] ? both : ends[0] || ends[1] ? one : none)++;
  }
  EXPECT_GT(both, 0);
  EXPECT_GT(one, 0);
  EXPECT_GT(none, 0);
  EXPECT_EQ(net.active_flows(), 0u);  // nothing was added
  // Three ranks each side: the link between the switches carries flows of three sources and to
  // three destinations, so nothing is paired.
  MaxMinModel wide(two_switches(3));
  EXPECT_FALSE(wide.pair_key(0, 3).has_value());
  const auto refused = wide.exclusive_pair_ends({0, 3, 100, 1, {}}, {2, 4, 100, 1, {}});
  EXPECT_FALSE(refused[0].has_value() || refused[1].has_value());
  AlphaBetaModel ab(two_switches(2));  // every flow exclusive: no pairs
  EXPECT_FALSE(ab.pair_key(0, 2).has_value());
}

TEST(MaxMin, DisjointComponentsAreSolvedApart) {
  // Four flows join at 200 ns on a star (rank 0's uplink 3 GB/s, the others 4 GB/s): 1->2 and
  // 3->4 are alone on their links, 0->5 twice shares rank 0's uplink at 1.5 B/ns each. Each
  // connected component is solved on its own: three solves at 200 ns (the largest two flows),
  // none when a lone flow leaves its links empty, one for the 6,000 B flow left alone at 2,200.
  MaxMinModel net(star(5, 3 * kGBps, 4 * kGBps));
  net.add_flow(1, 1, 2, 4000, SimTime{});
  net.add_flow(2, 3, 4, 8000, SimTime{});
  net.add_flow(3, 0, 5, 3000, SimTime{});
  net.add_flow(4, 0, 5, 6000, SimTime{});
  const auto done = drain(net);
  EXPECT_EQ(done.at(1), 200 + 1000);
  EXPECT_EQ(done.at(2), 200 + 2000);
  EXPECT_EQ(done.at(3), 200 + 2000);
  EXPECT_EQ(done.at(4), 2200 + 1000);  // its last 3,000 B alone at 3 B/ns
  EXPECT_EQ(net.stats().solves, 4u);
  EXPECT_EQ(net.stats().largest_component, 2u);
  EXPECT_EQ(net.stats().flows_solved, 5u);
}

TEST(MaxMin, JoinOrderDoesNotDependOnTheOrderFlowsAreAdded) {
  // 80 flows on a line with three route latencies (100, 700 and 800 ns), random sizes and
  // starts, all added before time moves. Added by start, each latency's flows join in the
  // order they were added (its queue); added in reverse, all but the first of each latency
  // join out of that order (the heap). Both must give every flow the same completion time.
  std::mt19937 rng(5);
  std::vector<RandomFlow> flows;
  for (int i = 0; i < 80; ++i) {
    const int src = std::uniform_int_distribution<int>(0, 2)(rng);
    const int dst = (src + std::uniform_int_distribution<int>(1, 2)(rng)) % 3;
    flows.push_back({static_cast<std::uint64_t>(i), src, dst,
                     std::uniform_int_distribution<std::int64_t>(1, 1 << 14)(rng),
                     std::uniform_int_distribution<std::int64_t>(0, 5000)(rng)});
  }
  std::sort(flows.begin(), flows.end(),
            [](const RandomFlow& a, const RandomFlow& b) { return a.start < b.start; });
  std::map<std::uint64_t, std::int64_t> done[2];
  for (int reversed = 0; reversed < 2; ++reversed) {
    MaxMinModel net(line(100, 3 * kGBps, 700, 5 * kGBps));
    if (reversed != 0) std::reverse(flows.begin(), flows.end());
    for (const RandomFlow& f : flows)
      net.add_flow(f.id, f.src, f.dst, f.bytes, SimTime::from_ns(f.start));
    done[reversed] = drain(net);
  }
  ASSERT_EQ(done[0].size(), flows.size());
  EXPECT_EQ(done[0], done[1]);
  // A lone flow still costs latency plus bytes over bandwidth: 0 -> 2 at the 3 GB/s hop.
  MaxMinModel lone(line(100, 3 * kGBps, 700, 5 * kGBps));
  lone.add_flow(7, 0, 2, 3000, SimTime::from_ns(50));
  EXPECT_EQ(drain(lone).at(7), 50 + 800 + 1000);
}

TEST(MaxMin, TwinsGiveWhatSeparateFlowsGive) {
  // Random pairs of equal flows at random starts on a 5-rank star, rates not whole bytes per
  // ns: added back to back (each pair one entry of weight two) or interleaved with another
  // flow (every flow its own entry), the completion times are identical to the ns.
  std::mt19937 rng(11);
  std::vector<RandomFlow> pairs;
  for (int i = 0; i < 40; ++i) {
    const int src = std::uniform_int_distribution<int>(0, 4)(rng);
    const int dst = (src + std::uniform_int_distribution<int>(1, 4)(rng)) % 5;
    const std::int64_t bytes = std::uniform_int_distribution<std::int64_t>(0, 1 << 16)(rng);
    const std::int64_t start = std::uniform_int_distribution<std::int64_t>(0, 20000)(rng);
    pairs.push_back({static_cast<std::uint64_t>(2 * i), src, dst, bytes, start});
  }
  std::sort(pairs.begin(), pairs.end(),
            [](const RandomFlow& a, const RandomFlow& b) { return a.start < b.start; });
  std::map<std::uint64_t, std::int64_t> done[2];
  for (int interleaved = 0; interleaved < 2; ++interleaved) {
    MaxMinModel net(star(4, 3 * kGBps, 7 * kGBps));
    std::vector<std::uint64_t> ids;
    for (size_t i = 0; i < pairs.size(); ++i) {
      const RandomFlow& f = pairs[i];
      // Flows end as virtual time reaches each start, as the emulator advances.
      while (net.next_event_time().ns() <= f.start) {
        ids.clear();
        net.advance_to(net.next_event_time(), ids);
        for (std::uint64_t id : ids) done[interleaved].emplace(id, net.now().ns());
      }
      net.add_flow(f.id, f.src, f.dst, f.bytes, SimTime::from_ns(f.start));
      if (interleaved != 0) {  // a flow of the next pair between the twins
        const RandomFlow& g = pairs[(i + 1) % pairs.size()];
        net.add_flow(1000 + f.id, g.src, g.dst, g.bytes, SimTime::from_ns(f.start));
      }
      net.add_flow(f.id + 1, f.src, f.dst, f.bytes, SimTime::from_ns(f.start));
      if (interleaved == 0) {  // the same extra flow, after the twins
        const RandomFlow& g = pairs[(i + 1) % pairs.size()];
        net.add_flow(1000 + f.id, g.src, g.dst, g.bytes, SimTime::from_ns(f.start));
      }
    }
    for (auto [id, t] : drain(net)) done[interleaved].emplace(id, t);
    EXPECT_EQ(done[interleaved].size(), 3 * pairs.size());
  }
  EXPECT_EQ(done[0], done[1]);
  for (const RandomFlow& f : pairs) EXPECT_EQ(done[0].at(f.id), done[0].at(f.id + 1));
}

TEST(MaxMin, CloneIsEmptyAndIndependent) {
  MaxMinModel net(line(0, kGBps, 0, kGBps));
  net.add_flow(1, 0, 2, 100, SimTime{});
  std::unique_ptr<NetworkModel> c = net.clone_empty();
  EXPECT_EQ(c->active_flows(), 0u);
  EXPECT_EQ(c->name(), "maxmin");
  c->add_flow(1, 0, 1, 100, SimTime{});
  EXPECT_EQ(drain(*c).at(1), 100);
  EXPECT_EQ(drain(net).at(1), 100);
}

TEST(ClusterGraph, RoutesAreBandwidthAwareAndDeterministic) {
  // A ring of 4 ranks plus a chord 0-2. A 1 MiB message crosses two ring links (1 GB/s) faster
  // than a slow chord (0.1 GB/s): 0 -> 2 goes round the ring, although the chord is one hop.
  // With a fast chord (10 GB/s) it takes the chord.
  for (const double chord_gbps : {0.1, 10.0}) {
    auto g = std::make_shared<ClusterGraph>(flat_topo(4));
    const int ring = g->add_link_class("ring", "intra-node");
    const int chord = g->add_link_class("chord", "intra-node");
    for (int r = 0; r < 4; ++r) g->add_duplex(r, (r + 1) % 4, SimTime::from_ns(10), kGBps, ring);
    g->add_duplex(0, 2, SimTime::from_ns(500), chord_gbps * kGBps, chord);
    RouteTable routes(g);
    if (chord_gbps < 1) {
      ASSERT_EQ(routes.route(0, 2).size(), 2u);
      EXPECT_EQ(g->link_class(g->link(routes.route(0, 2)[0]).link_class).name, "ring");
      EXPECT_EQ(routes.summary(0, 2).latency.ns(), 20);
    } else {
      ASSERT_EQ(routes.route(0, 2).size(), 1u);
      EXPECT_EQ(g->link_class(g->link(routes.route(0, 2)[0]).link_class).name, "chord");
      EXPECT_EQ(routes.summary(0, 2).latency.ns(), 500);
    }
    EXPECT_EQ(routes.route(1, 3).size(), 2u);  // two equal ways round: the first found wins
    EXPECT_EQ(g->describe_route(1, routes.route(1, 3)), g->describe_route(1, g->route(1, 3)));
    EXPECT_FALSE(g->find_unreachable_pair().has_value());
  }
}

}  // namespace
}  // namespace cocodiff
