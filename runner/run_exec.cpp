#include "runner/run_exec.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <new>
#include <sstream>
#include <string_view>

#include "core/atomic_file.hpp"
#include "core/errors.hpp"
#include "core/hash.hpp"
#include "dit/image.hpp"
#include "dit/model.hpp"
#include "dit/quality.hpp"
#include "dit/safetensors.hpp"
#include "dit/weights.hpp"
#include "emulator/chrome_trace.hpp"
#include "emulator/timeline_plot.hpp"
#include "runner/measured_rates.hpp"
#include "runner/memory_estimate.hpp"

namespace cocodiff::apps {

nlohmann::ordered_json base_report(const RunPlan& plan, const std::string& backend) {
  const Topology& t = plan.cluster.topology;
  nlohmann::ordered_json r;
  r["backend"] = backend;
  r["strategy"] = plan.settings.strategy;
  r["ulysses_degree"] = plan.ulysses_degree;
  r["ring_degree"] = plan.ring_degree;
  r["cfg_degree"] = plan.settings.cfg_degree;
  if (dit::attention_strategy_layout(plan.settings.strategy, plan.settings.strategies.get()).kind ==
      dit::StrategyLayout::Kind::kStages) {
    const dit::StrategyOptions& o = plan.settings.strategy_options;
    r[plan.settings.strategy] = {{"degree", plan.pipefusion_degree},
                                 {"patches", o.pipefusion_patches},
                                 {"warmup_steps", o.pipefusion_warmup_steps}};
  }
  r["shard_text"] = plan.settings.strategy_options.shard_text;
  r["model"] = plan.model.name;
  r["cluster"] = plan.cluster.name;
  r["network"] = plan.cluster.network_kind;
  r["device"] = plan.cluster.device->name();
  r["ranks"] = t.num_ranks();
  r["nodes"] = t.num_nodes();
  r["math"] = plan.math;
  r["steps"] = plan.settings.steps;
  // resolution: pixels per side of a square image, null for a rectangle (height x width).
  r["resolution"] = plan.settings.resolution > 0 ? nlohmann::ordered_json(plan.settings.resolution)
                                                 : nlohmann::ordered_json(nullptr);
  r["height"] = plan.settings.pixel_height();
  r["width"] = plan.settings.pixel_width();
  r["frames"] = plan.settings.frames;  // video frames (1: an image)
  r["latent_frames"] = plan.model.latent_frames(plan.settings.frames);
  if (!plan.motion.empty()) {  // the condition row names the class and the motion
    r["class_label"] = plan.settings.class_label % plan.model.classes();
    r["motion"] = plan.motion;
  }
  r["tokens"] = plan.tokens();
  r["seed"] = plan.settings.seed;
  r["status"] = "ok";
  return r;
}

namespace {

/// report.json lists at most this many kernel shapes outside the device's grids.
constexpr size_t kOutsideGridListed = 50;

// A checkpoint whose values cannot be used, as a config error naming run.weights.
[[noreturn]] void bad_weights(const RunPlan& plan, const InputError& e) {
  throw ConfigError(plan.cfg.where("run.weights"), "run.weights",
                    "a safetensors checkpoint of " + plan.model.name + " with finite values",
                    e.what());
}
}  // namespace

std::shared_ptr<const dit::Weights> weights_for(const RunPlan& plan) {
  if (plan.weights_file && !plan.settings.phantom) {
    try {
      return dit::load_weights(plan.model, *plan.weights_file);
    } catch (const InputError& e) {
      bad_weights(plan, e);
    }
  }
  return dit::make_weights(plan.model, plan.weights_seed, plan.settings.phantom);
}

void check_weight_values(const RunPlan& plan) {
  if (!plan.weights_file || plan.settings.phantom) return;
  try {
    const dit::SafetensorsCheckpoint ckpt(*plan.weights_file);
    for (const dit::TensorSpec& s : dit::make_model(plan.model)->tensor_specs())
      (void)ckpt.read(s.name);  // in the order load_weights reads them; one tensor at a time
  } catch (const InputError& e) {
    bad_weights(plan, e);
  }
}

void add_measured(const RunPlan& plan, const dit::StepCacheStats& cache,
                  const dit::StrategyStats& stats, nlohmann::ordered_json& report) {
  if (nlohmann::ordered_json c = step_cache_json(cache); !c.is_null()) report["step_cache"] = c;
  if (plan.measured_rates_from) {
    const RunPlan::RatesSource& m = *plan.measured_rates_from;
    report["measured_rates_from"] = {
        {"file", m.file},
        {"model", m.model},
        {"steps", m.steps},
        {"tokens", m.tokens},
        {"note", m.model == plan.model.name && m.tokens == plan.tokens()
                     ? "measured at this model and shape"
                     : "measured on another model or shape: its step-to-step change stands in "
                       "for this one's"}};
  }
  if (nlohmann::ordered_json m = measured_rates_json(plan, cache, stats); !m.is_null())
    report["measured_rates"] = m;
}

namespace {

// strategy_stats of report.json: V-First per layer kind (means per layer and rank), V-Major
// per tier (all ranks summed). Absent sections: the strategy has no such mechanism.
nlohmann::ordered_json strategy_stats_json(const RunPlan& plan, const dit::StrategyStats& st) {
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  j["ranks"] = st.ranks;
  if (!st.v_first.empty()) {
    nlohmann::ordered_json vf = nlohmann::ordered_json::object();
    for (const auto& [kind, v] : st.v_first) {
      const double l = std::max<double>(1.0, static_cast<double>(v.layers));
      vf[kind] = {
          {"layers", v.layers},  // layer executions summed over ranks
          {"v_proj_s", v.v_proj_s / l},
          {"qk_prep_s", v.qk_prep_s / l},
          {"v_phase1_s", v.v_phase1_s / l},
          {"v_transfer_s", v.v_transfer_s / l},
          {"v_exposed_s", v.v_exposed_s / l},
          {"v_hidden_share", v.v_transfer_s > 0 ? 1.0 - v.v_exposed_s / v.v_transfer_s : 1.0},
          {"condition_held_fraction", static_cast<double>(v.condition_held) / l},
          {"phase1_hidden_fraction", static_cast<double>(v.phase1_hidden) / l},
      };
    }
    j["v_first"] = vf;
    j["v_first_note"] =
        "means per layer; condition = T(V proj) + T(V phase 1) <= T(Q,K prep) with T(V proj) "
        "from layer start to V's launch (projection + pack), T(V phase 1) from launch to the "
        "first observed completion of V's first exchange phase (exact when the rank had to wait "
        "for it, else an upper bound), T(Q,K prep) the Q/K projections, norms and RoPE; "
        "phase1_hidden: V's first phase had completed when Q/K preparation ended";
  }
  if (!st.v_major.empty()) {
    const dit::StrategyOptions& o = plan.settings.strategy_options;
    nlohmann::ordered_json tiers = nlohmann::ordered_json::object();
    for (const auto& [tier, v] : st.v_major) {
      const double bpe = dit::kBytesPerElement;
      tiers[tier] = {
          {"v_full_bytes", v.full_elements * bpe},
          {"v_sent_bytes", v.sent_elements * bpe},
          {"bytes_saved", (v.full_elements - v.sent_elements) * bpe},
          {"saved_fraction", v.full_elements > 0 ? 1.0 - v.sent_elements / v.full_elements : 0.0},
          {"blocks", v.blocks},
          {"active_block_fraction",
           v.blocks > 0 ? static_cast<double>(v.active_blocks) / static_cast<double>(v.blocks)
                        : 0.0},
      };
    }
    j["v_major"] = {
        {"threshold", o.v_major_threshold},
        {"block_tokens", o.v_major_block_tokens},
        {"block_heads", o.v_major_block_heads},
        {"warmup_steps", o.v_major_warmup_steps},
        {"refresh_every", o.v_major_refresh_every},
        {"active_blocks_from",
         st.v_major_phantom ? "v_major.phantom_active_fraction (phantom mode: no data to measure)"
                            : "measured change against the receiver's copy"},
        {"phantom_active_fraction", st.v_major_phantom
                                        ? nlohmann::ordered_json(o.v_major_phantom_active_fraction)
                                        : nlohmann::ordered_json(nullptr)},
        {"tiers", tiers},
        {"cache_bytes_total", st.v_major_cache_bytes},
        {"cache_bytes_per_rank", st.v_major_cache_bytes / std::max(1, st.ranks)},
        {"bytes_note",
         "bf16 (2 bytes per element), all ranks summed; sent bytes include the block masks"},
    };
  }
  return j;
}

}  // namespace

dit::RunSettings settings_for(const RunPlan& plan) {
  dit::RunSettings s = plan.settings;
  s.on_step = step_hook(plan);
  s.on_step_clock = plan.on_step_clock;
  if (plan.initial_latent && !s.phantom) {
    dit::SafetensorsFile f(*plan.initial_latent);
    const dit::SafetensorsEntry* e = f.find("latent");
    const dit::TensorSpec want{
        "latent",
        {plan.model.latent_channels, plan.model.latent_side(plan.settings.pixel_height()),
         plan.model.latent_side(plan.settings.pixel_width())}};
    if (e != nullptr && e->shape != want.shape)
      throw InputError(
          f.path().string() + ": tensor \"latent\" has shape " +
          dit::TensorSpec{"latent", e->shape}.shape_str() + ", run.initial_latent wants " +
          want.shape_str() + " (latent channels, height, width of " + plan.model.name + " at " +
          (plan.settings.resolution > 0 ? std::to_string(plan.settings.resolution)
                                        : std::to_string(plan.settings.pixel_width()) + " x " +
                                              std::to_string(plan.settings.pixel_height())) +
          " px)");
    s.initial_latent = f.read("latent");
  }
  return s;
}

namespace {

// Tests make a phase's allocation fail: COCODIFF_TEST_BAD_ALLOC=weights or =tiles.
void alloc_test_point(std::string_view phase) {
  const char* v = std::getenv("COCODIFF_TEST_BAD_ALLOC");
  if (v != nullptr && phase == v) throw std::bad_alloc();
}

// Runs `build`; a failed allocation becomes a ResourceError naming what was being built and
// the run's memory estimate.
template <typename Build>
auto building(const std::string& what, const MemoryEstimate& estimate, bool phantom,
              Build&& build) {
  try {
    return build();
  } catch (const std::bad_alloc&) {
    throw ResourceError("out of memory while building " + what + " (std::bad_alloc; the run's " +
                        estimate.summary() + "): use " + (phantom ? "" : "run.math = \"skip\", ") +
                        "a smaller model, resolution or rank count, or more memory");
  }
}

std::string hex_digest(std::string_view bytes) {
  Sha256 h;
  h.update(bytes);
  return h.hex();
}

// The critical rank's time split (compute, exposed communication, host wait) and the ranks'
// mean, least and most exposed communication: report.json's "breakdown".
nlohmann::ordered_json breakdown_json(const emu::RunResult& res) {
  // The critical tile ends last; its time is exactly compute + exposed communication + the
  // time its device waited for its host (0 on a device without a host).
  size_t crit = 0;
  double compute_sum = 0, exposed_sum = 0;
  SimTime exposed_min = res.rank_exposed.at(0), exposed_max = exposed_min;
  for (size_t i = 0; i < res.rank_end.size(); ++i) {
    if (res.rank_end[i] > res.rank_end[crit]) crit = i;
    compute_sum += res.rank_compute[i].seconds();
    exposed_sum += res.rank_exposed[i].seconds();
    exposed_min = std::min(exposed_min, res.rank_exposed[i]);
    exposed_max = std::max(exposed_max, res.rank_exposed[i]);
  }
  const double n = static_cast<double>(res.rank_end.size());
  return {
      {"critical_rank", crit},
      {"compute_s", res.rank_compute[crit].seconds()},
      {"exposed_comm_s", res.rank_exposed[crit].seconds()},
      {"exposed_comm_fraction",
       res.makespan.ns() > 0 ? res.rank_exposed[crit].seconds() / res.makespan.seconds() : 0.0},
      {"host_wait_s", res.rank_host_wait[crit].seconds()},
      {"host_wait_fraction",
       res.makespan.ns() > 0 ? res.rank_host_wait[crit].seconds() / res.makespan.seconds() : 0.0},
      {"mean_compute_s", compute_sum / n},
      {"mean_exposed_comm_s", exposed_sum / n},
      {"min_exposed_comm_s", exposed_min.seconds()},
      {"max_exposed_comm_s", exposed_max.seconds()},
  };
}

// The emulated run's report: the base report, then the engine's times, bytes and counts.
nlohmann::ordered_json emulated_report(const RunPlan& plan, const emu::RunResult& res,
                                       const RunRecord& rec, double wall_s) {
  nlohmann::ordered_json r = base_report(plan, "emulator");
  r["workers"] = plan.engine.workers;
  r["virtual_time_s"] = res.makespan.seconds();
  r["wall_time_s"] = wall_s;
  r["output_sha256"] = plan.settings.phantom
                           ? nlohmann::ordered_json(nullptr)
                           : nlohmann::ordered_json(sha256_hex(rec.latent.data()));
  r["timeline_sha256"] = res.timeline_sha256;
  nlohmann::ordered_json tiers = nlohmann::ordered_json::object();
  const Topology& t = plan.cluster.topology;
  for (int k = 0; k < t.num_tiers(); ++k)
    tiers[t.tier_name(k)] = res.bytes_by_tier[static_cast<size_t>(k)];
  r["bytes_by_tier"] = tiers;
  r["wire_bytes_per_element"] = plan.engine.wire_bytes_per_element;
  r["bytes_by_tier_counts"] = "each hop of the emulated algorithm";
  // Kernels the device's measured grids do not cover, timed by the fitted roofline instead.
  r["device_outside_grid"] = plan.cluster.device->outside_grid(kOutsideGridListed);
  r["breakdown"] = breakdown_json(res);
  r["flows"] = res.flows;
  r["flows_exclusive"] = res.flows_exclusive;
  r["ring_passes_whole"] = res.passes_whole;
  r["regions_replayed"] = res.regions_replayed;
  r["blocks_taped"] = res.tapes_played;
  r["events"] = res.events;
  r["trace_truncated"] = res.trace_truncated;
  return r;
}

// report.json's "trace_window": the steps that trace.json keeps (emulator.trace_steps), and
// rec.trace_from, the virtual time where that window starts.
void add_trace_window(const RunPlan& plan, const emu::RunResult& res,
                      const std::vector<SimTime>& step_starts, RunRecord& rec,
                      nlohmann::ordered_json& r) {
  const int steps = static_cast<int>(step_starts.size());
  if (plan.engine.trace && plan.trace_steps > 0 && plan.trace_steps < steps) {
    const int first = steps - plan.trace_steps;
    rec.trace_from = step_starts[static_cast<size_t>(first)];
    std::uint64_t flows = 0;
    for (const emu::TraceEvent& e : res.trace)
      flows += e.kind == emu::TraceEvent::Kind::kFlow && e.end > rec.trace_from ? 1 : 0;
    r["trace_window"] = {
        {"steps", {first, steps - 1}},
        {"from_virtual_s", rec.trace_from.seconds()},
        {"flows", flows},
        {"note", "trace.json holds the events that end after rank 0's clock at the start of step " +
                     std::to_string(first) +
                     " (emulator.trace_steps = " + std::to_string(plan.trace_steps) +
                     "; 0 writes every step); timeline.png draws the whole run"}};
  } else if (plan.engine.trace) {
    r["trace_window"] = {{"steps", {0, std::max(0, steps - 1)}},
                         {"from_virtual_s", 0.0},
                         {"flows", res.flows},
                         {"note", "trace.json holds every step"}};
  }
}

RunRecord run_one(const RunPlan& plan, const std::shared_ptr<const dit::Weights>& weights,
                  std::uint64_t seed, const MemoryEstimate& estimate) {
  const auto wall_start = std::chrono::steady_clock::now();
  dit::RunSettings settings = settings_for(plan);
  settings.seed = seed;
  // Rank 0's clock at the start of each step: where the trace window begins.
  std::vector<SimTime> step_starts;
  settings.on_step_clock = [inner = settings.on_step_clock, &step_starts](int rank, int step,
                                                                          SimTime now) {
    if (rank == 0 && step >= 0 && static_cast<size_t>(step) >= step_starts.size())
      step_starts.push_back(now);
    if (inner) inner(rank, step, now);
  };

  emu::Engine engine(plan.cluster.topology, plan.cluster.network->clone_empty(),
                     plan.cluster.device, plan.engine);
  RunRecord rec;
  std::mutex mutex;
  std::vector<dit::StrategyStats> stats(static_cast<size_t>(plan.ranks()));
  dit::StepCacheStats cache;  // the same on every rank: rank 0's
  emu::RunResult res = engine.run([&](Communicator& comm) {
    dit::RunOutput out =
        building("the activations of rank " + std::to_string(comm.rank()) + " (" + plan.model.name +
                     ", " + std::to_string(plan.tokens()) + " image tokens over " +
                     std::to_string(plan.ranks()) + " ranks)",
                 estimate, plan.settings.phantom, [&] {
                   alloc_test_point("tiles");
                   return dit::generate(comm, plan.model, *weights, settings);
                 });
    stats[static_cast<size_t>(comm.rank())] = std::move(out.strategy_stats);
    if (comm.rank() == 0) {
      std::lock_guard<std::mutex> lk(mutex);
      cache = std::move(out.step_cache);
      rec.latent = std::move(out.latent);
      rec.latent_frames = out.latent_frames;
      rec.latent_height = out.latent_height;
      rec.latent_width = out.latent_width;
    }
  });
  const double wall_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_start).count();

