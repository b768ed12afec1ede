"""Tier 2 of the KV store: one file per block in a directory, LRU by mtime within a byte bound.

    <dir>/<block hash hex>:  header | token ids (int32 LE) | payload (the KV's raw bytes)
    header = magic, model fingerprint (32), parent hash (32), payload SHA-256 (32),
             num_tokens, payload bytes

A file is written to a temporary name and renamed, so a crash mid-write leaves no file
under a block's name. A read checks the fingerprint (the model, its quantization, the KV
dtype and every shape), the parent hash and tokens, and the payload's checksum: a file
that fails (truncated, altered, another model's) is deleted and is a miss. Writes run on
one writer thread behind a bounded queue; a block waiting there is already findable.
With a max age, a file unused for longer is deleted (on the next write, and on a restart's
scan): the serve command sets it to the session TTL, so an expired session's blocks go
with it while blocks other sessions still use (a shared system prompt) stay.
Replicas may share the directory (a session that fails over finds the blocks the dead
replica wrote): a read also tries a file this process never indexed, and indexes it. Each
process bounds the files it wrote or read, so N replicas keep at most N bounds' worth.

A block written with a retention (a request's prompt_cache_key or prompt_cache_retention)
is *kept*: the byte bound drops every other block before it, and the age sweep leaves it
for `retain_s` (and never before the max age after its last use). Its file's mtime is
`keep_until - max_age`, in the future while the retention outlasts the max age, so a
restart's scan finds it kept again:

    ordinary: index  hash -> (bytes, last used)   LRU first: the byte bound's first victims
    kept:     kept   hash -> (bytes, keep until)  earliest first: dropped after `keep until`
"""
from __future__ import annotations

import hashlib
import logging
import math
import os
import queue
import struct
import threading
import time
from collections import OrderedDict
from pathlib import Path

import torch

from engine.kv_host_tier import TieredBlock
from engine.outputs import TierStats

log = logging.getLogger(__name__)

_MAGIC = b"TWKV\x00\x01\x00\x00"
_HEADER = struct.Struct("<8s32s32s32sII")
_NO_PARENT = bytes(32)
_STALE_TEMP_S = 600.0  # a temporary file this old is a crashed write's leftover


