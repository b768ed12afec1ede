"""KV tiers under the prefix cache (engine.kv_tiers) on the default model: a prompt evicted
from a small pool comes back from host RAM or from disk (after a restart), with the same
greedy output; broken files and another model's files are misses; tiers stay in bounds."""
import shutil

import pytest
import torch

from engine import LLM
from engine.block_manager import BlockManager, hash_block_tokens
from engine.config import EngineConfig
from engine.errors import ConfigError
from engine.kv_disk_tier import DiskTier
from engine.kv_host_tier import TieredBlock
from engine.kv_tiers import KVTiers
from engine.request import Request
from engine.sampling_params import SamplingParams
from tests.engine.conftest import assert_all_blocks_free

BLOCK = 16
POOL_BLOCKS = 16  # 256 tokens: the long prompt plus one filler overflow it
LONG_TOKENS = 160  # 10 blocks; 9 can come from the cache (the last token is computed)
CACHEABLE = (LONG_TOKENS - 1) // BLOCK * BLOCK
FILLER_TOKENS = 130
NUM_FILLERS = 4  # 520 tokens: the pool over twice
GREEDY = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
STORY = ("The lighthouse keeper of {} wrote in her log every night: the weather, the ships "
         "that passed, the birds that rested on the rail, and the letters she never sent. ")


@pytest.fixture(scope="module")
def prompts():
    tokenizer = LLM(model="dummy:tiny", device="cpu", num_kv_blocks=8,
                    attention_backend="torch").tokenizer  # the default model's tokenizer

    def prompt(place: str, num_tokens: int) -> list[int]:
        ids = tokenizer.encode(" ".join(STORY.format(f"{place} {i}") for i in range(40)))
        return ids[:num_tokens]

    long = prompt("Ardnamurchan", LONG_TOKENS)
    fillers = [prompt(p, FILLER_TOKENS) for p in ("Fastnet", "Eddystone", "Bell Rock",
                                                  "Skerryvore")[:NUM_FILLERS]]
    return long, fillers


def engine(**tiers) -> LLM:
    return LLM(model="default", device="cpu", num_kv_blocks=POOL_BLOCKS, block_size=BLOCK,
               max_num_batched_tokens=512, **tiers)


def block_hashes(tokens: list[int]) -> list[bytes]:
    hashes, parent = [], None
    for start in range(0, len(tokens) - BLOCK + 1, BLOCK):
        parent = hash_block_tokens(parent, tokens[start:start + BLOCK])
        hashes.append(parent)
    return hashes


def evict_then_rerun(llm: LLM, long: list[int], fillers: list[list[int]]):
    """The long prompt, the fillers (one at a time, each evicting what came before), the
    long prompt again: (first output, second output)."""
    first = llm.generate([long], GREEDY)[0]
    for filler in fillers:
        llm.generate([filler], GREEDY)
    assert block_hashes(long)[0] not in llm.core.blocks.hash_to_block  # left the pool
    return first, llm.generate([long], GREEDY)[0]


def block_file(directory, block_hash: bytes):
    """The file of one block under a disk tier's root (in its fingerprint's folder)."""
    (path,) = directory.glob(f"*/{block_hash.hex()}")
    return path


def test_host_tier_serves_an_evicted_prefix_with_the_same_output(prompts):
    long, fillers = prompts
    llm = engine(kv_host_bytes=64 << 20)
    first, again = evict_then_rerun(llm, long, fillers)
    assert first.num_cached_tokens == 0
    assert again.num_cached_tokens == CACHEABLE
    assert again.token_ids == first.token_ids
    host = llm.core.stats().kv_tiers["host"]
    assert host.hits == CACHEABLE and host.loads == CACHEABLE // BLOCK
    assert host.stores > 0 and 0 < host.bytes <= host.capacity
    assert llm.core.stats().prefix_cache_hits == CACHEABLE
    assert_all_blocks_free(llm.core)


@pytest.fixture(scope="module")
def untiered():
    return engine()


def test_without_tiers_the_evicted_prefix_is_prefilled_again(prompts, untiered):
    long, fillers = prompts
    llm = untiered
    first, again = evict_then_rerun(llm, long, fillers)
    assert again.num_cached_tokens == 0 and again.token_ids == first.token_ids
    assert llm.core.stats().kv_tiers == {}


