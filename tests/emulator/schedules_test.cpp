// Every schedule of emulator/collectives/ run symbolically, with no engine, for every group size
// of 1 to 33 and up to 96: each send is received by the member it names, in the same round, with
// the same step and size; no member reads and writes one place in a round; and every member ends
// holding what the collective must give it (all-to-all blocks, all-gather blocks, sums). Bruck's
// and the hierarchical all-gather's rounds and message sizes against their closed forms. The ring
// pass hands every block round the ring once, each member computing on every block once.

#include <gtest/gtest.h>

#include <bit>
#include <map>
#include <numeric>

#include "emulator/collectives/schedule.hpp"

namespace cocodiff::emu::collectives {
namespace {

// Element i of member a's block for member b.
float tag_value(int a, int b, std::int64_t i) {
  return static_cast<float>(a * 100000 + b * 100 + static_cast<int>(i % 100));
}

struct Member {
  std::vector<float> send, recv, scratch;
  std::vector<float>& buffer(Buffer b) {
    return b == Buffer::kSend ? send : b == Buffer::kRecv ? recv : scratch;
  }
};

std::vector<Segment> segments_of(const Schedule& s, const Sizes& sizes, int me, int round, int k,
                                 bool sending) {
  const Message m = sending ? s.send(sizes, me, round, k) : s.recv(sizes, me, round, k);
  std::vector<Segment> out;
  if (m.gathered)
    s.segments(sizes, me, round, k, sending, out);
  else
    out.push_back(m.at);
  std::int64_t total = 0;
  for (const Segment& g : out) total += g.count;
  EXPECT_EQ(total, m.count) << "segments of member " << me << " round " << round;
  return out;
}

bool overlap(const Segment& a, const Segment& b) {
  return a.buffer == b.buffer && a.count > 0 && b.count > 0 && a.offset < b.offset + b.count &&
         b.offset < a.offset + a.count;
}

// Runs `s` on members whose buffers are set, round by round: every send of a round is read
// before any receive of it is written (the runners copy when a message is matched, which the
// no-overlap check makes equivalent).
void run(const Schedule& s, const std::vector<Sizes>& sizes, std::vector<Member>& m,
         bool reduce_sum = true) {
  const int p = s.size();
  for (int r = 0; r < p; ++r) {
    m[static_cast<size_t>(r)].scratch.assign(static_cast<size_t>(s.scratch(sizes[r])), -7);
    if (const auto c = s.own(sizes[static_cast<size_t>(r)], r)) {
      Member& me = m[static_cast<size_t>(r)];
      ASSERT_EQ(c->from.count, c->to.count);
      for (std::int64_t e = 0; e < c->from.count; ++e)
        me.buffer(c->to.buffer)[static_cast<size_t>(c->to.offset + e)] =
            me.buffer(c->from.buffer)[static_cast<size_t>(c->from.offset + e)];
    }
  }
  for (int i = 0; i < s.rounds(); ++i) {
    // (src, dst, k) -> the message's step and elements.
    std::map<std::tuple<int, int, int>, std::pair<int, std::vector<float>>> wire;
    for (int r = 0; r < p; ++r) {
      const Sizes& z = sizes[static_cast<size_t>(r)];
      std::vector<Segment> reads, writes;
      for (int k = 0; k < s.sends(r, i); ++k) {
        const Message out = s.send(z, r, i, k);
        ASSERT_NE(out.peer, r);
        std::vector<float> data;
        for (const Segment& g : segments_of(s, z, r, i, k, true)) {
          reads.push_back(g);
          const std::vector<float>& b = m[static_cast<size_t>(r)].buffer(g.buffer);
          ASSERT_LE(g.offset + g.count, static_cast<std::int64_t>(b.size()));
          data.insert(data.end(), b.begin() + g.offset, b.begin() + g.offset + g.count);
        }
        ASSERT_TRUE(
            wire.emplace(std::make_tuple(r, out.peer, k), std::make_pair(out.step, data)).second);
      }
      for (int k = 0; k < s.recvs(r, i); ++k)
        for (const Segment& g : segments_of(s, z, r, i, k, false)) writes.push_back(g);
      for (const Segment& w : writes)
        for (const Segment& g : reads)
          ASSERT_FALSE(overlap(w, g))
              << "member " << r << " reads and writes one place, round " << i;
    }
    for (int r = 0; r < p; ++r) {
      const Sizes& z = sizes[static_cast<size_t>(r)];
      for (int k = 0; k < s.recvs(r, i); ++k) {
        const Message in = s.recv(z, r, i, k);
        const auto it = wire.find({in.peer, r, k});
        ASSERT_NE(it, wire.end()) << "member " << r << " round " << i << " receive " << k
                                  << " from " << in.peer << ": nobody sends it";
        ASSERT_EQ(it->second.first, in.step);
        const std::vector<float>& data = it->second.second;
        ASSERT_EQ(static_cast<std::int64_t>(data.size()), in.count);
        std::size_t at = 0;
        for (const Segment& g : segments_of(s, z, r, i, k, false)) {
          std::vector<float>& b = m[static_cast<size_t>(r)].buffer(g.buffer);
          ASSERT_LE(g.offset + g.count, static_cast<std::int64_t>(b.size()));
          for (std::int64_t e = 0; e < g.count; ++e, ++at) {
            float& y = b[static_cast<size_t>(g.offset + e)];
            y = !s.reduces(i) ? data[at] : reduce_sum ? y + data[at] : std::max(y, data[at]);
          }
        }
        wire.erase(it);
      }
    }
    ASSERT_TRUE(wire.empty()) << wire.size() << " messages of round " << i << " never received";
  }
}

// count(a -> b) of an uneven all-to-allv, some zero.
std::int64_t uneven(int a, int b) { return (a * 7 + b * 3) % 5 == 0 ? 0 : 1 + (a * 5 + b) % 4; }

void check_all_to_all(const Schedule& s, bool uneven_counts) {
  const int p = s.size();
  std::vector<std::vector<std::int64_t>> sc(static_cast<size_t>(p)), sd(sc), rc(sc), rd(sc);
  std::vector<Sizes> sizes(static_cast<size_t>(p));
  std::vector<Member> m(static_cast<size_t>(p));
  const std::int64_t n = 3;
  for (int r = 0; r < p; ++r) {
    const auto ur = static_cast<size_t>(r);
    for (int j = 0; j < p; ++j) {
      sc[ur].push_back(uneven_counts ? uneven(r, j) : n);
      rc[ur].push_back(uneven_counts ? uneven(j, r) : n);
    }
    sd[ur].assign(static_cast<size_t>(p), 0);
    rd[ur].assign(static_cast<size_t>(p), 0);
    std::partial_sum(sc[ur].begin(), sc[ur].end() - 1, sd[ur].begin() + 1);
    std::partial_sum(rc[ur].begin(), rc[ur].end() - 1, rd[ur].begin() + 1);
    if (uneven_counts)
      sizes[ur] = {0, sc[ur].data(), sd[ur].data(), rc[ur].data(), rd[ur].data()};
    else
      sizes[ur] = Sizes::uniform(n);
    Member& me = m[ur];
    me.send.assign(static_cast<size_t>(sd[ur].back() + sc[ur].back()), 0);
    me.recv.assign(static_cast<size_t>(rd[ur].back() + rc[ur].back()), -1);
    for (int j = 0; j < p; ++j)
      for (std::int64_t i = 0; i < sc[ur][static_cast<size_t>(j)]; ++i)
        me.send[static_cast<size_t>(sd[ur][static_cast<size_t>(j)] + i)] = tag_value(r, j, i);
  }
  run(s, sizes, m);
  for (int r = 0; r < p; ++r) {
    const auto ur = static_cast<size_t>(r);
    for (int j = 0; j < p; ++j)
      for (std::int64_t i = 0; i < rc[ur][static_cast<size_t>(j)]; ++i)
        ASSERT_EQ(m[ur].recv[static_cast<size_t>(rd[ur][static_cast<size_t>(j)] + i)],
                  tag_value(j, r, i))
            << "member " << r << " block from " << j << " of " << p;
  }
}

void check_all_gather(const Schedule& s, std::int64_t n) {
  const int p = s.size();
  std::vector<Sizes> sizes(static_cast<size_t>(p), Sizes::uniform(n));
  std::vector<Member> m(static_cast<size_t>(p));
  for (int r = 0; r < p; ++r) {
    Member& me = m[static_cast<size_t>(r)];
    for (std::int64_t i = 0; i < n; ++i) me.send.push_back(tag_value(r, 0, i));
    me.recv.assign(static_cast<size_t>(p * n), -1);
  }
  run(s, sizes, m);
  for (int r = 0; r < p; ++r)
    for (int j = 0; j < p; ++j)
      for (std::int64_t i = 0; i < n; ++i)
        ASSERT_EQ(m[static_cast<size_t>(r)].recv[static_cast<size_t>(j * n + i)],
                  tag_value(j, 0, i))
            << "member " << r << " block " << j << " of " << p;
}

// In-place reductions of n elements: each member holds r + i at i.
std::vector<Member> reduced(const Schedule& s, std::int64_t n) {
  const int p = s.size();
  std::vector<Sizes> sizes(static_cast<size_t>(p), Sizes::uniform(n));
  std::vector<Member> m(static_cast<size_t>(p));
  for (int r = 0; r < p; ++r)
    for (std::int64_t i = 0; i < n; ++i)
      m[static_cast<size_t>(r)].recv.push_back(static_cast<float>(r + i));
  run(s, sizes, m);
  return m;
}

float sum_at(int p, std::int64_t i) { return static_cast<float>(p * (p - 1) / 2 + p * i); }

TEST(Schedules, EveryAlgorithmDeliversWhatItMustOnOneTo96Members) {
  std::vector<int> sizes(33);
  std::iota(sizes.begin(), sizes.end(), 1);
  sizes.insert(sizes.end(), {47, 48, 63, 64, 95, 96});
  for (const int p : sizes) {
    SCOPED_TRACE("p = " + std::to_string(p));
    for (bool uneven_counts : {false, true}) {
      check_all_to_all(*make_pairwise_shift(p), uneven_counts);
      check_all_to_all(*make_concurrent(p), uneven_counts);
      if (std::has_single_bit(static_cast<unsigned>(p)))
        check_all_to_all(*make_pairwise_xor(p), uneven_counts);
    }
    check_all_to_all(*make_bruck(p), false);
    check_all_gather(*make_ring_all_gather(p), 3);
    check_all_gather(*make_ring_all_gather(p), 0);
    const std::int64_t n = 2 * p + 3;  // chunks of uneven sizes
    const std::vector<Member> all = reduced(*make_ring_all_reduce(p), n);
    for (int r = 0; r < p; ++r)
      for (std::int64_t i = 0; i < n; ++i)
        ASSERT_EQ(all[static_cast<size_t>(r)].recv[static_cast<size_t>(i)], sum_at(p, i));
    const std::vector<Member> rs = reduced(*make_ring_reduce_scatter(p), n);
    for (int r = 0; r < p; ++r) {
      const int c = (r + 1) % p;  // the chunk member r holds reduced
      for (std::int64_t i = chunk_begin(n, p, c); i < chunk_begin(n, p, c + 1); ++i)
        ASSERT_EQ(rs[static_cast<size_t>(r)].recv[static_cast<size_t>(i)], sum_at(p, i));
    }
    std::vector<Member> none(static_cast<size_t>(p));
    run(*make_dissemination_barrier(p), std::vector<Sizes>(static_cast<size_t>(p)), none);
  }
}

// Coordinates of the members of a grid of the given level sizes, in group order `order`.
std::vector<std::vector<int>> grid(const std::vector<int>& sizes, const std::vector<int>& order) {
  std::vector<std::vector<int>> coords;
  for (const int r : order) {
    std::vector<int> c;
    int rest = r;
    for (const int n : sizes) {
      c.push_back(rest % n);
      rest /= n;
    }
    coords.push_back(c);
  }
  return coords;
}

TEST(Schedules, HierarchicalAllGatherRunsOneRingPerLevel) {
  // 2 tiles x 6 GPUs x 4 nodes, in rank order and shuffled; a sub-grid that skips a level (tile
  // 1 of every GPU: 6 x 4); one level only.
  std::vector<int> order(48);
  std::iota(order.begin(), order.end(), 0);
  std::vector<int> shuffled = order;
  for (size_t i = 0; i < shuffled.size(); ++i) std::swap(shuffled[i], shuffled[(i * 17 + 5) % 48]);
  std::vector<int> tile1;
  for (int r = 1; r < 48; r += 2) tile1.push_back(r);
  for (const auto& [members, q] : std::vector<std::pair<std::vector<int>, std::vector<int>>>{
           {order, {2, 6, 4}}, {shuffled, {2, 6, 4}}, {tile1, {6, 4}}, {{0, 2, 4, 6, 8}, {5}}}) {
    const std::vector<std::vector<int>> coords = grid({2, 6, 4}, members);
    const std::unique_ptr<Schedule> s = make_hierarchical_all_gather(coords);
    ASSERT_NE(s, nullptr);
    // Rounds: q_f - 1 per level; round t of level f carries q_0 ... q_{f-1} blocks.
    int rounds = 0, stride = 1;
    for (const int n : q) {
      for (int t = 0; t < n - 1; ++t)
        EXPECT_EQ(s->send(Sizes::uniform(5), 0, rounds + t, 0).count, 5 * stride);
      rounds += n - 1;
      stride *= n;
    }
    EXPECT_EQ(s->rounds(), rounds);
    check_all_gather(*s, 4);
  }
  // Not a grid: no hierarchical schedule.
  EXPECT_EQ(make_hierarchical_all_gather(grid({2, 6, 4}, {0, 1, 2})), nullptr);
  EXPECT_EQ(make_hierarchical_all_gather(grid({2, 6, 4}, {0, 0, 1, 1})), nullptr);
}

TEST(Schedules, BruckMovesHalfTheBlocksInLogRounds) {
  for (const int p : {2, 3, 5, 8, 12, 24, 96}) {
    const std::unique_ptr<Schedule> s = make_bruck(p);
    int rounds = 0;
    while ((1 << rounds) < p) ++rounds;
    EXPECT_EQ(s->rounds(), rounds) << p;
    std::int64_t moved = 0;
    for (int k = 0; k < rounds; ++k) {
      std::int64_t blocks = 0;
      for (int j = 1; j < p; ++j) blocks += (j >> k) & 1;
      EXPECT_EQ(s->send(Sizes::uniform(7), 3 % p, k, 0).count, 7 * blocks);
      EXPECT_EQ(s->send(Sizes::uniform(7), 0, k, 0).peer, (1 << k) % p);
      moved += blocks;
    }
    // Every block travels as many hops as its distance has set bits.
    std::int64_t hops = 0;
    for (int j = 1; j < p; ++j) hops += std::popcount(static_cast<unsigned>(j));
    EXPECT_EQ(moved, hops);
  }
}

TEST(Schedules, RingPassHandsEveryBlockRoundTheRingOnceAndWorksOnEachOnce) {
  for (int p = 1; p <= 33; ++p) {
    SCOPED_TRACE("p = " + std::to_string(p));
    const std::unique_ptr<Schedule> s = make_ring_pass(p);
    std::vector<std::int64_t> counts(static_cast<size_t>(p));
    for (int b = 0; b < p; ++b) counts[static_cast<size_t>(b)] = b % 7 == 3 ? 0 : 1 + (b * 5) % 4;
    Sizes z;
    z.send_counts = counts.data();
    ASSERT_EQ(s->rounds(), p < 2 ? 0 : p - 1);
    EXPECT_TRUE(s->same_peers());
    // held[r][b]: member r holds block b (its own at the start); worked[r][b]: it computed on b.
    std::vector<std::vector<bool>> held(static_cast<size_t>(p), std::vector<bool>(p, false));
    std::vector<std::vector<int>> worked(held.size(), std::vector<int>(static_cast<size_t>(p)));
    for (int r = 0; r < p; ++r) held[static_cast<size_t>(r)][static_cast<size_t>(r)] = true;
    const auto work = [&](int r, int round) {
      const int b = s->work_block(r, round);
      ASSERT_TRUE(held[static_cast<size_t>(r)][static_cast<size_t>(b)]) << r << " " << round;
      ++worked[static_cast<size_t>(r)][static_cast<size_t>(b)];
    };
    for (int i = 0; i < s->rounds(); ++i) {
      std::vector<std::pair<int, int>> arrived;  // (member, block)
      for (int r = 0; r < p; ++r) {
        ASSERT_EQ(s->sends(r, i), 1);
        ASSERT_EQ(s->recvs(r, i), 1);
        const Message out = s->send(z, r, i, 0);
        ASSERT_EQ(out.peer, (r + 1) % p);
        ASSERT_EQ(out.step, i);
        ASSERT_EQ(out.at.buffer, Buffer::kBlock);
        const int b = static_cast<int>(out.at.offset);
        ASSERT_EQ(b, s->work_block(r, i));  // it sends the block it computes on meanwhile
        ASSERT_EQ(out.count, counts[static_cast<size_t>(b)]);
        const Message in = s->recv(z, out.peer, i, 0);
        ASSERT_EQ(in.peer, r);
        ASSERT_EQ(in.step, i);
        ASSERT_EQ(in.at.offset, out.at.offset);
        ASSERT_EQ(in.count, out.count);
        work(r, i);
        arrived.emplace_back(out.peer, b);
      }
      for (const auto& [r, b] : arrived) {
        ASSERT_FALSE(held[static_cast<size_t>(r)][static_cast<size_t>(b)]);  // once
        held[static_cast<size_t>(r)][static_cast<size_t>(b)] = true;
      }
    }
    for (int r = 0; r < p; ++r) {
      work(r, s->rounds());  // the last block received
      for (int b = 0; b < p; ++b) {
        EXPECT_TRUE(held[static_cast<size_t>(r)][static_cast<size_t>(b)]);
        EXPECT_EQ(worked[static_cast<size_t>(r)][static_cast<size_t>(b)], 1);
      }
    }
  }
}

}  // namespace
}  // namespace cocodiff::emu::collectives
