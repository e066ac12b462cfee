#include "calibrate/measurements.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "core/errors.hpp"
#include "net_models/kernel_grid.hpp"

namespace cocodiff::calibrate {

namespace {

using apps::BenchOp;

struct Line {
  std::size_t number = 0;  // from 1
  std::string_view text;   // without the line end
};

std::string_view trim(std::string_view s) {
  const size_t a = s.find_first_not_of(" \t\r");
  if (a == std::string_view::npos) return {};
  return s.substr(a, s.find_last_not_of(" \t\r") - a + 1);
}

std::vector<std::string_view> split(std::string_view s, char sep) {
  std::vector<std::string_view> out;
  for (;;) {
    const size_t k = s.find(sep);
    out.push_back(trim(s.substr(0, k)));
    if (k == std::string_view::npos) return out;
    s.remove_prefix(k + 1);
  }
}

std::vector<std::string_view> words(std::string_view s) {
  std::vector<std::string_view> out;
  size_t i = 0;
  while (i < s.size()) {
    while (i < s.size() && (s[i] == ' ' || s[i] == '\t' || s[i] == '\r')) ++i;
    const size_t a = i;
    while (i < s.size() && s[i] != ' ' && s[i] != '\t' && s[i] != '\r') ++i;
    if (i > a) out.push_back(s.substr(a, i - a));
  }
  return out;
}

// A value as it appears in an error: quoted, control characters escaped, at most 40 chars.
std::string shown(std::string_view s) {
  std::string out = "\"";
  for (size_t i = 0; i < s.size() && i < 40; ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x20 || c >= 0x7f || c == '"' || c == '\\') {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  if (s.size() > 40) out += "...";
  return out + "\"";
}

[[noreturn]] void bad(const std::string& where, const std::string& expected,
                      const std::string& found) {
  throw InputError(where + ": expected " + expected + ", found " + found);
}

std::string at(const std::string& name, std::size_t line) {
  return name + ":" + std::to_string(line);
}

bool parse_int(std::string_view s, std::int64_t& v) {
  const auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  return ec == std::errc() && p == s.data() + s.size() && !s.empty();
}

bool parse_double(std::string_view s, double& v) {
  const auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  return ec == std::errc() && p == s.data() + s.size() && !s.empty() && std::isfinite(v);
}

std::int64_t int_in(std::string_view s, const std::string& where, const std::string& what,
                    std::int64_t lo, std::int64_t hi) {
  std::int64_t v = 0;
  const std::string expected =
      what + " (an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "])";
  if (!parse_int(s, v) || v < lo || v > hi) bad(where, expected, shown(s));
  return v;
}

double double_in(std::string_view s, const std::string& where, const std::string& what, double lo,
                 double hi) {
  double v = 0;
  char range[96];
  std::snprintf(range, sizeof range, " (a number in [%g, %g])", lo, hi);
  if (!parse_double(s, v) || v < lo || v > hi) bad(where, what + range, shown(s));
  return v;
}

double time_us(std::string_view s, const std::string& where, const std::string& what) {
  return double_in(s, where, what, kMinTimeUs, kMaxTimeUs);
}

// A line without the tag `mpirun --tag-output` puts before it: "[JOB,RANK]<stdout>:" (or
// <stderr>, <stddiag>). Every rank's copy of a line reads alike.
std::string_view without_launcher_tag(std::string_view l) {
  if (l.empty() || l[0] != '[') return l;
  size_t i = 1;
  auto digits = [&] {
    const size_t from = i;
    while (i < l.size() && l[i] >= '0' && l[i] <= '9') ++i;
    return i > from;
  };
  if (!digits() || i >= l.size() || l[i++] != ',' || !digits() || i >= l.size() || l[i++] != ']')
    return l;
  for (const std::string_view stream : {"<stdout>:", "<stderr>:", "<stddiag>:"})
    if (l.substr(i, stream.size()) == stream) return l.substr(i + stream.size());
  return l;
}

std::vector<Line> lines_of(std::string_view text, const std::string& name) {
  std::vector<Line> out;
  std::size_t number = 0;
  while (!text.empty()) {
    ++number;
    const size_t k = text.find('\n');
    const std::string_view l = text.substr(0, k);
    if (l.size() > kMaxLineChars)
      bad(at(name, number), "a line of at most " + std::to_string(kMaxLineChars) + " characters",
          std::to_string(l.size()) + " characters (not a measurements file?)");
    if (l.find('\0') != std::string_view::npos)
      bad(at(name, number), "text", "a NUL byte (not a measurements file?)");
    out.push_back({number, without_launcher_tag(l)});
    if (k == std::string_view::npos) break;
    text.remove_prefix(k + 1);
  }
  return out;
}

std::string op_list() { return "all_to_all | all_gather | reduce_scatter | all_reduce | sendrecv"; }

// ---- CSV ----

void read_collective_csv(const std::vector<Line>& lines, size_t header, const std::string& name,
                         Measurements& m, std::vector<CollectivePoint>& out) {
  const std::vector<std::string_view> cols = split(lines[header].text, ',');
  std::map<std::string, size_t, std::less<>> col;
  for (size_t i = 0; i < cols.size(); ++i) {
    if (!col.emplace(std::string(cols[i]), i).second)
      bad(at(name, lines[header].number), "distinct column names", shown(cols[i]) + " twice");
  }
  for (const char* req : {"op", "ranks", "bytes", "time_us"})
    if (col.find(req) == col.end())
      bad(at(name, lines[header].number),
          "a header naming op, ranks, bytes and time_us (and optionally nodes, transport)",
          shown(lines[header].text));
  for (const auto& [c, i] : col)
    if (c != "op" && c != "ranks" && c != "bytes" && c != "time_us" && c != "nodes" &&
        c != "transport")
      m.ignored_columns.insert(name + ": " + (c.empty() ? "(empty)" : c));
  auto field = [&](const std::vector<std::string_view>& f, const char* c) {
    auto it = col.find(c);
    return it == col.end() ? std::string_view() : f[it->second];
  };
  for (size_t i = header + 1; i < lines.size(); ++i) {
    const std::string_view t = trim(lines[i].text);
    if (t.empty() || t[0] == '#') continue;
    const std::string where = at(name, lines[i].number);
    const std::vector<std::string_view> f = split(lines[i].text, ',');
    if (f.size() != cols.size())
      bad(where, std::to_string(cols.size()) + " fields (as the header)", std::to_string(f.size()));
    CollectivePoint p;
    p.where = where;
    if (!apps::parse_bench_op(field(f, "op"), p.op)) bad(where, "op " + op_list(), shown(f[0]));
    p.ranks = static_cast<int>(int_in(field(f, "ranks"), where, "ranks", 1, kMaxRanks));
    if (col.count("nodes") != 0)
      p.nodes = static_cast<int>(int_in(field(f, "nodes"), where, "nodes", 1, p.ranks));
    p.bytes = int_in(field(f, "bytes"), where, "bytes", 1, kMaxBytes);
    p.time_us = time_us(field(f, "time_us"), where, "time_us");
    p.transport = std::string(field(f, "transport"));
    out.push_back(std::move(p));
  }
}

bool parse_kind(std::string_view s, OpKind& out) {
  for (int k = 0; k < kNumOpKinds; ++k) {
    if (op_kind_name(static_cast<OpKind>(k)) == s) {
      out = static_cast<OpKind>(k);
      return true;
    }
  }
  return false;
}

// A label cocodiff charges, which the written cluster file uses as a TOML key: bare-key
// characters only, so that it reads back as the same one key.
bool is_label(std::string_view s) {
  if (s.empty() || s.size() > 64) return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '-';
  });
}

