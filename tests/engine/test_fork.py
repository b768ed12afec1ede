"""n > 1: the samples of one prompt share its KV blocks; the prompt is prefilled once."""
import random

from engine import SamplingParams
from tests.engine.conftest import assert_all_blocks_free

N = 4


def _run_samples(core, prompt: list[int], seed: int | None, tag: str) -> list[list[int]]:
    ids = [f"{tag}-{i}" for i in range(N)]
    for i, request_id in enumerate(ids):
        params = SamplingParams(max_tokens=12, temperature=1.0, ignore_eos=True,
                                seed=None if seed is None else seed + i)
        core.add_request(request_id, prompt, params, parent_id=ids[0] if i else None)
    tokens = {i: [] for i in ids}
    while core.has_work():
        for out in core.step():
            tokens[out.request_id].extend(out.new_token_ids)
    return [tokens[i] for i in ids]


def _fresh_prompt(seed: int, length: int = 1000) -> list[int]:
    rng = random.Random(seed)  # unseen by the prefix cache of earlier tests
    return [rng.randrange(100, 40000) for _ in range(length)]


def test_n_samples_prefill_the_prompt_once(llm):
    core = llm.core
    before = core.stats()
    samples = _run_samples(core, _fresh_prompt(1), seed=7, tag="fork-a")
    after = core.stats()
    block = core.config.block_size
    shared = (1000 - 1) // block * block  # the full blocks; the last token is computed
    assert after.fork_shared_tokens - before.fork_shared_tokens == (N - 1) * shared
    assert after.prefill_tokens - before.prefill_tokens == 1000 + (N - 1) * (1000 - shared)
    assert after.prefix_cache_hits == before.prefix_cache_hits  # shared by fork, not cache
    assert len({tuple(s) for s in samples}) == N  # each sample its own seed stream
    assert all(len(s) == 12 for s in samples)
    assert_all_blocks_free(core)


def test_same_seed_same_samples(llm):
    prompt = _fresh_prompt(2)
    first = _run_samples(llm.core, prompt, seed=11, tag="fork-b")
    again = _run_samples(llm.core, prompt, seed=11, tag="fork-c")
    assert first == again
    assert_all_blocks_free(llm.core)


def test_a_parent_that_ends_early_hands_its_samples_on(llm):
    core = llm.core
    prompt = _fresh_prompt(3, length=300)
    params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    core.add_request("orphan-0", prompt, params)
    core.add_request("orphan-1", prompt, params, parent_id="orphan-0")
    core.add_request("orphan-2", prompt, params, parent_id="orphan-0")
    core.abort_request("orphan-0")  # before its prompt was computed
    finished = {}
    while core.has_work():
        for out in core.step():
            finished.setdefault(out.request_id, []).extend(out.new_token_ids)
    assert len(finished["orphan-1"]) == 4 and finished["orphan-1"] == finished["orphan-2"]
    assert_all_blocks_free(core)
