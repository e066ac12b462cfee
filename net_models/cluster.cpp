#include "net_models/cluster.hpp"

#include <algorithm>
#include <charconv>
#include <fstream>
#include <optional>
#include <set>
#include <sstream>

#include "core/errors.hpp"
#include "emulator/collectives/registry.hpp"
#include "net_models/maxmin_model.hpp"

namespace cocodiff {

namespace {

// "n3.nic2". Built by appending: GCC 12 warns falsely (-Wrestrict) on "n" + std::to_string(n).
std::string in_node(int node, std::string_view what, int index) {
  std::string s = "n";
  s.append(std::to_string(node)).append(".").append(what).append(std::to_string(index));
  return s;
}

std::string number(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

// The run config's [cluster] section layered over the preset file: a key set in the run config
// (or by --set) wins. Keys are read from whichever layer holds them, rather than from a merged
// copy, because toml++ drops source positions when nodes are copied, and every error must name
// the file and line the bad value came from.
class Layers {
 public:
  Layers(const Config& run, const Config* preset) : run_(run), preset_(preset) {}

  bool has(std::string_view k) const {
    return run_.has(run_key(k)) || (preset_ != nullptr && preset_->has(k));
  }
  /// Whether the run config (or --set) gives the key, not only the preset.
  bool set_by_run(std::string_view k) const { return run_.has(run_key(k)); }
  std::string where(std::string_view k) const { return src(k).where(full(k)); }
  /// The directory of the file that gives k (relative paths in k resolve against it).
  const std::filesystem::path& directory(std::string_view k) const { return src(k).directory(); }
  [[noreturn]] void fail(std::string_view k, std::string_view expected,
                         std::string_view found) const {
    throw ConfigError(where(k), run_key(k), expected, found);
  }

  std::int64_t get_int(std::string_view k, std::int64_t def, std::int64_t lo,
                       std::int64_t hi) const {
    return use(k).get_int(full(k), def, lo, hi);
  }
  std::int64_t require_int(std::string_view k, std::int64_t lo, std::int64_t hi) const {
    return use(k).require_int(full(k), lo, hi);
  }
  std::string get_string(std::string_view k, std::string def) const {
    return use(k).get_string(full(k), std::move(def));
  }
  std::string choice(std::string_view k, std::string def,
                     std::initializer_list<std::string_view> choices) const {
    return use(k).get_choice(full(k), std::move(def), choices);
  }
  double get_double(std::string_view k, double def, double lo, double hi) const {
    return use(k).get_double(full(k), def, lo, hi);
  }
  std::vector<double> get_double_list(std::string_view k, std::vector<double> def) const {
    return use(k).get_double_list(full(k), std::move(def));
  }
  std::vector<std::int64_t> get_int_list(std::string_view k, std::vector<std::int64_t> def) const {
    return use(k).get_int_list(full(k), std::move(def));
  }
  std::vector<std::string> get_string_list(std::string_view k, std::vector<std::string> def) const {
    return use(k).get_string_list(full(k), std::move(def));
  }
  /// A bandwidth given in GB/s (1e9 bytes/s) per direction, returned in bytes/s.
  double bandwidth_bytes_per_s(std::string_view k) const {
    return physical(k, "bandwidth", "GB/s per direction", 1e-3, 1e6) * 1e9;
  }
  /// A required physical quantity: finite, > 0 and within the plausible range [lo, hi] (in
  /// `unit`), so that no value can push virtual time past its horizon or make a rate vanish.
  double physical(std::string_view k, std::string_view what, std::string_view unit, double lo,
                  double hi) const {
    const double v = use(k).require_double(full(k));
    if (!(v > 0)) fail(k, "a " + std::string(what) + " > 0 (" + std::string(unit) + ")", number(v));
    if (!(v >= lo && v <= hi))
      fail(k,
           "a plausible " + std::string(what) + " in [" + number(lo) + ", " + number(hi) + "] " +
               std::string(unit),
           number(v));
    return v;
  }
  SimTime latency(std::string_view k) const {
    return SimTime::from_ns(use(k).require_int(full(k), 0, std::int64_t{1} << 50));
  }
  double efficiency(std::string_view k) const {
    // Below a millionth of the peak no device runs; such a value (a denormal 1e-320, say) would
    // only overflow virtual time later, where the peak's key, not this one, would be blamed.
    const double v = use(k).get_double(full(k), 1.0);
    if (!(v >= 1e-6 && v <= 1)) fail(k, "an efficiency in [1e-6, 1]", number(v));
    return v;
  }
  /// Keys of a table in either layer, sorted.
  std::vector<std::string> subkeys(std::string_view k) const {
    std::set<std::string> all;
    for (const std::string& s : run_.subkeys(run_key(k))) all.insert(s);
    if (preset_ != nullptr)
      for (const std::string& s : preset_->subkeys(k)) all.insert(s);
    return {all.begin(), all.end()};
  }

  /// Records the effective values of `layer` (a library preset) under cluster.<prefix>.
  void adopt_effective(std::string_view prefix, const Config& layer) const {
    run_.adopt_effective(run_key(prefix), layer);
  }

  /// Throws on the first key of the preset or of the run's [cluster] section nobody read.
  void check_no_unknown_keys() const {
    auto complain = [](const Config& c, const std::string& k) {
      const std::string best = closest_match(k, c.known_keys());
      throw ConfigError(c.where(k) + ": unknown key '" + k + "' in the cluster description" +
                        (best.empty() ? "" : "; did you mean '" + best + "'?") +
                        " (configs/clusters/README.md lists the keys)");
    };
    if (preset_ != nullptr)
      for (const std::string& k : preset_->unknown_keys()) complain(*preset_, k);
    for (const std::string& k : run_.unknown_keys())
      if (k.rfind("cluster.", 0) == 0) complain(run_, k);
  }

 private:
  static std::string run_key(std::string_view k) { return "cluster." + std::string(k); }
  bool in_run(std::string_view k) const { return preset_ == nullptr || run_.has(run_key(k)); }
  const Config& src(std::string_view k) const { return in_run(k) ? run_ : *preset_; }
  std::string full(std::string_view k) const { return in_run(k) ? run_key(k) : std::string(k); }
  /// The layer to read k from; the key counts as read in both, so an overridden preset key is
  /// not reported as unknown.
  const Config& use(std::string_view k) const {
    run_.mark_used(run_key(k));
    if (preset_ != nullptr) preset_->mark_used(k);
    return src(k);
  }

  const Config& run_;
  const Config* preset_;
};

Topology read_topology(const Layers& in, int nodes) {
  std::vector<std::string> names = in.get_string_list("topology.levels", {});
  std::vector<std::int64_t> sizes = in.get_int_list("topology.sizes", {});
  std::vector<std::string> tiers = in.get_string_list("topology.tiers", {});
  const std::string node_tier = in.get_string("topology.node_tier", "inter-node");
  const std::string count = std::to_string(names.size());
  if (sizes.size() != names.size())
    in.fail("topology.sizes", count + " sizes, one per entry of topology.levels",
            std::to_string(sizes.size()));
  if (tiers.size() != names.size())
    in.fail("topology.tiers", count + " tier names, one per entry of topology.levels",
            std::to_string(tiers.size()));
  std::vector<TopologyLevel> levels;
  std::set<std::string> seen;
  std::int64_t ranks_per_node = 1;
  for (size_t k = 0; k < names.size(); ++k) {
    if (names[k].empty() || names[k] == "node" || !seen.insert(names[k]).second)
      in.fail("topology.levels", "distinct level names other than \"node\"",
              "\"" + names[k] + "\"");
    if (sizes[k] < 1 || sizes[k] > 4096)
      in.fail("topology.sizes", "sizes in [1, 4096]", std::to_string(sizes[k]));
    ranks_per_node *= sizes[k];
    levels.push_back({names[k], static_cast<int>(sizes[k]), tiers[k]});
  }
  if (ranks_per_node * nodes > (std::int64_t{1} << 20))
    in.fail("nodes", "at most 2^20 ranks in all",
            std::to_string(nodes) + " nodes x " + std::to_string(ranks_per_node) + " ranks");
  levels.push_back({"node", nodes, node_tier});
  return Topology(std::move(levels));
}

// Parses "a-b" into two local ranks in [0, n).
std::pair<int, int> parse_pair(const Layers& in, const std::string& key, const std::string& s,
                               int n) {
  const std::string expected = "pairs \"a-b\" of local ranks in [0, " + std::to_string(n - 1) + "]";
  const size_t dash = s.find('-');
  int a = -1, b = -1;
  auto parse = [](std::string_view t, int& v) {
    auto [p, ec] = std::from_chars(t.data(), t.data() + t.size(), v);
    return ec == std::errc() && p == t.data() + t.size();
  };
  if (dash == std::string::npos || !parse(std::string_view(s).substr(0, dash), a) ||
      !parse(std::string_view(s).substr(dash + 1), b))
    in.fail(key, expected, "\"" + s + "\"");
  for (int r : {a, b})
    if (r < 0 || r >= n)
      in.fail(key, expected,
              "\"" + s + "\": local rank " + std::to_string(r) + " does not exist (a node has " +
                  std::to_string(n) + " ranks)");
  if (a == b) in.fail(key, expected, "\"" + s + "\": a link from a rank to itself");
  return {a, b};
}

int level_index(const Layers& in, const std::string& key, const Topology& topo) {
  const std::string name = in.get_string(key, "");
  std::string list;
  for (int k = 0; k + 1 < topo.num_levels(); ++k) {
    if (topo.level(k).name == name) return k;
    list += (list.empty() ? "" : " | ") + topo.level(k).name;
  }
  in.fail(key, "a level below the node: " + (list.empty() ? std::string("(none)") : list),
          "\"" + name + "\"");
}

void add_link_classes(const Layers& in, ClusterGraph& g) {
  const Topology& topo = g.topology();
  const int rpn = topo.ranks_per_node();
  const int nodes = topo.num_nodes();
  const std::string default_tier =
      topo.num_levels() > 1 ? topo.tier_name(topo.num_levels() - 2) : topo.tier_name(0);
  for (const std::string& name : in.subkeys("links")) {
    const std::string p = "links." + name + ".";
    const std::string kind = in.choice(p + "kind", "", {"pair", "switch", "direct"});
    const std::int64_t count = in.get_int(p + "count", 1, 1, 4096);
    const double bw =
        in.bandwidth_bytes_per_s(p + "bandwidth_gbytes_per_s") * static_cast<double>(count);
    const SimTime lat = in.latency(p + "latency_ns");
    if (kind != "switch" && in.has(p + "pair_bandwidth_gbytes_per_s"))
      in.fail(p + "pair_bandwidth_gbytes_per_s", "no per-pair bandwidth (it is a switch's)",
              "one on a link of kind \"" + kind + "\"");
    if (kind == "direct") {
      std::vector<std::pair<int, int>> pairs;
      for (const std::string& s : in.get_string_list(p + "pairs", {}))
        pairs.push_back(parse_pair(in, p + "pairs", s, rpn));
      if (pairs.empty()) in.fail(p + "pairs", "at least one pair \"a-b\" of local ranks", "none");
      const int cls = g.add_link_class(name, in.get_string(p + "tier", default_tier));
      for (int n = 0; n < nodes; ++n)
        for (auto [a, b] : pairs) g.add_duplex(n * rpn + a, n * rpn + b, lat, bw, cls);
      continue;
    }
    const int k = level_index(in, p + "level", topo);
    const int cls = g.add_link_class(name, in.get_string(p + "tier", topo.tier_name(k)));
    int stride = 1;
    for (int j = 0; j < k; ++j) stride *= topo.level(j).size;
    const int size = topo.level(k).size;
    if (kind == "pair") {
      for (int a = 0; a < topo.num_ranks(); ++a)
        for (int v = topo.coord(a, k) + 1; v < size; ++v)
          g.add_duplex(a, a + (v - topo.coord(a, k)) * stride, lat, bw, cls);
    } else {  // switch: one per group of ranks that share every coordinate above level k
      const int group = stride * size;
      // With a per-pair bandwidth, the switch is a crossbar: each rank's link ends at its own
      // port, and each ordered pair of ports has a link of that bandwidth (no latency), so one
      // pair's flows share it and a lone flow moves at the lesser of the two rates.
      const std::string pair_key = p + "pair_bandwidth_gbytes_per_s";
      const bool crossbar = in.has(pair_key);
      const double pair_bw = crossbar ? in.bandwidth_bytes_per_s(pair_key) : 0;
      const int pair_cls =
          crossbar ? g.add_link_class(name + std::string(kPairLinkSuffix), g.link_class(cls).tier)
                   : -1;
      for (int first = 0; first < topo.num_ranks(); first += group) {
        const int n = topo.node(first);
        const std::string sw_name = in_node(n, name, (first % rpn) / group);
        if (!crossbar) {
          const int sw = g.add_vertex(sw_name, VertexKind::kSwitch, n);
          for (int r = first; r < first + group; ++r) g.add_duplex(r, sw, lat, bw, cls);
          continue;
        }
        std::vector<int> port;
        for (int r = first; r < first + group; ++r) {
          port.push_back(
              g.add_vertex(sw_name + ".port" + std::to_string(r - first), VertexKind::kSwitch, n));
          g.add_duplex(r, port.back(), lat, bw, cls);
        }
        for (int a : port)
          for (int b : port)
            if (a != b) g.add_link(a, b, SimTime{}, pair_bw, pair_cls);
      }
    }
  }
}

void add_nics_and_fabric(const Layers& in, ClusterGraph& g) {
  const Topology& topo = g.topology();
  const int rpn = topo.ranks_per_node();
  const std::string tier = topo.tier_name(topo.num_levels() - 1);
  const int count = static_cast<int>(in.require_int("nic.count", 1, 4096));
  std::vector<std::int64_t> def(static_cast<size_t>(rpn));
  for (int r = 0; r < rpn; ++r) def[static_cast<size_t>(r)] = r % count;
  std::vector<std::int64_t> rank_nic = in.get_int_list("nic.rank_nic", def);
  // The preset's map is for its own GPUs per node: where the run uses fewer (topology.sizes set,
  // nic.rank_nic not), the first ranks keep their NICs; where it uses more, each rank takes NIC
  // rank % count. Only a map the run itself gives must match its ranks exactly.
  if (!in.set_by_run("nic.rank_nic") && static_cast<int>(rank_nic.size()) != rpn)
    rank_nic = static_cast<int>(rank_nic.size()) > rpn
                   ? std::vector<std::int64_t>(rank_nic.begin(), rank_nic.begin() + rpn)
                   : def;
  if (static_cast<int>(rank_nic.size()) != rpn)
    in.fail("nic.rank_nic", "one NIC index per local rank (" + std::to_string(rpn) + ")",
            std::to_string(rank_nic.size()) + " entries");
  for (std::int64_t i : rank_nic)
    if (i < 0 || i >= count)
      in.fail("nic.rank_nic", "NIC indices in [0, " + std::to_string(count - 1) + "]",
              std::to_string(i) +
                  " (that NIC does not exist: nic.count = " + std::to_string(count) + ")");
  const double nic_bw = in.bandwidth_bytes_per_s("nic.bandwidth_gbytes_per_s");
  const SimTime nic_lat = in.latency("nic.latency_ns");
  const double attach_bw = in.bandwidth_bytes_per_s("nic.attach_bandwidth_gbytes_per_s");
  const SimTime attach_lat = in.latency("nic.attach_latency_ns");
  in.choice("fabric.kind", "nonblocking", {"nonblocking"});
  const SimTime fabric_lat = in.latency("fabric.latency_ns");

  const int attach_cls = g.add_link_class("nic-attach", tier);
  const int nic_cls = g.add_link_class("nic", tier);
  const int fabric_cls = g.add_link_class("fabric", tier);
  // The non-blocking core is one unlimited link that carries the fabric's latency.
  const int core_in = g.add_vertex("fabric.in", VertexKind::kSwitch, -1);
  const int core_out = g.add_vertex("fabric.out", VertexKind::kSwitch, -1);
  g.add_link(core_in, core_out, fabric_lat, kUnlimitedBytesPerS, fabric_cls);
  for (int n = 0; n < topo.num_nodes(); ++n) {
    std::vector<int> nic(static_cast<size_t>(count));
    for (int i = 0; i < count; ++i) {
      nic[static_cast<size_t>(i)] = g.add_vertex(in_node(n, "nic", i), VertexKind::kNic, n);
      g.add_link(nic[static_cast<size_t>(i)], core_in, nic_lat, nic_bw, nic_cls);
      g.add_link(core_out, nic[static_cast<size_t>(i)], nic_lat, nic_bw, nic_cls);
    }
    for (int r = 0; r < rpn; ++r)
      g.add_duplex(n * rpn + r, nic[static_cast<size_t>(rank_nic[static_cast<size_t>(r)])],
                   attach_lat, attach_bw, attach_cls);
  }
}

// reference_host.csv (bench/fidelity/models/host_counts.py): model,scope,calls,counted_us. Each
// block's host time: counted_us + calls x per_call, taken `scale` times (device.host.scale).
std::map<std::string, SimTime, std::less<>> read_reference_host(const std::filesystem::path& file,
                                                                double per_call, double scale,
                                                                const std::string& where) {
  std::ifstream in(file);
  if (!in)
    throw ConfigError(where + ": device.host.reference: cannot read " + file.string() +
                      " (a directory holding reference_host.csv)");
  std::map<std::string, SimTime, std::less<>> out;
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    ++n;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || line[0] == '#' || (n == 1 && line == "model,scope,calls,counted_us"))
      continue;
    std::vector<std::string> f;
    std::stringstream ss(line);
    for (std::string x; std::getline(ss, x, ',');) f.push_back(x);
    double calls = -1, us = -1;
    if (f.size() == 4) {
      const auto num = [](const std::string& s, double& v) {
        const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
        return ec == std::errc{} && end == s.data() + s.size() && v >= 0 && v < 1e9;
      };
      if (!num(f[2], calls) || !num(f[3], us)) calls = -1;
    }
    if (calls < 0 || f[0].empty() || f[1].empty())
      throw ConfigError(file.string() + ":" + std::to_string(n) +
                        ": expected model,scope,calls,counted_us (names, then two numbers >= 0), "
                        "found \"" +
                        line.substr(0, 120) + "\"");
    out[f[0] + "/" + f[1]] = SimTime::from_seconds((us + calls * per_call) * 1e-6 * scale);
  }
  if (out.empty()) throw ConfigError(file.string() + ": no rows (model,scope,calls,counted_us)");
  return out;
}

// Per kind of op: efficiencies, overlap weight, strided and kernel-grid factors.
void read_op_kind_factors(const Layers& in, RooflineParams& d) {
  for (int k = 0; k < kNumOpKinds; ++k) {
    const std::string kind(op_kind_name(static_cast<OpKind>(k)));
    d.compute_efficiency[static_cast<size_t>(k)] =
        in.efficiency("device.compute_efficiency." + kind);
    d.memory_efficiency[static_cast<size_t>(k)] = in.efficiency("device.memory_efficiency." + kind);
    d.overlap_kind_weight[static_cast<size_t>(k)] =
        in.get_double("device.overlap_kind_weight." + kind, 1.0, 0.0, 100.0);
    d.strided_factor[static_cast<size_t>(k)] =
        in.get_double("device.strided_factor." + kind, 1.0, 0.1, 100.0);
    d.grid_scale[static_cast<size_t>(k)] =
        in.get_double("device.grid_scale." + kind, 1.0, 0.2, 5.0);
  }
}

// [device.overlap_by_group.N]: overlap factors for groups of N ranks, defaulting to the
// device-wide ones (read before this).
void read_overlap_by_group(const Layers& in, RooflineParams& d) {
  for (const std::string& group : in.subkeys("device.overlap_by_group")) {
    const std::string k = "device.overlap_by_group." + group;
    int ranks = 0;
    const auto [end, ec] = std::from_chars(group.data(), group.data() + group.size(), ranks);
    if (ec != std::errc{} || end != group.data() + group.size() || ranks < 2 || ranks > (1 << 20))
      in.fail(k, "a number of ranks (2 or more) as the key", "\"" + group + "\"");
    RooflineParams::OverlapFactors f;
    f.compute = in.get_double(k + ".compute_factor", d.overlap_compute_factor, 1.0, 100.0);
    f.transfer = in.get_double(k + ".transfer_factor", d.overlap_transfer_factor, 1.0, 100.0);
    d.overlap_by_group[ranks] = f;
  }
}

// [device.kernels.NAME]: measured kernel times by FLOP count, sizes ascending.
void read_kernel_tables(const Layers& in, RooflineParams& d) {
  for (const std::string& name : in.subkeys("device.kernels")) {
    const std::string k = "device.kernels." + name;
    KernelTable t;
    t.flops = in.get_double_list(k + ".flops", {});
    const std::vector<double> us = in.get_double_list(k + ".time_us", {});
    t.source = in.get_string(k + ".source", "");
    if (t.flops.empty() || us.size() != t.flops.size())
      in.fail(
          k + ".time_us", "one time per entry of " + k + ".flops (at least one)",
          std::to_string(us.size()) + " times for " + std::to_string(t.flops.size()) + " sizes");
    for (size_t i = 0; i < us.size(); ++i) {
      if (!(t.flops[i] > 0) || (i > 0 && !(t.flops[i] > t.flops[i - 1])))
        in.fail(k + ".flops", "FLOP counts > 0 in ascending order", number(t.flops[i]));
      if (!(us[i] > 0)) in.fail(k + ".time_us", "times > 0 (microseconds)", number(us[i]));
      t.time_s.push_back(us[i] * 1e-6);
    }
    d.kernels.emplace(name, std::move(t));
  }
}

// device.grid: kernel grids by shape, from directories relative to the file that names them;
// a grid_scale other than 1 needs them.
void read_kernel_grids(const Layers& in, RooflineParams& d) {
  if (in.has("device.grid")) {
    d.grid_dirs = in.get_string_list("device.grid", {});
    if (d.grid_dirs.empty() || d.grid_dirs.size() > 16)
      in.fail("device.grid",
              "1 to 16 directories of kernel grids (gemm.csv, attention.csv, memory.csv)",
              std::to_string(d.grid_dirs.size()) + " entries");
    std::vector<std::filesystem::path> dirs;
    for (const std::string& g : d.grid_dirs) {
      const std::filesystem::path p(g);
      dirs.push_back(p.is_absolute() ? p : in.directory("device.grid") / p);
    }
    try {
      d.grid = KernelGrid::load(dirs);
    } catch (const InputError& e) {
      throw ConfigError(in.where("device.grid") + ": device.grid: " + e.what());
    }
  }
  if (d.grid == nullptr)  // 1 (what a resolved config writes for every device) scales nothing
    for (int k = 0; k < kNumOpKinds; ++k)
      if (d.grid_scale[static_cast<size_t>(k)] != 1.0)
        in.fail("device.grid_scale." + std::string(op_kind_name(static_cast<OpKind>(k))),
                "a device with kernel grids (device.grid): the factor scales their times",
                "no device.grid");
}

// A host cost given in microseconds at key k (0 if absent), taken `scale` times.
SimTime scaled_us(const Layers& in, const std::string& k, double scale) {
  return SimTime::from_seconds(in.get_double(k, 0.0, 0.0, 1e6) * 1e-6 * scale);
}

// device.host.range: the lowest and highest host scales this device is run at, if given.
void read_host_range(const Layers& in, HostParams& host) {
  const std::vector<double> range = in.get_double_list("device.host.range", {});
  if (range.empty()) return;
  if (range.size() != 2 || !(range[0] >= 0.1) || !(range[1] <= 10.0) || !(range[0] <= range[1]))
    in.fail("device.host.range", "[lowest, highest]: two host scales from 0.1 to 10, lowest first",
            std::to_string(range.size()) + " values" +
                (range.size() == 2 ? " (" + number(range[0]) + ", " + number(range[1]) + ")"
                                   : std::string()));
  host.range_low = range[0];
  host.range_high = range[1];
}

// device.host.framework and [device.host.inductor]: how the host issues a step's ops.
void read_host_framework(const Layers& in, HostParams& host) {
  // A framework that captures the step (CUDA graphs, torch.compile) takes the host off the
  // critical path: no op issue cost; a collective call still costs its issue. "reference": each
  // block at the host time its reference implementation takes, counted.
  const std::string framework =
      in.choice("device.host.framework", "eager", {"eager", "compiled", "inductor", "reference"});
  host.framework = framework == "compiled"    ? HostParams::Framework::kCompiled
                   : framework == "inductor"  ? HostParams::Framework::kInductor
                   : framework == "reference" ? HostParams::Framework::kReference
                                              : HostParams::Framework::kEager;
  // torch.compile's default mode: memory-bound kernels fused, each op launched by the compiled
  // graph's wrapper. Both figures are a device's own measurement; none is assumed.
  const bool fusion_given = in.has("device.host.inductor.fusion");
  const bool launch_given = in.has("device.host.inductor.launch_us");
  if (fusion_given != launch_given)
    in.fail(fusion_given ? "device.host.inductor.launch_us" : "device.host.inductor.fusion",
            "both device.host.inductor.fusion and device.host.inductor.launch_us", "one of them");
  host.has_inductor = fusion_given;
  if (fusion_given) {
    host.inductor_fusion = in.get_double("device.host.inductor.fusion", 1.0, 0.05, 1.0);
    host.inductor_launch = scaled_us(in, "device.host.inductor.launch_us", host.scale);
  }
  if (host.framework == HostParams::Framework::kInductor && !host.has_inductor)
    in.fail("device.host.framework",
            "\"eager\", \"compiled\" or \"reference\" on a device without [device.host.inductor] "
            "(fusion and launch_us, fitted to torch.compile forwards on that device)",
            "\"inductor\"");
}

// device.host.reference: the counted host time of each block's reference implementation.
void read_host_reference(const Layers& in, HostParams& host) {
  const double per_call = in.get_double("device.host.call_overhead_us", 0.0, 0.0, 1000.0);
  if (in.has("device.host.reference")) {
    const std::filesystem::path dir =
        in.directory("device.host.reference") / in.get_string("device.host.reference", "");
    host.reference = read_reference_host(dir / "reference_host.csv", per_call, host.scale,
                                         in.where("device.host.reference"));
  }
  if (host.framework == HostParams::Framework::kReference && host.reference.empty())
    in.fail("device.host.framework",
            "\"eager\", \"compiled\" or \"inductor\", or a device.host.reference directory beside "
            "\"reference\" (the host profile of the models' reference implementations)",
            "\"reference\" without device.host.reference");
}

// [device.host]: the host's issue costs, its framework and its per-kernel-class costs.
void read_host(const Layers& in, HostParams& host) {
  // This machine's host against the preset's: every issue cost taken `scale` times.
  host.scale = in.get_double("device.host.scale", 1.0, 0.1, 10.0);
  read_host_range(in, host);
  host.op_issue = scaled_us(in, "device.host.op_issue_us", host.scale);
  host.collective_issue = scaled_us(in, "device.host.collective_issue_us", host.scale);
  host.per_rank_slowdown = in.get_double("device.host.per_rank_slowdown", 0.0, 0.0, 10.0);
  host.sync_slowdown = in.get_double("device.host.sync_slowdown", 0.0, 0.0, 10.0);
  host.step_factor = in.get_double("device.host.step_factor", 1.0, 0.1, 10.0);
  for (const std::string& label : in.subkeys("device.host.ops"))
    host.ops.emplace(label, scaled_us(in, "device.host.ops." + label, host.scale));
  read_host_framework(in, host);
  read_host_reference(in, host);
  for (const std::string& name : in.subkeys("device.host.kernels")) {
    const std::optional<KernelClass> c = kernel_class_of(name);
    if (!c)
      in.fail("device.host.kernels." + name,
              "a kernel class (gemm, sdpa, layernorm, rms_norm, "
              "rms_norm_unfused, rope_real, modulate_eager, ...: core/op_cost.hpp)",
              name);
    host.kernels[static_cast<size_t>(*c)] =
        scaled_us(in, "device.host.kernels." + name, host.scale);
  }
}

// [device]: the roofline of one device and its host.
RooflineParams read_device(const Layers& in, const std::string& cluster_name) {
  RooflineParams d;
  d.name = in.get_string("device.name", cluster_name + " device");
  d.peak_flops_per_s = in.physical("device.peak_tflops", "peak", "TFLOP/s", 1e-3, 1e6) * 1e12;
  d.hbm_bytes_per_s = in.physical("device.hbm_gbytes_per_s", "bandwidth", "GB/s", 1e-3, 1e6) * 1e9;
  d.launch_overhead =
      SimTime::from_ns(in.get_int("device.launch_overhead_ns", 0, 0, std::int64_t{1} << 40));
  read_op_kind_factors(in, d);
  d.overlap_compute_factor = in.get_double("device.overlap_compute_factor", 1.0, 1.0, 100.0);
  d.overlap_transfer_factor = in.get_double("device.overlap_transfer_factor", 1.0, 1.0, 100.0);
  read_overlap_by_group(in, d);
  d.rank_spread = in.get_double("device.rank_spread", 0.0, 0.0, 0.2);
  d.step_factor = in.get_double("device.step_factor", 1.0, 0.1, 10.0);
  read_kernel_tables(in, d);
  read_kernel_grids(in, d);
  read_host(in, d.host);
  return d;
}

// The collective library: [library] preset = "nccl" names configs/libraries/nccl.toml, whose
// keys any key of [library] overrides; no [library] section means the free `ideal` model.
LibraryModel read_library(const Layers& in, const std::filesystem::path& preset_dir) {
  LibraryModel lib;
  if (!in.has("library")) return lib;
  std::optional<Config> file;
  if (in.has("library.preset")) {
    const std::string name = in.get_string("library.preset", "ideal");
    const std::filesystem::path path = preset_dir.parent_path() / "libraries" / (name + ".toml");
    std::error_code ec;
    if (name.find('/') != std::string::npos || !std::filesystem::exists(path, ec))
      in.fail("library.preset", "a library preset of " + path.parent_path().string(),
              "\"" + name + "\"");
    file = Config::load(path);
    lib.name = name;
  }
  // A key of [library] wins over the library preset's.
  auto has = [&](const std::string& k) { return in.has("library." + k) || (file && file->has(k)); };
  auto num = [&](const std::string& k, double def, double lo, double hi) {
    if (in.has("library." + k)) return in.get_double("library." + k, def, lo, hi);
    return file ? file->get_double(k, def, lo, hi) : def;
  };
  auto us = [&](const std::string& k) { return SimTime::from_seconds(num(k, 0, 0, 1e9) * 1e-6); };
  auto bytes = [&](const std::string& k) {
    return static_cast<std::int64_t>(num(k, -1, -1, 1e18));
  };
  // An algorithm's name, checked against the registry, stored as it is registered.
  auto algo = [&](const std::string& k, emu::collectives::CollectiveKind kind,
                  const std::string& def) {
    if (!has(k)) return def;
    const bool mine = in.has("library." + k);
    const std::string v = mine ? in.get_string("library." + k, "") : file->get_string(k, "");
    const emu::collectives::AlgorithmId id = emu::collectives::find_algorithm(kind, v);
    if (id < 0) {
      const std::string expected = emu::collectives::algorithm_list(kind);
      if (mine) in.fail("library." + k, expected, "\"" + v + "\"");
      throw ConfigError(file->where(k), k, expected, "\"" + v + "\"");
    }
    return emu::collectives::algorithm(id).name;
  };
  if (has("name"))
    lib.name = in.has("library.name") ? in.get_string("library.name", lib.name)
                                      : file->get_string("name", lib.name);
  lib.call_overhead = us("call_overhead_us");
  lib.message_overhead = us("message_overhead_us");
  lib.eager_max_bytes = bytes("eager_max_bytes");
  lib.eager_overhead = us("eager_overhead_us");
  lib.eager_copy_bytes_per_s = num("eager_copy_gbytes_per_s", 0, 0, 1e6) * 1e9;
  lib.local_copy_bytes_per_s = num("local_copy_gbytes_per_s", 0, 0, 1e6) * 1e9;
  lib.rendezvous_overhead = us("rendezvous_overhead_us");
  lib.chunk_bytes = std::max<std::int64_t>(0, bytes("chunk_bytes"));
  lib.chunk_overhead = us("chunk_overhead_us");
  using emu::collectives::CollectiveKind;
  lib.all_to_all_large = algo("all_to_all", CollectiveKind::kAllToAll, lib.all_to_all_large);
  lib.all_to_all_small = algo("all_to_all_small", CollectiveKind::kAllToAll, lib.all_to_all_large);
  lib.all_to_all_small_max_bytes = bytes("all_to_all_small_max_bytes");
  lib.all_gather = algo("all_gather", CollectiveKind::kAllGather, lib.all_gather);
  lib.all_reduce = algo("all_reduce", CollectiveKind::kAllReduce, lib.all_reduce);
  lib.barrier = algo("barrier", CollectiveKind::kBarrier, lib.barrier);
  // Keys that [library] overrides count as read in the preset file too.
  for (std::string_view k :
       {"description", "source", "name", "call_overhead_us", "message_overhead_us",
        "eager_max_bytes", "eager_overhead_us", "eager_copy_gbytes_per_s", "rendezvous_overhead_us",
        "chunk_bytes", "chunk_overhead_us", "all_to_all", "all_to_all_small",
        "all_to_all_small_max_bytes", "all_gather", "all_reduce", "barrier",
        "local_copy_gbytes_per_s"})
    if (file && file->has(k)) file->mark_used(k);
  if (file) {
    file->check_no_unknown_keys();
    in.adopt_effective("library", *file);
  }
  return lib;
}

}  // namespace

