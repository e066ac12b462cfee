#pragma once
// Flow-level max-min fair sharing (progressive filling), as in SimGrid's flow models. A flow
// first pays its route's latency, then joins the links of its route and shares each link's
// bandwidth max-min fairly with the other flows there. Rates are re-solved whenever a flow
// joins or ends, only for the flows connected to it through shared links. Twins (flows added
// one after the other with the same ends, size and start: a ring's key and value chunks) share
// one entry of weight two: they get the same rate at every instant and end together, so the
// solver counts them once per link with their weight, with the arithmetic of two flows.
//
//   auto graph = std::make_shared<const ClusterGraph>(...);  // or load_cluster(cfg, dir).graph
//   MaxMinModel net(graph);
//   net.add_flow(0, /*src=*/0, /*dst=*/1, 1 << 20, SimTime{});
//   net.add_flow(1, /*src=*/0, /*dst=*/2, 1 << 20, SimTime{});   // shares rank 0's uplink
//   std::vector<std::uint64_t> done;
//   while (net.active_flows() > 0) net.advance_to(net.next_event_time(), done);

#include <array>
#include <boost/circular_buffer.hpp>
#include <boost/container/small_vector.hpp>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "net_models/cluster_graph.hpp"
#include "net_models/network_model.hpp"

namespace cocodiff {

class MaxMinModel final : public NetworkModel {
 public:
  explicit MaxMinModel(std::shared_ptr<const ClusterGraph> graph);

  /// `id` must differ from every live flow's (the emulator numbers flows in order).
  void add_flow(std::uint64_t id, int src, int dst, std::int64_t bytes, SimTime start) override;
  SimTime next_event_time() const override;
  void advance_to(SimTime t, std::vector<std::uint64_t>& completed) override;
  SimTime now() const override { return now_; }
  std::size_t active_flows() const override { return live_; }
  std::unique_ptr<NetworkModel> clone_empty() const override;
  std::string name() const override { return "maxmin"; }
  /// A flow is exclusive when every limited link of its route carries only flows that leave
  /// its source, or only flows that enter its destination (a NIC of one tile's own): alone
  /// there, it gets its narrowest link over its copies, the lone-entry rate of the solver, and
  /// ends at start + latency + transfer time, exactly as if it had been added.
  std::optional<SimTime> exclusive_end(int src, int dst, std::int64_t bytes, int copies,
                                       SimTime start) override;
  /// A flow of no bytes pays its route's latency and finishes as it joins (activate): it never
  /// shares a link, so it ends at start + latency whatever else runs.
  std::optional<SimTime> empty_end(int src, int dst, SimTime start) override;
  /// The first link of the route (in route order) whose flows come from two sources, or go to
  /// two destinations, when no limited link of the route has more of both.
  std::optional<int> pair_key(int src, int dst) override;
  /// Every limited link of either route must carry only flows from a's and b's sources, or
  /// only flows to a's and b's destinations. The ends are what adding both flows would give:
  /// add_flow, activate, solve_lone and solve_component for these two entries, in the same
  /// arithmetic (progressive filling over the links of both routes).
  std::array<std::optional<SimTime>, 2> exclusive_pair_ends(const PairFlow& a,
                                                            const PairFlow& b) override;

  /// Current rate of a flow in bytes/s; 0 while it still pays its latency or is unknown.
  /// (A scan of the flows: for tests and diagnostics.)
  double rate_bytes_per_s(std::uint64_t id) const;

  /// Work counters, for benchmarks.
  struct Stats {
    std::uint64_t solves = 0;             // re-solves (one per changed component and event time)
    std::uint64_t flows_solved = 0;       // sum of the flows re-solved
    std::uint64_t largest_component = 0;  // most flows re-solved at once
  };
  const Stats& stats() const { return stats_; }

