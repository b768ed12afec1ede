"""/v1/realtime with the official openai SDK's realtime client (websockets underneath).

Every event is read raw and parsed strictly as the SDK's own server-event union
(realtime_helpers.parse), so a field of the wrong type or shape fails the test.
"""
from __future__ import annotations

import re

import aiohttp
from realtime_helpers import (CLOSING_ORDER, RESPONSE_ORDER, connect, recv, recv_until, say,
                              text_of, types)

BLOCK_SIZE = 16  # the engine's KV block: the prefix cache shares whole blocks only
FAST = {"type": "realtime", "instructions": "Answer in one short sentence.",
        "max_output_tokens": 12, "temperature": 0}


def metric(text: str, name: str) -> float:
    match = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
    return float(match.group(1)) if match else 0.0


async def scrape(base_url: str) -> str:
    async with aiohttp.ClientSession() as http:
        async with http.get(base_url + "/metrics") as r:
            return await r.text()


async def test_session_update_then_two_turns_reuse_the_prefix_cache(server, base_url):
    assert server.engine.core.config.block_size == BLOCK_SIZE
    async with connect(base_url) as conn:
        created = await recv(conn)
        assert created.type == "session.created" and created.session.id
        await conn.session.update(session=FAST)
        updated = await recv(conn)
        assert updated.type == "session.updated"
        assert updated.session.instructions == FAST["instructions"]
        assert updated.session.max_output_tokens == 12

        events1, done1 = await say(conn, "Here are some European countries: France, Germany, "
                                   "Italy, Spain, Portugal, Austria and Belgium. What is "
                                   "the capital of France?")
        n = len(RESPONSE_ORDER)
        assert types(events1)[:n] == RESPONSE_ORDER
        delta = "response.output_text.delta"
        deltas = types(events1)[n:].count(delta)
        assert deltas > 0 and types(events1)[n:n + deltas] == [delta] * deltas
        assert types(events1)[n + deltas:] == CLOSING_ORDER + [
            "conversation.item.added", "conversation.item.done", "response.done"]
        reply1 = text_of(events1)
        assert "Paris" in reply1 and done1.response.output[0].content[0].text == reply1
        usage1 = done1.response.usage

        _, done2 = await say(conn, "And of Germany?")
        usage2 = done2.response.usage
        # Turn 2's prompt holds turn 1 (question and reply), and finds at least turn 1's
        # whole prompt blocks in the prefix cache (more than the system prompt's).
        assert usage2.input_tokens > usage1.input_tokens + usage1.output_tokens
        cached = usage2.input_token_details.cached_tokens
        assert usage1.input_tokens >= 2 * BLOCK_SIZE  # the system prompt fills less than one
        assert (usage1.input_tokens // BLOCK_SIZE) * BLOCK_SIZE <= cached
        assert cached <= usage1.input_tokens + usage1.output_tokens


async def test_cancel_mid_stream_ends_cancelled_and_frees_blocks(server, base_url):
    before = metric(await scrape(base_url), 'tokenwire_requests_total{finish_reason="cancelled"}')
    async with connect(base_url) as conn:
        await recv(conn)
        await conn.conversation.item.create(item={
            "type": "message", "role": "user",
            "content": [{"type": "input_text", "text": "Count from 1 to 300, comma separated."}]})
        await recv_until(conn, "conversation.item.done")
        await conn.response.create(response={"max_output_tokens": 1000, "temperature": 0})
        await recv_until(conn, "response.output_text.delta")  # streaming: cancel now
        await conn.response.cancel(event_id="evt_cancel")
        events, done = await recv_until(conn, "response.done")
        assert done.response.status == "cancelled"
        assert done.response.status_details.reason == "client_cancelled"
        assert done.response.usage.output_tokens < 1000
        assert CLOSING_ORDER == [t for t in types(events) if t in CLOSING_ORDER]
        # The engine freed every KV block of the cancelled request.
        assert server.all_blocks_free()
        stats = server.engine.stats()
        assert stats.num_free_blocks == stats.num_total_blocks and stats.num_running == 0
    after = metric(await scrape(base_url), 'tokenwire_requests_total{finish_reason="cancelled"}')
    assert after == before + 1


async def test_out_of_band_response_leaves_the_conversation_unchanged(base_url):
    async with connect(base_url) as conn:
        await recv(conn)
        await conn.session.update(session=FAST)
        await recv(conn)
        await conn.conversation.item.create(item={
            "id": "msg_q", "type": "message", "role": "user",
            "content": [{"type": "input_text", "text": "What is the capital of Italy?"}]})
        await recv_until(conn, "conversation.item.done")
        _, baseline = await recv_until_done(conn, {})
        await conn.conversation.item.delete(item_id=baseline.response.output[0].id)
        await recv_until(conn, "conversation.item.deleted")

        events, oob = await recv_until_done(conn, {
            "conversation": "none", "metadata": {"purpose": "title"},
            "instructions": "Give a three-word title.",
            "input": [{"type": "item_reference", "id": "msg_q"}]})
        assert oob.response.conversation_id is None
        assert oob.response.metadata == {"purpose": "title"}
        assert "conversation.item.added" not in types(events)
        # The out-of-band reply is not an item of the conversation ...
        await conn.conversation.item.retrieve(item_id=oob.response.output[0].id,
                                              event_id="evt_oob")
        error = await recv(conn)
        assert error.type == "error" and error.error.code == "item_not_found"
        assert error.error.event_id == "evt_oob"
        # ... so the next in-band response sees the same conversation as before it.
        _, again = await recv_until_done(conn, {})
        assert again.response.usage.input_tokens == baseline.response.usage.input_tokens


async def recv_until_done(conn, response: dict):
    await conn.response.create(response=response)
    return await recv_until(conn, "response.done")


async def test_item_retrieve_truncate_delete(base_url):
    async with connect(base_url) as conn:
        await recv(conn)
        await conn.conversation.item.create(item={
            "id": "msg_a", "type": "message", "role": "assistant",
            "content": [{"type": "output_text", "text": "Paris is the capital of France."}]})
        added = await recv(conn)
        assert added.type == "conversation.item.added" and added.item.id == "msg_a"
        await recv(conn)  # conversation.item.done
        await conn.conversation.item.retrieve(item_id="msg_a")
        got = await recv(conn)
        assert got.type == "conversation.item.retrieved"
        assert got.item.content[0].text == "Paris is the capital of France."
        await conn.conversation.item.truncate(item_id="msg_a", content_index=0, audio_end_ms=5)
        cut = await recv(conn)
        assert cut.type == "conversation.item.truncated" and cut.audio_end_ms == 5
        await conn.conversation.item.retrieve(item_id="msg_a")
        assert (await recv(conn)).item.content[0].text == "Paris"
        await conn.conversation.item.delete(item_id="msg_a")
        deleted = await recv(conn)
        assert deleted.type == "conversation.item.deleted" and deleted.item_id == "msg_a"
        await conn.conversation.item.retrieve(item_id="msg_a", event_id="evt_gone")
        gone = await recv(conn)
        assert gone.type == "error" and gone.error.event_id == "evt_gone"


async def test_audio_event_is_an_unsupported_error_and_the_socket_goes_on(base_url):
    async with connect(base_url) as conn:
        await recv(conn)
        await conn.input_audio_buffer.append(audio="AAAA", event_id="evt_audio")
        error = await recv(conn)
        assert error.type == "error" and error.error.code == "unsupported"
        assert error.error.event_id == "evt_audio"
        assert "input_audio_buffer.append" in error.error.message
        await conn.session.update(session=FAST)
        await recv(conn)
        _, done = await say(conn, "Hi")
        assert done.response.status in ("completed", "incomplete")
