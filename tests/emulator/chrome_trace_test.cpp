// trace.json: valid Chrome trace JSON with one span per compute, wait and flow event.

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "emulator/chrome_trace.hpp"
#include "tests/emulator/test_util.hpp"

namespace cocodiff {
namespace {

TEST(ChromeTrace, SpansMatchTheRun) {
  Topology topo = test::make_topo(2, 2, 1);
  emu::Engine engine = test::make_engine(topo, test::uniform_tiers(3, 1000, 1e9), 2);
  emu::RunResult r = engine.run([](Communicator& c) {
    std::vector<float> s(40), d(40);
    Request q = c.iall_to_all(s, d, 10, "exchange \"x\"");
    c.compute({OpKind::kGemm, 300, 0, "proj"});
    q.wait();
  });
  const std::filesystem::path path =
      std::filesystem::temp_directory_path() / "cocodiff_trace_test.json";
  emu::write_chrome_trace(r, topo, path);
  std::ifstream in(path);
  nlohmann::json j = nlohmann::json::parse(in);
  int compute = 0, flows = 0, waits = 0;
  for (const auto& e : j["traceEvents"]) {
    if (e["ph"] != "X") continue;
    if (e["cat"] == "compute") {
      ++compute;
      EXPECT_EQ(e["name"], "proj");
      EXPECT_DOUBLE_EQ(e["dur"].get<double>(), 0.3);
    }
    if (e["cat"] == "flow") {
      ++flows;
      EXPECT_EQ(e["name"], "exchange \"x\"");
      EXPECT_EQ(e["args"]["bytes"], 40);
    }
    if (e["cat"] == "wait") ++waits;
  }
  EXPECT_EQ(compute, 4);
  EXPECT_EQ(flows, 4 * 3);  // every rank sends to 3 others
  EXPECT_EQ(waits, 4);      // 3 rounds of 1.04 us outlast 0.3 us of compute
  EXPECT_EQ(j["otherData"]["timeline_sha256"], r.timeline_sha256);
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace cocodiff
