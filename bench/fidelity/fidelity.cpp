// Every prediction the hgx-h100 preset makes against every measurement shipped with it
// (configs/measurements/h100): kernels by shape, single-rank NCCL calls by size, device copies,
// and the one interference pair. One table, one summary per group.
//   fidelity [--cluster hgx-h100] [--measurements DIR] [--out DIR]
//     -> DIR/fidelity.csv, DIR/fidelity.json, and DIR/kernels_cocodiff.csv: the measured kernels
//        as the ops cocodiff charges (op,kind,flops,bytes,time_us), what `cocodiff calibrate`
//        reads to fit a device's roofline and kernel tables
//
// Kernels are predicted three ways, each with the OpCost cocodiff charges for that op
// (dit/layers.cpp: a linear is 2*N*in*out FLOPs over its operands, bf16):
//   roofline  the preset without its [device.kernels.*] tables;
//   table     the preset as shipped (its tables were made from these very points, so this
//             shows the interpolation reproduces them, not that it predicts);
//   held out  the preset with the predicted point removed from its table: what the table
//             predicts for a shape it was not given (falls back to the roofline at a table's
//             ends). This is the figure to read as the kernel model's error.

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "bench/common/bench_util.hpp"
#include "core/config.hpp"
#include "net_models/cluster.hpp"
#include "net_models/device_model.hpp"

