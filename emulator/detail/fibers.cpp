// Fibers: how a tile's fiber blocks on the simulation and is woken, the fibers that progress a
// collective message by message, and arithmetic handed to the math threads.

#include "emulator/detail/kernel.hpp"
#include "emulator/detail/ring_passes.hpp"

#include <boost/fiber/all.hpp>

#include "core/errors.hpp"
#include "emulator/detail/fiber_launch.hpp"
#include "emulator/emu_comm.hpp"

namespace cocodiff::emu::detail {

void Kernel::block(FiberState& f, std::unique_lock<NullLock>& lk, const ReqState* req,
                   bool in_test) {
  if (aborting_) throw Cancelled{};
  f.waiting_on = req;
  f.waiting_in_test = in_test;
  f.blocked = true;
  f.blocked_index = blocked_list_.size();
  blocked_list_.push_back(&f);
  if (--runnable_ == 0) controller_cv_.notify_one();
  f.ctx = boost::fibers::context::active();
  lk.unlock();
  while (!f.wake) f.ctx->suspend();  // the next ready fiber runs; wake() makes this one ready
  lk.lock();
  asan_on_stack(f.stack);  // back on this fiber's stack, possibly on another thread
  f.wake = false;
  if (aborting_) throw Cancelled{};
}

void Kernel::wake(FiberState& f) {
  COCO_CHECK(f.blocked, "waking a fiber that is not blocked");
  f.blocked = false;
  FiberState* last = blocked_list_.back();
  blocked_list_[f.blocked_index] = last;
  last->blocked_index = f.blocked_index;
  blocked_list_.pop_back();
  f.wake = true;
  ++runnable_;
  boost::fibers::context::active()->schedule(f.ctx);
}

void Kernel::spawn_comm(FiberState& parent, std::function<void(FiberState&)> body, ReqPtr req) {
  issue_call(parent);
  auto state = std::make_shared<FiberState>();
  state->rank = parent.rank;
  state->is_main = false;
  state->clock = parent.clock;
  open_collective(parent, *req);
  {
    std::lock_guard<NullLock> lk(state_lock_);
    ++runnable_;
    ++live_;
  }
  launch_fiber(PooledStack(comm_stacks_, state->stack),
               [this, state, body = std::move(body), req = std::move(req)] {
                 asan_on_stack(state->stack);
                 try {
                   body(*state);
                   std::lock_guard<NullLock> lk(state_lock_);
                   complete(*req, state->clock);
                 } catch (const Cancelled&) {
                 } catch (...) {
                   record_error(state->rank, std::current_exception());
                 }
                 std::lock_guard<NullLock> lk(state_lock_);
                 --live_;
                 if (--runnable_ == 0) controller_cv_.notify_one();
               });
}

void Kernel::fiber_main(FiberState& f, const std::function<void(Communicator&)>& tile_main) {
  asan_on_stack(f.stack);
  try {
    Group world;
    world.ctx = 1;
    world.members.resize(static_cast<size_t>(topo_.num_ranks()));
    for (int i = 0; i < topo_.num_ranks(); ++i) world.members[static_cast<size_t>(i)] = i;
    EmuComm comm(*this, f, std::move(world), f.rank);
    tile_main(comm);
  } catch (const Cancelled&) {
  } catch (...) {
    record_error(f.rank, std::current_exception());
  }
  acct_.tile(f.rank).end = f.clock;
  std::lock_guard<NullLock> lk(state_lock_);
  --live_;
  if (--runnable_ == 0) controller_cv_.notify_one();
}

void Kernel::run_math(FiberState& f, const std::function<void()>& work) {
  if (aborting_) throw Cancelled{};
  math_->run(work, f.stack);
}

void Kernel::ring_pass(FiberState& f, const std::shared_ptr<const Group>& g, int group_rank,
                       std::uint64_t seq, const RingPass& pass, PassRows kept) {
  const ReqPtr req = passes_->start(f, g, group_rank, seq, pass, kept);
  std::unique_lock<NullLock> lk(state_lock_);
  if (!req->done) {
    req->waiter = &f;
    block(f, lk, req.get(), false);
  }
  COCO_CHECK(req->done, "woken before completion");
  // Every charge and wait is already on the tile's accounting: the clock only catches up.
  f.clock = req->done_time;
}

ReqPtr Kernel::ring_pass_start(FiberState& f, const std::shared_ptr<const Group>& g, int group_rank,
                               std::uint64_t seq, const RingPass& pass, PassRows kept) {
  return passes_->start(f, g, group_rank, seq, pass, kept);
}

const PassCosts& Kernel::pass_costs(std::span<const OpCost> work, int group_rank) {
  return passes_->pass_costs(work, group_rank);
}

const std::int64_t* Kernel::pass_counts(std::span<const std::int64_t> counts) {
  return passes_->pass_counts(counts);
}

}  // namespace cocodiff::emu::detail
