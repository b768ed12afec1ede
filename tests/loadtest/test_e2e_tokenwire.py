"""End to end: `tokenwire loadtest` against a real `tokenwire serve` on loopback.

The client's numbers must agree with the server's own /metrics: as many TTFT samples as
requests, TTFT sums within a loopback's overhead, and generation_tokens_total equal to
the output tokens the client counted from its deltas.
"""
from __future__ import annotations

import argparse
import json

import pytest
from prometheus_client.parser import text_string_to_metric_families

from loadtest.cli import main
from loadtest.server_process import ServerProcess, http_get


@pytest.fixture(scope="module")
def tokenwire_url():
    """`tokenwire serve` (default model, one CPU thread, small KV pool); its base URL."""
    args = ["--device", "cpu", "--num-threads", "1", "--num-kv-blocks", "256",
            "--max-model-len", "1024", "--drain-timeout", "2"]
    with ServerProcess(args, ready_timeout_s=300) as server:
        yield server.base


def scrape(base: str) -> dict[str, float]:
    """Label-free samples of /metrics (label sets summed), by sample name."""
    status, text = http_get(f"{base}/metrics")
    assert status == 200
    samples: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples[s.name] = samples.get(s.name, 0.0) + s.value
    return samples


def run_loadtest(tmp_path, name: str, *argv: str) -> dict:
    out = tmp_path / f"{name}.json"
    rc = main([*argv, "--disable-tqdm", "--result-json", str(out), "--seed", "3"])
    assert rc == 0
    return json.loads(out.read_text())


def assert_agrees_with_server(before: dict, after: dict, result: dict) -> None:
    n = result["completed"]
    ttft_count = after["tokenwire_time_to_first_token_seconds_count"] - \
        before["tokenwire_time_to_first_token_seconds_count"]
    assert ttft_count == n
    server_ttft = after["tokenwire_time_to_first_token_seconds_sum"] - \
        before["tokenwire_time_to_first_token_seconds_sum"]
    client_ttft = sum(result["ttfts"])
    # The client's clock starts before the server's and stops after it: a little more.
    assert server_ttft * 0.95 - 0.01 <= client_ttft <= server_ttft * 1.25 + 0.1 * n
    generated = after["tokenwire_generation_tokens_total"] - \
        before["tokenwire_generation_tokens_total"]
    assert generated == result["total_output_tokens"] == result["client_output_tokens"]


def test_websocket_random_run_matches_server_metrics(tokenwire_url, tmp_path):
    before = scrape(tokenwire_url)
    result = run_loadtest(
        tmp_path, "ws", "--url", tokenwire_url.replace("http", "ws") + "/v1/ws",
        "--num-prompts", "4", "--random-input-len", "16", "--random-output-len", "6",
        "--ignore-eos", "--max-concurrency", "4", "--percentiles", "50,99", "--scrape-metrics")
    after = scrape(tokenwire_url)
    # The tool's own /metrics bracket saw the same server-side counts.
    assert result["server"]["ttft_count"] == 4
    assert result["server"]["generation_tokens"] == result["total_output_tokens"]
    assert result["completed"] == 4 and result["failed"] == 0
    assert result["output_lens"] == [6] * 4  # ignore_eos: exactly max_tokens each
    assert result["input_lens"] == [16] * 4  # the server tokenized what the client built
    assert result["total_deltas"] <= result["client_output_tokens"]
    assert result["mean_ttft_ms"] > 0 and result["mean_tpot_ms"] > 0
    assert_agrees_with_server(before, after, result)


def test_copy_dataset_runs_over_completions_with_the_lengths_it_built(tokenwire_url, tmp_path):
    result = run_loadtest(
        tmp_path, "copy", "--url", tokenwire_url + "/v1", "--endpoint", "completions",
        "--dataset", "copy", "--num-prompts", "3", "--random-input-len", "48",
        "--random-output-len", "4", "--ignore-eos", "--max-concurrency", "3")
    assert result["dataset"] == "copy" and result["completed"] == 3 and result["failed"] == 0
    assert all(48 <= n <= 72 for n in result["input_lens"])  # the server's own counts


def test_msgpack_sessions_show_prefix_cache_hits_on_later_turns(tokenwire_url, tmp_path):
    before = scrape(tokenwire_url)
    result = run_loadtest(
        tmp_path, "sessions", "--url", tokenwire_url.replace("http", "ws") + "/v1/ws",
        "--msgpack", "--dataset", "sessions", "--num-sessions", "2", "--turns", "2",
        "--random-input-len", "24", "--random-output-len", "4", "--ignore-eos")
    after = scrape(tokenwire_url)
    assert result["completed"] == 4 and result["transport"] == "ws+msgpack"
    first, second = result["per_turn"]
    # Turn 2 resends turn 1's history, which the prefix cache already holds.
    assert second["mean_prompt_tokens"] > first["mean_prompt_tokens"]
    assert second["mean_cached_tokens"] > first["mean_cached_tokens"]
    assert_agrees_with_server(before, after, result)


