// Quantized matmul with AVX-512 VNNI (vpdpbusd: 64 unsigned codes x 64 int8 activations
// into 16 int32 lanes per instruction), compiled for that set alone and called only where
// the CPU has it (quant_linear.cpp).
//
// One group of 128 weights of one weight row against one activation row (sub 32), with
// code.p = lo . p_lo + hi . p_hi over the group's two runs, 16 int32 lanes (lanes 4b..4b+3:
// block b):
//
//   S = 128 code.p1 + code.p2    (the first kSimdLevels = 2 activation levels)
//   acc += 128 float(S) * (scale * d)[lane / 4] + offsets . sums    (d: the block's / 128^2)
//
// Against 4 activation rows the 4 rows' sums are first added within each block and
// interleaved (lane 4b + r: block b, row r), so the conversions, one multiply and one fma
// serve 4 rows:
//
//   S_r = [b0: s s s s | b1: s s s s | b2 ... | b3 ...]   r = 0..3
//   T   = [b0: S_0 S_1 S_2 S_3 | b1: ... | b2 ... | b3 ...]   (two unpack + add rounds)
//
// With sub 16 (Q6_K) the lo and hi runs of a block have their own scales and are kept apart.
#ifdef TOKENWIRE_QUANT_EMULATE_AVX512
#include "avx512_emulated.h"
#else
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>

#include "quant_kernels.h"

#ifndef TOKENWIRE_QUANT_EMULATE_AVX512
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")
#endif

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

inline __m512i dpbusd(__m512i acc, __m512i codes, const int8_t* p) {
  return _mm512_dpbusd_epi32(acc, codes, _mm512_loadu_si512(p));
}

// The dots of one group (level l's at p[l] + at) per lane, over both runs (sub 32) or
// over each run apart (sub 16: [0] lo, [1] hi, each with its own scale), at the first two
// levels: s = 128 code.p1 + code.p2, below 2^31 with 8-bit codes even summed over a block
// of 32 (4 * 255 * 127 * 2 * 128 per lane, four lanes).
struct Dots {
  __m512i s[2];
};

template <int Sub>
inline Dots dots(__m512i lo, __m512i hi, const int8_t* const* p, int64_t at) {
  static_assert(kSimdLevels == 2, "the dots below read two levels");
  const __m512i zero = _mm512_setzero_si512();
  constexpr int kRuns = Sub == 32 ? 2 : 1;  // runs summed into one dot
  Dots out;
  for (int h = 0; h < 3 - kRuns; ++h) {
    // level l over the runs of this dot, added to acc
    auto level = [&](__m512i acc, int l) {
      for (int run = h; run < h + kRuns; ++run)
        acc = dpbusd(acc, run ? hi : lo, p[l] + at + 64 * run);
      return acc;
    };
    // two independent chains, then combined: shorter latency than one chain through both
    const __m512i s1 = level(zero, 0), s2 = level(zero, 1);
    out.s[h] = _mm512_add_epi32(_mm512_slli_epi32(s1, kLevelShift), s2);
  }
  return out;
}

// A dot's value as floats, times 128^2 as d is stored (quant_kernels.h): 128 float(s), exact.
inline __m512 levels(__m512i s) {
  return _mm512_mul_ps(_mm512_cvtepi32_ps(s), _mm512_set1_ps(float(1 << kLevelShift)));
}

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

// The group's sub-block of each lane (lane / 4 is its block) in run h: b, or 2b + h (sub 16).
template <int Sub>
inline __m512i lane_subs(int h) {
  alignas(64) int idx[16];
  for (int l = 0; l < 16; ++l) idx[l] = Sub == 32 ? l / 4 : 2 * (l / 4) + h;
  return _mm512_load_si512(idx);
}

// Lane 4b + r of the result: the sum of block b's 4 lanes of s[r].
inline __m512i interleave_sums(const __m512i* s) {
  const __m512i s01 = _mm512_add_epi32(_mm512_unpacklo_epi32(s[0], s[1]),
                                       _mm512_unpackhi_epi32(s[0], s[1]));
  const __m512i s23 = _mm512_add_epi32(_mm512_unpacklo_epi32(s[2], s[3]),
                                       _mm512_unpackhi_epi32(s[2], s[3]));
  return _mm512_add_epi32(_mm512_unpacklo_epi64(s01, s23), _mm512_unpackhi_epi64(s01, s23));
}

template <int Bits, int Sub, bool Half>
struct Row {  // one weight row's codes, scales and offsets
  int64_t stride;  // bytes of codes per row
  const uint8_t* codes;
  const void* scales;
  const void* offsets;

