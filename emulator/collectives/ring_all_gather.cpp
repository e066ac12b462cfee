// Ring all-gather: in round k = 0..p-2, rank r forwards block (r-k) mod p to r+1 and receives
// block (r-k-1) mod p from r-1, both in the receive buffer. On a contention-free network:
// T = call + (p-1) (sw(m) + alpha + m beta), sw being the library's software time per message.

#include "emulator/collectives/registry.hpp"
#include "emulator/collectives/schedule.hpp"

namespace cocodiff::emu::collectives {

namespace {

class RingAllGather final : public Schedule {
 public:
  using Schedule::Schedule;
  int rounds() const override { return size() - 1; }
  Message recv(const Sizes& s, int me, int round, int /*k*/) const override {
    const int block = wrap(me - round - 1, size());
    return {wrap(me - 1, size()), round, s.count, {Buffer::kRecv, block * s.count, s.count}};
  }
  Message send(const Sizes& s, int me, int round, int /*k*/) const override {
    const int block = wrap(me - round, size());
    return {(me + 1) % size(), round, s.count, {Buffer::kRecv, block * s.count, s.count}};
  }
  std::optional<Copy> own(const Sizes& s, int me) const override {
    return Copy{{Buffer::kSend, 0, s.count}, {Buffer::kRecv, me * s.count, s.count}};
  }
  std::int64_t local_elements(const Sizes& s, int /*me*/) const override { return s.count; }
};

}  // namespace

std::unique_ptr<Schedule> make_ring_all_gather(int p) { return std::make_unique<RingAllGather>(p); }

// Its registry entry (registry.cpp lists it with the other built-ins).
Algorithm builtin_ring_all_gather() {
  return algorithm_entry(CollectiveKind::kAllGather, "ring",
                         "p-1 rounds passing one block to the right",
                         [](const GroupShape& g) { return make_ring_all_gather(g.size); });
}

}  // namespace cocodiff::emu::collectives
