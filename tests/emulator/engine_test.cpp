// The engine's semantics: closed-form alpha-beta times, compute/communication overlap,
// deadlock and mismatch reports, exception propagation, determinism across worker counts, and
// arithmetic handed to the math threads.

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <fstream>
#include <mutex>
#include <random>
#include <regex>
#include <set>
#include <thread>

#include "core/errors.hpp"
#include "tests/emulator/test_util.hpp"

namespace cocodiff {
namespace {

constexpr std::int64_t kAlphaNs = 1000;
constexpr double kBytesPerS = 1e9;  // 1 byte per ns

TEST(EngineTime, PointToPointIsAlphaPlusBetaPerTier) {
  Topology topo = test::make_topo(2, 2, 2);
  // Tier k: latency (k+1) us, bandwidth 10^(9-k) bytes/s.
  std::vector<LinkCost> tiers = {
      {SimTime::from_ns(1000), 1e9}, {SimTime::from_ns(2000), 1e8}, {SimTime::from_ns(3000), 1e7}};
  emu::Engine engine = test::make_engine(topo, tiers, 2);
  const std::int64_t n = 250;   // 1000 bytes
  for (int peer : {1, 2, 4}) {  // tier 0, 1, 2 from rank 0
    emu::RunResult r = engine.run([&](Communicator& c) {
      std::vector<float> buf(n);
      if (c.rank() == 0) c.send(buf, n, peer, 0);
      if (c.rank() == peer) c.recv(buf, n, 0, 0);
    });
    const int tier = topo.tier(0, peer);
    const std::int64_t expect =
        1000 * (tier + 1) +
        static_cast<std::int64_t>(1000 / tiers[static_cast<size_t>(tier)].bandwidth_bytes_per_s *
                                  1e9);
    EXPECT_EQ(r.rank_end[0].ns(), expect) << "tier " << tier;
    EXPECT_EQ(r.rank_end[static_cast<size_t>(peer)].ns(), expect);
    EXPECT_EQ(r.bytes_by_tier[static_cast<size_t>(tier)], 1000);
  }
}

TEST(EngineTime, PairwiseAllToAllIsPMinusOneAlphaPlusNBeta) {
  for (int p : {2, 4, 6}) {
    Topology topo = test::make_topo(1, p, 1);
    emu::Engine engine = test::make_engine(topo, test::uniform_tiers(3, kAlphaNs, kBytesPerS), 2);
    const std::int64_t count = 250;  // m = 1000 bytes per destination, n = (p-1) m in total
    emu::RunResult r = engine.run([&](Communicator& c) {
      std::vector<float> s(static_cast<size_t>(p * count)), d(s.size());
      c.all_to_all(s, d, count);
    });
    const std::int64_t n_bytes = (p - 1) * 1000;
    EXPECT_EQ(r.makespan.ns(), (p - 1) * kAlphaNs + n_bytes) << "p=" << p;
    EXPECT_EQ(r.bytes_by_tier[1], p * n_bytes);
  }
}

TEST(EngineTime, OverlapGivesMaxNotSum) {
  Topology topo = test::make_topo(1, 2, 1);
  emu::Engine engine = test::make_engine(topo, test::uniform_tiers(3, kAlphaNs, kBytesPerS), 1);
  const std::int64_t comm_ns = kAlphaNs + 1000;  // one round of 1000 bytes
  for (std::int64_t compute_ns : {500, 2000, 5000}) {
    emu::RunResult r = engine.run([&](Communicator& c) {
      std::vector<float> s(500), d(500);
      Request req = c.iall_to_all(s, d, 250);
      c.compute({OpKind::kGemm, static_cast<double>(compute_ns), 0, "overlapped"});
      req.wait();
    });
    EXPECT_EQ(r.makespan.ns(), std::max(compute_ns, comm_ns)) << compute_ns;
    EXPECT_EQ(r.rank_compute[0].ns(), compute_ns);
    EXPECT_EQ(r.rank_exposed[0].ns(), std::max<std::int64_t>(0, comm_ns - compute_ns));
  }
}

// A unit device (1 FLOP per ns) whose host spends `op_ns` to issue any op.
RooflineParams unit_params(const std::string& name, std::int64_t op_ns) {
  RooflineParams p;
  p.name = name;
  p.peak_flops_per_s = 1e9;
  p.hbm_bytes_per_s = 1e9;
  p.host.op_issue = SimTime::from_ns(op_ns);
  return p;
}

// A unit device with a host: every op costs the host `op_ns` to issue, ops labelled "cheap" 100
// ns, a collective call `call_ns`.
std::shared_ptr<DeviceModel> host_device(std::int64_t op_ns, std::int64_t call_ns,
                                         double compute_factor = 1.0,
                                         double transfer_factor = 1.0) {
  RooflineParams p = unit_params("unit with a host", op_ns);
  p.host.collective_issue = SimTime::from_ns(call_ns);
  p.host.ops.emplace("cheap", SimTime::from_ns(100));
  p.overlap_compute_factor = compute_factor;
  p.overlap_transfer_factor = transfer_factor;
  return std::make_shared<RooflineDevice>(p);
}

emu::Engine host_engine(const Topology& topo, std::shared_ptr<DeviceModel> device) {
  emu::EngineOptions o;
  o.workers = 1;
  o.wire_bytes_per_element = 4;
  return emu::Engine(
      topo, std::make_unique<AlphaBetaModel>(topo, test::uniform_tiers(3, kAlphaNs, kBytesPerS)),
      std::move(device), o);
}

TEST(EngineHost, HostBoundOpsStartWhenTheHostHasIssuedThem) {
  // Five 200 ns ops, each 1000 ns to issue: the device idles between them.
  Topology topo = test::make_topo(1, 1, 1);
  emu::Engine engine = host_engine(topo, host_device(1000, 0));
  emu::RunResult r = engine.run([](Communicator& c) {
    for (int i = 0; i < 5; ++i) c.compute({OpKind::kGemm, 200, 0, "small"});
  });
  EXPECT_EQ(r.makespan.ns(), 5 * 1000 + 200);
  EXPECT_EQ(r.rank_compute[0].ns(), 5 * 200);
}

TEST(EngineHost, IssueCostsGrowWithTheNodesRanksAndTheHarmonicNumberOfTheRun) {
  // Five host-bound ops of 1000 ns to issue, on every rank, with per_rank_slowdown 0.1 and
  // sync_slowdown 0.6: each costs 1000 x (1 + 0.1 (ranks per node - 1) + 0.6 (H(ranks) - 1)).
  struct Case {
    int gpus, nodes;
    double scale;
  };
  for (const Case k : {Case{1, 1, 1.0}, Case{2, 1, 1.0 + 0.1 + 0.6 * 0.5},
                       Case{4, 1, 1.0 + 0.3 + 0.6 * (1.0 / 2 + 1.0 / 3 + 1.0 / 4)},
                       Case{2, 2, 1.0 + 0.1 + 0.6 * (1.0 / 2 + 1.0 / 3 + 1.0 / 4)}}) {
    RooflineParams p = unit_params("unit with a slowing host", 1000);
    p.host.per_rank_slowdown = 0.1;
    p.host.sync_slowdown = 0.6;
    Topology topo = test::make_topo(1, k.gpus, k.nodes);
    emu::Engine engine = host_engine(topo, std::make_shared<RooflineDevice>(p));
    emu::RunResult r = engine.run([](Communicator& c) {
      for (int i = 0; i < 5; ++i) c.compute({OpKind::kGemm, 200, 0, "small"});
    });
    EXPECT_EQ(r.makespan.ns(), 5 * std::llround(1000 * k.scale) + 200) << k.gpus << "x" << k.nodes;
    EXPECT_DOUBLE_EQ(host_issue_scale(1.0, 0.1, 0.6, k.gpus, k.gpus * k.nodes), k.scale);
  }
}

TEST(EngineHost, TheStepFactorMultipliesEveryOpIssueCostOnTwoOrMoreRanks) {
  // The same five host-bound ops with step_factor 1.5 and sync_slowdown 0.6: on 1 GPU each
  // costs its measured 1000 ns, on 2 GPUs 1.5 x 1000 x (1 + 0.6 (H(2) - 1)), on 4 GPUs
  // 1.5 x 1000 x (1 + 0.6 (H(4) - 1)).
  for (const int gpus : {1, 2, 4}) {
    RooflineParams p = unit_params("unit with a step factor", 1000);
    p.host.sync_slowdown = 0.6;
    p.host.step_factor = 1.5;
    const double scale = gpus == 1   ? 1.0
                         : gpus == 2 ? 1.5 * (1.0 + 0.6 * (1.0 / 2))
                                     : 1.5 * (1.0 + 0.6 * (1.0 / 2 + 1.0 / 3 + 1.0 / 4));
    Topology topo = test::make_topo(1, gpus, 1);
    emu::Engine engine = host_engine(topo, std::make_shared<RooflineDevice>(p));
    emu::RunResult r = engine.run([](Communicator& c) {
      for (int i = 0; i < 5; ++i) c.compute({OpKind::kGemm, 200, 0, "small"});
    });
    EXPECT_EQ(r.makespan.ns(), 5 * std::llround(1000 * scale) + 200) << gpus;
    EXPECT_DOUBLE_EQ(host_issue_scale(1.5, 0.0, 0.6, gpus, gpus), scale);
  }
}

TEST(EngineHost, TheKernelStepFactorMultipliesEveryDeviceTimeBesideTheRanksSpread) {
  // Five device-bound 2000 ns ops (100 ns to issue) with the kernels' step factor 1.25: 2500 ns
  // each on 1 and 4 ranks alike; with a spread of 0.1 on 2 ranks each rank's time is also
  // scaled by its speed (rank_speed_factors), and the run ends with the slower rank.
  for (const int gpus : {1, 4, 2}) {
    RooflineParams p = unit_params("unit with a kernel step factor", 1000);
    p.host.ops.emplace("cheap", SimTime::from_ns(100));
    p.step_factor = 1.25;
    if (gpus == 2) p.rank_spread = 0.1;
    Topology topo = test::make_topo(1, gpus, 1);
    emu::Engine engine = host_engine(topo, std::make_shared<RooflineDevice>(p));
    emu::RunResult r = engine.run([](Communicator& c) {
      for (int i = 0; i < 5; ++i) c.compute({OpKind::kGemm, 2000, 0, "cheap"});
    });
    std::int64_t expected = 100 + 5 * 2500;
    if (gpus == 2) {
      expected = 0;
      for (const double f : rank_speed_factors(2, 0.1))
        expected = std::max<std::int64_t>(expected, 100 + 5 * std::llround(2000.0 * (f * 1.25)));
      EXPECT_NE(expected, 100 + 5 * 2500);
    }
    EXPECT_EQ(r.makespan.ns(), expected) << gpus;
    if (gpus != 2) {
      for (int rank = 0; rank < gpus; ++rank)
        EXPECT_EQ(r.rank_compute[static_cast<size_t>(rank)].ns(), 5 * 2500) << rank;
    }
  }
}

TEST(EngineHost, DeviceBoundOpsQueueBehindEachOther) {
  // Five 2000 ns ops, 100 ns each to issue: the host runs ahead, the device never idles.
  Topology topo = test::make_topo(1, 1, 1);
  emu::Engine engine = host_engine(topo, host_device(1000, 0));
  emu::RunResult r = engine.run([](Communicator& c) {
    for (int i = 0; i < 5; ++i) c.compute({OpKind::kGemm, 2000, 0, "cheap"});
  });
  EXPECT_EQ(r.makespan.ns(), 100 + 5 * 2000);
}

TEST(EngineHost, ABarrierBlocksTheHostUntilItsDeviceHasCaughtUp) {
  // Five 2000 ns ops issued 100 ns apart leave the host 9600 ns ahead of its device. After a
  // barrier the host issues from the device's clock: the next op (1000 ns to issue) starts 1000
  // ns after it, where without the barrier it would start at once.
  Topology topo = test::make_topo(1, 1, 1);
  emu::Engine engine = host_engine(topo, host_device(1000, 0));
  for (const bool barrier : {false, true}) {
    emu::RunResult r = engine.run([&](Communicator& c) {
      for (int i = 0; i < 5; ++i) c.compute({OpKind::kGemm, 2000, 0, "cheap"});
      if (barrier) c.barrier();
      c.compute({OpKind::kGemm, 200, 0, "small"});
    });
    EXPECT_EQ(r.makespan.ns(), 100 + 5 * 2000 + (barrier ? 1000 : 0) + 200) << barrier;
  }
}

TEST(EngineHost, ACollectiveStartsWhenIssuedAndSlowsAndIsSlowedByComputeBesideIt) {
  // The all-to-all (one round of 1000 bytes: t = alpha + 1000 ns) is issued at 3000 ns; the op
  // beside it is issued 100 ns later and runs compute_factor slower; the transfer's part beside
  // the compute runs transfer_factor slower; the wait holds the device, not the host.
  Topology topo = test::make_topo(1, 2, 1);
  const double cf = 1.2, tf = 1.5;
  emu::Engine engine = host_engine(topo, host_device(1000, 3000, cf, tf));
  const std::int64_t t = kAlphaNs + 1000;
  for (const std::int64_t c_ns : {500, 2000, 5000}) {
    emu::RunResult r = engine.run([&](Communicator& c) {
      std::vector<float> s(500), d(500);
      Request req = c.iall_to_all(s, d, 250);
      c.compute({OpKind::kGemm, static_cast<double>(c_ns), 0, "cheap"});
      req.wait();
    });
    const std::int64_t compute = std::llround(static_cast<double>(c_ns) * cf);
    const std::int64_t penalty = std::llround(static_cast<double>(std::min(compute, t)) * (tf - 1));
    EXPECT_EQ(r.makespan.ns(), std::max(3100 + compute, 3000 + t + penalty)) << c_ns;
  }
}

TEST(EngineHost, ATilesCollectivesRunInOrderOnOneStream) {
  // Two all-to-alls of one round (t = alpha + 1000 ns each): A at 0, then C ns of compute beside
  // it, then B, then both waited. A's part beside the compute runs tf slower, so it ends on the
  // stream at t x tf (C >= t); B, which the network finished at C + t, starts on the stream
  // only when A has ended there: the run takes max(C, t x tf) + t.
  Topology topo = test::make_topo(1, 2, 1);
  const double tf = 1.5;
  emu::Engine engine = host_engine(topo, host_device(0, 0, 1.0, tf));
  const std::int64_t t = kAlphaNs + 1000;
  const std::int64_t a_end = std::llround(static_cast<double>(t) * tf);
  for (const std::int64_t c_ns : {t, t + 300, a_end - 1, a_end, a_end + 700}) {
    emu::RunResult r = engine.run([&](Communicator& c) {
      std::vector<float> s(500), d(500), s2(500), d2(500);
      Request a = c.iall_to_all(s, d, 250);
      c.compute({OpKind::kGemm, static_cast<double>(c_ns), 0, "work"});
      Request b = c.iall_to_all(s2, d2, 250);
      a.wait();
      b.wait();
    });
    EXPECT_EQ(r.makespan.ns(), std::max(c_ns, a_end) + t) << c_ns;
    EXPECT_EQ(r.rank_exposed[0].ns(), std::max(c_ns, a_end) + t - c_ns) << c_ns;
  }
}

TEST(EngineHost, ACollectiveTakesTheOverlapFactorsOfItsGroupSize) {
  // Factors for 2-rank groups only (compute 1.2, transfer 1.5; every other size overlaps for
  // free): beside a 2-rank all-to-all the compute and the transfer slow down as in the closed
  // form above; a 4-rank run is the run of a device without overlap factors, event for event.
  RooflineParams p;
  p.name = "unit, factors by group";
  p.peak_flops_per_s = 1e9;
  p.hbm_bytes_per_s = 1e9;
  const auto free_device = std::make_shared<RooflineDevice>(p);
  p.overlap_by_group[2] = {1.2, 1.5};
  const auto device = std::make_shared<RooflineDevice>(p);
  const std::int64_t t = kAlphaNs + 1000;
  for (const std::int64_t c_ns : {500, 5000}) {
    for (const int ranks : {2, 4}) {
      Topology topo = test::make_topo(1, ranks, 1);
      const auto run = [&](std::shared_ptr<DeviceModel> dev) {
        emu::Engine engine = host_engine(topo, std::move(dev));
        return engine.run([&](Communicator& c) {
          std::vector<float> s(250 * static_cast<size_t>(ranks)), d(s.size());
          Request req = c.iall_to_all(s, d, 250);
          c.compute({OpKind::kGemm, static_cast<double>(c_ns), 0, "work"});
          req.wait();
        });
      };
      const emu::RunResult r = run(device);
      if (ranks == 2) {
        const std::int64_t compute = std::llround(static_cast<double>(c_ns) * 1.2);
        const std::int64_t penalty = std::llround(static_cast<double>(std::min(compute, t)) * 0.5);
        EXPECT_EQ(r.rank_compute[0].ns(), compute) << c_ns;
        EXPECT_EQ(r.makespan.ns(), std::max(compute, t + penalty)) << c_ns;
      } else {
        const emu::RunResult free = run(free_device);
        EXPECT_EQ(r.rank_compute[0].ns(), c_ns) << c_ns;
        EXPECT_EQ(r.makespan, free.makespan) << c_ns;
        EXPECT_EQ(r.timeline_sha256, free.timeline_sha256) << c_ns;
      }
    }
  }
}

TEST(EngineHost, EachKindTakesItsShareOfTheComputeFactor) {
  // Compute factor 1.5; an attention takes none of it (weight 0), a norm 0.4, an elementwise op
  // twice (2), a GEMM all (1). Beside an open all-to-all 1000 ns of each cost 1500, 1000, 1200
  // and 2000 ns; after the wait, 1000 each.
  RooflineParams p;
  p.name = "unit, factors by kind";
  p.peak_flops_per_s = 1e9;
  p.hbm_bytes_per_s = 1e9;
  p.overlap_compute_factor = 1.5;
  p.overlap_kind_weight[static_cast<size_t>(OpKind::kAttention)] = 0.0;
  p.overlap_kind_weight[static_cast<size_t>(OpKind::kNorm)] = 0.4;
  p.overlap_kind_weight[static_cast<size_t>(OpKind::kElementwise)] = 2.0;
  Topology topo = test::make_topo(1, 2, 1);
  const auto run = [&](bool beside) {
    emu::Engine engine = host_engine(topo, std::make_shared<RooflineDevice>(p));
    return engine.run([&](Communicator& c) {
      std::vector<float> s(500), d(500);
      Request req = c.iall_to_all(s, d, 250);
      if (!beside) req.wait();
      for (const OpKind k :
           {OpKind::kGemm, OpKind::kAttention, OpKind::kNorm, OpKind::kElementwise})
        c.compute({k, 1000, 0, op_kind_name(k)});
      if (beside) req.wait();
    });
  };
  EXPECT_EQ(run(true).rank_compute[0].ns(), 1500 + 1000 + 1200 + 2000);
  EXPECT_EQ(run(false).rank_compute[0].ns(), 4000);
}

TEST(EngineSpread, EveryExchangeWaitsForTheSlowestRanksDevice) {
  // Two ranks compute 1e6 ns of work each, then exchange 4 bytes each way, three times: rank r's
  // device takes 1e6 x f_r, both leave an exchange alpha + 4 ns after the slower one arrives, so
  // each rank waits (f_max - f_r) x 1e6 + alpha + 4 ns an exchange.
  Topology topo = test::make_topo(1, 2, 1);
  const double spread = 0.05;
  const std::vector<double> f = rank_speed_factors(2, spread);
  ASSERT_EQ(f.size(), 2u);
  RooflineParams p;
  p.peak_flops_per_s = 1e9;
  p.hbm_bytes_per_s = 1e9;
  p.rank_spread = spread;
  const auto run = [&](bool trace, int workers) {
    emu::EngineOptions o;
    o.workers = workers;
    o.trace = trace;
    o.wire_bytes_per_element = 4;
    emu::Engine engine(
        topo, std::make_unique<AlphaBetaModel>(topo, test::uniform_tiers(3, kAlphaNs, kBytesPerS)),
        std::make_shared<RooflineDevice>(p), o);
    return engine.run([](Communicator& c) {
      std::vector<float> s(2), d(2);
      for (int i = 0; i < 3; ++i) {
        c.compute({OpKind::kGemm, 1e6, 0, "work"});
        c.all_to_all(s, d, 1);
      }
    });
  };
  const emu::RunResult r = run(false, 1);
  std::int64_t work[2], slowest = 0;
  for (int rank = 0; rank < 2; ++rank) {
    work[rank] = std::llround(1e6 * f[static_cast<size_t>(rank)]);
    slowest = std::max(slowest, work[rank]);
  }
  EXPECT_NE(work[0], work[1]);
  EXPECT_EQ(r.makespan.ns(), 3 * (slowest + kAlphaNs + 4));
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_EQ(r.rank_compute[static_cast<size_t>(rank)].ns(), 3 * work[rank]) << rank;
    EXPECT_EQ(r.rank_exposed[static_cast<size_t>(rank)].ns(),
              3 * (slowest - work[rank] + kAlphaNs + 4))
        << rank;
  }
  // The trace observes and never changes the timeline; nor does the worker count.
  EXPECT_EQ(run(true, 1).timeline_sha256, r.timeline_sha256);
  EXPECT_EQ(run(false, 2).timeline_sha256, r.timeline_sha256);
}

TEST(EngineTime, TestDoesNotSeeTheFuture) {
  Topology topo = test::make_topo(1, 2, 1);
  emu::Engine engine = test::make_engine(topo, test::uniform_tiers(3, kAlphaNs, kBytesPerS), 2);
  std::vector<int> seen(2, -1);
  engine.run([&](Communicator& c) {
    std::vector<float> s(500), d(500);
    Request req = c.iall_to_all(s, d, 250);  // completes at 2000 ns
    c.compute({OpKind::kGemm, 1500, 0, "a"});
    const bool early = req.test();  // at 1500 ns
    c.compute({OpKind::kGemm, 1000, 0, "b"});
    const bool late = req.test();  // at 2500 ns
    seen[static_cast<size_t>(c.rank())] = (early ? 1 : 0) + (late ? 2 : 0);
  });
  EXPECT_EQ(seen[0], 2);
  EXPECT_EQ(seen[1], 2);
}

TEST(EngineErrors, DeadlockNamesWhoWaitsOnWhat) {
  Topology topo = test::make_topo(1, 4, 1);
  emu::Engine engine = test::make_engine(topo, test::uniform_tiers(3, kAlphaNs, kBytesPerS), 2);
  try {
    engine.run([](Communicator& c) {
      std::vector<float> buf(4);
      if (c.rank() == 0) c.recv(buf, 4, 1, 9);  // rank 1 never sends
      c.barrier();
    });
    FAIL() << "expected a deadlock report";
  } catch (const CommError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("deadlock"), std::string::npos) << m;
    EXPECT_NE(m.find("rank 0 waits in recv of 4 elements from rank 1"), std::string::npos) << m;
    EXPECT_NE(m.find("rank 1 waits in barrier"), std::string::npos) << m;
    EXPECT_NE(m.find("on group 1 (world ranks 0-3)"), std::string::npos) << m;
  }
}

