"""Stored responses on the engine's KV tiers, as sessions are (gateway/sessions/kv.py):

    finish()   a stored response (or one with a prompt_cache_key or retention) parks its
               prompt and output: the next previous_response_id turn finds them after
               the pool evicted them, after a restart, on a replica sharing the disk tier
    DELETE     the response's own turn (its input and reply, as the chat template renders
               the chain) leaves the tiers; the turns before it stay, as the responses
               before it in the chain (and any chain branching off them) share them

Blocks are keyed by content: another conversation with the very same turn after the very
same history loses its copy too, and a later response that continued from the deleted one
re-prefills that turn once. Both cost time, never a wrong answer.
"""
from __future__ import annotations

from gateway.responses.stored import Stored
from gateway.runtime import Runtime
from gateway.tools.fallback import without_tools
from gateway.tools.formats import format_for_model
from scheduler.models import ModelSlot
from scheduler.registry import UnknownModel


def keep_finished(rt: Runtime, tokens: list[int], retain_s: float | None,
                  stored: bool) -> None:
    """Park a finished response's prompt and output (`tokens`) when it is stored or asked
    for a retention."""
    if stored or retain_s is not None:
        rt.session_kv.keep(rt.model, tokens, retain_s)


def forget_deleted(rt: Runtime, found: Stored) -> None:
    """Forget the blocks of a deleted response's own turn (module docstring)."""
    own_from = found.record.response.get("own_from")
    if own_from is None:  # stored by a tokenwire that did not record its turn's start
        return
    try:
        slot = rt.scheduler.models.resolve(found.object.get("model"))
    except UnknownModel:  # its model is no longer served: nothing of it is cached here
        return
    instructions = found.object.get("instructions")
    system = [{"role": "system", "content": instructions}] if instructions else []
    history = found.history
    parser = rt.config.tool_call_parser
    rt.session_kv.drop(slot, lambda: _turn_tokens(slot, parser, system, history, own_from))


def _turn_tokens(slot: ModelSlot, parser: str, system: list[dict], history: list[dict],
                 own_from: int) -> tuple[list[int], int]:
    """The chain through this turn as the next turn's prompt begins, and how many of its
    leading tokens the chain before this turn renders alike."""
    fmt = format_for_model(slot, parser)

    def render(messages: list[dict]) -> list[int]:
        return slot.encode_chat(without_tools(fmt, messages), add_generation_prompt=False)

    whole = render(system + history)
    before = render(system + history[:own_from]) if own_from else []
    shared = 0
    for a, b in zip(whole, before):
        if a != b:
            break
        shared += 1
    return whole, shared
