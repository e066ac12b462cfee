#pragma once
// The emulator's private kernel: fiber states, the matching fabric, the event loop.
// Everything here is guarded by Kernel::mutex_; fibers block through block(), which is the only
// place a tile fiber gives up its worker thread, so "no runnable fiber" (runnable_ == 0) means
// every tile has posted everything it will post before its next wake-up: the controller may
// then advance virtual time (conservative discrete-event simulation).

#include <atomic>
#include <boost/fiber/condition_variable.hpp>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "core/communicator.hpp"
#include "emulator/detail/stack_pool.hpp"
#include "emulator/engine.hpp"

namespace cocodiff::emu::detail {

/// Thrown inside fibers when the run is being torn down; caught at the fiber's entry.
struct Cancelled {};

/// One fiber: a tile's main fiber, or a fiber progressing one non-blocking collective.
struct FiberState {
  int rank = 0;
  bool is_main = true;
  SimTime clock;
  boost::fibers::condition_variable_any cv;
  bool wake = false;
  bool blocked = false;
  std::size_t blocked_index = 0;                // position in Kernel::blocked_list_
  const struct ReqState* waiting_on = nullptr;  // for deadlock reports
  bool waiting_in_test = false;
  StackBounds stack;  // set when the fiber's stack is allocated
};

/// A group of world ranks sharing a context id (what MPI calls a communicator).
struct Group {
  std::uint64_t ctx = 1;
  std::vector<int> members;  // world ranks, in group-rank order
  std::string describe() const;
};

/// Completion state of a point-to-point operation or of a whole collective. Descriptions are
/// built only when a report needs them: requests are on the hot path.
struct ReqState {
  enum class Op : std::uint8_t { kSend, kRecv, kCollective };
  bool done = false;
  SimTime done_time;
  FiberState* waiter = nullptr;
  Op op = Op::kSend;
  int peer = -1;  // world rank of the other side (point-to-point)
  std::int64_t count = 0;
  std::string label;                   // the caller's label ("v", "q"), may be empty
  std::string call;                    // collectives: "all_to_all(count=4) #3"
  std::shared_ptr<const Group> group;  // collectives
  /// "recv of 4 elements from rank 1 ('v')", "all_to_all(count=4) #3 'v' on group ...".
  std::string describe() const;
  /// Short name for trace spans.
  std::string_view trace_label() const;
};
using ReqPtr = std::shared_ptr<ReqState>;

/// Per-tile accounting, written only by the tile's main fiber (and read after the run).
struct TileStats {
  SimTime end, compute, exposed;
  std::uint64_t hash = 1469598103934665603ull;  // FNV-1a over the tile's events
  std::uint64_t events = 0;
  std::vector<TraceEvent> trace;
};

class Kernel {
 public:
  Kernel(const Topology& topo, NetworkModel& net, const DeviceModel& device,
         const EngineOptions& options);
  ~Kernel();

  RunResult run(const std::function<void(Communicator&)>& tile_main);

  // ---- called from fibers ----
  /// Posts a send (data may be empty: sizes only). Matching is FIFO per (ctx, src, dst, tag).
  ReqPtr post_send(FiberState& f, std::uint64_t ctx, int src, int dst, std::uint64_t tag,
                   std::span<const float> data, std::int64_t count, std::string_view label);
  ReqPtr post_recv(FiberState& f, std::uint64_t ctx, int src, int dst, std::uint64_t tag,
                   std::span<float> data, std::int64_t count, std::string_view label);
  /// Blocks f until req completes; f.clock = max(f.clock, completion). Main fibers account
  /// the jump as exposed communication.
  void wait(FiberState& f, ReqState& req);
  /// True when req completed at or before f.clock (may block until virtual time reaches it).
  bool test(FiberState& f, ReqState& req);
  /// req's completion time, once it is complete (nullopt before).
  std::optional<SimTime> done_time(const ReqState& req);
  void compute(FiberState& f, const OpCost& cost);
  /// Starts a fiber at parent's clock that runs body and then completes req at its own clock.
  void spawn_comm(FiberState& parent, std::function<void(FiberState&)> body, ReqPtr req);
  /// Checks that every member's `seq`-th collective on ctx is the same call.
  void register_collective(const Group& g, int group_rank, std::uint64_t seq,
                           const std::string& call);
  const Topology& topology() const { return topo_; }
  const EngineOptions& options() const { return options_; }

