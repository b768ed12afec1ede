"""Every parameter the installed openai SDK defines for chat and completions is honoured,
accepted with no effect, or refused with a 400 naming it, never silently dropped, and
docs/http-api.md's table says which. A field the SDK gains fails here until classified."""
from __future__ import annotations

import re
from pathlib import Path

import openai
import pytest
from openai.types import completion_create_params as completion
from openai.types.chat import completion_create_params as chat

DOC = Path(__file__).resolve().parents[2] / "docs" / "http-api.md"
CHAT = [{"role": "user", "content": "Hi"}]
BASE = {"max_tokens": 2, "temperature": 0}
H, N, R = "honoured", "accepted, no effect", "refused"

# name -> (class, the value sent, the status it gets on the default model)
CHAT_PROBES = {
    "audio": (R, {"voice": "alloy", "format": "wav"}, 400),
    "frequency_penalty": (H, 0.5, 200),
    "function_call": (R, "auto", 400),
    "functions": (R, [{"name": "f", "parameters": {"type": "object"}}], 400),
    "logit_bias": (R, {"42": 5}, 400),
    "logprobs": (H, True, 200),
    "max_completion_tokens": (H, 3, 200),
    "max_tokens": (H, 3, 200),
    "messages": (H, CHAT, 200),
    "metadata": (N, {"k": "v"}, 200),
    "modalities": (H, ["text"], 200),
    "model": (N, "any-name", 200),
    "moderation": (R, {"model": "omni-moderation-latest"}, 400),
    "n": (H, 2, 200),
    "parallel_tool_calls": (H, False, 200),
    "prediction": (N, {"type": "content", "content": "Hello"}, 200),
    "presence_penalty": (H, 0.5, 200),
    "prompt_cache_key": (H, "k", 200),
    "prompt_cache_options": (N, {"mode": "implicit"}, 200),
    "prompt_cache_retention": (H, "24h", 200),
    "reasoning_effort": (R, "low", 400),
    "response_format": (H, {"type": "text"}, 200),
    "safety_identifier": (N, "u1", 200),
    "seed": (H, 3, 200),
    "service_tier": (N, "auto", 200),
    "stop": (H, ["\n"], 200),
    "store": (N, True, 200),
    "stream": (H, False, 200),
    "stream_options": (H, {"include_usage": True}, 200),  # sent with stream: true
    "temperature": (H, 0.7, 200),
    "tool_choice": (H, "none", 200),
    "tools": (H, [{"type": "function", "function": {"name": "f"}}], 200),  # the fallback
    "top_logprobs": (H, 2, 200),  # sent with logprobs: true
    "top_p": (H, 0.9, 200),
    "user": (N, "u1", 200),
    "verbosity": (R, "low", 400),
    "web_search_options": (R, {}, 400),
}
COMPLETION_PROBES = {
    "best_of": (H, 1, 200), "echo": (H, True, 200), "frequency_penalty": (H, 0.5, 200),
    "logit_bias": (R, {"42": 5}, 400), "logprobs": (H, 2, 200), "max_tokens": (H, 3, 200),
    "model": (N, "any-name", 200), "n": (H, 2, 200), "presence_penalty": (H, 0.5, 200),
    "prompt": (H, "Hi", 200), "seed": (H, 3, 200), "stop": (H, "\n", 200),
    "stream": (H, False, 200), "stream_options": (H, {"include_usage": True}, 200),
    "suffix": (R, "end", 400), "temperature": (H, 0.7, 200), "top_p": (H, 0.9, 200),
    "user": (N, "u1", 200),
}
COMPANIONS = {"stream_options": {"stream": True}, "top_logprobs": {"logprobs": True}}


def _sdk_fields(module) -> set[str]:
    return set(module.CompletionCreateParamsBase.__annotations__) | {"stream"}


def _doc_table() -> dict[str, str]:
    rows = re.findall(r"^\| `(\w+)` \| ([\w, ]+) \| (honoured|accepted, no effect|refused)",
                      DOC.read_text(), re.M)
    return {name: cls for name, _, cls in rows}


def test_every_sdk_parameter_is_classified_and_documented():
    assert _sdk_fields(chat) == set(CHAT_PROBES)
    assert _sdk_fields(completion) == set(COMPLETION_PROBES)
    documented = _doc_table()
    for name, (cls, _, _) in {**COMPLETION_PROBES, **CHAT_PROBES}.items():
        assert documented.get(name) == cls, name


async def _status(create, body: dict, name: str) -> int:
    try:
        resp = await create(**body)
        if body.get("stream"):
            async for _ in resp:
                pass
        return 200
    except openai.BadRequestError as exc:
        assert exc.body["param"] == name, exc.body  # a refusal names the parameter
        return 400


@pytest.mark.parametrize("name", sorted(CHAT_PROBES))
async def test_chat_parameter(client, name):
    _, value, status = CHAT_PROBES[name]
    body = {"model": "m", "messages": CHAT, **BASE, **COMPANIONS.get(name, {}), name: value}
    assert await _status(client.chat.completions.create, body, name) == status


@pytest.mark.parametrize("name", sorted(COMPLETION_PROBES))
async def test_completion_parameter(client, name):
    _, value, status = COMPLETION_PROBES[name]
    body = {"model": "m", "prompt": "Hi", **BASE, **COMPANIONS.get(name, {}), name: value}
    assert await _status(client.completions.create, body, name) == status


async def test_unknown_fields_are_refused_naming_them(client):
    with pytest.raises(openai.BadRequestError) as info:
        await client.chat.completions.create(model="m", messages=CHAT, **BASE,
                                             extra_body={"bogus_knob": 1})
    assert info.value.body["param"] == "bogus_knob"
