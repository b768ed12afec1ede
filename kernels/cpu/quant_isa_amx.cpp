// Quantized matmul on AMX tiles (Intel's Advanced Matrix Extensions: eight 1 KiB tile
// registers and an int8 dot unit, TDPBSUD: 16 x 16 int32 sums of 32 signed activation
// bytes times 32 unsigned codes per instruction), for batched rows: prefill chunks and
// batched decode steps. Compiled for AMX alone and called only where the CPU has it and
// Linux granted the process its tile state (available()).
//
// The arithmetic is the AVX-512 path's (quant_kernels.h): activations at two int8 levels per
// 32-block, exact integer sums per block, one fp32 scale per block, offsets against the
// exact sums of x. Per block b of 32 weights, for 16 activation rows against a panel of 16
// weight rows:
//
//   C1 = P1[rows, b] x codes[b, panel]      tmm3 <- tmm0 x tmm2   (TDPBSUD)
//   C2 = P2[rows, b] x codes[b, panel]      tmm4 <- tmm1 x tmm2
//   acc[r] += float(128 C1[r] + C2[r]) * (128 d[r, b]) * scale[b, panel]
//           + sums[r, b] * offset[b, panel]                        (AVX-512, 16 lanes)
//
// |128 C1 + C2| <= 128 * 32 * 127 * 255 + ... < 2^31, so the two levels add exactly in int32.
// Both operands are read in natural weight order: the activations are repacked from the
// lo/hi order once per call (Inputs), each panel's codes are unpacked once into the tile's
// layout (4 consecutive codes of one weight row per int32 column, 8 such rows per block)
// and then meet every 16-row tile of activations from L1.
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "quant_kernels.h"

#pragma GCC push_options
#pragma GCC target("amx-tile,amx-int8,avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")

