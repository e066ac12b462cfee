#include "runner/memory_estimate.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "core/errors.hpp"
#include "dit/model.hpp"
#include "dit/parallel/strategies.hpp"
#include "emulator/engine.hpp"

namespace cocodiff::apps {

namespace {

constexpr std::int64_t kFloatBytes = 4;  // every tensor is fp32
// The program itself: code, shared libraries, allocator arenas, the parsed config and presets
// (measured peak RSS of a run that stops after resolving its config: 14 MiB; bench/README.md).
constexpr std::int64_t kProgramBytes = std::int64_t{16} << 20;
// An MPI process adds the MPI library, its shared-memory transport and progress thread.
constexpr std::int64_t kMpiProgramBytes = std::int64_t{48} << 20;
// Phantom bookkeeping per tile: its strategy and sub-communicators, shape-only tensors, region
// records, the engine's per-tile clocks, queues and statistics (measured: phantom FLUX.1-dev on
// 96 tiles without trace, 18 MiB in all, 48 KiB per tile above the program).
constexpr std::int64_t kTileBookkeepingBytes = std::int64_t{64} << 10;
// The resident part of a fiber stack: stacks are reserved at emulator.stack_kib each but only
// the pages a tile touches count; real math reaches Eigen's 128 KiB of stack temporaries.
constexpr std::int64_t kStackResidentRealBytes = std::int64_t{192} << 10;
constexpr std::int64_t kStackResidentPhantomBytes = std::int64_t{64} << 10;
// Bytes per trace event while the run holds it and while trace.json is written (the event, its
// share of the label table, its slices and the JSON text of one event). The README's phantom
// FLUX.1-dev 1024^2 command, two steps on 4 tiles, holds 70.5 MiB of trace at its peak where
// the events counted below at 200 bytes each give 58.3 MiB: 256 bounds it.
constexpr std::int64_t kTraceEventBytes = 256;
// What each real-math worker thread beyond the first adds: its stack's touched pages, Eigen's
// blocking buffers and the allocator's per-thread cache (measured on the quickstart: 0.6 MiB a
// worker from 1 to 16 workers; bench/README.md, "Memory estimate").
constexpr std::int64_t kMathWorkerBytes = std::int64_t{1} << 20;
constexpr double kAllocatorSlack = 0.15;
// The engine's state of one rank pair of the run's widest collective, alive at once while it
// runs: its messages, flows and their records (measured on phantom FLUX.1-dev 2048^2 without
// trace, one step, on 256 to 2048 tiles: the peak grows with the square of the tile count,
// 333-348 bytes for each pair beyond the linear parts; bench/README.md, "Memory estimate").
constexpr std::int64_t kRankPairBytes = 400;

// The arithmetic is in double, so that an absurd config (the fuzzer's) cannot overflow it;
// bytes() clamps a part to 1 EiB, so that the sum of the parts fits an int64.
double ceil_div(double a, double b) { return std::ceil(a / b); }
std::int64_t bytes(double v) { return static_cast<std::int64_t>(std::clamp(v, 0.0, 0x1p60)); }

// Sequences per transformer pass: 2 with batch classifier-free guidance (1 with CFG-parallel,
// where each half of the ranks runs one of them).
int batch_of(const RunPlan& plan) {
  if (plan.settings.cfg_degree > 1) return 1;
  const dit::ModelConfig& m = plan.model;
  const double scale = plan.settings.cfg_scale >= 0 ? plan.settings.cfg_scale : m.cfg_scale;
  return m.cfg_mode == dit::CfgMode::kBatch && scale != 1.0 ? 2 : 1;
}

// Ranks of one sequence-parallel group: all of them, or one half with CFG-parallel.
double sp_ranks(const RunPlan& plan) {
  return static_cast<double>(plan.ranks()) / plan.settings.cfg_degree;
}

// Activations one tile keeps alive during a transformer block, its share of the sampler's
// state and the final latent gather, in bytes (real math only).
//   rows = B * (L + T): the tile's image tokens (L = ceil(N / P)) and the replicated text.
//   block: residual streams, norm output, Q, K, V, attention output, projection and MLP input
//          (8 x hidden) plus the MLP hidden layer before and after its activation (2 x ratio)
//   exchange: send and receive staging of Q, K, V and the output (8 x B * L x hidden) and the
//          head-major full sequence of Q, K, V, output (4 x B * (N + T) x heads/P x head_dim)
//   sampler: x, noise, velocity, known latent, mask, step output (6 x L x features), the
//          conditioning (text and, with CFG, the negative text) and the final gather
//          ((P + 3) x N / P x features, every tile gathers the whole latent).
double tile_activation_bytes(const RunPlan& plan) {
  const dit::ModelConfig& m = plan.model;
  const double p = sp_ranks(plan), n = static_cast<double>(plan.tokens()), t = m.text_tokens;
  const double b = batch_of(plan), h = m.hidden(), f = m.token_features();
  const double l = ceil_div(n, p);
  const double heads_here = ceil_div(m.heads, p) * m.head_dim;
  const double ratio = std::ceil(m.mlp_ratio);
  const double block = b * (l + t) * h * (8 + 2 * ratio);
  const double exchange = 8 * b * l * h + 4 * b * (n + t) * heads_here;
  const double cond = 2 * t * std::max<double>(m.text_dim, h) + 2.0 * m.pooled_dim;
  const double sampler = 6 * l * f + cond + (p + 3) * l * f;
  return (block + exchange + sampler) * kFloatBytes;
}

// What one tile of the run's strategy keeps beyond the activations, as the strategy declares
// it (dit::attention_strategy_memory: V-Major's caches, PipeFusion's, a user strategy's).
std::vector<dit::StrategyMemoryPart> strategy_parts(const RunPlan& plan) {
  dit::StrategyMemoryQuery q;
  q.model = &plan.model;
  q.options = &plan.settings.strategy_options;
  q.topology = &plan.cluster.topology;
  q.tokens = plan.tokens();
  q.sp_ranks = sp_ranks(plan);
  q.batch = batch_of(plan);
  q.ulysses_degree = plan.ulysses_degree;
  q.pipefusion_degree = plan.pipefusion_degree;
  return dit::attention_strategy_memory(plan.settings.strategy, q, plan.settings.strategies.get());
}

// Residual exchanges' reconstructions on one tile (compress.all_to_all = "residual"): for every
// Ulysses exchange of a forward (Q, K, V and the output of each attention layer, each pass of a
// step), what the tile sent and what it received, kept from one step to the next; each is at
// most the tile's rows (its image tokens and the text) x hidden.
double tile_residual_bytes(const RunPlan& plan) {
  if (plan.settings.strategy_options.compress != "residual") return 0;
  const dit::ModelConfig& m = plan.model;
  const double p = sp_ranks(plan), n = static_cast<double>(plan.tokens());
  const double rows = batch_of(plan) * (ceil_div(n, p) + m.text_tokens);
  const double passes =
      m.cfg_mode == dit::CfgMode::kTrue && plan.settings.cfg_degree == 1 ? 2.0 : 1.0;
  return passes * m.attention_layers() * 4 * 2 * rows * m.hidden() * kFloatBytes;
}

// Trace events the run records (at most emulator.trace_limit): per step, per layer and tile,
// about 16 compute and wait spans and one flow per peer for each of the four exchanges.
double trace_events(const RunPlan& plan) {
  if (!plan.engine.trace) return 0;
  const double p = plan.ranks();
  const double per_layer = p * (16 + 4 * (p - 1));
  const double passes = plan.settings.steps *
                        (plan.model.cfg_mode == dit::CfgMode::kTrue && batch_of(plan) == 1 ? 2 : 1);
  const double events = passes * (plan.model.attention_layers() + 2) * per_layer;
  return std::min(events, static_cast<double>(plan.engine.trace_limit));
}

// The positions a RoPE model builds for one tile's image tokens before its rotary table (one
// double per axis and token, phantom runs included: they need the table's shape), plus the
// 3-axis image positions that a model with more axes copies into them. The tiles build them one
// at a time, so one tile's worth is alive at once.
double tile_positions_bytes(const RunPlan& plan) {
  const double axes = static_cast<double>(plan.model.rope_axes.size());
  if (axes == 0) return 0;
  const double l = ceil_div(static_cast<double>(plan.tokens()), sp_ranks(plan));
  return l * (axes + (axes > 3 ? 3 : 0)) * 8;
}

}  // namespace

std::int64_t MemoryEstimate::total_bytes() const {
  std::int64_t s = 0;
  for (const MemoryPart& p : parts) s += p.bytes;
  return s;
}

const MemoryPart& MemoryEstimate::biggest() const {
  COCO_CHECK(!parts.empty(), "an empty memory estimate");
  return *std::max_element(
      parts.begin(), parts.end(),
      [](const MemoryPart& a, const MemoryPart& b) { return a.bytes < b.bytes; });
}

std::string MemoryEstimate::summary() const {
  std::string s = human_bytes(total_bytes()) + " estimated peak, " + scope + " (";
  bool first = true;
  for (const MemoryPart& p : parts) {
    if (p.bytes == 0) continue;
    s += (first ? "" : ", ") + p.name + " " + human_bytes(p.bytes);
    first = false;
  }
  return s + ")";
}

MemoryEstimate estimate_memory(const RunPlan& plan, const std::string& backend) {
  const bool phantom = plan.settings.phantom;
  double weights = 0;
  if (!phantom) {
    for (const dit::TensorSpec& t : dit::make_model(plan.model)->tensor_specs())
      weights += static_cast<double>(t.numel()) * kFloatBytes;
  }
  const double activations = phantom ? 0 : tile_activation_bytes(plan);
  const std::vector<dit::StrategyMemoryPart> strategy =
      phantom ? std::vector<dit::StrategyMemoryPart>{} : strategy_parts(plan);
  const double residual = phantom ? 0 : tile_residual_bytes(plan);
  MemoryEstimate e;
  if (backend == "mpi") {
    // One process per tile: each loads its own weights; no fibers, no trace.
    const Topology& topo = plan.cluster.topology;
    const double here = plan.mpi_check_hosts ? topo.ranks_per_node() : topo.num_ranks();
    e.scope = std::to_string(static_cast<int>(here)) + " MPI process(es) on one host";
    e.parts = {{"weights", bytes(here * weights)}, {"activations", bytes(here * activations)}};
    for (const dit::StrategyMemoryPart& part : strategy)
      e.parts.push_back({part.name, bytes(here * part.bytes)});
    e.parts.push_back({"residual exchanges", bytes(here * residual)});
    e.parts.push_back({"token positions", bytes(here * tile_positions_bytes(plan))});
    e.parts.push_back({"program", bytes(here * kMpiProgramBytes)});
    return e;
  }
  const double p = plan.ranks();
  const double stack =
      std::min<double>(static_cast<double>(plan.engine.stack_bytes),
                       phantom ? kStackResidentPhantomBytes : kStackResidentRealBytes);
  e.scope = "this process";
  // Real math packs the weights once for the GEMM kernel (dit/math_cache.hpp): a second copy.
  const double workers = phantom ? 0 : std::max(0, plan.engine.workers - 1);
  e.parts = {
      {"weights", bytes(weights)},  // one copy, shared by every tile
      {"packed weights", bytes(weights)},
      {"math threads", bytes(workers * kMathWorkerBytes)},
      {"activations", bytes(p * activations)},
      {"residual exchanges", bytes(p * residual)},
      {"token positions", bytes(tile_positions_bytes(plan))},  // one tile at a time
      {"tile bookkeeping", bytes(p * kTileBookkeepingBytes)},
      {"fiber stacks", bytes(p * stack)},  // resident pages of p stacks
      // Every tile of a Ulysses group exchanges with every other in its all-to-alls: the state
      // grows with tiles x the Ulysses degree (the square of the tile count for flat Ulysses;
      // usp's ring and the final gather pass messages along a ring). Measured: flat on 1,536
      // Aurora tiles peaks at 821 MiB, usp (Ulysses 12) at 182 MiB.
      {"collective pairs",
       bytes(p * std::max(1, plan.ulysses_degree) * static_cast<double>(kRankPairBytes))},
      {"trace", bytes(trace_events(plan) * kTraceEventBytes)},
      {"program", kProgramBytes},
  };
  // The strategy's own parts follow the activations.
  std::vector<MemoryPart> own;
  own.reserve(strategy.size());
  for (const dit::StrategyMemoryPart& part : strategy)
    own.push_back({part.name, bytes(p * part.bytes)});
  const auto activations_part = std::find_if(e.parts.begin(), e.parts.end(),
                                             [](const auto& m) { return m.name == "activations"; });
  e.parts.insert(activations_part + 1, own.begin(), own.end());
  // What the allocator holds beyond what the parts ask for (its caches, fragmentation, the
  // transient copies of a step): 15% over the parts above keeps the estimate above the measured
  // peak on every config of bench/README.md, "Memory estimate" (closest: 1.07x).
  double held = 0;
  for (const MemoryPart& part : e.parts)
    if (part.name != "trace" && part.name != "program") held += static_cast<double>(part.bytes);
  e.parts.push_back({"allocator slack", bytes(kAllocatorSlack * held)});
  return e;
}

void check_memory_limit(const RunPlan& plan, const MemoryEstimate& estimate) {
  if (!plan.memory_limit_bytes) return;
  const std::int64_t total = estimate.total_bytes();
  if (total <= *plan.memory_limit_bytes) return;
  const MemoryPart& big = estimate.biggest();
  std::int64_t trace = 0;
  for (const MemoryPart& p : estimate.parts)
    if (p.name == "trace") trace = p.bytes;
  // What to do: fewer tiles where the pairs of tiles dominate, else the trace, phantom math or a
  // smaller run.
  const std::string advice =
      big.name == "collective pairs"
          ? ", growing with the tiles x the Ulysses degree): use fewer tiles (cluster.nodes), or "
            "raise emulator.memory_limit"
          : "): " +
                (trace > 0
                     ? "set emulator.trace = false (the trace takes " + human_bytes(trace) + "), "
                     : std::string()) +
                "use " + (plan.math == "skip" ? std::string() : "run.math = \"skip\", ") +
                "a smaller model, resolution or rank count, or raise emulator.memory_limit";
  throw ResourceError(
      "the run needs an estimated " + human_bytes(total) + " (" + estimate.scope +
      "), more than emulator.memory_limit = " + human_bytes(*plan.memory_limit_bytes) + " (" +
      plan.memory_limit_source + "); the biggest part is " + big.name + " (" +
      human_bytes(big.bytes) + advice);
}

namespace {
// The value of a "Name:   123 kB" line of a /proc file, in bytes.
std::optional<std::int64_t> proc_kib_field(const char* file, const std::string& name) {
  std::ifstream in(file);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(name, 0) != 0) continue;
    std::istringstream words(line.substr(name.size()));
    std::int64_t kib = -1;
    std::string unit;
    if (words >> kib >> unit && kib >= 0 && unit == "kB") return kib * 1024;
    return std::nullopt;
  }
  return std::nullopt;
}
}  // namespace

std::optional<std::int64_t> available_memory_bytes() {
  return proc_kib_field("/proc/meminfo", "MemAvailable:");
}

std::optional<std::int64_t> peak_resident_bytes() {
  return proc_kib_field("/proc/self/status", "VmHWM:");
}

std::string human_bytes(std::int64_t bytes) {
  static const char* const kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  auto v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024.0 && u < 5) {
    v /= 1024.0;
    ++u;
  }
  char buf[32];
  if (u == 0)
    std::snprintf(buf, sizeof buf, "%lld B", static_cast<long long>(bytes));
  else
    std::snprintf(buf, sizeof buf,
                  v < 10    ? "%.2f %s"
                  : v < 100 ? "%.1f %s"
                            : "%.0f %s",
                  v, kUnits[u]);
  return buf;
}

}  // namespace cocodiff::apps
