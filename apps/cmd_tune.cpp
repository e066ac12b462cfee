// `cocodiff tune CONFIG [--nodes 1,2,4,8] [--gpus-per-node 1,2,...] [--objective latency|
// gpu-seconds] [--lossy PSNR_DB] [--budget-s S] [--jobs N] [--no-host-range] [--set k=v ...]
// [--out DIR]`
// Searches the fastest way to run the config's model, resolution and steps on its cluster
// (tune/tune.hpp): prints the ranked table, the Pareto front of time against GPUs and the
// `cocodiff run` command of each recommendation; writes tune.json, tune.txt and pareto.png
// into DIR as one set, once the search is done.

#include <cstdio>
#include <iostream>
#include <sstream>

#include "apps/commands.hpp"
#include "core/atomic_file.hpp"
#include "core/errors.hpp"
#include "tune/tune.hpp"

namespace cocodiff::apps {

namespace {

std::vector<int> int_list(const std::string& flag, const std::string& text) {
  std::vector<int> out;
  std::stringstream ss(text);
  for (std::string item; std::getline(ss, item, ',');) {
    if (item.empty() || item.size() > 6 ||
        item.find_first_not_of("0123456789") != std::string::npos)
      throw ConfigError(flag + ": expected positive integers separated by commas, found \"" +
                        std::string(text).append("\""));
    out.push_back(std::stoi(item));
  }
  if (out.empty()) throw ConfigError(flag + ": expected at least one number");
  return out;
}

}  // namespace

void add_tune_command(CLI::App& app) {
  struct Options {
    std::string config;
    std::string nodes = "1,2,4,8";
    std::string gpus;
    std::string objective = "latency";
    double lossy = -1;
    double budget_s = 0;
    int jobs = 0;
    std::vector<std::string> sets;
    std::string out = "out/tune";
    bool exhaustive = false;
    bool no_host_range = false;
    bool force = false;
  };
  auto opt = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand(
      "tune", "Search the fastest strategy, parallel layout and GPU count for a config");
  cmd->add_option("config", opt->config, "Run config (TOML): model, resolution, steps, cluster")
      ->required();
  cmd->add_option("--nodes", opt->nodes, "Node counts to search, comma-separated (1,2,4,8)");
  cmd->add_option("--gpus-per-node", opt->gpus,
                  "GPUs used per node, comma-separated (default: 1 to the node's GPUs)");
  cmd->add_option("--objective", opt->objective,
                  "latency (time per image) or gpu-seconds (GPUs x time per image)");
  cmd->add_option("--lossy", opt->lossy,
                  "Admit V-Major thresholds whose output keeps this preview PSNR (dB) on the "
                  "trained model (measured with real math before the search)");
  cmd->add_option("--budget-s", opt->budget_s,
                  "Stop the search after this many seconds, with what it has (0: no limit)");
  cmd->add_option("--jobs", opt->jobs,
                  "Runs side by side (default: the hardware threads; at most 256)");
  cmd->add_option("--set", opt->sets, "Override a config key: --set run.steps=4 (repeatable)");
  cmd->add_option("--out", opt->out, "Output directory (tune.json, tune.txt, pareto.png)");
  cmd->add_flag("--force", opt->force,
                "Replace --out even when it is not an earlier output set of cocodiff");
  cmd->add_flag("--exhaustive", opt->exhaustive, "Run every configuration (no pruning)");
  cmd->add_flag("--no-host-range", opt->no_host_range,
                "Do not time the best configurations again with the fastest and the slowest "
                "hosts measured (the cluster's device.host.range)");
  cmd->callback([opt] {
    check_output_target(opt->out, opt->force);  // before the search
    TuneOptions o;
    o.config = opt->config;
    o.sets = opt->sets;
    o.nodes = int_list("--nodes", opt->nodes);
    if (!opt->gpus.empty()) o.gpus_per_node = int_list("--gpus-per-node", opt->gpus);
    o.objective = opt->objective;
    if (opt->lossy != -1) o.lossy_psnr_db = opt->lossy;
    o.budget_s = opt->budget_s;
    if (opt->jobs < 0) throw ConfigError("--jobs: expected a count >= 0 (0: the hardware threads)");
    o.jobs = opt->jobs;
    o.prune = !opt->exhaustive;
    o.host_range = !opt->no_host_range;
    o.log = [](const std::string& line) {
      std::fprintf(stderr, "%s\n", line.c_str());
      std::fflush(stderr);
    };
    const TuneResult r = tune(o);
    const std::string table = tune_table(o, r);
    std::cout << table << std::flush;
    const std::string json = tune_json(o, r).dump(2) + "\n";
    auto lock = hold_interrupts();
    OutputSet set(opt->out, opt->force);
    write_file_atomic(set.dir() / "tune.json", json);
    write_file_atomic(set.dir() / "tune.txt", table);
    const std::string why = write_pareto_png(r, set.dir() / "pareto.png");
    set.commit();
    if (!why.empty())
      std::fprintf(stderr, "cocodiff: warning: pareto.png not written: %s\n", why.c_str());
    std::cout << "tune.json, tune.txt" << (why.empty() ? ", pareto.png" : "") << " in " << opt->out
              << "/\n";
  });
}

}  // namespace cocodiff::apps
