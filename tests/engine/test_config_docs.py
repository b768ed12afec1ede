"""The docs state the engine's defaults as the code applies them."""
from pathlib import Path

from engine.config import CPU_KV_CACHE_MAX_BYTES, CPU_KV_CACHE_MIN_BYTES

DOCS = Path(__file__).resolve().parents[2] / "docs"


def test_docs_state_the_cpu_kv_default_the_runner_applies():
    text = (f"one full-length sequence, {CPU_KV_CACHE_MIN_BYTES / 2**20:g} MiB to "
            f"{CPU_KV_CACHE_MAX_BYTES / 2**30:g} GiB")
    flags = (DOCS / "configuration.md").read_text()
    flag_row = next(line for line in flags.splitlines()
                    if line.startswith("| `--kv-cache-max-bytes`"))
    assert f"| CPU: {text} |" in flag_row
    engine = (DOCS / "engine.md").read_text().replace(" ", "").replace("\n", "")
    assert f"on CPU by default room for {text}".replace(" ", "") in engine
