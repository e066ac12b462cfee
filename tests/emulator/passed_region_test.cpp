// Passed regions (Replay::pass_region): a region mark judged where the tiles arrive, at their
// first call after it, as a span mark is, once a mark of its key was not quiescent where the
// tiles passed it. Blocks that end with a message in flight (no block
// mark is quiescent where the tiles pass it) are quiescent where the tiles arrive, after what
// they compute first, and are replayed from there with the timeline of simulating them
// (virtual times, accounting, bytes, flows, events, timeline hash), on 1 and 2 workers, at the
// collective level and message by message; passed_answer() tells each tile which were
// replayed; a region that ended with work in flight is replayed only before the same next,
// and a caller whose next is not what follows stops the run, never giving a timeline.

#include <gtest/gtest.h>

#include <string>

#include "core/errors.hpp"
#include "core/replay.hpp"
#include "net_models/cluster.hpp"
#include "tests/emulator/test_util.hpp"

namespace cocodiff {
namespace {

using test::expect_same_timeline;

const std::filesystem::path kPresets = std::filesystem::path(COCODIFF_CONFIG_DIR) / "clusters";

// Two Aurora nodes (24 tiles) under max-min.
emu::Engine aurora(int workers, bool collective_ops, bool replay, bool trace = false) {
  emu::EngineOptions o;
  o.workers = workers;
  o.trace = trace;
  o.collective_ops = collective_ops;
  o.replay = replay;
  return test::aurora_engine(kPresets, 2, o);
}

struct Blocks {
  int n = 6;
  bool last_names_end = true;       // the last block names the end as its next (else "block")
  int* replayed_answers = nullptr;  // rank 0's count of passed_answer().replayed
};

// n blocks, each a passed region: a projection whose length differs by tile (200 GFLOP and
// more: longer than any message), an all-to-all within the node, then, for half of each node's
// tiles, a 4 MiB message to the other node that the other tiles do not wait for. They pass the
// next block's mark while it flies and arrive there, at their first call, after it landed.
// After the blocks: a region judged at its mark, where the tiles arrive at once.
void blocks(Communicator& world, const Blocks& b) {
  const int me = world.world_rank(world.rank());
  std::unique_ptr<Communicator> node = world.split(me / 12, me);
  std::unique_ptr<Communicator> ring = world.split(me % 12, me);
  Replay& r = *replay_of(world);
  world.barrier();
  int replayed = 0;
  for (int k = 0; k < b.n; ++k) {
    const bool last = k + 1 == b.n;
    const Replay::RegionMark m =
        r.pass_region("block", true, last && b.last_names_end ? "end" : "block");
    EXPECT_FALSE(m.replayed);  // judged where the tile arrives, not here
    world.compute({OpKind::kGemm, 2e11 * (1 + me % 3), 1e7, "proj"});
    AllToAllvLayout layout;
    for (int j = 0; j < node->size(); ++j) {
      layout.send_counts.push_back(1000 * (1 + (me + j) % 4));
      layout.recv_counts.push_back(1000 * (1 + (j + me) % 4));
    }
    layout = AllToAllvLayout::packed(layout.send_counts, layout.recv_counts);
    node->all_to_allv({}, {}, layout, "k_all_to_allv");
    if (me % 12 < 6) {
      const int peer = 1 - ring->rank();
      Request out = ring->isend({}, 1 << 22, peer, 4, "late");
      ring->irecv({}, 1 << 22, peer, 4, "late").wait();
      out.wait();
    }
    if (r.passed_answer().replayed) ++replayed;
  }
  (void)r.begin_region("end", false);
  world.barrier();
  if (me == 0 && b.replayed_answers != nullptr) *b.replayed_answers = replayed;
}

emu::RunResult run(emu::Engine& e, const Blocks& b) {
  return e.run([&b](Communicator& world) { blocks(world, b); });
}

TEST(PassedRegion, ARegionReplayedFromItsArrivalsGivesTheSimulatedTimeline) {
  for (const bool collective_ops : {true, false}) {
    for (const int workers : {1, 2}) {
      SCOPED_TRACE("collective ops " + std::to_string(collective_ops) + ", workers " +
                   std::to_string(workers));
      int answers_off = -1, answers_on = -1;
      emu::Engine off = aurora(workers, collective_ops, false);
      const emu::RunResult ref = run(off, {6, true, &answers_off});
      emu::Engine on = aurora(workers, collective_ops, true);
      const emu::RunResult got = run(on, {6, true, &answers_on});
      expect_same_timeline(got, ref);
      EXPECT_EQ(ref.regions_replayed, 0u);
      EXPECT_EQ(answers_off, 0);
      // The first mark of a key is judged where the tiles pass it: block 0's is quiescent
      // there (behind a barrier), block 1's is not (a late message flies), so from block 2 on
      // the marks are judged where the tiles arrive. Blocks 3 and 4 replay block 2. Block 5 is
      // followed by the end, not by a block's projection: its message would still fly where
      // the tiles arrive at the end mark, and block 2's record, made before a block, is not
      // replayed there.
      EXPECT_EQ(got.regions_replayed, 2u);
      EXPECT_EQ(answers_on, 2);
      EXPECT_GT(ref.flows, got.flows / 2);
    }
  }
}

TEST(PassedRegion, WhileTheTraceTakesEventsItIsJudgedAtItsMark) {
  // A record copies no trace: a passed region is judged where the tiles pass it, as a region
  // mark is, none of which is quiescent here. The timeline and trace are the simulated ones.
  emu::Engine off = aurora(1, true, false, true);
  const emu::RunResult ref = run(off, {});
  emu::Engine on = aurora(1, true, true, true);
  const emu::RunResult got = run(on, {});
  expect_same_timeline(got, ref);
  EXPECT_EQ(got.trace.size(), ref.trace.size());
  EXPECT_EQ(got.regions_replayed, 0u);
}

TEST(PassedRegionDeathTest, ARegionWhoseNextIsNotWhatFollowsItStopsTheRun) {
  // The last block names a block as what follows it, but the end follows: replayed from a
  // block that ended with its message in flight, it would drop that message, still in flight
  // where the tiles arrive at the end mark. The run stops there, never giving a timeline.
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  emu::Engine e = aurora(1, true, true);
  EXPECT_DEATH(run(e, {6, false, nullptr}), "is reached before the work replayed before it ended");
}

}  // namespace
}  // namespace cocodiff
