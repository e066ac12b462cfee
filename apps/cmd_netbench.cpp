// `cocodiff netbench CONFIG --op all_to_all --algo flat|tapa [--min-bytes A] [--max-bytes B]
// [--json FILE]`: nccl-tests for the emulator. Runs the collective on every rank of the
// emulated cluster with phantom buffers (sizes only) for message sizes doubling from A to B
// and prints, per size, the virtual time, algorithm and bus bandwidth and the bytes each tier
// carried. CONFIG is a run config with a [cluster] section, a cluster preset file, or a preset
// name; --set overrides any cluster key (e.g. --set cluster.nodes=8).
//
// As in nccl-tests: "bytes" is one rank's send buffer for all_to_all (p blocks), its receive
// buffer for all_gather (p blocks), its buffer for all_reduce, its send buffer for
// reduce_scatter (p blocks, one reduced block received), and the message for sendrecv (rank r
// sends to r+1 and receives from r-1); algbw = bytes / time, and busbw = algbw times (p-1)/p
// (all_to_all, all_gather, reduce_scatter), 2(p-1)/p (all_reduce) or 1 (sendrecv), so that
// busbw is comparable with a link's bandwidth. reduce_scatter is the ring of NCCL and of the
// emulator's all-reduce (its first half): p-1 steps, each sending one block to r+1 and
// receiving one from r-1, T = call + (p-1) (sw + alpha + (bytes/p) beta) without contention;
// sendrecv costs the library's call and one message's software time on top of its message.
// calibrate/collective_bench.hpp times every op (`cocodiff calibrate` predicts by the same code).
// The last line is "# Avg bus bandwidth", the mean busbw. `flat` is one all-to-all over the world;
// `tapa` one all-to-all per topology level (innermost first) among the ranks that differ only at
// that level (all_to_all only).
//
// The table is nccl-tests' own (size, count, type, redop, root, then time, algbw, busbw and
// #wrong out of place and in place, with its header lines), so parsers of nccl-tests output read
// it; in place is the same run (buffers carry sizes only), and #wrong is N/A (no data to check).
// Its options are nccl-tests' too: -b -e -f -i (step bytes), -n (timed iterations, the time is
// their mean), -w (warm-up iterations), -g (GPUs: ranks, as nodes of the cluster), -d (the
// element type), -c and -G (accepted; nothing to check, no launch to capture), and its op names
// (alltoall, allgather, ...). Its defaults are calibrate's: the library's all-to-all schedule,
// and -w 1 -n 2 where the cluster's device has a host. The bytes each tier carried and the flows
// follow as comment lines, then "# Collective test concluded".

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "apps/commands.hpp"
#include "calibrate/collective_bench.hpp"
#include "core/atomic_file.hpp"
#include "core/errors.hpp"
#include "emulator/collectives/registry.hpp"
#include "emulator/engine.hpp"
#include "net_models/cluster.hpp"
#include "runner/run_plan.hpp"

