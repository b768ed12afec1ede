// Quantized matmul with AVX2 + FMA + F16C, compiled for that set alone and called only where
// the CPU has it (quant_linear.cpp): CPUs with AVX2 and without AVX-512.
//
// AVX2 has no VNNI, so every activation level costs a pass of multiplies: these dots read
// the first kSimdLevels (2) of the three (quant_kernels.h), activations to within
// d / 256 = max|x| / 32512 of each block's largest (llama.cpp's Q8_1: d / 2).
//   4-bit codes (0-15) x a level (|p| <= 127): vpmaddubsw (32 unsigned bytes by 32 signed
//     ones into 16 int16 lanes of two products, saturating) is exact, a lane at most
//     2 * 15 * 127 = 3810; the lo and hi runs' lanes of the same blocks add in int16 (7620)
//     before vpmaddwd widens them to int32 and weighs the levels (128^2, 128) in the same
//     instruction.
//   8-bit codes (0-255) would overflow vpmaddubsw against the first level (2 * 255 * 127),
//     so they are widened to int16 and vpmaddwd multiplies them by x12 = 128 * p1 + p2:
//     both levels in one multiply, at most 32 * 255 * 16320 per block in int32.
//
// A step covers 8 sub-blocks (two groups at sub 32, one at sub 16). Its int32 lanes hold
// products of one block half or block each; vphaddd rounds (and for int16 dots a swap of
// 128-bit halves) sum each sub-block into one lane, in the order [0 2 4 6 1 3 5 7] (sub 32)
// or [0 1 4 5 2 3 6 7] (sub 16), so the 8 scales are permuted once per step to meet them.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "quant_kernels.h"

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")

#include "quant_tiles.h"  // after the target: its loops compile for AVX2

namespace tokenwire::quant::avx2 {
namespace {

inline __m256i load32(const void* p) {
  return _mm256_loadu_si256(static_cast<const __m256i*>(p));
}

// A group's codes as 4 vectors of 32 bytes, vector i against activation bytes 32 i..32 i + 31
// of the group (lo run: i = 0, 1; hi run: i = 2, 3; i even: blocks 0-1, odd: blocks 2-3).
// A 4-bit HalfGroup (Weights::half_tail's last group) unpacks only the even ones: the odd
// ones are padding, and no caller reads them.
template <int Bits, bool HalfGroup = false>
struct Codes {
  __m256i v[4];

  explicit Codes(const uint8_t* group) {
    if constexpr (Bits == 4) {
      const __m256i nib = _mm256_set1_epi8(15);
      for (int h = 0; h < (HalfGroup ? 1 : 2); ++h) {  // byte t: lo[32 h + t] | hi[.] << 4
        const __m256i c = load32(group + 32 * h);
        v[h] = _mm256_and_si256(c, nib);
        v[2 + h] = _mm256_and_si256(_mm256_srli_epi16(c, 4), nib);
      }
    } else {
      for (int i = 0; i < 4; ++i) v[i] = load32(group + 32 * i);
    }
  }

  // Vector i's int16 lanes against 32 activation bytes at p.
  __m256i products(int i, const int8_t* p) const { return _mm256_maddubs_epi16(v[i], load32(p)); }
};

inline __m256i weigh(__m256i lanes16, int k) {
  return _mm256_madd_epi16(lanes16, _mm256_set1_epi16(static_cast<short>(k)));
}

// Sums of 4-bit codes' dot vectors (code vector i's int32 lanes, as Codes orders them; sub
// 32: lo + hi added already, v[0] and v[1] only) per block half (sub 16) or block (sub 32),
// in the layout group_dots returns.
template <int Sub>
inline __m256i reduce_nibbles(const __m256i* v) {
  if constexpr (Sub == 32) return _mm256_hadd_epi32(v[0], v[1]);
  // v[0] lo of blocks 0-1 (sub-blocks 0, 2), v[2] their hi (1, 3), v[1], v[3]: 4-7
  return _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[2]), _mm256_hadd_epi32(v[1], v[3]));
}

