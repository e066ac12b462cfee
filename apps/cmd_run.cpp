// `cocodiff run CONFIG [--set key=value ...] [--out DIR] [--backend emulator|mpi]`

#include <cstdio>
#include <iostream>

#include "apps/commands.hpp"
#include "apps/run_exec.hpp"
#include "apps/run_plan.hpp"

namespace cocodiff::apps {

void add_run_command(CLI::App& app) {
  struct Options {
    std::string config;
    std::vector<std::string> sets;
    std::string out = "out";
    std::string backend = "emulator";
    bool quiet = false;
  };
  auto opt = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand("run", "Run a config: DiT inference on the emulator or MPI");
  cmd->add_option("config", opt->config, "Run config (TOML)")->required();
  cmd->add_option("--set", opt->sets, "Override a config key: --set run.steps=4 (repeatable)");
  cmd->add_option("--out", opt->out, "Output directory (report.json, image.png, trace.json)");
  cmd->add_option("--backend", opt->backend, "emulator | mpi")
      ->check(CLI::IsMember({"emulator", "mpi"}));
  cmd->add_flag("-q,--quiet", opt->quiet, "Print only errors");
  cmd->callback([opt] {
    if (opt->backend == "mpi") {
      std::exit(run_mpi_main(opt->config, opt->sets, opt->out, opt->quiet));
    }
    RunPlan plan = resolve_run_plan(opt->config, opt->sets);
    if (!opt->quiet) std::cout << describe(plan) << std::flush;
    RunRecord rec = run_emulated(plan);
    {
      const std::unique_lock<std::mutex> hold = hold_interrupts();
      write_outputs(plan, rec, opt->out);
    }
    if (!opt->quiet) std::cout << summarize(rec) << "outputs in " << opt->out << "/\n";
  });
}

}  // namespace cocodiff::apps
