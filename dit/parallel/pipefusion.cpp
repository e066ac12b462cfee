#include "dit/parallel/pipefusion.hpp"

#include <algorithm>
#include <cmath>
#include <deque>
#include <memory>
#include <utility>

#include "core/errors.hpp"
#include "dit/layers.hpp"
#include "dit/model.hpp"
#include "dit/parallel/sp_attention.hpp"
#include "dit/parallel/strategies.hpp"
#include "dit/pipeline.hpp"
#include "dit/sampler.hpp"
#include "dit/weights.hpp"

namespace cocodiff::dit {

namespace {

size_t u(std::int64_t i) { return static_cast<size_t>(i); }

std::vector<ColumnRange> head_columns(const HeadSplit& hs, int head_dim) {
  std::vector<ColumnRange> c;
  for (size_t d = 0; d < hs.begin.size(); ++d)
    c.push_back({std::int64_t{hs.begin[d]} * head_dim, std::int64_t{hs.count[d]} * head_dim});
  return c;
}

// The families whose forward runs a stage's blocks, for messages.
std::string stage_families() {
  std::string list;
  for (const std::string& f : model_family_names())
    if (model_family(f).stage_blocks) list += (list.empty() ? "" : ", ") + f;
  return list;
}

}  // namespace

StageBlocks pipefusion_stage_blocks(int blocks, int degree, int stage) {
  const TokenShard s = shard_tokens(blocks, degree, stage);
  return {static_cast<int>(s.begin), static_cast<int>(s.count)};
}

TokenShard pipefusion_patch(int rows, int width, int patches, int m) {
  const TokenShard r = shard_tokens(rows, patches, m);
  return {r.begin * width, r.count * width, std::int64_t{rows} * width};
}

std::optional<ModelConfigProblem> pipefusion_problem(const ModelConfig& cfg,
                                                     const StrategyOptions& o, int ranks,
                                                     const TokenGrid& grid) {
  const ModelFamily& fam = model_family(cfg.family);
  if (!fam.stage_blocks)
    return ModelConfigProblem("run.strategy",
                              "a model whose family runs a pipeline stage's blocks (" +
                                  stage_families() + ") for \"pipefusion\"",
                              cfg.name + " (family " + cfg.family + ")");
  const int blocks = fam.stage_blocks(cfg);
  const int degree = o.pipefusion_degree > 0 ? o.pipefusion_degree : ranks;
  const std::string d = std::to_string(degree);
  if (ranks % degree != 0)
    return ModelConfigProblem("parallel.pipefusion_degree",
                              "a divisor of the " + std::to_string(ranks) +
                                  " ranks of a pipeline (stages x Ulysses degree)",
                              d);
  if (degree > blocks)
    return ModelConfigProblem(
        "parallel.pipefusion_degree",
        "at most the " + std::to_string(blocks) + " transformer blocks of " + cfg.name, d);
  const int patches = o.pipefusion_patches > 0 ? o.pipefusion_patches : degree;
  const int ulysses = ranks / degree;
  const int rows = grid.frames * grid.height;  // a video's rows, frame after frame
  if (o.pipefusion_patches < 0 || patches > rows || patches > 4096 ||
      std::int64_t{rows / patches} * grid.width < ulysses)
    return ModelConfigProblem("pipefusion.patches",
                              "1 to the " + std::string(grid.frames > 1 ? "video's " : "image's ") +
                                  std::to_string(rows) +
                                  " token rows, each patch at least one token per rank of a "
                                  "stage (Ulysses degree " +
                                  std::to_string(ulysses) + ")",
                              std::to_string(o.pipefusion_patches));
  if (o.pipefusion_warmup_steps < 1)
    return ModelConfigProblem("pipefusion.warmup_steps",
                              "at least 1 (the first steps fill every layer's K/V cache)",
                              std::to_string(o.pipefusion_warmup_steps));
  if (cfg.heads % ulysses != 0 && !o.uneven_heads)
    return ModelConfigProblem("parallel.pipefusion_degree",
                              "a degree that leaves a Ulysses degree dividing the " +
                                  std::to_string(cfg.heads) +
                                  " heads (or ulysses.uneven_heads = true)",
                              d + " (Ulysses degree " + std::to_string(ulysses) + ")");
  if (o.shard_text)
    return ModelConfigProblem("parallel.shard_text", "false with \"pipefusion\"", "true");
  if (o.compress != "none")
    return ModelConfigProblem("compress.all_to_all", "\"none\" with \"pipefusion\"",
                              "\"" + o.compress + "\"");
  if (grid.frames != 1 && !fam.video)
    return ModelConfigProblem("run.frames", "1 (" + cfg.name + " makes images)",
                              std::to_string(grid.frames));
  return std::nullopt;
}

PipeFusionAttention::PipeFusionAttention(Communicator& ulysses) : group_(ulysses, false) {}

void PipeFusionAttention::begin_forward(int /*step*/, int pass) {
  pass_ = pass;
  layer_ = 0;
}

Tensor PipeFusionAttention::gather_part(const Exec& ex, const QkvSource& src, int s, QkvPart part,
                                        const AttentionShape& shape) {
  const int p = group_.size();
  const HeadSplit hs(shape.heads, p);
  const int h0 = hs.begin[u(group_.rank())], hl = hs.count[u(group_.rank())];
  if (!src.sharded(s) || p == 1) {
    // The text (replicated), or a stage of one rank: this rank's heads, no exchange.
    const int a = p == 1 ? 0 : h0, b = p == 1 ? shape.heads : h0 + hl;
    Tensor x = src.project(ex, s, part, a, b);
    src.prepare(ex, s, part, x, 0, b - a, 0);
    return x;
  }
  // The patch's tokens, all heads -> this rank's heads of every token of the patch.
  Tensor x = src.project(ex, s, part, 0, shape.heads);
  src.prepare(ex, s, part, x, 0, shape.heads, 0);
  static constexpr std::string_view kA2a[3] = {"q_all_to_all", "k_all_to_all", "v_all_to_all"};
  const std::int64_t width = std::int64_t{hl} * shape.head_dim;
  std::unique_ptr<BlockExchange> xc =
      start_to_heads(ex, group_, x, patch_.count, shape.batch, head_columns(hs, shape.head_dim),
                     std::string(kA2a[static_cast<int>(part)]));
  Tensor y = Tensor::zeros(shape.batch * patch_.count, width, ex.phantom);
  unpack_to_heads(ex, group_, *xc, patch_.count, shape.batch, 0, width, y);
  return y;
}

// cache [B * total, w]: rows b * total + patch.begin + t <- fresh rows b * patch.count + t
const Tensor& PipeFusionAttention::refresh_cache(const Exec& ex, int key, const Tensor& fresh,
                                                 std::int64_t total, int batch) {
  Tensor& c = cache_[key];
  if (c.rows() == 0) {
    COCO_CHECK(patch_.count == total, "pipefusion: a layer's first pass must hold every token");
    c = Tensor::zeros(batch * total, fresh.cols(), ex.phantom);
  }
  COCO_CHECK(c.rows() == batch * total && c.cols() == fresh.cols(), "pipefusion cache shape");
  if (!ex.phantom)
    for (int b = 0; b < batch; ++b)
      c.mat().middleRows(b * total + patch_.begin, patch_.count) =
          fresh.mat().middleRows(b * patch_.count, patch_.count);
  ex.charge(OpKind::kCopy, 0, 2.0 * static_cast<double>(fresh.numel()), "kv_cache_update",
            memory_shape(KernelClass::kCopy, fresh.numel(), fresh.cols()));
  return c;
}

// attend: queries of the text and the patch, keys and values of the text and every image token
// (the patch's fresh, the others from the cache).
std::vector<Tensor> PipeFusionAttention::attend(const Exec& ex, const QkvSource& src,
                                                const AttentionShape& shape) {
  const int p = group_.size(), batch = shape.batch, streams = src.num_streams();
  const HeadSplit hs(shape.heads, p);
  const int heads_here = p == 1 ? shape.heads : hs.count[u(group_.rank())];
  const int layer = layer_++;
  std::vector<Tensor> parts[3];
  std::vector<const Tensor*> q, k, v;
  std::vector<std::int64_t> tokens;
  for (int part = 0; part < 3; ++part)
    for (int s = 0; s < streams; ++s)
      parts[part].push_back(gather_part(ex, src, s, static_cast<QkvPart>(part), shape));
  for (int s = 0; s < streams; ++s) {
    q.push_back(&parts[0][u(s)]);
    if (src.sharded(s)) {
      const std::int64_t total = src.total_tokens(s);
      const int key = ((pass_ * 4096 + layer) * 8 + s) * 2;
      k.push_back(&refresh_cache(ex, key, parts[1][u(s)], total, batch));
      v.push_back(&refresh_cache(ex, key + 1, parts[2][u(s)], total, batch));
      tokens.push_back(patch_.count);
    } else {
      k.push_back(&parts[1][u(s)]);
      v.push_back(&parts[2][u(s)]);
      tokens.push_back(src.rows(s) / batch);
    }
  }
  const Tensor o = attention(
      ex, concat_tokens(ex, q, batch, "q_concat"), concat_tokens(ex, k, batch, "k_concat"),
      concat_tokens(ex, v, batch, "v_concat"), heads_here, shape.head_dim, batch, "attention");
  std::vector<Tensor> outs = split_tokens(ex, o, tokens, batch, "o_split");
  if (p == 1) return outs;
  const std::vector<ColumnRange> cols = head_columns(hs, shape.head_dim);
  for (int s = 0; s < streams; ++s) {
    Tensor& os = outs[u(s)];
    if (!src.wants_output(s))
      os = Tensor::zeros(src.rows(s), std::int64_t{shape.heads} * shape.head_dim, ex.phantom);
    else if (src.sharded(s))
      os = to_sequence(ex, group_, os, patch_.count, batch, cols, "o_all_to_all");
    else
      os = gather_columns(ex, group_.comm(), os, cols, "text_o_all_gather");
  }
  return outs;
}

namespace {

// Tags of the pipeline's messages on the group (patch m adds m; patches <= 4096, so every tag
// stays below MPI's least upper bound, 32767).
constexpr int kTextTag = 9999, kHiddenTag = 10000, kFinalTag = 14999, kLatentTag = 15000;
// Tag of the CFG-parallel swap of a patch's prediction on the world.
constexpr int kCfgTag = 7002;

// Rows [s.begin, s.begin + s.count) of x [N, F].
Tensor rows_of(const Tensor& x, const TokenShard& s) {
  if (x.phantom()) return Tensor::zeros(s.count, x.cols(), true);
  return Tensor::from(x.mat().middleRows(s.begin, s.count));
}

// [a; a] or [a; b] stacked by rows (a batch of 2, the conditional sequence first).
Tensor stack2(const Tensor& a, const Tensor& b) {
  if (a.phantom()) return Tensor::zeros(a.rows() + b.rows(), a.cols(), true);
  Mat m(a.rows() + b.rows(), a.cols());
  m << a.mat(), b.mat();
  return Tensor::from(std::move(m));
}

// One rank of the pipeline: its stage, its share of the patches, and what it holds.
struct Pipe {
  Pipe(Communicator& world_, Communicator& group_, const ModelConfig& cfg_, const Weights& w_,
       const RunSettings& st_, const Exec& ex_)
      : world(world_), group(group_), cfg(cfg_), w(w_), st(st_), ex(ex_) {}
  Communicator& world;
  Communicator& group;  // the pipeline (a CFG half, or every rank)
  std::unique_ptr<Communicator> stage_comm;
  const ModelConfig& cfg;
  const Weights& w;
  const RunSettings& st;
  Exec ex;
  std::unique_ptr<Model> model;
  std::unique_ptr<PipeFusionAttention> attn;
  int degree = 1, ulysses = 1, stage = 0, index = 0;
  // The text is a stream of the blocks (joint attention): its hidden states go from stage to
  // stage. False: no text (DiT) or text that every stage embeds itself (Wan's cross-attention).
  bool text_stream = true;
  StageBlocks blocks;
  TokenGrid grid;
  std::vector<TokenShard> whole, patches;  // a warm-up step's one patch; a later step's
  bool cfg_parallel = false;
  int branch = 0;    // CFG-parallel: 0 conditional, 1 unconditional
  int batch = 1;     // 2: batch CFG
  double scale = 1;  // guidance
  bool use_cfg = false;
  Tensor text, pooled;  // this pass's conditioning (batch rows)
  std::vector<int> labels;
  Tensor x;  // [N, F]: the latent, valid on the rows this rank holds (first and last stages)
  std::vector<double> sigmas;
  int steps = 0;
  int forwards = 0;
  // Requests in flight and the buffers they read or fill.
  std::deque<std::pair<Request, Tensor>> sends;  // a deque: its buffers never move
  std::vector<Request> hidden_recv, latent_recv, latent_wait;
  std::vector<Tensor> hidden_in, latent_in, latent_next;
  Request text_recv;
  Tensor text_in;

