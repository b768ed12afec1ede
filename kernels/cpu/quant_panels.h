// Weight panels for batched rows (quant_isa_amx.cpp, quant_isa_avx512.cpp): 16 weight rows
// unpacked per call into the layout of Intel's int8 dot instructions, where one int32 holds 4
// consecutive codes of one weight row and a 64-byte vector holds that int32 for all 16 rows:
//
//   panel block b (32 codes of 16 rows, kPanelBytes):  vector i = codes 4i..4i+3 of rows 0..15
//
// Against one activation row, VPDPBUSD with the row's codes 4i..4i+3 broadcast to every lane
// adds 4 products to each of the 16 rows' sums; AMX's TDPBSUD reads the same bytes as its B
// tile. The arithmetic is the int8 dots' (quant_kernels.h): two activation levels per
// 32-block, exact integer sums per block, one fp32 scale per block and offsets against the
// exact sums of x, per block b for 16 activation rows r against a panel:
//
//   acc[r] += float(128 C1[r] + C2[r]) * (128 d[r, b]) * scale[b, panel]
//           + sums[r, b] * offset[b, panel]                    (16 lanes: the panel's rows)
//
// with C1, C2 the integer dots of levels 1 and 2; |128 C1 + C2| < 2^31, so they add exactly.
// The activations come repacked in natural weight order (panels::Inputs), each panel's codes
// are unpacked once per call and then meet every 16-row tile of activations from cache.
//
// Each file includes this after its `#pragma GCC target`: the functions below compile for
// that file's instruction set (and, in an unnamed namespace, stay that file's own).
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "quant_kernels.h"

namespace tokenwire::quant {
namespace {

using panels::kTile;
constexpr int64_t kPanelBytes = 512;  // one block's codes for a panel: 8 x 16 int32 columns

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

// A tile of up to 16 activation rows against one panel, for panel_loop's Tile.
struct PanelTile {
  const uint8_t* codes;  // the panel's blocks, kPanelBytes each
  const float* scales;   // the panel's rows' scales and offsets, 16 per block
  const float* offsets;
  const int8_t* p1;      // row 0's levels 1 and 2 (row r at + r k, block b at + 32 b)
  const int8_t* p2;
  const float* d;        // row 0's 128 d and exact sum per block (row r at + r blocks)
  const float* sums;
  int64_t k, blocks;
  int64_t rows;          // the tile's rows below m (the rest of its 16 are zero padding)
};

// acc += row r's terms of block b (the equation above), from its levels' int32 dots c1, c2
// against the panel: a Tile's last step per row and block.
inline __m512 add_block(__m512 acc, __m512i c1, __m512i c2, const PanelTile& t, __m512 scale,
                        __m512 offset, int r, int64_t b) {
  const __m512i both = _mm512_add_epi32(_mm512_slli_epi32(c1, kLevelShift), c2);
  const __m512 weight = _mm512_mul_ps(scale, _mm512_set1_ps(t.d[r * t.blocks + b]));
  acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(both), weight, acc);
  return _mm512_fmadd_ps(offset, _mm512_set1_ps(t.sums[r * t.blocks + b]), acc);
}

// out[r * n + j] = x_r . w_j (+ bias[j]) for r < m and the panels [panel_begin, panel_end),
// with tile(acc, PanelTile) adding every block's terms to the tile's row sums acc[r].
template <class Tile>
void panel_loop(const Weights& w, const panels::Inputs& x, const float* bias, float* out,
                int64_t m, int64_t panel_begin, int64_t panel_end, const Tile& tile) {
  const int64_t k = x.k, blocks = x.blocks, n = w.n, count = panel_end - panel_begin;
  // The panels' codes, scales and offsets, unpacked once and then read from cache by every
  // 16-row tile of activations in turn (the caller keeps a chunk's codes within L2).
  thread_local std::vector<uint8_t> codes_buf;
  thread_local std::vector<float> params;
  codes_buf.resize(count * blocks * kPanelBytes);
  params.resize(2 * count * blocks * kTile);
  for (int64_t p = 0; p < count; ++p)
    unpack_panel(w, (panel_begin + p) * kTile, blocks, codes_buf.data() + p * blocks * kPanelBytes,
                 params.data() + 2 * p * blocks * kTile, params.data() + (2 * p + 1) * blocks * kTile);
  for (int64_t m0 = 0; m0 < m; m0 += kTile) {
    const int64_t rows = std::min(kTile, m - m0);
    for (int64_t p = 0; p < count; ++p) {
      const int64_t j0 = (panel_begin + p) * kTile, cols = std::min(kTile, n - j0);
      const float* scales = params.data() + 2 * p * blocks * kTile;
      const __mmask16 mask = __mmask16((1u << cols) - 1);
      __m512 acc[kTile];
      for (auto& a : acc) a = bias ? _mm512_maskz_loadu_ps(mask, bias + j0) : _mm512_setzero_ps();
      const int8_t* p1 = x.levels.data() + m0 * k;
      tile(acc, PanelTile{codes_buf.data() + p * blocks * kPanelBytes, scales,
                          scales + blocks * kTile, p1, p1 + x.mp * k, x.d.data() + m0 * blocks,
                          x.sums.data() + m0 * blocks, k, blocks, rows});
      for (int64_t r = 0; r < rows; ++r)
        _mm512_mask_storeu_ps(out + (m0 + r) * n + j0, mask, acc[r]);
    }
  }
}

}  // namespace
}  // namespace tokenwire::quant
