"""Loads from the KV tiers are charged to the step's token budget (StepScheduler with
`tier_load_cost`): a long prefix restored from host RAM loads over several steps while a
decoding request keeps its token every step, and the request then runs with the whole
prefix cached, each pool block holding the KV computed for it."""
import torch

from engine.block_manager import BlockManager, hash_block_tokens
from engine.kv_tiers import KVTiers
from engine.outputs import SampledToken
from engine.request import Request, RequestStatus
from engine.sampling_params import SamplingParams
from engine.step_scheduler import StepScheduler

BLOCK = 4
PROMPT = list(range(1, 34))  # 33 tokens: 8 full blocks come from the cache


def scheduler(token_budget: int, tier_load_cost: float):
    kv_caches = [(torch.zeros(16, BLOCK, 1, 2), torch.zeros(16, BLOCK, 1, 2))
                 for _ in range(2)]
    blocks = BlockManager(16, BLOCK, tiers=KVTiers(kv_caches, 1 << 20))
    sched = StepScheduler(blocks, max_num_seqs=4, token_budget=token_budget,
                          tier_load_cost=tier_load_cost)
    return sched, kv_caches


def compute(sched: StepScheduler, kv_caches, request: Request) -> list[int]:
    """Run `request` to its end in the pool (each block's KV = its block id), so its
    blocks are cached and then free; returns the block ids."""
    sched.blocks.allocate(request, request.num_tokens)
    for block_id in request.block_ids:
        for t in (t for pair in kv_caches for t in pair):
            t[block_id].fill_(block_id)
    request.num_computed_tokens = request.num_tokens
    sched.blocks.cache_full_blocks(request)
    block_ids = list(request.block_ids)
    sched.blocks.free(request)
    return block_ids


def step(sched: StepScheduler) -> dict[str, int]:
    """One step, every request that completes its tokens sampling one; {id: new tokens}."""
    batch = sched.schedule()
    sampled = [[SampledToken(7)] if r.num_computed_tokens + n >= r.num_tokens else []
               for r, n in zip(batch.requests, batch.num_new_tokens)]
    sched.update_from_output(batch, sampled)
    return {r.request_id: n for r, n in zip(batch.requests, batch.num_new_tokens)}


def evicted_prompt(sched, kv_caches) -> list[int]:
    """The prompt computed, then pushed out of the pool into host RAM; its block ids."""
    first = compute(sched, kv_caches, Request("p", PROMPT, SamplingParams()))
    compute(sched, kv_caches, Request("filler", list(range(100, 164)), SamplingParams()))
    assert hash_block_tokens(None, PROMPT[:BLOCK]) not in sched.blocks.hash_to_block
    return first


def test_a_long_restore_loads_over_steps_while_decode_goes_on():
    # budget 8 - 1 decode token = 7; a block costs 4 x 0.5 = 2: 3 blocks a step (6 + 1 left)
    sched, kv_caches = scheduler(token_budget=8, tier_load_cost=0.5)
    first = evicted_prompt(sched, kv_caches)
    decoding = Request("d", [200, 201], SamplingParams(max_tokens=50))
    sched.add(decoding)
    step(sched)
    again = Request("p2", list(PROMPT), SamplingParams(max_tokens=4))
    sched.add(again)
    host = sched.blocks.tiers.host_stats
    assert [step(sched) for _ in range(2)] == [{"d": 1}, {"d": 1}]
    assert host.loads == 6 and again.status is RequestStatus.WAITING
    assert step(sched) == {"d": 1, "p2": 1}  # 2 more blocks (4 tokens), then its last token
    assert host.loads == 8 and again.num_cached_tokens == 8 * BLOCK
    for block_id, computed_in in zip(again.block_ids[:8], first):
        assert all(t[block_id].eq(computed_in).all() for pair in kv_caches for t in pair)


def test_without_a_cost_the_whole_prefix_loads_in_one_lookup():
    sched, kv_caches = scheduler(token_budget=8, tier_load_cost=0.0)
    evicted_prompt(sched, kv_caches)
    again = Request("p2", list(PROMPT), SamplingParams(max_tokens=4))
    sched.add(again)
    assert step(sched) == {"p2": 1}
    assert sched.blocks.tiers.host_stats.loads == 8 and again.num_cached_tokens == 8 * BLOCK
