"""OpenAI-compatible streaming client (`/completions` and `/chat/completions`, SSE).

Works against tokenwire or any OpenAI-compatible server (vLLM, SGLang, ...), so one run
can compare them. Asks for `stream_options.include_usage` so the server's token counts win.
"""
from __future__ import annotations

import json
import time

import aiohttp

from loadtest.records import RequestRecord

# HTTP status -> protocol error code, so refusals are counted alike on both transports.
STATUS_CODES = {400: "invalid_request", 401: "unauthorized", 403: "unauthorized",
                404: "not_found", 413: "too_large", 429: "rate_limited",
                503: "overloaded"}


async def fetch_model(http: aiohttp.ClientSession, base_url: str) -> str:
    """The first model the server lists at GET {base}/models."""
    async with http.get(f"{base_url}/models") as resp:
        resp.raise_for_status()
        return (await resp.json())["data"][0]["id"]


def build_body(endpoint: str, model: str, prompt: str | list, params: dict) -> dict:
    """The request body: `prompt` (text or token ids) for completions, `messages` for chat."""
    key = "messages" if endpoint == "chat" else "prompt"
    return {"model": model, key: prompt, "stream": True,
            "stream_options": {"include_usage": True}, **params}


async def stream(http: aiohttp.ClientSession, url: str, body: dict,
                 record: RequestRecord) -> None:
    """POST `body` to `url` and fill `record` from the SSE stream."""
    record.start = time.perf_counter()
    try:
        async with http.post(url, json=body) as resp:
            if resp.status != 200:
                text = await resp.text()
                record.fail(STATUS_CODES.get(resp.status, f"http_{resp.status}"), text)
                return
            finish_reason = await _read_events(resp, record)
    except aiohttp.ClientError as exc:
        record.fail("disconnected", repr(exc))
        return
    if record.error_code is None:
        record.finish(time.perf_counter(), finish_reason or "stop")


async def _read_events(resp: aiohttp.ClientResponse, record: RequestRecord) -> str | None:
    finish_reason = None
    async for raw_line in resp.content:
        now = time.perf_counter()
        line = raw_line.decode("utf-8").strip()
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            break
        event = json.loads(data)
        if "error" in event:
            error = event["error"]
            record.fail(error.get("code") or error.get("type") or "error",
                        error.get("message", ""))
            return None
        finish_reason = _apply_event(event, now, record) or finish_reason
    return finish_reason


def _apply_event(event: dict, now: float, record: RequestRecord) -> str | None:
    usage = event.get("usage")
    if usage:
        record.usage_prompt_tokens = usage.get("prompt_tokens")
        record.usage_completion_tokens = usage.get("completion_tokens")
        details = usage.get("prompt_tokens_details") or {}
        record.usage_cached_tokens = details.get("cached_tokens")
    choices = event.get("choices") or []
    if not choices:
        return None
    choice = choices[0]
    text = choice.get("text")
    if text is None:
        text = (choice.get("delta") or {}).get("content") or ""
    if text:
        record.add_chunk(now, text, 1)  # SSE has no per-chunk token count: one a chunk
    return choice.get("finish_reason")
