// Quantized matmul for any CPU, compiled for the baseline instruction set: integer dots per
// sub-block in plain C++, the reference the vector paths are tested against.
#include <vector>

#include "quant_kernels.h"

namespace tokenwire::quant::portable {

void gemm(const Gemm& g, int64_t n_begin, int64_t n_end) {
  const Weights& w = g.w;
  const Activations& x = g.x;
  const int64_t subs = w.kp / w.sub, cb = code_bytes(w.kp, w.bits), pbytes = w.half ? 2 : 4;
  std::vector<int32_t> codes(w.kp);
  for (int64_t j = n_begin; j < n_end; ++j) {
    for (int64_t t = 0; t < w.kp; ++t) codes[t] = code_at(w.codes + j * cb, w.bits, t);
    const auto* srow = static_cast<const char*>(w.scales) + j * subs * pbytes;
    const auto* orow = static_cast<const char*>(w.offsets) + j * subs * pbytes;
    for (int64_t r = 0; r < x.m; ++r) {
      const int8_t* p1 = x.p1 + r * x.kp;
      const int8_t* p2 = x.p2 + r * x.kp;
      float acc = 0.f;
      for (int64_t s = 0; s < subs; ++s) {
        int32_t dot1 = 0, dot2 = 0;
        for (int64_t t = s * w.sub; t < (s + 1) * w.sub; ++t) {
          dot1 += codes[t] * p1[lohi_index(t)];
          dot2 += codes[t] * p2[lohi_index(t)];
        }
        const float ds = param_at(srow, w.half, s) * x.d[r * subs + s];
        acc += float(dot1 * kLevel2 + dot2) * ds + param_at(orow, w.half, s) * x.sums[r * subs + s];
      }
      g.out[r * w.n + j] = acc + (g.bias ? g.bias[j] : 0.f);
    }
  }
}

}  // namespace tokenwire::quant::portable
