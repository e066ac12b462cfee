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
// Anything outside (a class never measured, a size beyond the series' ends, a missing corner)
// is nullopt: the device model then times it by its roofline and reports it.

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

  std::optional<double> time_s(const KernelShape& shape) const;
  bool empty() const { return points_.empty(); }
  /// Every merged point, by class then shape.
  const std::vector<Point>& points() const { return points_; }
  /// The grid files read, in order.
  const std::vector<std::string>& files() const { return files_; }
  /// Rows of memory grids whose op names no KernelClass (skipped, counted).
  int skipped_rows() const { return skipped_rows_; }

  /// A copy without the points `drop` accepts: for leave-one-out checks of the interpolation.
  KernelGrid without(const std::function<bool(const Point&)>& drop) const;

 private:
  struct Series {  // times by one ascending size
    std::vector<double> x, t;
    std::optional<double> at(double v) const;
  };
  std::optional<double> gemm(std::int64_t m, std::int64_t n, std::int64_t k, int bias) const;
  std::optional<double> gemm_series(std::int64_t m, std::int64_t n, std::int64_t k,
                                    int bias) const;
  std::optional<double> attention(const std::array<std::int64_t, 5>& d) const;
  std::optional<double> self_attention(std::int64_t head_dim, double bh, double s) const;
  std::optional<double> memory(KernelClass c, std::int64_t elements, std::int64_t width) const;

  std::vector<Point> raw_;     // as read
  std::vector<Point> points_;  // merged
  std::vector<std::string> files_;
  int skipped_rows_ = 0;
  std::map<std::array<std::int64_t, 3>, Series> gemm_;  // (n, k, bias) -> over m
  struct AttentionGrid {
    std::vector<double> bh, s;                       // ascending axes
    std::map<std::pair<double, double>, double> t;   // (bh, s) -> time
  };
  std::map<std::int64_t, AttentionGrid> self_;  // by head_dim
  std::map<std::array<std::int64_t, 4>, double> cross_;  // (bh, q, kv, head_dim) -> time
  std::map<std::pair<int, std::int64_t>, Series> memory_;  // (class, width) -> over elements
};

}  // namespace cocodiff
