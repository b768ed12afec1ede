"""Command-line flags generated from a config dataclass, so every limit it has is a flag.

    EngineConfig.max_num_seqs: int            -> --max-num-seqs N
    SchedulerConfig.max_rss_bytes: int | None -> --max-rss-bytes N|none
    EngineConfig.enable_prefix_caching: bool  -> --prefix-caching / --no-prefix-caching
    GatewayConfig.heartbeat_s = setting(..., flag="--heartbeat")  -> --heartbeat X

A field declared with `setting` (common/settings.py) brings its help text and, where the
field's name would not do, its flag's name, a parser, or `repeat` (the flag may be given
several times). A flag left out keeps the dataclass default (argparse default None), so the
dataclass stays the one place defaults live; `--help` shows them.
"""
from __future__ import annotations

import argparse
import dataclasses


def add_config_flags(group, cls: type, skip: frozenset[str] = frozenset()) -> None:
    """One flag per field of `cls` not in `skip`."""
    for f in dataclasses.fields(cls):
        if f.name in skip or not f.init:
            continue
        meta = f.metadata
        type_name = _type_name(f.type)
        default = _default(f)
        help_text = f"{meta['help']} (default: %(default)s)" if meta.get("help") else \
            "default: %(default)s"
        if type_name == "bool":
            group.add_argument(meta.get("flag") or _bool_flag(f.name), dest=f.name,
                               default=None, action=argparse.BooleanOptionalAction,
                               help=help_text.replace("%(default)s",
                                                      "on" if default else "off"))
            continue
        flag = meta.get("flag") or "--" + f.name.replace("_", "-")
        shown = "none" if default is None else default
        options = {"dest": f.name, "default": None, "metavar": meta.get("metavar")
                   or _metavar(type_name), "help": help_text.replace("%(default)s",
                                                                      str(shown))}
        if meta.get("repeat"):
            group.add_argument(flag, action="append", **options)
        else:
            group.add_argument(flag, type=meta.get("parse") or _parser(type_name), **options)


def config_values(args: argparse.Namespace, cls: type,
                  skip: frozenset[str] = frozenset()) -> dict:
    """The fields of `cls` that were given on the command line ("none" given -> None)."""
    names = {f.name for f in dataclasses.fields(cls) if f.init} - skip
    given = {name: getattr(args, name) for name in names if getattr(args, name) is not None}
    values = {name: None if value is _OFF else value for name, value in given.items()}
    for f in dataclasses.fields(cls):
        if f.name in values and f.metadata.get("repeat"):
            values[f.name] = tuple(values[f.name])
    return values


def _default(f: dataclasses.Field):
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None


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