TEST(EngineErrors, DeadlockOnASubGroupNamesTheSubGroup) {
  Topology topo = test::make_topo(1, 4, 1);
  emu::Engine engine = test::make_engine(topo, test::uniform_tiers(3, kAlphaNs, kBytesPerS), 2);
  try {
    engine.run([](Communicator& c) {
      // {0, 1} and {2, 3}; in the first, world rank 1 waits in a barrier that rank 0 never joins.
      std::unique_ptr<Communicator> half = c.split(c.rank() / 2, c.rank());
      std::vector<float> buf(4);
      if (c.rank() == 0) half->recv(buf, 4, 1, 3);
      if (c.rank() == 1) half->barrier();
    });
    FAIL() << "expected a deadlock report";
  } catch (const CommError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("deadlock"), std::string::npos) << m;
    EXPECT_NE(m.find("rank 0 waits in recv of 4 elements from rank 1"), std::string::npos) << m;
    EXPECT_NE(m.find("rank 1 waits in barrier"), std::string::npos) << m;
    EXPECT_NE(m.find("(world ranks 0-1)"), std::string::npos) << m;
    EXPECT_EQ(m.find("rank 2 waits"), std::string::npos) << m;  // {2, 3} finished
  }
}

TEST(EngineErrors, MismatchedCollectivesNameRanksAndCalls) {
  Topology topo = test::make_topo(1, 4, 1);
  emu::Engine engine = test::make_engine(topo, test::uniform_tiers(3, kAlphaNs, kBytesPerS), 2);
  try {
    engine.run([](Communicator& c) {
      std::vector<float> s(40), d(40);
      if (c.rank() == 2)
        c.all_gather(s, d, 4);
      else
        c.all_to_all(s, d, c.rank() == 3 ? 5 : 4);
    });
    FAIL() << "expected a mismatch";
  } catch (const RankError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("mismatched collectives"), std::string::npos) << m;
    // Whichever pair meets first is reported (the first caller, then the one that disagrees),
    // each with its rank and its call: rank 2's all_gather or rank 3's count against a rank
    // whose call differs.
    const std::regex pair(
        "call #0: rank ([0-3]) called (all_to_all\\(count=[45]\\)|all_gather\\(count=4\\)), "
        "rank ([0-3]) called (all_to_all\\(count=[45]\\)|all_gather\\(count=4\\))");
    std::smatch g;
    ASSERT_TRUE(std::regex_search(m, g, pair)) << m;
    auto call_of = [](int rank) {
      return rank == 2 ? std::string("all_gather(count=4)")
                       : "all_to_all(count=" + std::string(rank == 3 ? "5" : "4") + ")";
    };
    const int a = std::stoi(g[1]), b = std::stoi(g[3]);
    EXPECT_EQ(g[2], call_of(a)) << m;
    EXPECT_EQ(g[4], call_of(b)) << m;
    EXPECT_NE(call_of(a), call_of(b)) << m;
    EXPECT_NE(m.find("world ranks 0-3"), std::string::npos) << m;
    EXPECT_TRUE(e.user_error());
  }
}

