// The register-blocked tile of linear.cpp's matmul: R rows against one packed weight panel
// of 16 columns, R x 16 sums in 2*R vector registers, each k step one broadcast per row and
// two panel loads.
#pragma once

#include <cstdint>

#include "common.h"

namespace tokenwire {

constexpr int64_t kPanel = 16;  // columns per panel: two 8-float vectors

// Lines (one k step of a panel: 16 floats, 64 bytes) of the next panel for one tile to
// prefetch, one every `stride` k steps.
struct Prefetch {
  const float* lines = nullptr;
  int64_t count = 0;
  int64_t stride = 1;
};

// rows x panel: out[r][c] = sum_k x[r][k] * panel[k][c] (+ bias[c]), c < cols (<= 16).
template <int R>
inline void tile(const float* x, int64_t k_dim, const float* panel, const float* bias,
                 float* out, int64_t out_stride, int64_t cols, Prefetch prefetch = {}) {
  float8 acc[R][2] = {};
  int64_t next_prefetch = 0, prefetched = 0;
  for (int64_t k = 0; k < k_dim; ++k) {
    if (k == next_prefetch && prefetched < prefetch.count) {
      __builtin_prefetch(prefetch.lines + kPanel * prefetched++);
      next_prefetch += prefetch.stride;
    }
    const float8 w0 = load8(panel + k * kPanel), w1 = load8(panel + k * kPanel + 8);
    for (int r = 0; r < R; ++r) {
      const float8 xr = float8{} + x[r * k_dim + k];
      acc[r][0] += xr * w0;
      acc[r][1] += xr * w1;
    }
  }
  for (int r = 0; r < R; ++r) {
    float* o = out + r * out_stride;
    if (bias && cols == kPanel) acc[r][0] += load8(bias), acc[r][1] += load8(bias + 8);
    if (cols == kPanel) {
      store8(o, acc[r][0]);
      store8(o + 8, acc[r][1]);
      continue;
    }
    float row[kPanel];  // the last, partial panel
    store8(row, acc[r][0]);
    store8(row + 8, acc[r][1]);
    for (int64_t c = 0; c < cols; ++c) o[c] = bias ? row[c] + bias[c] : row[c];
  }
}

}  // namespace tokenwire
