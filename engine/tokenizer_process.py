"""A model's tokenizer in a child process, for a model loaded beside running streams.

Building a large vocabulary's tokenizer is single C calls that hold the GIL for seconds
(Gemma 3's 262k vocabulary on the 2-core CI box: transformers reading tokenizer.json
~1.3 s, its conversion ~1.7 s, the Rust build ~1.5 s, xgrammar reading the vocabulary
~0.9 s), and while they run no other model's engine steps and the event loop writes no
token. So the child builds the real tokenizer and answers what needs it whole (encodes,
chat template renders); this process keeps only what decoding needs, each token's piece,
and decodes by replaying the tokenizer's decoder chain on them (`Decoder`). The child
checks that replay against the real decoder on every token and on random spans before
it is used; a tokenizer whose decoder it cannot replay is built here instead, as before.
"""
from __future__ import annotations

import json
import logging
import os
import random
import socket
import subprocess
import sys
import threading
from multiprocessing.connection import Connection
from pathlib import Path

from engine.prompt_length import max_chars_per_token

log = logging.getLogger(__name__)

START_TIMEOUT_S = 600.0  # a cold child imports transformers and builds the tokenizer
# One encode or render; the longest prompt the gateway admits encodes in well under a
# second. A child past it is stuck (or stopped): it is ended, and restarts on the next call.
CALL_TIMEOUT_S = 60.0
_SPANS_CHECKED = 2000  # random spans the child decodes both ways before handing over


class UnsupportedDecoder(Exception):
    """The tokenizer's decoder has a step `Decoder` does not replay."""


class Decoder:
    """tokenizers' decoder chain replayed on token pieces (the steps of the SentencePiece,
    byte-fallback and byte-level vocabularies of Llama, Mistral, Qwen, SmolLM2 and Gemma).
    `steps`: the decoder's JSON (Sequence or one step); `pieces[id]`: each token as the
    tokenizer spells it; `special`: ids that skip_special_tokens drops."""

    def __init__(self, steps: dict | None, pieces: list[str], special: frozenset[int]):
        self.steps = _flatten(steps)
        self.pieces = pieces
        self.special = special
        self._byte_of = _byte_level_table() if any(
            s["type"] == "ByteLevel" for s in self.steps) else {}

    def decode(self, token_ids, skip_special_tokens: bool = False) -> str:
        pieces = self.pieces
        tokens = [pieces[i] for i in token_ids
                  if not (skip_special_tokens and i in self.special)]
        if not self.steps:
            return " ".join(tokens)
        for step in self.steps:
            tokens = getattr(self, "_" + step["type"])(tokens, step)
        return "".join(tokens)

    def _ByteFallback(self, tokens: list[str], _step) -> list[str]:
        out: list[str] = []
        pending = bytearray()
        for token in tokens:
            if len(token) == 6 and token.startswith("<0x") and token.endswith(">"):
                pending.append(int(token[3:5], 16))
                continue
            if pending:
                out.append(_utf8_or_replacements(pending))
                pending = bytearray()
            out.append(token)
        if pending:
            out.append(_utf8_or_replacements(pending))
        return out

    def _Fuse(self, tokens: list[str], _step) -> list[str]:
        return ["".join(tokens)]

    def _Replace(self, tokens: list[str], step) -> list[str]:
        old, new = step["pattern"]["String"], step["content"]
        return [t.replace(old, new) for t in tokens]

    def _Strip(self, tokens: list[str], step) -> list[str]:
        return [_strip(t, step["content"], step["start"], step["stop"]) for t in tokens]

    def _ByteLevel(self, tokens: list[str], _step) -> list[str]:
        data = bytearray()
        for token in tokens:
            try:
                data += bytes(self._byte_of[c] for c in token)
            except KeyError:  # a token with a char outside the byte alphabet: as it is
                data += token.encode()
        return [data.decode("utf-8", "replace")]

    def _Metaspace(self, tokens: list[str], step) -> list[str]:
        replacement, prepend = step["replacement"], step.get("prepend_scheme", "always")
        out = []
        for index, token in enumerate(tokens):
            text = token.replace(replacement, " ")
            if index == 0 and prepend != "never" and text.startswith(" "):
                text = text[1:]
            out.append(text)
        return out


_STEPS = {"ByteFallback", "Fuse", "Replace", "Strip", "ByteLevel", "Metaspace"}


def _flatten(steps: dict | None) -> list[dict]:
    if steps is None:
        return []
    chain = steps["decoders"] if steps["type"] == "Sequence" else [steps]
    for step in chain:
        if step["type"] not in _STEPS or (step["type"] == "Replace"
                                          and "String" not in step["pattern"]):
            raise UnsupportedDecoder(json.dumps(step)[:200])
    return chain


