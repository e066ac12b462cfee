// Every collective, on the world group and on split sub-groups, with random sizes, against a
// direct computation of what each rank must receive.

#include <gtest/gtest.h>

#include <algorithm>
#include <mutex>
#include <random>

#include "tests/emulator/test_util.hpp"

namespace cocodiff {
namespace {

// A value that identifies (sender, receiver, index) so a misrouted element is caught.
float tag_value(int from, int to, std::int64_t i) {
  return static_cast<float>(from * 1000000 + to * 1000 + static_cast<int>(i % 1000));
}

// Runs body on every rank of a 2x3x2 cluster (12 ranks) with 2 workers.
void on_cluster(const std::function<void(Communicator&)>& body, int workers = 2) {
  Topology topo = test::make_topo(2, 3, 2);
  emu::Engine engine = test::make_engine(topo, test::uniform_tiers(3, 100, 1e10), workers);
  engine.run(body);
}

void check_all_to_all(Communicator& c, std::int64_t count) {
  const int p = c.size();
  std::vector<float> send(static_cast<size_t>(p * count)), recv(static_cast<size_t>(p * count), -1);
  for (int j = 0; j < p; ++j)
    for (std::int64_t i = 0; i < count; ++i)
      send[static_cast<size_t>(j * count + i)] = tag_value(c.rank(), j, i);
  c.all_to_all(send, recv, count);
  for (int j = 0; j < p; ++j)
    for (std::int64_t i = 0; i < count; ++i)
      ASSERT_EQ(recv[static_cast<size_t>(j * count + i)], tag_value(j, c.rank(), i))
          << "from " << j;
}

TEST(Collectives, AllToAllWorldAndSubgroups) {
  on_cluster([](Communicator& world) {
    check_all_to_all(world, 7);
    // Sub-groups: ranks of one node, and ranks with the same tile index (a TAPA-style phase).
    auto node = world.split(world.topology().node(world.world_rank(world.rank())), world.rank());
    EXPECT_EQ(node->size(), 6);
    check_all_to_all(*node, 5);
    auto same_tile =
        world.split(world.topology().tile(world.world_rank(world.rank())), world.rank());
    EXPECT_EQ(same_tile->size(), 6);
    check_all_to_all(*same_tile, 3);
    auto sub = same_tile->split(same_tile->rank() % 2, -same_tile->rank());  // reversed order
    EXPECT_EQ(sub->size(), 3);
    check_all_to_all(*sub, 11);
  });
}

TEST(Collectives, AllToAllvRandomCounts) {
  on_cluster([](Communicator& c) {
    const int p = c.size();
    // count(i -> j) is a deterministic pseudo-random function of (i, j), so both ends agree.
    auto cnt = [](int i, int j) { return static_cast<std::int64_t>((i * 7919 + j * 104729) % 13); };
    std::vector<std::int64_t> sc(static_cast<size_t>(p)), rc(static_cast<size_t>(p));
    for (int j = 0; j < p; ++j) {
      sc[static_cast<size_t>(j)] = cnt(c.rank(), j);
      rc[static_cast<size_t>(j)] = cnt(j, c.rank());
    }
    AllToAllvLayout l = AllToAllvLayout::packed(sc, rc);
    std::vector<float> send(static_cast<size_t>(l.send_total())),
        recv(static_cast<size_t>(l.recv_total()));
    for (int j = 0; j < p; ++j)
      for (std::int64_t i = 0; i < sc[static_cast<size_t>(j)]; ++i)
        send[static_cast<size_t>(l.send_displs[static_cast<size_t>(j)] + i)] =
            tag_value(c.rank(), j, i);
    c.all_to_allv(send, recv, l);
    for (int j = 0; j < p; ++j)
      for (std::int64_t i = 0; i < rc[static_cast<size_t>(j)]; ++i)
        ASSERT_EQ(recv[static_cast<size_t>(l.recv_displs[static_cast<size_t>(j)] + i)],
                  tag_value(j, c.rank(), i));
  });
}

TEST(Collectives, AllGatherAllReduceRandomSizes) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 3; ++trial) {
    const std::int64_t n = std::uniform_int_distribution<int>(1, 50)(rng);
    on_cluster([n](Communicator& world) {
      auto groups = world.split(world.rank() % 3, world.rank());
      for (Communicator* c : {&world, groups.get()}) {
        const int p = c->size();
        std::vector<float> mine(static_cast<size_t>(n)), all(static_cast<size_t>(n * p));
        for (std::int64_t i = 0; i < n; ++i)
          mine[static_cast<size_t>(i)] = tag_value(c->rank(), 0, i);
        c->all_gather(mine, all, n);
        for (int j = 0; j < p; ++j)
          for (std::int64_t i = 0; i < n; ++i)
            ASSERT_EQ(all[static_cast<size_t>(j * n + i)], tag_value(j, 0, i));
        // Integers in float are summed exactly, so the expected sum is exact.
        std::vector<float> v(static_cast<size_t>(n));
        for (std::int64_t i = 0; i < n; ++i)
          v[static_cast<size_t>(i)] = static_cast<float>(c->rank() + i);
        c->all_reduce(v, n, ReduceOp::kSum);
        for (std::int64_t i = 0; i < n; ++i)
          ASSERT_EQ(v[static_cast<size_t>(i)], static_cast<float>(p * (p - 1) / 2 + p * i));
        for (std::int64_t i = 0; i < n; ++i)
          v[static_cast<size_t>(i)] = static_cast<float>((c->rank() * 5 + i) % p);
        c->all_reduce(v, n, ReduceOp::kMax);
        for (std::int64_t i = 0; i < n; ++i)
          ASSERT_EQ(v[static_cast<size_t>(i)], static_cast<float>(p - 1));
        c->barrier();
      }
    });
  }
}

