// timeline.png: lane grouping, binned shares against the trace, a valid PNG of the size the
// layout promises, and no PNG (a reason instead, never an exception) without gnuplot.

#include "emulator/timeline_plot.hpp"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <fstream>
#include <iterator>
#include <numeric>
#include <string>
#include <vector>

#include "tests/emulator/test_util.hpp"

namespace cocodiff {
namespace {

// A run with overlap: each rank posts an all-to-all, computes while it flows, then waits.
emu::RunResult overlapped_run(const Topology& topo) {
  emu::Engine engine = test::make_engine(topo, test::uniform_tiers(3, 1000, 1e9), 2);
  return engine.run([](Communicator& c) {
    for (int layer = 0; layer < 40; ++layer) {
      std::vector<float> s(static_cast<size_t>(c.size()) * 100), d(s.size());
      Request q = c.iall_to_all(s, d, 100, "v");
      c.compute({OpKind::kGemm, 2000, 0, "qk"});
      q.wait();
      c.compute({OpKind::kGemm, 1000, 0, "attn"});
    }
  });
}

// Width and height from a PNG's IHDR chunk; false when the file is not a PNG.
bool png_size(const std::filesystem::path& p, std::uint32_t& w, std::uint32_t& h) {
  std::ifstream in(p, std::ios::binary);
  unsigned char b[24] = {};
  in.read(reinterpret_cast<char*>(b), sizeof b);
  if (!in) return false;
  const unsigned char sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
  if (!std::equal(sig, sig + 8, b) || std::string(reinterpret_cast<char*>(b + 12), 4) != "IHDR")
    return false;
  auto be32 = [&](int o) {
    return (std::uint32_t{b[o]} << 24) | (std::uint32_t{b[o + 1]} << 16) |
           (std::uint32_t{b[o + 2]} << 8) | std::uint32_t{b[o + 3]};
  };
  w = be32(16);
  h = be32(20);
  return true;
}

TEST(TimelinePlot, LanesGroupTilesAlongTheTopology) {
  const emu::TimelineOptions o;  // at most 48 lanes
  emu::TimelineLayout one = emu::timeline_layout(test::make_topo(2, 6, 2), o);
  EXPECT_EQ(one.group, 1);
  EXPECT_EQ(one.lanes, 24);
  EXPECT_EQ(one.lane_names[13], "n1 g0 t1");
  emu::TimelineLayout gpu = emu::timeline_layout(test::make_topo(2, 6, 8), o);
  EXPECT_EQ(gpu.group, 2);  // 96 tiles: one lane per GPU
  EXPECT_EQ(gpu.lanes, 48);
  EXPECT_EQ(gpu.lane_names[7], "n1 g1");
  emu::TimelineLayout nodes = emu::timeline_layout(test::make_topo(2, 6, 128), o);
  EXPECT_EQ(nodes.group, 48);  // 1,536 tiles: 4 nodes per lane
  EXPECT_EQ(nodes.lanes, 32);
  EXPECT_EQ(nodes.lane_names[1], "n4-7");
  EXPECT_GT(gpu.height_px, one.height_px);
  EXPECT_EQ(one.width_px, o.width_px);
}

TEST(TimelinePlot, BinsAddUpToTheTrace) {
  Topology topo = test::make_topo(2, 2, 1);
  emu::RunResult r = overlapped_run(topo);
  emu::TimelineLayout layout = emu::timeline_layout(topo, {});
  emu::TimelineBins b = emu::bin_timeline(r, topo, layout, SimTime(), r.makespan, 100);
  const double bin_ns = static_cast<double>(r.makespan.ns()) / 100;
  for (int rank = 0; rank < 4; ++rank) {
    double compute_ns = 0, wait_ns = 0;
    for (const emu::TraceEvent& e : r.trace) {
      if (e.rank != rank) continue;
      if (e.kind == emu::TraceEvent::Kind::kCompute) compute_ns += (e.end - e.start).ns();
      if (e.kind == emu::TraceEvent::Kind::kWait) wait_ns += (e.end - e.start).ns();
    }
    const auto& c = b.compute[static_cast<size_t>(rank)];
    const auto& w = b.wait[static_cast<size_t>(rank)];
    EXPECT_NEAR(std::accumulate(c.begin(), c.end(), 0.0) * bin_ns, compute_ns, 1e-6 * compute_ns);
    EXPECT_NEAR(std::accumulate(w.begin(), w.end(), 0.0) * bin_ns, wait_ns, 1e-6 * wait_ns + 1);
    for (size_t i = 0; i < c.size(); ++i) EXPECT_LE(c[i] + w[i], 1 + 1e-9);
    // Concurrent sends on one tier count once: a share never exceeds the bin.
    for (int t = 0; t < 3; ++t)
      for (double v : b.tier[static_cast<size_t>(t)][static_cast<size_t>(rank)])
        EXPECT_LE(v, 1 + 1e-9);
  }
  // The 2 tiles of a GPU talk over tier 0, the GPUs over tier 1; nothing crosses nodes.
  const auto& t0 = b.tier[0][0];
  const auto& t2 = b.tier[2][0];
  EXPECT_GT(std::accumulate(t0.begin(), t0.end(), 0.0), 0.0);
  EXPECT_EQ(std::accumulate(t2.begin(), t2.end(), 0.0), 0.0);
}

// The zoom panel names the first tile's operations: every one in the window is listed, and
// those wide enough carry their name, on their row, without overlapping another.
TEST(TimelinePlot, ZoomNamesTheOperations) {
  Topology topo = test::make_topo(2, 2, 1);
  emu::RunResult r = overlapped_run(topo);
  std::vector<std::string> names;
  const std::vector<emu::TimelineLabel> labels =
      emu::timeline_labels(r, SimTime(), SimTime::from_ns(r.makespan.ns() / 10), 1466, &names);
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"attn", "qk", "v"}));
  bool qk = false, v = false;
  SimTime last_compute;
  for (const emu::TimelineLabel& l : labels) {
    qk = qk || (l.text == "qk" && !l.send);
    v = v || (l.text == "v" && l.send);
    if (!l.send) {
      EXPECT_GT(l.at, last_compute);
      last_compute = l.at;
    }
  }
  EXPECT_TRUE(qk);
  EXPECT_TRUE(v);
  // Too narrow a window for any name: the list stays, the labels go.
  names.clear();
  EXPECT_TRUE(emu::timeline_labels(r, SimTime(), r.makespan, 8, &names).empty());
  EXPECT_EQ(names.size(), 3u);
}

