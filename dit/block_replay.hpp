#pragma once
// Transformer blocks as regions of the run (Replay::begin_region), where the backend offers
// replay (the emulator). In phantom mode a block's work is a function of its kind (the model's
// name for blocks that do the same work) and of the strategy's state
// (AttentionStrategy::next_block), so the emulator may replay a
// block it has already simulated from the same start state (the tiles' clock offsets, nothing
// in flight) instead of simulating it again: the 57 blocks of a FLUX step are two kinds, and
// after a few blocks their start states repeat. A rank's BlockReplay keeps what a simulated
// block did beyond the emulator's own accounting (the strategy's statistics), so that a
// replayed block adds the same. A block that exchanges its layers for the first time (V-Major
// counts their cache) does the same work as one that does not: both share a region key, and a
// replayed block adds the cache bytes a simulated first exchange of its kind added, or none.
// Until such a figure is known, a first exchange keys a region of its own (so it is simulated).
// Real math marks the same regions and never replays.
//
//   BlockReplay blocks(attn, *replay_of(world), phantom);
//   ex.blocks = &blocks;
//   for (int i = 0; i < n; ++i) run_block(ex, "flux single", 1, [&] { single_block(ex, i); });
//   end_blocks(ex);                            // after the last block of a pass
//   stats.merge(blocks.replayed());            // what the replayed blocks measured

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/replay.hpp"
#include "dit/attention_strategy.hpp"
#include "dit/exec.hpp"

namespace cocodiff::dit {

/// The strategy statistics added between two snapshots (sums only: the V-Major cache size is a
/// high-water mark, and ranks are not added).
StrategyStats stats_added(const StrategyStats& after, const StrategyStats& before);

class BlockReplay {
 public:
  /// `attn` is the rank's strategy and `replay` its world communicator's (both borrowed, must
  /// outlive this object).
  BlockReplay(AttentionStrategy& attn, Replay& replay, bool phantom);
  /// Marks a region for one block of `kind` with `attention_layers` attention layers, and runs
  /// `body` unless the backend replays it.
  void run(std::string_view kind, int attention_layers, const std::function<void()>& body);
  /// Says what follows the end of the block run() marks next: a block of `next_kind`, or the
  /// end of the pass's blocks where it is empty (end()). Called by whoever knows the order of
  /// the blocks (run_blocks), before each one. A phantom block so told is a region judged where
  /// its tiles arrive (Replay::pass_region): its start state is read after what its tiles
  /// compute before their first call, where the last block's exchanges may have ended. A block
  /// not told is judged at its mark (Replay::begin_region).
  void then(std::string_view next_kind);
  /// Marks the end of a pass's blocks (what follows them is not a block).
  void end();
  /// What of this rank's block state a span of blocks depends on beside the strategy's: which
  /// first exchanges are known (a span key's part, Replay::begin_span).
  std::string state_key() const;
  /// Statistics of the replayed blocks (sums only: ranks and cache size are 0), summed once
  /// per kind of block (its simulated effect times its replays).
  StrategyStats replayed() const;

 private:
  AttentionStrategy& attn_;
  Replay& replay_;
  bool phantom_;
  struct Effect {
    StrategyStats stats;       // what the simulated block added (sums)
    std::int64_t replays = 0;  // blocks replayed from it
  };
  std::unordered_map<std::uint64_t, Effect> effects_;  // region id -> what it did, if anything
  std::vector<bool> simulated_;                        // by region id: simulated on this rank
  std::optional<std::string> next_kind_;               // then()'s, for the block run() marks next
  /// The region key the last block said follows it ("blocks end": the pass's end); empty: none.
  std::string expected_;
  /// What the blocks replayed from their arrivals measured, their calls free: not what they
  /// did (their simulated blocks' effects stand for them), so taken off.
  StrategyStats discount_;
  // Block kind and strategy key -> the V-Major cache bytes such a block adds when it exchanges
  // its layers for the first time (a function of the shapes: the same for every such block).
  std::unordered_map<std::string, double> first_cache_;
  // Region key -> the calls of the first block of that key (BlockDeps::calls_fixed), or null
  // where they cannot be issued again.
  std::unordered_map<std::string, std::unique_ptr<Replay::CallTape>> tapes_;
};

/// One transformer block: through ex.blocks when the run marks blocks (its backend replays),
/// else `body` directly. `reference_list` names the ModuleList that holds the block in the
/// model's reference implementation (its host cost under device.host.framework = "reference");
/// empty: "single_transformer_blocks" for a kind with "single" in it, else "transformer_blocks".
void run_block(const Exec& ex, std::string_view kind, int attention_layers,
               const std::function<void()>& body, std::string_view reference_list = {});
/// After the last block of a pass, when the run marks blocks.
void end_blocks(const Exec& ex);
/// The kind of a pass's block i (as its run_block names it): what lets run_blocks say what
/// follows each block (BlockReplay::then).
using BlockKinds = std::function<std::string(int)>;
/// Before block i of the n a loop runs before end_blocks: says what follows it, where the run
/// marks blocks and `kinds` is given.
void then_block(const Exec& ex, const BlockKinds& kinds, int i, int n);

}  // namespace cocodiff::dit
