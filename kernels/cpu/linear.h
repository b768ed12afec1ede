#pragma once

#include <ATen/ATen.h>

#include <optional>

namespace tokenwire {

// weight [N, K] -> [ceil(N/16), K, 16]: panel p, row k holds W[16p .. 16p+15][k]
// (the last panel zero-padded). Done once per weight, at load.
at::Tensor pack_linear_weight(const at::Tensor& weight);

// x [M, K] -> x W^T (+ bias) [M, out_features]; packed from pack_linear_weight.
at::Tensor packed_linear(const at::Tensor& x, const at::Tensor& packed,
                         const std::optional<at::Tensor>& bias, int64_t out_features);

}  // namespace tokenwire