@pytest.fixture(scope="module")
def disk_written(prompts, tmp_path_factory):
    """An engine with only the disk tier ran the long prompt and the fillers, then stopped:
    (its directory, the long prompt's first output)."""
    long, fillers = prompts
    directory = tmp_path_factory.mktemp("kv")
    llm = engine(kv_disk_dir=str(directory))
    first, again = evict_then_rerun(llm, long, fillers)
    assert again.num_cached_tokens == CACHEABLE  # from disk, within the same engine
    llm.core.kv_tiers.close()
    return directory, first


@pytest.fixture
def disk_run(disk_written, tmp_path):
    """A copy of `disk_written`'s directory (files and mtimes) for one test to change."""
    directory, first = disk_written
    shutil.copytree(directory, tmp_path / "kv")
    return tmp_path / "kv", first


def test_disk_tier_serves_the_prefix_after_a_restart(prompts, disk_run):
    long, _ = prompts
    directory, first = disk_run
    llm = engine(kv_disk_dir=str(directory))
    again = llm.generate([long], GREEDY)[0]
    assert again.num_cached_tokens == CACHEABLE
    assert again.token_ids == first.token_ids
    disk = llm.core.stats().kv_tiers["disk"]
    assert disk.hits == CACHEABLE and disk.corrupt == 0
    llm.core.kv_tiers.close()


def test_a_broken_block_file_is_a_miss_and_is_deleted(prompts, disk_run):
    long, _ = prompts
    directory, first = disk_run
    hashes = block_hashes(long)
    for index, break_file in ((6, truncate), (3, flip_a_payload_bit)):
        path = block_file(directory, hashes[index])
        break_file(path)
        llm = engine(kv_disk_dir=str(directory))
        again = llm.generate([long], GREEDY)[0]
        assert again.num_cached_tokens == index * BLOCK  # up to the broken block
        assert again.token_ids == first.token_ids
        assert not path.exists() and llm.core.stats().kv_tiers["disk"].corrupt == 1
        llm.core.kv_tiers.close()


def truncate(path):
    path.write_bytes(path.read_bytes()[:-1000])


def flip_a_payload_bit(path):
    data = bytearray(path.read_bytes())
    data[-100] ^= 0x01
    path.write_bytes(bytes(data))


def test_another_fingerprint_never_reuses_a_block(prompts, disk_run):
    long, _ = prompts
    directory, first = disk_run
    first_file = block_file(directory, block_hashes(long)[0])
    # the default model keeps its own GGUF quantization, so only the fingerprint differs
    llm = engine(kv_disk_dir=str(directory), quantization="int8")
    again = llm.generate([long], GREEDY)[0]
    assert again.num_cached_tokens == 0 and again.token_ids == first.token_ids
    # its blocks live in a folder of their own: the other settings' blocks are kept
    assert llm.core.kv_tiers.disk.dir != first_file.parent and first_file.exists()
    llm.core.kv_tiers.close()


def test_tiers_stay_within_their_bounds_dropping_the_oldest(prompts, untiered, tmp_path):
    long, fillers = prompts
    block_bytes = untiered.core.runner.kv_bytes_per_block(untiered.model_config)
    host_bytes, disk_bytes = 5 * block_bytes, 12 * (block_bytes + 2048)
    llm = engine(kv_host_bytes=host_bytes, kv_disk_dir=str(tmp_path), kv_disk_bytes=disk_bytes)
    for prompt in [long, *fillers]:
        llm.generate([prompt], GREEDY)
    tiers = llm.core.kv_tiers
    tiers.disk.flush()
    host, disk = tiers.stats()["host"], tiers.stats()["disk"]
    assert 0 < host.bytes <= host_bytes and host.dropped > 0
    assert sum(p.stat().st_size for p in tiers.disk.dir.iterdir()) == disk.bytes <= disk_bytes
    assert disk.dropped > 0
    # a finished request's blocks are reused tail first: the order they were evicted in
    evicted = [h for prompt in [long, *fillers] for h in reversed(block_hashes(prompt))
               if h not in llm.core.blocks.hash_to_block]
    on_disk = [(tiers.disk.dir / h.hex()).exists() for h in evicted]
    in_host = [h in tiers.host for h in evicted]
    assert in_host == [False] * (len(evicted) - 5) + [True] * 5  # the newest 5
    kept = [d or h for d, h in zip(on_disk, in_host)]
    assert kept == sorted(kept) and kept.count(False) > 0  # the oldest dropped, only they
    tiers.close()


