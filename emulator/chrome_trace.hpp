#pragma once
// Chrome trace (JSON "traceEvents") of a run's virtual timeline, viewable in Perfetto or
// chrome://tracing: one process per node, per tile a "compute" lane (compute and waits) and a
// "send" lane (each transfer it sends, from flow start to completion).

#include <filesystem>

#include "core/topology.hpp"
#include "emulator/engine.hpp"

namespace cocodiff::emu {

/// Writes `result.trace` to `path` atomically. Times are virtual microseconds.
void write_chrome_trace(const RunResult& result, const Topology& topo,
                        const std::filesystem::path& path);

}  // namespace cocodiff::emu
