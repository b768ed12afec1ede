"""The weight-only quantized matmul (kernels/cpu/quant_*.cpp) against dequantize-then-matmul:
every GGUF format the loader keeps packed, every instruction-set path (each forced in turn;
AVX-512 emulated in portable C where this CPU lacks it), decode's one row and batched rows
past every tile edge, odd output counts, in_features that are not whole groups of 128, bias,
the embedding lookup, the regrouped layout against gguf's own dequantization, and bad
arguments."""

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize

import kernels.cpu as cpu_kernels
from engine.quant.layout import FORMATS
from engine.quant.linear import QuantLinear
from engine.quant.weights import QuantWeight, cat_rows
from tests.kernels import emulated_avx512
from tests.kernels.quant_blocks import LEGACY, gguf_blocks


@pytest.fixture(scope="module")
def quant():
    built = cpu_kernels.load_quant()
    if built is None:
        pytest.skip("the quantized C++ kernels did not build here (no compiler or ninja)")
    return built


def kernels_for(quant, name: str):
    """The module and instruction-set id that run `name`'s path: this CPU's own, or where
    the CPU has no AVX-512, the build that emulates it (emulated_avx512.py)."""
    isa = cpu_kernels.QUANT_ISAS[name]
    if quant.isa_supported(isa):
        return quant, isa
    if name == "avx512":
        return emulated_avx512.load(), isa
    pytest.skip(f"this CPU has no {name}")


def packed(rng, fmt, out_features, in_features):
    blocks = gguf_blocks(rng, fmt, out_features, in_features)
    dense = dequantize(blocks, GGMLQuantizationType[fmt])
    return QuantWeight.from_blocks(blocks, fmt, in_features), torch.from_numpy(dense).double()


def rounded_levels(x: np.ndarray, levels: int = 3) -> np.ndarray:
    """The kernels' activation rounding (quant_kernels.h), in the same fp32 steps:
    per 32-block x ~= d * (p1 + p2 / 128 + p3 / 128^2) with d = max|x| / 127, the first
    `levels` terms of it (the AVX2 and AVX-512 dots read two, portable three)."""
    blocks = x.reshape(x.shape[0], -1, 32).astype(np.float32)
    amax = np.abs(blocks).max(axis=-1, keepdims=True)
    with np.errstate(divide="ignore"):
        v = blocks * np.where(amax > 0, np.float32(127) / amax, np.float32(0))
    rounded = np.zeros(blocks.shape, np.float64)
    for level in range(levels):
        p = np.rint(v)
        assert np.abs(p).max() <= (127 if level == 0 else 64)  # fits int8
        rounded += p.astype(np.float64) / 128.0 ** level
        v = (v - p) * np.float32(128)
    return ((amax / np.float32(127)).astype(np.float64) * rounded).reshape(x.shape)


def reference(x: torch.Tensor, weight: QuantWeight, dense: torch.Tensor,
              levels: int) -> torch.Tensor:
    """Dequantize-then-matmul in fp64 on the rounded activations, with the offsets (the
    `+ offset` part of every weight) against the exact x, as the kernels take them."""
    offsets = torch.from_numpy(np.repeat(weight.offsets.numpy().astype(np.float64), weight.sub,
                                         axis=1)[:, :weight.in_features])
    xr = torch.from_numpy(rounded_levels(x.numpy(), levels))
    return xr @ (dense - offsets).T + x.double() @ offsets.T


def expected(quant, isa_id: int, x: torch.Tensor, weight: QuantWeight,
             dense: torch.Tensor) -> torch.Tensor:
    """What the kernels compute for these rows: on the rounded activations, or from
    exact_rows(isa, sub) on (AVX2's unpacked path, the dense one) on the exact ones."""
    if x.shape[0] >= quant.exact_rows(isa_id, weight.sub):
        return x.double() @ dense.T
    return reference(x, weight, dense, quant.activation_levels(isa_id))


SHAPES = {  # (out_features, in_features): k under/at/past a group of 128; odd row counts
    # whose last 16 rows (AVX2's unpacked path's chunk) end in tiles of 1 to 6 rows
    "legacy": [(1, 32), (7, 96), (19, 576), (66, 1536)],
    "k": [(1, 256), (7, 512), (21, 768), (69, 1536)],
}


