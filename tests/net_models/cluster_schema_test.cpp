// The cluster-file schema in configs/clusters/README.md against the loader: every key the loader
// reads (from every preset, and from a file with each kind of link) is named in the document.

#include <gtest/gtest.h>

#include <fstream>
#include <regex>
#include <set>
#include <sstream>

#include "net_models/cluster.hpp"

namespace cocodiff {
namespace {

const std::filesystem::path kConfigs(COCODIFF_CONFIG_DIR);

// Every `key` in backquotes in the document, with "{a,b}" expanded.
std::set<std::string> documented_keys() {
  std::ifstream in(kConfigs / "clusters" / "README.md");
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  std::set<std::string> keys;
  const std::regex quoted("`([a-z_.{},A-Z]+)`");
  for (auto it = std::sregex_iterator(text.begin(), text.end(), quoted);
       it != std::sregex_iterator(); ++it) {
    const std::string k = (*it)[1];
    const size_t open = k.find('{');
    const size_t close = k.find('}');
    if (open == std::string::npos || close == std::string::npos || close < open) {
      keys.insert(k);
      continue;
    }
    std::stringstream alts(k.substr(open + 1, close - open - 1));
    std::string alt;
    while (std::getline(alts, alt, ',')) keys.insert(k.substr(0, open) + alt + k.substr(close + 1));
  }
  return keys;
}

// The keys the loader asked for while loading `run` (under "cluster."), with the name of each
// link class replaced by NAME.
std::set<std::string> parsed_keys(const Config& run) {
  std::set<std::string> keys;
  const std::regex link_name("^links\\.[^.]+\\.");
  const std::regex kernel_name("^device\\.kernels\\.[^.]+\\.");
  for (const std::string& k : run.known_keys()) {
    if (k.rfind("cluster.", 0) != 0) continue;
    const std::string key = std::regex_replace(k.substr(8), link_name, "links.NAME.");
    const std::regex host_op("^device\\.host\\.ops\\.[^.]+$");
    const std::regex host_kernel("^device\\.host\\.kernels\\.[^.]+$");
    const std::regex group("^device\\.overlap_by_group\\.[0-9]+\\.");
    keys.insert(std::regex_replace(
        std::regex_replace(
            std::regex_replace(std::regex_replace(key, kernel_name, "device.kernels.NAME."),
                               host_op, "device.host.ops.LABEL"),
            host_kernel, "device.host.kernels.CLASS"),
        group, "device.overlap_by_group.N."));
  }
  return keys;
}

TEST(ClusterSchema, EveryParsedKeyIsDocumented) {
  const std::set<std::string> documented = documented_keys();
  ASSERT_GT(documented.size(), 30u) << "configs/clusters/README.md not found or empty";
  std::set<std::string> parsed;
  auto load = [&](const std::string& text) {
    Config cfg = Config::parse(text, "run.toml");
    load_cluster(cfg, kConfigs / "clusters");
    for (const std::string& k : parsed_keys(cfg)) parsed.insert(k);
  };
  // h100-shm: a switch with a per-pair bandwidth.
  for (const char* preset : {"aurora", "hgx-h100", "hgx-h200", "h100-shm", "h200-shm", "uniform"})
    load(std::string("[cluster]\npreset = \"") + preset + "\"\nnodes = 2\n");
  // A whole description inline, with a `direct` link class (no preset uses one).
  load(R"([cluster]
name = "inline"
[cluster.topology]
levels = ["gpu"]
sizes = [2]
tiers = ["intra-node"]
[cluster.links.bridge]
kind = "direct"
pairs = ["0-1"]
bandwidth_gbytes_per_s = 10
latency_ns = 100
[cluster.device]
peak_tflops = 1
hbm_gbytes_per_s = 1
[cluster.device.host]
framework = "compiled"
[cluster.device.host.kernels]
rms_norm_unfused = 99
[cluster.device.kernels.q_proj]
flops = [1e9, 4e9]
time_us = [10.0, 30.0]
source = "a kernel table by label; no shipped preset keeps one, they are timed by grids"
)");
  // The library files (configs/libraries/*.toml) hold keys of [library] too.
  for (const auto& e : std::filesystem::directory_iterator(kConfigs / "libraries")) {
    if (e.path().extension() != ".toml") continue;
    const Config lib = Config::load(e.path());
    for (const auto& [key, value] : lib.table()) parsed.insert("library." + std::string(key.str()));
  }
  parsed.erase("");
  // A table the loader asks for by name ("is there a [nic]?") is documented by its keys.
  const auto documented_table = [&](const std::string& k) {
    const auto next = documented.upper_bound(k + ".");
    return next != documented.end() && next->rfind(k + ".", 0) == 0;
  };
  for (const std::string& k : parsed) {
    if (documented_table(k)) continue;
    EXPECT_TRUE(documented.count(k) != 0)
        << "the cluster loader reads '" << k
        << "' but configs/clusters/README.md does not document it";
  }
  // The document names no section key the loader never reads (no stale entry after a rename).
  for (const std::string& k : documented)
    for (const char* section : {"topology.", "links.NAME.", "nic.", "fabric.", "device."})
      if (k.rfind(section, 0) == 0) {
        EXPECT_TRUE(parsed.count(k) != 0) << "documented but never read: '" << k << "'";
      }
}

}  // namespace
}  // namespace cocodiff
