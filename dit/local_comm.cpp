#include "dit/local_comm.hpp"

#include <algorithm>

#include "core/errors.hpp"

namespace cocodiff::dit {

namespace {
void copy(std::span<const float> from, std::span<float> to, std::int64_t count) {
  if (from.empty() || to.empty()) return;  // phantom: sizes only
  std::copy_n(from.begin(), count, to.begin());
}
}  // namespace

LocalComm::LocalComm() : topo_({{"tile", 1, "local"}}), start_(std::chrono::steady_clock::now()) {}

std::unique_ptr<Communicator> LocalComm::split(int /*color*/, int /*key*/) {
  return std::make_unique<LocalComm>();
}

void LocalComm::compute(const OpCost& cost) {
  flops_ += cost.flops;
  bytes_ += cost.bytes;
  ++ops_;
}

SimTime LocalComm::now() const {
  return SimTime::from_ns(std::chrono::duration_cast<std::chrono::nanoseconds>(
                              std::chrono::steady_clock::now() - start_)
                              .count());
}

Request LocalComm::do_iall_to_all(std::span<const float> send, std::span<float> recv,
                                  std::int64_t count, std::string_view) {
  copy(send, recv, count);
  return {};
}

Request LocalComm::do_iall_to_allv(std::span<const float> send, std::span<float> recv,
                                   const AllToAllvLayout& l, std::string_view) {
  if (!send.empty() && !recv.empty()) {
    COCO_CHECK(l.send_counts[0] == l.recv_counts[0], "LocalComm all_to_allv counts");
    std::copy_n(send.begin() + l.send_displs[0], l.send_counts[0], recv.begin() + l.recv_displs[0]);
  }
  return {};
}

Request LocalComm::do_iall_gather(std::span<const float> send, std::span<float> recv,
                                  std::int64_t count, std::string_view) {
  copy(send, recv, count);
  return {};
}

Request LocalComm::do_iall_reduce(std::span<float>, std::int64_t, ReduceOp, std::string_view) {
  return {};
}

Request LocalComm::do_isend(std::span<const float>, std::int64_t, int, int, std::string_view) {
  throw CommError("LocalComm: send to self without a matching receive is not supported");
}

Request LocalComm::do_irecv(std::span<float>, std::int64_t, int, int, std::string_view) {
  throw CommError("LocalComm: receive from self without a matching send is not supported");
}

}  // namespace cocodiff::dit
