#include "dit/parallel/sp_attention.hpp"

#include <algorithm>
#include <cstdio>

#include "core/errors.hpp"
#include "dit/layers.hpp"
#include "dit/model_family.hpp"

namespace cocodiff::dit {

namespace {

double n(std::int64_t v) { return static_cast<double>(v); }
size_t u(std::int64_t i) { return static_cast<size_t>(i); }

constexpr std::string_view kA2a[3] = {"q_all_to_all", "k_all_to_all", "v_all_to_all"};

// Per member of p: the rows of `chunk` of its shard of `total` tokens, times batch. The shards
// take two sizes (the first total % p one token more), so the rows do too: filled, not asked of
// shard_tokens member by member (a phantom exchange at 1,536 tiles does this on every tile).
std::vector<std::int64_t> shard_rows(std::int64_t total, int p, int batch, TokenChunk chunk) {
  const std::int64_t base = total / p, rem = total % p;
  std::vector<std::int64_t> r(u(p), batch * chunk.count_of(base));
  std::fill_n(r.begin(), rem, batch * chunk.count_of(base + 1));
  return r;
}

std::vector<ColumnRange> head_columns(const HeadSplit& hs, int head_dim) {
  std::vector<ColumnRange> c;
  for (size_t d = 0; d < hs.begin.size(); ++d)
    c.push_back({std::int64_t{hs.begin[d]} * head_dim, std::int64_t{hs.count[d]} * head_dim});
  return c;
}

}  // namespace

HeadSplit::HeadSplit(int heads, int parts) {
  COCO_CHECK(parts >= 1 && heads >= 1, "HeadSplit");
  int at = 0;
  for (int r = 0; r < parts; ++r) {
    const int c = heads / parts + (r < heads % parts ? 1 : 0);
    begin.push_back(at);
    count.push_back(c);
    at += c;
    max_count = std::max(max_count, c);
  }
}

// to_heads: x [B*n_me, *] -> block (me, d) = [B*n_me, cols(d).count] = x[:, cols(d)]
// (n_me: this rank's tokens, or their chunk)
std::unique_ptr<BlockExchange> start_to_heads(const Exec& ex, const SpGroup& g, const Tensor& x,
                                              std::int64_t total, int batch,
                                              std::vector<ColumnRange> cols, std::string label,
                                              VMajorChannel* v_major, TokenChunk chunk) {
  const int p = g.size();
  COCO_CHECK(x.rows() == batch * chunk.of(shard_tokens(total, p, g.rank())).count,
             "to_heads: x " + x.shape_str());
  std::vector<std::int64_t> rows = shard_rows(total, p, batch, chunk), widths(u(p));
  for (int m = 0; m < p; ++m) widths[u(m)] = cols[u(m)].count;
  auto xc =
      std::make_unique<BlockExchange>(g, BlockShapeFn(std::move(rows), std::move(widths), true),
                                      ex.phantom, std::move(label), v_major);
  xc->start(
      ex, [&](int d, MatMap out) { out = x.mat().middleCols(cols[u(d)].begin, cols[u(d)].count); });
  return xc;
}

// unpack: block (s, me) [B*n_s, w] -> y rows b*total + begin_s, columns [col0, col0 + w)
void unpack_to_heads(const Exec& ex, const SpGroup& g, BlockExchange& x, std::int64_t total,
                     int batch, std::int64_t col0, std::int64_t width, Tensor& y,
                     TokenChunk chunk) {
  x.finish(ex);
  const int p = g.size();
  const std::int64_t rows = batch * chunk.total_of(total, p);
  if (!ex.phantom && width > 0)
    for (int s = 0; s < p; ++s) {
      const TokenShard sh = chunk.of(shard_tokens(total, p, s));
      const ConstMatMap blk = x.block(s);
      for (int b = 0; b < batch; ++b)
        y.mat().block(b * total + sh.begin, col0, sh.count, width) =
            blk.middleRows(b * sh.count, sh.count);
    }
  ex.charge(OpKind::kCopy, 0, 2.0 * n(rows * width), "a2a_unpack",
            memory_shape(KernelClass::kLayoutA2a, rows * width, width));
}

// to_sequence: o [B*total, w_me] -> block (me, d) = [B*n_d, w_me] (d's tokens);
//              block (s, me) [B*n_me, w_s] -> y[:, cols(s)]
Tensor to_sequence(const Exec& ex, const SpGroup& g, const Tensor& o, std::int64_t total, int batch,
                   const std::vector<ColumnRange>& cols, std::string label) {
  const int p = g.size(), me = g.rank();
  COCO_CHECK(o.rows() == batch * total, "to_sequence: o " + o.shape_str());
  std::vector<std::int64_t> rows = shard_rows(total, p, batch, TokenChunk{}), widths(u(p));
  for (int m = 0; m < p; ++m) widths[u(m)] = cols[u(m)].count;
  BlockExchange xc(g, BlockShapeFn(std::move(rows), std::move(widths), false), ex.phantom,
                   std::move(label));
  xc.start(ex, [&](int d, MatMap out) {
    const TokenShard sh = shard_tokens(total, p, d);
    for (int b = 0; b < batch; ++b)
      out.middleRows(b * sh.count, sh.count) = o.mat().middleRows(b * total + sh.begin, sh.count);
  });
  xc.finish(ex);
  const TokenShard mine = shard_tokens(total, p, me);
  std::int64_t width = 0;
  for (const ColumnRange& c : cols) width = std::max(width, c.begin + c.count);
  Tensor y = Tensor::zeros(batch * mine.count, width, ex.phantom);
  if (!ex.phantom)
    for (int s = 0; s < p; ++s)
      if (cols[u(s)].count > 0)
        y.mat().middleCols(cols[u(s)].begin, cols[u(s)].count) = xc.block(s);
  ex.charge(OpKind::kCopy, 0, 2.0 * n(y.numel()), "a2a_unpack",
            memory_shape(KernelClass::kLayoutA2a, y.numel(), y.cols()));
  return y;
}

Tensor gather_columns(const Exec& ex, Communicator& g, const Tensor& o,
                      const std::vector<ColumnRange>& cols, std::string_view label) {
  const int p = g.size();
  std::int64_t maxw = 0, width = 0;
  for (const ColumnRange& c : cols) {
    maxw = std::max(maxw, c.count);
    width = std::max(width, c.begin + c.count);
  }
  const std::int64_t rows = o.rows(), count = rows * maxw;
  std::vector<float> send, recv;
  if (!ex.phantom) {
    send.assign(u(count), 0.0f);
    if (o.cols() > 0) MatMap(send.data(), rows, maxw).leftCols(o.cols()) = o.mat();
    recv.resize(u(count * p));
  }
  g.all_gather(send, recv, count, label);
  // Every column is copied below: the ranks' column ranges cover [0, width) back to back.
  Tensor y = Tensor::uninitialized(rows, width, ex.phantom);
  if (!ex.phantom)
    for (int i = 0; i < p; ++i)
      if (cols[u(i)].count > 0)
        y.mat().middleCols(cols[u(i)].begin, cols[u(i)].count) =
            ConstMatMap(recv.data() + i * count, rows, maxw).leftCols(cols[u(i)].count);
  ex.charge(OpKind::kCopy, 0, 2.0 * n(y.numel()), "gather_unpack",
            memory_shape(KernelClass::kLayoutA2a, y.numel(), y.cols()));
  return y;
}

SpAttention::SpAttention(std::string name, Communicator& group, const ModelConfig& cfg,
                         SpFeatures features, const StrategyOptions& options)
    : name_(std::move(name)), group_(group, features.tapa), f_(features), opt_(options) {
  group_.set_fp8(options.compress == "fp8");
  group_.set_residual(options.compress == "residual");
  if (cfg.heads % group.size() != 0 && !opt_.uneven_heads)
    throw ConfigError(name_ + ": " + std::to_string(cfg.heads) +
                      " attention heads are not divisible by the sequence-parallel degree " +
                      std::to_string(group.size()) +
                      " (set ulysses.uneven_heads = true for DeepSpeed's uneven split, or use "
                      "usp)");
  if (f_.chunks < 1) throw ConfigError("pipeline.chunks must be >= 1");
  check_text_shards(cfg, options, group.size());
  if (f_.v_major) VMajorCache probe(opt_, group.topology(), true);  // tier names checked now
}

void SpAttention::begin_forward(int step, int pass) {
  step_ = step;
  pass_ = pass;
  group_.begin_forward(step, pass);
  if (v_major_) v_major_->begin_forward(step, pass);
}

std::string SpAttention::step_key(int step) const {
  // Residual exchanges send the blocks themselves in the first step, residuals after it.
  const std::string residual = !group_.residual() ? ""
                               : step == 0        ? "residual exact "
                                                  : "residual ";
  if (!f_.v_major) return residual;
  return residual + (VMajorCache::full_step_at(opt_, step) ? "v_major full" : "v_major selective");
}

std::optional<AttentionStrategy::BlockDeps> SpAttention::next_block() const {
  BlockDeps d;
  d.key = step_key(step_);
  // V-Major counts a layer's cache the first time it exchanges that layer's V.
  d.first_exchange = f_.v_major && (v_major_ == nullptr || !v_major_->next_layer_seen());
  return d;
}

void SpAttention::skip_layers(int layers, double v_major_cache_bytes) {
  if (v_major_) v_major_->skip_layers(layers, v_major_cache_bytes);
}

std::optional<TokenShard> SpAttention::text_shard(std::int64_t text_tokens) const {
  if (!opt_.shard_text) return std::nullopt;
  return shard_tokens(text_tokens, group_.size(), group_.rank());
}

void check_text_shards(const ModelConfig& cfg, const StrategyOptions& options, int degree) {
  if (!options.shard_text) return;
  const ModelFamily& fam = model_family(cfg.family);
  if (!fam.text_conditioned || !fam.joint_text)
    throw ConfigError("parallel.shard_text: " + cfg.name +
                      " has no text stream in its attention to shard");
  if (cfg.text_tokens % degree != 0)
    throw ConfigError("parallel.shard_text: the " + std::to_string(cfg.text_tokens) +
                      " text tokens of " + cfg.name + " are not divisible by the Ulysses degree " +
                      std::to_string(degree) +
                      " (xDiT shards the text only when the degree divides it)");
}

StrategyStats SpAttention::stats() const {
  StrategyStats s;
  s.v_first = v_first_;
  if (v_major_) v_major_->add_to(s);
  return s;
}

// One attend call: the layer's head split, the Q/K/V tensors its exchanges fill, those
// exchanges in flight and V-First's timings.
struct SpAttention::LayerState {
  // One exchange in flight: the part (Q, K, V) and stream it fills, and where.
  struct Pending {
    int part, stream;
    std::int64_t col0, width;  // this rank's columns of the assembled tensor
    std::unique_ptr<VMajorChannel> channel;
    std::unique_ptr<BlockExchange> x;
    TokenChunk tokens;  // the rows it carries (pipelining by tokens)
  };

