"""/v1/responses over HTTP and SSE with the official openai SDK, against the shared real
server. Every Response and stream event is validated strictly as the SDK's own pydantic
types (no coercion), so a field of the wrong type or shape fails the test."""
from __future__ import annotations

import itertools
import json

import aiohttp
import openai
import pytest
from openai import AsyncOpenAI
from openai.types.responses import Response, ResponseItemList, ResponseStreamEvent
from pydantic import TypeAdapter
from ws_helpers import open_ws

EVENT = TypeAdapter(ResponseStreamEvent)
FAST = {"max_output_tokens": 12, "temperature": 0}
OPENING = ["response.created", "response.in_progress", "response.output_item.added",
           "response.content_part.added"]
CLOSING = ["response.output_text.done", "response.content_part.done",
           "response.output_item.done", "response.completed"]


async def strict(call) -> Response:
    """The body the server sent, validated strictly as the SDK's Response."""
    raw = await call
    return Response.model_validate_json(raw.http_response.text, strict=True)


async def test_create_plain(client):
    resp = await strict(client.responses.with_raw_response.create(model="default", input="Say hello.",
                                                **FAST))
    assert resp.id.startswith("resp_") and resp.object == "response"
    assert resp.status == "completed" or resp.status == "incomplete"
    message = resp.output[0]
    assert message.type == "message" and message.role == "assistant"
    assert message.id.startswith("msg_")
    assert resp.output_text and message.content[0].text == resp.output_text
    usage = resp.usage
    assert usage.input_tokens > 0 and usage.output_tokens > 0
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens


async def test_max_output_tokens_is_incomplete(client):
    resp = await strict(client.responses.with_raw_response.create(
        model="default", input="Count from 1 to 100, comma separated.",
        max_output_tokens=4, temperature=0))
    assert resp.status == "incomplete"
    assert resp.incomplete_details.reason == "max_output_tokens"
    assert resp.usage.output_tokens == 4


async def test_streamed_event_sequence(client, base_url):
    events = []
    stream = await client.responses.create(model="default", input="Say hello.", stream=True,
                                           **FAST)
    async for event in stream:
        events.append(EVENT.validate_json(event.model_dump_json(), strict=True))
    kinds = [e.type for e in events]
    n = len(OPENING)
    assert kinds[:n] == OPENING
    deltas = kinds[n:-len(CLOSING)]
    assert deltas and set(deltas) == {"response.output_text.delta"}
    assert kinds[-len(CLOSING):] in (CLOSING, CLOSING[:-1] + ["response.incomplete"])
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert events[-1].response.output[0].content[0].text == text
    assert events[0].response.id == events[-1].response.id
    # Stored by default: GET returns the same object.
    got = await strict(client.responses.with_raw_response.retrieve(events[-1].response.id))
    assert got.output_text == text
    assert got.model_dump() == events[-1].response.model_dump()  # what was sent, stored


async def test_chain_of_five_turns_carries_history(client):
    previous = None
    facts = ["My name is Ada.", "I live in Paris.", "I have a cat.", "My cat is Tom.",
             "What is my name?"]
    inputs = []
    for fact in facts:
        resp = await strict(client.responses.with_raw_response.create(
            model="default", input=fact, previous_response_id=previous, **FAST))
        assert resp.previous_response_id == previous
        inputs.append(resp.usage.input_tokens)
        previous = resp.id
    # Each turn's prompt holds every earlier turn (question and reply).
    assert all(b > a for a, b in itertools.pairwise(inputs))
    raw = await client.responses.input_items.with_raw_response.list(previous)
    items = ResponseItemList.model_validate_json(raw.http_response.text, strict=True)
    assert [i.content[0].text for i in items.data] == ["What is my name?"]


async def test_text_format_json_schema(client):
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
              "required": ["city"], "additionalProperties": False}
    resp = await strict(client.responses.with_raw_response.create(
        model="default", input="Name a city in France as JSON.", temperature=0,
        max_output_tokens=40,
        text={"format": {"type": "json_schema", "name": "city", "schema": schema,
                         "strict": True}}))
    assert resp.status == "completed"
    assert isinstance(json.loads(resp.output_text)["city"], str)
    assert resp.text.format.type == "json_schema"


