"""A Gemma tokenizer from a GGUF's vocabulary, as SentencePiece BPE.

transformers' GGUF reader turns a Gemma vocabulary into a Unigram model over the pieces'
scores, which are BPE merge ranks, not log-probabilities: it splits " capital" into
" c" "ap" "it" "al" where Gemma's own tokenizer (and llama.cpp's, reading the same file)
keeps one piece. Gemma's tokenizer is BPE that merges the highest-scoring pair first;
transformers' generate_merges turns the scores into exactly those merges, and its
GemmaTokenizer runs them (byte fallback, spaces as "▁").
"""
from __future__ import annotations

_CONTROL, _USER_DEFINED = 3, 4  # llama.cpp's token types that are never split


def gemma_tokenizer_from_gguf(fields: dict, add_bos: bool):
    """`fields`: the GGUF's metadata with its vocabulary (engine.quant.gguf_header)."""
    from tokenizers import AddedToken
    from transformers import GemmaTokenizer
    from transformers.convert_slow_tokenizer import generate_merges

    tokens = [_piece(t) for t in fields["tokenizer.ggml.tokens"]]
    scores = fields["tokenizer.ggml.scores"].tolist()
    types = fields["tokenizer.ggml.token_type"].tolist()
    vocab: dict[str, int] = {}
    for index, token in enumerate(tokens):
        vocab.setdefault(token, index)
    merges = generate_merges(vocab, {t: s for t, s in zip(tokens, scores)})
    tokenizer = GemmaTokenizer(vocab=vocab, merges=merges, add_bos_token=add_bos,
                               add_eos_token=False)
    tokenizer.add_tokens([AddedToken(t, special=True, normalized=False)
                          for t, kind in zip(tokens, types) if kind in (_CONTROL, _USER_DEFINED)
                          and t not in tokenizer.all_special_tokens], special_tokens=True)
    return tokenizer


def _piece(token: str) -> str:
    """The piece as GemmaTokenizer spells it (transformers' GGUFGemmaConverter's mapping):
    a tab byte as a tab, runs of spaces as runs of "▁"."""
    if token == "<0x09>":
        return "\t"
    if " " in token and not token.strip():
        return "▁" * len(token)
    return token
