"""The disk tier's age limit (kv_disk_max_age_s; `tokenwire serve` sets it to the session
TTL): a block file unused for longer is deleted on the next write and when a restarted
server scans the directory, while a block in use stays however old it was first written."""
import os
import time

import pytest
import torch

from engine.config import EngineConfig
from engine.errors import ConfigError
from engine.kv_disk_tier import DiskTier
from engine.kv_host_tier import TieredBlock

SHAPE = (4, 4, 1, 2)
MAX_AGE_S = 3600.0


def tier(directory, max_age_s=MAX_AGE_S) -> DiskTier:
    return DiskTier(str(directory), 1 << 20, bytes(32), SHAPE, torch.float32, 4, max_age_s)


def block(value: float) -> TieredBlock:
    return TieredBlock(None, (1, 2, 3, 4), torch.full(SHAPE, float(value)))


def written(disk: DiskTier, *names: bytes) -> None:
    for i, name in enumerate(names):
        disk.put(name * 32, block(i))
    disk.flush()


def age(disk: DiskTier, name: bytes, seconds: float) -> None:
    """Make the block's file look last used `seconds` ago (its mtime, as a restart reads)."""
    then = time.time() - seconds
    os.utime(disk.dir / (name * 32).hex(), (then, then))


def names_on_disk(disk: DiskTier) -> set[str]:
    return {p.name for p in disk.dir.iterdir()}


def test_a_restart_deletes_the_files_unused_past_the_age_limit(tmp_path):
    disk = tier(tmp_path)
    written(disk, b"a", b"b", b"c")
    disk.close()
    age(disk, b"a", 2 * MAX_AGE_S)  # its session expired while the server was down
    age(disk, b"b", MAX_AGE_S / 2)
    disk = tier(tmp_path)
    assert names_on_disk(disk) == {(b"b" * 32).hex(), (b"c" * 32).hex()}
    assert disk.get(b"a" * 32) is None
    assert disk.get(b"b" * 32).payload.equal(block(1).payload)
    assert disk.stats.bytes == sum(p.stat().st_size for p in disk.dir.iterdir())
    disk.close()


def test_a_block_in_use_stays_and_the_next_write_drops_the_expired(tmp_path):
    disk = tier(tmp_path, max_age_s=2.0)
    written(disk, b"a", b"b")
    time.sleep(1.2)
    assert disk.get(b"a" * 32) is not None  # a turn reads it: last used now
    time.sleep(1.2)  # b unused for 2.4 s, past the limit; a for 1.2 s
    written(disk, b"c")
    assert names_on_disk(disk) == {(b"a" * 32).hex(), (b"c" * 32).hex()}
    assert disk.stats.dropped == 1
    disk.close()


def test_without_an_age_limit_only_the_byte_bound_drops_files(tmp_path):
    disk = tier(tmp_path, max_age_s=None)
    written(disk, b"a")
    disk.close()
    age(disk, b"a", 365 * 24 * 3600)
    disk = tier(tmp_path, max_age_s=None)
    assert disk.get(b"a" * 32) is not None
    disk.close()


@pytest.mark.parametrize("value", [0, -1.0])
def test_a_non_positive_age_limit_is_refused_by_name(value):
    with pytest.raises(ConfigError, match="kv_disk_max_age_s"):
        EngineConfig(kv_disk_max_age_s=value)
