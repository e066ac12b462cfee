#pragma once
// Step caching: a denoising step whose transformer blocks would change little reuses what they
// added the last time they ran, instead of running them. Two published policies:
//
// - First-Block-Cache (ParaAttention, para_attn/first_block_cache/utils.py; diffusers
//   hooks/first_block_cache.py; cache-dit's DBCache with one front block): run the first block,
//   and compare its residual (output - input, image stream) with that of the last step that ran
//   every block: d = mean|r - r_prev| / mean|r_prev|. Below the threshold, the other blocks are
//   skipped and each stream gets the residual they added on that step (state += cached). The
//   reference residual is only replaced on steps that run every block, so drift accumulates
//   until one runs again. ParaAttention's FLUX example uses 0.08 (faster: 0.12).
// - TeaCache (Liu et al., "Timestep Embedding Tells: It's Time to Cache for Video Diffusion
//   Model", CVPR 2025; ali-vilab/TeaCache, TeaCache4FLUX/teacache_flux.py): before any block,
//   the relative L1 change of the timestep-modulated input of the first block (its norm1 output;
//   Wan: the timestep projection, as TeaCache4Wan2.1 does) against the previous step's,
//   rescaled by a polynomial fitted per model (FLUX.1: 4.98651651e+02, -2.83781631e+02,
//   5.58554382e+01, -3.82021401e+00, 2.64230861e-01), is accumulated; while the sum stays below
//   the threshold the step skips every block (state += the residual of the last full pass), and
//   a step that runs resets it. The first and last steps always run. TeaCache's FLUX thresholds:
//   0.25 (1.5x), 0.4 (1.8x), 0.6 (2.0x), 0.8 (2.25x).
//
// Every rank skips the same steps: the change is summed over the sequence-parallel group (each
// rank's partial sums gathered and added in rank order, so every rank gets the same bits), and a
// step's decision is made on its first forward pass (the conditional one) and kept for the
// step's other passes. Under CFG-parallel the conditional half decides and each of its ranks
// sends the answer to the rank holding the same tokens in the other half. Each pass (true CFG:
// conditional, unconditional) keeps its own cached residuals.
//
// Phantom runs have no tensors to measure: they skip the steps named in `phantom_skipped` (the
// steps a real run of the same policy skipped, from `run.measured_rates`), doing the same
// collectives and charges as the real run.
//
//   StepCache cache(sp, world, peer, opts, steps, phantom);   // once per run, on every rank
//   ex.step_cache = &cache;
//   cache.begin_forward(step, pass);                           // before every transformer pass
//   run_blocks(ex, n, block_fn, {&h, &c}, tea_input);          // in the model's forward

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <string>
#include <vector>

#include "core/communicator.hpp"
#include "core/tensor.hpp"
#include "dit/block_replay.hpp"
#include "dit/exec.hpp"

namespace cocodiff::dit {

/// Config section [step_cache].
struct StepCacheOptions {
  std::string policy = "none";  // "none" | "first_block" | "teacache"
  /// First-Block-Cache: the residual change below which a step skips; TeaCache: the bound of the
  /// accumulated rescaled change. 0: never skip (the run is the exact one: no decision is taken,
  /// nothing is exchanged).
  double threshold = 0;
  /// TeaCache's rescale polynomial, highest power first; empty: the family's published one
  /// (FLUX.1), or none (the raw change) for families TeaCache publishes none for here.
  std::vector<double> coefficients;
  /// Phantom runs: the steps to skip (measured on a real run).
  std::vector<int> phantom_skipped;
  bool active() const { return policy != "none" && threshold > 0; }
};

/// The policy names, for config errors.
const std::vector<std::string>& step_cache_policies();
/// The published threshold of a policy for FLUX: ParaAttention's 0.08 (First-Block-Cache),
/// TeaCache's 0.4 (1.8x); 0 for "none".
double step_cache_default_threshold(const std::string& policy);

/// What the cache did on this rank (the same on every rank).
struct StepCacheStats {
  std::string policy = "none";
  double threshold = 0;
  int steps = 0;
  std::vector<int> skipped;    // steps whose blocks were skipped (first-block: but the first)
  std::vector<double> change;  // per step: the measured change (TeaCache: accumulated), or -1
  int blocks_run = 0;          // transformer blocks run, all passes
  int blocks_total = 0;        // blocks an exact run runs
  bool phantom = false;        // skipped steps came from phantom_skipped
};

class StepCache {
 public:
  /// `sp`: the sequence-parallel group; `world`: where CFG-parallel's halves meet, with `peer`
  /// the world rank holding this rank's tokens in the other half (-1: no CFG-parallel) and
  /// `decides` true on the conditional half. All borrowed.
  StepCache(Communicator& sp, Communicator& world, int peer, bool decides, StepCacheOptions opts,
            int steps, bool phantom);
  bool active() const { return opts_.active(); }
  const StepCacheOptions& options() const { return opts_; }
  /// Before every transformer pass: its step, and its slot (true CFG's pass, CFG-parallel's
  /// branch: 0 conditional, 1 unconditional).
  void begin_forward(int step, int slot);
  /// The blocks of one pass (see run_blocks).
  void run(const Exec& ex, int n, const std::function<void(int)>& block,
           const std::vector<Tensor*>& state, const std::function<Tensor()>& tea_input,
           const BlockKinds& kinds = {});
  StepCacheStats stats() const { return stats_; }

 private:
  struct Slot {
    std::vector<Tensor> residual;  // per state tensor: what the skipped blocks added
    Tensor reference;              // first-block residual / modulated input of the last pass
    bool has_reference = false;
    double accumulated = 0;  // TeaCache
  };
  // Collective over the group: sum|a - b| / sum|b| over every rank's rows.
  double relative_change(const Exec& ex, const Tensor& a, const Tensor& b);
  // The step's decision: this slot measures it, or it was taken by the step's first pass (or
  // the other half), `change` being this pass's measurement (-1: none).
  bool decide(bool wants_skip, double change);
  double rescale(double x) const;

  Communicator& sp_;
  Communicator& world_;
  int peer_;
  bool decides_;
  StepCacheOptions opts_;
  int steps_;
  bool phantom_;
  int step_ = -1, slot_ = 0;
  int decided_step_ = -1;  // the step whose decision is in decided_skip_
  bool decided_skip_ = false;
  std::vector<Slot> slots_;
  StepCacheStats stats_;
};

/// The transformer blocks of one forward pass: block(i) for i < n, each in place on `state`
/// (state[0] the image stream the decision reads, then any other stream the blocks update),
/// through ex.step_cache when it is active (`tea_input` gives TeaCache's indicator; it may be
/// empty for other policies), then end_blocks(ex). `kinds` names each block's kind, so that a
/// phantom run may judge a block where its tiles arrive (BlockReplay::then); it may be empty.
void run_blocks(const Exec& ex, int n, const std::function<void(int)>& block,
                const std::vector<Tensor*>& state, const std::function<Tensor()>& tea_input = {},
                const BlockKinds& kinds = {});

}  // namespace cocodiff::dit
