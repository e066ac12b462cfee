#include "dit/parallel/v_major.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/errors.hpp"
#include "dit/parallel/strategies.hpp"

namespace cocodiff::dit {

namespace {

double n(std::int64_t v) { return static_cast<double>(v); }

// Phantom mode: sub-block i of a peer's run is active when the running share crosses an integer.
bool phantom_active(std::int64_t i, double f) {
  return std::floor(static_cast<double>(i + 1) * f) > std::floor(static_cast<double>(i) * f);
}

// Visits the sub-blocks of a [rows, cols] block: rows in runs of `tr`, columns in runs of `tc`.
template <typename F>
void for_subblocks(BlockShape b, std::int64_t tr, std::int64_t tc, F&& f) {
  for (std::int64_t r0 = 0; r0 < b.rows; r0 += tr)
    for (std::int64_t c0 = 0; c0 < b.cols; c0 += tc)
      f(r0, std::min(tr, b.rows - r0), c0, std::min(tc, b.cols - c0));
}

// Whether the rn x cn sub-block at a0 (rows `stride` apart) is sent against its copy at h0:
// always when the receiver holds no copy yet (`have` false), else when it changed (any bit when
// `exact`, else ||a - h||^2 > thr2 * ||h||^2).
bool active_subblock(const float* a0, const float* h0, std::int64_t stride, std::int64_t rn,
                     std::int64_t cn, bool have, bool exact, double thr2) {
  bool active = !have;
  double diff2 = 0, ref2 = 0;
  for (std::int64_t r = 0; r < rn && (!active || !exact); ++r) {
    const float* a = a0 + r * stride;
    const float* h = h0 + r * stride;
    if (exact) {
      active = active || std::memcmp(a, h, static_cast<size_t>(cn) * sizeof(float)) != 0;
    } else {
      for (std::int64_t c = 0; c < cn; ++c) {
        const double e = double(a[c]) - double(h[c]);
        diff2 += e * e;
        ref2 += double(h[c]) * double(h[c]);
      }
    }
  }
  if (!exact && diff2 > thr2 * ref2) active = true;
  return active;
}

// Appends the rn x cn sub-block at a0 (rows `stride` apart) to `out` and copies it to h0.
void compact_subblock(const float* a0, float* h0, std::int64_t stride, std::int64_t rn,
                      std::int64_t cn, std::vector<float>& out) {
  for (std::int64_t r = 0; r < rn; ++r) {
    const float* a = a0 + r * stride;
    out.insert(out.end(), a, a + cn);
    std::memcpy(h0 + r * stride, a, static_cast<size_t>(cn) * sizeof(float));
  }
}

}  // namespace

VMajorCache::VMajorCache(const StrategyOptions& options, const Topology& topo, bool phantom)
    : opt_(options),
      topo_(topo),
      phantom_(phantom),
      tier_on_(static_cast<size_t>(topo.num_tiers())) {
  for (const std::string& name : opt_.v_major_tiers) {
    bool found = false;
    for (int k = 0; k < topo.num_tiers(); ++k)
      if (topo.tier_name(k) == name) {
        tier_on_[static_cast<size_t>(k)] = true;
        found = true;
      }
    if (!found) {
      std::string list;
      for (int k = 0; k < topo.num_tiers(); ++k)
        list += (list.empty() ? "" : ", ") + topo.tier_name(k);
      throw ConfigError("v_major.tiers: unknown tier \"" + name + "\" (this cluster has " + list +
                        ")");
    }
  }
}

std::uint8_t& VMajorCache::flag(int pass, int layer) {
  COCO_CHECK(pass >= 0 && layer >= 0 && layer < 65536, "V-Major layer key");
  if (layer_flags_.size() <= static_cast<size_t>(pass))
    layer_flags_.resize(static_cast<size_t>(pass) + 1);
  std::vector<std::uint8_t>& f = layer_flags_[static_cast<size_t>(pass)];
  if (f.size() <= static_cast<size_t>(layer)) f.resize(static_cast<size_t>(layer) + 1, 0);
  return f[static_cast<size_t>(layer)];
}

std::uint8_t VMajorCache::flag_at(int pass, int layer) const {
  if (static_cast<size_t>(pass) >= layer_flags_.size()) return 0;
  const std::vector<std::uint8_t>& f = layer_flags_[static_cast<size_t>(pass)];
  return static_cast<size_t>(layer) < f.size() ? f[static_cast<size_t>(layer)] : 0;
}

void VMajorCache::skip_layers(int layers, double cache_bytes) {
  for (int i = 0; i < layers; ++i) {
    std::uint8_t& f = flag(pass_, layer_++);
    if ((f & kSeen) == 0) f |= kSeen | kCountedWhole;
  }
  cache_elements_ += cache_bytes / kBytesPerElement;
}

void VMajorCache::begin_forward(int step, int pass) {
  pass_ = pass;
  layer_ = 0;
  full_ = full_step_at(opt_, step);
}

bool VMajorCache::full_step_at(const StrategyOptions& options, int step) {
  return step < options.v_major_warmup_steps ||
         (options.v_major_refresh_every > 0 && step % options.v_major_refresh_every == 0);
}

bool VMajorCache::tier_selected(int tier) const {
  return tier >= 0 && tier < static_cast<int>(tier_on_.size()) &&
         tier_on_[static_cast<size_t>(tier)];
}

void VMajorCache::add_to(StrategyStats& s) const {
  for (const auto& [name, t] : tiers_) {
    VMajorTierStats& m = s.v_major[name];
    m.full_elements += t.full_elements;
    m.sent_elements += t.sent_elements;
    m.blocks += t.blocks;
    m.active_blocks += t.active_blocks;
    m.selective_blocks += t.selective_blocks;
    m.selective_active_blocks += t.selective_active_blocks;
  }
  s.v_major_cache_bytes += cache_elements_ * kBytesPerElement;
  s.v_major_phantom = s.v_major_phantom || phantom_;
  s.v_major_threshold = opt_.v_major_threshold;
}

bool VMajorChannel::member_selective(const SpGroup::Phase& ph, int v) const {
  return c_.tier_selected(ph.member_tier[static_cast<size_t>(v)]);
}

bool VMajorChannel::selective(const SpGroup::Phase& ph) const {
  if (c_.full_step()) return false;
  for (int v = 0; v < ph.members; ++v)
    if (member_selective(ph, v)) return true;
  return false;
}

std::uint64_t VMajorChannel::key(int phase, int s, int d) const {
  return (static_cast<std::uint64_t>(layer_) << 40) | (static_cast<std::uint64_t>(phase) << 32) |
         (static_cast<std::uint64_t>(s) << 16) | static_cast<std::uint64_t>(d);
}

std::int64_t VMajorChannel::subblocks(BlockShape b) const {
  const std::int64_t tr = c_.options().v_major_block_tokens;
  const std::int64_t tc = std::int64_t{c_.options().v_major_block_heads} * head_dim_;
  return ((b.rows + tr - 1) / tr) * ((b.cols + tc - 1) / tc);
}

double VMajorCache::tile_bytes(const StrategyMemoryQuery& q) {
  const Topology& topo = *q.topology;
  const std::vector<std::string>& tiers = q.options->v_major_tiers;
  double slow_peers = 0;
  for (int j = 1; j < topo.num_ranks(); ++j) {
    const int k = topo.tier(0, j);
    if (k >= 0 && std::find(tiers.begin(), tiers.end(), topo.tier_name(k)) != tiers.end())
      ++slow_peers;
  }
  const ModelConfig& m = *q.model;
  const double p = q.sp_ranks;
  const double v = q.batch * std::ceil(static_cast<double>(q.tokens) / p) * m.hidden();
  return 2.0 * m.attention_layers() * std::ceil(v * slow_peers / p) * sizeof(float);
}

std::vector<float>& VMajorCache::block_copy(bool held, std::uint64_t key, std::int64_t numel,
                                            bool counting) {
  if (phantom_) {
    if (counting) cache_elements_ += n(numel);
    return none_;
  }
  auto [it, fresh] = (held ? held_ : mirror_).try_emplace(key);
  if (fresh) cache_elements_ += n(numel);
  return it->second;
}

bool VMajorCache::counts_pass(int layer, std::uint64_t pass_key) {
  return !phantom_ || ((flag_at(layer / 65536, layer % 65536) & kCountedWhole) == 0 &&
                       phantom_counted_.insert(pass_key).second);
}

void VMajorChannel::begin_pass(int phase, bool held) {
  // One pass visits the same blocks every step (a sender's mirror in pack and record_sent, a
  // receiver's copy in unpack and record_received), so counting its first visit counts every
  // distinct block once.
  counting_ = c_.counts_pass(layer_, key(phase, 0, 0) ^ (held ? 1ull << 63 : 0));
}

// One pack call: the sub-block sizes and the threshold, the compacted active blocks of every
// selective peer, and the elements compared and compacted (what the pack is charged for).
struct VMajorChannel::Pack {
  std::int64_t tr, tc;  // sub-block rows and columns
  double thr2;          // squared threshold
  bool exact;           // threshold 0: a sub-block is active when any bit changed
  double f;             // phantom: the share of sub-blocks sent
  std::int64_t full_total;
  std::vector<float> compact;
  double scanned = 0, compacted = 0;
};

void VMajorChannel::pack(const Exec& ex, int phase, PhaseIo& io) {
  begin_pass(phase, false);
  const SpGroup::Phase& ph = io.ph;
  const size_t m = static_cast<size_t>(ph.members);
  Pack pk{c_.options().v_major_block_tokens,
          std::int64_t{c_.options().v_major_block_heads} * head_dim_,
          c_.options().v_major_threshold * c_.options().v_major_threshold,
          c_.options().v_major_threshold == 0,
          c_.options().v_major_phantom_active_fraction,
          io.send_off.back(),
          {}};
  std::vector<std::int64_t> msc(m, 0), mrc(m, 0);
  io.mask_send.clear();
  for (size_t v = 0; v < m; ++v) {
    if (!member_selective(ph, static_cast<int>(v))) continue;
    msc[v] = pack_member(pk, phase, io, v);
    // The peer's run to this rank has the same blocks, hence the same number of sub-blocks.
    std::int64_t rsub = 0;
    for (int i = ph.recv_member_begin[v]; i < ph.recv_member_begin[v + 1]; ++i)
      rsub += subblocks(
          io.shape(ph.recv[static_cast<size_t>(i)].first, ph.recv[static_cast<size_t>(i)].second));
    mrc[v] = rsub;
  }
  if (!io.phantom) io.send.insert(io.send.end(), pk.compact.begin(), pk.compact.end());
  io.mask_layout = AllToAllvLayout::packed(msc, mrc);
  if (io.phantom) io.mask_send.clear();
  io.mask_recv.assign(io.phantom ? 0 : static_cast<size_t>(io.mask_layout.recv_total()), 0.0f);
  // Compare against the mirror (read both), write the compacted blocks and the mirror.
  ex.charge(OpKind::kElementwise, 3.0 * pk.scanned, 2.0 * pk.scanned + 4.0 * pk.compacted,
            "v_major_select");
}

// Packs the blocks for selective peer v: its mask and its active sub-blocks, compacted; sets
// its send count and displacement. Returns its number of sub-blocks (mask elements).
std::int64_t VMajorChannel::pack_member(Pack& pk, int phase, PhaseIo& io, size_t v) {
  const SpGroup::Phase& ph = io.ph;
  VMajorTierStats& ts = c_.tier_stats(ph.member_tier[v]);
  const std::int64_t before = static_cast<std::int64_t>(pk.compact.size());
  std::int64_t phantom_sent = 0, idx = 0;
  for (int i = ph.send_member_begin[v]; i < ph.send_member_begin[v + 1]; ++i)
    pack_block(pk, phase, io, i, ts, idx, phantom_sent);
  const std::int64_t sent =
      io.phantom ? phantom_sent : static_cast<std::int64_t>(pk.compact.size()) - before;
  if (io.phantom) pk.compact.resize(0);
  ts.sent_elements += n(sent) + n(idx);
  pk.compacted += n(sent);
  io.layout.send_counts[v] = sent;
  io.layout.send_displs[v] = pk.full_total + (io.phantom ? 0 : before);
  if (io.phantom) {
    // Phantom: the compact region is never touched; displacements only need to be valid.
    io.layout.send_displs[v] = 0;
  }
  return idx;
}

// Scans send block i sub-block by sub-block (idx counts the peer's sub-blocks so far): whether
// each is active, its mask element and, when active, its compacted copy and the mirror's update.
void VMajorChannel::pack_block(Pack& pk, int phase, PhaseIo& io, int i, VMajorTierStats& ts,
                               std::int64_t& idx, std::int64_t& phantom_sent) {
  const auto [s, d] = io.ph.send[static_cast<size_t>(i)];
  const BlockShape b = io.shape(s, d);
  ts.full_elements += n(b.numel());
  pk.scanned += n(b.numel());
  std::vector<float>& mirror = c_.block_copy(false, key(phase, s, d), b.numel(), counting_);
  const bool have = !io.phantom && !mirror.empty();
  if (!io.phantom && mirror.empty()) mirror.assign(static_cast<size_t>(b.numel()), 0.0f);
  const float* data = io.phantom ? nullptr : io.send.data() + io.send_off[static_cast<size_t>(i)];
  for_subblocks(b, pk.tr, pk.tc,
                [&](std::int64_t r0, std::int64_t rn, std::int64_t c0, std::int64_t cn) {
                  bool active;
                  if (io.phantom) {
                    active = phantom_active(idx, pk.f);
                    if (active) phantom_sent += rn * cn;
                  } else {
                    const std::int64_t at = r0 * b.cols + c0;
                    active = active_subblock(data + at, mirror.data() + at, b.cols, rn, cn, have,
                                             pk.exact, pk.thr2);
                    io.mask_send.push_back(active ? 1.0f : 0.0f);
                    if (active)
                      compact_subblock(data + at, mirror.data() + at, b.cols, rn, cn, pk.compact);
                  }
                  ++ts.blocks;
                  ++ts.selective_blocks;
                  if (active) {
                    ++ts.active_blocks;
                    ++ts.selective_active_blocks;
                  }
                  ++idx;
                });
}

void VMajorChannel::plan_receive(int /*phase*/, PhaseIo& io) {
  const SpGroup::Phase& ph = io.ph;
  const size_t m = static_cast<size_t>(ph.members);
  const std::int64_t tr = c_.options().v_major_block_tokens;
  const std::int64_t tc = std::int64_t{c_.options().v_major_block_heads} * head_dim_;
  const double f = c_.options().v_major_phantom_active_fraction;
  std::int64_t tail = io.recv_off.back();
  std::int64_t mi = 0;  // position in the received mask
  for (size_t v = 0; v < m; ++v) {
    if (!member_selective(ph, static_cast<int>(v))) continue;
    std::int64_t count = 0, idx = 0;
    mi = io.mask_layout.recv_displs[v];
    for (int i = ph.recv_member_begin[v]; i < ph.recv_member_begin[v + 1]; ++i) {
      const auto [s, d] = ph.recv[static_cast<size_t>(i)];
      for_subblocks(io.shape(s, d), tr, tc,
                    [&](std::int64_t, std::int64_t rn, std::int64_t, std::int64_t cn) {
                      const bool active = io.phantom
                                              ? phantom_active(idx, f)
                                              : io.mask_recv[static_cast<size_t>(mi + idx)] != 0;
                      if (active) count += rn * cn;
                      ++idx;
                    });
    }
    io.layout.recv_counts[v] = count;
    io.layout.recv_displs[v] = io.phantom ? 0 : tail;
    tail += count;
  }
  if (!io.phantom) io.recv.resize(static_cast<size_t>(tail));
}

void VMajorChannel::unpack(const Exec& ex, int phase, PhaseIo& io) {
  begin_pass(phase, true);
  const SpGroup::Phase& ph = io.ph;
  const size_t m = static_cast<size_t>(ph.members);
  const std::int64_t tr = c_.options().v_major_block_tokens;
  const std::int64_t tc = std::int64_t{c_.options().v_major_block_heads} * head_dim_;
  double patched = 0, copied = 0;
  for (size_t v = 0; v < m; ++v) {
    if (!member_selective(ph, static_cast<int>(v))) continue;
    std::int64_t at = io.layout.recv_displs[v];
    std::int64_t idx = 0;
    const std::int64_t mi = io.mask_layout.recv_displs[v];
    for (int i = ph.recv_member_begin[v]; i < ph.recv_member_begin[v + 1]; ++i) {
      const auto [s, d] = ph.recv[static_cast<size_t>(i)];
      const BlockShape b = io.shape(s, d);
      std::vector<float>& held = c_.block_copy(true, key(phase, s, d), b.numel(), counting_);
      copied += n(b.numel());
      if (io.phantom) continue;
      if (held.empty()) held.assign(static_cast<size_t>(b.numel()), 0.0f);
      for_subblocks(b, tr, tc,
                    [&](std::int64_t r0, std::int64_t rn, std::int64_t c0, std::int64_t cn) {
                      if (io.mask_recv[static_cast<size_t>(mi + idx)] != 0) {
                        for (std::int64_t r = 0; r < rn; ++r) {
                          std::memcpy(held.data() + (r0 + r) * b.cols + c0, io.recv.data() + at,
                                      static_cast<size_t>(cn) * sizeof(float));
                          at += cn;
                        }
                        patched += n(rn * cn);
                      }
                      ++idx;
                    });
      std::memcpy(io.recv.data() + io.recv_off[static_cast<size_t>(i)], held.data(),
                  static_cast<size_t>(b.numel()) * sizeof(float));
    }
  }
  ex.charge(OpKind::kCopy, 0, 2.0 * (patched + copied), "v_major_patch");
}

void VMajorChannel::record_sent(int phase, PhaseIo& io) {
  begin_pass(phase, false);
  const SpGroup::Phase& ph = io.ph;
  for (int v = 0; v < ph.members; ++v) {
    if (!member_selective(ph, v)) continue;
    VMajorTierStats& ts = c_.tier_stats(ph.member_tier[static_cast<size_t>(v)]);
    for (int i = ph.send_member_begin[static_cast<size_t>(v)];
         i < ph.send_member_begin[static_cast<size_t>(v) + 1]; ++i) {
      const auto [s, d] = ph.send[static_cast<size_t>(i)];
      const BlockShape b = io.shape(s, d);
      ts.full_elements += n(b.numel());
      ts.sent_elements += n(b.numel());
      ts.blocks += subblocks(b);
      ts.active_blocks += subblocks(b);
      std::vector<float>& mirror = c_.block_copy(false, key(phase, s, d), b.numel(), counting_);
      if (!io.phantom) {
        const float* a = io.send.data() + io.send_off[static_cast<size_t>(i)];
        mirror.assign(a, a + b.numel());
      }
    }
  }
}

void VMajorChannel::record_received(int phase, PhaseIo& io) {
  begin_pass(phase, true);
  const SpGroup::Phase& ph = io.ph;
  for (int v = 0; v < ph.members; ++v) {
    if (!member_selective(ph, v)) continue;
    for (int i = ph.recv_member_begin[static_cast<size_t>(v)];
         i < ph.recv_member_begin[static_cast<size_t>(v) + 1]; ++i) {
      const auto [s, d] = ph.recv[static_cast<size_t>(i)];
      const BlockShape b = io.shape(s, d);
      std::vector<float>& held = c_.block_copy(true, key(phase, s, d), b.numel(), counting_);
      if (!io.phantom) {
        const float* a = io.recv.data() + io.recv_off[static_cast<size_t>(i)];
        held.assign(a, a + b.numel());
      }
    }
  }
}

}  // namespace cocodiff::dit