TEST(TimelinePlot, WritesAValidPngOfTheLayoutSize) {
  if (emu::find_gnuplot().empty()) GTEST_SKIP() << "gnuplot is not installed";
  Topology topo = test::make_topo(2, 6, 2);
  emu::RunResult r = overlapped_run(topo);
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("cocodiff_timeline_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  const std::filesystem::path png = dir / "timeline.png";
  emu::TimelineOptions o;
  o.title = "test 'quoted' run";
  EXPECT_EQ(emu::write_timeline_png(r, topo, png, o), "");
  std::uint32_t w = 0, h = 0;
  ASSERT_TRUE(png_size(png, w, h));
  const emu::TimelineLayout layout = emu::timeline_layout(topo, o);
  EXPECT_EQ(w, static_cast<std::uint32_t>(layout.width_px));
  EXPECT_EQ(h, static_cast<std::uint32_t>(layout.height_px));
  EXPECT_GT(std::filesystem::file_size(png), 10000u);  // a drawn chart, not an empty canvas
  // The steps' starts mark the whole-run panel: the same layout, another picture.
  emu::TimelineOptions with_steps = o;
  const SimTime end = r.makespan;
  for (int k = 0; k < 4; ++k) with_steps.step_starts.push_back(SimTime::from_ns(end.ns() * k / 4));
  const std::filesystem::path png2 = dir / "steps.png";
  EXPECT_EQ(emu::write_timeline_png(r, topo, png2, with_steps), "");
  ASSERT_TRUE(png_size(png2, w, h));
  EXPECT_EQ(w, static_cast<std::uint32_t>(layout.width_px));
  EXPECT_EQ(h, static_cast<std::uint32_t>(layout.height_px));
  const auto bytes = [](const std::filesystem::path& f) {
    std::ifstream in(f, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  EXPECT_NE(bytes(png), bytes(png2));
  std::filesystem::remove(png2);
  // Only timeline.png is left: no temporaries beside it.
  int files = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(dir)) ++files;
  EXPECT_EQ(files, 1);
  std::filesystem::remove_all(dir);
}

TEST(TimelinePlot, AStringLiteralIsOnlyData) {
  EXPECT_EQ(emu::gnuplot_string("it's"), "'it''s'");
  // A newline would end the command and start another (gnuplot's `!` runs a shell).
  EXPECT_EQ(emu::gnuplot_string("x\n!id\r\t#\x7f"), "'x !id  # '");
}

// Names and paths that hold a newline and a gnuplot shell command draw the chart and run
// nothing: every text reaches gnuplot as a literal, and no path reaches its script at all.
TEST(TimelinePlot, NamesAndPathsRunNoCommand) {
  if (emu::find_gnuplot().empty()) GTEST_SKIP() << "gnuplot is not installed";
  Topology topo = test::make_topo(1, 2, 1);
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("cocodiff_inject_" + std::to_string(getpid()));
  std::filesystem::remove_all(dir);
  const std::filesystem::path sub = dir / "a\n!touch planted_by_path\n#";
  std::filesystem::create_directories(sub);
  const std::filesystem::path mark = dir / "planted";
  const std::string inject = "x\n!touch " + mark.string() + "\n#";
  emu::RunResult r = overlapped_run(topo);
  emu::TimelineOptions o;
  o.title = inject;
  const std::filesystem::path png = sub / "timeline.png";
  EXPECT_EQ(emu::write_timeline_png(r, topo, png, o), "");
  EXPECT_TRUE(std::filesystem::exists(png));
  EXPECT_FALSE(std::filesystem::exists(mark)) << "a title ran a shell command";
  EXPECT_FALSE(std::filesystem::exists("planted_by_path"));
  // The plots of tune and the benchmarks take the same way.
  const std::filesystem::path png2 = sub / "plot.png";
  EXPECT_EQ(emu::render_gnuplot_png("pngcairo size 200,100",
                                    "set title " + emu::gnuplot_string(inject) +
                                        "\nplot 'data.txt' using 1:2 with lines",
                                    {{"data.txt", "1 2\n2 3\n"}}, png2),
            "");
  EXPECT_TRUE(std::filesystem::exists(png2));
  EXPECT_FALSE(std::filesystem::exists(mark));
  std::filesystem::remove_all(dir);
}

TEST(TimelinePlot, MissingGnuplotIsAReasonNotAFailure) {
  Topology topo = test::make_topo(2, 2, 1);
  emu::RunResult r = overlapped_run(topo);
  const std::filesystem::path png = std::filesystem::temp_directory_path() /
                                    ("cocodiff_nognuplot_" + std::to_string(getpid()) + ".png");
  const char* old = std::getenv("COCODIFF_GNUPLOT");
  const std::string saved = old != nullptr ? old : "";
  setenv("COCODIFF_GNUPLOT", "/nonexistent/gnuplot", 1);
  const std::string why = emu::write_timeline_png(r, topo, png);
  EXPECT_NE(why.find("gnuplot not found"), std::string::npos) << why;
  EXPECT_FALSE(std::filesystem::exists(png));
  testing::internal::CaptureStderr();
  EXPECT_NO_THROW(emu::write_timeline_png_or_warn(r, topo, png));
  EXPECT_NE(testing::internal::GetCapturedStderr().find("warning: "), std::string::npos);
  EXPECT_FALSE(std::filesystem::exists(png));
  if (old != nullptr)
    setenv("COCODIFF_GNUPLOT", saved.c_str(), 1);
  else
    unsetenv("COCODIFF_GNUPLOT");
}

}  // namespace
}  // namespace cocodiff