  nlohmann::ordered_json r = emulated_report(plan, res, rec, wall_s);
  rec.step_starts = step_starts;
  add_trace_window(plan, res, step_starts, rec, r);
  dit::StrategyStats merged = stats.at(0);
  for (size_t i = 1; i < stats.size(); ++i) merged.merge(stats[i]);
  r["strategy_stats"] = strategy_stats_json(plan, merged);
  add_measured(plan, cache, merged, r);
  rec.strategy_stats = std::move(merged);
  rec.report = std::move(r);
  rec.emulated = std::move(res);
  return rec;
}

}  // namespace

RunRecord run_emulated(const RunPlan& plan) {
  // Before anything heavy: a run that would not fit stops here, not in an OOM kill.
  const MemoryEstimate estimate = estimate_memory(plan, "emulator");
  check_memory_limit(plan, estimate);
  std::shared_ptr<const dit::Weights> weights =
      building("the weights of " + plan.model.name, estimate, plan.settings.phantom, [&] {
        alloc_test_point("weights");
        return weights_for(plan);
      });
  RunRecord rec = run_one(plan, weights, plan.settings.seed, estimate);
  // What the run was estimated to peak at, beside what it did (bench/README.md compares them).
  rec.report["memory_estimate_bytes"] = estimate.total_bytes();
  if (plan.batch_size == 1) return rec;
  // A batch: the images run one after another on the same cluster, so the run's virtual time,
  // bytes, flows and breakdown are the sums over the images.
  nlohmann::ordered_json& r = rec.report;
  nlohmann::ordered_json images = nlohmann::ordered_json::array();
  std::string latents, timelines;
  auto add_image = [&](const RunRecord& one, std::uint64_t seed) {
    images.push_back({{"seed", seed},
                      {"output_sha256", one.report["output_sha256"]},
                      {"virtual_time_s", one.report["virtual_time_s"]},
                      {"critical_rank", one.report["breakdown"]["critical_rank"]},
                      {"timeline_sha256", one.report["timeline_sha256"]}});
    timelines += one.report["timeline_sha256"].get<std::string>();
    if (!one.latent.phantom()) {
      const std::span<const float> d = one.latent.data();
      latents.append(reinterpret_cast<const char*>(d.data()), d.size_bytes());
    }
  };
  add_image(rec, plan.settings.seed);
  rec.images.push_back(rec.latent);
  for (int i = 1; i < plan.batch_size; ++i) {
    const std::uint64_t seed = plan.settings.seed + static_cast<std::uint64_t>(i);
    RunRecord one = run_one(plan, weights, seed, estimate);
    add_image(one, seed);
    const nlohmann::ordered_json& o = one.report;
    for (const char* key : {"virtual_time_s", "wall_time_s"})
      r[key] = r[key].get<double>() + o[key].get<double>();
    for (const char* key : {"flows", "flows_exclusive", "ring_passes_whole", "regions_replayed",
                            "blocks_taped", "events"})
      r[key] = r[key].get<std::uint64_t>() + o[key].get<std::uint64_t>();
    for (auto it = r["bytes_by_tier"].begin(); it != r["bytes_by_tier"].end(); ++it)
      *it = it->get<std::int64_t>() + o["bytes_by_tier"][it.key()].get<std::int64_t>();
    for (const char* key : {"compute_s", "exposed_comm_s", "host_wait_s", "mean_compute_s",
                            "mean_exposed_comm_s", "min_exposed_comm_s", "max_exposed_comm_s"})
      r["breakdown"][key] = r["breakdown"][key].get<double>() + o["breakdown"][key].get<double>();
    rec.images.push_back(std::move(one.latent));
  }
  const double vt = r["virtual_time_s"].get<double>();
  r["breakdown"]["exposed_comm_fraction"] =
      vt > 0 ? r["breakdown"]["exposed_comm_s"].get<double>() / vt : 0.0;
  r["breakdown"]["host_wait_fraction"] =
      vt > 0 ? r["breakdown"]["host_wait_s"].get<double>() / vt : 0.0;
  r["breakdown"]["critical_rank"] = nullptr;  // per image: see images[]
  r["batch_size"] = plan.batch_size;
  r["output_sha256"] = plan.settings.phantom ? nlohmann::ordered_json(nullptr)
                                             : nlohmann::ordered_json(hex_digest(latents));
  r["timeline_sha256"] = hex_digest(timelines);
  r["images"] = images;
  r["batch_note"] =
      "images run one after another, image i seeded with seed + i; times, bytes and breakdown "
      "are sums over the images; output_sha256 hashes every image's final latent in order, "
      "timeline_sha256 the images' timeline hashes; trace.json is image 0's";
  return rec;
}

