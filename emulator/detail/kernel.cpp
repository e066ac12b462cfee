// The kernel's event loop: the controller advances virtual time when no fiber can run, in a
// fixed order of events, and reports what a stuck run waits for.

#include "emulator/detail/kernel.hpp"
#include "emulator/detail/collective_runner.hpp"
#include "emulator/detail/message_timing.hpp"
#include "emulator/detail/region_replay.hpp"
#include "emulator/detail/tape_runs.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <new>
#include <thread>

#include "core/errors.hpp"
#include "core/hash.hpp"
#include "emulator/detail/fiber_launch.hpp"
#include "emulator/detail/scheduler.hpp"

namespace cocodiff::emu::detail {

Kernel::Kernel(const Topology& topo, NetworkModel& net, const DeviceModel& device,
               const EngineOptions& options)
    : topo_(topo),
      net_(net),
      device_(device),
      options_(options),
      acct_(topo, device, options),
      fabric_(*this),
      main_stacks_(options.stack_bytes),
      comm_stacks_(options.comm_stack_bytes),
      runner_(std::make_unique<CollectiveRunner>(*this)),
      timing_(std::make_unique<MessageTiming>(*this)),
      regions_(std::make_unique<RegionReplay>(*this)),
      tapes_(std::make_unique<TapeRuns>(*this)),
      sources_{runner_.get(), timing_.get(), &network_, &timer_events_, regions_.get()} {
  const double w = options.wire_bytes_per_element;
  if (w >= 1 && w <= 64 && w == std::floor(w)) wire_whole_ = static_cast<std::int64_t>(w);
  using collectives::CollectiveKind;
  using collectives::find_algorithm;
  const LibraryModel& lib = options.library;  // its names are checked by the Engine
  algorithms_.all_to_all_large = find_algorithm(CollectiveKind::kAllToAll, lib.all_to_all_large);
  algorithms_.all_to_all_small = find_algorithm(CollectiveKind::kAllToAll, lib.all_to_all_small);
  algorithms_.all_gather = find_algorithm(CollectiveKind::kAllGather, lib.all_gather);
  algorithms_.all_reduce = find_algorithm(CollectiveKind::kAllReduce, lib.all_reduce);
  algorithms_.barrier = find_algorithm(CollectiveKind::kBarrier, lib.barrier);
  for (collectives::AlgorithmId id :
       {algorithms_.all_to_all_large, algorithms_.all_to_all_small, algorithms_.all_gather,
        algorithms_.all_reduce, algorithms_.barrier})
    COCO_CHECK(id >= 0, "the Engine let an unregistered algorithm through");
}

Kernel::~Kernel() = default;

const collectives::Schedule& Kernel::group_schedule(
    std::uint64_t ctx, collectives::AlgorithmId algorithm, int size,
    const std::function<std::vector<std::vector<int>>()>& coords) {
  std::unique_ptr<const collectives::Schedule>& s = group_schedules_[{ctx, algorithm}];
  if (s == nullptr) {
    const std::vector<std::vector<int>> c = coords();
    s = collectives::make_schedule(algorithm, collectives::GroupShape{size, c});
  }
  return *s;
}

void Kernel::register_collective(const Group& g, int group_rank, std::uint64_t seq,
                                 std::string_view call) {
  std::lock_guard<NullLock> lk(state_lock_);
  groups_seen_.try_emplace(g.ctx, g);  // copies the group only the first time
  auto key = std::make_pair(g.ctx, seq);
  auto it = collectives_.find(key);
  if (it == collectives_.end()) {
    if (g.members.size() > 1) collectives_.emplace(key, CollectiveEntry{call, group_rank, 1});
    return;
  }
  CollectiveEntry& e = it->second;
  if (e.call != call) {
    const int a = g.members[static_cast<size_t>(e.first_group_rank)];
    const int b = g.members[static_cast<size_t>(group_rank)];
    throw CommError("mismatched collectives on " + g.describe() + ", call #" + std::to_string(seq) +
                    ": rank " + std::to_string(a) + " called " + std::string(e.call) + ", rank " +
                    std::to_string(b) + " called " + std::string(call));
  }
  if (++e.seen == static_cast<int>(g.members.size())) collectives_.erase(it);
}

void Kernel::record_error(int rank, const std::exception_ptr& e) {
  Failure f{rank, SimTime{}, "unknown exception", false};
  try {
    std::rethrow_exception(e);
  } catch (const RankError& ex) {
    f.message = ex.what();
    f.user_error = ex.user_error();
  } catch (const UserError& ex) {
    f.message = ex.what();
    f.user_error = true;
  } catch (const std::bad_alloc&) {  // a resource error, not a bug: the run is too large
    f.message =
        "out of memory while running this tile's share of the model (std::bad_alloc); use "
        "run.math = \"skip\", a smaller model or resolution, or more memory";
    f.user_error = true;
  } catch (const std::exception& ex) {
    f.message = ex.what();
  } catch (...) {
  }
  std::lock_guard<NullLock> lk(state_lock_);
  f.clock = mains_[static_cast<size_t>(rank)]->clock;
  failures_.push_back(std::move(f));
}

std::string Kernel::describe_group(std::uint64_t ctx) const {
  const auto g = groups_seen_.find(ctx);
  return g != groups_seen_.end() ? g->second.describe() : "group " + std::to_string(ctx);
}

std::string Kernel::deadlock_report() const {
  std::vector<const FiberState*> b(blocked_list_.begin(), blocked_list_.end());
  std::sort(b.begin(), b.end(), [](const FiberState* x, const FiberState* y) {
    return std::tie(x->rank, y->is_main, x->waiting_on) <
           std::tie(y->rank, x->is_main, y->waiting_on);
  });
  std::string s = "deadlock: no rank can make progress at virtual time " +
                  std::to_string(net_.now().seconds()) + " s; " + std::to_string(b.size()) +
                  " fiber(s) wait:";
  size_t shown = 0;
  for (const FiberState* f : b) {
    if (++shown > 16) {
      s += "\n  ... and " + std::to_string(b.size() - 16) + " more";
      break;
    }
    s += "\n  rank " + std::to_string(f->rank) + (f->is_main ? "" : " (collective)") +
         " waits in " + (f->waiting_in_test ? "test() of " : "") +
         (f->waiting_on ? f->waiting_on->describe() : std::string("?"));
  }
  fabric_.describe_unmatched(s);
  for (const auto& [key, e] : collectives_) {
    auto g = groups_seen_.find(key.first);
    if (g == groups_seen_.end()) continue;
    s += "\n  collective #" + std::to_string(key.second) + " " + std::string(e.call) + " on " +
         g->second.describe() + ": only " + std::to_string(e.seen) + " of " +
         std::to_string(g->second.members.size()) + " ranks called it";
  }
  return s;
}

bool Kernel::controller_step(std::unique_lock<NullLock>& lk) {
  (void)lk;
  // Completions due now first: the fibers they wake may post before anything later.
  for (EventSource* s : sources_)
    if (s->settle()) return true;
  for (EventSource* s : sources_) s->prepare();
  EventSource* first = nullptr;
  SimTime t = SimTime::max();
  for (EventSource* s : sources_)
    if (const SimTime next = s->next_time(); next < t) {
      t = next;
      first = s;
    }
  if (first == nullptr) return false;  // stuck
  if (first != regions_.get()) last_work_ = std::max(last_work_, t);
  first->fire();
  return true;
}

SimTime Kernel::Network::next_time() const {
  next_ = std::min(k_.net_.next_event_time(), k_.runner_->next_early_finish());
  return next_;
}

void Kernel::Network::fire() {
  k_.fabric_.network_step(next_);
  k_.runner_->finish_early(next_);
}

void Kernel::Timers::fire() {
  const SimTime t = k_.timers_.begin()->first;
  while (!k_.timers_.empty() && k_.timers_.begin()->first == t) {
    FiberState* f = k_.timers_.begin()->second;
    k_.timers_.erase(k_.timers_.begin());
    k_.wake(*f);
  }
}

void Kernel::controller() {
  const StackBounds own_stack = asan_thread_stack();
  std::unique_lock<NullLock> lk(state_lock_);
  while (true) {
    controller_cv_.wait(lk, [this] { return runnable_ == 0; });
    asan_on_stack(own_stack);  // this thread may have run fibers while waiting
    if (live_ == 0) break;
    if (aborting_) {
      // Tear-down: wake everything still blocked; each throws Cancelled and ends.
      tapes_->drop_ready();
      while (!blocked_list_.empty()) wake(*blocked_list_.back());
      timers_.clear();
      continue;
    }
    // Tape runs whose request completed issue their next calls, as their fibers would have on
    // waking; the fibers those calls wake run before the controller steps again.
    if (tapes_->run_ready()) continue;
    if (!controller_step(lk)) {
      if (failures_.empty()) {
        std::string report = deadlock_report();
        failures_.push_back({-1, net_.now(), report, true});
      }
      aborting_ = true;
    }
  }
}

RunResult Kernel::run(const std::function<void(Communicator&)>& tile_main) {
  const int n = topo_.num_ranks();
  const int workers = options_.workers > 0
                          ? options_.workers
                          : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  acct_.start();
  for (int r = 0; r < n; ++r) {
    mains_.push_back(std::make_unique<FiberState>());
    mains_.back()->rank = r;
  }
  const auto wall_start = std::chrono::steady_clock::now();

  // Every fiber runs on the controller's thread; the other workers run the tiles' arithmetic.
  MathPool math(workers - 1);
  math_ = &math;
  ThreadWake wake;
  std::thread controller_thread([&] {
    boost::fibers::use_scheduling_algorithm<ThreadQueueAlgorithm>(wake);
    {
      std::lock_guard<NullLock> lk(state_lock_);
      runnable_ = n;
      live_ = n;
    }
    for (int r = 0; r < n; ++r) {
      FiberState* f = mains_[static_cast<size_t>(r)].get();
      launch_fiber(PooledStack(main_stacks_, f->stack),
                   [this, f, &tile_main] { fiber_main(*f, tile_main); });
    }
    controller();
  });
  controller_thread.join();
  math_ = nullptr;

  rethrow_first_failure();

  RunResult res;
  res.wall_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_start).count();
  acct_.finish(res);
  res.passes_whole = runner_->passes_whole();
  res.regions_replayed = regions_->replayed();
  res.tapes_played = tapes_->played_count();
  res.tapes_run_by_engine = tapes_->run_count();
  return res;
}

