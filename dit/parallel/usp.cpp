#include "dit/parallel/usp.hpp"

#include <algorithm>

#include "core/errors.hpp"
#include "dit/layers.hpp"
#include "dit/parallel/sp_attention.hpp"

namespace cocodiff::dit {

namespace {

double n(std::int64_t v) { return static_cast<double>(v); }
size_t u(std::int64_t i) { return static_cast<size_t>(i); }

// Above this many scores per head (1 MiB of floats), the ring's softmax takes keys in blocks.
constexpr std::int64_t kOneBlockScores = std::int64_t{1} << 18;

// The clock's share of one ring step: the partial attention of q [B*nq, h*D] against one
// key/value set of nk tokens per batch element (scores, softmax, weighted sum, log-sum-exp).
OpCost partial_attention_cost(std::int64_t q_rows, std::int64_t q_cols, std::int64_t k_rows,
                              int heads, int head_dim, int batch) {
  const std::int64_t nq = q_rows / batch, nk = k_rows / batch;
  const double q_numel = n(q_rows) * n(q_cols), k_numel = n(k_rows) * n(q_cols);
  return {OpKind::kAttention, 4.0 * batch * heads * n(nq) * n(nk) * head_dim,
          (q_numel + k_numel + k_numel + q_numel) * kBytesPerElement, "ring_attention",
          sdpa_shape(batch, nq, nk, heads, head_dim)};
}

// Token chunk of ring member j (of a world of pw ranks in Ulysses groups of ud): the shards of
// its Ulysses group (contiguous world ranks).
TokenShard ring_chunk(std::int64_t total, int pw, int ud, int j) {
  const TokenShard a = shard_tokens(total, pw, j * ud);
  const TokenShard b = shard_tokens(total, pw, j * ud + ud - 1);
  return TokenShard{a.begin, b.begin + b.count - a.begin, total};
}

// The clock's share of merging `parts` partial results of q's shape by their log-sum-exp.
void charge_merge(const Exec& ex, std::int64_t q_rows, std::int64_t q_cols, size_t parts) {
  const double numel = n(q_rows) * n(q_cols);
  ex.charge(OpKind::kElementwise, 3.0 * numel * n(static_cast<std::int64_t>(parts)),
            numel * n(static_cast<std::int64_t>(parts + 1)), "ring_merge");
}

}  // namespace

UlyssesRing::UlyssesRing(Communicator& world, const ModelConfig& cfg,
                         const StrategyOptions& options)
    : world_(world) {
  const Topology& t = world.topology();
  if (world.size() != t.num_ranks())
    throw ConfigError("usp runs over the whole cluster (" + std::to_string(t.num_ranks()) +
                      " ranks), not a group of " + std::to_string(world.size()));
  const int levels = t.num_levels();
  const int ring_levels = options.usp_ring_levels;
  if (ring_levels < 0 || ring_levels >= levels)
    throw ConfigError("usp.ring_levels = " + std::to_string(ring_levels) + ": expected 0.." +
                      std::to_string(levels - 1) + " (this topology has " + std::to_string(levels) +
                      " levels)");
  const int me = world.world_rank(world.rank());
  const std::vector<int> c = t.coords(me);
  // Ulysses group: same outer coordinates; ring: same inner coordinates.
  std::vector<int> outer = c, inner = c;
  for (int k = 0; k < levels; ++k) (k < levels - ring_levels ? outer : inner)[u(k)] = 0;
  ulysses_comm_ = world.split(t.rank_of(outer), me);
  ring_comm_ = world.split(t.rank_of(inner), me);
  ulysses_ = std::make_unique<SpGroup>(*ulysses_comm_, options.usp_tapa);
  ulysses_->set_fp8(options.compress == "fp8");
  ulysses_->set_residual(options.compress == "residual");
  if (cfg.heads % ulysses_comm_->size() != 0 && !options.uneven_heads)
    throw ConfigError("usp: " + std::to_string(cfg.heads) +
                      " attention heads are not divisible by the Ulysses degree " +
                      std::to_string(ulysses_comm_->size()) +
                      " (set ulysses.uneven_heads = true for an uneven split, or change "
                      "usp.ring_levels)");
  check_text_shards(cfg, options, ulysses_comm_->size());
  shard_text_ = options.shard_text;
}

std::optional<TokenShard> UlyssesRing::text_shard(std::int64_t text_tokens) const {
  if (!shard_text_) return std::nullopt;
  return shard_tokens(text_tokens, ulysses_comm_->size(), ulysses_comm_->rank());
}

const UlyssesRing::RingPlan& UlyssesRing::ring_plan(std::int64_t total, std::int64_t q_rows,
                                                    std::int64_t q_cols, int heads, int head_dim,
                                                    int batch) {
  for (const RingPlan& p : plans_)
    if (p.total == total && p.q_rows == q_rows && p.q_cols == q_cols && p.heads == heads &&
        p.head_dim == head_dim && p.batch == batch)
      return p;
  const int pw = world_.size(), ud = ulysses_comm_->size();
  const int rd = ring_comm_->size(), ri = ring_comm_->rank();
  RingPlan& p = plans_.emplace_back();
  p.total = total;
  p.q_rows = q_rows;
  p.q_cols = q_cols;
  p.heads = heads;
  p.head_dim = head_dim;
  p.batch = batch;
  p.chunk_rows.reserve(u(rd));
  for (int j = 0; j < rd; ++j) p.chunk_rows.push_back(batch * ring_chunk(total, pw, ud, j).count);
  // At step i this rank attends to member (ri - i)'s image K/V while passing it on.
  const std::int64_t hw = std::int64_t{heads} * head_dim;
  p.pass.parts = 2;
  p.pass.labels = {"ring_k", "ring_v"};
  for (int j = 0; j < rd; ++j) p.pass.counts.push_back(p.chunk_rows[u(j)] * hw);
  for (int i = 0; i < rd; ++i) {
    const int holder = ((ri - i) % rd + rd) % rd;
    p.pass.work.push_back(
        partial_attention_cost(q_rows, q_cols, p.chunk_rows[u(holder)], heads, head_dim, batch));
  }
  return p;
}

// One attend call: the group's geometry, the layer's Q/K/V per stream, the streams sorted into
// queries and keys, and where the ring's image K/V chunks land.
struct UlyssesRing::Layer {
  Layer(const Exec& ex, const QkvSource& src, const AttentionShape& shape, int pw,
        const Communicator& ulysses, const Communicator& ring)
      : ex(ex),
        src(src),
        shape(shape),
        pw(pw),
        ud(ulysses.size()),
        ui(ulysses.rank()),
        rd(ring.size()),
        ri(ring.rank()),
        hs(shape.heads, ud),
        hl(hs.count[u(ui)]),
        h0(hs.begin[u(ui)]),
        dh(shape.head_dim),
        batch(shape.batch),
        hw(std::int64_t{hl} * dh),
        streams(src.num_streams()) {
    cols.reserve(u(ud));
    for (int d = 0; d < ud; ++d)
      cols.push_back({std::int64_t{hs.begin[u(d)]} * dh, std::int64_t{hs.count[u(d)]} * dh});
  }