// [a.lo + a.hi | b.lo + b.hi] of two vectors' 128-bit halves.
inline __m256i fold_halves(__m256i a, __m256i b) {
  return _mm256_add_epi32(_mm256_permute2x128_si256(a, b, 0x20),
                          _mm256_permute2x128_si256(a, b, 0x31));
}

// 8-bit codes . x12 over one group, in the layout group_dots returns. A 16-code load is one
// sub-block s = 2 b + h (block b, half h: lo run at 16 b, hi run at 64 + 16 b), widened to
// int16: all 8 int32 lanes of its dot are that sub-block.
template <int Sub, bool HalfGroup>
inline __m256i x12_dots(const uint8_t* group, const int16_t* x12) {
  __m256i s[8];
  for (int b = 0; b < 4; ++b)
    for (int h = 0; h < 2; ++h) {
      if (HalfGroup && b >= 2) {
        s[2 * b + h] = _mm256_setzero_si256();
        continue;
      }
      const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(group + 64 * h + 16 * b));
      s[2 * b + h] = _mm256_madd_epi16(_mm256_cvtepu8_epi16(c), load32(x12 + 64 * h + 16 * b));
    }
  if constexpr (Sub == 32) {  // blocks B: [b0 b0 b2 b2 | b1 b1 b3 b3], half sums
    __m256i block[4];
    for (int b = 0; b < 4; ++b) block[b] = _mm256_add_epi32(s[2 * b], s[2 * b + 1]);
    return fold_halves(_mm256_hadd_epi32(block[0], block[2]),
                       _mm256_hadd_epi32(block[1], block[3]));
  }
  return fold_halves(  // [s0 s1 s4 s5 | s2 s3 s6 s7]
      _mm256_hadd_epi32(_mm256_hadd_epi32(s[0], s[1]), _mm256_hadd_epi32(s[4], s[5])),
      _mm256_hadd_epi32(_mm256_hadd_epi32(s[2], s[3]), _mm256_hadd_epi32(s[6], s[7])));
}

// The integer dots of one group in units of d / 128^2 (Activations::d), as int32 lanes.
// Sub 32: lanes [b0 b0 b2 b2 | b1 b1 b3 b3] (half sums of each block). Sub 16: the whole
// step, lanes [s0 s1 s4 s5 | s2 s3 s6 s7] (sub-blocks s of the group). `at`: the group's
// first activation of the row. A HalfGroup's blocks 2 and 3 are padding: their lanes are 0,
// their products never computed (a tenth of the work where k = 576).
template <int Bits, int Sub, bool HalfGroup>
[[gnu::always_inline]] inline __m256i group_dots(const uint8_t* group, const Activations& x,
                                                 int64_t at) {
  if constexpr (Bits == 8)  // in units of d / 128: dot() scales them by 128
    return x12_dots<Sub, HalfGroup>(group, x.x12 + at);
  const Codes<Bits, HalfGroup> codes(group);
  auto skipped = [](int i) { return HalfGroup && i % 2 == 1; };  // code vector of blocks 2-3
  constexpr int kWeight[kSimdLevels] = {128 * 128, 128};
  __m256i main[4];  // per code vector i (sub 32: i = 0, 1 only)
  for (int i = 0; i < 4; ++i) main[i] = _mm256_setzero_si256();
  for (int l = 0; l < kSimdLevels; ++l) {
    const int8_t* p = x.p[l] + at;
    if constexpr (Sub == 32) {  // lo + hi of the same blocks, in int16
      for (int i = 0; i < 2; ++i)
        if (!skipped(i))
          main[i] = _mm256_add_epi32(
              main[i], weigh(_mm256_add_epi16(codes.products(i, p + 32 * i),
                                              codes.products(i + 2, p + 64 + 32 * i)),
                             kWeight[l]));
    } else {
      for (int i = 0; i < 4; ++i)
        if (!skipped(i))
          main[i] = _mm256_add_epi32(main[i], weigh(codes.products(i, p + 32 * i), kWeight[l]));
    }
  }
  return reduce_nibbles<Sub>(main);
}

