"""`tokenwire bench --peer llama.cpp`: the side-by-side table and finding the peer binary
(the run itself needs a built llama-server: BENCHMARKS.md has one)."""

import os

from loadtest.llama_server import find_llama_server
from loadtest.peer_bench import format_report


def side(tpot, rate, failed, rss):
    return {"rows": {1: {"requests": 8, "failed": failed, "mean_tpot_ms": tpot,
                         "output_tok_per_s": rate}}, "rss_mib": rss}


def test_table_puts_each_figure_beside_the_peers_with_ratios():
    report = {"peer": "llama.cpp", "llama_server": "/x/llama-server", "threads": 2,
              "input_len": 128, "output_len": 64,
              "tokenwire": side(8.0, 120.0, 0, 900.0),
              "llama.cpp": side(10.0, 100.0, 2, 450.0)}
    text = format_report(report)
    assert "| c=1: TPOT | 10.0 ms | 8.0 ms | 1.25x faster |" in text
    assert "| c=1: output tok/s | 100 | 120 | 1.20x |" in text
    assert "| c=1: failed | 2 of 8 | 0 of 8 | |" in text
    assert "| server RSS after the runs | 450 MiB | 900 MiB | 2.00x |" in text


def test_given_binary_wins_and_a_missing_one_is_none(tmp_path, monkeypatch):
    binary = tmp_path / "llama-server"
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755)
    monkeypatch.setenv("TOKENWIRE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.delenv("LLAMA_SERVER", raising=False)
    assert find_llama_server(str(binary)) == str(binary)
    assert find_llama_server(None) is None
    monkeypatch.setenv("LLAMA_SERVER", os.fspath(binary))
    assert find_llama_server(None) == str(binary)