namespace tokenwire::quant::amx {
namespace {

constexpr int64_t kTile = 16;         // activation rows per tile, weight rows per panel
constexpr int64_t kPanelBytes = 512;  // one block's codes for a panel: 8 x 16 int32 columns

// Linux hands out the tile data state only on request (arch_prctl, once per process; the
// grant covers every thread).
constexpr int kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;

struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// tmm0, tmm1: levels 1 and 2 of 16 activation rows, one block (32 bytes a row);
// tmm2: one block of a panel's codes (8 rows of 16 int32 columns);
// tmm3, tmm4: their 16 x 16 int32 sums.
void configure_tiles() {
  TileConfig c;
  for (int t : {0, 1}) c.rows[t] = kTile, c.colsb[t] = 32;
  c.rows[2] = 8, c.colsb[2] = 64;
  for (int t : {3, 4}) c.rows[t] = kTile, c.colsb[t] = 64;
  _tile_loadconfig(&c);
}

bool cpu_has_amx_int8() {
  unsigned eax, ebx, ecx, edx;
  if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return false;
  const bool tile = edx & (1u << 24), int8 = edx & (1u << 25);
  const bool avx512 = (ebx & (1u << 16)) && (ebx & (1u << 30)) && (ecx & (1u << 11));
  return tile && int8 && avx512;
}

// r[i][j] -> r[j][i] for a 16 x 16 matrix of 32-bit values in 16 registers.
inline void transpose16(__m512i r[16]) {
  __m512i t[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {
    r[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
    r[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
    r[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
    r[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
  }
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 4; ++j) {
      t[8 * i + j] = _mm512_shuffle_i32x4(r[8 * i + j], r[8 * i + 4 + j], 0x88);
      t[8 * i + 4 + j] = _mm512_shuffle_i32x4(r[8 * i + j], r[8 * i + 4 + j], 0xdd);
    }
  for (int j = 0; j < 8; ++j) {
    r[j] = _mm512_shuffle_i32x4(t[j], t[8 + j], 0x88);
    r[8 + j] = _mm512_shuffle_i32x4(t[j], t[8 + j], 0xdd);
  }
}

// Group g (4 blocks) of the panel's rows into the tiles' layout. A group's codes are a lo
// run (codes 0-15 of each of its blocks) and a hi run (16-31), so with one register per
// weight row, dword 4q + i of the lo run is code dword i (codes 4i..4i+3) of block q, of the
// hi run dword 4 + i; transposed, register 4q + i holds that dword of all 16 rows: tile row
// i (lo) or 4 + i (hi) of block 4g + q.
void unpack_group(const Weights& w, const WeightRow* rows, int64_t cols, int64_t g,
                  int64_t blocks, uint8_t* codes) {
  const __m512i nibble = _mm512_set1_epi8(15);
  __m512i lo[kTile], hi[kTile];
  for (int64_t c = 0; c < kTile; ++c) {
    if (c >= cols) {
      lo[c] = hi[c] = _mm512_setzero_si512();
    } else if (w.bits == 4) {
      const __m512i packed = _mm512_loadu_si512(rows[c].codes + g * 64);
      lo[c] = _mm512_and_si512(packed, nibble);
      hi[c] = _mm512_and_si512(_mm512_srli_epi16(packed, 4), nibble);
    } else {
      lo[c] = _mm512_loadu_si512(rows[c].codes + g * kGroup);
      hi[c] = _mm512_loadu_si512(rows[c].codes + g * kGroup + 64);
    }
  }
  transpose16(lo);
  transpose16(hi);
  for (int64_t q = 0; q < 4 && 4 * g + q < blocks; ++q) {  // the last group may be padding
    uint8_t* tile = codes + (4 * g + q) * kPanelBytes;
    for (int i = 0; i < 4; ++i) {
      _mm512_storeu_si512(tile + 64 * i, lo[4 * q + i]);
      _mm512_storeu_si512(tile + 64 * (4 + i), hi[4 * q + i]);
    }
  }
}

// Every row's scale or offset (`offsets` picks which) per block, fp16 or fp32, to
// out[b * 16 + c], 16 blocks at a time.
void unpack_params(const Weights& w, const WeightRow* rows, int64_t cols, bool offsets,
                   int64_t blocks, float* out) {
  for (int64_t b0 = 0; b0 < blocks; b0 += 16) {
    const int64_t left = blocks - b0;
    const __mmask16 mask = left >= 16 ? 0xffff : __mmask16((1u << left) - 1);
    __m512i v[kTile];
    for (int64_t c = 0; c < kTile; ++c) {
      const void* src = offsets ? rows[c].offsets : rows[c].scales;
      __m512 f = _mm512_setzero_ps();
      if (c < cols && w.half)
        f = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask, static_cast<const uint16_t*>(src) + b0));
      else if (c < cols)
        f = _mm512_maskz_loadu_ps(mask, static_cast<const float*>(src) + b0);
      v[c] = _mm512_castps_si512(f);
    }
    transpose16(v);
    for (int64_t b = 0; b < std::min<int64_t>(16, left); ++b)
      _mm512_storeu_si512(out + (b0 + b) * kTile, v[b]);
  }
}

// A panel of 16 weight rows from j0 in the tiles' layout, with its scales and offsets per
// block as 16 floats; rows past n get zero codes, scales and offsets.
void unpack_panel(const Weights& w, int64_t j0, int64_t blocks, uint8_t* codes, float* scales,
                  float* offsets) {
  const int64_t cols = std::min(kTile, w.n - j0);
  WeightRow rows[kTile];
  for (int64_t c = 0; c < cols; ++c) rows[c] = weight_row(w, j0 + c);
  for (int64_t g = 0; 4 * g < blocks; ++g) unpack_group(w, rows, cols, g, blocks, codes);
  unpack_params(w, rows, cols, false, blocks, scales);
  unpack_params(w, rows, cols, true, blocks, offsets);
}

}  // namespace

bool available() {
  static const bool ok = cpu_has_amx_int8() &&
                         syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
  return ok;
}

void repack_rows(const Activations& x, int64_t k, Inputs& out) {
  const int64_t mp = (x.m + kTile - 1) / kTile * kTile, blocks = k / kBlock, subs = x.kp / kBlock;
  out.mp = mp, out.k = k, out.blocks = blocks;
  // Every row below m is written over; only the padding rows of the last tile are zeroed.
  out.levels.resize(2 * mp * k);
  out.d.resize(mp * blocks);
  out.sums.resize(mp * blocks);
  for (int l = 0; l < 2; ++l)
    std::fill(out.levels.begin() + (l * mp + x.m) * k, out.levels.begin() + (l + 1) * mp * k, 0);
  std::fill(out.d.begin() + x.m * blocks, out.d.end(), 0.f);
  std::fill(out.sums.begin() + x.m * blocks, out.sums.end(), 0.f);
  for (int64_t r = 0; r < x.m; ++r) {
    for (int l = 0; l < 2; ++l) {
      const int8_t* src = x.p[l] + r * x.kp;
      int8_t* dst = out.levels.data() + (l * mp + r) * k;
      for (int64_t b = 0; b < blocks; ++b) {
        const int64_t at = b / 4 * kGroup + 16 * (b % 4);
        std::memcpy(dst + 32 * b, src + at, 16);
        std::memcpy(dst + 32 * b + 16, src + at + 64, 16);
      }
    }
    for (int64_t b = 0; b < blocks; ++b) {
      out.d[r * blocks + b] = x.d[r * subs + b] * float(1 << kLevelShift);
      out.sums[r * blocks + b] = x.sums[r * subs + b];
    }
  }
}

void gemm(const Weights& w, const Inputs& x, const float* bias, float* out, int64_t m,
          int64_t panel_begin, int64_t panel_end) {
  const int64_t k = x.k, blocks = x.blocks, n = w.n, panels = panel_end - panel_begin;
  // The panels' codes, scales and offsets, unpacked once and then read from cache by every
  // 16-row tile of activations in turn (the caller keeps a chunk's codes within L2).
  thread_local std::vector<uint8_t> codes_buf;
  thread_local std::vector<float> params;
  codes_buf.resize(panels * blocks * kPanelBytes);
  params.resize(2 * panels * blocks * kTile);
  for (int64_t p = 0; p < panels; ++p)
    unpack_panel(w, (panel_begin + p) * kTile, blocks, codes_buf.data() + p * blocks * kPanelBytes,
                 params.data() + 2 * p * blocks * kTile, params.data() + (2 * p + 1) * blocks * kTile);
  alignas(64) int32_t dots[2][kTile * kTile];
  configure_tiles();
  for (int64_t m0 = 0; m0 < x.mp; m0 += kTile) {
    const int8_t* p1 = x.levels.data() + m0 * k;
    const int8_t* p2 = p1 + x.mp * k;
    const float* d = x.d.data() + m0 * blocks;
    const float* s = x.sums.data() + m0 * blocks;
    for (int64_t p = 0; p < panels; ++p) {
      const int64_t j0 = (panel_begin + p) * kTile, cols = std::min(kTile, n - j0);
      const uint8_t* codes = codes_buf.data() + p * blocks * kPanelBytes;
      const float* scales = params.data() + 2 * p * blocks * kTile;
      const float* offsets = scales + blocks * kTile;
      const __mmask16 mask = __mmask16((1u << cols) - 1);
      __m512 acc[kTile];
      for (auto& a : acc) a = bias ? _mm512_maskz_loadu_ps(mask, bias + j0) : _mm512_setzero_ps();
      for (int64_t b = 0; b < blocks; ++b) {
        _tile_loadd(0, p1 + 32 * b, k);
        _tile_loadd(1, p2 + 32 * b, k);
        _tile_loadd(2, codes + b * kPanelBytes, 64);
        _tile_zero(3);
        _tile_zero(4);
        _tile_dpbsud(3, 0, 2);
        _tile_dpbsud(4, 1, 2);
        _tile_stored(3, dots[0], 64);
        _tile_stored(4, dots[1], 64);
        const __m512 scale = _mm512_loadu_ps(scales + b * kTile);
        const __m512 offset = _mm512_loadu_ps(offsets + b * kTile);
#pragma GCC unroll 16
        for (int r = 0; r < kTile; ++r) {
          const __m512i both = _mm512_add_epi32(
              _mm512_slli_epi32(_mm512_load_si512(dots[0] + r * kTile), kLevelShift),
              _mm512_load_si512(dots[1] + r * kTile));
          const __m512 weight = _mm512_mul_ps(scale, _mm512_set1_ps(d[r * blocks + b]));
          acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(both), weight, acc[r]);
          acc[r] = _mm512_fmadd_ps(offset, _mm512_set1_ps(s[r * blocks + b]), acc[r]);
        }
      }
      for (int64_t r = 0; r < std::min(kTile, m - m0); ++r)
        _mm512_mask_storeu_ps(out + (m0 + r) * n + j0, mask, acc[r]);
    }
  }
  _tile_release();
}

}  // namespace tokenwire::quant::amx

#pragma GCC pop_options
