#include "net_models/kernel_grid.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <fstream>
#include <functional>
#include <mutex>
#include <sstream>
#include <string_view>

#include "core/errors.hpp"

namespace cocodiff {

namespace {

constexpr std::int64_t kMaxGridFileBytes = std::int64_t{64} << 20;
constexpr std::int64_t kMaxDim = std::int64_t{1} << 40;

std::vector<std::string_view> split(std::string_view s, char sep) {
  std::vector<std::string_view> out;
  size_t b = 0;
  while (true) {
    const size_t e = s.find(sep, b);
    out.push_back(s.substr(b, e == std::string_view::npos ? std::string_view::npos : e - b));
    if (e == std::string_view::npos) break;
    b = e + 1;
  }
  return out;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r'))
    s.remove_suffix(1);
  return s;
}

[[noreturn]] void bad_row(const std::string& where, std::string_view what, std::string_view got) {
  throw InputError(where + ": expected " + std::string(what) + ", found \"" + std::string(got) +
                   "\"");
}

std::int64_t parse_dim(const std::string& where, std::string_view col, std::string_view v,
                       std::int64_t lo) {
  std::int64_t x = 0;
  const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
  if (ec != std::errc{} || end != v.data() + v.size() || x < lo || x > kMaxDim)
    bad_row(where, std::string(col) + " as an integer from " + std::to_string(lo) + " to 2^40", v);
  return x;
}

double parse_us(const std::string& where, std::string_view col, std::string_view v) {
  double x = 0;
  const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
  if (ec != std::errc{} || end != v.data() + v.size() || !(x > 0) || !(x < 1e9))
    bad_row(where, std::string(col) + " as microseconds > 0", v);
  return x;
}

/// "1x64x1152" -> (elements, last dim); "1x333+4096x3072" sums the parts of a dimension.
std::pair<std::int64_t, std::int64_t> parse_shape(const std::string& where, std::string_view v) {
  std::int64_t elements = 1, last = 0;
  const std::vector<std::string_view> dims = split(v, 'x');
  for (const std::string_view d : dims) {
    std::int64_t sum = 0;
    for (const std::string_view part : split(d, '+')) sum += parse_dim(where, "shape", part, 1);
    if (sum > kMaxDim || elements > kMaxDim / sum) bad_row(where, "a shape below 2^40 elements", v);
    elements *= sum;
    last = sum;
  }
  return {elements, last};
}

double log_interp(double x0, double x1, double y0, double y1, double x) {
  if (x1 == x0) return y0;
  const double a = (std::log(x) - std::log(x0)) / (std::log(x1) - std::log(x0));
  return std::exp(std::log(y0) + a * (std::log(y1) - std::log(y0)));
}

/// The bracketing entries of ascending `v` around x: (i, i) when x is one, nullopt outside.
std::optional<std::pair<size_t, size_t>> bracket(const std::vector<double>& v, double x) {
  if (v.empty() || !(x >= v.front() && x <= v.back())) return std::nullopt;
  const size_t hi = static_cast<size_t>(std::lower_bound(v.begin(), v.end(), x) - v.begin());
  if (v[hi] == x) return std::pair{hi, hi};
  return std::pair{hi - 1, hi};
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace

std::optional<double> KernelGrid::Series::at(double v) const {
  const auto b = bracket(x, v);
  if (!b) return std::nullopt;
  if (b->first == b->second) return t[b->first];
  return log_interp(x[b->first], x[b->second], t[b->first], t[b->second], v);
}

std::optional<double> KernelGrid::Series::reach(double v, double power, bool& extrapolated) const {
  if (x.empty()) return std::nullopt;
  if (v > x.back()) {
    extrapolated = true;
    return t.back() * std::pow(v / x.back(), power);
  }
  if (v < x.front()) {
    extrapolated = true;
    return t.front();
  }
  return at(v);
}

void KernelGrid::add_text(std::string_view text, const std::string& name) {
  files_.push_back(name);
  std::vector<std::string_view> lines = split(text, '\n');
  size_t header = 0;
  while (header < lines.size() && (trim(lines[header]).empty() || trim(lines[header])[0] == '#'))
    ++header;
  if (header == lines.size()) throw InputError(name + ": empty grid file (expected a CSV header)");
  const std::vector<std::string_view> cols = split(trim(lines[header]), ',');
  const auto col = [&](std::string_view c) -> std::optional<size_t> {
    for (size_t i = 0; i < cols.size(); ++i)
      if (trim(cols[i]) == c) return i;
    return std::nullopt;
  };
  enum class Kind { kGemm, kAttention, kMemory } kind{};
  std::vector<std::string_view> need;
  if (col("m") && col("n") && col("k")) {
    kind = Kind::kGemm;
    need = {"m", "n", "k", "dtype", "bias", "us_median"};
  } else if (col("q_tokens")) {
    kind = Kind::kAttention;
    need = {"batch", "q_tokens", "kv_tokens", "heads", "head_dim", "us_median"};
  } else if (col("op") && col("shape")) {
    kind = Kind::kMemory;
    need = {"op", "shape", "dtype", "us_median"};
  } else {
    throw InputError(name + ":" + std::to_string(header + 1) +
                     ": expected the header of a GEMM (m,n,k,...), attention (batch,q_tokens,...) "
                     "or memory (op,shape,...) grid, found \"" +
                     std::string(trim(lines[header]).substr(0, 120)) + "\"");
  }
  std::vector<size_t> at;
  for (const std::string_view c : need) {
    const auto i = col(c);
    if (!i)
      throw InputError(name + ":" + std::to_string(header + 1) + ": expected a column '" +
                       std::string(c) + "' in the header");
    at.push_back(*i);
  }
  for (size_t li = header + 1; li < lines.size(); ++li) {
    const std::string_view line = trim(lines[li]);
    if (line.empty() || line[0] == '#') continue;
    const std::string where = name + ":" + std::to_string(li + 1);
    const std::vector<std::string_view> f = split(line, ',');
    if (f.size() != cols.size())
      bad_row(where, std::to_string(cols.size()) + " comma-separated fields",
              std::string(line.substr(0, 120)));
    const auto v = [&](size_t j) { return trim(f[at[j]]); };
    Point p;
    p.source = where;
    if (kind == Kind::kGemm) {
      if (v(3) != "bf16") {
        ++skipped_rows_;
        continue;
      }
      const std::string_view b = v(4);
      if (b != "0" && b != "1") bad_row(where, "bias as 0 or 1", b);
      p.shape = gemm_shape(parse_dim(where, "m", v(0), 1), parse_dim(where, "n", v(1), 1),
                           parse_dim(where, "k", v(2), 1), b == "1");
      p.time_s = parse_us(where, "us_median", v(5)) * 1e-6;
    } else if (kind == Kind::kAttention) {
      p.shape =
          sdpa_shape(parse_dim(where, "batch", v(0), 1), parse_dim(where, "q_tokens", v(1), 1),
                     parse_dim(where, "kv_tokens", v(2), 1), parse_dim(where, "heads", v(3), 1),
                     parse_dim(where, "head_dim", v(4), 1));
      p.time_s = parse_us(where, "us_median", v(5)) * 1e-6;
    } else {
      const std::optional<KernelClass> c = kernel_class_of(v(0));
      if (!c || *c == KernelClass::kGemm || *c == KernelClass::kSdpa ||
          *c == KernelClass::kHostBlock || v(2) != "bf16") {
        ++skipped_rows_;  // a kernel the device model does not time by shape
        continue;
      }
      const auto [elements, width] = parse_shape(where, v(1));
      p.shape = memory_shape(*c, elements, width);
      p.time_s = parse_us(where, "us_median", v(3)) * 1e-6;
    }
    raw_.push_back(std::move(p));
  }
}

void KernelGrid::finish() {
  // Merge repeated shapes: the median of their times.
  std::map<std::pair<int, std::array<std::int64_t, 5>>, std::vector<const Point*>> by;
  for (const Point& p : raw_) by[{static_cast<int>(p.shape.kernel), p.shape.dims}].push_back(&p);
  points_.clear();
  gemm_.clear();
  self_.clear();
  cross_.clear();
  memory_.clear();
  for (const auto& [key, ps] : by) {
    std::vector<double> ts;
    for (const Point* p : ps) ts.push_back(p->time_s);
    points_.push_back({ps.front()->shape, median(std::move(ts)), ps.front()->source});
  }
  // Lookups. Attention merges batch x heads (a batch of 2 runs as twice the heads).
  std::map<std::pair<std::int64_t, std::pair<double, double>>, std::vector<double>> self;
  std::map<std::array<std::int64_t, 4>, std::vector<double>> cross;
  for (const Point& p : points_) {
    const auto& d = p.shape.dims;
    switch (p.shape.kernel) {
      case KernelClass::kGemm: {
        Series& s = gemm_[{d[1], d[2], d[3]}];
        s.x.push_back(static_cast<double>(d[0]));
        s.t.push_back(p.time_s);
        break;
      }
      case KernelClass::kSdpa: {
        const std::int64_t bh = d[0] * d[3];
        if (d[1] == d[2])
          self[{d[4], {static_cast<double>(bh), static_cast<double>(d[1])}}].push_back(p.time_s);
        else
          cross[{bh, d[1], d[2], d[4]}].push_back(p.time_s);
        break;
      }
      default: {
        Series& s = memory_[{static_cast<int>(p.shape.kernel), d[1]}];
        s.x.push_back(static_cast<double>(d[0]));
        s.t.push_back(p.time_s);
        break;
      }
    }
  }
  for (auto& [key, ts] : self) {  // by head_dim, then bh, then s: each row ascending in s
    AttentionGrid& g = self_[key.first];
    Series& r = g.rows[key.second.first];
    r.x.push_back(key.second.second);
    r.t.push_back(median(ts));
  }
  for (auto& [hd, g] : self_)
    for (const auto& [bh, row] : g.rows) g.bh.push_back(bh);
  for (auto& [key, ts] : cross) cross_[key] = median(ts);
  // Points were sorted by shape, so each series is ascending in its size already.
  const auto sort_series = [](Series& s) {
    std::vector<size_t> idx(s.x.size());
    for (size_t i = 0; i < idx.size(); ++i) idx[i] = i;
    std::sort(idx.begin(), idx.end(), [&](size_t a, size_t b) { return s.x[a] < s.x[b]; });
    Series o;
    for (const size_t i : idx)
      if (o.x.empty() || o.x.back() != s.x[i]) {
        o.x.push_back(s.x[i]);
        o.t.push_back(s.t[i]);
      }
    s = std::move(o);
  };
  for (auto& [k, s] : gemm_) sort_series(s);
  for (auto& [k, s] : memory_) sort_series(s);
}

KernelGrid KernelGrid::without(const std::function<bool(const Point&)>& drop) const {
  KernelGrid g;
  g.files_ = files_;
  for (const Point& p : points_)
    if (!drop(p)) g.raw_.push_back(p);
  g.finish();
  return g;
}

std::optional<double> KernelGrid::held_out(size_t i) const {
  const Point& p = points_.at(i);
  const auto& d = p.shape.dims;
  const auto between = [](const Series& s, double x) -> std::optional<double> {
    const size_t j = static_cast<size_t>(std::lower_bound(s.x.begin(), s.x.end(), x) - s.x.begin());
    if (j == 0 || j + 1 >= s.x.size() || s.x[j] != x) return std::nullopt;
    return log_interp(s.x[j - 1], s.x[j + 1], s.t[j - 1], s.t[j + 1], x);
  };
  switch (p.shape.kernel) {
    case KernelClass::kNone:
      return std::nullopt;
    case KernelClass::kGemm: {
      const auto it = gemm_.find({d[1], d[2], d[3]});
      return it == gemm_.end() ? std::nullopt : between(it->second, static_cast<double>(d[0]));
    }
    case KernelClass::kSdpa: {
      if (d[1] != d[2]) return std::nullopt;
      const auto git = self_.find(d[4]);
      if (git == self_.end()) return std::nullopt;
      const AttentionGrid& g = git->second;
      const double bh = static_cast<double>(d[0] * d[3]), s = static_cast<double>(d[1]);
      const auto row = g.rows.find(bh);  // this batch x heads' times over the tokens
      return row == g.rows.end() ? std::nullopt : between(row->second, s);
    }
    default: {
      const auto it = memory_.find({static_cast<int>(p.shape.kernel), d[1]});
      return it == memory_.end() ? std::nullopt : between(it->second, static_cast<double>(d[0]));
    }
  }
}

std::optional<double> KernelGrid::gemm_series(std::int64_t m, std::int64_t n, std::int64_t k,
                                              int bias, bool& extrapolated) const {
  auto it = gemm_.find({n, k, bias});
  if (it == gemm_.end()) it = gemm_.find({n, k, 1 - bias});
  if (it == gemm_.end()) return std::nullopt;
  return it->second.reach(static_cast<double>(m), 1.0, extrapolated);
}

std::optional<double> KernelGrid::gemm(std::int64_t m, std::int64_t n, std::int64_t k, int bias,
                                       bool& extrapolated) const {
  if (auto t = gemm_series(m, n, k, bias, extrapolated)) return t;
  // A weight shape not measured: the throughput between the nearest measured widths that
  // bracket it with the same k (else the same n), each at this m.
  for (const bool vary_n : {true, false}) {
    const std::int64_t want = vary_n ? n : k;
    std::optional<std::int64_t> lo, hi;
    for (const auto& [key, s] : gemm_) {
      if ((vary_n ? key[1] : key[0]) != (vary_n ? k : n)) continue;
      const std::int64_t w = vary_n ? key[0] : key[1];
      if (!s.at(static_cast<double>(m))) continue;
      if (w < want && (!lo || w > *lo)) lo = w;
      if (w > want && (!hi || w < *hi)) hi = w;
    }
    if (!lo || !hi) continue;
    const auto t_of = [&](std::int64_t w) {
      return vary_n ? *gemm_series(m, w, k, bias, extrapolated)
                    : *gemm_series(m, n, w, bias, extrapolated);
    };
    // throughput = flops / time, flops proportional to the width
    const double r_lo = static_cast<double>(*lo) / t_of(*lo);
    const double r_hi = static_cast<double>(*hi) / t_of(*hi);
    const double r = log_interp(static_cast<double>(*lo), static_cast<double>(*hi), r_lo, r_hi,
                                static_cast<double>(want));
    return static_cast<double>(want) / r;
  }
  return std::nullopt;
}

std::optional<double> KernelGrid::self_attention(std::int64_t head_dim, double bh, double s,
                                                 bool& extrapolated) const {
  const auto git = self_.find(head_dim);
  if (git == self_.end() || git->second.bh.empty()) return std::nullopt;
  const AttentionGrid& g = git->second;
  // One batch x heads' row over the tokens (the points measured: large ones may be missing),
  // at s; beyond its ends the nearest point's rate (work grows with s^2).
  const auto along_s = [&](double row) -> std::optional<double> {
    const auto it = g.rows.find(row);
    if (it == g.rows.end()) return std::nullopt;
    return it->second.reach(s, 2.0, extrapolated);
  };
  const double lo_bh = g.bh.front(), hi_bh = g.bh.back();
  if (bh > hi_bh || bh < lo_bh) {  // beyond the heads measured: linear in them above
    const double edge = bh > hi_bh ? hi_bh : lo_bh;
    const auto t = along_s(edge);
    if (!t) return std::nullopt;
    extrapolated = true;
    return bh > hi_bh ? *t * bh / hi_bh : *t;
  }
  const auto bb = bracket(g.bh, bh);
  const auto lo = along_s(g.bh[bb->first]);
  if (bb->first == bb->second) return lo;
  const auto hi = along_s(g.bh[bb->second]);
  if (!lo || !hi) return std::nullopt;
  return log_interp(g.bh[bb->first], g.bh[bb->second], *lo, *hi, bh);
}

std::optional<double> KernelGrid::attention(const std::array<std::int64_t, 5>& d,
                                            bool& extrapolated) const {
  const std::int64_t bh = d[0] * d[3];
  if (d[1] == d[2])
    return self_attention(d[4], static_cast<double>(bh), static_cast<double>(d[1]), extrapolated);
  if (const auto it = cross_.find({bh, d[1], d[2], d[4]}); it != cross_.end()) return it->second;
  // The self-attention of equal work per head: sqrt(q kv) tokens, scaled by nothing (q kv equal).
  const double s = std::sqrt(static_cast<double>(d[1]) * static_cast<double>(d[2]));
  return self_attention(d[4], static_cast<double>(bh), s, extrapolated);
}

std::optional<double> KernelGrid::memory(KernelClass c, std::int64_t elements, std::int64_t width,
                                         bool& extrapolated) const {
  const Series* best = nullptr;
  double best_d = 0;
  for (auto it = memory_.lower_bound({static_cast<int>(c), 0});
       it != memory_.end() && it->first.first == static_cast<int>(c); ++it) {
    const double dist = std::abs(std::log(static_cast<double>(it->first.second)) -
                                 std::log(static_cast<double>(std::max<std::int64_t>(width, 1))));
    if (best == nullptr || dist < best_d) {
      best = &it->second;
      best_d = dist;
    }
  }
  if (best == nullptr) return std::nullopt;
  return best->reach(static_cast<double>(elements), 1.0, extrapolated);
}

std::optional<double> KernelGrid::time_s(const KernelShape& shape, bool* extrapolated) const {
  bool beyond = false;
  const std::optional<double> t = time_of(shape, beyond);
  if (extrapolated != nullptr) *extrapolated = t && beyond;
  return t;
}

std::optional<double> KernelGrid::time_of(const KernelShape& shape, bool& extrapolated) const {
  const auto& d = shape.dims;
  switch (shape.kernel) {
    case KernelClass::kNone:
      return std::nullopt;
    case KernelClass::kGemm:
      if (d[0] <= 0 || d[1] <= 0 || d[2] <= 0) return std::nullopt;
      return gemm(d[0], d[1], d[2], static_cast<int>(d[3]), extrapolated);
    case KernelClass::kSdpa:
      if (d[0] <= 0 || d[1] <= 0 || d[2] <= 0 || d[3] <= 0 || d[4] <= 0) return std::nullopt;
      return attention(d, extrapolated);
    default:
      if (d[0] <= 0) return std::nullopt;
      return memory(shape.kernel, d[0], d[1], extrapolated);
  }
}

std::shared_ptr<const KernelGrid> KernelGrid::load(const std::vector<std::filesystem::path>& dirs) {
  static std::mutex mu;
  static std::map<std::vector<std::string>, std::shared_ptr<const KernelGrid>> cache;
  std::vector<std::string> key;
  key.reserve(dirs.size());
  for (const auto& d : dirs)
    key.push_back(std::filesystem::absolute(d).lexically_normal().string());
  std::lock_guard<std::mutex> lock(mu);
  if (const auto it = cache.find(key); it != cache.end()) return it->second;
  auto g = std::make_shared<KernelGrid>();
  for (const auto& dir : dirs) {
    std::error_code ec;
    if (!std::filesystem::is_directory(dir, ec))
      throw InputError(dir.string() +
                       ": expected a directory of kernel grids (gemm.csv, "
                       "attention.csv, memory.csv), found none");
    int found = 0;
    for (const char* f : {"gemm.csv", "attention.csv", "memory.csv"}) {
      const std::filesystem::path file = dir / f;
      if (!std::filesystem::exists(file, ec)) continue;
      if (!std::filesystem::is_regular_file(file, ec))
        throw InputError(file.string() + ": expected a grid file, found something else");
      if (std::filesystem::file_size(file, ec) > static_cast<std::uintmax_t>(kMaxGridFileBytes))
        throw InputError(file.string() + ": expected a grid file of at most 64 MiB, found more");
      std::ifstream in(file, std::ios::binary);
      if (!in) throw InputError(file.string() + ": cannot read the grid file");
      std::ostringstream os;
      os << in.rdbuf();
      g->add_text(os.str(), file.string());
      ++found;
    }
    if (found == 0)
      throw InputError(dir.string() +
                       ": expected gemm.csv, attention.csv or memory.csv in it, found none");
  }
  g->finish();
  if (g->empty())
    throw InputError(key.empty() ? std::string("device.grid")
                                 : key.front() + ": the grid files hold no bf16 point");
  std::shared_ptr<const KernelGrid> done = std::move(g);
  cache.emplace(std::move(key), done);
  return done;
}

}  // namespace cocodiff
