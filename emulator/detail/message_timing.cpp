// MessageTiming: the one decision of how a message matched at the collective level is timed,
// and the one delivery of what was timed in closed form (message_timing.hpp).

#include "emulator/detail/message_timing.hpp"

#include <array>
#include <optional>

#include "core/errors.hpp"
#include "emulator/detail/kernel.hpp"

namespace cocodiff::emu::detail {

MessageTiming::Route MessageTiming::route(int src, int dst, int flows) const {
  NetworkModel& net = k_.network();
  if (net.exclusive_end(src, dst, 0, flows, net.now())) return {Route::Kind::kExclusive, -1};
  const std::optional<int> key = net.pair_key(src, dst);
  return key.has_value() ? Route{Route::Kind::kPaired, *key} : Route{};
}

void MessageTiming::time(const Message& m, Route route, Ends ends) {
  // A message of no bytes shares no link: nothing its ends or others post can change its end.
  if (m.bytes == 0)
    if (const std::optional<SimTime> end = k_.network().empty_end(m.src, m.dst, m.start)) {
      closed(m, *end);
      return;
    }
  // An end with something else open may post a flow that joins this one's links.
  if (ends == Ends::kBusy || route.kind == Route::Kind::kNetwork) {
    transfers(m);
    return;
  }
  if (route.kind == Route::Kind::kPaired) {
    pair(m, route.pair_key);
    return;
  }
  const std::optional<SimTime> end =
      k_.network().exclusive_end(m.src, m.dst, m.bytes, m.flows, m.start);
  if (!end.has_value()) {
    COCO_CHECK(route.kind == Route::Kind::kAsk, "an exclusive route is not exclusive");
    transfers(m);
    return;
  }
  // Matched while an end could still post (it has just started its op, before it waits):
  // decided when the controller next steps, before any new flow enters the network. The ends
  // usually wait for the op alone by then.
  if (ends == Ends::kAsk && !m.sink->ends_wait_alone(m.src_member, m.dst_member)) {
    undecided_.push_back({m, *end});
    return;
  }
  closed(m, *end);
}

void MessageTiming::closed(const Message& m, SimTime end) {
  COCO_CHECK(m.may_start_past || m.start >= k_.network().now(),
             "an exclusive flow starts in the past");
  k_.accounting().flow(m.start, end, m.src, m.dst, m.bytes, m.labels, /*exclusive=*/true);
  closed_.push_back({m.sink, m.src_member, m.dst_member, m.flows, m.src, end});
}

void MessageTiming::transfers(const Message& m) {
  for (int q = 0; q < m.flows; ++q) {
    // One message per (src, dst, tag) in flight: its channel's first match.
    ChannelKey key = m.key;
    std::get<3>(key) += static_cast<std::uint64_t>(q);
    Transfer t =
        Transfer::matched(m.start, key, 0, m.bytes,
                          m.labels[m.labels.size() == 1 ? 0 : static_cast<size_t>(q)], m.sink);
    t.src_member = m.src_member;
    t.dst_member = m.dst_member;
    t.part = q;
    k_.fabric().add(std::move(t));
  }
}

void MessageTiming::pair(const Message& m, int key) {
  // Routes whose links only one other pair's flows can reach (two tiles behind one NIC, each in
  // a ring of its own): rings that run in step match both before the controller moves the
  // network on (flush_held).
  const auto k = static_cast<size_t>(key);
  if (held_at_.size() <= k) held_at_.resize(k + 1, 0);
  if (held_at_[k] == 0) {
    held_.push_back({m, key});
    held_at_[k] = static_cast<std::uint32_t>(held_.size());
    return;
  }
  const Message other = held_[held_at_[k] - 1].m;
  held_[held_at_[k] - 1] = held_.back();
  held_at_[static_cast<size_t>(held_.back().key)] = held_at_[k];
  held_.pop_back();
  held_at_[k] = 0;
  const std::array<std::optional<SimTime>, 2> ends = k_.network().exclusive_pair_ends(
      {other.src, other.dst, other.bytes, other.flows, other.start},
      {m.src, m.dst, m.bytes, m.flows, m.start});
  const std::array<const Message*, 2> both = {&other, &m};
  for (size_t i = 0; i < 2; ++i) {
    if (ends[i].has_value())
      closed(*both[i], *ends[i]);
    else
      transfers(*both[i]);
  }
}

void MessageTiming::flush_held() {
  for (const Held& h : held_) {
    held_at_[static_cast<size_t>(h.key)] = 0;
    if (!k_.aborting()) transfers(h.m);
  }
  held_.clear();
}

bool MessageTiming::settle() { return deliver_closed() || settle_undecided(); }

bool MessageTiming::deliver_closed() {
  if (closed_.empty()) return false;
  // Each completion may finish a round of its ends, post their next and match messages whose
  // completions join the list: a ring or a schedule of exclusive messages runs here. The order
  // does not matter: a member acts once all of its round's completions are in.
  k_.deliver_all(
      closed_,
      [](const Closed& c) { c.sink->closed_done(c.src_member, c.dst_member, c.flows, c.t); },
      [](const Closed& c) { return c.rank; });
  return true;
}

bool MessageTiming::settle_undecided() {
  if (undecided_.empty()) return false;
  bool timed = false;
  for (const Undecided& u : undecided_) {
    if (k_.aborting()) break;
    if (u.m.sink->ends_wait_alone(u.m.src_member, u.m.dst_member)) {
      closed(u.m, u.end);
      timed = true;
    } else {
      transfers(u.m);
    }
  }
  undecided_.clear();
  return timed;
}

}  // namespace cocodiff::emu::detail
