#pragma once
// Groups of ranks, and the completion state of a point-to-point operation or of a collective.

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/sim_time.hpp"

namespace cocodiff::emu::detail {

struct FiberState;  // emulator/detail/fiber_state.hpp

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
  int peer = -1;   // world rank of the other side (point-to-point)
  int owner = -1;  // point-to-point: the posting rank, whose open_p2p counts it until done
  std::int64_t count = 0;
  std::string label;           // the caller's label ("v", "q"), may be empty
  std::string_view call;       // collectives: "all_to_all(count=4)", kept for the run
  std::uint64_t call_seq = 0;  // collectives: the call's number on its group (3)
  std::string call_text;       // collectives without a label: "all_to_all(count=4) #3"
  /// Sets call and call_seq, and call_text when there is no label (set the label first).
  void set_call(std::string_view c, std::uint64_t seq) {
    call = c;
    call_seq = seq;
    if (label.empty()) call_text = std::string(c) + " #" + std::to_string(seq);
  }
  std::shared_ptr<const Group> group;  // collectives
  /// The collective's number of ranks (0 without a group).
  int group_ranks() const { return group ? static_cast<int>(group->members.size()) : 0; }
  bool open = false;             // collectives: counted in its tile's open_collectives
  SimTime started;               // collectives: the starting tile's clock at the start
  SimTime overlap_mark;          // its tile's overlapped_compute when it was opened
  SimTime penalty;               // transfer slowdown charged when it closed
  std::uint64_t stream_seq = 0;  // its place on its tile's communication stream (from 1)
  int overlap_slot = -1;         // Accounting::open_overlap
  /// "recv of 4 elements from rank 1 ('v')", "all_to_all(count=4) #3 'v' on group ...".
  std::string describe() const;
  /// Short name for trace spans.
  std::string_view trace_label() const;
};
using ReqPtr = std::shared_ptr<ReqState>;

/// Collective messages use tags above every user tag: bit 63 set, then the call's sequence
/// number and the algorithm's step.
inline std::uint64_t collective_tag(std::uint64_t seq, int step) {
  return (std::uint64_t{1} << 63) | (seq << 24) | static_cast<std::uint64_t>(step);
}

}  // namespace cocodiff::emu::detail
