#pragma once
// A run config resolved into everything a run needs, checked before any work starts: the model,
// the cluster, the sampler settings, the engine options. Shared by `run`, `validate`, `compare`.
//
//   RunPlan plan = resolve_run_plan("configs/quickstart.toml", {"run.steps=2"});
//   std::cout << describe(plan);

#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/config.hpp"
#include "core/errors.hpp"
#include "dit/model_config.hpp"
#include "dit/parallel/strategies.hpp"
#include "dit/pipeline.hpp"
#include "emulator/engine.hpp"
#include "net_models/cluster.hpp"

namespace cocodiff::apps {

/// The configs/ directory, the first of: $COCODIFF_CONFIG_DIR; ../share/cocodiff/configs
/// beside the running program (an installed tree, wherever it was moved); the install prefix's
/// (compiled in); the source tree's (compiled in, for the build tree).
std::filesystem::path config_dir();

/// `--inject-fault rank=R,step=S`: rank R throws at the start of denoising step S (1 to the
/// run's steps, as the progress line counts them).
struct FaultSpec {
  int rank = 0;
  int step = 0;
  /// `kind=hang`: the rank stops there instead (sleeps forever), to test the MPI watchdog.
  bool hang = false;
};

/// Thrown by the step hook on the rank and at the step an --inject-fault names.
class InjectedFault : public Error {
 public:
  InjectedFault(int rank, int step);
  int rank() const { return rank_; }
  int step() const { return step_; }

 private:
  int rank_, step_;
};

/// Exit code of a run stopped by --inject-fault: its report.json (status "failed") is written.
inline constexpr int kExitInjectedFault = 3;

/// Seconds between two progress lines in a log (RunPlan::progress_lines).
inline constexpr double kProgressLineS = 5.0;

struct RunPlan {
  Config cfg;  // the resolved configuration (file + presets + --set)
  dit::ModelConfig model;
  Cluster cluster;
  dit::RunSettings settings;  // steps resolved (never 0)
  emu::EngineOptions engine;
  bool workers_set = false;  // emulator.workers was given (else engine.workers is the default)
  std::string math;          // "real" | "skip"
  std::uint64_t weights_seed = 0;  // model.weights_seed
  std::string motion;              // run.motion of a model conditioned on motions (else empty)
  std::optional<std::filesystem::path> weights_file;    // run.weights (safetensors)
  std::optional<std::filesystem::path> initial_latent;  // run.initial_latent (safetensors)
  bool save_latent = false;                             // run.save_latent: write latent.safetensors
  /// emulator.trace_steps: trace.json holds the last this many denoising steps (0: all of them).
  int trace_steps = 1;
  int batch_size = 1;  // run.batch_size: images per run, image i seeded with run.seed + i
  // The xDiT degrees the run resolved to: ulysses x ring x pipefusion x settings.cfg_degree =
  // ranks.
  int ulysses_degree = 1;
  int ring_degree = 1;
  int pipefusion_degree = 1;
  std::optional<FaultSpec> fault;  // --inject-fault
  bool progress = false;           // "step i/N" on stderr (rank 0)
  // How progress is shown: false rewrites one line with \r (a terminal); true prints whole
  // lines, each in one write, so concurrent runs and pipes never run lines together: one every
  // kProgressLineS seconds of wall time and the last step's once any was printed. Each says the
  // step, the seconds elapsed and an estimate of those left.
  bool progress_lines = false;
  std::string progress_label;  // printed before "step i/N" (compare: "[strategy] ")
  /// dit::RunSettings::on_step_clock: called on every rank at the start of each step with its
  /// clock (tune stops a run, by throwing, once it is over its budget or cannot win).
  std::function<void(int rank, int step, SimTime now)> on_step_clock;
  // mpi.check_hosts: the MPI backend checks that MPI's hosts are the topology's nodes; false
  // runs a multi-node topology on fewer hosts (the MPI path of a cluster config on one machine).
  bool mpi_check_hosts = true;
  /// mpi.progress_timeout_s: an MPI wait that sees no progress for this long ends the job
  /// naming the rank that stopped (0: off). "auto" (the default): a bound derived from the run,
  /// the largest of mpi.progress_floor_s and mpi.progress_multiple x the longest step so far
  /// (mpi::WorldOptions::progress_auto).
  double mpi_progress_timeout_s = 0;
  bool mpi_progress_auto = true;
  double mpi_progress_floor_s = 30;
  double mpi_progress_multiple = 10;
  /// emulator.memory_limit in bytes (default: MemAvailable); nullopt: no limit. A run whose
  /// memory estimate exceeds it stops before allocating (runner/memory_estimate.hpp).
  std::optional<std::int64_t> memory_limit_bytes;
  std::string memory_limit_source;  // where the limit came from, for the error message
  /// How heads split when they do not divide the Ulysses degree (ulysses.uneven_heads): which
  /// ranks idle in attention, and degree splits that avoid it. Empty when heads divide.
  std::string attention_note;
  /// Where run.measured_rates came from (phantom runs that name one: runner/measured_rates.hpp).
  struct RatesSource {
    std::string file, model;
    int steps = 0;
    std::int64_t tokens = 0;
  };
  std::optional<RatesSource> measured_rates_from;
  int ranks() const { return cluster.topology.num_ranks(); }
  std::int64_t tokens() const {
    return model.image_tokens(settings.pixel_height(), settings.pixel_width()) *
           model.latent_frames(settings.frames);
  }
};

/// Loads `config_file`, applies `sets` ("key=value", in order), reads every section and checks
/// that the pieces agree (ranks vs tokens and heads, resolution vs patch size, unknown keys).
/// ConfigError names the file, line and key.
/// `strategies`: the program's own attention strategies (run.strategy may name them).
RunPlan resolve_run_plan(const std::filesystem::path& config_file,
                         const std::vector<std::string>& sets,
                         std::shared_ptr<const dit::StrategyRegistry> strategies = nullptr);

/// The same for a configuration built in code (Config::from_table), or loaded and overridden
/// already: every check and default of the file's path, the same plan for the same keys.
RunPlan resolve_run_plan(Config cfg,
                         std::shared_ptr<const dit::StrategyRegistry> strategies = nullptr);

/// Parses "rank=R,step=S[,kind=throw|hang]" against the plan's rank and step counts;
/// ConfigError otherwise.
FaultSpec parse_fault(const std::string& spec, const RunPlan& plan);

/// The per-step hook of a plan: progress on rank 0 and the injected fault, if any.
std::function<void(int rank, int step)> step_hook(const RunPlan& plan);

/// Human-readable summary of the resolved settings (for `validate`, `run`, `compare`): the
/// engine line for backend "emulator", the MPI line for "mpi"; `strategies` (compare) replaces
/// the plan's one strategy.
std::string describe(const RunPlan& plan, const std::string& backend = "emulator",
                     const std::vector<std::string>& strategies = {});

}  // namespace cocodiff::apps
