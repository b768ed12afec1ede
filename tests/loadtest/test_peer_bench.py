"""`tokenwire bench --peer llama.cpp`: the side-by-side table and finding the peer binary
(the run itself needs a built llama-server: docs/benchmarks.md has one)."""

import os

from loadtest.llama_server import find_llama_server, peer_env
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


def test_llama_server_waits_its_own_way():
    """Our PASSIVE OpenMP setting must not reach the peer (it tripled its TPOT)."""
    assert peer_env({"OMP_WAIT_POLICY": "PASSIVE", "PATH": "/bin"}) == {"PATH": "/bin"}


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


def test_quant_compare_serves_both_and_tabulates(monkeypatch):
    """`python -m loadtest.quant_compare` for real on a tiny dummy model: two servers, the
    same client, every request answered, the table beside each other."""
    import argparse

    from loadtest import quant_compare

    parser = argparse.ArgumentParser()
    quant_compare.add_arguments(parser)
    args = parser.parse_args(["--model", "dummy:tiny", "--quantization", "int8",
                              "--input-len", "8", "--output-len", "4"])
    report = quant_compare.compare(args)
    for side in ("fp32", "int8"):
        row = report[side]["rows"][1]
        assert row["failed"] == 0 and row["mean_tpot_ms"] > 0 and report[side]["rss_mib"] > 0
    text = quant_compare.format_report(report)
    assert "| | fp32 | int8 | ratio |" in text and "| server RSS after the run |" in text