void write_outputs(const RunPlan& plan, const RunRecord& rec, const std::filesystem::path& out_dir,
                   bool force) {
  // One set: everything goes into a staging directory beside out_dir, moved into place last.
  OutputSet set(out_dir, force);
  const std::filesystem::path& dir = set.dir();
  if (!rec.latent.phantom()) {
    // image.png at the latent's own size (a pixel-space model's picture, pixel for pixel, so it
    // can be fed back as run.inpaint_image); preview.png enlarged to about 256 px wide.
    // A video's image.png is its frames top to bottom (a [C, F*H*W] latent is an F*H x W
    // picture), and each frame is frame_K.png too.
    const int upscale = std::max(1, 256 / std::max(1, rec.latent_width));
    auto render = [&](const Tensor& latent, int rows, int scale) {
      return plan.model.pixel_space ? dit::pixel_image(latent, rows, rec.latent_width, scale)
                                    : dit::latent_preview(latent, rows, rec.latent_width, scale);
    };
    auto draw = [&](const Tensor& latent, const std::string& name, int scale) {
      dit::write_png(dir / name, render(latent, rec.latent_frames * rec.latent_height, scale));
      output_test_point();
    };
    draw(rec.latent, "image.png", 1);
    if (upscale > 1) draw(rec.latent, "preview.png", upscale);
    if (rec.latent_frames > 1) {
      // Each latent frame as frame_K.png, and all of them as an animated video.gif (10 a second).
      const std::int64_t plane = std::int64_t{rec.latent_height} * rec.latent_width;
      std::vector<dit::Rgb> frames;
      for (int f = 0; f < rec.latent_frames; ++f) {
        const Tensor frame = Tensor::from(rec.latent.mat().middleCols(f * plane, plane));
        frames.push_back(render(frame, rec.latent_height, upscale));
        dit::write_png(dir / ("frame_" + std::to_string(f) + ".png"), frames.back());
        output_test_point();
      }
      dit::write_gif(dir / "video.gif", frames, 10);
      output_test_point();
    }
    if (rec.images.size() > 1)  // a batch: image.png is image_0.png
      for (size_t i = 0; i < rec.images.size(); ++i)
        draw(rec.images[i], "image_" + std::to_string(i) + ".png", 1);
    if (plan.save_latent) {
      dit::write_safetensors(
          dir / "latent.safetensors",
          {{"latent",
            rec.latent_frames > 1
                ? std::vector<std::int64_t>{rec.latent.rows(), rec.latent_frames, rec.latent_height,
                                            rec.latent_width}
                : std::vector<std::int64_t>{rec.latent.rows(), rec.latent_height, rec.latent_width},
            &rec.latent}});
      output_test_point();
    }
  }
  if (rec.emulated && plan.engine.trace) {
    emu::write_chrome_trace(*rec.emulated, plan.cluster.topology, dir / "trace.json",
                            rec.trace_from);
    output_test_point();
    // A PNG Gantt chart; warns and skips without gnuplot.
    emu::write_timeline_png_or_warn(
        *rec.emulated, plan.cluster.topology, dir / "timeline.png",
        {.title = plan.model.name + ", " + plan.settings.strategy + ", " + plan.cluster.name +
                  " x " + std::to_string(plan.cluster.topology.num_nodes()) + " node(s), " +
                  plan.math + " math, " + std::to_string(plan.settings.steps) + " step(s)",
         .step_starts = rec.step_starts});
    output_test_point();
  }
  if (rec.report.contains("measured_rates")) {
    // What a phantom run takes as run.measured_rates.
    write_file_atomic(dir / "rates.json", rec.report["measured_rates"].dump(2) + "\n");
    output_test_point();
  }
  write_file_atomic(dir / "report.json", rec.report.dump(2) + "\n");
  output_test_point();
  set.commit();
}

