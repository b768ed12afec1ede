"""Incremental detokenization with stop strings.

Each step decodes only a short window of tokens (TGI/vLLM's offsets trick):

    tokens: [ ... | prefix_offset ... read_offset | new ]
    delta = decode(tokens[prefix:]) minus decode(tokens[prefix:read])

A window whose decode ends in U+FFFD is an incomplete UTF-8 character: nothing is emitted
until the next token completes it. The window starts inside the prompt so leading-space
rules of SentencePiece/BPE tokenizers see real context.

Stop strings: the last (longest stop - 1) characters are held back until they cannot be
the start of a stop string, so stop text never leaks into a delta, even when it spans
token boundaries.
"""
from __future__ import annotations

_PROMPT_CONTEXT_TOKENS = 5


class IncrementalDetokenizer:
    """Per-request text state: feed token ids, get back text deltas."""

    def __init__(self, tokenizer, prompt_token_ids: list[int], stop: list[str],
                 skip_special_tokens: bool = True):
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.tokens = list(prompt_token_ids[-_PROMPT_CONTEXT_TOKENS:])
        self.prefix_offset = 0
        self.read_offset = len(self.tokens)
        self.stop = stop
        self.hold = max((len(s) for s in stop), default=1) - 1
        self.text = ""  # all output text decoded so far (truncated at a stop string)
        self.emitted = 0  # characters of self.text already handed out
        self.stopped = False

    def add(self, token_id: int) -> None:
        """Append one output token; updates self.text and self.stopped."""
        self.tokens.append(token_id)
        prefix = self._decode(self.prefix_offset, self.read_offset)
        full = self._decode(self.prefix_offset, len(self.tokens))
        if len(full) > len(prefix) and not full.endswith("\ufffd"):
            self._append(full[len(prefix):])
            self.prefix_offset, self.read_offset = self.read_offset, len(self.tokens)

    def flush(self) -> None:
        """At the end, emit what an incomplete character held back."""
        if self.stopped:
            return
        prefix = self._decode(self.prefix_offset, self.read_offset)
        full = self._decode(self.prefix_offset, len(self.tokens))
        if len(full) > len(prefix):
            self._append(full[len(prefix):])
            self.prefix_offset = self.read_offset = len(self.tokens)

    def take_delta(self, final: bool) -> str:
        """Text not yet handed out; without `final`, keep back a possible stop prefix."""
        end = len(self.text) if (final or self.stopped) else len(self.text) - self.hold
        if end <= self.emitted:
            return ""
        delta = self.text[self.emitted:end]
        self.emitted = end
        return delta

    def _append(self, new_text: str) -> None:
        if self.stopped:
            return
        search_from = max(0, len(self.text) - self.hold)
        self.text += new_text
        cut = _first_stop(self.text, self.stop, search_from)
        if cut is not None:
            self.text = self.text[:cut]
            self.stopped = True

    def _decode(self, start: int, end: int) -> str:
        return self.tokenizer.decode(self.tokens[start:end], skip_special_tokens=self.skip_special_tokens)


def _first_stop(text: str, stops: list[str], start: int) -> int | None:
    hits = [i for i in (text.find(s, start) for s in stops) if i >= 0]
    return min(hits) if hits else None