void read_kernel_csv(const std::vector<Line>& lines, size_t header, const std::string& name,
                     std::vector<KernelPoint>& out) {
  for (size_t i = header + 1; i < lines.size(); ++i) {
    const std::string_view t = trim(lines[i].text);
    if (t.empty() || t[0] == '#') continue;
    const std::string where = at(name, lines[i].number);
    const std::vector<std::string_view> f = split(lines[i].text, ',');
    if (f.size() != 5)
      bad(where, "5 fields (op,kind,flops,bytes,time_us)", std::to_string(f.size()));
    KernelPoint p;
    p.where = where;
    if (!is_label(f[0]))
      bad(where,
          "an op label of at most 64 letters, digits, '_' and '-' (the label cocodiff charges)",
          shown(f[0]));
    p.op = std::string(f[0]);
    if (!parse_kind(f[1], p.kind))
      bad(where, "kind gemm | attention | norm | elementwise | copy", shown(f[1]));
    p.flops = double_in(f[2], where, "flops", 0, 1e18);
    p.bytes = double_in(f[3], where, "bytes", 0, 1e15);
    p.time_us = time_us(f[4], where, "time_us");
    if (!(p.flops > 0 || p.bytes > 0)) bad(where, "flops or bytes > 0", "both 0");
    out.push_back(std::move(p));
  }
}

void read_eager_csv(const std::vector<Line>& lines, size_t header, const std::string& name,
                    std::vector<EagerOpPoint>& out) {
  for (size_t i = header + 1; i < lines.size(); ++i) {
    const std::string_view t = trim(lines[i].text);
    if (t.empty() || t[0] == '#') continue;
    const std::string where = at(name, lines[i].number);
    const std::vector<std::string_view> f = split(lines[i].text, ',');
    if (f.size() != 9)
      bad(where, "9 fields (op,label,tokens,heads,k,n,flops,device_us,host_us)",
          std::to_string(f.size()));
    EagerOpPoint p;
    p.where = where;
    for (int k : {0, 1})
      if (!is_label(f[static_cast<size_t>(k)]))
        bad(where,
            std::string(k == 0 ? "an op" : "a label") +
                " of at most 64 letters, digits, '_' and '-'",
            shown(f[static_cast<size_t>(k)]));
    p.op = std::string(f[0]);
    p.label = std::string(f[1]);
    for (size_t k = 2; k < 6; ++k)
      p.dims[k - 2] = int_in(f[k], where,
                             k == 2   ? "tokens"
                             : k == 3 ? "heads"
                             : k == 4 ? "k"
                                      : "n",
                             0, std::int64_t{1} << 40);
    if (!f[6].empty()) p.flops = double_in(f[6], where, "flops", 0, 1e18);
    if (!f[7].empty()) p.device_us = time_us(f[7], where, "device_us");
    if (!f[8].empty()) p.host_us = time_us(f[8], where, "host_us");
    if (p.device_us < 0 && p.host_us < 0) bad(where, "device_us or host_us", "both empty");
    out.push_back(std::move(p));
  }
}

