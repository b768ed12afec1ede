"""The Hugging Face config of a GGUF file, from the header that engine.quant.gguf_header
reads, as AutoConfig.from_pretrained(gguf_file=...) builds it.

AutoConfig reads the file with gguf's GGUFReader, which parses the whole vocabulary to
reach a few dozen scalar fields (~35 s for Gemma 3's 262k tokens). For the architectures
transformers maps without special cases (modeling_gguf_pytorch_utils.load_gguf_checkpoint)
the same mapping is applied here to the header; others still go through AutoConfig.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from engine.quant.gguf_header import GGUFHeader

# load_gguf_checkpoint renames only these architectures' model type (gemma3: the text
# backbone) and adds nothing beyond its key mapping, its defaults and tie_word_embeddings
_PLAIN = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "gemma3": "gemma3_text"}


def gguf_config(path: Path, header: GGUFHeader):
    """transformers' config of the GGUF at `path`; `header` read with config_arrays()'s arrays."""
    from transformers import AutoConfig
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    fields = header.fields
    architecture = fields["general.architecture"]
    if architecture not in _PLAIN or "mistral" in fields.get("general.name", ""):
        return AutoConfig.from_pretrained(path.parent, gguf_file=path.name)
    mapping = _mapping()
    config = dict(_defaults().get(architecture, {}))
    config["tie_word_embeddings"] = all(t[0] != "output.weight" for t in header.tensors)
    for key, value in fields.items():
        prefix, _, rest = key.partition(".")
        name = mapping.get(prefix, {}).get(rest)
        if name is not None and name != -1:
            config[name] = value.tolist() if isinstance(value, np.ndarray) else value
    config["model_type"] = _PLAIN[architecture]
    if "vocab_size" not in config and "tokenizer.ggml.tokens" in fields:
        config["vocab_size"] = len(fields["tokenizer.ggml.tokens"])
    config["_commit_hash"] = None
    hf_config = CONFIG_MAPPING[config["model_type"]].from_dict(config)
    hf_config._name_or_path = str(path.parent)  # as from_pretrained records it
    return hf_config


def config_arrays() -> frozenset[str]:
    """The array fields gguf_config reads: every mapped key that may hold one, and the
    vocabulary (engine.gguf_tokenizer reads it too; its length is the vocab size where the
    file does not state it)."""
    return frozenset({f"{prefix}.{key}" for prefix, keys in _mapping().items() for key in keys}
                     | {"tokenizer.ggml.tokens", "tokenizer.ggml.scores",
                        "tokenizer.ggml.token_type"})


def _mapping() -> dict:
    from transformers.modeling_gguf_pytorch_utils import GGUF_TO_TRANSFORMERS_MAPPING

    return GGUF_TO_TRANSFORMERS_MAPPING["config"]


def _defaults() -> dict:
    from transformers.integrations.ggml import GGUF_CONFIG_DEFAULTS_MAPPING

    return GGUF_CONFIG_DEFAULTS_MAPPING
