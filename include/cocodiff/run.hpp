#pragma once
// cocodiff's typed entry points: a run described in code, resolved into a checked plan, run on
// the emulator, its results as values. No config file and no "key=value" strings: a RunSpec
// goes through the same resolution as a config file does (presets, defaults, every check), so
// a spec and the file that sets the same keys give the same plan and byte-identical results.
//
//   cocodiff::RunSpec spec;
//   spec.model = "flux1-tiny";            // a preset of configs/models/, or a .toml path
//   spec.cluster = "aurora";              // a preset of configs/clusters/, or a .toml path
//   spec.resolution = 256;
//   spec.steps = 2;
//   cocodiff::Plan plan = cocodiff::make_plan(spec);       // ConfigError when it cannot run
//   cocodiff::RunResult r = cocodiff::run(plan);           // blocks until the run ends
//   std::printf("%.6f s of virtual time\n", r.virtual_time_s);
//   cocodiff::write_outputs(plan, r, "out/");              // report.json, image.png, ...
//
// The same plan on a cluster, under `mpirun -np <plan.ranks()>`, every rank alike:
//   return cocodiff::run_mpi(plan, "out/");                // rank 0 writes the outputs
//
// Errors: bad input (an unknown preset, a strategy that cannot run on the ranks, a resolution
// the patch size does not divide) throws cocodiff::UserError (ConfigError for the spec, naming
// the key and "cocodiff::RunSpec"); a failed rank throws RankError from run(). Presets are
// found in cocodiff's configs/ directory: $COCODIFF_CONFIG_DIR, else the installed one.
//
// This header includes no internal header but the error types: the plan and the run's record
// stay behind handles.

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/errors.hpp"

namespace cocodiff {

namespace apps {
struct RunPlan;
struct RunRecord;
struct PlanSource;
}  // namespace apps

class Extensions;

/// Whether a run computes the numbers or only their costs.
enum class Math : std::uint8_t {
  kReal,  // every tensor is computed: the output latent and image exist ("run.math = real")
  kSkip,  // phantom tensors (shapes only): timing and bytes of a run too large to compute
};

/// One run, as a config file's keys would describe it. Zero / empty fields leave the key unset:
/// the model's, the preset's or cocodiff's default applies (the comment names the key).
struct RunSpec {
  std::string model;    // model.preset: "flux1-tiny", or a path to a model .toml (required)
  std::string cluster;  // cluster.preset: "aurora", "hgx-h100", ..., or a cluster .toml (required)
  int nodes = 0;        // cluster.nodes (0: the preset's)
  /// cluster.topology.sizes: ranks per level, innermost first (Aurora: {tiles, gpus}); the
  /// ranks of a run are nodes x their product. Empty: the preset's.
  std::vector<int> topology_sizes;
  /// cluster.nic.rank_nic: the NIC of each rank of a node (one entry per rank of a node), for
  /// a cut-down topology_sizes. Empty: the preset's.
  std::vector<int> rank_nic;

  int resolution = 0;  // run.resolution: square images of this many pixels a side (0: 1024)
  int height = 0;      // run.height and run.width: a rectangle (both, and no resolution)
  int width = 0;
  int frames = 0;           // run.frames of a video model (0: the model's)
  int steps = 0;            // run.steps: denoising steps (0: the model's default)
  std::uint64_t seed = 0;   // run.seed: of the initial noise
  std::string strategy;     // run.strategy: "flat", "usp", "cocodiff", ... or a registered one
  Math math = Math::kReal;  // run.math
  std::optional<double> cfg_scale;  // run.cfg_scale: guidance scale (empty: the model's)
  int class_label = -1;             // run.class_label of a class-conditioned model (-1: none)
  int batch_size = 0;               // run.batch_size: images of one run (0: 1)
  std::string weights;              // run.weights: a safetensors checkpoint (empty: seeded)

  // The parallel layout (0 / empty: as the strategy resolves it from the ranks).
  int ulysses_degree = 0;            // parallel.ulysses_degree
  int ring_degree = 0;               // parallel.ring_degree (usp's rings)
  int cfg_degree = 0;                // parallel.cfg_degree: 2 runs the CFG branches side by side
  int pipefusion_degree = 0;         // parallel.pipefusion_degree: PipeFusion's stages
  std::optional<bool> shard_text;    // parallel.shard_text: text tokens split over Ulysses
  std::optional<bool> uneven_heads;  // ulysses.uneven_heads: heads not a multiple of the degree
  int pipeline_chunks = 0;           // pipeline.chunks of a composition with pipeline
  std::optional<double> v_major_threshold;  // v_major.threshold (0: exact)

  int workers = 0;  // emulator.workers: threads that run the ranks' fibers (0: the default)
  std::optional<bool> trace;   // emulator.trace: keep the timeline for trace.json
  std::string all_to_all;      // emulator.all_to_all: the all-to-all algorithm (empty: default)
  std::optional<bool> replay;  // emulator.replay: time repeated blocks once (phantom runs)

