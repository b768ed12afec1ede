#pragma once

#include <ATen/ATen.h>

namespace tokenwire {

// out, q [T, H, D] (D 64, 128 or 256); k/v_cache [num_blocks, block_size, Hkv, D];
// block_tables [>=B, W], query_start_loc [B+1], seq_lens [B], all int32. Sequence b's
// queries are q rows query_start_loc[b] .. query_start_loc[b+1]-1, the last positions of
// its seq_len context (causal; window > 0: each sees only the last `window` positions up
// to its own); other rows of out are left alone. bf16: the far key tiles' products on bf16
// operands with fp32 sums (only where prefill_attention_has_bf16(); see the .cpp).
void paged_prefill_attention(at::Tensor out, at::Tensor q, at::Tensor k_cache,
                             at::Tensor v_cache, at::Tensor block_tables,
                             at::Tensor query_start_loc, at::Tensor seq_lens, double scale,
                             int64_t window, bool bf16);

// Whether this build (-march=native) has the bf16 path: the CPU has AVX-512 BF16.
bool prefill_attention_has_bf16();

}  // namespace tokenwire
