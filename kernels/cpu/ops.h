// ops.cpp's kernels that decode_stack.cpp chains (their comments are beside the code).
#pragma once

#include <torch/extension.h>

#include <optional>
#include <vector>

std::vector<torch::Tensor> rms_norm(torch::Tensor x_in, torch::Tensor weight, double eps,
                                    std::optional<torch::Tensor> residual_in);
torch::Tensor qkv_decode_attention(torch::Tensor qkv, torch::Tensor positions,
                                   torch::Tensor cos_sin_cache, torch::Tensor k_cache,
                                   torch::Tensor v_cache, torch::Tensor slot_mapping,
                                   torch::Tensor block_tables, torch::Tensor seq_lens,
                                   int64_t num_heads, double scale);
torch::Tensor silu_and_mul(torch::Tensor x_in);
void paged_decode_attention(torch::Tensor out, torch::Tensor q, torch::Tensor k_cache,
                            torch::Tensor v_cache, torch::Tensor block_tables,
                            torch::Tensor seq_lens, double scale, int64_t window);
void rotary(torch::Tensor x, torch::Tensor positions, torch::Tensor cos_sin_cache);
void store_kv(torch::Tensor k, torch::Tensor v, torch::Tensor k_cache, torch::Tensor v_cache,
              torch::Tensor slot_mapping);
