"""The README states the engine's defaults as the code applies them."""
from pathlib import Path

from engine.config import CPU_KV_CACHE_MAX_BYTES, CPU_KV_CACHE_MIN_BYTES

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_states_the_cpu_kv_default_the_runner_applies():
    text = (f"one full-length sequence, {CPU_KV_CACHE_MIN_BYTES / 2**20:g} MiB to "
            f"{CPU_KV_CACHE_MAX_BYTES / 2**30:g} GiB")
    readme = README.read_text()
    flag_row = next(line for line in readme.splitlines()
                    if line.startswith("| `--kv-cache-max-bytes`"))
    assert f"| CPU: {text} |" in flag_row
    assert f"on CPU by default room for {text}".replace(" ", "") in readme.replace(" ", "").replace("\n", "")
