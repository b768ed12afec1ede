"""`--scrape-metrics`: /metrics URL derivation and before/after deltas."""
import pytest

from loadtest.server_metrics import metrics_url, server_delta


@pytest.mark.parametrize("url,expected", [
    ("ws://127.0.0.1:8000/v1/ws", "http://127.0.0.1:8000/metrics"),
    ("wss://localhost:9/v1/ws?session_id=x", "https://localhost:9/metrics"),
    ("http://[::1]:8000/v1", "http://[::1]:8000/metrics")])
def test_metrics_url(url, expected):
    assert metrics_url(url) == expected


def test_server_delta_takes_differences_and_means():
    p = "tokenwire_"
    before = {p + "time_to_first_token_seconds_count": 2, p + "time_to_first_token_seconds_sum": 1.0,
              p + "generation_tokens_total": 10, p + "prefix_cache_queries_total": 100,
              p + "prefix_cache_hits_total": 0}
    after = {p + "time_to_first_token_seconds_count": 6, p + "time_to_first_token_seconds_sum": 3.0,
             p + "generation_tokens_total": 50, p + "prefix_cache_queries_total": 300,
             p + "prefix_cache_hits_total": 50, p + "admission_rejections_total": 3}
    delta = server_delta(before, after)
    assert delta["ttft_count"] == 4 and delta["mean_ttft_ms"] == pytest.approx(500.0)
    assert delta["itl_count"] == 0 and delta["mean_itl_ms"] is None
    assert delta["generation_tokens"] == 40
    assert delta["prefix_cache_hit_rate"] == pytest.approx(0.25)
    assert delta["admission_rejections"] == 3


def test_server_delta_is_empty_for_servers_without_tokenwire_metrics():
    assert server_delta({}, {"vllm:num_requests_running": 1.0}) == {}
