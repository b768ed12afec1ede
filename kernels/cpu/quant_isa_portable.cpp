// Quantized matmul for any CPU: GCC vector extensions of 4 floats (SSE2 on x86-64, NEON on
// arm64), the block unpacked by the scalar reference. Compiled for the baseline ISA only.
#include <algorithm>

#include "quant_kernels.h"

namespace tokenwire::quant::portable {

typedef float V __attribute__((vector_size(16)));
constexpr int kLanes = 4, kVecs = 8, kNW = 4, kR = 2;

inline V vzero() { return V{}; }
inline V vload(const float* p) {
  V v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline V vfma(V a, V b, V c) { return a * b + c; }
inline V vadd(V a, V b) { return a + b; }
inline float vsum(V v) { return (v[0] + v[1]) + (v[2] + v[3]); }

template <int Fmt>
inline void dequant(const uint8_t* block, V* w) {
  float f[kBlock];
  dequantize_block(Fmt, block, f);
  for (int v = 0; v < kVecs; ++v) w[v] = vload(f + v * kLanes);
}

#include "quant_gemm.inc"

}  // namespace tokenwire::quant::portable
