#include "emulator/chrome_trace.hpp"

#include <algorithm>
#include <array>
#include <cstdio>
#include <functional>
#include <nlohmann/json.hpp>
#include <queue>
#include <tuple>
#include <utility>
#include <vector>

#include "core/atomic_file.hpp"

namespace cocodiff::emu {

namespace {

const char* kind_category(TraceEvent::Kind k) {
  switch (k) {
    case TraceEvent::Kind::kCompute:
      return "compute";
    case TraceEvent::Kind::kWait:
      return "wait";
    case TraceEvent::Kind::kFlow:
      return "flow";
  }
  return "?";
}

std::string fmt_us(SimTime t) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.3f", t.us());
  return buf;
}

}  // namespace

std::vector<TraceSlice> trace_slices(const RunResult& result, int ranks, SimTime from) {
  std::vector<TraceSlice> slices;
  slices.reserve(result.trace.size() * 2);
  for (size_t i = 0; i < result.trace.size(); ++i) {
    const TraceEvent& e = result.trace[i];
    if (e.rank < 0 || e.rank >= ranks || e.end <= from) continue;
    const auto event = static_cast<std::uint32_t>(i);
    if (e.kind != TraceEvent::Kind::kFlow) {
      slices.push_back({e.rank, TraceGroup::kCompute, 0, event, e.start, e.end});
      continue;
    }
    slices.push_back({e.rank, TraceGroup::kSend, 0, event, e.start, e.end});
    if (e.peer >= 0 && e.peer < ranks)
      slices.push_back({e.peer, TraceGroup::kRecv, 0, event, e.start, e.end});
  }
  // In start order within each tile's group, the longer of two slices first; then each slice on
  // the lowest lane free at its start, so no two slices of a lane overlap.
  std::sort(slices.begin(), slices.end(), [](const TraceSlice& a, const TraceSlice& b) {
    return std::make_tuple(a.rank, a.group, a.start, b.end, a.event) <
           std::make_tuple(b.rank, b.group, b.start, a.end, b.event);
  });
  using Busy = std::pair<SimTime, int>;  // a lane's end, the lane
  std::priority_queue<Busy, std::vector<Busy>, std::greater<>> busy;
  std::priority_queue<int, std::vector<int>, std::greater<>> free;
  int lanes = 0;
  for (size_t i = 0; i < slices.size(); ++i) {
    TraceSlice& s = slices[i];
    if (i == 0 || s.rank != slices[i - 1].rank || s.group != slices[i - 1].group) {
      busy = {};
      free = {};
      lanes = 0;
    }
    while (!busy.empty() && busy.top().first <= s.start) {
      free.push(busy.top().second);
      busy.pop();
    }
    if (free.empty()) {
      s.lane = lanes++;
    } else {
      s.lane = free.top();
      free.pop();
    }
    busy.emplace(s.end, s.lane);
  }
  return slices;
}

namespace {

// Events of a JSON array, one per line, with the commas between them.
struct EventList {
  std::ostream& out;
  bool first = true;
  std::ostream& next() {
    if (!first) out << ",\n";
    first = false;
    return out;
  }
};

// Names the processes (nodes) and threads (lanes) and returns each tile's first thread id per
// group: per node, its tiles in order, each tile's compute lanes, then its send lanes, then its
// receive lanes.
std::vector<std::array<int, 3>> name_threads(EventList& ev, const Topology& topo,
                                             const std::vector<TraceSlice>& slices) {
  const int ranks = topo.num_ranks();
  std::vector<std::array<int, 3>> lanes(static_cast<size_t>(ranks), {1, 1, 1});
  for (const TraceSlice& s : slices) {
    int& n = lanes[static_cast<size_t>(s.rank)][static_cast<size_t>(s.group)];
    n = std::max(n, s.lane + 1);
  }
  for (int n = 0; n < topo.num_nodes(); ++n)
    ev.next() << R"({"name":"process_name","ph":"M","pid":)" << n << R"(,"args":{"name":"node )"
              << n << "\"}}";
  static constexpr std::array<const char*, 3> kGroupName = {"compute", "send", "recv"};
  std::vector<std::array<int, 3>> first_tid(static_cast<size_t>(ranks));
  std::vector<int> next_tid(static_cast<size_t>(topo.num_nodes()), 0);
  for (int r = 0; r < ranks; ++r) {
    const int pid = topo.node(r);
    for (size_t g = 0; g < 3; ++g) {
      first_tid[static_cast<size_t>(r)][g] = next_tid[static_cast<size_t>(pid)];
      for (int l = 0; l < lanes[static_cast<size_t>(r)][g]; ++l) {
        const int tid = next_tid[static_cast<size_t>(pid)]++;
        ev.next() << R"({"name":"thread_name","ph":"M","pid":)" << pid << ",\"tid\":" << tid
                  << R"(,"args":{"name":")" << topo.describe_rank(r) << " " << kGroupName[g]
                  << (l > 0 ? " " + std::to_string(l + 1) : std::string()) << "\"}}";
        ev.next() << R"({"name":"thread_sort_index","ph":"M","pid":)" << pid << ",\"tid\":" << tid
                  << R"(,"args":{"sort_index":)" << tid << "}}";
      }
    }
  }
  return first_tid;
}

