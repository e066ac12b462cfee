#pragma once
// The per-message fabric: point-to-point posts matched FIFO per (context, source, destination,
// tag), each match a transfer; transfers enter the network model in a fixed order, and their
// completions reach whatever owns them (MessageSink): two requests, or the members of a
// collective run or a ring pass.

#include <boost/circular_buffer.hpp>
#include <cstdint>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/sim_time.hpp"
#include "emulator/detail/fiber_state.hpp"
#include "emulator/detail/request.hpp"

namespace cocodiff::emu::detail {

class Kernel;
struct Transfer;

/// Messages of one (context, source, destination, tag) are matched in the order posted.
using ChannelKey = std::tuple<std::uint64_t, int, int, std::uint64_t>;  // ctx, src, dst, tag

/// What a message's end is delivered to: its two requests (point to point), or the member state
/// of the collective run or ring pass it belongs to. The controller delivers every completion
/// through it, whichever way the message was timed.
struct MessageSink {
  virtual ~MessageSink() = default;
  /// Transfer t ended at `end`: the sender's part, then the receiver's.
  virtual void message_done(const Transfer& t, SimTime end) = 0;
  /// Every flow of a message timed in closed form (MessageTiming) ended at `end`: as the
  /// network's completion of each of its `flows` parts would be (message_done), at once.
  virtual void closed_done(int src_member, int dst_member, int flows, SimTime end);
  /// Whether the members at both ends of a message wait for it alone, so neither can post
  /// another flow before it ends (MessageTiming asks when it could time it in closed form).
  virtual bool ends_wait_alone(int /*src_member*/, int /*dst_member*/) const { return false; }
};

/// A matched message for the network model.
struct Transfer {
  SimTime start;
  int src, dst;  // world ranks
  ChannelKey key;
  std::uint64_t seq;
  std::int64_t bytes;
  std::uint32_t label;
  MessageSink* sink = nullptr;
  ReqPtr sreq, rreq;                             // point to point: its requests
  int src_member = 0, dst_member = 0, part = 0;  // a collective's: its ends' group ranks

  /// The one way a transfer is made (point to point, collective runs, ring passes): the
  /// `seq`-th message matched on channel `key` (its source and destination world ranks), of
  /// `bytes` from `start`, delivered to `sink`.
  static Transfer matched(SimTime start, const ChannelKey& key, std::uint64_t seq,
                          std::int64_t bytes, std::uint32_t label, MessageSink* sink) {
    Transfer t;
    t.start = start;
    t.src = std::get<1>(key);
    t.dst = std::get<2>(key);
    t.key = key;
    t.seq = seq;
    t.bytes = bytes;
    t.label = label;
    t.sink = sink;
    return t;
  }
};

class Fabric {
 public:
  explicit Fabric(Kernel& k) : k_(k), point_to_point_(*this) {}

  /// Posts a send (data may be empty: sizes only), matched with the first receive posted on its
  /// channel; a size mismatch throws CommError.
  ReqPtr post_send(FiberState& f, std::uint64_t ctx, int src, int dst, std::uint64_t tag,
                   std::span<const float> data, std::int64_t count, std::string_view label);
  ReqPtr post_recv(FiberState& f, std::uint64_t ctx, int src, int dst, std::uint64_t tag,
                   std::span<float> data, std::int64_t count, std::string_view label);
  /// A matched message of a collective run or a ring pass, for the network model.
  void add(Transfer t) { new_transfers_.push_back(std::move(t)); }
  /// The transfers matched since the last step enter the network model, in a fixed order.
  void enter_network();
  /// Advances the network model to t_net and delivers the flows that end there.
  void network_step(SimTime t_net);
  /// No transfer waits to enter the network or is in it.
  bool idle() const { return new_transfers_.empty() && in_flight_.empty(); }
  /// A replayed region's flows: their ids are spent, as simulating it would have.
  void skip_flows(std::uint64_t n) {
    next_flow_id_ += n;
    in_flight_base_ = next_flow_id_;
  }
  /// Appends to `s` (a deadlock report) the posted operations nothing matches, naming the
  /// missing partner (up to 8).
  void describe_unmatched(std::string& s) const;

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
  struct Channel {
    // Usually one of each: a collective's step has its own tag.
    std::vector<PostedSend> sends;
    std::vector<PostedRecv> recvs;
    std::uint64_t matched = 0;
  };
  struct ChannelKeyHash {
    std::size_t operator()(const ChannelKey& k) const noexcept;
  };
  /// A point-to-point message's end completes its two requests.
  struct PointToPoint final : MessageSink {
    explicit PointToPoint(Fabric& f) : fabric(f) {}
    void message_done(const Transfer& t, SimTime end) override;
    Fabric& fabric;
  };
  struct TransferOrder {  // a new transfer's sort key: start, then (src, dst) in one word
    std::int64_t start;
    std::uint64_t ends;
    std::uint32_t index;
  };
  /// A point-to-point request of tile f, counted open until it completes.
  ReqPtr p2p_request(FiberState& f, ReqState::Op op, int peer, std::int64_t count,
                     std::string_view label);
  void match(Channel& ch, const ChannelKey& key, std::unique_lock<NullLock>& lk);

  Kernel& k_;
  PointToPoint point_to_point_;
  std::unordered_map<ChannelKey, Channel, ChannelKeyHash> channels_;
  std::vector<Transfer> new_transfers_;
  std::vector<TransferOrder> transfer_order_;  // enter_network's sort, kept between steps
  // flow id - in_flight_base_ -> transfer; grown by doubling, so a flow costs no allocation
  boost::circular_buffer<std::optional<Transfer>> in_flight_;
  std::vector<std::uint64_t> done_;  // flows a network advance completed
  std::uint64_t in_flight_base_ = 0;
  std::uint64_t next_flow_id_ = 0;
};

}  // namespace cocodiff::emu::detail
