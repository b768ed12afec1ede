"""The weight-only quantized matmul (kernels/cpu/quant_*.cpp) against dequantize-then-matmul:
every block format, every instruction-set path this CPU has (each forced in turn), decode's
one row and batched rows with every tile remainder, odd output counts, bias, the embedding
lookup and bad arguments."""

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize, quantize

import kernels.cpu as cpu_kernels
from engine.quant.linear import QuantLinear
from engine.quant.weights import FORMATS, QuantWeight


@pytest.fixture(scope="module")
def quant():
    built = cpu_kernels.load_quant()
    if built is None:
        pytest.skip("the quantized C++ kernels did not build here (no compiler or ninja)")
    return built


def isa_or_skip(quant, name: str) -> int:
    isa = cpu_kernels.QUANT_ISAS[name]
    if not quant.isa_supported(isa):
        pytest.skip(f"this CPU has no {name}")
    return isa


def packed(rng, fmt: str, out_features: int, in_features: int):
    """A random weight in `fmt` (gguf's own quantizer) and its fp64 dequantized values."""
    kind = GGMLQuantizationType[fmt]
    blocks = quantize(rng.standard_normal((out_features, in_features)).astype(np.float32), kind)
    return torch.from_numpy(blocks), torch.from_numpy(dequantize(blocks, kind)).double()


@pytest.mark.parametrize("isa", sorted(cpu_kernels.QUANT_ISAS))
@pytest.mark.parametrize("fmt", sorted(FORMATS))
# rows: decode's 1, each remainder of the 4-row tile, 8 and 33 (batched decode), 200 (row
# blocks); out_features: under, at and past the 4-row weight group, odd counts; in_features
# from one block up to the model's 1536.
@pytest.mark.parametrize("rows", [1, 2, 3, 5, 8, 33, 200])
@pytest.mark.parametrize("out_features,in_features", [(1, 32), (7, 96), (13, 576),
                                                      (66, 1536)])
def test_matches_dequantized_matmul(quant, isa, fmt, rows, out_features, in_features):
    isa_id = isa_or_skip(quant, isa)
    rng = np.random.default_rng(rows * 1000 + out_features)
    weight, dense = packed(rng, fmt, out_features, in_features)
    x = torch.from_numpy(rng.standard_normal((rows, in_features)).astype(np.float32))
    out = quant.quant_linear(x, weight, FORMATS[fmt][0], None, isa_id)
    torch.testing.assert_close(out, (x.double() @ dense.T).float(), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("isa", sorted(cpu_kernels.QUANT_ISAS))
def test_bias_and_forced_isa_through_quant_linear(quant, isa, monkeypatch):
    isa_or_skip(quant, isa)
    monkeypatch.setenv(cpu_kernels.QUANT_ISA_ENV, isa)
    rng = np.random.default_rng(7)
    weight, dense = packed(rng, "Q4_1", 37, 64)
    bias = torch.from_numpy(rng.standard_normal(37).astype(np.float32))
    layer = QuantLinear(QuantWeight(weight, "Q4_1", 64), bias, quant)
    assert layer.isa == cpu_kernels.QUANT_ISAS[isa]
    x = torch.from_numpy(rng.standard_normal((6, 64)).astype(np.float32))
    torch.testing.assert_close(layer(x), (x.double() @ dense.T + bias.double()).float(),
                               rtol=1e-5, atol=1e-4)


def test_best_isa_is_the_widest_supported(quant):
    best = quant.best_isa()
    assert quant.isa_supported(best)
    assert all(not quant.isa_supported(isa) for isa in cpu_kernels.QUANT_ISAS.values()
               if isa > best)


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_embedding_unpacks_the_rows_asked_for(quant, fmt):
    rng = np.random.default_rng(3)
    weight, dense = packed(rng, fmt, 50, 96)
    ids = torch.tensor([49, 0, 7, 7, 13])
    out = quant.quant_embedding(ids, weight, FORMATS[fmt][0], 96)
    assert torch.equal(out, dense[ids].float())


def test_bad_arguments_are_refused(quant):
    rng = np.random.default_rng(5)
    weight, _ = packed(rng, "Q8_0", 4, 64)
    with pytest.raises(RuntimeError, match="multiple of 32"):
        quant.quant_linear(torch.zeros(1, 48), weight, 2, None, -1)
    with pytest.raises(RuntimeError, match="packed weight"):
        quant.quant_linear(torch.zeros(1, 64), weight, 1, None, -1)  # Q4_1 rows are 40 bytes
    with pytest.raises(RuntimeError, match="out of range"):
        quant.quant_embedding(torch.tensor([4]), weight, 2, 64)
    with pytest.raises(ValueError, match=cpu_kernels.QUANT_ISA_ENV):
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv(cpu_kernels.QUANT_ISA_ENV, "sse9")
            cpu_kernels.quant_isa()