// A group whose members mix all_to_all and all_to_allv in one call is a mismatch of calls,
// named as such (not a message size mismatch read from another kind of layout), whichever
// member starts first and at every collective-level setting.
TEST(EngineErrors, MixedAllToAllAndAllToAllvAreMismatchedCollectives) {
  Topology topo = test::make_topo(1, 4, 1);
  for (const bool collective_ops : {true, false})
    for (const int odd : {0, 3}) {
      emu::EngineOptions opt;
      opt.workers = 1;
      opt.collective_ops = collective_ops;
      emu::Engine engine(
          topo,
          std::make_unique<AlphaBetaModel>(topo, test::uniform_tiers(3, kAlphaNs, kBytesPerS)),
          test::unit_device(), opt);
      try {
        engine.run([odd](Communicator& c) {
          std::vector<float> s(16), d(16);
          // The odd member calls later (odd = 0) or earlier (odd = 3) than the others.
          if ((c.rank() == odd) == (odd == 0)) c.compute({OpKind::kElementwise, 0, 1e6, "late"});
          if (c.rank() == odd) {
            c.all_to_all(s, d, 0);
          } else {
            c.all_to_allv(s, d, AllToAllvLayout::packed({1, 2, 3, 4}, {1, 2, 3, 4}));
          }
        });
        FAIL() << "expected a mismatch";
      } catch (const RankError& e) {
        const std::string m = e.what();
        EXPECT_NE(m.find("mismatched collectives"), std::string::npos) << m;
        EXPECT_NE(m.find("all_to_allv"), std::string::npos) << m;
        EXPECT_NE(m.find("all_to_all(count=0)"), std::string::npos) << m;
        EXPECT_EQ(m.find("size mismatch"), std::string::npos) << m;
        EXPECT_TRUE(e.user_error());
      }
    }
}

