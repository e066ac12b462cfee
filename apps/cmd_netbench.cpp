// `cocodiff netbench CONFIG --op all_to_all --algo flat|tapa [--min-bytes A] [--max-bytes B]
// [--json FILE]`: nccl-tests for the emulator. Runs the collective on every rank of the
// emulated cluster with phantom buffers (sizes only) for message sizes doubling from A to B
// and prints, per size, the virtual time, algorithm and bus bandwidth and the bytes each tier
// carried. CONFIG is a run config with a [cluster] section, a cluster preset file, or a preset
// name; --set overrides any cluster key (e.g. --set cluster.nodes=8).
//
// As in nccl-tests, "bytes" is one rank's whole send buffer (p blocks); algbw = bytes / time,
// busbw = algbw (p-1)/p. `flat` is one all-to-all over the world; `tapa` one all-to-all per
// topology level (innermost first) among the ranks that differ only at that level.

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "apps/commands.hpp"
#include "apps/run_plan.hpp"
#include "core/atomic_file.hpp"
#include "core/errors.hpp"
#include "emulator/engine.hpp"
#include "net_models/cluster.hpp"
#include "net_models/hierarchical_a2a.hpp"

namespace cocodiff::apps {

namespace {

struct NetbenchOptions {
  std::string config;
  std::vector<std::string> sets;
  std::string op = "all_to_all";
  std::string algo = "flat";
  std::string a2a = "pairwise";
  std::uint64_t min_bytes = 1 << 10;
  std::uint64_t max_bytes = 64 << 20;
  double wire_bytes = 2;
  int workers = 0;
  std::string json;
};

struct Row {
  std::int64_t bytes = 0;  // one rank's send buffer
  std::int64_t count = 0;  // elements per destination
  SimTime time;
  std::vector<std::int64_t> tier_bytes;
  std::uint64_t flows = 0;
  double wall_s = 0;
};

// One timed collective: every rank records when it starts (after a barrier) and ends; the
// time is last end - first start. split() and barrier() move bytes of their own, so the bytes
// of a run that only sets up are subtracted.
Row measure(emu::Engine& engine, const NetbenchOptions& o, std::int64_t count,
            const Row* setup_only) {
  const int p = engine.topology().num_ranks();
  std::vector<SimTime> start(static_cast<size_t>(p)), end(static_cast<size_t>(p));
  const auto wall0 = std::chrono::steady_clock::now();
  emu::RunResult r = engine.run([&](Communicator& comm) {
    std::unique_ptr<HierarchicalAllToAll> tapa;
    if (o.algo == "tapa") tapa = std::make_unique<HierarchicalAllToAll>(comm);
    comm.barrier();
    start[static_cast<size_t>(comm.rank())] = comm.now();
    if (count > 0) {
      if (tapa)
        tapa->run({}, {}, count, "netbench");
      else
        comm.all_to_all({}, {}, count, "netbench");
    }
    end[static_cast<size_t>(comm.rank())] = comm.now();
  });
  Row row;
  row.count = count;
  row.bytes = static_cast<std::int64_t>(static_cast<double>(count) * p * o.wire_bytes);
  row.time =
      *std::max_element(end.begin(), end.end()) - *std::min_element(start.begin(), start.end());
  row.tier_bytes = r.bytes_by_tier;
  row.flows = r.flows;
  if (setup_only != nullptr) {
    for (size_t k = 0; k < row.tier_bytes.size(); ++k)
      row.tier_bytes[k] -= setup_only->tier_bytes[k];
    row.flows -= setup_only->flows;
  }
  row.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
  return row;
}

void run_netbench(const NetbenchOptions& o) {
  if (o.min_bytes < 1 || o.max_bytes < o.min_bytes)
    throw UserError("netbench: expected 1 <= --min-bytes <= --max-bytes, found " +
                    std::to_string(o.min_bytes) + " and " + std::to_string(o.max_bytes));
  Config cfg = load_cluster_config(o.config, config_dir() / "clusters");
  for (const std::string& s : o.sets) cfg.set(s);
  Cluster c = load_cluster(cfg, config_dir() / "clusters");
  const Topology topo = c.topology;
  const int p = topo.num_ranks();
  const std::string network = c.network->name();

  emu::EngineOptions eo;
  eo.workers = o.workers;
  eo.wire_bytes_per_element = o.wire_bytes;
  eo.all_to_all_algorithm = o.a2a;
  eo.trace = false;
  emu::Engine engine(topo, std::move(c.network), c.device, eo);

  std::printf("# cocodiff netbench: %s, algo %s (%s rounds), cluster %s, %d ranks, network %s\n",
              o.op.c_str(), o.algo.c_str(), o.a2a.c_str(), c.name.c_str(), p, network.c_str());
  std::printf(
      "# bytes = one rank's send buffer (%g wire bytes per element); busbw = algbw (p-1)/p\n",
      o.wire_bytes);
  std::printf("#%13s %12s %12s %11s %11s", "bytes", "count/peer", "time(us)", "algbw(GB/s)",
              "busbw(GB/s)");
  for (int k = 0; k < topo.num_tiers(); ++k)
    std::printf(" %14s", (topo.tier_name(k) + "(B)").c_str());
  std::printf(" %9s %8s\n", "flows", "wall(s)");
  std::fflush(stdout);

  // The setup (split, barrier) alone, to subtract its bytes from each row.
  const Row setup = measure(engine, o, 0, nullptr);

  std::vector<Row> rows;
  std::int64_t last_count = -1;
  for (std::uint64_t bytes = o.min_bytes; bytes <= o.max_bytes; bytes *= 2) {
    const std::int64_t count = std::max<std::int64_t>(
        1, static_cast<std::int64_t>(static_cast<double>(bytes) / (p * o.wire_bytes)));
    if (count == last_count) continue;  // below one element per peer, sizes repeat
    last_count = count;
    Row row = measure(engine, o, count, &setup);
    const double algbw = static_cast<double>(row.bytes) / row.time.seconds() / 1e9;
    const double busbw = algbw * (p - 1) / p;
    std::printf(" %13lld %12lld %12.2f %11.2f %11.2f", static_cast<long long>(row.bytes),
                static_cast<long long>(row.count), row.time.us(), algbw, busbw);
    for (std::int64_t b : row.tier_bytes) std::printf(" %14lld", static_cast<long long>(b));
    std::printf(" %9llu %8.2f\n", static_cast<unsigned long long>(row.flows), row.wall_s);
    std::fflush(stdout);
    rows.push_back(std::move(row));
  }

  if (!o.json.empty()) {
    nlohmann::json j;
    j["op"] = o.op;
    j["algo"] = o.algo;
    j["all_to_all_rounds"] = o.a2a;
    j["cluster"] = c.name;
    j["cluster_source"] = c.source;
    j["nodes"] = topo.num_nodes();
    j["ranks"] = p;
    j["network"] = network;
    j["wire_bytes_per_element"] = o.wire_bytes;
    std::vector<std::string> tiers;
    tiers.reserve(static_cast<size_t>(topo.num_tiers()));
    for (int k = 0; k < topo.num_tiers(); ++k) tiers.push_back(topo.tier_name(k));
    j["tiers"] = tiers;
    j["rows"] = nlohmann::json::array();
    for (const Row& r : rows) {
      const double algbw = static_cast<double>(r.bytes) / r.time.seconds() / 1e9;
      nlohmann::json jr;
      jr["bytes"] = r.bytes;
      jr["count_per_peer"] = r.count;
      jr["time_ns"] = r.time.ns();
      jr["algbw_gbytes_per_s"] = algbw;
      jr["busbw_gbytes_per_s"] = algbw * (p - 1) / p;
      nlohmann::json per_tier;
      for (int k = 0; k < topo.num_tiers(); ++k)
        per_tier[topo.tier_name(k)] = r.tier_bytes[static_cast<size_t>(k)];
      jr["bytes_by_tier"] = per_tier;
      jr["flows"] = r.flows;
      jr["wall_seconds"] = r.wall_s;
      j["rows"].push_back(jr);
    }
    AtomicFile f(o.json);
    f.stream() << j.dump(2) << "\n";
    f.commit();
  }
}

}  // namespace

void add_netbench_command(CLI::App& app) {
  auto o = std::make_shared<NetbenchOptions>();
  CLI::App* cmd = app.add_subcommand(
      "netbench", "nccl-tests-style collective benchmark on the emulated cluster (virtual time)");
  cmd->add_option("config", o->config,
                  "run config with a [cluster] section, a cluster preset file, or a preset name")
      ->required();
  cmd->add_option("--set", o->sets, "override a key, e.g. --set cluster.nodes=8");
  cmd->add_option("--op", o->op, "collective")->check(CLI::IsMember({"all_to_all"}));
  cmd->add_option("--algo", o->algo, "flat: one world all-to-all; tapa: one phase per level")
      ->check(CLI::IsMember({"flat", "tapa"}));
  cmd->add_option("--rounds", o->a2a,
                  "how each all-to-all posts its messages: pairwise (p-1 rounds) or concurrent")
      ->check(CLI::IsMember({"pairwise", "concurrent"}));
  cmd->add_option("--min-bytes", o->min_bytes, "smallest send buffer per rank (e.g. 1K, 4MB)")
      ->transform(CLI::AsSizeValue(false));
  cmd->add_option("--max-bytes", o->max_bytes, "largest send buffer per rank (e.g. 64M)")
      ->transform(CLI::AsSizeValue(false));
  cmd->add_option("--wire-bytes", o->wire_bytes, "bytes per element on the wire (2 = bf16)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--workers", o->workers, "emulator worker threads (0: all hardware threads)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--json", o->json, "also write the rows as JSON to FILE");
  cmd->callback([o] { run_netbench(*o); });
}

}  // namespace cocodiff::apps
