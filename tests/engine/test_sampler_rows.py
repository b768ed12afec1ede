"""Top-k and top-p in a mixed batch: each row keeps exactly its own allowed set, and only
the rows that filter pay for a top-k or a sort (observed with torch's profiler, which
records every aten op the filters run and the shape it ran on)."""
import torch
from torch.profiler import ProfilerActivity, profile

from engine import SamplingParams
from engine.sampler import TOP_P_CANDIDATES, filtered_probs

VOCAB = 5000  # wider than the top-p candidates


def peaked_logits(rows: int) -> torch.Tensor:
    return torch.randn(rows, VOCAB, generator=torch.Generator().manual_seed(0)) * 3


def reference(logits: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    """One row's filters the plain way: whole-vocabulary sorts."""
    logits = logits / (p.temperature or 1.0)
    if 0 < p.top_k < logits.numel():
        kth = logits.sort(descending=True).values[p.top_k - 1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if p.top_p < 1.0:
        values, order = probs.sort(descending=True)
        keep = (values.cumsum(0) - values) < p.top_p
        probs = torch.zeros_like(probs).scatter_(0, order, values * keep)
    if p.min_p > 0.0:
        probs = probs.masked_fill(probs < p.min_p * probs.max(), 0.0)
    return probs / probs.sum()


def selection_ops(logits: torch.Tensor, params: list[SamplingParams]) -> list[tuple]:
    """(op, rows it ran on, k) for every sort and top-k that filtered_probs runs."""
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        filtered_probs(logits, params)
    return [(e.name, e.input_shapes[0][0], e.concrete_inputs[1] if e.name == "aten::topk"
             else None) for e in prof.events() if e.name in ("aten::sort", "aten::topk")]


MIXED = [SamplingParams(temperature=0.8), SamplingParams(top_p=0.5),
         SamplingParams(top_k=5), SamplingParams(top_k=40, top_p=0.8),
         SamplingParams(temperature=0.5, top_p=0.999999),  # a nucleus wider than candidates
         SamplingParams(min_p=0.2), SamplingParams(top_k=VOCAB + 1, top_p=1.0)]


def test_mixed_batch_keeps_each_rows_allowed_set():
    logits = peaked_logits(len(MIXED))
    got = filtered_probs(logits, MIXED)
    for row, p in enumerate(MIXED):
        want = reference(logits[row], p)
        assert torch.equal(got[row] > 0, want > 0), f"row {row} ({p})"
        assert torch.allclose(got[row], want, atol=1e-6), f"row {row} ({p})"
    assert (got[2] > 0).sum() == 5 and (got[4] > 0).sum() > TOP_P_CANDIDATES[-1]
    assert (got[0] > 0).all() and (got[6] > 0).all()


def test_only_rows_that_filter_are_selected_or_sorted():
    params = [SamplingParams(temperature=0.8), SamplingParams(top_p=0.5),
              SamplingParams(top_k=5), SamplingParams(top_p=1.0)]
    ops = selection_ops(peaked_logits(4), params)
    assert sorted(ops) == [("aten::topk", 1, 5), ("aten::topk", 1, TOP_P_CANDIDATES[0])]


def test_only_a_wide_nucleus_row_pays_the_full_sort():
    params = [SamplingParams(top_p=0.5), SamplingParams(temperature=0.5, top_p=0.999999),
              SamplingParams(temperature=0.8), SamplingParams(top_p=0.6)]
    ops = selection_ops(peaked_logits(4), params)
    assert sorted(ops) == [("aten::sort", 1, None), ("aten::topk", 1, TOP_P_CANDIDATES[1]),
                           ("aten::topk", 3, TOP_P_CANDIDATES[0])]


def test_only_nuclei_wider_than_the_first_candidates_pay_the_second():
    """0.97 nucleus of row 0: 355 tokens, 0.5 of row 1: 16, 0.9 of row 2: 327. Rows 0 and 2
    go on from the 256 most likely to the 1024, and each row keeps exactly the plain way's
    set."""
    params = [SamplingParams(top_p=0.97), SamplingParams(top_p=0.5), SamplingParams(top_p=0.9)]
    logits = peaked_logits(3)
    assert sorted(selection_ops(logits, params)) == [("aten::topk", 2, TOP_P_CANDIDATES[1]),
                                                     ("aten::topk", 3, TOP_P_CANDIDATES[0])]
    got = filtered_probs(logits, params)
    for row, p in enumerate(params):
        assert torch.allclose(got[row], reference(logits[row], p), atol=1e-6), f"row {row}"
    assert [int((row > 0).sum()) for row in got] == [355, 16, 327]


def test_unfiltered_batch_selects_nothing():
    params = [SamplingParams(temperature=0.8), SamplingParams(top_p=1.0, top_k=0)]
    assert selection_ops(peaked_logits(2), params) == []
