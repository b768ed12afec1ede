"""Speculative decoding (engine.speculative): the n-gram proposer, booking with rollback,
and exactness on the default model (greedy) and in distribution (sampled)."""
import random

import pytest
import torch
from logprob_tolerance import logprob_tolerance
from test_hf_parity import PROMPTS as PARITY_PROMPTS

from engine import LLM, SamplingParams
from engine.block_manager import BlockManager
from engine.config import EngineConfig
from engine.core import proposer_for
from engine.errors import ConfigError
from engine.outputs import SampledToken
from engine.request import Request
from engine.sampler import Sampler
from engine.speculative import NgramProposer
from engine.speculative.ngram import RecentTokens, find_continuation
from engine.speculative.verify import sample_verified
from engine.step_scheduler import StepScheduler
from loadtest.copy_dataset import copy_prompts
from loadtest.logprob_error import first_difference

TEXT = ("The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor "
        "jugs. How vexingly quick daft zebras jump!")
COPY_PROMPTS = [
    f"Repeat this text exactly: {TEXT}",
    "Copy this list, one item per line: apples, pears, plums, cherries, apricots, figs.",
    "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef mul(a, b):\n",
]


def longest_match_by_every_n(tokens, k, min_n, max_n):
    """find_continuation's contract, spelled out: each n from max_n down, each earlier
    position from the latest back."""
    for n in range(min(max_n, len(tokens) - 1), min_n - 1, -1):
        for end in range(len(tokens) - 1, n - 1, -1):  # the occurrence ends before the last
            if tokens[end - n:end] == tokens[-n:]:
                return tokens[end:end + k]
    return []


def test_the_binary_search_finds_what_trying_every_n_finds():
    """Over many short sequences of a few ids (repeats of every length), with the n range
    cut anywhere: the same continuation as the plain search over every n and position."""
    rng = random.Random(0)
    hits = 0
    for _ in range(3000):
        tokens = [rng.randrange(3) for _ in range(rng.randrange(1, 40))]
        min_n = rng.randrange(1, 6)
        max_n = rng.randrange(min_n, 20)
        expected = longest_match_by_every_n(tokens, 4, min_n, max_n)
        assert find_continuation(tokens, 4, min_n, max_n) == expected, (tokens, min_n, max_n)
        hits += bool(expected)
    assert 1000 < hits < 2900  # both hits and misses were checked


def test_the_longest_recent_match_gives_the_continuation():
    assert find_continuation([1, 2, 3, 9, 8, 7, 5, 1, 2, 3], 3, 1, 3) == [9, 8, 7]
    assert find_continuation([4, 1, 2, 6, 3, 2, 7, 1, 2], 2, 1, 3) == [6, 3]  # n=2 beats n=1
    assert find_continuation([5, 2, 8, 2, 9, 2], 2, 1, 3) == [9, 2]  # the latest occurrence
    assert find_continuation([1, 2, 3, 4], 2, 1, 3) == []
    assert find_continuation([256, 1, 2, 1], 2, 1, 3) == [2, 1]  # word-aligned matches only
    assert find_continuation([1, 2, 3, 1, 2, 3], 2, 3, 2) == []  # no n in [3, 2]


def test_the_engine_proposes_only_from_its_shortest_ngram_on():
    """speculative_ngram_min: a suffix met before only as 2 tokens is chance, not a quote."""
    tokens = [7, 8, 1, 2, 9, 9, 5, 1, 2]  # [1, 2] met before, [5, 1, 2] never
    request = Request("r", tokens, SamplingParams())
    cautious = proposer_for(EngineConfig(speculative="ngram"))  # the default: 3 to 16 tokens
    assert (cautious.min_n, cautious.max_n) == (3, 16)
    assert cautious.propose(request, 4) == []
    eager = proposer_for(EngineConfig(speculative="ngram", speculative_ngram_min=2))
    assert eager.propose(request, 4) == [9, 9, 5]  # k: num_speculative_tokens, 3
    with pytest.raises(ConfigError, match="speculative_ngram_max"):
        EngineConfig(speculative_ngram_min=4, speculative_ngram_max=3)


def finished(request_id: str, prompt: list[int], output: list[int]) -> Request:
    request = Request(request_id, prompt, SamplingParams())
    request.all_token_ids += output
    return request