std::filesystem::path resolve_cluster_preset(const std::string& name_or_path,
                                             const std::filesystem::path& config_dir,
                                             const std::filesystem::path& preset_dir,
                                             const std::string& where) {
  namespace fs = std::filesystem;
  std::error_code ec;
  std::vector<fs::path> tried;
  if (name_or_path.find('/') != std::string::npos ||
      fs::path(name_or_path).extension() == ".toml") {
    fs::path p(name_or_path);
    tried.push_back(p.is_absolute() ? p : config_dir / p);
    // A relative path given on the command line (--set cluster.preset=fit.toml) means the
    // working directory's file when the config's directory has none.
    if (!p.is_absolute() && fs::current_path(ec) / p != tried.front())
      tried.push_back(fs::current_path(ec) / p);
  } else if (!name_or_path.empty()) {
    tried.push_back(config_dir / "clusters" / (name_or_path + ".toml"));
    tried.push_back(preset_dir / (name_or_path + ".toml"));
  }
  for (const fs::path& p : tried)
    if (fs::is_regular_file(p, ec)) return p;
  std::set<std::string> known;
  for (const fs::path& dir : {config_dir / "clusters", preset_dir})
    if (fs::is_directory(dir, ec))
      for (const fs::directory_entry& e : fs::directory_iterator(dir, ec))
        if (e.path().extension() == ".toml") known.insert(e.path().stem().string());
  std::string expected = "a preset name (";
  for (const std::string& k : known) expected += (expected.back() == '(' ? "" : ", ") + k;
  expected += ") or a path to a cluster .toml file";
  std::string found = "\"" + name_or_path + "\"";
  if (!tried.empty()) {
    found += " (looked for";
    for (const fs::path& p : tried) found += " " + p.string();
    found += ")";
  }
  if (const std::string best =
          closest_match(name_or_path, std::vector<std::string>(known.begin(), known.end()));
      !best.empty())
    found += "; did you mean '" + best + "'?";
  throw ConfigError(where, "cluster.preset", expected, found);
}

