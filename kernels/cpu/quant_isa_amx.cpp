// Quantized matmul on AMX tiles (Intel's Advanced Matrix Extensions: eight 1 KiB tile
// registers and an int8 dot unit, TDPBSUD: 16 x 16 int32 sums of 32 signed activation
// bytes times 32 unsigned codes per instruction), for batched rows: prefill chunks and
// batched decode steps. Compiled for AMX alone and called only where the CPU has it and
// Linux granted the process its tile state (available()).
//
// The panels, the activations' repacking and the arithmetic are quant_panels.h's; per block
// of 32 weights, for a tile of 16 activation rows against a panel of 16 weight rows:
//
//   C1 = P1[rows, b] x codes[b, panel]      tmm3 <- tmm0 x tmm2   (TDPBSUD)
//   C2 = P2[rows, b] x codes[b, panel]      tmm4 <- tmm1 x tmm2
//
// then AVX-512 combines them, scales and adds the offsets' terms as the panels' loop asks.
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "quant_kernels.h"

#pragma GCC push_options
#pragma GCC target("amx-tile,amx-int8,avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")

#include "quant_panels.h"  // after the target: its loops compile for AMX

namespace tokenwire::quant::amx {
namespace {

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

}  // namespace

bool available() {
  static const bool ok = cpu_has_amx_int8() &&
                         syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
  return ok;
}

void gemm(const Weights& w, const panels::Inputs& x, const float* bias, float* out, int64_t m,
          int64_t panel_begin, int64_t panel_end) {
  alignas(64) int32_t dots[2][kTile * kTile];
  configure_tiles();
  auto tile = [&](__m512 (&acc)[kTile], const PanelTile& t) {
    for (int64_t b = 0; b < t.blocks; ++b) {
      _tile_loadd(0, t.p1 + 32 * b, t.k);
      _tile_loadd(1, t.p2 + 32 * b, t.k);
      _tile_loadd(2, t.codes + b * kPanelBytes, 64);
      _tile_zero(3);
      _tile_zero(4);
      _tile_dpbsud(3, 0, 2);
      _tile_dpbsud(4, 1, 2);
      _tile_stored(3, dots[0], 64);
      _tile_stored(4, dots[1], 64);
      const __m512 scale = _mm512_loadu_ps(t.scales + b * kTile);
      const __m512 offset = _mm512_loadu_ps(t.offsets + b * kTile);
#pragma GCC unroll 16
      for (int r = 0; r < kTile; ++r) {
        acc[r] = add_block(acc[r], _mm512_load_si512(dots[0] + r * kTile),
                           _mm512_load_si512(dots[1] + r * kTile), t, scale, offset, r, b);
      }
    }
  };
  panel_loop(w, x, bias, out, m, panel_begin, panel_end, tile);
  _tile_release();
}

}  // namespace tokenwire::quant::amx

#pragma GCC pop_options
