// Concurrent all-to-all (NCCL-style grouped send/recv): one round in which every receive is
// posted, then every send, each after the library's software time, and the network model
// decides how they share the links. With p-1 messages of m bytes on a contention-free network:
// T = call + (p-1) sw(m) + alpha + m beta.

#include "emulator/collectives/all_to_all_blocks.hpp"
#include "emulator/collectives/registry.hpp"

namespace cocodiff::emu::collectives {

namespace {

class Concurrent final : public Schedule {
 public:
  using Schedule::Schedule;
  int rounds() const override { return size() > 1 ? 1 : 0; }
  int recvs(int /*me*/, int /*round*/) const override { return size() - 1; }
  int sends(int /*me*/, int /*round*/) const override { return size() - 1; }
  Message recv(const Sizes& s, int me, int /*round*/, int k) const override {
    return block_from(s, wrap(me - k - 1, size()), 0);
  }
  Message send(const Sizes& s, int me, int /*round*/, int k) const override {
    return block_to(s, (me + k + 1) % size(), 0);
  }
  std::optional<Copy> own(const Sizes& s, int me) const override { return own_block(s, me); }
  bool one_each_way() const override { return false; }
};

}  // namespace

std::unique_ptr<Schedule> make_concurrent(int p) { return std::make_unique<Concurrent>(p); }

// Its registry entry (registry.cpp lists it with the other built-ins).
Algorithm builtin_concurrent() {
  return algorithm_entry(CollectiveKind::kAllToAll, "concurrent",
                         "every message posted at once (grouped send/recv)",
                         [](const GroupShape& g) { return make_concurrent(g.size); });
}

}  // namespace cocodiff::emu::collectives