namespace {

using namespace cocodiff;
namespace fs = std::filesystem;

constexpr double kHidden = 3072, kMlp = 12288, kHeadDim = 128;  // FLUX.1-dev, as measured

std::vector<std::map<std::string, std::string>> read_csv(const fs::path& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot read " + path.string());
  std::string line;
  std::vector<std::string> header;
  std::vector<std::map<std::string, std::string>> rows;
  auto split = [](const std::string& s) {
    std::vector<std::string> cells;
    std::stringstream ss(s);
    for (std::string c; std::getline(ss, c, ',');) cells.push_back(c);
    return cells;
  };
  if (std::getline(in, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    header = split(line);
  }
  while (std::getline(in, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();  // written with CRLF endings
    if (line.empty()) continue;
    const auto cells = split(line);
    if (cells.size() != header.size())
      throw std::runtime_error(path.string() + ": a row of " + std::to_string(cells.size()) +
                               " cells under " + std::to_string(header.size()) + " columns");
    std::map<std::string, std::string> row;
    for (size_t i = 0; i < cells.size(); ++i) row[header[i]] = cells[i];
    rows.push_back(std::move(row));
  }
  return rows;
}

// The cocodiff op a measured kernel stands for: its label, and the OpCost cocodiff charges at
// `tokens` tokens (sequence length for attention) and `heads` heads. `share`: the measurement
// timed this many such ops together (Q and K norm or RoPE).
struct KernelOp {
  std::string label;
  int share = 1;
  std::function<OpCost(double tokens, double heads)> cost;
};

OpCost linear_cost(double n, double in, double out) {
  return OpCost{OpKind::kGemm, 2.0 * n * in * out, 2.0 * (n * in + out * in + n * out + out), {}};
}

std::map<std::string, KernelOp> kernel_ops() {
  std::map<std::string, KernelOp> m;
  auto lin = [](double in, double out) {
    return [in, out](double n, double) { return linear_cost(n, in, out); };
  };
  m["gemm_v"] = {"v_proj", 1, lin(kHidden, kHidden)};
  m["gemm_qk"] = {"qk_proj", 1, lin(kHidden, 2 * kHidden)};
  m["gemm_qkv_fused"] = {"qkv", 1, lin(kHidden, 3 * kHidden)};
  m["gemm_proj"] = {"attn_out", 1, lin(kHidden, kHidden)};
  m["gemm_mlp_up"] = {"mlp_fc1", 1, lin(kHidden, kMlp)};
  m["gemm_mlp_down"] = {"mlp_fc2", 1, lin(kMlp, kHidden)};
  m["gemm_single_out"] = {"proj_out", 1, lin(kHidden + kMlp, kHidden)};
  m["qk_rmsnorm_unfused"] = {
      "q_norm", 2, [](double n, double) {
        const double e = n * kHidden;
        return OpCost{OpKind::kNorm, 4.0 * e, 2.0 * (2.0 * e + kHeadDim), {}};
      }};
  m["qk_rope_unfused"] = {
      "q_rope", 2, [](double n, double) {
        const double e = n * kHidden;
        return OpCost{OpKind::kElementwise, 3.0 * e, 2.0 * (2.0 * e + n * kHeadDim), {}};
      }};
  m["attention_sdpa"] = {
      "attention", 1, [](double s, double h) {
        return OpCost{
            OpKind::kAttention, 4.0 * h * s * s * kHeadDim, 2.0 * 4.0 * h * s * kHeadDim, {}};
      }};
  return m;
}

double pct(double predicted, double measured) { return 100.0 * (predicted / measured - 1.0); }

struct Summary {
  std::vector<double> abs_err;
  void add(double e) { abs_err.push_back(std::fabs(e)); }
  std::string text() const {
    if (abs_err.empty()) return "no points";
    auto v = abs_err;
    std::sort(v.begin(), v.end());
    return bench::fmt("%zu points, |error| median %.1f%%, max %.1f%%", v.size(), v[v.size() / 2],
                      v.back());
  }
};

}  // namespace

int main(int argc, char** argv) {
  bench::Args args = bench::parse_args(
      argc, argv, "[--cluster NAME] [--measurements DIR]   (kernels, NCCL, copies, interference)");
  std::string cluster_name = "hgx-h100";
  fs::path mdir = fs::path(COCODIFF_CONFIG_DIR) / "measurements" / "h100";
  for (size_t i = 0; i < args.rest.size(); ++i) {
    const std::string& a = args.rest[i];
    if (a == "--cluster" && i + 1 < args.rest.size()) {
      cluster_name = args.rest[++i];
    } else if (a == "--measurements" && i + 1 < args.rest.size()) {
      mdir = args.rest[++i];
    } else {
      std::fprintf(stderr, "fidelity: unknown option '%s'\n", a.c_str());
      return 2;
    }
  }
  try {
    const fs::path presets = fs::path(COCODIFF_CONFIG_DIR) / "clusters";
    const Cluster c = load_cluster(load_cluster_config(cluster_name, presets), presets);
    const RooflineParams shipped = c.device_params;
    RooflineParams bare = shipped;
    bare.kernels.clear();
    const RooflineDevice roofline(bare), tabled(shipped);

    bench::Table t({"group", "measured op", "cocodiff op", "size", "measured us", "roofline us",
                    "table us", "held out us", "error %"});
    Summary k_roof_big, k_held_big, k_roof_small, k_held_small, coll_call, coll_copy, copies;

    // Kernels.
    const auto ops = kernel_ops();
    std::string as_cocodiff = "op,kind,flops,bytes,time_us\n";
    for (const auto& r : read_csv(mdir / "kernels.csv")) {
      const auto it = ops.find(r.at("op"));
      if (it == ops.end()) continue;
      const KernelOp& op = it->second;
      const double tokens = std::stod(r.at("tokens")), heads = std::stod(r.at("heads"));
      const double measured = std::stod(r.at("time_us")) / op.share;
      OpCost cost = op.cost(tokens, heads);
      cost.label = op.label;
      as_cocodiff += bench::fmt("%s,%s,%.6g,%.6g,%.4f\n", op.label.c_str(),
                                std::string(op_kind_name(cost.kind)).c_str(), cost.flops,
                                cost.bytes, measured);
      const double roof = roofline.time(cost).seconds() * 1e6;
      const double tab = tabled.time(cost).seconds() * 1e6;
      RooflineParams held = shipped;
      double held_out = roof;
      bool in_table = false;
      auto kt = held.kernels.find(op.label);
      if (kt != held.kernels.end()) {
        KernelTable& tbl = kt->second;
        for (size_t j = 0; j < tbl.flops.size(); ++j) {
          if (std::fabs(tbl.flops[j] / cost.flops - 1.0) < 1e-4) {
            tbl.flops.erase(tbl.flops.begin() + static_cast<std::ptrdiff_t>(j));
            tbl.time_s.erase(tbl.time_s.begin() + static_cast<std::ptrdiff_t>(j));
            in_table = true;
            break;
          }
        }
        held_out = RooflineDevice(held).time(cost).seconds() * 1e6;
      }
      const double err = pct(held_out, measured);
      const bool big = tokens >= 4096;  // attention: sequence length
      (big ? k_roof_big : k_roof_small).add(pct(roof, measured));
      (big ? k_held_big : k_held_small).add(err);
      const std::string size = bench::fmt("%g tokens x %g heads", tokens, heads);
      t.add({"kernel", r.at("op") + (op.share > 1 ? " / 2" : ""), op.label, size,
             bench::fmt("%.1f", measured), bench::fmt("%.1f", roof), bench::fmt("%.1f", tab),
             bench::fmt("%.1f", held_out), bench::fmt("%+.1f", err)},
            {{"group", "kernel"},
             {"measured_op", r.at("op")},
             {"op", op.label},
             {"tokens", tokens},
             {"heads", heads},
             {"flops", cost.flops},
             {"measured_us", measured},
             {"roofline_us", roof},
             {"table_us", tab},
             {"held_out_us", held_out},
             {"point_in_table", in_table},
             {"error_pct", err}});
    }

    // Collectives: one rank, so each call is the library's per-call cost on the device, or,
    // where the device has a host, the host's cost to issue it when that is longer (the calls
    // run back to back in eager mode); above 256 KiB NCCL copies the buffer locally, which
    // cocodiff does not charge (no bytes leave the tile).
    const double call_us = std::max(c.library.call_overhead.seconds() * 1e6,
                                    c.device->collective_issue().seconds() * 1e6);
    for (const auto& r : read_csv(mdir / "nccl.csv")) {
      const double bytes = std::stod(r.at("bytes")), measured = std::stod(r.at("time_us"));
      const bool copy_regime = bytes > 256.0 * 1024;
      const double err = pct(call_us, measured);
      (copy_regime ? coll_copy : coll_call).add(err);
      t.add(
          {"nccl", r.at("op"), std::string(copy_regime ? "call (local copy not charged)" : "call"),
           bench::fmt("%s ranks, %.0f B", r.at("ranks").c_str(), bytes),
           bench::fmt("%.1f", measured), "", bench::fmt("%.1f", call_us), "",
           bench::fmt("%+.1f", err)},
          {{"group", "nccl"},
           {"measured_op", r.at("op")},
           {"ranks", std::stoi(r.at("ranks"))},
           {"bytes", bytes},
           {"measured_us", measured},
           {"predicted_us", call_us},
           {"local_copy_regime", copy_regime},
           {"error_pct", err}});
    }

    // Device-to-device copies: cocodiff charges a copy as its bytes read and written at the
    // copy efficiency of HBM, plus a launch.
    for (const auto& r : read_csv(mdir / "copy.csv")) {
      if (r.at("op") != "copy_engine_d2d") continue;
      const double bytes = std::stod(r.at("bytes")), measured = std::stod(r.at("time_us"));
      const OpCost cost{OpKind::kCopy, 0, 2.0 * bytes, "copy"};
      const double pred = roofline.time(cost).seconds() * 1e6;
      const double err = pct(pred, measured);
      if (bytes >= 1 << 20) copies.add(err);
      t.add({"copy", r.at("op"), "copy", bench::fmt("%.0f B", bytes), bench::fmt("%.1f", measured),
             bench::fmt("%.1f", pred), "", "", bench::fmt("%+.1f", err)},
            {{"group", "copy"},
             {"bytes", bytes},
             {"measured_us", measured},
             {"predicted_us", pred},
             {"error_pct", err}});
    }

    // Interference: a GEMM with a copy in flight beside it, and the copy beside the GEMM.
    std::ifstream jf(mdir / "interference.json");
    if (!jf) throw std::runtime_error("cannot read " + (mdir / "interference.json").string());
    const nlohmann::json ij = nlohmann::json::parse(jf);
    const double gemm_alone = ij.at("gemm_alone_us"), gemm_with = ij.at("gemm_with_copy_engine_us");
    const double copy_alone = ij.at("copy_engine_alone_us");
    const double copy_with = ij.at("copy_engine_with_gemm_us");
    const double gemm_pred = gemm_alone * c.device_params.overlap_compute_factor;
    // The copy lies wholly beside the longer GEMM: all of it is slowed by the transfer factor.
    const double copy_pred = copy_alone * c.device_params.overlap_transfer_factor;
    t.add({"overlap", "gemm beside a copy", "compute x overlap_compute_factor", "8192x3072x12288",
           bench::fmt("%.1f", gemm_with), "", bench::fmt("%.1f", gemm_pred), "",
           bench::fmt("%+.1f", pct(gemm_pred, gemm_with))},
          {{"group", "overlap"},
           {"measured_op", "gemm_with_copy"},
           {"measured_us", gemm_with},
           {"predicted_us", gemm_pred},
           {"error_pct", pct(gemm_pred, gemm_with)}});
    t.add({"overlap", "copy beside a gemm", "transfer x overlap_transfer_factor", "256 MiB",
           bench::fmt("%.1f", copy_with), "", bench::fmt("%.1f", copy_pred), "",
           bench::fmt("%+.1f", pct(copy_pred, copy_with))},
          {{"group", "overlap"},
           {"measured_op", "copy_with_gemm"},
           {"measured_us", copy_with},
           {"predicted_us", copy_pred},
           {"error_pct", pct(copy_pred, copy_with)}});

    nlohmann::json meta = {{"cluster", cluster_name},
                           {"measurements", mdir.string()},
                           {"library", c.library.name},
                           {"call_overhead_us", call_us}};
    std::ifstream ef(mdir / "env.json");
    if (ef) meta["environment"] = nlohmann::json::parse(ef);
    t.finish(args, "fidelity", meta);
    bench::write_text(args.out / "kernels_cocodiff.csv", as_cocodiff);
    std::printf("\nkernels >= 4096 tokens per rank (attention: sequence length >= 4096):\n");
    std::printf("  roofline:        %s\n", k_roof_big.text().c_str());
    std::printf("  table, held out: %s\n", k_held_big.text().c_str());
    std::printf("kernels < 4096 tokens per rank:\n");
    std::printf("  roofline:        %s\n", k_roof_small.text().c_str());
    std::printf("  table, held out: %s\n", k_held_small.text().c_str());
    std::printf("nccl, single rank, <= 256 KiB (per call, back to back: %.1f us): %s\n", call_us,
                coll_call.text().c_str());
    std::printf("nccl, single rank, > 256 KiB (a local copy cocodiff does not charge): %s\n",
                coll_copy.text().c_str());
    std::printf("d2d copies >= 1 MiB: %s\n", copies.text().c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fidelity: %s\n", e.what());
    return 2;
  }
  return 0;
}