class DiskTier:
    """Blocks as files under `directory`, in a folder of their own fingerprint (so models
    or settings sharing one directory never evict or delete each other's blocks), never
    over `capacity` bytes in all for this fingerprint, none unused for over `max_age_s`
    seconds (None: no age limit)."""

    def __init__(self, directory: str, capacity: int, fingerprint: bytes,
                 payload_shape: tuple[int, ...], dtype: torch.dtype, queue_blocks: int,
                 max_age_s: float | None = None):
        self.dir = Path(directory) / fingerprint.hex()[:32]
        self.dir.mkdir(parents=True, exist_ok=True)
        self.capacity = capacity
        self.max_age_s = max_age_s
        self.fingerprint = fingerprint
        self.payload_shape = payload_shape
        self.dtype = dtype
        # payload_shape: [2 * num_layers, block_size, kv_heads, head_dim]
        self.payload_bytes = math.prod(payload_shape) * dtype.itemsize
        self.stats = TierStats(capacity=capacity)
        self.lock = threading.Lock()  # the index, pending and stats: writer vs. step thread
        # hash -> (file bytes, last used: wall-clock seconds, as the files' mtime), LRU first
        self.index: OrderedDict[bytes, tuple[int, float]] = OrderedDict()
        # kept blocks: hash -> (file bytes, wall-clock seconds until which age keeps it)
        self.kept: OrderedDict[bytes, tuple[int, float]] = OrderedDict()
        self._scan()
        self.stats.bytes = sum(size for size, _ in (*self.index.values(),
                                                    *self.kept.values()))
        self._drop_expired()  # blocks that outlived the age limit while the server was down
        self._drop_oldest(capacity)  # a directory filled under a larger bound
        self.pending: dict[bytes, TieredBlock] = {}
        self.pending_keep: dict[bytes, float] = {}  # queued blocks' keep-until
        self.queue: queue.Queue[tuple[bytes, TieredBlock] | None] = queue.Queue(queue_blocks)
        self.writer = threading.Thread(target=self._write_loop, name="kv-disk-writer",
                                       daemon=True)
        self.writer.start()

    # -- the step thread ------------------------------------------------------------
    def __contains__(self, block_hash: bytes) -> bool:
        with self.lock:
            return self._holds(block_hash)

    def put(self, block_hash: bytes, block: TieredBlock, retain_s: float | None = None
            ) -> None:
        """Queue `block` to be written; dropped (counted) when the queue is full.
        `retain_s`: keep it (see the module docstring), written already or not."""
        with self.lock:
            if not self._holds(block_hash):
                try:
                    self.queue.put_nowait((block_hash, block))
                except queue.Full:
                    self.stats.dropped += 1
                    return
                self.pending[block_hash] = block
            if retain_s is None:
                return
            stamp = self._keep(block_hash, time.time() + max(retain_s, self.max_age_s or 0))
        if stamp is not None:
            self._stamp(block_hash, stamp)

    def get(self, block_hash: bytes) -> TieredBlock | None:
        """The block if it is pending or on disk and passes every check, else None.
        A file this process never indexed is read too: another replica sharing the
        directory wrote it (a session that failed over), and it joins the index."""
        with self.lock:
            block = self.pending.get(block_hash)
            if block is not None:
                return block
            known = self._holds(block_hash)
            stamp = self._used(block_hash) if known else 0.0
        path = self._path(block_hash)
        try:
            data = path.read_bytes()
            if known:
                os.utime(path, (stamp, stamp))
            else:
                mtime = os.stat(path).st_mtime  # another writer's: kept, if in the future
        except OSError:
            if known:  # deleted under us: by another replica's bound, or by hand
                self._forget(block_hash, corrupt=False)
            return None
        block = self._decode(data)
        if block is None:
            log.warning("KV block file %s failed its check; deleted", path.name)
            self._forget(block_hash, corrupt=True)
        elif not known:
            self._adopt(block_hash, len(data), mtime)
        return block

    def discard(self, block_hash: bytes) -> bool:
        """Delete the block's file (a queued write of it is skipped); whether it was held."""
        with self.lock:
            held = self.pending.pop(block_hash, None) is not None or self._holds(block_hash)
        self._forget(block_hash, corrupt=False)
        return held

    def flush(self) -> None:
        """Wait until every queued block is written."""
        self.queue.join()

    def close(self) -> None:
        self.flush()
        self.queue.put(None)
        self.writer.join()

    def _holds(self, block_hash: bytes) -> bool:
        return block_hash in self.index or block_hash in self.kept or block_hash in self.pending

    def _keep(self, block_hash: bytes, keep_until: float) -> float | None:
        """Keep a block until `keep_until` at least (a queued one once written); the
        mtime its file is to get, None while it is queued."""
        held = self.index.pop(block_hash, None) or self.kept.get(block_hash)
        if held is None:  # queued: the writer keeps it
            self.pending_keep[block_hash] = max(keep_until,
                                                self.pending_keep.get(block_hash, 0.0))
            return None
        return self._kept(block_hash, held[0], keep_until)

    def _kept(self, block_hash: bytes, size: int, keep_until: float) -> float:
        """Enter a block among the kept ones; returns its file's mtime (see the docstring)."""
        old = self.kept.pop(block_hash, (0, 0.0))[1]
        self.kept[block_hash] = (size, max(keep_until, old))
        if self.max_age_s is None:  # no age sweep: the file's mtime is its last use
            return time.time()
        return max(keep_until, old) - self.max_age_s

    def _used(self, block_hash: bytes) -> float:
        """Mark a block used now (an ordinary one most recent; a kept one kept at least
        the max age from now); returns the mtime its file is to get."""
        now = time.time()
        if block_hash in self.kept:
            return self._kept(block_hash, self.kept[block_hash][0], now + (self.max_age_s or 0))
        self.index[block_hash] = (self.index[block_hash][0], now)
        self.index.move_to_end(block_hash)
        return now

    # -- the writer thread ----------------------------------------------------------
    def _write_loop(self) -> None:
        while (item := self.queue.get()) is not None:
            try:
                self._write(*item)
            except OSError:
                log.exception("writing a KV block file failed")
            finally:
                with self.lock:
                    self.pending.pop(item[0], None)
                    self.pending_keep.pop(item[0], None)  # not written: nothing to keep
                self.queue.task_done()
        self.queue.task_done()

    def _write(self, block_hash: bytes, block: TieredBlock) -> None:
        with self.lock:
            if block_hash not in self.pending:  # discarded while queued
                return
        started = time.perf_counter()
        data = self._encode(block)
        if len(data) > self.capacity:
            return
        with self.lock:
            self._drop_expired()
            self._drop_oldest(self.capacity - len(data))
        temp = self.dir / f".{block_hash.hex()}.{os.getpid()}.{threading.get_ident()}.tmp"
        temp.write_bytes(data)
        os.replace(temp, self._path(block_hash))
        with self.lock:
            keep_until = self.pending_keep.pop(block_hash, None)
            stamp = None
            if keep_until is None:
                self.index[block_hash] = (len(data), time.time())
            else:
                stamp = self._kept(block_hash, len(data), keep_until)
            self.stats.bytes += len(data)
            self.stats.stores += 1
            self.stats.store_seconds += time.perf_counter() - started
        if stamp is not None:
            self._stamp(block_hash, stamp)

    def _stamp(self, block_hash: bytes, mtime: float) -> None:
        try:
            os.utime(self._path(block_hash), (mtime, mtime))
        except FileNotFoundError:  # dropped meanwhile by the bound
            pass

    def _drop_oldest(self, room: int) -> None:
        """Delete the least recently used files until the tier holds at most `room` bytes:
        ordinary blocks first, then the kept ones that expire first."""
        while self.stats.bytes > room and (self.index or self.kept):
            self._drop_first(self.index or self.kept)

    def _drop_expired(self) -> None:
        """Delete the files unused for longer than max_age_s, and the kept ones past their
        keep-until (each table's oldest first, so this stops at the first young one and
        costs only what it deletes)."""
        if self.max_age_s is None:
            return
        now = time.time()
        for table, cutoff in ((self.index, now - self.max_age_s), (self.kept, now)):
            while table and next(iter(table.values()))[1] < cutoff:
                self._drop_first(table)

    def _drop_first(self, table: OrderedDict[bytes, tuple[int, float]]) -> None:
        old_hash, (size, _) = table.popitem(last=False)
        self.stats.bytes -= size
        self.stats.dropped += 1
        self._path(old_hash).unlink(missing_ok=True)

    # -- files ----------------------------------------------------------------------
    def _encode(self, block: TieredBlock) -> bytes:
        payload = block.payload.contiguous().view(torch.uint8).numpy().tobytes()
        tokens = struct.pack(f"<{len(block.token_ids)}i", *block.token_ids)
        header = _HEADER.pack(_MAGIC, self.fingerprint, block.parent_hash or _NO_PARENT,
                              hashlib.sha256(payload).digest(), len(block.token_ids),
                              len(payload))
        return header + tokens + payload

    def _decode(self, data: bytes) -> TieredBlock | None:
        if len(data) < _HEADER.size:
            return None
        magic, fingerprint, parent, checksum, num_tokens, num_bytes = \
            _HEADER.unpack_from(data)
        body = _HEADER.size + 4 * num_tokens
        if (magic != _MAGIC or fingerprint != self.fingerprint
                or num_tokens != self.payload_shape[1] or num_bytes != self.payload_bytes
                or len(data) != body + num_bytes):
            return None
        payload = data[body:]
        if hashlib.sha256(payload).digest() != checksum:
            return None
        tokens = struct.unpack_from(f"<{num_tokens}i", data, _HEADER.size)
        tensor = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
        tensor = tensor.view(self.dtype).reshape(self.payload_shape)
        return TieredBlock(None if parent == _NO_PARENT else parent, tokens, tensor)

    def _adopt(self, block_hash: bytes, size: int, mtime: float) -> None:
        """Index another writer's file within this process's byte bound: kept as its
        writer kept it (an mtime in the future, as a restart's scan reads it), else as
        used now."""
        with self.lock:
            if self._holds(block_hash):  # adopted by a concurrent read
                return
            if mtime > time.time() and self.max_age_s is not None:
                self.kept[block_hash] = (size, mtime + self.max_age_s)
            else:
                self.index[block_hash] = (size, time.time())
                os.utime(self._path(block_hash))
            self.stats.bytes += size
            self._drop_oldest(self.capacity)

    def _forget(self, block_hash: bytes, corrupt: bool) -> None:
        with self.lock:
            self.pending_keep.pop(block_hash, None)
            held = self.index.pop(block_hash, None) or self.kept.pop(block_hash, None)
            if held is not None:
                self.stats.bytes -= held[0]
            self.stats.corrupt += corrupt
        self._path(block_hash).unlink(missing_ok=True)

    def _path(self, block_hash: bytes) -> Path:
        return self.dir / block_hash.hex()

    def _scan(self) -> None:
        """Index the block files already there (a restart), oldest first (a file whose
        mtime is in the future is a kept one); stale temp files go."""
        found = []
        for entry in os.scandir(self.dir):
            stat = entry.stat()
            if entry.name.endswith(".tmp") and time.time() - stat.st_mtime > _STALE_TEMP_S:
                os.unlink(entry.path)
            elif len(entry.name) == 64 and not entry.name.startswith("."):
                try:
                    found.append((stat.st_mtime, bytes.fromhex(entry.name), stat.st_size))
                except ValueError:
                    continue
        now = time.time()
        for mtime, block_hash, size in sorted(found):
            if mtime > now and self.max_age_s is not None:
                self.kept[block_hash] = (size, mtime + self.max_age_s)
            else:
                self.index[block_hash] = (size, mtime)
