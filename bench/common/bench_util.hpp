#pragma once
// What the sweep benchmarks share: running `cocodiff run` as a child process (its report.json,
// wall time and peak memory), a table printed to stdout and written as CSV and JSON, progress
// on stderr, and gnuplot plots.
//
//   bench::Args args = bench::parse_args(argc, argv, "emulator_scale");   // --out, --smoke, ...
//   bench::Table t({"tiles", "wall s"});
//   bench::Progress progress(points.size());
//   bench::ChildRun r = bench::run_cocodiff(args, {"--set", "cluster.nodes=2"}, "n2");
//   t.add({std::to_string(r.report["ranks"].get<int>()), bench::fmt("%.2f", r.wall_s)});
//   t.finish(args, "emulator_scale");                 // stdout + CSV + JSON in args.out
//   bench::plot(args, "emulator_scale", script);      // PNG via gnuplot

#include <chrono>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace cocodiff::bench {

struct Args {
  std::filesystem::path out = "bench-out";  // tables, JSON, CSV, PNGs, run directories
  std::filesystem::path cocodiff;           // the cocodiff binary
  std::filesystem::path config;             // the base run config (configs/quickstart.toml)
  std::filesystem::path config_dir;         // configs/
  bool smoke = false;                       // a seconds-long subset for CTest
  int workers = 1;                          // emulator.workers for the child runs
  std::vector<std::string> rest;            // arguments the program parses itself
};

/// Parses --out DIR, --smoke, --cocodiff BIN, --workers N (others are left in rest).
/// Prints usage and exits 2 on a malformed option.
Args parse_args(int argc, char** argv, const std::string& usage_tail = "");

/// One child `cocodiff run`: exit code, wall seconds, peak resident memory, report.json.
struct ChildRun {
  int exit_code = -1;
  double wall_s = 0;
  long maxrss_kib = 0;        // getrusage(RUSAGE_CHILDREN)-style ru_maxrss of this child
  double cpu_s = 0;           // the child's user + system CPU seconds (robust to a busy machine)
  nlohmann::json report;      // null unless the run succeeded
  std::string error;          // the child's last output lines when it failed
  std::filesystem::path dir;  // its output directory
  bool ok() const { return exit_code == 0 && !report.is_null(); }
};

/// Runs `cocodiff run <config> --out <args.out>/runs/<name> -q --set emulator.workers=W <extra>`
/// and waits for it (blocking). Never throws for a failing child: see ChildRun::error.
ChildRun run_cocodiff(const Args& args, const std::vector<std::string>& extra,
                      const std::string& name);

/// Runs any command with stdout+stderr into `log`; returns exit code, wall time and ru_maxrss.
ChildRun run_command(const std::vector<std::string>& argv, const std::filesystem::path& log);

/// Runs a command that writes `dir`/report.json (a `cocodiff run --out dir`, under mpirun or
/// not) with its output in `dir`.log.txt (beside the set); a stale report.json is removed first
/// and the new one read into ChildRun::report. Never throws for a failing child.
ChildRun run_report(const std::vector<std::string>& argv, const std::filesystem::path& dir);

/// "1,2,4" -> {1, 2, 4} (std::stoi's exceptions for a non-number).
std::vector<int> int_list(const std::string& s);

/// printf into a std::string.
std::string fmt(const char* format, ...) __attribute__((format(printf, 1, 2)));

/// "[3/12] label (elapsed 4.1 s, about 12 s left)" on stderr.
class Progress {
 public:
  explicit Progress(size_t total);
  void step(const std::string& label);
  void done();

 private:
  size_t total_, i_ = 0;
  std::chrono::steady_clock::time_point t0_;
};

/// A results table: string cells for stdout and CSV, JSON values for the JSON file.
class Table {
 public:
  explicit Table(std::vector<std::string> columns);
  /// One row; `cells` are printed, `json` (an object) is stored in the JSON file.
  void add(std::vector<std::string> cells, nlohmann::json json);
  /// Prints the table to stdout and writes <out>/<name>.csv and <out>/<name>.json (with `meta`
  /// as "meta" beside "rows").
  void finish(const Args& args, const std::string& name, const nlohmann::json& meta = {}) const;
  size_t size() const { return rows_.size(); }

 private:
  std::vector<std::string> columns_;
  std::vector<std::vector<std::string>> rows_;
  nlohmann::json json_ = nlohmann::json::array();
};

/// Writes <out>/<name>.dat (`data`), runs `script` through gnuplot with $DATA replaced by that
/// file's path (quoted), the terminal (pngcairo, width x height) and output <out>/<name>.png set
/// before it; the PNG appears atomically.
/// Returns false (after a warning on stderr) when gnuplot is missing or fails.
bool plot(const Args& args, const std::string& name, const std::string& data,
          const std::string& script, int width = 1000, int height = 600);

/// Writes `text` to `path` atomically; throws on failure.
void write_text(const std::filesystem::path& path, const std::string& text);

}  // namespace cocodiff::bench