// 8 consecutive scales (or offsets, activation d or sums) of a row from `first`, or the
// first 4 of them and zeros when `four` (a row's last step at sub 32 may hold one group).
// A narrower load rather than a copy into a zeroed buffer: the copy's stores stall the
// vector load that reads them back, which cost a third of a short row's time.
template <bool Half>
inline __m256 load8(const void* row, int64_t first, bool four) {
  const char* at = static_cast<const char*>(row) + first * (Half ? 2 : 4);
  if constexpr (Half) {
    const __m128i h = four ? _mm_loadl_epi64(reinterpret_cast<const __m128i*>(at))
                           : _mm_loadu_si128(reinterpret_cast<const __m128i*>(at));
    return _mm256_cvtph_ps(h);
  }
  const float* f = reinterpret_cast<const float*>(at);
  return four ? _mm256_zextps128_ps256(_mm_loadu_ps(f)) : _mm256_loadu_ps(f);
}

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

// Weight row j against activation row `row`.
template <int Bits, int Sub, bool Half>
[[gnu::always_inline]] inline float dot(const Gemm& g, int64_t j, int64_t row) {
  constexpr int64_t kSubsPerGroup = kGroup / Sub, kGroupsPerStep = 8 / kSubsPerGroup;
  const Weights& w = g.w;
  const Activations& x = g.x;
  const int64_t groups = w.kp / kGroup, subs = w.kp / Sub;
  const WeightRow wj = weight_row(w, j);
  const float* d = x.d + row * subs;
  const float* sums = x.sums + row * subs;
  const __m256i order = Sub == 32 ? _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7)
                                  : _mm256_setr_epi32(0, 1, 4, 5, 2, 3, 6, 7);
  __m256 acc = _mm256_setzero_ps(), acc_offsets = _mm256_setzero_ps();
  auto dots_of = [&]<bool HalfGroup>(int64_t gj) {
    return group_dots<Bits, Sub, HalfGroup>(wj.codes + gj * (kGroup * Bits / 8), x,
                                            row * x.kp + gj * kGroup);
  };
  // Sub 32: two groups' lanes as one step's 8 sub-blocks.
  auto pair = [](__m256i a, __m256i b) { return _mm256_hadd_epi32(a, b); };
  // One step's sub-blocks from `first` on, scaled into the sums (`four`: a sub 32 step
  // of one group).
  auto accumulate = [&](__m256i dots, int64_t first, bool four) {
    __m256 value = _mm256_cvtepi32_ps(dots);
    if constexpr (Bits == 8) value = _mm256_mul_ps(value, _mm256_set1_ps(1 << kLevelShift));
    const __m256 scale = load8<Half>(wj.scales, first, four);
    const __m256 ds = _mm256_mul_ps(scale, load8<false>(d, first, four));
    acc = _mm256_fmadd_ps(value, _mm256_permutevar8x32_ps(ds, order), acc);
    acc_offsets = _mm256_fmadd_ps(load8<Half>(wj.offsets, first, four),
                                  load8<false>(sums, first, four), acc_offsets);
  };
  // Whole steps of whole groups, then what is left: one or two groups (sub 32), the last
  // a half group where the weight has one (Weights::half_tail).
  const int64_t whole = w.half_tail ? groups - 1 : groups;
  int64_t gi = 0;
  for (; gi + kGroupsPerStep <= whole; gi += kGroupsPerStep) {
    __m256i s = dots_of.template operator()<false>(gi);
    if constexpr (Sub == 32) s = pair(s, dots_of.template operator()<false>(gi + 1));
    accumulate(s, gi * kSubsPerGroup, false);
  }
  if (gi == groups) return hsum(_mm256_add_ps(acc, acc_offsets));
  const __m256i zero = _mm256_setzero_si256();
  const __m256i last = w.half_tail ? dots_of.template operator()<true>(groups - 1)
                                : dots_of.template operator()<false>(groups - 1);
  if constexpr (Sub == 32) {
    if (groups - gi == 2)
      accumulate(pair(dots_of.template operator()<false>(gi), last), gi * kSubsPerGroup, false);
    else
      accumulate(pair(last, zero), gi * kSubsPerGroup, true);
  } else {
    accumulate(last, gi * kSubsPerGroup, false);
  }
  return hsum(_mm256_add_ps(acc, acc_offsets));
}

