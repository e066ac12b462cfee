#pragma once
// The complete cluster file calibrate writes: the base cluster (its preset's keys, with the run
// config's [cluster] keys and every --set over them, and the library preset's keys inlined under
// [library]) with the fitted values in place. It names no preset, so a run can name it directly
// (`cluster.preset = "fit.toml"`), and nothing it was fitted with is lost.
//
//   toml::table t = complete_cluster_table(cfg, preset_dir);
//   set_key(t, "library.call_overhead_us", toml::value<double>(31.2));
//   Cluster c = load_cluster_table(t, "fit.toml", /*min_nodes=*/2);   // as a run would load it
//   write_file_atomic("fit.toml", cluster_file_text(t, "# fitted by ...\n"));

#include <filesystem>
#include <string>
#include <string_view>

#include <toml++/toml.h>

#include "core/config.hpp"
#include "net_models/cluster.hpp"

namespace cocodiff::calibrate {

/// The [cluster] section of cfg made complete (see above). ConfigError as load_cluster.
toml::table complete_cluster_table(const Config& cfg, const std::filesystem::path& preset_dir);

/// Sets the dotted `key` of t to `value`, making the tables on the way.
void set_key(toml::table& t, std::string_view key, const toml::node& value);

/// The cluster a run gets from a preset file holding t (`source` names it in errors), with at
/// least `min_nodes` nodes.
Cluster load_cluster_table(const toml::table& t, const std::string& source,
                           const std::filesystem::path& preset_dir, int min_nodes);

/// t as TOML text, after `header` (comment lines).
std::string cluster_file_text(const toml::table& t, const std::string& header);

}  // namespace cocodiff::calibrate
