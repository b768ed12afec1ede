"""Where a compiler and ninja exist the C++ kernels must build. Every kernel test skips where
they cannot (a box without a toolchain keeps the plain-torch path), so without this check a
compile error in kernels/cpu would turn hundreds of tests into skips and CI would pass."""
import shutil

import pytest

import kernels.cpu as cpu_kernels

TOOLCHAIN = all(shutil.which(tool) for tool in ("c++", "ninja"))


@pytest.mark.skipif(not TOOLCHAIN, reason="no C++ compiler or ninja on PATH")
def test_both_modules_build_where_a_toolchain_exists():
    assert cpu_kernels.load_quant() is not None, "quantized kernels failed to build (log above)"
    assert cpu_kernels.load() is not None, "CPU kernels failed to build (log above)"
