"""Kernels: Triton for the GPU, one per file, each with a plain-torch `<name>_ref` of the
same semantics; C++ for CPU decode steps in kernels.cpu.

Triton is optional (a CPU-only install has none), so nothing here imports it unless it is
installed; the Triton modules are imported by name (kernels.rms_norm, ...).
"""
import importlib.util

if importlib.util.find_spec("triton") is not None:
    import triton

    from kernels._interpreter_compat import patch_triton_interpreter

    # CPU tests run the kernels under Triton's interpreter (TRITON_INTERPRET=1); the patch
    # must precede any launch, hence here, before any kernel module is imported.
    if getattr(getattr(triton, "knobs", None), "runtime", None) and triton.knobs.runtime.interpret:
        patch_triton_interpreter()
