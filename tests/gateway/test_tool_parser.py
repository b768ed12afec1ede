"""The tool-call parser reads the same calls and content however the text is cut into
deltas, keeps what is not a call as content, and reads each character once."""
from __future__ import annotations

import json
import time

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.tools.formats import HERMES, LLAMA3_JSON, format_for_template
from gateway.tools import parser as parser_module
from gateway.tools.parser import CallParser

NAMES = frozenset({"get_weather", "add"})
HERMES_TEXT = ('Let me check. <tool_call>\n{"name": "get_weather", "arguments": '
               '{"city": "Pa}ris \\"x\\"", "days": [1, {"n": 2}]}}\n</tool_call>\n'
               '<tool_call>\n{"name": "add", "arguments": {}}\n</tool_call>')
LLAMA_TEXT = '{"name": "add", "parameters": {"a": 1, "b": "}"}}'


def _read(fmt, text: str, cuts: list[int]) -> tuple[str, list[tuple[str, dict]]]:
    parser, content, calls, at = CallParser(fmt, NAMES), [], [], 0
    for cut in sorted(set(cuts)) + [len(text)]:
        piece, new = parser.feed(text[at:cut])
        content.append(piece)
        calls += new
        at = cut
    rest, last = parser.finish()
    return "".join(content) + rest, [(c.name, json.loads(c.arguments)) for c in calls + last]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(1, len(HERMES_TEXT) - 1), max_size=25))
def test_hermes_calls_whatever_the_cuts(cuts):
    content, calls = _read(HERMES, HERMES_TEXT, cuts)
    assert content.strip() == "Let me check."
    assert calls == [("get_weather", {"city": 'Pa}ris "x"', "days": [1, {"n": 2}]}),
                     ("add", {})]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, len(LLAMA_TEXT) - 1), max_size=15))
def test_llama_json_call_whatever_the_cuts(cuts):
    assert _read(LLAMA3_JSON, LLAMA_TEXT, cuts) == ("", [("add", {"a": 1, "b": "}"})])


def test_what_is_not_a_call_stays_content():
    for text in ("a <tool_call> not json", "<tool_call>\n{\"name\": \"other\", "
                 "\"arguments\": {}}\n</tool_call>", "cut <tool_call>\n{\"name\": \"add\"",
                 "held <tool_ca", "<tool_call>\n[1, 2]\n</tool_call>", "<tool_call>  x",
                 "<tool_call><tool_call> {\"name\": \"other\"} </tool_cal"):
        content, calls = _read(HERMES, text, [3, 9])
        assert (content, calls) == (text, []), text


def test_a_call_cut_before_its_closing_tag_stands():
    text = '<tool_call>\n{"name": "add", "arguments": {"a": 1}}'
    assert _read(HERMES, text, [5]) == ("", [("add", {"a": 1})])


def test_a_long_call_is_read_in_linear_time(monkeypatch):
    # 20,000 one-character deltas of one call: the brace scanner is handed each character
    # once (a parser that re-read the held text per delta would hand it ~2e8).
    handed = []
    scan = parser_module._ObjectEnd.feed
    monkeypatch.setattr(parser_module._ObjectEnd, "feed",
                        lambda self, text: handed.append(len(text)) or scan(self, text))
    arguments = json.dumps({"text": "x" * 20_000})
    text = f'<tool_call>\n{{"name": "add", "arguments": {arguments}}}\n</tool_call>'
    parser, calls = CallParser(HERMES, NAMES), []
    for ch in text:
        calls += parser.feed(ch)[1]
    assert [c.name for c in calls] == ["add"]
    assert sum(handed) <= len(text)


def _read_spaced_call(pieces: int) -> float:
    """CPU seconds to read one call with `pieces` one-space deltas before its object and
    as many before its closing tag (best of three: the box is shared)."""
    best = float("inf")
    for _ in range(3):
        parser, calls = CallParser(HERMES, NAMES), []
        began = time.thread_time()
        parser.feed("<tool_call>")
        for _ in range(pieces):
            parser.feed(" ")
        calls += parser.feed('{"name": "add", "arguments": {}}')[1]
        for _ in range(pieces):
            calls += parser.feed(" ")[1]
        calls += parser.feed("</tool_call>")[1]
        best = min(best, time.thread_time() - began)
        assert [c.name for c in calls] == ["add"]
    return best


def test_whitespace_held_in_a_call_is_read_in_linear_time():
    # Unconstrained, a model may write long whitespace runs inside a call's tags: each
    # delta's work must be linear in the delta, not in what is held (re-stripping the
    # held text per delta makes 10x the pieces cost ~100x).
    ratio = _read_spaced_call(100_000) / _read_spaced_call(10_000)
    assert ratio < 30, ratio


def test_the_syntax_follows_the_template():
    assert format_for_template(None) is HERMES  # the fallback writes Hermes
    assert format_for_template("{{ '<tool_call>' }}") is HERMES
    assert format_for_template("<|start_header_id|>ipython<|end_header_id|>") is LLAMA3_JSON
    assert format_for_template("<tool_call>", "llama3_json") is LLAMA3_JSON
