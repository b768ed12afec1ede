"""CUDA graphs for decode steps: one graph of the model's forward per padded batch size.

A decode step is hundreds of small kernels whose launch cost dominates at small batch;
replaying a captured graph issues them all at once. Inputs live in static buffers that
every replay reads; a batch of n requests runs the smallest captured size >= n, its padding
rows writing to no cache slot (slot -1) and attending to nothing (length 0).
Only the Triton attention backend is captured: its decode kernel's launch grid depends on
tensor shapes alone, never on the step's sequence lengths.
"""
from __future__ import annotations

import logging

import torch

from engine.attention import AttentionMetadata

log = logging.getLogger(__name__)


def capture_sizes(max_batch: int) -> list[int]:
    """1, 2, 4, 8, then every 16 up to max_batch, and max_batch itself (vLLM's spacing:
    padding stays < 16 rows, and every batch up to max_batch has a graph)."""
    sizes = [s for s in (1, 2, 4, 8) if s < max_batch]
    sizes += list(range(16, max_batch, 16))
    return sizes + [max_batch]


class DecodeGraphs:
    """Captured decode forwards sharing one memory pool and one set of input buffers."""

    def __init__(self, model, kv_caches, max_batch: int, max_blocks_per_seq: int,
                 max_seq_len: int, device: torch.device):
        self.model, self.kv_caches = model, kv_caches
        self.max_seq_len = max_seq_len
        self.sizes = capture_sizes(max_batch)
        self.max_batch = self.sizes[-1]
        n = self.max_batch
        self.input_ids = torch.zeros(n, dtype=torch.long, device=device)
        self.positions = torch.zeros(n, dtype=torch.long, device=device)
        self.slot_mapping = torch.full((n,), -1, dtype=torch.long, device=device)
        self.block_tables = torch.zeros(n, max_blocks_per_seq, dtype=torch.int32, device=device)
        self.seq_lens = torch.zeros(n, dtype=torch.int32, device=device)
        self.query_start_loc = torch.arange(n + 1, dtype=torch.int32, device=device)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        self.num_replays = 0  # observable in tests: decode steps that ran from a graph

    def padded_size(self, n: int) -> int | None:
        return next((s for s in self.sizes if s >= n), None)

    @torch.inference_mode()
    def capture(self) -> None:
        pool = None
        for size in reversed(self.sizes):  # largest first: later graphs reuse its pool
            self._forward(size)  # compile and autotune the kernels outside the capture
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.outputs[size] = self._forward(size)
            pool = graph.pool()
            self.graphs[size] = graph
        torch.cuda.synchronize()
        log.info("captured decode CUDA graphs for batch sizes %s", self.sizes)

    def _forward(self, size: int) -> torch.Tensor:
        meta = AttentionMetadata(
            slot_mapping=self.slot_mapping[:size], block_tables=self.block_tables[:size],
            seq_lens=self.seq_lens[:size], query_start_loc=self.query_start_loc[:size + 1],
            num_decodes=size, max_seq_len=self.max_seq_len,
            query_lens_host=[1] * size, seq_lens_host=[self.max_seq_len] * size)
        return self.model.forward(self.input_ids[:size], self.positions[:size], meta,
                                  self.kv_caches)

    def replay(self, host: dict[str, torch.Tensor], n: int) -> torch.Tensor:
        """host: pinned CPU tensors already padded to a captured size; returns hidden [n]."""
        size = self.load(host)
        self.graphs[size].replay()
        self.num_replays += 1
        return self.outputs[size][:n]

    def load(self, host: dict[str, torch.Tensor]) -> int:
        """Copy a padded step into the input buffers; returns its size. Block-table columns
        past the step's width keep older entries: a row reads only the blocks its seq_len
        covers."""
        size = host["input_ids"].shape[0]
        width = host["block_tables"].shape[1]
        self.input_ids[:size].copy_(host["input_ids"], non_blocking=True)
        self.positions[:size].copy_(host["positions"], non_blocking=True)
        self.slot_mapping[:size].copy_(host["slot_mapping"], non_blocking=True)
        self.seq_lens[:size].copy_(host["seq_lens"], non_blocking=True)
        self.block_tables[:size, :width].copy_(host["block_tables"], non_blocking=True)
        return size
