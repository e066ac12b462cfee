#pragma once
// The message-by-message runner: any schedule (emulator/collectives/schedule.hpp) as straight-line
// code on one fiber over Port point-to-point. It is the reference the collective level
// (emulator/detail/collective_runner.hpp) is checked against, and runs what the collective level
// does not (all-reduce, barrier).

#include <span>

#include "core/communicator.hpp"
#include "emulator/collectives/schedule.hpp"
#include "emulator/emu_comm.hpp"

namespace cocodiff::emu::collectives {

/// Runs member port.rank()'s part of `s`: its own block first, the library's call overhead,
/// then each round (receives, sends each after its software time, waits in posting order).
/// Buffers may be empty (phantom: sizes only); `op` combines the receives of reducing rounds.
void run_on_fiber(Port& port, const Schedule& s, const Sizes& sizes, std::span<const float> send,
                  std::span<float> recv, ReduceOp op = ReduceOp::kSum);

}  // namespace cocodiff::emu::collectives