// measure_multi.py's steps_*.csv.
void read_steps_csv(const std::vector<Line>& lines, size_t header, const std::string& name,
                    std::vector<StepPoint>& out) {
  for (size_t i = header + 1; i < lines.size(); ++i) {
    const std::string_view t = trim(lines[i].text);
    if (t.empty() || t[0] == '#') continue;
    const std::string where = at(name, lines[i].number);
    const std::vector<std::string_view> f = split(lines[i].text, ',');
    if (f.size() != 10)
      bad(where,
          "10 fields (strategy,gpus,resolution,image_tokens,median_ms,min_ms,max_ms,"
          "host_issue_ms,transport,timed_steps)",
          std::to_string(f.size()));
    StepPoint p;
    p.where = where;
    p.source = name;
    if (!is_label(f[0])) bad(where, "a strategy of letters, digits, '_' and '-'", shown(f[0]));
    p.strategy = std::string(f[0]);
    p.gpus = static_cast<int>(int_in(f[1], where, "gpus", 1, kMaxRanks));
    p.resolution = static_cast<int>(int_in(f[2], where, "resolution", 16, 1 << 16));
    if (p.resolution % 16 != 0)
      bad(where, "a resolution divisible by 16 (FLUX.1-dev's pixels per token side)", shown(f[2]));
    int_in(f[3], where, "image_tokens", 1, std::int64_t{1} << 32);
    p.median_ms = double_in(f[4], where, "median_ms", kMinTimeUs / 1e3, kMaxTimeUs / 1e3);
    const double lo = double_in(f[5], where, "min_ms", kMinTimeUs / 1e3, kMaxTimeUs / 1e3);
    const double hi = double_in(f[6], where, "max_ms", kMinTimeUs / 1e3, kMaxTimeUs / 1e3);
    if (lo > p.median_ms || p.median_ms > hi)
      bad(where, "min_ms <= median_ms <= max_ms",
          std::string(f[5]) + ", " + std::string(f[4]) + ", " + std::string(f[6]));
    double_in(f[7], where, "host_issue_ms", 0, kMaxTimeUs / 1e3);
    if (!f[8].empty() && !is_label(f[8]))
      bad(where, "a transport of letters, digits, '_' and '-'", shown(f[8]));
    p.transport = std::string(f[8]);
    int_in(f[9], where, "timed_steps", 1, 1 << 20);
    out.push_back(std::move(p));
  }
}

// ---- nccl-tests ----

struct Section {
  size_t first_line = 0;  // the line that opened it
  std::string op_name;    // NAME of NAME_perf, if a line said
  std::string binary;     // NAME of a NAME_perf binary named in the log (a command line)
  std::map<std::int64_t, std::string> rank_host;
  std::vector<CollectivePoint> rows;  // op, ranks, nodes filled in at the end
};

// "NAME_perf" anywhere in s (a binary name on a command line or in a path): NAME.
std::string perf_binary(std::string_view s) {
  for (size_t k = s.find("_perf"); k != std::string_view::npos; k = s.find("_perf", k + 1)) {
    size_t a = k;
    while (a > 0 && (std::isalnum(static_cast<unsigned char>(s[a - 1])) != 0 || s[a - 1] == '_'))
      --a;
    BenchOp op{};
    if (a < k && apps::parse_bench_op(s.substr(a, k - a), op))
      return std::string(s.substr(a, k - a));
  }
  return "";
}

// A comment line of an nccl-tests log: a header (which may open the next test's section), the
// test's name, or a rank and its host.
void read_nccl_comment(std::string_view t, const std::vector<std::string_view>& w,
                       const std::string& where, size_t number, std::vector<Section>& sections,
                       std::string& pending) {
  const bool starting = t.find("Collective test starting") != std::string_view::npos;
  const bool header = starting || (w.size() >= 2 && w[1] == "nThread");
  // A header after rows, or a second test's first line, opens the next test's section.
  if (header && (!sections.back().rows.empty() || (starting && !sections.back().op_name.empty()))) {
    sections.emplace_back();
    sections.back().binary = std::move(pending);
    pending.clear();
  }
  Section& s = sections.back();
  if (header && s.first_line == 0) s.first_line = number;
  if (starting) {
    const size_t colon = t.find(':');
    const std::string_view what = colon == std::string_view::npos ? "" : trim(t.substr(colon + 1));
    std::string_view bare = what;
    if (bare.size() > 5 && bare.substr(bare.size() - 5) == "_perf") bare.remove_suffix(5);
    BenchOp op{};
    if (!apps::parse_bench_op(bare, op))
      bad(where, "a test of " + op_list() + " (alltoall_perf, all_gather_perf, ...)", shown(what));
    s.op_name = std::string(bare);
    return;
  }
  // "#  Rank  0 Group  0 Pid 123 on host device  0 [0x07] NVIDIA H100"
  if (w.size() >= 3 && w[1] == "Rank") {
    std::int64_t rank = 0;
    if (!parse_int(w[2], rank) || rank < 0 || rank >= kMaxRanks)
      bad(where, "a rank number in [0, " + std::to_string(kMaxRanks - 1) + "]", shown(w[2]));
    auto on = std::find(w.begin(), w.end(), std::string_view("on"));
    if (on == w.end() || on + 1 == w.end())
      bad(where, "\"#  Rank N ... on HOST device D\"", shown(t));
    if (!s.rank_host.emplace(rank, std::string(*(on + 1))).second)
      bad(where,
          "each rank listed once (nccl-tests built without MPI lists every process as rank 0)",
          "rank " + std::to_string(rank) + " again");
  }
}

