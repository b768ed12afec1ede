"""CPU prefill/extend attention, the engine's two backends side by side in one run:
torch (SDPA per request over gathered, head-repeated K/V) and cpu (the C++ kernel reading
the paged cache), the latter in fp32 and, where the CPU has AVX-512 BF16, with bf16
products. Checks they give the same output first (bf16 within its rounding), then prints
the best-of-N time per layer call, GFLOP/s and the ratios.

    python -m loadtest.attention_bench            # SmolLM2-135M's heads (9 q, 3 kv, D 64)
    python -m loadtest.attention_bench --heads 4 1 256 --window 512   # Gemma 3 270M's local layers
"""
from __future__ import annotations

import argparse

import torch

import kernels.cpu as cpu_kernels
from engine.attention import AttentionMetadata, TorchAttention, store_kv
from engine.cpu_backend import CpuAttention
from loadtest.roofline import best_time

# (what, context lengths, new tokens per request): the bench workload's prefill step, a
# long first turn, and a chat turn over a long cached history.
CASES = [("16 prompts x 128 tokens", [128] * 16, [128] * 16),
         ("one 2048-token prompt", [2048], [2048]),
         ("32 new tokens over 2048 cached", [2080], [32])]


def paged_step(seq_lens, q_lens, num_heads, num_kv_heads, head_dim, block_size=16, seed=0):
    """q/k/v of one step's new tokens, caches with scattered blocks holding every context
    token's K/V (the new ones included), and metadata."""
    gen = torch.Generator().manual_seed(seed)
    blocks = [-(-n // block_size) for n in seq_lens]
    ids = torch.randperm(sum(blocks), generator=gen).int()
    tables = torch.zeros(len(seq_lens), max(blocks), dtype=torch.int32)
    for b, start in enumerate(torch.tensor([0] + blocks).cumsum(0)[:-1].tolist()):
        tables[b, :blocks[b]] = ids[start:start + blocks[b]]
    shape = (sum(blocks), block_size, num_kv_heads, head_dim)
    caches = tuple(torch.randn(shape, generator=gen) for _ in range(2))
    tokens = sum(q_lens)
    q = torch.randn(tokens, num_heads, head_dim, generator=gen)
    k, v = (torch.randn(tokens, num_kv_heads, head_dim, generator=gen) for _ in range(2))
    slots = torch.tensor([int(tables[b, p // block_size]) * block_size + p % block_size
                          for b, (s, n) in enumerate(zip(seq_lens, q_lens)) for p in range(s - n, s)])
    store_kv(k, v, *caches, slots)  # as a step does before attention
    meta = AttentionMetadata(
        slot_mapping=slots, block_tables=tables,
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        query_start_loc=torch.tensor([0] + q_lens).cumsum(0).int(), num_decodes=0,
        max_seq_len=max(seq_lens), query_lens_host=q_lens, seq_lens_host=seq_lens)
    return q, k, v, caches, meta


def causal_flops(seq_lens, q_lens, num_heads, head_dim, window=None) -> float:
    """QK^T and PV over the visible query-key pairs (the query at position p sees p + 1
    keys, at most `window`)."""
    pairs = sum(min(p + 1, window or p + 1) for s, n in zip(seq_lens, q_lens)
                for p in range(s - n, s))
    return 4.0 * pairs * num_heads * head_dim


def run_case(kernels, seq_lens, q_lens, heads, repeats, window=None) -> dict[str, float]:
    """Best seconds per call of each backend's prefill path, after checking they agree
    (bf16 within its rounding); the backends take turns, repeats times."""
    q, k, v, (k_cache, v_cache), meta = paged_step(seq_lens, q_lens, *heads)
    backends = {"torch": TorchAttention(*heads, window=window),
                "cpu": CpuAttention(*heads, kernels, window=window)}
    if kernels.prefill_attention_has_bf16():
        backends["cpu bf16"] = CpuAttention(*heads, kernels, window=window, prefill_bf16=True)
    outs = {name: torch.empty_like(q) for name in backends}
    calls = {name: (lambda a=a, o=outs[name]: a._prefill(q, k, v, k_cache, v_cache, meta, o))
             for name, a in backends.items()}
    for call in calls.values():
        call()
    torch.testing.assert_close(outs["cpu"], outs["torch"], rtol=1e-4, atol=1e-4)
    if "cpu bf16" in outs:
        torch.testing.assert_close(outs["cpu bf16"], outs["torch"], rtol=2e-2, atol=2e-2)
    best = {name: float("inf") for name in calls}
    for _ in range(repeats):
        for name, call in calls.items():
            best[name] = min(best[name], best_time(call, q.device, 1))
    return best


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--heads", type=int, nargs=3, default=[9, 3, 64],
                   metavar=("HEADS", "KV_HEADS", "HEAD_DIM"))
    p.add_argument("--window", type=int, default=None, help="a sliding window (default: none)")
    p.add_argument("--repeats", type=int, default=20)
    args = p.parse_args(argv)
    kernels = cpu_kernels.load()
    if kernels is None:
        raise SystemExit("the C++ CPU kernels did not build here")
    print(f"prefill attention per layer call, {torch.get_num_threads()} threads, heads "
          f"{args.heads[0]}/{args.heads[1]}, head_dim {args.heads[2]}, window {args.window}, fp32")
    bf16 = kernels.prefill_attention_has_bf16()
    bf16_columns = (f"{'bf16 ms':>9}{'bf16 GF/s':>11}{'bf16/cpu':>10}" if bf16
                    else "  (no AVX-512 BF16: no bf16 column)")
    print(f"{'case':<32}{'torch ms':>10}{'cpu ms':>9}{'torch GF/s':>12}{'cpu GF/s':>10}"
          f"{'speed-up':>10}{bf16_columns}")
    for what, seq_lens, q_lens in CASES:
        t = run_case(kernels, seq_lens, q_lens, args.heads, args.repeats, args.window)
        flops = causal_flops(seq_lens, q_lens, args.heads[0], args.heads[2], args.window)
        line = (f"{what:<32}{1e3 * t['torch']:>10.2f}{1e3 * t['cpu']:>9.2f}"
                f"{flops / t['torch'] / 1e9:>12.1f}{flops / t['cpu'] / 1e9:>10.1f}"
                f"{t['torch'] / t['cpu']:>9.2f}x")
        if bf16:
            line += (f"{1e3 * t['cpu bf16']:>9.2f}{flops / t['cpu bf16'] / 1e9:>11.1f}"
                     f"{t['cpu'] / t['cpu bf16']:>9.2f}x")
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