async def test_instructions_and_items_input(client):
    resp = await strict(client.responses.with_raw_response.create(
        model="default", instructions="Answer in one word.", input=[
            {"role": "user", "content": [{"type": "input_text", "text": "Capital of France?"}]},
            {"type": "message", "role": "assistant", "content": [
                {"type": "output_text", "text": "Paris", "annotations": []}]},
            {"type": "function_call", "call_id": "call_1", "name": "lookup",
             "arguments": "{\"q\": \"Germany\"}"},
            {"type": "function_call_output", "call_id": "call_1", "output": "Berlin"},
            {"role": "user", "content": "And of Germany?"}], **FAST))
    assert resp.instructions == "Answer in one word."
    items = await client.responses.input_items.list(resp.id, order="asc")
    assert [i.type for i in items.data] == ["message", "message", "function_call",
                                            "function_call_output", "message"]


@pytest.mark.parametrize("body, param", [
    ({"tools": [{"type": "file_search"}]}, "tools[0].type"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"reasoning": {"effort": "low"}}, "reasoning"),
    ({"frobnicate": 1}, "frobnicate"),
    ({"temperature": -1}, "temperature"),
    ({"max_output_tokens": 0}, "max_output_tokens"),
    ({"input": [{"type": "input_image", "image_url": "x"}]}, "input[0].type"),
    ({"input": [{"role": "user", "content": [{"type": "input_image"}]}]},
     "input[0].content[0].type"),
    ({"input": [{"role": "wizard", "content": "hi"}]}, "input[0].role"),
    ({"previous_response_id": "resp_nope"}, "previous_response_id"),
])
async def test_refused_by_name(base_url, body, param):
    async with aiohttp.ClientSession() as http:
        async with http.post(base_url + "/v1/responses",
                             json={"model": "default", "input": "hi", **body}) as r:
            error = (await r.json())["error"]
            assert r.status == 400, error
    assert error["param"] == param and param.split(".")[0].split("[")[0] in error["message"]
    if param == "previous_response_id":
        assert error["code"] == "previous_response_not_found"


async def test_unknown_and_deleted_response_404(client):
    with pytest.raises(openai.NotFoundError):
        await client.responses.retrieve("resp_0123")
    resp = await client.responses.create(model="default", input="Hi.", **FAST)
    await client.responses.delete(resp.id)
    with pytest.raises(openai.NotFoundError):
        await client.responses.retrieve(resp.id)
    with pytest.raises(openai.BadRequestError):
        await client.responses.create(model="default", input="Hi.", previous_response_id=resp.id,
                                      **FAST)


async def test_store_false_is_not_kept(client):
    resp = await client.responses.create(model="default", input="Hi.", store=False, **FAST)
    with pytest.raises(openai.NotFoundError):
        await client.responses.retrieve(resp.id)


async def test_a_response_belongs_to_its_key(server):
    url = server.start_app(api_keys=("key-one", "key-two"))
    one = AsyncOpenAI(base_url=url + "/v1", api_key="key-one", max_retries=0)
    two = AsyncOpenAI(base_url=url + "/v1", api_key="key-two", max_retries=0)
    resp = await one.responses.create(model="default", input="Hi.", **FAST)
    assert (await one.responses.retrieve(resp.id)).id == resp.id
    with pytest.raises(openai.NotFoundError):
        await two.responses.retrieve(resp.id)
    with pytest.raises(openai.NotFoundError):
        await two.responses.delete(resp.id)
    with pytest.raises(openai.BadRequestError) as refused:
        await two.responses.create(model="default", input="Hi.",
                                   previous_response_id=resp.id, **FAST)
    assert refused.value.code == "previous_response_not_found"
    assert (await one.responses.input_items.list(resp.id)).data


async def test_a_socket_cannot_resume_a_response_as_its_session(client, base_url):
    resp = await client.responses.create(model="default", input="Hi.", **FAST)
    async with aiohttp.ClientSession() as http:
        ws, hello = await open_ws(http, base_url, params={"session_id": resp.id})
        await ws.close()
    assert hello["resumed"] is False and hello["session_id"] != resp.id
    assert (await client.responses.retrieve(resp.id)).id == resp.id
