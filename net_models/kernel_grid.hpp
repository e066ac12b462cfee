#pragma once
// Measured kernel times by shape: the GEMM, attention and memory-bound grids that
// bench/fidelity/models/microbench.py writes (gemm.csv, attention.csv, memory.csv), read from one
// or more directories (several machines: each grid point takes the median of its measurements).
//
//   KernelGrid g = KernelGrid::load({"configs/measurements/h200x1-models"});
//   std::optional<double> t = g.time_s(gemm_shape(4096, 3072, 3072, true));  // nullopt: outside
//
// How a shape is timed (all interpolation is linear in log(size) -> log(time), so a point of the
// grid returns its measurement and a shape between two points lies between their times):
// - GEMM (m, n, k, bias): the series of its weight shape (n, k) over m; the other bias variant's
//   when its own was not measured. A weight shape not measured takes the throughput (FLOP/s)
//   interpolated between the two nearest measured widths that bracket it with the same k (or the
//   same n), each at this m.
// - Attention (batch, q, kv, heads, head_dim): for its head_dim, by bilinear interpolation over
//   (batch x heads, tokens) of the self-attention grid (q = kv); a q != kv shape measured as such
//   returns its point, else takes the throughput of the self-attention of sqrt(q kv) tokens.
// - Memory-bound kernels (class, elements, width): the class's series over elements at the
//   measured row width nearest to the op's (in log); widths differ little at equal elements.
// Beyond a series' ends the nearest point's rate holds: above the largest size the time grows
// with the work (a GEMM's m, a memory kernel's elements: linearly; an attention's tokens:
// quadratically, its batch x heads linearly), below the smallest it stays the smallest point's
// (a launch-bound kernel); such a time is flagged `extrapolated` and the device model reports
// it. What has no series at all (a class or head_dim never measured, a weight shape no measured
// one brackets) is nullopt: the device model times it by the roofline fitted to the grid.

#include <array>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/op_cost.hpp"

namespace cocodiff {

class KernelGrid {
 public:
  /// One measured point: a kernel's shape and its median time, with where it was read.
  struct Point {
    KernelShape shape;
    double time_s = 0;
    std::string source;  // "file:line" of its (first) row
  };

  /// Reads the grids of `dirs` (each holding gemm.csv, attention.csv and/or memory.csv; at
  /// least one of them in all). A malformed row throws InputError naming its file and line.
  /// Loads of the same directories share one grid (the files are read once a process).
  static std::shared_ptr<const KernelGrid> load(const std::vector<std::filesystem::path>& dirs);
  /// Parses one grid file's text (`name` names it in errors); the kind comes from its header.
  void add_text(std::string_view text, const std::string& name);
  /// Merges repeated points (the median of their times) and builds the lookups; after add_text.
  void finish();

  /// The shape's time; `extrapolated`, when given, is set when it lies beyond the measured ends.
  std::optional<double> time_s(const KernelShape& shape, bool* extrapolated = nullptr) const;
  bool empty() const { return points_.empty(); }
  /// Every merged point, by class then shape.
  const std::vector<Point>& points() const { return points_; }
  /// The grid files read, in order.
  const std::vector<std::string>& files() const { return files_; }
  /// Rows of memory grids whose op names no KernelClass (skipped, counted).
  int skipped_rows() const { return skipped_rows_; }

  /// A copy without the points `drop` accepts.
  KernelGrid without(const std::function<bool(const Point&)>& drop) const;
  /// Point i of points() held out: its time interpolated from its two neighbours along its
  /// series (a GEMM's m, a memory kernel's elements, an attention's tokens at its batch x
  /// heads), which is what the grid would give there without it; nullopt at a series' end and
  /// for q != kv attention points.
  std::optional<double> held_out(size_t i) const;

 private:
  struct Series {  // times by one ascending size
    std::vector<double> x, t;
    std::optional<double> at(double v) const;  // inside the ends only
    /// Beyond the ends too: above, the last time x (v / last)^power; below, the first time.
    std::optional<double> reach(double v, double power, bool& extrapolated) const;
  };
  std::optional<double> time_of(const KernelShape& shape, bool& extrapolated) const;
  std::optional<double> gemm(std::int64_t m, std::int64_t n, std::int64_t k, int bias,
                             bool& extrapolated) const;
  std::optional<double> gemm_series(std::int64_t m, std::int64_t n, std::int64_t k, int bias,
                                    bool& extrapolated) const;
  std::optional<double> attention(const std::array<std::int64_t, 5>& d, bool& extrapolated) const;
  std::optional<double> self_attention(std::int64_t head_dim, double bh, double s,
                                       bool& extrapolated) const;
  std::optional<double> memory(KernelClass c, std::int64_t elements, std::int64_t width,
                               bool& extrapolated) const;

  std::vector<Point> raw_;     // as read
  std::vector<Point> points_;  // merged
  std::vector<std::string> files_;
  int skipped_rows_ = 0;
  std::map<std::array<std::int64_t, 3>, Series> gemm_;  // (n, k, bias) -> over m
  struct AttentionGrid {
    std::vector<double> bh;         // the batch x heads measured, ascending
    std::map<double, Series> rows;  // by batch x heads: its times over the tokens
  };
  std::map<std::int64_t, AttentionGrid> self_;             // by head_dim
  std::map<std::array<std::int64_t, 4>, double> cross_;    // (bh, q, kv, head_dim) -> time
  std::map<std::pair<int, std::int64_t>, Series> memory_;  // (class, width) -> over elements
};

}  // namespace cocodiff
