#pragma once
// Chrome trace (JSON "traceEvents") of a run's virtual timeline, viewable in Perfetto or
// chrome://tracing: one process per node; per tile, "compute" tracks (compute and waits), "send"
// tracks (each transfer it sends, from flow start to completion) and "recv" tracks (each
// transfer it receives), with an arrow from each send to its receive. Operations in flight at
// once are on tracks of their own ("send", "send 2", ...), so the slices of a track never
// overlap: the nesting Perfetto requires of complete ("X") slices.

#include <cstdint>
#include <filesystem>
#include <vector>

#include "core/topology.hpp"
#include "emulator/engine.hpp"

namespace cocodiff::emu {

/// The kind of track a slice is drawn on.
enum class TraceGroup : std::uint8_t { kCompute = 0, kSend = 1, kRecv = 2 };

/// One slice of the trace file: a trace event on one lane of one of a tile's groups.
struct TraceSlice {
  int rank = 0;
  TraceGroup group = TraceGroup::kCompute;
  int lane = 0;             // 0, 1, ...: the lowest lane free when the slice starts
  std::uint32_t event = 0;  // index into RunResult::trace
  SimTime start, end;
};

/// The slices write_chrome_trace draws (a flow is a send slice of its sender and a receive
/// slice of its receiver), ordered by tile, group and start, with their lanes, of the events
/// that end after `from`. Deterministic.
std::vector<TraceSlice> trace_slices(const RunResult& result, int ranks, SimTime from = {});

/// Writes `result.trace` to `path` atomically: the events that end after `from` (zero: all of
/// them; `otherData.from_us` names it). Times are virtual microseconds.
void write_chrome_trace(const RunResult& result, const Topology& topo,
                        const std::filesystem::path& path, SimTime from = {});

}  // namespace cocodiff::emu