@pytest.mark.parametrize("isa", sorted(cpu_kernels.QUANT_ISAS))
@pytest.mark.parametrize("fmt", sorted(FORMATS))
# rows: decode's 1, odd and even counts around the 2- and 4-row tiles (AVX-512's dots: 2
# and 3 a partial tile alone, 6 and 11 one after whole tiles, 5 a single row after one), 11
# (AVX2's last on the int8 dots), 12 (its unpacked path's first: a panel of 8 rows and half
# of one), 17 and 33 past 16-row blocks (the last panel one row and seven of padding; on the
# weight panels of AMX and AVX-512, 12 their first and a 16-row tile with padding, 16 a
# whole one; AVX-512's panels take a tile's rows 4 at a time, so 14 and 31 end a tile in 2
# and 3 rows after whole groups), 200 (several blocks and chunks)
@pytest.mark.parametrize("rows", [1, 2, 3, 5, 6, 11, 12, 14, 16, 17, 31, 33, 200])
@pytest.mark.parametrize("shape", range(4))
def test_matches_dequantized_matmul(quant, isa, fmt, rows, shape):
    quant, isa_id = kernels_for(quant, isa)
    out_features, in_features = SHAPES["legacy" if fmt in LEGACY else "k"][shape]
    rng = np.random.default_rng(rows * 1000 + out_features)
    weight, dense = packed(rng, fmt, out_features, in_features)
    x = torch.from_numpy(rng.standard_normal((rows, in_features)).astype(np.float32))
    out = quant.quant_linear(x, weight.codes, weight.scales, weight.offsets, weight.bits,
                             weight.sub, None, isa_id)
    scale = (x.double().abs() @ dense.abs().T).max().item()  # the size of the sums' terms
    torch.testing.assert_close(out.double(), expected(quant, isa_id, x, weight, dense), rtol=0,
                               atol=2e-6 * scale)
    # and against the unrounded activations: within the rounding's bound, d / 2 at one
    # level and 128 times less per level after it
    step = 2 ** (1 + 7 * (quant.activation_levels(isa_id) - 1))
    bound = x.double().abs().reshape(rows, -1, 32).amax(-1).repeat_interleave(32, 1) / 127 / step
    assert ((out.double() - x.double() @ dense.T).abs() <= bound @ dense.abs().T
            + 2e-6 * scale).all()


@pytest.mark.parametrize("isa", sorted(cpu_kernels.QUANT_ISAS))
@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_prefill_sized_batches_take_exact_activations(quant, isa, fmt):
    """From dense_rows() rows on, the weight is unpacked to fp32 and multiplied by torch's
    GEMM: the product of the exact activations, to fp32's rounding, bias included. The weight
    panels (AMX, AVX-512) keep sub-32 weights at every size: their two levels, bias included."""
    quant, isa_id = kernels_for(quant, isa)
    rng = np.random.default_rng(9)
    in_features = 576 if fmt in LEGACY else 768
    weight, dense = packed(rng, fmt, 37, in_features)
    rows = quant.dense_rows() + 3
    x = torch.from_numpy(rng.standard_normal((rows, in_features)).astype(np.float32))
    bias = torch.from_numpy(rng.standard_normal(37).astype(np.float32))
    out = quant.quant_linear(x, weight.codes, weight.scales, weight.offsets, weight.bits,
                             weight.sub, bias, isa_id)
    scale = (x.double().abs() @ dense.abs().T).max().item()
    if rows < quant.exact_rows(isa_id, weight.sub):
        torch.testing.assert_close(out.double(), expected(quant, isa_id, x, weight, dense)
                                   + bias.double(), rtol=0, atol=2e-6 * scale)
        return
    torch.testing.assert_close(out.double(), x.double() @ dense.T + bias.double(), rtol=0,
                               atol=1e-6 * scale)


@pytest.mark.parametrize("isa", sorted(cpu_kernels.QUANT_ISAS))
# each path: int8 dots (5: a single row after a tile, 6: a partial tile), unpacked, dense
@pytest.mark.parametrize("rows", [1, 5, 6, 13, 300])
def test_nan_and_inf_rows_give_non_finite_outputs_and_spare_the_others(quant, isa, rows):
    """A NaN or an inf in a row makes that row's outputs non-finite, as fp32 arithmetic would
    (the int8 paths set the block's scale to NaN: rounding would hide it), and no other
    row's."""
    quant, isa_id = kernels_for(quant, isa)
    rng = np.random.default_rng(11)
    weight, _ = packed(rng, "Q4_1", 21, 256)
    x = torch.from_numpy(rng.standard_normal((rows, 256)).astype(np.float32))
    x[0, 40] = float("nan")
    x[rows - 1, 200] = float("inf")
    out = quant.quant_linear(x, weight.codes, weight.scales, weight.offsets, weight.bits,
                             weight.sub, None, isa_id)
    bad = torch.zeros(rows, dtype=torch.bool)
    bad[[0, rows - 1]] = True
    assert not torch.isfinite(out[bad]).any()
    assert torch.isfinite(out[~bad]).all()


@pytest.mark.parametrize("levels, step", [(1, 2), (2, 2**8), (3, 2**15)])
def test_each_level_rounds_128_times_finer(levels, step):
    """One int8 level is off by up to d / 2; two by d / 2^8, three by d / 2^15 (and fp32's
    own rounding), and no tighter: the bound is reached within a factor of 4."""
    x = np.random.default_rng(1).standard_normal((4, 256)).astype(np.float32)
    d = np.abs(x.reshape(4, -1, 32)).max(-1, keepdims=True) / 127
    err = np.abs(rounded_levels(x, levels) - x).reshape(4, -1, 32)
    assert (err <= d / step + np.abs(x.reshape(4, -1, 32)) * 2**-23).all()
    assert (err / d).max() > 1 / (4 * step)


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_layout_dequantizes_as_gguf(fmt):
    weight, dense = packed(np.random.default_rng(2), fmt, 9, 512)
    assert torch.equal(weight.dequantize(), dense.float())
    expected_dtype = torch.float16 if fmt in LEGACY else torch.float32
    assert weight.scales.dtype == expected_dtype  # exact fp16 kept as fp16, else fp32


