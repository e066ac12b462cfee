#include "bench/common/bench_util.hpp"

#include <fcntl.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <sstream>

#include "core/atomic_file.hpp"
#include "emulator/timeline_plot.hpp"

extern char** environ;

namespace cocodiff::bench {

namespace {

[[noreturn]] void usage(const char* prog, const std::string& tail) {
  std::fprintf(stderr,
               "usage: %s [--out DIR] [--smoke] [--cocodiff BIN] [--config TOML] [--workers N]%s\n",
               prog, tail.c_str());
  std::exit(2);
}

std::string tail_of(const std::filesystem::path& p, size_t max_chars) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  std::string s = ss.str();
  if (s.size() > max_chars) s = "..." + s.substr(s.size() - max_chars);
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

std::string csv_cell(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string q = "\"";
  for (char c : s) q += c == '"' ? std::string("\"\"") : std::string(1, c);
  return q + "\"";
}

}  // namespace

std::string fmt(const char* format, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, format);
  std::vsnprintf(buf, sizeof buf, format, ap);
  va_end(ap);
  return buf;
}

Args parse_args(int argc, char** argv, const std::string& usage_tail) {
  Args a;
#ifdef COCODIFF_BIN
  a.cocodiff = COCODIFF_BIN;
#endif
#ifdef COCODIFF_CONFIG_DIR
  a.config_dir = COCODIFF_CONFIG_DIR;
  a.config = a.config_dir / "flux1-tiny-24tiles.toml";
#endif
  for (int i = 1; i < argc; ++i) {
    const std::string s = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(argv[0], usage_tail);
      return argv[++i];
    };
    if (s == "--out") {
      a.out = value();
    } else if (s == "--smoke") {
      a.smoke = true;
    } else if (s == "--cocodiff") {
      a.cocodiff = value();
    } else if (s == "--config") {
      a.config = value();
    } else if (s == "--workers") {
      a.workers = std::atoi(value().c_str());
      if (a.workers < 1) usage(argv[0], usage_tail);
    } else if (s == "-h" || s == "--help") {
      usage(argv[0], usage_tail);
    } else {
      a.rest.push_back(s);
    }
  }
  std::error_code ec;
  std::filesystem::create_directories(a.out, ec);
  if (ec) {
    std::fprintf(stderr, "%s: cannot create %s: %s\n", argv[0], a.out.c_str(),
                 ec.message().c_str());
    std::exit(2);
  }
  return a;
}

ChildRun run_command(const std::vector<std::string>& argv, const std::filesystem::path& log) {
  ChildRun r;
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const auto t0 = std::chrono::steady_clock::now();
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, args[0], &fa, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) {
    r.error = argv[0] + ": cannot start: " + std::strerror(rc);
    return r;
  }
  int status = 0;
  rusage ru{};
  while (wait4(pid, &status, 0, &ru) < 0) {
    if (errno != EINTR) {
      r.error = std::string("wait4: ") + std::strerror(errno);
      return r;
    }
  }
  r.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.maxrss_kib = ru.ru_maxrss;
  r.cpu_s = static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
            static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1e-6;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  if (r.exit_code != 0) r.error = tail_of(log, 800);
  return r;
}

ChildRun run_report(const std::vector<std::string>& argv, const std::filesystem::path& dir) {
  // The log goes beside the output set: cocodiff replaces only its own earlier sets.
  std::error_code ec;
  std::filesystem::create_directories(dir.parent_path(), ec);
  std::filesystem::remove(dir / "report.json", ec);
  ChildRun r = run_command(argv, dir.string() + ".log.txt");
  r.dir = dir;
  if (r.exit_code == 0) {
    std::ifstream in(dir / "report.json");
    try {
      r.report = nlohmann::json::parse(in);
    } catch (const std::exception& e) {
      r.error = std::string("report.json: ") + e.what();
    }
  }
  return r;
}

ChildRun run_cocodiff(const Args& args, const std::vector<std::string>& extra,
                      const std::string& name) {
  const std::filesystem::path dir = args.out / "runs" / name;
  std::vector<std::string> argv = {args.cocodiff.string(),
                                   "run",
                                   args.config.string(),
                                   "--out",
                                   dir.string(),
                                   "-q",
                                   "--set",
                                   "emulator.workers=" + std::to_string(args.workers)};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return run_report(argv, dir);
}

std::vector<int> int_list(const std::string& s) {
  std::vector<int> v;
  std::stringstream ss(s);
  std::string x;
  while (std::getline(ss, x, ',')) v.push_back(std::stoi(x));
  return v;
}