  bool first() const { return stage == 0; }
  bool last() const { return stage == degree - 1; }
  int peer(int s) const { return s * ulysses + index; }
  TokenShard sub(const TokenShard& patch, int j) const {
    TokenShard t = shard_tokens(patch.count, ulysses, j);
    t.begin += patch.begin;
    t.total = patch.total;
    return t;
  }
  TokenShard mine(const TokenShard& patch) const { return sub(patch, index); }
  const std::vector<TokenShard>& layout(int step) const {
    return step < st.strategy_options.pipefusion_warmup_steps ? whole : patches;
  }
};

void send_tensor(Pipe& pp, Tensor t, int dest, int tag, std::string_view label) {
  const std::int64_t count = t.numel();
  pp.sends.emplace_back(Request(), std::move(t));
  Tensor& held = pp.sends.back().second;
  pp.sends.back().first = pp.group.isend(held.data(), count, dest, tag, label);
}

// Posts the receives of step `step`: the hidden states from the stage before, and on the first
// stage the next step's latents from the last one.
void post_receives(Pipe& pp, int step) {
  const std::vector<TokenShard>& lay = pp.layout(step);
  const std::int64_t d = pp.cfg.hidden();
  const bool ph = pp.st.phantom;
  pp.hidden_recv.clear();
  pp.hidden_in.clear();
  pp.hidden_in.reserve(lay.size());  // the receives fill these buffers: they must not move
  if (!pp.first()) {
    if (pp.text_stream) {
      pp.text_in = Tensor::uninitialized(pp.text.rows(), d, ph);
      pp.text_recv = pp.group.irecv(pp.text_in.data(), pp.text_in.numel(), pp.peer(pp.stage - 1),
                                    kTextTag, "pipefusion_text");
    }
    for (size_t m = 0; m < lay.size(); ++m) {
      pp.hidden_in.push_back(Tensor::uninitialized(pp.batch * pp.mine(lay[m]).count, d, ph));
      Tensor& b = pp.hidden_in.back();
      pp.hidden_recv.push_back(pp.group.irecv(b.data(), b.numel(), pp.peer(pp.stage - 1),
                                              kHiddenTag + static_cast<int>(m),
                                              "pipefusion_hidden"));
    }
  }
  pp.latent_recv.clear();
  pp.latent_next.clear();
  if (!pp.first() || pp.degree == 1 || step + 1 >= pp.steps) return;
  const std::vector<TokenShard>& next = pp.layout(step + 1);
  pp.latent_next.reserve(next.size());
  for (size_t m = 0; m < next.size(); ++m) {
    pp.latent_next.push_back(Tensor::uninitialized(pp.mine(next[m]).count, pp.x.cols(), ph));
    Tensor& b = pp.latent_next.back();
    pp.latent_recv.push_back(pp.group.irecv(b.data(), b.numel(), pp.peer(pp.degree - 1),
                                            kLatentTag + static_cast<int>(m), "pipefusion_latent"));
  }
}

// Every member of the last stage's Ulysses group gets every row of x (each held those of its
// share of `lay`'s patches): one all_gather, padded to the largest share.
void share_rows(Pipe& pp, const std::vector<TokenShard>& lay) {
  if (pp.ulysses == 1) return;
  const std::int64_t f = pp.x.cols();
  std::int64_t max_rows = 0;
  for (int j = 0; j < pp.ulysses; ++j) {
    std::int64_t r = 0;
    for (const TokenShard& p : lay) r += pp.sub(p, j).count;
    max_rows = std::max(max_rows, r);
  }
  std::vector<float> send, recv;
  if (!pp.st.phantom) {
    send.assign(u(max_rows * f), 0.0f);
    std::int64_t at = 0;
    for (const TokenShard& p : lay) {
      const TokenShard s = pp.mine(p);
      MatMap(send.data() + at * f, s.count, f) = pp.x.mat().middleRows(s.begin, s.count);
      at += s.count;
    }
    recv.resize(u(max_rows * f * pp.ulysses));
  }
  pp.stage_comm->all_gather(send, recv, max_rows * f, "pipefusion_latent_gather");
  if (pp.st.phantom) return;
  for (int j = 0; j < pp.ulysses; ++j) {
    std::int64_t at = 0;
    for (const TokenShard& p : lay) {
      const TokenShard s = pp.sub(p, j);
      pp.x.mat().middleRows(s.begin, s.count) =
          ConstMatMap(recv.data() + (j * max_rows + at) * f, s.count, f);
      at += s.count;
    }
  }
}

// The first stage's input of patch m of `step`: its rows of the latent (batch CFG: twice).
Tensor stage_input(Pipe& pp, int step, int m) {
  const TokenShard mine = pp.mine(pp.layout(step)[u(m)]);
  Tensor x;
  if (step == 0 || pp.degree == 1) {
    x = rows_of(pp.x, mine);
  } else {
    pp.latent_wait[u(m)].wait();
    x = std::move(pp.latent_in[u(m)]);
  }
  return pp.batch == 2 ? stack2(x, x) : x;
}

// This stage's blocks on patch m of `step`; the last stage returns the model's prediction, the
// others send their hidden states on (the text's with patch 0) and return nothing.
Tensor run_patch(Pipe& pp, int step, int m) {
  const TokenShard& patch = pp.layout(step)[u(m)];
  Tensor x_in, image, text;
  if (pp.first()) {
    x_in = stage_input(pp, step, m);
  } else {
    pp.hidden_recv[u(m)].wait();
    image = std::move(pp.hidden_in[u(m)]);
    if (m == 0 && pp.text_stream) pp.text_recv.wait();
    text = pp.text_in;  // every patch's pass starts from the text patch 0 brought
  }
  const StagePass sp{
      pp.blocks.first, pp.blocks.first + pp.blocks.count, pp.first(), pp.last(), &image, &text};
  ForwardInputs in;
  in.batch = pp.batch;
  in.x = &x_in;
  in.grid = pp.grid;
  in.shard = pp.mine(patch);
  in.sigmas.assign(u(pp.batch), static_cast<float>(pp.sigmas[u(step)]));
  if (pp.cfg.guidance_embed) in.guidance.assign(u(pp.batch), static_cast<float>(pp.scale));
  in.text = &pp.text;
  in.pooled = pp.cfg.pooled_dim > 0 ? &pp.pooled : nullptr;
  in.class_labels = pp.labels;
  in.stage = &sp;
  pp.attn->set_patch(patch);
  pp.attn->begin_forward(step, 0);
  ++pp.forwards;
  Tensor out = pp.model->forward(pp.ex, pp.w, *pp.attn, in);
  if (pp.last()) return out;
  const int next = pp.peer(pp.stage + 1);
  if (m == 0 && pp.text_stream) send_tensor(pp, std::move(text), next, kTextTag, "pipefusion_text");
  send_tensor(pp, std::move(image), next, kHiddenTag + m, "pipefusion_hidden");
  return Tensor();
}

// The last stage's latent of patch m of `step` goes to the first stage for the next step; at
// the switch from whole-image steps to patches, after the step's last patch, every patch's.
void hand_back(Pipe& pp, int step, int m, Tensor xs) {
  if (step + 1 >= pp.steps) return;
  const int warmup = pp.st.strategy_options.pipefusion_warmup_steps;
  if ((step + 1 < warmup) == (step < warmup)) {
    if (pp.degree > 1)
      send_tensor(pp, std::move(xs), pp.peer(0), kLatentTag + m, "pipefusion_latent");
    return;
  }
  share_rows(pp, pp.layout(step));
  if (pp.degree == 1) return;
  const std::vector<TokenShard>& next = pp.layout(step + 1);
  for (size_t k = 0; k < next.size(); ++k)
    send_tensor(pp, rows_of(pp.x, pp.mine(next[k])), pp.peer(0), kLatentTag + static_cast<int>(k),
                "pipefusion_latent");
}

// The last stage: guidance, then the sampler's step on the patch's rows.
void finish_patch(Pipe& pp, int step, int m, const Tensor& out) {
  const TokenShard mine = pp.mine(pp.layout(step)[u(m)]);
  const Exec& ex = pp.ex;
  const bool ph = pp.st.phantom;
  const bool rescale = pp.cfg.cfg_mode == CfgMode::kTrue && pp.cfg.cfg_rescale;
  Tensor v;
  if (!pp.use_cfg) {
    v = out;
  } else if (pp.cfg_parallel) {
    // The last stages of the two halves hold the same rows: they swap their predictions.
    Tensor vo = Tensor::uninitialized(mine.count, out.cols(), ph);
    const int half = pp.world.size() / 2;
    const int peer = pp.branch == 0 ? pp.world.rank() + half : pp.world.rank() - half;
    Request rr = pp.world.irecv(vo.data(), vo.numel(), peer, kCfgTag, "cfg_branch_output");
    Request sr = pp.world.isend(out.data(), out.numel(), peer, kCfgTag, "cfg_branch_output");
    rr.wait();
    sr.wait();
    v = pp.branch == 0 ? cfg_combine(ex, out, vo, pp.scale, rescale)
                       : cfg_combine(ex, vo, out, pp.scale, rescale);
  } else {
    const Tensor vc = ph ? Tensor::zeros(mine.count, out.cols(), true)
                         : Tensor::from(out.mat().topRows(mine.count));
    const Tensor vu = ph ? Tensor::zeros(mine.count, out.cols(), true)
                         : Tensor::from(out.mat().bottomRows(mine.count));
    v = cfg_combine(ex, vc, vu, pp.scale, false);
  }
  Tensor xs = rows_of(pp.x, mine);
  euler_step(ex, xs, v, pp.sigmas[u(step)], pp.sigmas[u(step) + 1]);
  if (!ph) {
    if (!xs.mat().allFinite())
      throw NumericError("step " + std::to_string(step) + " of " + std::to_string(pp.steps) +
                         ": non-finite values (NaN or infinity) in the latent after the "
                         "sampler's update");
    pp.x.mat().middleRows(mine.begin, mine.count) = xs.mat();
  }
  hand_back(pp, step, m, std::move(xs));
}

void wait_sends(Pipe& pp) {
  for (auto& s : pp.sends) s.first.wait();
  pp.sends.clear();
}

// After the last step: the last stage's rows to every rank of the pipeline.
void spread_latent(Pipe& pp) {
  if (pp.last()) share_rows(pp, pp.layout(pp.steps - 1));
  if (pp.degree == 1) return;
  if (pp.last()) {
    for (int s = 0; s + 1 < pp.degree; ++s) {
      Tensor copy = pp.x;
      send_tensor(pp, std::move(copy), pp.peer(s), kFinalTag, "pipefusion_final_latent");
    }
    wait_sends(pp);
    return;
  }
  pp.group
      .irecv(pp.x.data(), pp.x.numel(), pp.peer(pp.degree - 1), kFinalTag,
             "pipefusion_final_latent")
      .wait();
}

// Guidance and the conditioning of this rank's passes: batch CFG stacks [cond; uncond], each
// CFG-parallel half takes its own, true CFG in one pipeline is refused.
void set_conditioning(Pipe& pp) {
  const ModelConfig& cfg = pp.cfg;
  const RunSettings& st = pp.st;
  pp.scale = st.cfg_scale >= 0 ? st.cfg_scale : cfg.cfg_scale;
  pp.use_cfg = cfg.cfg_mode != CfgMode::kNone && pp.scale != 1.0;
  if (pp.cfg_parallel && !pp.use_cfg)
    throw ConfigError("parallel.cfg_degree 2 needs classifier-free guidance: " + cfg.name +
                      " has no unconditional pass at this scale");
  if (pp.use_cfg && !pp.cfg_parallel && cfg.cfg_mode == CfgMode::kTrue)
    throw ConfigError("run.strategy \"pipefusion\": " + cfg.name +
                      " runs true CFG (two passes a step); run it with parallel.cfg_degree = 2");
  const bool class_tokens = model_family(cfg.family).class_tokens && cfg.num_classes > 0;
  if (class_tokens && (st.class_label < 0 || st.class_label >= cfg.num_classes))
    throw ConfigError("run.class_label " + std::to_string(st.class_label) + " is out of range: " +
                      cfg.name + " has classes 0.." + std::to_string(cfg.num_classes - 1));
  auto make = [&](bool negative) {
    if (class_tokens)
      return class_conditioning(cfg, pp.w, negative ? cfg.num_classes : st.class_label, st.phantom);
    return make_text_conditioning(cfg, st.seed, negative, st.phantom);
  };
  const TextConditioning cond = make(false);
  const int null_class = cfg.num_classes;
  if (!pp.use_cfg) {
    pp.text = cond.text;
    pp.pooled = cond.pooled;
    pp.labels = {st.class_label};
  } else if (pp.cfg_parallel) {
    const TextConditioning mine = pp.branch == 0 ? cond : make(true);
    pp.text = mine.text;
    pp.pooled = mine.pooled;
    pp.labels = {pp.branch == 0 ? st.class_label : null_class};
  } else {
    const TextConditioning uncond = make(true);
    pp.batch = 2;
    pp.text = stack2(cond.text, uncond.text);
    if (cfg.pooled_dim > 0) pp.pooled = stack2(cond.pooled, uncond.pooled);
    pp.labels = {st.class_label, null_class};
  }
}

// This rank's stage, Ulysses group, blocks and patches; refuses what PipeFusion cannot run.
void place(Pipe& pp, int lf, int lh, int lw) {
  const ModelConfig& cfg = pp.cfg;
  const StrategyOptions& o = pp.st.strategy_options;
  const ModelFamily& fam = model_family(cfg.family);
  pp.grid = TokenGrid{lf, lh / cfg.patch_size, lw / cfg.patch_size};
  if (std::optional<ModelConfigProblem> bad = pipefusion_problem(cfg, o, pp.group.size(), pp.grid))
    throw ConfigError(bad->key + ": expected " + bad->expected + ", found " + bad->found);
  if (pp.st.known_latent || pp.st.mask)
    throw ConfigError("run.inpaint_image: inpainting does not run with \"pipefusion\"");
  if (pp.st.step_cache.active())
    throw ConfigError("step_cache.policy: a step cache does not run with \"pipefusion\"");
  pp.degree = o.pipefusion_degree > 0 ? o.pipefusion_degree : pp.group.size();
  pp.ulysses = pp.group.size() / pp.degree;
  pp.stage = pp.group.rank() / pp.ulysses;
  pp.index = pp.group.rank() % pp.ulysses;
  pp.stage_comm = pp.group.split(pp.stage, pp.group.rank());
  pp.blocks = pipefusion_stage_blocks(fam.stage_blocks(cfg), pp.degree, pp.stage);
  pp.text_stream = fam.text_conditioned && fam.joint_text;
  const int patches = o.pipefusion_patches > 0 ? o.pipefusion_patches : pp.degree;
  pp.whole = {TokenShard{0, pp.grid.tokens(), pp.grid.tokens()}};
  // A video's patches are runs of its rows taken frame after frame (see pipefusion.hpp).
  for (int m = 0; m < patches; ++m)
    pp.patches.push_back(
        pipefusion_patch(pp.grid.frames * pp.grid.height, pp.grid.width, patches, m));
  pp.attn = std::make_unique<PipeFusionAttention>(*pp.stage_comm);
  pp.model = make_model(cfg);
}

}  // namespace

RunOutput generate_pipefusion(Communicator& comm, const ModelConfig& cfg, const Weights& w,
                              const RunSettings& st) {
  const bool phantom = st.phantom;
  const int cell = cfg.vae_scale * cfg.patch_size;
  for (const int px : {st.pixel_height(), st.pixel_width()})
    if (px <= 0 || px % cell != 0)
      throw ConfigError("image side " + std::to_string(px) + " is not a positive multiple of " +
                        std::to_string(cell) + " pixels (VAE scale x patch size) for model " +
                        cfg.name);
  if (st.cfg_degree != 1 && st.cfg_degree != 2)
    throw ConfigError("parallel.cfg_degree " + std::to_string(st.cfg_degree) + ": expected 1 or 2");
  if (st.cfg_degree == 2 && comm.size() % 2 != 0)
    throw ConfigError("parallel.cfg_degree 2 needs an even rank count");
  const bool cfg_parallel = st.cfg_degree == 2;
  const int branch = cfg_parallel ? comm.rank() / (comm.size() / 2) : 0;
  std::unique_ptr<Communicator> half = cfg_parallel ? comm.split(branch, comm.rank()) : nullptr;
  Pipe pp(comm, cfg_parallel ? *half : comm, cfg, w, st,
          Exec{comm, phantom, phantom ? nullptr : &w.math_cache()});
  pp.ex.model = cfg.name;
  pp.cfg_parallel = cfg_parallel;
  pp.branch = branch;
  // Video: the VAE keeps the first frame and compresses the others in time.
  const int ts = cfg.vae_temporal_scale;
  if (st.frames < 1 || (st.frames - 1) % ts != 0)
    throw ConfigError("run.frames " + std::to_string(st.frames) + ": expected 1 + a multiple of " +
                      std::to_string(ts) + " (the temporal compression of " + cfg.name + "'s VAE)");
  const int lf = (st.frames - 1) / ts + 1;
  const int lh = st.pixel_height() / cfg.vae_scale, lw = st.pixel_width() / cfg.vae_scale;
  place(pp, lf, lh, lw);
  set_conditioning(pp);
  const std::int64_t total = pp.grid.tokens();
  pp.steps = st.steps > 0 ? st.steps : cfg.default_steps;
  pp.sigmas = sigma_schedule(cfg, pp.steps, total);
  pp.x = st.initial_latent
             ? (phantom
                    ? Tensor::zeros(total, cfg.token_features(), true)
                    : patchify(*st.initial_latent, cfg.latent_channels, lh, lw, cfg.patch_size, lf))
             : seeded_normal_rows(0, total, cfg.token_features(), st.seed, "latent_noise", 1.0f,
                                  phantom);
  for (int i = 0; i < pp.steps; ++i) {
    if (st.on_step) st.on_step(comm.rank(), i);
    if (st.on_step_clock) st.on_step_clock(comm.rank(), i, comm.now());
    pp.latent_in = std::move(pp.latent_next);
    pp.latent_wait = std::move(pp.latent_recv);
    post_receives(pp, i);
    const int n = static_cast<int>(pp.layout(i).size());
    for (int m = 0; m < n; ++m) {
      const Tensor out = run_patch(pp, i, m);
      if (pp.last()) finish_patch(pp, i, m, out);
    }
    wait_sends(pp);
  }
  spread_latent(pp);
  RunOutput out;
  out.latent = unpatchify(pp.x, cfg.latent_channels, lh, lw, cfg.patch_size, lf);
  out.latent_frames = lf;
  out.latent_height = lh;
  out.latent_width = lw;
  out.tokens = total;
  out.local_tokens = pp.mine(pp.whole[0]).count;
  out.steps = pp.steps;
  out.forwards = pp.forwards;
  out.batch = pp.batch;
  out.sigmas = pp.sigmas;
  return out;
}

double pipefusion_tile_bytes(const StrategyMemoryQuery& q) {
  const ModelConfig& m = *q.model;
  const double n = static_cast<double>(q.tokens);
  const double layers = std::ceil(static_cast<double>(m.attention_layers()) / q.pipefusion_degree);
  const double width =
      std::ceil(static_cast<double>(m.heads) / std::max(1, q.ulysses_degree)) * m.head_dim;
  return (2 * layers * q.batch * n * width + n * m.token_features()) * sizeof(float);
}

void pipefusion_search(const SearchShape& s, const SearchEmit& emit) {
  const ModelConfig& m = *s.model;
  const ModelFamily& fam = model_family(m.family);
  if (!fam.stage_blocks) return;
  const RunSettings& run = *s.settings;
  const TokenGrid grid{m.latent_frames(run.frames),
                       m.latent_side(run.pixel_height()) / m.patch_size,
                       m.latent_side(run.pixel_width()) / m.patch_size};
  // A pipeline runs one pass a step: true CFG runs a pipeline per branch.
  const bool true_cfg = s.cfg_capable && m.cfg_mode == CfgMode::kTrue;
  for (int cfg : {1, 2}) {
    if (cfg == 2 && (!s.cfg_capable || s.ranks % 2 != 0)) continue;
    if (cfg == 1 && true_cfg) continue;
    const int sp = s.ranks / cfg;
    for (int d = 2; d <= std::min(sp, fam.stage_blocks(m)); ++d) {
      StrategyOptions o;
      o.pipefusion_degree = d;
      o.uneven_heads = true;
      if (sp % d != 0 || pipefusion_problem(m, o, sp, grid)) continue;
      SearchPoint p;
      p.strategy = "pipefusion";
      p.ulysses = sp / d;
      p.cfg = cfg;
      p.uneven_heads = m.heads % p.ulysses != 0;
      p.detail = " " + std::to_string(d) + " stages x " + std::to_string(p.ulysses);
      // Every step whole (exact): the warm-up covers the run.
      p.sets = {"parallel.pipefusion_degree=" + std::to_string(d),
                "pipefusion.warmup_steps=" + std::to_string(run.steps)};
      p.report = {{"pipefusion_degree", d}};
      emit(p);
    }
  }
}

}  // namespace cocodiff::dit
