import os

import pytest
import torch

import kernels.cpu as cpu_kernels

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


@pytest.fixture
def device() -> str:
    """Where the small-shape kernel tests run: the CPU under Triton's interpreter
    (TRITON_INTERPRET=1, as scripts/test.sh sets), else the GPU when there is one."""
    if INTERPRET:
        return "cpu"
    if torch.cuda.is_available():
        return "cuda"
    pytest.skip("Triton kernels need TRITON_INTERPRET=1 (CPU) or a CUDA GPU")


@pytest.fixture
def gen() -> torch.Generator:
    """A seeded CPU generator: fresh random inputs per test, reproducible across runs."""
    return torch.Generator().manual_seed(1234)


@pytest.fixture(scope="module")
def kernels():
    """The built C++ CPU kernels module; the test is skipped where they cannot build."""
    built = cpu_kernels.load()
    if built is None:
        pytest.skip("the C++ kernels did not build here (no compiler or ninja)")
    return built
