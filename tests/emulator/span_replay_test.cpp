// Span replay (Replay::begin_span): a span recorded between two quiescent span marks is replayed
// from the same start state with the timeline of simulating it (virtual times, accounting,
// bytes, flows, events, timeline hash), on 1 and 2 workers, at the collective level and message
// by message, where the regions inside it never start quiescent (a message crosses every block
// mark); a span mark is judged where the tiles arrive, at their first call after it, so one
// passed with messages in flight that land while the tiles compute is quiescent there; a
// replayed span's calls are free, its inner marks answer as recorded, and a region key that
// differs from the recording's stops the run, never giving a timeline.

#include <gtest/gtest.h>

#include <string>
#include <tuple>

#include "core/errors.hpp"
#include "core/replay.hpp"
#include "net_models/cluster.hpp"
#include "tests/emulator/test_util.hpp"

namespace cocodiff {
namespace {

using test::expect_same_timeline;

const std::filesystem::path kPresets = std::filesystem::path(COCODIFF_CONFIG_DIR) / "clusters";

// Two Aurora nodes (24 tiles) under max-min.
emu::Engine aurora(int workers, bool collective_ops, bool replay) {
  emu::EngineOptions o;
  o.workers = workers;
  o.trace = false;
  o.collective_ops = collective_ops;
  o.replay = replay;
  return test::aurora_engine(kPresets, 2, o);
}

struct Groups {
  std::unique_ptr<Communicator> node, ring;
};

// How a step starts and ends.
struct Shape {
  double embed_flops = 0;  // computed first, as a DiT embeds its inputs before its first block
  bool late_tail = false;  // ends with half the tiles exchanging a message, not a barrier
  bool last_apart = true;  // the last step names the end as what follows it (begin_span's next)
};

// One step: three blocks, each leaving a message to the other node in flight across the next
// mark (no block mark is quiescent), then a tail that is not a block, then a barrier (the next
// step's mark is quiescent) or, with a late tail, a message between the nodes for half of the
// tiles that the others do not wait for (it is in flight when they pass the next step's mark).
// `inner` names the blocks' regions.
void step(Communicator& world, Groups& g, const std::string& inner, Shape shape = {}) {
  Replay& r = *replay_of(world);
  const int me = g.node->rank();
  if (shape.embed_flops > 0) world.compute({OpKind::kGemm, shape.embed_flops, 1e7, "embed"});
  Request pending[2];
  for (int k = 0; k < 3; ++k) {
    const bool replayed = r.begin_region(inner, true).replayed;
    pending[0].wait();
    pending[1].wait();
    if (replayed) continue;
    world.compute({OpKind::kGemm, 1e9 * (1 + me % 3), 1e7, "proj"});
    AllToAllvLayout layout;
    for (int j = 0; j < g.node->size(); ++j) {
      layout.send_counts.push_back(1000 * (1 + (me + j) % 4));
      layout.recv_counts.push_back(1000 * (1 + (j + me) % 4));
    }
    layout = AllToAllvLayout::packed(layout.send_counts, layout.recv_counts);
    g.node->all_to_allv({}, {}, layout, "k_all_to_allv");
    const int peer = 1 - g.ring->rank();
    pending[0] = g.ring->isend({}, 1 << 20, peer, 3, "cross");
    pending[1] = g.ring->irecv({}, 1 << 20, peer, 3, "cross");
  }
  (void)r.begin_region("tail", false);  // runs in a replayed span too, its calls free
  pending[0].wait();
  pending[1].wait();
  world.compute({OpKind::kNorm, 1e6, 1e6 * (1 + me % 2), "final"});
  g.node->all_gather({}, {}, 512, "gather");
  if (!shape.late_tail) {
    world.barrier();
    return;
  }
  if (me < 6) {
    const int peer = 1 - g.ring->rank();
    Request out = g.ring->isend({}, 1 << 22, peer, 4, "late");
    g.ring->irecv({}, 1 << 22, peer, 4, "late").wait();
    out.wait();
  }
}

emu::RunResult steps(emu::Engine& e, int n, Shape shape = {}) {
  return e.run([n, shape](Communicator& world) {
    const int me = world.world_rank(world.rank());
    Groups g;
    g.node = world.split(me / 12, me);
    g.ring = world.split(me % 12, me);
    world.barrier();
    for (int i = 0; i < n; ++i) {
      replay_of(world)->begin_span("step", true, shape.last_apart && i + 1 == n ? "end" : "step");
      step(world, g, "block", shape);
    }
    replay_of(world)->begin_span("end", false, "");
  });
}

TEST(SpanReplay, AReplayedSpanGivesTheSimulatedTimeline) {
  for (const bool collective_ops : {true, false}) {
    for (const int workers : {1, 2}) {
      SCOPED_TRACE("collective ops " + std::to_string(collective_ops) + ", workers " +
                   std::to_string(workers));
      emu::Engine off = aurora(workers, collective_ops, false);
      const emu::RunResult ref = steps(off, 6);
      emu::Engine on = aurora(workers, collective_ops, true);
      const emu::RunResult got = steps(on, 6);
      expect_same_timeline(got, ref);
      EXPECT_EQ(ref.regions_replayed, 0u);
      // Every step starts behind a barrier, from the same offsets: step 0 is simulated and
      // recorded, steps 1 to 5 replay it, its five regions each (no block could be replayed
      // on its own: none starts quiescent).
      EXPECT_EQ(got.regions_replayed, 5u * 5u);
      EXPECT_GT(ref.flows, got.flows / 2);
    }
  }
}

TEST(SpanReplay, AMarkPassedWithMessagesInFlightIsJudgedWhereTheTilesArrive) {
  // Half the tiles end each step with a 4 MiB message between the nodes; the others pass the
  // next step's mark while it flies. Computing first (200 GFLOP of embedding, longer than the
  // message), every tile arrives at the mark, at its first call, after the message landed: the
  // mark is quiescent there and steps replay. Without that compute, the tiles arrive at the
  // mark itself, the message still in flight, and nothing replays.
  for (const bool collective_ops : {true, false}) {
    for (const int workers : {1, 2}) {
      for (const double embed : {2e11, 0.0}) {
        SCOPED_TRACE("collective ops " + std::to_string(collective_ops) + ", workers " +
                     std::to_string(workers) + ", embedding " + std::to_string(embed));
        const Shape shape{embed, true};
        emu::Engine off = aurora(workers, collective_ops, false);
        const emu::RunResult ref = steps(off, 6, shape);
        emu::Engine on = aurora(workers, collective_ops, true);
        const emu::RunResult got = steps(on, 6, shape);
        expect_same_timeline(got, ref);
        EXPECT_EQ(ref.regions_replayed, 0u);
        // Step 0 starts behind a barrier, step 1 behind a late tail: steps 2 to 4 replay
        // step 1, its five regions each. Step 5 is followed by the end, not by a step's
        // embedding: its message would still fly when the tiles arrive at the end mark, and
        // step 1's record, made before a step, is not replayed there.
        EXPECT_EQ(got.regions_replayed, embed > 0 ? 3u * 5u : 0u);
      }
    }
  }
}

TEST(SpanReplay, OnceTheTraceIsFullSpansReplayAndTheTraceIsTheSimulatedOne) {
  // While the trace takes events a span is not recorded (its record would copy them); once
  // every tile's part and the flows' part are full, spans replay and keep no trace.
  auto traced = [](bool replay, std::size_t limit) {
    emu::EngineOptions o;
    o.workers = 1;
    o.trace = true;
    o.trace_limit = limit;
    o.replay = replay;
    return test::aurora_engine(kPresets, 2, o);
  };
  auto key = [](const emu::TraceEvent& e) {
    return std::tie(e.kind, e.rank, e.peer, e.tier, e.label, e.start, e.end, e.bytes);
  };
  for (const std::size_t limit : {std::size_t{2'000'000}, std::size_t{480}}) {
    SCOPED_TRACE("trace limit " + std::to_string(limit));
    emu::Engine off = traced(false, limit);
    const emu::RunResult ref = steps(off, 6);
    emu::Engine on = traced(true, limit);
    const emu::RunResult got = steps(on, 6);
    expect_same_timeline(got, ref);
    ASSERT_EQ(got.trace.size(), ref.trace.size());
    for (std::size_t i = 0; i < ref.trace.size(); ++i)
      ASSERT_EQ(key(got.trace[i]), key(ref.trace[i])) << i;
    EXPECT_EQ(got.trace_truncated, limit < 2'000'000);
    // Untruncated, no step is replayed (no block starts quiescent either); truncated, the
    // steps after the trace filled are.
    if (limit < 2'000'000)
      EXPECT_GT(got.regions_replayed, 0u);
    else
      EXPECT_EQ(got.regions_replayed, 0u);
  }
}

TEST(SpanReplayDeathTest, ASpanWhoseNextIsNotWhatFollowsItStopsTheRun) {
  // The last step names a step as what follows it, but the end follows: replayed from a step
  // that ended with its message in flight, it would drop that message, which is still in flight
  // where the tiles arrive at the end mark. The run stops there, never giving a timeline.
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  emu::Engine e = aurora(1, true, true);
  Shape shape{2e11, true};
  shape.last_apart = false;
  EXPECT_DEATH(steps(e, 4, shape), "is reached before the work replayed before it ended");
}

TEST(SpanReplayDeathTest, AnInnerRegionUnlikeTheRecordingStopsTheRun) {
  // The span's key promises the same regions; a caller that breaks the promise is caught (an
  // internal check: the caller's bug), never given a timeline.
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  emu::Engine e = aurora(1, true, true);
  EXPECT_DEATH(e.run([](Communicator& world) {
    const int me = world.world_rank(world.rank());
    Groups g;
    g.node = world.split(me / 12, me);
    g.ring = world.split(me % 12, me);
    world.barrier();
    for (int i = 0; i < 4; ++i) {
      replay_of(world)->begin_span("step", true, "step");
      step(world, g, i < 2 ? "block" : "other block");
    }
    replay_of(world)->begin_span("end", false, "");
  }),
               "region 'other block' inside a replayed span, whose recording marked region "
               "'block' there");
}

}  // namespace
}  // namespace cocodiff