TEST(EngineErrors, SizeMismatchInSendRecv) {
  Topology topo = test::make_topo(1, 2, 1);
  emu::Engine engine = test::make_engine(topo, test::uniform_tiers(3, kAlphaNs, kBytesPerS), 1);
  try {
    engine.run([](Communicator& c) {
      std::vector<float> buf(8);
      if (c.rank() == 0)
        c.send(buf, 8, 1, 0);
      else
        c.recv(buf, 6, 0, 0);
    });
    FAIL();
  } catch (const RankError& e) {
    EXPECT_NE(std::string(e.what()).find("rank 0 sends 8 elements to rank 1, which expects 6"),
              std::string::npos)
        << e.what();
  }
}

TEST(EngineErrors, ExceptionInOneTileIsRethrownWithItsRank) {
  Topology topo = test::make_topo(2, 3, 1);
  emu::Engine engine = test::make_engine(topo, test::uniform_tiers(3, kAlphaNs, kBytesPerS), 2);
  try {
    engine.run([](Communicator& c) {
      c.barrier();
      if (c.rank() == 4) throw std::runtime_error("injected failure");
      c.barrier();  // the others wait here for rank 4 forever
    });
    FAIL();
  } catch (const RankError& e) {
    EXPECT_EQ(e.rank(), 4);
    EXPECT_NE(std::string(e.what()).find("injected failure"), std::string::npos);
    EXPECT_FALSE(e.user_error());
  }
}

