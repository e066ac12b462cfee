#pragma once
// Small clusters for emulator tests: a 3-level topology with alpha-beta tiers; and the check
// that two runs give one timeline.

#include <gtest/gtest.h>

#include <filesystem>
#include <memory>
#include <string>

#include "core/config.hpp"
#include "emulator/engine.hpp"
#include "net_models/cluster.hpp"
#include "net_models/device_model.hpp"
#include "net_models/network_model.hpp"

namespace cocodiff::test {

/// tiles x gpus x nodes, tiers with the given latencies (ns) and bandwidths (bytes/s).
inline Topology make_topo(int tiles, int gpus, int nodes) {
  return Topology(
      {{"tile", tiles, "die-to-die"}, {"gpu", gpus, "intra-node"}, {"node", nodes, "inter-node"}});
}

/// A device that runs 1 FLOP per ns (1 GFLOP/s) and 1 byte per ns, no launch overhead.
inline std::shared_ptr<DeviceModel> unit_device() {
  RooflineParams p;
  p.name = "unit";
  p.peak_flops_per_s = 1e9;
  p.hbm_bytes_per_s = 1e9;
  return std::make_shared<RooflineDevice>(p);
}

inline emu::Engine make_engine(const Topology& topo, std::vector<LinkCost> tiers, int workers,
                               double wire_bytes = 4) {
  emu::EngineOptions o;
  o.workers = workers;
  o.wire_bytes_per_element = wire_bytes;
  return emu::Engine(topo, std::make_unique<AlphaBetaModel>(topo, std::move(tiers)), unit_device(),
                     o);
}

inline std::vector<LinkCost> uniform_tiers(int n, std::int64_t latency_ns, double bytes_per_s) {
  return std::vector<LinkCost>(static_cast<size_t>(n),
                               LinkCost{SimTime::from_ns(latency_ns), bytes_per_s});
}

/// `nodes` Aurora nodes (12 tiles each) from the cluster presets in `presets`, under the preset's
/// network model (max-min), with `o`.
inline emu::Engine aurora_engine(const std::filesystem::path& presets, int nodes,
                                 emu::EngineOptions o) {
  const Config cfg = Config::parse(
      "[cluster]\npreset = \"aurora\"\nnodes = " + std::to_string(nodes) + "\n", "run.toml");
  Cluster c = load_cluster(cfg, presets);
  return emu::Engine(c.topology, std::move(c.network), c.device, std::move(o));
}

/// Two runs give the same timeline: virtual times, accounting, bytes, flows, events and hash.
inline void expect_same_timeline(const emu::RunResult& a, const emu::RunResult& b) {
  EXPECT_EQ(a.makespan, b.makespan);
  EXPECT_EQ(a.rank_end, b.rank_end);
  EXPECT_EQ(a.rank_compute, b.rank_compute);
  EXPECT_EQ(a.rank_exposed, b.rank_exposed);
  EXPECT_EQ(a.bytes_by_tier, b.bytes_by_tier);
  EXPECT_EQ(a.flows, b.flows);
  EXPECT_EQ(a.events, b.events);
  EXPECT_EQ(a.timeline_sha256, b.timeline_sha256);
}

}  // namespace cocodiff::test
