#pragma once
// A run over OpenMPI, one process per rank: every rank of an `mpirun -np N` job calls
// run_on_mpi alike, with a plan each resolves itself (the same config, or the same RunSpec).
//
//   MpiRunOptions opt;
//   opt.out = "out/mpi";
//   return run_on_mpi([&] { return resolve_run_plan(config, sets); }, opt);  // exit code
//
// The ranks check that they resolved the same run (one report of the lowest failing rank, not
// one per rank), run the DiT on MPI communicators, and rank 0 writes the outputs: the files
// the emulator writes, with measured wall times in place of modelled ones.

#include <functional>
#include <mutex>
#include <string>

#include "runner/run_plan.hpp"

namespace cocodiff::apps {

/// How one MPI run writes and what the program around it does at its turning points (its
/// signal handling: apps/main.cpp). A hook left empty does nothing.
struct MpiRunOptions {
  std::string out;           // the output directory rank 0 writes
  std::string inject_fault;  // "rank=R,step=S" (RunPlan::fault) or empty
  bool quiet = false;        // print nothing but errors
  bool force = false;        // replace `out` even when it is not an earlier output set
  /// From now on an interrupt ends the rank without a message (while the ranks decide whether
  /// one of them failed, and on the rank that aborts the job, which has said why).
  std::function<void()> quiet_interrupts;
  /// Undoes quiet_interrupts once every rank passed the checks.
  std::function<void()> loud_interrupts;
  /// Held while rank 0 writes outputs: an interrupt waits, so outputs are whole or absent.
  std::function<std::unique_lock<std::mutex>()> hold_interrupts;
};

/// This rank's part of an MPI run of the plan `resolve` returns (called once, on every rank;
/// its ConfigError is reported once, by the lowest failing rank). Blocks until the run ends;
/// returns the process's exit code (errors are printed and give 2, or abort the job). Without
/// MPI in the build: ConfigError.
int run_on_mpi(const std::function<RunPlan()>& resolve, const MpiRunOptions& opt);

}  // namespace cocodiff::apps
