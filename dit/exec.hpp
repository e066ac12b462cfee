#pragma once
// The execution context every DiT layer receives: where to charge compute, and whether to do
// the math at all (phantom mode, `math = "skip"`).
//
//   Exec ex{comm, /*phantom=*/false};
//   Tensor y = linear(ex, x, w, b, "qkv");   // math (unless phantom) + one OpCost charge
//
// Each layer function follows the same pattern:  if (!ex.phantom) { math }  ex.charge(cost);
// so real and phantom runs charge identical virtual time for identical shapes.

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/communicator.hpp"
#include "core/op_cost.hpp"

namespace cocodiff::dit {

/// Bytes one element costs in HBM traffic: activations and weights are modelled as bf16.
inline constexpr double kBytesPerElement = 2.0;

class MathCache;
class BlockReplay;
class StepCache;

/// One charge of a computation shared by tiles, kept to be charged again on another tile.
struct RecordedCharge {
  OpKind kind;
  double flops;
  double bytes;
  std::string label;
  KernelShape shape;
  OpCost cost() const { return OpCost{kind, flops, bytes, label, shape}; }
};

struct Exec {
  Communicator& comm;  // charges compute; the strategies use their own group communicators
  bool phantom = false;
  MathCache* cache = nullptr;  // shared by the tiles of a process (packed weights), or none
  std::vector<RecordedCharge>* record = nullptr;  // also keeps every charge here, or none
  BlockReplay* blocks = nullptr;    // transformer blocks as regions of the run, or none
  StepCache* step_cache = nullptr;  // skips a step's blocks (dit/step_cache.hpp), or none
  bool hand_over = true;            // math() may hand work to a math thread
  bool deferred = false;            // charges are only recorded (inside a handed-over section)
  /// The tensor handed to the next ops is a strided view (a head group sliced from a
  /// projection): the first op to read it charges its `_strided` label
  /// (RooflineParams::strided_factor).
  bool strided_input = false;
  /// The model's name (ModelConfig::name): which reference implementation's host profile a
  /// block is issued at (Communicator::host_reference).
  std::string_view model = {};

  /// Runs `work`, arithmetic of about `flops` operations on buffers this tile owns: on one of
  /// the emulator's math threads when it is large enough to pay for the hand-over
  /// (Communicator::run_math), else here. Same bytes either way.
  template <class Work>
  void math(double flops, const Work& work) const {
    if (hand_over && flops >= kMathHandOverFlops)
      comm.run_math(std::cref(work));  // a reference: no copy of the work, no allocation
    else
      work();
  }
  /// Below this many operations, math() runs its work at once (a hand-over costs microseconds).
  static constexpr double kMathHandOverFlops = 1e6;

  /// Charges one operation on this tile. `elements_moved` counts every element read or written;
  /// `shape` is its kernel's, for a device that times kernels by shape.
  void charge(OpKind kind, double flops, double elements_moved, std::string_view label,
              KernelShape shape = {}) const {
    charge(OpCost{kind, flops, elements_moved * kBytesPerElement, label, shape});
  }
  void charge(const OpCost& cost) const {
    record_charge(cost);
    if (!deferred) comm.compute(cost);
  }
  /// Keeps `cost` in `record` (if any) without charging it: for compute that a collective
  /// charges on this tile (RingPass::work).
  void record_charge(const OpCost& cost) const {
    if (record != nullptr)
      record->push_back({cost.kind, cost.flops, cost.bytes, std::string(cost.label), cost.shape});
  }

  /// Runs `body(e)`, a stretch of this tile's work that computes and charges but neither
  /// communicates nor shares work (shared_work), as one piece handed to a math thread when it
  /// is about `flops` operations or more (see math()). Its charges are recorded while it runs
  /// and made on this tile's clock afterwards, in their order: nothing else moves the clock
  /// meanwhile, so the timeline is the one of running it here.
  template <class Body>
  auto section(double flops, const Body& body) const -> decltype(body(*this)) {
    if (!hand_over || phantom || flops < kMathHandOverFlops) return body(*this);
    std::vector<RecordedCharge> charges;
    Exec e = *this;
    e.record = &charges;
    e.hand_over = false;
    e.deferred = true;
    std::optional<decltype(body(*this))> result;
    const auto run = [&] { result.emplace(body(e)); };
    comm.run_math(std::cref(run));
    for (const RecordedCharge& c : charges) {
      if (record != nullptr) record->push_back(c);
      comm.compute(c.cost());
    }
    return std::move(*result);
  }
};

}  // namespace cocodiff::dit
