// The CoCoDiff strategies on the emulator: exactness against the serial run and flat Ulysses
// (bitwise for TAPA and V-Major at threshold 0), uneven heads, Ulysses x Ring, the TAPA byte
// volumes per tier against the hierarchical all-to-all formulas, and V-First's time against a
// hand-computed closed form.

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <mutex>

#include "core/errors.hpp"
#include "dit/layers.hpp"
#include "dit/local_comm.hpp"
#include "dit/parallel/sp_attention.hpp"
#include "dit/parallel/strategies.hpp"
#include "dit/parallel/tapa.hpp"
#include "dit/pipeline.hpp"
#include "dit/quality.hpp"
#include "emulator/engine.hpp"
#include "net_models/device_model.hpp"
#include "net_models/network_model.hpp"
#include "tests/dit/emulated_runs.hpp"

namespace cocodiff::dit {
namespace {

using test::bitwise_equal;
using test::make_engine;
using test::Outcome;
using test::run;
using test::serial;

RunSettings small_run(int steps) {
  RunSettings st;
  st.resolution = 192;  // 24x24 latent, 144 image tokens
  st.steps = steps;
  st.seed = 9;
  return st;
}

TEST(Strategies, ExactStrategiesMatchSerialAndTapaIsBitwiseFlat) {
  const ModelConfig cfg = load_model_preset("flux1-tiny");
  const auto w = make_weights(cfg, 5, false);
  RunSettings st = small_run(2);
  const Tensor ref = serial(cfg, *w, st);
  // 12 ranks (2 heads each: pipeline chunks split them) and 24 ranks over 2 nodes (1 head
  // each: pipeline chunks split the tokens).
  for (int nodes : {1, 2}) {
    emu::Engine engine = make_engine(2, 6, nodes);
    st.strategy = "flat";
    const Outcome flat = run(engine, cfg, *w, st);
    EXPECT_LT(relative_l2(ref, flat.latent), 1e-5);
    Outcome tapa;
    for (const char* name : {"tapa", "v_first", "pipeline", "cocodiff"}) {
      st.strategy = name;
      st.strategy_options.v_major_threshold = 0;  // cocodiff exact
      const Outcome r = run(engine, cfg, *w, st);
      EXPECT_LT(relative_l2(ref, r.latent), 1e-5) << name << " nodes " << nodes;
      // Pipelining reorders nothing numerically (same values, prepared in parts) and really
      // sends Q and K in 2 parts each: more transfers for the same bytes.
      if (std::string(name) == "pipeline") {
        EXPECT_TRUE(bitwise_equal(tapa.latent, r.latent)) << "pipeline vs tapa, nodes " << nodes;
        EXPECT_GT(r.result.flows, tapa.result.flows) << "nodes " << nodes;
      }
      if (std::string(name) == "tapa") tapa = r;
      // TAPA: bitwise flat's output; more bytes inside a node, the same across nodes.
      if (std::string(name) == "tapa") {
        EXPECT_TRUE(bitwise_equal(flat.latent, r.latent)) << "tapa vs flat, nodes " << nodes;
        EXPECT_GT(r.result.bytes_by_tier[0], flat.result.bytes_by_tier[0]);
        // (TAPA's splits add a few hundred bytes of their own.)
        EXPECT_NEAR(static_cast<double>(r.result.bytes_by_tier[2]),
                    static_cast<double>(flat.result.bytes_by_tier[2]),
                    1e-3 * static_cast<double>(flat.result.bytes_by_tier[2]));
      }
    }
  }
}

// A test-only strategy bug: flat Ulysses, except that one rank, at its third attention layer,
// waits for a message rank 0 never sends instead of joining the all-to-all. The run must end
// with a deadlock report naming both sides, not hang.
class LosesAnExchange final : public AttentionStrategy {
 public:
  LosesAnExchange(Communicator& comm, const ModelConfig& cfg, int bad_rank)
      : comm_(comm), flat_(make_attention_strategy("flat", comm, cfg)), bad_rank_(bad_rank) {}
  std::string name() const override { return "loses_an_exchange"; }
  int degree() const override { return flat_->degree(); }
  int index() const override { return flat_->index(); }
  std::vector<Tensor> attend(const Exec& ex, const QkvSource& src,
                             const AttentionShape& shape) override {
    if (comm_.rank() == bad_rank_ && ++calls_ == 3) {
      std::vector<float> buf(4);
      comm_.recv(buf, 4, 0, 77);
    }
    return flat_->attend(ex, src, shape);
  }

