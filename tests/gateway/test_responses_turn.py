"""A Responses request as a chat turn (gateway/responses/turn.py), without a server:
input items as chat completions' messages, a chain's history bounded and never left
starting with a tool output, instructions never carried over."""
from __future__ import annotations

import msgspec
import pytest

from gateway.config import GatewayConfig
from gateway.errors import RequestError
from gateway.responses.request import CreateRequest, decode_items
from gateway.responses.turn import build_turn


def turn(body: dict, previous=None, **config):
    req = msgspec.convert(body, CreateRequest)
    return build_turn(GatewayConfig(**config), req, decode_items(req.input), previous)


def test_items_become_chat_messages():
    t = turn({"instructions": "Be brief.", "input": [
        {"role": "developer", "content": "Use tools."},
        {"role": "user", "content": [{"type": "input_text", "text": "Weather?"}]},
        {"type": "message", "role": "assistant",
         "content": [{"type": "output_text", "text": "Checking.", "annotations": []}]},
        {"type": "function_call", "call_id": "c1", "name": "w", "arguments": "{}"},
        {"type": "function_call", "call_id": "c2", "name": "w", "arguments": "{\"d\":1}"},
        {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
        {"type": "function_call_output", "call_id": "c2",
         "output": [{"type": "input_text", "text": "rain"}]}]})
    assert t.messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "system", "content": "Use tools."},
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": "Checking.", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "w", "arguments": "{}"}},
            {"id": "c2", "type": "function",
             "function": {"name": "w", "arguments": "{\"d\":1}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        {"role": "tool", "tool_call_id": "c2", "content": "rain"}]
    assert t.history == t.messages[1:]  # instructions are this request's only
    assert [i["type"] for i in t.input_items] == ["message"] * 3 + ["function_call"] * 2 + \
        ["function_call_output"] * 2
    assert all(i["id"] for i in t.input_items)


def test_chain_history_is_bounded_and_never_starts_with_a_tool_output():
    previous = [{"role": "user", "content": "q"},
                {"role": "assistant", "content": "", "tool_calls": [{"id": "c"}]},
                {"role": "tool", "tool_call_id": "c", "content": "out"},
                {"role": "assistant", "content": "a"}]
    t = turn({"input": "next"}, previous, max_conversation_items=3)
    assert t.history == [{"role": "assistant", "content": "a"},
                         {"role": "user", "content": "next"}]


@pytest.mark.parametrize("body, param", [
    ({"input": []}, "input"),
    ({"input": "x", "text": {"format": {"type": "json_schema", "schema": {}}}},
     "text.format.name"),
    ({"input": "x", "top_p": 2}, "top_p"),
    ({"input": [{"type": "function_call", "name": "f"}]}, "input[0].call_id"),
    ({"input": [{"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "c2", "output": "x"}]},
     "input[1].call_id"),
])
def test_refusals_name_the_field(body, param):
    with pytest.raises(RequestError) as refused:
        turn(body)
    assert refused.value.param == param


def test_a_function_call_output_answers_a_call_of_the_chain():
    previous = [{"role": "user", "content": "q"},
                {"role": "assistant", "content": "", "tool_calls": [
                    {"id": "c1", "type": "function",
                     "function": {"name": "f", "arguments": "{}"}}]}]
    answer = {"type": "function_call_output", "call_id": "c1", "output": "out"}
    assert turn({"input": [answer]}, previous).history[-1]["tool_call_id"] == "c1"
    with pytest.raises(RequestError) as refused:
        turn({"input": [answer]})  # the same output with no chain: it answers nothing
    assert refused.value.param == "input[0].call_id" and "'c1'" in refused.value.message