// What gemm_tiles (quant_tiles.h) runs: single rows (no multi-row dot here).
template <int Bits, int Sub, bool Half>
struct Kernel {
  static constexpr int64_t kRows = 1;
  static float row(const Gemm& g, int64_t j, int64_t m) { return dot<Bits, Sub, Half>(g, j, m); }
};

// A group's 8 (sub 16) or 4 (sub 32, zeros after) scales or offsets as floats.
inline __m256 group_params(const void* row, bool half, int sub, int64_t g) {
  const bool four = sub == 32;
  const int64_t first = g * (kGroup / sub);
  return half ? load8<true>(row, first, four) : load8<false>(row, first, four);
}

}  // namespace

namespace {

inline float hmax(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
}

// 16 floats (already whole numbers, |v| <= 127) as 16 int8 in order.
inline __m128i to_int8(__m256 a, __m256 b) {
  const __m256i words = _mm256_permute4x64_epi64(  // [a0-3 b0-3 | a4-7 b4-7] -> a0-7 b0-7
      _mm256_packs_epi32(_mm256_cvtps_epi32(a), _mm256_cvtps_epi32(b)), 0xd8);
  return _mm_packs_epi16(_mm256_castsi256_si128(words), _mm256_extracti128_si256(words, 1));
}

}  // namespace

// portable::quantize_row's arithmetic on 8 lanes, up to the levels the dots read: the same
// levels bit for bit (round to nearest even, the same multiplies); sums are added in another
// order.
void quantize_row(const float* x, int64_t k, int64_t kp, int sub, int8_t* p, int64_t stride,
                  float* d, float* sums) {
  const __m256 per_level = _mm256_set1_ps(float(1 << kLevelShift));
  const __m256 sign = _mm256_set1_ps(-0.f);
  for (int64_t b = 0; b < kp; b += kBlock) {
    __m256 v[4];  // k is a multiple of 32: a block is all inside x or all padding
    for (int i = 0; i < 4; ++i) v[i] = b < k ? _mm256_loadu_ps(x + b + 8 * i) : _mm256_setzero_ps();
    const float amax = hmax(_mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, v[0]), _mm256_andnot_ps(sign, v[1])),
                                          _mm256_max_ps(_mm256_andnot_ps(sign, v[2]), _mm256_andnot_ps(sign, v[3]))));
    const float half_sums[2] = {hsum(_mm256_add_ps(v[0], v[1])), hsum(_mm256_add_ps(v[2], v[3]))};
    const float total = half_sums[0] + half_sums[1];
    const bool finite = std::isfinite(total) && std::isfinite(amax);
    const __m256 inv = _mm256_set1_ps(finite && amax > 0.f ? 127.f / amax : 0.f);
    const int64_t at = lohi_index(b);
    for (int h = 0; h < 2; ++h) {  // the block's halves: 16 bytes of the lo, then the hi run
      __m256 lo = _mm256_mul_ps(v[2 * h], inv), hi = _mm256_mul_ps(v[2 * h + 1], inv);
      for (int level = 0; level < kSimdLevels; ++level) {
        const __m256 qlo = _mm256_round_ps(lo, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        const __m256 qhi = _mm256_round_ps(hi, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        _mm_storeu_si128(reinterpret_cast<__m128i*>(p + level * stride + at + 64 * h),
                         to_int8(qlo, qhi));
        lo = _mm256_mul_ps(_mm256_sub_ps(lo, qlo), per_level);
        hi = _mm256_mul_ps(_mm256_sub_ps(hi, qhi), per_level);
      }
    }
    store_block(b, sub, amax, finite, total, half_sums, d, sums);
  }
}