 private:
  struct PostedSend {
    ReqPtr req;
    std::span<const float> data;
    std::int64_t count;
    SimTime post;
    std::string_view label;
  };
  struct PostedRecv {
    ReqPtr req;
    std::span<float> data;
    std::int64_t count;
    SimTime post;
  };
  using ChannelKey = std::tuple<std::uint64_t, int, int, std::uint64_t>;  // ctx, src, dst, tag
  struct Channel {
    // Usually one of each: a collective's step has its own tag.
    std::vector<PostedSend> sends;
    std::vector<PostedRecv> recvs;
    std::uint64_t matched = 0;
  };
  struct Transfer {
    SimTime start;
    int src, dst;
    ChannelKey key;
    std::uint64_t seq;
    std::int64_t bytes;
    ReqPtr sreq, rreq;
    std::uint32_t label;
  };
  struct CollectiveEntry {
    std::string call;
    int first_group_rank;
    int seen;
  };

  void fiber_main(FiberState& f, const std::function<void(Communicator&)>& tile_main);
  void match(Channel& ch, const ChannelKey& key, std::unique_lock<std::mutex>& lk);
  void block(FiberState& f, std::unique_lock<std::mutex>& lk, const ReqState* req, bool in_test);
  void wake(FiberState& f);
  void complete(ReqState& r, SimTime t);
  void record_error(int rank, const std::exception_ptr& e);
  std::uint32_t intern(std::string_view label);
  void controller();
  bool controller_step(std::unique_lock<std::mutex>& lk);
  std::string deadlock_report() const;
  void record_tile_event(FiberState& f, TraceEvent::Kind kind, SimTime start, SimTime end,
                         std::string_view label);

  const Topology& topo_;
  NetworkModel& net_;
  const DeviceModel& device_;
  const EngineOptions& options_;
  StackPool main_stacks_;
  StackPool comm_stacks_;

  std::mutex mutex_;
  boost::fibers::condition_variable_any controller_cv_;
  int runnable_ = 0;
  int live_ = 0;
  std::atomic<bool> aborting_{false};
  std::vector<std::unique_ptr<FiberState>> mains_;
  std::vector<FiberState*> blocked_list_;  // fibers currently blocked (unordered)
  struct ChannelKeyHash {
    std::size_t operator()(const ChannelKey& k) const noexcept;
  };
  std::unordered_map<ChannelKey, Channel, ChannelKeyHash> channels_;
  std::vector<Transfer> new_transfers_;
  std::deque<std::optional<Transfer>> in_flight_;  // flow id - in_flight_base_ -> transfer
  std::uint64_t in_flight_base_ = 0;
  std::uint64_t next_flow_id_ = 0;
  std::multimap<SimTime, FiberState*> timers_;
  std::map<std::pair<std::uint64_t, std::uint64_t>, CollectiveEntry> collectives_;
  std::map<std::uint64_t, Group> groups_seen_;  // ctx -> group, for reports

  struct Failure {
    int rank;
    SimTime clock;
    std::string message;
    bool user_error;
  };
  std::vector<Failure> failures_;

  std::vector<TileStats> tiles_;
  std::size_t tile_trace_cap_ = 0;
  std::vector<TraceEvent> flow_trace_;
  std::uint64_t flow_hash_ = 1469598103934665603ull;
  std::vector<std::int64_t> bytes_by_tier_;
  std::uint64_t flows_ = 0;

  std::mutex label_mutex_;
  std::vector<std::string> labels_;
  std::unordered_map<std::string, std::uint32_t> label_ids_;
};

}  // namespace cocodiff::emu::detail