  // Token chunk of ring member j.
  TokenShard chunk_of(int j, std::int64_t total) const { return ring_chunk(total, pw, ud, j); }
  void sort_streams();
  void place_ring_keys(const std::vector<std::int64_t>& chunk_rows, std::int64_t total);
  void stack_ring_keys();
  Tensor attend_all_keys(const Tensor& qa);

  const Exec& ex;
  const QkvSource& src;
  const AttentionShape& shape;
  const int pw, ud, ui, rd, ri;
  const HeadSplit hs;
  const int hl, h0, dh, batch;
  const std::int64_t hw;
  std::vector<ColumnRange> cols;
  const int streams;
  std::vector<Tensor> parts[3];  // Q, K, V of every stream
  // Queries of every stream (and their tokens), the keys and values that are not the ring's
  // (text), and the one sharded image stream.
  std::vector<const Tensor*> q, tk, tv;
  std::vector<std::int64_t> q_tokens;
  int img = -1;
  // Where the ring's chunks land: with `direct`, rows chunk_at[j] of all_k and all_v; otherwise
  // ring_k and ring_v, one per chunk (none in phantom mode), stacked into all_k and all_v.
  bool direct = false;
  std::vector<std::int64_t> chunk_at;
  std::vector<Tensor> ring_k, ring_v;
  Mat all_k, all_v;
};

// Sorts the streams: every stream's Q is a query; the sharded image stream's K/V go round the
// ring, the others' (text) are local keys.
void UlyssesRing::Layer::sort_streams() {
  for (int s = 0; s < streams; ++s) {
    q.push_back(&parts[0][u(s)]);
    q_tokens.push_back(parts[0][u(s)].rows() / batch);
    if (src.sharded(s) && !src.text(s)) {
      COCO_CHECK(img < 0, "usp: one sharded stream per layer");
      img = s;
    } else {
      tk.push_back(&parts[1][u(s)]);
      tv.push_back(&parts[2][u(s)]);
    }
  }
  COCO_CHECK(img >= 0, "usp: no sharded stream");
}

// With one batch element every chunk arrives straight into its rows of one [keys, hw] matrix
// per K and V, in the streams' token order (what the softmax reads: nothing is stacked
// afterwards); otherwise into a tensor per chunk.
void UlyssesRing::Layer::place_ring_keys(const std::vector<std::int64_t>& chunk_rows,
                                         std::int64_t total) {
  chunk_at.resize(direct ? u(rd) : 0);
  if (direct) {
    std::int64_t at = 0;
    for (int s = 0; s < streams; ++s) {
      if (s != img) {
        at += parts[1][u(s)].rows();
        continue;
      }
      for (int j = 0; j < rd; ++j) {
        chunk_at[u(j)] = at;
        at += chunk_rows[u(j)];
      }
    }
    COCO_CHECK(parts[1][u(img)].rows() == chunk_rows[u(ri)], "usp: own chunk rows");
    all_k.resize(at, hw);
    all_v.resize(at, hw);
    at = 0;
    for (int s = 0; s < streams; ++s) {
      const std::int64_t r = s == img ? chunk_rows[u(ri)] : parts[1][u(s)].rows();
      const std::int64_t to = s == img ? chunk_at[u(ri)] : at;
      all_k.middleRows(to, r) = parts[1][u(s)].mat();
      all_v.middleRows(to, r) = parts[2][u(s)].mat();
      at += s == img ? total : r;
    }
  } else if (!ex.phantom) {  // phantom chunks are sizes only: the pass needs no tensors
    ring_k.resize(u(rd));
    ring_v.resize(u(rd));
    for (int j = 0; j < rd; ++j) {  // the pass fills the others
      ring_k[u(j)] = j == ri ? std::move(parts[1][u(img)])
                             : Tensor::uninitialized(chunk_rows[u(j)], hw, false);
      ring_v[u(j)] = j == ri ? std::move(parts[2][u(img)])
                             : Tensor::uninitialized(chunk_rows[u(j)], hw, false);
    }
  }
}

// Stacks the keys and values in the streams' token order (the ring's chunks in member order)
// into all_k and all_v.
void UlyssesRing::Layer::stack_ring_keys() {
  std::vector<const Tensor*> keys, values;
  for (int s = 0; s < streams; ++s) {
    if (s != img) {
      keys.push_back(&parts[1][u(s)]);
      values.push_back(&parts[2][u(s)]);
    } else {
      for (int j = 0; j < rd; ++j) {
        keys.push_back(&ring_k[u(j)]);
        values.push_back(&ring_v[u(j)]);
      }
    }
  }
  std::int64_t key_rows = 0;
  for (const Tensor* t : keys) key_rows += t->rows();
  all_k.resize(key_rows, hw);
  all_v.resize(key_rows, hw);
  stack_tokens(keys, batch, all_k);
  stack_tokens(values, batch, all_v);
}

// The values: one softmax of qa against every key the ring delivered (and the text's).
Tensor UlyssesRing::Layer::attend_all_keys(const Tensor& qa) {
  const std::int64_t qr = qa.rows(), qc = qa.cols();
  Tensor o = Tensor::uninitialized(qr, qc, ex.phantom);
  if (ex.phantom) return o;
  if (!direct) stack_ring_keys();
  // One key block while the scores stay small (qa has a shard's rows): [rows x keys] floats.
  const std::int64_t keys_per_batch = all_k.rows() / batch;
  const std::int64_t key_block = (qr / batch) * keys_per_batch <= kOneBlockScores
                                     ? std::max<std::int64_t>(keys_per_batch, 1)
                                     : kBlockK;
  ex.math(4.0 * n(qr) * n(all_k.rows() / batch) * hl * dh,
          [&] { attention_values(qa.mat(), all_k, all_v, hl, dh, batch, o.mat(), key_block); });
  return o;
}

std::vector<Tensor> UlyssesRing::attend(const Exec& ex, const QkvSource& src,
                                        const AttentionShape& shape) {
  Layer layer(ex, src, shape, world_.size(), *ulysses_comm_, *ring_comm_);
  exchange_qkv(layer);
  layer.sort_streams();
  const Tensor qa = concat_tokens(ex, layer.q, layer.batch, "q_concat");
  // The clock is charged as the ring kernel runs: one partial attention per key/value set (the
  // text's, then each ring step's, overlapped with passing the chunk on) and one merge. The
  // values are one softmax over every key the ring delivered, in the streams' token order
  // (attention_values, the serial run's arithmetic): the same function as merging the partials
  // by log-sum-exp, without a thin product and a merge per chunk.
  const std::int64_t qr = qa.rows(), qc = qa.cols();
  Tensor text_k, text_v;
  size_t sets = 0;
  if (!layer.tk.empty()) {  // text keys: replicated or gathered, so every ring member has them
    text_k = concat_tokens(ex, layer.tk, layer.batch, "k_concat");
    text_v = concat_tokens(ex, layer.tv, layer.batch, "v_concat");
    ex.charge(partial_attention_cost(qr, qc, text_k.rows(), layer.hl, layer.dh, layer.batch));
    ++sets;
  }
  // Ring: at step i this rank attends to member (ri - i)'s image K/V and passes it on.
  const std::int64_t total = src.total_tokens(layer.img);
  layer.direct = layer.batch == 1 && !ex.phantom;
  const RingPlan& plan = ring_plan(total, qr, qc, layer.hl, layer.dh, layer.batch);
  layer.place_ring_keys(plan.chunk_rows, total);
  pass_ring(layer, plan);
  sets += u(layer.rd);
  Tensor o = layer.attend_all_keys(qa);
  charge_merge(ex, qr, qc, sets);
  std::vector<Tensor> outs = split_tokens(ex, o, layer.q_tokens, layer.batch, "o_split");
  exchange_outputs(layer, outs, total);
  return outs;
}

// Q, K, V: image streams through the Ulysses exchange, text streams projected locally, or
// (sharded text) through the Ulysses exchange of all the group's text tokens.
void UlyssesRing::exchange_qkv(Layer& layer) {
  const Exec& ex = layer.ex;
  const QkvSource& src = layer.src;
  for (int part = 0; part < 3; ++part) {
    const QkvPart qp = static_cast<QkvPart>(part);
    static constexpr std::string_view kA2a[3] = {"q_all_to_all", "k_all_to_all", "v_all_to_all"};
    for (int s = 0; s < layer.streams; ++s) {
      if (!src.sharded(s)) {
        Tensor x = src.project(ex, s, qp, layer.h0, layer.h0 + layer.hl);
        src.prepare(ex, s, qp, x, 0, layer.hl, 0);
        layer.parts[part].push_back(std::move(x));
        continue;
      }
      Tensor x = src.project(ex, s, qp, 0, layer.shape.heads);
      src.prepare(ex, s, qp, x, 0, layer.shape.heads, 0);
      // Image: this ring member's chunk; sharded text: all of it (each Ulysses group holds it).
      const std::int64_t chunk =
          src.text(s) ? src.total_tokens(s) : layer.chunk_of(layer.ri, src.total_tokens(s)).count;
      if (layer.ud == 1) {
        layer.parts[part].push_back(std::move(x));
        continue;
      }
      std::unique_ptr<BlockExchange> xc =
          start_to_heads(ex, *ulysses_, x, chunk, layer.batch, layer.cols, std::string(kA2a[part]));
      // Every row and column is unpacked below: the shards cover the chunk, the heads hw.
      Tensor y = Tensor::uninitialized(layer.batch * chunk, layer.hw, ex.phantom);
      unpack_to_heads(ex, *ulysses_, *xc, chunk, layer.batch, 0, layer.hw, y);
      layer.parts[part].push_back(std::move(y));
    }
  }
}

// The ring pass: at step i this rank attends to member (ri - i)'s image K/V while passing it
// on (the plan's work, one charge per round).
void UlyssesRing::pass_ring(Layer& layer, const RingPlan& plan) {
  const Exec& ex = layer.ex;
  COCO_CHECK(!ex.deferred, "usp: a ring pass inside a deferred section");
  if (ex.record != nullptr)
    for (const OpCost& w : plan.pass.work) ex.record_charge(w);
  if (ex.phantom) {
    ring_comm_->ring_pass(plan.pass);  // sizes only
    return;
  }
  const std::vector<std::int64_t>& chunk_rows = plan.chunk_rows;
  const std::int64_t hw = layer.hw;
  RingPass pass = plan.pass;
  pass.data = [&](int part, int j) -> std::span<float> {
    if (!layer.direct) return (part == 0 ? layer.ring_k : layer.ring_v)[u(j)].data();
    Mat& all = part == 0 ? layer.all_k : layer.all_v;
    return {all.data() + layer.chunk_at[u(j)] * hw, static_cast<size_t>(chunk_rows[u(j)] * hw)};
  };
  ring_comm_->ring_pass(pass);
}

// Each stream's output back to its layout: the image's (and sharded text's) to its tokens,
// replicated text's heads gathered, zeros for an output nobody reads.
void UlyssesRing::exchange_outputs(const Layer& layer, std::vector<Tensor>& outs,
                                   std::int64_t total) {
  const Exec& ex = layer.ex;
  const QkvSource& src = layer.src;
  const int ud = layer.ud, batch = layer.batch;
  for (int s = 0; s < layer.streams; ++s) {
    Tensor& os = outs[u(s)];
    if (s == layer.img) {
      if (ud > 1)
        os = to_sequence(ex, *ulysses_, os, layer.chunk_of(layer.ri, total).count, batch,
                         layer.cols, "o_all_to_all");
    } else if (!src.wants_output(s)) {
      os = Tensor::zeros(src.rows(s), std::int64_t{layer.shape.heads} * layer.dh, ex.phantom);
    } else if (src.sharded(s)) {
      if (ud > 1)
        os = to_sequence(ex, *ulysses_, os, src.total_tokens(s), batch, layer.cols, "o_all_to_all");
    } else if (ud > 1) {
      os = gather_columns(ex, *ulysses_comm_, os, layer.cols, "text_o_all_gather");
    }
  }
}

void usp_search(const SearchShape& s, const SearchEmit& emit) {
  const std::vector<int>& sizes = s.levels;
  int ring = 1, last_ring = 1;
  for (int k = static_cast<int>(sizes.size()) - 1; k >= 1; --k) {
    ring *= sizes[static_cast<size_t>(k)];
    if (ring == last_ring) continue;  // a level of one member: the same split as the last
    last_ring = ring;
    const int ulysses = s.ranks / ring;
    for (bool tapa : {false, true}) {
      if (tapa && s.spanned_levels(ulysses) < 2) continue;
      for (bool text : s.text_options(ulysses)) {
        SearchPoint p;
        p.strategy = "usp";
        p.ulysses = ulysses;
        p.ring = ring;
        p.shard_text = text;
        p.uneven_heads = s.model->heads % ulysses != 0;
        p.detail =
            " " + std::to_string(ulysses) + "x" + std::to_string(ring) + (tapa ? ", tapa" : "");
        if (tapa) p.sets.emplace_back("usp.tapa=true");
        p.wave = tapa ? 0 : 1;
        emit(p);
      }
    }
  }
}

}  // namespace cocodiff::dit
