"""Workload builders and config validation (localhost-only by default)."""
import json
import random

import pytest

from loadtest.config import LoadTestConfig, is_loopback
from loadtest.datasets import file_prompts, random_prompts, sample_len, session_turns


def test_sample_len_stays_in_range_and_ratio_zero_is_exact():
    rng = random.Random(0)
    assert {sample_len(100, 0.0, rng) for _ in range(50)} == {100}
    lengths = [sample_len(100, 0.5, rng) for _ in range(500)]
    assert min(lengths) >= 50 and max(lengths) <= 150 and len(set(lengths)) > 20


def test_random_prompts_without_tokenizer_are_seeded_words():
    a = random_prompts(5, 12, 7, 0.0, random.Random(3))
    b = random_prompts(5, 12, 7, 0.0, random.Random(3))
    assert a == b
    assert all(len(p.text.split()) == 12 and p.prompt_len == 12 and p.output_len == 7 for p in a)
    assert len({p.text for p in a}) == 5


def test_file_prompts_read_lines_and_jsonl(tmp_path):
    path = tmp_path / "prompts.txt"
    path.write_text("hello there\n\n" + json.dumps({"prompt": "tell me", "output_len": 3})
                    + "\n")
    prompts = file_prompts(path, 3, output_len=9)
    assert [(p.text, p.output_len) for p in prompts] == \
        [("hello there", 9), ("tell me", 3), ("hello there", 9)]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": 5}\n')
    with pytest.raises(ValueError, match="line 1"):
        file_prompts(bad, 1, 9)


def test_session_turns_split_prompts_per_session():
    prompts = random_prompts(6, 4, 2, 0.0, random.Random(0))
    sessions = session_turns(2, 3, prompts)
    assert sessions == [prompts[:3], prompts[3:]]


def test_session_openers_replace_each_first_turn():
    prompts = random_prompts(6, 4, 2, 0.0, random.Random(0))
    openers = random_prompts(2, 50, 2, 0.0, random.Random(1))
    sessions = session_turns(2, 3, prompts, openers)
    assert [s[0] for s in sessions] == openers
    assert [s[1:] for s in sessions] == [prompts[1:3], prompts[4:6]]


def test_cli_first_turn_len_builds_long_openers():
    from loadtest.workload import build_workload

    cfg = LoadTestConfig(dataset="sessions", num_sessions=2, turns=3, first_turn_len=40,
                         random_input_len=5)
    sessions = build_workload(cfg, None)["sessions"]
    assert [[p.prompt_len for p in s] for s in sessions] == [[40, 5, 5], [40, 5, 5]]


@pytest.mark.parametrize("host,ok", [("127.0.0.1", True), ("localhost", True), ("::1", True),
                                     ("127.9.9.9", True), ("10.0.0.1", False),
                                     ("example.com", False), ("0.0.0.0", False)])
def test_is_loopback(host, ok):
    assert is_loopback(host) is ok


def test_config_refuses_remote_hosts_unless_allowed():
    with pytest.raises(ValueError, match="allow-remote"):
        LoadTestConfig(url="ws://192.168.1.4:8000/v1/ws")
    assert LoadTestConfig(url="ws://192.168.1.4:8000/v1/ws", allow_remote=True).is_websocket


@pytest.mark.parametrize("field,value", [("num_prompts", 0), ("random_range_ratio", 1.0),
                                         ("request_rate", 0.0), ("burstiness", -1.0),
                                         ("max_concurrency", 0), ("dataset", "nope"),
                                         ("first_turn_len", 0),
                                         ("url", "ftp://127.0.0.1/x"), ("percentiles", (0.0,))])
def test_config_rejects_bad_values(field, value):
    with pytest.raises(ValueError):
        LoadTestConfig(**{field: value})


@pytest.mark.parametrize("where", [{"idle_gap": -1.0, "dataset": "sessions"},
                                   {"idle_gap": 1.0},  # random prompts have no turns
                                   {"idle_gap": 1.0, "dataset": "sessions",
                                    "url": "ws://127.0.0.1:8000/v1/realtime"}])
def test_idle_gap_is_for_resumable_sessions(where):
    with pytest.raises(ValueError, match="idle_gap"):
        LoadTestConfig(**where)
    assert LoadTestConfig(dataset="sessions", idle_gap=1.0).idle_gap == 1.0


def test_file_dataset_needs_a_file():
    with pytest.raises(ValueError, match="prompts_file"):
        LoadTestConfig(dataset="file")


def test_copy_prompts_are_seeded_tasks_near_their_length_in_every_kind():
    from loadtest.copy_dataset import copy_prompts
    from loadtest.tokenizer import load_tokenizer

    tokenizer = load_tokenizer("default")
    prompts = copy_prompts(16, 200, 64, 0.0, random.Random(5), tokenizer)
    assert prompts == copy_prompts(16, 200, 64, 0.0, random.Random(5), tokenizer)
    for p in prompts:
        assert p.prompt_len == len(tokenizer.encode(p.text, add_special_tokens=False))
        assert 200 <= p.prompt_len <= 240 and p.output_len == 64
    openings = {p.text.split()[0] for p in prompts}
    assert openings == {"Repeat", "Rewrite", "Rename", "You"}  # all four kinds drawn
    rename = next(p.text for p in prompts if p.text.startswith("Rename"))
    old = rename.split("`")[1]
    assert rename.count(old) > 2  # the identifier to rename is in the file it names