// Any other line of an nccl-tests log: a data row's points into the current section, or a
// launcher's or NCCL's own line (which may name the test's binary).
void read_nccl_row(std::string_view t, const std::vector<std::string_view>& w,
                   const std::string& where, std::vector<Section>& sections, std::string& pending,
                   Measurements& m) {
  // A data row: size count type redop root time algbw busbw #wrong [time algbw busbw #wrong].
  std::int64_t size = 0, count = 0;
  // A line that opens with a digit is meant as a data row: one that is not a whole one (cut
  // off, a size that is no integer or overflows) is an error, never a row dropped in silence.
  const bool numeric = !w.empty() && !w[0].empty() && w[0][0] >= '0' && w[0][0] <= '9' &&
                       w[0].find_first_not_of("0123456789.") == std::string_view::npos;
  if (numeric && (w.size() < 9 || !parse_int(w[0], size) || !parse_int(w[1], count)))
    bad(where,
        "a data row of nccl-tests: size count type redop root time algbw busbw #wrong (and the "
        "in-place time algbw busbw #wrong), size and count integers",
        shown(t));
  if (w.size() < 9 || !parse_int(w[0], size) || !parse_int(w[1], count)) {
    const std::string b = perf_binary(t);
    if (!b.empty() && sections.back().rows.empty() && sections.back().binary.empty())
      sections.back().binary = b;
    else if (!b.empty())
      pending = b;
    return;  // a launcher's or NCCL's own line
  }
  Section& s = sections.back();
  if (size < 0 || size > kMaxBytes)
    bad(where, "a size in bytes in [0, " + std::to_string(kMaxBytes) + "]", shown(w[0]));
  // #wrong: the values the test found wrong (N/A without a check). A row with any is the time
  // of a failed run.
  for (const size_t col : {size_t{8}, size_t{12}}) {
    std::int64_t wrong = 0;
    if (col < w.size() && w[col] != "N/A" && (!parse_int(w[col], wrong) || wrong != 0))
      bad(where, "#wrong 0 or N/A (a row whose values the test found wrong is a failed run)",
          shown(w[col]));
  }
  for (const auto& [col, variant] :
       {std::pair<size_t, const char*>{5, "out-of-place"}, {9, "in-place"}}) {
    if (col >= w.size()) continue;
    if (w[col] == "N/A" || size == 0) {
      ++m.skipped_rows;
      continue;
    }
    CollectivePoint p;
    p.where = where;
    p.bytes = size;
    p.variant = variant;
    p.time_us = time_us(w[col], where, std::string("an ") + variant + " time in us");
    s.rows.push_back(std::move(p));
  }
}

// The test a log's file name names ("all_reduce_perf.log", or an older "alltoall.txt"), or "".
std::string nccl_file_op_name(const std::string& name) {
  std::string file_op_name = perf_binary(name);
  if (file_op_name.empty()) {
    // Older logs were named after the test without _perf (alltoall.txt, all_reduce.log).
    for (const char* n : {"alltoall", "all_to_all", "all_gather", "allgather", "reduce_scatter",
                          "reducescatter", "all_reduce", "allreduce", "sendrecv"})
      if (name.find(n) != std::string::npos) file_op_name = n;
  }
  return file_op_name;
}

// Each section's rows as points, with the section's test, ranks and nodes.
void nccl_section_points(std::vector<Section>& sections, const std::string& name,
                         std::vector<CollectivePoint>& out) {
  const std::string file_op_name = nccl_file_op_name(name);
  for (Section& s : sections) {
    if (s.rows.empty()) continue;
    const std::string where = at(name, s.first_line == 0 ? 1 : s.first_line);
    std::string op_name = s.op_name.empty() ? s.binary : s.op_name;
    if (op_name.empty()) op_name = file_op_name;
    BenchOp op{};
    if (op_name.empty() || !apps::parse_bench_op(op_name, op))
      bad(where,
          "a \"# Collective test starting: NAME_perf\" line, a NAME_perf binary in the log, or a "
          "file named after the test, NAME one of " +
              op_list(),
          "none");
    if (s.rank_host.empty())
      bad(where, "\"#  Rank N ... on HOST\" lines (one per rank) before the results", "none");
    const auto ranks = static_cast<std::int64_t>(s.rank_host.size());
    if (s.rank_host.rbegin()->first != ranks - 1)
      bad(where, "ranks 0.." + std::to_string(ranks - 1) + " listed",
          "rank " + std::to_string(s.rank_host.rbegin()->first));
    std::set<std::string> hosts;
    for (const auto& [r, h] : s.rank_host) hosts.insert(h);
    for (CollectivePoint& p : s.rows) {
      p.op = op;
      p.ranks = static_cast<int>(ranks);
      p.nodes = static_cast<int>(hosts.size());
      out.push_back(std::move(p));
    }
  }
}

