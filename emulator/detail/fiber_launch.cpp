#include "emulator/detail/fiber_launch.hpp"

#include <boost/fiber/fiber.hpp>
#include <memory>
#include <utility>

namespace cocodiff::emu::detail {

void launch_fiber(PooledStack stack, std::function<void()> body) {
  boost::fibers::fiber(std::allocator_arg, stack, std::move(body)).detach();
}

}  // namespace cocodiff::emu::detail
