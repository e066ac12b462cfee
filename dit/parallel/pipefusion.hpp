#pragma once
// PipeFusion: patch-level pipeline parallelism (Fang et al., "PipeFusion: Patch-level Pipeline
// Parallelism for Diffusion Transformers", arXiv 2405.14430), as xDiT runs it for FLUX.1
// (xfuser/model_executor/pipelines/pipeline_flux.py, `_sync_pipeline` and `_async_pipeline`;
// the stage split of xfuser/model_executor/models/transformers/base_transformer.py
// `_split_transformer_blocks`; the KV cache of xfuser/core/cache_manager/cache_manager.py, filled
// by the attention processors of xfuser/model_executor/layers/attention_processor.py):
//
// - The transformer blocks are split into `degree` contiguous stages, one per group of
//   `ulysses` ranks (xDiT: ceil(blocks / degree) a stage, which can leave the last stage none;
//   here the first blocks % degree stages get one block more, and every stage gets one).
// - The image tokens are split into `patches` patches of whole token rows (xDiT's
//   `num_pipeline_patch`, default the degree; `_calc_patches_metadata` in
//   xfuser/core/distributed/runtime_state.py splits the latent's height alike). A video's
//   patches are runs of its rows taken frame after frame: whole frames when the patches divide
//   the frames, else runs that may end inside a frame. Splitting each frame's height instead
//   (the same rows of every frame in one patch, xDiT's split of an image carried over) would
//   make a patch a set of F strips apart in the frame-major token order; a run is one
//   contiguous TokenShard, so the cache refresh, the RoPE positions, the Ulysses shares and
//   the sampler's rows are those of any shard, and a patch's self-attention within its own
//   frames is fresh while only other frames' keys are stale.
// - The first `warmup_steps` steps (xDiT `--warmup_steps`, default 1) send the whole image
//   through the stages in turn, every layer attending over fresh keys and values of every token
//   (exact), and fill each layer's cache with them.
// - Every later step sends the patches through the stages one after another: stage s runs patch
//   m as soon as stage s - 1 has sent it (point-to-point), so the stages work on different
//   patches at once. A layer's attention for patch m has the queries of the text and of patch m
//   and the keys and values of the text and of every image token: patch m's fresh, the others
//   from the layer's cache (this step's for the patches before m, the step before's, stale, for
//   those after it); the cache then keeps patch m's fresh ones (`_naive_cache_update`).
// - The text stream of joint-attention families (FLUX.1, FLUX.2, SD3.5, Qwen-Image): a stage
//   receives the text's hidden states once a step, those of the previous stage's pass of
//   patch 0, and runs every patch's pass from them (`pipeline_flux.py`: `patch_idx == 0`);
//   every pass attends with the queries, keys and values of the whole text, fresh. DiT has no
//   text (its class label and timestep drive the modulation every stage computes); Wan's text
//   enters by cross-attention, so every stage projects the conditioning itself and only the
//   video's hidden states go from stage to stage.
// - The last stage steps the sampler on each patch as it comes out and sends the patch's next
//   latent back to the first stage, so the next step's first patches start while the last
//   stage finishes this step's last ones. After the last step the final latent goes to every
//   rank.
// - Ulysses inside a stage (xDiT's pipefusion x ulysses): each rank of a stage holds 1 / ulysses
//   of every patch's tokens; Q, K, V of the patch are exchanged with one all-to-all each (flat
//   Ulysses), and the cache holds this rank's heads of every image token, as
//   `_sequence_parallel_cache_update` keeps them. CFG: batch CFG runs both sequences through
//   the pipeline as a batch of 2; CFG-parallel runs one pipeline per half of the ranks, and the
//   two last stages swap each patch's prediction.
//
// Rank r of the group is stage r / ulysses, Ulysses index r % ulysses. Families run it when
// their forward honours ForwardInputs::stage (ModelFamily::stage_blocks: every built-in one).
//
//   RunSettings st;  st.strategy = "pipefusion";  st.strategy_options.pipefusion_degree = 4;
//   RunOutput out = generate(comm, cfg, w, st);   // generate() hands it to generate_pipefusion

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "core/communicator.hpp"
#include "dit/attention_strategy.hpp"
#include "dit/model_config.hpp"
#include "dit/model_family.hpp"
#include "dit/parallel/search.hpp"
#include "dit/parallel/tapa.hpp"