void write_fault_report(const RunPlan& plan, const std::string& backend, int rank,
                        const std::string& message, const std::filesystem::path& out_dir,
                        bool force) {
  nlohmann::ordered_json r = base_report(plan, backend);
  r["status"] = "failed";
  r["failure"] = {{"kind", "fault"},
                  {"rank", rank},
                  {"step", plan.fault ? plan.fault->step : -1},
                  {"message", message}};
  r["output_sha256"] = nullptr;
  OutputSet set(out_dir, force);
  write_file_atomic(set.dir() / "report.json", r.dump(2) + "\n");
  set.commit();
}

bool is_injected_fault(const RunPlan& plan, int rank, const std::string& message) {
  return plan.fault && plan.fault->rank == rank &&
         message.find(InjectedFault(rank, plan.fault->step).what()) != std::string::npos;
}

namespace {
// The preview image as a [3, H*W] tensor of 0..255 values.
Tensor preview_tensor(const RunRecord& rec) {
  const dit::Rgb img =
      dit::latent_preview(rec.latent, rec.latent_frames * rec.latent_height, rec.latent_width, 1);
  Mat m(3, static_cast<Eigen::Index>(img.width) * img.height);
  for (Eigen::Index i = 0; i < m.cols(); ++i)
    for (int c = 0; c < 3; ++c) m(c, i) = img.pixels[static_cast<size_t>(3 * i + c)];
  return Tensor::from(std::move(m));
}

nlohmann::ordered_json finite_or_inf(double v) {
  return std::isfinite(v) ? nlohmann::ordered_json(v) : nlohmann::ordered_json("inf");
}
}  // namespace

