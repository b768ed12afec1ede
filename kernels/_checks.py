"""Argument checks shared by the kernel wrappers: each raises ValueError naming the argument."""

import torch

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def check_tensor(name: str, t, ndim: int, dtypes=FLOAT_DTYPES) -> None:
    """Require a torch tensor of `ndim` dims, one of `dtypes`, unit stride in its last dim."""
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dims, got shape {tuple(t.shape)}")
    if t.dtype not in dtypes:
        raise ValueError(f"{name} dtype must be one of {dtypes}, got {t.dtype}")
    if t.numel() > 0 and t.stride(-1) != 1:
        raise ValueError(f"{name} must have unit stride in its last dim, got strides {t.stride()}")


def check_same(name: str, t: torch.Tensor, ref_name: str, ref: torch.Tensor) -> None:
    """Require `t` on the same device and with the same dtype as `ref`."""
    if t.device != ref.device:
        raise ValueError(f"{name} is on {t.device} but {ref_name} is on {ref.device}")
    if t.dtype != ref.dtype:
        raise ValueError(f"{name} dtype {t.dtype} differs from {ref_name} dtype {ref.dtype}")


def check_dim(name: str, t: torch.Tensor, dim: int, size: int) -> None:
    """Require t.shape[dim] == size."""
    if t.shape[dim] != size:
        raise ValueError(f"{name}.shape[{dim}] must be {size}, got shape {tuple(t.shape)}")


def check_kv_cache(k_cache, v_cache, dtypes=FLOAT_DTYPES) -> None:
    """Require matching contiguous [num_blocks, block_size, num_kv_heads, head_dim] caches."""
    check_tensor("k_cache", k_cache, 4, dtypes)
    check_tensor("v_cache", v_cache, 4, dtypes)
    check_same("v_cache", v_cache, "k_cache", k_cache)
    if v_cache.shape != k_cache.shape:
        raise ValueError(f"v_cache shape {tuple(v_cache.shape)} != k_cache shape {tuple(k_cache.shape)}")
    if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise ValueError("k_cache and v_cache must be contiguous")


def check_head_dim(head_dim: int) -> None:
    """Kernels tile the head dim whole: it must be a power of two of at least 16."""
    if head_dim < 16 or head_dim & (head_dim - 1):
        raise ValueError(f"head_dim must be a power of two >= 16, got {head_dim}")


def dot_precision(dtype: torch.dtype):
    """fp32 inputs use exact fp32 dots (not tf32) so fp32 results match the reference;
    16-bit inputs keep Triton's default (None)."""
    return "ieee" if dtype == torch.float32 else None
