// y = x W^T (+ b) in fp32 on a weight packed once into panels of 16 output columns.
//
// Why not oneDNN: at a decode step's few rows every weight streams from memory once per
// step, and there this loop outruns oneDNN's matmul on the model's shapes; at prefill's
// thousands of rows oneDNN is level or ahead (docs/kernels.md, "Where the CPU thresholds
// come from"). Packing makes each panel one contiguous stream in the order the loop
// reads it.
//
// The inner tile (panel_tile.h) is the classic
// register-blocked one: kRows rows of x against one panel, kRows x 16 sums in 2*kRows
// vector registers, each k step one broadcast per row and two panel loads. The panel
// (16 x K floats) stays in L1/L2 while every row tile reads it.
// At a decode step's few rows only the first tile of a panel would wait on memory, so the
// later tiles prefetch the next panel a cache line at a time, spread over their k steps:
// the weight stream stays steady instead of stalling once per panel. At prefill's many rows
// x is taken in L2-sized row blocks instead.
#include <ATen/Parallel.h>

#include <algorithm>

#include "common.h"
#include "linear.h"
#include "panel_tile.h"

namespace tokenwire {
namespace {

constexpr int kRows = 6;        // rows per tile: 12 accumulators + 2 panel + 1 broadcast registers
// Software prefetch up to this many rows. Measured on a whole step's projections (CI box):
// 14% faster at 32 rows, 8% at 96, but 5% slower at 256, where the prefetched lines sit
// in L1 long before use and the hardware prefetcher has the first tile's time anyway.
constexpr int64_t kPrefetchMaxRows = 128;
// Above that (prefill), rows go in blocks of about this many bytes of x, each block
// against all of a thread's panels: x is then read from L2 instead of from L3 once per
// panel (+6-10% at 2048 rows; 256 KB measured best of 128-384 KB on the 512 KB L2).
constexpr int64_t kRowBlockBytes = 256 * 1024;

// All rows of x against one panel, kRows at a time, then the 1..kRows-1 left over; the
// full tiles after the first prefetch next_panel (nullptr: none) in equal shares.
void rows_by_panel(const float* x, int64_t m, int64_t k_dim, const float* panel,
                   const float* next_panel, const float* bias, float* out, int64_t n,
                   int64_t cols) {
  const int64_t prefetching_tiles = next_panel ? m / kRows - 1 : 0;
  const int64_t share =
      prefetching_tiles > 0 ? (k_dim + prefetching_tiles - 1) / prefetching_tiles : 0;
  int64_t r = 0;
  for (int64_t t = 0; r + kRows <= m; r += kRows, ++t) {
    Prefetch prefetch;
    if (next_panel && t > 0 && share > 0) {
      const int64_t first = (t - 1) * share;
      prefetch = {next_panel + first * kPanel,
                  std::max<int64_t>(0, std::min(share, k_dim - first)),
                  std::max<int64_t>(1, k_dim / share)};
    }
    tile<kRows>(x + r * k_dim, k_dim, panel, bias, out + r * n, n, cols, prefetch);
  }
  const float* xr = x + r * k_dim;
  float* o = out + r * n;
  switch (m - r) {
    case 1: tile<1>(xr, k_dim, panel, bias, o, n, cols); break;
    case 2: tile<2>(xr, k_dim, panel, bias, o, n, cols); break;
    case 3: tile<3>(xr, k_dim, panel, bias, o, n, cols); break;
    case 4: tile<4>(xr, k_dim, panel, bias, o, n, cols); break;
    case 5: tile<5>(xr, k_dim, panel, bias, o, n, cols); break;
    default: break;
  }
}

}  // namespace

at::Tensor pack_linear_weight(const at::Tensor& weight) {
  check_fp32_contiguous(weight, "weight");
  TORCH_CHECK(weight.dim() == 2, "weight must be [out_features, in_features]");
  const int64_t n = weight.size(0), k_dim = weight.size(1);
  const int64_t panels = (n + kPanel - 1) / kPanel;
  at::Tensor padded = at::zeros({panels * kPanel, k_dim}, weight.options());
  padded.narrow(0, 0, n).copy_(weight);
  return padded.view({panels, kPanel, k_dim}).transpose(1, 2).contiguous();
}

at::Tensor packed_linear(const at::Tensor& x, const at::Tensor& packed,
                         const std::optional<at::Tensor>& bias, int64_t out_features) {
  check_fp32_contiguous(x, "x");
  check_fp32_contiguous(packed, "packed weight");
  TORCH_CHECK(x.dim() == 2, "x must be [rows, in_features]");
  TORCH_CHECK(packed.dim() == 3 && packed.size(2) == kPanel && packed.size(1) == x.size(1),
              "packed weight [panels, ", x.size(1), ", ", kPanel, "] expected, got ",
              packed.sizes());
  const int64_t m = x.size(0), k_dim = x.size(1), n = out_features;
  TORCH_CHECK(n > (packed.size(0) - 1) * kPanel && n <= packed.size(0) * kPanel,
              "out_features ", n, " does not match ", packed.size(0), " panels");
  const float* bp = nullptr;
  if (bias) {
    check_fp32_contiguous(*bias, "bias");
    TORCH_CHECK(bias->numel() == n, "bias must have out_features elements");
    bp = bias->data_ptr<float>();
  }
  at::Tensor out = at::empty({m, n}, x.options());
  const float* xp = x.data_ptr<float>();
  const float* wp = packed.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const bool prefetch = m <= kPrefetchMaxRows;
  const int64_t row_bytes = std::max<int64_t>(k_dim, 1) * 4;
  const int64_t block_rows =
      prefetch ? m : std::max<int64_t>(kRows, kRowBlockBytes / row_bytes / kRows * kRows);
  // Threads split the panels: each streams its own part of the weight, once per row block.
  at::parallel_for(0, packed.size(0), 1, [&](int64_t begin, int64_t end) {
    for (int64_t r0 = 0; r0 < m; r0 += block_rows) {
      const int64_t rows = std::min(block_rows, m - r0);
      for (int64_t p = begin; p < end; ++p) {
        const int64_t col = p * kPanel;
        const float* panel = wp + p * k_dim * kPanel;
        const float* next = prefetch && p + 1 < end ? panel + k_dim * kPanel : nullptr;
        rows_by_panel(xp + r0 * k_dim, rows, k_dim, panel, next, bp ? bp + col : nullptr,
                      op + r0 * n + col, n, std::min(kPanel, n - col));
      }
    }
  });
  return out;
}

}  // namespace tokenwire