void read_nccl_tests(const std::vector<Line>& lines, const std::string& name, Measurements& m,
                     std::vector<CollectivePoint>& out) {
  std::vector<Section> sections(1);
  std::string pending;  // a binary named after a test's rows: the next test's
  for (const Line& l : lines) {
    const std::string_view t = trim(l.text);
    if (t.empty()) continue;
    const std::string where = at(name, l.number);
    const std::vector<std::string_view> w = words(t);
    if (t[0] == '#')
      read_nccl_comment(t, w, where, l.number, sections, pending);
    else
      read_nccl_row(t, w, where, sections, pending, m);
  }
  nccl_section_points(sections, name, out);
}

// ---- cocodiff netbench ----

// "# cocodiff netbench: all_to_all, algo flat (pairwise rounds), cluster X, 1 node(s), 8 ranks,"
void read_netbench_text(const std::vector<Line>& lines, size_t first, const std::string& name,
                        std::vector<CollectivePoint>& out) {
  const std::string where0 = at(name, lines[first].number);
  const std::string_view head = trim(lines[first].text);
  const std::vector<std::string_view> parts = split(head.substr(head.find(':') + 1), ',');
  CollectivePoint proto;
  if (parts.empty() || !apps::parse_bench_op(parts[0], proto.op))
    bad(where0, "the op after \"# cocodiff netbench:\"", shown(head));
  for (std::string_view part : parts) {
    const std::vector<std::string_view> w = words(part);
    if (w.size() == 2 && w[1] == "node(s)")
      proto.nodes = static_cast<int>(int_in(w[0], where0, "nodes", 1, kMaxRanks));
    if (w.size() == 2 && w[1] == "ranks")
      proto.ranks = static_cast<int>(int_in(w[0], where0, "ranks", 1, kMaxRanks));
    if (w.size() >= 2 && w[0] == "algo" && w[1] != "flat")
      bad(where0, "a flat collective (calibrate fits the library's own collectives)",
          "algo " + std::string(w[1]));
  }
  if (proto.ranks == 0 || proto.nodes == 0 || proto.nodes > proto.ranks)
    bad(where0, "\"N node(s), M ranks\" in the netbench line", shown(head));
  for (size_t i = first + 1; i < lines.size(); ++i) {
    const std::string_view t = trim(lines[i].text);
    if (t.empty() || t[0] == '#') continue;
    const std::string where = at(name, lines[i].number);
    const std::vector<std::string_view> w = words(t);
    if (w.size() < 3) bad(where, "a row: bytes count/peer time(us) ...", shown(t));
    CollectivePoint p = proto;
    p.where = where;
    p.bytes = int_in(w[0], where, "bytes", 1, kMaxBytes);
    p.time_us = time_us(w[2], where, "a time in us");
    out.push_back(std::move(p));
  }
}

void read_netbench_json(std::string_view text, const std::string& name,
                        std::vector<CollectivePoint>& out) {
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object())
    bad(name, "netbench --json output (a JSON object)", "other text");
  auto get = [&](const nlohmann::json& o, const char* k,
                 const std::string& where) -> const nlohmann::json& {
    auto it = o.find(k);
    if (it == o.end()) bad(where, std::string("a key \"") + k + "\"", "none");
    return *it;
  };
  auto integer = [&](const nlohmann::json& v, const std::string& where, const char* what,
                     std::int64_t lo, std::int64_t hi) {
    if (!v.is_number_integer() || v.get<std::int64_t>() < lo || v.get<std::int64_t>() > hi)
      bad(where,
          std::string(what) + " (an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) +
              "])",
          shown(v.dump()));
    return v.get<std::int64_t>();
  };
  CollectivePoint proto;
  const nlohmann::json& op = get(j, "op", name);
  if (!op.is_string() || !apps::parse_bench_op(op.get<std::string>(), proto.op))
    bad(name + ": op", op_list(), shown(op.dump()));
  if (j.contains("algo") && j["algo"] != "flat")
    bad(name + ": algo", "a flat collective", shown(j["algo"].dump()));
  proto.ranks =
      static_cast<int>(integer(get(j, "ranks", name), name + ": ranks", "ranks", 1, kMaxRanks));
  proto.nodes =
      static_cast<int>(integer(get(j, "nodes", name), name + ": nodes", "nodes", 1, proto.ranks));
  const nlohmann::json& rows = get(j, "rows", name);
  if (!rows.is_array()) bad(name + ": rows", "an array", shown(rows.dump()));
  for (size_t i = 0; i < rows.size(); ++i) {
    const std::string where = name + ": rows[" + std::to_string(i) + "]";
    if (!rows[i].is_object()) bad(where, "an object", shown(rows[i].dump()));
    CollectivePoint p = proto;
    p.where = where;
    p.bytes = integer(get(rows[i], "bytes", where), where + ".bytes", "bytes", 1, kMaxBytes);
    const std::int64_t ns = integer(get(rows[i], "time_ns", where), where + ".time_ns", "time_ns",
                                    1, static_cast<std::int64_t>(kMaxTimeUs * 1e3));
    p.time_us = static_cast<double>(ns) * 1e-3;
    out.push_back(std::move(p));
  }
}

