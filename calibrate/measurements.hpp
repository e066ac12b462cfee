#pragma once
// Measurements `cocodiff calibrate` fits: collective times and kernel times, read from the files
// they are printed in. Every point remembers its file and line, and every bad value is an
// InputError naming them; a file is refused before it is read whole when it is larger than a
// measurements file can be (kMaxFileBytes), and a line longer than kMaxLineChars ends the read.
//
//   Measurements m;
//   read_measurements("alltoall_perf.log", m);   // nccl-tests output as printed
//   read_measurements("sweep.csv", m);           // op,ranks,nodes,bytes,time_us,transport
//   m.collectives[0].where;                      // "alltoall_perf.log:17"
//
// Formats, told apart by their contents (never by the file name):
//  - nccl-tests output: the op from its "# Collective test starting: NAME_perf" line, else from
//    a NAME_perf binary named in the log, else from the file name; the ranks from its
//    "#  Rank N Group G Pid P on HOST device D ..." lines and the nodes from their distinct
//    hosts; one point per size for the out-of-place time and one for the in-place time. A log
//    of several tests holds one section per "Collective test starting" (or "# nThread") line.
//  - `cocodiff netbench` output as printed (its "# cocodiff netbench:" line names the op, nodes
//    and ranks) and its --json file.
//  - CSV of collectives: a header naming op, ranks, bytes, time_us (required) and nodes,
//    transport (optional) in any order; other columns are ignored (listed in `ignored_columns`).
//    Lines starting with '#' are comments.
//  - CSV of kernels: the header op,kind,flops,bytes,time_us, op being the label cocodiff charges.
//  - Kernel grids by shape (microbench.py): headers m,n,k,dtype,bias,us_median,... (GEMM),
//    batch,q_tokens,kv_tokens,heads,head_dim,us_median,... (attention) and
//    op,shape,dtype,bytes_moved,strided,us_median,... (memory-bound kernels).
//  - CSV of ops as eager PyTorch runs them (bench/fidelity/measure_multi.py's kernels.csv and
//    host_*.csv): the header op,label,tokens,heads,k,n,flops,device_us,host_us; device_us is the
//    op's device time replayed in a CUDA graph, host_us the host's time to issue it, either
//    empty where not measured (calibrate/eager_fit.hpp turns them into tables).
//  - measure_multi.py's interference_*.json: a JSON object of KERNEL_alone_us,
//    KERNEL_with_a2a_SIZE_us, all_to_all_SIZE_alone_us and all_to_all_SIZE_with_KERNEL_us.
//  - measure_multi.py's steps_*.csv: the header strategy,gpus,resolution,image_tokens,median_ms,
//    min_ms,max_ms,host_issue_ms,transport,timed_steps, one whole FLUX.1-dev step a row (the
//    median of its timed steps, slowest rank); a step measured in several launches has a row
//    from each (calibrate/host_sync_fit.hpp fits the host's sync slowdown to them).
//  - measure_multi.py's breakdown_*.json: {"world": N, "cases": {"WxRES": {...}}}, each case a
//    flat step on W GPUs split into its exchanges and the rest, with segment_wait_ms (how long
//    the ranks wait a step for the slowest rank's work between two exchanges).
//  - measure_multi.py's chunks.json: {"cases": [{...}, ...]}, each case a rank's Q preparation
//    whole and in head groups, with the norms on strided slices (norm_us) and on contiguous
//    copies of them (norm_contig_us).
// Sizes are as nccl-tests counts them (calibrate/collective_bench.hpp).

#include <array>
#include <cstdint>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "calibrate/collective_bench.hpp"
#include "core/op_cost.hpp"

