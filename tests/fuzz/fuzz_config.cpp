// Fuzz target: a run config through the whole resolution pass (TOML parse, --set overrides,
// model and cluster presets, cluster graph, consistency checks, unknown keys, describe()), then,
// when it resolves and is small, one phantom denoising step of it on the emulator, so that values
// that pass validation but break the timing model (a peak of 1e-30 TFLOP/s once aborted the run)
// are reached too. Bad input must end in a UserError subclass; anything else (another exception,
// a crash, a sanitizer report, a huge allocation) is a finding.
//
// Input: TOML text. Lines that start with "#set " (TOML comments) are also applied as --set
// assignments, so the fuzzer reaches the override code with the same input. The text is written
// to a real file, config.toml in a directory of this process's own (removed at exit) that also
// holds what a config may name relative to itself: image.png and mask.png (28 x 28, for
// run.inpaint_image and run.inpaint_mask) and big.png (a header claiming 30000 x 30000 pixels).
// Inputs of even size name the config by its bare file name, with that directory as the working
// directory while the input runs (a config whose directory is empty), the others by its absolute
// path.

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "core/errors.hpp"
#include "dit/image.hpp"
#include "runner/run_exec.hpp"
#include "runner/run_plan.hpp"

namespace {

// The largest run the target executes: one step of a tiny model on a few tiles takes
// milliseconds in phantom mode, so the fuzzer keeps its pace.
constexpr int kMaxRanks = 16;
constexpr std::int64_t kMaxTokens = 1024;

std::filesystem::path scratch_dir() {
  return std::filesystem::temp_directory_path() /
         ("cocodiff_fuzz_config_" + std::to_string(::getpid()));
}

// Creates the scratch directory with its images and makes it the working directory (once).
const std::filesystem::path& config_file() {
  static const std::filesystem::path file = [] {
    const std::filesystem::path dir = scratch_dir();
    std::filesystem::create_directories(dir);
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(scratch_dir(), ec);
    });
    cocodiff::dit::Rgb img;
    img.width = img.height = 28;
    img.pixels.assign(28 * 28 * 3, 0);
    for (std::size_t i = 0; i < img.pixels.size(); i += 7) img.pixels[i] = 200;
    cocodiff::dit::write_png(dir / "image.png", img);
    for (std::size_t i = 0; i < img.pixels.size(); ++i) img.pixels[i] = (i / 84) % 2 ? 255 : 0;
    cocodiff::dit::write_png(dir / "mask.png", img);
    // A PNG whose header claims 30000 x 30000 RGB pixels (69 bytes: IHDR, a tiny IDAT, IEND).
    const unsigned char big[] = {
        0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a, 0x00, 0x00, 0x00, 0x0d, 0x49, 0x48,
        0x44, 0x52, 0x00, 0x00, 0x75, 0x30, 0x00, 0x00, 0x75, 0x30, 0x08, 0x02, 0x00, 0x00,
        0x00, 0xe9, 0x45, 0x6f, 0xed, 0x00, 0x00, 0x00, 0x0c, 0x49, 0x44, 0x41, 0x54, 0x78,
        0x9c, 0x63, 0x60, 0x60, 0x60, 0x00, 0x00, 0x00, 0x04, 0x00, 0x01, 0xf6, 0x17, 0x38,
        0x55, 0x00, 0x00, 0x00, 0x00, 0x49, 0x45, 0x4e, 0x44, 0xae, 0x42, 0x60, 0x82};
    std::ofstream(dir / "big.png", std::ios::binary)
        .write(reinterpret_cast<const char*>(big), sizeof big);
    return dir / "config.toml";
  }();
  return file;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::filesystem::path& written = config_file();
  {
    std::ofstream out(written, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
    if (!out) __builtin_trap();
  }
  // The working directory is the config's for this input only: libFuzzer reads its corpus and
  // writes its artifacts relative to the one it started in.
  struct WorkingDirectory {
    std::filesystem::path before = std::filesystem::current_path();
    ~WorkingDirectory() {
      std::error_code ec;
      std::filesystem::current_path(before, ec);
    }
  } restore;
  if (size % 2 == 0) std::filesystem::current_path(written.parent_path());
  const std::filesystem::path file = size % 2 == 0 ? written.filename() : written;
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
