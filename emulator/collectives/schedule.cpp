#include "emulator/collectives/schedule.hpp"

namespace cocodiff::emu::collectives {

int Schedule::recvs(int /*me*/, int /*round*/) const { return 1; }

int Schedule::sends(int /*me*/, int /*round*/) const { return 1; }

void Schedule::segments(const Sizes& s, int me, int round, int k, bool sending,
                        std::vector<Segment>& out) const {
  out.push_back((sending ? send(s, me, round, k) : recv(s, me, round, k)).at);
}

std::optional<Schedule::Copy> Schedule::own(const Sizes& /*s*/, int /*me*/) const {
  return std::nullopt;
}

bool Schedule::reduces(int /*round*/) const { return false; }

std::int64_t Schedule::scratch(const Sizes& /*s*/) const { return 0; }

}  // namespace cocodiff::emu::collectives
