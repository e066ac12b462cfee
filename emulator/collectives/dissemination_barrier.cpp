// Dissemination barrier: in round k rank r signals r + 2^k and waits for r - 2^k; ceil(log2 p)
// rounds of empty messages, each costing the sender the library's software time.

#include "emulator/collectives/registry.hpp"
#include "emulator/collectives/schedule.hpp"

namespace cocodiff::emu::collectives {

namespace {

class DisseminationBarrier final : public Schedule {
 public:
  explicit DisseminationBarrier(int p) : Schedule(p) {
    for (int dist = 1; dist < p; dist *= 2) ++rounds_;
  }
  int rounds() const override { return rounds_; }
  Message recv(const Sizes& /*s*/, int me, int round, int /*k*/) const override {
    return {wrap(me - (1 << round), size()), round, 0, {Buffer::kRecv, 0, 0}};
  }
  Message send(const Sizes& /*s*/, int me, int round, int /*k*/) const override {
    return {(me + (1 << round)) % size(), round, 0, {Buffer::kSend, 0, 0}};
  }

 private:
  int rounds_ = 0;
};

}  // namespace

std::unique_ptr<Schedule> make_dissemination_barrier(int p) {
  return std::make_unique<DisseminationBarrier>(p);
}

// Its registry entry (registry.cpp lists it with the other built-ins).
Algorithm builtin_dissemination_barrier() {
  return algorithm_entry(CollectiveKind::kBarrier, "dissemination",
                         "ceil(log2 p) rounds of empty messages",
                         [](const GroupShape& g) { return make_dissemination_barrier(g.size); });
}

}  // namespace cocodiff::emu::collectives
