"""Streamed deltas concatenate to the full decode; no delta carries a broken character."""
import pytest

from engine.detokenizer import IncrementalDetokenizer

TEXTS = [
    "Hello, world! Plain ASCII with  double spaces and\nnewlines.",
    "中文测试：今天天气很好，我们去公园散步吧。",
    "Emoji time 🎉🚀👩‍👩‍👧 and flags 🇫🇷 mixed with café naïveté.",
    "  leading spaces, tabs\tand trailing  ",
]


@pytest.mark.parametrize("text", TEXTS)
def test_deltas_concatenate_to_full_decode(llm, text):
    tok = llm.tokenizer
    prompt = tok.encode("Say:")
    ids = tok.encode(text)
    detok = IncrementalDetokenizer(tok, prompt, stop=[])
    deltas = []
    for token in ids:
        detok.add(token)
        deltas.append(detok.take_delta(final=False))
    detok.flush()
    deltas.append(detok.take_delta(final=True))
    assert "".join(deltas) == tok.decode(ids, skip_special_tokens=True) == text
    assert all("\ufffd" not in d for d in deltas)
    multi_byte = [len(tok.decode([t])) for t in ids]
    if any("\ufffd" in tok.decode([t]) for t in ids):
        assert "" in deltas  # some character was held back until complete
    assert multi_byte


def test_stop_string_split_over_tokens_is_held_back(llm):
    tok = llm.tokenizer
    ids = tok.encode("alpha beta gamma delta")
    detok = IncrementalDetokenizer(tok, [], stop=["gamma"])
    seen = ""
    for token in ids:
        detok.add(token)
        seen += detok.take_delta(final=False)
        if detok.stopped:
            break
    seen += detok.take_delta(final=True)
    assert detok.stopped and seen == "alpha beta "
