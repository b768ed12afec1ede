"""StepScheduler.update_from_output: a step's result booked without a model."""
from engine.block_manager import BlockManager
from engine.outputs import SampledToken
from engine.request import Request, RequestStatus
from engine.sampling_params import SamplingParams
from engine.step_scheduler import StepScheduler

EOS = 2


def _scheduler(num_blocks=16, max_model_len=None) -> StepScheduler:
    return StepScheduler(BlockManager(num_blocks, block_size=4), max_num_seqs=8,
                         token_budget=64, eos_token_ids=frozenset({EOS}),
                         max_model_len=max_model_len)


def _tokens(*token_ids: int) -> list[list[SampledToken]]:
    """One sampled token for each request of a step."""
    return [[SampledToken(t)] for t in token_ids]


def _add(sched, rid, prompt_len=6, **params) -> Request:
    request = Request(rid, list(range(10, 10 + prompt_len)), SamplingParams(**params))
    sched.add(request)
    return request


def test_books_computed_tokens_appends_and_caches_full_blocks():
    sched = _scheduler()
    a = _add(sched, "a", max_tokens=4)
    batch = sched.schedule()
    assert batch.num_new_tokens == [6]
    booked = sched.update_from_output(batch, _tokens(7))
    assert booked == [(a, [SampledToken(7)])]
    assert a.num_computed_tokens == 6 and a.all_token_ids[-1] == 7
    assert len(a.block_hashes) == 1  # the one full block of 4 joined the prefix cache
    assert a.status is RequestStatus.RUNNING


def test_a_chunk_without_a_sampled_token_only_advances():
    sched = StepScheduler(BlockManager(16, block_size=4), max_num_seqs=8, token_budget=4)
    a = _add(sched, "a", prompt_len=6)
    batch = sched.schedule()
    assert sched.update_from_output(batch, [[]]) == []
    assert a.num_computed_tokens == 4 and a.num_tokens == 6


def test_stops_finish_and_free_their_requests():
    sched = _scheduler(max_model_len=8)
    eos = _add(sched, "eos")
    ignored = _add(sched, "ignored", ignore_eos=True)
    stop_id = _add(sched, "stop_id", stop_token_ids=[9])
    length = _add(sched, "length", max_tokens=1)
    context = _add(sched, "context", prompt_len=7)
    batch = sched.schedule()
    booked = sched.update_from_output(batch, _tokens(EOS, EOS, 9, 5, 5))
    assert [r.request_id for r, _ in booked] == ["eos", "ignored", "stop_id", "length",
                                                "context"]
    reasons = {r.request_id: r.finish_reason for r in (eos, ignored, stop_id, length, context)}
    assert reasons == {"eos": "stop", "ignored": None, "stop_id": "stop", "length": "length",
                       "context": "length"}
    assert sched.running == [ignored]
    assert all(r.block_ids == [] for r in (eos, stop_id, length, context))
    assert ignored.block_ids


def test_every_block_is_free_once_all_requests_end():
    sched = _scheduler()
    requests = [_add(sched, f"r{i}", max_tokens=3) for i in range(3)]
    while sched.has_work():
        batch = sched.schedule()
        sched.update_from_output(batch, _tokens(*[5] * len(batch.requests)))
    assert all(r.finish_reason == "length" and r.num_output_tokens == 3 for r in requests)
    assert sched.blocks.num_free_blocks == sched.blocks.num_blocks