  Row(const Weights& w, int64_t j)
      : stride(code_bytes(w.kp, Bits)),
        codes(w.codes + j * stride),
        scales(static_cast<const char*>(w.scales) + j * (w.kp / Sub) * (Half ? 2 : 4)),
        offsets(static_cast<const char*>(w.offsets) + j * (w.kp / Sub) * (Half ? 2 : 4)) {}

  // Codes of group g (prefetching the same group kAhead rows on).
  void group(int64_t g, __m512i& lo, __m512i& hi) const {
    const uint8_t* at = codes + g * (kGroup * Bits / 8);
    for (int c = 0; c < Bits / 4; ++c)
      _mm_prefetch(reinterpret_cast<const char*>(at + kAhead * stride + 64 * c), _MM_HINT_T0);
    load_codes<Bits>(at, lo, hi);
  }
};

// Weight row j against activation row `row`.
template <int Bits, int Sub, bool Half>
float dot_row(const Gemm& g, int64_t j, int64_t row) {
  constexpr int kSubs = kGroup / Sub, kHalves = Sub == 32 ? 1 : 2;
  const Activations& x = g.x;
  const Row<Bits, Sub, Half> w(g.w, j);
  const int64_t subs = g.w.kp / Sub;
  const __m512i idx[2] = {lane_subs<Sub>(0), lane_subs<Sub>(1)};
  __m512 acc = _mm512_setzero_ps();
  for (int64_t gi = 0; gi < g.w.kp / kGroup; ++gi) {
    __m512i lo, hi;
    w.group(gi, lo, hi);
    const Dots s = dots<Sub>(lo, hi, x.p, row * x.kp + gi * kGroup);
    const __m512 ds = _mm512_mul_ps(load_params<Sub, Half>(w.scales, gi * kSubs),
                                    load_params<Sub, false>(x.d + row * subs, gi * kSubs));
    for (int h = 0; h < kHalves; ++h)
      acc = _mm512_fmadd_ps(levels(s.s[h]), _mm512_permutexvar_ps(idx[h], ds), acc);
    acc = _mm512_fmadd_ps(load_params<Sub, Half>(w.offsets, gi * kSubs),  // zero-padded
                          load_params<Sub, false>(x.sums + row * subs, gi * kSubs), acc);
  }
  return _mm512_reduce_add_ps(acc);
}

// Weight row j against the 4 activation rows of tile q: out[r] for r = 0..3.
template <int Bits, int Sub, bool Half>
void dot_tile(const Gemm& g, int64_t j, int64_t q, float* out) {
  constexpr int kSubs = kGroup / Sub, kHalves = Sub == 32 ? 1 : 2;
  const Activations& x = g.x;
  const Row<Bits, Sub, Half> w(g.w, j);
  const int64_t groups = g.w.kp / kGroup;
  const __m512i idx[2] = {lane_subs<Sub>(0), lane_subs<Sub>(1)};
  __m512 acc = _mm512_setzero_ps();
  for (int64_t gi = 0; gi < groups; ++gi) {
    __m512i lo, hi, s[2][4];
    w.group(gi, lo, hi);
    for (int r = 0; r < 4; ++r) {
      const Dots dr = dots<Sub>(lo, hi, x.p, (4 * q + r) * x.kp + gi * kGroup);
      for (int h = 0; h < kHalves; ++h) s[h][r] = dr.s[h];
    }
    const __m512 scale = load_params<Sub, Half>(w.scales, gi * kSubs);
    const __m512 offset = load_params<Sub, Half>(w.offsets, gi * kSubs);
    for (int h = 0; h < kHalves; ++h) {
      const int64_t at = ((q * groups + gi) * kHalves + h) * 16;
      const __m512 ds = _mm512_mul_ps(_mm512_permutexvar_ps(idx[h], scale),
                                      _mm512_loadu_ps(x.d4 + at));
      acc = _mm512_fmadd_ps(levels(interleave_sums(s[h])), ds, acc);
      acc = _mm512_fmadd_ps(_mm512_permutexvar_ps(idx[h], offset), _mm512_loadu_ps(x.sums4 + at),
                            acc);
    }
  }
  // lanes 4b + r -> row r: add the blocks
  const __m256 b01 = _mm256_add_ps(_mm512_castps512_ps256(acc),
                                   _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc), 1)));
  _mm_storeu_ps(out, _mm_add_ps(_mm256_castps256_ps128(b01), _mm256_extractf128_ps(b01, 1)));
}

// Blocks of kTileRows weight rows x kTileRows activation rows: the weight rows stream from
// memory once, in order (one row at a time: interleaving rows defeats the hardware
// prefetcher on these CPUs), and a block of activation rows stays in L1 while they pass.
constexpr int64_t kTileRows = 16;

