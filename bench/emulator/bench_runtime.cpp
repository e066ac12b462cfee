// The emulator's own cost, in wall time (the simulated times are checked by tests):
//  - Handoff: one message between two tiles on a zero-latency network costs a fiber switch to the
//    receiver, a controller step and a switch back; reported as hand-offs per wall second.
//  - AllToAll/P: one all-to-all of real fp32 data among P tiles (pairwise rounds), reported as
//    payload bytes moved per wall second (bytes_per_second) and flows per second.
// Run: build/bench/emulator/bench_runtime --benchmark_out=runtime.json --benchmark_out_format=json

#include <benchmark/benchmark.h>

#include <thread>

#include "emulator/engine.hpp"

namespace cocodiff {
namespace {

std::shared_ptr<DeviceModel> fast_device() {
  RooflineParams p;
  p.peak_flops_per_s = 1e15;
  p.hbm_bytes_per_s = 1e12;
  return std::make_shared<RooflineDevice>(p);
}

emu::Engine make_engine(int tiles, int gpus, int nodes, int workers) {
  Topology topo(
      {{"tile", tiles, "die-to-die"}, {"gpu", gpus, "intra-node"}, {"node", nodes, "inter-node"}});
  std::vector<LinkCost> tiers = {{SimTime::from_ns(1000), 196e9},
                                 {SimTime::from_ns(2000), 15e9},
                                 {SimTime::from_ns(3000), 25e9}};
  emu::EngineOptions o;
  o.workers = workers;
  o.trace = false;
  return emu::Engine(topo, std::make_unique<AlphaBetaModel>(topo, tiers), fast_device(), o);
}

void Handoff(benchmark::State& state) {
  const int messages = 2000;
  emu::Engine engine = make_engine(2, 1, 1, static_cast<int>(state.range(0)));
  for (auto _ : state) {
    engine.run([&](Communicator& c) {
      float x = 0;
      std::span<float> buf(&x, 1);
      for (int i = 0; i < messages / 2; ++i) {
        if (c.rank() == 0) {
          c.send(buf, 1, 1, 0);
          c.recv(buf, 1, 1, 0);
        } else {
          c.recv(buf, 1, 0, 0);
          c.send(buf, 1, 0, 0);
        }
      }
    });
  }
  state.SetItemsProcessed(state.iterations() * messages);
  // An inverted rate is seconds per unit: counting units of 1e-6 handoffs gives microseconds.
  state.counters["wall_us_per_handoff"] = benchmark::Counter(
      1e-6 * static_cast<double>(messages) * static_cast<double>(state.iterations()),
      benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}

void AllToAll(benchmark::State& state) {
  const int p = static_cast<int>(state.range(0));
  const int workers = static_cast<int>(state.range(1));
  const std::int64_t count = 4096;  // 16 KiB of fp32 per destination
  const int gpus = p >= 12 ? 6 : 1;
  emu::Engine engine = make_engine(2, gpus, p / (2 * gpus), workers);
  std::vector<std::vector<float>> send(static_cast<size_t>(p)), recv(static_cast<size_t>(p));
  for (int r = 0; r < p; ++r) {
    send[static_cast<size_t>(r)].assign(static_cast<size_t>(p * count), static_cast<float>(r));
    recv[static_cast<size_t>(r)].assign(static_cast<size_t>(p * count), 0.f);
  }
  std::uint64_t flows = 0;
  for (auto _ : state) {
    emu::RunResult r = engine.run([&](Communicator& c) {
      c.all_to_all(send[static_cast<size_t>(c.rank())], recv[static_cast<size_t>(c.rank())], count);
    });
    flows += r.flows;
  }
  const double payload = static_cast<double>(p) * (p - 1) * count * sizeof(float);
  state.SetBytesProcessed(
      static_cast<std::int64_t>(payload * static_cast<double>(state.iterations())));
  state.counters["flows_per_s"] =
      benchmark::Counter(static_cast<double>(flows), benchmark::Counter::kIsRate);
}

// The same all-to-all in phantom mode (sizes only): the simulation's own cost per flow.
void AllToAllPhantom(benchmark::State& state) {
  const int p = static_cast<int>(state.range(0));
  const int gpus = p >= 12 ? 6 : 1;
  emu::Engine engine = make_engine(2, gpus, p / (2 * gpus), static_cast<int>(state.range(1)));
  std::uint64_t flows = 0;
  for (auto _ : state) {
    flows += engine.run([&](Communicator& c) { c.all_to_all({}, {}, 1 << 20); }).flows;
  }
  state.counters["flows_per_s"] =
      benchmark::Counter(static_cast<double>(flows), benchmark::Counter::kIsRate);
  state.counters["wall_us_per_flow"] = benchmark::Counter(
      1e-6 * static_cast<double>(flows), benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}

BENCHMARK(Handoff)->Arg(1)->Arg(2)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(AllToAll)
    ->Args({2, 1})
    ->Args({12, 1})
    ->Args({12, 2})
    ->Args({96, 1})
    ->Args({96, 2})
    ->ArgNames({"ranks", "workers"})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(AllToAllPhantom)
    ->Args({96, 1})
    ->Args({96, 2})
    ->Args({384, 1})
    ->ArgNames({"ranks", "workers"})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace cocodiff

BENCHMARK_MAIN();