def _utf8_or_replacements(data: bytearray) -> str:
    """tokenizers' ByteFallback: a run of byte tokens is its UTF-8 text, or one U+FFFD per
    byte when it is not valid UTF-8."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return "\ufffd" * len(data)


def _strip(token: str, content: str, start: int, stop: int) -> str:
    begin, end = 0, len(token)
    while begin < min(start, end) and token[begin] == content:
        begin += 1
    dropped = 0
    while dropped < stop and end > begin and token[end - 1] == content:
        end -= 1
        dropped += 1
    return token[begin:end]


def _byte_level_table() -> dict[str, int]:
    """GPT-2's printable stand-ins for the 256 bytes, char -> byte."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    return {char: byte for byte, char in bytes_to_unicode().items()}


class TokenizerProcess:
    """The tokenizer of the model directory `path` in a child process, with the parts of
    transformers' tokenizer interface the engine and the gateway use. Encodes and chat
    template renders go to the child (one at a time: callers on several threads queue on
    a lock); decode, len() and the vocabulary are answered here. A child that died, or was
    ended for taking longer than `call_timeout_s` on one call, is started again by the next
    call (its callers meanwhile get errors, never a hang)."""

    def __init__(self, path: Path, tokenizer_class: str, call_timeout_s: float = CALL_TIMEOUT_S):
        self._path, self._class = path, tokenizer_class
        self._call_timeout_s = call_timeout_s
        self._lock = threading.Lock()
        self._decoder: Decoder | None = None
        self._facts: dict = {}
        self._start()

    def _start(self) -> None:
        # A fresh interpreter (`python -m`), not multiprocessing's spawn: that re-imports
        # the caller's main script, which an offline user's script may not guard.
        ours, theirs = socket.socketpair()
        root = str(Path(__file__).resolve().parent.parent)  # where `engine` imports from
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            p for p in (root, os.environ.get("PYTHONPATH")) if p))
        with theirs:
            self._process = subprocess.Popen(
                [sys.executable, "-m", "engine.tokenizer_process", str(theirs.fileno()),
                 str(self._path), self._class], pass_fds=[theirs.fileno()], env=env,
                stdin=subprocess.DEVNULL)
        self._conn = Connection(ours.detach())

    def _restart(self) -> None:
        """A new child for one that is gone (called under the lock, after wait()): its
        first message, the tokenizer's facts, is what the first child sent."""
        log.warning("tokenizer process of %s exited (code %s); starting another", self._path,
                    self._process.poll())
        self._conn.close()
        self._start()
        if not self._conn.poll(START_TIMEOUT_S):
            self._end()
            raise TimeoutError(f"tokenizer of {self._path} not rebuilt in {START_TIMEOUT_S:g} s")
        self._answer()

    def _end(self) -> None:
        self._process.kill()
        self._process.wait()

    def wait(self) -> TokenizerProcess:
        """Block until the child has built the tokenizer (the loader reads the weights
        meanwhile); raises what the child raised (UnsupportedDecoder: build it here)."""
        with self._lock:
            if self._decoder is None:
                if not self._conn.poll(START_TIMEOUT_S):
                    raise TimeoutError(f"tokenizer of {self._path} not built in "
                                       f"{START_TIMEOUT_S:g} s")
                facts = self._answer()
                self._decoder = Decoder(facts.pop("decoder"), facts.pop("pieces"),
                                        facts.pop("special"))
                self._facts = facts
        return self

    @property
    def chat_template(self) -> str | None:
        return self.wait()._facts["chat_template"]

    @property
    def eos_token_id(self) -> int | None:
        return self.wait()._facts["eos_token_id"]

    @property
    def max_chars_per_token(self) -> int | None:
        """engine.prompt_length's bound, worked out in the child."""
        return self.wait()._facts["max_chars_per_token"]

    @property
    def grammar_vocabulary(self) -> tuple[list[str], int, bool]:
        """xgrammar's reading: each id's token (its piece), the vocabulary's type and
        whether it adds a prefix space (engine.grammar)."""
        facts = self.wait()._facts
        return self._decoder.pieces, *facts["grammar_type"]

    def __len__(self) -> int:
        return len(self.wait()._decoder.pieces)

    def decode(self, token_ids, skip_special_tokens: bool = False) -> str:
        return (self._decoder or self.wait()._decoder).decode(token_ids, skip_special_tokens)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self._call("encode", text, add_special_tokens)

    def apply_chat_template(self, messages, tools=None, tokenize: bool = False,
                            **template) -> str:
        if tokenize:
            raise ValueError("the tokenizer process renders text; encode it after")
        return self._call("render", list(messages), tools, template)

    def close(self) -> None:
        """End the child (the model is unloading)."""
        if self._process.poll() is None:
            try:
                with self._lock:
                    self._conn.send(("close",))
                self._process.wait(5)
            except (OSError, subprocess.TimeoutExpired):
                self._end()
        self._conn.close()

    def _call(self, op: str, *args):
        self.wait()
        with self._lock:
            if self._process.poll() is not None:
                self._restart()
            try:
                self._conn.send((op, *args))
            except OSError as exc:
                raise RuntimeError(f"the tokenizer process is gone: {exc}") from None
            if not self._conn.poll(self._call_timeout_s):
                self._end()  # its answer would come out of turn: no child is better
                raise RuntimeError(f"the tokenizer process did not answer in "
                                   f"{self._call_timeout_s:g} s; ended, it restarts on the "
                                   "next call")
            return self._answer()

    def _answer(self):
        try:
            status, *payload = self._conn.recv()
        except (EOFError, OSError):
            raise RuntimeError("the tokenizer process died "
                               f"(exit code {self._process.poll()})") from None
        if status == "ok":
            return payload[0]
        kind, message = payload
        raise _ERRORS.get(kind, RuntimeError)(message)


