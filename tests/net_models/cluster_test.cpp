// Cluster presets: every preset loads with the expected shape, routes and device; run-config
// and --set values override the preset; bad values are ConfigErrors naming file:line and key.

#include <gtest/gtest.h>

#include <fstream>

#include "core/errors.hpp"
#include "net_models/cluster.hpp"
#include "net_models/maxmin_model.hpp"

namespace cocodiff {
namespace {

const std::filesystem::path kPresets = std::filesystem::path(COCODIFF_CONFIG_DIR) / "clusters";

Cluster load(const std::string& preset, std::vector<std::string> sets = {}) {
  Config cfg = Config::parse("[cluster]\npreset = \"" + preset + "\"\n", "run.toml");
  for (const std::string& s : sets) cfg.set(s);
  return load_cluster(cfg, kPresets);
}

// Writes a preset file and returns its path.
std::filesystem::path write(const std::string& name, const std::string& text) {
  std::filesystem::path p = std::filesystem::path(testing::TempDir()) / name;
  std::ofstream(p) << text;
  return p;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "(no ConfigError)";
}

// A minimal valid preset: 2 GPUs per node on a switch, one NIC per GPU.
const std::string kSmall = R"(name = "small"
[topology]
levels = ["gpu"]
sizes = [2]
tiers = ["intra-node"]
[links.sw]
kind = "switch"
level = "gpu"
bandwidth_gbytes_per_s = 100
latency_ns = 100
[nic]
count = 2
bandwidth_gbytes_per_s = 10
latency_ns = 100
attach_bandwidth_gbytes_per_s = 20
attach_latency_ns = 100
[fabric]
latency_ns = 100
[device]
peak_tflops = 1
hbm_gbytes_per_s = 1
)";

TEST(Presets, EveryPresetLoads) {
  for (const auto& e : std::filesystem::directory_iterator(kPresets)) {
    if (e.path().extension() != ".toml") continue;  // README.md: the schema
    SCOPED_TRACE(e.path().string());
    for (int nodes : {1, 2, 8}) {
      Cluster c = load(e.path().stem().string(), {"cluster.nodes=" + std::to_string(nodes)});
      EXPECT_EQ(c.topology.num_nodes(), nodes);
      EXPECT_EQ(c.name, e.path().stem().string());
      EXPECT_FALSE(c.graph->find_unreachable_pair().has_value());
      EXPECT_GT(c.device_params.peak_flops_per_s, 0);
      ASSERT_NE(c.network, nullptr);
      EXPECT_EQ(c.network->name(), "maxmin");
    }
  }
}

TEST(Presets, AuroraShapeRoutesAndDevice) {
  Cluster c = load("aurora", {"cluster.nodes=8"});
  EXPECT_EQ(c.topology.num_ranks(), 96);
  EXPECT_EQ(c.topology.ranks_per_node(), 12);
  EXPECT_EQ(c.topology.tier_name(0), "die-to-die");
  EXPECT_EQ(c.topology.tier_name(1), "intra-node");
  EXPECT_EQ(c.topology.tier_name(2), "inter-node");
  RouteTable routes(c.graph);
  auto class_of = [&](int l) { return c.graph->link_class(c.graph->link(l).link_class).name; };
  // Tile 0 -> tile 1 of GPU 0: MDFI.
  ASSERT_EQ(routes.route(0, 1).size(), 1u);
  EXPECT_EQ(class_of(routes.route(0, 1)[0]), "mdfi");
  EXPECT_DOUBLE_EQ(routes.summary(0, 1).bottleneck_bytes_per_s, 196e9);
  // Tile 0 of GPU 0 -> tile 0 of GPU 3: one Xe link.
  ASSERT_EQ(routes.route(0, 6).size(), 1u);
  EXPECT_EQ(class_of(routes.route(0, 6)[0]), "xe-link");
  EXPECT_DOUBLE_EQ(routes.summary(0, 6).bottleneck_bytes_per_s, 15e9);
  // Tile 0 of GPU 0 -> tile 1 of GPU 3: MDFI + Xe link, 1000 + 1500 ns.
  EXPECT_EQ(routes.route(0, 7).size(), 2u);
  EXPECT_EQ(routes.summary(0, 7).latency.ns(), 2500);
  // Node 0 -> node 5: attach, NIC, fabric, NIC, attach = 500 + 1000 + 1500 + 1000 + 500 ns.
  const auto r = routes.route(0, 5 * 12 + 4);
  ASSERT_EQ(r.size(), 5u);
  EXPECT_EQ(class_of(r[0]), "nic-attach");
  EXPECT_EQ(class_of(r[2]), "fabric");
  EXPECT_EQ(routes.summary(0, 64).latency.ns(), 4500);
  EXPECT_DOUBLE_EQ(routes.summary(0, 64).bottleneck_bytes_per_s, 25e9);
  // Local rank 4 (GPU 2, tile 0) uses NIC 0, like local rank 0 (the preset's rank_nic).
  EXPECT_EQ(c.graph->vertex(c.graph->link(routes.route(4, 64)[0]).to).name, "n0.nic0");
  EXPECT_DOUBLE_EQ(c.device_params.peak_flops_per_s, 273e12);
  EXPECT_DOUBLE_EQ(c.device_params.hbm_bytes_per_s, 1638.4e9);
  EXPECT_EQ(c.device_params.launch_overhead.ns(), 5000);
  EXPECT_DOUBLE_EQ(c.device_params.compute_efficiency[static_cast<size_t>(OpKind::kAttention)],
                   0.6);
}

TEST(Presets, HgxUsesNvswitchInsideAndOneNicPerGpu) {
  Cluster c = load("hgx-h100", {"cluster.nodes=2"});
  EXPECT_EQ(c.topology.num_ranks(), 16);
  RouteTable routes(c.graph);
  EXPECT_EQ(routes.route(0, 7).size(), 2u);  // GPU -> NVSwitch -> GPU
  EXPECT_DOUBLE_EQ(routes.summary(0, 7).bottleneck_bytes_per_s, 370e9);
  EXPECT_DOUBLE_EQ(routes.summary(3, 11).bottleneck_bytes_per_s, 48e9);
  EXPECT_EQ(c.graph->vertex(c.graph->link(routes.route(3, 11)[0]).to).name, "n0.nic3");
  Cluster h200 = load("hgx-h200");
  EXPECT_DOUBLE_EQ(h200.device_params.hbm_bytes_per_s, 4800e9);
  EXPECT_DOUBLE_EQ(c.device_params.hbm_bytes_per_s, 3350e9);
}

// The case that routing by fewest hops, then latency, got wrong: two GPUs share one NIC and
// NVLink's latency (700 ns to the switch, 1400 ns GPU to GPU) is above the NIC attach's (500 ns
// each way), so GPU -> NIC -> GPU (two hops, 25 GB/s) beat GPU -> NVSwitch -> GPU (two hops,
// 240 GB/s). Routes now keep to the pair's tier, and bandwidth counts.
TEST(Routing, SharedNicIntraNodeRouteUsesNvlink) {
  Cluster c = load("hgx-h100", {"cluster.nodes=2", "cluster.links.nvlink.latency_ns=700",
                                "cluster.links.nvlink.bandwidth_gbytes_per_s=240",
                                "cluster.nic.count=1", "cluster.nic.rank_nic=[0,0,0,0,0,0,0,0]",
                                "cluster.nic.attach_bandwidth_gbytes_per_s=25"});
  RouteTable routes(c.graph);
  const std::span<const int> r = routes.route(0, 1);
  ASSERT_EQ(r.size(), 2u);
  for (int l : r) EXPECT_EQ(c.graph->link_class(c.graph->link(l).link_class).name, "nvlink");
  EXPECT_DOUBLE_EQ(routes.summary(0, 1).bottleneck_bytes_per_s, 240e9);
  EXPECT_EQ(routes.summary(0, 1).latency.ns(), 1400);
  EXPECT_FALSE(c.graph->link_outside_tier(0, 1, r).has_value());
  // Across nodes the route still leaves through the shared NIC: that is the pair's tier.
  const std::span<const int> across = routes.route(0, 9);
  EXPECT_EQ(c.graph->link_class(c.graph->link(across[0]).link_class).name, "nic-attach");
  EXPECT_FALSE(c.graph->link_outside_tier(0, 9, across).has_value());
}

// Where no link of the pair's tier exists (the uniform test cluster has no links inside a
// node), the route leaves the tier and link_outside_tier names the first link that does.
TEST(Routing, RouteOutsideItsTierIsReported) {
  Cluster c = load("uniform");
  RouteTable routes(c.graph);
  const std::span<const int> r = routes.route(0, 1);
  const std::optional<int> l = c.graph->link_outside_tier(0, 1, r);
  ASSERT_TRUE(l.has_value());
  EXPECT_EQ(c.graph->link_class(c.graph->link(*l).link_class).name, "nic-attach");
}

// Among routes on the same tiers, the faster one for a 1 MiB message wins, not the one with the
// lower latency: a slow, low-latency direct link loses to a fast switch two hops away.
TEST(Routing, BandwidthBreaksTiesBetweenRoutesOnOneTier) {
  const std::filesystem::path p = write("two_paths.toml", kSmall + R"(
[links.slow]
kind = "direct"
pairs = ["0-1"]
bandwidth_gbytes_per_s = 1
latency_ns = 10
tier = "intra-node"
)");
  Config cfg = Config::parse("[cluster]\npreset = \"" + p.string() + "\"\n", "run.toml");
  Cluster c = load_cluster(cfg, kPresets);
  RouteTable routes(c.graph);
  const std::span<const int> r = routes.route(0, 1);
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(c.graph->link_class(c.graph->link(r[0]).link_class).name, "sw");
}

// A switch with a per-pair bandwidth is a crossbar: rank -> its port -> the peer's port -> peer.
// One transfer alone moves at the lesser of the link and the pair bandwidth; transfers from one
// rank to three peers at once share its link (closed forms of max-min sharing).
TEST(Presets, SwitchWithAPerPairBandwidthCapsEachPairAndSharesEachRanksLink) {
  std::string text = kSmall;
  text.replace(text.find("sizes = [2]"), 11, "sizes = [4]");
  text.replace(text.find("count = 2"), 9, "count = 4");
  const auto p = write("crossbar.toml", text);
  Config cfg = Config::parse("[cluster]\npreset = \"" + p.string() +
                                 "\"\n[cluster.links.sw]\npair_bandwidth_gbytes_per_s = 40\n",
                             "run.toml");
  Cluster c = load_cluster(cfg, kPresets);
  RouteTable routes(c.graph);
  const std::span<const int> r = routes.route(0, 3);
  ASSERT_EQ(r.size(), 3u);
  EXPECT_EQ(c.graph->link_class(c.graph->link(r[1]).link_class).name, "sw.pair");
  EXPECT_DOUBLE_EQ(routes.summary(0, 3).bottleneck_bytes_per_s, 40e9);
  EXPECT_EQ(routes.summary(0, 3).latency.ns(), 200);  // the pair link adds none
  EXPECT_FALSE(c.graph->link_outside_tier(0, 3, r).has_value());

  const std::int64_t mib = 1 << 20;
  {  // alone: 200 ns + 1 MiB / 40 GB/s
    MaxMinModel net(c.graph);
    net.add_flow(0, 0, 3, mib, SimTime{});
    std::vector<std::uint64_t> done;
    while (net.active_flows() > 0) net.advance_to(net.next_event_time(), done);
    EXPECT_NEAR(net.now().ns(), 200 + mib / 40.0, 1.0);
  }
  {  // to three peers at once: each at 100 / 3 GB/s (below 40), all end together
    MaxMinModel net(c.graph);
    for (int d = 1; d <= 3; ++d) net.add_flow(static_cast<std::uint64_t>(d), 0, d, mib, SimTime{});
    std::vector<std::uint64_t> done;
    while (net.active_flows() > 0) net.advance_to(net.next_event_time(), done);
    EXPECT_EQ(done.size(), 3u);
    EXPECT_NEAR(net.now().ns(), 200 + 3.0 * mib / 100.0, 1.0);
  }
  // A per-pair bandwidth belongs to a switch.
  const auto q = write("pair_on_direct.toml", kSmall +
                                                  "[links.bridge]\nkind = \"direct\"\n"
                                                  "pairs = [\"0-1\"]\n"
                                                  "bandwidth_gbytes_per_s = 5\nlatency_ns = 1\n"
                                                  "pair_bandwidth_gbytes_per_s = 2\n");
  const std::string e = error_of([&] { load(q.string()); });
  EXPECT_NE(e.find(q.string() + ":27"), std::string::npos) << e;
  EXPECT_NE(e.find("links.bridge.pair_bandwidth_gbytes_per_s"), std::string::npos) << e;
  EXPECT_NE(e.find("it is a switch's"), std::string::npos) << e;
}

TEST(Presets, RunConfigAndSetOverrideThePreset) {
  Config cfg = Config::parse(
      "[cluster]\npreset = \"aurora\"\nnodes = 3\nnetwork = \"alpha-beta\"\n"
      "[cluster.links.mdfi]\nlatency_ns = 42\n",
      "run.toml");
  cfg.set("cluster.links.xe-link.bandwidth_gbytes_per_s=30");
  Cluster c = load_cluster(cfg, kPresets);
  EXPECT_EQ(c.topology.num_nodes(), 3);
  EXPECT_EQ(c.network->name(), "alpha-beta");
  RouteTable routes(c.graph);
  EXPECT_EQ(routes.summary(0, 1).latency.ns(), 42);
  EXPECT_DOUBLE_EQ(routes.summary(0, 6).bottleneck_bytes_per_s, 30e9);
  EXPECT_DOUBLE_EQ(routes.summary(0, 1).bottleneck_bytes_per_s, 196e9);  // untouched
  EXPECT_NO_THROW(cfg.check_no_unknown_keys());  // every cluster key was read
}

TEST(Presets, AClusterFileIsItsOwnConfig) {
  const auto p = write("small.toml", kSmall);
  Config cfg = load_cluster_config(p.string(), kPresets);
  cfg.set("cluster.nodes=3");
  Cluster c = load_cluster(cfg, kPresets);
  EXPECT_EQ(c.name, "small");
  EXPECT_EQ(c.topology.num_ranks(), 6);
  // An inline cluster (no preset) works too.
  std::string text = "[cluster]\n" + kSmall;
  for (size_t at = text.find("\n["); at != std::string::npos; at = text.find("\n[", at + 1))
    text.insert(at + 2, "cluster.");
  Config inline_cfg = Config::parse(text, "inline.toml");
  EXPECT_EQ(load_cluster(inline_cfg, kPresets).topology.num_ranks(), 2);
  // A bare preset name works as a config too.
  Config named = load_cluster_config("hgx-h200", kPresets);
  EXPECT_EQ(load_cluster(named, kPresets).name, "hgx-h200");
}

TEST(PresetErrors, ZeroBandwidthNamesWhereAndKey) {
  std::string e = error_of([] { load("aurora", {"cluster.links.mdfi.bandwidth_gbytes_per_s=0"}); });
  EXPECT_NE(e.find("--set cluster.links.mdfi.bandwidth_gbytes_per_s"), std::string::npos) << e;
  EXPECT_NE(e.find("bandwidth > 0"), std::string::npos) << e;
  // The same mistake inside a preset file names its file and line.
  std::string text = kSmall;
  text.replace(text.find("bandwidth_gbytes_per_s = 10\n"), 28, "bandwidth_gbytes_per_s = 0\n");
  const auto p = write("zero.toml", text);
  e = error_of([&] { load(p.string()); });
  EXPECT_NE(e.find(p.string() + ":13"), std::string::npos) << e;
  EXPECT_NE(e.find("nic.bandwidth_gbytes_per_s"), std::string::npos) << e;
}

TEST(PresetErrors, LinkToARankThatDoesNotExist) {
  const auto p = write("nowhere.toml", kSmall +
                                           "[links.extra]\nkind = \"direct\"\n"
                                           "pairs = [\"0-1\", \"1-2\"]\n"
                                           "bandwidth_gbytes_per_s = 5\nlatency_ns = 1\n");
  std::string e = error_of([&] { load(p.string()); });
  EXPECT_NE(e.find(p.string() + ":24"), std::string::npos) << e;
  EXPECT_NE(e.find("links.extra.pairs"), std::string::npos) << e;
  EXPECT_NE(e.find("local rank 2 does not exist"), std::string::npos) << e;
  e = error_of([] { load("aurora", {"cluster.nic.rank_nic=[0,1,2,3,4,5,6,7,8,0,1,2]"}); });
  EXPECT_NE(e.find("that NIC does not exist"), std::string::npos) << e;
  e = error_of([] { load("aurora", {"cluster.links.mdfi.level=socket"}); });
  EXPECT_NE(e.find("tile | gpu"), std::string::npos) << e;
}

TEST(PresetErrors, BadNodesUnknownPresetUnknownKeyAndDisconnectedNodes) {
  std::string e = error_of([] { load("aurora", {"cluster.nodes=0"}); });
  EXPECT_NE(e.find("--set cluster.nodes"), std::string::npos) << e;
  e = error_of([] { load("summit"); });
  EXPECT_NE(e.find("run.toml:2"), std::string::npos) << e;
  EXPECT_NE(e.find("aurora"), std::string::npos) << e;  // lists the known presets
  EXPECT_NE(e.find("\"summit\""), std::string::npos) << e;
  e = error_of([] { load("aurora", {"cluster.links.mdfi.bandwith_gbytes_per_s=3"}); });
  EXPECT_NE(e.find("unknown key 'cluster.links.mdfi.bandwith_gbytes_per_s'"), std::string::npos)
      << e;
  std::string text = kSmall;
  text.insert(text.find("[nic]"), "typo = 1\n");
  const auto typo = write("typo.toml", text);
  e = error_of([&] { load(typo.string()); });
  EXPECT_NE(e.find(typo.string() + ":11: unknown key 'links.sw.typo'"), std::string::npos) << e;
  std::string no_nic = kSmall.substr(0, kSmall.find("[nic]")) +
                       "[device]\npeak_tflops = 1\n"
                       "hbm_gbytes_per_s = 1\n";
  const auto island = write("island.toml", no_nic);
  e = error_of([&] { load(island.string(), {"cluster.nodes=2"}); });
  EXPECT_NE(e.find("has no route"), std::string::npos) << e;
  e = error_of([] { load("aurora", {"cluster.device.compute_efficiency.gemm=1.5"}); });
  EXPECT_NE(e.find("efficiency in [1e-6, 1]"), std::string::npos) << e;
  // A denormal efficiency is refused by its own key, not blamed later on device.peak_tflops.
  e = error_of([] { load("aurora", {"cluster.device.compute_efficiency.gemm=1e-320"}); });
  EXPECT_NE(e.find("cluster.device.compute_efficiency.gemm"), std::string::npos) << e;
  EXPECT_EQ(e.find("peak_tflops"), std::string::npos) << e;
  e = error_of([] { load("aurora", {"cluster.network=fluid"}); });
  EXPECT_NE(e.find("maxmin | alpha-beta"), std::string::npos) << e;
}

}  // namespace
}  // namespace cocodiff
