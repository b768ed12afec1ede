"""What the hardware allows: measured matmul peak and copy bandwidth, and the workload's
ceiling in output tokens/s derived from them.

CPU: the workload is compute-bound, so the ceiling is total FLOPs / measured matmul rate,
counting 2 x parameters per processed token (prompt and output alike, as the issue that set
the target counts them) plus attention. Two rates: the burst (the best single 2048^3 matmul)
and the sustained (matmuls back to back for a couple of seconds). On a shared VM they
differ by up to half (host neighbours), and a run of many seconds sees the sustained one.
GPU: decode is bandwidth-bound (weights + the batch's KV read once per step) and prefill is
compute-bound; the ceiling adds the two times.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch


@dataclass
class Hardware:
    matmul_flops: float  # measured dense matmul FLOP/s in the benchmark dtype: best single
    copy_bytes_per_s: float  # measured device copy bandwidth (read + write)
    sustained_matmul_flops: float  # the same matmul back to back over SUSTAIN_S

    def sustained(self) -> "Hardware":
        """This hardware with its sustained matmul rate as the peak."""
        return Hardware(self.sustained_matmul_flops, self.copy_bytes_per_s,
                        self.sustained_matmul_flops)


SUSTAIN_S = 2.0


@dataclass
class Workload:
    num_prompts: int
    input_len: int
    output_len: int


def measure_hardware(device: torch.device, dtype: torch.dtype) -> Hardware:
    n = 2048 if device.type == "cpu" else 8192
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    matmul_s = best_time(lambda: torch.mm(a, b), device)
    sustained_s = _mean_time(lambda: torch.mm(a, b), device, SUSTAIN_S)
    src = torch.empty(256 * 2**20 // 4, device=device, dtype=torch.float32)
    dst = torch.empty_like(src)
    copy_s = best_time(lambda: dst.copy_(src), device)
    return Hardware(2 * n ** 3 / matmul_s, 2 * src.numel() * 4 / copy_s, 2 * n ** 3 / sustained_s)


def around(before: Hardware, after: Hardware) -> Hardware:
    """What a run between two measurements had: the better burst figures (a neighbour's
    burst during one probe would otherwise lower the ceiling and flatter the fraction),
    and the mean of the two sustained rates."""
    return Hardware(max(before.matmul_flops, after.matmul_flops),
                    max(before.copy_bytes_per_s, after.copy_bytes_per_s),
                    (before.sustained_matmul_flops + after.sustained_matmul_flops) / 2)


def best_time(fn, device: torch.device, repeats: int = 5) -> float:
    """Best seconds of `repeats` calls of fn after one warm-up call."""
    fn()
    best = float("inf")
    for _ in range(repeats):
        _sync(device)
        start = time.perf_counter()
        fn()
        _sync(device)
        best = min(best, time.perf_counter() - start)
    return best


def _mean_time(fn, device: torch.device, seconds: float) -> float:
    """Mean seconds per call of fn run back to back for about `seconds`."""
    fn()
    _sync(device)
    calls, start = 0, time.perf_counter()
    while True:
        fn()
        calls += 1
        _sync(device)
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            return elapsed / calls


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def model_flops_per_token(config) -> float:
    """2 x parameters (embedding counted once; lm_head is the tied or separate projection)."""
    c = config
    attn = c.hidden_size * (c.num_heads + 2 * c.num_kv_heads) * c.head_dim \
        + c.num_heads * c.head_dim * c.hidden_size
    mlp = 3 * c.hidden_size * c.intermediate_size
    return 2.0 * (c.num_layers * (attn + mlp) + c.vocab_size * c.hidden_size)


def attention_flops(config, w: Workload) -> float:
    """QK^T and PV over the causal context of every processed token."""
    per_pair = 4 * config.num_heads * config.head_dim * config.num_layers
    total_len = w.input_len + w.output_len
    pairs = total_len * (total_len + 1) / 2  # each token attends to its prefix
    return w.num_prompts * pairs * per_pair


def compute_ceiling(config, w: Workload, hw: Hardware) -> float:
    """Output tokens/s if every FLOP ran at the measured matmul peak."""
    tokens = w.num_prompts * (w.input_len + w.output_len)
    flops = tokens * model_flops_per_token(config) + attention_flops(config, w)
    return w.num_prompts * w.output_len / (flops / hw.matmul_flops)


def bandwidth_ceiling(config, w: Workload, hw: Hardware, dtype_bytes: int) -> float:
    """Output tokens/s with all prompts in one batch: prefill at matmul peak, then one
    weights-plus-KV read per decode step at the measured copy bandwidth (bytes read and
    written per second, the figure usually quoted as a card's bandwidth)."""
    prefill_s = (w.num_prompts * w.input_len * model_flops_per_token(config)) / hw.matmul_flops
    weight_bytes = model_flops_per_token(config) / 2 * dtype_bytes
    kv_per_token = 2 * config.num_layers * config.num_kv_heads * config.head_dim * dtype_bytes
    decode_s = 0.0
    for step in range(w.output_len):
        context = w.num_prompts * (w.input_len + step)
        decode_s += (weight_bytes + context * kv_per_token) / hw.copy_bytes_per_s
    return w.num_prompts * w.output_len / (prefill_s + decode_s)
