"""The C++ packed-weight matmul (kernels/cpu/linear.cpp, through engine.cpu_backend.CpuLinear)
against F.linear: every row-tile remainder, partial last panels, bias, bad arguments."""

import pytest
import torch
import torch.nn.functional as F

from engine.cpu_backend import CpuLinear
from kernel_cases import randn


def expected(x, weight, bias):
    """F.linear in float64: the reference both fp32 summation orders are measured against."""
    return F.linear(x.double(), weight.double(), None if bias is None else bias.double()).float()


# rows: 0, each remainder of the 6-row tile (1-5, 7), decode's 32 and 100 (prefetching the
# next panel), 300 (row blocks of 108 and 42 rows at in_features 576 and 1536, last partial).
@pytest.mark.parametrize("rows", [0, 1, 2, 3, 4, 5, 6, 7, 32, 100, 300])
@pytest.mark.parametrize("out_features,in_features", [(48, 64), (100, 576), (17, 1536)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_matches_f_linear(gen, kernels, rows, out_features, in_features, with_bias):
    weight = randn(gen, out_features, in_features, dtype=torch.float32, device="cpu")
    bias = randn(gen, out_features, dtype=torch.float32, device="cpu") if with_bias else None
    x = randn(gen, rows, in_features, dtype=torch.float32, device="cpu")
    out = CpuLinear(weight, bias, kernels)(x)
    assert out.shape == (rows, out_features) and not out.isnan().any()
    torch.testing.assert_close(out, expected(x, weight, bias), rtol=1e-5, atol=1e-4)


def test_packing_layout_and_zero_padding(gen, kernels):
    weight = randn(gen, 20, 8, dtype=torch.float32, device="cpu")
    packed = kernels.pack_linear_weight(weight)
    assert packed.shape == (2, 8, 16)
    assert torch.equal(packed[0], weight[:16].T) and torch.equal(packed[1, :, :4], weight[16:].T)
    assert torch.equal(packed[1, :, 4:], torch.zeros(8, 12))


def test_strided_input_is_made_contiguous(gen, kernels):
    weight = randn(gen, 32, 24, dtype=torch.float32, device="cpu")
    x = randn(gen, 24, 10, dtype=torch.float32, device="cpu").T  # a transposed view
    torch.testing.assert_close(CpuLinear(weight, None, kernels)(x), expected(x, weight, None),
                               rtol=1e-5, atol=1e-4)


def test_rejects_bad_arguments(gen, kernels):
    weight = randn(gen, 20, 8, dtype=torch.float32, device="cpu")
    packed = kernels.pack_linear_weight(weight)
    x = randn(gen, 3, 8, dtype=torch.float32, device="cpu")
    with pytest.raises(RuntimeError, match="float32"):
        kernels.packed_linear(x.double(), packed, None, 20)
    with pytest.raises(RuntimeError, match="x must be"):
        kernels.packed_linear(x[None], packed, None, 20)
    with pytest.raises(RuntimeError, match="packed weight"):
        kernels.packed_linear(x[:, :4].contiguous(), packed, None, 20)
    for wrong in (16, 33):  # fewer columns than the panels hold, or more
        with pytest.raises(RuntimeError, match="does not match 2 panels"):
            kernels.packed_linear(x, packed, None, wrong)
    with pytest.raises(RuntimeError, match="bias must have"):
        kernels.packed_linear(x, packed, torch.zeros(16), 20)
    with pytest.raises(RuntimeError, match="contiguous"):
        kernels.packed_linear(x.T.contiguous().T, packed, None, 20)
    with pytest.raises(RuntimeError, match="weight must be"):
        kernels.pack_linear_weight(weight[0])