def test_a_finished_requests_output_is_proposed_to_a_request_that_quotes_it():
    """An agent quoting another session's tool result: its own tokens hold no earlier
    occurrence of its suffix, the first request's output does."""
    proposer = NgramProposer(4, history_tokens=1000)
    quoting = Request("b", [50, 51, 20, 21], SamplingParams())
    assert proposer.propose(quoting, 10) == []
    proposer.forget(finished("a", [1, 2], [20, 21, 22, 23, 24, 25, 26]))
    assert proposer.propose(quoting, 10) == [22, 23, 24, 25]
    assert NgramProposer(4, history_tokens=0).history is None  # off


def test_history_is_bounded_drops_the_oldest_and_never_runs_past_an_outputs_end():
    history = RecentTokens(8)
    history.add([1, 2, 3, 4])
    history.add([5, 6])
    assert history.continuation([2], 4, 1, 3) == [3, 4]  # stops at the separator before 5
    history.add([7, 8, 9])
    assert len(history) == 8  # separators count: -1 5 6 -1 7 8 9 and one of the first
    assert history.continuation([2], 4, 1, 3) == []  # 1, 2, 3 are gone
    assert history.continuation([6, 7], 2, 1, 3) == [8, 9]  # n=1 ([7]): 6, 7 never met
    history.add(list(range(100, 120)))  # one output longer than the whole history
    assert len(history) == 8 and history.continuation([113], 9, 1, 3) == [114, 115, 116, 117,
                                                                           118, 119]


def test_k_follows_the_average_accepted_and_a_failing_request_rests_longer_each_time():
    proposer = NgramProposer(4, first_rest=2)  # n-grams of 1 to 3 tokens
    request = Request("r", [1, 2, 3, 4, 5, 6, 7, 8, 9, 3], SamplingParams())  # [3] only
    assert proposer.propose(request, 10) == [4, 5, 6, 7]  # a fresh start: the full k
    proposer.record(request, 4, 4)
    proposer.record(request, 4, 1)  # one accepted, but 2.5 a verification of late
    assert len(proposer.propose(request, 10)) == 3  # one more than the average
    proposer.record(request, 3, 0)
    assert len(proposer.propose(request, 10)) == 3
    proposer.record(request, 3, 0)  # accepting too little on average: two steps of rest
    assert [len(proposer.propose(request, 10)) for _ in range(3)] == [0, 0, 4]
    proposer.record(request, 4, 0)
    assert len(proposer.propose(request, 10)) == 2
    proposer.record(request, 2, 0)  # failing again from a fresh start: twice the rest
    assert [len(proposer.propose(request, 10)) for _ in range(5)] == [0, 0, 0, 0, 4]
    proposer.forget(request)
    assert not proposer._state  # bounded: nothing kept for ended requests


def test_a_longer_match_ends_a_rest():
    """While a request rests, a match of min_n tokens proposes nothing, and one of more
    (a quote resumed) proposes at once and ends the rest."""
    proposer = NgramProposer(3, first_rest=4, min_n=2, max_n=8)
    weak = Request("r", [1, 2, 3, 4, 5, 6, 7, 8, 9, 2, 3], SamplingParams())  # [2, 3] only
    assert proposer.propose(weak, 10) == [4, 5, 6]
    proposer.record(weak, 3, 0)
    proposer.record(weak, 3, 0)  # a rest of 4 steps
    assert [proposer.propose(weak, 10) for _ in range(2)] == [[], []]
    resumed = Request("r", [1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2, 3], SamplingParams())
    assert proposer.propose(resumed, 10) == [4, 5, 6]  # [1, 2, 3]: 3 tokens
    assert proposer.propose(weak, 10) == [4, 5, 6]  # the rest is over
    proposer.record(weak, 3, 0)
    proposer.record(weak, 3, 0)  # rests again (8 steps); the longer match comes last
    assert [len(proposer.propose(weak, 10)) for _ in range(8)] == [0] * 8
    assert proposer.propose(weak, 10) == [4, 5, 6]
    never = NgramProposer(3, first_rest=4, min_n=3, max_n=3)  # no longer match looked for
    quoted = Request("q", [5, 1, 2, 3, 4, 8, 5, 1, 2, 3, 4], SamplingParams())  # 5 match
    assert never.propose(quoted, 10) == [8, 5, 1]
    never.record(quoted, 3, 0)
    never.record(quoted, 3, 0)
    assert [never.propose(quoted, 10) for _ in range(4)] == [[]] * 4