void unpack_row(const Weights& w, int64_t j, int64_t k, float* out) {
  const WeightRow row = weight_row(w, j);
  for (int64_t g = 0; g * kGroup < k; ++g) {
    __m256i v[4];
    if (w.bits == 4) {
      const Codes<4> c(row.codes + g * 64);
      for (int i = 0; i < 4; ++i) v[i] = c.v[i];
    } else {
      const Codes<8> c(row.codes + g * 128);
      for (int i = 0; i < 4; ++i) v[i] = c.v[i];
    }
    const __m256 scales = group_params(row.scales, w.half, w.sub, g);
    const __m256 offsets = group_params(row.offsets, w.half, w.sub, g);
    for (int b = 0; b < 4 && g * kGroup + b * kBlock < k; ++b) {
      for (int h = 0; h < 2; ++h) {  // block b's half h: Codes' vector 2 h + b / 2, half b % 2
        const __m256i lanes = v[2 * h + b / 2];
        const __m128i run = b % 2 ? _mm256_extracti128_si256(lanes, 1)
                                  : _mm256_castsi256_si128(lanes);
        const __m256i at = _mm256_set1_epi32(w.sub == 32 ? b : 2 * b + h);
        const __m256 scale = _mm256_permutevar8x32_ps(scales, at);
        const __m256 offset = _mm256_permutevar8x32_ps(offsets, at);
        float* o = out + g * kGroup + b * kBlock + 16 * h;
        const __m256 c0 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(run));
        const __m256 c1 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(run, 8)));
        _mm256_storeu_ps(o, _mm256_fmadd_ps(c0, scale, offset));
        _mm256_storeu_ps(o + 8, _mm256_fmadd_ps(c1, scale, offset));
      }
    }
  }
}

namespace {

// The 8x8 block of floats at `in` (rows `in_stride` apart) transposed into `out` (rows
// `out_stride` apart).
inline void transpose8x8(const float* in, int64_t in_stride, float* out, int64_t out_stride) {
  __m256 r[8], t[8];
  for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(in + i * in_stride);
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 8; i += 4)
    for (int h = 0; h < 2; ++h) {
      r[i + 2 * h] = _mm256_shuffle_ps(t[i + h], t[i + 2 + h], 0x44);
      r[i + 2 * h + 1] = _mm256_shuffle_ps(t[i + h], t[i + 2 + h], 0xee);
    }
  for (int i = 0; i < 4; ++i) {  // r[i]: columns i | i + 4 of rows 0-3, r[4 + i] of rows 4-7
    _mm256_storeu_ps(out + i * out_stride, _mm256_permute2f128_ps(r[i], r[4 + i], 0x20));
    _mm256_storeu_ps(out + (i + 4) * out_stride, _mm256_permute2f128_ps(r[i], r[4 + i], 0x31));
  }
}

constexpr int kTileWeights = 6;  // weight rows per tile: 12 accumulators at 2 panels

