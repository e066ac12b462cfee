// The models driving the emulator: closed-form all-to-all times on the uniform preset, exact
// bytes per tier, congestion that alpha-beta ignores, the hierarchical all-to-all against the
// flat one on real data, and a 96-rank max-min run whose timeline does not depend on workers.

#include <gtest/gtest.h>

#include "emulator/engine.hpp"
#include "net_models/cluster.hpp"
#include "net_models/hierarchical_a2a.hpp"

namespace cocodiff {
namespace {

const std::filesystem::path kPresets = std::filesystem::path(COCODIFF_CONFIG_DIR) / "clusters";

Cluster load(const std::string& preset, std::vector<std::string> sets = {}) {
  Config cfg = Config::parse("[cluster]\npreset = \"" + preset + "\"\n", "run.toml");
  for (const std::string& s : sets) cfg.set(s);
  return load_cluster(cfg, kPresets);
}

emu::Engine engine_for(Cluster& c, int workers, const std::string& algo = "pairwise") {
  emu::EngineOptions o;
  o.workers = workers;
  o.wire_bytes_per_element = 4;
  o.all_to_all_algorithm = algo;
  o.trace = false;
  return emu::Engine(c.topology, std::move(c.network), c.device, o);
}

// Uniform preset: alpha = 2000 ns, beta = 0.1 ns per byte between any two of its 8 ranks.
constexpr std::int64_t kAlphaNs = 2000;
constexpr std::int64_t kCount = 2500;        // floats per block
constexpr std::int64_t kBlockBytes = 10000;  // at 4 wire bytes per float
constexpr std::int64_t kBlockNs = 1000;      // kBlockBytes at 10 GB/s

TEST(NetEngine, FlatPairwiseAllToAllIsPMinusOneAlphaPlusNBeta) {
  for (const char* model : {"maxmin", "alpha-beta"}) {
    Cluster c = load("uniform", {std::string("cluster.network=") + model});
    const int p = c.topology.num_ranks();
    ASSERT_EQ(p, 8);
    emu::Engine engine = engine_for(c, 2);
    emu::RunResult r = engine.run([&](Communicator& comm) { comm.all_to_all({}, {}, kCount); });
    // (p-1) alpha + n beta with n = (p-1) blocks per rank.
    EXPECT_EQ(r.makespan.ns(), (p - 1) * kAlphaNs + (p - 1) * kBlockNs) << model;
    // Rank r has 1 peer across die-to-die, 2 across intra-node, 4 across inter-node.
    EXPECT_EQ(r.bytes_by_tier, (std::vector<std::int64_t>{p * 1 * kBlockBytes, p * 2 * kBlockBytes,
                                                          p * 4 * kBlockBytes}))
        << model;
  }
}

TEST(NetEngine, ConcurrentAllToAllSharesTheLinksUnderMaxMinOnly) {
  // Every rank posts its 7 sends at once. Max-min: each uplink and downlink carries 7 equal
  // flows, 10/7 GB/s each, so all end at alpha + 7 blocks / 10 GB/s. Alpha-beta ignores it.
  Cluster mm = load("uniform");
  Cluster ab = load("uniform", {"cluster.network=alpha-beta"});
  auto body = [](Communicator& comm) { comm.all_to_all({}, {}, kCount); };
  EXPECT_EQ(engine_for(mm, 2, "concurrent").run(body).makespan.ns(), kAlphaNs + 7 * kBlockNs);
  EXPECT_EQ(engine_for(ab, 2, "concurrent").run(body).makespan.ns(), kAlphaNs + kBlockNs);
}

TEST(NetEngine, HierarchicalAllToAllIsOnePhasePerLevel) {
  // Three levels of 2: each phase is one pairwise round carrying p/2 blocks:
  // sum_k (s_k - 1) (alpha + (p / s_k) m beta) = 3 (2000 + 4 x 1000) ns.
  Cluster c = load("uniform");
  emu::Engine engine = engine_for(c, 2);
  emu::RunResult r = engine.run([&](Communicator& comm) {
    HierarchicalAllToAll tapa(comm);
    const SimTime t0 = comm.now();
    tapa.run({}, {}, kCount);
    EXPECT_EQ((comm.now() - t0).ns(), 3 * (kAlphaNs + 4 * kBlockNs));
  });
  // Each phase's bytes stay on its tier: p ranks x p/2 blocks per phase, beyond what the
  // splits alone move (their all-gathers).
  emu::RunResult setup = engine.run([](Communicator& comm) { HierarchicalAllToAll tapa(comm); });
  for (size_t k = 0; k < 3; ++k)
    EXPECT_EQ(r.bytes_by_tier[k] - setup.bytes_by_tier[k], 8 * 4 * kBlockBytes) << "tier " << k;
}

float tag(int from, int to, std::int64_t i) {
  return static_cast<float>(from * 100000 + to * 100 + static_cast<int>(i));
}

TEST(NetEngine, HierarchicalAllToAllDeliversWhatTheFlatOneDoes) {
  for (auto [preset, nodes] : {std::pair{"aurora", 2}, {"hgx-h100", 2}, {"uniform", 3}}) {
    SCOPED_TRACE(preset);
    Cluster c = load(preset, {"cluster.nodes=" + std::to_string(nodes)});
    emu::Engine engine = engine_for(c, 2);
    engine.run([&](Communicator& comm) {
      const int p = comm.size(), me = comm.rank();
      const std::int64_t n = 3;
      std::vector<float> send(static_cast<size_t>(p * n)), recv(send.size(), -1);
      for (int j = 0; j < p; ++j)
        for (std::int64_t i = 0; i < n; ++i) send[static_cast<size_t>(j * n + i)] = tag(me, j, i);
      HierarchicalAllToAll tapa(comm);
      tapa.run(send, recv, n);
      for (int j = 0; j < p; ++j)
        for (std::int64_t i = 0; i < n; ++i)
          ASSERT_EQ(recv[static_cast<size_t>(j * n + i)], tag(j, me, i)) << "from " << j;
    });
  }
}

TEST(NetEngine, LastHierarchicalPermutationIsRankOrder) {
  Cluster c = load("aurora", {"cluster.nodes=3"});
  std::vector<std::int64_t> perm = hierarchical_a2a_permutation(c.topology, 3);
  for (size_t i = 0; i < perm.size(); ++i) EXPECT_EQ(perm[i], static_cast<std::int64_t>(i));
  // Before phase 0, the tile digit becomes outermost: block 1 (tile 1 of GPU 0 of node 0)
  // moves to position p/2.
  perm = hierarchical_a2a_permutation(c.topology, 0);
  EXPECT_EQ(perm[perm.size() / 2], 1);
}

TEST(NetEngine, NinetySixRankMaxMinAllToAllIsDeterministic) {
  // 96 tiles (8 Aurora nodes), every pair at once: 9,120 concurrent flows through max-min.
  std::string hash;
  SimTime makespan;
  for (int workers : {1, 2}) {
    Cluster c = load("aurora", {"cluster.nodes=8"});
    emu::Engine engine = engine_for(c, workers, "concurrent");
    emu::RunResult r = engine.run([](Communicator& comm) { comm.all_to_all({}, {}, 16384); });
    EXPECT_EQ(r.flows, 96u * 95u);
    if (workers == 1) {
      hash = r.timeline_sha256;
      makespan = r.makespan;
    } else {
      EXPECT_EQ(r.timeline_sha256, hash);
      EXPECT_EQ(r.makespan, makespan);
    }
  }
  // Contention can only slow things down relative to the congestion-unaware reference.
  Cluster ab = load("aurora", {"cluster.nodes=8", "cluster.network=alpha-beta"});
  emu::Engine engine = engine_for(ab, 2, "concurrent");
  emu::RunResult r = engine.run([](Communicator& comm) { comm.all_to_all({}, {}, 16384); });
  EXPECT_LT(r.makespan, makespan);
}

}  // namespace
}  // namespace cocodiff
