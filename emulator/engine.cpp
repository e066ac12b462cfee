#include "emulator/engine.hpp"

#include "core/errors.hpp"
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
  const std::string& a2a = options_.all_to_all_algorithm;
  AllToAllAlgorithm forced{};
  if (a2a == "pairwise") {
    forced = AllToAllAlgorithm::kShift;
  } else if (a2a != "library" && !parse_all_to_all_algorithm(a2a, forced)) {
    throw ConfigError(
        "emulator.all_to_all: expected pairwise, xor, concurrent, bruck or library, found \"" +
        a2a + "\"");
  }
  if (a2a != "library")
    options_.library.all_to_all_large = options_.library.all_to_all_small = forced;
}

Engine::~Engine() = default;

RunResult Engine::run(const std::function<void(Communicator&)>& tile_main) {
  check_fiber_stack_limit(topo_.num_ranks());  // refused before a fiber starts
  std::unique_ptr<NetworkModel> net = net_->clone_empty();
  detail::Kernel kernel(topo_, *net, *device_, options_);
  return kernel.run(tile_main);
}

}  // namespace cocodiff::emu
