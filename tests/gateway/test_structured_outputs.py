"""Structured outputs end to end: twenty JSON schemas, greedy and sampled, through the
official openai SDK (chat, stream and not; completions; the SDK's pydantic `parse`) and over
/v1/ws. Every answer must parse and validate with `jsonschema` and end with `stop`; a
schema xgrammar cannot compile is a 400 naming response_format, and an invalid_request
error frame on the socket."""
from __future__ import annotations

import asyncio
import json

import aiohttp
import jsonschema
import openai
import pydantic
import pytest

from loadtest.json_schemas import SCHEMAS, max_tokens_for
from ws_helpers import open_ws, recv_until

MODES = {"greedy": {"temperature": 0.0}, "sampled": {"temperature": 1.0, "top_p": 0.95}}
BAD_SCHEMA = {"type": "string", "pattern": "(unclosed"}


def _messages(name: str, schema: dict) -> list[dict]:
    return [{"role": "user", "content": f"Give one {name} as JSON for this schema: "
                                        f"{json.dumps(schema)}"}]


def _json_schema(name: str, schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema,
                                                   "strict": True}}


def _check(text: str, finish_reason: str, schema: dict) -> None:
    assert finish_reason == "stop", text
    jsonschema.validate(json.loads(text), schema)


async def _sdk_answer(client, index: int, mode: str) -> tuple[str, str]:
    name, schema = SCHEMAS[index]
    kwargs = dict(model="m", messages=_messages(name, schema), seed=index,
                  max_tokens=max_tokens_for(schema),
                  response_format=_json_schema(name, schema), **MODES[mode])
    if index % 2 == 0:
        resp = await client.chat.completions.create(**kwargs)
        return resp.choices[0].message.content, resp.choices[0].finish_reason
    parts, finish = [], None
    async for chunk in await client.chat.completions.create(stream=True, **kwargs):
        for choice in chunk.choices:
            parts.append(choice.delta.content or "")
            finish = choice.finish_reason or finish
    return "".join(parts), finish


@pytest.mark.parametrize("mode", sorted(MODES))
async def test_twenty_schemas_through_the_sdk(client, mode):
    """Chat completions, every other one streamed; all twenty valid."""
    answers = await asyncio.gather(*(_sdk_answer(client, i, mode) for i in range(len(SCHEMAS))))
    for (name, schema), (text, finish) in zip(SCHEMAS, answers):
        _check(text, finish, schema)


async def _ws_answers(session, base_url: str, mode: str) -> list[dict]:
    """Every schema as a `generate` on one socket, 8 at a time (its in-flight limit); each
    answer is its deltas' text and its `done` (or `error`) frame."""
    ws, _ = await open_ws(session, base_url)
    answers: dict[str, dict] = {}
    for start in range(0, len(SCHEMAS), 8):
        batch = range(start, min(start + 8, len(SCHEMAS)))
        for i in batch:
            name, schema = SCHEMAS[i]
            params = {"max_tokens": max_tokens_for(schema), "seed": i, **MODES[mode],
                      "response_format": _json_schema(name, schema)}
            await ws.send_json({"type": "generate", "id": f"s{i}",
                                "messages": _messages(name, schema), "params": params})
            answers[f"s{i}"] = {"text": ""}
        async with asyncio.timeout(600):
            while not all("type" in answers[f"s{i}"] for i in batch):
                frame = await ws.receive_json()
                answer = answers[frame["id"]]
                if frame["type"] == "delta":
                    answer["text"] += frame["text"]
                else:
                    answer.update(frame)
    await ws.close()
    return [answers[f"s{i}"] for i in range(len(SCHEMAS))]


@pytest.mark.parametrize("mode", sorted(MODES))
async def test_twenty_schemas_over_the_websocket(base_url, mode):
    async with aiohttp.ClientSession() as session:
        answers = await _ws_answers(session, base_url, mode)
    for (name, schema), answer in zip(SCHEMAS, answers):
        assert answer["type"] == "done", answer
        _check(answer["text"], answer["finish_reason"], schema)


async def test_json_object_on_completions_and_chat(client):
    resp = await client.completions.create(
        model="m", prompt="A JSON object describing a cat:", max_tokens=64, temperature=0,
        extra_body={"response_format": {"type": "json_object"}})
    if resp.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(resp.choices[0].text), dict)
    else:  # an open object may run to max_tokens; what it wrote is still a JSON prefix
        assert resp.choices[0].text.startswith("{")
    name, schema = SCHEMAS[0]
    resp = await client.completions.create(
        model="m", prompt=f"JSON for {json.dumps(schema)}:", max_tokens=max_tokens_for(schema),
        temperature=0, extra_body={"response_format": _json_schema(name, schema)})
    _check(resp.choices[0].text, resp.choices[0].finish_reason, schema)


class Pet(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")
    name: str = pydantic.Field(max_length=10)
    legs: int = pydantic.Field(ge=0, le=8)
    kind: str = pydantic.Field(json_schema_extra={"enum": ["cat", "dog", "bird"]})


async def test_sdk_parse_with_a_pydantic_model(client):
    resp = await client.chat.completions.parse(
        model="m", messages=[{"role": "user", "content": "Describe a pet."}],
        response_format=Pet, max_tokens=80, temperature=0)
    assert resp.choices[0].finish_reason == "stop"
    assert isinstance(resp.choices[0].message.parsed, Pet)


async def test_a_schema_that_cannot_compile_is_a_400_naming_response_format(client, base_url):
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError) as err:
            await client.chat.completions.create(
                model="m", messages=_messages("x", BAD_SCHEMA), max_tokens=8, stream=stream,
                response_format=_json_schema("x", BAD_SCHEMA))
        assert err.value.body["param"] == "response_format"
        assert err.value.body["code"] == "invalid_request"
    with pytest.raises(openai.BadRequestError) as err:
        await client.chat.completions.create(
            model="m", messages=_messages("x", {}), max_tokens=8,
            response_format={"type": "xml"})
    assert err.value.body["param"].startswith("response_format")


async def test_a_schema_that_cannot_compile_is_an_invalid_request_frame(base_url):
    async with aiohttp.ClientSession() as session:
        ws, _ = await open_ws(session, base_url)
        await ws.send_json({"type": "generate", "id": "bad", "prompt": "hi", "params": {
            "response_format": _json_schema("x", BAD_SCHEMA)}})
        _, last = await recv_until(ws, "bad")
        assert last["type"] == "error" and last["code"] == "invalid_request"
        assert last["message"].startswith("response_format:")
        await ws.send_json({"type": "generate", "id": "plain", "prompt": "hi", "params": {
            "max_tokens": 2, "response_format": {"type": "text"}}})
        _, last = await recv_until(ws, "plain")
        assert last["type"] == "done"  # the socket goes on; `text` is unconstrained
        await ws.close()
