"""tools / tool_choice / parallel_tool_calls on chat completions, with the default model
(whose chat template cannot render tools: the fallback renders them) and with a template
that renders them. Forced calls (required, named) always parse against their schema."""
from __future__ import annotations

import json

import jsonschema
import openai
import pytest

# A ChatML template that renders tools, as tool-capable models' templates do.
TOOLS_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\nTools you may call:\n"
    "{%- for tool in tools %}\n{{ tool | tojson }}{%- endfor %}<|im_end|>\n{% endif %}"
    "{%- for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{{ message['content'] or '' }}<|im_end|>\n{% endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                            "days": {"type": "integer", "minimum": 1,
                                                     "maximum": 9}},
           "required": ["city", "days"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Current weather of a city", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}]
CHAT = [{"role": "user", "content": "Weather in Paris for the next 3 days?"}]
GREEDY = {"model": "m", "temperature": 0, "max_tokens": 48}
NAMED = {"type": "function", "function": {"name": "get_weather"}}


@pytest.fixture
def tools_template(server):
    """The served model's tokenizer with a template that renders tools, for one test."""
    tokenizer = server.engine.tokenizer
    saved, tokenizer.chat_template = tokenizer.chat_template, TOOLS_TEMPLATE
    yield tokenizer
    tokenizer.chat_template = saved


async def _streamed(client, **kwargs) -> tuple[str, list[dict], str]:
    """(content, calls joined by index as OpenAI's clients join them, finish_reason)."""
    content, calls, finish = "", {}, None
    async for chunk in await client.chat.completions.create(stream=True, **kwargs):
        for choice in chunk.choices:
            content += choice.delta.content or ""
            for call in choice.delta.tool_calls or ():
                joined = calls.setdefault(call.index, {"name": "", "arguments": ""})
                joined["name"] += call.function.name or ""
                joined["arguments"] += call.function.arguments or ""
            finish = choice.finish_reason or finish
    return content, [calls[i] for i in sorted(calls)], finish


@pytest.mark.parametrize("stream", [False, True])
async def test_a_named_tool_choice_always_calls_it_with_valid_arguments(client, stream):
    kwargs = {"messages": CHAT, "tools": TOOLS, "tool_choice": NAMED, **GREEDY}
    if stream:
        content, calls, finish = await _streamed(client, **kwargs)
    else:
        resp = await client.chat.completions.create(**kwargs)
        message, finish = resp.choices[0].message, resp.choices[0].finish_reason
        content = message.content or ""
        calls = [{"name": c.function.name, "arguments": c.function.arguments}
                 for c in message.tool_calls]
        assert message.tool_calls[0].id.startswith("call_")
    assert finish == "stop"  # as OpenAI reports a forced call
    assert content == "" and [c["name"] for c in calls] == ["get_weather"]
    jsonschema.validate(json.loads(calls[0]["arguments"]), WEATHER)


@pytest.mark.parametrize("stream", [False, True])
async def test_required_makes_at_least_one_valid_call(client, stream):
    kwargs = {"messages": CHAT, "tools": TOOLS, "tool_choice": "required",
              "parallel_tool_calls": False, **GREEDY}
    if stream:
        _, calls, finish = await _streamed(client, **kwargs)
    else:
        resp = await client.chat.completions.create(**kwargs)
        finish = resp.choices[0].finish_reason
        calls = [{"name": c.function.name, "arguments": c.function.arguments}
                 for c in resp.choices[0].message.tool_calls]
    assert finish == "tool_calls" and len(calls) == 1
    schema = {"get_weather": WEATHER, "get_time": {"type": "object"}}[calls[0]["name"]]
    jsonschema.validate(json.loads(calls[0]["arguments"]), schema)


async def test_the_fallback_shows_the_tools_and_past_calls(client):
    """The default template cannot render tools: a system message lists them, and a past
    call and its result reach the prompt as text."""
    plain = await client.chat.completions.create(messages=CHAT, **GREEDY)
    shown = await client.chat.completions.create(messages=CHAT, tools=TOOLS, **GREEDY)
    assert shown.usage.prompt_tokens > plain.usage.prompt_tokens + 50
    none = await client.chat.completions.create(messages=CHAT, tools=TOOLS,
                                                tool_choice="none", **GREEDY)
    assert none.usage.prompt_tokens == plain.usage.prompt_tokens
    looped = CHAT + [
        {"role": "assistant", "content": None, "tool_calls": [{
            "id": "c1", "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "18C and sunny all week"}]
    after = await client.chat.completions.create(messages=looped, tools=TOOLS, **GREEDY)
    assert after.usage.prompt_tokens > shown.usage.prompt_tokens + 10


@pytest.mark.parametrize("stream", [False, True])
async def test_tools_are_rendered_through_a_template_that_can(client, tools_template, stream):
    rendered = tools_template.apply_chat_template(CHAT, tools=TOOLS, tokenize=False,
                                                  add_generation_prompt=True)
    assert "get_weather" in rendered
    expected = len(tools_template.encode(rendered, add_special_tokens=False))
    kwargs = {"stream": True, "stream_options": {"include_usage": True}} if stream else {}
    resp = await client.chat.completions.create(messages=CHAT, tools=TOOLS,
                                                tool_choice="auto", **kwargs, **GREEDY)
    usage = [c async for c in resp][-1].usage if stream else resp.usage
    assert usage.prompt_tokens == expected


BAD = [
    ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ({"tool_choice": "sometimes"}, "tool_choice"),
    ({"tools": [{"type": "function", "function": {"name": "has space"}}]},
     "tools[0].function.name"),
    ({"tools": [{"type": "custom", "function": {"name": "f"}}]}, "tools[0].type"),
    ({"tools": [{"type": "function", "function": {"name": "f", "bogus": 1}}]}, "bogus"),
    ({"tools": TOOLS * 70}, "tools"),  # 140 over the default 128, and names repeat
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": _deep}}]
      for _deep in [json.loads('{"a":' * 40 + "1" + "}" * 40)]}, "tools[0].function.parameters"),
    ({"tool_choice": NAMED, "response_format": {"type": "json_object"}}, "tool_choice"),
    ({"tools": None, "tool_choice": "required"}, "tool_choice"),
]


@pytest.mark.parametrize("extra,param", [(b[0] if isinstance(b[0], dict) else next(b[0]),
                                          b[1]) for b in BAD])
async def test_bad_tools_are_a_400_naming_the_field(client, extra, param):
    body = {"messages": CHAT, "tools": TOOLS, **GREEDY, **extra}
    with pytest.raises(openai.BadRequestError) as info:
        await client.chat.completions.create(**{k: v for k, v in body.items()
                                                 if v is not None})
    assert info.value.body["param"] == param
