#include "dit/step_cache.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "core/errors.hpp"
#include "dit/block_replay.hpp"

namespace cocodiff::dit {

namespace {

// Tag of the CFG-parallel decision message (point-to-point on the world group).
constexpr int kDecisionTag = 7002;

Tensor copy_of(const Exec& ex, const Tensor& t) {
  Tensor c = t;
  ex.charge(OpKind::kCopy, 0, 2.0 * static_cast<double>(t.numel()), "cache_copy",
            memory_shape(KernelClass::kCopy, t.numel(), t.cols()));
  return c;
}

// a - b (same shape).
Tensor difference(const Exec& ex, const Tensor& a, const Tensor& b) {
  Tensor d = Tensor::uninitialized(a.rows(), a.cols(), ex.phantom);
  if (!ex.phantom) d.mat() = a.mat() - b.mat();
  ex.charge(OpKind::kElementwise, static_cast<double>(a.numel()),
            3.0 * static_cast<double>(a.numel()), "cache_residual",
            memory_shape(KernelClass::kAdd, a.numel(), a.cols()));
  return d;
}

void add_into(const Exec& ex, Tensor& x, const Tensor& r) {
  COCO_CHECK(x.rows() == r.rows() && x.cols() == r.cols(),
             "step cache: residual " + r.shape_str() + " for a stream of " + x.shape_str());
  if (!ex.phantom) x.mat() += r.mat();
  ex.charge(OpKind::kElementwise, static_cast<double>(x.numel()),
            3.0 * static_cast<double>(x.numel()), "cache_apply",
            memory_shape(KernelClass::kAdd, x.numel(), x.cols()));
}

}  // namespace

double step_cache_default_threshold(const std::string& policy) {
  return policy == "first_block" ? 0.08 : policy == "teacache" ? 0.4 : 0.0;
}

const std::vector<std::string>& step_cache_policies() {
  static const std::vector<std::string> names = {"none", "first_block", "teacache"};
  return names;
}

StepCache::StepCache(Communicator& sp, Communicator& world, int peer, bool decides,
                     StepCacheOptions opts, int steps, bool phantom)
    : sp_(sp),
      world_(world),
      peer_(peer),
      decides_(decides),
      opts_(std::move(opts)),
      steps_(steps),
      phantom_(phantom) {
  COCO_CHECK(std::find(step_cache_policies().begin(), step_cache_policies().end(), opts_.policy) !=
                 step_cache_policies().end(),
             "step cache policy " + opts_.policy);
  stats_.policy = opts_.policy;
  stats_.threshold = opts_.threshold;
  stats_.steps = steps;
  stats_.phantom = phantom && active();
  stats_.change.assign(static_cast<size_t>(steps), -1.0);
}

void StepCache::begin_forward(int step, int slot) {
  COCO_CHECK(step >= 0 && step < steps_ && slot >= 0, "StepCache::begin_forward");
  step_ = step;
  slot_ = slot;
  if (static_cast<size_t>(slot) >= slots_.size()) slots_.resize(static_cast<size_t>(slot) + 1);
}

double StepCache::rescale(double x) const {
  if (opts_.coefficients.empty()) return x;
  double y = 0;
  for (const double c : opts_.coefficients) y = y * x + c;  // Horner, highest power first
  return y;
}

double StepCache::relative_change(const Exec& ex, const Tensor& a, const Tensor& b) {
  COCO_CHECK(a.rows() == b.rows() && a.cols() == b.cols(), "step cache: change of unequal shapes");
  // Each rank's two sums travel as the bits of two doubles (four floats), and every rank adds
  // the gathered sums in rank order: the same bits on every rank, whatever the backend.
  std::vector<float> send, recv;
  if (!phantom_) {
    double sums[2] = {(a.mat() - b.mat()).cwiseAbs().cast<double>().sum(),
                      b.mat().cwiseAbs().cast<double>().sum()};
    send.resize(4);
    std::memcpy(send.data(), sums, sizeof sums);
    recv.resize(4 * static_cast<size_t>(sp_.size()));
  }
  ex.charge(OpKind::kElementwise, 3.0 * static_cast<double>(a.numel()),
            2.0 * static_cast<double>(a.numel()), "cache_change",
            memory_shape(KernelClass::kAdd, a.numel(), a.cols()));
  sp_.all_gather(send, recv, 4, "cache_decision_gather");
  if (phantom_) return -1;
  double num = 0, den = 0;
  for (int r = 0; r < sp_.size(); ++r) {
    double sums[2];
    std::memcpy(sums, recv.data() + 4 * static_cast<std::ptrdiff_t>(r), sizeof sums);
    num += sums[0];
    den += sums[1];
  }
  return den > 0 ? num / den : (num > 0 ? HUGE_VAL : 0.0);
}

bool StepCache::decide(bool wants_skip, double change) {
  if (decided_step_ == step_) return decided_skip_;  // a later pass of the step
  bool skip = wants_skip;
  if (peer_ >= 0) {
    // CFG-parallel: the conditional half tells the other half.
    float flag[1] = {wants_skip ? 1.0f : 0.0f};
    std::span<float> buf = phantom_ ? std::span<float>() : std::span<float>(flag);
    if (decides_) {
      world_.isend(buf, 1, peer_, kDecisionTag, "cache_decision").wait();
    } else {
      world_.irecv(buf, 1, peer_, kDecisionTag, "cache_decision").wait();
      skip = phantom_ ? wants_skip : flag[0] != 0.0f;
    }
  }
  decided_step_ = step_;
  decided_skip_ = skip;
  if (skip) stats_.skipped.push_back(step_);
  if (change >= 0) stats_.change[static_cast<size_t>(step_)] = change;
  return skip;
}

void StepCache::run(const Exec& ex, int n_blocks, const std::function<void(int)>& block,
                    const std::vector<Tensor*>& state, const std::function<Tensor()>& tea_input,
                    const BlockKinds& kinds) {
  COCO_CHECK(step_ >= 0 && !state.empty(), "StepCache::run before begin_forward");
  stats_.blocks_total += n_blocks;
  Slot& s = slots_[static_cast<size_t>(slot_)];
  // This pass measures the change unless the step is decided already (a later pass) or the
  // other half decides (CFG-parallel's unconditional half).
  const bool measures = decided_step_ != step_ && (peer_ < 0 || decides_);
  const bool listed = std::find(opts_.phantom_skipped.begin(), opts_.phantom_skipped.end(),
                                step_) != opts_.phantom_skipped.end();
  auto keep_residuals = [&](const std::vector<Tensor>& before) {
    s.residual.clear();
    s.residual.reserve(state.size());
    for (size_t k = 0; k < state.size(); ++k)
      s.residual.push_back(difference(ex, *state[k], before[k]));
  };
  auto snapshot = [&] {
    std::vector<Tensor> c;
    c.reserve(state.size());
    for (Tensor* t : state) c.push_back(copy_of(ex, *t));
    return c;
  };
  auto apply_residuals = [&] {
    COCO_CHECK(s.residual.size() == state.size(), "step cache: a skip before any full pass");
    for (size_t k = 0; k < state.size(); ++k) add_into(ex, *state[k], s.residual[k]);
  };
  int first = 0;  // blocks run before the decision
  bool wants = false;
  double change = -1;
  Tensor measured;
  if (opts_.policy == "first_block") {
    const Tensor in0 = copy_of(ex, *state[0]);
    then_block(ex, kinds, 0, 1);
    block(0);
    end_blocks(ex);  // what follows is not part of the block (replayed blocks hold only theirs)
    first = 1;
    measured = difference(ex, *state[0], in0);
    if (measures && s.has_reference) {
      change = relative_change(ex, measured, s.reference);
      wants = phantom_ ? listed : change < opts_.threshold;
    }
  } else {  // teacache
    COCO_CHECK(static_cast<bool>(tea_input), "TeaCache needs the model's modulated input");
    measured = tea_input();
    if (measures) {
      const bool edge = step_ == 0 || step_ == steps_ - 1 || !s.has_reference;
      if (!edge) {
        const double d = relative_change(ex, measured, s.reference);
        if (!phantom_) s.accumulated += rescale(d);
        change = phantom_ ? -1 : s.accumulated;
        wants = phantom_ ? listed : s.accumulated < opts_.threshold;
      }
      if (!wants) s.accumulated = 0;
      s.reference = measured;  // TeaCache compares consecutive steps
      s.has_reference = true;
    }
  }
  const bool skip = decide(wants, change);
  stats_.blocks_run += first;
  if (skip) {
    apply_residuals();
    return;
  }
  const std::vector<Tensor> before = snapshot();
  for (int i = first; i < n_blocks; ++i) {
    then_block(ex, kinds, i, n_blocks);
    block(i);
  }
  end_blocks(ex);
  stats_.blocks_run += n_blocks - first;
  keep_residuals(before);
  if (opts_.policy == "first_block" && measures) {
    s.reference = std::move(measured);  // replaced on full passes only
    s.has_reference = true;
  }
}

void run_blocks(const Exec& ex, int n, const std::function<void(int)>& block,
                const std::vector<Tensor*>& state, const std::function<Tensor()>& tea_input,
                const BlockKinds& kinds) {
  if (ex.step_cache != nullptr && ex.step_cache->active()) {
    ex.step_cache->run(ex, n, block, state, tea_input, kinds);
  } else {
    for (int i = 0; i < n; ++i) {
      then_block(ex, kinds, i, n);
      block(i);
    }
  }
  end_blocks(ex);
}

}  // namespace cocodiff::dit