template <int Bits, int Sub, bool Half>
void gemm_layout(const Gemm& g, int64_t n_begin, int64_t n_end) {
  const int64_t n = g.w.n;
  for (int64_t j0 = n_begin; j0 < n_end; j0 += kTileRows) {
    for (int64_t m0 = 0; m0 < g.x.m; m0 += kTileRows) {
      const int64_t m1 = std::min(g.x.m, m0 + kTileRows);
      for (int64_t j = j0; j < std::min(n_end, j0 + kTileRows); ++j) {
        const float bias = g.bias ? g.bias[j] : 0.f;
        int64_t m = m0;
        for (; m + 4 <= m1; m += 4) {
          float out[4];
          dot_tile<Bits, Sub, Half>(g, j, m / 4, out);
          for (int r = 0; r < 4; ++r) g.out[(m + r) * n + j] = out[r] + bias;
        }
        for (; m < m1; ++m) g.out[m * n + j] = dot_row<Bits, Sub, Half>(g, j, m) + bias;
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

void unpack_row(const Weights& w, int64_t j, int64_t k, float* out) {
  const WeightRow row = weight_row(w, j);
  alignas(64) uint8_t runs[2][64];  // a group's lo and hi runs, one code per byte
  for (int64_t g = 0; g * kGroup < k; ++g) {
    __m512i lo, hi;
    if (w.bits == 4)
      load_codes<4>(row.codes + g * 64, lo, hi);
    else
      load_codes<8>(row.codes + g * 128, lo, hi);
    _mm512_store_si512(runs[0], lo);
    _mm512_store_si512(runs[1], hi);
    for (int64_t b = 0; b < 4 && g * kGroup + b * kBlock < k; ++b) {
      for (int h = 0; h < 2; ++h) {  // block b's halves of 16: run h, position 16 b
        const int64_t first = g * kGroup + b * kBlock + 16 * h, sub = first / w.sub;
        const __m512 c = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(
            _mm_load_si128(reinterpret_cast<const __m128i*>(runs[h] + 16 * b))));
        _mm512_storeu_ps(out + first,
                         _mm512_fmadd_ps(c, _mm512_set1_ps(param_at(row.scales, w.half, sub)),
                                         _mm512_set1_ps(param_at(row.offsets, w.half, sub))));
      }
    }
  }
}

void quantize_row(const float* x, int64_t k, int64_t kp, int sub, int8_t* p, int64_t stride,
                  float* d, float* sums) {
  constexpr float kPerLevel = float(1 << kLevelShift);
  for (int64_t b = 0; b < kp; b += kBlock) {
    // the block's halves: 16 weights each, 16 contiguous bytes of the lo and the hi run
    const int64_t at = lohi_index(b);
    const __m512 zero = _mm512_setzero_ps();
    const __m512 half[2] = {b < k ? _mm512_loadu_ps(x + b) : zero,
                            b < k ? _mm512_loadu_ps(x + b + 16) : zero};
    const float amax = _mm512_reduce_max_ps(
        _mm512_max_ps(_mm512_abs_ps(half[0]), _mm512_abs_ps(half[1])));
    const float total = _mm512_reduce_add_ps(_mm512_add_ps(half[0], half[1]));
    const bool finite = std::isfinite(total) && std::isfinite(amax);
    const __m512 inv = _mm512_set1_ps(finite && amax > 0.f ? 127.f / amax : 0.f);
    for (int h = 0; h < 2; ++h) {
      __m512 v = _mm512_mul_ps(half[h], inv);
      for (int level = 0; level < kSimdLevels; ++level) {  // the levels the dots read
        const __m512 q = _mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        _mm_storeu_si128(reinterpret_cast<__m128i*>(p + level * stride + at + 64 * h),
                         _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(q)));
        v = _mm512_mul_ps(_mm512_sub_ps(v, q), _mm512_set1_ps(kPerLevel));
      }
    }
    float half_sums[2] = {};  // read at sub 16 only
    if (sub == 16)
      for (int h = 0; h < 2; ++h) half_sums[h] = _mm512_reduce_add_ps(half[h]);
    store_block(b, sub, amax, finite, total, half_sums, d, sums);
  }
}

void gemm(const Gemm& g, int64_t n_begin, int64_t n_end) {
  if (g.w.bits == 4) {
    if (g.w.sub == 32) return gemm_bits_sub<4, 32>(g, n_begin, n_end);
    return gemm_bits_sub<4, 16>(g, n_begin, n_end);
  }
  if (g.w.sub == 32) return gemm_bits_sub<8, 32>(g, n_begin, n_end);
  gemm_bits_sub<8, 16>(g, n_begin, n_end);
}

}  // namespace tokenwire::quant::avx512

#ifndef TOKENWIRE_QUANT_EMULATE_AVX512
#pragma GCC pop_options
#endif
