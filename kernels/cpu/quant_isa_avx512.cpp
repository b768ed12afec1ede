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
#include <cstring>

#include "quant_kernels.h"

#ifndef TOKENWIRE_QUANT_EMULATE_AVX512
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")
#endif

#include "quant_panels.h"  // after the target: these loops compile for AVX-512
#include "quant_tiles.h"  // after the target: its loops compile for AVX-512

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

// A group's kGroup / Sub scales, offsets, d or sums of a row from `first` (4 at sub 32, 8 at
// sub 16) in the low lanes, zeros above.
template <int Sub, bool Half>
inline __m512 load_params(const void* row, int64_t first) {
  const auto* halves = reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(row) + first);
  const float* floats = static_cast<const float*>(row) + first;
  if constexpr (Sub == 32)
    return _mm512_zextps128_ps512(Half ? _mm_cvtph_ps(_mm_loadl_epi64(halves))
                                       : _mm_loadu_ps(floats));
  else
    return _mm512_zextps256_ps512(Half ? _mm256_cvtph_ps(_mm_loadu_si128(halves))
                                       : _mm256_loadu_ps(floats));
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
struct Row {  // one weight row's codes, scales and offsets, a group at a time
  static constexpr int kSubs = kGroup / Sub;         // sub-blocks (scales) per group
  static constexpr int kHalves = Sub == 32 ? 1 : 2;  // runs with scales of their own
  int64_t stride;  // bytes of codes per row
  int64_t groups;
  const uint8_t* codes;
  const void* scales;
  const void* offsets;
  __m512i idx[2];  // lane_subs of run 0 and run 1

  Row(const Weights& w, int64_t j)
      : stride(code_bytes(w.kp, Bits)),
        groups(w.kp / kGroup),
        codes(w.codes + j * stride),
        scales(static_cast<const char*>(w.scales) + j * (w.kp / Sub) * (Half ? 2 : 4)),
        offsets(static_cast<const char*>(w.offsets) + j * (w.kp / Sub) * (Half ? 2 : 4)),
        idx{lane_subs<Sub>(0), lane_subs<Sub>(1)} {}

  // Codes of group g (prefetching the same group kAhead rows on).
  void group(int64_t g, __m512i& lo, __m512i& hi) const {
    const uint8_t* at = codes + g * (kGroup * Bits / 8);
    for (int c = 0; c < Bits / 4; ++c)
      _mm_prefetch(reinterpret_cast<const char*>(at + kAhead * stride + 64 * c), _MM_HINT_T0);
    load_codes<Bits>(at, lo, hi);
  }

  // Group g's scales or offsets, zero-padded (load_params).
  __m512 scale(int64_t g) const { return load_params<Sub, Half>(scales, g * kSubs); }
  __m512 offset(int64_t g) const { return load_params<Sub, Half>(offsets, g * kSubs); }

  // Per-sub-block values (as load_params lays them) moved to the lanes of run h's dots.
  __m512 to_lanes(__m512 v, int h) const { return _mm512_permutexvar_ps(idx[h], v); }
};

// Weight row j against activation row `row`.
template <int Bits, int Sub, bool Half>
float dot_row(const Gemm& g, int64_t j, int64_t row) {
  using W = Row<Bits, Sub, Half>;
  const W w(g.w, j);
  const Activations& x = g.x;
  const float* d = x.d + row * (g.w.kp / Sub);
  const float* sums = x.sums + row * (g.w.kp / Sub);
  // The row's levels addressed once, not per group: a decode row at k = 576 is 5 groups, and
  // the per-group address arithmetic cost it ~10%.
  const int8_t* const p[kSimdLevels] = {x.p[0] + row * x.kp, x.p[1] + row * x.kp};
  __m512 acc = _mm512_setzero_ps();
  for (int64_t gi = 0; gi < w.groups; ++gi) {
    __m512i lo, hi;
    w.group(gi, lo, hi);
    const Dots s = dots<Sub>(lo, hi, p, gi * kGroup);
    const __m512 ds = _mm512_mul_ps(w.scale(gi), load_params<Sub, false>(d, gi * W::kSubs));
    for (int h = 0; h < W::kHalves; ++h)
      acc = _mm512_fmadd_ps(levels(s.s[h]), w.to_lanes(ds, h), acc);
    // offsets . sums lane by lane: both laid out (and zero-padded) alike
    acc = _mm512_fmadd_ps(w.offset(gi), load_params<Sub, false>(sums, gi * W::kSubs), acc);
  }
  return _mm512_reduce_add_ps(acc);
}

// Weight row j against the first R of the 4 activation rows of tile q: out[r] for r < R.
// A tile of 2 or 3 rows (a verification's, or a batch's last) runs as a whole tile whose
// missing rows' sums are zero: it shares the unpacking and the per-block float work as 4
// rows do, where 2 or 3 single rows paid them each.
template <int Bits, int Sub, bool Half, int R = 4>
void dot_tile(const Gemm& g, int64_t j, int64_t q, float* out) {
  using W = Row<Bits, Sub, Half>;
  const W w(g.w, j);
  const Activations& x = g.x;
  __m512 acc = _mm512_setzero_ps();
  for (int64_t gi = 0; gi < w.groups; ++gi) {
    __m512i lo, hi, s[2][4];
    w.group(gi, lo, hi);
    for (int r = 0; r < 4; ++r) {
      if (r >= R) {
        s[0][r] = s[1][r] = _mm512_setzero_si512();
        continue;
      }
      const Dots dr = dots<Sub>(lo, hi, x.p, (4 * q + r) * x.kp + gi * kGroup);
      for (int h = 0; h < W::kHalves; ++h) s[h][r] = dr.s[h];
    }
    const __m512 scale = w.scale(gi), offset = w.offset(gi);
    for (int h = 0; h < W::kHalves; ++h) {
      const int64_t at = ((q * w.groups + gi) * W::kHalves + h) * 16;  // Activations::d4
      const __m512 ds = _mm512_mul_ps(w.to_lanes(scale, h), _mm512_loadu_ps(x.d4 + at));
      acc = _mm512_fmadd_ps(levels(interleave_sums(s[h])), ds, acc);
      acc = _mm512_fmadd_ps(w.to_lanes(offset, h), _mm512_loadu_ps(x.sums4 + at), acc);
    }
  }
  // lanes 4b + r -> row r: add the blocks
  const __m256 b01 = _mm256_add_ps(_mm512_castps512_ps256(acc),
                                   _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc), 1)));
  float rows[4];
  _mm_storeu_ps(rows, _mm_add_ps(_mm256_castps256_ps128(b01), _mm256_extractf128_ps(b01, 1)));
  std::copy(rows, rows + R, out);
}

