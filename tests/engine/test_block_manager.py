"""BlockManager and StepScheduler unit tests: no model, just block bookkeeping."""
import hashlib
import struct

from engine.block_manager import BlockManager, hash_block_tokens
from engine.outputs import SampledToken
from engine.request import Request
from engine.sampling_params import SamplingParams
from engine.step_scheduler import StepScheduler
from tests.engine.conftest import forge_keys


def make(tokens, rid="r"):
    return Request(rid, list(tokens), SamplingParams(max_tokens=4))


def test_prefix_hit_needs_matching_tokens_and_skips_last_token():
    bm = BlockManager(num_blocks=8, block_size=4)
    a = make(range(10))
    assert bm.allocate(a, 10)
    a.num_computed_tokens = 10
    bm.cache_full_blocks(a)  # two full blocks registered
    assert len(a.block_hashes) == 2
    b = make(list(range(8)) + [99, 98])
    assert bm.find_cached_prefix(b) == a.block_ids[:2]
    c = make(range(8))  # exactly two blocks: the last token must be computed
    assert bm.find_cached_prefix(c) == a.block_ids[:1]
    d = make([5] + list(range(1, 10)))
    assert bm.find_cached_prefix(d) == []


def test_freed_blocks_stay_findable_until_reused():
    bm = BlockManager(num_blocks=4, block_size=4)
    a = make(range(9))
    bm.allocate(a, 9)
    a.num_computed_tokens = 9
    bm.cache_full_blocks(a)
    cached = list(a.block_ids[:2])
    bm.free(a)
    assert bm.num_free_blocks == 4
    b = make(range(9), "b")
    assert bm.find_cached_prefix(b) == cached
    # reuse every block: the old hashes must be gone
    c = make(range(100, 116), "c")
    bm.allocate(c, 16)
    assert bm.find_cached_prefix(make(range(9), "e")) == []
    bm.free(c)
    assert bm.num_free_blocks == 4


def test_shared_blocks_are_ref_counted():
    bm = BlockManager(num_blocks=6, block_size=4)
    a = make(range(9), "a")
    bm.allocate(a, 9)
    a.num_computed_tokens = 9
    bm.cache_full_blocks(a)
    b = make(range(9), "b")
    hit = bm.find_cached_prefix(b)
    b.num_computed_tokens = len(hit) * 4
    assert bm.allocate(b, 9 - b.num_computed_tokens, hit)
    assert bm.blocks[hit[0]].ref_count == 2
    bm.free(a)
    assert bm.blocks[hit[0]].ref_count == 1
    bm.free(b)
    assert bm.num_free_blocks == 6


def test_scheduler_preempts_latest_when_blocks_run_out_then_all_free():
    bm = BlockManager(num_blocks=4, block_size=4)
    sched = StepScheduler(bm, max_num_seqs=8, token_budget=64)
    reqs = [make(range(i * 10, i * 10 + 7), f"r{i}") for i in range(2)]
    for r in reqs:
        sched.add(r)
    batch = sched.schedule()
    assert [r.request_id for r in batch.requests] == ["r0", "r1"]
    for r, n in zip(batch.requests, batch.num_new_tokens):
        r.num_computed_tokens += n
        r.all_token_ids.extend([1, 2])  # pretend two tokens were generated
    batch = sched.schedule()  # each needs a third block: only one can continue
    assert [r.request_id for r in batch.preempted] == ["r1"]
    assert reqs[1].num_computed_tokens == 0 and sched.waiting[0] is reqs[1]
    for r in list(sched.running) + list(sched.waiting):
        sched.finish(r, "cancelled")
    assert bm.num_free_blocks == 4


def test_chunked_prefill_respects_token_budget():
    bm = BlockManager(num_blocks=16, block_size=4)
    sched = StepScheduler(bm, max_num_seqs=8, token_budget=5)
    r = make(range(12))
    sched.add(r)
    sizes = []
    while r.num_computed_tokens < r.num_tokens:
        batch = sched.schedule()
        sizes.append(batch.num_new_tokens[0])
        r.num_computed_tokens += batch.num_new_tokens[0]
    assert sizes == [5, 5, 2]


def run_step(sched, bm):
    """Schedule one step and book it as the engine does, two tokens generated per request."""
    batch = sched.schedule()
    for r, n in zip(batch.requests, batch.num_new_tokens):
        r.num_computed_tokens += n
        bm.cache_full_blocks(r)
        r.all_token_ids.extend([1, 2])
    return batch


