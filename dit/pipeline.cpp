#include "dit/pipeline.hpp"

#include "core/errors.hpp"
#include "core/replay.hpp"
#include "dit/block_replay.hpp"
#include "dit/layers.hpp"
#include "dit/model_family.hpp"
#include "dit/parallel/strategies.hpp"
#include "dit/safetensors.hpp"
#include "dit/sampler.hpp"

namespace cocodiff::dit {

std::shared_ptr<const Weights> make_weights(const ModelConfig& cfg, std::uint64_t seed,
                                            bool phantom) {
  return init_weights(make_model(cfg)->tensor_specs(), seed, phantom);
}

std::shared_ptr<const Weights> load_weights(const ModelConfig& cfg,
                                            const std::filesystem::path& checkpoint) {
  return load_safetensors_weights(checkpoint, make_model(cfg)->tensor_specs());
}

TextConditioning make_text_conditioning(const ModelConfig& cfg, std::uint64_t seed, bool negative,
                                        bool phantom) {
  TextConditioning t;
  const std::string tag = negative ? "negative_" : "";
  t.text =
      seeded_normal(cfg.text_tokens, cfg.text_dim, seed, tag + "text_embeddings", 1.0f, phantom);
  if (cfg.pooled_dim > 0)
    t.pooled = seeded_normal(1, cfg.pooled_dim, seed, tag + "pooled_embeddings", 1.0f, phantom);
  return t;
}

TextConditioning class_conditioning(const ModelConfig& cfg, const Weights& w, int label,
                                    bool phantom) {
  COCO_CHECK(label >= 0 && label <= cfg.num_classes, "class_conditioning label");
  TextConditioning t;
  t.text = Tensor::zeros(cfg.text_tokens, cfg.text_dim, phantom);
  if (!phantom) {
    const Tensor& table = w.get("class_embedding.text.weight");
    t.text.mat() = ConstMatMap(table.mat().row(label).data(), cfg.text_tokens, cfg.text_dim);
  }
  if (cfg.pooled_dim > 0) {
    t.pooled = Tensor::zeros(1, cfg.pooled_dim, phantom);
    if (!phantom) t.pooled.mat() = w.get("class_embedding.pooled.weight").mat().row(label);
  }
  return t;
}

Tensor forward(Communicator& comm, const ModelConfig& cfg, const Weights& w,
               const std::string& strategy, const ForwardInputs& in, bool phantom) {
  Exec ex{comm, phantom, phantom ? nullptr : &w.math_cache()};
  ex.model = cfg.name;
  std::unique_ptr<AttentionStrategy> attn = make_attention_strategy(strategy, comm, cfg);
  return make_model(cfg)->forward(ex, w, *attn, in);
}

void write_latent_safetensors(const std::filesystem::path& path, const RunOutput& out) {
  std::vector<std::int64_t> shape = {out.latent.rows(), std::int64_t{out.latent_height},
                                     out.latent_width};
  if (out.latent_frames > 1) shape.insert(shape.begin() + 1, out.latent_frames);
  write_safetensors(path, {{"latent", shape, &out.latent}});
}

namespace {

// Rows of a [C, F*H*W] latent-resolution tensor as packed tokens, this rank's shard only.
Tensor local_tokens(const Tensor& latent, int channels, int h, int w, int p, int frames,
                    const TokenShard& shard, bool phantom) {
  if (phantom) return Tensor::zeros(shard.count, std::int64_t{channels} * p * p, true);
  const Tensor all = patchify(latent, channels, h, w, p, frames);
  return Tensor::from(all.mat().middleRows(shard.begin, shard.count));
}

// Repeats rows: [n, F] -> [k*n, F] (a batch of k identical sequences).
Tensor repeat_rows(const Exec& ex, const Tensor& x, int k) {
  Tensor y = Tensor::zeros(x.rows() * k, x.cols(), ex.phantom);
  if (!ex.phantom)
    for (int i = 0; i < k; ++i) y.mat().middleRows(i * x.rows(), x.rows()) = x.mat();
  return y;
}

Tensor stack_rows(const Tensor& a, const Tensor& b) {
  if (a.phantom()) return Tensor::zeros(a.rows() + b.rows(), a.cols(), true);
  Mat m(a.rows() + b.rows(), a.cols());
  m << a.mat(), b.mat();
  return Tensor::from(std::move(m));
}

// Rows [shard.begin, shard.begin + shard.count) of one prompt's text embeddings.
Tensor text_rows(const Tensor& text, const TokenShard& shard) {
  if (text.phantom()) return Tensor::zeros(shard.count, text.cols(), true);
  return Tensor::from(text.mat().middleRows(shard.begin, shard.count));
}

// Tag of the CFG-parallel exchange of branch outputs (point-to-point on the world group).
constexpr int kCfgTag = 7001;

// One rank's sampling run: what generate() works out before the loop and what the loop updates.
// Members are declared in the order they are made, so they are destroyed in the reverse order.
struct Sampling {
  Sampling(Communicator& comm, const ModelConfig& cfg, const Weights& w, const RunSettings& st)
      : comm(comm),
        cfg(cfg),
        w(w),
        st(st),
        phantom(st.phantom),
        ex{comm, st.phantom, st.phantom ? nullptr : &w.math_cache()} {
    ex.model = cfg.name;
  }
  Communicator& comm;
  const ModelConfig& cfg;
  const Weights& w;
  const RunSettings& st;
  const bool phantom;
  Exec ex;
  // [C, lf*lh*lw] latents, frame-major then row-major (row = y); tokens are the lf x gh x gw
  // patch grid in the same order.
  int lf = 1, lh = 0, lw = 0, p = 1;
  TokenGrid grid;
  int c = 0;
  std::int64_t total = 0;
  std::int64_t cells = 0;
  double scale = 1.0;
  bool use_cfg = false, rescale = false;
  bool cfg_parallel = false;
  int half = 0;
  int branch = 0;  // 0: conditional, 1: unconditional
  std::unique_ptr<Communicator> branch_comm;
  Communicator* sp = nullptr;  // the sequence-parallel group
  int ranks = 1, rank = 0;
  TokenShard shard;
  int features = 0;
  RunOutput out;
  std::unique_ptr<Model> model;
  std::unique_ptr<AttentionStrategy> attn;
  Tensor noise;
  Tensor x;
  Tensor known, mask;
  TextConditioning cond;
  TextConditioning uncond;
  std::optional<TokenShard> text_shard;
  std::optional<StepCache> step_cache;
  Replay* replay = nullptr;
  std::optional<BlockReplay> blocks;
};

// Checks the image and video sizes against the model and sets the latent and token geometry.
void set_geometry(Sampling& s) {
  const ModelConfig& cfg = s.cfg;
  const RunSettings& st = s.st;
  const int cell = cfg.vae_scale * cfg.patch_size;
  for (const int px : {st.pixel_height(), st.pixel_width()})
    if (px <= 0 || px % cell != 0)
      throw ConfigError("image side " + std::to_string(px) + " is not a positive multiple of " +
                        std::to_string(cell) + " pixels (VAE scale x patch size) for model " +
                        cfg.name);
  // Video: the VAE keeps the first frame and compresses the others in time.
  const int ts = cfg.vae_temporal_scale;
  if (st.frames < 1 || (st.frames - 1) % ts != 0)
    throw ConfigError("run.frames " + std::to_string(st.frames) + ": expected 1 + a multiple of " +
                      std::to_string(ts) + " (the temporal compression of " + cfg.name + "'s VAE)");
  s.lf = (st.frames - 1) / ts + 1;
  if (s.lf > 1 && !model_family(cfg.family).video)
    throw ConfigError("run.frames " + std::to_string(st.frames) + ": " + cfg.name + " (family " +
                      cfg.family + ") makes images; set run.frames = 1");
  s.lh = st.pixel_height() / cfg.vae_scale;
  s.lw = st.pixel_width() / cfg.vae_scale;
  s.p = cfg.patch_size;
  s.grid = TokenGrid{s.lf, s.lh / s.p, s.lw / s.p};
  s.c = cfg.latent_channels;
  s.total = s.grid.tokens();
  s.cells = std::int64_t{s.lf} * s.lh * s.lw;
}

// Settles guidance and the CFG-parallel split: this rank's sequence-parallel group and shard.
void split_ranks(Sampling& s) {
  const ModelConfig& cfg = s.cfg;
  const RunSettings& st = s.st;
  Communicator& comm = s.comm;
  s.scale = st.cfg_scale >= 0 ? st.cfg_scale : cfg.cfg_scale;
  s.use_cfg = cfg.cfg_mode != CfgMode::kNone && s.scale != 1.0;
  s.rescale = cfg.cfg_mode == CfgMode::kTrue && cfg.cfg_rescale;
  // CFG-parallel: two halves of the ranks, one per guidance branch, each sequence-parallel.
  if (st.cfg_degree != 1 && st.cfg_degree != 2)
    throw ConfigError("parallel.cfg_degree " + std::to_string(st.cfg_degree) + ": expected 1 or 2");
  s.cfg_parallel = st.cfg_degree == 2;
  if (s.cfg_parallel && !s.use_cfg)
    throw ConfigError("parallel.cfg_degree 2 needs classifier-free guidance: " + cfg.name +
                      (cfg.cfg_mode == CfgMode::kNone ? " has no unconditional pass"
                                                      : " runs with guidance scale 1"));
  if (s.cfg_parallel && comm.size() % 2 != 0)
    throw ConfigError("parallel.cfg_degree 2 needs an even rank count, found " +
                      std::to_string(comm.size()));
  s.half = comm.size() / 2;
  s.branch = s.cfg_parallel ? comm.rank() / s.half : 0;
  s.branch_comm = s.cfg_parallel ? comm.split(s.branch, comm.rank()) : nullptr;
  s.sp = s.cfg_parallel ? s.branch_comm.get() : &comm;
  s.ranks = s.sp->size();
  s.rank = s.sp->rank();
  s.shard = shard_tokens(s.total, s.ranks, s.rank);
  s.features = cfg.token_features();
}

// The run's shape, step count, sigma schedule and batch in the output.
void describe_output(Sampling& s) {
  const ModelConfig& cfg = s.cfg;
  const RunSettings& st = s.st;
  RunOutput& out = s.out;
  out.latent_frames = s.lf;
  out.latent_height = s.lh;
  out.latent_width = s.lw;
  out.tokens = s.total;
  out.local_tokens = s.shard.count;
  out.steps = st.steps > 0 ? st.steps : cfg.default_steps;
  out.sigmas = sigma_schedule(cfg, out.steps, s.total);
  out.batch = s.use_cfg && cfg.cfg_mode == CfgMode::kBatch && !s.cfg_parallel ? 2 : 1;
}

// The model and this rank's attention strategy over the sequence-parallel group.
void make_model_and_strategy(Sampling& s) {
  const ModelConfig& cfg = s.cfg;
  const RunSettings& st = s.st;
  s.model = make_model(cfg);
  s.attn = st.make_strategy ? st.make_strategy(*s.sp, cfg)
                            : make_attention_strategy(st.strategy, *s.sp, cfg, st.strategy_options,
                                                      st.strategies.get());
}

// This rank's starting latent tokens and noise, and inpainting's known latent and mask.
void draw_latents(Sampling& s) {
  const RunSettings& st = s.st;
  const bool phantom = s.phantom;
  const int c = s.c, lh = s.lh, lw = s.lw, p = s.p, lf = s.lf;
  // Noise in token space: token t's features are elements [t*F, (t+1)*F) of one seeded stream,
  // so every rank draws exactly its rows of the same full tensor.
  s.noise = seeded_normal_rows(s.shard.begin, s.shard.count, s.features, st.seed, "latent_noise",
                               1.0f, phantom);
  s.x = st.initial_latent ? local_tokens(*st.initial_latent, c, lh, lw, p, lf, s.shard, phantom)
                          : s.noise;
  if (st.known_latent.has_value() != st.mask.has_value())
    throw ConfigError("inpainting needs both a known latent and a mask");
  if (st.known_latent) {
    const Tensor& kl = *st.known_latent;
    const Tensor& mk = *st.mask;
    const std::int64_t cells = s.cells;
    if (kl.rows() != c || kl.cols() != cells || mk.rows() != 1 || mk.cols() != cells)
      throw ConfigError("inpainting: known latent must be [" + std::to_string(c) + " x " +
                        std::to_string(cells) + "] and mask [1 x " + std::to_string(cells) +
                        "], found " + kl.shape_str() + " and " + mk.shape_str());
    s.known = local_tokens(kl, c, lh, lw, p, lf, s.shard, phantom);
    Tensor mask_c = Tensor::zeros(c, cells, phantom);
    if (!phantom) mask_c.mat() = mk.mat().replicate(c, 1);
    s.mask = local_tokens(mask_c, c, lh, lw, p, lf, s.shard, phantom);
  }
}

// The conditioning of both branches; the text stream sharded where the strategy shards it.
void condition(Sampling& s) {
  const ModelConfig& cfg = s.cfg;
  const RunSettings& st = s.st;
  // Conditioning (replicated on every rank): learned class tokens where the model has them,
  // else seeded stand-ins for the text encoder's output.
  const bool class_tokens = model_family(cfg.family).class_tokens && cfg.num_classes > 0;
  if (class_tokens && (st.class_label < 0 || st.class_label >= cfg.num_classes))
    throw ConfigError("run.class_label " + std::to_string(st.class_label) + " is out of range: " +
                      cfg.name + " has classes 0.." + std::to_string(cfg.num_classes - 1));
  s.cond = class_tokens ? class_conditioning(cfg, s.w, st.class_label, s.phantom)
                        : make_text_conditioning(cfg, st.seed, false, s.phantom);
  if (s.use_cfg)
    s.uncond = class_tokens ? class_conditioning(cfg, s.w, cfg.num_classes, s.phantom)
                            : make_text_conditioning(cfg, st.seed, true, s.phantom);
  // Text sharded over the strategy's Ulysses group (xDiT): this rank keeps its tokens only.
  const bool text_stream = model_family(cfg.family).text_conditioned &&
                           model_family(cfg.family).joint_text && cfg.text_tokens > 0;
  s.text_shard = text_stream ? s.attn->text_shard(cfg.text_tokens) : std::nullopt;
  if (st.strategy_options.shard_text && text_stream && !s.text_shard && s.attn->degree() > 1)
    throw ConfigError("parallel.shard_text: strategy \"" + s.attn->name() +
                      "\" does not shard the text stream");
  if (s.text_shard) {
    s.cond.text = text_rows(s.cond.text, *s.text_shard);
    if (s.use_cfg) s.uncond.text = text_rows(s.uncond.text, *s.text_shard);
  }
}

// Makes this rank's step cache and hands it to the run's Exec.
void start_step_cache(Sampling& s) {
  // Step caching: the image stream's change is measured over the sequence-parallel group;
  // under CFG-parallel the conditional half decides for the other.
  StepCacheOptions cache_opts = s.st.step_cache;
  if (cache_opts.policy == "teacache" && cache_opts.coefficients.empty())
    cache_opts.coefficients = model_family(s.cfg.family).teacache_coefficients;
  const int peer =
      s.cfg_parallel ? (s.branch == 0 ? s.comm.rank() + s.half : s.comm.rank() - s.half) : -1;
  s.ex.step_cache = &s.step_cache.emplace(*s.sp, s.comm, peer, s.branch == 0, std::move(cache_opts),
                                          s.out.steps, s.phantom);
}

// The forwards of one denoising step: each is a pass of the model over this rank's tokens at
// the step's sigma, numbered in order (the strategy's and the step cache's pass index).
struct StepForwards {
  StepForwards(Sampling& s, int step, double sigma) : s(s), step(step), sigma(sigma) {}
  Sampling& s;
  int step;
  double sigma;
  int pass = 0;
  ForwardInputs in;