// A program with data-dependent work, sub-groups, and overlapping non-blocking collectives.
struct Outcome {
  std::string timeline;
  std::vector<std::vector<float>> data;
  std::vector<SimTime> ends;
};

Outcome run_program(int workers, const std::string& algo) {
  Topology topo = test::make_topo(2, 3, 2);
  emu::EngineOptions o;
  o.workers = workers;
  o.all_to_all_algorithm = algo;
  emu::Engine engine(topo,
                     std::make_unique<AlphaBetaModel>(
                         topo, std::vector<LinkCost>{{SimTime::from_ns(200), 2e11},
                                                     {SimTime::from_ns(900), 2e10},
                                                     {SimTime::from_ns(3000), 2.5e9}}),
                     test::unit_device(), o);
  Outcome out;
  out.data.resize(12);
  std::mutex m;
  emu::RunResult r = engine.run([&](Communicator& c) {
    std::mt19937 rng(static_cast<unsigned>(c.rank()) * 31u + 1u);
    const int p = c.size();
    std::vector<float> x(static_cast<size_t>(p * 64));
    for (float& v : x) v = std::uniform_real_distribution<float>(-1, 1)(rng);
    auto node = c.split(c.topology().node(c.rank()), c.rank());
    std::vector<float> y(x.size());
    for (int step = 0; step < 5; ++step) {
      Request big = c.iall_to_all(x, y, 64, "big");
      std::vector<float> nx(static_cast<size_t>(node->size() * 16)), ny(nx.size());
      // Arithmetic handed to the math threads (with more than one worker) while fibers go on.
      c.run_math([&] {
        for (size_t i = 0; i < nx.size(); ++i) nx[i] = x[i] * 2;
      });
      Request small = node->iall_to_all(nx, ny, 16, "small");
      c.compute(
          {OpKind::kGemm, 1000.0 + std::uniform_int_distribution<int>(0, 5000)(rng), 0, "work"});
      small.wait();
      big.wait();
      c.run_math([&] {
        for (size_t i = 0; i < x.size(); ++i) x[i] = y[i] * 0.5f + ny[i % ny.size()];
      });
      c.barrier();
    }
    std::lock_guard<std::mutex> lk(m);
    out.data[static_cast<size_t>(c.rank())] = x;
  });
  out.timeline = r.timeline_sha256;
  out.ends = r.rank_end;
  return out;
}