@pytest.mark.parametrize("fmt", sorted(FORMATS))
@pytest.mark.parametrize("count", [5, 301])  # a decode step's few ids, a prefill's many
def test_embedding_unpacks_the_rows_asked_for(quant, fmt, count):
    weight, dense = packed(np.random.default_rng(3), fmt, 50, 256)
    ids = torch.tensor([49, 0, 7, 7, 13] * (count // 5) + [1] * (count % 5))
    out = quant.quant_embedding(ids, weight.codes, weight.scales, weight.offsets, weight.bits,
                                weight.sub, 256, weight.fused)
    assert torch.equal(out, dense[ids].float())


def test_rows_of_two_formats_share_one_matrix(quant):
    """A Q4_K q beside a Q6_K v (llama.cpp's Q4_K_M files): one wider matrix, same values."""
    rng = np.random.default_rng(4)
    q, q_dense = packed(rng, "Q4_K", 8, 256)
    v, v_dense = packed(rng, "Q6_K", 4, 256)
    both = cat_rows([q, v])
    assert (both.bits, both.sub, both.fmt) == (8, 16, "Q4_K+Q6_K")
    dense = torch.cat([q_dense, v_dense])
    x = torch.from_numpy(rng.standard_normal((3, 256)).astype(np.float32))
    out = quant.quant_linear(x, both.codes, both.scales, both.offsets, both.bits, both.sub,
                             None, -1)
    scale = (x.double().abs() @ dense.abs().T).max().item()
    torch.testing.assert_close(out.double(), expected(quant, quant.best_isa(), x, both, dense),
                               rtol=0, atol=2e-6 * scale)


@pytest.mark.parametrize("isa", sorted(cpu_kernels.QUANT_ISAS))
def test_bias_and_forced_isa_through_quant_linear(quant, isa, monkeypatch):
    quant, _ = kernels_for(quant, isa)
    monkeypatch.setenv(cpu_kernels.QUANT_ISA_ENV, isa)
    rng = np.random.default_rng(7)
    weight, dense = packed(rng, "Q4_1", 37, 64)
    bias = torch.from_numpy(rng.standard_normal(37).astype(np.float32))
    layer = QuantLinear(weight, bias, quant)
    assert layer.isa == cpu_kernels.QUANT_ISAS[isa]
    x = torch.from_numpy(rng.standard_normal((6, 64)).astype(np.float32))
    torch.testing.assert_close(layer(x).double(),
                               expected(quant, layer.isa, x, weight, dense) + bias.double(),
                               rtol=0, atol=1e-4)


def test_best_isa_is_the_widest_supported(quant):
    best = quant.best_isa()
    assert quant.isa_supported(best)
    assert all(not quant.isa_supported(isa) for isa in cpu_kernels.QUANT_ISAS.values()
               if isa > best)


def test_threads_split_the_rows_alike(quant):
    """The worker pool's chunks cover every row once, whatever the thread count."""
    rng = np.random.default_rng(8)
    weight, _ = packed(rng, "Q8_0", 4099, 256)
    x = torch.from_numpy(rng.standard_normal((3, 256)).astype(np.float32))
    threads = torch.get_num_threads()
    try:
        outs = []
        for n in (1, 2, 3):
            torch.set_num_threads(n)
            outs.append(quant.quant_linear(x, weight.codes, weight.scales, weight.offsets, 8,
                                           32, None, -1))
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])


def test_bad_arguments_are_refused(quant):
    weight, _ = packed(np.random.default_rng(5), "Q8_0", 4, 64)
    args = (weight.codes, weight.scales, weight.offsets)
    with pytest.raises(RuntimeError, match="multiple of 32"):
        quant.quant_linear(torch.zeros(1, 48), *args, 8, 32, None, -1)
    with pytest.raises(RuntimeError, match="codes must be"):
        quant.quant_linear(torch.zeros(1, 64), *args, 4, 32, None, -1)  # 4-bit rows: 64 bytes
    with pytest.raises(RuntimeError, match="scales and offsets"):
        quant.quant_linear(torch.zeros(1, 64), *args, 8, 16, None, -1)
    with pytest.raises(RuntimeError, match="scales and offsets"):
        quant.quant_linear(torch.zeros(1, 64), weight.codes, weight.scales,
                           weight.offsets.float(), 8, 32, None, -1)
    with pytest.raises(RuntimeError, match="out of range"):
        quant.quant_embedding(torch.tensor([4]), *args, 8, 32, 64, True)
    with pytest.raises(ValueError, match=cpu_kernels.QUANT_ISA_ENV):
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv(cpu_kernels.QUANT_ISA_ENV, "sse9")
            cpu_kernels.quant_isa()
