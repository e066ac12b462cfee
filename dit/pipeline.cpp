#include "dit/pipeline.hpp"

#include "core/errors.hpp"
#include "core/replay.hpp"
#include "dit/block_replay.hpp"
#include "dit/layers.hpp"
#include "dit/model_family.hpp"
#include "dit/parallel/pipefusion.hpp"
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

}  // namespace

RunOutput generate(Communicator& comm, const ModelConfig& cfg, const Weights& w,
                   const RunSettings& st) {
  const bool phantom = st.phantom;
  COCO_CHECK(phantom == w.phantom() || !w.phantom(), "phantom weights in a real run");
  // PipeFusion splits the blocks, not one layer's attention: it runs its own sampling loop.
  if (st.strategy == "pipefusion" && !st.make_strategy)
    return generate_pipefusion(comm, cfg, w, st);
  Exec ex{comm, phantom, phantom ? nullptr : &w.math_cache()};
  ex.model = cfg.name;
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
  const int lf = (st.frames - 1) / ts + 1;
  if (lf > 1 && !model_family(cfg.family).video)
    throw ConfigError("run.frames " + std::to_string(st.frames) + ": " + cfg.name + " (family " +
                      cfg.family + ") makes images; set run.frames = 1");
  // [C, lf*lh*lw] latents, frame-major then row-major (row = y); tokens are the lf x gh x gw
  // patch grid in the same order.
  const int lh = st.pixel_height() / cfg.vae_scale, lw = st.pixel_width() / cfg.vae_scale;
  const int p = cfg.patch_size;
  const TokenGrid grid{lf, lh / p, lw / p};
  const int c = cfg.latent_channels;
  const std::int64_t total = grid.tokens();
  const std::int64_t cells = std::int64_t{lf} * lh * lw;
  const double scale = st.cfg_scale >= 0 ? st.cfg_scale : cfg.cfg_scale;
  const bool use_cfg = cfg.cfg_mode != CfgMode::kNone && scale != 1.0;
  const bool rescale = cfg.cfg_mode == CfgMode::kTrue && cfg.cfg_rescale;
  // CFG-parallel: two halves of the ranks, one per guidance branch, each sequence-parallel.
  if (st.cfg_degree != 1 && st.cfg_degree != 2)
    throw ConfigError("parallel.cfg_degree " + std::to_string(st.cfg_degree) + ": expected 1 or 2");
  const bool cfg_parallel = st.cfg_degree == 2;
  if (cfg_parallel && !use_cfg)
    throw ConfigError("parallel.cfg_degree 2 needs classifier-free guidance: " + cfg.name +
                      (cfg.cfg_mode == CfgMode::kNone ? " has no unconditional pass"
                                                      : " runs with guidance scale 1"));
  if (cfg_parallel && comm.size() % 2 != 0)
    throw ConfigError("parallel.cfg_degree 2 needs an even rank count, found " +
                      std::to_string(comm.size()));
  const int half = comm.size() / 2;
  const int branch = cfg_parallel ? comm.rank() / half : 0;  // 0: conditional, 1: unconditional
  std::unique_ptr<Communicator> branch_comm =
      cfg_parallel ? comm.split(branch, comm.rank()) : nullptr;
  Communicator& sp = cfg_parallel ? *branch_comm : comm;  // the sequence-parallel group
  const int ranks = sp.size(), rank = sp.rank();
  const TokenShard shard = shard_tokens(total, ranks, rank);
  const int features = cfg.token_features();

  RunOutput out;
  out.latent_frames = lf;
  out.latent_height = lh;
  out.latent_width = lw;
  out.tokens = total;
  out.local_tokens = shard.count;
  out.steps = st.steps > 0 ? st.steps : cfg.default_steps;
  out.sigmas = sigma_schedule(cfg, out.steps, total);
  out.batch = use_cfg && cfg.cfg_mode == CfgMode::kBatch && !cfg_parallel ? 2 : 1;

  std::unique_ptr<Model> model = make_model(cfg);
  std::unique_ptr<AttentionStrategy> attn =
      st.make_strategy
          ? st.make_strategy(sp, cfg)
          : make_attention_strategy(st.strategy, sp, cfg, st.strategy_options, st.strategies.get());

  // Noise in token space: token t's features are elements [t*F, (t+1)*F) of one seeded stream,
  // so every rank draws exactly its rows of the same full tensor.
  const Tensor noise = seeded_normal_rows(shard.begin, shard.count, features, st.seed,
                                          "latent_noise", 1.0f, phantom);
  Tensor x = st.initial_latent ? local_tokens(*st.initial_latent, c, lh, lw, p, lf, shard, phantom)
                               : noise;
  if (st.known_latent.has_value() != st.mask.has_value())
    throw ConfigError("inpainting needs both a known latent and a mask");
  Tensor known, mask;
  if (st.known_latent) {
    const Tensor& kl = *st.known_latent;
    const Tensor& mk = *st.mask;
    if (kl.rows() != c || kl.cols() != cells || mk.rows() != 1 || mk.cols() != cells)
      throw ConfigError("inpainting: known latent must be [" + std::to_string(c) + " x " +
                        std::to_string(cells) + "] and mask [1 x " + std::to_string(cells) +
                        "], found " + kl.shape_str() + " and " + mk.shape_str());
    known = local_tokens(kl, c, lh, lw, p, lf, shard, phantom);
    Tensor mask_c = Tensor::zeros(c, cells, phantom);
    if (!phantom) mask_c.mat() = mk.mat().replicate(c, 1);
    mask = local_tokens(mask_c, c, lh, lw, p, lf, shard, phantom);
  }

  // Conditioning (replicated on every rank): learned class tokens where the model has them,
  // else seeded stand-ins for the text encoder's output.
  const bool class_tokens = model_family(cfg.family).class_tokens && cfg.num_classes > 0;
  if (class_tokens && (st.class_label < 0 || st.class_label >= cfg.num_classes))
    throw ConfigError("run.class_label " + std::to_string(st.class_label) + " is out of range: " +
                      cfg.name + " has classes 0.." + std::to_string(cfg.num_classes - 1));
  TextConditioning cond = class_tokens ? class_conditioning(cfg, w, st.class_label, phantom)
                                       : make_text_conditioning(cfg, st.seed, false, phantom);
  TextConditioning uncond;
  if (use_cfg)
    uncond = class_tokens ? class_conditioning(cfg, w, cfg.num_classes, phantom)
                          : make_text_conditioning(cfg, st.seed, true, phantom);
  // Text sharded over the strategy's Ulysses group (xDiT): this rank keeps its tokens only.
  const bool text_stream = model_family(cfg.family).text_conditioned &&
                           model_family(cfg.family).joint_text && cfg.text_tokens > 0;
  const std::optional<TokenShard> text_shard =
      text_stream ? attn->text_shard(cfg.text_tokens) : std::nullopt;
  if (st.strategy_options.shard_text && text_stream && !text_shard && attn->degree() > 1)
    throw ConfigError("parallel.shard_text: strategy \"" + attn->name() +
                      "\" does not shard the text stream");
  if (text_shard) {
    cond.text = text_rows(cond.text, *text_shard);
    if (use_cfg) uncond.text = text_rows(uncond.text, *text_shard);
  }

  // Where the backend replays (the emulator), every step and every transformer block is a
  // region of the run (Replay::begin_region): in phantom mode a block is a function of its
  // kind, of the strategy's state and of its start state, so the emulator may replay one it has
  // already simulated from the same state instead of running it again (BlockReplay). What lies
  // between blocks is simulated.
  // Step caching: the image stream's change is measured over the sequence-parallel group;
  // under CFG-parallel the conditional half decides for the other.
  StepCacheOptions cache_opts = st.step_cache;
  if (cache_opts.policy == "teacache" && cache_opts.coefficients.empty())
    cache_opts.coefficients = model_family(cfg.family).teacache_coefficients;
  StepCache step_cache(sp, comm,
                       cfg_parallel ? (branch == 0 ? comm.rank() + half : comm.rank() - half) : -1,
                       branch == 0, std::move(cache_opts), out.steps, phantom);
  ex.step_cache = &step_cache;

  Replay* const replay = replay_of(comm);
  std::optional<BlockReplay> blocks;
  if (replay != nullptr) ex.blocks = &blocks.emplace(*attn, *replay, phantom);
  for (int i = 0; i < out.steps; ++i) {
    if (st.on_step) st.on_step(comm.rank(), i);
    if (st.on_step_clock) st.on_step_clock(comm.rank(), i, comm.now());
    if (replay != nullptr) replay->begin_region("step " + attn->step_key(i), false);
    const double sigma = out.sigmas[static_cast<size_t>(i)];
    const double next = out.sigmas[static_cast<size_t>(i) + 1];
    int pass = 0;
    ForwardInputs in;
    in.grid = grid;
    in.shard = shard;
    in.text_shard = text_shard;
    auto run = [&](int batch, const Tensor& xb, const Tensor* text, const Tensor* pooled,
                   std::vector<int> labels) {
      in.batch = batch;
      in.x = &xb;
      in.sigmas.assign(static_cast<size_t>(batch), static_cast<float>(sigma));
      in.guidance.clear();
      if (cfg.guidance_embed)
        in.guidance.assign(static_cast<size_t>(batch), static_cast<float>(scale));
      in.text = text;
      in.pooled = pooled;
      in.class_labels = std::move(labels);
      ++out.forwards;
      step_cache.begin_forward(i, cfg_parallel ? branch : pass);
      attn->begin_forward(i, pass++);
      try {
        return model->forward(ex, w, *attn, in);
      } catch (const NumericError& e) {
        throw NumericError("step " + std::to_string(i) + " of " + std::to_string(out.steps) + ": " +
                           e.what());
      }
    };
    const int null_class = cfg.num_classes;
    Tensor v;
    if (!use_cfg) {
      v = run(1, x, &cond.text, cfg.pooled_dim > 0 ? &cond.pooled : nullptr, {st.class_label});
    } else if (cfg_parallel) {
      // This half runs its branch; the rank holding the same tokens in the other half sends
      // the other branch's output, and both halves combine them alike.
      const TextConditioning& mine = branch == 0 ? cond : uncond;
      const Tensor vb = run(1, x, &mine.text, cfg.pooled_dim > 0 ? &mine.pooled : nullptr,
                            {branch == 0 ? st.class_label : null_class});
      Tensor vo = Tensor::uninitialized(shard.count, features, phantom);
      const int peer = branch == 0 ? comm.rank() + half : comm.rank() - half;
      const std::int64_t n = shard.count * features;
      Request rr = comm.irecv(vo.data(), n, peer, kCfgTag, "cfg_branch_output");
      Request sr = comm.isend(vb.data(), n, peer, kCfgTag, "cfg_branch_output");
      rr.wait();
      sr.wait();
      v = branch == 0 ? cfg_combine(ex, vb, vo, scale, rescale)
                      : cfg_combine(ex, vo, vb, scale, rescale);
    } else if (cfg.cfg_mode == CfgMode::kBatch) {
      // [cond; uncond] as one batch of 2.
      const Tensor x2 = repeat_rows(ex, x, 2);
      const Tensor text2 = cfg.text_tokens > 0 ? stack_rows(cond.text, uncond.text) : Tensor();
      const Tensor pooled2 = cfg.pooled_dim > 0 ? stack_rows(cond.pooled, uncond.pooled) : Tensor();
      const Tensor v2 =
          run(2, x2, &text2, cfg.pooled_dim > 0 ? &pooled2 : nullptr, {st.class_label, null_class});
      // Batch-major rows: the conditional sequence first.
      const Tensor vc = phantom ? Tensor::zeros(shard.count, features, true)
                                : Tensor::from(v2.mat().topRows(shard.count));
      const Tensor vu = phantom ? Tensor::zeros(shard.count, features, true)
                                : Tensor::from(v2.mat().bottomRows(shard.count));
      v = cfg_combine(ex, vc, vu, scale, false);
    } else {
      const Tensor vc =
          run(1, x, &cond.text, cfg.pooled_dim > 0 ? &cond.pooled : nullptr, {st.class_label});
      const Tensor vu =
          run(1, x, &uncond.text, cfg.pooled_dim > 0 ? &uncond.pooled : nullptr, {null_class});
      v = cfg_combine(ex, vc, vu, scale, rescale);
    }
    euler_step(ex, x, v, sigma, next);
    if (st.known_latent) inpaint_blend(ex, x, mask, known, noise, next);
    if (!phantom && !x.mat().allFinite())
      throw NumericError("step " + std::to_string(i) + " of " + std::to_string(out.steps) +
                         ": non-finite values (NaN or infinity) first appear in the latent "
                         "after the sampler's update (an initial latent or a velocity that "
                         "overflows float32, whose largest finite value is 3.4e38)");
  }
  if (replay != nullptr) replay->begin_region("latent gather", false);

  // Gather every rank's tokens (padded to the largest shard) and unpack the latent.
  const std::int64_t max_rows = shard_tokens(total, ranks, 0).count;
  std::vector<float> send, recv;
  if (!phantom) {
    send.assign(static_cast<size_t>(max_rows * features), 0.0f);
    std::copy(x.data().begin(), x.data().end(), send.begin());
    recv.resize(static_cast<size_t>(max_rows * features * ranks));
  }
  sp.all_gather(send, recv, max_rows * features, "latent_all_gather");
  Tensor tokens = Tensor::zeros(total, features, phantom);
  if (!phantom)
    for (int r = 0; r < ranks; ++r) {
      const TokenShard s = shard_tokens(total, ranks, r);
      tokens.mat().middleRows(s.begin, s.count) =
          ConstMatMap(recv.data() + r * max_rows * features, s.count, features);
    }
  out.latent = unpatchify(tokens, c, lh, lw, p, lf);
  out.strategy_stats = attn->stats();
  out.step_cache = step_cache.stats();
  if (blocks)
    out.strategy_stats.merge(blocks->replayed());  // sums only: its ranks and cache size are 0
  return out;
}

}  // namespace cocodiff::dit
