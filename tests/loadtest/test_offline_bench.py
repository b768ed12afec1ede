"""`tokenwire bench --repeat 2` end to end on dummy:tiny: both systems generate every
token in every round, each reports its best, and the report's figures agree with each other (a real run, small enough for CI)."""
import json
import subprocess
import sys

import pytest


def test_bench_runs_both_systems_and_reports_consistent_figures(tmp_path):
    out = tmp_path / "bench.json"
    proc = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "bench", "--model", "dummy:tiny",
         "--num-prompts", "4", "--input-len", "40", "--output-len", "8",
         "--repeat", "2", "--prefill-len", "48", "--prefill-rounds", "2",
         "--result-json", str(out)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "ours / this" in proc.stdout and "of them" in proc.stdout
    assert "tokenwire rounds (s):" in proc.stdout
    report = json.loads(out.read_text())
    rows = report["results"]
    assert set(rows) == {"tokenwire", "HF static"}
    ours = rows["tokenwire"]["output_tok_per_s"]
    for row in rows.values():
        assert row["output_tokens"] == 4 * 8
        assert len(row["rounds_s"]) == 2 and row["seconds"] == min(row["rounds_s"])
        assert row["output_tok_per_s"] == pytest.approx(32 / row["seconds"], rel=0.05)
        assert row["ours_vs_this"] == pytest.approx(ours / row["output_tok_per_s"], rel=0.05)
    # The warm-up left nothing in the prefix cache for the timed prompts to hit.
    assert rows["tokenwire"]["cached_prompt_tokens"] == 0
    # Both ceilings, each from its own matmul rate.
    assert report["sustained_matmul_gflops"] > 0 and report["matmul_gflops"] > 0
    for kind in ("burst", "sustained"):
        assert report[f"fraction_of_{kind}_ceiling"] == pytest.approx(
            ours / report[f"{kind}_ceiling_out_tok_per_s"], rel=0.05)
    # One pair of fractions per round, each against its own probes; the headline is the
    # best round's.
    fractions = report["fractions_by_round"]
    best_round = rows["tokenwire"]["rounds_s"].index(rows["tokenwire"]["seconds"])
    assert len(fractions) == 2
    assert fractions[best_round] == {"burst": report["fraction_of_burst_ceiling"],
                                     "sustained": report["fraction_of_sustained_ceiling"]}
    assert "each against the rates probed around it" in proc.stdout
    # The prefill beside it: this checkout alone (no --baseline-rev), each round timed.
    prefill = report["prefill"]
    assert prefill["prompt_tokens"] == 48 and prefill["model"] == "dummy:tiny"
    row = prefill["rows"]["this checkout"]
    assert len(row["rounds_s"]) == 2 and row["tok_per_s"] > 0
    assert "prefill of one 48-token prompt" in proc.stdout
