// Fuzz targets for `cocodiff calibrate`'s measurement readers (calibrate/measurements.hpp):
// fuzz_calibrate_csv reads the input as it is (CSV of collectives, kernels or eager ops,
// netbench output or its JSON, interference, breakdown and chunks JSON, steps CSV, kernel grids:
// the reader tells them apart by their contents; eager ops and interference then go through the
// fit calibrate makes of them, a grid through its lookups),
// fuzz_nccl_tests reads it as nccl-tests output (after a "# nThread" line), fuzz_steps_csv as the
// rows of a steps CSV (after measure_multi.py's header), fuzz_interference_json as an
// interference JSON object (after a "{" where it has none). Every point read is
// placed on a small cluster as calibrate places it. One input in 16 also goes through a real file
// (the size and line caps of read_measurements), which must read the same points: a file per input
// would make the target ten times slower. Bad input must end in a UserError; anything else (another
// exception, a crash, a sanitizer report, a huge allocation), or a point outside the plausible
// ranges the reader promises, is a finding.

#include <unistd.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "calibrate/collective_fit.hpp"
#include "calibrate/eager_fit.hpp"
#include "calibrate/measurements.hpp"
#include "core/errors.hpp"
#include "net_models/cluster.hpp"
#include "net_models/kernel_grid.hpp"

#ifndef COCODIFF_FUZZ_NCCL_TESTS
#define COCODIFF_FUZZ_NCCL_TESTS 0
#endif
#ifndef COCODIFF_FUZZ_STEPS
#define COCODIFF_FUZZ_STEPS 0
#endif
#ifndef COCODIFF_FUZZ_INTERFERENCE
#define COCODIFF_FUZZ_INTERFERENCE 0
#endif