  /// Any other key, as `cocodiff run --set key=value` sets it ("pipefusion.patches=4"),
  /// applied after the fields above.
  std::vector<std::string> sets;
};

/// A RunSpec resolved and checked: everything a run needs. Cheap to copy (shared, immutable).
class Plan {
 public:
  /// Ranks (emulated devices) of the run.
  int ranks() const;
  /// Image tokens of one image (all frames).
  std::int64_t tokens() const;
  /// The resolved settings, as `cocodiff validate` prints them.
  std::string describe() const;
  /// The effective configuration as TOML: every key with the value the run uses. Written to a
  /// file, `cocodiff run` runs the same plan.
  std::string effective_config() const;

  /// The resolved plan (runner/run_plan.hpp, not installed): for code built with cocodiff's tree.
  const apps::RunPlan& resolved() const { return *plan_; }
  /// The plan resolved again from its spec or file: a RunPlan of its own, equal to resolved()
  /// (run_mpi resolves it on every rank).
  apps::RunPlan resolve_again() const;

 private:
  friend Plan make_plan(const RunSpec& spec, const Extensions* extensions);
  friend Plan load_plan(const std::filesystem::path& config_file,
                        const std::vector<std::string>& sets, const Extensions* extensions);
  explicit Plan(std::shared_ptr<const apps::PlanSource> source);
  std::shared_ptr<const apps::PlanSource> source_;  // what the plan is resolved from
  std::shared_ptr<const apps::RunPlan> plan_;
};

/// Wire bytes one tier of the topology carried ("intra-node", "inter-node", ...).
struct TierBytes {
  std::string tier;
  std::int64_t bytes = 0;
};

/// What a run measured, from rank 0's view of the emulated cluster.
struct RunResult {
  std::string strategy;  // the attention strategy that ran
  int ranks = 0;
  double virtual_time_s = 0;  // emulated wall time of the whole run (the critical rank's end)
  double wall_time_s = 0;     // host seconds the emulation took
  std::vector<TierBytes> bytes_by_tier;  // innermost tier first, each hop of each collective
  /// SHA-256 of the final latent's float32 bytes, hex; empty when math is kSkip.
  std::string output_sha256;
  /// SHA-256 of the emulated timeline (every rank's events and times): equal hashes, equal runs.
  std::string timeline_sha256;
  /// The final latent, row-major [latent_channels, latent_frames * latent_height *
  /// latent_width] (VAE latent space, before decoding); empty when math is kSkip.
  std::vector<float> latent;
  int latent_channels = 0, latent_frames = 1, latent_height = 0, latent_width = 0;
  /// report.json's text: every field `cocodiff run` reports (breakdown, strategy statistics).
  std::string report_json;

  /// The run's record (runner/run_exec.hpp, not installed), which write_outputs reads.
  std::shared_ptr<const apps::RunRecord> record;
};

/// Resolves `spec` (presets, defaults, checks); `extensions` adds the program's own attention
/// strategies (borrowed; read here only). Throws ConfigError naming the key that is wrong.
Plan make_plan(const RunSpec& spec, const Extensions* extensions = nullptr);

/// Resolves a config file as `cocodiff run CONFIG --set ...` does: `sets` ("run.steps=4") are
/// applied in order over the file. Throws ConfigError naming the file, line and key.
Plan load_plan(const std::filesystem::path& config_file, const std::vector<std::string>& sets = {},
               const Extensions* extensions = nullptr);

/// Runs `plan` on the emulator, every rank a fiber of this process (blocks; threads:
/// RunSpec::workers). Throws RankError / CommError when a rank fails, UserError when the run
/// does not fit in memory.
RunResult run(const Plan& plan);

/// Runs `plan` over OpenMPI, one process per rank: every rank of an `mpirun -np N` job
/// (N = plan.ranks()) calls this alike, with the same plan; rank 0 writes `out_dir` as
/// write_outputs does (measured wall times in place of virtual ones; no timeline hash). Blocks
/// until the run ends. Returns the process's exit code: 0, or 2 after the lowest failing rank
/// printed why (ranks that resolved different plans, too few ranks, a rank that failed). Call it
/// once per process (it initialises and finalises MPI). ConfigError when cocodiff was built
/// without MPI.
int run_mpi(const Plan& plan, const std::filesystem::path& out_dir, bool force = false);

/// Writes `result`'s outputs into `out_dir` as `cocodiff run` does: report.json, image.png
/// (math kReal; video.gif and frames for several frames), trace.json (when traced). Returns
/// the path of image.png (empty when none was written). `force`: replace files of another run.
std::filesystem::path write_outputs(const Plan& plan, const RunResult& result,
                                    const std::filesystem::path& out_dir, bool force = false);

}  // namespace cocodiff