// "16MiB" and the like: bytes.
std::int64_t size_bytes(const std::string& s) {
  std::int64_t v = 0;
  const auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || v <= 0) return 0;
  const std::string_view unit(p, static_cast<size_t>(s.data() + s.size() - p));
  const int shift = unit == "B"     ? 0
                    : unit == "KiB" ? 10
                    : unit == "MiB" ? 20
                    : unit == "GiB" ? 30
                                    : -1;
  if (shift < 0 || v > (kMaxBytes >> shift)) return 0;
  return v << shift;
}

// measure_multi.py's interference JSON: every KERNEL_with_a2a_SIZE_us whose three partners
// (KERNEL_alone_us, all_to_all_SIZE_alone_us, all_to_all_SIZE_with_KERNEL_us) are there.
void read_interference_json(const nlohmann::json& j, const std::string& name,
                            std::vector<InterferencePoint>& out) {
  auto number = [&](const std::string& key) {
    const nlohmann::json& v = j.at(key);
    if (!v.is_number() || !std::isfinite(v.get<double>()) || v.get<double>() < kMinTimeUs ||
        v.get<double>() > kMaxTimeUs)
      bad(name + ": " + key, "a time in us", shown(v.dump()));
    return v.get<double>();
  };
  int world = 0;
  if (j.contains("world")) {
    const nlohmann::json& w = j.at("world");
    if (!w.is_number_integer() || w.get<std::int64_t>() < 2 || w.get<std::int64_t>() > (1 << 20))
      bad(name + ": world", "a number of GPUs (2 or more)", shown(w.dump()));
    world = static_cast<int>(w.get<std::int64_t>());
  }
  const std::string with = "_with_a2a_", tail = "_us";
  for (const auto& [key, v] : j.items()) {
    const size_t k = key.find(with);
    if (k == std::string::npos || key.size() < tail.size() ||
        key.compare(key.size() - tail.size(), tail.size(), tail) != 0)
      continue;
    InterferencePoint p;
    p.kernel = key.substr(0, k);
    p.size = key.substr(k + with.size(), key.size() - tail.size() - k - with.size());
    p.world = world;
    p.where = name;
    p.where.append(": ").append(p.kernel).append(" with ").append(p.size);
    p.bytes = size_bytes(p.size);
    if (p.bytes == 0) bad(p.where, "a size such as 256MiB in " + key, shown(p.size));
    // The partners: KERNEL_alone_us, all_to_all_SIZE_alone_us, all_to_all_SIZE_with_KERNEL_us.
    std::string kernel_alone = p.kernel, a2a_alone = "all_to_all_", a2a_with = "all_to_all_";
    kernel_alone.append("_alone_us");
    a2a_alone.append(p.size).append("_alone_us");
    a2a_with.append(p.size).append("_with_").append(p.kernel).append("_us");
    for (const std::string* need : {&kernel_alone, &a2a_alone, &a2a_with})
      if (!j.contains(*need)) bad(name, "a key \"" + *need + "\" beside \"" + key + "\"", "none");
    p.kernel_alone_us = number(kernel_alone);
    p.kernel_with_us = number(key);
    p.a2a_alone_us = number(a2a_alone);
    p.a2a_with_us = number(a2a_with);
    out.push_back(std::move(p));
  }
  if (out.empty())
    bad(name, "interference times (KERNEL_with_a2a_SIZE_us and their partners)", "none");
}

// A JSON case's number `k` in [lo, hi], named `where: k` when it is not; a missing key is
// reported as found `missing`.
double case_number(const nlohmann::json& c, const std::string& where, const char* k, double lo,
                   double hi, const std::string& missing = "none") {
  if (!c.contains(k)) bad(where, std::string("a key \"") + k + "\"", missing);
  const nlohmann::json& v = c.at(k);
  if (!v.is_number() || !std::isfinite(v.get<double>()) || v.get<double>() < lo ||
      v.get<double>() > hi)
    bad(where + ": " + k, "a number in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]",
        shown(v.dump()));
  return v.get<double>();
}

