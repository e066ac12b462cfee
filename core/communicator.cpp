#include "core/communicator.hpp"

#include <numeric>
#include <string>

#include "core/errors.hpp"

namespace cocodiff {

void Request::wait() {
  if (impl_) impl_->wait();
}

bool Request::test() { return !impl_ || impl_->test(); }

SimTime Request::completed_at(SimTime seen) const {
  if (!impl_) return seen;
  return impl_->completed_at().value_or(seen);
}

void wait_all(std::span<Request> requests) {
  for (Request& r : requests) r.wait();
}

namespace {
std::vector<std::int64_t> prefix(const std::vector<std::int64_t>& counts) {
  std::vector<std::int64_t> d(counts.size(), 0);
  for (size_t i = 1; i < counts.size(); ++i) d[i] = d[i - 1] + counts[i - 1];
  return d;
}
std::int64_t extent(const std::vector<std::int64_t>& counts,
                    const std::vector<std::int64_t>& displs) {
  std::int64_t e = 0;
  for (size_t i = 0; i < counts.size(); ++i)
    if (counts[i] > 0) e = std::max(e, displs[i] + counts[i]);
  return e;
}
}  // namespace

AllToAllvLayout AllToAllvLayout::packed(std::vector<std::int64_t> send_counts,
                                        std::vector<std::int64_t> recv_counts) {
  AllToAllvLayout l;
  l.send_displs = prefix(send_counts);
  l.recv_displs = prefix(recv_counts);
  l.send_counts = std::move(send_counts);
  l.recv_counts = std::move(recv_counts);
  return l;
}

std::int64_t AllToAllvLayout::send_total() const { return extent(send_counts, send_displs); }
std::int64_t AllToAllvLayout::recv_total() const { return extent(recv_counts, recv_displs); }

void Communicator::check_buffer(std::size_t have, std::int64_t need, const char* what,
                                const char* op) const {
  if (need < 0)
    throw CommError(std::string(op) + " on rank " + std::to_string(rank()) + ": negative count");
  if (have != 0 && static_cast<std::int64_t>(have) < need)
    throw CommError(std::string(op) + " on rank " + std::to_string(rank()) + ": " + what +
                    " buffer holds " + std::to_string(have) + " elements, needs " +
                    std::to_string(need));
}

void Communicator::check_peer(int peer, const char* op) const {
  if (peer < 0 || peer >= size())
    throw CommError(std::string(op) + " on rank " + std::to_string(rank()) + ": peer " +
                    std::to_string(peer) + " outside a group of " + std::to_string(size()));
}

Request Communicator::iall_to_all(std::span<const float> send, std::span<float> recv,
                                  std::int64_t count, std::string_view label) {
  check_buffer(send.size(), count * size(), "send", "all_to_all");
  check_buffer(recv.size(), count * size(), "recv", "all_to_all");
  return do_iall_to_all(send, recv, count, label);
}

Request Communicator::iall_to_allv(std::span<const float> send, std::span<float> recv,
                                   const AllToAllvLayout& layout, std::string_view label) {
  const size_t p = static_cast<size_t>(size());
  if (layout.send_counts.size() != p || layout.recv_counts.size() != p ||
      layout.send_displs.size() != p || layout.recv_displs.size() != p)
    throw CommError("all_to_allv on rank " + std::to_string(rank()) +
                    ": counts and displacements need " + std::to_string(p) + " entries");
  for (size_t i = 0; i < p; ++i)
    if (layout.send_counts[i] < 0 || layout.recv_counts[i] < 0 || layout.send_displs[i] < 0 ||
        layout.recv_displs[i] < 0)
      throw CommError("all_to_allv on rank " + std::to_string(rank()) + ": negative entry");
  check_buffer(send.size(), layout.send_total(), "send", "all_to_allv");
  check_buffer(recv.size(), layout.recv_total(), "recv", "all_to_allv");
  return do_iall_to_allv(send, recv, layout, label);
}

Request Communicator::iall_gather(std::span<const float> send, std::span<float> recv,
                                  std::int64_t count, std::string_view label) {
  check_buffer(send.size(), count, "send", "all_gather");
  check_buffer(recv.size(), count * size(), "recv", "all_gather");
  return do_iall_gather(send, recv, count, label);
}

Request Communicator::iall_reduce(std::span<float> data, std::int64_t count, ReduceOp op,
                                  std::string_view label) {
  check_buffer(data.size(), count, "data", "all_reduce");
  return do_iall_reduce(data, count, op, label);
}

void Communicator::ring_pass(const RingPass& pass) {
  const size_t p = static_cast<size_t>(size());
  if (pass.parts < 1 || pass.labels.size() != static_cast<size_t>(pass.parts) ||
      pass.counts.size() != p || pass.work.size() != p)
    throw CommError("ring_pass on rank " + std::to_string(rank()) +
                    ": expected parts >= 1, one label per part and one count and one charge per "
                    "member (" +
                    std::to_string(p) + "), got parts = " + std::to_string(pass.parts) + ", " +
                    std::to_string(pass.labels.size()) + " labels, " +
                    std::to_string(pass.counts.size()) + " counts and " +
                    std::to_string(pass.work.size()) + " charges");
  for (size_t j = 0; j < p; ++j) {
    check_buffer(0, pass.counts[j], "block", "ring_pass");
    if (pass.data)
      for (int q = 0; q < pass.parts; ++q)
        check_buffer(pass.data(q, static_cast<int>(j)).size(), pass.counts[j], "block",
                     "ring_pass");
  }
  do_ring_pass(pass);
}

void Communicator::do_ring_pass(const RingPass& pass) {
  const int p = size(), r = rank();
  const int right = (r + 1) % p, left = (r - 1 + p) % p;
  auto block = [&pass](int q, int j) { return pass.data ? pass.data(q, j) : std::span<float>(); };
  std::vector<Request> reqs;
  for (int i = 0; i < p; ++i) {
    reqs.clear();
    if (i + 1 < p) {
      const int holder = ((r - i) % p + p) % p, from = ((r - i - 1) % p + p) % p;
      for (int q = 0; q < pass.parts; ++q)
        reqs.push_back(irecv(block(q, from), pass.counts[static_cast<size_t>(from)], left,
                             pass.parts * i + q, pass.labels[static_cast<size_t>(q)]));
      for (int q = 0; q < pass.parts; ++q)
        reqs.push_back(isend(block(q, holder), pass.counts[static_cast<size_t>(holder)], right,
                             pass.parts * i + q, pass.labels[static_cast<size_t>(q)]));
    }
    compute(pass.work[static_cast<size_t>(i)]);
    wait_all(reqs);
  }
}

Request Communicator::isend(std::span<const float> data, std::int64_t count, int dest, int tag,
                            std::string_view label) {
  check_peer(dest, "send");
  check_buffer(data.size(), count, "send", "send");
  return do_isend(data, count, dest, tag, label);
}

Request Communicator::irecv(std::span<float> data, std::int64_t count, int source, int tag,
                            std::string_view label) {
  check_peer(source, "recv");
  check_buffer(data.size(), count, "recv", "recv");
  return do_irecv(data, count, source, tag, label);
}

}  // namespace cocodiff
