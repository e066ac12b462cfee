#include "net_models/network_model.hpp"

#include <algorithm>
#include <functional>

#include "core/errors.hpp"

namespace cocodiff {

namespace {
constexpr std::string_view kTransferWhat =
    "a transfer at the slowest link's bandwidth on its route (the cluster's "
    "bandwidth_gbytes_per_s keys)";
}  // namespace

AlphaBetaModel::AlphaBetaModel(Topology topo, std::vector<LinkCost> tiers)
    : topo_(std::move(topo)), tiers_(std::move(tiers)) {
  COCO_CHECK(static_cast<int>(tiers_.size()) == topo_.num_tiers(), "one LinkCost per tier");
  for (const LinkCost& t : tiers_)
    COCO_CHECK(t.bandwidth_bytes_per_s > 0, "bandwidth must be positive");
}

AlphaBetaModel::AlphaBetaModel(std::shared_ptr<const ClusterGraph> graph)
    : topo_(graph->topology()), routes_(std::make_unique<RouteTable>(std::move(graph))) {}

SimTime AlphaBetaModel::flow_time(int src, int dst, std::int64_t bytes) const {
  COCO_CHECK(src != dst, "flow to self");
  if (routes_ != nullptr) {
    const RouteSummary s = routes_->summary(src, dst);
    return s.latency + SimTime::from_seconds(static_cast<double>(bytes) / s.bottleneck_bytes_per_s,
                                             kTransferWhat);
  }
  int tier = topo_.tier(src, dst);
  const LinkCost& c = tiers_[static_cast<size_t>(tier)];
  return c.latency +
         SimTime::from_seconds(static_cast<double>(bytes) / c.bandwidth_bytes_per_s, kTransferWhat);
}

void AlphaBetaModel::add_flow(std::uint64_t id, int src, int dst, std::int64_t bytes,
                              SimTime start) {
  COCO_CHECK(start >= now_, "flow starts in the past");
  pending_.push_back({start + flow_time(src, dst, bytes), id});
  std::push_heap(pending_.begin(), pending_.end(), std::greater<>());
}

SimTime AlphaBetaModel::next_event_time() const {
  return pending_.empty() ? SimTime::max() : pending_.front().done;
}

void AlphaBetaModel::advance_to(SimTime t, std::vector<std::uint64_t>& completed) {
  COCO_CHECK(t >= now_ && t <= next_event_time(), "advance beyond the next event");
  now_ = t;
  while (!pending_.empty() && pending_.front().done == t) {
    std::pop_heap(pending_.begin(), pending_.end(), std::greater<>());
    completed.push_back(pending_.back().id);
    pending_.pop_back();
  }
}

std::optional<SimTime> AlphaBetaModel::exclusive_end(int src, int dst, std::int64_t bytes,
                                                     int /*copies*/, SimTime start) {
  return start + flow_time(src, dst, bytes);
}

std::unique_ptr<NetworkModel> AlphaBetaModel::clone_empty() const {
  if (routes_ != nullptr) return std::make_unique<AlphaBetaModel>(routes_->graph_ptr());
  return std::make_unique<AlphaBetaModel>(topo_, tiers_);
}

}  // namespace cocodiff