  LayerState(const Exec& ex, const QkvSource& src, const AttentionShape& shape, const SpGroup& g)
      : ex(ex),
        src(src),
        shape(shape),
        p(g.size()),
        me(g.rank()),
        hs(shape.heads, p),
        hl(hs.count[u(me)]),
        h0(hs.begin[u(me)]),
        dh(shape.head_dim),
        batch(shape.batch),
        hw(std::int64_t{hl} * dh),
        head_cols(head_columns(hs, dh)),
        streams(src.num_streams()),
        clock(ex.comm) {}

  void progress();
  void wait_oldest();
  void drive(BlockExchange& x);
  void drive_all();
  void qk_prepared();

  const Exec& ex;
  const QkvSource& src;
  const AttentionShape& shape;
  const int p, me;
  const HeadSplit hs;
  const int hl, h0, dh, batch;
  const std::int64_t hw;
  const std::vector<ColumnRange> head_cols;
  const int streams;
  int v_major_layer = 0;  // V-Major's key of this layer (0 without V-Major)
  Communicator& clock;
  std::vector<Pending> pending;
  std::vector<Tensor> parts[3];
  std::vector<bool> head_chunked[3];  // exchanged in head groups: assembled after their unpacks
  // V-First: when the layer started, V's exchange was launched and the last Q/K preparation
  // ended, the time spent preparing Q/K, and V's exchange.
  SimTime t_start, v_launch, qk_end;
  double qk_prep_s = 0;
  BlockExchange* v_first_x = nullptr;
};

// Exchanges in flight share the phase communicators: each launches its phase k only after
// every older one has issued its phase k, so all ranks issue them in the same order.
void SpAttention::LayerState::progress() {
  int limit = 1 << 30;
  for (Pending& pd : pending) {
    pd.x->progress(ex, limit);
    limit = std::min(limit, pd.x->issued_phases());
  }
}

// Waits for a step of the oldest unfinished exchange (never held back by the order above).
void SpAttention::LayerState::wait_oldest() {
  for (Pending& pd : pending)
    if (!pd.x->done()) {
      pd.x->wait_step(ex);
      return;
    }
}

// A blocking exchange (flat/tapa Q, K, V; V without v_first; Q/K without pipeline) is driven
// to its end right after its launch; the exchanges still in flight progress meanwhile.
void SpAttention::LayerState::drive(BlockExchange& x) {
  while (true) {
    progress();
    if (x.done()) break;
    wait_oldest();
  }
}

// Drives every exchange to its end: whichever has a step ready moves on; otherwise waits for
// the oldest one's step in flight.
void SpAttention::LayerState::drive_all() {
  while (true) {
    progress();
    bool all_done = true;
    for (Pending& pd : pending) all_done = all_done && pd.x->done();
    if (all_done) break;
    wait_oldest();
  }
}

// A Q/K preparation ended: V-First notes when, and lets the exchanges in flight move on.
void SpAttention::LayerState::qk_prepared() {
  if (v_first_x == nullptr) return;
  qk_end = clock.now();
  progress();
}

std::vector<Tensor> SpAttention::attend(const Exec& ex, const QkvSource& src,
                                        const AttentionShape& shape) {
  LayerState layer(ex, src, shape, group_);
  if (f_.v_major && !v_major_) {
    v_major_ = std::make_unique<VMajorCache>(opt_, group_.comm().topology(), ex.phantom);
    v_major_->begin_forward(step_, pass_);
  }
  layer.v_major_layer = v_major_ ? v_major_->next_layer() : 0;
  for (auto& v : layer.parts) v.resize(u(layer.streams));
  for (auto& v : layer.head_chunked) v.assign(u(layer.streams), false);

  const int order_vf[3] = {2, 0, 1}, order_std[3] = {0, 1, 2};
  const int* order = f_.v_first ? order_vf : order_std;
  layer.t_start = layer.clock.now();
  for (int oi = 0; oi < 3; ++oi)
    for (int s = 0; s < layer.streams; ++s) launch(layer, order[oi], s);
  layer.drive_all();
  if (f_.v_first && layer.v_first_x != nullptr) record_v_first(layer);
  unpack_all(layer);
  return attend_heads(layer);
}

// Projects and prepares one stream's Q, K or V and launches its exchange (or exchanges).
void SpAttention::launch(LayerState& layer, int part, int s) {
  const QkvPart qp = static_cast<QkvPart>(part);
  const SimTime t0 = layer.clock.now();
  if (!layer.src.sharded(s) || layer.p == 1) {
    prepare_local(layer, part, s, t0);
    return;
  }
  const std::int64_t total = layer.src.total_tokens(s);
  layer.parts[part][u(s)] = Tensor::zeros(layer.batch * total, layer.hw, layer.ex.phantom);
  Tensor x = layer.src.project(layer.ex, s, qp, 0, layer.shape.heads);
  layer.progress();
  if (part == 2 || f_.chunks <= 1) {
    launch_whole(layer, part, s, x, total, t0);
    return;
  }
  layer.qk_prep_s += (layer.clock.now() - t0).seconds();
  layer.progress();
  // Pipeline by heads: chunk c holds, of every destination's heads, the c-th of `chunks`
  // groups (the last rank has the fewest heads under the uneven split).
  if (layer.hs.count.back() >= f_.chunks) {
    launch_head_chunks(layer, part, s, x, total);
    layer.head_chunked[part][u(s)] = true;
    return;
  }
  launch_token_chunks(layer, part, s, x, total);
}

// Replicated (or a group of one): this rank's heads, no exchange.
void SpAttention::prepare_local(LayerState& layer, int part, int s, SimTime t0) {
  const QkvPart qp = static_cast<QkvPart>(part);
  const int p = layer.p, h0 = layer.h0, hl = layer.hl;
  Tensor x =
      layer.src.project(layer.ex, s, qp, p == 1 ? 0 : h0, p == 1 ? layer.shape.heads : h0 + hl);
  layer.src.prepare(layer.ex, s, qp, x, 0, p == 1 ? layer.shape.heads : hl, 0);
  layer.parts[part][u(s)] = std::move(x);
  if (part != 2) {
    layer.qk_prep_s += (layer.clock.now() - t0).seconds();
    layer.qk_prepared();
  }
  layer.progress();
}

// Prepares x, all heads at once, and launches its exchange (V, or Q/K without pipelining).
void SpAttention::launch_whole(LayerState& layer, int part, int s, Tensor& x, std::int64_t total,
                               SimTime t0) {
  const QkvPart qp = static_cast<QkvPart>(part);
  layer.src.prepare(layer.ex, s, qp, x, 0, layer.shape.heads, 0);
  if (part != 2) {
    layer.qk_prep_s += (layer.clock.now() - t0).seconds();
    layer.qk_prepared();
  }
  LayerState::Pending pd{part, s, 0, layer.hw, nullptr, nullptr, {}};
  if (part == 2 && v_major_)
    pd.channel = std::make_unique<VMajorChannel>(*v_major_, layer.v_major_layer * 8 + s, layer.dh);
  pd.x = start_to_heads(layer.ex, group_, x, total, layer.batch, layer.head_cols,
                        std::string(kA2a[part]), pd.channel.get());
  if (part == 2 && f_.v_first && layer.v_first_x == nullptr) {
    layer.v_first_x = pd.x.get();
    layer.v_launch = layer.clock.now();
  }
  BlockExchange& launched = *pd.x;
  layer.pending.push_back(std::move(pd));
  // Blocking unless V-First (V, then Q and K, fly while the next ones are computed) or
  // pipelining (Q/K head groups fly) lets them run on.
  if (!f_.v_first && (part == 2 || f_.chunks <= 1)) layer.drive(launched);
  layer.progress();
}

// Pipeline by heads: prepares and launches each of the `chunks` head groups of x in turn.
void SpAttention::launch_head_chunks(LayerState& layer, int part, int s, const Tensor& x,
                                     std::int64_t total) {
  const QkvPart qp = static_cast<QkvPart>(part);
  const int p = layer.p, dh = layer.dh;
  const HeadSplit& hs = layer.hs;
  for (int c = 0; c < f_.chunks; ++c) {
    std::vector<ColumnRange> chunk_cols(u(p)), packed_cols(u(p));
    std::int64_t width = 0;
    for (int d = 0; d < p; ++d) {
      const int cnt = hs.count[u(d)];
      const int b0 = cnt * c / f_.chunks, b1 = cnt * (c + 1) / f_.chunks;
      chunk_cols[u(d)] = {std::int64_t{hs.begin[u(d)] + b0} * dh, std::int64_t{b1 - b0} * dh};
      packed_cols[u(d)] = {width, chunk_cols[u(d)].count};
      width += chunk_cols[u(d)].count;
    }
    const SimTime t1 = layer.clock.now();
    // The chunk's heads, gathered: for the device kernels a strided view of the
    // projection, which the first op to read it (the norm) reads more slowly.
    Tensor xc = Tensor::zeros(x.rows(), width, layer.ex.phantom);
    if (!layer.ex.phantom)
      for (int d = 0; d < p; ++d)
        if (chunk_cols[u(d)].count > 0)
          xc.mat().middleCols(packed_cols[u(d)].begin, packed_cols[u(d)].count) =
              x.mat().middleCols(chunk_cols[u(d)].begin, chunk_cols[u(d)].count);
    Exec strided = layer.ex;
    strided.strided_input = true;
    layer.src.prepare(strided, s, qp, xc, 0, static_cast<int>(width / dh), 0);
    layer.qk_prep_s += (layer.clock.now() - t1).seconds();
    layer.qk_prepared();
    const int cnt = hs.count[u(layer.me)];
    const std::int64_t col0 = std::int64_t{cnt * c / f_.chunks} * dh;
    LayerState::Pending pd{part, s, col0, packed_cols[u(layer.me)].count, nullptr, nullptr, {}};
    pd.x = start_to_heads(layer.ex, group_, xc, total, layer.batch, packed_cols,
                          std::string(kA2a[part]));
    layer.pending.push_back(std::move(pd));
    layer.progress();
  }
}

// Pipeline by tokens: chunk c holds the c-th of `chunks` groups of every rank's tokens,
// all heads (a destination with one head or none still gets every chunk in turn).
void SpAttention::launch_token_chunks(LayerState& layer, int part, int s, const Tensor& x,
                                      std::int64_t total) {
  const QkvPart qp = static_cast<QkvPart>(part);
  const int batch = layer.batch;
  const std::int64_t n_me = x.rows() / batch;
  for (int c = 0; c < f_.chunks; ++c) {
    const TokenChunk tc{c, f_.chunks};
    const TokenShard mine = tc.of(TokenShard{0, n_me, n_me});
    const SimTime t1 = layer.clock.now();
    // The chunk's rows of every batch element, gathered (a strided view: not charged).
    Tensor xc = Tensor::zeros(batch * mine.count, x.cols(), layer.ex.phantom);
    if (!layer.ex.phantom)
      for (int b = 0; b < batch; ++b)
        xc.mat().middleRows(b * mine.count, mine.count) =
            x.mat().middleRows(b * n_me + mine.begin, mine.count);
    layer.src.prepare(layer.ex, s, qp, xc, 0, layer.shape.heads, mine.begin);
    layer.qk_prep_s += (layer.clock.now() - t1).seconds();
    layer.qk_prepared();
    LayerState::Pending pd{part, s, 0, layer.hw, nullptr, nullptr, tc};
    pd.x = start_to_heads(layer.ex, group_, xc, total, batch, layer.head_cols,
                          std::string(kA2a[part]), nullptr, tc);
    layer.pending.push_back(std::move(pd));
    layer.progress();
  }
}

// V-First's share of this layer: how long V's projection, its first phase and its whole
// exchange took, against the Q/K preparation they were meant to hide behind.
void SpAttention::record_v_first(const LayerState& layer) {
  const BlockExchange* v_first_x = layer.v_first_x;
  VFirstKindStats& st = v_first_[std::string(layer.shape.kind)];
  const double phase1 = (v_first_x->phase_done(0) - layer.v_launch).seconds();
  const double v_proj = (layer.v_launch - layer.t_start).seconds();
  st.layers += 1;
  st.v_proj_s += v_proj;
  st.qk_prep_s += layer.qk_prep_s;
  st.v_phase1_s += phase1;
  st.v_transfer_s += (v_first_x->end_time() - layer.v_launch).seconds();
  st.v_exposed_s += v_first_x->waited().seconds();
  if (v_proj + phase1 <= layer.qk_prep_s) st.condition_held += 1;
  if (v_first_x->phase_done(0) <= layer.qk_end) st.phase1_hidden += 1;
}

// Writes every finished exchange into its part's heads, then charges the concatenation of the
// head groups received.
void SpAttention::unpack_all(LayerState& layer) {
  for (LayerState::Pending& pd : layer.pending)
    unpack_to_heads(layer.ex, group_, *pd.x, layer.src.total_tokens(pd.stream), layer.batch,
                    pd.col0, pd.width, layer.parts[pd.part][u(pd.stream)], pd.tokens);
  layer.pending.clear();
  // The head groups received are concatenated into the layer's heads (one copy of them; the
  // unpacks above are the groups' layout copies).
  for (int part = 0; part < 3; ++part)
    for (int s = 0; s < layer.streams; ++s)
      if (layer.head_chunked[part][u(s)])
        layer.ex.charge(OpKind::kCopy, 0, 2.0 * n(layer.parts[part][u(s)].numel()), "chunk_concat",
                        memory_shape(KernelClass::kCatFeat, layer.parts[part][u(s)].numel(),
                                     layer.parts[part][u(s)].cols()));
}

// Attention over this rank's heads of every stream's tokens, then each stream's output back
// to its tokens (sharded), gathered (replicated text) or zeros (an output nobody reads).
std::vector<Tensor> SpAttention::attend_heads(LayerState& layer) {
  const Exec& ex = layer.ex;
  const QkvSource& src = layer.src;
  const int batch = layer.batch, dh = layer.dh;
  std::vector<const Tensor*> q, k, v;
  std::vector<std::int64_t> tokens;
  for (int s = 0; s < layer.streams; ++s) {
    q.push_back(&layer.parts[0][u(s)]);
    k.push_back(&layer.parts[1][u(s)]);
    v.push_back(&layer.parts[2][u(s)]);
    tokens.push_back(src.sharded(s) ? src.total_tokens(s) : src.rows(s) / batch);
  }
  const int heads_here = layer.p == 1 ? layer.shape.heads : layer.hl;
  const Tensor o = attention(
      ex, concat_tokens(ex, q, batch, "q_concat"), concat_tokens(ex, k, batch, "k_concat"),
      concat_tokens(ex, v, batch, "v_concat"), heads_here, dh, batch, "attention");
  std::vector<Tensor> outs = split_tokens(ex, o, tokens, batch, "o_split");
  if (layer.p == 1) return outs;
  for (int s = 0; s < layer.streams; ++s) {
    Tensor& os = outs[u(s)];
    if (!src.wants_output(s))
      os = Tensor::zeros(src.rows(s), std::int64_t{layer.shape.heads} * dh, ex.phantom);
    else if (src.sharded(s))
      os = to_sequence(ex, group_, os, src.total_tokens(s), batch, layer.head_cols, "o_all_to_all");
    else
      os = gather_columns(ex, group_.comm(), os, layer.head_cols, "text_o_all_gather");
  }
  return outs;
}

namespace {

// The setting V-Major's probe measures and its lossy points set.
constexpr const char* kVMajorThreshold = "v_major.threshold";

std::string g_text(const char* f, double v) {
  char b[64];
  std::snprintf(b, sizeof b, f, v);
  return b;
}

// The exact compositions over a sequence-parallel group of `sp` ranks (flat or TAPA exchange,
// with or without V-First and pipelining), each with and without text sharding.
void exact_compositions(const SearchShape& s, const SearchPoint& base, int sp,
                        const SearchEmit& emit) {
  std::vector<std::string> exchanges = {"flat"};
  // TAPA differs from flat when the group spans two levels or more (CFG halves: the inner
  // levels of each half).
  if (sp > 1 && s.spanned_levels(sp) >= 2) exchanges.emplace_back("tapa");
  for (const std::string& x : exchanges)
    for (bool v_first : {false, true})
      for (int chunks : {0, 2, 4})
        for (bool text : s.text_options(sp)) {
          if (sp == 1 && (v_first || chunks > 0)) continue;  // nothing to overlap
          SearchPoint p = base;
          p.strategy = x + (v_first ? "+v_first" : "") + (chunks > 0 ? "+pipeline" : "");
          p.chunks = chunks;
          p.shard_text = text;
          if (chunks > 0) p.sets.push_back("pipeline.chunks=" + std::to_string(chunks));
          p.wave = x == "tapa" ? (v_first ? 0 : 1) : 2;
          p.baseline = x == "flat" && !v_first && chunks == 0 && !text && base.cfg == 1;
          emit(p);
        }
}

}  // namespace

void ulysses_search(const SearchShape& s, const SearchEmit& emit) {
  const int ranks = s.ranks;
  for (int cfg : {1, 2}) {
    if (cfg == 2 && (!s.cfg_capable || ranks % 2 != 0 || ranks < 2)) continue;
    const int sp = ranks / cfg;
    SearchPoint base;
    base.ulysses = sp;
    base.cfg = cfg;
    base.uneven_heads = s.model->heads % sp != 0;
    exact_compositions(s, base, sp, emit);
    // V-Major (lossy) on the full composition, only where there is an inter-node tier.
    if (s.nodes <= 1 || sp <= 1) continue;
    for (size_t q = 0; q < s.lossy.size(); ++q) {
      if (s.lossy[q].key != kVMajorThreshold) continue;  // another strategy's setting
      for (int chunks : {2, 4})
        for (bool text : s.text_options(sp)) {
          SearchPoint p = base;
          p.strategy = "tapa+v_first+pipeline+v_major";
          p.chunks = chunks;
          p.shard_text = text;
          p.lossy = static_cast<int>(q);
          p.wave = 0;
          p.sets = {
              "pipeline.chunks=" + std::to_string(chunks),
              std::string(kVMajorThreshold) + "=" + g_text("%g", s.lossy[q].threshold),
              "v_major.phantom_active_fraction=" + g_text("%.6g", s.lossy[q].active_fraction)};
          emit(p);
        }
    }
  }
}

LossyProbe v_major_probe() {
  LossyProbe p;
  p.strategy = "cocodiff";
  p.key = kVMajorThreshold;
  p.name = "V-Major";
  p.setting = "threshold";
  p.exact = 0;
  p.levels = {0.02, 0.05, 0.1, 0.2};
  p.sent = "V blocks";
  p.sent_key = "v_blocks_sent";
  p.phantom_key = "v_major.phantom_active_fraction";
  p.sent_fraction = [](const StrategyStats& st) {
    // Over every tier, as report.json's strategy_stats.v_major lists them.
    double blocks = 0, active = 0;
    for (const auto& [tier, v] : st.v_major) {
      const double b = static_cast<double>(v.blocks);
      blocks += b;
      active += (v.blocks > 0 ? static_cast<double>(v.active_blocks) / b : 0.0) * b;
    }
    return blocks > 0 ? active / blocks : 1.0;
  };
  return p;
}

}  // namespace cocodiff::dit
