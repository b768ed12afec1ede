"""Function calls on /v1/realtime with the official openai SDK's realtime client (every
server event parsed strictly as the SDK's own types): a forced call's arguments parse
against its schema, its output round trip ends in a text answer, tool_choice "none"
shows no tools, an output for an unknown call is refused, and the function items of a
chain survive a reconnect and a restart (the session store)."""
from __future__ import annotations

import json

import aiohttp
import jsonschema
import pytest
from realtime_helpers import connect, recv, recv_until, say, types
from test_realtime_sdk import metric, scrape
from ws_helpers import recv_type
from ws_helpers import recv_until as ws_recv_until

from gateway.config import GatewayConfig
from gateway.realtime.conversation import Conversation
from gateway.realtime.events import ResponseConfig
from gateway.realtime.prompt import for_template, response_messages
from gateway.sessions.live import LiveSession
from gateway.sessions.sqlite import SqliteSessionStore
from gateway.sessions.store import SessionRecord, decode_record, encode_record
from gateway.tools.fallback import without_tools
from gateway.tools.formats import HERMES
from gateway.tools.plan import FunctionDef, for_model

WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                            "days": {"type": "integer", "minimum": 1,
                                                     "maximum": 9}},
           "required": ["city", "days"], "additionalProperties": False}
TOOLS = [{"type": "function", "name": "get_weather", "description": "Weather of a city",
          "parameters": WEATHER}]
FORCED = {"type": "function", "name": "get_weather"}
SESSION = {"type": "realtime", "instructions": "Answer in one short sentence.",
           "max_output_tokens": 48, "temperature": 0, "tools": TOOLS}
# A tool output long enough that its tokens show in the next prompt's size.
OUTPUT = json.dumps({"city": "Oslo", "forecast": ["sunny, 21 C"] + ["rain, 12 C"] * 8})
CALL_EVENTS = ["response.created", "rate_limits.updated", "response.output_item.added",
               "response.function_call_arguments.delta",
               "response.function_call_arguments.done", "response.output_item.done",
               "conversation.item.added", "conversation.item.done", "response.done"]


async def _forced_call(conn) -> tuple[list, object, object]:
    """A user question answered by a forced get_weather call: (events, done, the call)."""
    events, done = await say(conn, "Weather in Oslo for 2 days?", tool_choice=FORCED)
    assert done.response.status == "completed", done.response.status_details
    [call] = done.response.output
    assert call.type == "function_call" and call.name == "get_weather"
    jsonschema.validate(json.loads(call.arguments), WEATHER)
    return events, done, call


async def _prompt_size(conn) -> int:
    """The input tokens of an out-of-band response to the conversation as it stands."""
    await conn.response.create(response={"conversation": "none", "tool_choice": "none",
                                         "max_output_tokens": 1})
    _, done = await recv_until(conn, "response.done")
    return done.response.usage.input_tokens


async def _send_output(conn, call_id: str, output: str = OUTPUT, **item):
    await conn.conversation.item.create(item={"type": "function_call_output",
                                              "call_id": call_id, "output": output, **item})
    _, done = await recv_until(conn, "conversation.item.done")
    return done.item


