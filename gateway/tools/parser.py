"""Reading tool calls out of a model's text as it streams.

    feed("Sure. <tool_")           -> content "Sure. "   (a possible call start is held)
    feed('call>\n{"name": "f", ')  -> nothing            (inside a call)
    feed('"arguments": {}}\n</tool_call>') -> call f({})

Text outside calls is content, passed on at once except a tail that may begin a call. A
call's JSON object is delimited by a brace scanner that reads each character once, so
reading a long call costs time linear in it, however it is cut into deltas. A call that
does not parse, or names a function the request did not offer, is content: never lost.
"""
from __future__ import annotations

import json
import secrets
from dataclasses import dataclass, field

from gateway.tools.formats import ToolFormat


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str  # JSON text, as OpenAI carries it
    id: str = field(default_factory=lambda: f"call_{secrets.token_hex(12)}")

    def openai(self, index: int | None = None) -> dict:
        call = {"id": self.id, "type": "function",
                "function": {"name": self.name, "arguments": self.arguments}}
        return call if index is None else {"index": index, **call}


class _ObjectEnd:
    """Finds where a JSON object ends, one character at a time (strings and escapes
    respected). `feed` returns the offset just past the object, or None."""

    def __init__(self):
        self.depth, self.in_string, self.escaped, self.offset = 0, False, False, 0

    def feed(self, text: str) -> int | None:
        for i, ch in enumerate(text):
            if self.in_string:
                if self.escaped:
                    self.escaped = False
                elif ch == "\\":
                    self.escaped = True
                elif ch == '"':
                    self.in_string = False
            elif ch == '"':
                self.in_string = True
            elif ch in "{[":
                self.depth += 1
            elif ch in "}]":
                self.depth -= 1
                if self.depth == 0:
                    return self.offset + i + 1
        self.offset += len(text)
        return None


class _Call:
    """A call being read: its text from the start marker on, kept as the deltas came (joined
    once, when the call is decided), and where its object begins and ends. Each delta is
    looked at once, so a call held across many deltas (a long object, or long whitespace
    before its object or closing tag) costs time linear in its length."""

    def __init__(self, fmt: ToolFormat):
        self.fmt = fmt
        self.chunks: list[str] = []
        self.size = 0
        # Llama's start is the object's own first bytes; Hermes' tag comes before it.
        self.object_at = -1 if fmt.end else 0
        self.object_end = -1
        self.closing_at = -1  # where the closing tag begins, past the object's whitespace
        self.closing_seen = 0  # how much of the closing tag has arrived
        self.scanner = _ObjectEnd()

    def text(self) -> str:
        return "".join(self.chunks)

    def feed(self, text: str) -> int | None:
        """How much of the held text the call decides on (all of it through its closing
        tag, through its object, or only the start marker when no object follows), or
        None while it is still arriving."""
        base, at = self.size, 0  # the held text's length before `text`; where work resumes
        self.chunks.append(text)
        self.size += len(text)
        if self.object_at < 0:
            at = max(0, len(self.fmt.start) - base)  # past the start marker
            body = text[at:].lstrip()
            if not body:
                return None
            if body[0] != "{":
                return len(self.fmt.start)  # not a call: the marker is text
            at = len(text) - len(body)
            self.object_at = base + at
        if self.object_end < 0:
            end = self.scanner.feed(text[at:])
            if end is None:
                return None
            self.object_end = self.object_at + end
            at = self.object_end - base
        if not self.fmt.end:
            return self.object_end
        return self._closing(text[at:], base + at)

    def _closing(self, text: str, base: int) -> int | None:
        """After the object: whitespace, then the closing tag (held while it may be
        arriving). Anything else: the call stands through its object, the rest is text."""
        tag = self.fmt.end
        if self.closing_at < 0:
            body = text.lstrip()
            if not body:
                return None
            self.closing_at = base + len(text) - len(body)
            text = body
        wanted = tag[self.closing_seen:]
        piece = text[:len(wanted)]
        if not wanted.startswith(piece):
            return self.object_end
        self.closing_seen += len(piece)
        return self.closing_at + len(tag) if self.closing_seen == len(tag) else None


class CallParser:
    """One choice's text -> (content, calls), incrementally."""

    def __init__(self, fmt: ToolFormat, names: frozenset[str]):
        self._fmt, self._names = fmt, names
        self._pending = ""  # outside a call: a tail that may begin one
        self._call: _Call | None = None  # set while a call is being read
        self.calls: list[ToolCall] = []

    def feed(self, text: str) -> tuple[str, list[ToolCall]]:
        content: list[str] = []
        calls: list[ToolCall] = []
        while text:
            if self._call is None:
                text = self._find_start(text, content)
                if not text:
                    break
                self._call = _Call(self._fmt)
            decided = self._call.feed(text)
            if decided is None:
                break
            text = self._decide(decided, content, calls)
        self.calls += calls
        return "".join(content), calls

    def finish(self) -> tuple[str, list[ToolCall]]:
        """The end of the text: a call whose object is complete stands (its closing tag
        may be cut by a stop); anything else still held is content."""
        calls, rest, held = [], self._pending, self._call
        if held is not None:
            rest = held.text()
            call = self._object(held, rest)
            if call is not None:
                calls, rest = [call], rest[held.object_end:].strip()
        self._pending, self._call = "", None
        self.calls += calls
        return rest, calls

    def _find_start(self, text: str, content: list[str]) -> str:
        """The text from the next call's start marker on ("" when none: content passes on,
        but for a tail that may begin a marker)."""
        text, self._pending = self._pending + text, ""
        start = self._fmt.start
        at = text.find(start)
        if at < 0:
            keep = len(text) - _partial_suffix(text, start)
            content.append(text[:keep])
            self._pending = text[keep:]
            return ""
        content.append(text[:at])
        return text[at:]

    def _decide(self, consumed: int, content: list[str], calls: list[ToolCall]) -> str:
        """The decided call (or its text as content); returns the held text after it."""
        held, self._call = self._call, None
        text = held.text()
        call = self._object(held, text)
        if call is None:
            content.append(text[:consumed])
        else:
            calls.append(call)
        return text[consumed:]

    def _object(self, held: _Call, text: str) -> ToolCall | None:
        """The call its complete object names, if it is one."""
        if held.object_end < 0:
            return None
        return self._parse(text[held.object_at:held.object_end])

    def _parse(self, text: str) -> ToolCall | None:
        try:
            obj = json.loads(text)
        except ValueError:
            return None
        if not isinstance(obj, dict) or obj.get("name") not in self._names:
            return None
        arguments = obj.get(self._fmt.arguments_key, obj.get("arguments", {}))
        if not isinstance(arguments, dict):
            return None
        return ToolCall(obj["name"], json.dumps(arguments, ensure_ascii=False))

def _partial_suffix(text: str, marker: str) -> int:
    """The length of the longest tail of `text` that begins `marker` (held: it may be
    the start of a call split across deltas)."""
    for n in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0
