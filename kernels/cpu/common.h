// Helpers shared by the CPU kernel sources: argument checks and 8-float SIMD vectors.
#pragma once

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdint>

namespace tokenwire {

inline void check_fp32_contiguous(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.device().is_cpu(), name, " must be on the CPU");
  TORCH_CHECK(t.scalar_type() == at::kFloat, name, " must be float32");
  TORCH_CHECK(t.is_contiguous(), name, " must be contiguous");
}

// 8 floats: GCC/Clang vector extensions, compiled to whatever SIMD -march=native offers.
typedef float float8 __attribute__((vector_size(32)));

inline float8 load8(const float* p) {
  float8 v;
  __builtin_memcpy(&v, p, sizeof v);
  return v;
}

inline void store8(float* p, float8 v) { __builtin_memcpy(p, &v, sizeof v); }

// A row-wise op's rows split in chunks of at least kMinChunkFloats floats each:
// fn(begin, end) on the calling thread where one chunk holds them all (a decode step's few
// rows: waking a thread costs more than it saves), else run_chunks(chunks, fn(c)) over the
// worker pool. Not at::parallel_for at a row grain: after each of its OpenMP regions
// libgomp's threads spin for milliseconds (its default wait policy), on the core the
// matmuls' pool needs next, four such regions a layer (docs/kernels.md has the cost).
inline constexpr int64_t kMinChunkFloats = int64_t(1) << 15;

template <class RunChunks, class F>
void for_row_chunks(int64_t rows, int64_t floats_per_row, const RunChunks& run_chunks,
                    const F& fn) {
  const int64_t per = std::max<int64_t>(1, kMinChunkFloats / std::max<int64_t>(floats_per_row, 1));
  const int64_t chunks = (rows + per - 1) / per;
  if (chunks <= 1) return fn(int64_t(0), rows);
  run_chunks(chunks, [&](int64_t c) { fn(c * per, std::min(rows, (c + 1) * per)); });
}

}  // namespace tokenwire
