"""GPU parity: the engine's greedy tokens with the Triton kernels (and CUDA graphs for
decode) equal those of its plain-torch path on the same GPU, same weights, fp32, for the
first 16 tokens of every request of a mixed batch. Runs on CUDA with compiled Triton."""
import os

import pytest
import torch

from engine import LLM, SamplingParams

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1",
                       reason="needs CUDA and compiled Triton (TRITON_INTERPRET unset)"),
]

PREFIX = [(31 * i + 7) % 20000 + 100 for i in range(300)]  # shared by half the prompts


def mixed_prompts() -> list[list[int]]:
    """20 prompts of 1 to 1100 tokens: ragged, partial last blocks, multi-partition
    contexts, and 300-token shared prefixes (prefix-cache extends)."""
    gen = torch.Generator().manual_seed(0)
    lengths = [1, 5, 16, 17, 33, 64, 100, 255, 257, 511, 700, 1100, 3, 40, 128, 250, 300,
               420, 640, 900]
    prompts = []
    for i, n in enumerate(lengths):
        tail = torch.randint(100, 40000, (n,), generator=gen).tolist()
        prompts.append(PREFIX + tail if i % 2 else tail)
    return prompts


def greedy(backend: str, use_cuda_graph: bool) -> list:
    # A 512-token budget chunks the long prompts and mixes decodes with prefill chunks;
    # decode batch sizes shrink as requests finish, so several graph sizes replay. A fixed
    # pool (1.5 GiB) leaves room for the second engine while the first is still alive.
    llm = LLM(model="dummy:smollm2-135m", device="cuda", dtype="float32",
              attention_backend=backend, use_cuda_graph=use_cuda_graph,
              max_num_batched_tokens=512, max_num_seqs=32, num_kv_blocks=2048)
    warm = llm.generate([PREFIX], SamplingParams(max_tokens=1, temperature=0, ignore_eos=True))
    prompts = mixed_prompts()
    params = [SamplingParams(max_tokens=16 + 4 * (i % 5), temperature=0, ignore_eos=True)
              for i in range(len(prompts))]
    outs = llm.generate(prompts, params)
    assert warm[0].token_ids
    graphs = llm.core.runner.graphs
    return outs, graphs.num_replays if graphs is not None else 0


def test_triton_with_cuda_graphs_matches_torch_greedy_fp32():
    triton_outs, replays = greedy("triton", use_cuda_graph=True)
    torch_outs, _ = greedy("torch", use_cuda_graph=False)
    assert replays >= 10  # decode steps ran from captured graphs
    assert any(o.num_cached_tokens >= 288 for o in triton_outs)  # prefix hits ran
    diverged = [i for i, (got, want) in enumerate(zip(triton_outs, torch_outs))
                if got.token_ids[:16] != want.token_ids[:16]]
    assert not diverged, f"requests {diverged} diverged within their first 16 tokens"
