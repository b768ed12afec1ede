"""RMSNorm, optionally fused with the residual add (HF LlamaRMSNorm numerics).

    residual is None:  out = rmsnorm(x)
    otherwise:         new_residual = x + residual (rounded to x's dtype, as HF adds)
                       out = rmsnorm(new_residual)
    rmsnorm(h) = (h.float() * rsqrt(mean(h.float()^2) + eps)).to(dtype) * weight
One program per row; the whole row is one tile.
"""

import torch
import triton
import triton.language as tl

from kernels._checks import check_dim, check_same, check_tensor


@triton.jit
def _rms_norm_kernel(
    x_ptr, residual_ptr, weight_ptr, out_ptr, new_residual_ptr, eps,
    stride_x, stride_r, stride_o, stride_nr,
    N: tl.constexpr, BLOCK: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < N
    dtype = out_ptr.dtype.element_ty
    hf = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        r = tl.load(residual_ptr + row * stride_r + offs, mask=mask, other=0.0)
        # Round the sum to the input dtype first: HF adds in that dtype, then normalises.
        h = (hf + r.to(tl.float32)).to(dtype)
        tl.store(new_residual_ptr + row * stride_nr + offs, h, mask=mask)
        hf = h.to(tl.float32)
    variance = tl.sum(hf * hf, 0) / N
    normed = (hf * tl.math.rsqrt(variance + eps)).to(dtype)
    w = tl.load(weight_ptr + offs, mask=mask, other=0.0)
    out = normed.to(tl.float32) * w.to(tl.float32)
    tl.store(out_ptr + row * stride_o + offs, out.to(dtype), mask=mask)


def _check_args(x, weight, residual, out) -> None:
    check_tensor("x", x, 2)
    check_tensor("weight", weight, 1)
    check_same("weight", weight, "x", x)
    check_dim("weight", weight, 0, x.shape[1])
    for name, t in (("residual", residual), ("out", out)):
        if t is not None:
            check_tensor(name, t, 2)
            check_same(name, t, "x", x)
            if t.shape != x.shape:
                raise ValueError(f"{name} shape {tuple(t.shape)} != x shape {tuple(x.shape)}")


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float,
             residual: torch.Tensor | None = None, out: torch.Tensor | None = None):
    """RMSNorm of x [T, N] into out (allocated if None); with residual [T, N] returns
    (out, x + residual)."""
    _check_args(x, weight, residual, out)
    num_rows, n = x.shape
    out = torch.empty_like(x) if out is None else out
    new_residual = torch.empty_like(x) if residual is not None else None
    if num_rows > 0:
        block = triton.next_power_of_2(n)
        _rms_norm_kernel[(num_rows,)](
            x, residual if residual is not None else x, weight, out,
            new_residual if residual is not None else out, eps,
            x.stride(0), residual.stride(0) if residual is not None else 0, out.stride(0),
            new_residual.stride(0) if residual is not None else 0,
            N=n, BLOCK=block, HAS_RESIDUAL=residual is not None,
            num_warps=min(16, max(1, block // 256)),
        )
    return out if residual is None else (out, new_residual)


def rms_norm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float,
                 residual: torch.Tensor | None = None, out: torch.Tensor | None = None):
    """Plain-torch rms_norm: same arguments and results."""
    h = x if residual is None else x + residual
    hf = h.float()
    normed = (hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + eps)).to(h.dtype)
    out = torch.mul(weight, normed, out=out)
    return out if residual is None else (out, h)
