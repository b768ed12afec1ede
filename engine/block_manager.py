"""Paged KV-cache blocks: reference counts and prefix caching by chained block hashes.

    request.all_token_ids:  [ t0 .. t15 | t16 .. t31 | t32 .. t37 ]
    block_size = 16           block A      block B      block C (partial, never shared)
    hash(A) = H(None, t0..t15);  hash(B) = H(hash(A), t16..t31);  H = hash_block_tokens

A full block is registered under its chained hash; a later request with the same prefix
finds it, after checking the block's parent hash and tokens, so that a collision costs a
miss and never serves another prefix's KV. A freed block keeps its hash and stays
findable at the tail of the free queue until it is reused (LRU). With `tiers` (engine.kv_tiers)
a hashed block about to be reused is first written down to host RAM (and from there to
disk), and a lookup that misses the pool goes on there, loading the blocks it finds into
free pool blocks.
"""
from __future__ import annotations

import functools
import hashlib
import struct
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from engine.request import Request

if TYPE_CHECKING:  # the block manager hands the tiers block ids; it never loads torch
    from engine.kv_tiers import KVTiers

_ROOT_PARENT = bytes(32)  # stands for the missing parent of a prompt's first block


def hash_block_tokens(parent_hash: bytes | None, token_ids: Sequence[int]) -> bytes:
    """The prefix-cache key of a full block: SHA-256 over its parent block's hash (None
    for a prompt's first block) and its token ids, so it names the whole prefix.

    Collision-resistant, so that no client can craft tokens whose block lands on the key
    of another client's cached KV. The same bytes in every process, Python version and
    host (no PYTHONHASHSEED, a fixed byte order), so that a tier outside this process
    can key blocks by it. The parent takes a fixed 32 bytes and each token a
    little-endian int32: every vocabulary fits in one, it hashes half the bytes of
    int64, and packing raises on an id that does not fit rather than wrapping it, so two
    different (parent, chunk) pairs never hash the same bytes.
    """
    packed = _int32_packer(len(token_ids)).pack(*token_ids)
    return hashlib.sha256((parent_hash or _ROOT_PARENT) + packed).digest()


@functools.cache
def _int32_packer(num_tokens: int) -> struct.Struct:
    return struct.Struct(f"<{num_tokens}i")


@dataclass(eq=False, slots=True)
class Block:
    block_id: int
    ref_count: int = 0
    block_hash: bytes | None = None
    parent_hash: bytes | None = None
    token_ids: tuple[int, ...] | None = None

    def holds(self, parent_hash: bytes | None, token_ids: tuple[int, ...]) -> bool:
        """Whether this block's KV is that of `token_ids` after the prefix `parent_hash`
        names: a hit is checked, not trusted, in case two keys collide."""
        return self.token_ids == token_ids and self.parent_hash == parent_hash


@dataclass(slots=True)
class PrefixHit:
    """A prefix lookup's result: the pool blocks of the cached prefix, how many of them
    it loaded from a tier, and whether a tier holds the next block past its load limit."""

    block_ids: list[int]
    num_loaded: int = 0
    more_in_tiers: bool = False


