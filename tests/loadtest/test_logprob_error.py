"""`python -m loadtest.logprob_error` measures each instruction set in its own process: the
two-level dots (AVX2) lie measurably further from fp32 than portable's three levels."""
from loadtest import logprob_error


def test_each_isa_is_measured_in_its_own_process(capsys):
    logprob_error.main(["--isa", "portable", "avx2", "--tokens", "2", "--seeds", "0",
                        "--prompts", "6"])
    lines = capsys.readouterr().out.splitlines()
    assert "6 prompts x 2 tokens, greedy and 0 sampled runs" in lines[0]
    rows = {}
    for line in lines[2:]:
        isa, levels, values, p50, p99, worst = line.split()
        rows[isa] = (int(levels), int(values), float(p50), float(worst))
    assert set(rows) == {"portable", "avx2"}
    assert rows["portable"][:2] == (3, 6 * 2 * 6)  # chosen + top 5 per token
    assert rows["avx2"][:2] == (2, 6 * 2 * 6)
    assert rows["portable"][3] < 5e-4
    assert rows["avx2"][2] > 3 * rows["portable"][2]