async def test_forced_call_then_its_output_gives_a_text_answer(server, base_url):
    stops = 'tokenwire_requests_total{finish_reason="stop"}'
    async with connect(base_url) as conn:
        await recv(conn)
        await conn.session.update(session={**SESSION, "tool_choice": "auto"})
        updated = await recv(conn)
        assert [t.name for t in updated.session.tools] == ["get_weather"]
        assert updated.session.tool_choice == "auto"

        before = metric(await scrape(base_url), stops)
        events, done, call = await _forced_call(conn)
        assert types(events)[-len(CALL_EVENTS):] == CALL_EVENTS
        # Its `done` had nothing left to send (the call went out whole) and still counts.
        assert metric(await scrape(base_url), stops) == before + 1
        added, delta, args_done, item_done = events[-len(CALL_EVENTS) + 2:-3]
        assert added.item.type == "function_call" and added.item.status == "in_progress"
        assert delta.delta == args_done.arguments == call.arguments
        assert delta.call_id == args_done.call_id == call.call_id
        assert args_done.name == "get_weather" and item_done.item.id == call.id
        assert call.call_id.startswith("call_") and call.status == "completed"

        size = await _prompt_size(conn)
        output_item = await _send_output(conn, call.call_id)
        assert output_item.type == "function_call_output"
        assert output_item.call_id == call.call_id and output_item.output == OUTPUT
        await conn.response.create(response={"tool_choice": "none"})
        _, answer = await recv_until(conn, "response.done")
        assert answer.response.status in ("completed", "incomplete")
        [message] = answer.response.output
        assert message.type == "message" and message.content[0].text
        # The output is in the prompt (at about 4 characters a token, and more).
        grown = answer.response.usage.input_tokens - size
        assert grown > len(OUTPUT) // 8, grown
    assert server.all_blocks_free()


async def test_tool_choice_none_shows_no_tools_and_calls_none(base_url):
    async with connect(base_url) as conn:
        await recv(conn)
        await conn.session.update(session=SESSION)
        await recv(conn)
        await conn.conversation.item.create(item={
            "type": "message", "role": "user",
            "content": [{"type": "input_text", "text": "Weather in Oslo for 2 days?"}]})
        await recv_until(conn, "conversation.item.done")
        sizes = {}
        for choice in ("required", "none"):
            await conn.response.create(response={"conversation": "none", "tool_choice":
                                                 choice, "parallel_tool_calls": False})
            _, done = await recv_until(conn, "response.done")
            sizes[choice] = done.response.usage.input_tokens
            kinds = {item.type for item in done.response.output}
            assert kinds == ({"function_call"} if choice == "required" else {"message"})
        assert sizes["none"] < sizes["required"]  # the tools are not even shown


@pytest.mark.parametrize("event, code, param", [
    ({"type": "conversation.item.create", "item": {
        "type": "function_call_output", "id": "out_1", "call_id": "call_nope",
        "output": "{}"}}, "invalid_request", "item.call_id"),
    ({"type": "session.update", "session": {"type": "realtime", "tools": [
        {"type": "mcp", "server_label": "files"}]}}, "unsupported", "session.tools[0].type"),
    ({"type": "response.create", "response": {"tools": TOOLS, "tool_choice": {
        "type": "function", "name": "nope"}}}, "invalid_request", "response.tool_choice"),
    ({"type": "session.update", "session": {"type": "realtime", "tools": [
        {"type": "function", "name": "bad name"}]}}, "invalid_request",
     "session.tools[0].name"),
    ({"type": "response.create", "response": {"input": [{
        "type": "function_call_output", "call_id": "call_nope", "output": "{}"}]}},
     "invalid_request", "response.input[0].call_id"),
])
async def test_bad_tools_and_unknown_call_ids_are_error_events(base_url, event, code, param):
    async with connect(base_url) as conn:
        await recv(conn)
        await conn.send({**event, "event_id": "evt_1"})
        error = await recv(conn)
        assert error.type == "error", error
        assert (error.error.code, error.error.param) == (code, param)
        assert error.error.type == "invalid_request_error" and error.error.event_id == "evt_1"
        if param == "item.call_id":
            assert "call_nope" in error.error.message
            await conn.send({"type": "conversation.item.retrieve", "item_id": "out_1"})
            assert (await recv(conn)).error.code == "item_not_found"  # not added


