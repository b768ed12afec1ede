"""Helpers for the /v1/realtime tests: the official openai SDK's realtime client, and every
server event parsed strictly as the SDK's own pydantic server-event union."""
from __future__ import annotations

import asyncio

from openai import AsyncOpenAI
from openai.types.realtime.realtime_server_event import RealtimeServerEvent
from pydantic import TypeAdapter

SERVER_EVENT = TypeAdapter(RealtimeServerEvent)
RESPONSE_ORDER = ["response.created", "rate_limits.updated", "response.output_item.added",
                  "response.content_part.added"]
CLOSING_ORDER = ["response.output_text.done", "response.content_part.done",
                 "response.output_item.done"]


def connect(base_url: str, api_key: str = "unused", **kwargs):
    """The SDK's realtime connection manager, pointed at this server."""
    client = AsyncOpenAI(base_url=base_url + "/v1", api_key=api_key)
    return client.realtime.connect(model="default", **kwargs)


def parse(raw: bytes | str):
    """One server event, validated strictly (no coercion) as the SDK's union of types."""
    return SERVER_EVENT.validate_json(raw, strict=True)


async def recv(conn, timeout: float = 120.0):
    return parse(await asyncio.wait_for(conn.recv_bytes(), timeout))


async def recv_until(conn, kind: str, timeout: float = 120.0) -> tuple[list, object]:
    """Events up to and including the first of type `kind` (or an `error`, raised)."""
    seen = []
    async with asyncio.timeout(timeout):
        while True:
            event = await recv(conn)
            seen.append(event)
            if event.type == kind:
                return seen, event
            if event.type == "error":
                raise AssertionError(f"unexpected error event: {event.error}")


async def say(conn, text: str, **response) -> tuple[list, object]:
    """A user message, then an in-band response: (its events, its response.done)."""
    await conn.conversation.item.create(item={
        "type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]})
    await recv_until(conn, "conversation.item.done")
    await conn.response.create(response=response)
    return await recv_until(conn, "response.done")


def types(events) -> list[str]:
    return [e.type for e in events]


def text_of(events) -> str:
    return "".join(e.delta for e in events if e.type == "response.output_text.delta")
