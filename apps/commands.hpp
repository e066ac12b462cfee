#pragma once
// Each `cocodiff` sub-command lives in its own apps/cmd_*.cpp and registers itself here.

#include <CLI/CLI.hpp>

#include <mutex>
#include <string>
#include <vector>

namespace cocodiff::apps {

void add_run_command(CLI::App& app);
/// Held while a command writes its outputs: SIGINT/SIGTERM wait until it is released, so an
/// interrupted command leaves complete output files or none (apps/main.cpp).
std::unique_lock<std::mutex> hold_interrupts();
/// From now on SIGINT/SIGTERM end the process without a message (an MPI rank waiting for
/// another rank's abort, which reports the error).
void quiet_interrupts();
/// Undoes quiet_interrupts(): an MPI rank quiet only while the ranks decide whether one of them
/// failed (a rank the launcher ends in that window must not print an interrupt notice).
void loud_interrupts();
void add_validate_command(CLI::App& app);
/// --ulysses-degree N, --ring-degree N and --cfg-degree N on `cmd` (xDiT's flags): each appends
/// parallel.ulysses_degree / ring_degree / cfg_degree = N to `sets`, which must outlive the parse.
void add_degree_options(CLI::App* cmd, std::vector<std::string>& sets);
void add_forward_command(CLI::App& app);
void add_compare_command(CLI::App& app);
/// The options of `cocodiff run`.
struct RunCommandOptions {
  std::string config;
  std::vector<std::string> sets;
  std::string out;  // empty: out/<config file name without .toml>
  std::string backend = "emulator";
  std::string inject_fault;  // "rank=R,step=S" or empty
  bool quiet = false;
  bool force = false;  // --force: replace --out even when it is not an earlier output set
};

/// `cocodiff topo`: prints a cluster's tiers, links, routes and device model.
void add_topo_command(CLI::App& app);
/// `cocodiff weights`: a model's expected tensors; --check a checkpoint against them.
void add_weights_command(CLI::App& app);
/// `cocodiff netbench`: nccl-tests-style collective benchmark on the emulated cluster.
void add_netbench_command(CLI::App& app);
/// `cocodiff calibrate`: fits the collective library's software costs to measurements.
void add_calibrate_command(CLI::App& app);
/// `cocodiff tune`: searches strategies, parallel layouts and GPU counts for a config.
void add_tune_command(CLI::App& app);

}  // namespace cocodiff::apps
