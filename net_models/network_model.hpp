#pragma once
// A network model times a set of concurrent flows in virtual time. The emulator drives it as a
// discrete-event process: add flows (each with its start time), ask for the next event, advance.
// Models are deterministic: the same calls in the same order give the same completions.
//
//   AlphaBetaModel net(topo, {{latency, bytes_per_ns}, ...});
//   net.add_flow(/*id=*/0, /*src=*/0, /*dst=*/1, /*bytes=*/1 << 20, SimTime{});
//   std::vector<std::uint64_t> done;
//   net.advance_to(net.next_event_time(), done);   // done == {0}

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/sim_time.hpp"
#include "core/topology.hpp"
#include "net_models/cluster_graph.hpp"

namespace cocodiff {

class NetworkModel {
 public:
  virtual ~NetworkModel() = default;
  /// Adds a flow of `bytes` from src to dst (world ranks, src != dst) that starts at `start`,
  /// which must not be earlier than the model's current time. Ids must be unique.
  virtual void add_flow(std::uint64_t id, int src, int dst, std::int64_t bytes, SimTime start) = 0;
  /// Earliest future time at which a flow starts, changes rate or completes; max() when idle.
  virtual SimTime next_event_time() const = 0;
  /// Moves the model's clock to t (<= next_event_time()); appends the ids of the flows that
  /// complete at t, in increasing id order.
  virtual void advance_to(SimTime t, std::vector<std::uint64_t>& completed) = 0;
  /// Current model time.
  virtual SimTime now() const = 0;
  /// Number of flows not yet completed.
  virtual std::size_t active_flows() const = 0;
  /// A fresh model of the same cluster, with no flows (for running a second simulation).
  virtual std::unique_ptr<NetworkModel> clone_empty() const = 0;
  virtual std::string name() const = 0;
  /// When `copies` flows of `bytes` each from src to dst, all starting at `start`, would end at
  /// a time that no other flow can change as long as no other flow leaves src or enters dst
  /// while they run: that time, without adding them (they never enter the model). nullopt when
  /// the model cannot promise it: a flow between two other ranks may share their route. A
  /// ring whose every hop is exclusive is timed without the model.
  virtual std::optional<SimTime> exclusive_end(int /*src*/, int /*dst*/, std::int64_t /*bytes*/,
                                               int /*copies*/, SimTime /*start*/) {
    return std::nullopt;
  }

  /// When a flow of no bytes from src to dst starting at `start` ends at a time that nothing
  /// else in flight can change (it pays its route's latency and never shares a link): that
  /// time, without adding it. nullopt when the model cannot promise it. The zero-count blocks of
  /// an all-to-allv under an uneven split are such messages, and most of a large one's.
  virtual std::optional<SimTime> empty_end(int /*src*/, int /*dst*/, SimTime /*start*/) {
    return std::nullopt;
  }

  /// `copies` flows of `bytes` each from src to dst, all starting at `start` (exclusive_pair_ends).
  struct PairFlow {
    int src = 0, dst = 0;
    std::int64_t bytes = 0;
    int copies = 1;
    SimTime start;
  };
  /// When the route src -> dst is not exclusive but every limited link on it carries only flows
  /// of at most two sources, or of at most two destinations (two tiles behind one NIC): a key
  /// that the route of any flow it could be timed with (exclusive_pair_ends) shares. nullopt
  /// otherwise.
  virtual std::optional<int> pair_key(int /*src*/, int /*dst*/) { return std::nullopt; }
  /// The ends of flows a and b (each with its copies), without adding them (they never enter
  /// the model), provided no other flow from a's or b's source, or to a's or b's destination,
  /// runs before that flow ends. nullopt for both unless only flows of these two sources, or
  /// only flows to these two destinations, can reach each limited link of their routes. An end
  /// is given only when nothing later can change it: both when they end at one instant; the
  /// first alone when the other joins its links only after it has ended (the other must then be
  /// added as usual); neither otherwise.
  virtual std::array<std::optional<SimTime>, 2> exclusive_pair_ends(const PairFlow& /*a*/,
                                                                    const PairFlow& /*b*/) {
    return {};
  }
};

/// Latency and bandwidth of one link class.
struct LinkCost {
  SimTime latency;
  double bandwidth_bytes_per_s = 1e9;
};

/// Congestion-unaware Hockney model: a flow takes latency + bytes / bandwidth, however many
/// other flows run. The fast reference. With a cluster graph, latency is the sum of the route's
/// link latencies and bandwidth its bottleneck link; with per-tier costs, the pair's tier's.
class AlphaBetaModel final : public NetworkModel {
 public:
  /// One LinkCost per topology tier (innermost first).
  AlphaBetaModel(Topology topo, std::vector<LinkCost> tiers);
  /// Route-based: every pair's cost comes from its route through `graph`.
  explicit AlphaBetaModel(std::shared_ptr<const ClusterGraph> graph);

  void add_flow(std::uint64_t id, int src, int dst, std::int64_t bytes, SimTime start) override;
  SimTime next_event_time() const override;
  void advance_to(SimTime t, std::vector<std::uint64_t>& completed) override;
  SimTime now() const override { return now_; }
  std::size_t active_flows() const override { return pending_.size(); }
  std::unique_ptr<NetworkModel> clone_empty() const override;
  std::string name() const override { return "alpha-beta"; }
  /// Every flow is exclusive here: flows never slow one another.
  std::optional<SimTime> exclusive_end(int src, int dst, std::int64_t bytes, int copies,
                                       SimTime start) override;

  /// The closed form this model uses: latency + bytes / bandwidth of the pair's route or tier.
  SimTime flow_time(int src, int dst, std::int64_t bytes) const;

 private:
  struct Pending {
    SimTime done;
    std::uint64_t id;
    bool operator>(const Pending& o) const { return done != o.done ? done > o.done : id > o.id; }
  };
  Topology topo_;
  std::vector<LinkCost> tiers_;                 // per-tier mode
  mutable std::unique_ptr<RouteTable> routes_;  // route mode (a cache, hence mutable)
  std::vector<Pending> pending_;                // min-heap on (done, id)
  SimTime now_;
};

}  // namespace cocodiff
