// Weight-only quantized matmul over GGUF blocks kept as stored: the interface between the
// binding (quant_linear.cpp) and the per-instruction-set kernels (quant_isa_*.cpp).
#pragma once

#include <cstdint>
#include <cstring>

namespace tokenwire::quant {

// Block formats, each 32 weights of one row, as ggml lays them out (little-endian):
//   Q4_0: fp16 d, 16 bytes of nibbles       w = d * (q - 8)
//   Q4_1: fp16 d, fp16 m, 16 bytes nibbles  w = d * q + m
//   Q8_0: fp16 d, 32 int8                   w = d * q
// Byte j of the nibbles holds weight j (low nibble) and weight j + 16 (high nibble).
enum Format : int { kQ4_0 = 0, kQ4_1 = 1, kQ8_0 = 2 };
constexpr int64_t kBlock = 32;

inline int64_t block_bytes(int fmt) { return fmt == kQ4_0 ? 18 : fmt == kQ4_1 ? 20 : 34; }

// Instruction sets, best last; kernels for each are compiled for that set alone, so the
// process picks one at run time and a forced one can be tested on a bigger CPU.
enum Isa : int { kPortable = 0, kAvx2 = 1, kAvx512 = 2 };

struct GemmArgs {
  const float* x;       // [m, k] activations, fp32
  const uint8_t* w;     // [n, k / 32 blocks] packed rows
  const float* bias;    // [n] or nullptr
  float* out;           // [m, n]
  int64_t m, n, k;
  int fmt;
};

// Rows of the weight a thread owns, always whole multiples of kRowGroup but the last.
constexpr int64_t kRowGroup = 4;

namespace portable { void gemm(const GemmArgs& a, int64_t n_begin, int64_t n_end); }
namespace avx2 { void gemm(const GemmArgs& a, int64_t n_begin, int64_t n_end); }
namespace avx512 { void gemm(const GemmArgs& a, int64_t n_begin, int64_t n_end); }

// IEEE half -> float without F16C (the portable kernels and the embedding lookup).
inline float half_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f, mant = h & 0x3ff, bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000 | (mant << 13);
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  } else if (mant == 0) {
    bits = sign;
  } else {  // subnormal half: normalise
    exp = 113;
    while (!(mant & 0x400)) mant <<= 1, --exp;
    bits = sign | (exp << 23) | ((mant & 0x3ff) << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline uint16_t load_u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

// One block to 32 floats in weight order (the reference every kernel path must match).
inline void dequantize_block(int fmt, const uint8_t* b, float* out) {
  const float d = half_to_float(load_u16(b));
  if (fmt == kQ8_0) {
    for (int j = 0; j < 32; ++j) out[j] = d * float(int8_t(b[2 + j]));
    return;
  }
  const float m = fmt == kQ4_1 ? half_to_float(load_u16(b + 2)) : -8.f * d;
  const uint8_t* qs = b + (fmt == kQ4_1 ? 4 : 2);
  for (int j = 0; j < 16; ++j) {
    out[j] = d * float(qs[j] & 15) + m;
    out[j + 16] = d * float(qs[j] >> 4) + m;
  }
}

}  // namespace tokenwire::quant
