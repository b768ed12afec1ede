"""ModelRunner: turns a scheduled batch into tensors, runs the model, samples.

Inputs for a step are built once on the host and copied to the device in one go
(through pinned memory on CUDA). Decode requests go first in the token order.
"""
from __future__ import annotations

import logging

import torch

from engine.attention import AttentionMetadata, TorchAttention
from engine.config import EngineConfig
from engine.loader import LoadedModel
from engine.models.llama import LlamaModel
from engine.ops import TorchOps
from engine.sampler import Sampler
from engine.step_scheduler import ScheduledBatch

log = logging.getLogger(__name__)


class ModelRunner:
    """Owns the model, the KV cache tensors and the sampler."""

    def __init__(self, config: EngineConfig, loaded: LoadedModel, max_model_len: int):
        self.config = config
        self.device = config.resolved_device()
        self.dtype = config.resolved_dtype()
        c = loaded.config
        attention, ops = self._backends(c)
        self.model = LlamaModel(c, loaded.weights, attention, ops, max_positions=max_model_len)
        self.sampler = Sampler(config.seed)
        self.block_size = config.block_size
        # A dummy model may have more vocab rows than the tokenizer: never sample those.
        self.sample_vocab = min(c.vocab_size, len(loaded.tokenizer))
        self.num_blocks = config.num_kv_blocks or self._measure_num_blocks(c)
        shape = (self.num_blocks, self.block_size, c.num_kv_heads, c.head_dim)
        self.kv_caches = [(torch.zeros(shape, dtype=self.dtype, device=self.device),
                           torch.zeros(shape, dtype=self.dtype, device=self.device))
                          for _ in range(c.num_layers)]

    def _backends(self, c):
        if self.config.use_triton():
            from engine.triton_backend import TritonAttention, TritonOps
            return TritonAttention(c.num_heads, c.num_kv_heads, c.head_dim), TritonOps
        return TorchAttention(c.num_heads, c.num_kv_heads, c.head_dim), TorchOps

    def kv_bytes_per_block(self, c) -> int:
        return 2 * c.num_layers * self.block_size * c.num_kv_heads * c.head_dim * \
            torch.tensor([], dtype=self.dtype).element_size()

    def _measure_num_blocks(self, c) -> int:
        """KV pool size from measured free memory (after weights are resident)."""
        if self.device.type == "cuda":
            free, total = torch.cuda.mem_get_info(self.device)
            # keep (1 - fraction) of the card plus room for one step's activations
            budget = free - (1 - self.config.kv_memory_fraction) * total - self._activation_bytes(c)
            cap = self.config.kv_cache_max_bytes
        else:
            import psutil
            budget = psutil.virtual_memory().available * self.config.kv_memory_fraction
            cap = self.config.kv_cache_max_bytes or 1 << 30
        budget = min(budget, cap) if cap else budget
        num_blocks = int(budget // self.kv_bytes_per_block(c))
        if num_blocks < 2:
            raise RuntimeError(f"not enough memory for a KV cache ({budget / 2**20:.0f} MiB)")
        log.info("KV cache: %d blocks of %d tokens (%.0f MiB)", num_blocks, self.block_size,
                 num_blocks * self.kv_bytes_per_block(c) / 2**20)
        return num_blocks

    def _activation_bytes(self, c) -> int:
        tokens = self.config.max_num_batched_tokens
        per_token = 4 * (c.hidden_size * 4 + c.intermediate_size * 3) + 4 * c.vocab_size // 8
        return tokens * per_token + self.config.max_num_seqs * c.vocab_size * 4

    # -- one step ------------------------------------------------------------------
    @torch.inference_mode()
    def execute(self, batch: ScheduledBatch) -> list[int | None]:
        """Run one step; returns a sampled token for each request that caught up, else None."""
        order = sorted(range(len(batch.requests)), key=lambda i: batch.num_new_tokens[i] != 1)
        inputs = self._build_inputs(batch, order)
        hidden = self.model.forward(inputs["input_ids"], inputs["positions"], inputs["meta"],
                                    self.kv_caches)
        sampled_rows = inputs["sample_rows"]
        tokens: list[int | None] = [None] * len(batch.requests)
        if not sampled_rows:
            return tokens
        logits = self.model.compute_logits(hidden[inputs["sample_index"]])
        logits = logits[:, :self.sample_vocab]
        requests = [batch.requests[i] for i in sampled_rows]
        for i, token in zip(sampled_rows, self.sampler.sample(logits, requests)):
            tokens[i] = token
        return tokens

    def _build_inputs(self, batch: ScheduledBatch, order: list[int]) -> dict:
        bs = self.block_size
        ids, positions, slots, seq_lens, q_lens = [], [], [], [], []
        sample_rows, sample_index = [], []
        for i in order:
            request, n = batch.requests[i], batch.num_new_tokens[i]
            start = request.num_computed_tokens
            ids.extend(request.all_token_ids[start:start + n])
            positions.extend(range(start, start + n))
            blocks = request.block_ids
            slots.extend(blocks[p // bs] * bs + p % bs for p in range(start, start + n))
            seq_lens.append(start + n)
            q_lens.append(n)
            if start + n == request.num_tokens:
                sample_rows.append(i)
                sample_index.append(len(ids) - 1)
        max_blocks = max(len(batch.requests[i].block_ids) for i in order)
        tables = [batch.requests[i].block_ids + [0] * (max_blocks - len(batch.requests[i].block_ids))
                  for i in order]
        host = {
            "input_ids": torch.tensor(ids, dtype=torch.long),
            "positions": torch.tensor(positions, dtype=torch.long),
            "slot_mapping": torch.tensor(slots, dtype=torch.long),
            "block_tables": torch.tensor(tables, dtype=torch.int32),
            "seq_lens": torch.tensor(seq_lens, dtype=torch.int32),
            "query_start_loc": torch.tensor([0] + _cumsum(q_lens), dtype=torch.int32),
            "sample_index": torch.tensor(sample_index, dtype=torch.long),
        }
        dev = {k: self._to_device(v) for k, v in host.items()}
        meta = AttentionMetadata(
            slot_mapping=dev["slot_mapping"], block_tables=dev["block_tables"],
            seq_lens=dev["seq_lens"], query_start_loc=dev["query_start_loc"],
            num_decodes=q_lens.count(1),
            max_seq_len=max(seq_lens), query_lens_host=q_lens, seq_lens_host=seq_lens)
        return {"input_ids": dev["input_ids"], "positions": dev["positions"], "meta": meta,
                "sample_index": dev["sample_index"], "sample_rows": sample_rows}

    def _to_device(self, t: torch.Tensor) -> torch.Tensor:
        if self.device.type == "cpu":
            return t
        return t.pin_memory().to(self.device, non_blocking=True)


def _cumsum(values: list[int]) -> list[int]:
    out, total = [], 0
    for v in values:
        total += v
        out.append(total)
    return out
