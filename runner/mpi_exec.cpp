// A run over OpenMPI, one process per rank (`cocodiff run --backend mpi`, cocodiff::run_mpi): the
// same plan and DiT code as on the emulator. Every rank resolves the plan itself, rank 0 writes
// the outputs.

#include "runner/mpi_exec.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <exception>
#include <iostream>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "core/atomic_file.hpp"
#include "core/errors.hpp"
#include "core/hash.hpp"
#include "dit/pipeline.hpp"
#include "runner/memory_estimate.hpp"
#include "runner/run_exec.hpp"
#include "runner/run_plan.hpp"

#ifdef COCODIFF_HAVE_MPI
#include "mpi_backend/mpi_comm.hpp"
#endif

#ifndef COCODIFF_VERSION
#define COCODIFF_VERSION "unknown"
#endif

namespace cocodiff::apps {

#ifdef COCODIFF_HAVE_MPI
namespace {

/// Flattens a TOML table into "dotted.key" -> value as TOML writes it.
void flatten(const toml::table& t, const std::string& prefix,
             std::map<std::string, std::string>& out) {
  for (const auto& [k, v] : t) {
    const std::string key =
        prefix.empty() ? std::string(k.str()) : prefix + "." + std::string(k.str());
    if (const toml::table* sub = v.as_table(); sub != nullptr) {
      flatten(*sub, key, out);
      continue;
    }
    std::ostringstream os;
    v.visit([&](const auto& node) { os << node; });
    out[key] = os.str();
  }
}

/// What makes this rank's run: the program's version, --inject-fault and every resolved config
/// key with the value it got, one "key = value" line each. The emulator's keys are left out: the
/// MPI backend does not read them, and their defaults depend on the host (emulator.workers).
std::string run_identity(const RunPlan& plan, const MpiRunOptions& opt) {
  std::map<std::string, std::string> keys;
  const std::string effective = plan.cfg.dump_effective();
  try {
    flatten(toml::parse(effective), "", keys);
  } catch (const std::exception&) {  // not expected: then the text itself is compared
    keys["(config)"] = effective;
  }
  std::erase_if(keys, [](const auto& kv) { return kv.first.rfind("emulator.", 0) == 0; });
  keys["(cocodiff version)"] = COCODIFF_VERSION;
  keys["(--inject-fault)"] = opt.inject_fault.empty() ? "none" : opt.inject_fault;
  std::string text;
  for (const auto& [k, v] : keys) {
    text += k;
    text += " = ";
    text += v;
    text += "\n";
  }
  return text;
}

std::map<std::string, std::string> parse_identity(const std::string& text) {
  std::map<std::string, std::string> keys;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    const size_t eq = line.find(" = ");
    if (eq != std::string::npos) keys[line.substr(0, eq)] = line.substr(eq + 3);
  }
  return keys;
}

/// "2" or "0-3" or "0, 2-3".
std::string rank_list(const std::vector<int>& ranks) {
  std::string s;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    s += (s.empty() ? "" : ", ") + std::to_string(ranks[i]);
    if (j > i) s += (j == i + 1 ? ", " : "-") + std::to_string(ranks[j]);
    i = j + 1;
  }
  return (ranks.size() == 1 ? "rank " : "ranks ") + s;
}

