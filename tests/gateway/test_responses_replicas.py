"""A Responses chain moves between replicas sharing a Redis session store: two apps
(each its own SessionRegistry and store client, as two `tokenwire serve` processes) on
one real redis-server. A chain started on one continues on the other, over HTTP and
WebSocket mode, with the full history; the first replica going away loses nothing."""
from __future__ import annotations

from openai import AsyncOpenAI

from gateway.sessions.redis import RedisSessionStore
from gateway.sessions.store import SessionStoreConfig

FAST = {"model": "default", "max_output_tokens": 8, "temperature": 0}


def client(url: str) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)


async def test_chain_continues_on_another_replica(server, redis_server):
    config = SessionStoreConfig(redis_server.url)
    first_url = server.start_app(store=RedisSessionStore(config))
    second_url = server.start_app(store=RedisSessionStore(config))
    first, second = client(first_url), client(second_url)
    one = await first.responses.create(input="My name is Ada.", **FAST)
    two = await first.responses.create(input="I live in Paris.",
                                       previous_response_id=one.id, **FAST)
    server.stop_app(first_url)  # the replica holding the chain goes away
    assert (await second.responses.retrieve(two.id)).output_text == two.output_text
    three = await second.responses.create(input="What is my name?",
                                          previous_response_id=two.id, **FAST)
    assert three.usage.input_tokens > two.usage.input_tokens + two.usage.output_tokens
    async with second.responses.connect() as conn:
        await conn.response.create(input="Where do I live?",
                                   previous_response_id=three.id, **FAST)
        async for event in conn:
            assert event.type != "error", event
            if event.type in ("response.completed", "response.incomplete"):
                break
    assert event.response.usage.input_tokens > three.usage.input_tokens
    await second.responses.delete(three.id)
    server.stop_app(second_url)
