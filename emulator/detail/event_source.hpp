#pragma once
// What the kernel's controller steps over without naming it (Kernel::controller_step): every
// mechanism with events of its own is an EventSource, in one list the kernel builds once, in
// the order that decides ties. Each step the controller
//   1. lets the sources settle, in order: the first that delivers completions due before virtual
//      time advances (known in advance, or decided now) ends the step, so the fibers they wake
//      run before anything later;
//   2. lets every source prepare, in order (hand over what it holds for the network);
//   3. fires the source whose next event is earliest (the first in the list among equals).
// No source with a next event and nothing settled: the run is stuck.

#include "core/sim_time.hpp"

namespace cocodiff::emu::detail {

class EventSource {
 public:
  virtual ~EventSource() = default;
  /// Delivers completions due before virtual time advances; false when there were none.
  virtual bool settle() { return false; }
  /// Hands over what it holds before the sources' next events are asked for.
  virtual void prepare() {}
  /// The virtual time of its next event; SimTime::max() when it has none.
  virtual SimTime next_time() const { return SimTime::max(); }
  /// Runs its events at next_time().
  virtual void fire() {}

 protected:
  EventSource() = default;
  EventSource(const EventSource&) = default;
  EventSource& operator=(const EventSource&) = default;
};

}  // namespace cocodiff::emu::detail