// measure_multi.py's breakdown JSON: every case of two or more GPUs.
void read_breakdown_json(const nlohmann::json& j, const std::string& name,
                         std::vector<BreakdownPoint>& out) {
  const nlohmann::json& cases = j.at("cases");
  if (!cases.is_object() || cases.empty())
    bad(name + ": cases", "an object of cases", shown(cases.dump()));
  for (const auto& item : cases.items()) {
    const nlohmann::json& c = item.value();
    BreakdownPoint p;
    p.where = name;
    p.where.append(": case ").append(item.key());
    if (!c.is_object()) bad(p.where, "an object", shown(c.dump()));
    auto number = [&](const char* k, double lo, double hi) {
      const bool old = std::string_view(k).rfind("segment", 0) == 0;
      return case_number(
          c, p.where, k, lo, hi,
          old ? "none (a breakdown file from before segment times were measured)" : "none");
    };
    p.gpus = static_cast<int>(number("gpus", 1, static_cast<double>(kMaxRanks)));
    if (static_cast<double>(p.gpus) != c.at("gpus").get<double>())
      bad(p.where + ": gpus", "a whole number", shown(c.at("gpus").dump()));
    const double max_ms = kMaxTimeUs * 1e-3;
    p.step_ms = number("step_ms", kMinTimeUs * 1e-3, max_ms);
    p.rest_ms_min = number("rest_ms_min", 0, max_ms);
    p.rest_ms_max = number("rest_ms_max", p.rest_ms_min, max_ms);
    p.segment_wait_ms = number("segment_wait_ms", 0, max_ms);
    p.host_late_ms_max = number("host_late_ms_max", 0, max_ms);
    if (p.gpus >= 2) out.push_back(std::move(p));
  }
  if (out.empty()) bad(name, "a case of two or more GPUs", "none");
}

// measure_multi.py's chunks.json: every case.
void read_chunks_json(const nlohmann::json& j, const std::string& name,
                      std::vector<ChunkPoint>& out) {
  const nlohmann::json& cases = j.at("cases");
  if (cases.empty()) bad(name + ": cases", "a case", "none");
  for (size_t i = 0; i < cases.size(); ++i) {
    const nlohmann::json& c = cases[i];
    ChunkPoint p;
    p.where = name + ": case " + std::to_string(i + 1);
    if (!c.is_object()) bad(p.where, "an object", shown(c.dump()));
    auto number = [&](const char* k, double lo, double hi) {
      return case_number(c, p.where, k, lo, hi);
    };
    auto whole = [&](const char* k, double lo, double hi) {
      const double v = number(k, lo, hi);
      if (std::floor(v) != v) bad(p.where + ": " + k, "a whole number", shown(c.at(k).dump()));
      return static_cast<int>(v);
    };
    p.ranks = whole("ranks", 1, static_cast<double>(kMaxRanks));
    p.resolution = whole("resolution", 1, 1 << 20);
    p.chunks = whole("chunks", 1, 1 << 20);
    p.norm_us = number("norm_us", kMinTimeUs, kMaxTimeUs);
    p.norm_contig_us = number("norm_contig_us", kMinTimeUs, kMaxTimeUs);
    out.push_back(std::move(p));
  }
}

/// A JSON file: chunks, a breakdown, interference or netbench output, told apart by its keys.
void read_json_file(std::string_view text, const std::string& name, Measurements& m) {
  if (text.size() > static_cast<size_t>(kMaxFileBytes))
    bad(name, "a file of at most " + std::to_string(kMaxFileBytes) + " bytes", "more");
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_discarded() && j.is_object() && j.contains("cases") && j.at("cases").is_array())
    read_chunks_json(j, name, m.chunks);
  else if (!j.is_discarded() && j.is_object() && j.contains("cases"))
    read_breakdown_json(j, name, m.breakdowns);
  else if (!j.is_discarded() && j.is_object() && !j.contains("rows") && !j.contains("op"))
    read_interference_json(j, name, m.interference);
  else
    read_netbench_json(text, name, m.collectives);
}

/// What the lines of a text file say it is.
struct TextKind {
  bool nccl_tests = false;          // nccl-tests output
  size_t netbench = 0, header = 0;  // the first netbench line, the first non-comment; or size()
};

/// The kind of a text file, from its lines.
TextKind text_kind(const std::vector<Line>& lines) {
  TextKind k;
  k.netbench = lines.size();
  k.header = lines.size();
  for (size_t i = 0; i < lines.size(); ++i) {
    const std::string_view t = trim(lines[i].text);
    if (t.empty()) continue;
    if (t.rfind("# cocodiff netbench:", 0) == 0 && k.netbench == lines.size()) k.netbench = i;
    const std::vector<std::string_view> w = words(t);
    if (t[0] == '#' && (t.find("Collective test starting") != std::string_view::npos ||
                        t.find("nccl-tests version") != std::string_view::npos ||
                        (w.size() >= 2 && w[1] == "nThread")))
      k.nccl_tests = true;
    if (t[0] != '#' && k.header == lines.size()) k.header = i;
  }
  return k;
}

/// A CSV file: grids, kernels, eager ops, steps or collectives, told apart by its header.
void read_csv_file(std::string_view text, const std::vector<Line>& lines, size_t header,
                   const std::string& name, Measurements& m) {
  const std::vector<std::string_view> cols = split(lines[header].text, ',');
  const auto starts = [&](std::initializer_list<std::string_view> want) {
    return cols.size() >= want.size() && std::equal(want.begin(), want.end(), cols.begin());
  };
  if (starts({"m", "n", "k"}) || starts({"batch", "q_tokens", "kv_tokens"}) ||
      starts({"op", "shape", "dtype"})) {
    KernelGrid check;  // InputError naming the file and line of a malformed row
    check.add_text(text, name);
    m.grid_files.emplace_back(name, std::string(text));
  } else if (cols == std::vector<std::string_view>{"op", "kind", "flops", "bytes", "time_us"})
    read_kernel_csv(lines, header, name, m.kernels);
  else if (cols == std::vector<std::string_view>{"op", "label", "tokens", "heads", "k", "n",
                                                 "flops", "device_us", "host_us"})
    read_eager_csv(lines, header, name, m.eager_ops);
  else if (cols == std::vector<std::string_view>{"strategy", "gpus", "resolution", "image_tokens",
                                                 "median_ms", "min_ms", "max_ms", "host_issue_ms",
                                                 "transport", "timed_steps"})
    read_steps_csv(lines, header, name, m.steps);
  else
    read_collective_csv(lines, header, name, m, m.collectives);
}

