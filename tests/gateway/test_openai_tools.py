"""tools/tool_choice: rendered through the model's chat template when it supports tools,
else a 400 naming `tools`; never accepted and dropped."""
from __future__ import annotations

import openai
import pytest

# A ChatML template that renders tools, as tool-capable models' templates do.
TOOLS_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\nTools you may call:\n"
    "{%- for tool in tools %}\n{{ tool | tojson }}{%- endfor %}<|im_end|>\n{% endif %}"
    "{%- for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{{ message['content'] or '' }}<|im_end|>\n{% endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Current weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}]
CHAT = [{"role": "user", "content": "Weather in Paris?"}]
GREEDY = {"model": "m", "temperature": 0, "max_tokens": 4}


@pytest.fixture
def client(base_url):
    return openai.AsyncOpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0)


@pytest.fixture
def tools_template(server):
    """The served model's tokenizer with a template that renders tools, for one test."""
    tokenizer = server.engine.tokenizer
    saved, tokenizer.chat_template = tokenizer.chat_template, TOOLS_TEMPLATE
    yield tokenizer
    tokenizer.chat_template = saved


async def test_tools_without_template_support_name_tools(client):
    with pytest.raises(openai.BadRequestError) as info:
        await client.chat.completions.create(messages=CHAT, tools=TOOLS, **GREEDY)
    assert info.value.body["param"] == "tools"


@pytest.mark.parametrize("stream", [False, True])
async def test_tools_are_rendered_through_the_template(client, tools_template, stream):
    rendered = tools_template.apply_chat_template(CHAT, tools=TOOLS, tokenize=False,
                                                  add_generation_prompt=True)
    assert "get_weather" in rendered
    expected = len(tools_template.encode(rendered, add_special_tokens=False))
    kwargs = {"stream": True, "stream_options": {"include_usage": True}} if stream else {}
    resp = await client.chat.completions.create(messages=CHAT, tools=TOOLS,
                                                tool_choice="auto", **kwargs, **GREEDY)
    if stream:
        usage = [c async for c in resp][-1].usage
    else:
        usage = resp.usage
    assert usage.prompt_tokens == expected
    none = await client.chat.completions.create(messages=CHAT, tools=TOOLS,
                                                tool_choice="none", **GREEDY)
    assert none.usage.prompt_tokens < expected  # "none": the model is shown no tools


async def test_tool_turns_pass_to_the_template(client, tools_template):
    messages = CHAT + [
        {"role": "assistant", "content": None, "tool_calls": [{
            "id": "c1", "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "18C, sunny"}]
    rendered = tools_template.apply_chat_template(messages, tools=TOOLS, tokenize=False,
                                                  add_generation_prompt=True)
    assert "18C, sunny" in rendered
    resp = await client.chat.completions.create(messages=messages, tools=TOOLS, **GREEDY)
    assert resp.usage.prompt_tokens == len(tools_template.encode(rendered,
                                                                 add_special_tokens=False))


async def test_forced_tool_choice_is_refused(client, tools_template):
    for choice in ("required", {"type": "function", "function": {"name": "get_weather"}}):
        with pytest.raises(openai.BadRequestError) as info:
            await client.chat.completions.create(messages=CHAT, tools=TOOLS,
                                                 tool_choice=choice, **GREEDY)
        assert info.value.body["param"] == "tool_choice"