/// Collective over MPI_COMM_WORLD: every rank compares a digest of its run_identity(); when
/// they differ, rank 0 gathers them and returns the message naming the ranks and the keys that
/// differ (other ranks get a non-empty placeholder). Empty when every rank runs the same run.
std::string compare_runs(const std::string& identity, int rank, int size) {
  Sha256 h;
  h.update(identity);
  const std::string mine = h.hex();  // 64 characters
  std::vector<char> all(static_cast<size_t>(size) * 64);
  MPI_Allgather(mine.data(), 64, MPI_CHAR, all.data(), 64, MPI_CHAR, MPI_COMM_WORLD);
  std::vector<std::string> digests;
  digests.reserve(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r) digests.emplace_back(all.data() + std::ptrdiff_t{64} * r, 64);
  if (std::all_of(digests.begin(), digests.end(),
                  [&](const std::string& d) { return d == digests[0]; }))
    return {};
  // They differ: rank 0 gathers every identity to say how.
  int length = static_cast<int>(identity.size());
  std::vector<int> lengths(static_cast<size_t>(rank == 0 ? size : 0));
  MPI_Gather(&length, 1, MPI_INT, lengths.data(), 1, MPI_INT, 0, MPI_COMM_WORLD);
  std::vector<int> offsets(lengths.size());
  int total = 0;
  for (size_t r = 0; r < lengths.size(); ++r) {
    offsets[r] = total;
    total += lengths[r];
  }
  std::vector<char> texts(static_cast<size_t>(total));
  MPI_Gatherv(identity.data(), length, MPI_CHAR, texts.data(), lengths.data(), offsets.data(),
              MPI_CHAR, 0, MPI_COMM_WORLD);
  if (rank != 0) return "differ";
  // Groups of ranks with equal digests, in the order of their lowest rank.
  std::vector<std::vector<int>> groups;
  std::vector<std::string> group_digest;
  for (int r = 0; r < size; ++r) {
    const auto it =
        std::find(group_digest.begin(), group_digest.end(), digests[static_cast<size_t>(r)]);
    if (it == group_digest.end()) {
      group_digest.push_back(digests[static_cast<size_t>(r)]);
      groups.push_back({r});
    } else {
      groups[static_cast<size_t>(it - group_digest.begin())].push_back(r);
    }
  }
  const auto identity_of = [&](int r) {
    return parse_identity(std::string(texts.data() + offsets[static_cast<size_t>(r)],
                                      static_cast<size_t>(lengths[static_cast<size_t>(r)])));
  };
  const std::map<std::string, std::string> base = identity_of(groups[0][0]);
  std::string msg =
      "the ranks do not run the same run (every rank must get the same config, "
      "--set values, --inject-fault and cocodiff build):";
  for (size_t g = 1; g < groups.size(); ++g) {
    const std::map<std::string, std::string> other = identity_of(groups[g][0]);
    std::set<std::string> keys;
    for (const auto& [k, v] : base) keys.insert(k);
    for (const auto& [k, v] : other) keys.insert(k);
    std::string diff;
    int shown = 0, differing = 0;
    for (const std::string& k : keys) {
      const auto a = base.find(k), b = other.find(k);
      const std::string va = a == base.end() ? "(absent)" : a->second;
      const std::string vb = b == other.end() ? "(absent)" : b->second;
      if (va == vb) continue;
      ++differing;
      if (shown == 8) continue;
      if (!diff.empty()) diff += ", ";
      diff += k;
      diff += " (";
      diff += va;
      diff += " vs ";
      diff += vb;
      diff += ")";
      ++shown;
    }
    if (differing > shown) diff += " and " + std::to_string(differing - shown) + " more";
    msg += " " + rank_list(groups[g]) + " differ from " + rank_list(groups[0]) + " in " + diff +
           (g + 1 < groups.size() ? ";" : "");
  }
  return msg;
}

/// Calls `hook` where the program gave one.
void call(const std::function<void()>& hook) {
  if (hook) hook();
}

/// Held while rank 0 writes outputs (MpiRunOptions::hold_interrupts), where the program gave it.
std::unique_lock<std::mutex> hold(const MpiRunOptions& opt) {
  return opt.hold_interrupts ? opt.hold_interrupts() : std::unique_lock<std::mutex>();
}

