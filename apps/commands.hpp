#pragma once
// Each `cocodiff` sub-command lives in its own apps/cmd_*.cpp and registers itself here.

#include <CLI/CLI.hpp>

namespace cocodiff::apps {

/// `cocodiff topo`: prints a cluster's tiers, links, routes and device model.
void add_topo_command(CLI::App& app);
/// `cocodiff netbench`: nccl-tests-style collective benchmark on the emulated cluster.
void add_netbench_command(CLI::App& app);

}  // namespace cocodiff::apps
