// A job in which rank 1 throws while every other rank waits in a barrier that rank 1 never
// joins: run_guarded must abort the whole job with rank 1's message and exit code 2, not hang.

#include <cstdio>

#include "core/errors.hpp"
#include "mpi_backend/mpi_comm.hpp"

int main(int argc, char** argv) {
  cocodiff::mpi::MpiRuntime runtime(argc, argv);
  return runtime.run_guarded([&] {
    const int p = runtime.world_size();
    auto world = runtime.world(cocodiff::Topology({{"gpu", p, "intra-node"}}));
    world->barrier();
    if (world->rank() == 1)
      throw cocodiff::ConfigError("probe.toml", "run.ranks", "a good value", "boom");
    world->barrier();  // never completes: rank 1 is gone
    std::printf("rank %d passed a barrier it should not have\n", world->rank());
    return 0;
  });
}