namespace cocodiff::calibrate {

/// A measurements file larger than this is refused before it is read (64 MiB: a million
/// points of CSV).
inline constexpr std::int64_t kMaxFileBytes = std::int64_t{64} << 20;
/// A line longer than this is refused (no format prints lines of this length).
inline constexpr std::size_t kMaxLineChars = 4096;
/// At most this many points over all files.
inline constexpr std::size_t kMaxPoints = 1'000'000;
/// Plausible ranges: a point outside them is refused with its file and line.
inline constexpr std::int64_t kMaxRanks = std::int64_t{1} << 20;  // a cluster's limit
inline constexpr std::int64_t kMaxBytes = std::int64_t{1} << 40;  // 1 TiB per rank
inline constexpr double kMinTimeUs = 1e-3;                        // 1 ns
inline constexpr double kMaxTimeUs = 1e9;                         // 1000 s

struct CollectivePoint {
  std::string where;  // "file:line"
  apps::BenchOp op = apps::BenchOp::kAllToAll;
  int ranks = 0;
  int nodes = 0;           // 0: not given (the first `ranks` ranks of the cluster)
  std::int64_t bytes = 0;  // nccl-tests' size
  double time_us = 0;
  std::string transport;  // empty when the file does not say
  std::string variant;    // "out-of-place" | "in-place" for nccl-tests, else empty
};

struct KernelPoint {
  std::string where;  // "file:line"
  std::string op;     // the label cocodiff charges: letters, digits, '_' and '-'
  OpKind kind = OpKind::kGemm;
  double flops = 0, bytes = 0, time_us = 0;
};

/// One op as eager PyTorch runs it. A time not measured is negative.
struct EagerOpPoint {
  std::string where;  // "file:line"
  std::string op;     // the PyTorch op measured: linear, rms_norm, rope, sdpa, all_to_all, ...
  std::string label;  // the cocodiff label it was measured for
  double flops = 0;   // what cocodiff charges for the label at this shape (0: not charged)
  std::array<std::int64_t, 4> dims{};  // the row's tokens, heads, k, n
  double device_us = -1, host_us = -1;
};

/// A compute kernel and an all-to-all of SIZE per rank, each alone and running beside the other
/// on two streams.
struct InterferencePoint {
  std::string where;   // "file: KERNEL with SIZE"
  std::string kernel;  // e.g. gemm_4096x3072x12288
  std::string size;    // e.g. 256MiB
  int world = 0;       // the GPUs the all-to-all ran over (the file's "world"; 0: not given)
  std::int64_t bytes = 0;
  double kernel_alone_us = 0, kernel_with_us = 0, a2a_alone_us = 0, a2a_with_us = 0;
};

/// One case of a breakdown file: a flat step on `gpus` GPUs, medians over its timed steps.
struct BreakdownPoint {
  std::string where;  // "file: case 4x2048"
  int gpus = 0;
  double step_ms = 0;
  double rest_ms_min = 0, rest_ms_max = 0;  // the ranks' work outside exchanges
  double segment_wait_ms = 0;   // the mean rank's wait for the slowest, summed over a step
  double host_late_ms_max = 0;  // the GPU's wait for its own host at the exchanges, slowest rank
};

/// One row of a steps file: a whole FLUX.1-dev step of `strategy` on `gpus` GPUs at
/// resolution^2, the median of its timed steps.
struct StepPoint {
  std::string where;   // "file:line"
  std::string source;  // the file (the steps of one file are one machine's)
  std::string strategy;
  int gpus = 0;
  int resolution = 0;
  double median_ms = 0;
  std::string transport;
};

/// One case of a chunks file: the Q preparation of a rank of `ranks` at resolution^2 in
/// `chunks` head groups (device times summed over the groups).
struct ChunkPoint {
  std::string where;  // "file: case N"
  int ranks = 0, resolution = 0, chunks = 0;
  double norm_us = 0;         // RMSNorm on the groups' strided slices of the projection
  double norm_contig_us = 0;  // the same on contiguous copies of them
};

struct Measurements {
  std::vector<CollectivePoint> collectives;
  std::vector<KernelPoint> kernels;
  std::vector<EagerOpPoint> eager_ops;
  std::vector<InterferencePoint> interference;
  std::vector<BreakdownPoint> breakdowns;
  std::vector<StepPoint> steps;
  std::vector<ChunkPoint> chunks;
  /// Kernel grids by shape (bench/fidelity/models/microbench.py's gemm.csv, attention.csv,
  /// memory.csv): the file's name and text, checked as net_models/kernel_grid.hpp reads them.
  std::vector<std::pair<std::string, std::string>> grid_files;
  std::set<std::string> ignored_columns;  // CSV columns nobody reads, "file: name"
  std::size_t skipped_rows = 0;           // nccl-tests times of N/A or of size 0
};

/// Parses one file's text (`name` names it in errors) and appends its points. InputError for
/// anything malformed or implausible, naming name:line; nothing is appended then.
void parse_measurements(std::string_view text, const std::string& name, Measurements& out);

/// Reads `file` (at most kMaxFileBytes, refused before reading more; a non-regular file such as
/// a pipe is read up to that cap) and parses it.
void read_measurements(const std::string& file, Measurements& out);

}  // namespace cocodiff::calibrate
