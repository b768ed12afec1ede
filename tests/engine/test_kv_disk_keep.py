"""Kept blocks in the disk tier (a request's prompt_cache_key or prompt_cache_retention):
the age sweep leaves a 24h block for 24 h where it drops an ordinary one, across restarts
(its file's mtime carries the retention), and the byte bound drops ordinary blocks first.
Time passing is simulated by moving every file's mtime back, as a restart's scan reads it."""
import os
import time

import torch

from engine.kv_disk_tier import DiskTier
from engine.kv_host_tier import TieredBlock

SHAPE = (4, 4, 1, 2)
HOUR = 3600.0
DAY = 24 * HOUR


def tier(directory, capacity=1 << 20, max_age_s=HOUR) -> DiskTier:
    return DiskTier(str(directory), capacity, bytes(32), SHAPE, torch.float32, 4, max_age_s)


def block(value: float) -> TieredBlock:
    return TieredBlock(None, (1, 2, 3, 4), torch.full(SHAPE, float(value)))


def held(disk: DiskTier) -> set[bytes]:
    return {bytes.fromhex(p.name)[:1] for p in disk.dir.iterdir()}


def time_passes(disk: DiskTier, seconds: float) -> None:
    for path in disk.dir.iterdir():
        mtime = path.stat().st_mtime - seconds
        os.utime(path, (mtime, mtime))


def test_a_24h_block_outlives_the_age_sweep_that_drops_an_ordinary_one(tmp_path):
    disk = tier(tmp_path)
    disk.put(b"a" * 32, block(1))
    disk.put(b"k" * 32, block(2), retain_s=DAY)
    disk.flush()
    disk.close()
    time_passes(disk, 2 * HOUR)  # past the one-hour age limit
    disk = tier(tmp_path)
    assert held(disk) == {b"k"}
    assert disk.get(b"k" * 32).payload.equal(block(2).payload)
    disk.close()
    time_passes(disk, 20 * HOUR)  # 22 h in all: still within its retention
    disk = tier(tmp_path)
    assert held(disk) == {b"k"}
    disk.close()
    time_passes(disk, 4 * HOUR)  # 26 h: retention and one age limit since its last use over
    disk = tier(tmp_path)
    assert held(disk) == set()
    disk.close()


def test_retaining_a_block_already_written_keeps_it(tmp_path):
    disk = tier(tmp_path)
    disk.put(b"k" * 32, block(1))
    disk.flush()
    disk.put(b"k" * 32, block(1), retain_s=DAY)  # a later request asks 24h for it
    disk.close()
    time_passes(disk, 2 * HOUR)
    disk = tier(tmp_path)
    assert held(disk) == {b"k"}
    disk.close()


def test_the_byte_bound_drops_ordinary_blocks_before_kept_ones(tmp_path):
    probe = tier(tmp_path / "probe")
    probe.put(b"x" * 32, block(0))
    probe.flush()
    file_bytes = probe.stats.bytes
    probe.close()
    disk = tier(tmp_path, capacity=3 * file_bytes)
    disk.put(b"k" * 32, block(1), retain_s=0.0)  # a prompt_cache_key: kept, no extra age
    for name in b"abcd":
        disk.put(bytes([name]) * 32, block(name))
        disk.flush()
    assert held(disk) == {b"k", b"c", b"d"}
    assert disk.stats.bytes <= 3 * file_bytes
    disk.close()


def test_the_next_write_sweeps_an_expired_ordinary_block_but_not_a_kept_one(tmp_path):
    disk = tier(tmp_path, max_age_s=1.0)
    disk.put(b"a" * 32, block(1))
    disk.put(b"k" * 32, block(2), retain_s=60.0)
    disk.flush()
    time.sleep(1.2)
    disk.put(b"b" * 32, block(3))
    disk.flush()
    assert held(disk) == {b"k", b"b"}
    disk.close()