class BlockManager:
    """Hands out KV blocks to requests; the free queue is an OrderedDict (O(1) removal)."""

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True,
                 tiers: KVTiers | None = None):
        self.block_size = block_size
        self.tiers = tiers if enable_prefix_caching else None
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free_queue: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self.hash_to_block: dict[bytes, int] = {}
        self.cache_queries = 0  # prompt tokens looked up in the prefix cache, once a request
        self.cache_hits = 0  # of those, tokens found
        self.fork_shared_tokens = 0  # prompt tokens samples took from their parent's blocks

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_queue)

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    # -- prefix cache ---------------------------------------------------------------
    def find_cached_prefix(self, request: Request) -> list[int]:
        """Block ids of the longest cached prefix of the request's full blocks, loading
        from the tiers as much as it takes (`lookup_prefix` without a load limit)."""
        return self.lookup_prefix(request).block_ids

    def lookup_prefix(self, request: Request, max_loads: int | None = None) -> PrefixHit:
        """The longest cached prefix of the request's full blocks.

        The last token is never taken from the cache: its logits must be computed. Past
        the pool's last hit the lookup goes on in the tiers below; what they hold is
        loaded into free pool blocks and registered, as if it had never left, at most
        `max_loads` blocks (None: no limit). Blocks loaded before the limit stop the
        lookup stay free and findable in the pool, so the next lookup of the same
        prefix finds them there and loads on from where this one stopped.
        """
        if not self.enable_prefix_caching:
            return PrefixHit([])
        tokens = request.all_token_ids
        return self._lookup(tokens, (len(tokens) - 1) // self.block_size, max_loads)

    def _lookup(self, tokens: Sequence[int], max_blocks: int,
                max_loads: int | None = None) -> PrefixHit:
        hit = PrefixHit([])
        for block_hash, parent_hash, chunk in self._chain(tokens, max_blocks):
            block_id = self.hash_to_block.get(block_hash)
            if block_id is None:
                if hit.num_loaded == max_loads:
                    hit.more_in_tiers = self.tiers is not None and block_hash in self.tiers
                    break
                block_id = self._load_from_tiers(block_hash, parent_hash, chunk,
                                                 hit.block_ids)
                hit.num_loaded += block_id is not None
            if block_id is None or not self.blocks[block_id].holds(parent_hash, chunk):
                break
            hit.block_ids.append(block_id)
        return hit

    def _chain(self, tokens: Sequence[int], max_blocks: int):
        """(block hash, parent hash, token chunk) of the first `max_blocks` full blocks."""
        parent_hash = None
        for index in range(min(max_blocks, len(tokens) // self.block_size)):
            chunk = tuple(tokens[index * self.block_size:(index + 1) * self.block_size])
            block_hash = hash_block_tokens(parent_hash, chunk)
            yield block_hash, parent_hash, chunk
            parent_hash = block_hash

    # -- a sequence's blocks in the tiers (a session's parking, resume and deletion) ---
    def park(self, tokens: Sequence[int], retain_s: float | None = None) -> int:
        """Write the pool's full blocks of `tokens` down to the tiers now (through to disk
        where there is one), so they outlive their pool blocks and this process; the
        pool keeps them too. `retain_s`: the disk tier keeps them (KVTiers.park).
        Returns the number of blocks written."""
        if self.tiers is None:
            return 0
        parked = 0
        for block_hash, parent_hash, chunk in self._chain(tokens, len(tokens)):
            block_id = self.hash_to_block.get(block_hash)
            if block_id is not None and self.blocks[block_id].holds(parent_hash, chunk):
                self.tiers.park(block_hash, parent_hash, chunk, block_id, retain_s)
                parked += 1
        return parked

    def prefetch(self, tokens: Sequence[int]) -> int:
        """Load the tiers' blocks of `tokens` into free pool blocks ahead of a request
        that will ask for them; returns how many of its leading blocks the pool holds."""
        if self.tiers is None:
            return 0
        return len(self._lookup(tokens, len(tokens) // self.block_size).block_ids)

    def forget(self, tokens: Sequence[int], keep_tokens: int = 0) -> int:
        """Delete the tiers' copies of the blocks of `tokens`, but for the blocks within
        its first `keep_tokens` (a prefix others share); returns how many there were."""
        if self.tiers is None:
            return 0
        chain = list(self._chain(tokens, len(tokens)))[keep_tokens // self.block_size:]
        return sum(self.tiers.forget(block_hash) for block_hash, _, _ in chain)

    def _load_from_tiers(self, block_hash: bytes, parent_hash: bytes | None,
                         chunk: tuple[int, ...], found: list[int]) -> int | None:
        """Load the block from a lower tier into the least recently used free pool block
        that is not one of `found` (those move to the queue's far end first); None on a
        miss, or when every free block is one of `found`."""
        if self.tiers is None:
            return None
        found_free = [b for b in found if self.blocks[b].ref_count == 0]
        if len(self.free_queue) <= len(found_free):
            return None
        tiered = self.tiers.fetch(block_hash, parent_hash, chunk)
        if tiered is None:
            return None
        for block_id in found_free:
            self.free_queue.move_to_end(block_id)
        block_id, _ = self.free_queue.popitem(last=False)
        block = self.blocks[block_id]
        self._evict(block)
        self.tiers.load(block_id, tiered)
        block.block_hash, block.parent_hash, block.token_ids = block_hash, parent_hash, chunk
        self.hash_to_block[block_hash] = block_id
        self.free_queue[block_id] = None  # free and findable, as a pool hit would be
        return block_id

    def cache_full_blocks(self, request: Request) -> None:
        """Register the request's newly filled blocks so later requests can share them."""
        if not self.enable_prefix_caching:
            return
        num_full = request.num_computed_tokens // self.block_size
        tokens = request.all_token_ids
        for index in range(len(request.block_hashes), num_full):
            chunk = tuple(tokens[index * self.block_size:(index + 1) * self.block_size])
            parent_hash = request.block_hashes[-1] if request.block_hashes else None
            block_hash = hash_block_tokens(parent_hash, chunk)
            request.block_hashes.append(block_hash)
            block = self.blocks[request.block_ids[index]]
            if block.block_hash is None and block_hash not in self.hash_to_block:
                block.block_hash, block.parent_hash = block_hash, parent_hash
                block.token_ids = chunk
                self.hash_to_block[block_hash] = block.block_id

    # -- allocation -----------------------------------------------------------------
    def can_allocate(self, request: Request, num_new_tokens: int,
                     cached_block_ids: list[int] = ()) -> bool:
        needed = self.blocks_needed(request.num_computed_tokens + num_new_tokens)
        have = len(request.block_ids) + len(cached_block_ids)
        reusable_free = sum(1 for b in cached_block_ids if self.blocks[b].ref_count == 0)
        return max(0, needed - have) + reusable_free <= self.num_free_blocks

    def allocate(self, request: Request, num_new_tokens: int,
                 cached_block_ids: list[int] = ()) -> bool:
        """Give the request blocks for its computed + new tokens; False if they don't fit."""
        if not self.can_allocate(request, num_new_tokens, cached_block_ids):
            return False
        if not request.block_ids and request.num_preemptions == 0:
            self._count_lookup(request, len(cached_block_ids))
        for block_id in cached_block_ids:
            self._take(self.blocks[block_id])
            request.block_ids.append(block_id)
        needed = self.blocks_needed(request.num_computed_tokens + num_new_tokens)
        while len(request.block_ids) < needed:
            block_id, _ = self.free_queue.popitem(last=False)
            self._evict(self.blocks[block_id])
            self.blocks[block_id].ref_count = 1
            request.block_ids.append(block_id)
        return True

    def trim(self, request: Request, num_tokens: int) -> None:
        """Free the request's blocks past those `num_tokens` need: a speculative step's
        rejected tokens may have reached into blocks that nothing now holds. Those blocks
        were never registered in the prefix cache (their tokens were not computed)."""
        keep = self.blocks_needed(num_tokens)
        self._release(request.block_ids[keep:])
        del request.block_ids[keep:]

    def fork(self, parent: Request, child: Request) -> None:
        """Give `child` (the same prompt) a reference on each of the parent's full blocks
        of that prompt; the prompt's last token stays to compute, as on a cache hit.

            parent.block_ids: [ A | B | C (partial, parent's own) ]
            child.block_ids:  [ A | B ]   ref_count(A) = ref_count(B) = 2
        """
        num_shared = (child.num_prompt_tokens - 1) // self.block_size
        child.block_ids = list(parent.block_ids[:num_shared])
        child.block_hashes = list(parent.block_hashes[:num_shared])
        for block_id in child.block_ids:
            self._take(self.blocks[block_id])
        child.num_computed_tokens = num_shared * self.block_size
        self.fork_shared_tokens += child.num_computed_tokens

    def free(self, request: Request) -> None:
        """Drop the request's references; tail blocks go to the free queue first (evicted first)."""
        self._release(request.block_ids)
        request.block_ids = []
        request.block_hashes = []

    def _release(self, block_ids: list[int]) -> None:
        """Drop one reference on each block, last first: a block nothing holds joins the
        free queue, tail blocks first (evicted first)."""
        for block_id in reversed(block_ids):
            block = self.blocks[block_id]
            block.ref_count -= 1
            if block.ref_count == 0:
                self.free_queue[block_id] = None

    def _count_lookup(self, request: Request, num_cached_blocks: int) -> None:
        """Book a request's prefix-cache lookup at its first admission only: a lookup
        that found no room, or one after a preemption, is a retry of the same query."""
        if self.enable_prefix_caching:
            self.cache_queries += request.num_prompt_tokens
            self.cache_hits += num_cached_blocks * self.block_size

    def _take(self, block: Block) -> None:
        if block.ref_count == 0:
            del self.free_queue[block.block_id]
        block.ref_count += 1

    def _evict(self, block: Block) -> None:
        """Forget a block's hash as it is reused; the tiers keep its KV first."""
        if block.block_hash is not None:
            if self.tiers is not None:
                self.tiers.store(block.block_hash, block.parent_hash, block.token_ids,
                                 block.block_id)
            if self.hash_to_block.get(block.block_hash) == block.block_id:
                del self.hash_to_block[block.block_hash]
            block.block_hash, block.parent_hash, block.token_ids = None, None, None
