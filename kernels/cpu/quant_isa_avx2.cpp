// Quantized matmul with AVX2 + FMA + F16C (8 floats per vector), compiled for that set
// alone and called only where the CPU has it (quant_linear.cpp).
#include <immintrin.h>

#include <algorithm>

#include "quant_kernels.h"

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")

namespace tokenwire::quant::avx2 {

typedef __m256 V;
constexpr int kLanes = 8, kVecs = 4, kNW = 4, kR = 2;

inline V vzero() { return _mm256_setzero_ps(); }
inline V vload(const float* p) { return _mm256_loadu_ps(p); }
inline V vfma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
inline V vadd(V a, V b) { return _mm256_add_ps(a, b); }
inline float vsum(V v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

template <int Fmt>
inline void dequant(const uint8_t* b, V* w) {
  // d and m (Q4_1) are adjacent halves: one conversion gives both.
  uint32_t dm_bits;
  std::memcpy(&dm_bits, b, 4);
  const __m128 dm = _mm_cvtph_ps(_mm_cvtsi32_si128(int(dm_bits)));
  const V d = _mm256_broadcastss_ps(dm);
  if constexpr (Fmt == kQ8_0) {
    for (int v = 0; v < 4; ++v) {
      const __m128i q = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(b + 2 + 8 * v));
      w[v] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)), d);
    }
  } else {
    const V m = Fmt == kQ4_1 ? _mm256_broadcastss_ps(_mm_movehdup_ps(dm)) : _mm256_mul_ps(d, _mm256_set1_ps(-8.f));
    const __m128i qs = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + (Fmt == kQ4_1 ? 4 : 2)));
    const __m256i lo8 = _mm256_cvtepu8_epi32(qs), hi8 = _mm256_cvtepu8_epi32(_mm_srli_si128(qs, 8));
    const __m256i nib = _mm256_set1_epi32(15);
    w[0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(lo8, nib)), d, m);
    w[1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(hi8, nib)), d, m);
    w[2] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(lo8, 4)), d, m);
    w[3] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(hi8, 4)), d, m);
  }
}

#include "quant_gemm.inc"

}  // namespace tokenwire::quant::avx2

#pragma GCC pop_options
