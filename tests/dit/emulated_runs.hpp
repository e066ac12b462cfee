#pragma once
// What the strategy and video tests share: an emulated cluster of tiles x GPUs x nodes with
// Aurora-like tiers (alpha-beta, no contention), a generate() on every rank of it, the serial
// reference, and a bitwise comparison.

#include <cstring>
#include <mutex>

#include "dit/local_comm.hpp"
#include "dit/pipeline.hpp"
#include "emulator/engine.hpp"
#include "net_models/device_model.hpp"
#include "net_models/network_model.hpp"

namespace cocodiff::dit::test {

inline emu::Engine make_engine(int tiles, int gpus, int nodes, int workers = 2) {
  Topology topo(
      {{"tile", tiles, "die-to-die"}, {"gpu", gpus, "intra-node"}, {"node", nodes, "inter-node"}});
  std::vector<LinkCost> tiers{{SimTime::from_ns(2000), 196e9},
                              {SimTime::from_ns(5000), 15e9},
                              {SimTime::from_ns(10000), 25e9}};
  RooflineParams p;
  p.name = "test-tile";
  p.peak_flops_per_s = 273e12;
  p.hbm_bytes_per_s = 1e12;
  p.launch_overhead = SimTime::from_ns(5000);
  emu::EngineOptions o;
  o.workers = workers;
  o.trace = false;
  return emu::Engine(topo, std::make_unique<AlphaBetaModel>(topo, tiers),
                     std::make_shared<RooflineDevice>(p), o);
}

struct Outcome {
  Tensor latent;  // rank 0's
  emu::RunResult result;
  StrategyStats stats;  // merged over ranks
  int latent_frames = 0;
  StepCacheStats cache;  // rank 0's
};

inline Outcome run(emu::Engine& engine, const ModelConfig& cfg, const Weights& w,
                   const RunSettings& st) {
  Outcome out;
  std::mutex mu;
  std::vector<StrategyStats> stats(static_cast<size_t>(engine.topology().num_ranks()));
  out.result = engine.run([&](Communicator& comm) {
    RunOutput o = generate(comm, cfg, w, st);
    stats[static_cast<size_t>(comm.rank())] = o.strategy_stats;
    if (comm.rank() == 0) {
      std::lock_guard<std::mutex> lock(mu);
      out.latent = std::move(o.latent);
      out.latent_frames = o.latent_frames;
      out.cache = o.step_cache;
    }
  });
  out.stats = stats[0];
  for (size_t i = 1; i < stats.size(); ++i) out.stats.merge(stats[i]);
  return out;
}

inline RunOutput serial_output(const ModelConfig& cfg, const Weights& w, RunSettings st) {
  st.strategy = "serial";
  LocalComm comm;
  return generate(comm, cfg, w, st);
}

inline Tensor serial(const ModelConfig& cfg, const Weights& w, RunSettings st) {
  return serial_output(cfg, w, std::move(st)).latent;
}

inline bool bitwise_equal(const Tensor& a, const Tensor& b) {
  return a.numel() == b.numel() &&
         std::memcmp(a.data().data(), b.data().data(), a.data().size_bytes()) == 0;
}

/// The run on tiles x gpus x nodes with 1, 2 and 4 workers: calls check(first, other, workers)
/// with the 1-worker outcome and each other one.
template <class Check>
void on_one_two_and_four_workers(int tiles, int gpus, int nodes, const ModelConfig& cfg,
                                 const Weights& w, const RunSettings& st, const Check& check) {
  Outcome first;
  for (int workers : {1, 2, 4}) {
    emu::Engine engine = make_engine(tiles, gpus, nodes, workers);
    Outcome r = run(engine, cfg, w, st);
    if (workers == 1)
      first = std::move(r);
    else
      check(first, r, workers);
  }
}

}  // namespace cocodiff::dit::test