def test_sessions_with_an_idle_gap_resume_their_history_on_a_new_socket(tokenwire_url,
                                                                        tmp_path):
    """--idle-gap closes each session's socket between turns; the next turn resumes the
    session by id, so it still carries the first turn's history (a session the server
    did not resume would fail its turn as session_lost)."""
    before = scrape(tokenwire_url)
    result = run_loadtest(
        tmp_path, "idle", "--url", tokenwire_url.replace("http", "ws") + "/v1/ws",
        "--dataset", "sessions", "--num-sessions", "2", "--turns", "2", "--idle-gap", "0.3",
        "--random-input-len", "24", "--random-output-len", "4", "--ignore-eos")
    assert result["completed"] == 4 and result["failed"] == 0
    first, second = result["per_turn"]
    assert second["mean_prompt_tokens"] > first["mean_prompt_tokens"] + 24
    assert_agrees_with_server(before, scrape(tokenwire_url), result)


def test_openai_http_completions_run_matches_server_metrics(tokenwire_url, tmp_path):
    before = scrape(tokenwire_url)
    result = run_loadtest(
        tmp_path, "http", "--url", tokenwire_url + "/v1", "--endpoint", "completions",
        "--num-prompts", "2", "--random-input-len", "12", "--random-output-len", "5",
        "--ignore-eos", "--request-rate", "20")
    after = scrape(tokenwire_url)
    assert result["completed"] == 2 and result["model"] == "SmolLM2-135M-Instruct"
    assert result["output_lens"] == [5, 5]
    assert_agrees_with_server(before, after, result)


def test_realtime_random_run_matches_server_metrics(tokenwire_url, tmp_path):
    before = scrape(tokenwire_url)
    result = run_loadtest(
        tmp_path, "rt", "--url", tokenwire_url.replace("http", "ws") + "/v1/realtime",
        "--num-prompts", "4", "--random-input-len", "16", "--random-output-len", "6",
        "--max-concurrency", "4", "--scrape-metrics")
    after = scrape(tokenwire_url)
    assert result["transport"] == "realtime" and result["endpoint"] == "chat"
    assert result["completed"] == 4 and result["failed"] == 0
    assert result["model"] == "SmolLM2-135M-Instruct"
    assert all(0 < n <= 6 for n in result["output_lens"])
    # The same metrics as the other targets, and the server's own counts agree.
    assert result["server"]["ttft_count"] == 4
    assert result["mean_ttft_ms"] > 0 and result["output_throughput"] > 0
    generated = after["tokenwire_generation_tokens_total"] - \
        before["tokenwire_generation_tokens_total"]
    assert generated == result["total_output_tokens"]
    assert result["total_deltas"] <= result["total_output_tokens"]


def test_realtime_sessions_show_prefix_cache_hits_on_later_turns(tokenwire_url, tmp_path):
    result = run_loadtest(
        tmp_path, "rt-sessions", "--url", tokenwire_url.replace("http", "ws") + "/v1/realtime",
        "--dataset", "sessions", "--num-sessions", "2", "--turns", "2",
        "--random-input-len", "24", "--random-output-len", "4")
    assert result["completed"] == 4 and result["failed"] == 0
    first, second = result["per_turn"]
    assert second["mean_prompt_tokens"] > first["mean_prompt_tokens"]
    assert second["mean_cached_tokens"] > first["mean_cached_tokens"]


@pytest.mark.parametrize("endpoint,path", [("responses-ws", "/v1/responses"),
                                           ("responses", "/v1")])
def test_responses_tool_chains_grow_turn_by_turn(tokenwire_url, tmp_path, endpoint, path):
    """Two 2-turn tool chains (the default dataset of a responses endpoint): each turn a
    forced call, the next turn its output; turn 2 sees turn 1 and finds it in cache."""
    url = (tokenwire_url.replace("http", "ws") if endpoint == "responses-ws"
           else tokenwire_url) + path
    result = run_loadtest(
        tmp_path, endpoint, "--url", url, "--endpoint", endpoint, "--num-sessions", "2",
        "--turns", "2", "--random-input-len", "8", "--random-output-len", "48",
        "--percentiles", "50,99")
    assert result["endpoint"] == endpoint and result["dataset"] == "sessions"
    assert result["completed"] == 4 and result["failed"] == 0, result.get("errors_by_code")
    assert result["mean_ttft_ms"] > 0 and all(n > 0 for n in result["output_lens"])
    first, second = result["per_turn"]
    # Turn 2's prompt holds turn 1's, its call (at least the shortest reply's tokens) and
    # the tool's output: the chain's history reached the model.
    assert second["mean_prompt_tokens"] > first["mean_prompt_tokens"] + min(result["output_lens"])
    assert second["mean_cached_tokens"] > first["mean_cached_tokens"]


def test_a_responses_endpoint_on_the_wrong_url_is_refused(capsys):
    rc = main(["--url", "http://127.0.0.1:9/v1", "--endpoint", "responses-ws"])
    assert rc == 2 and "url" in capsys.readouterr().err


@pytest.mark.parametrize("mode", ["resend", "ws-local"])
def test_agent_chain_comparison_variants_carry_the_history(tokenwire_url, mode):
    """The comparison's variants beyond the loadtest's (loadtest.compare_agent_chain):
    HTTP with store false, the client resending every item so far, and WebSocket mode
    with store false, the socket keeping the chain; turn 2 sees turn 1's call whole."""
    from loadtest.compare_agent_chain import one_chain
    from loadtest.tokenizer import load_tokenizer

    args = argparse.Namespace(first_turn_len=8, tool_output_len=8, output_len=48)
    first, second = one_chain(tokenwire_url + "/v1", mode, args, load_tokenizer("default"),
                              seed=5, turns=2)
    assert second.prompt_tokens > first.prompt_tokens + first.output_tokens + 8
    assert second.usage_cached_tokens > 0  # the resent prefix was found in cache
