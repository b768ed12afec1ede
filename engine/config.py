"""EngineConfig: every engine limit in one frozen dataclass, validated when built."""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from engine.errors import ConfigError

# The KV pool on CPU when kv_cache_max_bytes is None: room for one sequence of the whole
# context (max_model_len), but at least the MIN and at most the MAX. The pool is allocated
# whole at start and on CPU competes with the rest of the host's memory, so it is sized for
# what the model needs, not for what is free: 360 MiB for SmolLM2-135M's 8192 tokens
# (~8,000 tokens: 32 streams of 256), instead of a flat 1 GiB.
CPU_KV_CACHE_MIN_BYTES = 256 << 20
CPU_KV_CACHE_MAX_BYTES = 1 << 30


def cpu_kv_cache_bytes(bytes_per_token: int, max_model_len: int) -> int:
    """The CPU pool's default size (see above)."""
    one_sequence = bytes_per_token * max_model_len
    return min(CPU_KV_CACHE_MAX_BYTES, max(CPU_KV_CACHE_MIN_BYTES, one_sequence))

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """Model and engine limits.

    model: "default" (embedded SmolLM2-135M-Instruct), a local HF directory, or "dummy:NAME".
    num_kv_blocks: None sizes the KV pool from measured free memory (kv_memory_fraction of
    what is free after the weights and a warm-up step, capped by kv_cache_max_bytes).
    """

    model: str = "default"
    device: str = "auto"  # "auto" -> cuda if available else cpu
    dtype: str = "auto"  # "auto" -> float32 on CPU, bfloat16 on CUDA
    block_size: int = 16
    num_kv_blocks: int | None = None
    kv_memory_fraction: float = 0.85
    kv_cache_max_bytes: int | None = None  # None: cpu_kv_cache_bytes on CPU, no cap on CUDA
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    max_model_len: int | None = None  # None: the model's own, <= 32768; never past its window
    enable_prefix_caching: bool = True
    # KV tiers under the prefix cache (engine.kv_tiers): a hashed block the pool reuses is
    # kept in host RAM up to kv_host_bytes (0: off), what that drops goes to files under
    # kv_disk_dir (None: off) up to kv_disk_bytes, through a writer queue of
    # kv_disk_queue_blocks (a block arriving at a full queue is dropped); a block file
    # unused for kv_disk_max_age_s is deleted (None: only the byte bound drops files).
    kv_host_bytes: int = 0
    kv_disk_dir: str | None = None
    kv_disk_bytes: int = 4 << 30
    kv_disk_queue_blocks: int = 256
    kv_disk_max_age_s: float | None = None
    # A block loaded back from a tier takes kv_tier_load_cost budget tokens per token it
    # holds from its step's max_num_batched_tokens (a prefill token costs 1), so a long
    # restore loads over several steps instead of stalling one; 0: loads are free.
    kv_tier_load_cost: float = 0.25
    # "torch" | "triton" | "cpu" (C++ kernels, kernels/cpu) | "auto": triton on CUDA; on
    # CPU, cpu where the kernels build (a C++ compiler is present), else torch
    attention_backend: str = "auto"
    use_cuda_graph: bool = True
    cuda_graph_max_batch: int = 512
    # "int8" | "int4": a safetensors or dummy model's matrices quantized at load into the
    # packed CPU kernels' blocks (engine.quant; CPU fp32 only). The default model is
    # already quantized (its GGUF's Q4_1) and keeps that.
    quantization: str | None = None
    cpu_weight_prepack: bool = True  # CPU fp32: weights packed at load (C++ matmul, else oneDNN)
    # CPU, quantized projections: decode-only steps run every layer in one C++ call
    # (engine.cpu_decode); off, LlamaModel.forward chains the same kernels from Python.
    cpu_fused_decode: bool = True
    # Speculative decoding: "ngram" proposes up to num_speculative_tokens tokens per
    # decoding request and step from its own prompt and output (engine.speculative),
    # verified exactly in the step; None: off. k = 3 by default: with the token the step
    # samples anyway a verification is 4 rows, one tile of the CPU's int8 dots (their
    # rows share the weights' unpacking 4 at a time); a fifth row costs a one-row pass of
    # its own, ~0.6 of a decode step, more than the 4th proposed token earns back
    # (docs/benchmarks.md, "Speculative decoding at c=1").
    speculative: str | None = None
    num_speculative_tokens: int = 3
    # Most decode rows (each decoding request's token and the tokens proposed after it) a
    # step fills with proposals: a few rows cost little more than one (the weights are
    # read once for all), but a batch past that is compute-bound and each row pays its own
    # multiply-adds, more than a proposal that is often rejected earns back. Proposals
    # take only the rows the decoding requests leave, so speculation backs off as the
    # batch grows and stops at this many (4: one request's token and its full k); None:
    # no limit.
    speculative_max_rows: int | None = 4
    # With speculative: the output tokens of this model's recently finished requests the
    # proposer also searches when a request's own tokens give no proposal (an agent quoting
    # another session's tool result); 4 bytes a token, a lookup reads them all; 0: off.
    speculative_history_tokens: int = 32768
    # With speculative: the n-gram lengths the proposer matches, longest first (vLLM's
    # prompt_lookup_min / _max). A match of 1 or 2 tokens is mostly chance: from 3 on, the
    # default model's copy-heavy prompts accepted 0.79 of proposals instead of 0.61, chat
    # 0.57 instead of 0.28, and fewer wasted verifications made both faster
    # (docs/benchmarks.md, "Speculative decoding at c=1").
    speculative_ngram_min: int = 3
    speculative_ngram_max: int = 16
    seed: int = 0
    # "on": the tokenizer is built, and encodes and renders chat templates, in a child
    # process (engine.tokenizer_process): building a large vocabulary's tokenizer holds the
    # GIL for seconds, which a model loaded beside running streams must not; decoding
    # stays here. "off": all here. "auto": what a server decides (on for a model it loads
    # on demand, off for the models it starts with); off elsewhere.
    tokenizer_process: str = "auto"
    # A failed step ends only its own requests; this many failed steps in a row mean the
    # device or the engine is broken for good: the engine stops (and `serve` exits).
    max_consecutive_failed_steps: int = 3
    max_logprobs: int = 20  # most top alternatives a request may ask for per token
    # Structured outputs: a schema whose grammar takes longer to compile is refused (400)
    # (its compile still finishes on its pool thread and is cached); compiled grammars are
    # kept by schema, the latest grammar_cache_size of them.
    grammar_compile_timeout_s: float = 10.0
    grammar_compile_threads: int = 1
    grammar_cache_size: int = 256
    # Digits a JSON number's integer part and fraction may each have in a schema's grammar
    # (its exponent: 2), so a model cannot run on in one; None: unbounded, as xgrammar.
    # 15: every such integer is exact in a double.
    max_json_number_digits: int | None = 15

    def __post_init__(self):
        _positive("block_size", self.block_size)
        _positive("max_num_seqs", self.max_num_seqs)
        _positive("max_num_batched_tokens", self.max_num_batched_tokens)
        _positive("max_consecutive_failed_steps", self.max_consecutive_failed_steps)
        _positive("cuda_graph_max_batch", self.cuda_graph_max_batch)
        if self.speculative not in (None, "ngram"):
            raise ConfigError("speculative", "must be ngram, or None for off")
        _positive("num_speculative_tokens", self.num_speculative_tokens)
        if self.speculative_history_tokens < 0:
            raise ConfigError("speculative_history_tokens", "must be >= 0")
        _positive("speculative_ngram_min", self.speculative_ngram_min)
        if self.speculative_ngram_max < self.speculative_ngram_min:
            raise ConfigError("speculative_ngram_max", "must be >= speculative_ngram_min")
        if self.speculative_max_rows is not None:
            _positive("speculative_max_rows", self.speculative_max_rows)
        if isinstance(self.max_logprobs, bool) or not isinstance(self.max_logprobs, int) \
                or self.max_logprobs < 0:
            raise ConfigError("max_logprobs", "must be a non-negative integer")
        _positive("grammar_compile_threads", self.grammar_compile_threads)
        _positive("grammar_cache_size", self.grammar_cache_size)
        if self.max_json_number_digits is not None and not 2 <= self.max_json_number_digits:
            raise ConfigError("max_json_number_digits", "must be at least 2, or None")
        if not 0.0 < self.grammar_compile_timeout_s <= 3600.0:
            raise ConfigError("grammar_compile_timeout_s", "must be in (0, 3600]")
        if isinstance(self.kv_host_bytes, bool) or not isinstance(self.kv_host_bytes, int) \
                or self.kv_host_bytes < 0:
            raise ConfigError("kv_host_bytes", "must be a non-negative integer (0: off)")
        _positive("kv_disk_bytes", self.kv_disk_bytes)
        _positive("kv_disk_queue_blocks", self.kv_disk_queue_blocks)
        if self.kv_disk_max_age_s is not None and not self.kv_disk_max_age_s > 0:
            raise ConfigError("kv_disk_max_age_s", "must be a positive number of seconds")
        if self.tokenizer_process not in ("on", "off", "auto"):
            raise ConfigError("tokenizer_process", "must be on, off or auto")
        if not 0.0 <= self.kv_tier_load_cost <= 1.0:
            raise ConfigError("kv_tier_load_cost", "must be in [0, 1] (budget tokens per "
                              "token loaded; a prefill token costs 1)")
        if self.kv_disk_dir is not None and not self.kv_disk_dir.strip():
            raise ConfigError("kv_disk_dir", "must be a directory path, or None for off")
        if self.num_kv_blocks is not None:
            _positive("num_kv_blocks", self.num_kv_blocks)
        if self.max_model_len is not None:
            _positive("max_model_len", self.max_model_len)
        if not 0.0 < self.kv_memory_fraction <= 1.0:
            raise ConfigError("kv_memory_fraction", "must be in (0, 1]")
        if self.dtype != "auto" and self.dtype not in _DTYPES:
            raise ConfigError("dtype", f"must be auto or one of {sorted(_DTYPES)}")
        if self.quantization is not None and self.quantization not in ("int8", "int4"):
            raise ConfigError("quantization", "must be int8 or int4")
        if self.quantization is not None and (self.resolved_device().type != "cpu"
                                              or self.resolved_dtype() != torch.float32):
            raise ConfigError("quantization", "runs on CPU in float32 only")
        if self.attention_backend not in ("auto", "torch", "triton", "cpu"):
            raise ConfigError("attention_backend", "must be auto, torch, triton or cpu")
        if self.attention_backend == "cpu" and self.resolved_device().type != "cpu":
            raise ConfigError("attention_backend", "cpu needs device cpu")
        if (self.attention_backend == "triton" and self.resolved_device().type == "cpu"
                and os.environ.get("TRITON_INTERPRET") != "1"):
            raise ConfigError("attention_backend",
                                      "triton needs a CUDA device (or TRITON_INTERPRET=1 on CPU)")

    def resolved_device(self) -> torch.device:
        if self.device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        return torch.device(self.device)

    def resolved_dtype(self) -> torch.dtype:
        if self.dtype != "auto":
            return _DTYPES[self.dtype]
        return torch.bfloat16 if self.resolved_device().type == "cuda" else torch.float32

    def use_triton(self) -> bool:
        if self.attention_backend == "auto":
            return self.resolved_device().type == "cuda"
        return self.attention_backend == "triton"


def _positive(name: str, value: int) -> None:
    if not isinstance(value, int) or value <= 0:
        raise ConfigError(name, "must be a positive integer")
