// A QuantLinear as the fused decode stacks hold it, and its matmul through the quantized
// module's exports (quant_exports.h).
#pragma once

#include <torch/extension.h>

#include <optional>
#include <tuple>

#include "quant_exports.h"

namespace tokenwire {

// A QuantLinear's arguments to `quant_linear`: codes, scales, offsets, bits, sub, bias, isa.
using Projection = std::tuple<at::Tensor, at::Tensor, at::Tensor, int64_t, int64_t,
                              std::optional<at::Tensor>, int64_t>;

inline at::Tensor project(const QuantExports& quant, const at::Tensor& x, const Projection& p) {
  const auto& [codes, scales, offsets, bits, sub, bias, isa] = p;
  return quant.linear(x, codes, scales, offsets, bits, sub, bias, isa);
}

// The exports, checked: a stack cannot run without them.
inline const QuantExports& quant_or_throw() {
  const QuantExports* quant = borrowed_quant_exports();
  TORCH_CHECK(quant != nullptr, "the quantized module's exports were not handed over");
  return *quant;
}

}  // namespace tokenwire
