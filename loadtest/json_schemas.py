"""Twenty JSON schemas of bounded size for structured-output tests and benchmarks, and the
longest compact JSON each admits (so a max_tokens above it can never cut an answer short).

Every string has a maxLength or an enum, every array a maxItems, every integer and number a
range: the grammar (compact separators ", " and ": "; strings without escapes when their
length is bounded; at most 6 fraction digits in a bounded number) then admits only outputs
of at most `max_output_bytes(schema)` UTF-8 bytes, and every token is at least one byte.
"""
from __future__ import annotations

import json


def _obj(properties: dict, required=None) -> dict:
    return {"type": "object", "properties": properties,
            "required": list(properties) if required is None else required,
            "additionalProperties": False}


def _str(max_len: int, min_len: int = 0) -> dict:
    return {"type": "string", "minLength": min_len, "maxLength": max_len}


def _int(lo: int, hi: int) -> dict:
    return {"type": "integer", "minimum": lo, "maximum": hi}


def _num(lo: float, hi: float) -> dict:
    return {"type": "number", "minimum": lo, "maximum": hi}


def _arr(items: dict, max_items: int, min_items: int = 0) -> dict:
    return {"type": "array", "items": items, "minItems": min_items, "maxItems": max_items}


_BOOL = {"type": "boolean"}

SCHEMAS: list[tuple[str, dict]] = [
    ("person", _obj({"name": _str(12, 1), "age": _int(0, 120)})),
    ("flags", _obj({"active": _BOOL, "verified": _BOOL, "admin": _BOOL})),
    ("color", _obj({"color": {"enum": ["red", "green", "blue"]}})),
    ("point", _obj({"x": _num(-100, 100), "y": _num(-100, 100)})),
    ("tags", _obj({"tags": _arr(_str(8, 1), 3, 1)})),
    ("scores", _obj({"scores": _arr(_int(0, 100), 4)})),
    ("address", _obj({"street": _str(16), "city": _str(12, 1),
                      "zip": {"type": "string", "pattern": "^[0-9]{5}$"}})),
    ("user", _obj({"id": _int(1, 9999), "profile": _obj({"nick": _str(10, 1),
                                                         "premium": _BOOL})})),
    ("optional", _obj({"title": _str(12, 1), "subtitle": _str(12), "pages": _int(1, 999)},
                      required=["title"])),
    ("status", _obj({"state": {"enum": ["open", "closed", "pending"]},
                     "priority": {"enum": [1, 2, 3]}})),
    ("matrix", _obj({"rows": _arr(_arr(_int(0, 9), 3, 1), 3, 1)})),
    ("product", _obj({"sku": _str(8, 3), "price": _num(0, 1000), "in_stock": _BOOL})),
    ("event", _obj({"name": _str(12, 1), "day": _int(1, 31),
                    "month": {"enum": ["jan", "feb", "mar", "apr"]}})),
    ("items", _obj({"items": _arr(_obj({"name": _str(8, 1), "qty": _int(1, 20)}), 3, 1)})),
    ("nested", _obj({"a": _obj({"b": _obj({"c": _int(0, 50), "d": _BOOL})})})),
    ("temperature", _obj({"celsius": _num(-50, 60), "unit": {"const": "C"}})),
    ("nullable", _obj({"note": {"anyOf": [_str(10), {"type": "null"}]}, "count": _int(0, 5)})),
    ("short_code", _obj({"code": _str(4, 4), "valid": _BOOL})),
    ("answer", {"type": "string", "enum": ["yes", "no", "maybe"]}),
    ("list_of_bools", _arr(_BOOL, 5, 1)),
]


def max_output_bytes(schema: dict) -> int:
    """Bytes of the longest compact JSON the grammar admits for `schema`."""
    if "enum" in schema or "const" in schema:
        values = schema.get("enum", [schema.get("const")])
        return max(len(json.dumps(v, ensure_ascii=False).encode()) for v in values)
    if "anyOf" in schema:
        return max(max_output_bytes(s) for s in schema["anyOf"])
    kind = schema.get("type")
    if kind == "object":
        props = schema["properties"]
        members = sum(len(json.dumps(k).encode()) + 2 + max_output_bytes(v)
                      for k, v in props.items())
        return 2 + members + 2 * max(len(props) - 1, 0)
    if kind == "array":
        n = schema["maxItems"]
        return 2 + n * max_output_bytes(schema["items"]) + 2 * max(n - 1, 0)
    if kind == "string":
        return 2 + 4 * schema.get("maxLength", 8)  # pattern strings here are 5 digits
    if kind == "integer":
        return max(len(str(schema["minimum"])), len(str(schema["maximum"])))
    if kind == "number":
        whole = max(len(str(int(schema["minimum"]))), len(str(int(schema["maximum"]))))
        return whole + 1 + 6
    return {"boolean": 5, "null": 4}[kind]


def max_tokens_for(schema: dict) -> int:
    """A max_tokens that cannot end a constrained answer early: every byte a token, plus
    the end-of-sequence token that ends the grammar."""
    return max_output_bytes(schema) + 1
