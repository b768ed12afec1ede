"""engine.linear: the oneDNN path computes what F.linear does, and is used only where it can be."""
import pytest
import torch
import torch.nn.functional as F

from engine.linear import Linear, can_prepack


@pytest.mark.parametrize("rows", [1, 7, 32, 300])
@pytest.mark.parametrize("with_bias", [False, True])
def test_prepacked_matches_f_linear(rows, with_bias):
    if not can_prepack(torch.zeros(1)):
        pytest.skip("this torch build has no oneDNN")
    g = torch.Generator().manual_seed(rows)
    weight = torch.randn(96, 64, generator=g)
    bias = torch.randn(96, generator=g) if with_bias else None
    x = torch.randn(rows, 64, generator=g)
    packed = Linear(weight, bias, prepack=True)
    assert packed.prepacked and packed.weight.is_mkldnn
    torch.testing.assert_close(packed(x), F.linear(x, weight, bias), rtol=1e-5, atol=1e-4)


def test_prepack_only_for_cpu_fp32():
    weight = torch.randn(8, 4, dtype=torch.bfloat16)
    layer = Linear(weight, prepack=True)
    assert not layer.prepacked and layer.weight is weight
    assert not Linear(torch.randn(8, 4), prepack=False).prepacked
