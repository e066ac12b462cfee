// Collectives at the collective level (EngineOptions::collective_ops) against the per-message
// algorithms they replace: the same received bytes and the same timeline (virtual times, bytes
// per tier, flows, events, timeline hash) for every all-to-all schedule (shift, XOR,
// concurrent), all-to-allv with uneven and zero counts, ring all-gather, all-reduce (sum and max,
// in place) and barrier, sub-groups,
// non-blocking calls overlapping compute with interference, library software costs and max-min
// contention, ring passes with compute beside every round (uneven and empty blocks, a
// collective open beside them), on 1, 2 and 4 workers; and the same errors for mismatched calls.

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <mutex>

#include "core/errors.hpp"
#include "net_models/cluster.hpp"
#include "tests/emulator/test_util.hpp"

namespace cocodiff {
namespace {

const std::filesystem::path kPresets = std::filesystem::path(COCODIFF_CONFIG_DIR) / "clusters";

float tag_value(int from, int to, std::int64_t i) {
  return static_cast<float>(from * 1000000 + to * 1000 + static_cast<int>(i % 1000));
}

// count(i -> j) of an uneven all-to-allv, some of them zero; both ends compute it.
std::int64_t uneven(int i, int j) { return (i * 7 + j * 3) % 5 == 0 ? 0 : 1 + (i * 5 + j) % 9; }

// Aurora nodes (two: 24 tiles) under max-min, a library that charges every message and a ring's
// own block, a device whose compute and transfers slow down beside each other.
emu::Engine engine(const std::string& a2a, int workers, bool collective_ops, bool trace = true,
                   int nodes = 2, const std::string& preset = "aurora",
                   const std::string& all_gather = "ring") {
  Config cfg = Config::parse(
      "[cluster]\npreset = \"" + preset + "\"\nnodes = " + std::to_string(nodes) + "\n",
      "run.toml");
  Cluster c = load_cluster(cfg, kPresets);
  RooflineParams d;
  d.peak_flops_per_s = 1e12;
  d.hbm_bytes_per_s = 1e11;
  d.overlap_compute_factor = 1.2;
  d.overlap_transfer_factor = 1.3;
  emu::EngineOptions o;
  o.workers = workers;
  o.trace = trace;
  o.collective_ops = collective_ops;
  o.all_to_all_algorithm = a2a;
  o.library.name = "test";
  o.library.call_overhead = SimTime::from_ns(20'000);
  o.library.message_overhead = SimTime::from_ns(3'000);
  o.library.eager_max_bytes = 64;
  o.library.eager_overhead = SimTime::from_ns(500);
  o.library.rendezvous_overhead = SimTime::from_ns(4'000);
  o.library.local_copy_bytes_per_s = 5e10;  // a ring's own block: 20 ps per byte
  o.library.all_gather = all_gather;
  return emu::Engine(c.topology, std::move(c.network), std::make_shared<RooflineDevice>(d), o);
}

// Everything a run received, by (world rank, call).
using Received = std::map<std::pair<int, int>, std::vector<float>>;

void program(Communicator& world, Received& got, std::mutex& mu) {
  const int me = world.world_rank(world.rank());
  int call = 0;
  auto keep = [&](std::vector<float> v) {
    std::lock_guard<std::mutex> lk(mu);
    got[{me, call++}] = std::move(v);
  };
  auto all_to_all = [&](Communicator& c, std::int64_t count) {
    const int p = c.size();
    std::vector<float> send(static_cast<size_t>(p * count)), recv(send.size(), -1);
    for (int j = 0; j < p; ++j)
      for (std::int64_t i = 0; i < count; ++i)
        send[static_cast<size_t>(j * count + i)] = tag_value(c.rank(), j, i);
    c.all_to_all(send, recv, count, "a2a");
    for (int j = 0; j < p; ++j)
      for (std::int64_t i = 0; i < count; ++i)
        EXPECT_EQ(recv[static_cast<size_t>(j * count + i)], tag_value(j, c.rank(), i));
    keep(recv);
  };
  all_to_all(world, 3);
  // A power-of-two sub-group (XOR order applies) and one of 8 with reversed order.
  auto sixteen = world.split(world.rank() < 16 ? 0 : 1, world.rank());
  all_to_all(*sixteen, 40);
  auto reversed = sixteen->split(sixteen->rank() % 2, -sixteen->rank());
  all_to_all(*reversed, 1000);  // rendezvous-size messages

  // all-to-allv with uneven and zero counts.
  const int p = world.size();
  const int r = world.rank();
  std::vector<std::int64_t> sc(static_cast<size_t>(p)), rc(static_cast<size_t>(p));
  for (int j = 0; j < p; ++j) {
    sc[static_cast<size_t>(j)] = uneven(r, j);
    rc[static_cast<size_t>(j)] = uneven(j, r);
  }
  const AllToAllvLayout layout = AllToAllvLayout::packed(sc, rc);
  std::vector<float> vsend(static_cast<size_t>(layout.send_total()));
  std::vector<float> vrecv(static_cast<size_t>(layout.recv_total()), -1);
  for (int j = 0; j < p; ++j)
    for (std::int64_t i = 0; i < sc[static_cast<size_t>(j)]; ++i)
      vsend[static_cast<size_t>(layout.send_displs[static_cast<size_t>(j)] + i)] =
          tag_value(r, j, i);
  world.all_to_allv(vsend, vrecv, layout, "a2av");
  for (int j = 0; j < p; ++j)
    for (std::int64_t i = 0; i < rc[static_cast<size_t>(j)]; ++i)
      EXPECT_EQ(vrecv[static_cast<size_t>(layout.recv_displs[static_cast<size_t>(j)] + i)],
                tag_value(j, r, i));
  keep(vrecv);

  // all-to-allv in which rank 3 receives nothing (an empty receive buffer) but sends, and rank 5
  // sends nothing (an empty send buffer) but receives: their data still moves (Ulysses with
  // fewer heads than ranks exchanges so).
  const auto one_sided = [](int i, int j) -> std::int64_t { return j == 3 || i == 5 ? 0 : 2; };
  for (int j = 0; j < p; ++j) {
    sc[static_cast<size_t>(j)] = one_sided(r, j);
    rc[static_cast<size_t>(j)] = one_sided(j, r);
  }
  const AllToAllvLayout side = AllToAllvLayout::packed(sc, rc);
  std::vector<float> ssend(static_cast<size_t>(side.send_total()));
  std::vector<float> srecv(static_cast<size_t>(side.recv_total()), -1);
  EXPECT_EQ(r == 3, srecv.empty());
  EXPECT_EQ(r == 5, ssend.empty());
  for (int j = 0; j < p; ++j)
    for (std::int64_t i = 0; i < sc[static_cast<size_t>(j)]; ++i)
      ssend[static_cast<size_t>(side.send_displs[static_cast<size_t>(j)] + i)] = tag_value(r, j, i);
  world.all_to_allv(ssend, srecv, side, "one_sided");
  for (int j = 0; j < p; ++j)
    for (std::int64_t i = 0; i < rc[static_cast<size_t>(j)]; ++i)
      EXPECT_EQ(srecv[static_cast<size_t>(side.recv_displs[static_cast<size_t>(j)] + i)],
                tag_value(j, r, i))
          << "from " << j << " to " << r;
  keep(srecv);

  // Ring all-gather on the world and on a sub-group.
  for (Communicator* c : {&world, sixteen.get()}) {
    std::vector<float> mine = {static_cast<float>(me), static_cast<float>(2 * me)};
    std::vector<float> all(static_cast<size_t>(2 * c->size()), -1);
    c->all_gather(mine, all, 2, "gather");
    for (int j = 0; j < c->size(); ++j)
      EXPECT_EQ(all[static_cast<size_t>(2 * j)], static_cast<float>(c->world_rank(j)));
    keep(all);
  }

  // Ring passes of two parts with uneven blocks (one empty), and compute beside every round
  // that makes some rounds wait for their messages and others not.
  auto ring_pass = [&](Communicator& c, std::int64_t scale, bool with_data) {
    const int n = c.size();
    std::vector<std::vector<float>> k(static_cast<size_t>(n)), v(static_cast<size_t>(n));
    RingPass pass;
    pass.parts = 2;
    pass.labels = {"ring_k", "ring_v"};
    for (int j = 0; j < n; ++j) {
      const std::int64_t count = j % 5 == 3 ? 0 : scale * (1 + j % 3);
      pass.counts.push_back(count);
      k[static_cast<size_t>(j)].assign(static_cast<size_t>(count), -1);
      v[static_cast<size_t>(j)].assign(static_cast<size_t>(count), -1);
      if (j == c.rank())
        for (std::int64_t i = 0; i < count; ++i) {
          k[static_cast<size_t>(j)][static_cast<size_t>(i)] = tag_value(me, 0, i);
          v[static_cast<size_t>(j)][static_cast<size_t>(i)] = tag_value(me, 1, i);
        }
      pass.work.push_back(
          {OpKind::kAttention, 2e5 * (1 + (j + c.rank()) % 4), 0, "ring_attention"});
    }
    if (with_data)
      pass.data = [&](int part, int j) -> std::span<float> {
        return (part == 0 ? k : v)[static_cast<size_t>(j)];
      };
    c.ring_pass(pass);
    if (!with_data) return;
    for (int j = 0; j < n; ++j)
      for (std::int64_t i = 0; i < pass.counts[static_cast<size_t>(j)]; ++i) {
        EXPECT_EQ(k[static_cast<size_t>(j)][static_cast<size_t>(i)],
                  tag_value(c.world_rank(j), 0, i));
        EXPECT_EQ(v[static_cast<size_t>(j)][static_cast<size_t>(i)],
                  tag_value(c.world_rank(j), 1, i));
      }
    keep(k[static_cast<size_t>((c.rank() + 1) % n)]);
  };
  world.compute({OpKind::kGemm, 1e6 * (1 + r % 3), 0, "skew"});
  ring_pass(world, 300, true);
  ring_pass(*sixteen, 5000, false);  // sizes only
  {
    // A collective open beside the pass: its compute runs slower, the collective pays for it.
    std::vector<float> s3(static_cast<size_t>(p * 16), 3.0f), r3(s3.size());
    Request q3 = world.iall_to_all(s3, r3, 16, "beside_ring");
    ring_pass(*reversed, 700, true);
    q3.wait();
  }

  // All-reduce in place (sum on the world, max on a sub-group; counts that split unevenly over
  // the ring's chunks), then a barrier after skewed compute.
  for (Communicator* c : {&world, sixteen.get()}) {
    const bool sum = c == &world;
    const std::int64_t count = 3 * c->size() + 5;
    std::vector<float> x(static_cast<size_t>(count));
    for (std::int64_t i = 0; i < count; ++i)
      x[static_cast<size_t>(i)] = static_cast<float>((me + 1) * (1 + i % 7));
    c->all_reduce(x, count, sum ? ReduceOp::kSum : ReduceOp::kMax, "reduce");
    float members = 0, largest = 0;
    for (int j = 0; j < c->size(); ++j) {
      members += static_cast<float>(c->world_rank(j) + 1);
      largest = std::max(largest, static_cast<float>(c->world_rank(j) + 1));
    }
    for (std::int64_t i = 0; i < count; ++i)
      EXPECT_EQ(x[static_cast<size_t>(i)],
                (sum ? members : largest) * static_cast<float>(1 + i % 7));
    keep(x);
  }
  world.compute({OpKind::kGemm, 3e6 * (1 + r % 4), 0, "skew"});
  world.barrier();

  // Non-blocking: two all-to-alls in flight beside compute (interference on both sides), one
  // waited for in reverse order, with tiles starting at different clocks.
  world.compute({OpKind::kGemm, 1e6 * (1 + r % 5), 0, "skew"});
  std::vector<float> s1(static_cast<size_t>(p * 64), 1.0f), r1(s1.size());
  std::vector<float> s2(static_cast<size_t>(p * 8), 2.0f), r2(s2.size());
  Request q1 = world.iall_to_all(s1, r1, 64, "overlapped_v");
  world.compute({OpKind::kGemm, 5e7, 0, "beside"});
  Request q2 = world.iall_to_all(s2, r2, 8, "overlapped_k");
  world.compute({OpKind::kAttention, 2e7, 0, "beside"});
  while (!q2.test()) world.compute({OpKind::kElementwise, 0, 1e6, "poll"});
  q1.wait();
  keep(r1);
  keep(r2);
}

struct Outcome {
  emu::RunResult result;
  Received received;
};

Outcome run(const std::string& a2a, int workers, bool collective_ops, bool trace = true,
            int nodes = 2, const std::string& preset = "aurora") {
  emu::Engine e = engine(a2a, workers, collective_ops, trace, nodes, preset);
  Outcome out;
  std::mutex mu;
  out.result = e.run([&](Communicator& c) { program(c, out.received, mu); });
  return out;
}

// The same timeline (virtual times, compute, exposed time, bytes per tier, flows, events, hash)
// and the same received bytes.
void expect_same_run(const Outcome& got, const Outcome& ref) {
  EXPECT_EQ(got.result.makespan, ref.result.makespan);
  EXPECT_EQ(got.result.rank_end, ref.result.rank_end);
  EXPECT_EQ(got.result.rank_compute, ref.result.rank_compute);
  EXPECT_EQ(got.result.rank_exposed, ref.result.rank_exposed);
  EXPECT_EQ(got.result.bytes_by_tier, ref.result.bytes_by_tier);
  EXPECT_EQ(got.result.flows, ref.result.flows);
  EXPECT_EQ(got.result.events, ref.result.events);
  EXPECT_EQ(got.result.timeline_sha256, ref.result.timeline_sha256);
  EXPECT_EQ(got.received, ref.received);
}

// The same trace: each tile's events in its order, and the same flows (start, end, ends, bytes,
// label), whose order among equal (start, sender, receiver, end) does not count.
void expect_same_trace(const emu::RunResult& got, const emu::RunResult& ref) {
  using Row = std::tuple<int, std::int64_t, std::int64_t, int, int, int, std::int64_t, std::string>;
  const auto rows = [](const emu::RunResult& r) {
    std::vector<Row> out, flows;
    for (const emu::TraceEvent& e : r.trace) {
      const Row row{
          static_cast<int>(e.kind), e.start.ns(), e.end.ns(), e.rank, e.peer, e.tier, e.bytes,
          r.labels[e.label]};
      (e.kind == emu::TraceEvent::Kind::kFlow ? flows : out).push_back(row);
    }
    std::sort(flows.begin(), flows.end());
    out.insert(out.end(), flows.begin(), flows.end());
    return out;
  };
  EXPECT_FALSE(ref.trace.empty());
  EXPECT_FALSE(got.trace_truncated);
  EXPECT_TRUE(rows(got) == rows(ref));
}

TEST(CollectiveOps, GiveThePerMessageTimelineAndBytesOnAnyWorkerCount) {
  for (const std::string a2a : {"pairwise", "xor", "concurrent", "library"}) {
    SCOPED_TRACE(a2a);
    const Outcome ref = run(a2a, 1, false);
    EXPECT_GT(ref.result.flows, 0u);
    for (int workers : {1, 2, 4}) {
      SCOPED_TRACE("workers " + std::to_string(workers));
      const Outcome got = run(a2a, workers, true);
      expect_same_run(got, ref);
      expect_same_trace(got.result, ref.result);
    }
  }
  // The schedules differ, so the test can tell them apart.
  EXPECT_NE(run("pairwise", 1, true).result.timeline_sha256,
            run("xor", 1, true).result.timeline_sha256);
  EXPECT_NE(run("pairwise", 1, true).result.timeline_sha256,
            run("concurrent", 1, true).result.timeline_sha256);
}

TEST(CollectiveOps, ExclusiveRingHopsGiveTheNetworkTimeline) {
  // Ring passes time the hops whose links no other rank's flow can reach (tiles 2,
  // 3, 8 and 9 of an Aurora node have a NIC each; tiles of one GPU share their MDFI link) with
  // NetworkModel::exclusive_end instead of the network model, as long as neither end has
  // anything else open: the passes beside an open all-to-all take the network's path. The
  // timeline hash sums a digest per flow, so the order in which flows complete does not count.
  const Outcome ref = run("pairwise", 1, false, false);
  EXPECT_EQ(ref.result.flows_exclusive, 0u);  // per message: every flow through the network
  for (int workers : {1, 2, 4}) {
    SCOPED_TRACE("workers " + std::to_string(workers));
    const Outcome got = run("pairwise", workers, true, false);
    EXPECT_GT(got.result.flows_exclusive, 0u);
    EXPECT_LT(got.result.flows_exclusive, got.result.flows);
    expect_same_run(got, ref);
  }
  // The trace observes the same path: the same flows timed in closed form, the same timeline,
  // and the per-message run's trace.
  const Outcome traced = run("pairwise", 1, true, true);
  const Outcome untraced = run("pairwise", 1, true, false);
  EXPECT_EQ(traced.result.flows_exclusive, untraced.result.flows_exclusive);
  EXPECT_EQ(traced.result.passes_whole, untraced.result.passes_whole);
  expect_same_run(traced, ref);
  expect_same_trace(traced.result, run("pairwise", 1, false, true).result);
}

TEST(CollectiveOps, MessagesThatTravelAloneGiveTheNetworkTimeline) {
  // Three HGX H100 nodes (24 GPUs): every GPU reaches the NVSwitch and its NIC over links of its
  // own, so a message of a pairwise or ring schedule between two tiles that both wait for that
  // op alone (op_waits_alone) travels alone, and it is timed in closed form. The program's
  // overlapped all-to-alls, its polled one and its concurrent schedule take the network's path.
  // The same timeline and received bytes as the per-message run on 1, 2 and 4 workers; with the
  // trace on, the same path, and the per-message run's trace.
  std::uint64_t concurrent_exclusive = 0;
  for (const std::string a2a : {"concurrent", "pairwise", "xor", "library"}) {
    SCOPED_TRACE(a2a);
    const Outcome ref = run(a2a, 1, false, false, 3, "hgx-h100");
    EXPECT_EQ(ref.result.flows_exclusive, 0u);
    for (int workers : {1, 2, 4}) {
      SCOPED_TRACE("workers " + std::to_string(workers));
      const Outcome got = run(a2a, workers, true, false, 3, "hgx-h100");
      expect_same_run(got, ref);
      EXPECT_LT(got.result.flows_exclusive, got.result.flows);
      // Ring passes are exclusive on every schedule; the all-to-all messages only when one
      // message goes each way at a time.
      if (a2a == "concurrent")
        concurrent_exclusive = got.result.flows_exclusive;
      else
        EXPECT_GT(got.result.flows_exclusive, concurrent_exclusive + 500);
    }
    const Outcome traced = run(a2a, 1, true, true, 3, "hgx-h100");
    EXPECT_EQ(traced.result.flows_exclusive,
              run(a2a, 1, true, false, 3, "hgx-h100").result.flows_exclusive);
    expect_same_run(traced, ref);
    expect_same_trace(traced.result, run(a2a, 1, false, true, 3, "hgx-h100").result);
  }
}

// usp's rings across four Aurora nodes: one ring per tile index. Tiles 2, 3, 8 and 9 have a NIC
// each, so their rings' hops are exclusive; tiles 0 and 4, 1 and 5, 6 and 10, 7 and 11 share
// one, so two rings' hops between two nodes share its links. After a barrier, rings 0 and 4 run
// in step; ring 5 starts late on one node; rings 7 and 11 pass blocks of other sizes; ring 6 has
// an empty block; ring 10 has compute that differs by member.
void rings(Communicator& world, Received& got, std::mutex& mu) {
  const int me = world.rank(), tile = me % 12, node = me / 12;
  auto ring = world.split(tile, me);
  const int n = ring->size();
  world.barrier();
  if (tile == 5 && node == 1) world.compute({OpKind::kGemm, 3e6, 0, "late"});
  for (int pass_no = 0; pass_no < 2; ++pass_no) {
    std::vector<std::vector<float>> k(static_cast<size_t>(n)), v(static_cast<size_t>(n));
    RingPass pass;
    pass.parts = 2;
    pass.labels = {"ring_k", "ring_v"};
    for (int j = 0; j < n; ++j) {
      const std::int64_t count = tile == 7             ? 300 * (1 + j % 3)
                                 : tile == 11          ? 200 * (1 + (j + 1) % 3)
                                 : tile == 6 && j == 2 ? 0
                                                       : 300 + 100 * pass_no;
      pass.counts.push_back(count);
      k[static_cast<size_t>(j)].assign(static_cast<size_t>(count), -1);
      v[static_cast<size_t>(j)].assign(static_cast<size_t>(count), -1);
      for (std::int64_t i = 0; j == ring->rank() && i < count; ++i) {
        k[static_cast<size_t>(j)][static_cast<size_t>(i)] = tag_value(me, 0, i);
        v[static_cast<size_t>(j)][static_cast<size_t>(i)] = tag_value(me, 1, i);
      }
      pass.work.push_back(
          {OpKind::kAttention, tile == 10 ? 1e5 * (1 + (j + node) % 3) : 2e5, 0, "ring_attention"});
    }
    pass.data = [&](int part, int j) -> std::span<float> {
      return (part == 0 ? k : v)[static_cast<size_t>(j)];
    };
    // Ring 3's member on node 2 joins its second pass with a receive open (from node 3's, which
    // sends after the pass): the members that joined before it post their first round then,
    // and the pass runs round by round; its first pass, and rings 2, 8 and 9, are timed whole.
    const bool open_recv = tile == 3 && node == 2 && pass_no == 1;
    const bool late_send = tile == 3 && node == 3 && pass_no == 1;
    std::vector<float> side(16, -1), side_out(16, static_cast<float>(me));
    Request side_req;
    if (open_recv) side_req = ring->irecv(side, 16, ring->rank() + 1, 99, "side");
    ring->ring_pass(pass);
    if (late_send) ring->isend(side_out, 16, ring->rank() - 1, 99, "side").wait();
    if (open_recv) {
      side_req.wait();
      ASSERT_EQ(side[0], static_cast<float>(me + 12));
    }
    for (int j = 0; j < n; ++j)
      for (std::int64_t i = 0; i < pass.counts[static_cast<size_t>(j)]; ++i)
        ASSERT_EQ(k[static_cast<size_t>(j)][static_cast<size_t>(i)] +
                      v[static_cast<size_t>(j)][static_cast<size_t>(i)],
                  tag_value(ring->world_rank(j), 0, i) + tag_value(ring->world_rank(j), 1, i));
    std::lock_guard<std::mutex> lk(mu);
    got[{me, pass_no}] = k[static_cast<size_t>((ring->rank() + 1) % n)];
  }
}

TEST(CollectiveOps, PairedRingHopsGiveTheNetworkTimeline) {
  // Two hops that only each other's flows can slow down (NetworkModel::pair_key) are held until
  // both are matched and timed together when they end at one instant (exclusive_pair_ends); the
  // others go to the network. The same timeline and received bytes as the per-message run, on
  // 1, 2 and 4 workers; with the trace on, the same path and the per-message run's trace.
  const auto run_rings = [](int workers, bool ops, bool trace) {
    emu::Engine e = engine("pairwise", workers, ops, trace, 4);
    Outcome out;
    std::mutex mu;
    out.result = e.run([&](Communicator& c) { rings(c, out.received, mu); });
    return out;
  };
  const Outcome ref = run_rings(1, false, false);
  EXPECT_EQ(ref.result.flows_exclusive, 0u);
  // Flows of one ring: 4 members, 3 hops each, 2 parts, 2 passes.
  const std::uint64_t ring_flows = std::uint64_t{4} * 3 * 2 * 2;
  for (int workers : {1, 2, 4}) {
    SCOPED_TRACE("workers " + std::to_string(workers));
    const Outcome got = run_rings(workers, true, false);
    // The four exclusive rings', rings 0 and 4, but not every ring's: those out of step go to
    // the network.
    // (Besides the barrier's and the splits' collective messages between tiles that wait for
    // them alone, on routes of their own: op_waits_alone.)
    EXPECT_GE(got.result.flows_exclusive, (4 + 2) * ring_flows - 12);  // ring 3's open receive
    EXPECT_LT(got.result.flows_exclusive, got.result.flows);
    // Rings 2, 8 and 9 twice and ring 3 once are timed whole (CollectiveRunner::op_whole).
    EXPECT_EQ(got.result.passes_whole, 7u);
    expect_same_run(got, ref);
  }
  EXPECT_EQ(ref.result.passes_whole, 0u);
  const Outcome traced = run_rings(1, true, true);
  EXPECT_EQ(traced.result.flows_exclusive, run_rings(1, true, false).result.flows_exclusive);
  EXPECT_EQ(traced.result.passes_whole, 7u);
  expect_same_run(traced, ref);
  expect_same_trace(traced.result, run_rings(1, false, true).result);
}

// Groups of 2, 3, 5, 7, 11, 13, 17 and 38 members of 96 ranks, and the world: an all-to-all, an
// uneven all-to-allv and an all-gather on each, at once, and a non-blocking all-to-all beside
// compute on the world.
void sizes_2_to_96(Communicator& world, Received& got, std::mutex& mu) {
  const int me = world.rank();
  const std::vector<int> ends = {2, 5, 10, 17, 28, 41, 58, 96};
  const int color = static_cast<int>(std::upper_bound(ends.begin(), ends.end(), me) - ends.begin());
  auto g = world.split(color, (me * 37) % 96);  // a shuffled order
  int call = 0;
  const auto keep = [&](std::vector<float> v) {
    std::lock_guard<std::mutex> lk(mu);
    got[{me, call++}] = std::move(v);
  };
  for (Communicator* c : {g.get(), &world}) {
    const int p = c->size(), r = c->rank();
    const std::int64_t n = c == &world ? 1 : 3;
    std::vector<float> send(static_cast<size_t>(p * n)), recv(send.size(), -1);
    for (int j = 0; j < p; ++j)
      for (std::int64_t i = 0; i < n; ++i)
        send[static_cast<size_t>(j * n + i)] = tag_value(c->world_rank(r), c->world_rank(j), i);
    Request q = c->iall_to_all(send, recv, n, "a2a");
    c->compute({OpKind::kGemm, 1e5 * (1 + r % 3), 0, "beside"});
    q.wait();
    keep(recv);
    std::vector<std::int64_t> sc(static_cast<size_t>(p)), rc(static_cast<size_t>(p));
    for (int j = 0; j < p; ++j) {
      sc[static_cast<size_t>(j)] = uneven(c->world_rank(r), c->world_rank(j));
      rc[static_cast<size_t>(j)] = uneven(c->world_rank(j), c->world_rank(r));
    }
    const AllToAllvLayout l = AllToAllvLayout::packed(sc, rc);
    std::vector<float> vs(static_cast<size_t>(l.send_total()), 1.0f + static_cast<float>(me));
    std::vector<float> vr(static_cast<size_t>(l.recv_total()), -1);
    c->all_to_allv(vs, vr, l, "a2av");
    keep(vr);
    std::vector<float> mine(static_cast<size_t>(n + 1), static_cast<float>(me));
    std::vector<float> all(static_cast<size_t>((n + 1) * p), -1);
    c->all_gather(mine, all, n + 1, "gather");
    for (int j = 0; j < p; ++j)
      EXPECT_EQ(all[static_cast<size_t>(j * (n + 1))], static_cast<float>(c->world_rank(j)));
    keep(all);
  }
}

TEST(CollectiveOps, EveryScheduleOnTwoTo96RanksGivesItsPerMessageRun) {
  // Eight Aurora nodes under max-min. Per message (the schedule run on a collective fiber)
  // against the collective level (messages that travel alone timed in closed form): the same
  // timeline and received bytes.
  for (const auto& pair :
       std::vector<std::pair<std::string, std::string>>{{"pairwise", "ring"},
                                                        {"xor", "hierarchical"},
                                                        {"concurrent", "ring"},
                                                        {"bruck", "hierarchical"}}) {
    const std::string& a2a = pair.first;
    const std::string& ag = pair.second;
    SCOPED_TRACE(a2a);
    const auto run_sizes = [&](bool ops, bool trace) {
      emu::Engine e = engine(a2a, 1, ops, trace, 8, "aurora", ag);
      Outcome out;
      std::mutex mu;
      out.result = e.run([&](Communicator& c) { sizes_2_to_96(c, out.received, mu); });
      return out;
    };
    const Outcome ref = run_sizes(false, false);
    const Outcome got = run_sizes(true, false);
    expect_same_run(got, ref);
    EXPECT_EQ(ref.result.flows_exclusive, 0u);
    if (a2a != "concurrent") {
      EXPECT_GT(got.result.flows_exclusive, 0u);
    }
  }
}

// Errors: the same message whichever path runs the collective.
std::string error_of(bool collective_ops, const std::function<void(Communicator&)>& body,
                     bool trace = true) {
  emu::Engine e = engine("pairwise", 1, collective_ops, trace);
  try {
    e.run(body);
  } catch (const std::exception& ex) {
    return ex.what();
  }
  return "";
}

TEST(CollectiveOps, MismatchedCountsFailNamingBothRanks) {
  // Rank 3 expects one element more from rank 5 than rank 5 sends it.
  auto body = [](Communicator& c) {
    const int p = c.size();
    std::vector<std::int64_t> sc(static_cast<size_t>(p), 2), rc(static_cast<size_t>(p), 2);
    if (c.rank() == 3) rc[5] = 3;
    const AllToAllvLayout l = AllToAllvLayout::packed(sc, rc);
    std::vector<float> send(static_cast<size_t>(l.send_total())),
        recv(static_cast<size_t>(l.recv_total()));
    c.all_to_allv(send, recv, l, "uneven");
  };
  for (bool ops : {false, true}) {
    SCOPED_TRACE(ops ? "collective ops" : "per message");
    const std::string msg = error_of(ops, body);
    EXPECT_NE(msg.find("message size mismatch: rank 5 sends 2 elements to rank 3, which expects 3"),
              std::string::npos)
        << msg;
    EXPECT_NE(msg.find("'uneven'"), std::string::npos) << msg;
  }
}

// A member whose first round finds a mismatch leaves the call (its sizes and buffers go with
// the stack it unwinds); the members that start after it must not match it: the run fails with
// the mismatch (under ASan, a later member reading the first's freed layout would fail it).
TEST(CollectiveOps, AMemberFailingAtItsStartIsNotMatchedByLaterMembers) {
  // Every rank sends one element to each other rank and none to rank 0, and expects none from
  // rank 0: rank 0 sends rank 1 an element rank 1 does not expect, found when rank 1 starts.
  auto body = [](Communicator& c) {
    std::vector<std::int64_t> sc(static_cast<size_t>(c.size()), 1);
    sc[0] = 0;
    const AllToAllvLayout l = AllToAllvLayout::packed(sc, sc);
    std::vector<float> send(static_cast<size_t>(l.send_total()), 1.0F),
        recv(static_cast<size_t>(l.recv_total()));
    c.all_to_allv(send, recv, l, "skewed");
  };
  for (bool ops : {false, true}) {
    SCOPED_TRACE(ops ? "collective ops" : "per message");
    const std::string msg = error_of(ops, body);
    EXPECT_NE(msg.find("message size mismatch: rank 0 sends 1 elements to rank 1, which expects 0"),
              std::string::npos)
        << msg;
    EXPECT_NE(msg.find("'skewed'"), std::string::npos) << msg;
  }
}

// (collective_ops, trace): per message; at the collective level; at the collective level with
// the trace off, where exclusive ring hops skip the network model.
const std::vector<std::pair<bool, bool>> kRingPassPaths = {
    {false, true}, {true, true}, {true, false}};

TEST(CollectiveOps, MismatchedRingPassBlocksFailNamingBothRanks) {
  // `rank` expects `block` one element longer than its owner sends it: block 5 reaches rank 3
  // in a later round; block 23 reaches rank 0 in the first, from the last rank to start, which
  // has already matched its receive from rank 22 when it finds the mismatch.
  auto body = [](int rank, int block) {
    return [rank, block](Communicator& c) {
      RingPass pass;
      pass.parts = 2;
      pass.labels = {"ring_k", "ring_v"};
      pass.counts.assign(static_cast<size_t>(c.size()), 4);
      if (c.rank() == rank) pass.counts[static_cast<size_t>(block)] = 5;
      pass.work.assign(static_cast<size_t>(c.size()), OpCost{OpKind::kAttention, 1e5, 0, "a"});
      c.ring_pass(pass);
    };
  };
  // Trace off, the collective-level pass times exclusive hops without the network model.
  for (const auto& [ops, trace] : kRingPassPaths) {
    SCOPED_TRACE(ops ? (trace ? "collective ops" : "collective ops, exclusive hops")
                     : "per message");
    std::string msg = error_of(ops, body(3, 5), trace);
    EXPECT_NE(msg.find("message size mismatch: rank 2 sends 4 elements to rank 3, which expects 5"),
              std::string::npos)
        << msg;
    EXPECT_NE(msg.find("'ring_k'"), std::string::npos) << msg;
    msg = error_of(ops, body(0, 23), trace);
    EXPECT_NE(
        msg.find("message size mismatch: rank 23 sends 4 elements to rank 0, which expects 5"),
        std::string::npos)
        << msg;
  }
}

TEST(CollectiveOps, ARingPassWithAMissingRankIsADeadlockNamingIt) {
  auto body = [](Communicator& c) {
    if (c.rank() == 7) return;
    RingPass pass;
    pass.labels = {"lonely_ring"};
    pass.counts.assign(static_cast<size_t>(c.size()), 2);
    pass.work.assign(static_cast<size_t>(c.size()), OpCost{OpKind::kAttention, 1e5, 0, "a"});
    c.ring_pass(pass);
  };
  for (const auto& [ops, trace] : kRingPassPaths) {
    SCOPED_TRACE(ops ? (trace ? "collective ops" : "collective ops, exclusive hops")
                     : "per message");
    const std::string msg = error_of(ops, body, trace);
    EXPECT_NE(msg.find("deadlock"), std::string::npos) << msg;
    EXPECT_NE(msg.find("lonely_ring"), std::string::npos) << msg;
    EXPECT_NE(msg.find("rank 8"), std::string::npos) << msg;
  }
}

TEST(CollectiveOps, ErrorsInAPassTimedWholeAreTheRoundsErrors) {
  // Ring 2 across four Aurora nodes (ranks 2, 14, 26, 38): every hop exclusive, so with the
  // trace off its members wait to be timed whole. A member with other block sizes makes the
  // pass run round by round (the same mismatch as the other paths); a member that never joins
  // leaves the others waiting (the same deadlock).
  const auto error_on_ring = [](bool ops, bool trace, bool missing) {
    emu::Engine e = engine("pairwise", 1, ops, trace, 4);
    try {
      e.run([missing](Communicator& world) {
        const int me = world.rank();
        auto ring = world.split(me % 12, me);
        if (me % 12 != 2 || (missing && me == 26)) return;
        RingPass pass;
        pass.parts = 2;
        pass.labels = {"ring_k", "ring_v"};
        pass.counts.assign(4, 4);
        if (me == 38) pass.counts[1] = 5;  // block 1 reaches ring member 3 in round 1
        pass.work.assign(4, OpCost{OpKind::kAttention, 1e5, 0, "a"});
        ring->ring_pass(pass);
      });
    } catch (const std::exception& ex) {
      return std::string(ex.what());
    }
    return std::string();
  };
  for (const auto& [ops, trace] : kRingPassPaths) {
    SCOPED_TRACE(ops ? (trace ? "collective ops" : "collective ops, timed whole") : "per message");
    std::string msg = error_on_ring(ops, trace, false);
    EXPECT_NE(
        msg.find("message size mismatch: rank 26 sends 4 elements to rank 38, which expects 5"),
        std::string::npos)
        << msg;
    msg = error_on_ring(ops, trace, true);
    EXPECT_NE(msg.find("deadlock"), std::string::npos) << msg;
    EXPECT_NE(msg.find("rank 14"), std::string::npos) << msg;
  }
}

TEST(CollectiveOps, ARingPassBesideACollectiveOfTheSameNumberOnOneGroupKeepsItsOwnState) {
  // A group's collectives and ring passes are numbered apart: the first non-blocking all-to-all
  // (#0) is still open while the first ring pass (#0) runs on the same group. Each keeps its own
  // data, and every path gives the per-message timeline.
  const auto body = [](Communicator& c) {
    const int p = c.size(), me = c.rank();
    std::vector<float> send(static_cast<size_t>(p * 4)), recv(send.size(), -1);
    for (int j = 0; j < p; ++j)
      for (int i = 0; i < 4; ++i) send[static_cast<size_t>(j * 4 + i)] = tag_value(me, j, i);
    Request q = c.iall_to_all(send, recv, 4, "open_a2a");
    std::vector<std::vector<float>> blocks(static_cast<size_t>(p));
    RingPass pass;
    pass.labels = {"ring_beside"};
    for (int j = 0; j < p; ++j) {
      pass.counts.push_back(3);
      blocks[static_cast<size_t>(j)].assign(3, j == me ? tag_value(me, 0, j) : -1.0f);
      pass.work.push_back({OpKind::kAttention, 1e5, 0, "ring_attention"});
    }
    pass.data = [&](int, int j) -> std::span<float> { return blocks[static_cast<size_t>(j)]; };
    c.ring_pass(pass);
    q.wait();
    for (int j = 0; j < p; ++j) {
      EXPECT_EQ(blocks[static_cast<size_t>(j)][2], tag_value(j, 0, j)) << "block " << j;
      EXPECT_EQ(recv[static_cast<size_t>(j * 4 + 3)], tag_value(j, me, 3)) << "from " << j;
    }
  };
  std::string reference;
  for (const auto& [ops, trace] : kRingPassPaths) {
    SCOPED_TRACE(ops ? (trace ? "collective ops" : "collective ops, exclusive hops")
                     : "per message");
    emu::Engine e = engine("pairwise", 1, ops, trace);
    const emu::RunResult res = e.run(body);
    if (reference.empty()) reference = res.timeline_sha256;
    EXPECT_EQ(res.timeline_sha256, reference);
  }
}

TEST(CollectiveOps, ARingPassWithoutAChargePerMemberIsRefused) {
  const std::string msg = error_of(true, [](Communicator& c) {
    RingPass pass;
    pass.labels = {"x"};
    pass.counts.assign(static_cast<size_t>(c.size()), 1);
    pass.work.resize(3);
    c.ring_pass(pass);
  });
  EXPECT_NE(msg.find("ring_pass on rank"), std::string::npos) << msg;
  EXPECT_NE(msg.find("3 charges"), std::string::npos) << msg;
}

TEST(CollectiveOps, ARankThatNeverCallsIsADeadlockNamingTheCollective) {
  auto body = [](Communicator& c) {
    if (c.rank() == 7) return;
    std::vector<float> send(static_cast<size_t>(c.size())), recv(send.size());
    c.all_to_all(send, recv, 1, "lonely");
  };
  for (bool ops : {false, true}) {
    SCOPED_TRACE(ops ? "collective ops" : "per message");
    const std::string msg = error_of(ops, body);
    EXPECT_NE(msg.find("deadlock"), std::string::npos) << msg;
    EXPECT_NE(msg.find("all_to_all(count=1) #0 ('lonely')"), std::string::npos) << msg;
    EXPECT_NE(msg.find("only 23 of 24 ranks called it"), std::string::npos) << msg;
  }
}

}  // namespace
}  // namespace cocodiff