std::unique_ptr<NetworkModel> make_network_model(const std::string& kind,
                                                 std::shared_ptr<const ClusterGraph> graph) {
  if (kind == "maxmin") return std::make_unique<MaxMinModel>(std::move(graph));
  if (kind == "alpha-beta") return std::make_unique<AlphaBetaModel>(std::move(graph));
  throw ConfigError("network model \"" + kind + "\": expected maxmin or alpha-beta");
}

Config load_cluster_config(const std::string& file_or_preset,
                           const std::filesystem::path& preset_dir) {
  std::error_code ec;
  std::filesystem::path file = file_or_preset;
  if (!std::filesystem::exists(file, ec) && file_or_preset.find('/') == std::string::npos &&
      file.extension() != ".toml")
    file = resolve_cluster_preset(file_or_preset, std::filesystem::current_path(), preset_dir,
                                  "command line");
  Config c = Config::load(file);
  if (c.has("cluster")) return c;
  toml::table t{{"cluster", toml::table{{"preset", std::filesystem::absolute(file).string()}}}};
  std::ostringstream os;
  os << t;
  return Config::parse(os.str(), file.string());
}

Cluster load_cluster(const Config& cfg, const std::filesystem::path& preset_dir) {
  Cluster c;
  std::optional<Config> preset;
  if (cfg.has("cluster.preset")) {
    const std::string name = cfg.get_string("cluster.preset", "");
    const std::filesystem::path file =
        resolve_cluster_preset(name, cfg.directory(), preset_dir, cfg.where("cluster.preset"));
    preset = Config::load(file);
    c.source = file.string();
    c.name = file.stem().string();
  } else {
    c.source = cfg.source();
    c.name = "cluster";
    cfg.mark_used("cluster");  // an empty or missing section still counts as read
  }
  const Layers in(cfg, preset ? &*preset : nullptr);
  c.name = in.get_string("name", c.name);
  c.description = in.get_string("description", "");
  c.network_kind = in.choice("network", "maxmin", {"maxmin", "alpha-beta"});
  const int nodes = static_cast<int>(in.get_int("nodes", 1, 1, 1 << 20));
  c.topology = read_topology(in, nodes);

  auto graph = std::make_shared<ClusterGraph>(c.topology);
  add_link_classes(in, *graph);
  if (in.has("nic"))
    add_nics_and_fabric(in, *graph);
  else if (in.has("fabric"))  // read with the NICs: without them it would be an "unknown key"
    in.fail("fabric", "a [nic] section beside it (the NICs that connect the nodes to the fabric)",
            "[fabric] without [nic]");
  c.device_params = read_device(in, c.name);
  c.library = read_library(in, preset_dir);
  in.check_no_unknown_keys();
  if (auto bad = graph->find_unreachable_pair()) {
    throw ConfigError(c.source + ": cluster '" + c.name +
                      "': " + c.topology.describe_rank(bad->first) + " has no route to " +
                      c.topology.describe_rank(bad->second) +
                      (c.topology.num_nodes() > 1 && !in.has("nic")
                           ? " (nodes > 1 needs a [nic] section to join the nodes)"
                           : " (add links that reach every rank)"));
  }
  c.graph = std::move(graph);
  c.network = make_network_model(c.network_kind, c.graph);
  c.device = std::make_shared<RooflineDevice>(c.device_params);
  if (preset) cfg.adopt_effective("cluster", *preset);  // every value, for validate --dump
  return c;
}

}  // namespace cocodiff
