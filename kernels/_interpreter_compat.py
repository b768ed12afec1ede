"""Fixes for Triton 3.6's CPU interpreter (TRITON_INTERPRET=1), used by the CPU tests.

1. The interpreter holds every scalar as a 1-element array and converts loop bounds with
   int(array), which NumPy >= 2.4 rejects for arrays with ndim > 0, so
   `for i in range(start, end)` with tensor bounds fails. Convert through .item().
2. It stores bf16 as raw uint16 bits and its tl.dot multiplies those bits as integers.
   Widen bf16 operands to fp32 first (the result is fp32-accumulated, as on the GPU).
3. Its fp32 -> bf16 cast truncates; the GPU (and torch) round to nearest even.
Compiled (GPU) kernels are untouched.
"""


def patch_triton_interpreter() -> None:
    """Idempotently install the fixes into triton.runtime.interpreter."""
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter

    original_patch = interpreter._patch_lang_tensor
    if getattr(original_patch, "tokenwire_patched", False):
        return

    def patch_lang_tensor(tensor, scope) -> None:
        original_patch(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.item()))

    original_dot = interpreter.InterpreterBuilder.create_dot

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        if tl.bfloat16 in (a.dtype.scalar, b.dtype.scalar):
            a, b = (_bf16_to_fp32(interpreter, np, x) for x in (a, b))
        return original_dot(self, a, b, d, input_precision, max_num_imprecise_acc)

    original_cast = interpreter.InterpreterBuilder.cast_impl

    def cast_impl(self, src, dst_type):
        if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
            return interpreter.TensorHandle(_fp32_to_bf16_bits(np, src.data), tl.bfloat16)
        return original_cast(self, src, dst_type)

    patch_lang_tensor.tokenwire_patched = True
    interpreter._patch_lang_tensor = patch_lang_tensor
    interpreter.InterpreterBuilder.create_dot = create_dot
    interpreter.InterpreterBuilder.cast_impl = cast_impl


def _bf16_to_fp32(interpreter, np, handle):
    import triton.language as tl

    if handle.dtype.scalar != tl.bfloat16:
        return handle
    bits = handle.data.astype(np.uint32) << 16  # bf16 is the top half of an fp32
    return interpreter.TensorHandle(bits.view(np.float32), tl.float32)


def _fp32_to_bf16_bits(np, data):
    """Round-to-nearest-even fp32 -> bf16, as raw uint16 bits (the interpreter's storage)."""
    bits = np.ascontiguousarray(data, dtype=np.float32).view(np.uint32)
    rounded = (bits + (0x7FFF + ((bits >> 16) & 1))) >> 16
    quiet_nan = (bits >> 16) | 0x40  # keep NaN a NaN (rounding could carry into inf)
    return np.where(np.isnan(data), quiet_nan, rounded).astype(np.uint16)
