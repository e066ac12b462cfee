#include "dit/parallel/ulysses.hpp"

#include "core/errors.hpp"
#include "dit/layers.hpp"

namespace cocodiff::dit {

namespace {

double n(std::int64_t v) { return static_cast<double>(v); }

// Equal counts use the plain all-to-all; uneven shards the v-variant.
Request exchange(Communicator& g, std::span<const float> send, std::span<float> recv,
                 const std::vector<std::int64_t>& send_counts,
                 const std::vector<std::int64_t>& recv_counts, std::string_view label) {
  bool equal = true;
  for (size_t j = 0; j < send_counts.size(); ++j)
    equal = equal && send_counts[j] == send_counts[0] && recv_counts[j] == send_counts[0];
  if (equal) return g.iall_to_all(send, recv, send_counts[0], label);
  return g.iall_to_allv(send, recv, AllToAllvLayout::packed(send_counts, recv_counts), label);
}

}  // namespace

// to_heads: x [B*n_r, h*D] -> send block j = [B, n_r, hl*D] (heads of rank j)
//           recv block i = [B, n_i, hl*D] -> y [B*total, hl*D], tokens of rank i at begin_i
UlyssesExchange::Pending UlyssesExchange::start_to_heads(const Exec& ex, const Tensor& x,
                                                         std::int64_t total, int batch,
                                                         int head_dim,
                                                         std::string_view label) const {
  const int p = degree(), r = index();
  const std::int64_t heads = x.cols() / head_dim;
  COCO_CHECK(heads % p == 0, "Ulysses heads not divisible by the degree");
  const std::int64_t hw = heads / p * head_dim;  // this rank's width after the exchange
  const TokenShard me = shard_tokens(total, p, r);
  COCO_CHECK(x.rows() == me.count * batch, "to_heads: x " + x.shape_str());
  std::vector<std::int64_t> sc(static_cast<size_t>(p)), rc(static_cast<size_t>(p));
  for (int j = 0; j < p; ++j) {
    sc[static_cast<size_t>(j)] = batch * me.count * hw;
    rc[static_cast<size_t>(j)] = batch * shard_tokens(total, p, j).count * hw;
  }
  Pending pd;
  pd.rows = batch * total;
  pd.cols = hw;
  if (!ex.phantom) {
    pd.send.resize(static_cast<size_t>(x.numel()));
    pd.recv.resize(static_cast<size_t>(pd.rows * hw));
    std::int64_t at = 0;
    for (int j = 0; j < p; ++j)
      for (int b = 0; b < batch; ++b) {
        MatMap dst(pd.send.data() + at, me.count, hw);
        dst = x.mat().block(b * me.count, j * hw, me.count, hw);
        at += me.count * hw;
      }
  }
  ex.charge(OpKind::kCopy, 0, 2.0 * n(x.numel()), "a2a_pack");
  pd.request = exchange(group_, pd.send, pd.recv, sc, rc, label);
  return pd;
}

Tensor UlyssesExchange::finish_to_heads(const Exec& ex, Pending& pd, std::int64_t total, int batch,
                                        std::string_view /*label*/) const {
  pd.request.wait();
  const int p = degree();
  Tensor y = Tensor::zeros(pd.rows, pd.cols, ex.phantom);
  if (!ex.phantom) {
    std::int64_t at = 0;
    for (int i = 0; i < p; ++i) {
      const TokenShard s = shard_tokens(total, p, i);
      for (int b = 0; b < batch; ++b) {
        y.mat().middleRows(b * total + s.begin, s.count) =
            ConstMatMap(pd.recv.data() + at, s.count, pd.cols);
        at += s.count * pd.cols;
      }
    }
  }
  ex.charge(OpKind::kCopy, 0, 2.0 * n(y.numel()), "a2a_unpack");
  pd.send = {};
  pd.recv = {};
  return y;
}

Tensor UlyssesExchange::to_heads(const Exec& ex, const Tensor& x, std::int64_t total, int batch,
                                 int head_dim, std::string_view label) const {
  Pending pd = start_to_heads(ex, x, total, batch, head_dim, label);
  return finish_to_heads(ex, pd, total, batch, label);
}

// to_sequence: o [B*total, hl*D] -> send block j = [B, n_j, hl*D] (tokens of rank j)
//              recv block i = [B, n_r, hl*D] -> y [B*n_r, h*D], heads of rank i at i*hl*D
Tensor UlyssesExchange::to_sequence(const Exec& ex, const Tensor& o, std::int64_t total, int batch,
                                    std::string_view label) const {
  const int p = degree(), r = index();
  const std::int64_t hw = o.cols();
  const TokenShard me = shard_tokens(total, p, r);
  COCO_CHECK(o.rows() == batch * total, "to_sequence: o " + o.shape_str());
  std::vector<std::int64_t> sc(static_cast<size_t>(p)), rc(static_cast<size_t>(p));
  std::vector<float> send, recv;
  if (!ex.phantom) {
    send.resize(static_cast<size_t>(o.numel()));
    recv.resize(static_cast<size_t>(batch * me.count * hw * p));
  }
  std::int64_t at = 0;
  for (int j = 0; j < p; ++j) {
    const TokenShard s = shard_tokens(total, p, j);
    sc[static_cast<size_t>(j)] = batch * s.count * hw;
    rc[static_cast<size_t>(j)] = batch * me.count * hw;
    if (!ex.phantom)
      for (int b = 0; b < batch; ++b) {
        MatMap dst(send.data() + at, s.count, hw);
        dst = o.mat().middleRows(b * total + s.begin, s.count);
        at += s.count * hw;
      }
  }
  ex.charge(OpKind::kCopy, 0, 2.0 * n(o.numel()), "a2a_pack");
  exchange(group_, send, recv, sc, rc, label).wait();
  Tensor y = Tensor::zeros(batch * me.count, hw * p, ex.phantom);
  if (!ex.phantom) {
    at = 0;
    for (int i = 0; i < p; ++i)
      for (int b = 0; b < batch; ++b) {
        y.mat().block(b * me.count, i * hw, me.count, hw) =
            ConstMatMap(recv.data() + at, me.count, hw);
        at += me.count * hw;
      }
  }
  ex.charge(OpKind::kCopy, 0, 2.0 * n(y.numel()), "a2a_unpack");
  return y;
}

// gather_heads: every rank's o [rows, hl*D] -> y [rows, P*hl*D], rank i's heads at i*hl*D
Tensor UlyssesExchange::gather_heads(const Exec& ex, const Tensor& o,
                                     std::string_view label) const {
  const int p = degree();
  const std::int64_t hw = o.cols();
  std::vector<float> recv;
  if (!ex.phantom) recv.resize(static_cast<size_t>(o.numel() * p));
  group_.all_gather(o.data(), recv, o.numel(), label);
  Tensor y = Tensor::zeros(o.rows(), hw * p, ex.phantom);
  if (!ex.phantom)
    for (int i = 0; i < p; ++i)
      y.mat().middleCols(i * hw, hw) = ConstMatMap(recv.data() + i * o.numel(), o.rows(), hw);
  ex.charge(OpKind::kCopy, 0, 2.0 * n(y.numel()), "gather_unpack");
  return y;
}

FlatUlysses::FlatUlysses(Communicator& group, int heads) : x_(group) {
  if (heads % group.size() != 0)
    throw ConfigError("flat Ulysses: " + std::to_string(heads) +
                      " attention heads are not divisible by the sequence-parallel degree " +
                      std::to_string(group.size()) +
                      " (choose a degree that divides the head count)");
}

// attend: per stream, per part (Q, K, V): project -> prepare -> exchange, one at a time;
// then attention on H/P heads over all tokens; then the output back per stream.
std::vector<Tensor> FlatUlysses::attend(const Exec& ex, const QkvSource& src,
                                        const AttentionShape& shape) {
  const int p = degree();
  if (shape.heads % p != 0)
    throw ConfigError("flat Ulysses: " + std::to_string(shape.heads) +
                      " heads not divisible by degree " + std::to_string(p));
  const int hl = shape.heads / p;
  const int h0 = index() * hl;
  const int streams = src.num_streams();
  static constexpr std::string_view kA2a[3] = {"q_all_to_all", "k_all_to_all", "v_all_to_all"};
  std::vector<Tensor> parts[3];
  for (int part = 0; part < 3; ++part) {
    const QkvPart qp = static_cast<QkvPart>(part);
    for (int s = 0; s < streams; ++s) {
      if (src.sharded(s) && p > 1) {
        Tensor x = src.project(ex, s, qp, 0, shape.heads);
        src.prepare(ex, s, qp, x, 0, shape.heads);
        parts[part].push_back(
            x_.to_heads(ex, x, src.total_tokens(s), shape.batch, shape.head_dim, kA2a[part]));
      } else {
        Tensor x = src.project(ex, s, qp, h0, h0 + hl);
        src.prepare(ex, s, qp, x, h0, h0 + hl);
        parts[part].push_back(std::move(x));
      }
    }
  }
  std::vector<const Tensor*> q, k, v;
  std::vector<std::int64_t> tokens;
  for (int s = 0; s < streams; ++s) {
    q.push_back(&parts[0][static_cast<size_t>(s)]);
    k.push_back(&parts[1][static_cast<size_t>(s)]);
    v.push_back(&parts[2][static_cast<size_t>(s)]);
    tokens.push_back(src.total_tokens(s));
  }
  const Tensor o = attention(ex, concat_tokens(ex, q, shape.batch, "q_concat"),
                             concat_tokens(ex, k, shape.batch, "k_concat"),
                             concat_tokens(ex, v, shape.batch, "v_concat"), hl, shape.head_dim,
                             shape.batch, "attention");
  std::vector<Tensor> outs = split_tokens(ex, o, tokens, shape.batch, "o_split");
  if (p == 1) return outs;
  for (int s = 0; s < streams; ++s) {
    Tensor& os = outs[static_cast<size_t>(s)];
    if (src.sharded(s))
      os = x_.to_sequence(ex, os, src.total_tokens(s), shape.batch, "o_all_to_all");
    else if (src.wants_output(s))
      os = x_.gather_heads(ex, os, "text_o_all_gather");
    else
      os = Tensor::zeros(os.rows(), std::int64_t{shape.heads} * shape.head_dim, ex.phantom);
  }
  return outs;
}

}  // namespace cocodiff::dit