bool Kernel::nothing_under_way() const {
  const int n = topo_.num_ranks();
  return live_ == n && runner_->idle() && timing_->idle() && failures_.empty() && fabric_.idle() &&
         timers_.empty() && net_.active_flows() == 0 &&
         std::all_of(acct_.tiles().begin(), acct_.tiles().end(), [](const TileStats& t) {
           return t.timing.open_collectives() == 0;  // no compute slowed by overlap
         });
}

Replay::RegionMark Kernel::begin_region(FiberState& f, std::string_view key, bool may_skip) {
  return regions_->begin(f, key, may_skip, MarkKind::kRegion);
}

Replay::RegionMark Kernel::pass_region(FiberState& f, std::string_view key, bool may_skip,
                                       std::string_view next) {
  return regions_->begin(f, key, may_skip, MarkKind::kPassedRegion, next);
}

Replay::RegionMark Kernel::passed_answer(FiberState& f) { return regions_->passed_answer(f); }

void Kernel::begin_span(FiberState& f, std::string_view key, bool may_skip, std::string_view next) {
  regions_->begin(f, key, may_skip, MarkKind::kSpan, next);
}

void Kernel::arrive_pending(FiberState& f) { regions_->arrive_pending(f); }

void Kernel::run_tape(FiberState& f, TapeRun& run) { tapes_->start(f, run); }

