"""Metric math: percentiles, TPOT, ITL, goodput, throughput, per-turn TTFT."""
import math

import numpy as np
import pytest
from hypothesis import given, strategies as st

from loadtest.metrics import (describe, is_good, output_token_series, parse_goodput,
                              peak_concurrency, per_turn, percentile, summarize, tpot)
from loadtest.records import RequestRecord


def make_record(start, ttft, gaps, tokens_per_delta=1, end_after_last=0.0, usage=None,
                turn=None, cached=None):
    """A successful request: first delta at start+ttft, then one delta after each gap."""
    r = RequestRecord(prompt_len=10, turn=turn)
    r.start = start
    t = start + ttft
    r.add_chunk(t, "a", tokens_per_delta)
    for gap in gaps:
        t += gap
        r.add_chunk(t, "b", tokens_per_delta)
    r.usage_completion_tokens = usage
    r.usage_cached_tokens = cached
    r.finish(t + end_after_last, "length")
    return r


@given(st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=1, max_size=50),
       st.floats(0, 100))
def test_percentile_matches_numpy_linear(values, p):
    assert percentile(values, p) == pytest.approx(np.percentile(values, p), rel=1e-9, abs=1e-6)


def test_describe_reports_ms_with_population_std():
    stats = describe([0.1, 0.2, 0.3, 0.4], [50, 90, 99])
    assert stats["mean"] == pytest.approx(250.0)
    assert stats["median"] == pytest.approx(250.0)
    assert stats["std"] == pytest.approx(np.std([100, 200, 300, 400]))
    assert stats["p90"] == pytest.approx(370.0)
    assert describe([], [99]) == {"mean": 0.0, "median": 0.0, "std": 0.0, "p99": 0.0}


def test_tpot_is_decode_time_over_tokens_after_the_first():
    r = make_record(start=10.0, ttft=0.5, gaps=[0.1, 0.2, 0.3])  # 4 tokens, e2e 1.1 s
    assert r.latency == pytest.approx(1.1)
    assert tpot(r) == pytest.approx((1.1 - 0.5) / 3)
    assert tpot(make_record(0.0, 0.5, [])) is None  # one token: no TPOT


def test_tpot_prefers_server_usage_over_delta_count():
    # 2 deltas of 4 tokens each, but the server says 10 tokens: TPOT divides by 9.
    r = make_record(0.0, 0.2, [0.7], tokens_per_delta=4, usage=10)
    assert r.client_tokens == 8 and r.output_tokens == 10
    assert tpot(r) == pytest.approx(0.7 / 9)


def test_itl_is_per_delta_gaps():
    r = make_record(0.0, 0.3, [0.05, 0.15, 0.1])
    assert r.itl == pytest.approx([0.05, 0.15, 0.1])
    assert r.ttft == pytest.approx(0.3)


def test_goodput_counts_requests_meeting_every_slo():
    fast = make_record(0.0, 0.1, [0.01] * 9)  # TTFT 100 ms, TPOT 10 ms
    slow_first = make_record(0.0, 0.9, [0.01] * 9)  # TTFT 900 ms
    slow_decode = make_record(0.0, 0.1, [0.2] * 9)  # TPOT 200 ms
    one_token = make_record(0.0, 0.2, [])  # TPOT counts as 0
    slos = parse_goodput(["ttft:500", "tpot:50"])
    assert [is_good(r, slos) for r in (fast, slow_first, slow_decode, one_token)] == \
        [True, False, False, True]
    result = summarize([fast, slow_first, slow_decode, one_token], 2.0, 0.0, (99,), slos)
    assert result["request_goodput"] == pytest.approx(2 / 2.0)


def test_parse_goodput_rejects_unknown_keys_and_bad_values():
    assert parse_goodput(["e2el:1000"]) == {"e2el": 1000.0}
    for bad in (["ttft"], ["latency:5"], ["ttft:-1"], ["tpot:x"]):
        with pytest.raises(ValueError):
            parse_goodput(bad)


def test_summary_throughput_and_failures():
    a = make_record(0.0, 0.1, [0.1] * 4)  # 5 tokens
    b = make_record(0.3, 0.1, [0.1] * 9)  # 10 tokens, overlaps a
    refused = RequestRecord(prompt_len=10)
    refused.fail("overloaded", "retry later")
    result = summarize([a, b, refused], duration_s=2.0, t0=0.0, percentiles=(50, 99))
    assert result["completed"] == 2 and result["failed"] == 1
    assert result["errors_by_code"] == {"overloaded": 1}
    assert result["total_output_tokens"] == 15
    assert result["total_input_tokens"] == 20
    assert result["request_throughput"] == pytest.approx(1.0)
    assert result["output_throughput"] == pytest.approx(7.5)
    assert result["total_token_throughput"] == pytest.approx(17.5)
    assert result["max_concurrent_requests"] == 2
    assert result["mean_ttft_ms"] == pytest.approx(100.0)
    assert result["p50_itl_ms"] == pytest.approx(100.0)
    assert sum(result["output_tokens_per_s_series"]) == 15


def test_output_token_series_bins_by_second():
    r = make_record(0.0, 0.5, [0.4, 0.4, 0.9], tokens_per_delta=2)  # at 0.5 0.9 1.3 2.2
    assert output_token_series([r], t0=0.0) == [4, 2, 2]


def test_peak_concurrency_counts_overlaps():
    records = [make_record(s, 0.1, [0.1] * 9) for s in (0.0, 0.2, 0.4, 5.0)]  # 1 s each
    assert peak_concurrency(records) == 3


def test_per_turn_groups_ttft_and_cached_tokens():
    records = [make_record(0, 0.4, [0.1], turn=0, cached=0),
               make_record(0, 0.6, [0.1], turn=0, cached=0),
               make_record(0, 0.1, [0.1], turn=1, cached=32)]
    rows = per_turn(records, (99,))
    assert [row["turn"] for row in rows] == [0, 1]
    assert rows[0]["ttft_ms"]["mean"] == pytest.approx(500.0)
    assert rows[1]["mean_cached_tokens"] == 32
    assert math.isclose(rows[1]["ttft_ms"]["median"], 100.0)


def test_failed_done_counts_as_failure_not_success():
    r = RequestRecord(prompt_len=3)
    r.finish(1.0, "error")
    assert not r.success
    assert summarize([r], 1.0, 0.0)["completed"] == 0
