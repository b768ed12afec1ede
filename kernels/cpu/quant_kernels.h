// Weight-only quantized matmul: the interface between the binding (quant_linear.cpp) and the
// per-instruction-set kernels (quant_isa_*.cpp).
//
// Weights (engine/quant/layout.py regroups each GGUF format into this, bit for bit):
//   w = scale * code + offset, one scale and one offset per `sub` weights of a row
//
//   codes    uint8 [n, kp * bits / 8]   kp = in_features rounded up to 128 (a group)
//   scales   fp16 or fp32 [n, kp / sub] sub = 32 (Q4_0, Q4_1, Q8_0, Q4_K) or 16 (Q6_K)
//   offsets  same shape and type        padding weights: code 0, scale 0, offset 0
//
// A group of 128 weights is 4 blocks of 32, each split in halves of 16; its codes are a
// "lo" run of 64 (the first halves of blocks 0-3) and a "hi" run (the second halves):
//
//   lo run, position 16 b + t  =  weight 32 b + t        (b = block 0-3, t = 0-15)
//   hi run, position 16 b + t  =  weight 32 b + 16 + t
//   4-bit: byte i of the group's 64 = lo[i] | hi[i] << 4  (ggml's own Q4 nibble order)
//   8-bit: the group's 128 bytes    = lo run, then hi run
//
// so in a 64-code vector each int32 lane of a dot (4 codes) lies in one block: lanes
// 4b..4b+3 are block b in both runs, and lo + hi sums are whole blocks.
//
// Activations are quantized per row in blocks of 32 at three int8 levels (quantize_rows),
// stored in the same lo/hi order as the codes:
//   x ~= d * (p1 + p2 / 128 + p3 / 128^2),  d = max|x| / 127,  |x - that| <= d / 2^15
// so sum(code * x) over a block is d / 128^2 * (128 * (128 * code.p1 + code.p2) + code.p3):
// exact integer dots, one float scale per block. With one int8 level (llama.cpp's Q8_1)
// greedy output matched Hugging Face's fp32 on 3 of 9 parity prompts, with two on 8 or 9
// (the ninth parts at a 3e-4 tie of HF's top two), three on 9 of 9; logprobs lie from fp32
// activations' at a median 1e-3 with two levels, 1e-5 with three (python -m
// loadtest.logprob_error). The AVX2 and AVX-512 dots pay a pass of multiplies per level and
// read only the first two (kSimdLevels: the time saved is in docs/kernels.md); portable
// reads all three.
// The offsets multiply the exact fp32 sum of x over each sub-block.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace tokenwire::quant {

constexpr int64_t kGroup = 128;  // weights per group of codes
constexpr int64_t kBlock = 32;   // activation weights per quantization block
constexpr int kLevels = 3;       // int8 levels of an activation
constexpr int kSimdLevels = 2;   // of them, the ones the AVX2 and AVX-512 dots read
constexpr int kLevelShift = 7;   // each level is 1 / 128 (2^-7) of the one before

struct Weights {
  const uint8_t* codes;
  const void* scales;   // uint16_t (fp16 bits) or float
  const void* offsets;  // as scales
  int64_t n, kp;
  int bits, sub;
  bool half;
  // The last group holds at most 64 weights (k = 576 = 4.5 groups): its blocks 2 and 3 are
  // padding, zero codes against zero activations, which kernels may skip.
  bool half_tail = false;
};

struct Activations {
  const int8_t* p[kLevels];  // [m, kp] each, each group in lo/hi order
  const float* d;      // [m, kp / sub]: the block's d / 128^2, repeated per sub-block
  const float* sums;   // [m, kp / sub]: exact sum of x over each sub-block
  // The same per tile of 4 rows (and a last tile of 2 or 3 rows, the rest zero),
  // transposed for the 4-row kernels: for tile q,
  // group g, run h (sub 16 only: h = 0 lo, 1 hi) and block b, the 4 rows' values are at
  // [((q * groups + g) * halves + h) * 16 + 4 b + r], halves = 2 for sub 16, else 1.
  const float* d4;
  const float* sums4;
  int64_t m, kp;
  // [m, kp] 128 * p1 + p2 (lo/hi order), the first two levels as one int16: the AVX2 path
  // multiplies 8-bit codes by it (kernels that do not read it get nullptr).
  const int16_t* x12 = nullptr;
};

// out[r * out_stride + j] = x_r . w_j (+ bias[j]) for weight rows [n_begin, n_end).
struct Gemm {
  Weights w;
  Activations x;
  const float* bias;  // [n] or nullptr
  float* out;         // [m, n]
};

// Instruction sets, best last; kernels for each are compiled for that set alone, so the
// process picks one at run time and a forced one can be tested on a bigger CPU.
// kAmx: AVX-512's paths plus AMX tiles for batched rows (quant_isa_amx.cpp).
enum Isa : int { kPortable = 0, kAvx2 = 1, kAvx512 = 2, kAmx = 3 };

namespace portable { void gemm(const Gemm& g, int64_t n_begin, int64_t n_end); }
namespace avx2 { void gemm(const Gemm& g, int64_t n_begin, int64_t n_end); }
namespace avx512 { void gemm(const Gemm& g, int64_t n_begin, int64_t n_end); }

