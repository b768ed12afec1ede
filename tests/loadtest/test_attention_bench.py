"""`python -m loadtest.attention_bench`: both CPU attention backends (and the C++ one's
bf16 products where the CPU has them) on every case, checked to agree before they are
timed (a real run on small heads, quick enough for CI)."""
import re
import subprocess
import sys

import pytest
import torch

from loadtest.attention_bench import CASES, paged_step


@pytest.mark.usefixtures("cpu_kernels")
def test_prints_a_row_per_case_with_consistent_figures():
    proc = subprocess.run([sys.executable, "-m", "loadtest.attention_bench", "--heads", "4", "2",
                           "64", "--repeats", "2"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    for what, _, _ in CASES:
        line = next(line for line in proc.stdout.splitlines() if line.startswith(what))
        figures = list(map(float, re.findall(r"[\d.]+", line[len(what):])))
        torch_ms, cpu_ms, torch_gf, cpu_gf, speedup = figures[:5]
        assert min(torch_ms, cpu_ms, torch_gf, cpu_gf) > 0
        assert speedup == pytest.approx(torch_ms / cpu_ms, rel=0.05, abs=0.01)
        assert cpu_gf / torch_gf == pytest.approx(speedup, rel=0.05, abs=0.01)
        if len(figures) > 5:  # the bf16 column, where the CPU has AVX-512 BF16
            bf16_ms, bf16_gf, bf16_ratio = figures[5:]
            assert bf16_ratio == pytest.approx(cpu_ms / bf16_ms, rel=0.05, abs=0.01)
            assert bf16_gf / cpu_gf == pytest.approx(bf16_ratio, rel=0.05, abs=0.01)


def test_step_caches_hold_the_new_tokens_kv():
    """The torch backend attends a whole prompt from the new k/v and the kernel from the
    cache: the two agree only if the step stored the new rows, as an engine step does."""
    q, k, v, (k_cache, v_cache), meta = paged_step([20, 9], [20, 4], 4, 2, 64)
    positions = [(0, p) for p in range(20)] + [(1, p) for p in range(5, 9)]
    for row, (b, p) in enumerate(positions):
        slot = 16 * int(meta.block_tables[b, p // 16]) + p % 16
        assert torch.equal(k_cache.view(-1, 2, 64)[slot], k[row])
        assert torch.equal(v_cache.view(-1, 2, 64)[slot], v[row])