async def test_function_items_survive_a_reconnect_and_a_restart(server, tmp_path):
    db = tmp_path / "sessions.db"
    url = server.start_app(store=SqliteSessionStore(db))
    try:
        async with connect(url) as conn:
            session_id = (await recv(conn)).session.id
            await conn.session.update(session=SESSION)
            await recv(conn)
            _, _, call = await _forced_call(conn)
        async with connect(url, extra_query={"session_id": session_id}) as conn:
            resumed = await recv(conn)
            assert [t.name for t in resumed.session.tools] == ["get_weather"]
            await _send_output(conn, call.call_id)  # the call was kept: accepted
    finally:
        server.stop_app(url)
    url = server.start_app(store=SqliteSessionStore(db))  # a restart: the file only
    try:
        async with connect(url, extra_query={"session_id": session_id}) as conn:
            await recv(conn)
            await conn.response.create(response={"tool_choice": "none"})
            _, answer = await recv_until(conn, "response.done")
            assert answer.response.output[0].type == "message"
            # An output for the call is still accepted: the call is in the conversation.
            await _send_output(conn, call.call_id, "again")
        async with aiohttp.ClientSession() as http:
            ws = await http.ws_connect(f"{url}/v1/ws?session_id={session_id}")
            assert (await ws.receive_json())["resumed"] is True
            await ws.send_json({"type": "session.history"})
            history = (await recv_type(ws, "session.history"))["messages"]
            # A /v1/ws chat turn on the session renders the calls as text (any template).
            await ws.send_json({"type": "chat", "id": "t1", "content": "Thanks.",
                                "params": {"max_tokens": 4}})
            _, done = await ws_recv_until(ws, "t1")
            await ws.close()
    finally:
        server.stop_app(url)
    assert [m["role"] for m in history] == ["user", "assistant", "tool", "assistant", "tool"]
    assert history[1]["tool_calls"][0]["id"] == call.call_id
    assert history[1]["tool_calls"][0]["function"]["arguments"] == call.arguments
    assert history[2] == {"role": "tool", "tool_call_id": call.call_id, "content": OUTPUT}
    system = [{"role": "system", "content": SESSION["instructions"]}]
    prompt = server.engine.encode_chat(without_tools(HERMES, system + history + [
        {"role": "user", "content": "Thanks."}]))
    assert done["type"] == "done" and done["usage"]["prompt_tokens"] == len(prompt)


def test_sessions_stored_before_tools_still_load():
    old = json.dumps({"owner": None, "system": "Be brief.", "params": {},
                      "messages": [{"role": "user", "content": "Hi"},
                                   {"role": "assistant", "content": "Hello."}]})
    record = decode_record("s1", old, 0.0, 1)
    assert record.tools is None and record.messages[1]["content"] == "Hello."
    record.tools = {"tools": TOOLS, "tool_choice": "auto"}
    body, _ = encode_record(record, 1 << 20)
    assert decode_record("s1", body, 0.0, 2).tools == record.tools
    # A session without tools is stored as before (an older server can still read it).
    assert json.loads(encode_record(decode_record("s1", old, 0.0, 1), 1 << 20)[0]) == \
        json.loads(old)


def test_a_responses_text_and_calls_render_as_one_assistant_turn():
    """For a template that renders tools itself: the items of one response (its text,
    then each call) are one assistant turn with all its calls, arguments as objects."""
    call = {"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Oslo", "days": 2}'}}
    history = [{"role": "user", "content": "Weather?"},
               {"role": "assistant", "content": "Let me look."},
               {"role": "assistant", "content": "", "tool_calls": [call]},
               {"role": "assistant", "content": "", "tool_calls": [{**call, "id": "call_2"}]},
               {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
    plan = for_model(GatewayConfig(), _NativeModel(), [FunctionDef("get_weather")], "auto",
                     None)
    conversation = Conversation(LiveSession(SessionRecord("s1", None, None, {}, history)), 64)
    messages = for_template(response_messages(conversation, ResponseConfig(), None, None),
                            plan, plan.format)
    assert [m["role"] for m in messages] == ["user", "assistant", "tool"]
    assert messages[1]["content"] == "Let me look."
    assert [c["id"] for c in messages[1]["tool_calls"]] == ["call_1", "call_2"]
    assert messages[1]["tool_calls"][0]["function"]["arguments"] == {"city": "Oslo", "days": 2}


class _NativeModel:
    """What tool planning reads of a model whose template renders tools (Qwen's)."""

    supports_tools = True
    chat_template = "{% if tools %}<tools></tools>{% endif %}<tool_call>"
