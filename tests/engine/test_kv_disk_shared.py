"""A disk tier directory shared by replicas (--kv-disk-dir on a shared volume): a replica
reads the block files another one wrote after it started (a session that failed over),
indexes them within its own byte bound, and takes a file deleted under it, or a crashed
writer's temporary file, as a miss, never as a corrupt block."""
import time

import torch

from engine.kv_disk_tier import DiskTier
from engine.kv_host_tier import TieredBlock

SHAPE = (4, 4, 1, 2)


def replica(directory, capacity: int = 1 << 20) -> DiskTier:
    return DiskTier(str(directory), capacity, bytes(32), SHAPE, torch.float32, 4)


def block(value: float) -> TieredBlock:
    return TieredBlock(None, (1, 2, 3, 4), torch.full(SHAPE, float(value)))


def written(disk: DiskTier, name: bytes, value: float) -> None:
    disk.put(name * 32, block(value))
    disk.flush()


def test_a_replica_reads_the_blocks_another_wrote_after_it_started(tmp_path):
    a, b = replica(tmp_path), replica(tmp_path)  # both up before the session's blocks
    assert b.get(b"x" * 32) is None
    written(a, b"x", 7)
    assert b.get(b"x" * 32).payload.equal(block(7).payload)
    assert b"x" * 32 in b and b.stats.bytes == a.stats.bytes > 0
    assert b.stats.corrupt == 0
    a.close()
    b.close()


def test_a_file_deleted_by_another_replica_is_a_plain_miss(tmp_path):
    a, b = replica(tmp_path), replica(tmp_path)
    written(a, b"x", 1)
    assert b.get(b"x" * 32) is not None
    a.discard(b"x" * 32)  # a session deleted on the other replica
    assert b.get(b"x" * 32) is None
    assert b.stats.bytes == 0 and b.stats.corrupt == 0
    a.close()
    b.close()


def test_a_crashed_writers_temporary_file_is_never_read(tmp_path):
    a, b = replica(tmp_path), replica(tmp_path)
    written(a, b"x", 1)
    path = a.dir / (b"x" * 32).hex()
    temp = a.dir / f".{path.name}.999.1.tmp"  # a kill -9 between write and rename
    path.rename(temp)
    temp.write_bytes(temp.read_bytes()[:100])
    assert b.get(b"x" * 32) is None and b.stats.corrupt == 0
    a.close()
    b.close()


def test_read_files_count_against_the_readers_bound(tmp_path):
    a = replica(tmp_path)
    written(a, b"x", 1)
    b = replica(tmp_path, capacity=a.stats.bytes)  # room for one block: x, found at start
    written(a, b"y", 2)
    assert b.get(b"y" * 32) is not None  # indexed now; x, used least recently, goes
    assert {p.name for p in b.dir.iterdir()} == {(b"y" * 32).hex()}
    assert b.stats.bytes == a.stats.bytes // 2 and b.stats.dropped == 1
    a.close()
    b.close()


def test_a_block_its_writer_kept_stays_kept_on_the_replica_that_reads_it(tmp_path):
    """A 24h block (prompt_cache_retention) written by one replica is read by another
    kept as its writer kept it (its file's mtime in the future), not as an ordinary block
    its byte bound drops first or its age sweep deletes after the max age."""
    hour = 3600.0
    a = DiskTier(str(tmp_path), 1 << 20, bytes(32), SHAPE, torch.float32, 4, hour)
    b = DiskTier(str(tmp_path), 1 << 20, bytes(32), SHAPE, torch.float32, 4, hour)
    a.put(b"k" * 32, block(1), retain_s=24 * hour)
    written(a, b"o", 2)  # an ordinary block beside it
    assert b.get(b"k" * 32) is not None and b.get(b"o" * 32) is not None
    assert b"k" * 32 in b.kept and b"o" * 32 in b.index
    assert b.kept[b"k" * 32][1] > time.time() + 23 * hour
    a.close()
    b.close()
