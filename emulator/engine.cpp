#include "emulator/engine.hpp"

#include "core/errors.hpp"
#include "emulator/collectives/registry.hpp"
#include "emulator/detail/kernel.hpp"

namespace cocodiff::emu {

Engine::Engine(Topology topo, std::unique_ptr<NetworkModel> net,
               std::shared_ptr<const DeviceModel> device, EngineOptions options)
    : topo_(std::move(topo)),
      net_(std::move(net)),
      device_(std::move(device)),
      options_(std::move(options)) {
  COCO_CHECK(net_ != nullptr && device_ != nullptr, "engine needs a network and a device model");
  // A forced schedule replaces the library's choice at every size; "library" keeps it.
  using collectives::CollectiveKind;
  const std::string& a2a = options_.all_to_all_algorithm;
  if (a2a != "library") {
    const collectives::AlgorithmId forced =
        collectives::find_algorithm(CollectiveKind::kAllToAll, a2a);
    if (forced < 0)
      throw ConfigError("emulator.all_to_all: expected " +
                        collectives::algorithm_list(CollectiveKind::kAllToAll, ", ") +
                        " or library, found \"" + a2a + "\"");
    options_.library.all_to_all_large = options_.library.all_to_all_small =
        collectives::algorithm(forced).name;
  }
  // A library model built in code names its algorithms too: each must be registered.
  const LibraryModel& lib = options_.library;
  for (const auto& [kind, name] : {std::pair{CollectiveKind::kAllToAll, &lib.all_to_all_large},
                                   std::pair{CollectiveKind::kAllToAll, &lib.all_to_all_small},
                                   std::pair{CollectiveKind::kAllGather, &lib.all_gather},
                                   std::pair{CollectiveKind::kAllReduce, &lib.all_reduce},
                                   std::pair{CollectiveKind::kBarrier, &lib.barrier}})
    if (collectives::find_algorithm(kind, *name) < 0)
      throw ConfigError("library \"" + lib.name + "\": no " +
                        std::string(collectives::collective_kind_name(kind)) +
                        " algorithm is called \"" + *name +
                        "\" (registered: " + collectives::algorithm_list(kind, ", ") + ")");
}

Engine::~Engine() = default;

std::vector<std::string> all_to_all_choices() {
  std::vector<std::string> out{"library"};
  for (std::string& n :
       collectives::algorithm_names(collectives::CollectiveKind::kAllToAll, /*with_aliases=*/true))
    out.push_back(std::move(n));
  return out;
}

RunResult Engine::run(const std::function<void(Communicator&)>& tile_main) {
  check_fiber_stack_limit(topo_.num_ranks());  // refused before a fiber starts
  std::unique_ptr<NetworkModel> net = net_->clone_empty();
  detail::Kernel kernel(topo_, *net, *device_, options_);
  return kernel.run(tile_main);
}

}  // namespace cocodiff::emu
