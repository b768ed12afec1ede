"""Messages and prompts as newer SDK code sends them: the `developer` role is a system
message, content may be a list of text parts (HTTP and /v1/ws), a list `prompt` gives one
choice per prompt, `echo` shows the prompt; each whole and streamed."""
from __future__ import annotations

import aiohttp
import openai
import pytest

from ws_helpers import open_ws, recv_until

GREEDY = {"model": "m", "temperature": 0, "max_tokens": 8}
SYSTEM = "Answer in French."
QUESTION = "What is the color of the sky?"


async def _chat(client, messages, stream: bool) -> tuple[str, int]:
    """The reply's text and its prompt's token count."""
    if not stream:
        resp = await client.chat.completions.create(messages=messages, **GREEDY)
        return resp.choices[0].message.content, resp.usage.prompt_tokens
    text, usage = "", None
    async for chunk in await client.chat.completions.create(
            messages=messages, stream=True, stream_options={"include_usage": True}, **GREEDY):
        text += chunk.choices[0].delta.content or "" if chunk.choices else ""
        usage = chunk.usage or usage
    return text, usage.prompt_tokens


@pytest.mark.parametrize("stream", [False, True])
async def test_developer_role_and_text_parts_are_the_system_message(client, stream):
    plain = await _chat(client, [{"role": "system", "content": SYSTEM},
                                 {"role": "user", "content": QUESTION}], stream)
    parts = [{"type": "text", "text": "What is the color "}, {"type": "text", "text": "of the sky?"}]
    newer = await _chat(client, [{"role": "developer", "content": [{"type": "text",
                                                                    "text": SYSTEM}]},
                                 {"role": "user", "content": parts}], stream)
    default_system = await _chat(client, [{"role": "user", "content": QUESTION}], stream)
    assert newer == plain  # the same prompt, token for token, so the same reply
    assert plain[1] != default_system[1]  # and the developer text was used


async def test_ws_generate_messages_take_developer_and_parts(base_url, client):
    messages = [{"role": "developer", "content": [{"type": "text", "text": SYSTEM}]},
                {"role": "user", "content": [{"type": "text", "text": QUESTION}]}]
    async with aiohttp.ClientSession() as s:
        ws, _ = await open_ws(s, base_url)
        await ws.send_json({"type": "generate", "id": "g", "messages": messages,
                            "params": {"temperature": 0, "max_tokens": 8}})
        frames, done = await recv_until(ws, "g")
        await ws.send_json({"type": "generate", "id": "img", "messages": [
            {"role": "user", "content": [{"type": "image_url", "text": ""}]}]})
        _, refused = await recv_until(ws, "img")
        await ws.close()
    assert done["type"] == "done"
    text = "".join(f["text"] for f in frames if f["type"] == "delta")
    http = await _chat(client, [{"role": "system", "content": SYSTEM},
                                {"role": "user", "content": QUESTION}], False)
    assert (text, done["usage"]["prompt_tokens"]) == http
    assert refused["code"] == "invalid_request"
    assert refused["message"].startswith("messages[0].content[0].type")


async def test_non_text_parts_are_refused_naming_them(client):
    with pytest.raises(openai.BadRequestError) as info:
        await client.chat.completions.create(messages=[{"role": "user", "content": [
            {"type": "text", "text": "hi"}, {"type": "image_url",
                                             "image_url": {"url": "http://x/y.png"}}]}],
            **GREEDY)
    assert info.value.body["param"] == "messages[0].content[1].type"


@pytest.mark.parametrize("stream", [False, True])
async def test_a_list_prompt_gives_one_choice_per_prompt(client, stream):
    prompts = ["The capital of France is", "Two plus two is"]
    singles = [(await client.completions.create(prompt=p, **GREEDY)) for p in prompts]
    if stream:
        texts = {}
        async for chunk in await client.completions.create(prompt=prompts, stream=True,
                                                           **GREEDY):
            for c in chunk.choices:
                texts[c.index] = texts.get(c.index, "") + c.text
    else:
        resp = await client.completions.create(prompt=prompts, **GREEDY)
        texts = {c.index: c.text for c in resp.choices}
        assert resp.usage.prompt_tokens == sum(s.usage.prompt_tokens for s in singles)
    assert texts == {i: s.choices[0].text for i, s in enumerate(singles)}


@pytest.mark.parametrize("stream", [False, True])
async def test_echo_shows_the_prompt_first(client, stream):
    prompt = "The capital of France is"
    plain = (await client.completions.create(prompt=prompt, **GREEDY)).choices[0].text
    if stream:
        chunks = [c.choices[0].text async for c in await client.completions.create(
            prompt=prompt, echo=True, stream=True, **GREEDY)]
        assert chunks[0] == prompt
        text = "".join(chunks)
    else:
        text = (await client.completions.create(prompt=prompt, echo=True, **GREEDY)
                ).choices[0].text
    assert text == prompt + plain


async def test_echo_with_logprobs_is_refused(client):
    with pytest.raises(openai.BadRequestError) as info:
        await client.completions.create(prompt="Hi", echo=True, logprobs=1, **GREEDY)
    assert info.value.body["param"] == "echo"
