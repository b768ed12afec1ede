// Python bindings of the weight-only quantized kernels: y = x W^T (+ b) with W kept in its
// GGUF blocks (quant_kernels.h), and the embedding lookup that unpacks only the rows a step
// reads. Picks the instruction set at run time; callers may force a smaller one.
#include <ATen/Parallel.h>
#include <torch/extension.h>

#include "quant_kernels.h"

namespace tokenwire::quant {
namespace {

bool isa_supported(int64_t isa) {
  __builtin_cpu_init();
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                    __builtin_cpu_supports("f16c");
  if (isa == kAvx512) return avx2 && __builtin_cpu_supports("avx512f");
  if (isa == kAvx2) return avx2;
  return isa == kPortable;
}

int64_t best_isa() {
  for (int64_t isa : {kAvx512, kAvx2})
    if (isa_supported(isa)) return isa;
  return kPortable;
}

void check_weight(const at::Tensor& w, int64_t fmt, int64_t k) {
  TORCH_CHECK(fmt == kQ4_0 || fmt == kQ4_1 || fmt == kQ8_0, "unknown block format ", fmt);
  TORCH_CHECK(k > 0 && k % kBlock == 0, "in_features must be a multiple of 32, got ", k);
  TORCH_CHECK(w.device().is_cpu() && w.scalar_type() == at::kByte && w.is_contiguous() &&
                  w.dim() == 2 && w.size(1) == k / kBlock * block_bytes(fmt),
              "packed weight must be contiguous uint8 [out_features, ", k / kBlock * block_bytes(fmt),
              "], got ", w.sizes());
}

// x [M, K] fp32 -> [M, N]; isa -1 picks the best this CPU has.
at::Tensor quant_linear(const at::Tensor& x, const at::Tensor& w, int64_t fmt,
                        const std::optional<at::Tensor>& bias, int64_t isa) {
  TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == at::kFloat && x.is_contiguous() &&
                  x.dim() == 2, "x must be contiguous float32 [rows, in_features]");
  check_weight(w, fmt, x.size(1));
  if (isa < 0) isa = best_isa();
  TORCH_CHECK(isa_supported(isa), "instruction set ", isa, " is not available on this CPU");
  const int64_t n = w.size(0);
  GemmArgs a{x.data_ptr<float>(), w.data_ptr<uint8_t>(), nullptr, nullptr, x.size(0), n,
             x.size(1), int(fmt)};
  if (bias) {
    TORCH_CHECK(bias->scalar_type() == at::kFloat && bias->is_contiguous() &&
                bias->numel() == n, "bias must be contiguous float32 [out_features]");
    a.bias = bias->data_ptr<float>();
  }
  at::Tensor out = at::empty({a.m, n}, x.options());
  a.out = out.data_ptr<float>();
  auto* gemm = isa == kAvx512 ? avx512::gemm : isa == kAvx2 ? avx2::gemm : portable::gemm;
  // Threads split the weight rows in groups of kRowGroup: each streams its own part once.
  const int64_t groups = (n + kRowGroup - 1) / kRowGroup;
  at::parallel_for(0, groups, 1, [&](int64_t begin, int64_t end) {
    gemm(a, begin * kRowGroup, std::min(n, end * kRowGroup));
  });
  return out;
}

// ids [T] -> fp32 rows [T, K] of the packed table w.
at::Tensor quant_embedding(const at::Tensor& ids, const at::Tensor& w, int64_t fmt, int64_t k) {
  check_weight(w, fmt, k);
  TORCH_CHECK(ids.scalar_type() == at::kLong && ids.dim() == 1, "ids must be int64 [T]");
  const at::Tensor idc = ids.contiguous();
  const int64_t t = idc.numel(), nb = k / kBlock, bb = block_bytes(fmt);
  at::Tensor out = at::empty({t, k}, at::TensorOptions().dtype(at::kFloat));
  const int64_t* ip = idc.data_ptr<int64_t>();
  for (int64_t i = 0; i < t; ++i)
    TORCH_CHECK(ip[i] >= 0 && ip[i] < w.size(0), "token id ", ip[i], " out of range");
  at::parallel_for(0, t, 16, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const uint8_t* row = w.data_ptr<uint8_t>() + ip[i] * nb * bb;
      for (int64_t b = 0; b < nb; ++b)
        dequantize_block(int(fmt), row + b * bb, out.data_ptr<float>() + i * k + b * kBlock);
    }
  });
  return out;
}

}  // namespace
}  // namespace tokenwire::quant

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  using namespace tokenwire::quant;
  const auto no_gil = py::call_guard<py::gil_scoped_release>();
  m.def("quant_linear", &quant_linear, no_gil);
  m.def("quant_embedding", &quant_embedding, no_gil);
  m.def("isa_supported", &isa_supported);
  m.def("best_isa", &best_isa);
}
