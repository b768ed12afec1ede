"""Suite-wide settings, applied before any test module imports torch."""
import os

import pytest
from services import RedisServer

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


@pytest.fixture(scope="session", autouse=True)
def state_home(tmp_path_factory):
    """`tokenwire serve` keeps sessions in $XDG_STATE_HOME/tokenwire by default: servers
    the tests start write there, never into the real home's state directory."""
    before = os.environ.get("XDG_STATE_HOME")
    os.environ["XDG_STATE_HOME"] = str(tmp_path_factory.mktemp("state"))
    yield os.environ["XDG_STATE_HOME"]
    if before is None:
        del os.environ["XDG_STATE_HOME"]
    else:
        os.environ["XDG_STATE_HOME"] = before


@pytest.fixture
def redis_server(tmp_path):
    """A fresh redis-server on a free loopback port, stopped after the test."""
    with RedisServer(tmp_path / "redis") as server:
        yield server
