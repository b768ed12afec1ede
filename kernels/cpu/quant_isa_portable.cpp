// Quantized matmul for any CPU, compiled for the baseline instruction set: integer dots per
// sub-block in plain C++, the reference the vector paths are tested against.
#include <algorithm>
#include <cmath>
#include <vector>

#include "quant_kernels.h"

namespace tokenwire::quant::portable {
namespace {

// Round to nearest, ties to even, for |v| <= 2^22: adding 1.5 * 2^23 leaves no fraction
// bits (exact, as nearbyint in the default rounding mode, which on baseline x86-64 is a
// libm call per element).
inline float round_even(float v) {
  constexpr float kMagic = 12582912.f;
  return (v + kMagic) - kMagic;
}

}  // namespace

void quantize_row(const float* x, int64_t k, int64_t kp, int sub, int8_t* p, int64_t stride,
                  float* d, float* sums) {
  for (int64_t b = 0; b < kp; b += kBlock) {
    float amax = 0.f, total = 0.f;
    for (int64_t t = b; t < std::min(b + kBlock, k); ++t) {
      amax = std::max(amax, std::fabs(x[t]));
      total += x[t];
    }
    const bool finite = std::isfinite(total) && std::isfinite(amax);
    const float inv = finite && amax > 0.f ? 127.f / amax : 0.f;
    for (int64_t t = b; t < b + kBlock; ++t) {
      float v = t < k ? x[t] * inv : 0.f;  // |v| <= 127, then each remainder <= 64
      for (int level = 0; level < kLevels; ++level) {  // each level: what is left, x 128
        const float q = round_even(v);
        p[level * stride + lohi_index(t)] = static_cast<int8_t>(q);
        v = (v - q) * float(1 << kLevelShift);
      }
    }
    float half_sums[2] = {};  // read at sub 16 only (at sub 32 the block's sum is total)
    if (sub == 16)
      for (int h = 0; h < 2; ++h)
        for (int64_t t = b + 16 * h; t < std::min(b + 16 * h + 16, k); ++t) half_sums[h] += x[t];
    store_block(b, sub, amax, finite, total, half_sums, d, sums);
  }
}

void unpack_row(const Weights& w, int64_t j, int64_t k, float* out) {
  const WeightRow row = weight_row(w, j);
  for (int64_t t = 0; t < k; ++t)
    out[t] = param_at(row.scales, w.half, t / w.sub) * float(code_at(row.codes, w.bits, t)) +
             param_at(row.offsets, w.half, t / w.sub);
}

void gemm(const Gemm& g, int64_t n_begin, int64_t n_end) {
  const Weights& w = g.w;
  const Activations& x = g.x;
  const int64_t subs = w.kp / w.sub;
  std::vector<int32_t> codes(w.kp);
  for (int64_t j = n_begin; j < n_end; ++j) {
    const WeightRow row = weight_row(w, j);
    for (int64_t t = 0; t < w.kp; ++t) codes[t] = code_at(row.codes, w.bits, t);
    for (int64_t r = 0; r < x.m; ++r) {
      float acc = 0.f;
      for (int64_t s = 0; s < subs; ++s) {
        int32_t dots[kLevels] = {};
        for (int64_t t = s * w.sub; t < (s + 1) * w.sub; ++t)
          for (int level = 0; level < kLevels; ++level)
            dots[level] += codes[t] * x.p[level][r * x.kp + lohi_index(t)];
        const float ds = param_at(row.scales, w.half, s) * x.d[r * subs + s];
        const float levels = float((dots[0] << kLevelShift) + dots[1]) * float(1 << kLevelShift) +
                             float(dots[2]);
        acc += levels * ds + param_at(row.offsets, w.half, s) * x.sums[r * subs + s];
      }
      g.out[r * w.n + j] = acc + (g.bias ? g.bias[j] : 0.f);
    }
  }
}

}  // namespace tokenwire::quant::portable