// Random sub-groups (colour and key a seeded function of the rank, ties in key broken by the
// parent rank, as MPI_Comm_split does), random sizes, and every collective, blocking and
// non-blocking, against what each member must hold.
TEST(Collectives, EveryCollectiveOnRandomSubgroupsWithRandomSizes) {
  for (int trial = 0; trial < 3; ++trial) {
    std::mt19937 rng(100 + trial);
    std::vector<int> color(12), key(12);
    for (int r = 0; r < 12; ++r) {
      color[static_cast<size_t>(r)] = std::uniform_int_distribution<int>(0, 2)(rng);
      key[static_cast<size_t>(r)] = std::uniform_int_distribution<int>(0, 4)(rng);
    }
    const std::int64_t n = std::uniform_int_distribution<int>(1, 40)(rng);
    const int salt = std::uniform_int_distribution<int>(1, 97)(rng);
    SCOPED_TRACE("trial " + std::to_string(trial) + ", n " + std::to_string(n));
    on_cluster([&](Communicator& world) {
      const int me = world.rank();
      auto g = world.split(color[static_cast<size_t>(me)], key[static_cast<size_t>(me)]);
      // Membership and order: same colour, sorted by (key, world rank).
      std::vector<int> want;
      for (int r = 0; r < 12; ++r)
        if (color[static_cast<size_t>(r)] == color[static_cast<size_t>(me)]) want.push_back(r);
      std::stable_sort(want.begin(), want.end(), [&](int a, int b) {
        return key[static_cast<size_t>(a)] < key[static_cast<size_t>(b)];
      });
      ASSERT_EQ(g->size(), static_cast<int>(want.size()));
      for (int i = 0; i < g->size(); ++i) ASSERT_EQ(g->world_rank(i), want[static_cast<size_t>(i)]);
      ASSERT_EQ(g->world_rank(g->rank()), me);
      const int p = g->size(), r = g->rank();
      // Element i of member a's block for member b: identifies (a, b, i) in world ranks.
      auto v = [&](int a, int b, std::int64_t i) {
        return tag_value(g->world_rank(a), g->world_rank(b), i);
      };
      // all_to_all with a random count.
      check_all_to_all(*g, n);
      // iall_to_allv: count(a -> b) a seeded function of both.
      auto cnt = [&](int a, int b) {
        return static_cast<std::int64_t>((a * 31 + b * 17 + salt) % 9);
      };
      std::vector<std::int64_t> sc(static_cast<size_t>(p)), rc(static_cast<size_t>(p));
      for (int j = 0; j < p; ++j) {
        sc[static_cast<size_t>(j)] = cnt(r, j);
        rc[static_cast<size_t>(j)] = cnt(j, r);
      }
      const AllToAllvLayout l = AllToAllvLayout::packed(sc, rc);
      std::vector<float> vs(static_cast<size_t>(l.send_total())),
          vr(static_cast<size_t>(l.recv_total()), -1);
      for (int j = 0; j < p; ++j)
        for (std::int64_t i = 0; i < sc[static_cast<size_t>(j)]; ++i)
          vs[static_cast<size_t>(l.send_displs[static_cast<size_t>(j)] + i)] = v(r, j, i);
      Request rv = g->iall_to_allv(vs, vr, l);
      // iall_gather and iall_reduce in flight at the same time.
      std::vector<float> mine(static_cast<size_t>(n)), all(static_cast<size_t>(n * p), -1);
      for (std::int64_t i = 0; i < n; ++i) mine[static_cast<size_t>(i)] = v(r, r, i);
      Request ra = g->iall_gather(mine, all, n);
      std::vector<float> sum(static_cast<size_t>(n));
      for (std::int64_t i = 0; i < n; ++i)
        sum[static_cast<size_t>(i)] = static_cast<float>(g->world_rank(r) + i);
      Request rs = g->iall_reduce(sum, n, ReduceOp::kSum);
      rs.wait();
      ra.wait();
      rv.wait();
      for (int j = 0; j < p; ++j)
        for (std::int64_t i = 0; i < rc[static_cast<size_t>(j)]; ++i)
          ASSERT_EQ(vr[static_cast<size_t>(l.recv_displs[static_cast<size_t>(j)] + i)], v(j, r, i));
      for (int j = 0; j < p; ++j)
        for (std::int64_t i = 0; i < n; ++i)
          ASSERT_EQ(all[static_cast<size_t>(j * n + i)], v(j, j, i));
      float ranks = 0;
      for (int w : want) ranks += static_cast<float>(w);
      for (std::int64_t i = 0; i < n; ++i)
        ASSERT_EQ(sum[static_cast<size_t>(i)], ranks + static_cast<float>(p * i));
      // send/recv around the group's ring.
      if (p > 1) {
        const int right = (r + 1) % p, left = (r - 1 + p) % p;
        std::vector<float> out(static_cast<size_t>(n)), in(static_cast<size_t>(n), -1);
        for (std::int64_t i = 0; i < n; ++i) out[static_cast<size_t>(i)] = v(r, right, i);
        Request rin = g->irecv(in, n, left, 1);
        g->send(out, n, right, 1);
        rin.wait();
        for (std::int64_t i = 0; i < n; ++i) ASSERT_EQ(in[static_cast<size_t>(i)], v(left, r, i));
      }
      g->barrier();
    });
  }
}

