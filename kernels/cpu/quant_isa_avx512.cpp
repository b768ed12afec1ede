// Quantized matmul with AVX-512F (+ F16C, 16 floats per vector), compiled for that set
// alone and called only where the CPU has it (quant_linear.cpp).
#include <immintrin.h>

#include <algorithm>

#include "quant_kernels.h"

#pragma GCC push_options
#pragma GCC target("avx512f,avx2,fma,f16c")

namespace tokenwire::quant::avx512 {

typedef __m512 V;
// 4 weight rows x 4 activation rows: 16 accumulators of the 32 registers; at decode's one
// row the 4 weight rows are 4 independent sum chains.
constexpr int kLanes = 16, kVecs = 2, kNW = 4, kR = 4;

inline V vzero() { return _mm512_setzero_ps(); }
inline V vload(const float* p) { return _mm512_loadu_ps(p); }
inline V vfma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
inline V vadd(V a, V b) { return _mm512_add_ps(a, b); }
inline float vsum(V v) { return _mm512_reduce_add_ps(v); }

template <int Fmt>
inline void dequant(const uint8_t* b, V* w) {
  // d and m (Q4_1) are adjacent halves: one conversion gives both.
  uint32_t dm_bits;
  std::memcpy(&dm_bits, b, 4);
  const __m128 dm = _mm_cvtph_ps(_mm_cvtsi32_si128(int(dm_bits)));
  const V d = _mm512_broadcastss_ps(dm);
  if constexpr (Fmt == kQ8_0) {
    for (int v = 0; v < 2; ++v) {
      const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 2 + 16 * v));
      w[v] = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)), d);
    }
  } else {
    const V m = Fmt == kQ4_1 ? _mm512_broadcastss_ps(_mm_movehdup_ps(dm)) : _mm512_mul_ps(d, _mm512_set1_ps(-8.f));
    const __m128i qs = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + (Fmt == kQ4_1 ? 4 : 2)));
    const __m512i q = _mm512_cvtepu8_epi32(qs);
    w[0] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_and_si512(q, _mm512_set1_epi32(15))), d, m);
    w[1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(q, 4)), d, m);
  }
}

#include "quant_gemm.inc"

}  // namespace tokenwire::quant::avx512

#pragma GCC pop_options
