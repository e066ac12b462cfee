#pragma once
// A PNG timeline of a run (a Gantt chart of compute and transfers per tile), drawn by gnuplot.
//
//   std::string why = emu::write_timeline_png(result, topo, "out/timeline.png", {.title = "x"});
//   if (!why.empty()) ...;   // gnuplot missing or failed: no PNG, the reason
//
// The trace is aggregated into time bins per lane before gnuplot sees it, so a run with millions
// of events costs gnuplot the same as a small one. Each lane (a tile, or a group of adjacent
// tiles when there are more than max_lanes) has two rows: the compute stream (compute, and
// exposed communication = waits) and the transfers the lane sends, coloured by topology tier.
// A bin's colour mixes the categories by the share of the bin they occupy (white = idle), so
// overlap (a transfer under compute) and the phases of a hierarchical all-to-all (one tier after
// another) are visible at a glance. A second panel zooms into a short window of the run and
// names the first tile's operations there.

#include <filesystem>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/sim_time.hpp"
#include "core/topology.hpp"
#include "emulator/engine.hpp"

namespace cocodiff::emu {

struct TimelineOptions {
  std::string title;     // first line of the plot title (e.g. model, strategy, cluster)
  int width_px = 1600;   // PNG width
  int max_lanes = 48;    // more tiles than this: adjacent tiles share a lane
  int bins = 1200;       // time bins per panel (the image's horizontal resolution)
  int zoom_events = 48;  // the zoom panel spans about this many compute spans of rank 0
  /// Rank 0's clock at the start of each denoising step: the whole-run panel marks them (a
  /// line and the step's number), so a run of identical steps reads as steps, not a stripe.
  std::vector<SimTime> step_starts;
};

/// How the tiles map to lanes and how large the PNG is, for a topology and options.
struct TimelineLayout {
  int group = 1;  // tiles per lane (adjacent ranks)
  int lanes = 0;
  std::vector<std::string> lane_names;
  int width_px = 0, height_px = 0;
};

/// The lane grouping and the PNG size write_timeline_png uses (deterministic).
TimelineLayout timeline_layout(const Topology& topo, const TimelineOptions& options);

/// One category's share of each bin of each lane row, and its colour.
struct TimelineBins {
  SimTime begin, end;  // the window the bins cover
  int bins = 0, lanes = 0;
  // [lane][bin] shares in [0, 1]; compute row: compute, wait; transfer row: one per tier.
  std::vector<std::vector<double>> compute, wait;
  std::vector<std::vector<std::vector<double>>> tier;  // [tier][lane][bin]
};

/// Aggregates the trace into bins over [begin, end). Transfers of one tile that overlap in time
/// count once per tier (their union), so a share is the fraction of the bin a tier was busy.
TimelineBins bin_timeline(const RunResult& result, const Topology& topo,
                          const TimelineLayout& layout, SimTime begin, SimTime end, int bins);

/// A name written over an operation in the zoom panel.
struct TimelineLabel {
  SimTime at;         // the middle of the operation
  int lane = 0;       // lane 0: the first tile's
  bool send = false;  // on the lane's transfer row, else on its compute row
  std::string text;   // the operation's label
};

/// The operations of the first tile in [begin, end) wide enough at `width_px` pixels for the
/// window to carry their name (compute spans on the compute row, sends on the transfer row),
/// none overlapping another on its row; and, in `names`, every distinct operation name of the
/// first tile in the window in order of first appearance.
std::vector<TimelineLabel> timeline_labels(const RunResult& result, SimTime begin, SimTime end,
                                           int width_px, std::vector<std::string>* names);

/// Path of the gnuplot executable: $COCODIFF_GNUPLOT if set, else `gnuplot` on PATH; empty
/// when none is found.
std::filesystem::path find_gnuplot();

/// `text` as a gnuplot single-quoted string literal that can only ever be data: a quote is
/// doubled and every control character becomes a space (a newline would end the command and
/// start another one, and gnuplot's `!` runs a shell). Single-quoted strings take no backquote
/// or macro substitution.
std::string gnuplot_string(std::string_view text);

/// Runs gnuplot (blocking) on `commands` under `terminal` (such as "pngcairo size 800,600"), in a
/// scratch directory holding `files` (bare name -> bytes), which the commands read by bare name;
/// no path reaches the script. The image goes to `png` atomically. Returns an empty string on
/// success, else why no PNG was written (gnuplot not found, its exit code and the end of its
/// output). For benchmarks' and tune's plots as well as the timeline; every text a user can set
/// goes into `commands` through gnuplot_string.
std::string render_gnuplot_png(const std::string& terminal, const std::string& commands,
                               const std::vector<std::pair<std::string, std::string>>& files,
                               const std::filesystem::path& png);

/// Renders the run's trace to `png` (written atomically: a temporary beside it, then renamed).
/// Returns an empty string on success, else why no PNG was written (no trace events, gnuplot
/// not found, gnuplot failed). Never throws for a missing or failing gnuplot.
std::string write_timeline_png(const RunResult& result, const Topology& topo,
                               const std::filesystem::path& png,
                               const TimelineOptions& options = {});

/// write_timeline_png, printing "cocodiff: warning: timeline.png not written: <why>" to stderr
/// instead of returning the reason. For command-line programs: a missing plot never fails a run.
void write_timeline_png_or_warn(const RunResult& result, const Topology& topo,
                                const std::filesystem::path& png,
                                const TimelineOptions& options = {});

}  // namespace cocodiff::emu
