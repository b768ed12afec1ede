"""Kernels: Triton for the GPU, one per file, each with a plain-torch `<name>_ref` of the
same semantics; C++ for CPU decode steps in kernels.cpu.

Triton is optional (a CPU-only install has none); the Triton modules are imported by name
(kernels.rms_norm, ...). This package imports it only where its interpreter may be on
(TRITON_INTERPRET set), to patch it: a CPU server, which imports kernels.cpu alone, never
loads Triton (about 60 MiB of its RSS).
"""
import importlib.util
import os

if os.environ.get("TRITON_INTERPRET") and importlib.util.find_spec("triton") is not None:
    import triton

    from kernels._interpreter_compat import patch_triton_interpreter

    # CPU tests run the kernels under Triton's interpreter (TRITON_INTERPRET=1); the patch
    # must precede any launch, hence here, before any kernel module is imported.
    if getattr(getattr(triton, "knobs", None), "runtime", None) and triton.knobs.runtime.interpret:
        patch_triton_interpreter()
