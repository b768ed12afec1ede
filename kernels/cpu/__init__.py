"""C++ CPU kernels for fp32 (ops.cpp: decode attention and pointwise ops; linear.cpp: the
projections' matmul on packed weights; prefill_attention.cpp: prefill/extend attention),
and the weight-only quantized matmul (quant_*.cpp), built with torch's extension loader at
first use and cached (TORCH_EXTENSIONS_DIR, default ~/.cache/torch_extensions).

`load()` and `load_quant()` return the built module, or None where it cannot be built (no
C++ compiler or ninja): callers then keep the plain-torch path, which computes the same thing.
"""
from __future__ import annotations

import functools
import hashlib
import logging
import os
import platform

log = logging.getLogger(__name__)

SOURCES = [os.path.join(os.path.dirname(__file__), name)
           for name in ("ops.cpp", "linear.cpp", "prefill_attention.cpp", "decode_stack.cpp",
                        "gemma_decode_stack.cpp")]
# The attention kernels (decode, prefill and the fused qkv paths) are built for these head
# sizes (templates); 256 is Gemma 3's.
ATTENTION_HEAD_DIMS = (64, 128, 256)
# -march=native: built for the CPU that runs it. -ffast-math lets GCC vectorize exp()
# (glibc's vector math) and reorder sums; it is a compile flag only, so the library does
# not switch the process to flush-to-zero when it loads.
FLAGS = ["-O3", "-march=native", "-fopenmp", "-ffast-math"]


QUANT_SOURCES = [os.path.join(os.path.dirname(__file__), name)
                 for name in ("quant_linear.cpp", "quant_isa_portable.cpp",
                              "quant_isa_avx2.cpp", "quant_isa_avx512.cpp", "quant_isa_amx.cpp",
                              "worker_pool.cpp")]
# No -march: each quant_isa_*.cpp names its own instruction set, the binding picks one at
# run time, so one build serves every x86-64 CPU and the smaller sets can be tested here.
# No fp contraction: the embedding lookup rounds as ggml's dequantization does.
QUANT_FLAGS = ["-O3", "-fopenmp", "-Wno-psabi", "-ffp-contract=off"]
# The quantized kernels' instruction sets (quant_kernels.h's Isa).
QUANT_ISAS = {"portable": 0, "avx2": 1, "avx512": 2, "amx": 3}
QUANT_ISA_ENV = "TOKENWIRE_CPU_QUANT_ISA"
# The prefill attention's precision: fp32 or bf16 (see prefill_attention_bf16).
PREFILL_ATTENTION_ENV = "TOKENWIRE_CPU_PREFILL_ATTENTION"


@functools.cache
def load():
    """The compiled kernels module, or None (logged) if this machine cannot build it.
    It borrows the quantized module's worker pool and matmul (quant_exports.h), so that
    module is built with it."""
    try:
        from torch.utils import cpp_extension
        ops = cpp_extension.load(name=f"tokenwire_cpu_ops_{_cpu_id()}", sources=SOURCES,
                                 extra_cflags=FLAGS, extra_ldflags=["-fopenmp"])
    except Exception as exc:  # a missing compiler or ninja raises several types
        log.warning("CPU kernels unavailable, using plain torch ops: %s", exc)
        return None
    quant = load_quant()
    if quant is not None:
        ops.use_quant_exports(quant.exports())
    return ops


def _cpu_id() -> str:
    """A short hash of this CPU's instruction-set flags: a cache shared between machines
    (an NFS home) keeps one -march=native build per kind of CPU, never the wrong one."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line for line in f if line.startswith(("flags", "Features"))), "")
    except OSError:
        flags = ""
    return hashlib.sha1((platform.machine() + flags).encode()).hexdigest()[:10]


@functools.cache
def load_quant():
    """The compiled quantized-matmul module, or None (logged) if it cannot be built."""
    try:
        return build_quant("tokenwire_cpu_quant", QUANT_SOURCES)
    except Exception as exc:  # a missing compiler or ninja raises several types
        log.warning("quantized CPU kernels unavailable: %s", exc)
        return None


def build_quant(name: str, sources: list[str]):
    """The quantized-matmul module built from `sources` (QUANT_SOURCES' files, here or in
    another tree: loadtest.matmul_ab) as `name`, with its flags; raises if it cannot be."""
    from torch.utils import cpp_extension
    return cpp_extension.load(name=name, sources=sources, extra_cflags=QUANT_FLAGS,
                              extra_ldflags=["-fopenmp"])


def quant_isa() -> int:
    """The instruction set the quantized kernels use: TOKENWIRE_CPU_QUANT_ISA (portable,
    avx2 or avx512) forces one, for tests and comparisons; unset (-1) picks the best."""
    name = os.environ.get(QUANT_ISA_ENV, "")
    if not name:
        return -1
    if name not in QUANT_ISAS:
        raise ValueError(f"{QUANT_ISA_ENV}={name!r}: expected one of {sorted(QUANT_ISAS)}")
    return QUANT_ISAS[name]


def prefill_attention_bf16(kernels, quantized_model: bool) -> bool:
    """Whether the C++ prefill attention multiplies its far key tiles in bf16 (fp32 sums;
    docs/kernels.md): TOKENWIRE_CPU_PREFILL_ATTENTION=fp32 or bf16 forces it. Unset: bf16
    for a model with quantized projections whose dots read two activation levels (an fp32
    model's logits stay within 1e-4 of transformers', portable's three levels within 5e-4
    of fp32's) where the build has AVX-512 BF16, except on CPUs with AMX (the Intel Xeon),
    where fp32 met the prefill target and bf16 is not yet measured."""
    name = os.environ.get(PREFILL_ATTENTION_ENV, "")
    if name not in ("", "fp32", "bf16"):
        raise ValueError(f"{PREFILL_ATTENTION_ENV}={name!r}: expected fp32 or bf16")
    has_bf16 = kernels.prefill_attention_has_bf16()
    if name == "bf16" and not has_bf16:
        raise ValueError(f"{PREFILL_ATTENTION_ENV}=bf16: this CPU has no AVX-512 BF16")
    if name:
        return name == "bf16"
    quant = load_quant()
    if not (quantized_model and has_bf16 and quant is not None):
        return False
    isa = quant_isa()
    levels = quant.activation_levels(isa if isa >= 0 else quant.best_isa())
    return levels <= 2 and not quant.isa_supported(QUANT_ISAS["amx"])
