// Pairwise-exchange all-to-all in XOR order (MPICH and Open MPI for power-of-two groups): p-1
// synchronised rounds; in round k = 1..p-1 rank r exchanges blocks with r XOR k, so each round
// is a set of disjoint two-way exchanges. Same closed form as the shift order:
// T = call + (p-1) (sw(m) + alpha + m beta).

#include <bit>

#include "core/errors.hpp"
#include "emulator/collectives/all_to_all_blocks.hpp"
#include "emulator/collectives/registry.hpp"

namespace cocodiff::emu::collectives {

namespace {

class PairwiseXor final : public Schedule {
 public:
  explicit PairwiseXor(int p) : Schedule(p) {
    COCO_CHECK(std::has_single_bit(static_cast<unsigned>(p)), "XOR pairing needs 2^k ranks");
  }
  int rounds() const override { return size() - 1; }
  Message recv(const Sizes& s, int me, int round, int /*k*/) const override {
    return block_from(s, me ^ (round + 1), 0);
  }
  Message send(const Sizes& s, int me, int round, int /*k*/) const override {
    return block_to(s, me ^ (round + 1), 0);
  }
  std::optional<Copy> own(const Sizes& s, int me) const override { return own_block(s, me); }
};

}  // namespace

std::unique_ptr<Schedule> make_pairwise_xor(int p) { return std::make_unique<PairwiseXor>(p); }

// Its registry entry (registry.cpp lists it with the other built-ins).
Algorithm builtin_xor() {
  return algorithm_entry(
      CollectiveKind::kAllToAll, "xor",
      "p-1 rounds, round k: exchange with r XOR k (p a power of two)",
      [](const GroupShape& g) -> std::unique_ptr<Schedule> {
        return std::has_single_bit(static_cast<unsigned>(g.size)) ? make_pairwise_xor(g.size)
                                                                  : nullptr;
      },
      "shift");
}

}  // namespace cocodiff::emu::collectives
