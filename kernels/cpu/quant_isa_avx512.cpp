// Quantized matmul with AVX-512 VNNI (vpdpbusd: 64 unsigned codes x 64 int8 activations
// into 16 int32 lanes per instruction), compiled for that set alone and called only where
// the CPU has it (quant_linear.cpp).
//
// One group of 128 weights, one weight row, one activation row:
//
//   codes lo = weights 0-63, hi = weights 64-127 (quant_kernels.h's layout)
//   S_lo = 128 * dpbusd(lo, p1[0:64]) + dpbusd(lo, p2[0:64])      16 int32 lanes,
//   S_hi = the same over weights 64-127                            lane l = weights 4l..4l+3
//   acc += float(S_lo) * (scale * d)[sub of lane] + float(S_hi) * (...)
//          + offsets . sums                                       (one vector op each)
//
// A tile is 1 weight row x R activation rows: the row's codes are unpacked once per group
// and dotted with every activation row of the tile.
#include <immintrin.h>

#include <algorithm>

#include "quant_kernels.h"

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")

namespace tokenwire::quant::avx512 {
namespace {

constexpr int64_t kAhead = 16;  // weight rows ahead whose codes are prefetched

template <int Bits>
inline void load_codes(const uint8_t* group, __m512i& lo, __m512i& hi) {
  if constexpr (Bits == 4) {
    const __m512i c = _mm512_loadu_si512(group), nib = _mm512_set1_epi8(15);
    lo = _mm512_and_si512(c, nib);
    hi = _mm512_and_si512(_mm512_srli_epi16(c, 4), nib);
  } else {
    lo = _mm512_loadu_si512(group);
    hi = _mm512_loadu_si512(group + 64);
  }
}

// 128 * (codes . p1) + codes . p2 in each int32 lane.
inline __m512i dot2(__m512i codes, const int8_t* p1, const int8_t* p2) {
  __m512i s = _mm512_dpbusd_epi32(_mm512_setzero_si512(), codes, _mm512_loadu_si512(p1));
  s = _mm512_slli_epi32(s, 7);  // kLevel2
  return _mm512_dpbusd_epi32(s, codes, _mm512_loadu_si512(p2));
}

// A group's 128 / Sub scales or offsets (4 or 8) as floats in the low lanes, the rest zero.
template <int Sub, bool Half>
inline __m512 load_params(const void* row, int64_t first) {
  if constexpr (Sub == 32) {
    __m128 v;
    if constexpr (Half)
      v = _mm_cvtph_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(
          static_cast<const uint16_t*>(row) + first)));
    else
      v = _mm_loadu_ps(static_cast<const float*>(row) + first);
    return _mm512_zextps128_ps512(v);
  } else {
    __m256 v;
    if constexpr (Half)
      v = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(
          static_cast<const uint16_t*>(row) + first)));
    else
      v = _mm256_loadu_ps(static_cast<const float*>(row) + first);
    return _mm512_zextps256_ps512(v);
  }
}

// Which of the group's sub-blocks each int32 lane of S_lo (hi: + 128 / Sub / 2) belongs to.
template <int Sub>
inline __m512i lane_subs(int half) {
  const int per = Sub / 4, base = half * (64 / Sub);
  alignas(64) int idx[16];
  for (int l = 0; l < 16; ++l) idx[l] = base + l / per;
  return _mm512_load_si512(idx);
}

template <int Bits, int Sub, bool Half, int R>
void tile(const Gemm& g, int64_t j, int64_t m0) {
  const Weights& w = g.w;
  const Activations& x = g.x;
  constexpr int kSubs = kGroup / Sub;
  const int64_t subs = w.kp / Sub, cb = code_bytes(w.kp, Bits), pbytes = Half ? 2 : 4;
  const __m512i idx_lo = lane_subs<Sub>(0), idx_hi = lane_subs<Sub>(1);
  const uint8_t* codes = w.codes + j * cb;
  const auto* srow = static_cast<const char*>(w.scales) + j * subs * pbytes;
  const auto* orow = static_cast<const char*>(w.offsets) + j * subs * pbytes;
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t gi = 0; gi < w.kp / kGroup; ++gi) {
    const uint8_t* group = codes + gi * (kGroup * Bits / 8);
    for (int c = 0; c < Bits / 4; ++c)
      _mm_prefetch(reinterpret_cast<const char*>(group + kAhead * cb + 64 * c), _MM_HINT_T0);
    __m512i lo, hi;
    load_codes<Bits>(group, lo, hi);
    const __m512 scale = load_params<Sub, Half>(srow, gi * kSubs);
    const __m512 offset = load_params<Sub, Half>(orow, gi * kSubs);
    for (int r = 0; r < R; ++r) {
      const int64_t row = m0 + r;
      const int8_t* p1 = x.p1 + row * x.kp + gi * kGroup;
      const int8_t* p2 = x.p2 + row * x.kp + gi * kGroup;
      const __m512 ds = _mm512_mul_ps(scale, load_params<Sub, false>(x.d + row * subs, gi * kSubs));
      __m512 a = acc[r];
      a = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot2(lo, p1, p2)), _mm512_permutexvar_ps(idx_lo, ds), a);
      a = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot2(hi, p1 + 64, p2 + 64)),
                          _mm512_permutexvar_ps(idx_hi, ds), a);
      // zero past the group's sub-blocks
      acc[r] = _mm512_fmadd_ps(offset, load_params<Sub, false>(x.sums + row * subs, gi * kSubs), a);
    }
  }
  for (int r = 0; r < R; ++r)
    g.out[(m0 + r) * w.n + j] = _mm512_reduce_add_ps(acc[r]) + (g.bias ? g.bias[j] : 0.f);
}

// Blocks of kTileRows weight rows x kTileRows activation rows: the weight rows stream from
// memory once, in order (one row at a time: interleaving rows defeats the hardware
// prefetcher on these CPUs), and a block of activation rows stays in L1 while they pass.
constexpr int64_t kTileRows = 16;

template <int Bits, int Sub, bool Half>
void gemm_layout(const Gemm& g, int64_t n_begin, int64_t n_end) {
  for (int64_t j0 = n_begin; j0 < n_end; j0 += kTileRows) {
    for (int64_t m0 = 0; m0 < g.x.m; m0 += kTileRows) {
      const int64_t m1 = std::min(g.x.m, m0 + kTileRows);
      for (int64_t j = j0; j < std::min(n_end, j0 + kTileRows); ++j) {
        int64_t m = m0;
        for (; m + 2 <= m1; m += 2) tile<Bits, Sub, Half, 2>(g, j, m);
        if (m < m1) tile<Bits, Sub, Half, 1>(g, j, m);
      }
    }
  }
}

template <int Bits, int Sub>
void gemm_bits_sub(const Gemm& g, int64_t n_begin, int64_t n_end) {
  if (g.w.half) return gemm_layout<Bits, Sub, true>(g, n_begin, n_end);
  gemm_layout<Bits, Sub, false>(g, n_begin, n_end);
}

}  // namespace

void gemm(const Gemm& g, int64_t n_begin, int64_t n_end) {
  if (g.w.bits == 4) {
    if (g.w.sub == 32) return gemm_bits_sub<4, 32>(g, n_begin, n_end);
    return gemm_bits_sub<4, 16>(g, n_begin, n_end);
  }
  if (g.w.sub == 32) return gemm_bits_sub<8, 32>(g, n_begin, n_end);
  gemm_bits_sub<8, 16>(g, n_begin, n_end);
}

}  // namespace tokenwire::quant::avx512

#pragma GCC pop_options
