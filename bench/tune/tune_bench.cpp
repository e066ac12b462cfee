// What `cocodiff tune` finds on the paper's models and the shipped clusters, against the paper's
// fixed choice (cocodiff on every tile of the nodes) and xDiT's default (flat Ulysses over every
// GPU in one group), driving the cocodiff program:
//  search   per model x cluster: `cocodiff tune` over the node counts (and every GPU count per
//           node), its wall and CPU seconds, how many configurations it considered, ran, pruned
//           and stopped (tune_search.{csv,json});
//  compare  per model x cluster x node count: tune's best on those nodes against the two fixed
//           choices on all their GPUs, each a `cocodiff run` (tune_compare.{csv,json}).
// Every time is virtual (phantom runs, one image, the model's default steps).
//
//   tune_bench [--out DIR] [--smoke] [--models flux1-dev,...] [--clusters aurora,hgx-h100,...]
//              [--resolution 2048] [--jobs N]
//
// Regenerate bench/results/tune_*: tune_bench --out bench/results (about 40 CPU minutes).

#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>

#include "bench/common/bench_util.hpp"

namespace cocodiff::bench {
namespace {

struct Options {
  std::vector<std::string> models = {"flux1-dev", "sd35-large", "qwen-image", "sd35-medium"};
  std::vector<std::string> clusters = {"aurora", "hgx-h100", "hgx-h200"};
  int resolution = 2048;
  int jobs = 0;  // cocodiff tune --jobs (0: its default, the hardware threads)
};

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> v;
  std::stringstream ss(s);
  for (std::string x; std::getline(ss, x, ',');)
    if (!x.empty()) v.push_back(x);
  return v;
}

// The node counts the paper runs on each cluster: Aurora 1-8, HGX 1-4.
std::vector<int> nodes_of(const std::string& cluster, bool smoke) {
  if (smoke) return {1, 2};
  return cluster == "aurora" ? std::vector<int>{1, 2, 4, 8} : std::vector<int>{1, 2, 4};
}

std::string join(const std::vector<int>& v) {
  std::string s;
  for (int x : v) s += (s.empty() ? "" : ",") + std::to_string(x);
  return s;
}

}  // namespace
}  // namespace cocodiff::bench

