// The emulated figures the READMEs quote, regenerated from the shipped presets, and the check
// that they still match what the presets and the engine give.
//
//   figures --write [--parts study,paper-scale] [--jobs N]
//                                study: runs `study` (speedup, breakdown, a2a) on every cluster
//                                of kClusters and keeps its JSON in bench/figures/data/;
//                                paper-scale: runs the paper-scale image's commands (kPaperScale,
//                                a second) into bench/figures/data/paper_scale.json; then
//                                rewrites every marked block of the READMEs from the data
//   figures --render             rewrites the blocks from the data kept (no runs)
//   figures --check              every marked block against the data (no runs), then the cheap
//                                part of the data run again (per cluster: the one-node
//                                all-to-all sweep and the FLUX.1-dev 1024^2 one-node cell; one
//                                compare run of bench/study/run_study.sh; the paper-scale runs)
//   figures --check --blocks-only  the blocks against the data alone (no runs)
// The `cocodiff compare` blocks come from bench/study/results/*/compare.json, which
// bench/study/run_study.sh writes (scripts/figures.sh runs it afresh first). The emulator_scale
// blocks of bench/README.md (kResults) come from bench/results/NAME.json, which
// `emulator_scale --parts ... --out bench/results` writes (memory_estimate.json too), and the
// trained-model blocks from what `v_similarity` and `inpaint_quality` write there; those runs
// take minutes to half an hour, so no check runs them again.
//
// A block in a README is the lines between `<!-- figures:NAME -->` and `<!-- /figures:NAME -->`;
// each names the cluster preset and collective library its numbers come from.
// `bash scripts/figures.sh` builds what it needs and runs `figures --write`.

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <ctime>
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
  nlohmann::json paper_scale;                     // bench/figures/data/paper_scale.json
  std::map<std::string, nlohmann::json> results;  // bench/results/NAME.json, by NAME
};

// The whole image at the paper's scale: FLUX.1-dev 2048^2, 28 steps, 8 Aurora nodes (96 tiles),
// phantom, one worker, trace off; `cocodiff run` once per strategy (a fraction of a second each).
struct PaperScaleRun {
  std::string strategy, label;
  std::vector<std::string> extra;  // --set pairs beyond the common ones
};
const std::vector<PaperScaleRun> kPaperScale = {
    {"usp", "usp", {}}, {"cocodiff", "cocodiff, uneven heads", {"ulysses.uneven_heads=true"}}};
const std::vector<std::string> kPaperScaleSets = {
    "run.math=skip",   "model.preset=flux1-dev", "run.resolution=2048", "run.steps=28",
    "cluster.nodes=8", "emulator.trace=false",   "emulator.workers=1"};

// `cocodiff run configs/quickstart.toml --set ...` for one paper-scale strategy (no --out).
std::vector<std::string> paper_scale_args(const PaperScaleRun& r) {
  std::vector<std::string> argv = {"run", "configs/quickstart.toml"};
  std::vector<std::string> sets = kPaperScaleSets;
  sets.insert(sets.begin() + 5, "run.strategy=" + r.strategy);
  sets.insert(sets.end(), r.extra.begin(), r.extra.end());
  for (const std::string& kv : sets) {
    argv.push_back("--set");
    argv.push_back(kv);
  }
  return argv;
}

// The tables of bench/README.md rendered from bench/results/NAME.json: section B's (an
// emulator_scale part, the flow solver, the fiber runtime, MPI vs emulator, the V-Major sweep),
// the memory estimate (emulator_scale --parts memory) and the trained-model tables (v_similarity,
// inpaint_quality). They take minutes to half an hour to run again, so the check compares the
// blocks with these files.
const std::vector<std::string> kResults = {
    "emulator_phantom", "emulator_replay",    "emulator_collective", "emulator_grid",
    "emulator_large",   "emulator_large_usp", "emulator_video",      "emulator_workers",
    "emulator_math",    "net_models_flows",   "mpi_vs_emulator",     "study_vmajor_quality",
    "runtime",          "v_similarity",       "inpaint_quality",     "inpaint_quality_lower",
    "memory_estimate"};

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
  d.paper_scale = read_json(source / "bench" / "figures" / "data" / "paper_scale.json");
  for (const std::string& name : kResults)
    d.results[name] = read_json(source / "bench" / "results" / (name + ".json"));
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

// 1234567 -> "1,234,567".
std::string grouped(double v) {
  std::string digits = fmt("%.0f", v), out;
  const size_t n = digits.size();
  for (size_t i = 0; i < n; ++i) {
    if (i > 0 && (n - i) % 3 == 0 && digits[i - 1] != '-') out += ',';
    out += digits[i];
  }
  return out;
}

