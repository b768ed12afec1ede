"""Mailbox merges a request's outputs into one slot: constant memory per slow reader,
nothing lost, the reader woken when something is pending."""
import asyncio

from engine.logprobs import TokenLogprob
from engine.mailbox import Mailbox
from engine.outputs import RequestOutput


def out(text: str, n: int = 1, logprobs=None, **totals) -> RequestOutput:
    return RequestOutput("r", text, list(range(n)), logprobs=logprobs, **totals)


def test_mailbox_merges_text_and_counts():
    box = Mailbox()
    assert box.take() is None
    for word in ("Hel", "lo", " world"):
        box.put(out(word))
    merged = box.take()
    assert (merged.delta_text, len(merged.new_token_ids)) == ("Hello world", 3)
    assert box.empty and box.take() is None


def test_slow_reader_costs_one_output_and_only_the_text():
    box = Mailbox()
    for _ in range(10_000):
        box.put(out("xy"))
    assert box.pending_chars == 20_000  # the unsent text itself, no per-output overhead
    merged = box.take()
    assert len(merged.new_token_ids) == 10_000 and len(merged.delta_text) == 20_000
    assert box.pending_chars == 0


def test_token_without_text_still_counts():
    """A token whose text is still held back by the detokenizer (half a UTF-8 char)."""
    box = Mailbox()
    box.put(out(""))
    merged = box.take()
    assert (merged.delta_text, merged.new_token_ids) == ("", [0])


def test_logprobs_merge_with_their_tokens_and_never_alias_the_callers_list():
    a, c, d = (TokenLogprob(i, -0.5, ()) for i in (1, 3, 4))
    first = [a]
    box = Mailbox()
    box.put(out("a", 1, first))
    box.put(out("b", 1))  # a request that asked has one entry per token; none here
    box.put(out("c", 2, [c, d]))
    assert box.take().logprobs == [a, c, d]
    assert first == [a]
    assert box.take() is None


def test_totals_and_finish_state_come_from_the_latest_output():
    box = Mailbox()
    box.put(out("a", num_prompt_tokens=5, num_cached_tokens=0, num_output_tokens=1))
    box.put(out("b", num_prompt_tokens=5, num_cached_tokens=4, num_output_tokens=2))
    box.put(RequestOutput("r", "", [], finished=True, finish_reason="length",
                          num_output_tokens=2, num_cached_tokens=4))
    merged = box.take()
    assert (merged.finished, merged.finish_reason) == (True, "length")
    assert (merged.num_prompt_tokens, merged.num_cached_tokens,
            merged.num_output_tokens) == (5, 4, 2)


async def test_get_waits_for_a_put_and_takes_everything_pending():
    box = Mailbox()
    getter = asyncio.ensure_future(box.get())
    await asyncio.sleep(0.01)
    assert not getter.done()
    box.put(out("a"))
    box.put(out("b"))
    assert (await asyncio.wait_for(getter, 1)).delta_text == "ab"
    assert box.empty
