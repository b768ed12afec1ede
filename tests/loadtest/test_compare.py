"""The one-command comparisons, end to end on a small random-weight model (dummy:tiny):
each starts a real `tokenwire serve`, drives it over WebSocket and reads the numbers back.

The full-size figures (default model, 2k-token history) come from the same commands; see
the README's loadtest section. Here the checks are that both sides ran the same work and
that the cache really was off in one run and on in the other.
"""
import json

import pytest

from loadtest.compare import main

TINY = ["--model", "dummy:tiny", "--device", "cpu", "--num-threads", "1",
        "--num-kv-blocks", "128"]


@pytest.mark.parametrize("order", [[], ["--interleave"]])
def test_online_vs_offline_runs_the_same_tokens_on_both_sides(tmp_path, capsys, order):
    out = tmp_path / "offline.json"
    rc = main(["offline", *TINY, "--concurrency", "2,4", "--num-prompts", "6",
               "--input-len", "24", "--output-len", "8", "--repeat", "2", *order,
               "--result-json", str(out)])
    assert rc == 0
    report = json.loads(out.read_text())
    assert [r["concurrency"] for r in report["rows"]] == [2, 4]
    for row in report["rows"]:
        assert row["online_output_tokens"] == row["offline_output_tokens"] == 6 * 8
        assert len(row["online_seconds"]) == len(row["offline_seconds"]) == 2
        assert row["online_output_tok_per_s"] > 0 and row["offline_output_tok_per_s"] > 0
        assert abs(row["ratio"] - row["online_output_tok_per_s"]
                   / row["offline_output_tok_per_s"]) < 1e-9
    assert "online/offline" in capsys.readouterr().out


def test_prefix_cache_comparison_serves_later_turns_from_cache_only_when_on(tmp_path, capsys):
    out = tmp_path / "prefix.json"
    rc = main(["prefix-cache", *TINY, "--history-len", "200", "--user-len", "8",
               "--output-len", "4", "--num-sessions", "1", "--turns", "3",
               "--result-json", str(out)])
    assert rc == 0
    report = json.loads(out.read_text())
    off, on = report["cache_off"], report["cache_on"]
    assert off["later_count"] == on["later_count"] == 2
    assert off["later_mean_prompt_tokens"] == on["later_mean_prompt_tokens"] > 200
    assert off["later_mean_cached_tokens"] == 0
    # Whole blocks of the history (16 tokens each) come from the cache on turns 2 and 3.
    assert on["later_mean_cached_tokens"] >= 200 - 16
    assert report["ratio"] == off["later_mean_ttft_ms"] / on["later_mean_ttft_ms"]
    assert "off/on" in capsys.readouterr().out


def test_realtime_vs_ws_runs_both_sides_on_one_server(tmp_path, capsys):
    from loadtest.compare_realtime import main as compare_realtime

    out = tmp_path / "realtime.json"
    rc = compare_realtime([*TINY, "--concurrency", "2", "--num-prompts", "4",
                           "--input-len", "16", "--output-len", "6", "--repeat", "2",
                           "--result-json", str(out)])
    assert rc == 0
    report = json.loads(out.read_text())
    assert len(report["ws_output_tok_per_s"]) == len(report["realtime_output_tok_per_s"]) == 2
    assert report["ws_output_tokens"] > 0 and report["realtime_output_tokens"] > 0
    assert report["ratio"] == max(report["realtime_output_tok_per_s"]) / max(
        report["ws_output_tok_per_s"])
    assert "realtime/ws:" in capsys.readouterr().out


def test_kv_tiers_comparison_loads_idle_sessions_back_only_with_tiers_on(tmp_path, capsys):
    """Two sessions whose histories overflow a 16-block pool, each idle with its socket
    closed between turns: the tiers-on server serves turn 2 from its tiers."""
    from loadtest.compare_kv_tiers import main as compare_kv_tiers

    out = tmp_path / "tiers.json"
    rc = compare_kv_tiers([*TINY[:-1], "16", "--history-len", "200", "--user-len", "8",
                           "--output-len", "4", "--num-sessions", "2", "--turns", "2",
                           "--idle-gap", "0.5", "--result-json", str(out)])
    assert rc == 0
    report = json.loads(out.read_text())
    off, on = report["tiers_off"], report["tiers_on"]
    assert off["later_count"] == on["later_count"] == 2
    assert off["later_mean_prompt_tokens"] == on["later_mean_prompt_tokens"] > 200
    assert on["later_mean_cached_tokens"] >= 200 - 16 > off["later_mean_cached_tokens"]
    assert "off/on" in capsys.readouterr().out