nlohmann::ordered_json quality_json(const RunRecord& exact, const RunRecord& rec,
                                    const std::string& reference) {
  if (rec.latent.phantom() || exact.latent.phantom()) return nullptr;
  const Tensor a = preview_tensor(exact), b = preview_tensor(rec);
  const double range = dit::data_range(exact.latent);
  const int h = rec.latent_frames * rec.latent_height, w = rec.latent_width;
  return {{"reference", reference},
          {"latent_relative_l2", dit::relative_l2(exact.latent, rec.latent)},
          {"latent_psnr_db", finite_or_inf(dit::psnr(exact.latent, rec.latent, range))},
          {"latent_ssim", dit::ssim(exact.latent, rec.latent, h, w, range)},
          {"preview_psnr_db", finite_or_inf(dit::psnr(a, b, 255.0))},
          {"preview_ssim", dit::ssim(a, b, h, w, 255.0)},
          {"bitwise_equal", exact.report["output_sha256"] == rec.report["output_sha256"]}};
}

std::string summarize(const RunRecord& rec) {
  const nlohmann::ordered_json& r = rec.report;
  std::ostringstream os;
  char buf[256];
  if (r.contains("virtual_time_s") && r["virtual_time_s"].is_number()) {
    const nlohmann::ordered_json& b = r["breakdown"];
    // A batch sums its images, whose critical tiles may differ: it names none.
    const std::string who =
        b["critical_rank"].is_number()
            ? "critical tile " + std::to_string(b["critical_rank"].get<int>())
            : "sum over " + std::to_string(r.value("batch_size", 0)) + " images' critical tiles";
    std::snprintf(buf, sizeof buf,
                  "virtual time %.6f s (%s: compute %.6f s, exposed communication "
                  "%.6f s = %.1f%%",
                  r["virtual_time_s"].get<double>(), who.c_str(), b["compute_s"].get<double>(),
                  b["exposed_comm_s"].get<double>(),
                  100 * b["exposed_comm_fraction"].get<double>());
    os << buf;
    if (b.value("host_wait_s", 0.0) > 0) {
      std::snprintf(buf, sizeof buf, ", waiting for its host %.6f s = %.1f%%",
                    b["host_wait_s"].get<double>(), 100 * b["host_wait_fraction"].get<double>());
      os << buf;
    }
    std::snprintf(buf, sizeof buf, "); wall time %.2f s\n", r["wall_time_s"].get<double>());
    os << buf;
  } else {
    std::snprintf(buf, sizeof buf, "wall time %.2f s\n", r["wall_time_s"].get<double>());
    os << buf;
  }
  if (r.contains("bytes_by_tier")) {
    os << "bytes by tier:";
    for (auto it = r["bytes_by_tier"].begin(); it != r["bytes_by_tier"].end(); ++it) {
      std::snprintf(buf, sizeof buf, " %s %.3f GB", it.key().c_str(),
                    it.value().get<double>() / 1e9);
      os << buf;
    }
    os << "\n";
  }
  if (r.contains("device_outside_grid") && r["device_outside_grid"].is_array() &&
      !r["device_outside_grid"].empty()) {
    const auto& o = r["device_outside_grid"];
    os << "warning: " << o.size() << (o.size() == kOutsideGridListed ? " or more" : "")
       << " kernel shapes lie outside device.grid and were timed by the roofline at its fitted "
          "efficiencies (report.json: device_outside_grid), e.g. "
       << o[0].get<std::string>() << "\n";
  }
  if (r["output_sha256"].is_string())
    os << "output_sha256 " << r["output_sha256"].get<std::string>() << "\n";
  if (r.contains("quality") && r["quality"].is_object()) {
    const nlohmann::ordered_json& q = r["quality"];
    const auto db = [](const nlohmann::ordered_json& v) {
      return v.is_string() ? std::string("inf") : std::to_string(v.get<double>());
    };
    os << "quality vs " << q["reference"].get<std::string>() << ": latent relative L2 "
       << q["latent_relative_l2"].get<double>() << ", latent PSNR " << db(q["latent_psnr_db"])
       << " dB, preview PSNR " << db(q["preview_psnr_db"]) << " dB, SSIM "
       << q["preview_ssim"].get<double>() << "\n";
  }
  return os.str();
}

std::string trace_warning(const RunPlan& plan, const RunRecord& rec) {
  if (!rec.emulated || !plan.engine.trace || !rec.emulated->trace_truncated) return {};
  return "the trace is truncated: trace.json and timeline.png hold the first events only "
         "(emulator.trace_limit = " +
         std::to_string(plan.engine.trace_limit) + "; the run had " +
         std::to_string(rec.emulated->events) +
         " events): raise emulator.trace_limit for all of them, or set emulator.trace = false "
         "to write no trace";
}

}  // namespace cocodiff::apps
