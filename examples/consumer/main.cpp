// consumer [CONFIG]: a program of its own on cocodiff's public API (<cocodiff/cocodiff.hpp>).
// It registers an attention strategy (kv_gather) and an all-to-all algorithm of its own,
// describes a run in code (FLUX.1-tiny on one Aurora node cut to 2 GPUs x 2 tiles, real math)
// and runs it on the emulator with kv_gather, then with the built-in Ulysses strategy (flat,
// over its own all-to-all), and checks that the two final latents agree (both compute exact
// attention). Given CONFIG (a run config file, examples/consumer/consumer.toml), it also runs
// the file and checks that the run in code is the same run: equal output and timeline hashes.
// `consumer --mpi OUT` under `mpirun -np 4` runs the run in code over MPI instead, every rank
// alike (cocodiff::run_mpi; rank 0 writes OUT), and rank 0 checks that MPI's output bytes are
// the emulator's. Exit 0 when all agree, 1 when not, 2 on bad input.
#include <cmath>
#include <cocodiff/cocodiff.hpp>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>

#include "kv_gather.hpp"

namespace {

void print(const char* what, const cocodiff::RunResult& r) {
  std::printf("%s: strategy %s on %d ranks: virtual time %.6f s\n", what, r.strategy.c_str(),
              r.ranks, r.virtual_time_s);
  for (const cocodiff::TierBytes& t : r.bytes_by_tier)
    std::printf("  %-12s %lld bytes\n", t.tier.c_str(), static_cast<long long>(t.bytes));
  std::printf("  output   %s\n  timeline %s\n  latent   [%d, %d x %d x %d]\n",
              r.output_sha256.c_str(), r.timeline_sha256.c_str(), r.latent_channels,
              r.latent_frames, r.latent_height, r.latent_width);
}

// ||a - b|| / ||b|| over two latents of one shape.
double relative_l2(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    diff += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    norm += static_cast<double>(b[i]) * b[i];
  }
  return a.size() == b.size() && norm > 0 ? std::sqrt(diff / norm) : INFINITY;
}

// The "output_sha256" field of the report.json in `out`; empty when absent.
std::string reported_output_hash(const std::string& out) {
  std::ifstream in(out + "/report.json");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string key = "\"output_sha256\": \"";
  const size_t at = text.find(key);
  return at == std::string::npos ? "" : text.substr(at + key.size(), 64);
}

// The run in code over MPI (every rank of the job alike); rank 0, which writes `out`, first
// runs it on the emulator and then compares the two outputs' bytes.
int run_over_mpi(const cocodiff::Plan& plan, const std::string& out) {
  const char* rank = std::getenv("OMPI_COMM_WORLD_RANK");
  const bool root = rank == nullptr || std::atoi(rank) == 0;
  std::string emulated;
  if (root) emulated = cocodiff::run(plan).output_sha256;
  if (const int rc = cocodiff::run_mpi(plan, out); rc != 0 || !root) return rc;
  const std::string measured = reported_output_hash(out);
  std::printf("over MPI: %s the emulator's output bytes (%s)\n",
              measured == emulated ? "the same as" : "DIFFERENT from", measured.c_str());
  return measured == emulated ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  const bool mpi = argc == 3 && std::string(argv[1]) == "--mpi";
  if (argc > 2 && !mpi) {
    std::fprintf(stderr, "usage: consumer [CONFIG] | consumer --mpi OUT (under mpirun -np 4)\n");
    return 2;
  }
  setenv("COCODIFF_CONFIG_DIR", CONSUMER_CONFIG_DIR, /*overwrite=*/0);
  cocodiff::Extensions mine;
  mine.add_strategy("kv_gather", [](cocodiff::Communicator& comm, const cocodiff::ModelConfig&,
                                    const cocodiff::StrategyOptions&) {
    return std::make_unique<consumer::KvGather>(comm);
  });
  try {
    // An all-to-all of its own: here the built-in shift schedule under another name.
    namespace coll = cocodiff::emu::collectives;
    cocodiff::register_all_to_all(
        "consumer_shift", "the shift schedule, registered by the consumer",
        coll::algorithm(coll::find_algorithm(coll::CollectiveKind::kAllToAll, "shift")).make);

    cocodiff::RunSpec spec;
    spec.model = "flux1-tiny";
    spec.cluster = "aurora";
    spec.nodes = 1;
    spec.topology_sizes = {2, 2};  // 2 tiles x 2 GPUs
    spec.rank_nic = {0, 1, 2, 3};
    spec.resolution = 256;
    spec.steps = 2;
    spec.seed = 7;
    spec.math = cocodiff::Math::kReal;
    spec.strategy = "kv_gather";
    spec.workers = 1;
    spec.trace = false;
    const cocodiff::Plan plan = cocodiff::make_plan(spec, &mine);
    if (mpi) return run_over_mpi(plan, argv[2]);
    const cocodiff::RunResult own = cocodiff::run(plan);
    print("in code", own);

    cocodiff::RunSpec ref_spec = spec;
    ref_spec.strategy = "flat";
    ref_spec.all_to_all = "consumer_shift";
    const cocodiff::RunResult ref = cocodiff::run(cocodiff::make_plan(ref_spec));
    print("reference", ref);
    const double rel = relative_l2(own.latent, ref.latent);
    std::printf(
        "strategy %s on %d ranks: virtual time %.6f s (flat: %.6f s), relative L2 to flat %.3g\n",
        own.strategy.c_str(), plan.ranks(), own.virtual_time_s, ref.virtual_time_s, rel);
    if (!(rel < 1e-5)) {
      std::fprintf(stderr, "consumer: kv_gather and flat disagree (relative L2 %g)\n", rel);
      return 1;
    }

    if (argc == 2) {
      const cocodiff::RunResult file = cocodiff::run(cocodiff::load_plan(argv[1], {}, &mine));
      const bool same =
          file.output_sha256 == own.output_sha256 && file.timeline_sha256 == own.timeline_sha256;
      std::printf("%s: %s the run in code\n", argv[1], same ? "the same run as" : "DIFFERS from");
      if (!same) return 1;
    }
    return 0;
  } catch (const cocodiff::UserError& e) {
    std::fprintf(stderr, "consumer: %s\n", e.what());
    return 2;
  }
}
