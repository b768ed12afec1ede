"""JSON numbers of bounded length in a compiled JSON-schema grammar.

xgrammar lets a number's digits run on without end (`[1-9] [0-9]*`, `digits{1, -1}`): a
small model that starts a number can keep choosing another digit until max_tokens, and
the reply never parses. Real JSON numbers are short, so each run of digits is bounded:

    integer part   [1-9] [0-9]*          -> [1-9] [0-9]{0, N-1}      (at most N digits)
                   [1-9] d{1, -1}        -> [1-9] d{1, N-1}
    fraction       "." d{1, -1}          -> "." d{1, N}
    exponent       [eE] sign d{1, -1}    -> [eE] sign d{1, 2}        (doubles end at 1e308)

where d is a rule that is one digit, `[0-9]`. The rewrite works on xgrammar's EBNF text
of the schema's grammar (Grammar.from_json_schema printed, then parsed back); string
rules (their `Regex(...)` patterns) are left alone: a pattern's digits are the schema's.
"""
from __future__ import annotations

import re

EXPONENT_DIGITS = 2
_DIGIT_RULE = re.compile(r"^(\w+) ::= \(\(\[0-9\]\)\)$", re.M)
_UNBOUNDED = re.compile(r"(\[1-9\] )?(\[0-9\]\*|(\w+)\{1, -1\})")


def bound_numbers(ebnf: str, max_digits: int) -> str:
    """`ebnf` with every run of digits in a number bounded to `max_digits` (>= 2)."""
    digit_rules = set(_DIGIT_RULE.findall(ebnf))
    return "\n".join(_bound_rule(line, digit_rules, max_digits)
                     for line in ebnf.splitlines())


def _bound_rule(line: str, digit_rules: set[str], max_digits: int) -> str:
    if "Regex(" in line:
        return line
    exponent = "[eE]" in line

    def bounded(match: re.Match) -> str:
        lead, run, rule = match.groups()
        if rule is not None and rule not in digit_rules:
            return match.group(0)  # a repetition of something else (array items)
        if lead:  # the integer part: its first digit is the lead
            tail = f"{{0, {max_digits - 1}}}" if rule is None else f"{{1, {max_digits - 1}}}"
            return f"{lead}{'[0-9]' if rule is None else rule}{tail}"
        limit = EXPONENT_DIGITS if exponent else max_digits
        return f"{'[0-9]' if rule is None else rule}{{{0 if rule is None else 1}, {limit}}}"

    return _UNBOUNDED.sub(bounded, line)
