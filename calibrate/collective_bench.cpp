#include "calibrate/collective_bench.hpp"

#include <algorithm>
#include <cmath>
#include <memory>

#include "core/errors.hpp"
#include "net_models/hierarchical_a2a.hpp"

namespace cocodiff::apps {

std::string_view bench_op_name(BenchOp op) {
  switch (op) {
    case BenchOp::kAllToAll:
      return "all_to_all";
    case BenchOp::kAllGather:
      return "all_gather";
    case BenchOp::kReduceScatter:
      return "reduce_scatter";
    case BenchOp::kAllReduce:
      return "all_reduce";
    case BenchOp::kSendRecv:
      return "sendrecv";
  }
  return "?";
}

bool parse_bench_op(std::string_view name, BenchOp& out) {
  if (name.size() > 5 && name.substr(name.size() - 5) == "_perf") name.remove_suffix(5);
  struct Spelling {
    std::string_view name;
    BenchOp op;
  };
  static constexpr Spelling kSpellings[] = {
      {"all_to_all", BenchOp::kAllToAll},
      {"alltoall", BenchOp::kAllToAll},
      {"all_gather", BenchOp::kAllGather},
      {"allgather", BenchOp::kAllGather},
      {"reduce_scatter", BenchOp::kReduceScatter},
      {"reducescatter", BenchOp::kReduceScatter},
      {"all_reduce", BenchOp::kAllReduce},
      {"allreduce", BenchOp::kAllReduce},
      {"sendrecv", BenchOp::kSendRecv},
      {"send_recv", BenchOp::kSendRecv},
  };
  for (const Spelling& s : kSpellings) {
    if (s.name == name) {
      out = s.op;
      return true;
    }
  }
  return false;
}

bool bench_op_has_blocks(BenchOp op) {
  return op == BenchOp::kAllToAll || op == BenchOp::kAllGather || op == BenchOp::kReduceScatter;
}

double bench_bus_factor(BenchOp op, int ranks) {
  if (op == BenchOp::kAllReduce) return 2.0 * (ranks - 1) / ranks;
  if (op == BenchOp::kSendRecv) return 1.0;
  return static_cast<double>(ranks - 1) / ranks;
}

std::int64_t bench_message_bytes(BenchOp op, int ranks, std::int64_t bytes) {
  if (op == BenchOp::kSendRecv || ranks <= 1) return bytes;
  return (bytes + ranks - 1) / ranks;
}

namespace {

// The call on comm (phantom buffers); tapa: the hierarchical all-to-all made for comm.
void issue(Communicator& comm, const BenchCall& call, HierarchicalAllToAll* tapa) {
  if (call.count <= 0) return;
  const int rank = comm.rank(), n = comm.size();
  if (tapa != nullptr) {
    tapa->run({}, {}, call.count, "netbench");
  } else if (call.op == BenchOp::kAllToAll) {
    comm.all_to_all({}, {}, call.count, "netbench");
  } else if (call.op == BenchOp::kAllGather || call.op == BenchOp::kReduceScatter) {
    comm.all_gather({}, {}, call.count, "netbench");
  } else if (call.op == BenchOp::kAllReduce) {
    comm.all_reduce({}, call.count, ReduceOp::kSum, "netbench");
  } else {  // sendrecv: a ring shift
    Request send = comm.isend({}, call.count, (rank + 1) % n, 7, "netbench");
    Request recv = comm.irecv({}, call.count, (rank + n - 1) % n, 7, "netbench");
    send.wait();
    recv.wait();
  }
}

// On one member: a barrier, the warm-up calls and another barrier, then the timed calls back to
// back. `start`: when the first began; `first_end`: when it returned; `end`: when the last did.
void timed_calls(Communicator& comm, const BenchCall& call, HierarchicalAllToAll* tapa,
                 SimTime& start, SimTime& first_end, SimTime& end) {
  comm.barrier();
  for (int i = 0; i < call.warmup; ++i) issue(comm, call, tapa);
  if (call.warmup > 0) comm.barrier();
  start = comm.now();
  for (int i = 0; i < call.iters; ++i) {
    issue(comm, call, tapa);
    if (i == 0) first_end = comm.now();
  }
  end = comm.now();
}

// One call's time, from the members' clocks (the earliest start, the latest returns): one call
// alone, its own time; several back to back, the time between the first's end and the last's
// over the calls between them, the rate a long run of calls settles at (as nccl-tests' many
// iterations give it), where the first call's host issue, paid after the barrier, is not
// hidden behind a call before it.
SimTime per_call(SimTime start, SimTime first_end, SimTime end, const BenchCall& call) {
  if (call.iters < 2) return end - start;
  return SimTime::from_ns((end - first_end).ns() / (call.iters - 1));
}

// What the library spends on a sendrecv that its messages do not show (see the header).
SimTime library_extra(const emu::Engine& engine, const BenchCall& call) {
  if (call.op != BenchOp::kSendRecv || call.count <= 0) return SimTime{};
  const LibraryModel& lib = engine.options().library;
  const std::int64_t wire =
      std::llround(static_cast<double>(call.count) * engine.options().wire_bytes_per_element);
  return lib.call_overhead + message_software_time(lib, wire);
}

}  // namespace

BenchTiming time_collective(emu::Engine& engine, const BenchCall& call) {
  const int world = engine.topology().num_ranks();
  const bool subset = !call.members.empty();
  std::vector<int> group_rank(static_cast<size_t>(world), subset ? -1 : 0);
  for (size_t i = 0; i < call.members.size(); ++i) {
    const int m = call.members[i];
    COCO_CHECK(m >= 0 && m < world && group_rank[static_cast<size_t>(m)] < 0,
               "bench members must be distinct world ranks");
    group_rank[static_cast<size_t>(m)] = static_cast<int>(i);
  }
  std::vector<SimTime> start(static_cast<size_t>(world)), first_end(static_cast<size_t>(world)),
      end(static_cast<size_t>(world));
  std::vector<bool> took_part(static_cast<size_t>(world), false);
  const emu::RunResult r = engine.run([&](Communicator& world_comm) {
    std::unique_ptr<Communicator> sub;
    if (subset) {
      const int g = group_rank[static_cast<size_t>(world_comm.rank())];
      sub = world_comm.split(g < 0 ? 1 : 0, world_comm.rank());
      if (g < 0) return;
    }
    Communicator& comm = subset ? *sub : world_comm;
    std::unique_ptr<HierarchicalAllToAll> tapa;
    if (call.tapa) tapa = std::make_unique<HierarchicalAllToAll>(comm);
    const auto me = static_cast<size_t>(world_comm.rank());
    took_part[me] = true;
    timed_calls(comm, call, tapa.get(), start[me], first_end[me], end[me]);
  });
  BenchTiming t;
  SimTime first = SimTime::max(), first_done, last;
  for (size_t i = 0; i < static_cast<size_t>(world); ++i) {
    if (!took_part[i]) continue;
    first = std::min(first, start[i]);
    first_done = std::max(first_done, first_end[i]);
    last = std::max(last, end[i]);
  }
  t.time = per_call(first, first_done, last, call) + library_extra(engine, call);
  t.bytes_by_tier = r.bytes_by_tier;
  t.flows = r.flows;
  return t;
}

}  // namespace cocodiff::apps

