// Ring all-reduce: a reduce-scatter ring (p-1 steps, each adding the received chunk into the
// local one) then an all-gather ring (p-1 steps). Each chunk is reduced in one fixed order, so
// results are bitwise reproducible. T = call + 2 (p-1) (sw(n/p) + alpha + (n/p) beta).

#include <algorithm>
#include <vector>

#include "emulator/collectives/collectives.hpp"

namespace cocodiff::emu::collectives {

void all_reduce_ring(Port& port, std::span<float> data, std::int64_t count, ReduceOp op) {
  const int p = port.size();
  const int r = port.rank();
  port.charge_call();
  if (p == 1) return;
  const int right = (r + 1) % p;
  const int left = (r - 1 + p) % p;
  auto chunk_begin = [&](int c) { return count * c / p; };
  auto chunk_size = [&](int c) { return chunk_begin(c + 1) - chunk_begin(c); };
  std::vector<float> tmp(data.empty() ? 0 : static_cast<size_t>(count / p + 1));
  for (int k = 0; k + 1 < p; ++k) {
    const int out_c = (r - k + p) % p;
    const int in_c = (r - k - 1 + 2 * p) % p;
    std::span<float> in_buf =
        data.empty() ? std::span<float>()
                     : std::span<float>(tmp).first(static_cast<size_t>(chunk_size(in_c)));
    detail::ReqPtr rr = port.irecv(in_buf, chunk_size(in_c), left, k);
    port.charge_message(chunk_size(out_c));
    detail::ReqPtr sr =
        port.isend(sub(std::span<const float>(data), chunk_begin(out_c), chunk_size(out_c)),
                   chunk_size(out_c), right, k);
    port.wait(rr);
    port.wait(sr);
    if (!data.empty()) {
      float* dst = data.data() + chunk_begin(in_c);
      for (std::int64_t i = 0; i < chunk_size(in_c); ++i)
        dst[i] = op == ReduceOp::kSum ? dst[i] + in_buf[static_cast<size_t>(i)]
                                      : std::max(dst[i], in_buf[static_cast<size_t>(i)]);
    }
  }
  // Rank r now owns the fully reduced chunk (r+1) mod p; circulate the reduced chunks.
  for (int k = 0; k + 1 < p; ++k) {
    const int out_c = (r + 1 - k + p) % p;
    const int in_c = (r - k + p) % p;
    detail::ReqPtr rr =
        port.irecv(sub(data, chunk_begin(in_c), chunk_size(in_c)), chunk_size(in_c), left, p + k);
    port.charge_message(chunk_size(out_c));
    detail::ReqPtr sr =
        port.isend(sub(std::span<const float>(data), chunk_begin(out_c), chunk_size(out_c)),
                   chunk_size(out_c), right, p + k);
    port.wait(rr);
    port.wait(sr);
  }
}

}  // namespace cocodiff::emu::collectives
