// How a matched ring pass hop is timed: in closed form when neither end has anything else open
// and no other rank's flow can reach its route, with the one other pair whose flows can (held
// until both are matched), or through the network model; and the delivery of the completions
// timed in closed form.

#include <array>
#include <optional>

#include "core/errors.hpp"
#include "emulator/detail/ring_passes.hpp"

namespace cocodiff::emu::detail {

namespace {
std::size_t u(int i) { return static_cast<std::size_t>(i); }
}  // namespace

void RingPasses::deliver_closed() {
  // Each completion may finish a member's round, post its next round and match exclusive
  // messages whose completions join the list: the whole of an exclusive ring runs here. The
  // order does not matter: a member acts once all of its round's completions are in.
  k_.deliver_all(
      closed_pass_messages_,
      [this](const ClosedPassMessage& d) {
        pass_message_done(*d.op, d.member, d.slot, d.t, d.count);
      },
      [](const ClosedPassMessage& d) { return d.op->members[u(d.member)].rank; });
}

void RingPasses::time_pass_hop(const PassHop& hop) {
  PassOp& op = *hop.op;
  const int parts = op.parts;
  // With nothing else open on either end (s and d wait in this pass, so neither posts again
  // before these messages end), a route on which no other rank's flow can travel carries them
  // alone: their end is known now, and they never enter the network model.
  if (!k_.acct_.tile(hop.src_rank).nothing_open() || !k_.acct_.tile(hop.dst_rank).nothing_open()) {
    pass_transfers(hop);
    return;
  }
  const HopRoute route = op.hops[u(hop.src)];  // set with the mode
  if (route.kind == HopRoute::Kind::kExclusive) {
    const std::optional<SimTime> end =
        k_.net_.exclusive_end(hop.src_rank, hop.dst_rank, hop.bytes, parts, hop.start);
    COCO_CHECK(end.has_value(), "an exclusive hop's route is not exclusive");
    pass_closed(hop, *end);
    return;
  }
  // A route whose links only one other pair's flows can reach (two tiles behind one NIC, each
  // in a ring of its own): held until that pair's message is matched, then both are timed
  // together if nothing else can change their ends (NetworkModel::exclusive_pair_ends), else
  // they go to the network. Rings that run in step match both before the controller moves the
  // network on (flush_held).
  if (route.kind == HopRoute::Kind::kNetwork) {
    pass_transfers(hop);
    return;
  }
  const int key = route.pair_key;
  const auto k = static_cast<size_t>(key);
  if (held_at_.size() <= k) held_at_.resize(k + 1, 0);
  if (held_at_[k] == 0) {
    held_.push_back({hop, key});
    held_at_[k] = static_cast<std::uint32_t>(held_.size());
    return;
  }
  const PassHop other = held_[held_at_[k] - 1].hop;
  held_[held_at_[k] - 1] = held_.back();
  held_at_[static_cast<size_t>(held_.back().key)] = held_at_[k];
  held_.pop_back();
  held_at_[k] = 0;
  const std::array<std::optional<SimTime>, 2> ends = k_.net_.exclusive_pair_ends(
      {other.src_rank, other.dst_rank, other.bytes, other.op->parts, other.start},
      {hop.src_rank, hop.dst_rank, hop.bytes, parts, hop.start});
  const std::array<const PassHop*, 2> both = {&other, &hop};
  for (size_t i = 0; i < 2; ++i) {
    if (ends[i].has_value())
      pass_closed(*both[i], *ends[i]);
    else
      pass_transfers(*both[i]);
  }
}

void RingPasses::pass_closed(const PassHop& h, SimTime end) {
  COCO_CHECK(h.op->late || h.start >= k_.net_.now(), "an exclusive flow starts in the past");
  const int parts = h.op->parts;
  k_.acct_.flow(h.start, end, h.src_rank, h.dst_rank, h.bytes,
                {h.op->trace_labels.data() + u(h.src) * u(parts), u(parts)}, /*exclusive=*/true);
  closed_pass_messages_.push_back(
      {h.op, h.src, parts, parts, end});                          // the sends; dst's are pending
  closed_pass_messages_.push_back({h.op, h.dst, 0, parts, end});  // the receives
}

void RingPasses::pass_transfers(const PassHop& h) {
  const int parts = h.op->parts;
  for (int q = 0; q < parts; ++q) {
    Transfer t;
    t.start = h.start;
    t.src = h.src_rank;
    t.dst = h.dst_rank;
    t.key = ChannelKey{h.op->group->ctx, h.src_rank, h.dst_rank,
                       static_cast<std::uint64_t>(parts * h.round + q)};
    t.seq = 0;  // one message per (src, dst, tag) in flight: its channel's first match
    t.bytes = h.bytes;
    t.label = h.op->trace_labels[u(h.src) * u(parts) + u(q)];
    t.sink = h.op;
    t.src_member = h.src;
    t.dst_member = h.dst;
    t.part = q;
    k_.fabric_.add(std::move(t));
  }
}

void RingPasses::flush_held() {
  for (const HeldHop& h : held_) {
    held_at_[static_cast<size_t>(h.key)] = 0;
    if (!k_.aborting_) pass_transfers(h.hop);
  }
  held_.clear();
}

}  // namespace cocodiff::emu::detail
