// Flows resolved per wall second by the network models, for an all-to-all among every rank of
// an Aurora cluster (12 tiles per node): all p (p-1) flows start at once, the hardest case for
// max-min sharing (one connected component, re-solved at every completion time).
//   model:  the NetworkModel alone, driven like the emulator drives it
//   engine: the same all-to-all as phantom collectives through emu::Engine (fibers included)
// Prints a table; --json FILE writes the rows.
//
//   net_models_bench [--ranks 96,768] [--engine-ranks 96,768] [--bytes 1048576] [--repeat 3]

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "emulator/engine.hpp"
#include "net_models/cluster.hpp"
#include "net_models/maxmin_model.hpp"

namespace cocodiff {
namespace {

const std::filesystem::path kPresets = std::filesystem::path(COCODIFF_CONFIG_DIR) / "clusters";

struct Args {
  std::vector<int> ranks = {96, 768};
  std::vector<int> engine_ranks = {96, 768};
  std::int64_t bytes = 1 << 20;  // per flow
  int repeat = 3;
  std::string json;
};

std::vector<int> parse_list(const std::string& s) {
  std::vector<int> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');)
    if (!item.empty()) out.push_back(std::stoi(item));
  return out;
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", k.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (k == "--ranks") {
      a.ranks = parse_list(next());
    } else if (k == "--engine-ranks") {
      a.engine_ranks = parse_list(next());
    } else if (k == "--bytes") {
      a.bytes = std::stoll(next());
    } else if (k == "--repeat") {
      a.repeat = std::max(1, std::stoi(next()));
    } else if (k == "--json") {
      a.json = next();
    } else {
      std::fprintf(stderr,
                   "usage: %s [--ranks 96,768] [--engine-ranks 96,768] [--bytes N] [--repeat N] "
                   "[--json FILE]\n",
                   argv[0]);
      std::exit(k == "--help" ? 0 : 2);
    }
  }
  for (int p : a.ranks)
    if (p < 12 || p % 12 != 0) {
      std::fprintf(stderr, "ranks must be multiples of 12 (Aurora nodes)\n");
      std::exit(2);
    }
  return a;
}

Cluster aurora(int ranks, const std::string& network) {
  Config cfg = Config::parse("[cluster]\npreset = \"aurora\"\n", "bench");
  cfg.set("cluster.nodes=" + std::to_string(ranks / 12));
  cfg.set("cluster.network=" + network);
  return load_cluster(cfg, kPresets);
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

struct Result {
  std::string what, network;
  int ranks = 0;
  std::uint64_t flows = 0, events = 0, solves = 0, flows_solved = 0;
  SimTime makespan;
  double wall_s = 0;  // best of the repeats
};

Result run_model(int p, const std::string& network, const Args& a) {
  Cluster c = aurora(p, network);
  Result r;
  r.what = "model";
  r.network = network;
  r.ranks = p;
  r.wall_s = 1e30;
  for (int rep = 0; rep < a.repeat; ++rep) {
    std::unique_ptr<NetworkModel> net = c.network->clone_empty();
    const auto t0 = std::chrono::steady_clock::now();
    std::uint64_t id = 0, events = 0;
    for (int k = 1; k < p; ++k)  // in the order the concurrent collective posts them
      for (int s = 0; s < p; ++s) net->add_flow(id++, s, (s + k) % p, a.bytes, SimTime{});
    std::vector<std::uint64_t> done;
    done.reserve(id);
    while (net->active_flows() > 0) {
      net->advance_to(net->next_event_time(), done);
      ++events;
    }
    r.wall_s = std::min(r.wall_s, seconds_since(t0));
    r.flows = id;
    r.events = events;
    r.makespan = net->now();
    if (auto* mm = dynamic_cast<MaxMinModel*>(net.get())) {
      r.solves = mm->stats().solves;
      r.flows_solved = mm->stats().flows_solved;
    }
  }
  return r;
}

Result run_engine(int p, const std::string& network, const std::string& rounds, const Args& a) {
  Cluster c = aurora(p, network);
  emu::EngineOptions o;
  o.workers = 2;
  o.trace = false;
  o.wire_bytes_per_element = 4;
  o.all_to_all_algorithm = rounds;
  emu::Engine engine(c.topology, std::move(c.network), c.device, o);
  Result r;
  r.what = "engine " + rounds;
  r.network = network;
  r.ranks = p;
  r.wall_s = 1e30;
  for (int rep = 0; rep < a.repeat; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    emu::RunResult res =
        engine.run([&](Communicator& comm) { comm.all_to_all({}, {}, a.bytes / 4); });
    r.wall_s = std::min(r.wall_s, seconds_since(t0));
    r.flows = res.flows;
    r.events = res.events;
    r.makespan = res.makespan;
  }
  return r;
}

}  // namespace
}  // namespace cocodiff

int main(int argc, char** argv) {
  using namespace cocodiff;
  const Args a = parse(argc, argv);
  std::vector<Result> rows;
  std::printf("# all-to-all on Aurora, %lld bytes per flow, best of %d\n",
              static_cast<long long>(a.bytes), a.repeat);
  std::printf("%-20s %-11s %6s %9s %8s %8s %12s %12s %10s %14s\n", "what", "network", "ranks",
              "flows", "events", "solves", "flows solved", "virtual(us)", "wall(s)",
              "flows/s (wall)");
  auto print = [&](const Result& r) {
    std::printf("%-20s %-11s %6d %9llu %8llu %8llu %12llu %12.1f %10.3f %14.0f\n", r.what.c_str(),
                r.network.c_str(), r.ranks, static_cast<unsigned long long>(r.flows),
                static_cast<unsigned long long>(r.events),
                static_cast<unsigned long long>(r.solves),
                static_cast<unsigned long long>(r.flows_solved), r.makespan.us(), r.wall_s,
                static_cast<double>(r.flows) / r.wall_s);
    std::fflush(stdout);
    rows.push_back(r);
  };
  for (int p : a.ranks) {
    print(run_model(p, "maxmin", a));
    print(run_model(p, "alpha-beta", a));
  }
  for (int p : a.engine_ranks) {
    print(run_engine(p, "maxmin", "concurrent", a));
    print(run_engine(p, "maxmin", "pairwise", a));
  }
  if (!a.json.empty()) {
    nlohmann::json j = nlohmann::json::array();
    for (const Result& r : rows)
      j.push_back({{"what", r.what},
                   {"network", r.network},
                   {"ranks", r.ranks},
                   {"flows", r.flows},
                   {"events", r.events},
                   {"solves", r.solves},
                   {"flows_solved", r.flows_solved},
                   {"virtual_ns", r.makespan.ns()},
                   {"wall_seconds", r.wall_s},
                   {"flows_per_wall_second", static_cast<double>(r.flows) / r.wall_s}});
    std::ofstream(a.json) << j.dump(2) << "\n";
  }
  return 0;
}
