// Pairwise-exchange all-to-all in shift order (MPI's large-message algorithm): p-1 synchronised
// rounds; in round k = 1..p-1 rank r sends its block for r+k and receives r-k's block for it,
// and waits for both before the next round. On a contention-free alpha-beta network with m
// bytes per block and the library's software time sw(m) per message:
// T = call + (p-1) (sw(m) + alpha + m beta).

#include "emulator/collectives/all_to_all_blocks.hpp"
#include "emulator/collectives/registry.hpp"

namespace cocodiff::emu::collectives {

namespace {

class PairwiseShift final : public Schedule {
 public:
  using Schedule::Schedule;
  int rounds() const override { return size() - 1; }
  // me and round + 1 both lie in [0, p): their sum or difference wraps at most once.
  Message recv(const Sizes& s, int me, int round, int /*k*/) const override {
    const int from = me - round - 1;
    return block_from(s, from < 0 ? from + size() : from, 0);
  }
  Message send(const Sizes& s, int me, int round, int /*k*/) const override {
    const int to = me + round + 1;
    return block_to(s, to >= size() ? to - size() : to, 0);
  }
  std::optional<Copy> own(const Sizes& s, int me) const override { return own_block(s, me); }
};

}  // namespace

std::unique_ptr<Schedule> make_pairwise_shift(int p) { return std::make_unique<PairwiseShift>(p); }

// Its registry entry (registry.cpp lists it with the other built-ins).
Algorithm builtin_shift() {
  Algorithm a = algorithm_entry(CollectiveKind::kAllToAll, "shift",
                                "p-1 rounds, round k: send to r+k, receive from r-k",
                                [](const GroupShape& g) { return make_pairwise_shift(g.size); });
  a.aliases = {"pairwise"};
  return a;
}

}  // namespace cocodiff::emu::collectives
