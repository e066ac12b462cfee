// The MPI backend under mpirun: every collective, on the world and on split sub-groups with
// random sizes, against a direct computation of what each rank must receive; phantom buffers;
// int overflow; MPI error conversion; the rank-count and host/topology mismatch errors.
//
// Every rank runs the same tests in the same order. Data checks count mismatches instead of
// returning early, so that all ranks keep calling the same collectives; a fixture's TearDown
// shares the verdict, so a failure on any rank fails the test on every rank.

#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <random>
#include <thread>

#include "core/errors.hpp"
#include "mpi_backend/detail/mpi_util.hpp"
#include "mpi_backend/mpi_comm.hpp"

namespace cocodiff {
namespace {

mpi::MpiRuntime* g_runtime = nullptr;

int world_size() { return g_runtime->world_size(); }
int world_rank() { return g_runtime->world_rank(); }
size_t u(std::int64_t i) { return static_cast<size_t>(i); }

// A value that identifies (sender, receiver, index) so a misrouted element is caught.
float tag_value(int from, int to, std::int64_t i) {
  return static_cast<float>(from * 100000 + to * 1000 + static_cast<int>(i % 1000));
}

// tile x gpu x node with 2 tiles per GPU and 2 nodes from 4 ranks on. The test machine is one
// host, so a multi-node topology needs the host check off.
Topology test_topology(int p) {
  const int nodes = p >= 4 ? 2 : 1;
  const int tiles = 2;
  return Topology({{"tile", tiles, "die-to-die"},
                   {"gpu", p / (tiles * nodes), "intra-node"},
                   {"node", nodes, "inter-node"}});
}

std::unique_ptr<Communicator> make_world() {
  return g_runtime->world(test_topology(world_size()), mpi::WorldOptions{.check_hosts = false});
}

class Mpi : public ::testing::Test {
 protected:
  void TearDown() override {
    int bad = HasFailure() ? 1 : 0;
    int worst = 0;
    MPI_Allreduce(&bad, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (worst && !bad) ADD_FAILURE() << "failed on another rank (see its [rank R] lines)";
  }
};

// Equal-count all-to-all; returns the number of wrong elements.
int check_all_to_all(Communicator& c, std::int64_t count) {
  const int p = c.size();
  std::vector<float> send(u(p * count)), recv(u(p * count), -1);
  for (int j = 0; j < p; ++j)
    for (std::int64_t i = 0; i < count; ++i) send[u(j * count + i)] = tag_value(c.rank(), j, i);
  c.all_to_all(send, recv, count, "check");
  int bad = 0;
  for (int j = 0; j < p; ++j)
    for (std::int64_t i = 0; i < count; ++i)
      bad += recv[u(j * count + i)] != tag_value(j, c.rank(), i);
  return bad;
}

// Variable all-to-all with counts drawn from (seed, i, j), the same on both ends.
int check_all_to_allv(Communicator& c, unsigned seed, bool gaps) {
  const int p = c.size();
  auto cnt = [seed](int i, int j) {
    std::mt19937 g(seed * 1000003u + static_cast<unsigned>(i * 131 + j));
    return static_cast<std::int64_t>(std::uniform_int_distribution<int>(0, 40)(g));
  };
  std::vector<std::int64_t> sc(u(p)), rc(u(p));
  for (int j = 0; j < p; ++j) {
    sc[u(j)] = cnt(c.rank(), j);
    rc[u(j)] = cnt(j, c.rank());
  }
  AllToAllvLayout l = AllToAllvLayout::packed(sc, rc);
  if (gaps)  // non-packed: blocks in reverse order with a hole of 3 before each
    for (int j = p - 1, s = 0, r = 0; j >= 0; --j) {
      l.send_displs[u(j)] = s + 3;
      l.recv_displs[u(j)] = r + 3;
      s += 3 + static_cast<int>(sc[u(j)]);
      r += 3 + static_cast<int>(rc[u(j)]);
    }
  std::vector<float> send(u(l.send_total())), recv(u(l.recv_total()), -1);
  for (int j = 0; j < p; ++j)
    for (std::int64_t i = 0; i < sc[u(j)]; ++i)
      send[u(l.send_displs[u(j)] + i)] = tag_value(c.rank(), j, i);
  c.all_to_allv(send, recv, l, "checkv");
  int bad = 0;
  for (int j = 0; j < p; ++j)
    for (std::int64_t i = 0; i < rc[u(j)]; ++i)
      bad += recv[u(l.recv_displs[u(j)] + i)] != tag_value(j, c.rank(), i);
  return bad;
}

int check_gather_reduce(Communicator& c, std::int64_t n) {
  const int p = c.size();
  int bad = 0;
  std::vector<float> mine(u(n)), all(u(n * p), -1);
  for (std::int64_t i = 0; i < n; ++i) mine[u(i)] = tag_value(c.rank(), 0, i);
  c.all_gather(mine, all, n);
  for (int j = 0; j < p; ++j)
    for (std::int64_t i = 0; i < n; ++i) bad += all[u(j * n + i)] != tag_value(j, 0, i);
  // Small integers in float add exactly in any order, so the expected sum is exact.
  std::vector<float> v(u(n));
  for (std::int64_t i = 0; i < n; ++i) v[u(i)] = static_cast<float>(c.rank() + i);
  c.all_reduce(v, n, ReduceOp::kSum);
  for (std::int64_t i = 0; i < n; ++i)
    bad += v[u(i)] != static_cast<float>(p * (p - 1) / 2 + p * i);
  for (std::int64_t i = 0; i < n; ++i) v[u(i)] = static_cast<float>((c.rank() * 5 + i) % p);
  c.all_reduce(v, n, ReduceOp::kMax);
  for (std::int64_t i = 0; i < n; ++i) {
    // max over r of (5r + i) mod p, computed directly
    int want = 0;
    for (int r = 0; r < p; ++r) want = std::max(want, static_cast<int>((r * 5 + i) % p));
    bad += v[u(i)] != static_cast<float>(want);
  }
  return bad;
}

TEST_F(Mpi, WorldMatchesTopology) {
  auto world = make_world();
  EXPECT_EQ(world->size(), world_size());
  EXPECT_EQ(world->rank(), world_rank());
  for (int r = 0; r < world->size(); ++r) EXPECT_EQ(world->world_rank(r), r);
  EXPECT_EQ(world->coords(world->rank()), test_topology(world_size()).coords(world_rank()));
  // With the host check on, a one-node topology is what this one-host job really is.
  auto checked = g_runtime->world(Topology({{"tile", 2, "die-to-die"},
                                            {"gpu", world_size() / 2, "intra-node"},
                                            {"node", 1, "inter-node"}}));
  EXPECT_EQ(checked->size(), world_size());
  EXPECT_EQ(check_all_to_all(*checked, 3), 0);
}

TEST_F(Mpi, AllToAllWorldAndTapaPhases) {
  auto world = make_world();
  const Topology& t = world->topology();
  const int me = world->rank();
  EXPECT_EQ(check_all_to_all(*world, 7), 0);
  EXPECT_EQ(check_all_to_all(*world, 0), 0);
  // The groups of TAPA's phases: ranks that differ in one coordinate only.
  auto same_gpu = world->split(me / 2, me);  // phase 1: the two tiles of a GPU
  EXPECT_EQ(same_gpu->size(), 2);
  EXPECT_EQ(check_all_to_all(*same_gpu, 5), 0);
  auto phase2 = world->split(t.node(me) * 2 + t.tile(me), me);  // same node, same tile index
  EXPECT_EQ(phase2->size(), t.level(1).size);
  EXPECT_EQ(check_all_to_all(*phase2, 3), 0);
  auto phase3 = world->split(t.ranks_per_node() + me % t.ranks_per_node(), me);  // across nodes
  EXPECT_EQ(phase3->size(), t.num_nodes());
  EXPECT_EQ(check_all_to_all(*phase3, 11), 0);
  for (int r = 0; r < phase3->size(); ++r)
    EXPECT_EQ(phase3->world_rank(r), r * t.ranks_per_node() + me % t.ranks_per_node());
}

TEST_F(Mpi, AllToAllvRandomCounts) {
  auto world = make_world();
  for (unsigned seed = 1; seed <= 4; ++seed) {
    EXPECT_EQ(check_all_to_allv(*world, seed, false), 0) << "seed " << seed;
    EXPECT_EQ(check_all_to_allv(*world, seed, true), 0) << "seed " << seed << " with gaps";
  }
  auto halves = world->split(world->rank() % 2, -world->rank());
  EXPECT_EQ(check_all_to_allv(*halves, 9, true), 0);
}

TEST_F(Mpi, AllGatherAllReduceRandomSizes) {
  auto world = make_world();
  std::mt19937 rng(7);  // same seed on every rank: same sizes everywhere
  for (int trial = 0; trial < 4; ++trial) {
    const std::int64_t n = std::uniform_int_distribution<int>(1, 300)(rng);
    EXPECT_EQ(check_gather_reduce(*world, n), 0) << "n=" << n;
    auto groups = world->split(world->rank() % 3, world->rank());
    EXPECT_EQ(check_gather_reduce(*groups, n), 0) << "n=" << n << " on a third";
    groups->barrier();
  }
}

TEST_F(Mpi, AllGatherInPlace) {
  auto world = make_world();
  const int p = world->size(), me = world->rank();
  const std::int64_t n = 4;
  std::vector<float> all(u(p * n), -1);
  for (std::int64_t i = 0; i < n; ++i) all[u(me * n + i)] = tag_value(me, 0, i);
  world->all_gather(std::span<const float>(all).subspan(u(me * n), u(n)), all, n);
  int bad = 0;
  for (int j = 0; j < p; ++j)
    for (std::int64_t i = 0; i < n; ++i) bad += all[u(j * n + i)] != tag_value(j, 0, i);
  EXPECT_EQ(bad, 0);
}

TEST_F(Mpi, SendRecvRingBothWays) {
  auto world = make_world();
  const int p = world->size(), me = world->rank();
  const int right = (me + 1) % p, left = (me - 1 + p) % p;
  std::vector<float> out(1000), in_l(1000, -1), in_r(1000, -1);
  for (int i = 0; i < 1000; ++i) out[u(i)] = tag_value(me, 0, i);
  Request a = world->irecv(in_l, 1000, left, 5);
  Request b = world->irecv(in_r, 1000, right, 6);
  Request c = world->isend(out, 1000, right, 5);
  Request d = world->isend(out, 1000, left, 6);
  std::vector<Request> all{d, c, b, a};
  wait_all(all);
  int bad = 0;
  for (int i = 0; i < 1000; ++i) {
    bad += in_l[u(i)] != tag_value(left, 0, i);
    bad += in_r[u(i)] != tag_value(right, 0, i);
  }
  EXPECT_EQ(bad, 0);
  // Blocking forms, and a message shorter than the receive expects is an error naming both.
  if (me % 2 == 0 && me + 1 < p) world->send(out, 7, me + 1, 9);
  if (me % 2 == 1) {
    std::vector<float> got(10);
    try {
      world->recv(got, 10, me - 1, 9);
      ADD_FAILURE() << "a 7-element message into a 10-element receive did not throw";
    } catch (const CommError& e) {
      EXPECT_NE(std::string(e.what()).find("received 7 elements"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("expected 10"), std::string::npos) << e.what();
      const std::string site = "recv from rank " + std::to_string(me - 1) + " on rank " +
                               std::to_string(me) + " of " + std::to_string(p);
      EXPECT_NE(std::string(e.what()).find(site), std::string::npos) << e.what();
      for (int i = 0; i < 7; ++i) bad += got[u(i)] != tag_value(me - 1, 0, i);
    }
  }
  EXPECT_EQ(bad, 0);
}

TEST_F(Mpi, NonBlockingOverlapWithTest) {
  auto world = make_world();
  const int p = world->size(), me = world->rank();
  const std::int64_t n = (1 << 20) / p;  // 4 MiB per rank in flight
  std::vector<float> send(u(p * n)), recv(u(p * n), -1);
  for (int j = 0; j < p; ++j)
    for (std::int64_t i = 0; i < n; i += 997) send[u(j * n + i)] = tag_value(me, j, i);
  // A second, small collective posted after the large one and waited for first.
  std::vector<float> g_in(3, static_cast<float>(me)), g_out(u(3 * p), -1);
  Request big = world->iall_to_all(send, recv, n, "v");
  Request small = world->iall_gather(g_in, g_out, 3, "small");
  // "Compute" while the transfer is in flight, polling test() between chunks as a V-First
  // schedule would; the loop is bounded by the 60 s CTest timeout.
  double acc = 0;
  long polls = 0;
  while (!big.test()) {
    for (int k = 0; k < 1000; ++k) acc += std::sqrt(static_cast<double>(k + polls));
    ++polls;
  }
  EXPECT_TRUE(big.test());  // stays complete
  big.wait();               // and wait() after completion returns at once
  small.wait();
  // polls may be 0: the last rank to post can find the exchange already done.
  EXPECT_TRUE(std::isfinite(acc));
  int bad = 0;
  for (int j = 0; j < p; ++j)
    for (std::int64_t i = 0; i < n; i += 997) bad += recv[u(j * n + i)] != tag_value(j, me, i);
  for (int j = 0; j < p; ++j)
    for (int i = 0; i < 3; ++i) bad += g_out[u(3 * j + i)] != static_cast<float>(j);
  EXPECT_EQ(bad, 0);
  // Two outstanding all-to-alls and an all-reduce, completed in reverse order.
  std::vector<float> a(u(p * 2), 1.f), b(u(p * 2)), c2(u(p * 3), 2.f), d(u(p * 3));
  std::vector<float> s(5, 1.f);
  Request r1 = world->iall_to_all(a, b, 2);
  Request r2 = world->iall_to_all(c2, d, 3);
  Request r3 = world->iall_reduce(s, 5, ReduceOp::kSum);
  r3.wait();
  r2.wait();
  r1.wait();
  EXPECT_TRUE(std::all_of(b.begin(), b.end(), [](float x) { return x == 1.f; }));
  EXPECT_TRUE(std::all_of(d.begin(), d.end(), [](float x) { return x == 2.f; }));
  EXPECT_TRUE(std::all_of(s.begin(), s.end(), [p](float x) { return x == static_cast<float>(p); }));
}

TEST_F(Mpi, SplitRandomGroups) {
  auto world = make_world();
  const int p = world->size(), me = world->rank();
  std::mt19937 rng(42);
  for (int trial = 0; trial < 5; ++trial) {
    // Random colors (negative ones too) and keys, identical on every rank.
    const int ncolors = std::uniform_int_distribution<int>(1, p)(rng);
    std::vector<int> color(u(p)), key(u(p));
    for (int r = 0; r < p; ++r) {
      color[u(r)] = std::uniform_int_distribution<int>(0, ncolors - 1)(rng) * 7 - 10;
      key[u(r)] = std::uniform_int_distribution<int>(-3, 3)(rng);
    }
    auto g = world->split(color[u(me)], key[u(me)]);
    std::vector<std::pair<int, int>> expect;  // (key, world rank) of my color, in MPI's order
    for (int r = 0; r < p; ++r)
      if (color[u(r)] == color[u(me)]) expect.emplace_back(key[u(r)], r);
    std::sort(expect.begin(), expect.end());
    ASSERT_EQ(g->size(), static_cast<int>(expect.size()));
    for (int i = 0; i < g->size(); ++i) {
      EXPECT_EQ(g->world_rank(i), expect[u(i)].second);
      EXPECT_EQ(g->coords(i), world->topology().coords(expect[u(i)].second));
      if (expect[u(i)].second == me) {
        EXPECT_EQ(g->rank(), i);
      }
    }
    EXPECT_EQ(check_all_to_all(*g, trial + 1), 0);
    EXPECT_EQ(check_all_to_allv(*g, 100u + static_cast<unsigned>(trial), trial % 2 == 1), 0);
    EXPECT_EQ(check_gather_reduce(*g, 2 * trial + 1), 0);
    // A split of a split: world ranks still map through.
    auto gg = g->split(g->rank() % 2, 0);
    for (int i = 0; i < gg->size(); ++i)
      EXPECT_EQ(gg->world_rank(i), g->world_rank(2 * i + g->rank() % 2));
  }
}

TEST_F(Mpi, PhantomBuffersMoveBytes) {
  auto world = make_world();
  const int p = world->size();
  // All-phantom collectives complete and take time to move what they would move.
  world->all_to_all({}, {}, 1000, "phantom");
  AllToAllvLayout l = AllToAllvLayout::packed(std::vector<std::int64_t>(u(p), 10),
                                              std::vector<std::int64_t>(u(p), 10));
  world->all_to_allv({}, {}, l);
  world->all_gather({}, {}, 100);
  world->all_reduce({}, 100, ReduceOp::kSum);
  // A real receiver of a phantom sender gets zeros (documented in mpi_comm.hpp).
  std::vector<float> recv(u(p * 4), -1);
  world->all_gather({}, recv, 4);
  EXPECT_TRUE(std::all_of(recv.begin(), recv.end(), [](float x) { return x == 0.f; }));
  std::vector<float> real(u(p * 4), 1.f);
  world->all_to_all(real, {}, 4);  // real sender, phantom receiver
  const int right = (world->rank() + 1) % p, left = (world->rank() - 1 + p) % p;
  Request r = world->irecv({}, 50, left, 1);
  world->send({}, 50, right, 1);
  r.wait();
}

// The run report's measured traffic: fp32 payload per destination, counted under the tier
// that joins the two ranks; time blocked in waits and barriers accumulates.
TEST_F(Mpi, AccountingCountsBytesPerTierAndWaits) {
  auto world = make_world();
  const auto& mpi_world = dynamic_cast<const mpi::MpiComm&>(*world);
  const Topology& topo = world->topology();
  const mpi::Accounting a0 = mpi_world.accounting();
  const std::int64_t count = 100;
  const int p = world->size();
  std::vector<float> send(u(count * p), 1.0f), recv(u(count * p));
  world->all_to_all(send, recv, count);
  // A point-to-point ring: each rank sends 7 elements to the next.
  const int right = (world->rank() + 1) % p, left = (world->rank() + p - 1) % p;
  std::vector<float> out(7, 2.0f), in(7);
  Request r = world->irecv(in, 7, left, 4);
  world->send(out, 7, right, 4);
  r.wait();
  world->barrier();
  const mpi::Accounting a1 = mpi_world.accounting();
  ASSERT_EQ(a1.sent_bytes_by_tier.size(), static_cast<size_t>(topo.num_tiers()));
  std::vector<std::int64_t> want(u(topo.num_tiers()), 0);
  for (int j = 0; j < p; ++j)
    if (j != world->rank()) want[u(topo.tier(world->rank(), j))] += count * 4;
  if (right != world->rank()) want[u(topo.tier(world->rank(), right))] += 7 * 4;
  for (int k = 0; k < topo.num_tiers(); ++k)
    EXPECT_EQ(a1.sent_bytes_by_tier[u(k)] - a0.sent_bytes_by_tier[u(k)], want[u(k)])
        << topo.tier_name(k);
  EXPECT_GE(a1.comm_wait_s, a0.comm_wait_s);
  // Rank 0 arrives late at a barrier: every other rank waits at least that long in it.
  if (world->rank() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const double w0 = mpi_world.accounting().comm_wait_s;
  world->barrier();
  if (world->rank() != 0) {
    EXPECT_GE(mpi_world.accounting().comm_wait_s - w0, 0.04);
  }
}

TEST_F(Mpi, CountsBeyondIntAreClearErrors) {
  auto world = make_world();
  const std::int64_t big = std::int64_t{1} << 31;
  try {
    world->iall_to_all({}, {}, big, "huge");
    ADD_FAILURE() << "no error for a count of 2^31";
  } catch (const CommError& e) {
    const std::string w = e.what();
    EXPECT_NE(w.find("all_to_all 'huge' on rank"), std::string::npos) << w;
    EXPECT_NE(w.find("2147483648"), std::string::npos) << w;
    EXPECT_NE(w.find("int range"), std::string::npos) << w;
  }
  AllToAllvLayout l = AllToAllvLayout::packed(std::vector<std::int64_t>(u(world->size()), 1),
                                              std::vector<std::int64_t>(u(world->size()), 1));
  l.recv_displs.back() = big;
  EXPECT_THROW(world->iall_to_allv({}, {}, l), CommError);
  EXPECT_THROW(world->isend({}, 1, 0, -1), CommError);  // negative tag
  world->barrier();
}

TEST_F(Mpi, MpiErrorsBecomeCommErrors) {
  auto world = make_world();
  auto sub = world->split(world->rank() % 2, 0);
  for (Communicator* c : {world.get(), sub.get()}) {
    auto* m = dynamic_cast<mpi::MpiComm*>(c);
    ASSERT_NE(m, nullptr);
    MPI_Errhandler h = MPI_ERRHANDLER_NULL;
    MPI_Comm_get_errhandler(m->handle(), &h);
    EXPECT_TRUE(h == MPI_ERRORS_RETURN) << "errors would abort instead of throwing";
    MPI_Errhandler_free(&h);
    // An invalid rank reaches MPI (bypassing our own checks) and comes back as a CommError.
    float x = 0;
    const int rc = MPI_Send(&x, 1, MPI_FLOAT, c->size() + 3, 0, m->handle());
    EXPECT_NE(rc, MPI_SUCCESS);
    try {
      mpi::detail::check_mpi(rc, "send on rank 0");
      ADD_FAILURE() << "check_mpi did not throw";
    } catch (const CommError& e) {
      EXPECT_NE(std::string(e.what()).find("send on rank 0: MPI error: "), std::string::npos)
          << e.what();
    }
  }
}

// With the progress watchdog on, a receive whose peer stopped (here: sleeps outside MPI) ends
// in a CommError within the timeout plus the 0.5-1 s grace, naming the peer and the silent rank.
TEST_F(Mpi, WatchdogNamesTheStoppedPeer) {
  auto world = make_world();  // no watchdog: the final barrier waits as long as it takes
  auto watched =
      g_runtime->world(test_topology(world_size()),
                       mpi::WorldOptions{.check_hosts = false, .progress_timeout_s = 0.5});
  std::vector<float> buf(1, 0.0f);
  if (world->rank() == 0) {
    const auto t0 = std::chrono::steady_clock::now();
    try {
      watched->recv(buf, 1, 1, 11);
      ADD_FAILURE() << "a receive from a stopped rank completed";
    } catch (const CommError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("no progress for 0."), std::string::npos) << what;
      EXPECT_NE(what.find("waiting in recv from rank 1 on rank 0"), std::string::npos) << what;
      EXPECT_NE(what.find("(peer: world rank 1)"), std::string::npos) << what;
      EXPECT_NE(what.find("stopped rank(s): 1"), std::string::npos) << what;
      EXPECT_NE(what.find("mpi.progress_timeout_s = 0.5"), std::string::npos) << what;
    }
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(2400));
  }
  if (world->rank() == 1) {
    std::this_thread::sleep_for(std::chrono::seconds(3));  // stopped, as far as rank 0 knows
    watched->send(buf, 1, 0, 11);                          // completes the receive rank 0 abandoned
  }
  world->barrier();
}

TEST_F(Mpi, NowIsWallTime) {
  auto world = make_world();
  const SimTime t0 = world->now();
  world->compute({OpKind::kGemm, 1e15, 1e12, "free"});  // no-op: no time is charged
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const SimTime t1 = world->now();
  EXPECT_GE((t1 - t0).ns(), 20'000'000);
  EXPECT_LT((t1 - t0).ns(), 5'000'000'000);
  EXPECT_GE(t0.ns(), 0);
}

TEST_F(Mpi, RankCountMismatchIsAClearError) {
  const int p = world_size();
  try {
    g_runtime->world(
        Topology({{"tile", 2, "die-to-die"}, {"gpu", p, "intra-node"}, {"node", 1, "inter-node"}}));
    ADD_FAILURE() << "no error for a topology of " << 2 * p << " ranks on " << p;
  } catch (const CommError& e) {
    const std::string w = e.what();
    EXPECT_NE(w.find("the MPI job has " + std::to_string(p) + " ranks"), std::string::npos) << w;
    EXPECT_NE(w.find("has " + std::to_string(2 * p) + "; start it with mpirun -np " +
                     std::to_string(2 * p)),
              std::string::npos)
        << w;
  }
}

TEST_F(Mpi, HostTopologyMismatchIsAClearError) {
  const int p = world_size();
  MPI_Comm host;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &host);
  int on_host = 0;
  MPI_Comm_size(host, &on_host);
  MPI_Comm_free(&host);
  if (on_host != p) GTEST_SKIP() << "needs all ranks on one host";
  // Two topology nodes, one real host: the ranks of node 0 and node 1 share it.
  try {
    g_runtime->world(Topology({{"gpu", p / 2, "intra-node"}, {"node", 2, "inter-node"}}));
    ADD_FAILURE() << "no error for a 2-node topology on one host";
  } catch (const CommError& e) {
    const std::string w = e.what();
    EXPECT_NE(w.find("host placement does not match the topology"), std::string::npos) << w;
    EXPECT_NE(
        w.find("rank 0 (node 0, gpu 0) and rank " + std::to_string(p / 2) + " (node 1, gpu 0)"),
        std::string::npos)
        << w;
    EXPECT_NE(w.find("run on the same host"), std::string::npos) << w;
    EXPECT_NE(w.find("--map-by ppr:" + std::to_string(p / 2) + ":node"), std::string::npos) << w;
  }
  // The job is still usable: the failed world() left no collective half-done.
  auto world = make_world();
  EXPECT_EQ(check_all_to_all(*world, 2), 0);
}

// The placement rule on made-up hosts (a pure function, identical on every rank).
TEST_F(Mpi, PlacementRule) {
  const Topology t(
      {{"tile", 2, "die-to-die"}, {"gpu", 6, "intra-node"}, {"node", 2, "inter-node"}});
  std::vector<std::string> names;
  for (int r = 0; r < 24; ++r)
    names.push_back(std::to_string(r).insert(0, 1, 'x'));  // GCC 12 PR105651
  std::vector<int> good(24), fine(24), coarse(24, 0);
  for (int r = 0; r < 24; ++r) {
    good[u(r)] = r < 12 ? 100 : 7;  // any ids, one per node
    fine[u(r)] = r / 6;             // 6 ranks per host: a node spans two hosts
  }
  EXPECT_EQ(mpi::detail::placement_error(t, good, names), "");
  const std::string f = mpi::detail::placement_error(t, fine, names);
  EXPECT_NE(f.find("rank 0 (node 0, gpu 0, tile 0) and rank 6 (node 0, gpu 3, tile 0) are on one "
                   "node of the topology but run on different hosts 'x0' and 'x6'"),
            std::string::npos)
      << f;
  const std::string c = mpi::detail::placement_error(t, coarse, names);
  EXPECT_NE(c.find("rank 0 (node 0, gpu 0, tile 0) and rank 12 (node 1, gpu 0, tile 0) are on "
                   "different nodes of the topology but run on the same host 'x12'"),
            std::string::npos)
      << c;
}

// Prints failures of ranks other than 0 with their rank, in place of gtest's full output.
class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (r.failed())
      std::fprintf(stderr, "[rank %d] %s:%d: failure\n%s\n", rank_,
                   r.file_name() ? r.file_name() : "?", r.line_number(), r.summary());
  }

 private:
  int rank_;
};

}  // namespace
}  // namespace cocodiff

int main(int argc, char** argv) {
  cocodiff::mpi::MpiRuntime runtime(argc, argv);
  cocodiff::g_runtime = &runtime;
  ::testing::InitGoogleTest(&argc, argv);
  if (runtime.world_rank() != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new cocodiff::RankFailurePrinter(runtime.world_rank()));
  }
  const int rc = RUN_ALL_TESTS();
  int worst = 0;
  MPI_Allreduce(&rc, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (runtime.world_rank() == 0)
    std::printf("%d ranks: %s\n", runtime.world_size(),
                worst == 0 ? "all tests passed on every rank" : "FAILED on at least one rank");
  return worst;
}
