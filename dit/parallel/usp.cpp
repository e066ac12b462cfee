#include "dit/parallel/usp.hpp"

#include <cmath>
#include <limits>

#include "core/errors.hpp"
#include "dit/layers.hpp"
#include "dit/parallel/sp_attention.hpp"

namespace cocodiff::dit {

namespace {

double n(std::int64_t v) { return static_cast<double>(v); }
size_t u(std::int64_t i) { return static_cast<size_t>(i); }

// One key/value set's share of attention: o = softmax(q k^T / sqrt(D)) v per head, normalised
// over these keys only, and lse = log sum exp of the scores (to merge shares exactly).
struct Partial {
  Tensor o;  // [B*nq, h*D]
  Mat lse;   // [B*nq, h]
};

// partial: q [B*nq, h*D], k, v [B*nk, h*D] -> o [B*nq, h*D], lse [B*nq, h]
Partial partial_attention(const Exec& ex, const Tensor& q, const Tensor& k, const Tensor& v,
                          int heads, int head_dim, int batch) {
  const std::int64_t nq = q.rows() / batch, nk = k.rows() / batch;
  // Every head's block of the output is written below unless there are no keys (zeros then).
  Partial r{nk > 0 ? Tensor::uninitialized(q.rows(), q.cols(), ex.phantom)
                   : Tensor::zeros(q.rows(), q.cols(), ex.phantom),
            Mat()};
  if (!ex.phantom) {
    r.lse = Mat::Constant(q.rows(), heads, -std::numeric_limits<float>::infinity());
    const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
    Mat s;
    Eigen::VectorXf m, l;
    if (nk > 0)
      for (int b = 0; b < batch; ++b)
        for (int h = 0; h < heads; ++h) {
          const std::int64_t c = std::int64_t{h} * head_dim;
          s.noalias() = q.mat().block(b * nq, c, nq, head_dim) *
                        k.mat().block(b * nk, c, nk, head_dim).transpose();
          s *= scale;
          // Softmax of every row at once, down the columns (contiguous, vectorised).
          m = s.rowwise().maxCoeff();
          s.array().colwise() -= m.array();
          s.array() = s.array().exp();
          l = s.rowwise().sum();
          s.array().colwise() /= l.array();
          for (std::int64_t i = 0; i < nq; ++i) r.lse(b * nq + i, h) = m(i) + std::log(l(i));
          r.o.mat().block(b * nq, c, nq, head_dim).noalias() =
              s * v.mat().block(b * nk, c, nk, head_dim);
        }
  }
  ex.charge(OpKind::kAttention, 4.0 * batch * heads * n(nq) * n(nk) * head_dim,
            n(q.numel()) + n(k.numel()) + n(v.numel()) + n(q.numel()), "ring_attention");
  return r;
}

// merge: out = sum_j exp(lse_j - m) o_j / sum_j exp(lse_j - m), in the order of `parts`.
Tensor merge_partials(const Exec& ex, const std::vector<Partial>& parts, int heads, int head_dim) {
  const Tensor& first = parts.at(0).o;
  Tensor out = Tensor::zeros(first.rows(), first.cols(), ex.phantom);
  if (!ex.phantom)
    for (std::int64_t i = 0; i < first.rows(); ++i)
      for (int h = 0; h < heads; ++h) {
        float m = -std::numeric_limits<float>::infinity();
        for (const Partial& p : parts) m = std::max(m, p.lse(i, h));
        float wsum = 0;
        auto dst = out.mat().block(i, std::int64_t{h} * head_dim, 1, head_dim);
        for (const Partial& p : parts) {
          if (p.lse(i, h) == -std::numeric_limits<float>::infinity()) continue;
          const float w = std::exp(p.lse(i, h) - m);
          wsum += w;
          dst += w * p.o.mat().block(i, std::int64_t{h} * head_dim, 1, head_dim);
        }
        dst /= wsum;
      }
  ex.charge(OpKind::kElementwise, 3.0 * n(first.numel()) * n(parts.size()),
            n(first.numel()) * n(parts.size() + 1), "ring_merge");
  return out;
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
  if (cfg.heads % ulysses_comm_->size() != 0 && !options.uneven_heads)
    throw ConfigError("usp: " + std::to_string(cfg.heads) +
                      " attention heads are not divisible by the Ulysses degree " +
                      std::to_string(ulysses_comm_->size()) +
                      " (set ulysses.uneven_heads = true for an uneven split, or change "
                      "usp.ring_levels)");
}

std::vector<Tensor> UlyssesRing::attend(const Exec& ex, const QkvSource& src,
                                        const AttentionShape& shape) {
  const int pw = world_.size();
  const int ud = ulysses_comm_->size(), ui = ulysses_comm_->rank();
  const int rd = ring_comm_->size(), ri = ring_comm_->rank();
  const HeadSplit hs(shape.heads, ud);
  const int hl = hs.count[u(ui)], h0 = hs.begin[u(ui)];
  const int dh = shape.head_dim, batch = shape.batch;
  const std::int64_t hw = std::int64_t{hl} * dh;
  std::vector<ColumnRange> cols;
  for (int d = 0; d < ud; ++d)
    cols.push_back({std::int64_t{hs.begin[u(d)]} * dh, std::int64_t{hs.count[u(d)]} * dh});
  const int streams = src.num_streams();
  // Token chunk of ring member j: the shards of its Ulysses group (contiguous world ranks).
  auto chunk_of = [&](int j, std::int64_t total) {
    const TokenShard a = shard_tokens(total, pw, j * ud);
    const TokenShard b = shard_tokens(total, pw, j * ud + ud - 1);
    return TokenShard{a.begin, b.begin + b.count - a.begin, total};
  };

  // Q, K, V: image streams through the Ulysses exchange, text streams projected locally.
  std::vector<Tensor> parts[3];
  for (int part = 0; part < 3; ++part) {
    const QkvPart qp = static_cast<QkvPart>(part);
    static constexpr std::string_view kA2a[3] = {"q_all_to_all", "k_all_to_all", "v_all_to_all"};
    for (int s = 0; s < streams; ++s) {
      if (!src.sharded(s)) {
        Tensor x = src.project(ex, s, qp, h0, h0 + hl);
        src.prepare(ex, s, qp, x, 0, hl, 0);
        parts[part].push_back(std::move(x));
        continue;
      }
      Tensor x = src.project(ex, s, qp, 0, shape.heads);
      src.prepare(ex, s, qp, x, 0, shape.heads, 0);
      const std::int64_t chunk = chunk_of(ri, src.total_tokens(s)).count;
      if (ud == 1) {
        parts[part].push_back(std::move(x));
        continue;
      }
      std::unique_ptr<BlockExchange> xc =
          start_to_heads(ex, *ulysses_, x, chunk, batch, cols, std::string(kA2a[part]));
      Tensor y = Tensor::zeros(batch * chunk, hw, ex.phantom);
      unpack_to_heads(ex, *ulysses_, *xc, chunk, batch, 0, hw, y);
      parts[part].push_back(std::move(y));
    }
  }
  std::vector<const Tensor*> q, tk, tv;
  std::vector<std::int64_t> q_tokens;
  int img = -1;
  for (int s = 0; s < streams; ++s) {
    q.push_back(&parts[0][u(s)]);
    q_tokens.push_back(parts[0][u(s)].rows() / batch);
    if (src.sharded(s)) {
      COCO_CHECK(img < 0, "usp: one sharded stream per layer");
      img = s;
    } else {
      tk.push_back(&parts[1][u(s)]);
      tv.push_back(&parts[2][u(s)]);
    }
  }
  COCO_CHECK(img >= 0, "usp: no sharded stream");
  const Tensor qa = concat_tokens(ex, q, batch, "q_concat");
  std::vector<Partial> partials;
  if (!tk.empty())  // text keys: replicated, so every ring member has them
    partials.push_back(partial_attention(ex, qa, concat_tokens(ex, tk, batch, "k_concat"),
                                         concat_tokens(ex, tv, batch, "v_concat"), hl, dh, batch));
  // Ring: at step i this rank attends to member (ri - i)'s image K/V and passes it on.
  const std::int64_t total = src.total_tokens(img);
  std::vector<Partial> ring(u(rd));
  Tensor cur_k = std::move(parts[1][u(img)]), cur_v = std::move(parts[2][u(img)]);
  for (int i = 0; i < rd; ++i) {
    const int holder = ((ri - i) % rd + rd) % rd;
    Tensor next_k, next_v;
    std::vector<Request> reqs;
    if (i + 1 < rd) {
      const int from = ((ri - i - 1) % rd + rd) % rd;
      const std::int64_t rows = batch * chunk_of(from, total).count;
      next_k = Tensor::uninitialized(rows, hw, ex.phantom);  // the receives fill them
      next_v = Tensor::uninitialized(rows, hw, ex.phantom);
      const int right = (ri + 1) % rd, left = (ri - 1 + rd) % rd;
      reqs.push_back(ring_comm_->irecv(next_k.data(), rows * hw, left, 2 * i, "ring_k"));
      reqs.push_back(ring_comm_->irecv(next_v.data(), rows * hw, left, 2 * i + 1, "ring_v"));
      reqs.push_back(ring_comm_->isend(cur_k.data(), cur_k.numel(), right, 2 * i, "ring_k"));
      reqs.push_back(ring_comm_->isend(cur_v.data(), cur_v.numel(), right, 2 * i + 1, "ring_v"));
    }
    ring[u(holder)] = partial_attention(ex, qa, cur_k, cur_v, hl, dh, batch);
    wait_all(reqs);
    if (i + 1 < rd) {
      cur_k = std::move(next_k);
      cur_v = std::move(next_v);
    }
  }
  for (Partial& p : ring) partials.push_back(std::move(p));
  const Tensor o = merge_partials(ex, partials, hl, dh);
  std::vector<Tensor> outs = split_tokens(ex, o, q_tokens, batch, "o_split");
  for (int s = 0; s < streams; ++s) {
    Tensor& os = outs[u(s)];
    if (src.sharded(s)) {
      if (ud > 1)
        os = to_sequence(ex, *ulysses_, os, chunk_of(ri, total).count, batch, cols, "o_all_to_all");
    } else if (!src.wants_output(s)) {
      os = Tensor::zeros(os.rows(), std::int64_t{shape.heads} * dh, ex.phantom);
    } else if (ud > 1) {
      os = gather_columns(ex, *ulysses_comm_, os, cols, "text_o_all_gather");
    }
  }
  return outs;
}

}  // namespace cocodiff::dit
