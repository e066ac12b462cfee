// Fibers and requests: how a tile's fiber blocks on the simulation and is woken, the fibers that
// progress a collective message by message, and arithmetic handed to the math threads; a
// point-to-point operation's or a collective's completion, and what a tile's wait or test for one
// does to its clock and accounting.

#include "emulator/detail/collective_runner.hpp"
#include "emulator/detail/fiber_launch.hpp"
#include "emulator/detail/kernel.hpp"
#include "emulator/detail/tape_runs.hpp"
#include "emulator/emu_comm.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include <boost/fiber/all.hpp>

#include "core/errors.hpp"

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
    arrive(f);  // at a span mark it passed last
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
  const ReqPtr req = runner_->start_pass(f, g, group_rank, seq, pass, kept);
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
  return runner_->start_pass(f, g, group_rank, seq, pass, kept);
}

const PassCosts& Kernel::pass_costs(std::span<const OpCost> work, int group_rank) {
  return runner_->pass_costs(work, group_rank);
}

const std::int64_t* Kernel::pass_counts(std::span<const std::int64_t> counts) {
  return runner_->pass_counts(counts);
}

namespace {

std::string describe_ranks(const std::vector<int>& ranks) {
  std::string s;
  for (size_t i = 0; i < ranks.size(); ++i) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (!s.empty()) s += ",";
    s += std::to_string(ranks[i]);
    if (j > i) s += "-" + std::to_string(ranks[j]);
    i = j;
  }
  return s;
}

}  // namespace

std::string Group::describe() const {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%llx", static_cast<unsigned long long>(ctx));
  return "group " + std::string(buf) + " (world ranks " + describe_ranks(members) + ")";
}

std::string ReqState::describe() const {
  std::string s;
  switch (op) {
    case Op::kSend:
      s = "send of " + std::to_string(count) + " elements to rank " + std::to_string(peer);
      break;
    case Op::kRecv:
      s = "recv of " + std::to_string(count) + " elements from rank " + std::to_string(peer);
      break;
    case Op::kCollective:
      s = std::string(call) + " #" + std::to_string(call_seq);
      break;
  }
  if (!label.empty()) s += " ('" + label + "')";
  if (group) s += " on " + group->describe();
  return s;
}

std::string_view ReqState::trace_label() const {
  if (!label.empty()) return label;
  switch (op) {
    case Op::kSend:
      return "send";
    case Op::kRecv:
      return "recv";
    case Op::kCollective:
      return call_text;
  }
  return "?";
}

void Kernel::complete(ReqState& r, SimTime t) {
  COCO_CHECK(!r.done, "request completed twice");
  if (r.owner >= 0) acct_.tile(r.owner).timing.p2p_done();
  r.done = true;
  r.done_time = t;
  if (r.waiter != nullptr) {
    FiberState* w = r.waiter;
    r.waiter = nullptr;
    if (w->tape_run != nullptr && w->tape_run->waiting.get() == &r)
      tapes_->ready(w->tape_run);  // the engine issues its next calls (TapeRuns)
    else
      wake(*w);
  }
}

void Kernel::wait(FiberState& f, ReqState& req) {
  arrive(f);
  const SimTime before = f.clock;
  {
    std::unique_lock<NullLock> lk(state_lock_);
    if (!req.done) {
      req.waiter = &f;
      block(f, lk, &req, false);
    }
    COCO_CHECK(req.done, "woken before completion");
  }
  finish_wait(f, req, before);
}

void Kernel::finish_wait(FiberState& f, ReqState& req, SimTime before) {
  if (f.is_main && req.open) req.penalty = transfer_penalty(acct_.tile(f.rank).timing, req);
  f.clock = std::max(f.clock, req.done_time + req.penalty);
  if (f.is_main) {
    TileClock& c = acct_.tile(f.rank).timing;
    c.close(req);
    if (f.clock > before) {
      c.expose(f.clock - before);
      acct_.tile_event(f.rank, TraceEvent::Kind::kWait, before, f.clock, req.trace_label());
    }
  }
}

bool Kernel::test(FiberState& f, ReqState& req) {
  arrive(f);
  std::unique_lock<NullLock> lk(state_lock_);
  if (!req.done) {
    // Whether it completes by f.clock is known only once virtual time reaches f.clock.
    timers_.emplace(f.clock, &f);
    block(f, lk, &req, true);
  }
  if (!req.done) return false;
  TileClock& c = acct_.tile(f.rank).timing;
  const SimTime penalty = f.is_main && req.open ? transfer_penalty(c, req) : req.penalty;
  const bool done = req.done_time + penalty <= f.clock;
  if (done && f.is_main) {
    req.penalty = penalty;
    c.close(req);
  }
  return done;
}

SimTime Kernel::transfer_penalty(const TileClock& c, const ReqState& req) const {
  return c.transfer_penalty(req, device_.overlap_transfer_factor_for(req.group_ranks()));
}

std::optional<SimTime> Kernel::done_time(const ReqState& req) {
  std::lock_guard<NullLock> lk(state_lock_);
  if (!req.done) return std::nullopt;
  return req.done_time + req.penalty;
}

void Kernel::open_collective(FiberState& parent, ReqState& req) {
  if (!parent.is_main || req.op != ReqState::Op::kCollective) return;
  req.overlap_slot = acct_.overlap_slot(req.group_ranks());
  acct_.tile(parent.rank).timing.open(req, parent.clock, acct_.overlap_slots());
}

}  // namespace cocodiff::emu::detail