// One row of x [k] -> the int8 levels its dots read (level l at p + l * stride, lo/hi order
// within each group: portable all kLevels, AVX2 and AVX-512 the first kSimdLevels), and per
// sub-block the block's d / 128^2 and the exact sum of x. Padding blocks (past k) get zeros;
// a block holding NaN or inf gets d = NaN, so its outputs are NaN as fp32 arithmetic would
// make them.
namespace portable {
void quantize_row(const float* x, int64_t k, int64_t kp, int sub, int8_t* p, int64_t stride,
                  float* d, float* sums);
}
namespace avx2 {
void quantize_row(const float* x, int64_t k, int64_t kp, int sub, int8_t* p, int64_t stride,
                  float* d, float* sums);
}
namespace avx512 {
void quantize_row(const float* x, int64_t k, int64_t kp, int sub, int8_t* p, int64_t stride,
                  float* d, float* sums);
}

// What every quantize_row stores for block b (32 weights): the block's d / 128^2 for each of
// its sub-blocks, NaN where the block holds NaN or inf (`finite` false: rounding would hide
// them), and the exact sum of x over each sub-block (sub 32: total; sub 16: half_sums).
inline void store_block(int64_t b, int sub, float amax, bool finite, float total,
                        const float* half_sums, float* d, float* sums) {
  const float scale = (finite ? amax / 127.f : NAN) / float(1 << (kLevelShift * (kLevels - 1)));
  if (sub == 32) {
    d[b / 32] = scale;
    sums[b / 32] = total;
    return;
  }
  for (int h = 0; h < 2; ++h) {
    d[b / 16 + h] = scale;
    sums[b / 16 + h] = half_sums[h];
  }
}

// Weight row j as k fp32 values (scale * code + offset) into out: the dense path's unpack
// for prefill-sized batches.
namespace portable { void unpack_row(const Weights& w, int64_t j, int64_t k, float* out); }
namespace avx2 { void unpack_row(const Weights& w, int64_t j, int64_t k, float* out); }
namespace avx512 { void unpack_row(const Weights& w, int64_t j, int64_t k, float* out); }

// AVX2's path for small batches (quant_linear.cpp kAvx2UnpackedRows), x exact fp32:
// pack_rows lays x [m, k] out as panels of 8 rows, k-major (xt[(q k + t) 8 + i] =
// x[8 q + i][t], zeros past row m; ceil(m / 8) * 8 * k floats), then gemm_unpacked sets
// out[r * n + j] = x_r . w_j (+ bias[j]) for weight rows [n_begin, n_end), unpacking 16 weight
// rows at a time into cache-sized scratch and multiplying them with fp32 fmas.
namespace avx2 {
void pack_rows(const float* x, int64_t m, int64_t k, float* xt);
void gemm_unpacked(const Weights& w, const float* xt, int64_t m, int64_t k, const float* bias,
                   float* out, int64_t n_begin, int64_t n_end);
}

// Batched rows against weight panels (quant_panels.h), for sub-32 weights: the rows' first
// two levels repacked in natural weight order, 16-row tiles (rows past m zero), each block's
// d (times 128: the two levels' sum is 128 p1 + p2) and exact sum.
namespace panels {
constexpr int64_t kTile = 16;  // activation rows per tile, weight rows per panel
struct Inputs {
  std::vector<int8_t> levels;  // [2][mp][k]
  std::vector<float> d, sums;  // [mp][k / 32]
  int64_t mp = 0, k = 0, blocks = 0;
};
}  // namespace panels

// out[r * n + j] = x_r . w_j (+ bias[j]), r < m, for the 16-row weight panels
// [panel_begin, panel_end): on AMX tiles (quant_isa_amx.cpp) or with AVX-512 VNNI's dots.
namespace amx {
// The CPU has AMX-TILE, AMX-INT8 and AVX-512, and Linux granted this process tile data.
bool available();
void gemm(const Weights& w, const panels::Inputs& x, const float* bias, float* out, int64_t m,
          int64_t panel_begin, int64_t panel_end);
}  // namespace amx
namespace avx512 {
void gemm_panels(const Weights& w, const panels::Inputs& x, const float* bias, float* out,
                 int64_t m, int64_t panel_begin, int64_t panel_end);
}  // namespace avx512

// IEEE half -> float without F16C (portable kernels, embedding lookup, scale reads).
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

// Scale or offset i of a row, in whichever type the weight keeps them.
inline float param_at(const void* row, bool half, int64_t i) {
  if (!half) return static_cast<const float*>(row)[i];
  return half_to_float(static_cast<const uint16_t*>(row)[i]);
}

inline int64_t code_bytes(int64_t kp, int bits) { return kp * bits / 8; }

// Where weight row j's codes, scales and offsets start (the last two fp16 or fp32, as
// w.half says: read them with param_at).
struct WeightRow {
  const uint8_t* codes;
  const void* scales;
  const void* offsets;
};

inline WeightRow weight_row(const Weights& w, int64_t j) {
  const int64_t param_bytes = w.kp / w.sub * (w.half ? 2 : 4);
  return {w.codes + j * code_bytes(w.kp, w.bits),
          static_cast<const char*>(w.scales) + j * param_bytes,
          static_cast<const char*>(w.offsets) + j * param_bytes};
}

// Where weight j of a row sits in its group's lo/hi order (0-63 lo, 64-127 hi).
inline int64_t lohi_index(int64_t j) {
  const int64_t i = j % kGroup, block = i / kBlock, t = i % kBlock;
  return j - i + (t / 16) * 64 + block * 16 + t % 16;
}

// Code j of a row (the layout above).
inline int code_at(const uint8_t* row, int bits, int64_t j) {
  const int64_t at = lohi_index(j);
  if (bits == 8) return row[at];
  const uint8_t b = row[at / kGroup * 64 + at % 64];
  return at % kGroup < 64 ? (b & 15) : (b >> 4);
}

}  // namespace tokenwire::quant
