"""Mailboxes merge deltas into one slot: constant frames per stream, nothing lost."""
from scheduler.mailbox import Mailbox


def test_mailbox_merges_text_and_counts():
    box = Mailbox()
    assert box.take_delta() is None
    for word in ("Hel", "lo", " world"):
        box.put_delta(word, 1)
    assert box.take_delta() == ("Hello world", 3, None)
    assert box.empty and box.take_delta() is None


def test_slow_reader_costs_one_frame_and_only_the_text():
    box = Mailbox()
    for _ in range(10_000):
        box.put_delta("xy", 1)
    assert box.pending_bytes == 20_000  # the unsent text itself, no per-frame overhead
    text, n, _ = box.take_delta()
    assert n == 10_000 and len(text) == 20_000
    assert box.pending_bytes == 0


def test_token_without_text_still_counts():
    """A token whose text is still held back by the detokenizer (half a UTF-8 char)."""
    box = Mailbox()
    box.put_delta("", 1)
    assert box.take_delta() == ("", 1, None)


def test_logprobs_merge_with_their_tokens():
    box = Mailbox()
    box.put_delta("a", 1, ["lp-a"])
    box.put_delta("b", 1)  # a request that asked has one entry per token; none here
    box.put_delta("c", 2, ["lp-c", "lp-d"])
    assert box.take_delta() == ("abc", 4, ["lp-a", "lp-c", "lp-d"])
    assert box.take_delta() is None