// What gemm_tiles (quant_tiles.h) runs: tiles of 4 activation rows, then a tile of the
// last 2 or 3, or a single row.
template <int Bits, int Sub, bool Half>
struct Kernel {
  static constexpr int64_t kRows = 4;
  static void tile(const Gemm& g, int64_t j, int64_t q, float* out) {
    dot_tile<Bits, Sub, Half>(g, j, q, out);
  }
  static void partial_tile(const Gemm& g, int64_t j, int64_t q, int64_t rows, float* out) {
    if (rows == 2) return dot_tile<Bits, Sub, Half, 2>(g, j, q, out);
    dot_tile<Bits, Sub, Half, 3>(g, j, q, out);
  }
  static float row(const Gemm& g, int64_t j, int64_t m) {
    return dot_row<Bits, Sub, Half>(g, j, m);
  }
};

// Rows r0 .. r0 + N - 1 of a tile against block b of a panel whose 8 code vectors are in
// `codes`: the rows' 2N chains (a level each) advance together, one code vector at a time,
// so each VPDPBUSD waits on one issued 2N before it (4 cycles' latency on Zen 4), not on
// the one just before. Against one row at a time a 2048-row chunk's matmuls took 1.05-1.07x
// as long (AMD EPYC Zen 4, loadtest.matmul_ab); 8 rows at a time spill registers (0.86x).
template <int N>
inline void panel_row_group(__m512 (&acc)[kTile], const PanelTile& t, const __m512i (&codes)[8],
                            __m512 scale, __m512 offset, int r0, int64_t b) {
  __m512i c1[N], c2[N];
  for (int r = 0; r < N; ++r) c1[r] = c2[r] = _mm512_setzero_si512();
  const int8_t* p1 = t.p1 + r0 * t.k + 32 * b;
  const int8_t* p2 = t.p2 + r0 * t.k + 32 * b;
  for (int i = 0; i < 8; ++i) {
    for (int r = 0; r < N; ++r) {
      int32_t q1, q2;  // 4 activation bytes each
      std::memcpy(&q1, p1 + r * t.k + 4 * i, 4);
      std::memcpy(&q2, p2 + r * t.k + 4 * i, 4);
      c1[r] = _mm512_dpbusd_epi32(c1[r], codes[i], _mm512_set1_epi32(q1));
      c2[r] = _mm512_dpbusd_epi32(c2[r], codes[i], _mm512_set1_epi32(q2));
    }
  }
  for (int r = 0; r < N; ++r)
    acc[r0 + r] = add_block(acc[r0 + r], c1[r], c2[r], t, scale, offset, r0 + r, b);
}

// The R rows of a tile against a panel (quant_panels.h), R known when compiled so the rows'
// sums stay in registers: per block, each of the panel's 8 code vectors (4 codes of each of
// its 16 weight rows) meets the matching 4 activation bytes of a row, broadcast, 4 rows at
// a time (panel_row_group); the two levels combine as exact int32 (add_block).
template <int R>
void panel_rows(__m512 (&acc)[kTile], const PanelTile& t) {
  constexpr int kGroupRows = 4;
  for (int64_t b = 0; b < t.blocks; ++b) {
    __m512i codes[8];
    for (int i = 0; i < 8; ++i) codes[i] = _mm512_loadu_si512(t.codes + b * kPanelBytes + 64 * i);
    const __m512 scale = _mm512_loadu_ps(t.scales + b * kTile);
    const __m512 offset = _mm512_loadu_ps(t.offsets + b * kTile);
    int r0 = 0;
    for (; r0 + kGroupRows <= R; r0 += kGroupRows)
      panel_row_group<kGroupRows>(acc, t, codes, scale, offset, r0, b);
    if constexpr (R % kGroupRows != 0)
      panel_row_group<R % kGroupRows>(acc, t, codes, scale, offset, r0, b);
  }
}

// panel_rows for the tile's own row count.
template <int R = 1>
void panel_tile(__m512 (&acc)[kTile], const PanelTile& t) {
  if constexpr (R < kTile) {
    if (t.rows == R) return panel_rows<R>(acc, t);
    return panel_tile<R + 1>(acc, t);
  } else {
    panel_rows<kTile>(acc, t);
  }
}

}  // namespace

void gemm_panels(const Weights& w, const panels::Inputs& x, const float* bias, float* out,
                 int64_t m, int64_t panel_begin, int64_t panel_end) {
  panel_loop(w, x, bias, out, m, panel_begin, panel_end, panel_tile<>);
}

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

void gemm(const Gemm& g, int64_t n_begin, int64_t n_end) { gemm_any<Kernel>(g, n_begin, n_end); }

}  // namespace tokenwire::quant::avx512

#ifndef TOKENWIRE_QUANT_EMULATE_AVX512
#pragma GCC pop_options
#endif
