// The collective algorithm registry: the built-ins as it lists them, an algorithm a user
// registers running exactly as a built-in does (by the engine option, by a cluster file's
// library key, on the per-message path and the collective level), fallbacks where an algorithm
// cannot run, and the errors for a name taken twice or one nobody registered.

#include <gtest/gtest.h>

#include <mutex>

#include "core/errors.hpp"
#include "emulator/collectives/all_to_all_blocks.hpp"
#include "emulator/collectives/registry.hpp"
#include "net_models/cluster.hpp"
#include "tests/emulator/test_util.hpp"

namespace cocodiff {
namespace {

using emu::collectives::Algorithm;
using emu::collectives::CollectiveKind;
using emu::collectives::GroupShape;
using emu::collectives::Message;
using emu::collectives::Schedule;
using emu::collectives::Sizes;

// A user's all-to-all, written as a built-in is: p-1 rounds, round k sends to r-k and receives
// from r+k (the shift order backwards).
class ReverseShift final : public Schedule {
 public:
  using Schedule::Schedule;
  int rounds() const override { return size() - 1; }
  Message recv(const Sizes& s, int me, int round, int /*k*/) const override {
    return emu::collectives::block_from(s, (me + round + 1) % size(), 0);
  }
  Message send(const Sizes& s, int me, int round, int /*k*/) const override {
    return emu::collectives::block_to(s, (me - round - 1 + size()) % size(), 0);
  }
  std::optional<Copy> own(const Sizes& s, int me) const override {
    return emu::collectives::own_block(s, me);
  }
};

// Registered once for the test program (a registry holds a name once).
void register_reverse() {
  static std::once_flag once;
  std::call_once(once, [] {
    Algorithm a;
    a.kind = CollectiveKind::kAllToAll;
    a.name = "test-reverse";
    a.summary = "p-1 rounds, round k: send to r-k";
    a.make = [](const GroupShape& g) { return std::make_unique<ReverseShift>(g.size); };
    emu::collectives::register_algorithm(std::move(a));
  });
}

TEST(AlgorithmRegistry, ListsTheBuiltInsInOrder) {
  using emu::collectives::algorithm_list;
  EXPECT_EQ(algorithm_list(CollectiveKind::kAllToAll).rfind("shift | xor | concurrent | bruck", 0),
            0u);
  EXPECT_EQ(algorithm_list(CollectiveKind::kAllGather).rfind("ring | hierarchical", 0), 0u);
  EXPECT_EQ(algorithm_list(CollectiveKind::kAllReduce), "ring");
  EXPECT_EQ(algorithm_list(CollectiveKind::kBarrier), "dissemination");
  const auto shift = emu::collectives::find_algorithm(CollectiveKind::kAllToAll, "shift");
  EXPECT_GE(shift, 0);
  EXPECT_EQ(emu::collectives::find_algorithm(CollectiveKind::kAllToAll, "pairwise"), shift);
  EXPECT_EQ(emu::collectives::find_algorithm(CollectiveKind::kAllGather, "shift"), -1);
  const std::vector<std::string> choices = emu::all_to_all_choices();
  EXPECT_EQ(choices.front(), "library");
  EXPECT_NE(std::find(choices.begin(), choices.end(), "pairwise"), choices.end());
}

TEST(AlgorithmRegistry, AnAlgorithmThatCannotRunOnAGroupRunsItsFallback) {
  const auto xor_id = emu::collectives::find_algorithm(CollectiveKind::kAllToAll, "xor");
  const auto s6 = emu::collectives::make_schedule(xor_id, GroupShape{6, {}});
  // Six members: XOR pairing is not defined, the shift order runs (round 0: 0 sends to 1).
  EXPECT_EQ(s6->send(Sizes::uniform(1), 0, 0, 0).peer, 1);
  const auto s8 = emu::collectives::make_schedule(xor_id, GroupShape{8, {}});
  EXPECT_EQ(s8->send(Sizes::uniform(1), 5, 2, 0).peer, 5 ^ 3);
  // Bruck needs equal counts; an all-to-allv runs shift. Hierarchical with no coordinates: ring.
  const auto bruck = emu::collectives::find_algorithm(CollectiveKind::kAllToAll, "bruck");
  EXPECT_EQ(emu::collectives::algorithm(emu::collectives::variable_counts_algorithm(bruck)).name,
            "shift");
  const auto hier = emu::collectives::find_algorithm(CollectiveKind::kAllGather, "hierarchical");
  EXPECT_EQ(emu::collectives::make_schedule(hier, GroupShape{4, {}})->rounds(), 3);
}

TEST(AlgorithmRegistry, AUsersAlgorithmRunsAsABuiltInDoes) {
  register_reverse();
  const Topology topo = test::make_topo(1, 4, 2);
  const auto run = [&](const std::string& algo, bool collective_ops, int workers) {
    emu::EngineOptions o;
    o.workers = workers;
    o.wire_bytes_per_element = 4;
    o.all_to_all_algorithm = algo;
    o.collective_ops = collective_ops;
    emu::Engine e(topo, std::make_unique<AlphaBetaModel>(topo, test::uniform_tiers(3, 1000, 1e9)),
                  test::unit_device(), o);
    std::vector<std::vector<float>> got(8);
    std::mutex mu;
    emu::RunResult r = e.run([&](Communicator& c) {
      const int p = c.size(), count = 3;
      std::vector<float> send(static_cast<size_t>(p * count)), recv(send.size());
      for (int j = 0; j < p; ++j)
        for (int i = 0; i < count; ++i)
          send[static_cast<size_t>(j * count + i)] =
              static_cast<float>(100 * c.rank() + 10 * j + i);
      c.all_to_all(send, recv, count);
      std::lock_guard<std::mutex> lk(mu);
      got[static_cast<size_t>(c.rank())] = recv;
    });
    return std::make_pair(r, got);
  };
  const auto [ref, ref_data] = run("pairwise", true, 1);
  for (bool ops : {true, false})
    for (int workers : {1, 2}) {
      const auto [r, data] = run("test-reverse", ops, workers);
      EXPECT_EQ(data, ref_data);  // block j of rank r is what rank j sent to r
      // Every round crosses the same tiers as the shift order's on a uniform network.
      EXPECT_EQ(r.makespan, ref.makespan);
      EXPECT_EQ(r.bytes_by_tier, ref.bytes_by_tier);
    }
  for (int r = 0; r < 8; ++r)
    for (int j = 0; j < 8; ++j)
      EXPECT_EQ(ref_data[static_cast<size_t>(r)][static_cast<size_t>(j * 3)], 100 * j + 10 * r);
}

TEST(AlgorithmRegistry, AClusterFileNamesAUsersAlgorithm) {
  register_reverse();
  const Config cfg = Config::parse(
      "[cluster]\npreset = \"uniform\"\n[cluster.library]\nall_to_all = \"test-reverse\"\n",
      "run.toml");
  const Cluster c = load_cluster(cfg, COCODIFF_CONFIG_DIR "/clusters");
  EXPECT_EQ(c.library.all_to_all_large, "test-reverse");
}

TEST(AlgorithmRegistry, NamesTakenTwiceOrNeverRegisteredAreConfigErrors) {
  Algorithm a;
  a.kind = CollectiveKind::kAllToAll;
  a.name = "shift";
  a.make = [](const GroupShape& g) { return emu::collectives::make_pairwise_shift(g.size); };
  EXPECT_THROW(emu::collectives::register_algorithm(a), ConfigError);
  a.name = "test-unique";
  a.aliases = {"xor"};
  EXPECT_THROW(emu::collectives::register_algorithm(a), ConfigError);
  a.aliases.clear();
  a.fallback = "nothing";
  EXPECT_THROW(emu::collectives::register_algorithm(a), ConfigError);
  a.fallback.clear();
  a.make = nullptr;
  EXPECT_THROW(emu::collectives::register_algorithm(a), ConfigError);

  const Topology topo = test::make_topo(1, 2, 1);
  emu::EngineOptions o;
  o.all_to_all_algorithm = "library";
  o.library.all_gather = "tree";
  try {
    emu::Engine e(topo, std::make_unique<AlphaBetaModel>(topo, test::uniform_tiers(3, 1000, 1e9)),
                  test::unit_device(), o);
    FAIL() << "an unregistered all-gather was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("\"tree\""), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("ring, hierarchical"), std::string::npos) << e.what();
  }
  o.all_to_all_algorithm = "tree";
  o.library.all_gather = "ring";
  EXPECT_THROW(
      emu::Engine(topo, std::make_unique<AlphaBetaModel>(topo, test::uniform_tiers(3, 1000, 1e9)),
                  test::unit_device(), o),
      ConfigError);
}

}  // namespace
}  // namespace cocodiff
