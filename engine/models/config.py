"""ModelConfig: the shape of a Llama-family or Gemma 3 model, from an HF config or a named
dummy shape."""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from types import SimpleNamespace

from engine.models.rope import SUPPORTED_ROPE_TYPES


SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3", "gemma3_text")


@dataclass(frozen=True)
class ModelConfig:
    """Everything the model code needs; Qwen2 sets attention_bias, Qwen3 and Gemma 3 set
    qk_norm; `architecture` picks the model class (engine.models)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    # transformers' rope parameters with a rope_type of linear, llama3 or yarn; None: default
    rope_scaling: dict | None = None
    max_position_embeddings: int = 8192
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    qk_norm: bool = False
    eos_token_ids: tuple[int, ...] = field(default_factory=tuple)
    sliding_window: int | None = None  # some layer attends to only this many last tokens
    # which layers use the window (transformers' "sliding_attention"); None: all of them
    sliding_layers: tuple[bool, ...] | None = None
    architecture: str = "llama"  # or "gemma3"
    local_rope_theta: float | None = None  # the windowed layers' rope base (Gemma 3)
    query_pre_attn_scalar: float | None = None  # scores scaled by its -1/2 power, not head_dim's

    def layer_window(self, layer: int) -> int | None:
        """The window layer `layer` attends within, None for full attention."""
        if self.sliding_window is None or (self.sliding_layers is not None
                                           and not self.sliding_layers[layer]):
            return None
        return self.sliding_window

    @property
    def attention_scale(self) -> float:
        return (self.query_pre_attn_scalar or self.head_dim) ** -0.5


def from_hf_config(hf, eos_token_ids: tuple[int, ...]) -> ModelConfig:
    """Read a transformers PretrainedConfig of a supported model type."""
    if hf.model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(f"unsupported model type {hf.model_type!r}; "
                         f"supported: {', '.join(SUPPORTED_MODEL_TYPES)}")
    if hf.model_type == "gemma3_text":
        return _gemma3(hf, eos_token_ids)
    theta, scaling = _rope(hf)
    head_dim = getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads
    return ModelConfig(
        vocab_size=hf.vocab_size, hidden_size=hf.hidden_size,
        intermediate_size=hf.intermediate_size, num_layers=hf.num_hidden_layers,
        num_heads=hf.num_attention_heads,
        num_kv_heads=getattr(hf, "num_key_value_heads", None) or hf.num_attention_heads,
        head_dim=head_dim, rms_norm_eps=hf.rms_norm_eps, rope_theta=theta,
        rope_scaling=scaling, max_position_embeddings=hf.max_position_embeddings,
        tie_word_embeddings=bool(getattr(hf, "tie_word_embeddings", False)),
        attention_bias=hf.model_type == "qwen2" or bool(getattr(hf, "attention_bias", False)),
        qk_norm=hf.model_type == "qwen3", eos_token_ids=eos_token_ids,
        sliding_window=_sliding_window(hf), sliding_layers=_sliding_layers(hf))


def _gemma3(hf, eos_token_ids: tuple[int, ...]) -> ModelConfig:
    """Gemma 3: full-attention layers take rope_parameters["full_attention"] (theta 1M,
    maybe scaled), windowed ones ["sliding_attention"] (theta 10k, never scaled here)."""
    params = hf.rope_parameters
    theta, scaling = _rope(SimpleNamespace(
        rope_parameters=params["full_attention"],
        max_position_embeddings=hf.max_position_embeddings))
    local_theta, local_scaling = _rope(SimpleNamespace(
        rope_parameters=params["sliding_attention"],
        max_position_embeddings=hf.max_position_embeddings))
    if local_scaling is not None:
        raise ValueError("unsupported rope scaling on Gemma 3's sliding-window layers")
    if hf.attn_logit_softcapping or hf.final_logit_softcapping:
        raise ValueError("unsupported logit soft-capping (Gemma 2's)")
    return ModelConfig(
        vocab_size=hf.vocab_size, hidden_size=hf.hidden_size,
        intermediate_size=hf.intermediate_size, num_layers=hf.num_hidden_layers,
        num_heads=hf.num_attention_heads, num_kv_heads=hf.num_key_value_heads,
        head_dim=hf.head_dim, rms_norm_eps=hf.rms_norm_eps, rope_theta=theta,
        rope_scaling=scaling, max_position_embeddings=hf.max_position_embeddings,
        tie_word_embeddings=True, qk_norm=True, eos_token_ids=eos_token_ids,
        sliding_window=_sliding_window(hf), sliding_layers=_sliding_layers(hf),
        architecture="gemma3", local_rope_theta=local_theta,
        query_pre_attn_scalar=float(hf.query_pre_attn_scalar))


def _rope(hf) -> tuple[float, dict | None]:
    """(rope_theta, scaling) from transformers 5's rope_parameters or the older rope_scaling
    (whose type key was `type`); a type we cannot run exactly is refused here, at load."""
    params = dict(getattr(hf, "rope_parameters", None) or getattr(hf, "rope_scaling", None)
                  or {})
    theta = float(params.get("rope_theta", getattr(hf, "rope_theta", 10000.0)))
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise ValueError(f"unsupported rope_type {rope_type!r}; "
                         f"supported: {', '.join(SUPPORTED_ROPE_TYPES)}")
    if params.get("partial_rotary_factor", 1.0) != 1.0:
        raise ValueError("unsupported partial_rotary_factor "
                         f"{params['partial_rotary_factor']}: rotary covers the whole head")
    if rope_type == "default":
        return theta, None
    params["rope_type"] = rope_type
    if rope_type in ("llama3", "yarn"):
        params.setdefault("original_max_position_embeddings", getattr(
            hf, "original_max_position_embeddings", hf.max_position_embeddings))
    if rope_type == "yarn" and params.get("factor") is None:
        params["factor"] = hf.max_position_embeddings / params["original_max_position_embeddings"]
    return theta, params


def _sliding_window(hf) -> int | None:
    """The window, where transformers applies one: Mistral whenever sliding_window is set,
    Qwen2/Qwen3 on the layers their layer_types (from use_sliding_window and
    max_window_layers) mark "sliding_attention"."""
    window = getattr(hf, "sliding_window", None)
    layer_types = getattr(hf, "layer_types", None)
    if window is None or (layer_types is not None and "sliding_attention" not in layer_types):
        return None
    return int(window)


def _sliding_layers(hf) -> tuple[bool, ...] | None:
    layer_types = getattr(hf, "layer_types", None)
    return None if layer_types is None else tuple(t == "sliding_attention" for t in layer_types)


def context_len(config: ModelConfig, requested: int | None, limit: int) -> int:
    """The context to serve: `requested`, else the model's own up to `limit` (every
    attention backend honours a sliding window, so none caps the context to it)."""
    return requested or min(config.max_position_embeddings, limit)


_LLAMA3_ROPE = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}

# Real shapes for `dummy:NAME` models (random weights, for benchmarks).
DUMMY_SHAPES = {
    # tiny: a 2-layer GQA model for tests that run kernels under the Triton interpreter
    "tiny": ModelConfig(49152, 64, 128, 2, 4, 2, 16, 1e-5, 10000.0, None, 2048, True),
    "smollm2-135m": ModelConfig(49152, 576, 1536, 30, 9, 3, 64, 1e-5, 100000.0, None, 8192, True),
    "llama-3.2-1b": ModelConfig(128256, 2048, 8192, 16, 32, 8, 64, 1e-5, 500000.0,
                                _LLAMA3_ROPE, 131072, True),
    "qwen2.5-0.5b": ModelConfig(151936, 896, 4864, 24, 14, 2, 64, 1e-6, 1000000.0, None,
                                32768, True, attention_bias=True),
    "llama-3-8b": ModelConfig(128256, 4096, 14336, 32, 32, 8, 128, 1e-5, 500000.0, None,
                              8192, False),
}


def dummy_config(name: str, eos_token_ids: tuple[int, ...]) -> ModelConfig:
    if name not in DUMMY_SHAPES:
        raise ValueError(f"unknown dummy shape {name!r}; known: {', '.join(DUMMY_SHAPES)}")
    return replace(DUMMY_SHAPES[name], eos_token_ids=eos_token_ids)
