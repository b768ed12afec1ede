// Quantized matmul with AVX2 + FMA + F16C, compiled for that set alone and called only where
// the CPU has it (quant_linear.cpp). AVX2 has no VNNI and its u8 x s8 multiply saturates in
// int16, so codes and activations are widened to int16 and multiplied exactly (vpmaddwd):
// 16 weights per step, each int32 lane summing 2 of them.
#include <immintrin.h>

#include <algorithm>

#include "quant_kernels.h"

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")

namespace tokenwire::quant::avx2 {
namespace {

// A group's 128 codes as bytes, in its lo/hi order (that of the activations too).
template <int Bits>
inline void unpack_group(const uint8_t* group, uint8_t* out) {
  if constexpr (Bits == 4) {
    const __m256i nib = _mm256_set1_epi8(15);
    for (int h = 0; h < 2; ++h) {
      const __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(group + 32 * h));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 32 * h), _mm256_and_si256(c, nib));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 64 + 32 * h),
                          _mm256_and_si256(_mm256_srli_epi16(c, 4), nib));
    }
  } else {
    std::memcpy(out, group, kGroup);
  }
}

inline __m256i dot(__m256i codes, const int8_t* p) {
  return _mm256_madd_epi16(
      codes, _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}

// codes . (p1 + p2 / 128 + p3 / 128^2) * 128^2 over 16 weights, in 8 float lanes: levels 1-2
// in int32, level 3 apart (the three together can pass 2^31 with 8-bit codes).
inline __m256 dot_levels(const uint8_t* codes, const int8_t* const* p) {
  const __m256i c = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes)));
  const __m256i s12 = _mm256_add_epi32(_mm256_slli_epi32(dot(c, p[0]), kLevelShift), dot(c, p[1]));
  return _mm256_fmadd_ps(_mm256_cvtepi32_ps(s12), _mm256_set1_ps(float(1 << kLevelShift)),
                         _mm256_cvtepi32_ps(dot(c, p[2])));
}

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

template <int Bits>
void row(const Gemm& g, int64_t j) {
  const Weights& w = g.w;
  const Activations& x = g.x;
  const int64_t subs = w.kp / w.sub, cb = code_bytes(w.kp, Bits), pbytes = w.half ? 2 : 4;
  const auto* srow = static_cast<const char*>(w.scales) + j * subs * pbytes;
  const auto* orow = static_cast<const char*>(w.offsets) + j * subs * pbytes;
  alignas(32) uint8_t codes[kGroup];
  for (int64_t r = 0; r < x.m; ++r) g.out[r * w.n + j] = g.bias ? g.bias[j] : 0.f;
  for (int64_t gi = 0; gi < w.kp / kGroup; ++gi) {
    unpack_group<Bits>(w.codes + j * cb + gi * (kGroup * Bits / 8), codes);
    for (int64_t r = 0; r < x.m; ++r) {
      const int64_t at = r * x.kp + gi * kGroup;
      const float* d = x.d + r * subs;
      const float* sums = x.sums + r * subs;
      __m256 acc = _mm256_setzero_ps();
      float offset_sum = 0.f;
      for (int64_t t = 0; t < kGroup; t += 16) {  // run t / 64, block t / 16 % 4
        const int64_t block = gi * 4 + t / 16 % 4;
        const int64_t s = w.sub == 32 ? block : 2 * block + t / 64;
        const float ds = param_at(srow, w.half, s) * d[s];
        const int8_t* p[kLevels] = {x.p[0] + at + t, x.p[1] + at + t, x.p[2] + at + t};
        acc = _mm256_fmadd_ps(dot_levels(codes + t, p), _mm256_set1_ps(ds), acc);
      }
      for (int64_t s = gi * kGroup / w.sub; s < (gi + 1) * kGroup / w.sub; ++s)
        offset_sum += param_at(orow, w.half, s) * sums[s];
      g.out[r * w.n + j] += hsum(acc) + offset_sum;
    }
  }
}

}  // namespace

void gemm(const Gemm& g, int64_t n_begin, int64_t n_end) {
  for (int64_t j = n_begin; j < n_end; ++j) {
    if (g.w.bits == 4)
      row<4>(g, j);
    else
      row<8>(g, j);
  }
}

}  // namespace tokenwire::quant::avx2

#pragma GCC pop_options
