// Fuzz target: a run config through the whole resolution pass (TOML parse, --set overrides,
// model and cluster presets, cluster graph, consistency checks, unknown keys, describe()).
// Bad input must end in a UserError subclass; anything else (another exception, a crash, a
// sanitizer report, a huge allocation) is a finding.
//
// Input: TOML text. Lines that start with "#set " (TOML comments) are also applied as --set
// assignments, so the fuzzer reaches the override code with the same input.

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "apps/run_plan.hpp"
#include "core/errors.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const std::filesystem::path dir = [] {
    std::filesystem::path d = std::filesystem::temp_directory_path() /
                              ("cocodiff_fuzz_config_" + std::to_string(::getpid()));
    std::filesystem::create_directories(d);
    return d;
  }();
  const std::string text(reinterpret_cast<const char*>(data), size);
  std::vector<std::string> sets;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);)
    if (line.rfind("#set ", 0) == 0) sets.push_back(line.substr(5));
  const std::filesystem::path file = dir / "run.toml";
  {
    std::ofstream out(file, std::ios::binary | std::ios::trunc);
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
  }
  try {
    const cocodiff::apps::RunPlan plan = cocodiff::apps::resolve_run_plan(file, sets);
    const std::string summary = cocodiff::apps::describe(plan);
    if (summary.empty()) __builtin_trap();
  } catch (const cocodiff::UserError&) {
    // Expected for bad input: the CLI prints it and exits 2.
  }
  return 0;
}
