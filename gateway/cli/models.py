"""The models `tokenwire serve` serves: `--model [NAME=]SOURCE` (repeatable) and the
`[[model]]` tables of `--models FILE` (TOML), in that order; the first is the default.

    --model default --model small=dummy:tiny --keep-alive 60 --models-memory 2000000000

    # models.toml: any EngineConfig field per model, `source` for its --model
    memory_budget_bytes = 2_000_000_000      # as --models-memory
    [[model]]
    name = "small"
    source = "dummy:tiny"
    keep_alive_s = 0                          # idle seconds before unload (-1: never)
    preload = false
    max_model_len = 1024

A model's engine settings are the command line's engine flags with its table's fields
over them. With one model and no NAME it is served under the name it is today.
"""
from __future__ import annotations

import dataclasses
import tomllib
from dataclasses import dataclass
from pathlib import Path

from common.errors import ConfigError
from scheduler.models import served_name

DEFAULT_KEEP_ALIVE_S = 300.0  # of the models after the first (the default never unloads)
_OWN_KEYS = frozenset({"name", "source", "keep_alive_s", "preload"})


@dataclass(frozen=True)
class ModelSpec:
    """One served model: its name (None: the engine's own), engine settings, lifetime."""

    name: str | None
    engine: object  # engine.config.EngineConfig (imported lazily: it imports torch)
    keep_alive_s: float
    preload: bool


def split_model_flag(value: str) -> tuple[str | None, str]:
    """`NAME=SOURCE` -> (NAME, SOURCE); a bare SOURCE -> (None, SOURCE). A NAME holds no
    `/` or `:`, so a path or `dummy:x` with an `=` further on stays a SOURCE."""
    name, sep, source = value.partition("=")
    if sep and name and not set(name) & {"/", ":"}:
        return name, source
    return None, value


def model_specs(flags: list[str] | None, models_file: str | None, base, keep_alive_s: float
                ) -> tuple[list[ModelSpec], int | None]:
    """The served models in order, and the memory budget the file sets (None: unset).
    `base` is the EngineConfig the engine flags make; `keep_alive_s` the flag's value."""
    specs = [ModelSpec(name, dataclasses.replace(base, model=source),
                       -1 if i == 0 else keep_alive_s, i == 0)
             for i, (name, source) in enumerate(map(split_model_flag, flags or ()))]
    budget = None
    if models_file:
        tables, budget = _read_file(Path(models_file))
        specs += [_table_spec(t, base, keep_alive_s, first=not specs and i == 0)
                  for i, t in enumerate(tables)]
    if not specs:
        specs = [ModelSpec(None, base, -1, True)]
    if len(specs) > 1:
        specs = [s if s.name else dataclasses.replace(s, name=served_name(s.engine.model))
                 for s in specs]
        names = [s.name for s in specs]
        if len(set(names)) < len(names):
            raise ConfigError("model", f"two models share a name: {names} (give NAME=)")
    return specs, budget


def _read_file(path: Path) -> tuple[list[dict], int | None]:
    try:
        with path.open("rb") as f:
            data = tomllib.load(f)
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError("models", f"{path}: {exc}") from None
    unknown = set(data) - {"model", "memory_budget_bytes"}
    if unknown:
        raise ConfigError("models", f"{path}: unknown keys {sorted(unknown)} (expected "
                          "[[model]] tables and memory_budget_bytes)")
    tables = data.get("model", [])
    if not isinstance(tables, list) or not all(isinstance(t, dict) for t in tables):
        raise ConfigError("models", f"{path}: `model` must be [[model]] tables")
    return tables, data.get("memory_budget_bytes")


def _table_spec(table: dict, base, keep_alive_s: float, first: bool) -> ModelSpec:
    if "source" not in table:
        raise ConfigError("models", f"a [[model]] table has no source: {table}")
    fields = {f.name for f in dataclasses.fields(base) if f.init} - {"model"}
    unknown = set(table) - fields - _OWN_KEYS
    if unknown:
        raise ConfigError("models", f"model {table.get('name') or table['source']!r}: "
                          f"unknown keys {sorted(unknown)}")
    engine = {k: v for k, v in table.items() if k in fields}
    try:
        config = dataclasses.replace(base, model=table["source"], **engine)
    except (TypeError, ValueError) as exc:
        raise ConfigError("models", f"model {table['source']!r}: {exc}") from None
    return ModelSpec(table.get("name"), config,
                     float(table.get("keep_alive_s", -1 if first else keep_alive_s)),
                     bool(table.get("preload", first)))
