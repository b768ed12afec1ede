// Helpers shared by the CPU kernel sources: argument checks and 8-float SIMD vectors.
#pragma once

#include <ATen/ATen.h>

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

}  // namespace tokenwire
