#pragma once
// The block orders of a hierarchical exchange, written once for every user of them: TAPA's
// phases (dit/parallel/tapa.hpp) and the network benchmark's hierarchical all-to-all
// (net_models/hierarchical_a2a.hpp).
//
// The members of a group that differ in some topology levels are numbered by digits, one per
// such level (the innermost least significant): member g's digit j is
// g / (radix[0] ... radix[j-1]) % radix[j]. Phase k is one all-to-all among the members that
// differ only in digit k; a block (source s, destination d) moves along digit k in phase k. A
// holder's blocks before phase k are ordered by the digits (outermost first)
//   [d_k, d_k+1, ..., d_L-1, s_k-1, ..., s_0]       (order_before(k, L))
// so each peer's blocks are contiguous; phase k delivers them as
//   [s_k, d_k+1, ..., d_L-1, s_k-1, ..., s_0]       (order_received(k, L))
// and after the last phase the order is [s_L-1, ..., s_0]: source rank order, what a flat
// all-to-all gives.
//
//   const MemberDigits digits = member_digits(group);           // levels the group spans
//   const std::vector<int> mine = digits.of(group.rank());
//   auto blocks = enumerate_blocks(digits, mine, order_before(0, digits.count()));

#include <cstdint>
#include <utility>
#include <vector>

#include "core/communicator.hpp"
#include "core/topology.hpp"

namespace cocodiff {

/// One digit of a block order: digit `level` (an index into MemberDigits) of the block's source
/// or destination.
struct BlockDigit {
  bool source;
  int level;
};

/// A group's members numbered by digits, one per topology level in which they differ.
struct MemberDigits {
  std::vector<int> levels;  // topology level of each digit
  std::vector<int> radix;   // the size of that level
  std::int64_t product = 1;
  int count() const { return static_cast<int>(levels.size()); }
  /// Member g's digits.
  std::vector<int> of(int g) const;
  /// The member whose digits are `d`.
  int encode(const std::vector<int>& d) const;
};

/// The levels in which the members of `group` differ from its caller, and each level's size.
MemberDigits member_digits(const Communicator& group);

/// Every level of `topo`, of size one or not: the world's digits (member = world rank).
MemberDigits topology_digits(const Topology& topo);

/// Whether `group` is a full box of the topology in rank order (digits = coordinates).
bool is_aligned(const Communicator& group, const MemberDigits& digits);

/// The blocks (source member, destination member) in the order `spec` (outermost first); the
/// digits `spec` does not name are the holder's, `holder`.
std::vector<std::pair<int, int>> enumerate_blocks(const MemberDigits& digits,
                                                  const std::vector<int>& holder,
                                                  const std::vector<BlockDigit>& spec);

/// A holder's order before phase k of `levels` ([d_k ... d_L-1, s_k-1 ... s_0]); k = levels:
/// after the last phase, source rank order.
std::vector<BlockDigit> order_before(int k, int levels);

/// The order phase k delivers: [s_k, d_k+1 ... d_L-1, s_k-1 ... s_0].
std::vector<BlockDigit> order_received(int k, int levels);

/// Destination rank order [d_L-1 ... d_0]: a caller's send buffer.
std::vector<BlockDigit> order_by_destination(int levels);

}  // namespace cocodiff
