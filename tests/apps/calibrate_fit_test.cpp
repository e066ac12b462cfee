// The collective fit as a library (apps/calibrate/collective_fit.hpp): points made by the
// emulator's own timing on a cluster with known figures are fitted from other figures, and the
// known ones come back; on a cluster whose device has a host, calls timed back to back overlap
// the host's issue with the call before, and both the host's cost and the library's come back.

#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "apps/calibrate/cluster_file.hpp"
#include "apps/calibrate/collective_fit.hpp"

namespace cocodiff::calibrate {
namespace {

namespace fs = std::filesystem;

const fs::path kPresets = fs::path(COCODIFF_SOURCE_DIR) / "configs" / "clusters";
const fs::path kCluster = fs::path(COCODIFF_TEST_DATA) / "calibrate" / "two_nodes.toml";

FitCluster fit_cluster(const std::vector<std::string>& sets) {
  Config cfg = load_cluster_config(kCluster.string(), kPresets);
  for (const std::string& s : sets) cfg.set(s);
  return {complete_cluster_table(cfg, kPresets), kCluster.string(), kPresets, 1};
}

double value_of(const CollectiveFit& f, const std::string& key) {
  for (const FittedValue& v : f.values)
    if (v.key == key) return v.value;
  ADD_FAILURE() << key << " not fitted";
  return -1;
}

TEST(CalibrateFit, RecoversHostAndLibraryCostsFromBackToBackCalls) {
  const std::vector<std::string> host = {"cluster.device.host.per_rank_slowdown=0.2"};
  std::vector<std::string> truth = host;
  truth.insert(truth.end(),
               {"cluster.device.host.collective_issue_us=30", "cluster.library.call_overhead_us=10",
                "cluster.links.nvswitch.bandwidth_gbytes_per_s=80"});
  std::vector<std::string> start = host;
  start.insert(start.end(), {"cluster.device.host.collective_issue_us=50",
                             "cluster.library.call_overhead_us=40"});
  std::vector<CollectivePoint> points;
  for (const apps::BenchOp op : {apps::BenchOp::kAllToAll, apps::BenchOp::kAllGather})
    for (const int ranks : {2, 4})
      for (std::int64_t bytes = 1024; bytes <= (std::int64_t{64} << 20); bytes *= 4) {
        CollectivePoint p;
        p.where = "synthetic:" + std::to_string(points.size() + 1);
        p.op = op;
        p.ranks = ranks;
        p.nodes = 1;
        p.bytes = bytes;
        p.time_us = 1;
        points.push_back(p);
      }
  CollectiveFitOptions options;
  options.warmup = 1;
  options.iters = 2;
  options.fit_protocol = false;
  const std::vector<double> us = predict_collectives(fit_cluster(truth), points, options);
  for (size_t i = 0; i < points.size(); ++i) points[i].time_us = us[i];
  // Back to back, the small calls take the host's issue (30 us, measured with every rank
  // issuing: the per-rank slowdown of op issue costs does not scale it), not the library's
  // 10 us plus the messages: the host binds.
  EXPECT_NEAR(points[0].time_us, 30.0, 0.5);

  const FitCluster from = fit_cluster(start);
  const Cluster c = load_cluster_table(from.table, from.source, from.preset_dir, 1);
  const CollectiveFit f = fit_collectives(from, link_knobs(c, from.table), points, options);
  EXPECT_NEAR(value_of(f, "device.host.collective_issue_us"), 30, 0.3);
  EXPECT_NEAR(value_of(f, "library.call_overhead_us"), 10, 0.1);
  EXPECT_NEAR(value_of(f, "links.nvswitch.bandwidth_gbytes_per_s"), 80, 0.8);
  EXPECT_LT(f.rms_log, 1e-3);
}

}  // namespace
}  // namespace cocodiff::calibrate
