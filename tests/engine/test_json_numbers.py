"""JSON numbers in a schema's grammar have bounded length: the default model, greedy,
asked for a count, used to run on in digits until max_tokens; bounded, its reply ends
and parses. The bound is the engine's max_json_number_digits (None: xgrammar's own)."""
from __future__ import annotations

import json

import pytest
import xgrammar as xgr

from engine import SamplingParams
from engine.errors import ConfigError
from engine.config import EngineConfig
from engine.grammar import GrammarCompiler, new_matcher
from engine.json_numbers import bound_numbers

COUNT = {"type": "object", "properties": {"count": {"type": "integer"}},
         "required": ["count"], "additionalProperties": False}
NUMBERS = {"type": "object", "properties": {
    "x": {"type": "number"}, "n": {"type": "integer", "minimum": 0},
    "r": {"type": "number", "minimum": 0}, "code": {"type": "string", "pattern": "^[0-9]+$"}},
    "required": ["x", "n", "r", "code"], "additionalProperties": False}


def _compiler(llm, digits: int | None) -> GrammarCompiler:
    core = llm.core
    return GrammarCompiler(core.tokenizer, core.runner.sample_vocab, core.eos_token_ids,
                           threads=1, cache_size=4, timeout_s=30.0, max_number_digits=digits)


def _accepts(compiler: GrammarCompiler, schema: dict, text: str) -> bool:
    matcher = new_matcher(compiler.compile({"type": "json_schema", "schema": schema}))
    return matcher.accept_string(text) and matcher.is_completed()


@pytest.mark.parametrize("digits", [None, 15])
def test_the_default_model_finishes_a_number(llm, digits):
    """Unbounded (None), the model writes `{"count": 8000...` until max_tokens."""
    saved, llm.core.grammars = llm.core.grammars, _compiler(llm, digits)
    try:
        prompt = llm.core.encode_chat([{"role": "user",
                                         "content": "How many legs does a spider have?"}])
        params = SamplingParams(max_tokens=60, temperature=0, response_format={
            "type": "json_schema", "json_schema": {"name": "c", "schema": COUNT}})
        out = llm.generate([prompt], params)[0]
    finally:
        llm.core.grammars = saved
    if digits is None:
        assert out.finish_reason == "length"  # the behaviour the bound ends
        return
    assert out.finish_reason == "stop"
    count = json.loads(out.text)["count"]
    assert isinstance(count, int) and len(str(abs(count))) <= digits


def test_every_digit_run_is_bounded_and_patterns_are_not(llm):
    compiler = _compiler(llm, 4)
    ok = '{"x": -1234.5678e+12, "n": 1234, "r": 1234.5678, "code": "1234567890"}'
    assert _accepts(compiler, NUMBERS, ok)
    for too_long in ('{"x": 12345', '{"x": 1.12345', '{"x": 1e123',
                     '{"x": 1, "n": 12345', '{"x": 1, "n": 1, "r": 12345'):
        matcher = new_matcher(compiler.compile({"type": "json_schema", "schema": NUMBERS}))
        assert not matcher.accept_string(too_long), too_long
    assert _accepts(_compiler(llm, None), NUMBERS, ok.replace("1234,", "123456789,"))


def test_the_rewrite_leaves_other_repetitions_alone():
    ebnf = str(xgr.Grammar.from_json_schema(json.dumps(NUMBERS), any_whitespace=False))
    bounded = bound_numbers(ebnf, 15)
    assert "[0-9]*" not in bounded
    assert [line for line in bounded.splitlines() if "{1, -1}" in line] == []
    assert bounded.count("Regex(") == ebnf.count("Regex(")
    items = str(xgr.Grammar.from_json_schema('{"type": "array"}', any_whitespace=False))
    assert "basic_array_items{0, -1}" in bound_numbers(items, 15)  # arrays stay unbounded
    xgr.Grammar.from_ebnf(bounded, root_rule_name="root")  # and it parses


def test_the_bound_is_checked():
    with pytest.raises(ConfigError):
        EngineConfig(max_json_number_digits=1)
    assert EngineConfig(max_json_number_digits=None).max_json_number_digits is None