def test_prefix_cache_counters_book_each_request_once():
    bm = BlockManager(num_blocks=5, block_size=4)
    sched = StepScheduler(bm, max_num_seqs=8, token_budget=64)
    r0, r1 = make(range(7), "r0"), make(range(100, 107), "r1")
    sched.add(r0)
    sched.add(r1)
    run_step(sched, bm)
    assert (bm.cache_queries, bm.cache_hits) == (14, 0)
    assert run_step(sched, bm).preempted == [r1]  # both need a third block
    for _ in range(2):  # r1 finds its own freed block but waits for room, step after step
        assert [r.request_id for r in run_step(sched, bm).requests] == ["r0"]
    sched.finish(r0, "length")
    r2 = make(list(range(4)) + [50, 51, 52], "r2")  # r0's first block
    sched.add(r2)
    run_step(sched, bm)
    assert sched.running == [r1, r2] and r2.num_cached_tokens == 4
    assert (bm.cache_queries, bm.cache_hits) == (14 + 7, 4)
    for r in list(sched.running):
        sched.finish(r, "length")
    assert bm.num_free_blocks == 5


def test_forked_samples_share_the_parents_full_prompt_blocks():
    bm = BlockManager(num_blocks=8, block_size=4, enable_prefix_caching=False)
    sched = StepScheduler(bm, max_num_seqs=4, token_budget=64)
    parent, child = make(range(10), "p"), make(range(10), "c")
    sched.add(parent)
    sched.add(child, parent)  # waits: the parent's prompt is not computed yet
    batch = sched.schedule()
    assert batch.requests == [parent]
    sched.update_from_output(batch, [[SampledToken(7)]])  # the prompt is computed: the child forks
    assert child.block_ids == parent.block_ids[:2] and child.num_computed_tokens == 8
    assert [bm.blocks[b].ref_count for b in parent.block_ids] == [2, 2, 1]
    assert sched.schedule().num_new_tokens == [1, 2]  # parent decodes; child: 2 prompt tokens
    sched.finish(parent, "stop")
    assert bm.num_free_blocks == 8 - 3  # the child's two shared blocks and its own third
    sched.finish(child, "stop")
    assert bm.num_free_blocks == 8


def test_an_aborted_waiting_sample_leaves_no_trace():
    bm = BlockManager(num_blocks=8, block_size=4)
    sched = StepScheduler(bm, max_num_seqs=4, token_budget=64)
    parent, child = make(range(10), "p"), make(range(10), "c")
    sched.add(parent)
    sched.add(child, parent)
    sched.finish(child, "cancelled")
    assert len(sched.forks) == 0
    sched.finish(parent, "cancelled")
    assert not sched.has_work() and bm.num_free_blocks == 8


def test_block_hash_is_sha256_of_the_parent_and_int32_tokens():
    # fixed bytes, not Python's hash(): a tier outside this process can key blocks by it
    first = hash_block_tokens(None, [1, 2, 3, 4])
    assert first == hashlib.sha256(bytes(32) + struct.pack("<4i", 1, 2, 3, 4)).digest()
    second = hash_block_tokens(first, (5, 6, 7, 8))
    assert second == hashlib.sha256(first + struct.pack("<4i", 5, 6, 7, 8)).digest()


def test_a_key_shared_by_two_chunks_is_a_miss(monkeypatch):
    forge_keys(monkeypatch, lambda real, parent, token_ids: real(parent, ()))
    bm = BlockManager(num_blocks=8, block_size=4)
    sched = StepScheduler(bm, max_num_seqs=4, token_budget=64)
    a, b = make(range(9), "a"), make(range(100, 109), "b")
    sched.add(a)
    run_step(sched, bm)  # registers a's two full blocks
    sched.add(b)
    run_step(sched, bm)
    assert b.block_hashes == a.block_hashes[:2]  # the keys collide
    assert b.num_cached_tokens == 0 and bm.cache_hits == 0
    assert not set(a.block_ids) & set(b.block_ids)  # b computes its own KV
    for r in (a, b):
        sched.finish(r, "length")
    assert bm.num_free_blocks == 8


def test_a_key_shared_by_two_prefixes_is_a_miss(monkeypatch):
    # the same chunk [4..7] after two different first blocks gets one key
    forge_keys(monkeypatch, lambda real, parent, token_ids: real(None, token_ids))
    bm = BlockManager(num_blocks=12, block_size=4)
    sched = StepScheduler(bm, max_num_seqs=4, token_budget=64)
    c = make([50, 51, 52, 53, 4, 5, 6, 7, 9], "c")
    a = make([0, 1, 2, 3, 20, 21, 22, 23, 9], "a")
    for r in (c, a):
        sched.add(r)
    run_step(sched, bm)
    b = make([0, 1, 2, 3, 4, 5, 6, 7, 9], "b")
    sched.add(b)
    run_step(sched, bm)
    assert b.block_hashes[1] == c.block_hashes[1]  # the keys collide
    assert b.num_cached_tokens == 4 and b.block_ids[0] == a.block_ids[0]
    assert b.block_ids[1] not in c.block_ids  # b computes its own second block
    for r in (a, b, c):
        sched.finish(r, "length")
    assert bm.num_free_blocks == 12
