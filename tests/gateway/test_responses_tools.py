"""Tool calls on /v1/responses with the openai SDK (strict parsing of every event and
object): a forced call's arguments parse against its schema, over HTTP, SSE and the
WebSocket mode, and an agent loop (call, output, call...) chains on one socket."""
from __future__ import annotations

import json

import jsonschema
import openai
import pytest

from tests.gateway.test_responses_ws import connect, until_end

WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                            "days": {"type": "integer", "minimum": 1,
                                                     "maximum": 9}},
           "required": ["city", "days"], "additionalProperties": False}
TOOLS = [{"type": "function", "name": "get_weather", "description": "Weather of a city",
          "parameters": WEATHER, "strict": True}]
FORCED = {"type": "function", "name": "get_weather"}
FAST = {"model": "default", "max_output_tokens": 48, "temperature": 0}


def _calls(output) -> list:
    return [item for item in output if item.type == "function_call"]


async def test_a_forced_call_is_a_function_call_item(client):
    resp = await client.responses.create(input="Weather in Oslo for 2 days?", tools=TOOLS,
                                         tool_choice=FORCED, **FAST)
    calls = _calls(resp.output)
    assert resp.status == "completed" and [c.name for c in calls] == ["get_weather"]
    assert calls[0].call_id.startswith("call_") and calls[0].id.startswith("fc_")
    jsonschema.validate(json.loads(calls[0].arguments), WEATHER)
    assert resp.tools[0].name == "get_weather" and resp.tool_choice.name == "get_weather"


async def test_a_forced_call_streams_its_item_events(client):
    events = [e async for e in await client.responses.create(
        input="Weather in Oslo for 2 days?", tools=TOOLS, tool_choice="required",
        parallel_tool_calls=False, stream=True, **FAST)]
    kinds = [e.type for e in events]
    assert "response.function_call_arguments.done" in kinds, kinds
    done = next(e for e in events if e.type == "response.function_call_arguments.done")
    deltas = "".join(e.delta for e in events
                     if e.type == "response.function_call_arguments.delta")
    assert deltas == done.arguments
    jsonschema.validate(json.loads(done.arguments), WEATHER)
    final = events[-1].response
    assert kinds[-1] == "response.completed"
    assert _calls(final.output)[0].arguments == done.arguments
    assert [e.sequence_number for e in events] == list(range(len(events)))


async def test_an_agent_loop_of_five_turns_on_one_socket(client, base_url):
    """Each turn: the model calls (forced), the client runs the tool and sends its output
    as the next turn's input with previous_response_id; the chain grows every turn."""
    previous, prompt_tokens = None, []
    async with connect(base_url) as conn:
        for turn in range(5):
            if previous is None:
                items = "Weather in Oslo for 2 days?"
            else:
                items = [{"type": "function_call_output", "call_id": call.call_id,
                          "output": json.dumps({"temp_c": 10 + turn})}]
            await conn.response.create(input=items, previous_response_id=previous,
                                       tools=TOOLS, tool_choice=FORCED, **FAST)
            events = await until_end(conn)
            assert events[-1].type == "response.completed", events[-1]
            done = events[-1].response
            call = _calls(done.output)[0]
            jsonschema.validate(json.loads(call.arguments), WEATHER)
            prompt_tokens.append(done.usage.input_tokens)
            previous = done.id
    assert prompt_tokens == sorted(set(prompt_tokens))  # each turn sees the whole chain
    # The chain's calls and outputs were stored: it continues over HTTP.
    items = await client.responses.input_items.list(previous)
    assert items.data[0].type == "function_call_output"
    resp = await client.responses.create(input="Thanks.", previous_response_id=previous,
                                         tools=TOOLS, **FAST)
    assert resp.usage.input_tokens > prompt_tokens[-1]


@pytest.mark.parametrize("extra,param", [
    ({"tool_choice": {"type": "function", "name": "nope"}}, "tool_choice"),
    ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
    ({"tools": [{"type": "function", "name": "bad name"}]}, "tools[0].name"),
    ({"tool_choice": FORCED, "text": {"format": {"type": "json_object"}}}, "tool_choice"),
])
async def test_bad_tools_are_a_400_naming_the_field(client, extra, param):
    body = {"input": "Hi", "tools": TOOLS, **FAST, **extra}
    with pytest.raises(openai.BadRequestError) as info:
        await client.responses.create(**body)
    assert info.value.body["param"] == param


async def test_an_output_that_answers_no_call_is_refused_by_its_call_id(client, base_url):
    """A function_call_output must answer a function_call of the chain: a stale or wrong
    call_id is a 400 (an `error` event on a socket) naming it, never shown to the model."""
    first = await client.responses.create(input="Weather in Oslo for 2 days?", tools=TOOLS,
                                          tool_choice=FORCED, **FAST)
    call_id = _calls(first.output)[0].call_id
    stale = [{"type": "function_call_output", "call_id": "call_stale", "output": "{}"}]
    with pytest.raises(openai.BadRequestError) as info:
        await client.responses.create(input=stale, previous_response_id=first.id,
                                      tools=TOOLS, **FAST)
    assert info.value.body["param"] == "input[0].call_id"
    assert "'call_stale'" in info.value.body["message"]
    with pytest.raises(openai.BadRequestError):  # the right id, but no chain to answer
        await client.responses.create(input=[{**stale[0], "call_id": call_id}],
                                      tools=TOOLS, **FAST)
    async with connect(base_url) as conn:
        await conn.response.create(input=stale, previous_response_id=first.id, tools=TOOLS,
                                   **FAST)
        error = (await until_end(conn))[-1]
        assert error.type == "error" and error.error.param == "input[0].call_id"
        await conn.response.create(input=[{**stale[0], "call_id": call_id}],
                                   previous_response_id=first.id, tools=TOOLS, **FAST)
        assert (await until_end(conn))[-1].type == "response.completed"