TEST(EngineDeterminism, SameTimelineAndBytesForOneTwoFourWorkers) {
  for (const std::string algo : {"pairwise", "concurrent"}) {
    Outcome w1 = run_program(1, algo);
    for (int w : {2, 4, 1, 4}) {
      Outcome o = run_program(w, algo);
      EXPECT_EQ(o.timeline, w1.timeline) << "workers=" << w << " " << algo;
      EXPECT_EQ(o.ends, w1.ends);
      EXPECT_EQ(o.data, w1.data);
    }
  }
}

TEST(EngineDeterminism, TimelineHashSeesEveryTimeSizeEndAndLabel) {
  // One message and two compute events; each variant changes one thing by the least amount
  // (1 ns of compute, 4 bytes of message, which rank sends, the ninth byte of a label,
  // a label one character longer), and every variant hashes apart from the others.
  Topology topo = test::make_topo(1, 3, 1);
  emu::Engine engine = test::make_engine(topo, test::uniform_tiers(3, kAlphaNs, kBytesPerS), 1);
  struct Variant {
    double flops = 1000;
    std::int64_t count = 250;
    int sender = 0;
    std::string label = "partial_attention_a";
  };
  const auto hash = [&](const Variant& v) {
    return engine
        .run([&](Communicator& c) {
          std::vector<float> buf(static_cast<size_t>(v.count));
          c.compute({OpKind::kGemm, v.flops, 0, v.label});
          if (c.rank() == v.sender) c.send(buf, v.count, 2, 0);
          if (c.rank() == 2) c.recv(buf, v.count, v.sender, 0);
          c.compute({OpKind::kGemm, 1000, 0, "merge"});
        })
        .timeline_sha256;
  };
  std::vector<Variant> variants(6);
  variants[1].flops = 1001;  // 1 ns more: the test device runs a flop per ns
  variants[2].count = 251;
  variants[3].sender = 1;
  variants[4].label = "partial_Attention_a";  // its ninth byte
  variants[5].label = "partial_attention_a_";
  std::set<std::string> seen;
  for (const Variant& v : variants) seen.insert(hash(v));
  EXPECT_EQ(seen.size(), variants.size());
  EXPECT_EQ(hash(variants[0]), hash(variants[0]));
}

