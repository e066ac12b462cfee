#pragma once
// Executing a RunPlan on the emulator or over MPI, and writing its outputs atomically:
// report.json, image.png (preview of the final latent), trace.json (Chrome trace), and
// optionally latent.safetensors. Outputs are written only after the run succeeded.

#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <vector>

#include "core/tensor.hpp"
#include "emulator/engine.hpp"
#include "runner/run_plan.hpp"

namespace cocodiff::apps {

struct RunRecord {
  nlohmann::ordered_json report;  // the fields of report.json
  Tensor latent;                  // final latent [C, F*H*W] (phantom: shape only); image 0
  std::vector<Tensor> images;     // run.batch_size > 1: every image's final latent, in order
  int latent_frames = 1, latent_height = 0, latent_width = 0;
  std::optional<emu::RunResult> emulated;  // the timeline (emulator backend only)
  /// Where trace.json starts: rank 0's clock at the start of the first step of the window that
  /// emulator.trace_steps keeps (zero: the whole run).
  SimTime trace_from;
  std::vector<SimTime> step_starts;   // rank 0's clock at the start of each step
  dit::StrategyStats strategy_stats;  // every rank's, merged (report.json's strategy_stats)
};

/// Adds what the run measured of its data (step_cache, measured_rates, measured_rates_from) to
/// its report; rates.json is report["measured_rates"].
void add_measured(const RunPlan& plan, const dit::StepCacheStats& cache,
                  const dit::StrategyStats& stats, nlohmann::ordered_json& report);
/// The report fields every backend writes (config, sizes, backend name).
nlohmann::ordered_json base_report(const RunPlan& plan, const std::string& backend);
/// The run's weights: the plan's checkpoint, or seeded by tensor name.
std::shared_ptr<const dit::Weights> weights_for(const RunPlan& plan);
/// Reads every tensor of the plan's checkpoint (real math), one at a time, as weights_for would:
/// a value it would refuse (NaN, infinity, unreadable data) is the ConfigError it would throw.
/// For `validate`, which checks what `run` checks before its first step.
void check_weight_values(const RunPlan& plan);
/// The sampler settings of the plan, with the step hook and the initial latent loaded (its
/// shape checked: InputError naming the file).
dit::RunSettings settings_for(const RunPlan& plan);

/// Runs the plan on the emulator (blocking). Throws RankError / CommError / UserError.
/// run.batch_size B > 1: the B images run one after the other (image i with seed run.seed + i),
/// and the report sums their virtual times, bytes and breakdowns and lists each image.
RunRecord run_emulated(const RunPlan& plan);

/// Writes report.json, image.png (real math only), trace.json (when the plan traces) and
/// latent.safetensors (when asked) into out_dir, each atomically, as one output set (OutputSet:
/// only an earlier set is replaced, unless `force`).
void write_outputs(const RunPlan& plan, const RunRecord& record,
                   const std::filesystem::path& out_dir, bool force = false);

/// The report of a run stopped by --inject-fault: base_report with status "failed" and
/// `failure` (kind "fault", rank, step, message), written alone into out_dir as one set.
void write_fault_report(const RunPlan& plan, const std::string& backend, int rank,
                        const std::string& message, const std::filesystem::path& out_dir,
                        bool force = false);

/// True when `rank`'s error `message` is the plan's injected fault.
bool is_injected_fault(const RunPlan& plan, int rank, const std::string& message);

/// Quality of `record` against an exact run of the same config (null in phantom mode):
/// relative L2 of the final latent; PSNR and SSIM of the latent (float, over the exact
/// latent's range) and of the preview images as written (8-bit); and whether the bytes match.
nlohmann::ordered_json quality_json(const RunRecord& exact, const RunRecord& record,
                                    const std::string& reference);

/// One-paragraph summary for the terminal.
std::string summarize(const RunRecord& record);

/// Why the run's trace.json and timeline.png miss events (its trace was cut at
/// emulator.trace_limit), or an empty string when they hold the whole run.
std::string trace_warning(const RunPlan& plan, const RunRecord& record);

}  // namespace cocodiff::apps
