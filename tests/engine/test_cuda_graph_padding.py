"""The decode CUDA graphs' padding logic on CPU: which captured size a batch runs, what
the padding rows hold, and that the forward a graph captures, run on padded static
buffers (stale entries included), gives the eager step's hidden states and cache writes.
The forward runs the Triton backend under TRITON_INTERPRET=1 (CUDA graphs replay only
that backend); tests/engine/test_triton_gpu.py replays real graphs on a GPU."""
import os

import pytest
import torch

from engine import LLM, SamplingParams
from engine.cuda_graphs import DecodeGraphs, capture_sizes
from engine.errors import ConfigError
from engine.model_runner import _host_inputs, _pad, _tensors
from engine.request import Request
from engine.step_scheduler import ScheduledBatch

BLOCK = 16
# three decodes: contexts of 5, 20 and 37 tokens (the new token included), ragged tables
CONTEXTS = [(5, [3]), (20, [5, 9]), (37, [1, 2, 7])]
UNUSED = [b for b in range(16) if b not in {3, 5, 9, 1, 2, 7}]


def graphs_on_cpu(max_batch: int, model=None, kv_caches=()) -> DecodeGraphs:
    return DecodeGraphs(model, list(kv_caches), max_batch, max_blocks_per_seq=4,
                        max_seq_len=4 * BLOCK, device=torch.device("cpu"))


@pytest.mark.parametrize("max_batch", [1, 3, 8, 16, 20, 48, 100, 512])
def test_every_batch_up_to_the_max_gets_the_smallest_size_that_holds_it(max_batch):
    graphs = graphs_on_cpu(max_batch)
    sizes = capture_sizes(max_batch)
    assert sizes == sorted(set(sizes)) and sizes[-1] == max_batch == graphs.max_batch
    for n in range(1, max_batch + 1):
        size = graphs.padded_size(n)
        assert size in sizes and size >= n and size - n < 16, (n, size)
        assert all(s < n for s in sizes if s < size)
    assert graphs.padded_size(max_batch + 1) is None  # larger batches run eagerly


def test_graph_sizes_need_a_positive_max_batch():
    with pytest.raises(ConfigError, match="cuda_graph_max_batch"):
        LLM(model="dummy:tiny", device="cpu", cuda_graph_max_batch=0)


def decode_step():
    batch = ScheduledBatch()
    for i, (context, blocks) in enumerate(CONTEXTS):
        request = Request(f"r{i}", [100 + i] * context, SamplingParams())
        request.block_ids, request.num_computed_tokens = list(blocks), context - 1
        batch.add(request, 1)
    return _host_inputs(batch, list(range(len(CONTEXTS))), BLOCK)


def test_padding_rows_store_nothing_and_attend_to_nothing():
    step = decode_step()
    live = _tensors(step)
    host = _pad(step, 8)
    assert set(host) == {"input_ids", "positions", "slot_mapping", "seq_lens", "block_tables"}
    assert host["block_tables"].shape == (8, 3) and host["block_tables"].dtype == torch.int32
    for name, tensor in host.items():
        assert tensor.shape[0] == 8 and torch.equal(tensor[:3], live[name]), name
    assert host["slot_mapping"][3:].eq(-1).all() and host["seq_lens"][3:].eq(0).all()
    assert not host["block_tables"][3:].any()
    assert host["input_ids"][3:].eq(0).all() and host["positions"][3:].eq(0).all()
    assert host["slot_mapping"][:3].tolist() == [3 * BLOCK + 4, 9 * BLOCK + 3, 7 * BLOCK + 4]
    assert torch.equal(_pad(step, 3)["seq_lens"], live["seq_lens"])  # an exact size


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                    reason="the Triton backend on CPU needs TRITON_INTERPRET=1")
def test_padded_graph_forward_matches_the_eager_step():
    runner = LLM(model="dummy:tiny", device="cpu", attention_backend="triton",
                 num_kv_blocks=16, num_threads=1).core.runner
    gen = torch.Generator().manual_seed(0)
    for k_cache, v_cache in runner.kv_caches:
        for cache in (k_cache, v_cache):
            cache.copy_(torch.randn(cache.shape, generator=gen))
            cache[UNUSED] = 1e4  # a padding row or stale table entry reading these shows
    graph_caches = [tuple(c.clone() for c in pair) for pair in runner.kv_caches]
    graphs = graphs_on_cpu(8, runner.model, graph_caches)
    graphs.block_tables.fill_(UNUSED[-1])  # stale entries from an earlier, wider step
    step = decode_step()
    size = graphs.load(_pad(step, graphs.padded_size(3)))
    assert size == 4
    with torch.inference_mode():
        padded = graphs._forward(size)
        eager = runner._eager_forward(step)
    torch.testing.assert_close(padded[:3], eager, atol=1e-5, rtol=1e-5)
    for got, want in zip(graph_caches, runner.kv_caches):
        for g, w in zip(got, want):
            assert torch.equal(g[UNUSED], w[UNUSED])  # padding stored nothing
            torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5)
