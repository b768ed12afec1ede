"""Plain-torch paged-cache gather shared by the attention references."""

import torch


def gather_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor,
              seq_len: int, num_heads: int) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V of one sequence's first seq_len tokens as fp32 [num_heads, seq_len, D].

    Token n sits at block block_table[n // block_size], offset n % block_size; each kv
    head is repeated for the num_heads / num_kv_heads query heads that share it (GQA).
    """
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    pos = torch.arange(seq_len, device=k_cache.device)
    blocks = block_table[pos // block_size].long()
    offsets = pos % block_size
    group = num_heads // num_kv_heads
    k = k_cache[blocks, offsets].float().repeat_interleave(group, dim=1)  # [L, H, D]
    v = v_cache[blocks, offsets].float().repeat_interleave(group, dim=1)
    return k.transpose(0, 1), v.transpose(0, 1)
