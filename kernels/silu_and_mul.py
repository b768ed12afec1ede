"""SwiGLU activation: x [T, 2*I] = [gate | up] -> silu(gate) * up [T, I] (fp32 math)."""

import torch
import triton
import triton.language as tl

from kernels._checks import check_same, check_tensor

BLOCK = 1024


@triton.jit
def _silu_and_mul_kernel(x_ptr, out_ptr, stride_x, stride_o, I, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < I
    gate = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * stride_x + I + offs, mask=mask, other=0.0).to(tl.float32)
    out = gate * tl.sigmoid(gate) * up
    tl.store(out_ptr + row * stride_o + offs, out.to(out_ptr.dtype.element_ty), mask=mask)


def silu_and_mul(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """silu(x[:, :I]) * x[:, I:] for x [T, 2*I] into out [T, I] (allocated if None)."""
    check_tensor("x", x, 2)
    if x.shape[1] % 2:
        raise ValueError(f"x's last dim must be even (gate and up halves), got {x.shape[1]}")
    num_rows, inter = x.shape[0], x.shape[1] // 2
    if out is None:
        out = x.new_empty(num_rows, inter)
    check_tensor("out", out, 2)
    check_same("out", out, "x", x)
    if out.shape != (num_rows, inter):
        raise ValueError(f"out shape {tuple(out.shape)} != {(num_rows, inter)}")
    if num_rows > 0 and inter > 0:
        block = min(BLOCK, triton.next_power_of_2(inter))
        _silu_and_mul_kernel[(num_rows, triton.cdiv(inter, block))](
            x, out, x.stride(0), out.stride(0), inter, BLOCK=block)
    return out


def silu_and_mul_ref(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """Plain-torch silu_and_mul (fp32 math): same arguments and result."""
    gate, up = x.float().chunk(2, dim=-1)
    result = (torch.nn.functional.silu(gate) * up).to(x.dtype)
    return result if out is None else out.copy_(result)