def _template_error(message: str) -> Exception:
    from jinja2.exceptions import TemplateError

    return TemplateError(message)


# Errors the child's calls raise that callers handle by type (a template's refusal).
_ERRORS = {"UnsupportedDecoder": UnsupportedDecoder, "OSError": OSError,
           "ValueError": ValueError, "TypeError": TypeError,
           "TemplateError": _template_error, "TemplateSyntaxError": _template_error,
           "UndefinedError": _template_error, "TemplateRuntimeError": _template_error}


# -- the child ------------------------------------------------------------------------------
def _serve(conn, path: str, tokenizer_class: str) -> None:
    try:
        tokenizer = _build(path, tokenizer_class)
        conn.send(("ok", _facts(tokenizer)))
    except Exception as exc:  # noqa: BLE001 - the parent raises it
        conn.send(("error", type(exc).__name__, f"tokenizer of {path}: {exc}"))
        return
    while True:
        try:
            op, *args = conn.recv()
        except (EOFError, OSError):
            return  # the parent is gone
        if op == "close":
            return
        try:
            if op == "encode":
                result = tokenizer.encode(args[0], add_special_tokens=args[1])
            else:
                messages, tools, template = args
                result = tokenizer.apply_chat_template(messages, tools=tools, tokenize=False,
                                                       **template)
            conn.send(("ok", result))
        except Exception as exc:  # noqa: BLE001 - the parent raises it
            conn.send(("error", type(exc).__name__, str(exc)))


def _build(path: str, tokenizer_class: str):
    import transformers

    cls = getattr(transformers, tokenizer_class)
    return cls.from_pretrained(path, clean_up_tokenization_spaces=False)


def _facts(tokenizer) -> dict:
    """What the parent keeps: the decoder's chain and pieces (checked here), the template,
    and the vocabulary as xgrammar reads it."""
    backend = tokenizer.backend_tokenizer
    steps = json.loads(backend.decoder.__getstate__()) if backend.decoder else None
    size = len(tokenizer)
    pieces = [backend.id_to_token(i) or "" for i in range(size)]
    special = frozenset(tokenizer.all_special_ids) | frozenset(
        i for i, t in tokenizer.added_tokens_decoder.items() if t.special)
    decoder = Decoder(steps, pieces, special)  # raises UnsupportedDecoder
    alone = backend.decode_batch([[i] for i in range(size)], skip_special_tokens=False)
    _check(decoder, tokenizer, alone)
    return {"decoder": steps, "pieces": pieces, "special": special,
            "chat_template": tokenizer.chat_template, "eos_token_id": tokenizer.eos_token_id,
            "grammar_type": _grammar_type(tokenizer),
            "max_chars_per_token": max_chars_per_token(tokenizer, alone)}


def _check(decoder: Decoder, tokenizer, alone: list[str]) -> None:
    """The replay must decode exactly as the tokenizer: every token alone (`alone`, each
    id decoded by the Rust tokenizer) and random spans (through transformers' decode)."""
    size = len(alone)
    specials = [[i] for i in sorted(decoder.special) if i < size]
    # skip_special_tokens changes nothing for one token that is not special
    skipped = tokenizer.backend_tokenizer.decode_batch(specials, skip_special_tokens=True)
    for skip, each, real in ((False, [[i] for i in range(size)], alone),
                             (True, specials, skipped)):
        for ids, text in zip(each, real):
            if decoder.decode(ids, skip) != text:
                raise UnsupportedDecoder(f"token {ids[0]} decodes as {text!r}, replayed as "
                                         f"{decoder.decode(ids, skip)!r}")
    rng = random.Random(0)
    for _ in range(_SPANS_CHECKED):
        ids = [rng.randrange(size) for _ in range(rng.randint(2, 8))]
        skip = rng.random() < 0.5
        text = tokenizer.decode(ids, skip_special_tokens=skip)
        if decoder.decode(ids, skip) != text:
            raise UnsupportedDecoder(f"{ids} decode as {text!r}, replayed as "
                                     f"{decoder.decode(ids, skip)!r}")


def _grammar_type(tokenizer) -> tuple[int, bool]:
    """xgrammar's reading of the vocabulary's type and prefix space (its tokens are the
    pieces: what TokenizerInfo.from_huggingface takes from get_vocab())."""
    import xgrammar as xgr

    info = xgr.TokenizerInfo.from_huggingface(tokenizer, stop_token_ids=[0])
    return info.vocab_type.value, bool(info.add_prefix_space)


if __name__ == "__main__":
    _serve(Connection(int(sys.argv[1])), sys.argv[2], sys.argv[3])
