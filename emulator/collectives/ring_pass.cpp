// Ring pass (Communicator::ring_pass, ring attention): in round i = 0..p-2, member r sends the
// block it holds, (r - i) mod p, to r+1 and receives (r - i - 1) mod p from r-1, while its
// caller computes on the held block (work_block); after the last round it computes on the last
// block received. Blocks live where the caller keeps them (Buffer::kBlock), every part of one
// travelling as one flow. Not a library collective: the engine runs it with the caller's
// charges beside the rounds and no software time per message (its point-to-point messages).

#include "emulator/collectives/schedule.hpp"

namespace cocodiff::emu::collectives {

namespace {

class RingPass final : public Schedule {
 public:
  using Schedule::Schedule;
  int rounds() const override { return size() < 2 ? 0 : size() - 1; }
  Message recv(const Sizes& s, int me, int round, int /*k*/) const override {
    const int block = wrap(me - round - 1, size());
    const std::int64_t n = s.send_count(block);
    return {wrap(me - 1, size()), round, n, {Buffer::kBlock, block, n}};
  }
  Message send(const Sizes& s, int me, int round, int /*k*/) const override {
    const int block = wrap(me - round, size());
    const std::int64_t n = s.send_count(block);
    return {(me + 1) % size(), round, n, {Buffer::kBlock, block, n}};
  }
  bool same_peers() const override { return true; }
  int work_block(int me, int round) const override { return wrap(me - round, size()); }
};

}  // namespace

std::unique_ptr<Schedule> make_ring_pass(int p) { return std::make_unique<RingPass>(p); }

}  // namespace cocodiff::emu::collectives