namespace cocodiff::dit {

struct RunSettings;
struct StrategyMemoryQuery;  // dit/parallel/strategies.hpp
struct RunOutput;
class Weights;

/// Blocks [first, first + count) of `blocks` for stage `stage` of `degree`.
struct StageBlocks {
  int first = 0, count = 0;
};
StageBlocks pipefusion_stage_blocks(int blocks, int degree, int stage);

/// Patch m of `patches` of a grid of `rows` x `width` tokens: whole rows, the first rows %
/// patches patches one row more.
TokenShard pipefusion_patch(int rows, int width, int patches, int m);

/// What keeps PipeFusion from running `cfg` with `options` on a group of `ranks` ranks (a CFG
/// half's) over an image of `grid` tokens, naming the key; nullopt: nothing.
/// PipeFusion's state on one tile, in bytes: for every attention layer of its stage, keys and
/// values of every image token for its heads (B x N x heads / Ulysses degree x head_dim,
/// twice), and the whole latent the first and last stages hold.
double pipefusion_tile_bytes(const StrategyMemoryQuery& q);

std::optional<ModelConfigProblem> pipefusion_problem(const ModelConfig& cfg,
                                                     const StrategyOptions& options, int ranks,
                                                     const TokenGrid& grid);

/// The attention of one pipeline stage: flat Ulysses over the stage's group, the image's keys
/// and values from a per-layer cache that each pass refreshes for the patch it runs.
class PipeFusionAttention final : public AttentionStrategy {
 public:
  /// `ulysses` is the stage's group (borrowed, must outlive this object).
  explicit PipeFusionAttention(Communicator& ulysses);
  std::string name() const override { return "pipefusion"; }
  int degree() const override { return group_.size(); }
  int index() const override { return group_.rank(); }
  /// The next passes run patch `patch` of the image's tokens (the whole image in a warm-up
  /// step); this rank holds its share shard_tokens(patch.count, degree(), index()).
  void set_patch(const TokenShard& patch) { patch_ = patch; }
  void begin_forward(int step, int pass) override;
  std::vector<Tensor> attend(const Exec& ex, const QkvSource& src,
                             const AttentionShape& shape) override;

 private:
  // Q/K/V of stream s for this rank's heads: [rows of the patch (image) or text, width].
  Tensor gather_part(const Exec& ex, const QkvSource& src, int s, QkvPart part,
                     const AttentionShape& shape);
  // Writes the patch's fresh rows into the layer's cache and returns the whole cache.
  const Tensor& refresh_cache(const Exec& ex, int key, const Tensor& fresh, std::int64_t total,
                              int batch);

  SpGroup group_;
  TokenShard patch_;
  int pass_ = 0, layer_ = 0;
  std::map<int, Tensor> cache_;  // (pass, layer, K or V) -> [B * image tokens, this rank's heads]
};

/// The sampling loop of RunSettings::strategy "pipefusion" on every rank of `comm`
/// (collective); the final latent on every rank, as generate() gives it.
RunOutput generate_pipefusion(Communicator& comm, const ModelConfig& cfg, const Weights& w,
                              const RunSettings& settings);

/// PipeFusion's points for `cocodiff tune` (dit/parallel/search.hpp): 2 stages or more with
/// every step whole (exact), each a Ulysses group of the other ranks, with or without
/// CFG-parallel, where the family runs stages and the image has a patch for every rank of a
/// stage.
void pipefusion_search(const SearchShape& shape, const SearchEmit& emit);

}  // namespace cocodiff::dit
