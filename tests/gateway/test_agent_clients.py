"""Tool calls from the agent frameworks people use, unchanged, against the real server:
langchain-openai (`bind_tools` with a forced tool, `with_structured_output` by function
calling) and litellm with `tools`, streamed and not."""
from __future__ import annotations

import os

import httpx
import pytest
from pydantic import BaseModel, Field

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no fetch at import

CHAT = "What is the weather in Paris for the next 3 days?"


class GetWeather(BaseModel):
    """Current weather of a city."""

    city: str = Field(description="the city", max_length=30)
    days: int = Field(description="how many days", ge=1, le=14)


@pytest.fixture
async def llm(base_url):
    from langchain_openai import ChatOpenAI
    # An HTTP client of this test's own: langchain's shared default one would outlive
    # the event loop of the test that made it.
    async with httpx.AsyncClient() as http:
        yield ChatOpenAI(base_url=base_url + "/v1", api_key="unused", model="m",
                         temperature=0, max_tokens=48, max_retries=0, http_async_client=http)


@pytest.mark.parametrize("stream", [False, True])
async def test_langchain_bind_tools_with_a_forced_tool(llm, stream):
    bound = llm.bind_tools([GetWeather], tool_choice="GetWeather")
    if stream:
        message = None
        async for chunk in bound.astream(CHAT):
            message = chunk if message is None else message + chunk
    else:
        message = await bound.ainvoke(CHAT)
    assert [c["name"] for c in message.tool_calls] == ["GetWeather"]
    GetWeather.model_validate(message.tool_calls[0]["args"])  # parses against the schema


@pytest.mark.parametrize("stream", [False, True])
async def test_langchain_structured_output_by_function_calling(llm, stream):
    structured = llm.with_structured_output(GetWeather, method="function_calling")
    if stream:
        result = [r async for r in structured.astream(CHAT)][-1]
    else:
        result = await structured.ainvoke(CHAT)
    assert isinstance(result, GetWeather) and 1 <= result.days <= 14


async def test_langchain_any_tool(llm):
    bound = llm.bind_tools([GetWeather], tool_choice="any", parallel_tool_calls=False)
    message = await bound.ainvoke(CHAT)
    assert message.response_metadata["finish_reason"] == "tool_calls"
    GetWeather.model_validate(message.tool_calls[0]["args"])


@pytest.mark.parametrize("stream", [False, True])
async def test_litellm_tools(base_url, stream):
    import litellm
    tool = {"type": "function", "function": {"name": "GetWeather", "description": "weather",
                                             "parameters": GetWeather.model_json_schema()}}
    response = await litellm.acompletion(
        model="openai/m", api_base=base_url + "/v1", api_key="unused", stream=stream,
        messages=[{"role": "user", "content": CHAT}], tools=[tool], temperature=0,
        tool_choice={"type": "function", "function": {"name": "GetWeather"}}, max_tokens=48)
    if stream:
        chunks = [chunk async for chunk in response]
        message = litellm.stream_chunk_builder(chunks).choices[0].message
    else:
        message = response.choices[0].message
    assert message.tool_calls[0].function.name == "GetWeather"
    GetWeather.model_validate_json(message.tool_calls[0].function.arguments)
