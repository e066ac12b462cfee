// `cocodiff run CONFIG [--set key=value ...] [--out DIR] [--backend emulator|mpi]`
// --inject-fault rank=R,step=S makes rank R fail at step S: report.json (status "failed", the
// rank and step) is written and the exit code is kExitInjectedFault (3).
// A lossy strategy (V-Major above threshold 0) on real math is also run exactly, and
// report.json gets its quality against that run.

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>

#include "apps/commands.hpp"
#include "core/atomic_file.hpp"
#include "core/errors.hpp"
#include "dit/parallel/strategies.hpp"
#include "runner/memory_estimate.hpp"
#include "runner/mpi_exec.hpp"
#include "runner/run_exec.hpp"
#include "runner/run_plan.hpp"

namespace cocodiff::apps {

namespace {

/// Refuses a run started by mpirun without --backend mpi (the first rank says why).
void refuse_mpirun_without_backend(const RunCommandOptions& o) {
  // Started by mpirun without --backend mpi: every rank would run the whole emulator into the
  // same --out. Say so, once, from the first rank.
  if (const char* size = std::getenv("OMPI_COMM_WORLD_SIZE");
      o.backend != "mpi" && size != nullptr && std::atoi(size) > 1) {
    const char* rank = std::getenv("OMPI_COMM_WORLD_RANK");
    if (rank == nullptr || std::atoi(rank) == 0)
      throw ConfigError(std::string("this run was started by mpirun as ") + size +
                        " ranks, but without --backend mpi each would run the whole emulator "
                        "into the same --out: add --backend mpi, or run cocodiff without "
                        "mpirun (the emulator is one process)");
    std::exit(2);  // the first rank says why
  }
}

/// The emulator's plan: the config with --set and --inject-fault, and its progress display.
RunPlan resolve_emulator_plan(const RunCommandOptions& o) {
  RunPlan plan = resolve_run_plan(o.config, o.sets);
  if (!o.inject_fault.empty()) plan.fault = parse_fault(o.inject_fault, plan);
  if (plan.fault && plan.fault->hang)  // the emulator has no wall-clock watchdog to end it
    throw ConfigError(
        "--inject-fault kind=hang: only with --backend mpi (it tests the MPI "
        "progress watchdog, mpi.progress_timeout_s)");
  // A terminal gets one line rewritten at each step; a log a line every few seconds.
  plan.progress = !o.quiet;
  plan.progress_lines = isatty(STDERR_FILENO) == 0;
  return plan;
}

/// Runs `plan`; an injected fault writes its report and exits with kExitInjectedFault.
RunRecord run_or_report_fault(const RunPlan& plan, const RunCommandOptions& o) {
  try {
    return run_emulated(plan);
  } catch (const RankError& e) {
    // An injected fault is an expected failure: its report goes out as the run's output set,
    // and the exit code says which kind of failure it was.
    if (!is_injected_fault(plan, e.rank(), e.what())) throw;
    {
      const std::unique_lock<std::mutex> hold = hold_interrupts();
      write_fault_report(plan, "emulator", e.rank(), e.what(), o.out, o.force);
    }
    std::fprintf(stderr, "cocodiff: error: %s\ncocodiff: report in %s/report.json\n", e.what(),
                 o.out.c_str());
    std::exit(kExitInjectedFault);
  }
}

/// A lossy run's quality against the exact run of the same config, in its report.
void add_quality_reference(const RunPlan& plan, const RunCommandOptions& o, RunRecord& rec) {
  // A lossy run (V-Major above threshold 0, a step cache, a compressed exchange) reports its
  // quality against the exact run of the same config: the same strategy with each lossy
  // setting off, which is bitwise exact.
  const bool lossy_strategy = dit::attention_strategy_is_lossy(
      plan.settings.strategy, plan.settings.strategy_options, plan.settings.strategies.get());
  const bool cached = plan.settings.step_cache.active();
  const bool compressed = plan.settings.strategy_options.compress != "none";
  // Pipeline stages (PipeFusion) are exact while every step is a warm-up step (no stale K/V).
  const bool stale =
      dit::attention_strategy_layout(plan.settings.strategy, plan.settings.strategies.get()).kind ==
          dit::StrategyLayout::Kind::kStages &&
      plan.settings.strategy_options.pipefusion_warmup_steps < plan.settings.steps;
  if (plan.settings.phantom || !(lossy_strategy || cached || compressed || stale)) return;
  std::vector<std::string> sets = o.sets;
  std::string off;
  auto exact = [&](const std::string& set, const std::string& name) {
    sets.emplace_back(set);
    off += (off.empty() ? "" : ", ") + name;
  };
  if (lossy_strategy) exact("v_major.threshold=0", "v_major.threshold = 0");
  if (cached) exact("step_cache.policy=none", "step_cache.policy = \"none\"");
  if (compressed) exact("compress.all_to_all=none", "compress.all_to_all = \"none\"");
  if (stale)
    exact("pipefusion.warmup_steps=" + std::to_string(plan.settings.steps),
          "pipefusion.warmup_steps = run.steps");
  sets.emplace_back("emulator.trace=false");
  RunPlan exact_plan = resolve_run_plan(o.config, sets);
  if (!o.quiet)
    std::cout << "quality reference: the same run with " << off << " (exact)\n" << std::flush;
  const RunRecord exact_rec = run_emulated(exact_plan);
  rec.report["quality"] =
      quality_json(exact_rec, rec, plan.settings.strategy + " with " + off + " (exact)");
}

/// Writes the run's output set, warns about its trace, and (unless quiet) prints its summary.
void finish_run(const RunPlan& plan, const RunRecord& rec, const RunCommandOptions& o) {
  {
    const std::unique_lock<std::mutex> hold = hold_interrupts();
    write_outputs(plan, rec, o.out, o.force);
  }
  if (const std::string w = trace_warning(plan, rec); !w.empty())
    std::fprintf(stderr, "cocodiff: warning: %s\n", w.c_str());
  if (!o.quiet) {
    std::cout << summarize(rec);
    if (const std::optional<std::int64_t> peak = peak_resident_bytes())
      std::cout << "memory: peak resident " << human_bytes(*peak) << ", estimated "
                << human_bytes(estimate_memory(plan, "emulator").total_bytes()) << "\n";
    std::cout << "outputs in " << o.out << "/\n";
  }
}

/// `cocodiff run`: on the MPI backend, or on the emulator with its quality reference.
void run_config(RunCommandOptions& o) {
  if (o.out.empty())
    o.out = (std::filesystem::path("out") / std::filesystem::path(o.config).stem()).string();
  refuse_mpirun_without_backend(o);
  if (o.backend != "mpi") check_output_target(o.out, o.force);  // before the run
  if (o.backend == "mpi") {
    MpiRunOptions mpi{.out = o.out,
                      .inject_fault = o.inject_fault,
                      .quiet = o.quiet,
                      .force = o.force,
                      .quiet_interrupts = quiet_interrupts,
                      .loud_interrupts = loud_interrupts,
                      .hold_interrupts = hold_interrupts};
    std::exit(run_on_mpi([&] { return resolve_run_plan(o.config, o.sets); }, mpi));
  }
  const RunPlan plan = resolve_emulator_plan(o);
  if (!o.quiet) std::cout << describe(plan) << std::flush;
  RunRecord rec = run_or_report_fault(plan, o);
  add_quality_reference(plan, o, rec);
  finish_run(plan, rec, o);
}

}  // namespace

void add_run_command(CLI::App& app) {
  auto opt = std::make_shared<RunCommandOptions>();
  CLI::App* cmd = app.add_subcommand("run", "Run a config: DiT inference on the emulator or MPI");
  cmd->add_option("config", opt->config, "Run config (TOML)")->required();
  cmd->add_option("--set", opt->sets, "Override a config key: --set run.steps=4 (repeatable)");
  cmd->add_option("--out", opt->out,
                  "Output directory (report.json, image.png, trace.json); default out/<config "
                  "name>, so runs of different configs do not mix");
  cmd->add_option("--backend", opt->backend, "emulator | mpi")
      ->check(CLI::IsMember({"emulator", "mpi"}));
  cmd->add_option("--inject-fault", opt->inject_fault,
                  "Make rank R throw at the start of step S: rank=R,step=S (tests failure paths); "
                  "kind=hang stops it there instead (--backend mpi)");
  cmd->add_option_function<double>(
         "--progress-timeout",
         [opt](double s) { opt->sets.push_back("mpi.progress_timeout_s=" + std::to_string(s)); },
         "--backend mpi: end the job, naming the stopped rank, when a wait sees no progress for "
         "this many seconds (mpi.progress_timeout_s; 0: off)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_flag("--force", opt->force,
                "Replace --out even when it is not an earlier output set of cocodiff");
  cmd->add_flag("-q,--quiet", opt->quiet, "Print only errors");
  add_degree_options(cmd, opt->sets);
  cmd->callback([opt] { run_config(*opt); });
}

}  // namespace cocodiff::apps
