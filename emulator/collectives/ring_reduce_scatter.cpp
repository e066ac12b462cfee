// Ring reduce-scatter of `count` elements cut into p chunks (chunk_begin): in round k = 0..p-2
// rank r sends chunk (r-k) mod p to r+1 and adds chunk (r-k-1) mod p from r-1 into its own, in
// place. Each chunk is reduced in one fixed order, so results are bitwise reproducible; after
// the last round rank r holds chunk (r+1) mod p reduced over every rank.
// T = call + (p-1) (sw(n/p) + alpha + (n/p) beta) on a contention-free network.

#include "emulator/collectives/ring_chunks.hpp"

namespace cocodiff::emu::collectives {

namespace {

class RingReduceScatter final : public Schedule {
 public:
  using Schedule::Schedule;
  int rounds() const override { return size() > 1 ? size() - 1 : 0; }
  Message recv(const Sizes& s, int me, int round, int /*k*/) const override {
    return chunk_from_left(s.count, size(), me, wrap(me - round - 1, size()), round);
  }
  Message send(const Sizes& s, int me, int round, int /*k*/) const override {
    return chunk_to_right(s.count, size(), me, wrap(me - round, size()), round);
  }
  bool reduces(int /*round*/) const override { return true; }
  std::int64_t local_elements(const Sizes& s, int me) const override {
    return chunk_size(s.count, size(), me);
  }
};

}  // namespace

std::unique_ptr<Schedule> make_ring_reduce_scatter(int p) {
  return std::make_unique<RingReduceScatter>(p);
}

}  // namespace cocodiff::emu::collectives