/// Every rank resolves the plan alike: a bad config or rank count fails on all of them, and is
/// reported once, by the lowest failing rank, not once per rank.
RunPlan resolve_on_every_rank(mpi::MpiRuntime& runtime, const std::function<RunPlan()>& resolve,
                              const MpiRunOptions& opt) {
  std::optional<RunPlan> resolved;
  std::exception_ptr bad_input;
  try {
    resolved.emplace(resolve());
    if (!opt.inject_fault.empty()) resolved->fault = parse_fault(opt.inject_fault, *resolved);
    if (resolved->batch_size > 1)
      throw ConfigError(resolved->cfg.where("run.batch_size"), "run.batch_size",
                        "1 on the MPI backend (batches run on the emulator)",
                        std::to_string(resolved->batch_size));
    runtime.check_size(resolved->cluster.topology);
    check_memory_limit(*resolved, estimate_memory(*resolved, "mpi"));
    if (runtime.world_rank() == 0) check_output_target(opt.out, opt.force);  // rank 0 writes
  } catch (...) {
    bad_input = std::current_exception();
  }
  // Quiet while the ranks decide: the lowest failing rank may abort the job (and the launcher
  // end every other rank) before another has returned from the decision.
  call(opt.quiet_interrupts);
  if (const int first = runtime.lowest_failed_rank(bad_input != nullptr); first >= 0) {
    if (first == runtime.world_rank()) std::rethrow_exception(bad_input);
    runtime.abort_quietly(2);
  }
  // Every rank resolved its config alike; now they must also have resolved the same run
  // (mpirun's MPMD form, or a host with other configs, could give ranks different ones).
  if (const std::string differ =
          compare_runs(run_identity(*resolved, opt), runtime.world_rank(), runtime.world_size());
      !differ.empty()) {
    if (runtime.world_rank() == 0) throw ConfigError(differ);
    runtime.abort_quietly(2);
  }
  return std::move(*resolved);
}

/// The world communicator. Hosts that do not match the topology: every rank sees the same
/// gathered placement and fails alike; the lowest one says so, once, with the key that skips
/// the check.
std::unique_ptr<Communicator> make_world(mpi::MpiRuntime& runtime, const RunPlan& plan) {
  std::unique_ptr<Communicator> world;
  std::exception_ptr misplaced;
  try {
    world = runtime.world(plan.cluster.topology,
                          mpi::WorldOptions{.check_hosts = plan.mpi_check_hosts,
                                            .progress_timeout_s = plan.mpi_progress_timeout_s,
                                            .progress_auto = plan.mpi_progress_auto,
                                            .progress_floor_s = plan.mpi_progress_floor_s,
                                            .progress_multiple = plan.mpi_progress_multiple});
  } catch (const CommError& e) {
    misplaced = std::make_exception_ptr(CommError(
        std::string(e.what()) +
        "; or --set mpi.check_hosts=false to run the topology on these hosts anyway (its "
        "nodes' ranks then share hosts, e.g. a multi-node config's MPI path on one machine)"));
  }
  if (const int first = runtime.lowest_failed_rank(misplaced != nullptr); first >= 0) {
    if (first == runtime.world_rank()) std::rethrow_exception(misplaced);
    runtime.abort_quietly(2);
  }
  return world;
}

/// What one rank's sampling loop gave: its output, its start and end on the world's clock, and
/// its measurements (sampling seconds, seconds blocked in communication, bytes sent per tier).
struct Sampled {
  dit::RunOutput result;
  SimTime t0, t1;
  std::vector<double> mine;
};

