"""`tokenwire bench --peer llama.cpp`: the side-by-side table and finding the peer binary
(the run itself needs a built llama-server: docs/benchmarks.md has one)."""

import os

from loadtest.llama_server import find_llama_server, peer_env
from loadtest.peer_bench import format_report, gguf_vocab_size, median_row, peer_gguf


def side(tpots, rates, failed, rss):
    """One server's report: a turn per (TPOT, output tok/s), summarised as run_peer does."""
    turns = [{"requests": 8, "failed": 0, "mean_tpot_ms": tpot, "output_tok_per_s": rate}
             for tpot, rate in zip(tpots, rates)]
    turns[0]["failed"] = failed
    return {"rows": {1: median_row(turns)}, "rss_mib": rss}


def test_table_puts_each_median_beside_the_peers_with_ratios_and_the_rounds():
    report = {"peer": "llama.cpp", "model": "default", "llama_server": "/x/llama-server",
              "threads": 2,
              "input_len": 128, "output_len": 64, "rounds": 3,
              "tokenwire": side([9.0, 8.0, 7.5], [110.0, 120.0, 130.0], 0, 900.0),
              "llama.cpp": side([12.0, 10.0, 9.0], [100.0, 95.0, 105.0], 2, 450.0)}
    text = format_report(report)
    assert "model default, 2 threads" in text and "medians of 3 alternating rounds" in text
    assert "| c=1: TPOT | 10.0 ms | 8.0 ms | 1.25x faster |" in text
    assert "| c=1: TPOT by round | 12.0 / 10.0 / 9.0 | 9.0 / 8.0 / 7.5 | |" in text
    assert "| c=1: output tok/s | 100 | 120 | 1.20x |" in text
    assert "| c=1: failed | 2 of 24 | 0 of 24 | |" in text
    assert "| server RSS after the runs | 450 MiB | 900 MiB | 2.00x |" in text


def test_both_servers_load_the_gguf_the_model_names(tmp_path):
    """The default model's GGUF, or the one a model names (its prompts' ids drawn from its
    own vocabulary); a model without a GGUF is refused before anything starts."""
    from gguf import GGUFWriter

    assert peer_gguf("default").name.endswith(".gguf")
    assert peer_gguf("dummy:tiny") is None
    path = tmp_path / "vocab.gguf"
    writer = GGUFWriter(path, "llama")
    writer.add_token_list([f"t{i}" for i in range(300)])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    assert peer_gguf(str(path)) == path and gguf_vocab_size(path) == 300


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