// One slice as a complete event; a transfer's slices also as the ends of its arrow, both bound
// at the middle of the transfer (inside either slice, never at a boundary another shares).
void write_slice(EventList& ev, const TraceSlice& s, const TraceEvent& e, const std::string& name,
                 int pid, int tid, const Topology& topo) {
  ev.next() << "{\"name\":" << name << ",\"cat\":\""
            << (s.group == TraceGroup::kRecv ? "recv" : kind_category(e.kind))
            << "\",\"ph\":\"X\",\"pid\":" << pid << ",\"tid\":" << tid
            << ",\"ts\":" << fmt_us(e.start) << ",\"dur\":" << fmt_us(e.end - e.start);
  if (e.kind == TraceEvent::Kind::kFlow)
    ev.out << ",\"args\":{\"from\":" << e.rank << ",\"to\":" << e.peer << ",\"bytes\":" << e.bytes
           << ",\"tier\":\"" << topo.tier_name(e.tier) << "\"}";
  ev.out << "}";
  if (e.kind == TraceEvent::Kind::kFlow && e.peer >= 0 && e.peer < topo.num_ranks() &&
      s.group != TraceGroup::kCompute) {
    const SimTime mid = e.start + SimTime::from_ns((e.end - e.start).ns() / 2);
    ev.next() << "{\"name\":" << name << ",\"cat\":\"transfer\",\"ph\":\""
              << (s.group == TraceGroup::kSend ? "s" : "f")
              << (s.group == TraceGroup::kRecv ? "\",\"bp\":\"e" : "") << "\",\"id\":" << s.event
              << ",\"pid\":" << pid << ",\"tid\":" << tid << ",\"ts\":" << fmt_us(mid) << "}";
  }
}

}  // namespace

void write_chrome_trace(const RunResult& result, const Topology& topo,
                        const std::filesystem::path& path, SimTime from) {
  AtomicFile file(path);
  std::ostream& out = file.stream();
  out << "{\"displayTimeUnit\":\"ns\",\"otherData\":{\"timeline_sha256\":\""
      << result.timeline_sha256
      << "\",\"truncated\":" << (result.trace_truncated ? "true" : "false")
      << ",\"from_us\":" << fmt_us(from) << "},\"traceEvents\":[\n";
  EventList ev{out};
  const std::vector<TraceSlice> slices = trace_slices(result, topo.num_ranks(), from);
  const std::vector<std::array<int, 3>> first_tid = name_threads(ev, topo, slices);
  std::vector<std::string> names;
  names.reserve(result.labels.size());
  for (const std::string& l : result.labels) names.push_back(nlohmann::json(l).dump());
  size_t written = 0;
  for (const TraceSlice& s : slices) {
    if (++written % 4096 == 0) output_stop_check();  // an interrupt ends a long write at once
    const TraceEvent& e = result.trace[s.event];
    const int tid = first_tid[static_cast<size_t>(s.rank)][static_cast<size_t>(s.group)] + s.lane;
    write_slice(ev, s, e, names.at(e.label), topo.node(s.rank), tid, topo);
  }
  out << "\n]}\n";
  file.commit();
}

}  // namespace cocodiff::emu
