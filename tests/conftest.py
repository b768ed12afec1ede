"""Suite-wide settings, applied before any test module imports torch."""
import os

import pytest

# The engine's OpenMP threads share 2 cores with the server's event loop and the test's
# clients; spinning workers then starve the one doing the work and a step takes several
# times longer. Passive waiting yields the core instead (see gateway/cli.py).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


@pytest.fixture(scope="session")
def cpu_kernels():
    """The C++ CPU kernels, built on first use: never while collecting, since the GPU run
    collects these modules too and needs no CPU build. Skips where they cannot build."""
    import kernels.cpu

    built = kernels.cpu.load()
    if built is None:
        pytest.skip("the C++ CPU kernels did not build here (no compiler or ninja)")
    return built
