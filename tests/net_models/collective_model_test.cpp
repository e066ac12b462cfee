// The collective library model against closed forms: the software time of one message (eager,
// rendezvous, chunked), the schedule choice by size, and each term's effect on an all-to-all
// run by the emulator (one call, k messages, eager vs rendezvous, XOR vs shift on a two-node
// platform, Bruck's rounds), plus compute slowed while a collective is open.

#include <gtest/gtest.h>

#include <functional>
#include <set>

#include "core/errors.hpp"
#include "emulator/engine.hpp"
#include "net_models/cluster.hpp"
#include "net_models/collective_model.hpp"

namespace cocodiff {
namespace {

constexpr SimTime ns(std::int64_t v) { return SimTime::from_ns(v); }

// The closed forms the emulator's runs are held against: an all-to-all of m = `bytes` per peer
// among p ranks that start together on a network where every message takes alpha + m/B.
// Pairwise: call + (p-1) (sw + alpha + m/B); Bruck: call + sum over rounds k of
// (sw + alpha + n_k m/B), n_k the distances 1..p-1 with bit k set.
SimTime pairwise_time(const LibraryModel& lib, int p, std::int64_t bytes, SimTime alpha,
                      double bytes_per_s) {
  if (p <= 1) return lib.call_overhead;
  const SimTime one = message_software_time(lib, bytes) + alpha +
                      SimTime::from_seconds(static_cast<double>(bytes) / bytes_per_s);
  return lib.call_overhead + SimTime::from_ns(one.ns() * (p - 1));
}

SimTime bruck_time(const LibraryModel& lib, int p, std::int64_t bytes, SimTime alpha,
                   double bytes_per_s) {
  SimTime t = lib.call_overhead;
  for (int bit = 1; bit < p; bit *= 2) {
    std::int64_t blocks = 0;
    for (int j = 1; j < p; ++j) blocks += (j & bit) != 0 ? 1 : 0;
    const std::int64_t b = blocks * bytes;
    t += message_software_time(lib, b) + alpha +
         SimTime::from_seconds(static_cast<double>(b) / bytes_per_s);
  }
  return t;
}

TEST(LibraryModel, DefaultIsFreeAndShift) {
  LibraryModel ideal;
  EXPECT_TRUE(ideal.is_free());
  EXPECT_EQ(message_software_time(ideal, 0), SimTime{});
  EXPECT_EQ(message_software_time(ideal, 1 << 30), SimTime{});
  EXPECT_EQ(choose_all_to_all(ideal, 1), "shift");
  EXPECT_EQ(pairwise_time(ideal, 8, 10000, ns(2000), 1e10).ns(), 7 * 3000);
}

TEST(LibraryModel, MessageSoftwareTimeByProtocolAndChunks) {
  LibraryModel lib;
  lib.message_overhead = ns(1000);
  lib.eager_max_bytes = 4096;
  lib.eager_overhead = ns(300);
  lib.eager_copy_bytes_per_s = 1e9;  // 1 byte per ns
  lib.rendezvous_overhead = ns(5000);
  lib.chunk_bytes = 1 << 20;
  lib.chunk_overhead = ns(700);
  EXPECT_FALSE(lib.is_free());
  EXPECT_EQ(message_software_time(lib, 0).ns(), 1300);
  EXPECT_EQ(message_software_time(lib, 4096).ns(), 1000 + 300 + 4096);
  EXPECT_EQ(message_software_time(lib, 4097).ns(), 6000);
  EXPECT_EQ(message_software_time(lib, 1 << 20).ns(), 6000);
  EXPECT_EQ(message_software_time(lib, (1 << 20) + 1).ns(), 6700);
  EXPECT_EQ(message_software_time(lib, 5 << 20).ns(), 6000 + 4 * 700);
}

TEST(LibraryModel, ScheduleBySize) {
  LibraryModel lib;
  lib.all_to_all_small = "concurrent";
  lib.all_to_all_large = "xor";
  lib.all_to_all_small_max_bytes = 65536;
  EXPECT_EQ(choose_all_to_all(lib, 65536), "concurrent");
  EXPECT_EQ(choose_all_to_all(lib, 65537), "xor");
}

// ---- the emulator charging the library's costs ----

// One device that runs 1 FLOP per ns; `factor` on compute overlapped with an open collective.
// `transfer_factor` on the part of a collective that runs beside the tile's compute.
std::shared_ptr<DeviceModel> unit_device(double factor = 1.0, double transfer_factor = 1.0) {
  RooflineParams p;
  p.peak_flops_per_s = 1e9;
  p.hbm_bytes_per_s = 1e9;
  p.overlap_compute_factor = factor;
  p.overlap_transfer_factor = transfer_factor;
  return std::make_shared<RooflineDevice>(p);
}

// `nodes` nodes of `gpus` ranks; alpha-beta tiers (intra, inter).
emu::RunResult run_a2a(const LibraryModel& lib, const std::string& algo, int gpus, int nodes,
                       std::int64_t count, std::vector<LinkCost> tiers, int workers = 2) {
  Topology topo({{"gpu", gpus, "intra-node"}, {"node", nodes, "inter-node"}});
  emu::EngineOptions o;
  o.workers = workers;
  o.wire_bytes_per_element = 4;
  o.all_to_all_algorithm = algo;
  o.library = lib;
  o.trace = false;
  emu::Engine e(topo, std::make_unique<AlphaBetaModel>(topo, std::move(tiers)), unit_device(), o);
  return e.run([&](Communicator& c) { c.all_to_all({}, {}, count); });
}

// 8 ranks, alpha 2000 ns, 10 GB/s everywhere; 2500 floats = 10000 bytes = 1000 ns per block.
const std::vector<LinkCost> kUniform(2, LinkCost{ns(2000), 1e10});

TEST(LibraryEngine, FreeLibraryKeepsTheExactTimesAndTimeline) {
  const emu::RunResult base = run_a2a(LibraryModel{}, "pairwise", 4, 2, 2500, kUniform);
  const emu::RunResult lib = run_a2a(LibraryModel{}, "library", 4, 2, 2500, kUniform, 1);
  EXPECT_EQ(base.makespan.ns(), 7 * 3000);
  EXPECT_EQ(lib.makespan, base.makespan);
  EXPECT_EQ(lib.timeline_sha256, base.timeline_sha256);
}

TEST(LibraryEngine, OneCallCostsTheCallOverheadOnce) {
  LibraryModel lib;
  lib.call_overhead = ns(25000);
  EXPECT_EQ(run_a2a(lib, "library", 4, 2, 2500, kUniform).makespan.ns(), 25000 + 7 * 3000);
  EXPECT_EQ(run_a2a(lib, "concurrent", 4, 2, 2500, kUniform).makespan.ns(), 25000 + 3000);
}

TEST(LibraryEngine, EveryMessageCostsItsSender) {
  LibraryModel lib;
  lib.message_overhead = ns(400);
  // Pairwise: each of the p-1 rounds waits for its message, software first.
  EXPECT_EQ(run_a2a(lib, "pairwise", 4, 2, 2500, kUniform).makespan.ns(), 7 * (400 + 3000));
  // Concurrent: the sender posts its 7 messages one after another; the last leaves at 7 sw.
  EXPECT_EQ(run_a2a(lib, "concurrent", 4, 2, 2500, kUniform).makespan.ns(), 7 * 400 + 3000);
  for (int k : {2, 4, 8}) {
    EXPECT_EQ(run_a2a(lib, "pairwise", k, 1, 2500, kUniform).makespan,
              pairwise_time(lib, k, 10000, ns(2000), 1e10))
        << k;
  }
}

TEST(LibraryEngine, EagerBelowTheThresholdRendezvousAbove) {
  LibraryModel lib;
  lib.eager_max_bytes = 10000;  // exactly one block of 2500 floats
  lib.eager_overhead = ns(100);
  lib.rendezvous_overhead = ns(6000);
  EXPECT_EQ(run_a2a(lib, "pairwise", 4, 2, 2500, kUniform).makespan.ns(), 7 * (100 + 3000));
  // 2501 floats: 10004 bytes, rendezvous, and 1000.4 ns of wire rounded up to 1001.
  EXPECT_EQ(run_a2a(lib, "pairwise", 4, 2, 2501, kUniform).makespan.ns(), 7 * (6000 + 3001));
}

TEST(LibraryEngine, XorPairingKeepsRoundsOnOneTierOnTwoNodes) {
  // 2 nodes x 8 GPUs; intra-node alpha 1 us at 100 GB/s, inter-node alpha 5 us at 10 GB/s.
  const std::vector<LinkCost> tiers{{ns(1000), 1e11}, {ns(5000), 1e10}};
  const std::int64_t count = 250000;  // 1 MB per peer: 10 us intra, 100 us inter
  const std::int64_t intra = 1000 + 10000, inter = 5000 + 100000;
  // Shift: every round k has a pair that crosses nodes, so all 15 rounds take the inter time.
  EXPECT_EQ(run_a2a(LibraryModel{}, "pairwise", 8, 2, count, tiers).makespan.ns(), 15 * inter);
  // XOR: rounds 1..7 stay inside the node, rounds 8..15 all cross.
  EXPECT_EQ(run_a2a(LibraryModel{}, "xor", 8, 2, count, tiers).makespan.ns(),
            7 * intra + 8 * inter);
  LibraryModel mpich;
  mpich.all_to_all_large = "xor";
  EXPECT_EQ(run_a2a(mpich, "library", 8, 2, count, tiers).makespan.ns(), 7 * intra + 8 * inter);
}

TEST(LibraryEngine, BruckTakesLogRoundsOfHalfTheBlocks) {
  // 8 ranks, 3 rounds of 4 blocks of 10000 bytes: 3 (sw + 2000 + 4000) ns; 12 ranks, 4 rounds
  // of 6, 6, 4 and 4 blocks (the distances 1..11 with bit k set).
  LibraryModel lib;
  lib.call_overhead = ns(5000);
  lib.message_overhead = ns(300);
  lib.all_to_all_large = "bruck";
  EXPECT_EQ(run_a2a(lib, "library", 4, 2, 2500, kUniform).makespan.ns(),
            5000 + 3 * (300 + 2000 + 4000));
  EXPECT_EQ(run_a2a(lib, "bruck", 4, 3, 2500, kUniform).makespan.ns(),
            5000 + 2 * (300 + 2000 + 6000) + 2 * (300 + 2000 + 4000));
  for (int p : {2, 3, 5, 8, 12}) {
    EXPECT_EQ(run_a2a(lib, "bruck", p, 1, 2500, kUniform).makespan,
              bruck_time(lib, p, 10000, ns(2000), 1e10))
        << p;
  }
}

TEST(LibraryEngine, HierarchicalAllGatherRunsARingPerLevel) {
  // 4 GPUs x 3 nodes; intra-node alpha 1 us at 100 GB/s, inter-node alpha 5 us at 10 GB/s.
  // Blocks of 100 kB: the GPU ring takes 3 rounds of one block (1 + 1 us), the node ring 2
  // rounds of 4 blocks (5 + 40 us), each message after its 300 ns of software time.
  const std::vector<LinkCost> tiers{{ns(1000), 1e11}, {ns(5000), 1e10}};
  Topology topo({{"gpu", 4, "intra-node"}, {"node", 3, "inter-node"}});
  LibraryModel lib;
  lib.message_overhead = ns(300);
  lib.all_gather = "hierarchical";
  for (bool ops : {true, false}) {
    emu::EngineOptions o;
    o.wire_bytes_per_element = 4;
    o.library = lib;
    o.collective_ops = ops;
    emu::Engine e(topo, std::make_unique<AlphaBetaModel>(topo, tiers), unit_device(), o);
    const emu::RunResult r = e.run([](Communicator& c) {
      std::vector<float> mine(25000, static_cast<float>(c.rank()));
      std::vector<float> all(mine.size() * static_cast<size_t>(c.size()));
      c.all_gather(mine, all, 25000);
      for (int j = 0; j < c.size(); ++j)
        ASSERT_EQ(all[25000 * static_cast<size_t>(j)], static_cast<float>(j));
    });
    EXPECT_EQ(r.makespan.ns(), 3 * (300 + 1000 + 1000) + 2 * (300 + 5000 + 40000)) << ops;
    // Node ring: 12 ranks send 2 messages of 400 kB; GPU ring: 12 ranks send 3 of 100 kB.
    EXPECT_EQ(r.bytes_by_tier, (std::vector<std::int64_t>{12 * 3 * 100000, 12 * 2 * 400000}));
  }
}

TEST(LibraryEngine, RingKernelsSpendTheirOwnBlocksTimeBeforeTheirFirstMessage) {
  // 4 GPUs, alpha 1 us at 100 GB/s; blocks of 100 kB (25000 floats of 4 wire bytes): a ring
  // round takes 300 ns of software time + 1 us + 1 us. The own block at 50 GB/s: 2 us.
  Topology topo({{"gpu", 4, "intra-node"}});
  const std::vector<LinkCost> tier{{ns(1000), 1e11}};
  LibraryModel lib;
  lib.call_overhead = ns(5000);
  lib.message_overhead = ns(300);
  lib.local_copy_bytes_per_s = 50e9;
  EXPECT_FALSE(lib.is_free());
  EXPECT_EQ(local_copy_time(lib, 100000).ns(), 2000);
  EXPECT_EQ(local_copy_time(LibraryModel{}, 100000).ns(), 0);
  for (bool ops : {true, false}) {
    emu::EngineOptions o;
    o.wire_bytes_per_element = 4;
    o.library = lib;
    o.collective_ops = ops;
    auto run = [&](const std::function<void(Communicator&)>& f) {
      emu::Engine e(topo, std::make_unique<AlphaBetaModel>(topo, tier), unit_device(), o);
      return e.run(f).makespan.ns();
    };
    // All-gather: call, own block, 3 rounds.
    EXPECT_EQ(run([](Communicator& c) {
                std::vector<float> mine(25000, static_cast<float>(c.rank()));
                std::vector<float> all(mine.size() * 4);
                c.all_gather(mine, all, 25000);
                for (int j = 0; j < 4; ++j) ASSERT_EQ(all[25000 * static_cast<size_t>(j)], j);
              }),
              5000 + 2000 + 3 * (300 + 1000 + 1000))
        << ops;
    // All-reduce of 4 chunks of 25000: call, own chunk, 3 rounds reducing, 3 gathering.
    EXPECT_EQ(run([](Communicator& c) {
                std::vector<float> v(100000, 1.0f);
                c.all_reduce(v, 100000, ReduceOp::kSum);
                ASSERT_EQ(v[0], 4.0f);
              }),
              5000 + 2000 + 6 * (300 + 1000 + 1000))
        << ops;
    // An all-to-all's own block costs nothing: call and 3 pairwise rounds.
    EXPECT_EQ(run([](Communicator& c) {
                std::vector<float> send(100000), recv(100000);
                c.all_to_all(send, recv, 25000);
              }),
              5000 + 3 * (300 + 1000 + 1000))
        << ops;
  }
}

TEST(LibraryEngine, XorAllToAllDeliversEveryBlock) {
  Topology topo({{"gpu", 4, "intra-node"}, {"node", 2, "inter-node"}});
  emu::EngineOptions o;
  o.workers = 2;
  o.all_to_all_algorithm = "xor";
  emu::Engine e(topo, std::make_unique<AlphaBetaModel>(topo, kUniform), unit_device(), o);
  e.run([](Communicator& c) {
    const int p = c.size();
    std::vector<float> send(static_cast<size_t>(3 * p)), recv(send.size());
    for (int j = 0; j < 3 * p; ++j)
      send[static_cast<size_t>(j)] = static_cast<float>(100 * c.rank() + j / 3);
    c.all_to_all(send, recv, 3);
    for (int j = 0; j < 3 * p; ++j)
      ASSERT_EQ(recv[static_cast<size_t>(j)], static_cast<float>(100 * (j / 3) + c.rank()));
  });
}

TEST(Interference, OverlappedComputeIsMaxOfSlowedComputeAndTransfer) {
  // One all-to-all of 7 rounds x 3000 ns = 21 us in flight; c ns of compute beside it,
  // slowed by 1.5 while the collective is open: end = max(1.5 c, 21000).
  Topology topo({{"gpu", 4, "intra-node"}, {"node", 2, "inter-node"}});
  for (double c : {10000.0, 20000.0}) {
    for (double factor : {1.0, 1.5}) {
      emu::EngineOptions o;
      o.workers = 2;
      o.wire_bytes_per_element = 4;
      emu::Engine e(topo, std::make_unique<AlphaBetaModel>(topo, kUniform), unit_device(factor), o);
      const emu::RunResult r = e.run([&](Communicator& comm) {
        Request q = comm.iall_to_all({}, {}, 2500);
        comm.compute({OpKind::kGemm, c, 0, "gemm"});
        q.wait();
        comm.compute({OpKind::kGemm, 1000, 0, "after"});  // not overlapped: full speed
      });
      const auto expect = static_cast<std::int64_t>(std::max(factor * c, 21000.0)) + 1000;
      EXPECT_EQ(r.makespan.ns(), expect) << c << " " << factor;
    }
  }
}

TEST(Interference, TransfersBesideComputeAreSlowedByTheOverlappedPart) {
  // The same 21 us all-to-all beside c ns of compute (not slowed), transfers slowed by ft while
  // the tile computes: end = max(c, 21000 + (ft - 1) * min(c, 21000)).
  Topology topo({{"gpu", 4, "intra-node"}, {"node", 2, "inter-node"}});
  for (double c : {10000.0, 30000.0, 60000.0}) {
    for (double ft : {1.0, 1.5, 2.0}) {
      for (int workers : {1, 2}) {
        emu::EngineOptions o;
        o.workers = workers;
        o.wire_bytes_per_element = 4;
        emu::Engine e(topo, std::make_unique<AlphaBetaModel>(topo, kUniform), unit_device(1.0, ft),
                      o);
        SimTime done_at;
        const emu::RunResult r = e.run([&](Communicator& comm) {
          Request q = comm.iall_to_all({}, {}, 2500);
          comm.compute({OpKind::kGemm, c, 0, "gemm"});
          q.wait();
          if (comm.rank() == 0) done_at = q.completed_at(SimTime{});
          comm.compute({OpKind::kGemm, 1000, 0, "after"});
        });
        const double transfer = 21000.0 + (ft - 1.0) * std::min(c, 21000.0);
        EXPECT_EQ(r.makespan.ns(), static_cast<std::int64_t>(std::max(c, transfer)) + 1000)
            << c << " " << ft;
        // The request reports the completion the tile saw, slowdown included.
        EXPECT_EQ(done_at.ns(), static_cast<std::int64_t>(transfer)) << c << " " << ft;
      }
    }
  }
}

TEST(Interference, BothFactorsTogetherAndNoPenaltyWithoutOverlap) {
  Topology topo({{"gpu", 4, "intra-node"}, {"node", 2, "inter-node"}});
  emu::EngineOptions o;
  o.workers = 1;
  o.wire_bytes_per_element = 4;
  {
    // Compute 10 us slowed to 15 us beside the collective; the collective's overlapped part
    // is those 15 us, slowed by 2: 21 + 15 = 36 us.
    emu::Engine e(topo, std::make_unique<AlphaBetaModel>(topo, kUniform), unit_device(1.5, 2.0), o);
    const emu::RunResult r = e.run([&](Communicator& comm) {
      Request q = comm.iall_to_all({}, {}, 2500);
      comm.compute({OpKind::kGemm, 10000, 0, "gemm"});
      q.wait();
    });
    EXPECT_EQ(r.makespan.ns(), 36000);
  }
  {
    // Compute after the wait does not overlap: the blocking collective costs its 21 us.
    emu::Engine e(topo, std::make_unique<AlphaBetaModel>(topo, kUniform), unit_device(1.5, 2.0), o);
    const emu::RunResult r = e.run([&](Communicator& comm) {
      comm.all_to_all({}, {}, 2500);
      comm.compute({OpKind::kGemm, 10000, 0, "gemm"});
    });
    EXPECT_EQ(r.makespan.ns(), 31000);
  }
}

// ---- presets and their parsing ----

const std::filesystem::path kPresets = std::filesystem::path(COCODIFF_CONFIG_DIR) / "clusters";

Cluster load(const std::string& preset, const std::vector<std::string>& sets = {}) {
  Config cfg = Config::parse("[cluster]\npreset = \"" + preset + "\"\n", "run.toml");
  for (const std::string& s : sets) cfg.set(s);
  return load_cluster(cfg, kPresets);
}

std::string load_error(const std::string& preset, const std::vector<std::string>& sets) {
  try {
    load(preset, sets);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(LibraryPresets, ClustersNameTheirLibraryAndKeysOverrideIt) {
  const Cluster h100 = load("hgx-h100");
  EXPECT_EQ(h100.library.name, "nccl-device");  // its device has a host that issues calls
  EXPECT_EQ(h100.library.call_overhead.ns(), 10200);
  EXPECT_EQ(load("hgx-h200").library.name, "nccl-device");
  EXPECT_EQ(h100.library.message_overhead.ns(), 3400);
  EXPECT_EQ(h100.library.all_to_all_large, "concurrent");
  EXPECT_EQ(load("aurora").library.name, "oneccl");
  EXPECT_TRUE(load("uniform").library.is_free());
  EXPECT_TRUE(load("hgx-h100", {"cluster.library.preset=\"ideal\""}).library.is_free());
  const Cluster over = load(
      "hgx-h100", {"cluster.library.message_overhead_us=7", "cluster.library.all_to_all=\"xor\""});
  EXPECT_EQ(over.library.message_overhead.ns(), 7000);
  EXPECT_EQ(over.library.call_overhead.ns(), 10200);  // from the preset
  EXPECT_EQ(over.library.all_to_all_large, "xor");
  for (const char* lib : {"ideal", "nccl", "nccl-device", "oneccl", "mpich", "openmpi"})
    EXPECT_EQ(load("uniform", {std::string("cluster.library.preset=\"") + lib + "\""}).library.name,
              lib);
}

TEST(LibraryPresets, BadLibraryKeysNameTheKey) {
  EXPECT_NE(load_error("hgx-h100", {"cluster.library.preset=\"nope\""}).find("library.preset"),
            std::string::npos);
  std::string e = load_error("hgx-h100", {"cluster.library.all_to_all=\"tree\""});
  EXPECT_NE(e.find("library.all_to_all"), std::string::npos) << e;
  EXPECT_NE(e.find("shift | xor | concurrent | bruck"), std::string::npos) << e;
  e = load_error("hgx-h100", {"cluster.library.all_gather=\"tree\""});
  EXPECT_NE(e.find("library.all_gather"), std::string::npos) << e;
  EXPECT_NE(e.find("ring | hierarchical"), std::string::npos) << e;
  EXPECT_EQ(load("hgx-h100", {"cluster.library.all_gather=\"hierarchical\""}).library.all_gather,
            "hierarchical");
  EXPECT_EQ(
      load("hgx-h100", {"cluster.library.all_to_all_small=\"bruck\""}).library.all_to_all_small,
      "bruck");
  // An alias is stored as the name it stands for.
  EXPECT_EQ(load("hgx-h100", {"cluster.library.all_to_all=\"pairwise\""}).library.all_to_all_large,
            "shift");
  e = load_error("hgx-h100", {"cluster.library.barrier=\"tree\""});
  EXPECT_NE(e.find("library.barrier"), std::string::npos) << e;
  EXPECT_NE(e.find("dissemination"), std::string::npos) << e;
  EXPECT_NE(load_error("hgx-h100", {"cluster.library.call_overhead_us=-1"})
                .find("library.call_overhead_us"),
            std::string::npos);
  EXPECT_NE(load_error("hgx-h100", {"cluster.library.colour=1"}).find("unknown key"),
            std::string::npos);
}

TEST(KernelTable, InterpolatesInLogLogAndFallsBackToTheRoofline) {
  RooflineParams p;
  p.peak_flops_per_s = 1e12;
  p.hbm_bytes_per_s = 1e12;
  p.kernels["q_proj"] = KernelTable{{1e9, 4e9}, {10e-6, 40e-6}, "test"};
  p.kernels["attention"] = KernelTable{{1e9}, {99e-6}, "test"};
  const RooflineDevice d(p);
  EXPECT_EQ(d.time({OpKind::kGemm, 1e9, 0, "q_proj"}).ns(), 10000);
  EXPECT_EQ(d.time({OpKind::kGemm, 4e9, 0, "q_proj"}).ns(), 40000);
  // Halfway in log FLOPs: time grows as FLOPs (slope 1 in log-log) -> 20 us at 2e9.
  EXPECT_NEAR(d.time({OpKind::kGemm, 2e9, 0, "q_proj"}).us(), 20.0, 0.002);
  // Another label: the roofline (1 ms per 1e9 FLOPs here).
  EXPECT_EQ(d.time({OpKind::kGemm, 2e9, 0, "k_proj"}).ns(), 2'000'000);
  EXPECT_EQ(d.roofline({OpKind::kGemm, 8e9, 0, "q_proj"}).ns(), 8'000'000);
  // Outside the range: the roofline scaled by the table's ratio at the nearest end. Above:
  // 8 ms x (40 us / 4 ms) = 80 us. Below: 0.5 ms x (10 us / 1 ms) = 5 us.
  EXPECT_EQ(d.time({OpKind::kGemm, 8e9, 0, "q_proj"}).ns(), 80'000);
  EXPECT_EQ(d.time({OpKind::kGemm, 0.5e9, 0, "q_proj"}).ns(), 5'000);
  // A kind's table serves ops of that kind without their own label's table; a one-point table
  // scales the roofline on both sides (2 ms x 99 us / 1 ms = 198 us).
  EXPECT_EQ(d.time({OpKind::kAttention, 1e9, 0, "joint_attention"}).ns(), 99000);
  EXPECT_EQ(d.time({OpKind::kAttention, 2e9, 0, "joint_attention"}).ns(), 198000);
}

TEST(KernelTable, ExtrapolationScalesTheRooflineWithTheBytesInProportion) {
  // A memory-bound op: 1 GB/s HBM, launch 0. The table says it runs 4x slower than its
  // roofline at its only point; past it, the roofline (here bytes-bound) times 4.
  RooflineParams p;
  p.peak_flops_per_s = 1e15;
  p.hbm_bytes_per_s = 1e9;
  p.kernels["q_norm"] = KernelTable{{1e6}, {4e-3}, "test"};  // roofline at 1e6 FLOPs, 1e6 B: 1 ms
  const RooflineDevice d(p);
  EXPECT_EQ(d.time({OpKind::kNorm, 3e6, 3e6, "q_norm"}).ns(), 12'000'000);
  // Zero FLOPs (a pure copy labelled like a table): the roofline alone.
  EXPECT_EQ(d.time({OpKind::kNorm, 0, 2e6, "q_norm"}).ns(), 2'000'000);
}

TEST(KernelTable, PresetTablesParseAndBadOnesAreRefused) {
  const Cluster h100 = load("hgx-h100");
  EXPECT_TRUE(h100.device_params.kernels.empty());  // timed by its kernel grid
  EXPECT_DOUBLE_EQ(h100.device_params.overlap_compute_factor, 1.2);
  // FLUX.1-dev q_proj at 4096 tokens per rank: the H100 grid's point (103.648 us,
  // configs/measurements/h100x1-models/gemm.csv), not the roofline (the same GEMM replayed in a
  // CUDA graph inside FLUX's step measured 108.4 us: configs/measurements/h100x4/kernels.csv).
  OpCost q{OpKind::kGemm, 2.0 * 4096 * 3072 * 3072, 0, "q_proj"};
  q.shape = gemm_shape(4096, 3072, 3072, true);
  EXPECT_NEAR(h100.device->time(q).us(), 103.648, 0.01);
  // Tables by label still parse where a cluster has them (a label's FLOPs: its time).
  const Cluster tables = load("uniform", {"cluster.device.kernels.q_proj.flops=[1e9, 4e9]",
                                          "cluster.device.kernels.q_proj.time_us=[10.0, 30.0]"});
  EXPECT_NEAR(tables.device->time({OpKind::kGemm, 4e9, 0, "q_proj"}).us(), 30.0, 1e-9);
  // And the host that issues it: 15 us per projection in eager PyTorch.
  EXPECT_TRUE(h100.device->has_host());
  EXPECT_NEAR(h100.device->host_issue("q_proj").us(), 15.0, 1e-9);
  EXPECT_NE(load_error("hgx-h100", {"cluster.device.kernels.q_proj.time_us=[1.0]"})
                .find("one time per entry"),
            std::string::npos);
  EXPECT_NE(load_error("uniform", {"cluster.device.kernels.x.flops=[2.0, 1.0]",
                                   "cluster.device.kernels.x.time_us=[1.0, 2.0]"})
                .find("ascending"),
            std::string::npos);
  EXPECT_NE(load_error("hgx-h100", {"cluster.device.overlap_compute_factor=0.5"})
                .find("overlap_compute_factor"),
            std::string::npos);
}

TEST(OverlapByGroup, PresetGroupsParseAndBadOnesAreRefused) {
  // hgx-h100: its own factors for 2-GPU collectives, the base ones for any other group.
  const Cluster h100 = load("hgx-h100");
  EXPECT_EQ(h100.device->overlap_groups(), std::vector<int>{2});
  EXPECT_DOUBLE_EQ(h100.device->overlap_compute_factor_for(2), 1.2);
  EXPECT_DOUBLE_EQ(h100.device->overlap_transfer_factor_for(2), 1.6);
  EXPECT_DOUBLE_EQ(h100.device->overlap_transfer_factor_for(4), 1.5);
  EXPECT_DOUBLE_EQ(h100.device->overlap_transfer_factor_for(8), 1.5);
  // A group's missing factor is the base one.
  const Cluster one = load("uniform", {"cluster.device.overlap_transfer_factor=1.4",
                                       "cluster.device.overlap_by_group.4.compute_factor=1.1"});
  EXPECT_DOUBLE_EQ(one.device->overlap_compute_factor_for(4), 1.1);
  EXPECT_DOUBLE_EQ(one.device->overlap_transfer_factor_for(4), 1.4);
  EXPECT_NE(load_error("uniform", {"cluster.device.overlap_by_group.two.compute_factor=1.1"})
                .find("device.overlap_by_group.two"),
            std::string::npos);
  EXPECT_NE(load_error("uniform", {"cluster.device.overlap_by_group.1.compute_factor=1.1"})
                .find("2 or more"),
            std::string::npos);
  EXPECT_NE(load_error("uniform", {"cluster.device.overlap_by_group.2.transfer_factor=0.9"})
                .find("overlap_by_group.2.transfer_factor"),
            std::string::npos);
}

}  // namespace
}  // namespace cocodiff