 private:
  static constexpr std::size_t kInlineLinks = 6;
  struct Flow {
    std::uint64_t id = 0;
    std::vector<std::uint64_t> twins;  // the other flows this entry stands for
    int weight = 1;                    // 1 + twins.size()
    int src = 0, dst = 0;
    std::int64_t bytes = 0, start_ns = 0, join_ns = 0;  // as added
    double remaining_bytes = 0;
    double rate_bytes_per_s = 0;
    std::int64_t updated_ns = 0;  // remaining_bytes is as of this time
    std::int64_t finish_ns = 0;
    std::uint32_t version = 0;  // finish-heap entries of older versions are stale
    std::uint32_t mark = 0;     // component search epoch
    std::uint32_t fixed = 0;    // progressive-filling epoch in which its rate was fixed
    bool live = false;
    bool active = false;  // past its latency, sharing bandwidth
    // The limited links of its route, and its index in each of those links' flow lists: held
    // in the entry for routes of up to kInlineLinks such links (every preset's), so that
    // activating and finishing a flow read nothing beside it.
    boost::container::small_vector<int, kInlineLinks> links;
    boost::container::small_vector<std::uint32_t, kInlineLinks> pos;
  };
  struct LinkState {
    double bandwidth_bytes_per_s = 0;
    // (flow slot, index into the flow's links); held in the entry while there are at most two
    boost::container::small_vector<std::pair<int, int>, 2> flows;
    int weight = 0;       // flows on it, twins counted
    double cap_left = 0;  // solve scratch below
    int unfixed = 0;
    int newly_fixed = 0;
    std::uint32_t mark = 0;
  };
  struct Pending {  // a flow paying its latency
    std::int64_t join_ns;
    std::uint64_t id;
    int slot;
    bool operator>(const Pending& o) const {
      return join_ns != o.join_ns ? join_ns > o.join_ns : id > o.id;
    }
  };
  struct Finish {
    std::int64_t ns;
    std::uint64_t id;
    int slot;
    std::uint32_t version;
    bool operator>(const Finish& o) const { return ns != o.ns ? ns > o.ns : id > o.id; }
  };
  struct Share {
    double bytes_per_s;
    int link;
    bool operator>(const Share& o) const {
      return bytes_per_s != o.bytes_per_s ? bytes_per_s > o.bytes_per_s : link > o.link;
    }
  };

  void push_pending(const Pending& e, std::int64_t latency_ns);
  const Pending* next_pending() const;  // the next flow to join, or null
  void pop_pending(const Pending* p);   // p: what next_pending returned
  void activate(int slot, std::vector<std::uint64_t>& completed);
  void finish(int slot, std::vector<std::uint64_t>& completed);
  void solve(std::int64_t t);
  void solve_component(int seed, std::int64_t t);
  /// Gathers the seed link's component into comp_links_ and comp_flows_; returns its weight.
  std::uint64_t find_component(int seed);
  /// Progressive filling over comp_links_: fixes the rate of every flow of the component.
  void fill_component_rates();
  /// Pushes the finish times at t of the component's flows, at their new rates.
  void push_component_finishes(std::int64_t t);
  void solve_lone(Flow& f, std::int64_t t);
  void prune_finish_heap();
  /// Fills link_src_/link_dst_ from every pair's route (on the first hop_info).
  void find_link_owners();
  bool stale(const Finish& f) const;

