// Hierarchical all-gather: one ring per topology level the group spans, innermost first (the
// intra/inter split of NCCL, TAPA's phases). The members must be a full grid of those levels:
// q_f distinct coordinates at level f, p = the product of the q_f. In phase f each member runs
// a ring all-gather among the q_f members that differ from it at level f only, passing a bundle
// per round: the blocks of every member that agrees with the bundle's owner at levels f and
// above (everything gathered in the phases before). A bundle holds s_f = q_0 ... q_{f-1} blocks,
// each where it belongs in the receive buffer. On a contention-free network with alpha_f,
// beta_f the tier of level f and m the bytes of one block:
// T = call + sum over f of (q_f - 1) (sw(s_f m) + alpha_f + s_f m beta_f).

#include <algorithm>

#include "emulator/collectives/registry.hpp"
#include "emulator/collectives/schedule.hpp"

namespace cocodiff::emu::collectives {

namespace {

class HierarchicalAllGather final : public Schedule {
 public:
  /// Levels (sizes q) the group spans, innermost first; each member's place on the grid
  /// (mixed radix, innermost fastest) and the member at each place.
  HierarchicalAllGather(std::vector<int> q, std::vector<int> place, std::vector<int> member)
      : Schedule(static_cast<int>(place.size())),
        q_(std::move(q)),
        place_(std::move(place)),
        member_(std::move(member)) {
    int stride = 1;
    for (const int n : q_) {
      first_round_.push_back(rounds_);
      stride_.push_back(stride);
      rounds_ += n - 1;
      stride *= n;
    }
  }
  int rounds() const override { return rounds_; }
  Message recv(const Sizes& s, int me, int round, int /*k*/) const override {
    const int f = phase(round).first;
    return gathered(neighbour(me, f, -1), round, stride_[static_cast<size_t>(f)] * s.count);
  }
  Message send(const Sizes& s, int me, int round, int /*k*/) const override {
    const int f = phase(round).first;
    return gathered(neighbour(me, f, +1), round, stride_[static_cast<size_t>(f)] * s.count);
  }
  void segments(const Sizes& s, int me, int round, int /*k*/, bool sending,
                std::vector<Segment>& out) const override {
    const auto [f, t] = phase(round);
    // The bundle's owner along level f: t places behind me when sending, t + 1 receiving.
    const int at = place_[static_cast<size_t>(me)];
    const int n = q_[static_cast<size_t>(f)], stride = stride_[static_cast<size_t>(f)];
    const int a = at / stride % n;
    const int b = wrap(a - t - (sending ? 0 : 1), n);
    const int base = at - at % (stride * n) + b * stride;  // levels above f: mine
    for (int low = 0; low < stride; ++low) {
      const int at_low = base + low;
      const int m = member_[static_cast<size_t>(at_low)];
      out.push_back({Buffer::kRecv, m * s.count, s.count});
    }
  }
  std::optional<Copy> own(const Sizes& s, int me) const override {
    return Copy{{Buffer::kSend, 0, s.count}, {Buffer::kRecv, me * s.count, s.count}};
  }
  std::int64_t local_elements(const Sizes& s, int /*me*/) const override { return s.count; }

 private:
  std::pair<int, int> phase(int round) const {
    const auto it = std::upper_bound(first_round_.begin(), first_round_.end(), round);
    const int f = static_cast<int>(it - first_round_.begin()) - 1;
    return {f, round - first_round_[static_cast<size_t>(f)]};
  }
  /// The member one place along level f from me (dir = +1: right, -1: left).
  int neighbour(int me, int f, int dir) const {
    const int at = place_[static_cast<size_t>(me)];
    const int n = q_[static_cast<size_t>(f)], stride = stride_[static_cast<size_t>(f)];
    const int a = at / stride % n;
    const int next = at + (wrap(a + dir, n) - a) * stride;
    return member_[static_cast<size_t>(next)];
  }
  std::vector<int> q_, place_, member_;
  std::vector<int> first_round_, stride_;
  int rounds_ = 0;
};

}  // namespace

std::unique_ptr<Schedule> make_hierarchical_all_gather(std::span<const std::vector<int>> coords) {
  const int p = static_cast<int>(coords.size());
  if (p == 0) return nullptr;
  const size_t levels = coords.front().size();
  // Per level the group spans: its distinct coordinates, in order.
  std::vector<std::vector<int>> values;
  std::vector<size_t> spanned;
  for (size_t l = 0; l < levels; ++l) {
    std::vector<int> v;
    for (const std::vector<int>& c : coords) v.push_back(c[l]);
    std::sort(v.begin(), v.end());
    v.erase(std::unique(v.begin(), v.end()), v.end());
    if (v.size() < 2) continue;
    values.push_back(std::move(v));
    spanned.push_back(l);
  }
  std::vector<int> q;
  long long cells = 1;
  for (const std::vector<int>& v : values) {
    q.push_back(static_cast<int>(v.size()));
    cells *= static_cast<long long>(v.size());
  }
  if (cells != p) return nullptr;
  std::vector<int> place(static_cast<size_t>(p)), member(static_cast<size_t>(p), -1);
  for (int r = 0; r < p; ++r) {
    int at = 0, stride = 1;
    for (size_t f = 0; f < spanned.size(); ++f) {
      const std::vector<int>& v = values[f];
      const int a = static_cast<int>(
          std::lower_bound(v.begin(), v.end(), coords[static_cast<size_t>(r)][spanned[f]]) -
          v.begin());
      at += a * stride;
      stride *= q[f];
    }
    if (member[static_cast<size_t>(at)] >= 0) return nullptr;  // two members at one place
    place[static_cast<size_t>(r)] = at;
    member[static_cast<size_t>(at)] = r;
  }
  return std::make_unique<HierarchicalAllGather>(std::move(q), std::move(place), std::move(member));
}

// Its registry entry (registry.cpp lists it with the other built-ins).
Algorithm builtin_hierarchical_all_gather() {
  return algorithm_entry(
      CollectiveKind::kAllGather, "hierarchical",
      "one ring per topology level the group spans, innermost first",
      [](const GroupShape& g) -> std::unique_ptr<Schedule> {
        if (static_cast<int>(g.coords.size()) != g.size) return nullptr;
        return make_hierarchical_all_gather(g.coords);
      },
      "ring");
}

}  // namespace cocodiff::emu::collectives
