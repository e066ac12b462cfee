#include "core/hierarchy.hpp"

namespace cocodiff {

std::vector<int> MemberDigits::of(int g) const {
  std::vector<int> d(levels.size());
  for (size_t j = 0; j < d.size(); ++j) {
    d[j] = g % radix[j];
    g /= radix[j];
  }
  return d;
}

int MemberDigits::encode(const std::vector<int>& d) const {
  int g = 0;
  for (int j = count() - 1; j >= 0; --j)
    g = g * radix[static_cast<size_t>(j)] + d[static_cast<size_t>(j)];
  return g;
}

MemberDigits member_digits(const Communicator& group) {
  const Topology& t = group.topology();
  const int p = group.size();
  const std::vector<int> mine = group.coords(group.rank());
  MemberDigits md;
  for (int k = 0; k < t.num_levels(); ++k)
    for (int m = 0; m < p; ++m)
      if (group.coords(m)[static_cast<size_t>(k)] != mine[static_cast<size_t>(k)]) {
        md.levels.push_back(k);
        break;
      }
  for (int k : md.levels) {
    md.radix.push_back(t.level(k).size);
    md.product *= t.level(k).size;
  }
  return md;
}

MemberDigits topology_digits(const Topology& topo) {
  MemberDigits md;
  for (int k = 0; k < topo.num_levels(); ++k) {
    md.levels.push_back(k);
    md.radix.push_back(topo.level(k).size);
    md.product *= topo.level(k).size;
  }
  return md;
}

bool is_aligned(const Communicator& group, const MemberDigits& digits) {
  const int p = group.size();
  bool aligned = digits.product == p;
  for (int m = 0; aligned && m < p; ++m) {
    const std::vector<int> c = group.coords(m);
    const std::vector<int> d = digits.of(m);
    for (int j = 0; j < digits.count(); ++j)
      aligned = aligned && c[static_cast<size_t>(digits.levels[static_cast<size_t>(j)])] ==
                               d[static_cast<size_t>(j)];
  }
  return aligned;
}

std::vector<std::pair<int, int>> enumerate_blocks(const MemberDigits& digits,
                                                  const std::vector<int>& holder,
                                                  const std::vector<BlockDigit>& spec) {
  std::vector<std::pair<int, int>> out;
  std::vector<int> sd = holder, dd = holder;  // fixed digits: the holder's
  std::vector<int> ctr(spec.size(), 0);
  while (true) {
    for (size_t i = 0; i < spec.size(); ++i)
      (spec[i].source ? sd : dd)[static_cast<size_t>(spec[i].level)] = ctr[i];
    out.push_back({digits.encode(sd), digits.encode(dd)});
    int i = static_cast<int>(spec.size()) - 1;
    while (i >= 0) {
      const size_t u = static_cast<size_t>(i);
      if (++ctr[u] < digits.radix[static_cast<size_t>(spec[u].level)]) break;
      ctr[u] = 0;
      --i;
    }
    if (i < 0) break;
  }
  return out;
}

std::vector<BlockDigit> order_before(int k, int levels) {
  std::vector<BlockDigit> o;
  for (int j = k; j < levels; ++j) o.push_back({false, j});
  for (int j = k - 1; j >= 0; --j) o.push_back({true, j});
  return o;
}

std::vector<BlockDigit> order_received(int k, int levels) {
  std::vector<BlockDigit> o = {{true, k}};
  for (int j = k + 1; j < levels; ++j) o.push_back({false, j});
  for (int j = k - 1; j >= 0; --j) o.push_back({true, j});
  return o;
}

std::vector<BlockDigit> order_by_destination(int levels) {
  std::vector<BlockDigit> o;
  for (int j = levels - 1; j >= 0; --j) o.push_back({false, j});
  return o;
}

}  // namespace cocodiff