 private:
  Communicator& comm_;
  std::unique_ptr<AttentionStrategy> flat_;
  int bad_rank_;
  int calls_ = 0;
};

TEST(Strategies, AStrategyThatLeavesRanksWaitingIsReportedAsADeadlock) {
  const ModelConfig cfg = load_model_preset("flux1-tiny");
  const auto w = make_weights(cfg, 5, false);
  RunSettings st = small_run(2);
  st.make_strategy = [](Communicator& comm, const ModelConfig& c) {
    return std::make_unique<LosesAnExchange>(comm, c, 5);
  };
  emu::Engine engine = make_engine(2, 6, 1);
  const auto t0 = std::chrono::steady_clock::now();
  try {
    run(engine, cfg, *w, st);
    FAIL() << "expected a deadlock report";
  } catch (const CommError& e) {
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const std::string m = e.what();
    EXPECT_NE(m.find("deadlock"), std::string::npos) << m;
    EXPECT_NE(m.find("rank 5 waits in recv of 4 elements from rank 0"), std::string::npos) << m;
    EXPECT_NE(m.find("rank 0 waits in all_to_all"), std::string::npos) << m;
    // The watchdog reports within a second of the last progress; the budget also covers the steps
    // before the lost exchange on a loaded machine (sanitized builds run slower by their scale).
    EXPECT_LT(s, 3.0 * COCODIFF_TEST_TIME_SCALE) << "the report came after " << s << " s";
    std::printf("deadlock reported after %.3f s of wall time:\n%s\n", s, m.c_str());
  }
}

TEST(Strategies, SingleStreamAndDualAttentionModelsMatchSerial) {
  // flux2-tiny: fused Q/K/V + MLP projection in single blocks, 4-axis RoPE.
  for (const char* model : {"sd35-tiny", "dit-xl-2-tiny", "flux2-tiny"}) {
    const ModelConfig cfg = load_model_preset(model);
    const auto w = make_weights(cfg, 5, false);
    RunSettings st = small_run(2);
    const Tensor ref = serial(cfg, *w, st);
    emu::Engine engine = make_engine(2, 6, 2);
    for (const char* name : {"cocodiff", "usp"}) {
      st.strategy = name;
      st.strategy_options.v_major_threshold = 0;
      EXPECT_LT(relative_l2(ref, run(engine, cfg, *w, st).latent), 1e-5) << model << " " << name;
    }
  }
}

// A 64 x 128 px image (height x width): a 4 x 8 token grid. Positions (RoPE rows and columns,
// 2-D sin-cos embeddings) and the token shards must follow the rectangle; every parallel run
// equals the serial one, and the latent is [C, 8 x 16].
TEST(Strategies, NonSquareImagesMatchSerial) {
  for (const char* model : {"flux1-tiny", "qwen-image-tiny", "sd35-tiny", "dit-xl-2-tiny"}) {
    const ModelConfig cfg = load_model_preset(model);
    const auto w = make_weights(cfg, 5, false);
    RunSettings st = small_run(2);
    st.height = 64;
    st.width = 128;
    LocalComm local;
    st.strategy = "serial";
    const RunOutput ref = generate(local, cfg, *w, st);
    ASSERT_EQ(ref.latent_height, 64 / cfg.vae_scale) << model;
    ASSERT_EQ(ref.latent_width, 128 / cfg.vae_scale) << model;
    EXPECT_EQ(ref.latent.cols(), std::int64_t{ref.latent_height} * ref.latent_width) << model;
    EXPECT_EQ(ref.tokens, cfg.image_tokens(64, 128)) << model;
    // The rectangle is not its transpose: a 128 x 64 run gives another image.
    RunSettings tr = st;
    std::swap(tr.height, tr.width);
    const Tensor t = generate(local, cfg, *w, tr).latent;
    ASSERT_EQ(t.numel(), ref.latent.numel());
    EXPECT_FALSE(bitwise_equal(t, ref.latent)) << model;
    emu::Engine four = make_engine(2, 2, 1);
    st.strategy = "flat";
    EXPECT_LT(relative_l2(ref.latent, run(four, cfg, *w, st).latent), 1e-5) << model;
    emu::Engine eight = make_engine(2, 2, 2);
    st.strategy = "cocodiff";
    st.strategy_options.v_major_threshold = 0;
    EXPECT_LT(relative_l2(ref.latent, run(eight, cfg, *w, st).latent), 1e-5) << model;
  }
}

// CFG-parallel: the conditional pass on ranks 0-7, the unconditional one on ranks 8-15, each
// half sequence-parallel on its own; the result matches the serial run for batch CFG (SD3.5,
// DiT) and true CFG (Qwen-Image). A model without an unconditional pass is refused.
TEST(Strategies, CfgParallelMatchesSerial) {
  emu::Engine engine = make_engine(2, 4, 2);  // 16 ranks
  for (const char* model : {"sd35-tiny", "dit-xl-2-tiny", "qwen-image-tiny"}) {
    const ModelConfig cfg = load_model_preset(model);
    const auto w = make_weights(cfg, 5, false);
    RunSettings st = small_run(2);
    const Tensor ref = serial(cfg, *w, st);
    st.cfg_degree = 2;
    st.strategy_options.uneven_heads = true;
    st.strategy_options.v_major_threshold = 0;
    for (const char* name : {"flat", "tapa", "cocodiff"}) {
      st.strategy = name;
      const Outcome got = run(engine, cfg, *w, st);
      EXPECT_LT(relative_l2(ref, got.latent), 1e-5) << model << " " << name;
    }
  }
  const ModelConfig flux = load_model_preset("flux1-tiny");  // guidance-distilled: no CFG
  const auto w = make_weights(flux, 5, false);
  RunSettings st = small_run(1);
  st.cfg_degree = 2;
  try {
    run(engine, flux, *w, st);
    FAIL() << "CFG-parallel accepted for a model without an unconditional pass";
  } catch (const RankError& e) {
    EXPECT_NE(std::string(e.what()).find("parallel.cfg_degree"), std::string::npos) << e.what();
  }
}

TEST(Strategies, UnevenHeadsAndUspMatchSerial) {
  const ModelConfig cfg = load_model_preset("qwen-image-tiny");  // 24 heads
  const auto w = make_weights(cfg, 5, false);
  RunSettings st = small_run(2);
  const Tensor ref = serial(cfg, *w, st);
  // 2 x 4 x 2 = 16 ranks: 24 heads split [2 x 8, 1 x 8].
  emu::Engine engine = make_engine(2, 4, 2);
  st.strategy = "flat";
  try {
    run(engine, cfg, *w, st);
    FAIL() << "24 heads over 16 ranks accepted without ulysses.uneven_heads";
  } catch (const RankError& e) {
    EXPECT_NE(std::string(e.what()).find("uneven_heads"), std::string::npos) << e.what();
  }
  st.strategy_options.uneven_heads = true;
  for (const char* name : {"flat", "tapa", "cocodiff"}) {
    st.strategy = name;
    st.strategy_options.v_major_threshold = 0;
    EXPECT_LT(relative_l2(ref, run(engine, cfg, *w, st).latent), 1e-5) << name;
  }
  // Ulysses over 2 x 4 = 8 ranks (3 heads each), ring over 2 nodes; and Ulysses over the tiles
  // only (12 heads each), ring over gpu x node.
  st.strategy = "usp";
  EXPECT_LT(relative_l2(ref, run(engine, cfg, *w, st).latent), 1e-5);
  st.strategy_options.usp_ring_levels = 2;
  EXPECT_LT(relative_l2(ref, run(engine, cfg, *w, st).latent), 1e-5);
  // More ranks than Ulysses can give heads to: 2 x 4 x 4 = 32 ranks, 24 heads, usp 8 x 4.
  emu::Engine big = make_engine(2, 4, 4);
  st.strategy_options.usp_ring_levels = 1;
  st.resolution = 128;  // 64 tokens, 2 per rank
  const Tensor ref2 = serial(cfg, *w, st);
  EXPECT_LT(relative_l2(ref2, run(big, cfg, *w, st).latent), 1e-5);
}

// More ranks than heads, as FLUX on 48 or 96 tiles: 24 heads over 32 ranks leave 8 ranks with
// no head in attention, and pipelining splits tokens. Ulysses x Ring with an uneven Ulysses
// split: 24 heads over 10 ranks (2 tiles x 5 GPUs), ring across 2 nodes.
TEST(Strategies, FewerHeadsThanRanksAndUnevenUspMatchSerial) {
  const ModelConfig cfg = load_model_preset("qwen-image-tiny");  // 24 heads
  const auto w = make_weights(cfg, 5, false);
  RunSettings st = small_run(2);
  st.resolution = 128;  // 64 image tokens: 2 per rank
  st.strategy_options.uneven_heads = true;
  st.strategy_options.v_major_threshold = 0;
  const Tensor ref = serial(cfg, *w, st);
  emu::Engine engine = make_engine(2, 4, 4);
  Outcome tapa;
  for (const char* name : {"flat", "tapa", "pipeline", "cocodiff"}) {
    st.strategy = name;
    const Outcome r = run(engine, cfg, *w, st);
    EXPECT_LT(relative_l2(ref, r.latent), 1e-5) << name;
    if (std::string(name) == "tapa") tapa = r;
    if (std::string(name) == "pipeline") {
      EXPECT_TRUE(bitwise_equal(tapa.latent, r.latent));
      EXPECT_GT(r.result.flows, tapa.result.flows);
    }
  }
  emu::Engine odd = make_engine(2, 5, 2);
  st.strategy = "usp";
  st.resolution = 192;
  EXPECT_LT(relative_l2(serial(cfg, *w, st), run(odd, cfg, *w, st).latent), 1e-5);
}

// Text sharded over the Ulysses group (xDiT's split of the text embeddings): every family with
// a text stream, every strategy (usp: over its Ulysses groups, the same on every ring member),
// batch CFG (SD3.5), true CFG (Qwen-Image), CFG-parallel and an uneven head split match the
// serial run; the text really takes the exchanges (other bytes than the replicated run), and a
// degree that does not divide the text is refused naming parallel.shard_text.
TEST(Strategies, ShardedTextMatchesSerialOnEveryTextFamily) {
  struct Case {
    const char* model;
    int tiles, gpus, nodes;  // the Ulysses degree (all ranks) divides the model's text tokens
    bool uneven;
  };
  // sd35-tiny: 12 text tokens over 4; flux1/flux2-tiny: 16 over 8 (2 nodes: usp 4 x 2) and 4;
  // qwen-image-tiny: 10 over 10 (24 heads: uneven).
  for (const Case& c :
       {Case{"sd35-tiny", 2, 2, 1, false}, Case{"flux1-tiny", 2, 2, 2, false},
        Case{"flux2-tiny", 2, 2, 1, false}, Case{"qwen-image-tiny", 2, 5, 1, true}}) {
    const ModelConfig cfg = load_model_preset(c.model);
    const auto w = make_weights(cfg, 5, false);
    RunSettings st = small_run(2);
    const Tensor ref = serial(cfg, *w, st);
    emu::Engine engine = make_engine(c.tiles, c.gpus, c.nodes);
    st.strategy_options.uneven_heads = c.uneven;
    st.strategy_options.v_major_threshold = 0;
    std::vector<std::string> names = {"flat", "tapa", "pipeline", "cocodiff"};
    if (c.nodes > 1) names.push_back("usp");
    for (const std::string& name : names) {
      st.strategy = name;
      st.strategy_options.shard_text = false;
      const Outcome replicated = run(engine, cfg, *w, st);
      st.strategy_options.shard_text = true;
      const Outcome sharded = run(engine, cfg, *w, st);
      EXPECT_LT(relative_l2(ref, sharded.latent), 1e-5) << c.model << " " << name;
      EXPECT_NE(sharded.result.bytes_by_tier, replicated.result.bytes_by_tier)
          << c.model << " " << name;
    }
  }
  // CFG-parallel: each half of 4 ranks shards the text of its own branch (12 tokens over 4).
  {
    const ModelConfig cfg = load_model_preset("sd35-tiny");
    const auto w = make_weights(cfg, 5, false);
    RunSettings st = small_run(2);
    const Tensor ref = serial(cfg, *w, st);
    emu::Engine engine = make_engine(2, 2, 2);
    st.cfg_degree = 2;
    st.strategy = "tapa";
    st.strategy_options.shard_text = true;
    EXPECT_LT(relative_l2(ref, run(engine, cfg, *w, st).latent), 1e-5) << "cfg-parallel";
  }
  // 16 text tokens over 12 ranks, and a model without text, are refused.
  const ModelConfig flux = load_model_preset("flux1-tiny");
  const auto fw = make_weights(flux, 5, false);
  RunSettings st = small_run(1);
  st.strategy_options.shard_text = true;
  emu::Engine twelve = make_engine(2, 6, 1);
  for (const char* name : {"flat", "usp"}) {
    st.strategy = name;
    st.strategy_options.usp_ring_levels = 0;  // usp: Ulysses over all 12
    try {
      run(twelve, flux, *fw, st);
      FAIL() << name << ": 16 text tokens sharded over 12 ranks";
    } catch (const RankError& e) {
      EXPECT_NE(std::string(e.what()).find("parallel.shard_text"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("16 text tokens"), std::string::npos) << e.what();
    }
  }
  const ModelConfig dit = load_model_preset("dit-xl-2-tiny");
  const auto dw = make_weights(dit, 5, false);
  st.strategy = "flat";
  try {
    run(twelve, dit, *dw, st);
    FAIL() << "text sharding accepted for a model without text";
  } catch (const RankError& e) {
    EXPECT_NE(std::string(e.what()).find("parallel.shard_text"), std::string::npos) << e.what();
  }
}

// Phantom mode cannot measure how much V changed: V-Major sends the stated share of blocks
// (v_major.phantom_active_fraction; a quarter here, the measured default being all of them) on
// its tiers after the warm-up, and nothing else changes.
TEST(Strategies, PhantomVMajorSendsItsActiveFraction) {
  const ModelConfig cfg = load_model_preset("flux1-tiny");
  const auto w = make_weights(cfg, 5, true);
  RunSettings st = small_run(2);
  st.phantom = true;
  st.strategy_options.v_major_phantom_active_fraction = 0.25;
  st.strategy_options.v_major_warmup_steps = 1;
  emu::Engine engine = make_engine(2, 6, 2);
  st.strategy = "tapa+v_first+pipeline";
  const Outcome exact = run(engine, cfg, *w, st);
  st.strategy = "cocodiff";
  const Outcome vm = run(engine, cfg, *w, st);
  const VMajorTierStats& t = vm.stats.v_major.at("inter-node");
  // Step 0 sends every block, step 1 a quarter of them.
  const double active = static_cast<double>(t.active_blocks) / static_cast<double>(t.blocks);
  EXPECT_NEAR(active, (1 + st.strategy_options.v_major_phantom_active_fraction) / 2, 0.02);
  EXPECT_LT(t.sent_elements, 0.7 * t.full_elements);
  EXPECT_LT(vm.result.bytes_by_tier[2], exact.result.bytes_by_tier[2]);
  EXPECT_EQ(vm.result.bytes_by_tier[0], exact.result.bytes_by_tier[0]);
  EXPECT_EQ(vm.result.bytes_by_tier[1], exact.result.bytes_by_tier[1]);
}

// Pipelining by heads launches what a GPU framework launches: each head group's Q/K norm reads
// a strided slice of the projection (its `_strided` label), and the groups received are
// concatenated once per Q and K (chunk_concat). The unpipelined strategies launch neither.
TEST(Strategies, HeadGroupsChargeTheirStridedNormsAndTheirConcatenation) {
  const ModelConfig cfg = load_model_preset("flux1-tiny");
  const auto w = make_weights(cfg, 5, true);
  RunSettings st = small_run(1);
  st.phantom = true;
  Topology topo({{"gpu", 2, "intra-node"}});
  RooflineParams p;
  p.peak_flops_per_s = 1e12;
  p.hbm_bytes_per_s = 1e11;
  p.strided_factor[static_cast<size_t>(OpKind::kNorm)] = 1.5;
  emu::EngineOptions o;
  o.workers = 1;
  o.trace = true;
  emu::Engine engine(topo,
                     std::make_unique<AlphaBetaModel>(
                         topo, std::vector<LinkCost>{{SimTime::from_ns(2000), 100e9}}),
                     std::make_shared<RooflineDevice>(p), o);
  auto count = [](const emu::RunResult& r, std::string_view label) {
    int n = 0;
    for (const emu::TraceEvent& e : r.trace)
      if (e.kind == emu::TraceEvent::Kind::kCompute && e.rank == 0 && r.labels[e.label] == label)
        ++n;
    return n;
  };
  st.strategy = "tapa+v_first";
  const emu::RunResult plain = run(engine, cfg, *w, st).result;
  st.strategy = "tapa+v_first+pipeline";
  const emu::RunResult piped = run(engine, cfg, *w, st).result;
  ASSERT_FALSE(plain.trace_truncated || piped.trace_truncated);
  for (const char* l : {"q_norm_strided", "k_norm_strided", "chunk_concat"})
    EXPECT_EQ(count(plain, l), 0) << l;
  const int layers = count(plain, "q_norm") / 2;  // image and text streams, one norm each
  ASSERT_GT(layers, 0);
  // Two head groups of the image's Q and of its K a layer, one concatenation each.
  EXPECT_EQ(count(piped, "q_norm_strided"), 2 * layers);
  EXPECT_EQ(count(piped, "k_norm_strided"), 2 * layers);
  EXPECT_EQ(count(piped, "chunk_concat"), 2 * layers);
  EXPECT_EQ(count(piped, "q_norm"), layers);  // the text's, replicated and whole
}

TEST(Strategies, VMajorThresholdZeroIsBitwiseExactAndAboveZeroSavesBytes) {
  const ModelConfig cfg = load_model_preset("flux1-tiny");
  const auto w = make_weights(cfg, 5, false);
  RunSettings st = small_run(4);
  emu::Engine engine = make_engine(2, 6, 2);
  st.strategy = "tapa";
  const Outcome exact = run(engine, cfg, *w, st);
  st.strategy = "v_major";
  st.strategy_options.v_major_warmup_steps = 1;
  st.strategy_options.v_major_threshold = 0;
  const Outcome zero = run(engine, cfg, *w, st);
  EXPECT_TRUE(bitwise_equal(exact.latent, zero.latent));
  ASSERT_TRUE(zero.stats.v_major.count("inter-node"));
  EXPECT_GT(zero.stats.v_major_cache_bytes, 0);
  st.strategy_options.v_major_threshold = 0.5;
  st.strategy_options.v_major_block_tokens = 4;
  const Outcome lossy = run(engine, cfg, *w, st);
  const VMajorTierStats& t = lossy.stats.v_major.at("inter-node");
  EXPECT_LT(t.sent_elements, t.full_elements);
  EXPECT_LT(t.active_blocks, t.blocks);
  EXPECT_LT(lossy.result.bytes_by_tier[2], exact.result.bytes_by_tier[2]);
  EXPECT_EQ(lossy.result.bytes_by_tier[0], exact.result.bytes_by_tier[0]);  // slow tier only
  const double e = relative_l2(exact.latent, lossy.latent);
  EXPECT_GT(e, 0.0);
  EXPECT_LT(e, 0.5);
  // A refresh every other step (steps 0 and 2 of 4) sends everything at step 2: more than
  // with no refresh in those 4 steps, less than everything, and the mirror and the receivers'
  // caches restart from the exact V there.
  st.strategy_options.v_major_refresh_every = 2;
  const Outcome refreshed = run(engine, cfg, *w, st);
  const VMajorTierStats& tr = refreshed.stats.v_major.at("inter-node");
  EXPECT_EQ(tr.full_elements, t.full_elements);
  EXPECT_GT(tr.sent_elements, t.sent_elements);
  EXPECT_LT(tr.sent_elements, tr.full_elements);
  EXPECT_GT(tr.active_blocks, t.active_blocks);
  EXPECT_GT(relative_l2(exact.latent, refreshed.latent), 0.0);
  // A refresh every step sends everything: bitwise exact again.
  st.strategy_options.v_major_refresh_every = 1;
  EXPECT_TRUE(bitwise_equal(exact.latent, run(engine, cfg, *w, st).latent));
}

TEST(Strategies, VFirstIsNeverSlowerThanTapaOnFullSizeModels) {
  for (const char* model : {"flux1-dev", "sd35-large"}) {
    const ModelConfig cfg = load_model_preset(model);
    const auto w = make_weights(cfg, 0, true);
    RunSettings st;
    st.resolution = 1024;
    st.steps = 1;
    st.phantom = true;
    st.strategy_options.uneven_heads = true;  // SD3.5 Large: 38 heads over 24 ranks
    emu::Engine engine = make_engine(2, 6, 2);
    st.strategy = "tapa";
    const Outcome tapa = run(engine, cfg, *w, st);
    st.strategy = "v_first";
    const Outcome vf = run(engine, cfg, *w, st);
    EXPECT_LE(vf.result.makespan, tapa.result.makespan) << model;
    EXPECT_FALSE(vf.stats.v_first.empty());
    st.strategy = "flat";
    EXPECT_LT(tapa.result.makespan, run(engine, cfg, *w, st).result.makespan) << model;
  }
}

// A layer with hand-set costs: V projection cv, Q/K projection cq, Q/K norm cn (seconds at a
// 1 TFLOP/s unit device: flops = seconds * 1e12), one sharded stream.
class CostedQkv final : public QkvSource {
 public:
  CostedQkv(std::int64_t local, std::int64_t total, double cv, double cq, double cn)
      : local_(local), total_(total), cv_(cv), cq_(cq), cn_(cn) {}
  int num_streams() const override { return 1; }
  bool sharded(int) const override { return true; }
  std::int64_t total_tokens(int) const override { return total_; }
  std::int64_t rows(int) const override { return local_; }
  Tensor project(const Exec& ex, int, QkvPart part, int h0, int h1) const override {
    ex.charge(OpKind::kGemm, (part == QkvPart::kV ? cv_ : cq_) * 1e12, 0, "proj");
    return Tensor::zeros(local_, std::int64_t{h1 - h0} * kHeadDim, true);
  }
  void prepare(const Exec& ex, int, QkvPart part, Tensor&, int, int, std::int64_t) const override {
    if (part != QkvPart::kV) ex.charge(OpKind::kNorm, cn_ * 1e12, 0, "norm");
  }
  static constexpr int kHeadDim = 64;

 private:
  std::int64_t local_, total_;
  double cv_, cq_, cn_;
};

// V-First on two tiles against its closed form, once with V's exchange shorter than the Q/K
// preparation (the overlap condition holds, V is hidden) and once on a slow link where it does
// not (V's exchange outlasts Q/K and the rank waits for it).
TEST(Strategies, VFirstTimeMatchesTheClosedFormOverlap) {
  for (const double bw : {1e9, 1e8}) {
    SCOPED_TRACE("link bandwidth " + std::to_string(bw));
    // 2 ranks (two tiles of one GPU), alpha-beta link, unit device with free memory traffic.
    Topology topo({{"tile", 2, "die-to-die"}});
    const double alpha_s = 10e-6;
    RooflineParams dev;
    dev.peak_flops_per_s = 1e12;
    dev.hbm_bytes_per_s = 1e30;  // packing is free: only the charged FLOPs take time
    emu::EngineOptions o;
    o.workers = 1;
    o.trace = false;
    emu::Engine engine(topo,
                       std::make_unique<AlphaBetaModel>(
                           topo, std::vector<LinkCost>{{SimTime::from_seconds(alpha_s), bw}}),
                       std::make_shared<RooflineDevice>(dev), o);
    const int heads = 2;
    const std::int64_t total = 1000, local = 500;
    // One block: local tokens x one head, 2 wire bytes per element: 74 us at 1 GB/s, 650 us at
    // 100 MB/s.
    const double a2a = alpha_s + static_cast<double>(local * CostedQkv::kHeadDim * 2) / bw;
    const double cv = 20e-6, cq = 60e-6, cn = 20e-6;
    const double attn = 4.0 * 1 * total * total * CostedQkv::kHeadDim / 1e12;  // 1 head, batch 1
    ModelConfig cfg = load_model_preset("flux1-tiny");
    cfg.heads = heads;
    auto layer_time = [&](const std::string& name) {
      StrategyStats stats;
      const emu::RunResult r = engine.run([&](Communicator& comm) {
        std::unique_ptr<AttentionStrategy> s = make_attention_strategy(name, comm, cfg);
        const Exec ex{comm, true};
        const CostedQkv src(local, total, cv, cq, cn);
        s->attend(ex, src, {heads, CostedQkv::kHeadDim, 1, "costed"});
        if (comm.rank() == 0) stats = s->stats();
      });
      return std::make_pair(r.makespan.seconds(), stats);
    };
    // Blocking: Q, K, V each wait for their exchange, then attention and the output exchange.
    const double tapa_expected = cv + 2 * (cq + cn) + 4 * a2a + attn;
    // V-First: V flies from cv, Q's exchange from cv + (cq + cn), K's from cv + 2 (cq + cn);
    // with no contention on an alpha-beta link each takes a2a, so K's ends last.
    const double vf_expected = cv + 2 * (cq + cn) + 2 * a2a + attn;
    const auto [tapa_s, tapa_stats] = layer_time("tapa");
    const auto [vf_s, vf_stats] = layer_time("v_first");
    EXPECT_NEAR(tapa_s, tapa_expected, 1e-8);
    EXPECT_NEAR(vf_s, vf_expected, 1e-8);
    const VFirstKindStats& k = vf_stats.v_first.at("costed");
    const double qk = 2 * (cq + cn);
    EXPECT_EQ(k.layers, 1);
    EXPECT_NEAR(k.v_proj_s, cv, 1e-8);
    EXPECT_NEAR(k.qk_prep_s, qk, 1e-8);
    // V's one phase takes exactly a2a (its completion time, not when the rank looked).
    EXPECT_NEAR(k.v_phase1_s, a2a, 1e-8);
    EXPECT_NEAR(k.v_transfer_s, a2a, 1e-8);
    // The rank reaches V's wait at cv + qk and waits for whatever of V is still in flight.
    EXPECT_NEAR(k.v_exposed_s, std::max(0.0, a2a - qk), 1e-8);
    const bool holds = cv + a2a <= qk;
    EXPECT_EQ(holds, bw == 1e9);  // 94 us <= 160 us; 670 us > 160 us
    EXPECT_EQ(k.condition_held, holds ? 1 : 0);
    EXPECT_EQ(k.phase1_hidden, a2a <= qk ? 1 : 0);
    EXPECT_LT(vf_s, tapa_s);
  }
}

// Every block carries (source, destination) so misplaced data shows.
TEST(Strategies, TapaBytesPerTierMatchTheHierarchicalFormula) {
  const int tiles = 2, gpus = 3, nodes = 2, p = tiles * gpus * nodes;
  const std::int64_t m = 1000;  // elements per destination block
  std::vector<std::int64_t> bytes[2];
  for (int tapa = 0; tapa < 2; ++tapa) {
    emu::Engine engine = make_engine(tiles, gpus, nodes);
    // The splits' own traffic, subtracted below.
    const emu::RunResult setup =
        engine.run([&](Communicator& comm) { const SpGroup g(comm, tapa == 1); });
    const emu::RunResult r = engine.run([&](Communicator& comm) {
      const SpGroup g(comm, tapa == 1);
      EXPECT_EQ(static_cast<int>(g.phases().size()), tapa == 1 ? 3 : 1);
      const Exec ex{comm, false};
      BlockExchange x(g, BlockShapeFn::uniform(p, 1, m), false, "a2a");
      const int me = comm.rank();
      x.start(ex, [&](int d, MatMap out) { out.setConstant(static_cast<float>(me * 1000 + d)); });
      x.finish(ex);
      for (int s = 0; s < p; ++s) {
        const ConstMatMap b = x.block(s);
        EXPECT_EQ(b.minCoeff(), static_cast<float>(s * 1000 + me));
        EXPECT_EQ(b.maxCoeff(), static_cast<float>(s * 1000 + me));
      }
    });
    bytes[tapa] = r.bytes_by_tier;
    for (size_t k = 0; k < bytes[tapa].size(); ++k) bytes[tapa][k] -= setup.bytes_by_tier[k];
  }
  const std::int64_t mb = m * 2;  // wire bytes per block (2 per element)
  // Flat: a rank's blocks go straight to their destination's tier.
  EXPECT_EQ(bytes[0][0], p * (tiles - 1) * mb);
  EXPECT_EQ(bytes[0][1], p * tiles * (gpus - 1) * mb);
  EXPECT_EQ(bytes[0][2], p * tiles * gpus * (nodes - 1) * mb);
  // TAPA, phase per level: (size_k - 1) peers, each getting P / size_k blocks.
  EXPECT_EQ(bytes[1][0], p * (tiles - 1) * (p / tiles) * mb);
  EXPECT_EQ(bytes[1][1], p * (gpus - 1) * (p / gpus) * mb);
  EXPECT_EQ(bytes[1][2], p * (nodes - 1) * (p / nodes) * mb);
  EXPECT_EQ(bytes[1][2], bytes[0][2]);  // (N-1) G m across nodes either way
}

// Two exchanges in flight on the same phase communicators, polled at different times on
// different ranks: A is big, B tiny, so B's first phase ends long before A's. GPU 1's tiles poll
// while A is still in flight, GPU 0's only after it ended. Without the launch limit GPU 1 would
// issue B's phase 1 before A's and GPU 0 A's first: a size mismatch.
TEST(Strategies, ConcurrentTapaExchangesIssuePhasesInOrder) {
  emu::Engine engine = make_engine(2, 2, 2);  // 8 ranks, 3 phases
  for (const bool limit : {true, false}) {
    auto body = [&](Communicator& comm) {
      const SpGroup g(comm, true);
      const Exec ex{comm, true};  // phantom: sizes only
      BlockExchange a(g, BlockShapeFn::uniform(g.size(), 1, 100'000'000), true, "a");
      BlockExchange b(g, BlockShapeFn::uniform(g.size(), 1, 10), true, "b");
      a.start(ex, {});
      b.start(ex, {});
      for (int i = 0; i < 40; ++i) {             // 40 x 200 us of work; A's first phase takes ~4 ms
        if (comm.coords(comm.rank())[1] == 1) {  // GPU 1 polls; phase 1 groups GPUs 0 and 1
          a.progress(ex);
          b.progress(ex, limit ? a.issued_phases() : 1 << 30);
        }
        comm.compute({OpKind::kGemm, 5.46e10, 0, "work"});
      }
      while (!a.done() || !b.done()) {
        a.progress(ex);
        b.progress(ex, limit ? a.issued_phases() : 1 << 30);
        (a.done() ? b : a).wait_step(ex);
      }
    };
    if (limit)
      EXPECT_NO_THROW(engine.run(body));
    else
      EXPECT_THROW(engine.run(body), RankError);  // mismatched collectives: the test can tell
  }
}

TEST(Strategies, NamesAndCompositions) {
  EXPECT_TRUE(attention_strategy_error("cocodiff").empty());
  EXPECT_TRUE(attention_strategy_error("flat+v_first+pipeline").empty());
  EXPECT_NE(attention_strategy_error("flat+tapa").find("one exchange"), std::string::npos);
  EXPECT_NE(attention_strategy_error("tapa+warp").find("warp"), std::string::npos);
  StrategyOptions o;
  o.v_major_threshold = 0;
  EXPECT_FALSE(attention_strategy_is_lossy("cocodiff", o));
  o.v_major_threshold = 0.1;
  EXPECT_TRUE(attention_strategy_is_lossy("cocodiff", o));
  EXPECT_FALSE(attention_strategy_is_lossy("v_first", o));
}

}  // namespace
}  // namespace cocodiff::dit
