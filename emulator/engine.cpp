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
  if (options_.all_to_all_algorithm != "pairwise" && options_.all_to_all_algorithm != "concurrent")
    throw ConfigError("emulator.all_to_all: expected pairwise or concurrent, found \"" +
                      options_.all_to_all_algorithm + "\"");
}

Engine::~Engine() = default;

RunResult Engine::run(const std::function<void(Communicator&)>& tile_main) {
  std::unique_ptr<NetworkModel> net = net_->clone_empty();
  detail::Kernel kernel(topo_, *net, *device_, options_);
  return kernel.run(tile_main);
}

}  // namespace cocodiff::emu
