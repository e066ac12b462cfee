#pragma once
// The device model: an op's time from the measured kernel grids by its shape where the device has
// them (device.grid, net_models/kernel_grid.hpp), else from a measured kernel table by its label
// (device.kernels), else the roofline: max(flops / (peak * eff_kind), bytes / (hbm * eff_kind)) +
// launch. And the host that issues the ops: eager op by op, compiled, or each block as its
// reference implementation issues it (HostParams).

#include <array>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "core/op_cost.hpp"
#include "core/sim_time.hpp"
#include "net_models/kernel_grid.hpp"

namespace cocodiff {

class DeviceModel {
 public:
  virtual ~DeviceModel() = default;
  /// Virtual time one tile needs for `cost`.
  virtual SimTime time(const OpCost& cost) const = 0;
  virtual std::string name() const = 0;
  /// Factor on the time of compute that a tile issues while one of its collectives is open
  /// (started and not yet waited for): communication kernels take SMs and HBM bandwidth.
  /// 1 keeps overlap free.
  virtual double overlap_compute_factor() const { return 1.0; }
  /// Factor on the transfers of a tile's collective while that tile computes beside it: the
  /// overlapped part of the collective (at most the compute issued while it was open) takes
  /// this much longer, as seen by the tile that waits for it. 1 keeps overlap free.
  virtual double overlap_transfer_factor() const { return 1.0; }
  /// The two factors for a collective of `ranks` ranks: those measured for that group size
  /// where the device has its own (device.overlap_by_group), else the two above. Interference
  /// depends on the group: over NCCL's shared-memory transport a GEMM beside a 256 MiB
  /// all-to-all runs 1.14x slower on 2 GPUs and 1.25x on 4, the all-to-all 1.36x and 1.30x.
  virtual double overlap_compute_factor_for(int /*ranks*/) const {
    return overlap_compute_factor();
  }
  virtual double overlap_transfer_factor_for(int /*ranks*/) const {
    return overlap_transfer_factor();
  }
  /// The group sizes with factors of their own, ascending (none: every group takes the two
  /// factors above).
  virtual std::vector<int> overlap_groups() const { return {}; }
  /// How much of the compute factor an op of `kind` takes (>= 0): beside an open collective
  /// it runs 1 + w (F - 1) times its time, F the factor above. Kernels contend for what the
  /// communication kernel holds in different measure: beside a 256 MiB shared-memory all-to-all
  /// on 4 H100s a GEMM runs 1.25x slower, an attention 1.02x, Q/K norm+RoPE 1.10x. 1 (every
  /// kind as the factor says) by default.
  virtual double overlap_kind_weight(OpKind /*kind*/) const { return 1.0; }
  /// The host that issues a rank's work, as eager PyTorch does: it spends host_issue(op) of
  /// CPU time on every op before the device may start it, and collective_issue() on every
  /// collective call. False (every cost zero): ops start as soon as the device is free.
  virtual bool has_host() const { return false; }
  /// Whether the host issues each transformer block as its reference implementation does
  /// (device.host.framework = "reference"): the models then charge one KernelClass::kHostBlock
  /// op a block, its host time host_issue(label, kHostBlock), every other op issuing at no cost.
  virtual bool host_reference() const { return false; }
  /// The op's issue cost: its kernel class's where the host has one (the call sequence the
  /// reference launches for it), else its label's, else the default.
  virtual SimTime host_issue(std::string_view /*label*/,
                             KernelClass /*kernel*/ = KernelClass::kNone) const {
    return {};
  }
  virtual SimTime collective_issue() const { return {}; }
  /// How much slower each further rank on a node makes its hosts: op issue costs, measured on
  /// one rank alone, are taken (1 + this x (ranks per node - 1)) times (the ranks share the
  /// node's CPUs and memory). collective_issue() is not scaled: a collective is measured with
  /// every rank of the node issuing it.
  virtual double host_per_rank_slowdown() const { return 0.0; }
  /// How much a host's issue time grows with the ranks that wait for one another: every
  /// exchange waits for the slowest of the run's n hosts, and a host's excess over its issue
  /// cost between two exchanges varies from one segment to the next. Taken as exponentially
  /// distributed with mean (this x the cost), the expected slowest of n is H(n) = 1 + 1/2 + ...
  /// + 1/n times it, so op issue costs are taken (1 + this x (H(n) - 1)) times over one rank
  /// alone (host_issue_scale). 0: the hosts keep their pace.
  virtual double host_sync_slowdown() const { return 0.0; }
  /// How much slower a host issues an op inside a step of two or more ranks than one op at a
  /// time: op issue costs, measured alone, are taken this many times in every run of 2 or more
  /// ranks (the exchanges' host path beyond collective_issue() and the peers a host waits for;
  /// not the framework's own work: one H200 issues its host-bound 256^2 and 512^2 steps in
  /// 0.74-1.04x its ops' measured costs, configs/measurements/h200x1-host*/). It multiplies
  /// host_issue_scale's whole factor. A run of one rank takes 1. 1: as measured.
  virtual double host_step_factor() const { return 1.0; }
  /// How much longer a step's kernels take than the same kernels timed alone, back to back (the
  /// measured tables): every op's device time is taken this many times, on any number of ranks.
  /// Device-bound eager steps miss the tables' sum in proportion to their work (on H200s by 3-6%
  /// on 1, 2 and 4 GPUs and at 1536^2-3072^2 alike), and a profile of the 1-GPU step finds it in
  /// the kernels themselves, not between them. It is the net of the power cap: a device-bound
  /// step holds the GPU at its power limit and a lower clock than the tables' replays, by kernel
  /// kind in opposite directions (bench/fidelity/pace_fidelity.py). 1: as measured.
  virtual double kernel_step_factor() const { return 1.0; }
  /// How far the ranks' devices differ in speed: the standard deviation of their relative
  /// speed, as measured between two exchanges of a step (no two GPUs of a machine run a kernel in
  /// quite the same time, and every exchange waits for the slowest). 0: every rank alike.
  virtual double rank_spread() const { return 0.0; }
  /// The kernels of the run so far that the device's measured grids do not cover: a shape
  /// beyond a series' ends (timed at its nearest point's rate), or one no series covers (a
  /// kernel class or head_dim never measured: timed by the roofline at the fitted
  /// efficiencies): "gemm 4096x768x3072 (q_proj_heads): 38 ops", sorted, at most `limit`.
  /// Empty for a device without grids.
  virtual std::vector<std::string> outside_grid(size_t /*limit*/) const { return {}; }
};

/// Each rank's factor on its device time for a spread s of n ranks: 1 + s x z, where z are the
/// expected normal order statistics of n draws (Blom's scores, the normal quantiles at
/// (i - 3/8) / (n + 1/4)), dealt to the ranks in an order fixed by a hash of the rank, so the
/// slowest device is no particular rank. The scores sum to zero: the mean rank keeps its time,
/// and the slowest is rank_spread_top(n) x s slower. Empty when s is 0; at least 0.1 each.
std::vector<double> rank_speed_factors(int ranks, double spread);
/// The largest of rank_speed_factors' scores for n ranks (0 for one rank): how much longer, per
/// unit of spread, the slowest rank takes than the mean, and so how long the mean rank waits at
/// an exchange for the slowest, relative to its work since the last one.
double rank_spread_top(int ranks);

/// The factor on a rank's op issue costs in a run of `ranks` ranks, `ranks_per_node` on each
/// node: step x (1 + per_rank x (ranks_per_node - 1) + sync x (H(ranks) - 1)), where H is the
/// harmonic number (DeviceModel::host_step_factor, host_per_rank_slowdown, host_sync_slowdown);
/// 1 on one rank (the step factor is a multi-rank host's).
double host_issue_scale(double step, double per_rank, double sync, int ranks_per_node, int ranks);

/// Host issue costs ([device.host] of a cluster file).
struct HostParams {
  SimTime op_issue;                                 // any op whose label has no cost of its own
  SimTime collective_issue;                         // one collective call
  std::map<std::string, SimTime, std::less<>> ops;  // by op label
  /// By kernel class (device.host.kernels.CLASS): the eager calls the reference launches for
  /// one such op, each at its measured issue cost; zero where none is given. Before `ops`.
  std::array<SimTime, kNumKernelClasses> kernels{};
  double per_rank_slowdown = 0.0;  // DeviceModel::host_per_rank_slowdown
  double sync_slowdown = 0.0;      // DeviceModel::host_sync_slowdown
  double step_factor = 1.0;        // DeviceModel::host_step_factor
  /// device.host.framework: "eager" (each op at its issue cost below), "compiled" (the eager
  /// kernels replayed from a CUDA graph: ops issue at no cost; collective calls keep
  /// collective_issue), "inductor" (torch.compile's default mode: memory-bound kernels fused,
  /// each op launched at inductor_launch), "reference" (each transformer block at the host time
  /// its reference implementation takes: `reference`).
  enum class Framework : std::uint8_t { kEager, kCompiled, kInductor, kReference };
  Framework framework = Framework::kEager;
  /// device.host.inductor.fusion: under "inductor", a memory-bound kernel (a norm, RoPE, an
  /// elementwise op: any class but GEMM and attention) takes this fraction of its eager time,
  /// fused into its neighbours. device.host.inductor.launch_us: what the compiled graph's
  /// wrapper takes to launch one op. Both fitted to torch.compile forwards (the preset says which).
  double inductor_fusion = 1.0;
  SimTime inductor_launch;
  bool has_inductor = false;  // the cluster gave both
  /// By "model/scope" (scope: transformer_blocks, single_transformer_blocks, outside): the host
  /// time of one block as the reference issues it, counted (device.host.reference: its calls at
  /// their measured issue costs, plus device.host.call_overhead_us a call).
  std::map<std::string, SimTime, std::less<>> reference;
  /// device.host.scale: this machine's host against the preset's; every issue cost above (ops
  /// and collectives) was taken this many times when the cluster was read.
  double scale = 1.0;
  /// device.host.range: the scales of the hosts of the machines measured, lowest and highest
  /// (how much faster and slower than the preset they issued the same host-bound steps); both 0
  /// when the cluster has none. `cocodiff tune` times its best configurations at both ends.
  double range_low = 0.0, range_high = 0.0;
  bool has_range() const { return range_high > 0.0; }
  bool any() const;
};

/// Measured times of one kernel at several sizes, by FLOPs (ascending, distinct).
/// The suffix of an op that reads a strided view (RooflineParams::strided_factor).
inline constexpr std::string_view kStridedSuffix = "_strided";

struct KernelTable {
  std::vector<double> flops;
  std::vector<double> time_s;
  std::string source;  // the measurement the points come from
  /// Time at `flops` by linear interpolation in log(flops) -> log(time); nullopt outside the
  /// measured range.
  bool interpolate(double flops, double& time_s_out) const;
};

struct RooflineParams {
  std::string name = "device";
  double peak_flops_per_s = 1e12;
  double hbm_bytes_per_s = 1e11;
  SimTime launch_overhead;
  /// Achieved fraction of peak compute, per OpKind.
  std::array<double, kNumOpKinds> compute_efficiency{1, 1, 1, 1, 1};
  /// Achieved fraction of HBM bandwidth, per OpKind.
  std::array<double, kNumOpKinds> memory_efficiency{1, 1, 1, 1, 1};
  /// See DeviceModel::overlap_compute_factor (>= 1).
  double overlap_compute_factor = 1.0;
  /// See DeviceModel::overlap_transfer_factor (>= 1).
  double overlap_transfer_factor = 1.0;
  /// Overlap factors of collectives over a given number of ranks, in place of the two above
  /// (DeviceModel::overlap_compute_factor_for).
  struct OverlapFactors {
    double compute = 1.0, transfer = 1.0;
  };
  std::map<int, OverlapFactors> overlap_by_group;
  /// See DeviceModel::overlap_kind_weight (>= 0), per OpKind.
  std::array<double, kNumOpKinds> overlap_kind_weight{1, 1, 1, 1, 1};
  /// An op labelled `X_strided` reads a strided view (a head group sliced from a projection):
  /// without a table of its own it takes X's time times its kind's factor here (>= 0.1).
  std::array<double, kNumOpKinds> strided_factor{1, 1, 1, 1, 1};
  /// See DeviceModel::rank_spread (0 to 0.2).
  double rank_spread = 0.0;
  /// See DeviceModel::kernel_step_factor (0.1 to 10).
  double step_factor = 1.0;
  /// Measured kernels, by op label ("q_proj") or, for ops whose label has none, by op kind
  /// ("attention"). Inside a table's FLOP range its interpolation replaces the roofline (launch
  /// included, as measured); outside it the roofline applies, scaled by the table's ratio to the
  /// roofline at the nearest end of the range.
  std::map<std::string, KernelTable, std::less<>> kernels;
  /// Measured kernel times by shape (device.grid): where set, an op with a KernelShape takes
  /// the grid's time, the roofline (at the efficiencies above, fitted to the grid by
  /// cocodiff calibrate) times what the grid does not cover, and `kernels` is not consulted.
  std::shared_ptr<const KernelGrid> grid;
  std::vector<std::string> grid_dirs;  // the directories it was read from, as given
  /// The grids measured on another GPU: each kernel's grid time is taken this factor of its
  /// class's kind (device.grid_scale; 1 where the grids are this device's own).
  std::array<double, kNumOpKinds> grid_scale{1, 1, 1, 1, 1};
  HostParams host;
};

class RooflineDevice final : public DeviceModel {
 public:
  explicit RooflineDevice(RooflineParams p);
  SimTime time(const OpCost& cost) const override;
  /// The op's time as eager PyTorch runs it (time() before inductor's fusion).
  SimTime eager_time(const OpCost& cost) const;
  std::string name() const override { return p_.name; }
  double overlap_compute_factor() const override { return p_.overlap_compute_factor; }
  double overlap_transfer_factor() const override { return p_.overlap_transfer_factor; }
  double overlap_compute_factor_for(int ranks) const override;
  double overlap_transfer_factor_for(int ranks) const override;
  std::vector<int> overlap_groups() const override;
  double overlap_kind_weight(OpKind kind) const override {
    return p_.overlap_kind_weight[static_cast<size_t>(kind)];
  }
  bool has_host() const override { return has_host_; }
  bool host_reference() const override {
    return p_.host.framework == HostParams::Framework::kReference;
  }
  SimTime host_issue(std::string_view label,
                     KernelClass kernel = KernelClass::kNone) const override;
  SimTime collective_issue() const override { return p_.host.collective_issue; }
  double host_per_rank_slowdown() const override { return p_.host.per_rank_slowdown; }
  double host_sync_slowdown() const override { return p_.host.sync_slowdown; }
  double host_step_factor() const override { return p_.host.step_factor; }
  double rank_spread() const override { return p_.rank_spread; }
  double kernel_step_factor() const override { return p_.step_factor; }
  std::vector<std::string> outside_grid(size_t limit) const override;
  const RooflineParams& params() const { return p_; }
  /// The roofline alone, without the measured tables.
  SimTime roofline(const OpCost& cost) const;

 private:
  /// Counts an op the grid does not cover (outside_grid).
  void note_outside(const OpCost& cost) const;

  RooflineParams p_;
  bool has_host_ = false;
  mutable std::mutex outside_mu_;
  mutable std::map<std::string, long> outside_;
};

}  // namespace cocodiff
