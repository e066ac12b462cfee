// The per-message fabric: point-to-point posts matched FIFO per (context, source, destination,
// tag), each match a transfer for the network model.

#include "emulator/detail/fabric.hpp"

#include "emulator/detail/kernel.hpp"

#include <algorithm>
#include <cstring>
#include <optional>
#include <string>

#include "core/errors.hpp"

namespace cocodiff::emu::detail {

std::size_t Fabric::ChannelKeyHash::operator()(const ChannelKey& k) const noexcept {
  std::uint64_t h = std::get<0>(k) * 0x9e3779b97f4a7c15ull;
  h ^= (static_cast<std::uint64_t>(static_cast<std::uint32_t>(std::get<1>(k))) << 32 |
        static_cast<std::uint32_t>(std::get<2>(k))) +
       0x7f4a7c159e3779b9ull + (h << 6) + (h >> 2);
  h ^= std::get<3>(k) + 0x94d049bb133111ebull + (h << 6) + (h >> 2);
  return static_cast<std::size_t>(h);
}

ReqPtr Fabric::p2p_request(FiberState& f, ReqState::Op op, int peer, std::int64_t count,
                           std::string_view label) {
  auto req = std::make_shared<ReqState>();
  req->op = op;
  req->peer = peer;
  req->count = count;
  req->label = label;
  req->owner = f.rank;
  k_.accounting().tile(f.rank).timing.p2p_posted();
  return req;
}

ReqPtr Fabric::post_send(FiberState& f, std::uint64_t ctx, int src, int dst, std::uint64_t tag,
                         std::span<const float> data, std::int64_t count, std::string_view label) {
  std::unique_lock<NullLock> lk(k_.state_lock());
  ReqPtr req = p2p_request(f, ReqState::Op::kSend, dst, count, label);
  const ChannelKey key{ctx, src, dst, tag};
  Channel& ch = channels_[key];
  ch.sends.push_back({req, data, count, f.clock, label});
  match(ch, key, lk);
  return req;
}

ReqPtr Fabric::post_recv(FiberState& f, std::uint64_t ctx, int src, int dst, std::uint64_t tag,
                         std::span<float> data, std::int64_t count, std::string_view label) {
  std::unique_lock<NullLock> lk(k_.state_lock());
  ReqPtr req = p2p_request(f, ReqState::Op::kRecv, src, count, label);
  const ChannelKey key{ctx, src, dst, tag};
  Channel& ch = channels_[key];
  ch.recvs.push_back({req, data, count, f.clock});
  match(ch, key, lk);
  return req;
}

void Fabric::match(Channel& ch, const ChannelKey& key, std::unique_lock<NullLock>& lk) {
  if (ch.sends.empty() || ch.recvs.empty()) return;
  PostedSend s = std::move(ch.sends.front());
  PostedRecv r = std::move(ch.recvs.front());
  ch.sends.erase(ch.sends.begin());
  ch.recvs.erase(ch.recvs.begin());
  const std::uint64_t seq = ch.matched++;
  const int src = std::get<1>(key);
  const int dst = std::get<2>(key);
  if (ch.sends.empty() && ch.recvs.empty()) channels_.erase(key);
  if (s.count != r.count) {
    throw CommError("message size mismatch: rank " + std::to_string(src) + " sends " +
                    std::to_string(s.count) + " elements to rank " + std::to_string(dst) +
                    ", which expects " + std::to_string(r.count) +
                    (s.label.empty() ? "" : " (in '" + std::string(s.label) + "')"));
  }
  const SimTime start = std::max(s.post, r.post);
  // Copy outside the lock: both buffers stay valid until the requests complete, and the
  // controller cannot complete them while this fiber is still running.
  lk.unlock();
  if (!s.data.empty() && !r.data.empty() && s.count > 0)
    std::memcpy(r.data.data(), s.data.data(), static_cast<size_t>(s.count) * sizeof(float));
  lk.lock();
  if (src == dst) {
    k_.complete(*s.req, start);
    k_.complete(*r.req, start);
    return;
  }
  Transfer t =
      Transfer::matched(start, key, seq, k_.wire_bytes(s.count),
                        k_.options().trace ? k_.accounting().intern(s.label) : 0, &point_to_point_);
  t.sreq = std::move(s.req);
  t.rreq = std::move(r.req);
  new_transfers_.push_back(std::move(t));
}

void MessageSink::closed_done(int src_member, int dst_member, int flows, SimTime end) {
  Transfer t{};
  t.src_member = src_member;
  t.dst_member = dst_member;
  for (int q = 0; q < flows; ++q) {
    t.part = q;
    message_done(t, end);  // may finish and free this sink after its last part
  }
}

void Fabric::PointToPoint::message_done(const Transfer& t, SimTime end) {
  fabric.k_.complete(*t.sreq, end);
  fabric.k_.complete(*t.rreq, end);
}

void Fabric::enter_network() {
  // New transfers enter the network in a fixed order, whatever order the fibers matched them.
  if (new_transfers_.empty()) return;
  // Sorted through compact keys: a transfer record is 136 bytes, and each is moved once, in
  // order. (start, src, dst) decide almost every comparison; ties read the records.
  std::vector<TransferOrder>& order = transfer_order_;
  order.resize(new_transfers_.size());
  for (size_t i = 0; i < order.size(); ++i) {
    const Transfer& t = new_transfers_[i];
    order[i] = {t.start.ns(),
                (static_cast<std::uint64_t>(static_cast<std::uint32_t>(t.src)) << 32) |
                    static_cast<std::uint32_t>(t.dst),
                static_cast<std::uint32_t>(i)};
  }
  std::sort(order.begin(), order.end(), [this](const TransferOrder& x, const TransferOrder& y) {
    if (x.start != y.start) return x.start < y.start;
    if (x.ends != y.ends) return x.ends < y.ends;
    const Transfer& a = new_transfers_[x.index];
    const Transfer& b = new_transfers_[y.index];
    return std::tie(a.key, a.seq) < std::tie(b.key, b.seq);
  });
  if (in_flight_.size() + order.size() > in_flight_.capacity())
    in_flight_.set_capacity(
        std::max<size_t>({64, 2 * in_flight_.capacity(), in_flight_.size() + order.size()}));
  for (const TransferOrder& o : order) {
    Transfer& t = new_transfers_[o.index];
    const std::uint64_t id = next_flow_id_++;
    k_.network().add_flow(id, t.src, t.dst, t.bytes, t.start);
    COCO_CHECK(id == in_flight_base_ + in_flight_.size(), "flow ids are sequential");
    in_flight_.push_back(std::move(t));
  }
  new_transfers_.clear();
}

void Fabric::network_step(SimTime t_net) {
  std::vector<std::uint64_t>& done = done_;  // kept between steps: no allocation per event
  done.clear();
  k_.network().advance_to(t_net, done);
  for (std::uint64_t id : done) {
    COCO_CHECK(id >= in_flight_base_ && id - in_flight_base_ < in_flight_.size(),
               "unknown flow completed");
    std::optional<Transfer>& slot = in_flight_[id - in_flight_base_];
    COCO_CHECK(slot.has_value(), "flow completed twice");
    Transfer& t = *slot;
    k_.accounting().flow(t.start, t_net, t.src, t.dst, t.bytes, {&t.label, 1});
    try {
      t.sink->message_done(t, t_net);
    } catch (const CommError& e) {  // a mismatched message of a later round
      k_.message_failed(t.src, t_net, e);
    }
    slot.reset();
    while (!in_flight_.empty() && !in_flight_.front().has_value()) {
      in_flight_.pop_front();
      ++in_flight_base_;
    }
  }
}

void Fabric::describe_unmatched(std::string& s) const {
  size_t unmatched = 0;
  std::vector<std::pair<ChannelKey, const Channel*>> open;
  for (const auto& [key, ch] : channels_) open.emplace_back(key, &ch);
  std::sort(open.begin(), open.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  for (const auto& [key, chp] : open) {
    const Channel& ch = *chp;
    const auto& [ctx, src, dst, tag] = key;
    const std::string where = k_.describe_group(ctx);
    for (size_t i = 0; i < ch.recvs.size() && unmatched < 8; ++i, ++unmatched)
      s += "\n  rank " + std::to_string(dst) + " posted a recv from rank " + std::to_string(src) +
           " on " + where + " that no send matches";
    for (size_t i = 0; i < ch.sends.size() && unmatched < 8; ++i, ++unmatched)
      s += "\n  rank " + std::to_string(src) + " posted a send to rank " + std::to_string(dst) +
           " on " + where + " that no recv matches";
  }
}

}  // namespace cocodiff::emu::detail
