"""`setting()`: a config dataclass field that also says how it is set from the command line.

    heartbeat_s: float = setting(20.0, "seconds between WebSocket pings", flag="--heartbeat")

Every layer's config declares its fields this way, so the field is the one owner of a
limit: its default, its validation (the config's __post_init__), its flag and its help.
The CLI (gateway/cli/flags.py) derives one flag per field from this metadata.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any


def setting(default: Any = dataclasses.MISSING, help: str = "", *, flag: str | None = None,
            parse: Callable[[str], Any] | None = None, repeat: bool = False,
            metavar: str | None = None, default_factory: Any = dataclasses.MISSING) -> Any:
    """A dataclass field with its flag's help; `flag` overrides the name derived from the
    field, `parse` turns the flag's text into the value, `repeat` collects a repeated flag
    into a tuple."""
    meta = {"help": help, "flag": flag, "parse": parse, "repeat": repeat, "metavar": metavar}
    return dataclasses.field(default=default, default_factory=default_factory, metadata=meta)


def comma_list(text: str) -> tuple[str, ...]:
    """"a, b,,c" -> ("a", "b", "c"): a flag that takes a comma-separated list."""
    return tuple(part.strip() for part in text.split(",") if part.strip())
