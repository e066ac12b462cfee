#include "calibrate/eager_fit.hpp"

#include <algorithm>
#include <cmath>
#include <utility>

#include "calibrate/least_squares.hpp"
#include "core/errors.hpp"

namespace cocodiff::calibrate {

namespace {

// The PyTorch op (measure_multi.py's `op`, `label` columns) whose device time is each label's
// work. Labels of the same shape share a table: K and V are projected as Q is, the text
// stream's output projection as the image's, the single block's MLP input as the double
// block's.
struct DeviceSource {
  const char* label;
  std::vector<std::pair<const char*, const char*>> rows;  // (op, measured label)
};
const std::vector<DeviceSource>& device_sources() {
  static const std::vector<DeviceSource> kSources = {
      {"q_proj", {{"linear", "q_proj"}, {"linear_heads", "q_proj_heads"}}},
      {"attn_out", {{"linear", "attn_out"}}},
      {"mlp_fc1", {{"linear", "mlp_fc1"}}},
      {"mlp_fc2", {{"linear", "mlp_fc2"}}},
      {"proj_out", {{"linear", "proj_out"}}},
      {"q_norm", {{"rms_norm", "q_norm"}}},
      {"q_rope", {{"rope", "q_rope"}}},
      {"attention", {{"sdpa", "attention"}}},
  };
  return kSources;
}
const std::vector<std::pair<const char*, const char*>>& device_aliases() {
  static const std::vector<std::pair<const char*, const char*>> kAliases = {
      {"k_proj", "q_proj"},    {"v_proj", "q_proj"}, {"attn_add_out", "attn_out"},
      {"proj_mlp", "mlp_fc1"}, {"k_norm", "q_norm"}, {"k_rope", "q_rope"}};
  return kAliases;
}

// The PyTorch op whose host issue time each label costs. Every projection is one F.linear;
// LayerNorm + modulation is one PyTorch function (norm_modulate) that cocodiff charges as two
// ops: the norm takes one normalisation kernel's cost (rms_norm's, as F.layer_norm is one
// kernel), the modulation the rest (`modulate` below). Ulysses' layout changes are a permute
// and a contiguous copy (unpack), concatenations torch.cat (the head groups' received in
// pipelined Ulysses too: chunk_concat), the output split a view (pack).
const std::vector<std::pair<const char*, const char*>>& host_sources() {
  static const std::vector<std::pair<const char*, const char*>> kSources = {
      {"q_proj", "linear"},
      {"k_proj", "linear"},
      {"v_proj", "linear"},
      {"attn_out", "linear"},
      {"attn_add_out", "linear"},
      {"mlp_fc1", "linear"},
      {"mlp_fc2", "linear"},
      {"proj_mlp", "linear"},
      {"proj_out", "linear"},
      {"x_embedder", "linear"},
      {"context_embedder", "linear"},
      {"embed_fc1", "linear"},
      {"embed_fc2", "linear"},
      {"adaln", "adaln"},
      {"q_norm", "rms_norm"},
      {"k_norm", "rms_norm"},
      {"q_rope", "rope"},
      {"k_rope", "rope"},
      {"attention", "sdpa"},
      {"mlp_gelu", "gelu"},
      {"residual", "gated_residual"},
      {"norm", "rms_norm"},
      {"norm1", "rms_norm"},
      {"norm1_context", "rms_norm"},
      {"norm2", "rms_norm"},
      {"norm2_context", "rms_norm"},
      {"norm_out", "rms_norm"},
      {"a2a_pack", "unpack"},
      {"a2a_unpack", "unpack"},
      {"gather_unpack", "unpack"},
      {"q_concat", "concat"},
      {"k_concat", "concat"},
      {"v_concat", "concat"},
      {"chunk_concat", "concat"},
      {"attn_mlp_concat", "concat"},
      {"o_split", "pack"}};
  return kSources;
}

/// The device's kernel tables, per label and alias, from the ops' device times.
void fit_device_tables(const std::vector<EagerOpPoint>& ops, EagerFit& f) {
  // Device tables: the rows of each label's sources, keyed by FLOPs, equal counts averaged in
  // log time.
  for (const DeviceSource& src : device_sources()) {
    std::map<double, std::pair<double, int>> pts;  // flops -> (sum of log time, count)
    std::string names;
    for (const auto& [op, label] : src.rows) {
      names += (names.empty() ? "" : ", ") + std::string(op) + " " + label;
      for (const EagerOpPoint& p : ops) {
        if (p.op != op || p.label != label || p.device_us <= 0 || p.flops <= 0) continue;
        auto& [sum, n] = pts[p.flops];
        sum += std::log(p.device_us);
        ++n;
      }
    }
    if (pts.empty()) continue;
    KernelTableFit& t = f.tables[src.label];
    for (const auto& [flops, acc] : pts) {
      t.flops.push_back(flops);
      t.time_us.push_back(std::exp(acc.first / acc.second));
    }
    f.table_from[src.label] = names;
  }
  for (const auto& [label, source] : device_aliases()) {
    const auto it = f.tables.find(source);
    if (it == f.tables.end()) continue;
    f.tables[label] = it->second;  // std::map: inserting keeps `it` valid
    f.table_from[label] = f.table_from.at(source);
  }
}

/// The median host time of `op`, or -1 (`op` then listed in `missing`, once).
double host_cost(const std::map<std::string, std::vector<double>>& host, const std::string& op,
                 std::vector<std::string>& missing) {
  auto it = host.find(op);
  if (it == host.end()) {
    if (std::find(missing.begin(), missing.end(), op) == missing.end()) missing.push_back(op);
    return -1;
  }
  return median(it->second);
}

/// The host's issue costs: per label, the modulation's, and the medians of ops and collectives.
void fit_host_costs(const std::vector<EagerOpPoint>& ops, EagerFit& f) {
  // Host issue costs: the median over every point of the op (every machine given).
  std::map<std::string, std::vector<double>> host;
  for (const EagerOpPoint& p : ops)
    if (p.host_us > 0) host[p.op].push_back(p.host_us);
  if (host.empty()) return;
  for (const auto& [label, op] : host_sources()) {
    const double c = host_cost(host, op, f.missing);
    if (c > 0) f.host_ops[label] = c;
  }
  const double nm = host_cost(host, "norm_modulate", f.missing),
               norm = host_cost(host, "rms_norm", f.missing);
  if (nm > 0 && norm > 0) {
    if (nm <= norm)
      throw InputError("calibrate: the host time of norm_modulate (" + std::to_string(nm) +
                       " us) is not above rms_norm's (" + std::to_string(norm) +
                       " us), so the modulation's share of it cannot be told apart");
    f.host_ops["modulate"] = nm - norm;
  }
  std::vector<double> all;
  all.reserve(f.host_ops.size());
  for (const auto& [label, c] : f.host_ops) all.push_back(c);
  if (!all.empty()) f.op_issue_us = median(all);
  std::vector<double> coll;
  for (const char* op : {"all_to_all", "all_gather"})
    if (host.count(op) > 0) coll.push_back(median(host[op]));
  if (!coll.empty()) f.collective_issue_us = median(coll);
}

/// The kinds' overlap weights, from the kernels measured beside `top`'s all-to-all.
void fit_kind_weights(const std::vector<InterferencePoint>& interference,
                      const InterferencePoint& top, EagerFit& f) {
  // Other kernels beside the same all-to-all of the same file: their share of the GEMM's
  // slowdown, by the kinds cocodiff charges them as.
  const std::string file = top.where.substr(0, top.where.rfind(": "));
  const double gemm = f.overlap_compute - 1.0;
  for (const InterferencePoint& p : interference) {
    if (gemm <= 1e-9 || p.world != top.world || p.bytes != top.bytes ||
        p.where.substr(0, p.where.rfind(": ")) != file || !(p.kernel_alone_us > 0))
      continue;
    std::vector<std::string> kinds;
    if (p.kernel.rfind("attention", 0) == 0) kinds = {"attention"};
    if (p.kernel.rfind("qk_norm", 0) == 0) kinds = {"norm", "elementwise"};
    const double w = std::clamp((p.kernel_with_us / p.kernel_alone_us - 1.0) / gemm, 0.0, 100.0);
    for (const std::string& k : kinds) {
      f.kind_weights[k] = w;
      f.kind_weight_from[k] = p.where;
    }
  }
}

/// The overlap factors: the device's, each group size's and each kind's weight.
void fit_interference(const std::vector<InterferencePoint>& interference, EagerFit& f) {
  // Interference: per group size, the largest all-to-all measured beside a GEMM; the largest
  // group's factors are the device's, the others' their group's own.
  std::map<int, const InterferencePoint*> best;
  for (const InterferencePoint& p : interference) {
    if (p.kernel.rfind("gemm", 0) != 0) continue;
    const InterferencePoint*& b = best[p.world];
    if (b == nullptr || p.bytes > b->bytes) b = &p;
  }
  if (best.empty()) return;
  const InterferencePoint& top = *best.rbegin()->second;
  f.overlap_compute = top.kernel_with_us / top.kernel_alone_us;
  f.overlap_transfer = top.a2a_with_us / top.a2a_alone_us;
  f.interference_from = top.where;
  for (const auto& [world, p] : best)
    if (world >= 2 && p != &top)
      f.overlap_by_group[world] = {p->kernel_with_us / p->kernel_alone_us,
                                   p->a2a_with_us / p->a2a_alone_us, p->where};
  fit_kind_weights(interference, top, f);
}

}  // namespace

EagerFit fit_eager(const std::vector<EagerOpPoint>& ops,
                   const std::vector<InterferencePoint>& interference) {
  EagerFit f;
  fit_device_tables(ops, f);
  fit_host_costs(ops, f);
  fit_interference(interference, f);
  return f;
}

}  // namespace cocodiff::calibrate
