"""Stored responses: kept in the session store, one record per response, so they have
the sessions' TTL, byte cap and per-key quotas, and outlive a restart (SQLite) or a
replica (Redis).

    SessionRecord(session_id=resp_..., owner=key hash,
                  messages=the chain's history through this response's reply,
                  response={"object": the Response, "input_items": this request's items,
                            "own_from": where this request's messages begin in messages})

A record holds its whole chain's history, bounded by max_conversation_items, so a chain
continues from one load, on any replica. A response belongs to the key that made it:
another key is told it does not exist (404), as for an unknown id.
"""
from __future__ import annotations

import time

from gateway.errors import RequestError
from gateway.runtime import Runtime
from gateway.sessions.store import (
    SessionConflictError,
    SessionRecord,
    SessionStoreUnavailableError,
    SessionTooLargeError,
)

MAX_ID_CHARS = 64


class Stored:
    """One response as loaded or saved: its record (for the version), object, items.
    `in_store`: False for one never stored (store: false), which a socket keeps itself."""

    def __init__(self, record: SessionRecord, in_store: bool = True):
        self.record = record
        self.in_store = in_store

    @classmethod
    def of(cls, response_id: str, owner: str | None, history: list[dict], obj: dict,
           input_items: list[dict], own_from: int = 0) -> Stored:
        return cls(SessionRecord(response_id, owner, None, {}, history, time.time(), 0,
                                 {"object": obj, "input_items": input_items,
                                  "own_from": own_from}), False)

    @property
    def object(self) -> dict:
        return self.record.response["object"]

    @property
    def input_items(self) -> list[dict]:
        return self.record.response["input_items"]

    @property
    def history(self) -> list[dict]:
        return self.record.messages


async def load(rt: Runtime, response_id: str, owner: str | None) -> Stored | None:
    """The stored response `response_id` of `owner`, None when unknown (or another's).
    An unreachable store is a RequestError store_unavailable (503)."""
    if not response_id.startswith("resp_") or len(response_id) > MAX_ID_CHARS:
        return None
    try:
        record = await rt.sessions.store.load(response_id)
    except SessionStoreUnavailableError as exc:
        raise unavailable(exc) from None
    if record is None or record.response is None or record.owner != owner:
        return None
    return Stored(record)


async def kept_or_load(rt: Runtime, kept: Stored) -> Stored | None:
    """`kept`, the response a socket saved last, while the store still holds that very
    version: one version read, not the record (a long chain's history is megabytes to
    read and decode on every turn). Deleted or expired since, it is gone here too (a
    socket's copy never brings back what DELETE or the TTL removed); changed since, the
    store's is read."""
    response_id = kept.record.session_id
    try:
        version = await rt.sessions.store.version(response_id)
    except SessionStoreUnavailableError as exc:
        raise unavailable(exc) from None
    if version is None:
        return None
    if version == kept.record.version:
        return kept
    return await load(rt, response_id, kept.record.owner)


async def save(rt: Runtime, response: Stored, version: int = 0) -> str | None:
    """Store (or update, from `version`) a response; returns why it could not be, None
    once stored (`response` then holds the stored version)."""
    response.record.version = version
    try:
        await rt.sessions.store.save(response.record)
    except (SessionTooLargeError, SessionStoreUnavailableError, SessionConflictError) as exc:
        return str(exc)
    response.in_store = True
    return None


async def delete(rt: Runtime, response_id: str) -> None:
    try:
        await rt.sessions.store.delete(response_id)
    except SessionStoreUnavailableError as exc:
        raise unavailable(exc) from None


def unavailable(exc: SessionStoreUnavailableError) -> RequestError:
    return RequestError(exc.code, str(exc), retry_after_ms=exc.retry_after_ms)


def not_found(response_id: str, code: str = "not_found",
              param: str | None = None) -> RequestError:
    what = f"Response with id '{response_id[:MAX_ID_CHARS]}' not found."
    return RequestError(code, f"{param}: {what}" if param else what, param=param)
