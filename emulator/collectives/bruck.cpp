// Bruck's all-to-all (MPICH's short-message algorithm), for equal counts: ceil(log2 p) rounds
// instead of p-1, each moving about half of the blocks. Rank r's block for r + j travels j
// hops: in round k every block whose distance j has bit k set moves on to r + 2^k, so after the
// last round it has reached r + j. Blocks are named by distance: slot j of rank x holds, after
// rounds 0..k-1, the block from x - (j mod 2^k) for it + j. Round k's message to x + 2^k
// carries slots j with bit k set, in increasing j; the receiver keeps them in the same slots.
// A slot received t times of its m = popcount(j) lives in the receive buffer at its final place
// (the block from x - j) when m - t is even, else in scratch slot j: a round never reads and
// writes one place, and the last reception lands where it belongs. Slots not yet received are
// read from the send buffer. With n_k blocks of m bytes in round k on a contention-free network:
// T = call + sum over k of (sw(n_k m) + alpha + n_k m beta).

#include <bit>

#include "core/errors.hpp"
#include "emulator/collectives/all_to_all_blocks.hpp"
#include "emulator/collectives/registry.hpp"

namespace cocodiff::emu::collectives {

namespace {

class Bruck final : public Schedule {
 public:
  explicit Bruck(int p) : Schedule(p) {
    for (int bit = 1; bit < p; bit *= 2) {
      int n = 0;
      for (int j = 1; j < p; ++j) n += (j & bit) != 0 ? 1 : 0;
      blocks_.push_back(n);
    }
  }
  int rounds() const override { return static_cast<int>(blocks_.size()); }
  Message recv(const Sizes& s, int me, int round, int /*k*/) const override {
    return message(s, wrap(me - (1 << round), size()), round);
  }
  Message send(const Sizes& s, int me, int round, int /*k*/) const override {
    return message(s, (me + (1 << round)) % size(), round);
  }
  void segments(const Sizes& s, int me, int round, int /*k*/, bool sending,
                std::vector<Segment>& out) const override {
    COCO_CHECK(s.send_counts == nullptr, "Bruck's all-to-all moves equal counts only");
    const int p = size();
    const int bit = 1 << round;
    for (int j = 1; j < p; ++j) {
      if ((j & bit) == 0) continue;
      const int t = std::popcount(static_cast<unsigned>(j & (bit - 1))) + (sending ? 0 : 1);
      const int m = std::popcount(static_cast<unsigned>(j));
      if (t == 0)
        out.push_back({Buffer::kSend, s.send_displ((me + j) % p), s.count});
      else if ((m - t) % 2 == 0)
        out.push_back({Buffer::kRecv, s.recv_displ(wrap(me - j, p)), s.count});
      else
        out.push_back({Buffer::kScratch, j * s.count, s.count});
    }
  }
  std::optional<Copy> own(const Sizes& s, int me) const override { return own_block(s, me); }
  std::int64_t scratch(const Sizes& s) const override { return size() * s.count; }

 private:
  Message message(const Sizes& s, int peer, int round) const {
    return gathered(peer, round, blocks_[static_cast<size_t>(round)] * s.count);
  }
  std::vector<int> blocks_;  // per round: the distances 1..p-1 with its bit set
};

}  // namespace

std::unique_ptr<Schedule> make_bruck(int p) { return std::make_unique<Bruck>(p); }

// Its registry entry (registry.cpp lists it with the other built-ins).
Algorithm builtin_bruck() {
  Algorithm a = algorithm_entry(
      CollectiveKind::kAllToAll, "bruck", "ceil(log2 p) rounds forwarding blocks, equal counts",
      [](const GroupShape& g) { return make_bruck(g.size); }, "shift");
  a.equal_counts_only = true;
  return a;
}

}  // namespace cocodiff::emu::collectives