/// Runs the sampling loop between two barriers (a rank that finished early waits for the
/// slowest). An injected fault: the faulting rank writes the run's report (status "failed")
/// and ends the job.
Sampled sample(mpi::MpiRuntime& runtime, Communicator& world, const RunPlan& plan,
               const MpiRunOptions& opt) {
  std::shared_ptr<const dit::Weights> weights = weights_for(plan);
  const auto& mpi_world = dynamic_cast<const mpi::MpiComm&>(world);
  dit::RunSettings settings = settings_for(plan);
  // Every step start is a mark for the progress watchdog's derived bound.
  settings.on_step = [&mpi_world, hook = settings.on_step](int rank, int step) {
    mpi_world.step_started();
    if (hook) hook(rank, step);
  };
  Sampled s;
  world.barrier();
  s.t0 = world.now();
  const mpi::Accounting before = mpi_world.accounting();
  try {
    s.result = dit::generate(world, plan.model, *weights, settings);
  } catch (const InjectedFault& f) {
    const std::string message = "rank " + std::to_string(f.rank()) + ": " + f.what();
    {
      const std::unique_lock<std::mutex> held = hold(opt);
      write_fault_report(plan, "mpi", f.rank(), message, opt.out, opt.force);
    }
    runtime.abort(f.what(), kExitInjectedFault);
  }
  world.barrier();  // its wait counts
  s.t1 = world.now();
  const mpi::Accounting after = mpi_world.accounting();
  const int tiers = plan.cluster.topology.num_tiers();
  s.mine = {(s.t1 - s.t0).seconds(), after.comm_wait_s - before.comm_wait_s};
  for (int k = 0; k < tiers; ++k)
    s.mine.push_back(static_cast<double>(after.sent_bytes_by_tier[static_cast<size_t>(k)] -
                                         before.sent_bytes_by_tier[static_cast<size_t>(k)]));
  return s;
}

/// The measured counterparts of the emulator's bytes_by_tier: the elements each rank handed MPI
/// for each destination, summed per tier, in the emulator's unit (the run's
/// emulator.wire_bytes_per_element an element, not the fp32 MPI moves). The emulator counts each
/// hop of the algorithm it emulates (a ring all-gather's neighbour hops); MPI's own routing is
/// not seen here, so the tiers of a collective MPI routes otherwise can differ, while the total
/// is the same. `all`: every rank's Sampled::mine, `w` numbers each.
void add_bytes(const RunPlan& plan, const std::vector<double>& all, size_t w, int ranks,
               nlohmann::ordered_json& r) {
  const int tiers = plan.cluster.topology.num_tiers();
  const double wire = plan.engine.wire_bytes_per_element;
  nlohmann::ordered_json per_tier = nlohmann::ordered_json::object();
  double fp32_total = 0;
  for (int k = 0; k < tiers; ++k) {
    double b = 0;
    for (int i = 0; i < ranks; ++i) b += all[static_cast<size_t>(i) * w + 2 + k];
    fp32_total += b;
    per_tier[plan.cluster.topology.tier_name(k)] = std::llround(b / 4.0 * wire);
  }
  r["bytes_by_tier"] = per_tier;
  r["wire_bytes_per_element"] = wire;
  r["bytes_by_tier_counts"] = "the payload each rank handed MPI for each destination";
  r["mpi_fp32_bytes"] = static_cast<std::int64_t>(fp32_total);
}

/// Each rank's sampling time split into time blocked in communication and the rest
/// (computing, packing, posting); the critical rank is the one that waited least.
nlohmann::ordered_json breakdown(const std::vector<double>& all, size_t w, int ranks) {
  size_t crit = 0;
  double compute_sum = 0, wait_sum = 0, wait_min = all[1], wait_max = all[1];
  const auto busy = [&](size_t i) { return all[i * w] - all[i * w + 1]; };
  for (size_t i = 0; i < static_cast<size_t>(ranks); ++i) {
    if (busy(i) > busy(crit)) crit = i;
    compute_sum += busy(i);
    wait_sum += all[i * w + 1];
    wait_min = std::min(wait_min, all[i * w + 1]);
    wait_max = std::max(wait_max, all[i * w + 1]);
  }
  const double n = ranks;
  return {{"critical_rank", crit},
          {"compute_s", busy(crit)},
          {"exposed_comm_s", all[crit * w + 1]},
          {"exposed_comm_fraction", all[crit * w] > 0 ? all[crit * w + 1] / all[crit * w] : 0.0},
          {"mean_compute_s", compute_sum / n},
          {"mean_exposed_comm_s", wait_sum / n},
          {"min_exposed_comm_s", wait_min},
          {"max_exposed_comm_s", wait_max},
          {"note",
           "wall time of the sampling loop: exposed_comm is time blocked in MPI waits and "
           "barriers, compute the rest; critical_rank: the rank that waited least"}};
}