namespace cocodiff::apps {

std::vector<SimTime> time_collectives(emu::Engine& engine, const std::vector<BenchCall>& calls) {
  const int world = engine.topology().num_ranks();
  // One group per distinct member set; group_of[call] indexes them (-1: the world).
  std::vector<std::vector<int>> groups;
  std::vector<int> group_of(calls.size(), -1);
  for (size_t i = 0; i < calls.size(); ++i) {
    COCO_CHECK(!calls[i].tapa, "time_collectives times flat collectives only");
    if (calls[i].members.empty()) continue;
    auto it = std::find(groups.begin(), groups.end(), calls[i].members);
    group_of[i] = static_cast<int>(it - groups.begin());
    if (it == groups.end()) groups.push_back(calls[i].members);
  }
  std::vector<std::vector<char>> in_group(groups.size(),
                                          std::vector<char>(static_cast<size_t>(world), 0));
  for (size_t g = 0; g < groups.size(); ++g)
    for (int m : groups[g]) {
      COCO_CHECK(m >= 0 && m < world, "bench members must be world ranks");
      in_group[g][static_cast<size_t>(m)] = 1;
    }
  const SimTime never = SimTime::max();
  std::vector<SimTime> first(calls.size(), never), first_done(calls.size()), last(calls.size());
  engine.run([&](Communicator& world_comm) {
    const auto me = static_cast<size_t>(world_comm.rank());
    std::vector<std::unique_ptr<Communicator>> subs(groups.size());
    for (size_t g = 0; g < groups.size(); ++g) {
      subs[g] = world_comm.split(in_group[g][me] != 0 ? 0 : 1, world_comm.rank());
      if (in_group[g][me] == 0) subs[g].reset();
    }
    for (size_t i = 0; i < calls.size(); ++i) {
      world_comm.barrier();
      Communicator* comm =
          group_of[i] < 0 ? &world_comm : subs[static_cast<size_t>(group_of[i])].get();
      if (comm == nullptr) continue;
      SimTime start, first_end, end;
      timed_calls(*comm, calls[i], nullptr, start, first_end, end);
      // Every fiber runs on one thread: no lock needed.
      first[i] = std::min(first[i], start);
      first_done[i] = std::max(first_done[i], first_end);
      last[i] = std::max(last[i], end);
    }
  });
  std::vector<SimTime> out(calls.size());
  for (size_t i = 0; i < calls.size(); ++i)
    out[i] = per_call(first[i], first_done[i], last[i], calls[i]) + library_extra(engine, calls[i]);
  return out;
}

}  // namespace cocodiff::apps