Progress::Progress(size_t total) : total_(total), t0_(std::chrono::steady_clock::now()) {}

void Progress::step(const std::string& label) {
  ++i_;
  const double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
  std::string eta;
  if (i_ > 1)
    eta = fmt(", about %.0f s left",
              el / static_cast<double>(i_ - 1) * static_cast<double>(total_ - i_ + 1));
  std::fprintf(stderr, "[%zu/%zu] %s (elapsed %.1f s%s)\n", i_, total_, label.c_str(), el,
               eta.c_str());
}

void Progress::done() {
  const double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
  std::fprintf(stderr, "done: %zu point(s) in %.1f s\n", total_, el);
}

Table::Table(std::vector<std::string> columns) : columns_(std::move(columns)) {}

void Table::add(std::vector<std::string> cells, nlohmann::json json) {
  cells.resize(columns_.size());
  rows_.push_back(std::move(cells));
  json_.push_back(std::move(json));
}

namespace {
// `cocodiff --version` of the program the benchmark ran (its build: profile-guided or not),
// or empty when there is none.
std::string program_version(const std::filesystem::path& cocodiff) {
  std::error_code ec;
  if (cocodiff.empty() || !std::filesystem::exists(cocodiff, ec)) return {};
  // Run directly (no shell: the path is an argument, never code).
  char log[] = "/tmp/cocodiff-version-XXXXXX";
  const int fd = ::mkstemp(log);
  if (fd < 0) return {};
  ::close(fd);
  const ChildRun r = run_command({cocodiff.string(), "--version"}, log);
  std::string out = r.exit_code == 0 ? tail_of(log, 400) : std::string();
  std::filesystem::remove(log, ec);
  while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
  return out;
}
}  // namespace

void Table::finish(const Args& args, const std::string& name, const nlohmann::json& meta) const {
  std::vector<size_t> w(columns_.size());
  for (size_t c = 0; c < columns_.size(); ++c) {
    w[c] = columns_[c].size();
    for (const auto& r : rows_) w[c] = std::max(w[c], r[c].size());
  }
  std::ostringstream os, csv;
  auto line = [&](const std::vector<std::string>& cells) {
    for (size_t c = 0; c < cells.size(); ++c) {
      os << (c ? " | " : "") << cells[c] << std::string(w[c] - cells[c].size(), ' ');
      csv << (c ? "," : "") << csv_cell(cells[c]);
    }
    os << "\n";
    csv << "\n";
  };
  line(columns_);
  for (size_t c = 0; c < columns_.size(); ++c) os << (c ? "-|-" : "") << std::string(w[c], '-');
  os << "\n";
  for (const auto& r : rows_) line(r);
  std::cout << os.str() << std::flush;
  write_text(args.out / (name + ".csv"), csv.str());
  nlohmann::json m = meta.is_null() ? nlohmann::json::object() : meta;
  if (const std::string v = program_version(args.cocodiff); !v.empty() && m.is_object())
    m["cocodiff"] = {{"path", args.cocodiff.string()}, {"version", v}};
  nlohmann::json j = {{"benchmark", name}, {"meta", m}, {"rows", json_}};
  write_text(args.out / (name + ".json"), j.dump(2) + "\n");
  std::fprintf(stderr, "wrote %s.{csv,json} in %s\n", name.c_str(), args.out.c_str());
}

void write_text(const std::filesystem::path& path, const std::string& text) {
  write_file_atomic(path, text);
}

bool plot(const Args& args, const std::string& name, const std::string& data,
          const std::string& script, int width, int height) {
  const std::filesystem::path png = std::filesystem::absolute(args.out / (name + ".png"));
  write_text(args.out / (name + ".dat"), data);
  // The script reads the data by bare name in gnuplot's scratch directory: no path in it.
  std::string s = script;
  const std::string from = "$DATA", to = "'plot.dat'";
  for (size_t p = s.find(from); p != std::string::npos; p = s.find(from, p + to.size()))
    s.replace(p, from.size(), to);
  const std::string why =
      emu::render_gnuplot_png(fmt("pngcairo size %d,%d noenhanced font 'sans,10'", width, height),
                              s, {{"plot.dat", data}}, png);
  if (!why.empty()) {
    std::fprintf(stderr, "warning: %s.png not drawn: %s\n", name.c_str(), why.c_str());
    return false;
  }
  std::fprintf(stderr, "wrote %s\n", png.c_str());
  return true;
}

}  // namespace cocodiff::bench
