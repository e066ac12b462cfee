// Ring all-reduce: the ring reduce-scatter (rounds 0..p-2, steps 0..p-2), after which rank r
// holds chunk (r+1) mod p reduced, then a ring all-gather of the reduced chunks (rounds
// p-1..2p-3, steps p..2p-2): in its round k rank r sends chunk (r+1-k) mod p and receives
// chunk (r-k) mod p. T = call + 2 (p-1) (sw(n/p) + alpha + (n/p) beta).

#include "emulator/collectives/registry.hpp"
#include "emulator/collectives/ring_chunks.hpp"

namespace cocodiff::emu::collectives {

namespace {

class RingAllReduce final : public Schedule {
 public:
  explicit RingAllReduce(int p) : Schedule(p), reduce_scatter_(make_ring_reduce_scatter(p)) {}
  int rounds() const override { return 2 * reduce_scatter_->rounds(); }
  Message recv(const Sizes& s, int me, int round, int k) const override {
    const int half = reduce_scatter_->rounds();
    if (round < half) return reduce_scatter_->recv(s, me, round, k);
    const int g = round - half;
    return chunk_from_left(s.count, size(), me, wrap(me - g, size()), size() + g);
  }
  Message send(const Sizes& s, int me, int round, int k) const override {
    const int half = reduce_scatter_->rounds();
    if (round < half) return reduce_scatter_->send(s, me, round, k);
    const int g = round - half;
    return chunk_to_right(s.count, size(), me, wrap(me + 1 - g, size()), size() + g);
  }
  bool reduces(int round) const override { return round < reduce_scatter_->rounds(); }
  std::int64_t local_elements(const Sizes& s, int me) const override {
    return reduce_scatter_->local_elements(s, me);
  }

 private:
  std::unique_ptr<Schedule> reduce_scatter_;
};

}  // namespace

std::unique_ptr<Schedule> make_ring_all_reduce(int p) { return std::make_unique<RingAllReduce>(p); }

// Its registry entry (registry.cpp lists it with the other built-ins).
Algorithm builtin_ring_all_reduce() {
  return algorithm_entry(CollectiveKind::kAllReduce, "ring",
                         "ring reduce-scatter, then ring all-gather",
                         [](const GroupShape& g) { return make_ring_all_reduce(g.size); });
}

}  // namespace cocodiff::emu::collectives
