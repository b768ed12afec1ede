"""engine.prompt_length bounds the characters one token stands for only where tokenization
keeps every character of its input: for each tokenizer it refuses, a text shows the bound
broken (so refusing is needed), and where it gives one, the bound holds on the same texts.
The shipped vocabularies are checked in test_tokenizer_process."""
from __future__ import annotations

import pytest
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from engine.prompt_length import max_chars_per_token

VOCAB = {"<unk>": 0, "a": 1, "b": 2, " ": 3, "ab": 4, "▁": 5, "c": 6}
MERGES = [("a", "b")]
TEXTS = [" " * 1000 + "ab", "ab" * 500, "xyz" * 300 + "a", "a b " * 250, "a" + "\t" * 500]


def _fast(model=None, normalizer=None, pre_tokenizer=None) -> PreTrainedTokenizerFast:
    tokenizer = Tokenizer(model or models.BPE(VOCAB, MERGES, unk_token="<unk>"))
    if normalizer is not None:
        tokenizer.normalizer = normalizer
    if pre_tokenizer is not None:
        tokenizer.pre_tokenizer = pre_tokenizer
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer)


def _fewest_chars_per_token(tokenizer) -> float:
    """The bound the texts need: their most characters per token."""
    return max(len(t) / max(1, len(tokenizer.encode(t, add_special_tokens=False)))
               for t in TEXTS)


KEEPING = {
    "plain BPE": _fast(),
    "Gemma's space replace": _fast(normalizer=normalizers.Replace(" ", "▁")),
    "byte-level pieces": _fast(pre_tokenizer=pre_tokenizers.ByteLevel(add_prefix_space=False)),
    "split keeping the delimiter": _fast(
        pre_tokenizer=pre_tokenizers.Split(" ", behavior="merged_with_previous")),
    "byte fallback with fused unknowns": _fast(models.BPE(
        {**VOCAB, **{f"<0x{b:02X}>": 7 + b for b in range(256)}}, MERGES, unk_token="<unk>",
        fuse_unk=True, byte_fallback=True)),
}
DROPPING = {
    "whitespace split": _fast(pre_tokenizer=pre_tokenizers.Whitespace()),
    "split removing the delimiter": _fast(
        pre_tokenizer=pre_tokenizers.Split(" ", behavior="removed")),
    "strip": _fast(normalizer=normalizers.Sequence([normalizers.Strip()])),
    "replace by something shorter": _fast(normalizer=normalizers.Replace("  ", "")),
    "fused unknowns": _fast(models.BPE(VOCAB, MERGES, unk_token="<unk>", fuse_unk=True)),
    "word pieces": _fast(models.WordPiece({"[UNK]": 0, "a": 1}, unk_token="[UNK]")),
}


@pytest.mark.parametrize("name", list(KEEPING))
def test_a_tokenizer_that_keeps_every_character_is_bounded(name):
    tokenizer = KEEPING[name]
    bound = max_chars_per_token(tokenizer)
    assert bound is not None and bound >= _fewest_chars_per_token(tokenizer)


@pytest.mark.parametrize("name", list(DROPPING))
def test_a_tokenizer_that_drops_input_has_no_bound(name):
    tokenizer = DROPPING[name]
    assert max_chars_per_token(tokenizer) is None
    # what the bound would be from its tokens alone is broken by some text
    alone = tokenizer.backend_tokenizer.decode_batch([[i] for i in range(len(tokenizer))])
    assert _fewest_chars_per_token(tokenizer) > max(map(len, alone)) + 1


def test_a_tokenizer_without_a_rust_backend_has_no_bound():
    assert max_chars_per_token(object()) is None
