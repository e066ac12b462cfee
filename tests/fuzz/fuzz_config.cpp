// Fuzz target: a run config through the whole resolution pass (TOML parse, --set overrides,
// model and cluster presets, cluster graph, consistency checks, unknown keys, describe()), then,
// when it resolves and is small, one phantom denoising step of it on the emulator, so that values
// that pass validation but break the timing model (a peak of 1e-30 TFLOP/s once aborted the run)
// are reached too. Bad input must end in a UserError subclass; anything else (another exception,
// a crash, a sanitizer report, a huge allocation) is a finding.
//
// Input: TOML text. Lines that start with "#set " (TOML comments) are also applied as --set
// assignments, so the fuzzer reaches the override code with the same input. The text is written
// to an anonymous in-memory file (memfd), so nothing is left on disk, even after a crash.

#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "apps/run_exec.hpp"
#include "apps/run_plan.hpp"
#include "core/errors.hpp"

namespace {

// The largest run the target executes: one step of a tiny model on a few tiles takes
// milliseconds in phantom mode, so the fuzzer keeps its pace.
constexpr int kMaxRanks = 16;
constexpr std::int64_t kMaxTokens = 1024;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const int fd = ::memfd_create("cocodiff_fuzz_config.toml", MFD_CLOEXEC);
  if (fd < 0) __builtin_trap();
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, data, size, 0) != static_cast<ssize_t>(size))
    __builtin_trap();
  const std::filesystem::path file = "/proc/self/fd/" + std::to_string(fd);
  const std::string text(reinterpret_cast<const char*>(data), size);
  std::vector<std::string> sets;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);)
    if (line.rfind("#set ", 0) == 0) sets.push_back(line.substr(5));
  try {
    const cocodiff::apps::RunPlan plan = cocodiff::apps::resolve_run_plan(file, sets);
    const std::string summary = cocodiff::apps::describe(plan);
    if (summary.empty()) __builtin_trap();
    // The same config for one phantom step on one worker, without a trace.
    std::vector<std::string> step = sets;
    for (const char* s :
         {"run.steps=1", "run.math=\"skip\"", "emulator.workers=1", "emulator.trace=false"})
      step.emplace_back(s);
    const cocodiff::apps::RunPlan one = cocodiff::apps::resolve_run_plan(file, step);
    if (one.ranks() <= kMaxRanks && one.tokens() <= kMaxTokens && !one.weights_file &&
        !one.initial_latent) {
      const cocodiff::apps::RunRecord r = cocodiff::apps::run_emulated(one);
      if (!r.emulated) __builtin_trap();
    }
  } catch (const cocodiff::UserError&) {
    // Expected for bad input: the CLI prints it and exits 2.
  } catch (const cocodiff::RankError& e) {
    if (!e.user_error()) throw;  // a rank's internal error is a finding
  }
  return 0;
}