namespace cocodiff::apps {

namespace {

struct NetbenchOptions {
  std::string config;
  std::vector<std::string> sets;
  std::string op = "all_to_all";
  std::string algo = "flat";
  std::string a2a = "library";  // the schedule runs use (and calibrate predicts with)
  std::uint64_t min_bytes = 1 << 10;
  std::uint64_t max_bytes = 64 << 20;
  double factor = 2;             // -f: size multiplier between rows
  std::uint64_t step_bytes = 0;  // -i: size increment between rows instead (0: use -f)
  int iters = -1;        // -n: timed iterations per size, their mean (-1: 2 with a host, else 1)
  int warmup = -1;       // -w: iterations before the timed ones (-1: 1 with a host, else 0)
  std::string datatype;  // -d: nccl-tests' type name (sets the wire bytes)
  int graph_iters = 0;   // -G: accepted (virtual time has no launch to capture)
  int gpus = 0;          // -g: ranks (0: the cluster's)
  int check = 0;         // -c: accepted; phantom buffers carry nothing to check
  int nodes = 0;         // --nodes: cluster.nodes (0: the config's)
  double wire_bytes = 2;
  int workers = 0;
  std::string json;
};

struct Row {
  std::int64_t bytes = 0;  // one rank's send buffer
  std::int64_t count = 0;  // elements per collective call argument (per peer / per rank)
  SimTime time;
  std::vector<std::int64_t> tier_bytes;
  std::uint64_t flows = 0;
  double wall_s = 0;
};

// One timed collective (calibrate/collective_bench.hpp, the path calibrate predicts with). split()
// and barrier() move bytes of their own, so the bytes of a run that only sets up are subtracted.
Row measure(emu::Engine& engine, const NetbenchOptions& o, std::int64_t count,
            const Row* setup_only) {
  const int p = engine.topology().num_ranks();
  const auto wall0 = std::chrono::steady_clock::now();
  BenchCall call;
  if (!parse_bench_op(o.op, call.op)) throw UserError("netbench: unknown --op " + o.op);
  call.count = count;
  call.tapa = o.algo == "tapa";
  call.warmup = o.warmup;  // the setup run makes the same barriers, with no calls
  call.iters = o.iters;
  const BenchTiming t = time_collective(engine, call);
  Row row;
  row.count = count;
  row.bytes = static_cast<std::int64_t>(static_cast<double>(count) *
                                        (bench_op_has_blocks(call.op) ? p : 1) * o.wire_bytes);
  row.time = t.time;
  row.tier_bytes = t.bytes_by_tier;
  row.flows = t.flows;
  if (setup_only != nullptr) {  // one call's bytes and flows
    const std::int64_t calls = o.warmup + o.iters;
    for (size_t k = 0; k < row.tier_bytes.size(); ++k)
      row.tier_bytes[k] = (row.tier_bytes[k] - setup_only->tier_bytes[k]) / calls;
    row.flows = (row.flows - setup_only->flows) / static_cast<std::uint64_t>(calls);
  }
  row.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
  return row;
}

// nccl-tests' name of a data type of `bytes` per element.
std::string type_name(double bytes) {
  if (bytes == 1) return "int8";
  if (bytes == 2) return "bfloat16";
  if (bytes == 4) return "float";
  if (bytes == 8) return "double";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%gbyte", bytes);
  return buf;
}

// busbw / algbw for `op` on p ranks (nccl-tests' factors).
double bus_factor(const std::string& op, int p) {
  BenchOp b{};
  return parse_bench_op(op, b) ? bench_bus_factor(b, p) : 1.0;
}

// The most rows one sweep may have, and the largest buffer: past them a sweep would run for
// hours (-i 1 from 1 byte to 1 GiB is a billion rows).
constexpr double kMaxRows = 4096;
constexpr std::uint64_t kMaxNetbenchBytes = std::uint64_t{1} << 40;

// Refuses a sweep out of range (sizes, step, algorithm, rows) and sets -d's wire bytes.
void check_sweep(NetbenchOptions& o) {
  if (o.max_bytes > kMaxNetbenchBytes || o.min_bytes > kMaxNetbenchBytes)
    throw UserError("netbench: -b and -e: at most " + std::to_string(kMaxNetbenchBytes) +
                    " bytes (1 TiB) per rank, found " + std::to_string(o.min_bytes) + " and " +
                    std::to_string(o.max_bytes) + " (a negative size reads as a huge one)");
  if (o.min_bytes < 1 || o.max_bytes < o.min_bytes)
    throw UserError("netbench: expected 1 <= --min-bytes <= --max-bytes, found " +
                    std::to_string(o.min_bytes) + " and " + std::to_string(o.max_bytes));
  if (!(o.factor > 1))
    throw UserError("netbench: expected a step factor -f above 1, found " +
                    std::to_string(o.factor));
  if (o.algo == "tapa" && o.op != "all_to_all")
    throw UserError("netbench: --algo tapa is an all-to-all algorithm, not one for " + o.op);
  const double sizes =
      o.step_bytes > 0
          ? static_cast<double>(o.max_bytes - o.min_bytes) / static_cast<double>(o.step_bytes) + 1
          : std::log(static_cast<double>(o.max_bytes) / static_cast<double>(o.min_bytes)) /
                    std::log(o.factor) +
                1;
  if (sizes > kMaxRows)
    throw UserError("netbench: " + std::to_string(static_cast<long long>(sizes)) +
                    " sizes from -b " + std::to_string(o.min_bytes) + " to -e " +
                    std::to_string(o.max_bytes) + " by " +
                    (o.step_bytes > 0 ? "-i " + std::to_string(o.step_bytes)
                                      : "-f " + std::to_string(o.factor)) +
                    ": at most " + std::to_string(static_cast<int>(kMaxRows)) +
                    " rows a sweep; a larger -i or -f, or a narrower range");
  if (!o.datatype.empty()) {
    static const std::map<std::string, double> kTypes = {
        {"int8", 1},     {"char", 1},  {"uint8", 1},  {"half", 2},   {"float16", 2},
        {"bfloat16", 2}, {"int32", 4}, {"int", 4},    {"uint32", 4}, {"float", 4},
        {"float32", 4},  {"int64", 8}, {"uint64", 8}, {"double", 8}, {"float64", 8}};
    const auto t = kTypes.find(o.datatype);
    if (t == kTypes.end())
      throw UserError("netbench: -d " + o.datatype +
                      ": expected one of nccl-tests' types (int8, half, bfloat16, float, "
                      "int32, int64, double)");
    o.wire_bytes = t->second;
  }
}

// Applies --nodes and -g (whole nodes of the cluster) to the cluster's config.
void set_nodes(const NetbenchOptions& o, Config& cfg) {
  if (o.nodes > 0) cfg.set("cluster.nodes=" + std::to_string(o.nodes));
  if (o.gpus > 0) {
    // -g: the number of ranks, as whole nodes of the cluster.
    const int per_node = load_cluster(cfg, config_dir() / "clusters").topology.ranks_per_node();
    if (o.gpus % per_node != 0)
      throw UserError("netbench: -g " + std::to_string(o.gpus) +
                      ": expected a multiple of the cluster's " + std::to_string(per_node) +
                      " ranks per node (-g sets cluster.nodes = g / " + std::to_string(per_node) +
                      ")");
    cfg.set("cluster.nodes=" + std::to_string(o.gpus / per_node));
  }
}

// nccl-tests' header and what this emulation of the op runs.
void print_header(const NetbenchOptions& o, const Cluster& c, const Config& cfg,
                  const std::string& network) {
  const Topology& topo = c.topology;
  const int p = topo.num_ranks();
  // nccl-tests' header: its parsers take the test from the first line, count the "#  Rank"
  // lines and find the table after them.
  std::printf("# Collective test starting: %s_perf\n",
              o.op == "all_to_all" ? "alltoall" : o.op.c_str());
  std::printf(
      "# nThread 1 nGpus %d minBytes %llu maxBytes %llu step: %llu(%s) warmup iters: %d iters: %d "
      "agg iters: 1 validation: 0 graph: 0\n#\n",
      p, static_cast<unsigned long long>(o.min_bytes), static_cast<unsigned long long>(o.max_bytes),
      static_cast<unsigned long long>(o.step_bytes > 0 ? o.step_bytes
                                                       : static_cast<std::uint64_t>(o.factor)),
      o.step_bytes > 0 ? "bytes" : "factor", o.warmup, o.iters);
  std::printf(
      "# cocodiff netbench: %s, algo %s (%s rounds), cluster %s, %d node(s), %d ranks, network "
      "%s, virtual time\n",
      o.op.c_str(), o.algo.c_str(), o.a2a.c_str(), c.name.c_str(), topo.num_nodes(), p,
      network.c_str());
  if (o.nodes == 0 && o.gpus == 0 && !cfg.has("cluster.nodes"))
    std::printf("# nodes: the cluster file's default; --nodes N or -g GPUS for more\n");
  if (o.op == "all_reduce")
    std::printf(
        "# all_reduce runs one flat ring over all %d ranks in rank order (a reduce-scatter ring "
        "then an all-gather ring: 2 x %d messages of bytes / %d per rank), not NCCL's choice of "
        "rings and trees over the node's links\n",
        p, p - 1, p);
  if (o.op == "reduce_scatter")
    std::printf(
        "# reduce_scatter runs NCCL's ring (%d steps of bytes / %d per rank), timed as the "
        "library's all-gather schedule, which sends the same messages\n",
        p - 1, p);
  const char* what = o.op == "all_to_all"   ? "one rank's send buffer (p blocks)"
                     : o.op == "all_gather" ? "one rank's receive buffer (p blocks)"
                     : o.op == "all_reduce" ? "one rank's buffer"
                     : o.op == "reduce_scatter"
                         ? "one rank's send buffer (p blocks; one reduced block received)"
                         : "the message each rank sends to the next";
  std::printf("# size = %s, %g wire bytes per element (count = size / %g); busbw = algbw x %.4g\n",
              what, o.wire_bytes, o.wire_bytes, bus_factor(o.op, p));
  std::printf(
      "# in-place = out-of-place (buffers carry sizes only); #wrong: N/A, no data to check\n");
}

// The ranks as nccl-tests lists its devices, and the table's column headings.
void print_columns(const Cluster& c) {
  const Topology& topo = c.topology;
  const int p = topo.num_ranks();
  std::printf("#\n# Using devices\n");
  for (int r = 0; r < p; ++r)
    std::printf("#  Rank %2d Group  0 Pid %6d on %10s device %2d [0x00] %s %s\n", r, 0,
                ("node" + std::to_string(topo.node(r))).c_str(), r % topo.ranks_per_node(),
                c.device->name().c_str(), topo.describe_rank(r).c_str());
  std::printf("#\n#%58s%-36s%s\n", "", "out-of-place", "in-place");
  std::printf("#%11s %13s %9s %7s %7s %8s %7s %7s %6s %8s %7s %7s %6s\n", "size", "count", "type",
              "redop", "root", "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw",
              "#wrong");
  std::printf("#%11s %13s %9s %7s %7s %8s %7s %7s %6s %8s %7s %7s %6s\n", "(B)", "(elements)", "",
              "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "");
  std::fflush(stdout);
}

// The sweep: one row per size, printed as it is timed, each less the setup's bytes and flows.
std::vector<Row> sweep(emu::Engine& engine, const NetbenchOptions& o, int p, double& bus_sum) {
  const std::string type = type_name(o.wire_bytes);
  const char* redop = o.op == "all_reduce" || o.op == "reduce_scatter" ? "sum" : "none";
  // The setup (split, barrier) alone, to subtract its bytes from each row.
  const Row setup = measure(engine, o, 0, nullptr);

  std::vector<Row> rows;
  std::int64_t last_count = -1;
  const bool p_blocks = o.op == "all_to_all" || o.op == "all_gather" || o.op == "reduce_scatter";
  for (double size = static_cast<double>(o.min_bytes); size <= static_cast<double>(o.max_bytes);
       size = o.step_bytes > 0 ? size + static_cast<double>(o.step_bytes) : size * o.factor) {
    const std::int64_t count = std::max<std::int64_t>(
        1, static_cast<std::int64_t>(size / ((p_blocks ? p : 1) * o.wire_bytes)));
    if (count == last_count) continue;  // below one element per peer, sizes repeat
    last_count = count;
    Row row = measure(engine, o, count, &setup);
    const double algbw = static_cast<double>(row.bytes) / row.time.seconds() / 1e9;
    const double busbw = algbw * bus_factor(o.op, p);
    bus_sum += busbw;
    const auto elements = static_cast<long long>(static_cast<double>(row.bytes) / o.wire_bytes);
    std::printf(" %11lld %13lld %9s %7s %7d", static_cast<long long>(row.bytes), elements,
                type.c_str(), redop, -1);
    for (int place = 0; place < 2; ++place)  // out of place, then in place: the same run
      std::printf(" %8.2f %7.2f %7.2f %6s", row.time.us(), algbw, busbw, "N/A");
    std::printf("\n");
    std::fflush(stdout);
    rows.push_back(std::move(row));
  }
  return rows;
}

// What nccl-tests cannot show: the bytes each tier carried, the flows, the emulator's wall time.
void print_tiers(const Topology& topo, const std::vector<Row>& rows) {
  std::printf("#%11s", "size(B)");
  for (int k = 0; k < topo.num_tiers(); ++k)
    std::printf(" %14s", (topo.tier_name(k) + "(B)").c_str());
  std::printf(" %9s %8s\n", "flows", "wall(s)");
  for (const Row& row : rows) {
    std::printf("#%11lld", static_cast<long long>(row.bytes));
    for (std::int64_t b : row.tier_bytes) std::printf(" %14lld", static_cast<long long>(b));
    std::printf(" %9llu %8.2f\n", static_cast<unsigned long long>(row.flows), row.wall_s);
  }
}

// The sweep's rows and its cluster, as --json writes them.
void write_json(const NetbenchOptions& o, const Cluster& c, const std::string& network,
                const std::vector<Row>& rows, double avg_busbw) {
  const Topology& topo = c.topology;
  const int p = topo.num_ranks();
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
  j["avg_busbw_gbytes_per_s"] = avg_busbw;
  j["rows"] = nlohmann::json::array();
  for (const Row& r : rows) {
    const double algbw = static_cast<double>(r.bytes) / r.time.seconds() / 1e9;
    nlohmann::json jr;
    jr["bytes"] = r.bytes;
    jr["count_per_peer"] = r.count;
    jr["time_ns"] = r.time.ns();
    jr["algbw_gbytes_per_s"] = algbw;
    jr["busbw_gbytes_per_s"] = algbw * bus_factor(o.op, p);
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

void run_netbench(NetbenchOptions o) {  // a copy: the defaults that depend on the cluster
  check_sweep(o);
  Config cfg = load_cluster_config(o.config, config_dir() / "clusters");
  for (const std::string& s : o.sets) cfg.set(s);
  set_nodes(o, cfg);
  Cluster c = load_cluster(cfg, config_dir() / "clusters");
  // As calibrate times its points: a device with a host pays its issue cost on the first call.
  if (o.warmup < 0) o.warmup = c.device->has_host() ? 1 : 0;
  if (o.iters < 0) o.iters = c.device->has_host() ? 2 : 1;
  const Topology topo = c.topology;
  const int p = topo.num_ranks();
  const std::string network = c.network->name();

  emu::EngineOptions eo;
  eo.workers = o.workers;
  eo.wire_bytes_per_element = o.wire_bytes;
  eo.all_to_all_algorithm = o.a2a;
  eo.library = c.library;
  eo.trace = false;
  emu::Engine engine(topo, std::move(c.network), c.device, eo);

  print_header(o, c, cfg, network);
  print_columns(c);
  double bus_sum = 0;
  const std::vector<Row> rows = sweep(engine, o, p, bus_sum);
  const double avg_busbw = rows.empty() ? 0 : bus_sum / static_cast<double>(rows.size());
  std::printf("# Out of bounds values : 0 OK\n# Avg bus bandwidth    : %g \n#\n", avg_busbw);
  print_tiers(topo, rows);
  std::printf("#\n# Collective test concluded: %s_perf\n",
              o.op == "all_to_all" ? "alltoall" : o.op.c_str());
  std::fflush(stdout);
  if (!o.json.empty()) write_json(o, c, network, rows, avg_busbw);
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
  cmd->add_option("--op", o->op, "collective (nccl-tests' names too: alltoall, allgather, ...)")
      ->transform(
          CLI::Transformer(std::map<std::string, std::string>{{"alltoall", "all_to_all"},
                                                              {"allgather", "all_gather"},
                                                              {"allreduce", "all_reduce"},
                                                              {"reducescatter", "reduce_scatter"}}))
      ->check(
          CLI::IsMember({"all_to_all", "all_gather", "all_reduce", "reduce_scatter", "sendrecv"}));
  cmd->add_option("-d,--datatype", o->datatype,
                  "nccl-tests -d: the element type (int8, half, bfloat16, float, int32, int64, "
                  "double); sets the wire bytes per element");
  cmd->add_option("-G,--cudagraph", o->graph_iters,
                  "nccl-tests -G: accepted; virtual time has no launches to capture, so a call "
                  "costs what the cluster's library and host figures say")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--algo", o->algo, "flat: one world all-to-all; tapa: one phase per level")
      ->check(CLI::IsMember({"flat", "tapa"}));
  cmd->add_option(
         "--rounds", o->a2a,
         "how each all-to-all posts its messages: library (the cluster library's "
         "schedule, as runs and calibrate use it) or a registered algorithm (" +
             emu::collectives::algorithm_list(emu::collectives::CollectiveKind::kAllToAll, ", ") +
             "; pairwise is shift)")
      ->check(CLI::IsMember(emu::all_to_all_choices()));
  cmd->add_option("-b,--min-bytes", o->min_bytes, "smallest send buffer per rank (e.g. 1K, 4MB)")
      ->transform(CLI::AsSizeValue(false));
  cmd->add_option("-e,--max-bytes", o->max_bytes, "largest send buffer per rank (e.g. 64M)")
      ->transform(CLI::AsSizeValue(false));
  cmd->add_option("-f,--step-factor", o->factor, "size multiplier between rows (nccl-tests -f)");
  cmd->add_option("-i,--step-bytes", o->step_bytes,
                  "size increment between rows instead of -f (nccl-tests -i)")
      ->transform(CLI::AsSizeValue(false));
  cmd->add_option("-n,--iters", o->iters,
                  "timed iterations per size, back to back; the time is their mean (nccl-tests "
                  "-n; default as calibrate times its points: 2 where the cluster's device has a "
                  "host, else 1)")
      ->check(CLI::Range(1, 1000));
  cmd->add_option("-w,--warmup-iters", o->warmup,
                  "iterations before the timed ones (nccl-tests -w; default 1 where the "
                  "cluster's device has a host, else 0)")
      ->check(CLI::Range(0, 1000));
  cmd->add_option("-g,--ngpus", o->gpus,
                  "GPUs (ranks) in the test, whole nodes of the cluster (nccl-tests -g; sets "
                  "cluster.nodes)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("-c,--check", o->check,
                  "nccl-tests -c: accepted; buffers carry sizes only, so #wrong is N/A")
      ->check(CLI::Range(0, 1));
  cmd->add_option("--nodes", o->nodes, "nodes of the cluster (cluster.nodes; 0: the config's)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--wire-bytes", o->wire_bytes, "bytes per element on the wire (2 = bf16)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--workers", o->workers, "emulator worker threads (0: all hardware threads)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--json", o->json, "also write the rows as JSON to FILE");
  cmd->callback([o] { run_netbench(*o); });
}

}  // namespace cocodiff::apps
