#pragma once
// One collective timed on the emulator as `cocodiff netbench` times it, so that `cocodiff
// calibrate` predicts a measured point by the very same path netbench prints. Phantom buffers
// (sizes only). As nccl-tests: after a barrier, `warmup` calls and another barrier, every member
// records its clock, makes `iters` calls back to back and records its clock again. One call: its
// time; several: (last end - first call's end) / (iters - 1), the rate a long run of calls
// settles at (nccl-tests times many). The barriers block each member's host too, so a point's
// time does not depend on the points before it. Back to back, a call's host issue (a cluster's
// [device.host]) overlaps the call before it, as on a GPU.
//
//   emu::Engine engine(c.topology, std::move(c.network), c.device, options);
//   BenchCall call{.op = BenchOp::kAllGather, .count = 4096, .members = {0, 1, 2, 3}};
//   BenchTiming t = time_collective(engine, call);   // t.time, t.bytes_by_tier
//
// Sizes as nccl-tests counts them (bench_bytes): one rank's send buffer of p blocks for
// all_to_all and reduce_scatter, its receive buffer of p blocks for all_gather, its buffer for
// all_reduce, and the message for sendrecv; `count` is elements per block (per peer), or of the
// whole buffer for all_reduce and sendrecv. reduce_scatter runs NCCL's ring: p-1 steps, each
// sending one block to r+1 and receiving one from r-1 (phantom: the additions cost nothing), the
// messages, sizes and library costs of the ring all-gather, which is what is issued (a library
// whose all-gather is hierarchical times it by that schedule, level by level). sendrecv is rank r
// sending to r+1 and receiving from r-1 as one library call: its point-to-point messages, plus
// the library's call and message software time, which delays both posts of every rank alike and
// so adds to the time.

#include <cstdint>
#include <string_view>
#include <vector>

#include "core/sim_time.hpp"
#include "emulator/engine.hpp"

namespace cocodiff::apps {

enum class BenchOp : std::uint8_t { kAllToAll, kAllGather, kReduceScatter, kAllReduce, kSendRecv };

/// "all_to_all" | "all_gather" | "reduce_scatter" | "all_reduce" | "sendrecv".
std::string_view bench_op_name(BenchOp op);
/// Parses a name of bench_op_name(), or nccl-tests' spelling (alltoall, allgather, allreduce,
/// reducescatter, with or without _perf); false when it names no collective the emulator runs.
bool parse_bench_op(std::string_view name, BenchOp& out);
/// True for ops whose buffer holds p blocks (bytes = p x block).
bool bench_op_has_blocks(BenchOp op);
/// busbw / algbw on p ranks (nccl-tests' factors).
double bench_bus_factor(BenchOp op, int ranks);
/// Wire bytes of the largest message one call sends: a block, an all-reduce ring chunk, or the
/// whole sendrecv message. What the library's protocol threshold compares.
std::int64_t bench_message_bytes(BenchOp op, int ranks, std::int64_t bytes);

struct BenchCall {
  BenchOp op = BenchOp::kAllToAll;
  std::int64_t count = 0;    // elements per block (see above); 0: only the setup
  bool tapa = false;         // all_to_all only: one all-to-all per topology level
  std::vector<int> members;  // world ranks taking part, ascending; empty: every rank
  int warmup = 0;            // calls before the timed ones
  int iters = 1;             // timed calls, back to back
};

struct BenchTiming {
  SimTime time;                             // per call
  std::vector<std::int64_t> bytes_by_tier;  // of the whole run (setup and every call included)
  std::uint64_t flows = 0;
};

/// Runs `call` once on `engine` (a fresh run from virtual time zero). Blocking. Throws what the
/// engine throws (TimeOverflowError for absurd figures).
BenchTiming time_collective(emu::Engine& engine, const BenchCall& call);

/// The time of each call, as time_collective() gives it, from one run: the calls one after
/// another, each after a barrier of every rank (so the network is idle when it starts) and its
/// own barriers. A run costs a thread and a stack per rank, so many small calls are timed
/// far faster this way. bytes_by_tier and flows are left empty.
std::vector<SimTime> time_collectives(emu::Engine& engine, const std::vector<BenchCall>& calls);

}  // namespace cocodiff::apps
