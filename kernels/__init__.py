"""Triton kernels, one per file, each with a plain-torch `<name>_ref` of the same semantics."""

import triton

from kernels._interpreter_compat import patch_triton_interpreter

# CPU tests run the kernels under Triton's interpreter (TRITON_INTERPRET=1).
if getattr(getattr(triton, "knobs", None), "runtime", None) and triton.knobs.runtime.interpret:
    patch_triton_interpreter()

# The kernel modules come after the patch on purpose (E402): it must precede any launch.
from kernels.paged_decode_attention import paged_decode_attention, paged_decode_attention_ref  # noqa: E402
from kernels.paged_prefill_attention import paged_prefill_attention, paged_prefill_attention_ref  # noqa: E402
from kernels.rms_norm import rms_norm, rms_norm_ref  # noqa: E402
from kernels.rotary import apply_rotary, apply_rotary_ref, build_cos_sin_cache  # noqa: E402
from kernels.silu_and_mul import silu_and_mul, silu_and_mul_ref  # noqa: E402
from kernels.store_kv_cache import store_kv_cache, store_kv_cache_ref  # noqa: E402

__all__ = [
    "apply_rotary", "apply_rotary_ref", "build_cos_sin_cache",
    "paged_decode_attention", "paged_decode_attention_ref",
    "paged_prefill_attention", "paged_prefill_attention_ref",
    "rms_norm", "rms_norm_ref",
    "silu_and_mul", "silu_and_mul_ref",
    "store_kv_cache", "store_kv_cache_ref",
]