int main(int argc, char** argv) {
  using namespace cocodiff::bench;
  const char* usage =
      "[--models M,...] [--clusters C,...] [--resolution PX] [--jobs N]  (tune_bench)";
  Args args = parse_args(argc, argv, usage);
  Options o;
  for (size_t i = 0; i < args.rest.size(); ++i) {
    const std::string& k = args.rest[i];
    const bool has = i + 1 < args.rest.size();
    if (k == "--models" && has) {
      o.models = split(args.rest[++i]);
    } else if (k == "--clusters" && has) {
      o.clusters = split(args.rest[++i]);
    } else if (k == "--resolution" && has) {
      o.resolution = std::stoi(args.rest[++i]);
    } else if (k == "--jobs" && has) {
      o.jobs = std::stoi(args.rest[++i]);
    } else {
      std::fprintf(stderr, "tune_bench: unknown option %s\nusage: tune_bench %s\n", k.c_str(),
                   usage);
      return 2;
    }
  }
  if (args.smoke) {
    o.models = {"flux1-tiny"};
    o.clusters = {"aurora"};
    o.resolution = 256;
  }
  const std::filesystem::path config = args.config_dir / "cocodiff.toml";
  Table search({"model", "cluster", "nodes", "configurations", "run", "pruned", "stopped", "wall_s",
                "cpu_s", "best", "best_s"});
  Table compare({"model", "cluster", "nodes", "tune_best", "gpus", "tune_s", "cocodiff_all_s",
                 "xdit_flat_all_s", "vs_cocodiff", "vs_xdit"});
  Progress progress(o.models.size() * o.clusters.size());
  for (const std::string& model : o.models)
    for (const std::string& cluster : o.clusters) {
      progress.step(model + " on " + cluster);
      const std::vector<int> nodes = nodes_of(cluster, args.smoke);
      std::vector<std::string> sets = {"model.preset=" + model,
                                       "run.resolution=" + std::to_string(o.resolution),
                                       "cluster.preset=" + cluster};
      if (args.smoke) sets.push_back("run.steps=2");
      const std::filesystem::path dir = args.out / "runs" / ("tune_" + model + "_" + cluster);
      std::vector<std::string> cmd = {args.cocodiff.string(),
                                      "tune",
                                      config.string(),
                                      "--nodes",
                                      join(nodes),
                                      "--out",
                                      dir.string()};
      if (o.jobs > 0) cmd.insert(cmd.end(), {"--jobs", std::to_string(o.jobs)});
      for (const std::string& s : sets) cmd.insert(cmd.end(), {"--set", s});
      std::filesystem::create_directories(dir.parent_path());
      const ChildRun t = run_command(cmd, dir.string() + ".log");
      if (t.exit_code != 0) {
        std::fprintf(stderr, "tune_bench: %s on %s: cocodiff tune failed: %s\n", model.c_str(),
                     cluster.c_str(), t.error.c_str());
        return 1;
      }
      std::ifstream in(dir / "tune.json");
      const nlohmann::json j = nlohmann::json::parse(in);
      const nlohmann::json& best = j["ranking"][0];
      std::string command_line;
      for (const std::string& c : cmd) command_line += (command_line.empty() ? "" : " ") + c;
      search.add(
          {model, cluster, join(nodes), std::to_string(j["counts"]["configurations"].get<int>()),
           std::to_string(j["counts"]["run"].get<int>()),
           std::to_string(j["counts"]["pruned"].get<int>()),
           std::to_string(j["counts"]["stopped"].get<int>()), fmt("%.1f", t.wall_s),
           fmt("%.1f", t.cpu_s),
           best["nodes"].dump() + "x" + best["gpus_per_node"].dump() + " " +
               best["configuration"].get<std::string>(),
           fmt("%.4f", best["time_per_image_s"].get<double>())},
          {{"model", model},
           {"cluster", cluster},
           {"nodes", nodes},
           {"resolution", o.resolution},
           {"steps", j["steps"]},
           {"counts", j["counts"]},
           {"wall_s", t.wall_s},
           {"cpu_s", t.cpu_s},
           {"best", best},
           {"pareto", j["pareto"]},
           {"command", command_line}});
      // Per node count: tune's best on those nodes (any GPUs per node), against the two fixed
      // choices on every GPU of those nodes.
      for (int n : nodes) {
        const nlohmann::json* mine = nullptr;
        for (const nlohmann::json& p : j["ranking"])
          if (p["nodes"].get<int>() == n) {
            mine = &p;
            break;
          }
        auto fixed = [&](const std::string& name, std::vector<std::string> extra) {
          std::vector<std::string> a;
          for (const std::string& s : sets) a.insert(a.end(), {"--set", s});
          a.insert(a.end(),
                   {"--set", "run.math=skip", "--set", "emulator.trace=false", "--set",
                    "cluster.nodes=" + std::to_string(n), "--set", "ulysses.uneven_heads=true"});
          a.insert(a.end(), extra.begin(), extra.end());
          Args child = args;
          child.config = config;
          return run_cocodiff(child, a,
                              model + "_" + cluster + "_" + std::to_string(n) + "_" + name);
        };
        // The paper's choice: cocodiff (TAPA, V-First, pipelining, V-Major at its defaults: lossy,
        // its phantom share of V blocks) over every tile; xDiT's: every GPU in one Ulysses group.
        const ChildRun coco = fixed("cocodiff", {"--set", "run.strategy=cocodiff"});
        const ChildRun flat = fixed("flat", {"--set", "run.strategy=flat"});
        const double ct = coco.ok() ? coco.report["virtual_time_s"].get<double>() : 0;
        const double ft = flat.ok() ? flat.report["virtual_time_s"].get<double>() : 0;
        const double bt = mine ? (*mine)["time_per_image_s"].get<double>() : 0;
        const std::string label = mine ? (*mine)["nodes"].dump() + "x" +
                                             (*mine)["gpus_per_node"].dump() + " " +
                                             (*mine)["configuration"].get<std::string>()
                                       : "(none run)";
        compare.add({model, cluster, std::to_string(n), label, mine ? (*mine)["gpus"].dump() : "-",
                     mine ? fmt("%.4f", bt) : "-", coco.ok() ? fmt("%.4f", ct) : "failed",
                     flat.ok() ? fmt("%.4f", ft) : "failed",
                     mine && coco.ok() ? fmt("%.2fx", ct / bt) : "-",
                     mine && flat.ok() ? fmt("%.2fx", ft / bt) : "-"},
                    {{"model", model},
                     {"cluster", cluster},
                     {"nodes", n},
                     {"tune_best", mine ? *mine : nlohmann::json()},
                     {"cocodiff_all_tiles_s", coco.ok() ? nlohmann::json(ct) : nlohmann::json()},
                     {"xdit_flat_all_gpus_s", flat.ok() ? nlohmann::json(ft) : nlohmann::json()},
                     {"cocodiff_error", coco.error},
                     {"flat_error", flat.error}});
      }
    }
  progress.done();
  const nlohmann::json meta = {
      {"resolution", o.resolution},
      {"note",
       "virtual times per image (phantom runs, the model's default steps); tune searches exact "
       "strategies (no --lossy); the paper's fixed choice runs cocodiff with V-Major at its "
       "defaults (lossy: in phantom mode it sends v_major.phantom_active_fraction of its V "
       "blocks); xDiT's default is flat Ulysses over every GPU (uneven heads where they do not "
       "divide). wall_s and cpu_s: the cocodiff tune command, measured by this program"}};
  search.finish(args, "tune_search", meta);
  compare.finish(args, "tune_compare", meta);
  return 0;
}
