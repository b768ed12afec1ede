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


class CallParser:
    """One choice's text -> (content, calls), incrementally."""

    def __init__(self, fmt: ToolFormat, names: frozenset[str]):
        self._fmt, self._names = fmt, names
        self._pending = ""  # held text: a possible call start, or a call being read
        self._scanner: _ObjectEnd | None = None  # set while a call is being read
        self.calls: list[ToolCall] = []

    def feed(self, text: str) -> tuple[str, list[ToolCall]]:
        self._pending += text
        content: list[str] = []
        calls: list[ToolCall] = []
        while self._scanner is not None or self._find_start(content):
            decided = self._read_call()
            if decided is None:
                break
            consumed, call = decided
            if call is None:
                content.append(self._pending[:consumed])
            else:
                calls.append(call)
            self._pending, self._scanner = self._pending[consumed:], None
        self.calls += calls
        return "".join(content), calls

    def finish(self) -> tuple[str, list[ToolCall]]:
        """The end of the text: a call whose object is complete stands (its closing tag
        may be cut by a stop); anything else still held is content."""
        calls = []
        if self._scanner is not None and self._object_end >= 0:
            call = self._parse(self._pending[self._object_at:self._object_end])
            if call is not None:
                calls, self._pending = [call], self._pending[self._object_end:].strip()
        rest, self._pending, self._scanner = self._pending, "", None
        self.calls += calls
        return rest, calls

    def _find_start(self, content: list[str]) -> bool:
        start = self._fmt.start
        at = self._pending.find(start)
        if at < 0:
            keep = len(self._pending) - _partial_suffix(self._pending, start)
            content.append(self._pending[:keep])
            self._pending = self._pending[keep:]
            return False
        content.append(self._pending[:at])
        self._pending = self._pending[at:]
        self._scanner, self._scanned, self._object_end = _ObjectEnd(), 0, -1
        # Llama's start is the object's own first bytes; Hermes' tag comes before it.
        self._object_at = -1 if self._fmt.end else 0
        return True

    def _read_call(self) -> tuple[int, ToolCall | None] | None:
        """(characters consumed, the call or None: they are text) once decided; None
        while the call is still arriving."""
        fmt, pending = self._fmt, self._pending
        if self._object_at < 0:
            stripped = pending[len(fmt.start):].lstrip()
            if not stripped:
                return None
            if stripped[0] != "{":
                return len(fmt.start), None  # not a call: the tag is text
            self._object_at = self._scanned = len(pending) - len(stripped)
        if self._object_end < 0:
            end = self._scanner.feed(pending[self._scanned:])
            self._scanned = len(pending)
            if end is None:
                return None
            self._object_end = self._object_at + end
        end = self._object_end
        call = self._parse(pending[self._object_at:end])
        tail = pending[end:].lstrip()
        if not fmt.end:
            return end, call
        if len(tail) < len(fmt.end) and fmt.end.startswith(tail):
            return None  # the closing tag may be arriving
        if tail.startswith(fmt.end):
            return len(pending) - len(tail) + len(fmt.end), call
        return end, call  # no closing tag: the call stands, what follows is text

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
