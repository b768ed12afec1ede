"""Tier 1 of the KV store: blocks the pool evicted, kept in host RAM, LRU within a byte bound.

A block is kept with its parent hash and token ids, so that a hit is checked as the pool
checks one (`Block.holds`): a colliding key costs a miss, never another prefix's KV.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch


@dataclass(frozen=True, slots=True)
class TieredBlock:
    """One block's KV off the pool: payload [2 * num_layers, block_size, kv_heads, head_dim]
    (each layer's k then v), on the host."""

    parent_hash: bytes | None
    token_ids: tuple[int, ...]
    payload: torch.Tensor

    def holds(self, parent_hash: bytes | None, token_ids: tuple[int, ...]) -> bool:
        return self.token_ids == token_ids and self.parent_hash == parent_hash

    @property
    def nbytes(self) -> int:
        return self.payload.nbytes


class HostTier:
    """Blocks by hash, least recently stored or loaded first out; never over `capacity` bytes."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.used = 0
        self.entries: OrderedDict[bytes, TieredBlock] = OrderedDict()

    def __contains__(self, block_hash: bytes) -> bool:
        return block_hash in self.entries

    def touch(self, block_hash: bytes) -> bool:
        """Mark a held block most recently used; False if it is not held."""
        if block_hash not in self.entries:
            return False
        self.entries.move_to_end(block_hash)
        return True

    def get(self, block_hash: bytes) -> TieredBlock | None:
        if not self.touch(block_hash):
            return None
        return self.entries[block_hash]

    def discard(self, block_hash: bytes) -> bool:
        """Delete a block; whether it was held."""
        block = self.entries.pop(block_hash, None)
        if block is not None:
            self.used -= block.nbytes
        return block is not None

    def put(self, block_hash: bytes, block: TieredBlock) -> list[tuple[bytes, TieredBlock]]:
        """Keep `block`; returns the blocks dropped to stay within capacity, oldest first
        (`block` itself when it does not fit at all), for the tier below."""
        if block.nbytes > self.capacity:
            return [(block_hash, block)]
        self.entries[block_hash] = block
        self.used += block.nbytes
        dropped = []
        while self.used > self.capacity:
            old_hash, old = self.entries.popitem(last=False)
            self.used -= old.nbytes
            dropped.append((old_hash, old))
        return dropped
