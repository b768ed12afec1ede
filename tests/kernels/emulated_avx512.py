"""The quantized kernels built with their AVX-512 path emulated in portable C
(kernels/cpu/avx512_emulated.h over SIMDe), so the tests run that path's code on CPUs
without AVX-512 instead of skipping it. SIMDe comes from Debian's libsimde-dev, which
`scripts/setup.sh test` installs; tests never skip for want of it. What emulation cannot
show is the hardware's own speed: benchmarks still need an AVX-512 CPU."""
import functools

import kernels.cpu as cpu_kernels

DEFINE = "-DTOKENWIRE_QUANT_EMULATE_AVX512"


@functools.cache
def load():
    """The emulating module; raises (the compiler's log above) if it does not build.
    cpp_extension is imported here, not at collection: it needs setuptools, which the GPU
    image lacks (tests/gpu_kit)."""
    from torch.utils import cpp_extension

    return cpp_extension.load(name="tokenwire_cpu_quant_avx512_emulated",
                              sources=cpu_kernels.QUANT_SOURCES,
                              extra_cflags=cpu_kernels.QUANT_FLAGS + [DEFINE],
                              extra_ldflags=["-fopenmp"])