/// A text file: nccl-tests output, netbench output or a CSV with a header.
void read_text_file(std::string_view text, const std::string& name, Measurements& m) {
  const std::vector<Line> lines = lines_of(text, name);
  const TextKind k = text_kind(lines);
  if (k.nccl_tests) {
    read_nccl_tests(lines, name, m, m.collectives);
  } else if (k.netbench < lines.size()) {
    read_netbench_text(lines, k.netbench, name, m.collectives);
  } else if (k.header < lines.size()) {
    read_csv_file(text, lines, k.header, name, m);
  }
}

/// Adds one file's measurements `m` to `out`: refused if none, or past kMaxPoints in all.
void merge_measurements(Measurements& m, const std::string& name, Measurements& out) {
  if (m.collectives.empty() && m.kernels.empty() && m.eager_ops.empty() && m.interference.empty() &&
      m.breakdowns.empty() && m.steps.empty() && m.chunks.empty() && m.grid_files.empty())
    throw InputError(name +
                     ": no measurements in the file (expected nccl-tests output, "
                     "netbench output, or a CSV with a header)");
  if (out.collectives.size() + out.kernels.size() + out.eager_ops.size() + m.collectives.size() +
          m.kernels.size() + m.eager_ops.size() + out.steps.size() + m.steps.size() >
      kMaxPoints)
    throw InputError(name + ": more than " + std::to_string(kMaxPoints) +
                     " measurements in all; fit fewer at a time");
  for (CollectivePoint& p : m.collectives) out.collectives.push_back(std::move(p));
  for (KernelPoint& p : m.kernels) out.kernels.push_back(std::move(p));
  for (EagerOpPoint& p : m.eager_ops) out.eager_ops.push_back(std::move(p));
  for (InterferencePoint& p : m.interference) out.interference.push_back(std::move(p));
  for (BreakdownPoint& p : m.breakdowns) out.breakdowns.push_back(std::move(p));
  for (StepPoint& p : m.steps) out.steps.push_back(std::move(p));
  for (ChunkPoint& p : m.chunks) out.chunks.push_back(std::move(p));
  for (auto& g : m.grid_files) out.grid_files.push_back(std::move(g));
  out.ignored_columns.insert(m.ignored_columns.begin(), m.ignored_columns.end());
  out.skipped_rows += m.skipped_rows;
}

}  // namespace

void parse_measurements(std::string_view text, const std::string& name, Measurements& out) {
  Measurements m;
  const size_t first = text.find_first_not_of(" \t\r\n");
  if (first != std::string_view::npos && text[first] == '{')
    read_json_file(text, name, m);
  else
    read_text_file(text, name, m);
  merge_measurements(m, name, out);
}

void read_measurements(const std::string& file, Measurements& out) {
  struct stat st {};
  if (::stat(file.c_str(), &st) != 0)
    throw InputError(file + ": cannot read the measurements file (no such file?)");
  if (S_ISDIR(st.st_mode))
    throw InputError(file + ": expected a measurements file, found a directory");
  if (S_ISREG(st.st_mode) && st.st_size > kMaxFileBytes)
    throw InputError(file + ": expected a measurements file of at most " +
                     std::to_string(kMaxFileBytes >> 20) + " MiB, found " +
                     std::to_string(st.st_size) + " bytes");
  std::ifstream in(file, std::ios::binary);
  if (!in) throw InputError(file + ": cannot read the measurements file");
  // Read in pieces up to the cap, so that a device or a pipe (/dev/zero) is refused at the cap
  // instead of being read whole; a line of no format is longer than kMaxLineChars, so a long
  // first piece without a line end is refused at once.
  std::string text;
  char buf[1 << 16];
  while (in) {
    in.read(buf, sizeof buf);
    text.append(buf, static_cast<size_t>(in.gcount()));
    if (static_cast<std::int64_t>(text.size()) > kMaxFileBytes)
      throw InputError(file + ": expected a measurements file of at most " +
                       std::to_string(kMaxFileBytes >> 20) + " MiB, found more");
    const size_t nl = text.find('\n');
    const size_t first = text.find_first_not_of(" \t\r\n");
    if ((nl == std::string::npos ? text.size() : nl) > kMaxLineChars &&
        (first == std::string::npos || text[first] != '{'))
      throw InputError(file + ":1: expected a line of at most " + std::to_string(kMaxLineChars) +
                       " characters, found more (not a measurements file?)");
  }
  if (text.empty()) throw InputError(file + ": empty measurements file");
  parse_measurements(text, file, out);
}

}  // namespace cocodiff::calibrate
