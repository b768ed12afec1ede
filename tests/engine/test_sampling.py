"""Each sampling parameter changes what comes out; each test fails if it is ignored."""
import torch

from engine import SamplingParams
from engine.request import Request
from engine.sampler import Sampler, apply_penalties, argmax_rows, filtered_probs

PROMPT = "My favourite fruit is"


def gen(llm, n=16, **kw):
    params = SamplingParams(max_tokens=kw.pop("max_tokens", n), **kw)
    return llm.generate([PROMPT], params)[0]


def test_seed_reproducible_and_distinct(llm):
    a = gen(llm, temperature=1.0, seed=7)
    b = gen(llm, temperature=1.0, seed=7)
    c = gen(llm, temperature=1.0, seed=8)
    assert a.token_ids == b.token_ids
    assert a.token_ids != c.token_ids


def test_seeded_requests_are_independent_of_batch(llm):
    alone = gen(llm, temperature=0.9, seed=3)
    batch = llm.generate([PROMPT, "Other prompt here", PROMPT],
                         [SamplingParams(max_tokens=16, temperature=0.9, seed=s) for s in (3, 4, 3)])
    assert batch[0].token_ids == alone.token_ids == batch[2].token_ids


def test_temperature_zero_is_greedy_and_high_temperature_differs(llm):
    greedy = gen(llm, temperature=0.0)
    assert gen(llm, temperature=0.0).token_ids == greedy.token_ids
    hot = [gen(llm, temperature=5.0, seed=s).token_ids for s in range(3)]
    assert any(h != greedy.token_ids for h in hot)


def test_top_k_one_equals_greedy(llm):
    greedy = gen(llm, temperature=0.0)
    assert gen(llm, temperature=5.0, top_k=1, seed=1).token_ids == greedy.token_ids


def test_top_p_and_min_p_filter_the_distribution():
    logits = torch.tensor([3.0, 2.0, 1.0, 0.0, -1.0])
    p = torch.softmax(logits, 0)
    probs = filtered_probs(logits[None], [SamplingParams(top_p=0.7)])[0]
    kept = (probs > 0).nonzero().flatten().tolist()
    assert kept == [0, 1]  # 0.64 < 0.7, so the second token is needed too
    probs = filtered_probs(logits[None], [SamplingParams(min_p=0.3)])[0]
    assert ((probs > 0) == (p >= 0.3 * p.max())).all()
    probs = filtered_probs(logits[None], [SamplingParams(top_k=3)])[0]
    assert (probs > 0).sum() == 3


def test_tiny_top_p_and_high_min_p_make_sampling_greedy(llm):
    greedy = gen(llm, temperature=0.0)
    assert gen(llm, temperature=2.0, top_p=1e-6, seed=5).token_ids == greedy.token_ids
    assert gen(llm, temperature=2.0, min_p=0.999, seed=5).token_ids == greedy.token_ids


def test_penalties_change_logits_and_outputs(llm):
    req = Request("x", [1, 2], SamplingParams(repetition_penalty=2.0))
    req.all_token_ids += [3, 3]
    logits = torch.tensor([1.0, 4.0, -2.0, 6.0, 5.0])
    apply_penalties(logits, req)
    assert logits.tolist() == [1.0, 2.0, -4.0, 3.0, 5.0]
    req = Request("y", [1], SamplingParams(presence_penalty=1.0, frequency_penalty=0.5))
    req.all_token_ids += [3, 3, 4]
    logits = torch.zeros(5)
    apply_penalties(logits, req)
    assert logits.tolist() == [0.0, 0.0, 0.0, -2.0, -1.5]
    base = gen(llm, n=40, temperature=0.0, ignore_eos=True)
    for kw in ({"repetition_penalty": 1.8}, {"presence_penalty": 2.0},
               {"frequency_penalty": 2.0}):
        assert gen(llm, n=40, temperature=0.0, ignore_eos=True, **kw).token_ids != base.token_ids


def test_max_tokens_and_ignore_eos(llm):
    out = gen(llm, n=5, temperature=0.0, ignore_eos=True)
    assert len(out.token_ids) == 5 and out.finish_reason == "length"
    chat = llm.core.encode_chat([{"role": "user", "content": "Say hello."}])
    with_eos = llm.generate([chat], SamplingParams(max_tokens=48, temperature=0.0))[0]
    assert with_eos.token_ids[-1] in llm.core.eos_token_ids
    assert with_eos.finish_reason == "stop"
    ignored = llm.generate([chat], SamplingParams(max_tokens=48, temperature=0.0,
                                                  ignore_eos=True))[0]
    assert len(ignored.token_ids) == 48


def test_stop_token_ids(llm):
    base = gen(llm, temperature=0.0, ignore_eos=True)
    stop_at = base.token_ids[3]
    out = gen(llm, temperature=0.0, ignore_eos=True, stop_token_ids=[stop_at])
    assert out.token_ids == base.token_ids[:base.token_ids.index(stop_at) + 1]
    assert out.finish_reason == "stop"


