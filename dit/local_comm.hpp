#pragma once
// A one-rank Communicator for serial DiT runs outside any backend (layer tests, benchmarks):
// collectives copy send to recv, compute() tallies the charged FLOPs and bytes, now() is wall
// time since construction.
//
//   LocalComm comm;
//   Tensor y = linear(Exec{comm, false}, x, w, nullptr, "proj");
//   comm.flops();   // 2 * N * in * out

#include <chrono>

#include "core/communicator.hpp"

namespace cocodiff::dit {

class LocalComm final : public Communicator {
 public:
  LocalComm();
  int rank() const override { return 0; }
  int size() const override { return 1; }
  const Topology& topology() const override { return topo_; }
  int world_rank(int group_rank) const override { return group_rank; }
  std::unique_ptr<Communicator> split(int color, int key) override;
  void barrier() override {}
  void compute(const OpCost& cost) override;
  SimTime now() const override;

  /// Totals of everything charged through compute().
  double flops() const { return flops_; }
  double bytes() const { return bytes_; }
  std::int64_t ops() const { return ops_; }
  void reset_counters() { flops_ = bytes_ = 0, ops_ = 0; }

 protected:
  Request do_iall_to_all(std::span<const float> send, std::span<float> recv, std::int64_t count,
                         std::string_view label) override;
  Request do_iall_to_allv(std::span<const float> send, std::span<float> recv,
                          const AllToAllvLayout& layout, std::string_view label) override;
  Request do_iall_gather(std::span<const float> send, std::span<float> recv, std::int64_t count,
                         std::string_view label) override;
  Request do_iall_reduce(std::span<float> data, std::int64_t count, ReduceOp op,
                         std::string_view label) override;
  Request do_isend(std::span<const float> data, std::int64_t count, int dest, int tag,
                   std::string_view label) override;
  Request do_irecv(std::span<float> data, std::int64_t count, int source, int tag,
                   std::string_view label) override;

 private:
  Topology topo_;
  std::chrono::steady_clock::time_point start_;
  double flops_ = 0, bytes_ = 0;
  std::int64_t ops_ = 0;
};

}  // namespace cocodiff::dit