bool Kernel::tape_wait(TapeRun& run, const ReqPtr& req, bool pass) {
  return tapes_->wait(run, req, pass);
}

void Kernel::tape_played() {
  const std::lock_guard<NullLock> lk(state_lock_);
  tapes_->played();
}

void Kernel::message_failed(int rank, SimTime t, const CommError& e) {
  failures_.push_back({rank, t, e.what(), true});
  aborting_ = true;
}

ReqPtr Kernel::start_collective_op(FiberState& f, const std::shared_ptr<const Group>& g,
                                   int group_rank, std::uint64_t seq, ReqPtr req,
                                   const CollectiveSpec& spec) {
  issue_call(f);
  open_collective(f, *req);
  runner_->start(g, group_rank, seq, req, spec, f.clock);
  return req;
}

void Kernel::compute(FiberState& f, const OpCost& cost) {
  charge_compute(f, device_.time(cost), cost.label.empty() ? op_kind_name(cost.kind) : cost.label,
                 cost.kind, cost.shape.kernel);
}

void Kernel::charge_compute(FiberState& f, SimTime dt, std::string_view label, OpKind kind,
                            KernelClass kernel) {
  if (aborting_) throw Cancelled{};
  f.clock = acct_.charge(f.rank, f.clock, dt, label, kind, kernel);
}

void Kernel::issue_call(FiberState& f) {
  if (f.is_main) f.clock = acct_.issue_collective(f.rank, f.clock);
}

void Kernel::block_host(FiberState& f) {
  if (f.is_main) acct_.block_host(f.rank, f.clock);
}

void Kernel::rethrow_first_failure() const {
  if (failures_.empty()) return;
  // Report the failure that happened first in virtual time (ties: lowest rank).
  const Failure& f =
      *std::min_element(failures_.begin(), failures_.end(), [](const Failure& a, const Failure& b) {
        return std::tie(a.clock, a.rank) < std::tie(b.clock, b.rank);
      });
  if (f.rank < 0) throw CommError(f.message);
  if (f.message.rfind("rank ", 0) == 0)
    throw RankError(f.rank, f.message.substr(f.message.find(": ") + 2), f.user_error);
  throw RankError(f.rank, f.message, f.user_error);
}

}  // namespace cocodiff::emu::detail
