#pragma once
// The one place the emulator starts Boost fibers. Under ThreadSanitizer this file is compiled
// without instrumentation (emulator/CMakeLists.txt): the Boost templates it instantiates
// (fiber_entry, the fiber record, worker_context::run_) stay on a fiber's stack after the fiber
// ends, and Boost destroys such a context by unwinding that stack from the dispatcher, so their
// function-exit hooks would pop TSan's shadow call stack of the wrong fiber. Instrumented code
// (the body) runs and returns normally inside them.

#include <functional>

#include "emulator/detail/stack_pool.hpp"

namespace cocodiff::emu::detail {

/// Starts a detached fiber running `body` on a stack from `stack`'s pool.
void launch_fiber(PooledStack stack, std::function<void()> body);

}  // namespace cocodiff::emu::detail
