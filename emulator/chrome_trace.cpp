#include "emulator/chrome_trace.hpp"

#include <cstdio>
#include <nlohmann/json.hpp>

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

void write_chrome_trace(const RunResult& result, const Topology& topo,
                        const std::filesystem::path& path) {
  AtomicFile file(path);
  std::ofstream& out = file.stream();
  out << "{\"displayTimeUnit\":\"ns\",\"otherData\":{\"timeline_sha256\":\""
      << result.timeline_sha256
      << "\",\"truncated\":" << (result.trace_truncated ? "true" : "false")
      << "},\"traceEvents\":[\n";
  bool first = true;
  auto sep = [&] {
    if (!first) out << ",\n";
    first = false;
  };
  for (int n = 0; n < topo.num_nodes(); ++n) {
    sep();
    out << R"({"name":"process_name","ph":"M","pid":)" << n << R"(,"args":{"name":"node )" << n
        << "\"}}";
  }
  for (int r = 0; r < topo.num_ranks(); ++r) {
    const int pid = topo.node(r);
    sep();
    out << R"({"name":"thread_name","ph":"M","pid":)" << pid << ",\"tid\":" << 2 * r
        << R"(,"args":{"name":")" << topo.describe_rank(r) << " compute\"}}";
    sep();
    out << R"({"name":"thread_name","ph":"M","pid":)" << pid << ",\"tid\":" << 2 * r + 1
        << R"(,"args":{"name":")" << topo.describe_rank(r) << " send\"}}";
  }
  std::vector<std::string> names;
  names.reserve(result.labels.size());
  for (const std::string& l : result.labels) names.push_back(nlohmann::json(l).dump());
  for (const TraceEvent& e : result.trace) {
    sep();
    const int tid = 2 * e.rank + (e.kind == TraceEvent::Kind::kFlow ? 1 : 0);
    const std::string& name = names.at(e.label);
    out << "{\"name\":" << name << ",\"cat\":\"" << kind_category(e.kind)
        << "\",\"ph\":\"X\",\"pid\":" << topo.node(e.rank) << ",\"tid\":" << tid
        << ",\"ts\":" << fmt_us(e.start) << ",\"dur\":" << fmt_us(e.end - e.start);
    if (e.kind == TraceEvent::Kind::kFlow)
      out << ",\"args\":{\"to\":" << e.peer << ",\"bytes\":" << e.bytes << ",\"tier\":\""
          << topo.tier_name(e.tier) << "\"}";
    out << "}";
  }
  out << "\n]}\n";
  file.commit();
}

}  // namespace cocodiff::emu
