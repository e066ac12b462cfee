// trace.json: valid Chrome trace JSON with one span per compute, wait and flow event.

#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

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
  int compute = 0, flows = 0, waits = 0, recvs = 0;
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
    if (e["cat"] == "recv") ++recvs;
  }
  EXPECT_EQ(compute, 4);
  EXPECT_EQ(flows, 4 * 3);  // every rank sends to 3 others
  EXPECT_EQ(recvs, flows);  // and receives from 3 others
  EXPECT_EQ(waits, 4);      // 3 rounds of 1.04 us outlast 0.3 us of compute
  EXPECT_EQ(j["otherData"]["timeline_sha256"], r.timeline_sha256);
  std::filesystem::remove(path);
}

// Two all-to-alls in flight at once (concurrent rounds: every message of both posted together)
// beside compute: every track's slices are disjoint (Perfetto draws complete slices of a track
// only when they nest), the concurrent transfers of a tile take a track each, and every send
// has an arrow to its receive, both ends inside a slice of their own track.
TEST(ChromeTrace, ConcurrentOperationsGetTracksOfTheirOwnAndArrows) {
  Topology topo = test::make_topo(2, 2, 1);
  emu::EngineOptions options;
  options.workers = 2;
  options.wire_bytes_per_element = 4;
  options.all_to_all_algorithm = "concurrent";
  emu::Engine engine(topo,
                     std::make_unique<AlphaBetaModel>(topo, test::uniform_tiers(3, 1000, 1e9)),
                     test::unit_device(), options);
  emu::RunResult r = engine.run([](Communicator& c) {
    std::vector<float> s(4000), d(4000);
    Request q = c.iall_to_all(s, d, 1000, "q_all_to_all");
    c.compute({OpKind::kGemm, 300, 0, "k_proj"});
    Request k = c.iall_to_all(s, d, 1000, "k_all_to_all");
    q.wait();
    k.wait();
  });
  const std::filesystem::path path =
      std::filesystem::temp_directory_path() / "cocodiff_trace_lanes_test.json";
  emu::write_chrome_trace(r, topo, path);
  std::ifstream in(path);
  const nlohmann::json j = nlohmann::json::parse(in);
  std::map<std::pair<int, int>, std::vector<std::pair<double, double>>> tracks;
  std::map<std::pair<int, int>, std::string> names;
  std::map<int, std::vector<std::tuple<std::string, int, int, double>>> arrows;  // id -> ends
  for (const auto& e : j["traceEvents"]) {
    const std::pair<int, int> t{e.value("pid", -1), e.value("tid", -1)};
    if (e["ph"] == "M" && e["name"] == "thread_name") names[t] = e["args"]["name"];
    if (e["ph"] == "X")
      tracks[t].emplace_back(e["ts"].get<double>(), e["ts"].get<double>() + e["dur"].get<double>());
    if (e["ph"] == "s" || e["ph"] == "f")
      arrows[e["id"].get<int>()].emplace_back(e["ph"], t.first, t.second, e["ts"].get<double>());
  }
  int send_tracks = 0;
  for (auto& [t, spans] : tracks) {
    std::sort(spans.begin(), spans.end());
    for (size_t i = 1; i < spans.size(); ++i)
      EXPECT_LE(spans[i - 1].second, spans[i].first + 1e-9) << names[t];
    if (names[t].find(" send") != std::string::npos) ++send_tracks;
  }
  // Each tile sends 3 messages of each all-to-all at once: 6 transfers in flight, 6 tracks.
  EXPECT_EQ(send_tracks, 4 * 6);
  EXPECT_EQ(arrows.size(), 4u * 6u);
  for (const auto& [id, ends] : arrows) {
    ASSERT_EQ(ends.size(), 2u) << id;
    EXPECT_NE(std::get<0>(ends[0]), std::get<0>(ends[1])) << id;  // one start, one finish
    for (const auto& [ph, pid, tid, ts] : ends) {
      bool inside = false;
      for (const auto& [b, e] : tracks[{pid, tid}]) inside = inside || (b < ts && ts < e);
      EXPECT_TRUE(inside) << "arrow " << id << " end " << ph << " at " << ts;
    }
  }
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace cocodiff
