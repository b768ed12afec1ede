"""vLLM's chat/completions extensions that clients send widely (guidellm, vLLM's examples)
are honoured, through the openai SDK's extra_body as those clients send them:
continuous_usage_stats, chat_template_kwargs, add_generation_prompt,
continue_final_message, skip_special_tokens, echo. Unknown ones stay refused by name."""
from __future__ import annotations

import re
from pathlib import Path

import openai
import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "http-api.md"
CHAT = [{"role": "user", "content": "What is the capital of France?"}]
PARTIAL = CHAT + [{"role": "assistant", "content": "The capital of France is"}]
GREEDY = {"model": "m", "temperature": 0, "max_tokens": 6}
# A ChatML template with a variable of its own, as templates with `enable_thinking` have.
PERSONA_TEMPLATE = (
    "{%- if persona %}<|im_start|>system\nYou are {{ persona }}.<|im_end|>\n{% endif %}"
    "{%- for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@pytest.fixture
def persona_template(server):
    tokenizer = server.engine.tokenizer
    saved, tokenizer.chat_template = tokenizer.chat_template, PERSONA_TEMPLATE
    yield tokenizer
    tokenizer.chat_template = saved


def _tokens(tokenizer, messages, **options) -> int:
    text = tokenizer.apply_chat_template(messages, tokenize=False, **options)
    return len(tokenizer.encode(text, add_special_tokens=False))


async def _refused(create, param: str, **body) -> str:
    with pytest.raises(openai.BadRequestError) as info:
        await create(**body)
    assert info.value.body["param"] == param, info.value.body
    return info.value.body["message"]


@pytest.mark.parametrize("chat", [True, False])
async def test_continuous_usage_stats_puts_usage_on_every_chunk(client, chat):
    options = {"include_usage": True, "continuous_usage_stats": True}
    if chat:
        stream = await client.chat.completions.create(messages=CHAT, stream=True,
                                                      stream_options=options, **GREEDY)
    else:
        stream = await client.completions.create(prompt="Paris is", stream=True,
                                                 stream_options=options, **GREEDY)
    chunks = [c async for c in stream]
    assert all(c.usage is not None for c in chunks)
    counts = [c.usage.completion_tokens for c in chunks]
    assert counts == sorted(counts) and counts[-1] == 6  # GREEDY's max_tokens, grown to
    prompt = {c.usage.prompt_tokens for c in chunks}
    assert len(prompt) == 1 and all(c.usage.total_tokens == c.usage.prompt_tokens
                                    + c.usage.completion_tokens for c in chunks)


async def test_usage_only_at_the_end_without_continuous_stats(client):
    stream = await client.chat.completions.create(
        messages=CHAT, stream=True, stream_options={"include_usage": True}, **GREEDY)
    chunks = [c async for c in stream]
    assert [c.usage is not None for c in chunks] == [False] * (len(chunks) - 1) + [True]


async def test_chat_template_kwargs_reach_the_template(client, persona_template):
    body = {"messages": CHAT, **GREEDY}
    plain = await client.chat.completions.create(**body)
    kwargs = {"chat_template_kwargs": {"persona": "a pirate"}}
    pirate = await client.chat.completions.create(**body, extra_body=kwargs)
    assert plain.usage.prompt_tokens == _tokens(persona_template, CHAT,
                                                add_generation_prompt=True)
    assert pirate.usage.prompt_tokens == _tokens(persona_template, CHAT, persona="a pirate",
                                                 add_generation_prompt=True)
    assert pirate.usage.prompt_tokens > plain.usage.prompt_tokens


@pytest.mark.parametrize("kwargs,param", [
    ({"messages": []}, "chat_template_kwargs.messages"),
    ({"add_generation_prompt": False}, "chat_template_kwargs.add_generation_prompt"),
    ({"tools": []}, "chat_template_kwargs.tools"),
    ({"eos_token": "x"}, "chat_template_kwargs.eos_token"),
    ({"tokenize": True}, "chat_template_kwargs.tokenize"),
    ({"not a name": 1}, "chat_template_kwargs.not a name"),
    ({"big": "x" * 5000}, "chat_template_kwargs"),
    ([1], "chat_template_kwargs"),
])
async def test_chat_template_kwargs_are_bounded(client, kwargs, param):
    await _refused(client.chat.completions.create, param, messages=CHAT, **GREEDY,
                   extra_body={"chat_template_kwargs": kwargs})


async def test_add_generation_prompt_false_leaves_the_assistant_header_out(client, server):
    tokenizer = server.engine.tokenizer
    resp = await client.chat.completions.create(
        messages=CHAT, **GREEDY, extra_body={"add_generation_prompt": False})
    assert resp.usage.prompt_tokens == _tokens(tokenizer, CHAT, add_generation_prompt=False)
    assert resp.usage.prompt_tokens < _tokens(tokenizer, CHAT, add_generation_prompt=True)


@pytest.mark.parametrize("stream", [False, True])
async def test_continue_final_message_with_echo_returns_the_whole_message(client, server,
                                                                           stream):
    extra = {"add_generation_prompt": False, "continue_final_message": True, "echo": True}
    resp = await client.chat.completions.create(messages=PARTIAL, stream=stream, **GREEDY,
                                                extra_body=extra)
    if stream:
        text = "".join([c.choices[0].delta.content or "" async for c in resp])
    else:
        text = resp.choices[0].message.content
        assert resp.usage.prompt_tokens == _tokens(server.engine.tokenizer, PARTIAL,
                                                   continue_final_message=True)
    assert text.startswith("The capital of France is") and len(text) > len(PARTIAL[1]["content"])
    assert "Paris" in text


async def test_echo_only_repeats_a_message_of_the_replys_role(client):
    echoed = await client.chat.completions.create(messages=CHAT, **GREEDY,
                                                  extra_body={"echo": True})
    plain = await client.chat.completions.create(messages=CHAT, **GREEDY)
    assert echoed.choices[0].message.content == plain.choices[0].message.content


async def test_continue_final_message_needs_an_open_assistant_message(client):
    create = client.chat.completions.create
    await _refused(create, "continue_final_message", messages=PARTIAL, **GREEDY,
                   extra_body={"continue_final_message": True})  # with the header too
    await _refused(create, "continue_final_message", messages=CHAT, **GREEDY,
                   extra_body={"continue_final_message": True, "add_generation_prompt": False})


@pytest.mark.parametrize("chat", [True, False])
async def test_skip_special_tokens_false_shows_them(client, chat):
    """Past its end-of-turn token (ignore_eos) the model goes on: that token's text shows
    only with skip_special_tokens false."""
    body = {"model": "m", "temperature": 0, "max_tokens": 24, "extra_body": {"ignore_eos": True}}
    texts = []
    for skip in (True, False):
        body["extra_body"]["skip_special_tokens"] = skip
        if chat:
            resp = await client.chat.completions.create(
                messages=[{"role": "user", "content": "Say OK."}], **body)
            texts.append(resp.choices[0].message.content)
        else:
            resp = await client.completions.create(prompt="<|im_start|>user\nSay OK.<|im_end|>"
                                                   "\n<|im_start|>assistant\n", **body)
            texts.append(resp.choices[0].text)
    shown, hidden = texts[1], texts[0]
    assert "<|im_end|>" in shown and "<|im_end|>" not in hidden


async def test_unknown_extensions_stay_refused_by_name(client):
    for name in ("guided_json", "include_stop_str_in_output", "chat_template"):
        await _refused(client.chat.completions.create, name, messages=CHAT, **GREEDY,
                       extra_body={name: 1})
    await _refused(client.chat.completions.create, "bogus",
                   messages=CHAT, stream=True, **GREEDY,
                   stream_options={"include_usage": True, "bogus": True})


def test_the_extensions_are_documented():
    rows = re.findall(r"^\| `(\w+)` \| [\w, ]+ \| (\w+)", DOC.read_text(), re.M)
    documented = dict(rows)
    for name in ("add_generation_prompt", "continue_final_message", "chat_template_kwargs",
                 "skip_special_tokens", "echo"):
        assert documented.get(name) == "honoured", name
