"""Command-line flags generated from a config dataclass, so every limit it has is a flag.

    EngineConfig.max_num_seqs: int            -> --max-num-seqs N
    SchedulerConfig.max_rss_bytes: int | None -> --max-rss-bytes N|none
    EngineConfig.enable_prefix_caching: bool  -> --prefix-caching / --no-prefix-caching

A flag left out keeps the dataclass default (argparse default None), so the dataclass
stays the one place defaults live; `--help` shows them.
"""
from __future__ import annotations

import argparse
import dataclasses


def add_config_flags(group, cls: type, skip: frozenset[str] = frozenset()) -> None:
    """One flag per field of `cls` not in `skip`."""
    for f in dataclasses.fields(cls):
        if f.name in skip or not f.init:
            continue
        type_name = _type_name(f.type)
        if type_name == "bool":
            group.add_argument(_bool_flag(f.name), dest=f.name, default=None,
                               action=argparse.BooleanOptionalAction,
                               help=f"default: {'on' if f.default else 'off'}")
            continue
        group.add_argument("--" + f.name.replace("_", "-"), dest=f.name,
                           type=_parser(type_name), default=None, metavar=_metavar(type_name),
                           help=f"default: {f.default}")


def config_values(args: argparse.Namespace, cls: type,
                  skip: frozenset[str] = frozenset()) -> dict:
    """The fields of `cls` that were given on the command line ("none" given -> None)."""
    names = {f.name for f in dataclasses.fields(cls) if f.init} - skip
    given = {name: getattr(args, name) for name in names if getattr(args, name) is not None}
    return {name: None if value is _OFF else value for name, value in given.items()}


def _type_name(annotation) -> str:
    """The annotation as text, e.g. "int | None", whether or not annotations are postponed."""
    if isinstance(annotation, str):
        return annotation
    return annotation.__name__ if isinstance(annotation, type) else str(annotation)


def _bool_flag(name: str) -> str:
    # enable_prefix_caching -> --prefix-caching (and --no-prefix-caching), as vLLM spells it.
    for prefix in ("enable_", "use_"):
        name = name.removeprefix(prefix)
    return "--" + name.replace("_", "-")


def _parser(type_name: str):
    base = int if type_name.startswith("int") else float if type_name.startswith("float") else str
    if not type_name.endswith("| None"):
        return base

    def parse(text: str):
        # "none" switches an optional limit off, which the default None cannot express
        # when the dataclass default is a number.
        return _OFF if text.lower() in ("none", "off") else base(text)

    parse.__name__ = base.__name__  # argparse names the type in its error messages
    return parse


def _metavar(type_name: str) -> str:
    kind = "N" if type_name.startswith("int") else "X" if type_name.startswith("float") else "S"
    return kind + "|none" if type_name.endswith("| None") else kind


class _Off:
    """The value "none" given for an optional limit (replaced by None when building)."""

    def __repr__(self) -> str:
        return "none"


_OFF = _Off()

