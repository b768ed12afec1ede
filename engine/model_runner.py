"""ModelRunner: turns a scheduled batch into tensors, runs the model, samples.

Inputs for a step are built once on the host and copied to the device in one go
(through pinned memory on CUDA). Decode requests go first in the token order.
"""
from __future__ import annotations

import functools
import logging
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

import kernels.cpu as cpu_kernels
from engine.attention import AttentionMetadata, TorchAttention
from engine.config import EngineConfig, cpu_kv_cache_bytes
from engine.cpu_backend import CpuAttention, CpuOps
from engine.cpu_decode import CpuDecodeStack
from engine.cuda_graphs import DecodeGraphs
from engine.host_memory import lazy_zeros
from engine.linear import Linear
from engine.loader import LoadedModel
from engine.models.gemma3 import Gemma3Model
from engine.models.llama import LlamaModel
from engine.ops import TorchOps
from engine.outputs import SampledToken
from engine.quant.linear import quant_aware
from engine.quant.weights import QuantWeight
from engine.sampler import Sampler
from engine.speculative.verify import sample_verified
from engine.step_scheduler import ScheduledBatch

log = logging.getLogger(__name__)


class ModelRunner:
    """Owns the model, the KV cache tensors and the sampler."""

    def __init__(self, config: EngineConfig, loaded: LoadedModel, max_model_len: int):
        self.config = config
        self.device = config.resolved_device()
        self.dtype = config.resolved_dtype()
        c = loaded.config
        make_attention, ops = self._backends(c, quantized=any(
            isinstance(w, QuantWeight) for w in loaded.weights.values()))
        model_class = Gemma3Model if c.architecture == "gemma3" else LlamaModel
        self.model = model_class(c, loaded.weights, make_attention, ops,
                                 max_positions=max_model_len,
                                 make_linear=quant_aware(self._linear_factory(ops)))
        self.sampler = Sampler(config.seed)
        self.block_size = config.block_size
        # A dummy model may have more vocab rows than the tokenizer: never sample those.
        self.sample_vocab = min(c.vocab_size, len(loaded.tokenizer))
        self.num_blocks = config.num_kv_blocks or self._measure_num_blocks(c, max_model_len)
        shape = (self.num_blocks, self.block_size, c.num_kv_heads, c.head_dim)
        self.kv_caches = [(_zeros(shape, self.dtype, self.device),
                           _zeros(shape, self.dtype, self.device)) for _ in range(c.num_layers)]
        self.graphs = self._decode_graphs(max_model_len)
        self.decode_stack = CpuDecodeStack.build(self.model) if config.cpu_fused_decode \
            else None

    def _backends(self, c, quantized: bool):
        """(make_attention(window), ops) for this device and backend; quantized: the
        model's weights are (some of them) quantized."""
        shape = (c.num_heads, c.num_kv_heads, c.head_dim)
        if self.config.use_triton():
            from engine.triton_backend import TritonAttention, TritonOps
            return (lambda window: TritonAttention(*shape, scale=c.attention_scale,
                                                   window=window)), TritonOps
        if self.device.type == "cpu" and self.config.attention_backend in ("auto", "cpu"):
            kernels = cpu_kernels.load()
            if kernels is not None:
                bf16 = cpu_kernels.prefill_attention_bf16(kernels, quantized)
                cpu = functools.partial(CpuAttention, kernels=kernels, prefill_bf16=bf16)
                return functools.partial(_attention, cpu, shape, c), CpuOps(kernels)
            if self.config.attention_backend == "cpu":
                raise RuntimeError("attention_backend='cpu': the C++ kernels failed to build "
                                   "(see the warning above; needs a C++ compiler and ninja)")
        return functools.partial(_attention, TorchAttention, shape, c), TorchOps

    def _linear_factory(self, ops):
        """How projections are built: on CPU in fp32 with cpu_weight_prepack, weights are
        packed once at load for the C++ matmul (oneDNN's reorder without the C++ kernels)."""
        if not self.config.cpu_weight_prepack:
            return Linear
        if isinstance(ops, CpuOps) and self.dtype == torch.float32:
            return ops.linear
        return functools.partial(Linear, prepack=True)

    def kv_bytes_per_block(self, c) -> int:
        return 2 * c.num_layers * self.block_size * c.num_kv_heads * c.head_dim * \
            torch.tensor([], dtype=self.dtype).element_size()

    def _measure_num_blocks(self, c, max_model_len: int) -> int:
        """KV pool size from measured free memory (after weights are resident)."""
        if self.device.type == "cuda":
            free, total = torch.cuda.mem_get_info(self.device)
            # keep (1 - fraction) of the card plus room for one step's activations
            budget = free - (1 - self.config.kv_memory_fraction) * total - self._activation_bytes(c)
            cap = self.config.kv_cache_max_bytes
        else:
            import psutil
            budget = psutil.virtual_memory().available * self.config.kv_memory_fraction
            per_token = self.kv_bytes_per_block(c) // self.block_size
            cap = self.config.kv_cache_max_bytes or cpu_kv_cache_bytes(per_token, max_model_len)
        budget = min(budget, cap) if cap else budget
        num_blocks = int(budget // self.kv_bytes_per_block(c))
        if num_blocks < 2:
            raise RuntimeError(f"not enough memory for a KV cache ({budget / 2**20:.0f} MiB)")
        log.info("KV cache: %d blocks of %d tokens (%.0f MiB)", num_blocks, self.block_size,
                 num_blocks * self.kv_bytes_per_block(c) / 2**20)
        return num_blocks

    def _activation_bytes(self, c) -> int:
        tokens = self.config.max_num_batched_tokens
        per_token = 4 * (c.hidden_size * 4 + c.intermediate_size * 3) + 4 * c.vocab_size // 8
        return tokens * per_token + self.config.max_num_seqs * c.vocab_size * 4

    # -- CUDA graphs ----------------------------------------------------------------
    def _decode_graphs(self, max_model_len: int) -> DecodeGraphs | None:
        c = self.config
        if not (c.use_cuda_graph and self.device.type == "cuda" and c.use_triton()):
            return None
        max_model_len = min(max_model_len, self.num_blocks * self.block_size)
        graphs = DecodeGraphs(self.model, self.kv_caches,
                              min(c.cuda_graph_max_batch, c.max_num_seqs),
                              max_blocks_per_seq=-(-max_model_len // self.block_size),
                              max_seq_len=max_model_len, device=self.device)
        graphs.capture()
        return graphs

    # -- one step ------------------------------------------------------------------
    @torch.inference_mode()
    def execute(self, batch: ScheduledBatch) -> list[list[SampledToken]]:
        """Run one step; one entry per scheduled request, in batch order: the token sampled
        for a request that caught up (with its log-probabilities when asked), else []; for a
        request with proposed tokens, the accepted ones and the token sampled after them."""
        order = sorted(range(len(batch.requests)), key=lambda i: not _decodes(batch, i))
        step = _host_inputs(batch, order, self.block_size)
        graph_size = self._graph_size(step)
        if graph_size:
            hidden = self.graphs.replay(self._pinned(_pad(step, graph_size)),
                                        len(step.query_lens))
        else:
            hidden = self._eager_forward(step)
        sampled: list[list[SampledToken]] = [[] for _ in batch.requests]
        if not step.sample_rows:
            return sampled
        index = self._to_device(torch.tensor(step.sample_index, dtype=torch.long))
        logits = self.model.compute_logits(hidden[index])[:, :self.sample_vocab]
        requests = [batch.requests[i] for i in step.sample_rows]
        if len(step.sample_index) > len(requests):  # some rows verify proposed tokens
            for i, tokens in zip(step.sample_rows, sample_verified(self.sampler, logits,
                                                                   requests)):
                sampled[i] = tokens
            return sampled
        tokens, logprobs = self.sampler.sample(logits, requests)
        for i, token, logprob in zip(step.sample_rows, tokens, logprobs):
            sampled[i] = [SampledToken(token, logprob)]
        return sampled

    def _graph_size(self, step: "HostInputs") -> int | None:
        if self.graphs is None or any(n != 1 for n in step.query_lens):
            return None
        return self.graphs.padded_size(len(step.query_lens))

    def _eager_forward(self, step: "HostInputs") -> torch.Tensor:
        host = _tensors(step)
        dev = {k: self._to_device(v) for k, v in host.items()}
        meta = AttentionMetadata(
            slot_mapping=dev["slot_mapping"], block_tables=dev["block_tables"],
            seq_lens=dev["seq_lens"], query_start_loc=dev["query_start_loc"],
            num_decodes=step.query_lens.count(1), max_seq_len=max(step.seq_lens),
            query_lens_host=step.query_lens, seq_lens_host=step.seq_lens)
        forward = self.model.forward
        if self.decode_stack is not None and meta.num_decodes == len(step.query_lens):
            forward = self.decode_stack.forward
        return forward(dev["input_ids"], dev["positions"], meta, self.kv_caches)

    def _pinned(self, host: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {k: v.pin_memory() for k, v in host.items()}

    def _to_device(self, t: torch.Tensor) -> torch.Tensor:
        if self.device.type == "cpu":
            return t
        return t.pin_memory().to(self.device, non_blocking=True)


@dataclass
class HostInputs:
    """One step's inputs as host lists, tokens ordered decodes first. block_tables,
    seq_lens and query_lens have one entry per attention row: a decode row per token of a
    decoding request, then one per prefill/extend request."""

    input_ids: list[int] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)
    slot_mapping: list[int] = field(default_factory=list)
    block_tables: list[list[int]] = field(default_factory=list)
    seq_lens: list[int] = field(default_factory=list)
    query_lens: list[int] = field(default_factory=list)
    sample_rows: list[int] = field(default_factory=list)  # batch rows that sample a token
    # their last token's position; with proposed tokens, those before them too
    sample_index: list[int] = field(default_factory=list)


def _decodes(batch: ScheduledBatch, i: int) -> bool:
    """Whether request i computes only its last token and any proposed tokens after it."""
    return batch.num_new_tokens[i] == 1 or bool(batch.requests[i].spec_token_ids)


def _host_inputs(batch: ScheduledBatch, order: list[int], block_size: int) -> HostInputs:
    """A request with proposed tokens computes them after its last real token, and
    samples at each of those positions (the verification's target distributions). Each
    of its tokens is a decode row of its own, attending to the context up to itself, so
    a verification runs wherever a decode does (the fused CPU stack, CUDA graphs):

        input_ids:    [ t  d0 d1 d2 ]     position p .. p + 3
        seq_lens:     [p+1 p+2 p+3 p+4]   each row's own causal context
        block_tables: [ B  B  B  B ]      the request's table, once per row
        sample_index:   ^  ^  ^  ^        (4 rows of logits for one request)
    """
    step = HostInputs()
    for i in order:
        request, n = batch.requests[i], batch.num_new_tokens[i]
        start = request.num_computed_tokens
        blocks = request.block_ids
        drafts = request.spec_token_ids
        if drafts:  # they follow the last real token (only the uncomputed tail is copied)
            step.input_ids.extend((request.all_token_ids[start:] + drafts)[:n])
        else:
            step.input_ids.extend(request.all_token_ids[start:start + n])
        step.positions.extend(range(start, start + n))
        step.slot_mapping.extend(blocks[p // block_size] * block_size + p % block_size
                                 for p in range(start, start + n))
        if _decodes(batch, i):
            step.block_tables.extend([blocks] * n)
            step.seq_lens.extend(range(start + 1, start + n + 1))
            step.query_lens.extend([1] * n)
        else:
            step.block_tables.append(blocks)
            step.seq_lens.append(start + n)
            step.query_lens.append(n)
        if start + n == request.num_tokens + len(drafts):
            step.sample_rows.append(i)
            end = len(step.input_ids)
            step.sample_index.extend(range(end - 1 - len(drafts), end))
    return step


def _tensors(step: HostInputs) -> dict[str, torch.Tensor]:
    width = max(len(t) for t in step.block_tables)
    tables = [t + [0] * (width - len(t)) for t in step.block_tables]
    return {
        "input_ids": torch.tensor(step.input_ids, dtype=torch.long),
        "positions": torch.tensor(step.positions, dtype=torch.long),
        "slot_mapping": torch.tensor(step.slot_mapping, dtype=torch.long),
        "block_tables": torch.tensor(tables, dtype=torch.int32),
        "seq_lens": torch.tensor(step.seq_lens, dtype=torch.int32),
        "query_start_loc": torch.tensor([0] + _cumsum(step.query_lens), dtype=torch.int32),
    }


def _pad(step: HostInputs, size: int) -> dict[str, torch.Tensor]:
    """A decode step's tensors padded to a captured graph size: padding rows store nothing
    (slot -1) and attend to nothing (length 0)."""
    host = _tensors(step)
    pad = size - len(step.query_lens)
    del host["query_start_loc"]  # fixed arange in the graph's buffers
    if pad:
        host["input_ids"] = F.pad(host["input_ids"], (0, pad))
        host["positions"] = F.pad(host["positions"], (0, pad))
        host["slot_mapping"] = F.pad(host["slot_mapping"], (0, pad), value=-1)
        host["seq_lens"] = F.pad(host["seq_lens"], (0, pad), value=0)
        host["block_tables"] = F.pad(host["block_tables"], (0, 0, 0, pad))
    return host


def _attention(backend, shape: tuple, c, window: int | None):
    """A backend's attention for layers with `window`, scaled as the model says."""
    return backend(*shape, window=window, scale=c.attention_scale)


def _zeros(shape: tuple, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A zeroed KV tensor: on CPU lazily mapped, in small pages (host_memory.lazy_zeros)."""
    if device.type == "cpu":
        return lazy_zeros(shape, dtype)
    return torch.zeros(shape, dtype=dtype, device=device)


def _cumsum(values: list[int]) -> list[int]:
    out, total = [], 0
    for v in values:
        total += v
        out.append(total)
    return out