def test_stop_string_across_tokens_never_leaks(llm):
    base = gen(llm, n=30, temperature=0.0, ignore_eos=True)
    text = base.text
    stop = text[5:12]  # likely spans a token boundary
    out = gen(llm, n=30, temperature=0.0, ignore_eos=True, stop=[stop, "zzzz-never"])
    assert out.finish_reason == "stop"
    assert out.text == text[:text.index(stop)]
    assert stop not in out.text


def test_sampler_greedy_batch_fast_path():
    sampler = Sampler()
    reqs = [Request(f"r{i}", [1], SamplingParams(temperature=0.0)) for i in range(3)]
    logits = torch.randn(3, 50)
    assert sampler.sample(logits, reqs) == (logits.argmax(-1).tolist(), [None] * 3)


def test_batched_filters_match_each_row_alone():
    logits = torch.randn(4, 3000, generator=torch.Generator().manual_seed(0)) * 3
    params = [SamplingParams(top_k=5), SamplingParams(top_p=0.5), SamplingParams(min_p=0.2),
              SamplingParams(temperature=0.5, top_p=0.999999)]  # wider than the candidates
    together = filtered_probs(logits, params)
    for row, p in enumerate(params):
        alone = filtered_probs(logits[row:row + 1], [p])[0]
        assert torch.allclose(together[row], alone)
    assert (together[0] > 0).sum() == 5
    assert (together[3] > 0).sum() > 1024  # fell back to the full sort


def test_exponential_race_draws_follow_the_distribution():
    sampler = Sampler()
    logits = torch.log(torch.tensor([[0.6, 0.3, 0.1]])).repeat(3000, 1)
    reqs = [Request(f"r{i}", [1], SamplingParams(temperature=1.0, seed=i)) for i in range(3000)]
    counts = torch.bincount(torch.tensor(sampler.sample(logits, reqs)[0]), minlength=3) / 3000
    assert torch.allclose(counts, torch.tensor([0.6, 0.3, 0.1]), atol=0.04)


def test_filtered_draws_follow_the_kept_distribution():
    """top_k=2 over [0.5, 0.1, 0.3, 0.1]: 0.5/0.8 and 0.3/0.8, the others never."""
    sampler = Sampler()
    logits = torch.log(torch.tensor([[0.5, 0.1, 0.3, 0.1]])).repeat(4000, 1)
    reqs = [Request(f"r{i}", [1], SamplingParams(top_k=2, seed=i)) for i in range(4000)]
    counts = torch.bincount(torch.tensor(sampler.sample(logits, reqs)[0]), minlength=4) / 4000
    assert counts[1] == 0 and counts[3] == 0
    assert torch.allclose(counts, torch.tensor([0.625, 0.0, 0.375, 0.0]), atol=0.03)


def test_forbidden_tokens_are_never_drawn_over_many_steps():
    """Two allowed tokens of 49152 (a grammar's mask), 400 steps of one seeded request:
    19.7M noise draws, among which numpy's generator for seed 0 gives exact zeros."""
    sampler = Sampler()
    logits = torch.full((1, 49152), float("-inf"))
    logits[0, [7, 40000]] = 0.0
    request = Request("masked", [1], SamplingParams(temperature=1.0, seed=0))
    drawn = {sampler.sample(logits.clone(), [request])[0][0] for _ in range(400)}
    assert drawn == {7, 40000}


def test_argmax_rows_takes_the_first_of_ties_like_torch():
    x = torch.tensor([[1.0, 3.0, 3.0, 2.0], [float("-inf"), -1.0, -1.0, -5.0]])
    assert argmax_rows(x).tolist() == x.argmax(dim=-1).tolist() == [1, 1]
    wide = torch.randn(3, 49152, generator=torch.Generator().manual_seed(1))[:, :40000]
    assert torch.equal(argmax_rows(wide), wide.argmax(dim=-1))  # a strided view


def test_ill_typed_stop_fields_name_the_field():
    import pytest
    from engine.errors import InvalidRequestError

    for kw, field in (({"stop": 5}, "stop"), ({"stop": {"a": 1}}, "stop"),
                      ({"stop_token_ids": 1.5}, "stop_token_ids"),
                      ({"stop_token_ids": "ab"}, "stop_token_ids")):
        with pytest.raises(InvalidRequestError) as err:
            SamplingParams(**kw)
        assert err.value.field == field
    assert SamplingParams(stop="x").stop == ["x"]


def test_noise_split_over_threads_draws_each_rows_own_sequence():
    """7 seeded rows drawn together, their noise split over 2 threads, sample what each
    row sampled alone: a row's draws come from its own generator whichever thread draws."""
    logits = torch.randn(7, 49152, generator=torch.Generator().manual_seed(2)) * 3
    params = [SamplingParams(temperature=1.0, seed=s) for s in (11, 12, 13, 14, 15, 16, 17)]
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        together = Sampler().sample(logits.clone(), [Request(f"r{i}", [1], p)
                                                     for i, p in enumerate(params)])[0]
    finally:
        torch.set_num_threads(threads)
    alone = [Sampler().sample(logits[i:i + 1].clone(), [Request("a", [1], p)])[0][0]
             for i, p in enumerate(params)]
    assert together == alone