namespace {

namespace cal = cocodiff::calibrate;

// A file rewritten for every input, removed at exit. The name lives as long as the process:
// a static string would be destroyed before the exit handler that reads it (handlers run in
// the reverse order of their registration, and the string's own is registered after this one).
const std::string& input_file() {
  static const std::string* const path = [] {
    const auto* p =
        new std::string((std::filesystem::temp_directory_path() /
                         ("cocodiff_fuzz_calibrate_" + std::to_string(::getpid()) + ".txt"))
                            .string());
    std::atexit([] { std::filesystem::remove(input_file()); });
    return p;
  }();
  return *path;
}

const cocodiff::Cluster& cluster() {
  static const cocodiff::Cluster c = [] {
    const std::filesystem::path presets = std::filesystem::path(COCODIFF_CONFIG_DIR) / "clusters";
    return cocodiff::load_cluster(cocodiff::load_cluster_config("uniform", presets), presets);
  }();
  return c;
}

void check(bool ok) {
  if (!ok) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::string text(reinterpret_cast<const char*>(data), size);
  if (COCODIFF_FUZZ_NCCL_TESTS) text = "# nThread 1 nGpus 1 minBytes 8\n" + text;
  if (COCODIFF_FUZZ_STEPS)
    text =
        "strategy,gpus,resolution,image_tokens,median_ms,min_ms,max_ms,host_issue_ms,transport,"
        "timed_steps\n" +
        text;
  if (COCODIFF_FUZZ_INTERFERENCE && text.find_first_not_of(" \t\r\n") != std::string::npos &&
      text[text.find_first_not_of(" \t\r\n")] != '{')
    text = "{" + text;
  cal::Measurements m;
  bool parsed = true;
  try {
    cal::parse_measurements(text, input_file(), m);
  } catch (const cocodiff::UserError&) {
    parsed = false;
  }
  std::uint32_t h = 2166136261u;  // FNV-1a: which inputs also go through the file
  for (std::size_t i = 0; i < size; ++i) h = (h ^ data[i]) * 16777619u;
  if (h % 16 == 0) {
    FILE* f = std::fopen(input_file().c_str(), "wb");
    if (f == nullptr) __builtin_trap();
    if (std::fwrite(text.data(), 1, text.size(), f) != text.size()) __builtin_trap();
    std::fclose(f);
    cal::Measurements from_file;
    bool read = true;
    try {
      cal::read_measurements(input_file(), from_file);
    } catch (const cocodiff::UserError&) {
      read = false;
    }
    // The file reader refuses what the parser refuses; else it reads the same points.
    check(read == parsed);
    if (read)
      check(from_file.collectives.size() == m.collectives.size() &&
            from_file.kernels.size() == m.kernels.size() &&
            from_file.eager_ops.size() == m.eager_ops.size() &&
            from_file.interference.size() == m.interference.size());
  }
  if (!parsed) return 0;
  check(!m.collectives.empty() || !m.kernels.empty() || !m.eager_ops.empty() ||
        !m.interference.empty() || !m.steps.empty() || !m.breakdowns.empty() || !m.chunks.empty() ||
        !m.grid_files.empty());
  // A kernel grid: merged, every point returns a positive finite time at its own shape, and so
  // do shapes between and beyond its points (or none, for what no series covers).
  if (!m.grid_files.empty()) {
    cocodiff::KernelGrid g;
    try {
      for (const auto& [name, body] : m.grid_files) g.add_text(body, name);
      g.finish();
    } catch (const cocodiff::UserError&) {
      __builtin_trap();  // parse_measurements accepted the same text
    }
    const auto finite_or_none = [](std::optional<double> t) {
      check(!t || (std::isfinite(*t) && *t > 0));
    };
    for (size_t i = 0; i < g.points().size() && i < 64; ++i) {
      const cocodiff::KernelGrid::Point& p = g.points()[i];
      const std::optional<double> t = g.time_s(p.shape);
      check(t.has_value() && std::isfinite(*t) && *t > 0);
      finite_or_none(g.held_out(i));
      for (const std::int64_t scale : {2, 3, 7}) {
        cocodiff::KernelShape s = p.shape;
        s.dims[0] = s.dims[0] * scale + 1;
        finite_or_none(g.time_s(s));
        s.dims[1] = s.dims[1] / scale + 1;
        finite_or_none(g.time_s(s));
      }
    }
  }
  for (const cal::CollectivePoint& p : m.collectives) {
    check(!p.where.empty());
    check(p.ranks >= 1 && p.ranks <= cal::kMaxRanks);
    check(p.nodes >= 0 && p.nodes <= p.ranks);
    check(p.bytes >= 1 && p.bytes <= cal::kMaxBytes);
    check(p.time_us >= cal::kMinTimeUs && p.time_us <= cal::kMaxTimeUs);
    try {
      const std::vector<int> members = cal::point_members(cluster(), p);
      check(static_cast<int>(members.size()) == p.ranks);
      for (int r : members) check(r >= 0 && r < cluster().topology.num_ranks());
    } catch (const cocodiff::UserError&) {
    }
  }
  for (const cal::KernelPoint& p : m.kernels) {
    check(!p.op.empty() && p.op.size() <= 64);
    for (char c : p.op)
      check((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
            c == '_' || c == '-');
    check(p.flops >= 0 && p.bytes >= 0 && (p.flops > 0 || p.bytes > 0));
    check(p.time_us >= cal::kMinTimeUs && p.time_us <= cal::kMaxTimeUs);
  }
  const auto in_range_or_unmeasured = [](double t) {
    return t == -1 || (t >= cal::kMinTimeUs && t <= cal::kMaxTimeUs);
  };
  for (const cal::EagerOpPoint& p : m.eager_ops) {
    check(!p.op.empty() && !p.label.empty() && p.flops >= 0);
    check(in_range_or_unmeasured(p.device_us) && in_range_or_unmeasured(p.host_us));
    check(p.device_us > 0 || p.host_us > 0);
  }
  for (const cal::StepPoint& p : m.steps) {
    check(!p.where.empty() && !p.strategy.empty());
    check(p.gpus >= 1 && p.gpus <= cal::kMaxRanks);
    check(p.resolution >= 16 && p.resolution <= (1 << 16) && p.resolution % 16 == 0);
    check(std::isfinite(p.median_ms) && p.median_ms >= cal::kMinTimeUs / 1e3 &&
          p.median_ms <= cal::kMaxTimeUs / 1e3);
  }
  for (const cal::InterferencePoint& p : m.interference) {
    check(p.bytes >= 1 && p.bytes <= cal::kMaxBytes);
    check(!p.kernel.empty() && !p.where.empty());
    for (double t : {p.kernel_alone_us, p.kernel_with_us, p.a2a_alone_us, p.a2a_with_us})
      check(t >= cal::kMinTimeUs && t <= cal::kMaxTimeUs);
  }
  // The tables and factors calibrate writes from them: finite, or a UserError.
  try {
    const cal::EagerFit f = cal::fit_eager(m.eager_ops, m.interference);
    for (const auto& [label, t] : f.tables) {
      check(!t.flops.empty() && t.flops.size() == t.time_us.size());
      for (double v : t.time_us) check(std::isfinite(v) && v > 0);
    }
    for (const auto& [label, c] : f.host_ops) check(std::isfinite(c) && c > 0);
    check(std::isfinite(f.overlap_compute) && std::isfinite(f.overlap_transfer));
  } catch (const cocodiff::UserError&) {
  }
  return 0;
}
