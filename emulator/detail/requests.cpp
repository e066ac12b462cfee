// Requests: a point-to-point operation's or a collective's completion, and what a tile's wait or
// test for one does to its clock and accounting.

#include "emulator/detail/kernel.hpp"
#include "emulator/detail/tape_runs.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "core/errors.hpp"

namespace cocodiff::emu::detail {

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
  if (r.owner >= 0) --acct_.tile(r.owner).open_p2p;
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
  if (f.is_main && req.open) req.penalty = transfer_penalty(acct_.tile(f.rank), req);
  f.clock = std::max(f.clock, req.done_time + req.penalty);
  if (f.is_main) {
    TileStats& t = acct_.tile(f.rank);
    close_collective(t, req);
    if (f.clock > before) {
      t.exposed += f.clock - before;
      acct_.tile_event(f.rank, TraceEvent::Kind::kWait, before, f.clock, req.trace_label());
    }
  }
}

bool Kernel::test(FiberState& f, ReqState& req) {
  std::unique_lock<NullLock> lk(state_lock_);
  if (!req.done) {
    // Whether it completes by f.clock is known only once virtual time reaches f.clock.
    timers_.emplace(f.clock, &f);
    block(f, lk, &req, true);
  }
  if (!req.done) return false;
  TileStats& t = acct_.tile(f.rank);
  const SimTime penalty = f.is_main && req.open ? transfer_penalty(t, req) : req.penalty;
  const bool done = req.done_time + penalty <= f.clock;
  if (done && f.is_main) {
    req.penalty = penalty;
    close_collective(t, req);
  }
  return done;
}

SimTime Kernel::transfer_penalty(const TileStats& t, const ReqState& req) const {
  const double factor = device_.overlap_transfer_factor();
  if (factor == 1.0) return SimTime{};
  // The part of the collective that ran beside this tile's compute runs `factor` times slower:
  // at most the compute issued while it was open, at most the collective's own span.
  const SimTime overlapped = std::min(t.overlapped_compute - req.overlap_mark,
                                      req.done_time - std::min(req.done_time, req.started));
  return SimTime::from_ns(std::llround(static_cast<double>(overlapped.ns()) * (factor - 1.0)));
}

void Kernel::close_collective(TileStats& t, ReqState& req) {
  if (!req.open) return;
  req.open = false;
  --t.open_collectives;
}

std::optional<SimTime> Kernel::done_time(const ReqState& req) {
  std::lock_guard<NullLock> lk(state_lock_);
  if (!req.done) return std::nullopt;
  return req.done_time + req.penalty;
}

void Kernel::open_collective(FiberState& parent, ReqState& req) {
  if (!parent.is_main || req.op != ReqState::Op::kCollective) return;
  TileStats& t = acct_.tile(parent.rank);
  req.open = true;
  req.started = parent.clock;
  req.overlap_mark = t.overlapped_compute;
  ++t.open_collectives;
}

}  // namespace cocodiff::emu::detail