double median_of(const nlohmann::json& values) {
  std::vector<double> v = values.get<std::vector<double>>();
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 == 1 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

// The paper-scale image: the command, the table and what the reports say.
std::string paper_scale(const Data& d) {
  const nlohmann::json& ps = d.paper_scale;
  std::string cmd = "cocodiff";
  for (const std::string& a : paper_scale_args(kPaperScale.at(0))) {
    const bool wrap = a == "--set" && cmd.size() - cmd.rfind('\n') > 64;
    cmd += (wrap ? " \\\n    " : " ") + a;
  }
  std::string s =
      "```sh\n" + cmd +
      "\n```\n\n(`--set run.strategy=cocodiff --set ulysses.uneven_heads=true` "
      "for the second row.)\n" +
      ps["meta"]["measured"].get<std::string>() +
      ", 1 worker, trace off, replay on (the default); run wall s is report.json's\n"
      "`wall_time_s`, CPU s and peak RSS are the `cocodiff` process's (`wait4`).\n\n"
      "| strategy | Ulysses x ring | virtual s | run wall s | process CPU s | events | flows | "
      "peak RSS MiB |\n|---|---|---|---|---|---|---|---|\n";
  const nlohmann::json* usp = nullptr;
  const nlohmann::json* cc = nullptr;
  for (const nlohmann::json& r : ps["rows"]) {
    s += fmt("| %s | %d x %d | %.3f | %.2f | %.2f | %.1f M | %.1f M | %.0f |\n",
             r["label"].get<std::string>().c_str(), r["ulysses_degree"].get<int>(),
             r["ring_degree"].get<int>(), r["virtual_time_s"].get<double>(),
             r["wall_time_s"].get<double>(), r["cpu_s"].get<double>(),
             r["events"].get<double>() / 1e6, r["flows"].get<double>() / 1e6,
             r["peak_rss_mib"].get<double>());
    if (r["strategy"] == "usp") usp = &r;
    if (r["strategy"] == "cocodiff") cc = &r;
  }
  if (usp == nullptr || cc == nullptr)
    throw std::runtime_error("paper_scale.json: usp or cocodiff missing");
  const int heads = ps["meta"]["heads"];
  const int u_usp = (*usp)["ulysses_degree"], r_usp = (*usp)["ring_degree"];
  const int u_cc = (*cc)["ulysses_degree"];
  s +=
      fmt("\nusp's report says Ulysses %d x ring %d: %d of FLUX.1-dev's %d heads per tile in\n"
          "%d-tile Ulysses groups, one per node, with K/V passed around a ring of %d nodes.\n"
          "cocodiff's Ulysses spans %d tiles, so with uneven heads %d of them hold no head in\n"
          "attention. usp is %.2fx faster than cocodiff here (virtual time).\n",
          u_usp, r_usp, heads / u_usp, heads, u_usp, r_usp, u_cc, std::max(0, u_cc - heads),
          (*cc)["virtual_time_s"].get<double>() / (*usp)["virtual_time_s"].get<double>());
  return s;
}

// The command an emulator_scale table came from, and where its data is.
std::string results_source(const std::string& name) {
  return "Rendered from `bench/results/" + name + ".json` by `figures --render`.\n";
}

std::string emulator_phantom(const Data& d) {
  const nlohmann::json& p = d.results.at("emulator_phantom");
  std::string s =
      "| nodes | tiles | virtual ms | events | flows | run wall s | Mevents/s | us/flow | peak RSS "
      "MiB |\n|---|---|---|---|---|---|---|---|---|\n";
  for (const nlohmann::json& r : p["rows"])
    s += fmt("| %d | %d | %.3f | %s | %s | %.2f | %.3f | %.2f | %.0f |\n", r["nodes"].get<int>(),
             r["tiles"].get<int>(), 1e3 * r["virtual_time_s"].get<double>(),
             grouped(r["events"]).c_str(), grouped(r["flows"]).c_str(),
             r["run_wall_s"].get<double>(), r["events_per_s"].get<double>() / 1e6,
             r["wall_us_per_flow"].get<double>(), r["peak_rss_mib"].get<double>());
  return s + "\n" + results_source("emulator_phantom");
}

std::string emulator_replay(const Data& d) {
  const nlohmann::json& p = d.results.at("emulator_replay");
  std::string s =
      "| strategy | virtual s | CPU s, replay off | CPU s, replay on | speedup | wall s off / on | "
      "the issue's CPU s (before replay) | regions replayed | peak RSS MiB "
      "|\n|---|---|---|---|---|---|---|---|---|\n";
  for (const nlohmann::json& r : p["rows"]) {
    const double off = r["median_cpu_s_replay_off"], on = r["median_cpu_s_replay_on"];
    s += fmt("| %s | %.3f | %.2f | %.2f | %.1f | %.2f / %.2f | %s | %s | %.0f |\n",
             r["strategy"].get<std::string>().c_str(), r["virtual_time_s"].get<double>(), off, on,
             off / on, median_of(r["wall_s_replay_off"]), median_of(r["wall_s_replay_on"]),
             r["issue_cpu_s_before_replay"].get<std::string>().c_str(),
             grouped(r["regions_replayed"]).c_str(), r["peak_rss_mib_replay_on"].get<double>());
  }
  return s + "\n" + results_source("emulator_replay");
}

std::string emulator_collective(const Data& d) {
  const nlohmann::json& p = d.results.at("emulator_collective");
  std::string s =
      "| strategy | flows | CPU s per message | CPU s collective level | speedup "
      "|\n|---|---|---|---|---|\n";
  for (const nlohmann::json& r : p["rows"]) {
    const double msg = r["median_cpu_s_per_message"], coll = r["median_cpu_s_collective_level"];
    s += fmt("| %s | %s | %.2f | %.2f | %.2f |\n", r["strategy"].get<std::string>().c_str(),
             grouped(r["flows"]).c_str(), msg, coll, msg / coll);
  }
  return s + "\n" + results_source("emulator_collective");
}

std::string emulator_grid(const Data& d) {
  const nlohmann::json& p = d.results.at("emulator_grid");
  std::string s = "| model | runs | CPU s | wall s | largest run, CPU s |\n|---|---|---|---|---|\n";
  std::string total;
  std::vector<std::string> rows;
  for (const nlohmann::json& r : p["rows"]) {
    // "flux1-dev 4096px 8 node(s) cocodiff" -> "4096^2, 8 nodes, cocodiff"
    std::istringstream at(r["largest_at"].get<std::string>());
    std::string model, res, nodes, word, strategy;
    at >> model >> res >> nodes >> word >> strategy;
    if (res.size() > 2 && res.substr(res.size() - 2) == "px") res.resize(res.size() - 2);
    const std::string where =
        res + "^2, " + nodes + (nodes == "1" ? " node, " : " nodes, ") + strategy;
    if (r["model"] == "all") {
      total =
          fmt("**%d runs in %.1f CPU s, %.1f s of wall time**; the largest, %s %s, took %.2f "
              "CPU s.",
              r["runs"].get<int>(), r["cpu_s"].get<double>(), r["wall_s"].get<double>(),
              model_name(model).c_str(), where.c_str(), r["largest_cpu_s"].get<double>());
      continue;
    }
    rows.push_back(fmt("| %s | %d | %.1f | %.1f | %.2f (%s) |\n", model_name(r["model"]).c_str(),
                       r["runs"].get<int>(), r["cpu_s"].get<double>(), r["wall_s"].get<double>(),
                       r["largest_cpu_s"].get<double>(), where.c_str()));
  }
  std::sort(rows.begin(), rows.end());
  for (const std::string& r : rows) s += r;
  return total + "\n\n" + s + "\n" + results_source("emulator_grid");
}

std::string emulator_large(const Data& d) {
  std::string s =
      "| strategy | steps | virtual s | CPU s | CPU s, range | wall s | peak RSS MiB | regions "
      "replayed | goal (<= 60 s, <= 1 GiB) |\n|---|---|---|---|---|---|---|---|---|\n";
  for (const char* name : {"emulator_large", "emulator_large_usp"})
    for (const nlohmann::json& r : d.results.at(name)["rows"]) {
      const std::vector<double> cpu = r["cpu_s"].get<std::vector<double>>();
      const std::string range =
          cpu.size() < 2 ? std::string("(1 run)")
                         : fmt("%.1f-%.1f (%zu runs)", *std::min_element(cpu.begin(), cpu.end()),
                               *std::max_element(cpu.begin(), cpu.end()), cpu.size());
      s += fmt("| %s | %d | %.3f | %.1f | %s | %.1f | %.0f | %s | %s |\n",
               r["strategy"].get<std::string>().c_str(), r["steps"].get<int>(),
               r["virtual_time_s"].get<double>(), r["median_cpu_s"].get<double>(), range.c_str(),
               r["median_wall_s"].get<double>(), r["peak_rss_mib"].get<double>(),
               grouped(r["regions_replayed"]).c_str(),
               r["goal_met"].get<bool>() ? "met" : "not met");
    }
  return s +
         "\nRendered from `bench/results/emulator_large.json` and "
         "`bench/results/emulator_large_usp.json` by `figures --render`.\n";
}

std::string emulator_video(const Data& d) {
  std::string s =
      "| strategy | tiles | steps | virtual s | wall s | wall s, range | CPU s | peak RSS MiB | "
      "regions replayed | goal (<= 120 s wall, <= 2 GiB) "
      "|\n|---|---|---|---|---|---|---|---|---|---|\n";
  for (const nlohmann::json& r : d.results.at("emulator_video")["rows"]) {
    const std::vector<double> wall = r["wall_s"].get<std::vector<double>>();
    const std::string range =
        wall.size() < 2 ? std::string("(1 run)")
                        : fmt("%.1f-%.1f (%zu runs)", *std::min_element(wall.begin(), wall.end()),
                              *std::max_element(wall.begin(), wall.end()), wall.size());
    s += fmt("| %s | %s | %d | %.3f | %.1f | %s | %.1f | %.0f | %s | %s |\n",
             r["strategy"].get<std::string>().c_str(), grouped(r["tiles"]).c_str(),
             r["steps"].get<int>(), r["virtual_time_s"].get<double>(),
             r["median_wall_s"].get<double>(), range.c_str(), r["median_cpu_s"].get<double>(),
             r["peak_rss_mib"].get<double>(), grouped(r["regions_replayed"]).c_str(),
             r["goal_met"].get<bool>() ? "met" : "not met");
  }
  return s + "\nRendered from `bench/results/emulator_video.json` by `figures --render`.\n";
}

std::string emulator_workers(const Data& d) {
  std::string s =
      "| run | default workers | wall s: 1 / default / 2 workers | CPU s: 1 / default / 2 | "
      "default / 1 (wall) |\n|---|---|---|---|---|\n";
  for (const nlohmann::json& r : d.results.at("emulator_workers")["rows"]) {
    const nlohmann::json &w = r["median_wall_s"], &c = r["median_cpu_s"];
    s += fmt("| %s | %d | %.2f / %.2f / %.2f | %.2f / %.2f / %.2f | %.2f |\n",
             r["run"].get<std::string>().c_str(), r["default_workers"].get<int>(),
             w["1"].get<double>(), w["default"].get<double>(), w["2"].get<double>(),
             c["1"].get<double>(), c["default"].get<double>(), c["2"].get<double>(),
             w["default"].get<double>() / w["1"].get<double>());
  }
  return s + "\n" + results_source("emulator_workers");
}

std::string emulator_math(const Data& d) {
  std::string s =
      "| size | hidden | tokens | block GFLOP | block GFLOP/s | Eigen GEMM GFLOP/s | ratio "
      "|\n|---|---|---|---|---|---|---|\n";
  for (const nlohmann::json& r : d.results.at("emulator_math")["rows"])
    s += fmt("| %s | %d | %d | %.2f | %.1f | %.1f | %.2f |\n", r["size"].get<std::string>().c_str(),
             r["hidden"].get<int>(), r["tokens"].get<int>(), r["block_gflop"].get<double>(),
             r["block_gflops"].get<double>(), r["gemm_gflops"].get<double>(),
             r["block_gflops"].get<double>() / r["gemm_gflops"].get<double>());
  return s + "\n" + results_source("emulator_math");
}

std::string net_models_flows(const Data& d) {
  std::string s =
      "| what | network | ranks | flows | wall s | flows/s |\n|---|---|---|---|---|---|\n";
  for (const nlohmann::json& r : d.results.at("net_models_flows"))
    s += fmt("| %s | %s | %d | %s | %.3f | %s |\n", r["what"].get<std::string>().c_str(),
             r["network"].get<std::string>().c_str(), r["ranks"].get<int>(),
             grouped(r["flows"]).c_str(), r["wall_seconds"].get<double>(),
             grouped(r["flows_per_wall_second"]).c_str());
  return s + "\n" + results_source("net_models_flows");
}

std::string mpi_vs_emulator(const Data& d) {
  std::string s =
      "| ranks | emulator run s | emulator CPU s | mpirun process s | mpi run s | mpi sampling s | "
      "mpi / emulator | virtual ms |\n|---|---|---|---|---|---|---|---|\n";
  for (const nlohmann::json& r : d.results.at("mpi_vs_emulator")["rows"])
    s += fmt("| %d | %.3f | %.2f | %.3f | %.3f | %.3f | %.2f | %.3f |\n", r["ranks"].get<int>(),
             r["emulator_run_wall_s"].get<double>(), r["emulator_cpu_s"].get<double>(),
             r["mpirun_process_wall_s"].get<double>(), r["mpi_run_wall_s"].get<double>(),
             r["mpi_sampling_wall_s"].get<double>(), r["mpi_over_emulator"].get<double>(),
             1e3 * r["virtual_time_s"].get<double>());
  return s + "\n" + results_source("mpi_vs_emulator");
}

// 1.19e-03 -> "1.19e-3"; 0 -> "0".
std::string short_exp(double v) {
  if (v == 0) return "0";
  std::string t = fmt("%.2e", v);
  const size_t e = t.find('e');
  size_t d = e + 2;  // after the sign
  while (d + 1 < t.size() && t[d] == '0') t.erase(d, 1);
  return t;
}

// The V-Major threshold sweep; thresholds that give the same row share it ("0 - 0.2").
std::string vmajor_quality(const Data& d) {
  std::string s =
      "| threshold | rel L2 | PSNR dB | SSIM | V bytes saved % | virtual ms | x exact "
      "|\n|---|---|---|---|---|---|---|\n";
  const nlohmann::json& rows = d.results.at("study_vmajor_quality")["rows"];
  const auto figures_of = [](const nlohmann::json& r) {
    return short_exp(r["relative_l2"].get<double>()) + " | " +
           (r["psnr_db"].is_number() ? fmt("%.2f", r["psnr_db"].get<double>())
                                     : std::string("inf")) +
           " | " + fmt("%.5f", r["ssim"].get<double>()) + " | " +
           fmt("%.1f", 100 * r["v_bytes_saved_fraction"].get<double>()) + " | " +
           fmt("%.3f", 1e3 * r["virtual_s"].get<double>()) + " | " +
           fmt("%.3f", r["speedup_vs_exact"].get<double>());
  };
  for (size_t i = 0; i < rows.size();) {
    size_t j = i + 1;
    while (j < rows.size() && figures_of(rows[j]) == figures_of(rows[i])) ++j;
    std::string th = fmt("%g", rows[i]["threshold"].get<double>());
    if (j > i + 1) th += fmt(" - %g", rows[j - 1]["threshold"].get<double>());
    s += "| " + th + " | " + figures_of(rows[i]) + " |\n";
    i = j;
  }
  return s + "\n" + results_source("study_vmajor_quality");
}

// bench_runtime's Google Benchmark JSON: the medians, one row per benchmark and worker count.
std::string runtime_table(const Data& d) {
  std::string s =
      "| benchmark | ranks | workers | wall per iteration | figure |\n|---|---|---|---|---|\n";
  for (const nlohmann::json& b : d.results.at("runtime")["benchmarks"]) {
    if (b.value("aggregate_name", "") != "median") continue;
    // "AllToAll/ranks:12/workers:1/real_time_median", "Handoff/2/real_time_median"
    std::vector<std::string> parts;
    std::stringstream ss(b["name"].get<std::string>());
    for (std::string x; std::getline(ss, x, '/');) parts.push_back(x);
    std::string ranks = "2", workers;
    for (size_t i = 1; i < parts.size(); ++i) {
      const std::string& p = parts[i];
      if (p.rfind("ranks:", 0) == 0) ranks = p.substr(6);
      if (p.rfind("workers:", 0) == 0) workers = p.substr(8);
      if (i == 1 && !p.empty() && std::isdigit(static_cast<unsigned char>(p[0]))) workers = p;
    }
    const double ms = b["real_time"].get<double>() * (b["time_unit"] == "us"   ? 1e-3
                                                      : b["time_unit"] == "ns" ? 1e-6
                                                                               : 1);
    std::string figure;
    if (b.contains("wall_us_per_handoff"))
      figure = fmt("%.2f us per hand-off", b["wall_us_per_handoff"].get<double>());
    else if (b.contains("wall_us_per_flow"))
      figure = fmt("%.2f us per flow", b["wall_us_per_flow"].get<double>());
    else if (b.contains("bytes_per_second"))
      figure = fmt("%.1f GiB/s of payload, %.0fk flows/s",
                   b["bytes_per_second"].get<double>() / (1 << 30),
                   b["flows_per_s"].get<double>() / 1e3);
    s += fmt("| %s | %s | %s | %.3g ms | %s |\n", parts.at(0).c_str(), ranks.c_str(),
             workers.c_str(), ms, figure.c_str());
  }
  return s +
         "\nMedians of the repetitions; rendered from `bench/results/runtime.json` by "
         "`figures --render`.\n";
}

// V's change between adjacent steps per layer, trained against seeded random weights, and the
// ranges the text quotes.
std::string v_similarity(const Data& d) {
  const nlohmann::json& v = d.results.at("v_similarity");
  std::map<int, const nlohmann::json*> trained, seeded;
  for (const nlohmann::json& r : v["rows"])
    (r["weights"] == "trained" ? trained : seeded)[r["layer"].get<int>()] = &r;
  std::string s =
      "| layer | block | trained: mean (min-max over steps) | seeded random: mean (min-max) "
      "|\n|---|---|---|---|\n";
  const auto cell = [](const nlohmann::json& r) {
    return fmt("%.3f (%.3f-%.3f)", r["mean_relative_change"].get<double>(),
               r["min_step_change"].get<double>(), r["max_step_change"].get<double>());
  };
  double t_lo = 1e300, t_hi = 0, r_lo = 1e300, r_hi = 0, x_lo = 1e300, x_hi = 0;
  std::vector<int> max_steps;
  for (const auto& [layer, t] : trained) {
    const auto it = seeded.find(layer);
    if (it == seeded.end())
      throw std::runtime_error("v_similarity.json: no random-weights row of a layer");
    const nlohmann::json& r = *it->second;
    s += fmt("| %d | %s | %s | %s |\n", layer, (*t)["block"].get<std::string>().c_str(),
             cell(*t).c_str(), cell(r).c_str());
    const double tm = (*t)["mean_relative_change"], rm = r["mean_relative_change"];
    t_lo = std::min(t_lo, tm), t_hi = std::max(t_hi, tm);
    r_lo = std::min(r_lo, rm), r_hi = std::max(r_hi, rm);
    x_lo = std::min(x_lo, rm / tm), x_hi = std::max(x_hi, rm / tm);
    const int ms = (*t)["max_step"];
    if (std::find(max_steps.begin(), max_steps.end(), ms) == max_steps.end())
      max_steps.push_back(ms);
  }
  std::string at;
  for (size_t i = 0; i < max_steps.size(); ++i)
    at += (i ? ", " : "") + std::to_string(max_steps[i]);
  const nlohmann::json& m = v["meta"];
  return s +
         fmt("\nThe trained model's V moves %.0f-%.0f%% per step (means per layer), %.1f-%.1fx "
             "less than with random weights (%.0f-%.0f%%); its largest change is at step %s "
             "(%d steps, %d seeds).\n",
             100 * t_lo, 100 * t_hi, x_lo, x_hi, 100 * r_lo, 100 * r_hi, at.c_str(),
             m["steps"].get<int>(), m["seeds"].get<int>()) +
         "\n" + results_source("v_similarity");
}

// A median, min and max of inpaint_quality.json: null stands for an infinite PSNR.
std::string db(const nlohmann::json& x, const char* f = "%.1f") {
  return x.is_number() ? fmt(f, x.get<double>()) : std::string("inf");
}
double med(const nlohmann::json& row, const char* key) { return row[key]["median"]; }
// "74.1 [60.7, inf]", or "inf" when every image's picture equals the exact one.
std::string db_range(const nlohmann::json& s) {
  if (s["median"].is_null() && s["min"].is_null()) return "inf";
  return db(s["median"]) + " [" + db(s["min"]) + ", " + db(s["max"]) + "]";
}
// 0.00255 -> "0.0026", 132.19 -> "132.2": two decimals below 1, one above.
std::string small(double x) {
  if (x == 0) return "0";
  return x < 0.01 ? fmt("%.4f", x) : x < 1 ? fmt("%.2f", x) : fmt("%.1f", x);
}

// The phantom projection of inpaint_quality.json's meta: "flux1-dev 2048^2".
std::string projected_model(const nlohmann::json& meta) {
  char model[64] = {0};
  int res = 0;
  if (std::sscanf(meta["projection"].get<std::string>().c_str(), "phantom %63s %d^2", model,
                  &res) != 2)
    throw std::runtime_error("inpaint_quality.json: meta.projection without a model and size");
  return model_name(model) + " " + std::to_string(res) + "^2";
}

std::string projected_cells(const nlohmann::json& row, const char* sep) {
  std::string s;
  for (const nlohmann::json& p : row["projected"])
    s += (s.empty() ? "" : sep) + fmt("%.3f", p["speedup_vs_flat"].get<double>());
  return s;
}

const nlohmann::json& inpaint_row(const nlohmann::json& j, const nlohmann::json& threshold) {
  for (const nlohmann::json& r : j["rows"])
    if (r["threshold"] == threshold ||
        (r["threshold"].is_number() && threshold.is_number() &&
         std::fabs(r["threshold"].get<double>() - threshold.get<double>()) < 1e-12))
      return r;
  throw std::runtime_error("inpaint_quality.json: no row at threshold " + threshold.dump());
}

std::string inpaint_default(const Data& d) {
  const nlohmann::json& j = d.results.at("inpaint_quality");
  const nlohmann::json& m = j["meta"];
  std::string nodes;
  for (const nlohmann::json& p : j["rows"].at(0)["projected"])
    nodes += (nodes.empty() ? "" : " / ") + std::to_string(p["nodes"].get<int>());
  std::string s =
      fmt("| setting | PSNR / SSIM / MSE vs truth (image) | PSNR / SSIM / MSE vs truth (region) | "
          "PSNR / SSIM vs exact | V sent %% | x flat, %d tiles %d^2 | x flat, %s, %s nodes "
          "|\n|---|---|---|---|---|---|---|\n",
          m["ranks"].get<int>(), 28, projected_model(m).c_str(), nodes.c_str());
  for (const nlohmann::json* r :
       {&inpaint_row(j, nullptr), &inpaint_row(j, m["v_major_default_threshold"])}) {
    const bool flat = (*r)["threshold"].is_null();
    s += fmt("| %s | %s dB / %.4f / %.0f | %s dB / %.4f / %.0f | %s | %.1f | %.3f | %s |\n",
             (*r)["setting"].get<std::string>().c_str(),
             db((*r)["psnr_gt_db"]["median"], "%.2f").c_str(), med(*r, "ssim_gt"),
             med(*r, "mse_gt"), db((*r)["psnr_gt_region_db"]["median"], "%.2f").c_str(),
             med(*r, "ssim_gt_region"), med(*r, "mse_gt_region"),
             flat ? "exact"
                  : (db((*r)["psnr_exact_db"]["median"]) + fmt(" dB / %.5f", med(*r, "ssim_exact")))
                        .c_str(),
             100 * med(*r, "v_bytes_sent_fraction"), med(*r, "speedup_vs_flat"),
             projected_cells(*r, " / ").c_str());
  }
  return s + "\n" + results_source("inpaint_quality");
}

std::string inpaint_sweep(const Data& d) {
  const nlohmann::json& j = d.results.at("inpaint_quality");
  std::string s =
      "| threshold | V sent % | active % | PSNR region vs truth | PSNR vs exact [min, max] | SSIM "
      "vs exact | MSE vs exact |";
  std::string sep = "|---|---|---|---|---|---|---|";
  for (const nlohmann::json& p : j["rows"].at(0)["projected"]) {
    s += fmt(" projected x flat, %d nodes |", p["nodes"].get<int>());
    sep += "---|";
  }
  s += "\n" + sep + "\n";
  const nlohmann::json* flat = nullptr;
  double cc_lo = 1e300, cc_hi = 0;
  for (const nlohmann::json& r : j["rows"]) {
    const bool is_flat = r["threshold"].is_null();
    if (is_flat) flat = &r;
    s += fmt("| %s | %.1f | %.1f | %s | %s | %.5f | %s | %s |\n",
             is_flat ? "flat" : fmt("%g", r["threshold"].get<double>()).c_str(),
             100 * med(r, "v_bytes_sent_fraction"), 100 * med(r, "selective_active_block_fraction"),
             db(r["psnr_gt_region_db"]["median"], "%.2f").c_str(),
             db_range(r["psnr_exact_db"]).c_str(), med(r, "ssim_exact"),
             small(med(r, "mse_exact")).c_str(), projected_cells(r, " | ").c_str());
    if (!is_flat) {
      cc_lo = std::min(cc_lo, med(r, "virtual_s"));
      cc_hi = std::max(cc_hi, med(r, "virtual_s"));
    }
  }
  if (flat == nullptr) throw std::runtime_error("inpaint_quality.json: no flat row");
  const nlohmann::json& rows = j["rows"];
  const nlohmann::json &first = rows.at(1), &last = rows.at(rows.size() - 1);
  const int steps = j["meta"]["steps"];
  s +=
      fmt("\nVirtual time of a %d-step run (medians): flat %.3f ms (%.2f ms/step), cocodiff "
          "%.3f-%.3f ms (%.2f ms/step).",
          steps, 1e3 * med(*flat, "virtual_s"), 1e3 * med(*flat, "virtual_s") / steps, 1e3 * cc_lo,
          1e3 * cc_hi, 1e3 * cc_hi / steps);
  std::string per_nodes;
  for (size_t i = 0; i < (*flat)["projected"].size(); ++i) {
    const int n = (*flat)["projected"][i]["nodes"];
    per_nodes +=
        fmt(" %s%d nodes: flat %.3f s, cocodiff %.3f s at threshold %g to %.3f s at threshold %g.",
            i == 0 ? "Projected " : "", n, (*flat)["projected"][i]["virtual_s"].get<double>(),
            first["projected"][i]["virtual_s"].get<double>(), first["threshold"].get<double>(),
            last["projected"][i]["virtual_s"].get<double>(), last["threshold"].get<double>());
  }
  return s + per_nodes + "\n\n" + results_source("inpaint_quality");
}

std::string inpaint_lower(const Data& d) {
  const nlohmann::json& j = d.results.at("inpaint_quality_lower");
  std::string s = fmt(
      "| setting | V sent %% | PSNR / SSIM region vs truth | PSNR vs exact [min, max] | SSIM vs "
      "exact | x flat, %d tiles |\n|---|---|---|---|---|---|\n",
      j["meta"]["ranks"].get<int>());
  double p_lo = 1e300, p_hi = -1e300;
  for (const nlohmann::json& r : j["rows"]) {
    const bool flat = r["threshold"].is_null();
    s += fmt("| %s | %.1f | %s dB / %.4f | %s | %.5f | %.3f |\n",
             r["setting"].get<std::string>().c_str(), 100 * med(r, "v_bytes_sent_fraction"),
             db(r["psnr_gt_region_db"]["median"], "%.2f").c_str(), med(r, "ssim_gt_region"),
             flat ? "exact" : db_range(r["psnr_exact_db"]).c_str(), med(r, "ssim_exact"),
             med(r, "speedup_vs_flat"));
    p_lo = std::min(p_lo, med(r, "psnr_gt_region_db"));
    p_hi = std::max(p_hi, med(r, "psnr_gt_region_db"));
  }
  const nlohmann::json &flat = inpaint_row(j, nullptr), &last = j["rows"].back();
  s +=
      fmt("\nThe region against the truth: PSNR %.2f-%.2f dB over the settings, SSIM %.2f "
          "(flat) to %.2f (threshold %g).",
          p_lo, p_hi, med(flat, "ssim_gt_region"), med(last, "ssim_gt_region"),
          last["threshold"].get<double>());
  // The same threshold with the centre square masked, where both sweeps have it.
  const nlohmann::json& centre = d.results.at("inpaint_quality");
  for (const nlohmann::json& r : j["rows"]) {
    if (!r["threshold"].is_number() || r["threshold"].get<double>() != 0.2) continue;
    const nlohmann::json& c = inpaint_row(centre, r["threshold"]);
    s +=
        fmt(" At threshold 0.2: %s dB vs exact (lower half) against %s dB (centre square), "
            "%.1f%% of V sent against %.1f%%.",
            db(r["psnr_exact_db"]["median"]).c_str(), db(c["psnr_exact_db"]["median"]).c_str(),
            100 * med(r, "v_bytes_sent_fraction"), 100 * med(c, "v_bytes_sent_fraction"));
  }
  return s + "\n\n" + results_source("inpaint_quality_lower");
}

// "21.8 MiB", "1.37 GiB": binary units, three significant digits, as `cocodiff run` prints.
std::string mib(double bytes) {
  static const char* const kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double v = bytes;
  int u = 0;
  for (; v >= 1024.0 && u < 5; ++u) v /= 1024.0;
  if (u == 0) return fmt("%.0f B", bytes);
  return fmt(v < 10 ? "%.2f %s" : v < 100 ? "%.1f %s" : "%.0f %s", v, kUnits[u]);
}

double estimate_over_peak(const nlohmann::json& row) {
  return row["memory_estimate_bytes"].get<double>() / row["peak_rss_bytes"].get<double>();
}

// Whether the estimate bounded every run of memory_estimate.json, and its ratio range.
std::string memory_verdict(const nlohmann::json& j) {
  int below = 0;
  double lo = 1e300, hi = 0;
  for (const nlohmann::json& r : j["rows"]) {
    const double x = estimate_over_peak(r);
    below += x < 1;
    lo = std::min(lo, x), hi = std::max(hi, x);
  }
  const size_t n = j["rows"].size();
  return (below == 0 ? fmt("The estimate is an upper bound on every one of the %zu runs of the "
                           "two tables",
                           n)
                     : fmt("The estimate is below the measured peak on %d of the %zu runs of "
                           "the two tables",
                           below, n)) +
         fmt(": estimate / peak %.2f-%.2f.\n", lo, hi);
}

std::string memory_estimate(const Data& d) {
  const nlohmann::json& j = d.results.at("memory_estimate");
  std::string s =
      "| run | tiles | workers | trace | events | peak RSS | estimate | estimate / peak "
      "|\n|---|---|---|---|---|---|---|---|\n";
  for (const nlohmann::json& r : j["rows"]) {
    if (r["group"] != "configs") continue;
    s += fmt("| %s | %d | %d | %s | %s | %s | %s | %.2f |\n", r["run"].get<std::string>().c_str(),
             r["tiles"].get<int>(), r["workers"].get<int>(), r["trace"].get<bool>() ? "on" : "off",
             grouped(r["events"]).c_str(), mib(r["peak_rss_bytes"]).c_str(),
             mib(r["memory_estimate_bytes"]).c_str(), estimate_over_peak(r));
  }
  return s + "\n" + memory_verdict(j) + "\n" + results_source("memory_estimate");
}

std::string memory_estimate_tiles(const Data& d) {
  const nlohmann::json& j = d.results.at("memory_estimate");
  std::string s =
      "| run | tiles | peak RSS | estimate | estimate / peak |\n|---|---|---|---|---|\n";
  std::string growth;
  const nlohmann::json* prev = nullptr;
  for (const nlohmann::json& r : j["rows"]) {
    if (r["group"] != "tiles") continue;
    s += fmt("| %s | %s | %s | %s | %.2f |\n", r["run"].get<std::string>().c_str(),
             grouped(r["tiles"]).c_str(), mib(r["peak_rss_bytes"]).c_str(),
             mib(r["memory_estimate_bytes"]).c_str(), estimate_over_peak(r));
    // The peak's growth per added pair of tiles, between rows of one cluster and strategy.
    if (prev != nullptr && (*prev)["run"] == r["run"]) {
      const double t0 = (*prev)["tiles"], t1 = r["tiles"];
      growth += fmt("%s%.0f bytes (%s to %s tiles)", growth.empty() ? "" : ", ",
                    (r["peak_rss_bytes"].get<double>() - (*prev)["peak_rss_bytes"].get<double>()) /
                        (t1 * t1 - t0 * t0),
                    grouped(t0).c_str(), grouped(t1).c_str());
    }
    prev = &r;
  }
  if (!growth.empty()) s += "\nThe peak grows by " + growth + " for each added pair of tiles.\n";
  return s + "\n" + results_source("memory_estimate");
}

std::map<std::string, Render> blocks() {
  std::map<std::string, Render> b;
  b["headline"] = headline;
  b["compare-phantom"] = compare_phantom;
  b["compare-real"] = compare_real;
  b["compare-techniques"] = compare_techniques;
  b["paper-scale"] = paper_scale;
  b["emulator-phantom"] = emulator_phantom;
  b["emulator-replay"] = emulator_replay;
  b["emulator-collective"] = emulator_collective;
  b["emulator-grid"] = emulator_grid;
  b["emulator-large"] = emulator_large;
  b["emulator-video"] = emulator_video;
  b["emulator-workers"] = emulator_workers;
  b["emulator-math"] = emulator_math;
  b["net-models-flows"] = net_models_flows;
  b["mpi-vs-emulator"] = mpi_vs_emulator;
  b["vmajor-quality"] = vmajor_quality;
  b["runtime"] = runtime_table;
  b["v-similarity"] = v_similarity;
  b["inpaint-default"] = inpaint_default;
  b["inpaint-sweep"] = inpaint_sweep;
  b["inpaint-lower"] = inpaint_lower;
  b["memory-estimate"] = memory_estimate;
  b["memory-estimate-tiles"] = memory_estimate_tiles;
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

// "a,b" -> {"a", "b"}.
std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string x; std::getline(ss, x, ',');) out.push_back(x);
  return out;
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

// The paper-scale commands, run again: one row per strategy, as paper_scale.json keeps them.
nlohmann::json run_paper_scale(const Args& a, const fs::path& out) {
  nlohmann::json rows = nlohmann::json::array();
  for (const PaperScaleRun& p : kPaperScale) {
    std::vector<std::string> argv = paper_scale_args(p);
    argv[1] = (a.config_dir / fs::path(argv[1]).filename()).string();
    argv.insert(argv.begin(), a.cocodiff.string());
    const fs::path dir = out / ("paper_scale_" + p.strategy);
    fs::remove_all(dir);
    argv.insert(argv.end(), {"--out", dir.string(), "-q"});
    const ChildRun r = run_report(argv, dir);
    if (!r.ok())
      throw std::runtime_error("paper-scale run (" + p.strategy + ") failed: " + r.error);
    const nlohmann::json& rep = r.report;
    rows.push_back({{"strategy", p.strategy},
                    {"label", p.label},
                    {"ulysses_degree", rep["ulysses_degree"]},
                    {"ring_degree", rep["ring_degree"]},
                    {"virtual_time_s", rep["virtual_time_s"]},
                    {"wall_time_s", rep["wall_time_s"]},
                    {"cpu_s", r.cpu_s},
                    {"peak_rss_mib", static_cast<double>(r.maxrss_kib) / 1024},
                    {"events", rep["events"]},
                    {"flows", rep["flows"]},
                    {"regions_replayed", rep["regions_replayed"]},
                    {"timeline_sha256", rep["timeline_sha256"]}});
  }
  return rows;
}

// Writes bench/figures/data/paper_scale.json from a fresh run of the paper-scale commands.
void write_paper_scale(const Args& a, const fs::path& source) {
  std::fprintf(stderr, "figures: the paper-scale image (%zu runs)\n", kPaperScale.size());
  const std::time_t now = std::time(nullptr);
  char day[16];
  std::strftime(day, sizeof day, "%Y-%m-%d", std::gmtime(&now));
  const ChildRun version =
      run_command({a.cocodiff.string(), "--version"}, a.out / "paper_scale_version.txt");
  std::string program = read_file(a.out / "paper_scale_version.txt");
  program = program.substr(0, program.find('\n'));  // "cocodiff X.Y.Z", without local paths
  const Config model = Config::load(a.config_dir / "models" / "flux1-dev.toml");
  nlohmann::json ps;
  ps["meta"] = {{"measured", std::string("Measured on ") + day},
                {"program", version.exit_code == 0 ? program : std::string("unknown")},
                {"heads", model.get_int("heads", 0)}};
  ps["rows"] = run_paper_scale(a, a.out);
  write_text(source / "bench" / "figures" / "data" / "paper_scale.json", ps.dump(1) + "\n");
}

// The paper-scale commands again against paper_scale.json: the figures the engine decides
// (virtual time, events, flows, layout, timeline hash); wall, CPU and memory are the host's.
int recheck_paper_scale(const Args& a, const Data& d) {
  int moved = 0;
  const nlohmann::json now = run_paper_scale(a, a.out);
  const nlohmann::json& kept = d.paper_scale["rows"];
  for (const nlohmann::json& r : now) {
    const nlohmann::json* want = nullptr;
    for (const nlohmann::json& k : kept)
      if (k["strategy"] == r["strategy"]) want = &k;
    if (want == nullptr) {
      ++moved;
      continue;
    }
    const std::string st = r["strategy"];
    if (!same(r["virtual_time_s"].get<double>(), (*want)["virtual_time_s"].get<double>())) {
      ++moved;
      std::fprintf(stderr, "paper-scale %s: virtual time %.9f s now, %.9f s in the data\n",
                   st.c_str(), r["virtual_time_s"].get<double>(),
                   (*want)["virtual_time_s"].get<double>());
    }
    for (const char* f : {"events", "flows", "ulysses_degree", "ring_degree", "regions_replayed",
                          "timeline_sha256"})
      if (r[f] != (*want)[f]) {
        ++moved;
        std::fprintf(stderr, "paper-scale %s: %s %s now, %s in the data\n", st.c_str(), f,
                     r[f].dump().c_str(), (*want)[f].dump().c_str());
      }
  }
  return moved;
}

int main_impl(int argc, char** argv) {
  Args a = parse_args(argc, argv,
                      "--write [--parts study,paper-scale] | --render | --check [--blocks-only] "
                      "[--jobs N] [--source DIR] [--study BIN]");
  fs::path source = COCODIFF_SOURCE_DIR, study = COCODIFF_STUDY_BIN;
  bool write = false, check = false, render = false, blocks_only = false;
  std::string jobs = "0", parts = "study,paper-scale";
  for (size_t i = 0; i < a.rest.size(); ++i) {
    const std::string& k = a.rest[i];
    if (k == "--write") {
      write = true;
    } else if (k == "--check") {
      check = true;
    } else if (k == "--render") {
      render = true;
    } else if (k == "--blocks-only") {
      blocks_only = true;
    } else if ((k == "--jobs" || k == "--source" || k == "--study" || k == "--parts") &&
               i + 1 < a.rest.size()) {
      const std::string v = a.rest[++i];
      if (k == "--parts") parts = v;
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
    for (const std::string& part : split_list(parts))
      if (part != "study" && part != "paper-scale") {
        std::fprintf(stderr, "figures: unknown part %s (study, paper-scale)\n", part.c_str());
        return 2;
      }
    fs::create_directories(a.out);
    const std::vector<std::string> chosen = split_list(parts);
    const auto has = [&](const char* part) {
      return std::find(chosen.begin(), chosen.end(), part) != chosen.end();
    };
    if (has("paper-scale")) write_paper_scale(a, source);
    for (const ClusterRun& c : kClusters) {
      if (!has("study")) break;
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
  if (blocks_only) {
    if (stale > 0) {
      std::fprintf(stderr,
                   "figures: %d README block(s) do not match the data; render them with "
                   "`figures --render`, or regenerate the data with `bash scripts/figures.sh`\n",
                   stale);
      return 1;
    }
    return 0;
  }
  fs::create_directories(a.out);
  const int moved = rerun_cheap(a, study, d) + recheck_paper_scale(a, d);
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
