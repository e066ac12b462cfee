#pragma once
// Exact replay of repeated parts of a run: what a backend may offer beside its Communicator. The
// emulator does (its tiles repeat the same blocks many times with sizes only, and simulating
// each again would give the same timeline); MPI and the one-rank backend do not. Code that
// wants it asks the communicator, and runs its body as usual where the answer is null.
//
//   if (Replay* r = replay_of(world)) {
//     if (r->begin_region("block x", /*may_skip=*/true).replayed) return;  // effect applied
//   }
//   body();

#include <cstdint>
#include <memory>
#include <string_view>

#include "core/communicator.hpp"

namespace cocodiff {

class Replay {
 public:
  /// What begin_region() tells the caller.
  struct RegionMark {
    bool replayed = false;  // the region's recorded effect was applied: skip its body
    std::uint64_t id = 0;   // names the (key, start state) of a replayable region; 0: none
  };
  /// Collective over the world (every rank, same key, same order): a region of the run starts
  /// here and ends at the next call. With `may_skip`, a backend that already simulated a region
  /// of this key from the same start state (clock offsets, nothing in flight) applies its
  /// recorded effect and returns replayed = true: the caller skips the body, which must then
  /// depend on nothing but the key. On a sub-group: {}.
  virtual RegionMark begin_region(std::string_view key, bool may_skip) = 0;
  /// Collective over the world, like begin_region, but judged where the rank arrives, as a
  /// span mark is: the rank goes on at once, and the backend judges the region's start state
  /// where it next makes a call that is not a compute charge (or marks, or ends); what it
  /// computes up to there is always simulated. The region ends where the rank passes its next
  /// mark. The answer is known at the mark only inside a replayed span (replayed = true, as
  /// begin_region's: skip the body). Elsewhere it is {}: the caller runs the body, and where
  /// the backend replays the region from the arrivals, every call the rank makes from there up
  /// to its next mark returns at once, complete, taking no time (calls must then move sizes
  /// only, and what the rank does up to its next mark must depend on nothing but the key, as
  /// with begin_region's `may_skip`); passed_answer() then says so. `next` names what follows
  /// the region's end, as begin_span's does: what the rank computes after its next mark, up to
  /// its first call there. A region whose messages were still in flight at its end is replayed
  /// only where `next` is the same. A backend whose trace still takes events may judge it at
  /// the mark instead, as begin_region does (the answer is then known at the mark). On a
  /// sub-group: {}.
  virtual RegionMark pass_region(std::string_view key, bool may_skip, std::string_view next) = 0;
  /// After pass_region, before the rank's next mark: how the backend judged the region it
  /// passed. The rank arrives there first if it has not (as at a call). replayed = true: the
  /// region was replayed from the arrivals, every call since was free, and `id` names the
  /// record replayed (as begin_region's); replayed = false with an id: the region was
  /// simulated and may be replayed under that id later. Where the backend judged the region at
  /// its mark, the answer it gave there.
  virtual RegionMark passed_answer() = 0;
  /// Collective over the world, like begin_region: a span of the run starts here and ends at the
  /// next begin_span, the regions it holds included. The rank goes on at once; the backend
  /// judges the span's start state where the rank next makes a call that is not a compute
  /// charge (or marks, or ends), and what it computes up to there is always simulated. With
  /// `may_skip`, the caller promises that
  /// everything the rank does until the next begin_span (its calls, its charges, the keys of the
  /// regions it marks) depends only on the key and the span's start state. A backend that
  /// already simulated a span of this key from the same start state applies its recorded
  /// effect; the caller runs its code as usual, but every call it makes on any communicator
  /// returns at once, complete, and takes no time, and every region mark inside the span
  /// answers replayed as the recorded one did (a region's key that differs from the
  /// recording's is an internal error). Calls must then move sizes only. `next` names what
  /// follows the span's end (what the rank computes after the next begin_span, up to its first
  /// call): a span whose messages were still in flight at its end is replayed only where `next`
  /// is the same. Nothing on a sub-group.
  virtual void begin_span(std::string_view key, bool may_skip, std::string_view next) = 0;

  /// A rank's calls, recorded to be issued again (backend-specific).
  class CallTape {
   public:
    virtual ~CallTape() = default;
  };
  /// Starts recording the calls this rank makes on every one of its communicators, its compute
  /// charges included, in order (sizes only: phantom buffers). Returns false where tapes are
  /// turned off (then end_tape() returns null). Call on the world communicator's Replay.
  virtual bool begin_tape() = 0;
  /// Ends the recording. Null when the calls cannot be issued again as they were: a buffer with
  /// data, a test() (whose answer depends on timing), a wait for a request started before the
  /// recording, a request left unwaited, or a call that makes groups or regions.
  virtual std::unique_ptr<CallTape> end_tape() = 0;
  /// Issues the recorded calls again, in order, from this rank's present state: the same calls
  /// the recorded code would make, where that code's calls depend on nothing that differs
  /// between the two runs of it (its timing included).
  virtual void play_tape(const CallTape& tape) = 0;

 protected:
  ~Replay() = default;
};

/// The replay `comm`'s backend offers, or null where it has none.
inline Replay* replay_of(Communicator& comm) { return dynamic_cast<Replay*>(&comm); }

}  // namespace cocodiff
