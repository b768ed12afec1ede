#pragma once

#include <ATen/ATen.h>

namespace tokenwire {

// out, q [T, H, D] (D 64, 128 or 256); k/v_cache [num_blocks, block_size, Hkv, D];
// block_tables [>=B, W], query_start_loc [B+1], seq_lens [B], all int32. Sequence b's
// queries are q rows query_start_loc[b] .. query_start_loc[b+1]-1, the last positions of
// its seq_len context (causal; window > 0: each sees only the last `window` positions up
// to its own); other rows of out are left alone.
void paged_prefill_attention(at::Tensor out, at::Tensor q, at::Tensor k_cache,
                             at::Tensor v_cache, at::Tensor block_tables,
                             at::Tensor query_start_loc, at::Tensor seq_lens, double scale,
                             int64_t window);

}  // namespace tokenwire
