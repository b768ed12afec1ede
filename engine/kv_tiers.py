"""The KV store's tiers under the pool: host RAM (tier 1), then a directory (tier 2).

    pool (tier 0) --evicts a hashed block--> host RAM --drops LRU--> disk --drops LRU--> gone
    prefix lookup:  pool -> host -> disk; a block found below is copied into a pool block

Blocks are keyed by the pool's chained block hash (`hash_block_tokens`), which is the same
in every process, so the disk tier survives a restart. The block manager drives the tiers
through `store` (at eviction) and `fetch`/`load` (at lookup); it never sees a tensor.
"""
from __future__ import annotations

import dataclasses
import hashlib
import time
from typing import TYPE_CHECKING

import torch

from engine.config import EngineConfig
from engine.kv_disk_tier import DiskTier
from engine.kv_host_tier import HostTier, TieredBlock
from engine.outputs import TierStats

if TYPE_CHECKING:
    from engine.loader import LoadedModel
    from engine.model_runner import ModelRunner


class KVTiers:
    """Copies blocks between the pool's `kv_caches` (per layer (k, v), each
    [num_blocks, block_size, kv_heads, head_dim]) and the tiers below it."""

    def __init__(self, kv_caches: list[tuple[torch.Tensor, torch.Tensor]], host_bytes: int,
                 disk: DiskTier | None = None):
        self.kv_caches = kv_caches
        self.block_size = kv_caches[0][0].shape[1]
        self.host = HostTier(host_bytes)
        self.host_stats = TierStats(capacity=host_bytes)
        self.disk = disk
        self._fetched_from = self.host_stats  # the tier of the last fetch: its load's time

    def store(self, block_hash: bytes, parent_hash: bytes | None,
              token_ids: tuple[int, ...], block_id: int) -> None:
        """Keep a pool block about to be reused: into host RAM, what that drops to disk."""
        if self.host.touch(block_hash) or (self.host.capacity == 0 and self.disk is not None
                                           and block_hash in self.disk):
            return  # loaded from a tier earlier: the same KV is still there
        self._keep(block_hash, TieredBlock(parent_hash, token_ids, self._read(block_id)))

    def park(self, block_hash: bytes, parent_hash: bytes | None,
             token_ids: tuple[int, ...], block_id: int, retain_s: float | None = None
             ) -> None:
        """Write a pool block down now, whatever the pool does next: into host RAM and
        through to disk (queued: the writer thread does the file), so a restart finds it.
        `retain_s`: the disk tier keeps it (DiskTier: ahead of other blocks, and from
        its age sweep for that long)."""
        block = self.host.get(block_hash)
        if block is None:
            block = TieredBlock(parent_hash, token_ids, self._read(block_id))
            self._keep(block_hash, block)
        if self.disk is not None:
            self.disk.put(block_hash, block, retain_s)  # written or queued: kept, if asked

    def __contains__(self, block_hash: bytes) -> bool:
        """Whether a tier holds the block (unchecked: a broken file is a miss on load)."""
        return block_hash in self.host or (self.disk is not None and block_hash in self.disk)

    def forget(self, block_hash: bytes) -> bool:
        """Delete the block from every tier; whether any held it."""
        held = self.host.discard(block_hash)
        if self.disk is not None:
            held = self.disk.discard(block_hash) or held
        return held

    def _keep(self, block_hash: bytes, block: TieredBlock) -> None:
        """Into host RAM; what that drops goes to disk."""
        started = time.perf_counter()
        dropped = self.host.put(block_hash, block)
        if block_hash in self.host:
            self.host_stats.stores += 1
            self.host_stats.store_seconds += time.perf_counter() - started
        self.host_stats.dropped += sum(1 for h, _ in dropped if h != block_hash)
        if self.disk is not None:
            for old_hash, old in dropped:
                self.disk.put(old_hash, old)

    def fetch(self, block_hash: bytes, parent_hash: bytes | None,
              token_ids: tuple[int, ...]) -> TieredBlock | None:
        """The block of `token_ids` after `parent_hash` from the first tier that holds it."""
        for tier, stats in self._lower_tiers():
            started = time.perf_counter()
            block = tier.get(block_hash)
            stats.load_seconds += time.perf_counter() - started
            if block is not None and block.holds(parent_hash, token_ids):
                stats.loads += 1
                stats.hits += self.block_size
                self._fetched_from = stats
                return block
        return None

    def load(self, block_id: int, block: TieredBlock) -> None:
        """Copy a fetched block's KV into pool block `block_id`."""
        started = time.perf_counter()
        payload = block.payload.to(self.kv_caches[0][0].device)
        for i, cache in enumerate(t for pair in self.kv_caches for t in pair):
            cache[block_id].copy_(payload[i])
        self._fetched_from.load_seconds += time.perf_counter() - started

    def stats(self) -> dict[str, TierStats]:
        self.host_stats.bytes = self.host.used
        tiers = {"host": self.host_stats}
        if self.disk is not None:
            tiers["disk"] = self.disk.stats
        return tiers

    def close(self) -> None:
        if self.disk is not None:
            self.disk.close()

    def _lower_tiers(self):
        yield self.host, self.host_stats
        if self.disk is not None:
            yield self.disk, self.disk.stats

    def _read(self, block_id: int) -> torch.Tensor:
        """Pool block `block_id` as one host tensor [2 * num_layers, block_size, heads, dim]."""
        return torch.stack([t[block_id] for pair in self.kv_caches for t in pair]).cpu()


def build_kv_tiers(config: EngineConfig, runner: ModelRunner, loaded: LoadedModel
                   ) -> KVTiers | None:
    """The tiers the config asks for (None: neither, or no prefix cache to serve)."""
    if not config.enable_prefix_caching or not (config.kv_host_bytes or config.kv_disk_dir):
        return None
    disk = None
    if config.kv_disk_dir:
        k = runner.kv_caches[0][0]
        shape = (2 * len(runner.kv_caches), *k.shape[1:])
        disk = DiskTier(config.kv_disk_dir, config.kv_disk_bytes,
                        model_fingerprint(config, loaded, k), shape, k.dtype,
                        config.kv_disk_queue_blocks, config.kv_disk_max_age_s)
    return KVTiers(runner.kv_caches, config.kv_host_bytes, disk)


def model_fingerprint(config: EngineConfig, loaded: LoadedModel, kv: torch.Tensor) -> bytes:
    """What a disk block is bound to: the model (its spec, name and shape), its
    quantization, the KV dtype and the pool's block shape. A block written under any
    other fingerprint is a miss."""
    parts = (config.model, loaded.name, config.quantization, kv.dtype, tuple(kv.shape[1:]),
             dataclasses.astuple(loaded.config))
    return hashlib.sha256(repr(parts).encode()).digest()