/// Rank 0's record of the run: the report (measured times, bytes and breakdown in place of the
/// emulator's modelled ones) and the latent. `all`: every rank's Sampled::mine.
RunRecord mpi_record(const RunPlan& plan, Sampled& s, const std::vector<double>& all, int ranks,
                     double wall_s) {
  RunRecord rec;
  nlohmann::ordered_json& r = rec.report;
  r = base_report(plan, "mpi");
  r["network"] = nullptr;  // real MPI: no network or device model
  r["device"] = nullptr;
  r["virtual_time_s"] = nullptr;  // measured, not modelled: see the wall-clock fields
  r["wall_time_s"] = wall_s;
  r["phases_wall_s"] = {{"setup_s", s.t0.seconds()}, {"sampling_s", (s.t1 - s.t0).seconds()}};
  add_bytes(plan, all, s.mine.size(), ranks, r);
  r["breakdown"] = breakdown(all, s.mine.size(), ranks);
  r["output_sha256"] = plan.settings.phantom
                           ? nlohmann::ordered_json(nullptr)
                           : nlohmann::ordered_json(sha256_hex(s.result.latent.data()));
  r["timeline_sha256"] = nullptr;
  // The step cache's skips are the same on every rank; V-Major's rates are rank 0's.
  add_measured(plan, s.result.step_cache, s.result.strategy_stats, r);
  rec.latent = std::move(s.result.latent);
  rec.latent_frames = s.result.latent_frames;
  rec.latent_height = s.result.latent_height;
  rec.latent_width = s.result.latent_width;
  return rec;
}

}  // namespace

int run_on_mpi(const std::function<RunPlan()>& resolve, const MpiRunOptions& opt) {
  int argc = 0;
  char** argv = nullptr;
  mpi::MpiRuntime runtime(argc, argv);
  runtime.set_before_abort(opt.quiet_interrupts);  // the aborting rank has said why already
  return runtime.run_guarded([&] {
    const auto wall_start = std::chrono::steady_clock::now();
    RunPlan plan = resolve_on_every_rank(runtime, resolve, opt);
    std::unique_ptr<Communicator> world = make_world(runtime, plan);
    call(opt.loud_interrupts);  // every rank passed the checks: an interrupt from here on says so
    const bool root = world->rank() == 0;
    if (root && !opt.quiet) std::cout << describe(plan, "mpi") << std::flush;
    Sampled s = sample(runtime, *world, plan, opt);
    std::vector<double> all(root ? s.mine.size() * static_cast<size_t>(world->size()) : 0);
    MPI_Gather(s.mine.data(), static_cast<int>(s.mine.size()), MPI_DOUBLE, all.data(),
               static_cast<int>(s.mine.size()), MPI_DOUBLE, 0, MPI_COMM_WORLD);
    if (!root) return 0;
    const double wall_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_start).count();
    const RunRecord rec = mpi_record(plan, s, all, world->size(), wall_s);
    {
      const std::unique_lock<std::mutex> held = hold(opt);  // no half-written outputs
      write_outputs(plan, rec, opt.out, opt.force);
    }
    if (!opt.quiet) std::cout << summarize(rec) << "outputs in " << opt.out << "/\n";
    return 0;
  });
}
#else
int run_on_mpi(const std::function<RunPlan()>&, const MpiRunOptions&) {
  throw ConfigError("--backend mpi: this cocodiff was built without MPI (COCODIFF_WITH_MPI=OFF)");
}
#endif

}  // namespace cocodiff::apps
