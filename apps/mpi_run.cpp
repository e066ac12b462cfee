// `cocodiff run --backend mpi`: the same plan and DiT code over OpenMPI, one process per rank.
// Every rank resolves the config itself (same files), rank 0 writes the outputs.

#include <chrono>
#include <cstdio>
#include <exception>
#include <iostream>
#include <mutex>
#include <optional>
#include <vector>

#include "apps/commands.hpp"
#include "apps/memory_estimate.hpp"
#include "apps/run_exec.hpp"
#include "apps/run_plan.hpp"
#include "core/errors.hpp"
#include "core/hash.hpp"
#include "dit/pipeline.hpp"

#ifdef COCODIFF_HAVE_MPI
#include "mpi_backend/mpi_comm.hpp"
#endif

namespace cocodiff::apps {

#ifdef COCODIFF_HAVE_MPI
int run_mpi_main(const RunCommandOptions& opt) {
  const std::string& out = opt.out;
  const bool quiet = opt.quiet;
  int argc = 0;
  char** argv = nullptr;
  mpi::MpiRuntime runtime(argc, argv);
  runtime.set_before_abort(quiet_interrupts);  // the aborting rank has said why already
  return runtime.run_guarded([&] {
    const auto wall_start = std::chrono::steady_clock::now();
    // Every rank resolves the config alike: a bad config or rank count fails on all of them,
    // and is reported once, by the lowest failing rank, not once per rank.
    std::optional<RunPlan> resolved;
    std::exception_ptr bad_input;
    try {
      resolved.emplace(resolve_run_plan(opt.config, opt.sets));
      if (!opt.inject_fault.empty()) resolved->fault = parse_fault(opt.inject_fault, *resolved);
      if (resolved->batch_size > 1)
        throw ConfigError(resolved->cfg.where("run.batch_size"), "run.batch_size",
                          "1 on the MPI backend (batches run on the emulator)",
                          std::to_string(resolved->batch_size));
      runtime.check_size(resolved->cluster.topology);
      check_memory_limit(*resolved, estimate_memory(*resolved, "mpi"));
    } catch (...) {
      bad_input = std::current_exception();
    }
    if (const int first = runtime.lowest_failed_rank(bad_input != nullptr); first >= 0) {
      if (first == runtime.world_rank()) std::rethrow_exception(bad_input);
      quiet_interrupts();
      runtime.abort_quietly(2);
    }
    RunPlan& plan = *resolved;
    std::unique_ptr<Communicator> world =
        runtime.world(plan.cluster.topology,
                      mpi::WorldOptions{.check_hosts = plan.mpi_check_hosts,
                                        .progress_timeout_s = plan.mpi_progress_timeout_s});
    const bool root = world->rank() == 0;
    if (root && !quiet) std::cout << describe(plan, "mpi") << std::flush;
    std::shared_ptr<const dit::Weights> weights = weights_for(plan);
    const dit::RunSettings settings = settings_for(plan);
    const auto& mpi_world = dynamic_cast<const mpi::MpiComm&>(*world);
    world->barrier();
    const SimTime t0 = world->now();
    const mpi::Accounting before = mpi_world.accounting();
    dit::RunOutput result;
    try {
      result = dit::generate(*world, plan.model, *weights, settings);
    } catch (const InjectedFault& f) {
      // The faulting rank writes the run's report (status "failed") before it ends the job.
      const std::string message = "rank " + std::to_string(f.rank()) + ": " + f.what();
      {
        const std::unique_lock<std::mutex> hold = hold_interrupts();
        write_fault_report(plan, "mpi", f.rank(), message, out);
      }
      runtime.abort(f.what(), kExitInjectedFault);
    }
    world->barrier();  // its wait counts: a rank that finished early waits for the slowest
    const SimTime t1 = world->now();
    // Per rank: sampling wall time, time blocked in communication, bytes sent per tier.
    const mpi::Accounting after = mpi_world.accounting();
    const int tiers = plan.cluster.topology.num_tiers();
    std::vector<double> mine{(t1 - t0).seconds(), after.comm_wait_s - before.comm_wait_s};
    for (int k = 0; k < tiers; ++k)
      mine.push_back(static_cast<double>(after.sent_bytes_by_tier[static_cast<size_t>(k)] -
                                         before.sent_bytes_by_tier[static_cast<size_t>(k)]));
    std::vector<double> all(root ? mine.size() * static_cast<size_t>(world->size()) : 0);
    MPI_Gather(mine.data(), static_cast<int>(mine.size()), MPI_DOUBLE, all.data(),
               static_cast<int>(mine.size()), MPI_DOUBLE, 0, MPI_COMM_WORLD);
    if (root) {
      RunRecord rec;
      nlohmann::ordered_json& r = rec.report;
      r = base_report(plan, "mpi");
      r["network"] = nullptr;  // real MPI: no network or device model
      r["device"] = nullptr;
      r["virtual_time_s"] = nullptr;  // measured, not modelled: see the wall-clock fields
      r["wall_time_s"] =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_start).count();
      r["phases_wall_s"] = {{"setup_s", t0.seconds()}, {"sampling_s", (t1 - t0).seconds()}};
      // Measured counterparts of the emulator's fields: payload bytes each rank sent, summed
      // per tier (fp32 on the wire), and each rank's sampling time split into time blocked in
      // communication and the rest (computing, packing, posting).
      const size_t w = mine.size();
      nlohmann::ordered_json per_tier = nlohmann::ordered_json::object();
      for (int k = 0; k < tiers; ++k) {
        double b = 0;
        for (int i = 0; i < world->size(); ++i) b += all[static_cast<size_t>(i) * w + 2 + k];
        per_tier[plan.cluster.topology.tier_name(k)] = static_cast<std::int64_t>(b);
      }
      r["bytes_by_tier"] = per_tier;
      r["wire_bytes_per_element"] = 4;
      size_t crit = 0;
      double compute_sum = 0, wait_sum = 0;
      const auto busy = [&](size_t i) { return all[i * w] - all[i * w + 1]; };
      for (size_t i = 0; i < static_cast<size_t>(world->size()); ++i) {
        if (busy(i) > busy(crit)) crit = i;
        compute_sum += busy(i);
        wait_sum += all[i * w + 1];
      }
      const double ranks = world->size();
      r["breakdown"] = {
          {"critical_rank", crit},
          {"compute_s", busy(crit)},
          {"exposed_comm_s", all[crit * w + 1]},
          {"exposed_comm_fraction", all[crit * w] > 0 ? all[crit * w + 1] / all[crit * w] : 0.0},
          {"mean_compute_s", compute_sum / ranks},
          {"mean_exposed_comm_s", wait_sum / ranks},
          {"note",
           "wall time of the sampling loop: exposed_comm is time blocked in MPI waits and "
           "barriers, compute the rest; critical_rank: the rank that waited least"}};
      r["output_sha256"] = plan.settings.phantom
                               ? nlohmann::ordered_json(nullptr)
                               : nlohmann::ordered_json(sha256_hex(result.latent.data()));
      r["timeline_sha256"] = nullptr;
      rec.latent = std::move(result.latent);
      rec.latent_height = result.latent_height;
      rec.latent_width = result.latent_width;
      {
        const std::unique_lock<std::mutex> hold = hold_interrupts();  // no half-written outputs
        write_outputs(plan, rec, out);
      }
      if (!quiet) std::cout << summarize(rec) << "outputs in " << out << "/\n";
    }
    return 0;
  });
}
#else
int run_mpi_main(const RunCommandOptions&) {
  throw ConfigError("--backend mpi: this cocodiff was built without MPI (COCODIFF_WITH_MPI=OFF)");
}
#endif

}  // namespace cocodiff::apps