  RouteTable routes_;
  // Per link: the sources (link_src_) or destinations (link_dst_) of every route that crosses
  // it while there are at most two (kNoOwner where fewer); kShared when there are more.
  static constexpr int kNoOwner = -1, kShared = -2;
  struct Owners {
    int first = kNoOwner, second = kNoOwner;
    void add(int rank);
    bool only(int rank) const { return first == rank && second == kNoOwner; }
    bool two() const { return first >= 0 && second >= 0; }
    bool within(int a, int b) const {
      return first >= 0 && (first == a || first == b) &&
             (second == kNoOwner || second == a || second == b);
    }
  };
  std::vector<Owners> link_src_, link_dst_;
  // What the closed forms read of a route (exclusive_end, pair_key, exclusive_pair_ends), kept
  // for each source's last destination: a ring pass asks about the same hop again and again.
  struct HopInfo {
    int dst = -1;
    bool exclusive = false;  // every limited link carries only flows from src, or only to dst
    int key = -1;            // pair_key, or -1
    SimTime latency;
    double narrowest = 0;                          // bandwidth of its narrowest limited link
    boost::container::small_vector<int, 8> links;  // its limited links, in route order
  };
  const HopInfo& hop_info(int src, int dst);
  std::vector<HopInfo> hops_;  // per source
  // What exclusive_end reads of a route, for up to kEndMemo destinations per source (direct
  // mapped by destination): an all-to-all's messages inside a node each go to another one. An
  // entry names its kind of route (EndClass, a handful per cluster), so that a source's entries
  // fill four cache lines.
  static constexpr int kEndMemo = 32;
  struct EndClass {
    bool exclusive = false;
    bool empty = false;  // no limited link
    SimTime latency;
    double narrowest = 0;
    // The last size asked about, and its span from start to end (latency and transfer).
    std::int64_t last_bytes = -1;
    int last_copies = 0;
    std::int64_t last_span = 0;
  };
  struct EndMemo {
    std::int32_t dst = -1;
    std::uint32_t cls = 0;  // index into end_classes_
  };
  std::vector<EndMemo> end_memo_;  // kEndMemo per source
  std::vector<EndClass> end_classes_;
  // Whether each (source, destination) route is known, and exclusive, two bits in one word: a
  // large all-to-all's messages go to more destinations than the memo keeps, and most are not.
  std::vector<std::uint64_t> end_bits_;
  // empty_end's latencies: per (source, destination) route an index into route_latencies_ (a
  // handful per cluster), one byte each, so that the table stays in cache where the route
  // table does not; kNoLatency: not looked up yet (or past 254 distinct latencies).
  static constexpr std::uint8_t kNoLatency = 0xFF;
  std::vector<std::uint8_t> latency_class_;
  std::vector<SimTime> route_latencies_;
  // exclusive_pair_ends of x and y whose joins differ by dj (y's minus x's): the ends, taken
  // from x's join. Per x's source.
  struct PairMemo {
    PairFlow x{-1, -1, 0, 0, {}}, y{-1, -1, 0, 0, {}};
    std::int64_t dj = 0;
    std::array<std::optional<std::int64_t>, 2> off;
  };
  std::vector<PairMemo> pair_memo_;
  /// exclusive_pair_ends without the memo.
  std::array<std::optional<SimTime>, 2> pair_ends(const PairFlow& a, const PairFlow& b);
  struct PairEntry;  // one of pair_ends's two flows (maxmin_model.cpp)
  /// Fills pair_ends's entries for a and b; false where a limited link may carry other flows.
  bool pair_entries(const PairFlow& a, const PairFlow& b, std::array<PairEntry, 2>& e);
  /// Both entries on their links from t: progressive filling over both routes.
  void fill_pair_rates(std::array<PairEntry, 2>& e, std::int64_t t) const;
  std::vector<LinkState> links_;
  std::vector<Flow> flows_;
  std::vector<int> free_slots_;
  std::vector<char> limited_;  // per link: has a bandwidth limit (shared by its flows)
  // Flows paying their latency: a sorted queue per route latency (push_pending), and a
  // min-heap on (join, id) for those that join before their queue's last.
  struct Lane {
    std::int64_t latency_ns;
    boost::circular_buffer<Pending> queue;
  };
  static constexpr std::size_t kMaxLanes = 8;
  std::vector<Lane> lanes_;
  std::vector<Pending> pending_;
  std::vector<Finish> finish_;  // min-heap on (finish, id), lazily pruned
  std::vector<int> seeds_;      // links whose flow set changed
  std::vector<int> lone_;       // flows that joined empty links: components of their own
  std::vector<int> comp_links_, comp_flows_, stack_, touched_;
  std::vector<Share> shares_;
  std::uint32_t epoch_ = 0;
  std::size_t live_ = 0;
  int last_added_ = -1;  // the slot add_flow filled last: a twin joins it
  SimTime now_;
  Stats stats_;
};

}  // namespace cocodiff
