// The emulated figures the READMEs quote, regenerated from the shipped presets, and the check
// that they still match what the presets and the engine give.
//
//   figures --write [--jobs N]   runs `study` (speedup, breakdown, a2a) on every cluster of
//                                kClusters, keeps its JSON in bench/figures/data/, and rewrites
//                                every marked block of the READMEs from it
//   figures --render             rewrites the blocks from the data kept (no runs)
//   figures --check              every marked block against the data (no runs), then the cheap
//                                part of the data run again (per cluster: the one-node
//                                all-to-all sweep and the FLUX.1-dev 1024^2 one-node cell; one
//                                compare run of bench/study/run_study.sh)
// The `cocodiff compare` blocks come from bench/study/results/*/compare.json, which
// bench/study/run_study.sh writes (scripts/figures.sh runs it afresh first).
//
// A block in a README is the lines between `<!-- figures:NAME -->` and `<!-- /figures:NAME -->`;
// each names the cluster preset and collective library its numbers come from.
// `bash scripts/figures.sh` builds what it needs and runs `figures --write`.

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "bench/common/bench_util.hpp"
#include "core/config.hpp"

namespace cocodiff::bench {
namespace {

namespace fs = std::filesystem;

struct ClusterRun {
  std::string cluster;  // preset name
  std::string title;    // how the READMEs name it
};
const std::vector<ClusterRun> kClusters = {{"aurora", "Aurora"}, {"hgx-h100", "HGX H100"}};
const std::vector<std::string> kParts = {"speedup", "breakdown", "a2a"};
const std::vector<std::string> kReadmes = {"README.md", "bench/README.md",
                                           "bench/fidelity/README.md"};

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + p.string());
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

nlohmann::json read_json(const fs::path& p) { return nlohmann::json::parse(read_file(p)); }

fs::path data_file(const fs::path& source, const std::string& cluster, const std::string& part) {
  return source / "bench" / "figures" / "data" / (cluster + "_" + part + ".json");
}

// The study's output file for a part: study_<part>[_<cluster>].json (aurora has no suffix).
fs::path study_file(const fs::path& dir, const std::string& cluster, const std::string& part) {
  return dir / ("study_" + part + (cluster == "aurora" ? "" : "_" + cluster) + ".json");
}

std::string model_name(const std::string& preset) {
  static const std::map<std::string, std::string> names = {{"flux1-dev", "FLUX.1-dev"},
                                                           {"sd35-large", "SD3.5-L"},
                                                           {"sd35-medium", "SD3.5-M"},
                                                           {"qwen-image", "Qwen-Image"}};
  const auto it = names.find(preset);
  return it == names.end() ? preset : it->second;
}

// The collective library a cluster preset names ([library] preset; "ideal" without one).
std::string library_of(const fs::path& config_dir, const std::string& cluster) {
  const Config c = Config::load(config_dir / "clusters" / (cluster + ".toml"));
  return c.get_string("library.preset", "ideal");
}

struct Data {
  std::map<std::string, nlohmann::json> speedup, breakdown, a2a;  // by cluster
  std::map<std::string, std::string> library;                     // by cluster
  std::map<std::string, nlohmann::json> compare;  // bench/study/results/NAME/compare.json
};

// bench/study/run_study.sh's `cocodiff compare` runs, by directory name.
std::map<std::string, nlohmann::json> load_compare(const fs::path& source) {
  std::map<std::string, nlohmann::json> out;
  const fs::path dir = source / "bench" / "study" / "results";
  for (const fs::directory_entry& e : fs::directory_iterator(dir))
    if (fs::exists(e.path() / "compare.json"))
      out[e.path().filename().string()] = read_json(e.path() / "compare.json");
  if (out.empty()) throw std::runtime_error("no compare.json under " + dir.string());
  return out;
}

// An entry of a compare run by strategy.
const nlohmann::json& entry(const nlohmann::json& compare, const std::string& strategy) {
  for (const nlohmann::json& e : compare["entries"])
    if (e["strategy"] == strategy) return e;
  throw std::runtime_error("compare.json without strategy " + strategy);
}

Data load_data(const fs::path& source, const fs::path& config_dir) {
  Data d;
  for (const ClusterRun& c : kClusters) {
    d.speedup[c.cluster] = read_json(data_file(source, c.cluster, "speedup"));
    d.breakdown[c.cluster] = read_json(data_file(source, c.cluster, "breakdown"));
    d.a2a[c.cluster] = read_json(data_file(source, c.cluster, "a2a"));
    d.library[c.cluster] = library_of(config_dir, c.cluster);
  }
  d.compare = load_compare(source);
  return d;
}

std::string source_line(const Data& d, const std::string& cluster) {
  return "Preset `" + cluster + "` (`configs/clusters/" + cluster + ".toml`), library `" +
         d.library.at(cluster) + "`; regenerated by `bash scripts/figures.sh`.";
}

// The configuration of the best cocodiff speedup: "SD3.5 Medium 1024^2, 8 nodes".
std::string best_cell(const nlohmann::json& speedup, const char* field) {
  const nlohmann::json* best = nullptr;
  for (const nlohmann::json& r : speedup["rows"])
    if (best == nullptr || r[field].get<double>() > (*best)[field].get<double>()) best = &r;
  if (best == nullptr) return "no cells";
  const int nodes = (*best)["nodes"].get<int>();
  return model_name((*best)["model"]) + " " + std::to_string((*best)["resolution"].get<int>()) +
         "^2, " + std::to_string(nodes) + (nodes == 1 ? " node" : " nodes");
}

// Blocks by name: each renders the lines between its markers.
using Render = std::function<std::string(const Data&)>;

std::string headline(const Data& d) {
  std::string s;
  for (size_t i = 0; i < kClusters.size(); ++i) {
    const ClusterRun& c = kClusters[i];
    const nlohmann::json& sp = d.speedup.at(c.cluster);
    const nlohmann::json& m = sp["meta"];
    s +=
        fmt("- %s (preset `%s`, library `%s`): cocodiff **%.2fx** mean, **%.2fx** peak (%s); tapa "
            "%.2fx mean, %.2fx peak; %zu configurations.\n",
            c.title.c_str(), c.cluster.c_str(), d.library.at(c.cluster).c_str(),
            m["cocodiff_speedup_mean"].get<double>(), m["cocodiff_speedup_peak"].get<double>(),
            best_cell(sp, "cocodiff_speedup").c_str(), m["tapa_speedup_mean"].get<double>(),
            m["tapa_speedup_peak"].get<double>(), sp["rows"].size());
  }
  return s;
}

std::string speedup_table(const Data& d, const std::string& cluster) {
  const nlohmann::json& sp = d.speedup.at(cluster);
  std::string s =
      "| model | res | nodes | tiles | flat ms/step | tapa ms/step | cocodiff ms/step | tapa x | "
      "cocodiff x | flat exposed % | cocodiff exposed % | steps | flat s/image | cocodiff "
      "s/image | cocodiff x image "
      "|\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n";
  for (const nlohmann::json& r : sp["rows"]) {
    const double flat = r["flat_step_s"], tapa = r["tapa_step_s"], cc = r["cocodiff_step_s"];
    s += fmt(
        "| %s | %d | %d | %d | %.2f | %.2f | %.2f | %.2f | %.2f | %.1f | %.1f | %d | %.2f | "
        "%.2f | %.2f |\n",
        model_name(r["model"]).c_str(), r["resolution"].get<int>(), r["nodes"].get<int>(),
        r["tiles"].get<int>(), flat * 1e3, tapa * 1e3, cc * 1e3, r["tapa_speedup"].get<double>(),
        r["cocodiff_speedup"].get<double>(), 100 * r["flat_exposed_s"].get<double>() / flat,
        100 * r["cocodiff_exposed_s"].get<double>() / cc, r["image_steps"].get<int>(),
        r["flat_image_s"].get<double>(), r["cocodiff_image_s"].get<double>(),
        r["cocodiff_image_speedup"].get<double>());
  }
  return s;
}

std::string speedup_summary(const Data& d, const std::string& cluster) {
  const nlohmann::json& sp = d.speedup.at(cluster);
  const nlohmann::json& m = sp["meta"];
  return fmt(
      "Over these %zu configurations: **tapa %.2fx mean, %.2fx peak; cocodiff %.2fx mean, "
      "%.2fx peak** per steady-state step (peak: %s), and **%.2fx mean, %.2fx peak per "
      "whole image**. %s\n",
      sp["rows"].size(), m["tapa_speedup_mean"].get<double>(), m["tapa_speedup_peak"].get<double>(),
      m["cocodiff_speedup_mean"].get<double>(), m["cocodiff_speedup_peak"].get<double>(),
      best_cell(sp, "cocodiff_speedup").c_str(), m["cocodiff_image_speedup_mean"].get<double>(),
      m["cocodiff_image_speedup_peak"].get<double>(), source_line(d, cluster).c_str());
}

// Exposed communication per model and resolution, at each node count, from the speedup rows.
std::string exposed_table(const Data& d, const std::string& cluster) {
  const nlohmann::json& rows = d.speedup.at(cluster)["rows"];
  std::vector<int> nodes;
  std::vector<std::pair<std::string, int>> configs;
  for (const nlohmann::json& r : rows) {
    if (std::find(nodes.begin(), nodes.end(), r["nodes"].get<int>()) == nodes.end())
      nodes.push_back(r["nodes"]);
    const std::pair<std::string, int> c{r["model"], r["resolution"]};
    if (std::find(configs.begin(), configs.end(), c) == configs.end()) configs.push_back(c);
  }
  std::string at;
  for (size_t i = 0; i < nodes.size(); ++i) at += (i ? " / " : "") + std::to_string(nodes[i]);
  std::string s = "| model | res | flat exposed % at " + at + " nodes | cocodiff exposed % at " +
                  at + " nodes |\n|---|---|---|---|\n";
  for (const auto& [model, res] : configs) {
    std::string flat, cc;
    for (const int n : nodes)
      for (const nlohmann::json& r : rows)
        if (r["model"] == model && r["resolution"] == res && r["nodes"] == n) {
          flat +=
              (flat.empty() ? "" : " / ") +
              fmt("%.1f", 100 * r["flat_exposed_s"].get<double>() / r["flat_step_s"].get<double>());
          cc +=
              (cc.empty() ? "" : " / ") + fmt("%.1f", 100 * r["cocodiff_exposed_s"].get<double>() /
                                                          r["cocodiff_step_s"].get<double>());
        }
    s +=
        "| " + model_name(model) + " | " + std::to_string(res) + " | " + flat + " | " + cc + " |\n";
  }
  return s;
}

std::string breakdown_table(const Data& d, const std::string& cluster) {
  const nlohmann::json& b = d.breakdown.at(cluster);
  std::string s = b["meta"]["config"].get<std::string>() + ", per step. " +
                  source_line(d, cluster) +
                  "\n\n| strategy | run.strategy | ms/step | x flat | compute ms | exposed ms | "
                  "exposed % |\n|---|---|---|---|---|---|---|\n";
  for (const nlohmann::json& r : b["rows"]) {
    const double step = r["step_s"];
    s += fmt("| %s | %s | %.2f | %.2f | %.2f | %.2f | %.1f |\n",
             r["label"].get<std::string>().c_str(), r["strategy"].get<std::string>().c_str(),
             step * 1e3, r["speedup"].get<double>(), r["compute_s"].get<double>() * 1e3,
             r["exposed_s"].get<double>() * 1e3, 100 * r["exposed_s"].get<double>() / step);
  }
  return s;
}

std::string a2a_table(const Data& d, const std::string& cluster) {
  const nlohmann::json& a = d.a2a.at(cluster);
  std::string s = "All-to-all on one node (" + std::to_string(a["meta"]["ranks"].get<int>()) +
                  " ranks), pairwise rounds, bf16. " + source_line(d, cluster) +
                  "\n\n| bytes per rank | flat us | tapa us | tapa x |\n|---|---|---|---|\n";
  // Every fourth doubling from the first size, and the last.
  const nlohmann::json& rows = a["rows"];
  for (size_t i = 0; i < rows.size(); ++i) {
    if (i % 4 != 0 && i + 1 != rows.size()) continue;
    const double bytes = rows[i]["bytes"];
    const std::string size =
        bytes >= 0.9 * (1 << 20) ? fmt("%.0f MB", bytes / (1 << 20)) : fmt("%.0f KB", bytes / 1024);
    s += fmt("| %s | %.1f | %.1f | %.2f |\n", size.c_str(), rows[i]["flat_us"].get<double>(),
             rows[i]["tapa_us"].get<double>(), rows[i]["tapa_speedup"].get<double>());
  }
  return s;
}

std::string grid_row(const Data& d, const std::string& cluster) {
  const nlohmann::json& sp = d.speedup.at(cluster);
  const nlohmann::json& m = sp["meta"];
  return fmt(
      "| `%s` preset, `%s` library, %zu cells (per step) | %.2fx | %.2fx | %.2fx | %.2fx "
      "(%s) |\n"
      "| `%s` preset, `%s` library, %zu cells (whole image, default step counts) | | | "
      "%.2fx | %.2fx |\n",
      cluster.c_str(), d.library.at(cluster).c_str(), sp["rows"].size(),
      m["tapa_speedup_mean"].get<double>(), m["tapa_speedup_peak"].get<double>(),
      m["cocodiff_speedup_mean"].get<double>(), m["cocodiff_speedup_peak"].get<double>(),
      best_cell(sp, "cocodiff_speedup").c_str(), cluster.c_str(), d.library.at(cluster).c_str(),
      sp["rows"].size(), m["cocodiff_image_speedup_mean"].get<double>(),
      m["cocodiff_image_speedup_peak"].get<double>());
}

const std::vector<std::string> kCompareStrategies = {"tapa", "v_first", "pipeline", "cocodiff"};

// A compare run of data-dependent accelerations (--techniques): a table of its own.
bool with_techniques(const nlohmann::json& c) {
  return c.contains("techniques") && c["techniques"].is_string() &&
         !c["techniques"].get<std::string>().empty();
}

// The phantom compare runs: speedup of each strategy over flat, per run (2 steps, the first
// sending V in full), and what they show side by side.
std::string compare_phantom(const Data& d) {
  std::string s =
      "| run | flat ms/step | tapa x | v_first x | pipeline x | cocodiff x "
      "|\n|---|---|---|---|---|---|\n";
  std::vector<double> cc;
  std::string best;
  double best_x = 0;
  int vf_below_tapa = 0, pipe_beats_cc = 0, runs = 0;
  for (const auto& [name, c] : d.compare) {
    if (entry(c, "flat")["math"] != "skip" || with_techniques(c)) continue;
    ++runs;
    const nlohmann::json& flat = entry(c, "flat");
    s += fmt("| %s | %.2f |", name.c_str(),
             1e3 * flat["virtual_time_s"].get<double>() / flat["steps"].get<double>());
    for (const std::string& st : kCompareStrategies)
      s += fmt(" %.2f |", entry(c, st)["speedup_vs_flat"].get<double>());
    s += "\n";
    const double x = entry(c, "cocodiff")["speedup_vs_flat"];
    cc.push_back(x);
    if (x > best_x) {
      best_x = x;
      best = name;
    }
    vf_below_tapa += entry(c, "v_first")["speedup_vs_flat"].get<double>() <
                     entry(c, "tapa")["speedup_vs_flat"].get<double>();
    pipe_beats_cc += entry(c, "pipeline")["speedup_vs_flat"].get<double>() > x;
  }
  double mean = 0;
  for (double x : cc) mean += x / static_cast<double>(cc.size());
  s += fmt(
      "\nOver the %d phantom runs: cocodiff **%.2fx mean, %.2fx peak** (%s) over flat; v_first "
      "(tapa+v_first) slower than tapa in %d of them; tapa+pipeline faster than cocodiff in %d. "
      "Preset `aurora`, library `%s`; regenerated by `bash scripts/figures.sh`.\n",
      runs, mean, best_x, best.c_str(), vf_below_tapa, pipe_beats_cc,
      d.library.at("aurora").c_str());
  return s;
}

// The real-math runs of the small model: speedups and V-Major's saving and quality.
std::string compare_real(const Data& d) {
  std::string s =
      "| run | tapa x | v_first x | pipeline x | cocodiff x | V-Major saved (inter-node) | "
      "PSNR dB | SSIM |\n|---|---|---|---|---|---|---|---|\n";
  for (const auto& [name, c] : d.compare) {
    if (entry(c, "flat")["math"] == "skip" || with_techniques(c)) continue;
    s += "| " + name + " |";
    for (const std::string& st : kCompareStrategies)
      s += fmt(" %.2f |", entry(c, st)["speedup_vs_flat"].get<double>());
    const nlohmann::json& e = entry(c, "cocodiff");
    const nlohmann::json* vm = nullptr;
    if (e.contains("strategy_stats") && e["strategy_stats"].contains("v_major"))
      vm = &e["strategy_stats"]["v_major"]["tiers"]["inter-node"];
    s += vm != nullptr && vm->is_object()
             ? fmt(" %.1f%% |", 100 * (*vm)["saved_fraction"].get<double>())
             : std::string(" |");
    const nlohmann::json q = e.value("quality", nlohmann::json::object());
    const nlohmann::json psnr = q.value("preview_psnr_db", nlohmann::json());
    s += psnr.is_number()   ? fmt(" %.1f |", psnr.get<double>())
         : psnr.is_string() ? " " + psnr.get<std::string>() + " |"
                            : std::string(" |");
    s += q.contains("preview_ssim") ? fmt(" %.4f |\n", q["preview_ssim"].get<double>()) : " |\n";
  }
  return s + "\nPreset `aurora`, library `" + d.library.at("aurora") +
         "`; regenerated by `bash scripts/figures.sh`.\n";
}

// Speed against quality of each data-dependent acceleration on each strategy: the compare runs
// with --techniques (real math), every entry.
std::string compare_techniques(const Data& d) {
  std::string s =
      "| run | entry | virtual s | x flat | bytes MB | steps skipped | PSNR dB | SSIM |\n"
      "|---|---|---|---|---|---|---|---|\n";
  std::string fastest;
  for (const auto& [name, c] : d.compare) {
    if (!with_techniques(c)) continue;
    for (const nlohmann::json& e : c["entries"]) {
      double bytes = 0;
      for (const auto& [tier, b] : e["bytes_by_tier"].items()) bytes += b.get<double>();
      const nlohmann::json& sc = e.value("step_cache", nlohmann::json());
      const nlohmann::json q = e.value("quality", nlohmann::json::object());
      const nlohmann::json psnr = q.value("preview_psnr_db", nlohmann::json());
      s += "| " + name + " | " + e.value("entry", e["strategy"].get<std::string>()) + " |" +
           fmt(" %.4f |", e["virtual_time_s"].get<double>()) +
           fmt(" %.2f |", e["speedup_vs_flat"].get<double>()) + fmt(" %.1f |", bytes / 1e6) +
           (sc.is_object() ? fmt(" %d |", static_cast<int>(sc["skipped_steps"].size())) : " 0 |") +
           (psnr.is_number()   ? fmt(" %.1f |", psnr.get<double>())
            : psnr.is_string() ? " " + psnr.get<std::string>() + " |"
                               : std::string(" |")) +
           (q.contains("preview_ssim") ? fmt(" %.4f |\n", q["preview_ssim"].get<double>())
                                       : std::string(" |\n"));
    }
    if (c.contains("lossy") && c["lossy"]["fastest"].is_string())
      fastest += "\nFastest keeping a preview of " +
                 fmt("%.0f", c["lossy"]["psnr_db"].get<double>()) + " dB (" + name +
                 "): " + c["lossy"]["fastest"].get<std::string>() + ".\n";
  }
  return s + fastest + "\nPreset `aurora`, library `" + d.library.at("aurora") +
         "`; regenerated by `bash scripts/figures.sh`.\n";
}

std::map<std::string, Render> blocks() {
  std::map<std::string, Render> b;
  b["headline"] = headline;
  b["compare-phantom"] = compare_phantom;
  b["compare-real"] = compare_real;
  b["compare-techniques"] = compare_techniques;
  for (const ClusterRun& c : kClusters) {
    const std::string n = c.cluster;
    b[n + "-speedup"] = [n](const Data& d) { return speedup_table(d, n); };
    b[n + "-summary"] = [n](const Data& d) { return speedup_summary(d, n); };
    b[n + "-exposed"] = [n](const Data& d) { return exposed_table(d, n); };
    b[n + "-breakdown"] = [n](const Data& d) { return breakdown_table(d, n); };
    b[n + "-a2a"] = [n](const Data& d) { return a2a_table(d, n); };
    b[n + "-grid"] = [n](const Data& d) { return grid_row(d, n); };
  }
  return b;
}

struct Block {
  std::string name;
  size_t begin = 0, end = 0;  // the text between the marker lines
};

// The marked blocks of a README, in order.
std::vector<Block> find_blocks(const std::string& text, const std::string& file) {
  std::vector<Block> out;
  const std::string open = "<!-- figures:", close = "<!-- /figures:";
  for (size_t at = text.find(open); at != std::string::npos; at = text.find(open, at + 1)) {
    const size_t name_end = text.find(" -->", at);
    if (name_end == std::string::npos) throw std::runtime_error(file + ": unterminated marker");
    Block b;
    b.name = text.substr(at + open.size(), name_end - at - open.size());
    b.begin = text.find('\n', name_end) + 1;
    const size_t end = text.find(close + b.name + " -->", b.begin);
    if (end == std::string::npos)
      throw std::runtime_error(file + ": block '" + b.name + "' has no closing marker");
    b.end = end;
    out.push_back(b);
  }
  return out;
}

// Renders every block of every README from `d`; rewrites them (write) or lists the differences.
int render_readmes(const fs::path& source, const Data& d, bool write) {
  const std::map<std::string, Render> known = blocks();
  int stale = 0, seen = 0;
  for (const std::string& rel : kReadmes) {
    const fs::path file = source / rel;
    std::string text = read_file(file);
    const std::vector<Block> found = find_blocks(text, rel);
    // Back to front, so that earlier offsets stay valid while rewriting.
    for (auto it = found.rbegin(); it != found.rend(); ++it) {
      ++seen;
      const auto r = known.find(it->name);
      if (r == known.end()) {
        std::fprintf(stderr, "%s: unknown figures block '%s'\n", rel.c_str(), it->name.c_str());
        ++stale;
        continue;
      }
      const std::string want = r->second(d);
      const std::string have = text.substr(it->begin, it->end - it->begin);
      if (have == want) continue;
      if (write) {
        text.replace(it->begin, it->end - it->begin, want);
      } else {
        ++stale;
        std::fprintf(
            stderr, "%s: block '%s' does not match bench/figures/data:\n--- README\n%s--- data\n%s",
            rel.c_str(), it->name.c_str(), have.c_str(), want.c_str());
      }
    }
    if (write) write_text(file, text);
  }
  std::printf("%d figures block(s) in %zu README(s)%s\n", seen, kReadmes.size(),
              write ? " rewritten" : (stale == 0 ? ": all match the data" : ": some do not match"));
  return stale;
}

ChildRun run_study(const Args& a, const fs::path& study, const fs::path& out,
                   const std::vector<std::string>& extra) {
  std::vector<std::string> argv = {study.string(),
                                   "--out",
                                   out.string(),
                                   "--cocodiff",
                                   a.cocodiff.string(),
                                   "--workers",
                                   std::to_string(a.workers)};
  argv.insert(argv.end(), extra.begin(), extra.end());
  fs::create_directories(out);
  ChildRun r = run_command(argv, out / "study.log");
  if (r.exit_code != 0)
    throw std::runtime_error("study failed (" + (out / "study.log").string() + "): " + r.error);
  return r;
}

// Two step times agree: the same presets and engine give the same virtual nanoseconds.
bool same(double a, double b) { return std::fabs(a - b) <= 1e-12 + 1e-9 * std::fabs(b); }

// The cheap part of the data again: per cluster, the one-node all-to-all sweep and one
// speedup cell. Returns the number of figures that moved.
int rerun_cheap(const Args& a, const fs::path& study, const Data& d) {
  int moved = 0;
  for (const ClusterRun& c : kClusters) {
    const fs::path out = a.out / ("check_" + c.cluster);
    run_study(a, study, out,
              {"--parts", "a2a,speedup", "--cluster", c.cluster, "--models", "flux1-dev",
               "--resolutions", "1024", "--nodes", "1", "--jobs", "1"});
    const nlohmann::json a2a = read_json(study_file(out, c.cluster, "a2a"));
    const nlohmann::json& want_a2a = d.a2a.at(c.cluster)["rows"];
    if (a2a["rows"].size() != want_a2a.size()) ++moved;
    for (size_t i = 0; i < a2a["rows"].size() && i < want_a2a.size(); ++i)
      for (const char* f : {"flat_us", "tapa_us"})
        if (!same(a2a["rows"][i][f].get<double>(), want_a2a[i][f].get<double>())) {
          ++moved;
          std::fprintf(stderr, "%s all-to-all at %.0f bytes: %s %.3f now, %.3f in the data\n",
                       c.cluster.c_str(), a2a["rows"][i]["bytes"].get<double>(), f,
                       a2a["rows"][i][f].get<double>(), want_a2a[i][f].get<double>());
        }
    const nlohmann::json cell = read_json(study_file(out, c.cluster, "speedup"))["rows"].at(0);
    bool found = false;
    for (const nlohmann::json& r : d.speedup.at(c.cluster)["rows"]) {
      if (r["model"] != cell["model"] || r["resolution"] != cell["resolution"] ||
          r["nodes"] != cell["nodes"])
        continue;
      found = true;
      for (const char* f : {"flat_step_s", "tapa_step_s", "cocodiff_step_s"})
        if (!same(cell[f].get<double>(), r[f].get<double>())) {
          ++moved;
          std::fprintf(stderr, "%s flux1-dev 1024^2, 1 node: %s %.6f s now, %.6f s in the data\n",
                       c.cluster.c_str(), f, cell[f].get<double>(), r[f].get<double>());
        }
    }
    if (!found) ++moved;
  }
  // One compare run again: FLUX.1-dev 1024^2 on one Aurora node, as bench/study/run_study.sh
  // runs it.
  const std::string name = "flux1-dev_1024_1n";
  const auto stored = d.compare.find(name);
  if (stored == d.compare.end()) return moved + 1;
  const fs::path out = a.out / "check_compare";
  fs::remove_all(out);
  const ChildRun r = run_command({a.cocodiff.string(),
                                  "compare",
                                  (a.config_dir / "flux1-tiny-24tiles.toml").string(),
                                  "--strategies",
                                  "flat,tapa,v_first,pipeline,cocodiff",
                                  "--set",
                                  "model.preset=flux1-dev",
                                  "--set",
                                  "run.math=skip",
                                  "--set",
                                  "run.resolution=1024",
                                  "--set",
                                  "cluster.nodes=1",
                                  "--set",
                                  "run.steps=2",
                                  "--set",
                                  "v_major.warmup_steps=1",
                                  "--set",
                                  "ulysses.uneven_heads=true",
                                  "--out",
                                  out.string()},
                                 a.out / "check_compare.log");
  if (r.exit_code != 0)
    throw std::runtime_error("compare failed: see " + (a.out / "check_compare.log").string());
  const nlohmann::json now = read_json(out / "compare.json");
  for (const std::string& st : {std::string("flat"), std::string("tapa"), std::string("v_first"),
                                std::string("pipeline"), std::string("cocodiff")}) {
    const double t = entry(now, st)["virtual_time_s"],
                 want = entry(stored->second, st)["virtual_time_s"];
    if (!same(t, want)) {
      ++moved;
      std::fprintf(stderr, "compare %s, %s: %.6f s now, %.6f s in bench/study/results\n",
                   name.c_str(), st.c_str(), t, want);
    }
  }
  return moved;
}

int main_impl(int argc, char** argv) {
  Args a = parse_args(argc, argv,
                      "--write | --render | --check [--jobs N] [--source DIR] [--study BIN]");
  fs::path source = COCODIFF_SOURCE_DIR, study = COCODIFF_STUDY_BIN;
  bool write = false, check = false, render = false;
  std::string jobs = "0";
  for (size_t i = 0; i < a.rest.size(); ++i) {
    const std::string& k = a.rest[i];
    if (k == "--write") {
      write = true;
    } else if (k == "--check") {
      check = true;
    } else if (k == "--render") {
      render = true;
    } else if ((k == "--jobs" || k == "--source" || k == "--study") && i + 1 < a.rest.size()) {
      const std::string v = a.rest[++i];
      if (k == "--jobs") jobs = v;
      if (k == "--source") source = v;
      if (k == "--study") study = v;
    } else {
      std::fprintf(stderr, "figures: unknown option %s\n", k.c_str());
      return 2;
    }
  }
  if (static_cast<int>(write) + static_cast<int>(check) + static_cast<int>(render) != 1) {
    std::fprintf(stderr, "figures: expected one of --write, --render or --check\n");
    return 2;
  }
  if (render) {  // the blocks again from the data kept, without running anything
    render_readmes(source, load_data(source, a.config_dir), true);
    return 0;
  }
  if (write) {
    for (const ClusterRun& c : kClusters) {
      std::fprintf(stderr, "figures: study on %s (%s)\n", c.title.c_str(), c.cluster.c_str());
      const fs::path out = a.out / c.cluster;
      run_study(a, study, out,
                {"--parts", "speedup,breakdown,a2a", "--cluster", c.cluster, "--jobs", jobs});
      fs::create_directories(data_file(source, c.cluster, "x").parent_path());
      for (const std::string& part : kParts)
        write_text(data_file(source, c.cluster, part),
                   read_json(study_file(out, c.cluster, part)).dump(1) + "\n");
      // The tables and plots the READMEs show beside the blocks: bench/results/study_*.
      for (const char* part : {"speedup", "breakdown", "a2a", "exposed"})
        for (const char* ext : {".json", ".csv", ".png"}) {
          const fs::path from = study_file(out, c.cluster, part).replace_extension(ext);
          std::error_code ec;
          if (fs::exists(from, ec))
            fs::copy_file(from, source / "bench" / "results" / from.filename(),
                          fs::copy_options::overwrite_existing, ec);
        }
    }
    render_readmes(source, load_data(source, a.config_dir), true);
    return 0;
  }
  const Data d = load_data(source, a.config_dir);
  const int stale = render_readmes(source, d, false);
  const int moved = rerun_cheap(a, study, d);
  if (stale + moved > 0) {
    std::fprintf(stderr,
                 "figures: %d README block(s) and %d rerun figure(s) do not match; regenerate "
                 "them with `bash scripts/figures.sh`\n",
                 stale, moved);
    return 1;
  }
  std::printf("figures: the READMEs' blocks match the data, and the rerun cells match it\n");
  return 0;
}

}  // namespace
}  // namespace cocodiff::bench

int main(int argc, char** argv) {
  try {
    return cocodiff::bench::main_impl(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "figures: %s\n", e.what());
    return 2;
  }
}
