// The loops of the vector paths' gemm (quant_isa_avx2.cpp, quant_isa_avx512.cpp): which
// weight row meets which activation rows, in what order, and the choice of a kernel compiled
// for the weight's bits, sub-block and scale type. The dots themselves stay in each file.
//
// Each file includes this after its `#pragma GCC target`: a function template is compiled
// for the target in force where it is defined, so these loops get the file's instruction set
// and its dots can inline into them.
#pragma once

#include <algorithm>
#include <cstdint>

#include "quant_kernels.h"

namespace tokenwire::quant {

// Blocks of kTileRows weight rows x kTileRows activation rows: the weight rows stream from
// memory once, in order (one row at a time: interleaving rows defeats the hardware
// prefetcher on these CPUs), and a block of activation rows stays in L1 while they pass.
//
//                      activation rows
//                  m0 = 0          m0 = 16 (13 rows here)
//               +---------------+---------------+
//   weight rows | j0       TTTT | j0       TTTr |   T: a tile, Kernel::kRows rows at once,
//   j0 = 0      | j0 + 1   TTTT | j0 + 1   TTTr |      tile q = m / kRows (whole tiles
//   .. 15       | ...           | ...           |      from row 0: Activations::d4)
//               | j0 + 15  TTTT | j0 + 15  TTTr |   r: a row past the block's last tile
//               +---------------+---------------+
//   then j0 = 16 .. 31, each against every block again, and so on to n_end.
constexpr int64_t kTileRows = 16;

// Kernel, for one bits / sub / half:
//   kRows                  activation rows per tile (1: no tiles, rows only)
//   row(g, j, m)           weight row j . activation row m
//   tile(g, j, q, out)     out[r] = weight row j . activation row kRows q + r, r < kRows
//                          (only where kRows > 1)
//   partial_tile(g, j, q, rows, out)
//                          the same for r < rows, 1 < rows < kRows: the matrix's last rows
//                          as a tile, where the kernel has it (Activations::d4 holds that
//                          tile, its missing rows zero); else they run as single rows
template <class Kernel>
void gemm_tiles(const Gemm& g, int64_t n_begin, int64_t n_end) {
  constexpr int64_t kRows = Kernel::kRows;
  static_assert(kTileRows % kRows == 0, "a block's first row must start a tile");
  const int64_t n = g.w.n;
  for (int64_t j0 = n_begin; j0 < n_end; j0 += kTileRows) {
    for (int64_t m0 = 0; m0 < g.x.m; m0 += kTileRows) {
      const int64_t m1 = std::min(g.x.m, m0 + kTileRows);
      for (int64_t j = j0; j < std::min(n_end, j0 + kTileRows); ++j) {
        const float bias = g.bias ? g.bias[j] : 0.f;
        int64_t m = m0;
        if constexpr (kRows > 1) {
          for (; m + kRows <= m1; m += kRows) {
            float out[kRows];
            Kernel::tile(g, j, m / kRows, out);
            for (int r = 0; r < kRows; ++r) g.out[(m + r) * n + j] = out[r] + bias;
          }
          if constexpr (requires { &Kernel::partial_tile; }) {
            if (m1 - m > 1) {  // only the matrix's last rows: a block of 16 ends in a tile
              float out[kRows];
              Kernel::partial_tile(g, j, m / kRows, m1 - m, out);
              for (int64_t r = 0; r < m1 - m; ++r) g.out[(m + r) * n + j] = out[r] + bias;
              m = m1;
            }
          }
        }
        for (; m < m1; ++m) g.out[m * n + j] = Kernel::row(g, j, m) + bias;
      }
    }
  }
}

// The ISA's gemm: gemm_tiles with Kernel<Bits, Sub, Half> for the weight's bits (4, 8),
// sub-block (16, 32) and scales (fp16 or fp32).
template <template <int Bits, int Sub, bool Half> class Kernel>
void gemm_any(const Gemm& g, int64_t n_begin, int64_t n_end) {
  auto run = [&]<int Bits, int Sub>() {
    if (g.w.half) return gemm_tiles<Kernel<Bits, Sub, true>>(g, n_begin, n_end);
    gemm_tiles<Kernel<Bits, Sub, false>>(g, n_begin, n_end);
  };
  if (g.w.bits == 4) {
    if (g.w.sub == 32) return run.template operator()<4, 32>();
    return run.template operator()<4, 16>();
  }
  if (g.w.sub == 32) return run.template operator()<8, 32>();
  run.template operator()<8, 16>();
}

}  // namespace tokenwire::quant
