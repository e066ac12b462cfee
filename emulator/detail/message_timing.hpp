#pragma once
// How a message matched at the collective level is timed, whichever runner matched it (a
// collective run's schedule, a ring pass's hop): the one decision between closed form, a pair,
// and the network model, and the one delivery of what was timed in closed form.
//
// A message is `flows` flows of `bytes` each (a ring pass hop: one per part) from world rank src
// to dst from `start`. Its route says what can reach its links (NetworkModel::exclusive_end,
// pair_key): no other rank's flow (exclusive), one other pair's only (paired), or any. Its ends
// say whether either could post another flow before it ends. Then it is timed
//   - in closed form, its end known now, when the route is exclusive and both ends wait for it
//     alone: accounted at once, its completion delivered when the controller next settles (as
//     the network's would be, through its sink);
//   - decided at the next step when the route is exclusive and an end may still post (a member
//     that has just started its op): closed form then if both ends wait alone, else the network;
//   - with its pair when the route is paired: held until the other pair's message is matched,
//     then both timed together if nothing else can change their ends
//     (NetworkModel::exclusive_pair_ends), else through the network; a message still held when
//     the controller moves the network on goes to the network;
//   - through the network model otherwise: one Transfer a flow, its part's tag added to the key.
// Either way its ends are the network model's, so the timeline does not depend on the way.

#include <cstdint>
#include <span>
#include <vector>

#include "emulator/detail/event_source.hpp"
#include "emulator/detail/fabric.hpp"

namespace cocodiff::emu::detail {

class Kernel;

class MessageTiming final : public EventSource {
 public:
  explicit MessageTiming(Kernel& k) : k_(k) {}

  /// What can reach a message's links.
  struct Route {
    enum class Kind : std::uint8_t {
      kAsk,        // asked when matched: exclusive (exclusive_end) or the network
      kExclusive,  // no other rank's flow (asked before: its end must be exclusive_end's)
      kPaired,     // one other pair's flows only: pair_key
      kNetwork,    // any
    } kind = Kind::kNetwork;
    int pair_key = -1;
  };
  /// Whether a message's ends could post another flow before it ends.
  enum class Ends : std::uint8_t {
    kAlone,  // both wait for the message's op alone: neither can
    kAsk,    // ask its sink (MessageSink::ends_wait_alone) if the route is exclusive; an end
             // that may still post is asked again at the next step
    kBusy,   // an end has something else open
  };
  /// A matched message: its flows go from world rank src to dst from `start`, on channel
  /// `key` (flow q's tag is key's plus q), labelled labels[q] (labels[0] when there is one),
  /// delivered to `sink` as the Transfer of its ends' members and the flow's part.
  struct Message {
    SimTime start;
    int src = 0, dst = 0;
    std::int64_t bytes = 0;
    int flows = 1;
    ChannelKey key;
    std::span<const std::uint32_t> labels;
    MessageSink* sink = nullptr;
    int src_member = 0, dst_member = 0;
    bool may_start_past = false;  // its flows may start before the network's present
  };

  /// The route from world rank src to dst for `flows` flows, asked of the network model now.
  Route route(int src, int dst, int flows) const;
  /// Times matched message m (the cases above).
  void time(const Message& m, Route route, Ends ends);

  /// Delivers the completions timed in closed form, and those they lead to, then decides the
  /// messages whose ends could still post: true when it delivered or timed any.
  bool settle() override;
  /// Sends the held messages to the network model before it moves on.
  void prepare() override { flush_held(); }
  /// Nothing is held, undecided or waiting to be delivered.
  bool idle() const { return closed_.empty() && undecided_.empty() && held_.empty(); }

 private:
  /// Its end is `end`, known now: accounted at once, delivered at the next settle.
  void closed(const Message& m, SimTime end);
  /// Its flows go through the network model.
  void transfers(const Message& m);
  /// A paired message: held for its pair, or timed with it.
  void pair(const Message& m, int key);
  void flush_held();
  bool deliver_closed();
  bool settle_undecided();

  struct Closed {
    MessageSink* sink;
    int src_member, dst_member, flows, rank;  // rank: its sender's, should a completion fail
    SimTime t;
  };
  struct Undecided {
    Message m;
    SimTime end;  // its end in closed form
  };
  struct Held {
    Message m;
    int key;
  };
  Kernel& k_;
  std::vector<Closed> closed_;
  std::vector<Undecided> undecided_;
  std::vector<Held> held_;
  std::vector<std::uint32_t> held_at_;  // held_at_[pair key]: 1 + its index in held_, 0: none
};

}  // namespace cocodiff::emu::detail