def test_rejected_tokens_roll_back_and_no_block_leaks():
    blocks = BlockManager(num_blocks=12, block_size=4)
    sched = StepScheduler(blocks, max_num_seqs=4, token_budget=64,
                          proposer=NgramProposer(4))
    request = Request("r", [1, 2, 3, 4, 5, 6, 1, 2], SamplingParams(max_tokens=20))
    sched.add(request)
    sched.update_from_output(sched.schedule(), [[SampledToken(3)]])
    batch = sched.schedule()  # ... 1 2 3 -> proposes 4 5 6 1 after the real 3
    assert request.spec_token_ids == [4, 5, 6, 1] and batch.num_new_tokens == [5]
    assert len(request.block_ids) == 4  # room for 13 tokens
    booked = sched.update_from_output(batch, [[SampledToken(4), SampledToken(9)]])
    assert booked == [(request, [SampledToken(4), SampledToken(9)])]
    assert request.all_token_ids[-3:] == [3, 4, 9] and request.spec_token_ids == []
    assert request.num_computed_tokens == request.num_tokens - 1  # 9 computes next
    assert len(request.block_ids) == 3  # the block only rejected 6 1 reached is freed
    assert (sched.num_spec_proposed, sched.num_spec_accepted, sched.num_spec_drafts) == (4, 1, 1)
    sched.finish(request, "stop")
    assert blocks.num_free_blocks == blocks.num_blocks


def test_proposals_stop_at_max_tokens():
    sched = StepScheduler(BlockManager(12, block_size=4), max_num_seqs=4, token_budget=64,
                          proposer=NgramProposer(4))
    request = Request("r", [1, 2, 3, 4, 5, 6, 7, 1, 2], SamplingParams(max_tokens=3))
    sched.add(request)
    sched.update_from_output(sched.schedule(), [[SampledToken(3)]])
    assert sched.schedule().num_new_tokens == [2]  # one proposed: 3 tokens in all


def test_proposals_fill_only_the_rows_the_decoding_requests_leave():
    sched = StepScheduler(BlockManager(64, block_size=4), max_num_seqs=8, token_budget=64,
                          proposer=NgramProposer(4), spec_max_rows=6)

    def decode_step(num_requests: int) -> list[int]:
        for i in range(num_requests):
            sched.add(Request(f"r{num_requests}-{i}", [1, 2, 3, 4, 5, 6, 1, 2],
                              SamplingParams(max_tokens=20)))
        prefill = sched.schedule()
        sched.update_from_output(prefill, [[SampledToken(3)]] * num_requests)
        num_new = sched.schedule().num_new_tokens
        for request in list(sched.running):
            sched.finish(request, "stop")
        return num_new

    assert decode_step(1) == [5]  # 1 row + 4 proposed, under 6 rows
    assert decode_step(3) == [4, 1, 1]  # 3 rows leave 3 for proposals, first come first
    assert decode_step(6) == [1] * 6  # a full batch: no proposals


@pytest.fixture(scope="module")
def spec_llm():
    """The default model with n-gram speculation, otherwise as the shared `llm`; no row
    limit, so every request of a batch verifies proposals (exactness, not the back-off)."""
    return LLM(model="default", device="cpu", max_num_batched_tokens=512,
               speculative="ngram", num_speculative_tokens=4, speculative_max_rows=None)


def chat(llm, prompts):
    return [llm.core.encode_chat([{"role": "user", "content": p}]) for p in prompts]


def test_greedy_output_is_unchanged(llm, spec_llm):
    prompts = chat(llm, COPY_PROMPTS) + [llm.core.encode(p) for p in PARITY_PROMPTS]
    params = SamplingParams(max_tokens=32, temperature=0.0)
    before = spec_llm.core.stats()
    want = llm.generate(prompts, params)
    got = spec_llm.generate(prompts, params)
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    assert [o.finish_reason for o in got] == [o.finish_reason for o in want]
    stats = spec_llm.core.stats()
    accepted = stats.spec_accepted_tokens - before.spec_accepted_tokens
    assert accepted > 32, "the copy prompts should accept many proposed tokens"
    assert stats.num_free_blocks == stats.num_total_blocks