def test_a_load_never_reuses_a_block_the_same_lookup_found():
    """Pool [p0 | q2 q1 q0] free, p1 and p2 in host RAM: loading p1 must take q2, not p0
    (the least recently used, but part of the prefix being loaded)."""
    kv_caches = [(torch.zeros(4, 4, 1, 2), torch.zeros(4, 4, 1, 2)) for _ in range(2)]
    bm = BlockManager(num_blocks=4, block_size=4, tiers=KVTiers(kv_caches, 1 << 20))
    p = run_blocks(bm, kv_caches, Request("p", list(range(13)), SamplingParams()))
    run_blocks(bm, kv_caches, Request("q", list(range(100, 109)), SamplingParams()))
    again = Request("p2", list(range(13)), SamplingParams())
    found = bm.find_cached_prefix(again)
    assert found[0] == p[0] and len(set(found)) == 3
    for block_id, tag in zip(found, p):  # each pool block holds what was computed there
        assert all(t[block_id].eq(tag).all() for pair in kv_caches for t in pair)
    bm.allocate(again, 1, found)
    bm.free(again)
    assert bm.num_free_blocks == 4


def run_blocks(bm, kv_caches, request) -> list[int]:
    """Allocate, "compute" (each block's KV = its block id), cache, free; the block ids."""
    bm.allocate(request, request.num_tokens)
    for block_id in request.block_ids:
        for pair in kv_caches:
            for t in pair:
                t[block_id].fill_(block_id)
    request.num_computed_tokens = request.num_tokens
    bm.cache_full_blocks(request)
    block_ids = list(request.block_ids)
    bm.free(request)
    return block_ids


def test_a_well_formed_file_of_the_wrong_shape_or_garbage_is_a_miss(tmp_path):
    """Files another writer put under a block's name (a shared directory) never raise."""
    shape = (4, 4, 1, 2)
    disk = DiskTier(str(tmp_path), 1 << 20, bytes(32), shape, torch.float32, 4)
    good = TieredBlock(None, (1, 2, 3, 4), torch.ones(shape))
    disk.put(b"a" * 32, good)
    disk.put(b"b" * 32, TieredBlock(None, (1, 2, 3, 4), torch.ones(2, 4, 1, 2)))
    disk.put(b"c" * 32, TieredBlock(None, (1, 2, 3), torch.ones(shape)))
    disk.flush()
    (disk.dir / (b"d" * 32).hex()).write_bytes(b"garbage")
    stranger = DiskTier(str(tmp_path), 1 << 20, b"x" * 32, shape, torch.float32, 4)
    stranger.put(b"e" * 32, good)  # another fingerprint's block, copied under ours
    stranger.flush()
    shutil.copy(stranger.dir / (b"e" * 32).hex(), disk.dir)
    stranger.close()
    disk = DiskTier(str(tmp_path), 1 << 20, bytes(32), shape, torch.float32, 4)  # restart
    assert disk.get(b"a" * 32).payload.equal(good.payload)
    assert [disk.get(h * 32) for h in (b"b", b"c", b"d", b"e")] == [None] * 4
    assert disk.stats.corrupt == 4 and [p.name for p in disk.dir.iterdir()] == [(b"a" * 32).hex()]
    disk.close()


@pytest.mark.parametrize("field, value", [("kv_host_bytes", -1), ("kv_disk_bytes", 0),
                                          ("kv_disk_queue_blocks", 0), ("kv_disk_dir", " "),
                                          ("kv_tier_load_cost", -0.5),
                                          ("kv_tier_load_cost", 2.0)])
def test_bad_tier_settings_are_refused_by_name(field, value):
    with pytest.raises(ConfigError, match=field):
        EngineConfig(**{field: value})
