#pragma once
// Collective algorithms over Port point-to-point, one per file. Each is straight-line code run
// by one fiber; buffers may be empty (phantom: sizes only).

#include <span>

#include "core/communicator.hpp"
#include "emulator/emu_comm.hpp"

namespace cocodiff::emu::collectives {

/// p-1 synchronised rounds; in round k rank r sends to r+k and receives from r-k (shift order)
/// or exchanges with r^k (XOR order, power-of-two groups only).
/// Time on a contention-free network: call + (p-1) alpha + sum of software and message times.
void all_to_allv_pairwise(Port& port, std::span<const float> send, std::span<float> recv,
                          const AllToAllvLayout& layout,
                          AllToAllAlgorithm order = AllToAllAlgorithm::kShift);
/// Every pair at once (NCCL-style grouped send/recv); the network model shares the links.
void all_to_allv_concurrent(Port& port, std::span<const float> send, std::span<float> recv,
                            const AllToAllvLayout& layout);
/// Ring: p-1 rounds, each passing one block to the right neighbour.
void all_gather_ring(Port& port, std::span<const float> send, std::span<float> recv,
                     std::int64_t count);
/// Ring reduce-scatter then ring all-gather; sums in a fixed order, so results are reproducible.
void all_reduce_ring(Port& port, std::span<float> data, std::int64_t count, ReduceOp op);
/// Dissemination barrier: ceil(log2 p) rounds of empty messages.
void barrier_dissemination(Port& port);

}  // namespace cocodiff::emu::collectives
