"""rms_norm, apply_rotary and silu_and_mul against their references and Hugging Face."""

import pytest
import torch
from transformers.models.llama.modeling_llama import LlamaRMSNorm, apply_rotary_pos_emb

from kernel_cases import assert_close, gpu, nan_like, randn
from kernels.rms_norm import rms_norm, rms_norm_ref
from kernels.rotary import apply_rotary, apply_rotary_ref, build_cos_sin_cache
from kernels.silu_and_mul import silu_and_mul, silu_and_mul_ref

DTYPES = [torch.float32, torch.bfloat16, torch.float16]


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_matches_reference(gen, device, dtype):
    x = randn(gen, 5, 96, dtype=dtype, device=device)  # 96: not a power of two
    weight = randn(gen, 96, dtype=dtype, device=device)
    out = rms_norm(x, weight, 1e-5, out=nan_like(x))
    assert_close(out, rms_norm_ref(x, weight, 1e-5))


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_fused_residual(gen, device, dtype):
    x, residual = (randn(gen, 4, 64, dtype=dtype, device=device) for _ in range(2))
    weight = randn(gen, 64, dtype=dtype, device=device)
    out, new_residual = rms_norm(x, weight, 1e-6, residual=residual, out=nan_like(x))
    out_ref, residual_ref = rms_norm_ref(x, weight, 1e-6, residual=residual)
    assert torch.equal(new_residual, x + residual)  # rounded to dtype, as HF adds
    assert torch.equal(new_residual, residual_ref)
    assert_close(out, out_ref)
    # Fused == unfused bit for bit: the norm reads the sum rounded to dtype, as HF does.
    assert torch.equal(out, rms_norm(x + residual, weight, 1e-6))


def test_rms_norm_matches_hf_llama(gen, device):
    hf = LlamaRMSNorm(64, eps=1e-5).to(device=device, dtype=torch.bfloat16)
    with torch.no_grad():
        hf.weight.copy_(randn(gen, 64, dtype=torch.bfloat16, device=device))
    x = randn(gen, 6, 64, dtype=torch.bfloat16, device=device) * 3
    assert_close(rms_norm(x, hf.weight.detach(), 1e-5), hf(x).detach())


@pytest.mark.parametrize("dtype", DTYPES)
def test_rotary_matches_reference(gen, device, dtype):
    # q and k as strided views of a fused qkv projection; positions out of order.
    qkv = randn(gen, 7, (6 + 2 + 2) * 32, dtype=dtype, device=device)
    q, k = qkv[:, :6 * 32].view(7, 6, 32), qkv[:, 6 * 32:8 * 32].view(7, 2, 32)
    untouched = qkv[:, 8 * 32:].clone()
    positions = torch.randint(0, 50, (7,), generator=gen).to(device)
    cache = build_cos_sin_cache(50, 32, 10000.0, dtype, device)
    q_ref, k_ref = q.clone(), k.clone()
    apply_rotary(q, k, positions, cache)
    apply_rotary_ref(q_ref, k_ref, positions, cache)
    assert_close(q, q_ref)
    assert_close(k, k_ref)
    assert torch.equal(qkv[:, 8 * 32:], untouched)


def test_rotary_matches_hf_llama(gen, device):
    """build_cos_sin_cache + apply_rotary == HF's default rope with apply_rotary_pos_emb."""
    head_dim, theta = 64, 500000.0
    q = randn(gen, 5, 4, head_dim, dtype=torch.float32, device=device)
    k = randn(gen, 5, 2, head_dim, dtype=torch.float32, device=device)
    positions = torch.tensor([0, 3, 1, 99, 42], device=device)
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    freqs = torch.outer(positions.cpu().float(), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1).to(device)
    # HF layout: [batch, heads, seq, dim]; cos/sin [batch, seq, dim].
    q_hf, k_hf = apply_rotary_pos_emb(q.transpose(0, 1)[None], k.transpose(0, 1)[None],
                                      emb.cos()[None], emb.sin()[None])
    apply_rotary(q, k, positions, build_cos_sin_cache(100, head_dim, theta, torch.float32, device))
    torch.testing.assert_close(q, q_hf[0].transpose(0, 1), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(k, k_hf[0].transpose(0, 1), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_and_mul_matches_reference(gen, device, dtype):
    x = randn(gen, 3, 2 * 80, dtype=dtype, device=device)
    out = silu_and_mul(x, out=nan_like(x[:, :80]))
    assert out.shape == (3, 80)
    assert_close(out, silu_and_mul_ref(x))
    gate, up = x.float().chunk(2, dim=-1)
    assert_close(out, (gate * torch.sigmoid(gate) * up).to(dtype))


def test_pointwise_reject_bad_arguments(gen, device):
    x = randn(gen, 4, 64, dtype=torch.float32, device=device)
    with pytest.raises(ValueError, match="weight"):
        rms_norm(x, x[0, :32], 1e-5)
    with pytest.raises(ValueError, match="dtype"):
        rms_norm(x, x[0].half(), 1e-5)
    with pytest.raises(ValueError, match="residual"):
        rms_norm(x, x[0], 1e-5, residual=x[:2])
    with pytest.raises(ValueError, match="even"):
        silu_and_mul(x[:, :63])
    with pytest.raises(ValueError, match="out"):
        silu_and_mul(x, out=x[:, :16])
    with pytest.raises(ValueError, match="out"):
        rms_norm(x, x[0], 1e-5, out=x[:, :16])
    q, k = x.view(4, 2, 32), x.view(4, 2, 32).clone()
    cache = build_cos_sin_cache(8, 32, 10000.0, torch.float32, device)
    with pytest.raises(ValueError, match="positions"):
        apply_rotary(q, k, torch.zeros(4, dtype=torch.int32, device=device), cache)
    with pytest.raises(ValueError, match="cos_sin_cache"):
        apply_rotary(q, k, torch.zeros(4, dtype=torch.int64, device=device), cache[:, :16])


@gpu
def test_gpu_real_shapes(gen):
    x, residual = (randn(gen, 4096, 2048, dtype=torch.bfloat16, device="cuda") for _ in range(2))
    weight = randn(gen, 2048, dtype=torch.bfloat16, device="cuda")
    for got, want in zip(rms_norm(x, weight, 1e-5, residual), rms_norm_ref(x, weight, 1e-5, residual)):
        assert_close(got, want)
    assert_close(silu_and_mul(x), silu_and_mul_ref(x))
    q = randn(gen, 4096, 32, 64, dtype=torch.bfloat16, device="cuda")
    k = randn(gen, 4096, 8, 64, dtype=torch.bfloat16, device="cuda")
    positions = torch.randint(0, 8192, (4096,), generator=gen).cuda()
    cache = build_cos_sin_cache(8192, 64, 500000.0, torch.bfloat16, "cuda")
    q_ref, k_ref = q.clone(), k.clone()
    apply_rotary(q, k, positions, cache)
    apply_rotary_ref(q_ref, k_ref, positions, cache)
    assert_close(q, q_ref)
    assert_close(k, k_ref)