def test_greedy_on_32_copy_heavy_prompts_parts_only_at_ties(llm, spec_llm):
    """The load tester's copy-heavy dataset, 32 prompts batched: a verification computes its
    rows in the int8 dots' tiles where a plain step computes one row alone, so the logits
    may round apart; greedy output may then part from plain decoding only where its two
    likeliest tokens lie within that rounding of each other (as test_hf_parity allows)."""
    texts = [p.text for p in copy_prompts(32, 128, 32, 0.0, random.Random(0), llm.tokenizer)]
    prompts = chat(llm, texts)
    before = spec_llm.core.stats()
    want = llm.generate(prompts, SamplingParams(max_tokens=32, temperature=0.0, logprobs=2))
    got = spec_llm.generate(prompts, SamplingParams(max_tokens=32, temperature=0.0))
    tie = 2 * logprob_tolerance().each
    parted = []
    for ours, plain in zip(got, want):
        at = first_difference(ours.token_ids, plain.token_ids)
        if at is None:
            continue
        parted.append(at)
        (_, first), (_, second) = plain.logprobs[at].top[:2]
        assert first - second <= tie, f"parted at token {at}, not at a tie"
    assert len(parted) <= 2, parted
    stats = spec_llm.core.stats()
    assert stats.spec_accepted_tokens - before.spec_accepted_tokens > 100
    assert stats.num_free_blocks == stats.num_total_blocks


def test_stop_strings_logprobs_and_max_tokens_stay_exact(llm, spec_llm):
    prompt = chat(llm, COPY_PROMPTS[:1])
    for params in (SamplingParams(max_tokens=30, temperature=0.0, stop=["lazy"], logprobs=2),
                   SamplingParams(max_tokens=7, temperature=0.0, logprobs=0)):
        want, got = llm.generate(prompt, params)[0], spec_llm.generate(prompt, params)[0]
        assert (got.text, got.token_ids, got.finish_reason) == \
            (want.text, want.token_ids, want.finish_reason)
        assert [lp.token_id for lp in got.logprobs] == got.token_ids
        torch.testing.assert_close([lp.logprob for lp in got.logprobs],
                                   [lp.logprob for lp in want.logprobs], atol=1e-3, rtol=0)


def test_seeded_sampling_is_reproducible_and_as_without_speculation(llm, spec_llm):
    """Each token takes one draw of the request's generator either way (engine.speculative
    .verify), so a seeded request draws the same noise for the same position."""
    prompt = chat(spec_llm, COPY_PROMPTS[:1])
    params = SamplingParams(max_tokens=40, temperature=0.7, seed=1234)
    before = spec_llm.core.stats().spec_accepted_tokens
    first, second = (spec_llm.generate(prompt, params)[0].token_ids for _ in range(2))
    assert spec_llm.core.stats().spec_accepted_tokens > before
    assert first == second == llm.generate(prompt, params)[0].token_ids


def chi_square(counts: torch.Tensor, probs: torch.Tensor) -> float:
    expected = probs * counts.sum()
    return float(((counts - expected) ** 2 / expected).sum())


CHI2_5_DOF_P001 = 20.52  # the chi-square statistic over 6 cells exceeds it with p = 0.001


def test_verification_keeps_the_sampled_distribution():
    """Chi-square over many draws of a small vocabulary: the first token follows p0, and
    after an accepted proposal the second follows p1, as without speculation."""
    torch.manual_seed(0)
    logits = torch.randn(3, 6) * 1.5  # rows: after t, after t d0, after t d0 d1
    draws = 6000
    requests = [Request(f"r{i}", [0], SamplingParams(temperature=1.0, seed=i))
                for i in range(draws)]
    for r in requests:
        r.spec_token_ids = [2, 4]
    samples = sample_verified(Sampler(), logits.repeat(draws, 1), requests)
    p = torch.softmax(logits, dim=-1)
    first = torch.bincount(torch.tensor([s[0].token_id for s in samples]), minlength=6)
    assert chi_square(first, p[0]) < CHI2_5_DOF_P001
    after = [s[1].token_id for s in samples if len(s) > 1]
    assert len(after) == first[2]  # a second token exactly where d0 was drawn
    second = torch.bincount(torch.tensor(after), minlength=6)
    assert chi_square(second, p[1]) < CHI2_5_DOF_P001
