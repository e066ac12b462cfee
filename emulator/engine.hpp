#pragma once
// The emulator: N simulated tiles, each a Boost.Fiber running real code (their arithmetic spread
// over W worker threads), exchanging real bytes through an in-process fabric timed by a
// NetworkModel, in deterministic virtual time (a conservative discrete-event simulation; the
// design is in emulator/README.md).
//
//   Engine engine(topo, std::make_unique<AlphaBetaModel>(topo, tiers), device, {.workers = 2});
//   RunResult r = engine.run([&](Communicator& comm) {
//     comm.compute({OpKind::kGemm, 2e9, 1e6, "proj"});
//     comm.all_to_all(send, recv, n);
//   });
//   r.makespan;            // virtual time of the slowest tile
//   r.timeline_sha256;     // identical for any W and any OS scheduling

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/communicator.hpp"
#include "core/sim_time.hpp"
#include "core/topology.hpp"
#include "net_models/collective_model.hpp"
#include "net_models/device_model.hpp"
#include "net_models/network_model.hpp"

namespace cocodiff::emu {

namespace detail {
class Kernel;
}

struct EngineOptions {
  /// Threads of the run; 0 means the machine's hardware threads. The tile fibers and the
  /// engine always run on one of them (a fiber hand-off never crosses threads); the others run
  /// the tiles' arithmetic (Communicator::run_math) meanwhile. Without arithmetic to hand over
  /// (phantom runs) they stay idle. Results and timelines are the same for any count.
  int workers = 1;
  /// Stack of each tile fiber. Eigen puts temporaries of up to EIGEN_STACK_ALLOCATION_LIMIT
  /// (128 KiB) on the stack, and a product may hold a few at once under our own frames:
  /// 1 MiB leaves 8x that limit. Stacks are reused from a pool and end in a guard page, so an
  /// overflow faults at once instead of corrupting a neighbour.
  std::size_t stack_bytes = std::size_t{1} << 20;
  /// Stack of the fibers that progress non-blocking collectives (no Eigen math runs there).
  std::size_t comm_stack_bytes = std::size_t{256} << 10;
  /// Bytes one fp32 element costs on the wire (2 models bf16 traffic, 4 fp32).
  double wire_bytes_per_element = 2;
  /// Record trace events (compute spans, waits, flows) for trace.json.
  bool trace = true;
  /// At most this many trace events are stored; the timeline hash covers all of them anyway.
  std::size_t trace_limit = 2'000'000;
  /// All-to-all algorithm: a registered name (emulator/collectives/registry.hpp: "pairwise" is
  /// shift's p-1 synchronised rounds, MPI's large-message default; "xor", "concurrent", "bruck"
  /// and any a user registers) at every size, or "library" (the library model's choice by size).
  std::string all_to_all_algorithm = "pairwise";
  /// Software costs of the collective library (per call, per message, protocol, schedule); the
  /// default is free, which keeps the network model's exact times.
  LibraryModel library;
  /// Replay regions (Replay::begin_region) that start from a state already simulated
  /// instead of simulating them again; the timeline, bytes and hash are the same either way.
  bool replay = true;
  /// Run collectives (all-to-all(v), all-gather, all-reduce, barrier) at the collective level:
  /// the controller runs each call's schedule (emulator/collectives/) directly instead of a
  /// fiber, requests and channel matching per message. The timeline, bytes and hash are the
  /// per-message path's (false), which stays for point-to-point.
  bool collective_ops = true;
  /// Let a tile record the calls of a block whose calls are a function of its kind and key
  /// (Replay::begin_tape, dit::BlockReplay) and issue them again for the next such
  /// blocks without running their code; the timeline, bytes and hash are the same either way.
  bool call_tapes = true;
};

/// One span of the virtual timeline.
struct TraceEvent {
  enum class Kind : std::uint8_t { kCompute, kWait, kFlow };
  Kind kind = Kind::kCompute;
  int rank = 0;             // the tile (flows: the sender)
  int peer = -1;            // flows: the receiver
  int tier = -1;            // flows: topology tier
  std::uint32_t label = 0;  // index into RunResult::labels
  SimTime start, end;
  std::int64_t bytes = 0;  // flows: wire bytes
};

struct RunResult {
  SimTime makespan;                   // latest end clock over all tiles
  std::vector<SimTime> rank_end;      // each tile's clock when its function returned
  std::vector<SimTime> rank_compute;  // time charged by compute()
  std::vector<SimTime> rank_exposed;  // time spent waiting for communication
  /// Time each tile's device waited for its host to issue (DeviceModel::has_host; 0 without):
  /// a tile's end is its compute + exposed communication + this.
  std::vector<SimTime> rank_host_wait;
  std::vector<std::int64_t> bytes_by_tier;  // wire bytes, each transfer under its ranks' tier
  std::uint64_t flows = 0;                  // point-to-point transfers between ranks
  /// Of these, flows no other rank's flow could share a link with (NetworkModel::exclusive_end),
  /// or no flow but one other hop's (exclusive_pair_ends), timed in closed form instead of
  /// through the network model: ring pass hops.
  std::uint64_t flows_exclusive = 0;
  /// Ring passes whose every hop is exclusive, timed whole once all members had joined
  /// (CollectiveRunner::op_whole): their flows are among flows_exclusive.
  std::uint64_t passes_whole = 0;
  std::uint64_t events = 0;               // simulation events processed (flows + computes + waits)
  std::uint64_t regions_replayed = 0;     // regions whose recorded effect was applied
  std::uint64_t tapes_played = 0;         // recorded calls issued again (Replay::play_tape)
  std::uint64_t tapes_run_by_engine = 0;  // of those, issued by the engine for a waiting fiber
  std::string timeline_sha256;            // digest of every event of the timeline
  std::vector<TraceEvent> trace;          // empty unless EngineOptions::trace
  std::vector<std::string> labels;
  bool trace_truncated = false;
  double wall_seconds = 0;
};

/// Memory mappings the fiber stacks of `ranks` tiles take (each stack a mapping, its guard page
/// another; a tile's main fiber and its communication fiber).
std::int64_t fiber_stack_mappings(int ranks);
/// ResourceError, before any fiber starts, when the kernel's limit on one process's memory
/// mappings (vm.max_map_count) leaves too few for `ranks` tiles' fiber stacks: it names the limit,
/// what the run needs and how to raise it. Engine::run calls it; validate does too.
void check_fiber_stack_limit(int ranks);

/// Every value EngineOptions::all_to_all_algorithm accepts: "library", then each registered
/// all-to-all algorithm's name and aliases.
std::vector<std::string> all_to_all_choices();

class Engine {
 public:
  Engine(Topology topo, std::unique_ptr<NetworkModel> net,
         std::shared_ptr<const DeviceModel> device, EngineOptions options = {});
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  /// Runs `tile_main` once per rank, each as a fiber with its own world Communicator, and
  /// returns when all have finished. Blocking. Throws RankError (an exception in a tile, with
  /// its rank) or CommError (mismatched collectives, deadlock naming who waits on what).
  /// May be called again; every run starts from virtual time zero.
  RunResult run(const std::function<void(Communicator&)>& tile_main);

  const Topology& topology() const { return topo_; }
  const EngineOptions& options() const { return options_; }
  const NetworkModel& network() const { return *net_; }
  const DeviceModel& device() const { return *device_; }

 private:
  Topology topo_;
  std::unique_ptr<NetworkModel> net_;
  std::shared_ptr<const DeviceModel> device_;
  EngineOptions options_;
};

}  // namespace cocodiff::emu