TEST(Collectives, SendRecvAndNonBlocking) {
  on_cluster([](Communicator& c) {
    const int p = c.size();
    const int right = (c.rank() + 1) % p, left = (c.rank() - 1 + p) % p;
    std::vector<float> out(17, static_cast<float>(c.rank())), in(17, -1);
    Request r = c.irecv(in, 17, left, 5);
    Request s = c.isend(out, 17, right, 5);
    s.wait();
    r.wait();
    for (float x : in) ASSERT_EQ(x, static_cast<float>(left));
    // Two outstanding all-to-alls on the same group complete independently.
    std::vector<float> a(static_cast<size_t>(p * 2), 1.f), b(static_cast<size_t>(p * 2));
    std::vector<float> c2(static_cast<size_t>(p * 3), 2.f), d(static_cast<size_t>(p * 3));
    Request r1 = c.iall_to_all(a, b, 2);
    Request r2 = c.iall_to_all(c2, d, 3);
    r2.wait();
    r1.wait();
    for (float x : b) ASSERT_EQ(x, 1.f);
    for (float x : d) ASSERT_EQ(x, 2.f);
  });
}

TEST(Collectives, PhantomBuffersMoveOnlySizes) {
  Topology topo = test::make_topo(2, 2, 1);
  emu::Engine engine = test::make_engine(topo, test::uniform_tiers(3, 0, 1e9), 2, 4);
  emu::RunResult r = engine.run([](Communicator& c) { c.all_to_all({}, {}, 250); });
  // 4 ranks, 3 remote blocks each of 250 floats x 4 bytes.
  std::int64_t total = 0;
  for (std::int64_t b : r.bytes_by_tier) total += b;
  EXPECT_EQ(total, 4 * 3 * 1000);
  EXPECT_EQ(r.makespan.ns(), 3 * 1000);  // 3 rounds of 1000 bytes at 1 byte/ns
}

}  // namespace
}  // namespace cocodiff
