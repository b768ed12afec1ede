// What the quantized-matmul module (quant_linear.cpp) lends the ops module (ops.cpp,
// decode_stack.cpp): its worker pool and its matmul, as a table of plain function pointers.
//
// Each module is its own shared library, loaded with its symbols private, so they cannot
// call each other's functions by name; the quant module hands this table out in a PyCapsule
// (`exports()`, named kQuantExportsCapsule) and kernels/cpu/__init__.py gives it to the ops
// module (`use_quant_exports`). One worker pool for both keeps two cores from being claimed
// by three spinning threads.
#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <cstdint>
#include <optional>

namespace tokenwire {

struct QuantExports {
  // The worker pool (worker_pool.h): fn(ctx, c) for every c in [0, chunks).
  void (*run)(int64_t chunks, int threads, void (*fn)(void* ctx, int64_t chunk), void* ctx);
  // The `quant_linear` binding: x [M, K] fp32 -> x W^T (+ bias) [M, N] on packed codes.
  at::Tensor (*linear)(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scales,
                       const at::Tensor& offsets, int64_t bits, int64_t sub,
                       const std::optional<at::Tensor>& bias, int64_t isa);
};

inline constexpr const char* kQuantExportsCapsule = "tokenwire.quant_exports";

// In the ops module: the table once handed over, else nullptr.
const QuantExports* borrowed_quant_exports();

// In the ops module: fn(c) for every c in [0, chunks), on the worker pool once handed over
// (its threads start in a microsecond, and the caller never waits for one that has not
// shown up) or else OpenMP's threads.
template <class F>
void parallel_chunks(int64_t chunks, const F& fn) {
  if (const QuantExports* quant = borrowed_quant_exports()) {
    auto call = [](void* ctx, int64_t c) { (*static_cast<const F*>(ctx))(c); };
    quant->run(chunks, at::get_num_threads(), call, const_cast<F*>(&fn));
    return;
  }
  at::parallel_for(0, chunks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c) fn(c);
  });
}

}  // namespace tokenwire
