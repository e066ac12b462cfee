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
// Every key of [cluster] (a preset file holds the same keys at its top level), with its unit,
// default and what it models: configs/clusters/README.md (a test checks it against this loader).

#include <filesystem>
#include <memory>
#include <string>
#include <string_view>

#include "core/config.hpp"
#include "core/topology.hpp"
#include "net_models/cluster_graph.hpp"
#include "net_models/collective_model.hpp"
#include "net_models/device_model.hpp"
#include "net_models/network_model.hpp"

namespace cocodiff {

/// The link class of a switch's per-pair links (links.NAME.pair_bandwidth_gbytes_per_s) is the
/// switch's name with this suffix ("nvlink.pair").
inline constexpr std::string_view kPairLinkSuffix = ".pair";

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
  LibraryModel library;  // free (`ideal`) unless the description has a [library] section
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

/// The file a preset name or path resolves to: a name (no '/', no .toml) is a file of
/// config_dir/clusters or preset_dir; a path is taken relative to config_dir (the run config's
/// directory), then to the working directory. ConfigError naming every place looked in if none.
std::filesystem::path resolve_cluster_preset(const std::string& name_or_path,
                                             const std::filesystem::path& config_dir,
                                             const std::filesystem::path& preset_dir,
                                             const std::string& where);

}  // namespace cocodiff
