// consumer CONFIG: runs CONFIG (whose run.strategy is this program's kv_gather) on cocodiff's
// emulator, then the same config with the built-in Ulysses strategy (flat), and checks that the
// two final latents agree (both compute exact attention). Exit 0 when they do, 1 when not,
// 2 on bad input.
#include <cmath>
#include <cocodiff/apps/run_exec.hpp>
#include <cocodiff/apps/run_plan.hpp>
#include <cocodiff/core/errors.hpp>
#include <cocodiff/dit/parallel/strategies.hpp>
#include <cstdio>
#include <cstdlib>
#include <memory>

#include "kv_gather.hpp"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: consumer CONFIG\n");
    return 2;
  }
  setenv("COCODIFF_CONFIG_DIR", CONSUMER_CONFIG_DIR, /*overwrite=*/0);
  namespace apps = cocodiff::apps;
  auto mine = std::make_shared<cocodiff::dit::StrategyRegistry>();
  mine->add("kv_gather", [](cocodiff::Communicator& comm, const cocodiff::dit::ModelConfig&,
                            const cocodiff::dit::StrategyOptions&) {
    return std::make_unique<consumer::KvGather>(comm);
  });
  try {
    const apps::RunPlan plan = apps::resolve_run_plan(argv[1], {}, mine);
    const apps::RunRecord own = apps::run_emulated(plan);
    const apps::RunPlan ref_plan = apps::resolve_run_plan(argv[1], {"run.strategy=flat"});
    const apps::RunRecord ref = apps::run_emulated(ref_plan);
    const double diff = (own.latent.mat() - ref.latent.mat()).norm();
    const double rel = diff / ref.latent.mat().norm();
    std::printf(
        "strategy %s on %d ranks: virtual time %.6f s (flat: %.6f s), relative L2 to flat %.3g\n",
        own.report["strategy"].get<std::string>().c_str(), plan.ranks(),
        own.report["virtual_time_s"].get<double>(), ref.report["virtual_time_s"].get<double>(),
        rel);
    if (!(rel < 1e-5)) {
      std::fprintf(stderr, "consumer: kv_gather and flat disagree (relative L2 %g)\n", rel);
      return 1;
    }
    return 0;
  } catch (const cocodiff::UserError& e) {
    std::fprintf(stderr, "consumer: %s\n", e.what());
    return 2;
  }
}
