// Call tapes (Replay::begin_tape, end_tape, play_tape): a tile's recorded calls, issued
// again, give the timeline (virtual times, bytes per tier, flows, events, timeline hash) of
// making the same calls from code, on every kind of call a phantom block makes (compute,
// all-to-all and all-to-allv, all-gather, all-reduce, point-to-point, ring passes), at the
// collective level and message by message, on 1 and 2 workers; and whatever a tape could not
// issue again as it was (a test(), a wait for a request started before the recording, a request
// left unwaited, a buffer with data, a split, a barrier, a region mark) leaves no tape.

#include <gtest/gtest.h>

#include <functional>
#include <mutex>

#include "core/errors.hpp"
#include "core/replay.hpp"
#include "net_models/cluster.hpp"
#include "tests/emulator/test_util.hpp"

namespace cocodiff {
namespace {

using test::expect_same_timeline;

const std::filesystem::path kPresets = std::filesystem::path(COCODIFF_CONFIG_DIR) / "clusters";

// Two Aurora nodes (24 tiles) under max-min.
emu::Engine aurora(int workers, bool collective_ops, bool call_tapes = true) {
  emu::EngineOptions o;
  o.workers = workers;
  o.trace = false;
  o.collective_ops = collective_ops;
  o.call_tapes = call_tapes;
  return test::aurora_engine(kPresets, 2, o);
}

// The groups a block uses: the tile's node (12 tiles) and its ring across the nodes (2).
struct Groups {
  std::unique_ptr<Communicator> node, ring;
};

Groups make_groups(Communicator& world) {
  const int me = world.world_rank(world.rank());
  Groups g;
  g.node = world.split(me / 12, me);
  g.ring = world.split(me % 12, me);
  return g;
}

// One phantom "block": sizes only, every kind of call, requests waited in a fixed order.
// With `reduce`, an all-reduce too (a call the engine leaves to the tile's fiber).
void block(Communicator& world, Groups& g, int round, bool reduce) {
  const int n = g.node->size(), me = g.node->rank();
  world.compute({OpKind::kGemm, 4e9, 1e7, "proj"});
  Request a = g.node->iall_to_all({}, {}, 4096, "q_all_to_all");
  world.compute({OpKind::kElementwise, 1e6, 3e6, "rope"});
  AllToAllvLayout layout;
  for (int j = 0; j < n; ++j) {
    layout.send_counts.push_back(1000 + 100 * ((me + j) % 3));
    layout.recv_counts.push_back(1000 + 100 * ((j + me) % 3));
  }
  layout = AllToAllvLayout::packed(layout.send_counts, layout.recv_counts);
  Request b = g.node->iall_to_allv({}, {}, layout, "k_all_to_allv");
  a.wait();
  b.wait();
  RingPass pass;
  pass.parts = 2;
  pass.labels = {"ring_k", "ring_v"};
  for (int j = 0; j < g.ring->size(); ++j) {
    pass.counts.push_back(8192);
    pass.work.push_back({OpKind::kAttention, 2e8 * (1 + j), 1e6, "ring_attention"});
  }
  g.ring->ring_pass(pass);
  g.node->all_gather({}, {}, 512, "gather");
  Request s = g.node->isend({}, 2048, (me + 1) % n, 7, "p2p");
  Request r = g.node->irecv({}, 2048, (me + n - 1) % n, 7, "p2p");
  world.compute({OpKind::kNorm, 1e5, 1e6, "norm"});
  r.wait();
  s.wait();
  if (reduce) g.ring->all_reduce({}, 1024, ReduceOp::kSum, "reduce");
  world.compute({OpKind::kCopy, 0, 1e6 * (1 + round % 2), "copy"});  // differs by round
}

TEST(CallTape, PlayedCallsGiveTheTimelineOfTheCode) {
  for (const bool collective_ops : {true, false}) {
    for (const bool reduce : {true, false}) {
      for (const int workers : {1, 2}) {
        SCOPED_TRACE("collective ops " + std::to_string(collective_ops) + ", all-reduce " +
                     std::to_string(reduce) + ", workers " + std::to_string(workers));
        // Rounds 0 and 2 are one block (even), rounds 1 and 3 another (odd): each tile records
        // the first of each and plays it for the second.
        emu::Engine code = aurora(workers, collective_ops);
        const emu::RunResult ref = code.run([reduce](Communicator& world) {
          Groups g = make_groups(world);
          for (int round = 0; round < 4; ++round) block(world, g, round, reduce);
        });
        emu::Engine taped = aurora(workers, collective_ops);
        const emu::RunResult got = taped.run([reduce](Communicator& world) {
          Groups g = make_groups(world);
          std::unique_ptr<Replay::CallTape> tapes[2];
          for (int round = 0; round < 4; ++round) {
            std::unique_ptr<Replay::CallTape>& t = tapes[round % 2];
            if (t != nullptr) {
              replay_of(world)->play_tape(*t);
              continue;
            }
            ASSERT_TRUE(replay_of(world)->begin_tape());
            block(world, g, round, reduce);
            t = replay_of(world)->end_tape();
            ASSERT_NE(t, nullptr);
          }
        });
        expect_same_timeline(got, ref);
        EXPECT_EQ(got.tapes_played, 2u * 24u);
        EXPECT_EQ(ref.tapes_played, 0u);
        // The engine issues the tapes it can for the waiting fibers (Kernel::run_tape); the
        // others are played on the fibers.
        EXPECT_EQ(got.tapes_run_by_engine, collective_ops && !reduce ? 2u * 24u : 0u);
        EXPECT_GT(ref.flows, 0u);
      }
    }
  }
}

TEST(CallTape, WhatCannotBeIssuedAgainLeavesNoTape) {
  // Each case runs between begin_tape and end_tape (a request it keeps is waited afterwards).
  using Case = std::function<Request(Communicator & world, Groups & g, const Request& before)>;
  const std::vector<std::pair<std::string, Case>> cases = {
      {"a test()",
       [](Communicator&, Groups& g, const Request&) {
         Request a = g.node->iall_to_all({}, {}, 64, "a");
         (void)a.test();
         a.wait();
         return Request();
       }},
      {"a wait for a request started before the recording",
       [](Communicator&, Groups&, const Request& before) {
         Request b = before;
         b.wait();
         return Request();
       }},
      {"a request left unwaited",
       [](Communicator&, Groups& g, const Request&) {
         return g.node->iall_to_all({}, {}, 64, "a");
       }},
      {"a buffer with data",
       [](Communicator&, Groups& g, const Request&) {
         std::vector<float> send(static_cast<size_t>(g.node->size()) * 4, 1.0f), recv(send.size());
         g.node->all_to_all(send, recv, 4, "a");
         return Request();
       }},
      {"a split",
       [](Communicator&, Groups& g, const Request&) {
         (void)g.node->split(0, g.node->rank());
         return Request();
       }},
      {"a barrier",
       [](Communicator&, Groups& g, const Request&) {
         g.node->barrier();
         return Request();
       }},
      {"a region mark",
       [](Communicator& world, Groups&, const Request&) {
         (void)replay_of(world)->begin_region("r", false);
         return Request();
       }},
  };
  for (const auto& [name, body] : cases) {
    SCOPED_TRACE(name);
    emu::Engine e = aurora(1, true);
    int spoiled = 0;
    std::mutex mu;
    e.run([&, &body = body](Communicator& world) {
      Groups g = make_groups(world);
      Request before = g.ring->iall_to_all({}, {}, 64, "before");
      ASSERT_TRUE(replay_of(world)->begin_tape());
      Request kept = body(world, g, before);
      const bool none = replay_of(world)->end_tape() == nullptr;
      kept.wait();
      before.wait();
      const std::lock_guard<std::mutex> lk(mu);
      spoiled += none ? 1 : 0;
    });
    EXPECT_EQ(spoiled, 24);
  }
  // Off (EngineOptions::call_tapes = false), nothing records.
  emu::Engine off = aurora(1, true, false);
  off.run([](Communicator& world) {
    EXPECT_FALSE(replay_of(world)->begin_tape());
    EXPECT_EQ(replay_of(world)->end_tape(), nullptr);
  });
}

}  // namespace
}  // namespace cocodiff
