"""A prompt too long for the context, known from its length in characters alone.

Encoding is the costly part of a prompt's way in (~0.7 s of one core for 850 KB on the
default model's vocabulary, against 11 ms to render 1,000 messages), and a prompt longer
than the context is refused after it. Each token stands for at most a fixed number of
its input's characters (its longest piece, decoded), so a text longer than that times the
context holds more tokens than the context: it is refused without being encoded.

That holds only where tokenization never drops input: no normalizer or pre-tokenizer that
removes characters (BERT's whitespace split, a Strip, NFC's composing) and no unknown-token
fusing that makes one token of any run of unknown characters. For any other tokenizer
there is no bound (None), and prompts are encoded whole as before.
"""
from __future__ import annotations

import json

# Steps that keep every input character (or add some): Prepend and ByteLevel add, Split
# keeps the pieces unless told to remove the delimiter, Metaspace replaces spaces one by one.
_KEEPING_NORMALIZERS = frozenset({"Prepend"})
_KEEPING_PRE_TOKENIZERS = frozenset({"ByteLevel", "Metaspace", "Digits", "Punctuation",
                                     "UnicodeScripts", "Split"})


def max_chars_per_token(tokenizer, alone: list[str] | None = None) -> int | None:
    """The most input characters one token of `tokenizer` (transformers' fast tokenizer)
    can stand for, or None where its tokenization may drop input. `alone`: each token id
    decoded by itself with special tokens kept (the template's "<|im_start|>" is one token
    of 12 characters), where the caller has it already."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or not _keeps_every_character(backend):
        return None
    if alone is None:
        alone = backend.decode_batch([[i] for i in range(len(tokenizer))],
                                     skip_special_tokens=False)
    # A decoded token's characters cover every character it touches (a partial UTF-8
    # sequence at either end decodes as one replacement character); one more for a
    # leading space a decoder strips.
    return max(map(len, alone), default=0) + 1


def _keeps_every_character(backend) -> bool:
    model = json.loads(backend.model.__getstate__())
    if model.get("type") != "BPE":
        return False  # WordPiece and Unigram: one unknown token for a whole word
    if model.get("fuse_unk") and not model.get("byte_fallback"):
        return False  # a run of unknown characters is one token
    return (_keeps(backend.normalizer, "normalizers", _KEEPING_NORMALIZERS)
            and _keeps(backend.pre_tokenizer, "pretokenizers", _KEEPING_PRE_TOKENIZERS))


def _keeps(step, members: str, keeping: frozenset[str]) -> bool:
    return step is None or _step_keeps(json.loads(step.__getstate__()), members, keeping)


def _step_keeps(state: dict, members: str, keeping: frozenset[str]) -> bool:
    kind = state.get("type")
    if kind == "Sequence":
        return all(_step_keeps(s, members, keeping) for s in state.get(members, []))
    if kind == "Replace":  # Gemma's " " -> "▁": a string for one at least as long
        pattern = state.get("pattern", {})
        return "String" in pattern and len(state.get("content", "")) >= len(pattern["String"])
    if kind == "Split" and state.get("behavior") == "Removed":
        return False
    return kind in keeping