// V panels of 8 activation rows (panel v at xt + v * 8 k) against J unpacked weight rows
// (stride k): each k step V panel loads and one broadcast per weight row, J x V fmas.
// sums[j][8 v + i] = row 8 v + i of the panels . weight row j.
template <int V, int J>
inline void weight_tile(const float* xt, int64_t k, const float* w, float (*sums)[16]) {
  __m256 acc[J][V];
  for (int j = 0; j < J; ++j)
    for (int v = 0; v < V; ++v) acc[j][v] = _mm256_setzero_ps();
  for (int64_t t = 0; t < k; ++t) {
    __m256 xv[V];
    for (int v = 0; v < V; ++v) xv[v] = _mm256_loadu_ps(xt + (v * k + t) * 8);
    for (int j = 0; j < J; ++j) {
      const __m256 wb = _mm256_broadcast_ss(w + j * k + t);
      for (int v = 0; v < V; ++v) acc[j][v] = _mm256_fmadd_ps(wb, xv[v], acc[j][v]);
    }
  }
  // Unrolled, so acc stays in registers (a rolled loop here kept it on the stack throughout).
#pragma GCC unroll 8
  for (int j = 0; j < J; ++j)
#pragma GCC unroll 2
    for (int v = 0; v < V; ++v) _mm256_storeu_ps(sums[j] + 8 * v, acc[j][v]);
}

template <int V>
void weight_tile_of(int j, const float* xt, int64_t k, const float* w, float (*sums)[16]) {
  switch (j) {
    case 6: return weight_tile<V, 6>(xt, k, w, sums);
    case 5: return weight_tile<V, 5>(xt, k, w, sums);
    case 4: return weight_tile<V, 4>(xt, k, w, sums);
    case 3: return weight_tile<V, 3>(xt, k, w, sums);
    case 2: return weight_tile<V, 2>(xt, k, w, sums);
    default: return weight_tile<V, 1>(xt, k, w, sums);
  }
}

}  // namespace

void pack_rows(const float* x, int64_t m, int64_t k, float* xt) {
  for (int64_t q = 0; 8 * q < m; ++q) {
    const int64_t rows = std::min<int64_t>(8, m - 8 * q);
    float* panel = xt + q * 8 * k;
    for (int64_t t = 0; t < k; t += 8) {  // k is a multiple of 32
      if (rows == 8) {
        transpose8x8(x + 8 * q * k + t, k, panel + t * 8, 8);
        continue;
      }
      for (int64_t u = 0; u < 8; ++u)
        for (int64_t i = 0; i < 8; ++i)
          panel[(t + u) * 8 + i] = i < rows ? x[(8 * q + i) * k + t + u] : 0.f;
    }
  }
}

void gemm_unpacked(const Weights& w, const float* xt, int64_t m, int64_t k, const float* bias,
                   float* out, int64_t n_begin, int64_t n_end) {
  constexpr int64_t kUnpackRows = 16;  // 36 KB of scratch at k = 576: L2, beside the x panels
  thread_local std::vector<float> scratch;
  scratch.resize(kUnpackRows * k);
  float sums[kTileWeights][16];
  for (int64_t j0 = n_begin; j0 < n_end; j0 += kUnpackRows) {
    const int64_t rows = std::min(kUnpackRows, n_end - j0);
    for (int64_t j = 0; j < rows; ++j) unpack_row(w, j0 + j, k, scratch.data() + j * k);
    for (int64_t r0 = 0; r0 < m; r0 += 16) {  // two panels of activation rows at a time
      const int64_t panel_rows = std::min<int64_t>(16, m - r0);
      const float* xt_at = xt + r0 * k;
      for (int64_t j = 0; j < rows; j += kTileWeights) {
        const int tile = static_cast<int>(std::min<int64_t>(kTileWeights, rows - j));
        const float* wj = scratch.data() + j * k;
        if (panel_rows > 8) weight_tile_of<2>(tile, xt_at, k, wj, sums);
        else weight_tile_of<1>(tile, xt_at, k, wj, sums);
        for (int i = 0; i < tile; ++i) {
          const float b = bias ? bias[j0 + j + i] : 0.f;
          for (int64_t r = 0; r < panel_rows; ++r) out[(r0 + r) * w.n + j0 + j + i] = sums[i][r] + b;
        }
      }
    }
  }
}

void gemm(const Gemm& g, int64_t n_begin, int64_t n_end) { gemm_any<Kernel>(g, n_begin, n_end); }

}  // namespace tokenwire::quant::avx2

#pragma GCC pop_options