  // One forward of `batch` sequences `xb` with their conditioning and class labels.
  Tensor run(int batch, const Tensor& xb, const Tensor* text, const Tensor* pooled,
             std::vector<int> labels) {
    in.batch = batch;
    in.x = &xb;
    in.sigmas.assign(static_cast<size_t>(batch), static_cast<float>(sigma));
    in.guidance.clear();
    if (s.cfg.guidance_embed)
      in.guidance.assign(static_cast<size_t>(batch), static_cast<float>(s.scale));
    in.text = text;
    in.pooled = pooled;
    in.class_labels = std::move(labels);
    ++s.out.forwards;
    s.step_cache->begin_forward(step, s.cfg_parallel ? s.branch : pass);
    s.attn->begin_forward(step, pass++);
    try {
      return s.model->forward(s.ex, s.w, *s.attn, in);
    } catch (const NumericError& e) {
      throw NumericError("step " + std::to_string(step) + " of " + std::to_string(s.out.steps) +
                         ": " + e.what());
    }
  }
};

// CFG-parallel: runs this half's branch, swaps outputs with the other half, combines them.
Tensor exchange_branches(Sampling& s, StepForwards& f) {
  // This half runs its branch; the rank holding the same tokens in the other half sends the
  // other branch's output, and both halves combine them alike.
  const ModelConfig& cfg = s.cfg;
  Communicator& comm = s.comm;
  const TextConditioning& mine = s.branch == 0 ? s.cond : s.uncond;
  const Tensor vb = f.run(1, s.x, &mine.text, cfg.pooled_dim > 0 ? &mine.pooled : nullptr,
                          {s.branch == 0 ? s.st.class_label : cfg.num_classes});
  Tensor vo = Tensor::uninitialized(s.shard.count, s.features, s.phantom);
  const int peer = s.branch == 0 ? comm.rank() + s.half : comm.rank() - s.half;
  const std::int64_t n = s.shard.count * s.features;
  Request rr = comm.irecv(vo.data(), n, peer, kCfgTag, "cfg_branch_output");
  Request sr = comm.isend(vb.data(), n, peer, kCfgTag, "cfg_branch_output");
  rr.wait();
  sr.wait();
  return s.branch == 0 ? cfg_combine(s.ex, vb, vo, s.scale, s.rescale)
                       : cfg_combine(s.ex, vo, vb, s.scale, s.rescale);
}

// Batch CFG: [cond; uncond] as one batch of 2, then the guided combination.
Tensor batch_branches(Sampling& s, StepForwards& f) {
  const ModelConfig& cfg = s.cfg;
  const TextConditioning& cond = s.cond;
  const TextConditioning& uncond = s.uncond;
  const Tensor x2 = repeat_rows(s.ex, s.x, 2);
  const Tensor text2 = cfg.text_tokens > 0 ? stack_rows(cond.text, uncond.text) : Tensor();
  const Tensor pooled2 = cfg.pooled_dim > 0 ? stack_rows(cond.pooled, uncond.pooled) : Tensor();
  const Tensor v2 = f.run(2, x2, &text2, cfg.pooled_dim > 0 ? &pooled2 : nullptr,
                          {s.st.class_label, cfg.num_classes});
  // Batch-major rows: the conditional sequence first.
  const Tensor vc = s.phantom ? Tensor::zeros(s.shard.count, s.features, true)
                              : Tensor::from(v2.mat().topRows(s.shard.count));
  const Tensor vu = s.phantom ? Tensor::zeros(s.shard.count, s.features, true)
                              : Tensor::from(v2.mat().bottomRows(s.shard.count));
  return cfg_combine(s.ex, vc, vu, s.scale, false);
}

// The velocity of this step: one forward, or the guided combination of the two branches.
Tensor velocity(Sampling& s, StepForwards& f) {
  const ModelConfig& cfg = s.cfg;
  const TextConditioning& cond = s.cond;
  const TextConditioning& uncond = s.uncond;
  const int null_class = cfg.num_classes;
  if (!s.use_cfg)
    return f.run(1, s.x, &cond.text, cfg.pooled_dim > 0 ? &cond.pooled : nullptr,
                 {s.st.class_label});
  if (s.cfg_parallel) return exchange_branches(s, f);
  if (cfg.cfg_mode == CfgMode::kBatch) return batch_branches(s, f);
  const Tensor vc =
      f.run(1, s.x, &cond.text, cfg.pooled_dim > 0 ? &cond.pooled : nullptr, {s.st.class_label});
  const Tensor vu =
      f.run(1, s.x, &uncond.text, cfg.pooled_dim > 0 ? &uncond.pooled : nullptr, {null_class});
  return cfg_combine(s.ex, vc, vu, s.scale, s.rescale);
}

// Denoising step i: the step hooks, the step's region, the velocity and the sampler's update.
void denoise_step(Sampling& s, int i) {
  const RunSettings& st = s.st;
  Communicator& comm = s.comm;
  if (st.on_step) st.on_step(comm.rank(), i);
  if (st.on_step_clock) st.on_step_clock(comm.rank(), i, comm.now());
  // In phantom mode a step is a span (Replay::begin_span) that depends on the strategy's key for
  // it and on the blocks' state, unless the step cache decides it by its own measurements. What
  // follows it is the next step's embeddings, or the latent's gather after the last.
  if (s.replay != nullptr)
    s.replay->begin_span("step " + s.attn->step_key(i) + " | " + s.blocks->state_key(),
                         s.phantom && !s.step_cache->active(),
                         i + 1 < s.out.steps ? "step" : "latent gather");
  const double sigma = s.out.sigmas[static_cast<size_t>(i)];
  const double next = s.out.sigmas[static_cast<size_t>(i) + 1];
  StepForwards f(s, i, sigma);
  f.in.grid = s.grid;
  f.in.shard = s.shard;
  f.in.text_shard = s.text_shard;
  const Tensor v = velocity(s, f);
  euler_step(s.ex, s.x, v, sigma, next);
  if (st.known_latent) inpaint_blend(s.ex, s.x, s.mask, s.known, s.noise, next);
  if (!s.phantom && !s.x.mat().allFinite())
    throw NumericError("step " + std::to_string(i) + " of " + std::to_string(s.out.steps) +
                       ": non-finite values (NaN or infinity) first appear in the latent "
                       "after the sampler's update (an initial latent or a velocity that "
                       "overflows float32, whose largest finite value is 3.4e38)");
}

// Gathers the full latent on every rank; collects the strategy's and step cache's statistics.
void gather_latent(Sampling& s) {
  // Every rank's tokens, padded to the largest shard, then unpacked.
  const bool phantom = s.phantom;
  const int ranks = s.ranks, features = s.features;
  const std::int64_t total = s.total;
  const std::int64_t max_rows = shard_tokens(total, ranks, 0).count;
  std::vector<float> send, recv;
  if (!phantom) {
    send.assign(static_cast<size_t>(max_rows * features), 0.0f);
    std::copy(s.x.data().begin(), s.x.data().end(), send.begin());
    recv.resize(static_cast<size_t>(max_rows * features * ranks));
  }
  s.sp->all_gather(send, recv, max_rows * features, "latent_all_gather");
  Tensor tokens = Tensor::zeros(total, features, phantom);
  if (!phantom)
    for (int r = 0; r < ranks; ++r) {
      const TokenShard sh = shard_tokens(total, ranks, r);
      tokens.mat().middleRows(sh.begin, sh.count) =
          ConstMatMap(recv.data() + r * max_rows * features, sh.count, features);
    }
  s.out.latent = unpatchify(tokens, s.c, s.lh, s.lw, s.p, s.lf);
  s.out.strategy_stats = s.attn->stats();
  s.out.step_cache = s.step_cache->stats();
  if (s.blocks)
    s.out.strategy_stats.merge(s.blocks->replayed());  // sums only: its ranks and cache size are 0
}

}  // namespace

RunOutput generate(Communicator& comm, const ModelConfig& cfg, const Weights& w,
                   const RunSettings& st) {
  const bool phantom = st.phantom;
  COCO_CHECK(phantom == w.phantom() || !w.phantom(), "phantom weights in a real run");
  // A strategy with its own sampling loop (PipeFusion splits the blocks, not one layer's
  // attention) runs the whole run.
  if (!st.make_strategy)
    if (const StrategyEntry* e = attention_strategy_entry(st.strategy, st.strategies.get());
        e != nullptr && e->sampler)
      return e->sampler(comm, cfg, w, st);
  Sampling s(comm, cfg, w, st);
  set_geometry(s);
  split_ranks(s);
  describe_output(s);
  make_model_and_strategy(s);
  draw_latents(s);
  condition(s);

  // Where the backend replays (the emulator), every step and every transformer block is a
  // region of the run (Replay::begin_region): in phantom mode a block is a function of its
  // kind, of the strategy's state and of its start state, so the emulator may replay one it has
  // already simulated from the same state instead of running it again (BlockReplay). What lies
  // between blocks is simulated. A whole step, blocks and all, is a span the emulator may
  // replay the same way, where its blocks are not (their starts are not quiescent).
  start_step_cache(s);
  s.replay = replay_of(comm);
  if (s.replay != nullptr) s.ex.blocks = &s.blocks.emplace(*s.attn, *s.replay, phantom);
  for (int i = 0; i < s.out.steps; ++i) denoise_step(s, i);
  if (s.replay != nullptr) s.replay->begin_span("latent gather", false, "end");
  gather_latent(s);
  return std::move(s.out);
}

}  // namespace cocodiff::dit
