"""The README states the engine's defaults as the code applies them."""
from pathlib import Path

from engine.config import CPU_KV_CACHE_MAX_BYTES

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_states_the_cpu_kv_cap_the_runner_applies():
    text = f"{CPU_KV_CACHE_MAX_BYTES / 2**30:g} GiB"
    readme = README.read_text()
    flag_row = next(line for line in readme.splitlines()
                    if line.startswith("| `--kv-cache-max-bytes`"))
    assert f"| {text} on CPU |" in flag_row
    assert f"capped by `kv_cache_max_bytes`; {text} by default on CPU" in readme