// Handed-over arithmetic runs on the math threads, beside other tiles' (workers - 1 threads
// plus the fibers' own), and never beside anything with one worker.
int most_at_once(int workers) {
  Topology topo = test::make_topo(2, 3, 1);
  emu::Engine engine =
      test::make_engine(topo, test::uniform_tiers(3, kAlphaNs, kBytesPerS), workers);
  std::atomic<int> active{0}, most{0};
  engine.run([&](Communicator& c) {
    for (int i = 0; i < 3; ++i) {
      c.run_math([&] {
        const int now = ++active;
        int seen = most.load();
        while (now > seen && !most.compare_exchange_weak(seen, now)) {
        }
        // With several workers, wait (at most 5 s) until two pieces of work overlap.
        const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
        while (workers > 1 && most.load() < 2 && std::chrono::steady_clock::now() < until)
          std::this_thread::yield();
        --active;
      });
      c.compute({OpKind::kGemm, 1000, 0, "work"});
      c.barrier();
    }
  });
  return most.load();
}

TEST(EngineMath, WorkRunsOnTheMathThreadsBesideOtherTilesWork) {
  EXPECT_EQ(most_at_once(1), 1);
  EXPECT_EQ(most_at_once(2), 2);
}

TEST(EngineMath, AnExceptionInHandedOverWorkIsRethrownWithItsRank) {
  for (int workers : {1, 2, 4}) {
    Topology topo = test::make_topo(2, 3, 1);
    emu::Engine engine =
        test::make_engine(topo, test::uniform_tiers(3, kAlphaNs, kBytesPerS), workers);
    try {
      engine.run([](Communicator& c) {
        c.run_math([&] {
          if (c.rank() == 5) throw std::runtime_error("bad arithmetic");
        });
        c.barrier();
      });
      ADD_FAILURE() << "workers " << workers;
    } catch (const RankError& e) {
      EXPECT_EQ(e.rank(), 5);
      EXPECT_NE(std::string(e.what()).find("bad arithmetic"), std::string::npos);
    }
  }
}

// A rank count whose fiber stacks need more memory mappings than the kernel lets a process hold
// (vm.max_map_count) is refused before any fiber starts, naming the limit; it used to abort at
// the first guard page the kernel refused (16,384 tiles at the default 65,530).
TEST(Engine, RankCountsPastTheMappingLimitAreRefusedBeforeTheRun) {
  std::ifstream in("/proc/sys/vm/max_map_count");
  std::int64_t limit = 0;
  if (!(in >> limit) || limit <= 0) GTEST_SKIP() << "no vm.max_map_count to read";
  EXPECT_NO_THROW(emu::check_fiber_stack_limit(1024));
  const int too_many = static_cast<int>(std::min<std::int64_t>(limit / 4 + 1, 1 << 30));
  try {
    emu::check_fiber_stack_limit(too_many);
    ADD_FAILURE() << too_many << " tiles accepted";
  } catch (const ResourceError& e) {
    EXPECT_NE(std::string(e.what()).find("vm.max_map_count = " + std::to_string(limit)),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(emu::fiber_stack_mappings(4096), 4 * 4096);
}

}  // namespace
}  // namespace cocodiff
