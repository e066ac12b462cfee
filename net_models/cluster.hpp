#pragma once
// A cluster from its TOML description: topology, link graph, network model and device model.
// A run config names a preset under [cluster] and may override any of its keys; the preset's
// numbers stay data (configs/clusters/*.toml, each with its source).
//
//   Config cfg = Config::load("configs/quickstart.toml");   // [cluster] preset = "aurora"
//   cfg.set("cluster.nodes=4");
//   Cluster c = load_cluster(cfg, std::filesystem::path(COCODIFF_CONFIG_DIR) / "clusters");
//   emu::Engine engine(c.topology, std::move(c.network), c.device);
//
// Keys of [cluster] (a preset file holds the same keys at its top level):
//   preset       name (resolved as <config dir>/clusters/NAME.toml, then <preset_dir>/NAME.toml)
//                or a path to a .toml file (relative to the config's directory); when absent the
//                [cluster] section itself is the whole description
//   nodes        node count >= 1 (default: the preset's `nodes`, else 1)
//   network      "maxmin" (flow-level max-min sharing, default) | "alpha-beta" (no contention)
//   name, description
//   topology.levels/sizes/tiers  levels below the node, innermost first: ["tile","gpu"], [2,6],
//                ["die-to-die","intra-node"]; topology.node_tier names the node-to-node tier
//   links.NAME.* a class of links inside every node: kind = "pair" (a direct link between every
//                two ranks that differ only at `level`), "switch" (one switch per group of ranks
//                sharing all coordinates above `level`, a link from each rank to it) or "direct"
//                (pairs = ["0-1", ...] of local ranks); bandwidth_gbytes_per_s per direction,
//                latency_ns, count (bundled links), tier (for reports)
//   nic.*        count per node, rank_nic (NIC of each local rank; default rank mod count),
//                bandwidth_gbytes_per_s, latency_ns (NIC <-> fabric),
//                attach_bandwidth_gbytes_per_s, attach_latency_ns (rank <-> NIC)
//   fabric.*     kind = "nonblocking" (a core that never limits), latency_ns (crossing it)
//   device.*     name, peak_tflops, hbm_gbytes_per_s, launch_overhead_ns,
//                compute_efficiency.{gemm,attention,norm,elementwise,copy}, memory_efficiency.*

#include <filesystem>
#include <memory>
#include <string>

#include "core/config.hpp"
#include "core/topology.hpp"
#include "net_models/cluster_graph.hpp"
#include "net_models/device_model.hpp"
#include "net_models/network_model.hpp"

namespace cocodiff {

struct Cluster {
  std::string name;          // "aurora"
  std::string description;   // one line from the preset
  std::string source;        // the preset file, or the run config when the cluster is inline
  std::string network_kind;  // "maxmin" | "alpha-beta"
  Topology topology;
  std::shared_ptr<const ClusterGraph> graph;
  std::unique_ptr<NetworkModel> network;  // a fresh model with no flows
  std::shared_ptr<const DeviceModel> device;
  RooflineParams device_params;
};

/// Reads the [cluster] section of cfg, layered over its preset (keys in cfg and --set win).
/// Marks the keys it reads as used in cfg, and throws ConfigError naming file:line and key for
/// any bad value, unknown key of the cluster section or preset, or unknown preset.
Cluster load_cluster(const Config& cfg, const std::filesystem::path& preset_dir);

/// A network model of `kind` ("maxmin" | "alpha-beta") over graph; ConfigError otherwise.
std::unique_ptr<NetworkModel> make_network_model(const std::string& kind,
                                                 std::shared_ptr<const ClusterGraph> graph);

/// Loads `file_or_preset` as a run config; a file without a [cluster] table is taken to be a
/// cluster preset itself, and a bare name ("aurora") a preset in preset_dir: both are wrapped as
/// `[cluster] preset = "<file>"`, so --set cluster.KEY works the same on all three.
Config load_cluster_config(const std::string& file_or_preset,
                           const std::filesystem::path& preset_dir);

/// The file a preset name or path resolves to (see `preset` above); ConfigError if none.
std::filesystem::path resolve_cluster_preset(const std::string& name_or_path,
                                             const std::filesystem::path& config_dir,
                                             const std::filesystem::path& preset_dir,
                                             const std::string& where);

}  // namespace cocodiff
