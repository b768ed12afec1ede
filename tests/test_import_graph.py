"""The import graph keeps the architecture (docs/architecture.md):

    gateway -> scheduler -> engine -> kernels -> common      (never back)

- no module imports a package above its own (loadtest drives servers from outside: only
  the `tokenwire` console script, gateway/cli, may load it);
- the scheduler reaches the engine through the `engine` package's public names only;
- the gateway takes only the engine's types (classes), never calls it: its requests go
  through the scheduler; the entry point alone also sets torch's threads;
- no import cycle among runtime imports (typing-only imports left out).
"""
from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LAYERS = {"common": 0, "kernels": 1, "engine": 2, "scheduler": 3, "gateway": 4}
PACKAGES = [*LAYERS, "loadtest"]
CONSOLE_SCRIPT = "gateway.cli"  # may load the subcommands' modules, loadtest's included
ENTRY_POINT_CALLS = {("gateway.cli.serve", "engine.llm", "set_num_threads")}
# Where the engine's data types live: a request's params, its outputs and their mailbox,
# the errors it raises, its config (the entry point derives flags from it).
ENGINE_TYPES = {"engine.errors", "engine.outputs", "engine.sampling_params",
                "engine.logprobs", "engine.mailbox", "engine.config"}


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for package in PACKAGES
           for p in sorted((ROOT / package).rglob("*.py"))}


def _typing_only(node: ast.AST, parents: dict) -> bool:
    """Inside `if TYPE_CHECKING:`."""
    while node in parents:
        node = parents[node]
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            return True
    return False


def imports(module: str) -> list[tuple[str, list[str], bool]]:
    """(imported module, names taken from it, typing only) for each import in `module`."""
    tree = ast.parse(MODULES[module].read_text())
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(a.name, [], _typing_only(node, parents)) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolve against this module's package
                package = module.split(".")
                package = package if MODULES[module].name == "__init__.py" else package[:-1]
                base = ".".join(package[:len(package) - node.level + 1] + ([base] if base else []))
            names = [a.name for a in node.names]
            submodules = [f"{base}.{n}" for n in names if f"{base}.{n}" in MODULES]
            typing_only = _typing_only(node, parents)
            found += [(sub, [], typing_only) for sub in submodules]
            if len(submodules) < len(names):
                found.append((base, [n for n in names if f"{base}.{n}" not in MODULES],
                              typing_only))
    return [(target, names, typing) for target, names, typing in found
            if target.split(".")[0] in PACKAGES and target != module]


def _layer(module: str) -> int | None:
    return LAYERS.get(module.split(".")[0])


def test_the_graph_was_read():
    assert len(MODULES) > 100 and "gateway.sockets.core" in MODULES
    edges = sum(len(imports(m)) for m in MODULES)
    assert edges > 300


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_import_points_up_the_layers(module):
    for target, _, _ in imports(module):
        if target.split(".")[0] == "loadtest":
            assert module.startswith(("loadtest", CONSOLE_SCRIPT)), (module, target)
        elif _layer(module) is not None:
            assert _layer(target) <= _layer(module), f"{module} imports {target}"


@pytest.mark.parametrize("module", sorted(m for m in MODULES if m.startswith("scheduler")))
def test_the_scheduler_uses_the_engines_public_names_only(module):
    for target, _, _ in imports(module):
        if target.startswith("engine"):
            assert target == "engine", f"{module} imports {target}, not the engine package"


@pytest.mark.parametrize("module", sorted(m for m in MODULES if m.startswith("gateway")))
def test_the_gateway_takes_only_the_engines_types(module):
    for target, names, _ in imports(module):
        if not target.startswith("engine"):
            continue
        assert names, f"{module} imports the module {target}, not names from it"
        calls = {(m, t) for m, t, _ in ENTRY_POINT_CALLS}
        assert target in ENGINE_TYPES or (module, target) in calls, \
            f"{module} imports {target}: the gateway reaches the engine through the scheduler"
        source = importlib.import_module(target)
        for name in names:
            if (module, target, name) in ENTRY_POINT_CALLS:
                continue
            assert inspect.isclass(getattr(source, name)), \
                f"{module} takes {target}.{name}, which is not a type"


def test_no_cycles():
    graph = {m: {t for t, _, typing in imports(m) if not typing and t in MODULES}
             for m in MODULES}
    visiting, done, cycles = set(), set(), []

    def visit(node: str, path: list[str]) -> None:
        if node in done:
            return
        if node in visiting:
            cycles.append(path[path.index(node):] + [node])
            return
        visiting.add(node)
        for nxt in sorted(graph[node]):
            visit(nxt, path + [nxt])
        visiting.discard(node)
        done.add(node)

    for module in sorted(graph):
        visit(module, [module])
    assert not cycles, " ; ".join(" -> ".join(c) for c in cycles[:5])
