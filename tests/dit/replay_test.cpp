// Exact replay of repeated regions (Replay::begin_region) and collectives run at the
// collective level (EngineOptions::collective_ops): every strategy gives the same virtual
// times, bytes per tier, flows, events and timeline hash with replay on and off, with
// collective-level and per-message collectives, on 1, 2 and 4 workers, under alpha-beta and
// max-min; regions whose key or start state differ (a
// V-Major refresh step, a first step from zero offsets) are simulated, a refresh step's blocks
// replay the warm-up step's, and a fault injected mid-run ends the run the same way with replay
// on and off.

#include <gtest/gtest.h>

#include <atomic>
#include <utility>

#include "core/errors.hpp"
#include "core/replay.hpp"
#include "dit/local_comm.hpp"
#include "dit/pipeline.hpp"
#include "emulator/engine.hpp"
#include "net_models/cluster.hpp"
#include "tests/emulator/test_util.hpp"

namespace cocodiff::dit {
namespace {

using test::expect_same_timeline;

const std::filesystem::path kPresets = std::filesystem::path(COCODIFF_CONFIG_DIR) / "clusters";

// Aurora with `nodes` nodes (12 tiles each), max-min or alpha-beta.
emu::Engine aurora(int nodes, const std::string& network, int workers, bool replay,
                   bool collective_ops = true, bool call_tapes = true) {
  Config cfg = Config::parse("[cluster]\npreset = \"aurora\"\n", "run.toml");
  cfg.set("cluster.nodes=" + std::to_string(nodes));
  cfg.set("cluster.network=" + network);
  Cluster c = load_cluster(cfg, kPresets);
  emu::EngineOptions o;
  o.workers = workers;
  o.trace = false;
  o.replay = replay;
  o.collective_ops = collective_ops;
  o.call_tapes = call_tapes;
  return emu::Engine(c.topology, std::move(c.network), c.device, o);
}

ModelConfig small_flux() {
  ModelConfig cfg = load_model_preset("flux1-dev");
  cfg.double_blocks = 1;
  cfg.single_blocks = 1;
  return cfg;
}

struct Outcome {
  emu::RunResult result;
  int forwards = 0;
  StrategyStats stats;  // rank 0's
};

Outcome run(emu::Engine& engine, const ModelConfig& cfg, const RunSettings& st) {
  const std::shared_ptr<const Weights> w = make_weights(cfg, 1, true);
  Outcome out;
  out.result = engine.run([&](Communicator& comm) {
    RunOutput o = generate(comm, cfg, *w, st);
    if (comm.rank() == 0) {
      out.forwards = o.forwards;
      out.stats = o.strategy_stats;
    }
  });
  return out;
}

// The run on 2 Aurora nodes under max-min with replay off and on (one worker): both timelines
// must be the same.
std::pair<Outcome, Outcome> simulated_and_replayed(const ModelConfig& cfg, const RunSettings& st) {
  emu::Engine off = aurora(2, "maxmin", 1, false);
  emu::Engine on = aurora(2, "maxmin", 1, true);
  Outcome simulated = run(off, cfg, st);
  Outcome replayed = run(on, cfg, st);
  expect_same_timeline(replayed.result, simulated.result);
  return {std::move(simulated), std::move(replayed)};
}

RunSettings phantom_settings(const std::string& strategy, int steps) {
  RunSettings st;
  st.resolution = 128;
  st.steps = steps;
  st.seed = 3;
  st.phantom = true;
  st.strategy = strategy;
  st.strategy_options.uneven_heads = true;
  st.strategy_options.v_major_warmup_steps = 1;
  st.strategy_options.v_major_refresh_every = 0;
  return st;
}

// PipeFusion marks no regions (its stages run different blocks on different patches at once),
// so nothing is replayed; its all-to-alls run at the collective level or message by message,
// with the same timeline, on any worker count.
TEST(Replay, PipeFusionGivesThePerMessageTimelineWithEveryShortcut) {
  const ModelConfig cfg = small_flux();
  RunSettings st = phantom_settings("pipefusion", 3);
  st.strategy_options.pipefusion_degree = 2;  // 2 stages of 12 tiles over 2 nodes
  st.strategy_options.pipefusion_patches = 4;
  emu::Engine off = aurora(2, "maxmin", 1, false, false, false);
  const Outcome ref = run(off, cfg, st);
  for (const int workers : {1, 2, 4}) {
    emu::Engine on = aurora(2, "maxmin", workers, true, true, true);
    const Outcome got = run(on, cfg, st);
    expect_same_timeline(got.result, ref.result);
    EXPECT_EQ(got.result.regions_replayed, 0u);
  }
}

TEST(Replay, EveryStrategyGivesTheSimulatedPerMessageTimelineOnAnyWorkerCount) {
  const ModelConfig cfg = small_flux();
  for (const std::string strategy :
       {"flat", "tapa", "v_first", "tapa+v_first+pipeline", "cocodiff", "usp"}) {
    for (const std::string network : {"maxmin", "alpha-beta"}) {
      if (network == "alpha-beta" && strategy != "flat" && strategy != "cocodiff") continue;
      SCOPED_TRACE(strategy + " on " + network);
      const RunSettings st = phantom_settings(strategy, 4);
      // The reference simulates everything, message by message, running every block's code.
      emu::Engine off = aurora(2, network, 1, false, false, false);
      const Outcome ref = run(off, cfg, st);
      EXPECT_EQ(ref.result.regions_replayed, 0u);
      EXPECT_EQ(ref.result.tapes_played, 0u);
      struct Variant {
        int workers;
        bool replay, collective_ops, call_tapes;
      };
      for (const Variant v : {Variant{1, false, true, true}, Variant{1, true, false, true},
                              Variant{1, true, true, true}, Variant{2, true, true, true},
                              Variant{4, true, true, true}, Variant{2, false, false, true},
                              Variant{1, false, true, false}, Variant{4, false, true, true}}) {
        SCOPED_TRACE("workers " + std::to_string(v.workers) + ", replay " +
                     std::to_string(v.replay) + ", collective ops " +
                     std::to_string(v.collective_ops) + ", call tapes " +
                     std::to_string(v.call_tapes));
        emu::Engine on = aurora(2, network, v.workers, v.replay, v.collective_ops, v.call_tapes);
        const Outcome got = run(on, cfg, st);
        expect_same_timeline(got.result, ref.result);
        EXPECT_EQ(got.forwards, ref.forwards);
        // usp's blocks issue their first block's calls again (replay off: every block but the
        // first of each kind on each tile); no other strategy's blocks are taped.
        if (strategy == "usp" && v.call_tapes && !v.replay) {
          EXPECT_GT(got.result.tapes_played, 0u);
        }
        if (strategy != "usp" || !v.call_tapes) {
          EXPECT_EQ(got.result.tapes_played, 0u);
        }
        // Steps after the first two start from a state already seen: they are replayed.
        if (v.replay)
          EXPECT_GE(got.result.regions_replayed, 2u);
        else
          EXPECT_EQ(got.result.regions_replayed, 0u);
        for (const auto& [kind, v] : ref.stats.v_first) {
          EXPECT_EQ(got.stats.v_first.at(kind).layers, v.layers);
          EXPECT_NEAR(got.stats.v_first.at(kind).v_exposed_s, v.v_exposed_s, 1e-12);
        }
        for (const auto& [tier, v] : ref.stats.v_major) {
          EXPECT_EQ(got.stats.v_major.at(tier).blocks, v.blocks);
          EXPECT_EQ(got.stats.v_major.at(tier).active_blocks, v.active_blocks);
        }
        EXPECT_EQ(got.stats.v_major_cache_bytes, ref.stats.v_major_cache_bytes);
      }
    }
  }
}

// Transformer blocks are regions too: within one step, a block of a kind already simulated
// from the same start state is replayed, and the run stays the simulated one. Models whose
// blocks differ (SD3's last block, SD3.5 Medium's dual-attention blocks) name their kinds.
TEST(Replay, BlocksOfOneKindAreReplayedWithinAStep) {
  struct Case {
    std::string model;
    int doubles, singles;
  };
  for (const Case& c : {Case{"flux1-dev", 3, 6}, Case{"sd35-medium", 8, 0}, Case{"dit-xl-2", 5, 0},
                        Case{"qwen-image", 4, 0}}) {
    ModelConfig cfg = load_model_preset(c.model);
    cfg.double_blocks = c.doubles;
    cfg.single_blocks = c.singles;
    if (c.model == "sd35-medium") cfg.dual_attention_blocks = 3;
    for (const std::string strategy :
         {"flat", "tapa", "v_first", "tapa+v_first+pipeline", "cocodiff", "usp"}) {
      if (c.model != "flux1-dev" && strategy != "flat" && strategy != "cocodiff") continue;
      SCOPED_TRACE(c.model + " " + strategy);
      RunSettings st = phantom_settings(strategy, 1);
      st.resolution = c.model == "dit-xl-2" ? 256 : 128;
      emu::Engine off = aurora(2, "maxmin", 1, false, true, false);
      emu::Engine on = aurora(2, "maxmin", 1, true);
      const Outcome ref = run(off, cfg, st);
      const Outcome got = run(on, cfg, st);
      expect_same_timeline(got.result, ref.result);
      EXPECT_GE(got.result.regions_replayed, 1u);  // one step: only blocks can be replayed
      EXPECT_EQ(got.stats.v_major_cache_bytes, ref.stats.v_major_cache_bytes);
      for (const auto& [tier, v] : ref.stats.v_major) {
        EXPECT_EQ(got.stats.v_major.at(tier).blocks, v.blocks);
        EXPECT_EQ(got.stats.v_major.at(tier).sent_elements, v.sent_elements);
      }
      for (const auto& [kind, v] : ref.stats.v_first)
        EXPECT_EQ(got.stats.v_first.at(kind).layers, v.layers);
    }
  }
}

// V-Major refresh steps send everything: their key differs from a selective step's, so a
// refresh step is simulated (the first time from its start state), never replayed from a
// selective one, and the timeline stays the simulated one.
TEST(Replay, VMajorRefreshStepsAreSimulated) {
  const ModelConfig cfg = small_flux();
  RunSettings st = phantom_settings("cocodiff", 8);
  st.strategy_options.v_major_phantom_active_fraction = 0.25;  // a refresh sends more
  auto replayed = [&](int refresh_every, emu::RunResult* off_result) {
    st.strategy_options.v_major_refresh_every = refresh_every;
    const auto [a, b] = simulated_and_replayed(cfg, st);
    if (off_result != nullptr) *off_result = a.result;
    return b.result.regions_replayed;
  };
  emu::RunResult no_refresh, refresh;
  const std::uint64_t without = replayed(0, &no_refresh);
  const std::uint64_t with = replayed(3, &refresh);  // steps 3 and 6 send everything
  EXPECT_LT(with, without);
  EXPECT_GT(refresh.bytes_by_tier.back(), no_refresh.bytes_by_tier.back());
}

// A refresh step sends everything, as the warm-up step did, but exchanges layers whose cache is
// counted already: its blocks do the warm-up's work and replay the warm-up's records (only the
// V-Major cache a first exchange counts is told apart), and every figure stays the simulated one.
TEST(Replay, ARefreshStepReplaysTheWarmUpStepsBlocks) {
  ModelConfig cfg = load_model_preset("flux1-dev");
  cfg.double_blocks = 3;
  cfg.single_blocks = 3;
  RunSettings st = phantom_settings("cocodiff", 5);
  auto replayed = [&](int refresh_every) {
    st.strategy_options.v_major_refresh_every = refresh_every;
    const auto [ref, got] = simulated_and_replayed(cfg, st);
    EXPECT_GT(ref.stats.v_major_cache_bytes, 0);
    EXPECT_EQ(got.stats.v_major_cache_bytes, ref.stats.v_major_cache_bytes);
    for (const auto& [tier, v] : ref.stats.v_major) {
      EXPECT_EQ(got.stats.v_major.at(tier).full_elements, v.full_elements);
      EXPECT_EQ(got.stats.v_major.at(tier).sent_elements, v.sent_elements);
      EXPECT_EQ(got.stats.v_major.at(tier).blocks, v.blocks);
      EXPECT_EQ(got.stats.v_major.at(tier).active_blocks, v.active_blocks);
    }
    for (const auto& [kind, v] : ref.stats.v_first) {
      EXPECT_EQ(got.stats.v_first.at(kind).layers, v.layers);
      EXPECT_NEAR(got.stats.v_first.at(kind).v_exposed_s, v.v_exposed_s, 1e-12);
    }
    return got.result.regions_replayed;
  };
  // Steps 0 and 3 send everything. Without a refresh, steps 2 to 4 replay step 1 whole, as a
  // span of its 8 regions. With one, step 3 is a span of a key not seen before: its first block
  // of each kind starts from the end of a selective step, a start state the warm-up step never
  // had, and is simulated, and its other 4 blocks replay the warm-up step's records; steps 2 and
  // 4 replay step 1 whole as before (step 4 starts from the end of a full step, as step 1 did).
  const std::uint64_t selective = replayed(0), refresh = replayed(3);
  EXPECT_EQ(selective, refresh + 8 - 4);
}

// Real math marks the same regions and never replays: its timeline equals phantom mode's.
TEST(Replay, RealMathNeverReplaysAndHashesLikePhantom) {
  ModelConfig cfg = load_model_preset("flux1-tiny");
  cfg.double_blocks = 1;
  cfg.single_blocks = 1;
  RunSettings st;
  st.resolution = 128;
  st.steps = 3;
  st.strategy = "flat";
  emu::Engine real_engine = aurora(1, "maxmin", 1, true);
  const std::shared_ptr<const Weights> w = make_weights(cfg, 1, false);
  const emu::RunResult real =
      real_engine.run([&](Communicator& comm) { (void)generate(comm, cfg, *w, st); });
  EXPECT_EQ(real.regions_replayed, 0u);
  st.phantom = true;
  emu::Engine phantom_engine = aurora(1, "maxmin", 1, true);
  const Outcome phantom = run(phantom_engine, cfg, st);
  EXPECT_GT(phantom.result.regions_replayed, 0u);
  expect_same_timeline(phantom.result, real);
}

// Replay is the emulator's offer beside its communicators (core/replay.hpp): a one-rank run
// has none and generates the same image through the same pipeline without it.
TEST(Replay, OnlyTheEmulatorOffersIt) {
  LocalComm local;
  EXPECT_EQ(replay_of(local), nullptr);
  emu::Engine e = aurora(1, "maxmin", 1, true);
  std::atomic<int> offered{0};
  e.run([&](Communicator& world) {
    if (replay_of(world) != nullptr) ++offered;
    std::unique_ptr<Communicator> node = world.split(0, world.rank());
    EXPECT_NE(replay_of(*node), nullptr);  // a sub-group marks no region, but is the emulator's
  });
  EXPECT_EQ(offered.load(), 12);
}

// A rank failing at the start of a step ends the run with the same error, replay on or off.
TEST(Replay, InjectedFaultFailsTheSameWay) {
  const ModelConfig cfg = small_flux();
  RunSettings st = phantom_settings("flat", 6);
  st.on_step = [](int rank, int step) {
    if (rank == 5 && step == 4) throw std::runtime_error("injected fault");
  };
  std::string messages[2];
  for (int replay = 0; replay < 2; ++replay) {
    emu::Engine e = aurora(1, "maxmin", 1, replay == 1);
    try {
      run(e, cfg, st);
      ADD_FAILURE() << "the fault did not end the run";
    } catch (const RankError& ex) {
      messages[replay] = ex.what();
      EXPECT_EQ(ex.rank(), 5);
    }
  }
  EXPECT_NE(messages[0].find("injected fault"), std::string::npos) << messages[0];
  EXPECT_EQ(messages[0], messages[1]);
}

// One node of 4 GPUs of the hgx-h100 preset, whose device has a host ([device.host]).
emu::Engine hgx(int workers, bool replay, bool collective_ops, bool call_tapes, bool host = true) {
  Config cfg = Config::parse("[cluster]\npreset = \"hgx-h100\"\n", "run.toml");
  for (const char* kv : {"cluster.nodes=1", "cluster.topology.sizes=[4]", "cluster.nic.count=4",
                         "cluster.nic.rank_nic=[0,1,2,3]"})
    cfg.set(kv);
  Cluster c = load_cluster(cfg, kPresets);
  if (!host) c.device_params.host = HostParams{};
  emu::EngineOptions o;
  o.workers = workers;
  o.trace = false;
  o.replay = replay;
  o.collective_ops = collective_ops;
  o.call_tapes = call_tapes;
  return emu::Engine(c.topology, std::move(c.network),
                     std::make_shared<RooflineDevice>(c.device_params), o);
}

TEST(Replay, AHostModelKeepsEveryShortcutExact) {
  // A tile's host clock is part of the state a region starts from: replay, tapes and
  // collective-level collectives must give the timeline simulated message by message.
  const ModelConfig cfg = small_flux();
  for (const std::string strategy : {"flat", "cocodiff", "usp"}) {
    SCOPED_TRACE(strategy);
    RunSettings st = phantom_settings(strategy, 4);
    st.resolution = 256;
    emu::Engine off = hgx(1, false, false, false);
    const Outcome ref = run(off, cfg, st);
    emu::Engine no_host = hgx(1, false, false, false, false);
    // The host's issue costs make the steps longer than the device alone does.
    EXPECT_GT(ref.result.makespan, run(no_host, cfg, st).result.makespan);
    for (const int workers : {1, 2}) {
      emu::Engine on = hgx(workers, true, true, true);
      const Outcome got = run(on, cfg, st);
      expect_same_timeline(got.result, ref.result);
      EXPECT_GE(got.result.regions_replayed, 1u);
    }
  }
}

}  // namespace
}  // namespace cocodiff::dit
