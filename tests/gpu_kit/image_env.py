"""A stand-in, on CPU, for the GPU machine's Python: this venv with every third-party
package that is neither on the GPU image (scripts/gpu_image_packages.txt) nor in the kit
(scripts/gpu_kit.py's KIT) made unimportable, through a sitecustomize that blocks their
top-level modules. What runs under it imports only what the GPU machine will have."""
from __future__ import annotations

import ast
import importlib.util
import os
import sys
from importlib.metadata import packages_distributions
from pathlib import Path

from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[2]
LOCAL = {"common", "gateway", "scheduler", "engine", "kernels", "loadtest", "tests"}
SOURCES = ("common", "gateway", "scheduler", "engine", "kernels", "loadtest", "tests", "scripts")
# Third-party clients that CPU tests drive and import inside those tests only (never at
# module level), so collection on the GPU machine does not need them.
CPU_ONLY_CLIENTS = {"langchain-openai": "tests/gateway/test_agent_clients.py",
                    "litellm": "tests/gateway/test_agent_clients.py"}
# pytest plugins the suite needs that no module imports by name.
PLUGINS = {"pytest-asyncio": "asyncio_mode = auto (pyproject.toml), async tests",
           "pytest-aiohttp": "the aiohttp_server fixture (tests/loadtest/conftest.py)"}

# Blocked packages look absent, as on the image: imports of them fail, and a library's
# availability probe (importlib.util.find_spec, as accelerate's is_boto3_available) gets
# None instead of an exception.
_BLOCKER = '''import os, sys
from importlib.machinery import PathFinder
_BLOCKED = frozenset(os.environ["REHEARSAL_BLOCKED"].split(","))
_find_spec = PathFinder.find_spec
def _not_on_image(cls, fullname, path=None, target=None):
    if fullname.partition(".")[0] in _BLOCKED:
        return None
    return _find_spec(fullname, path, target)
PathFinder.find_spec = classmethod(_not_on_image)
'''


def load_kit_module():
    spec = importlib.util.spec_from_file_location("gpu_kit", REPO / "scripts" / "gpu_kit.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def allowed_distributions() -> set[str]:
    kit = load_kit_module()
    return kit.image_packages() | {canonicalize_name(n) for n in kit.KIT}


def third_party_imports() -> dict[str, set[str]]:
    """{top-level module: files importing it} over the product, tests and scripts."""
    # tests and scripts import their sibling modules by bare name (sys.path holds their dir)
    local = LOCAL | {p.stem for top in ("tests", "scripts") for p in (REPO / top).rglob("*.py")}
    found: dict[str, set[str]] = {}
    for top in SOURCES:
        for path in (REPO / top).rglob("*.py"):
            for name in _imported_modules(ast.parse(path.read_text())):
                root = name.partition(".")[0]
                if root not in sys.stdlib_module_names and root not in local:
                    found.setdefault(root, set()).add(str(path.relative_to(REPO)))
    return found


def _imported_modules(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.module


def blocked_modules() -> set[str]:
    """Top-level modules of this venv that come only from packages the GPU machine lacks."""
    allowed = allowed_distributions()
    return {module for module, dists in packages_distributions().items()
            if module not in LOCAL
            and not any(canonicalize_name(d) in allowed for d in dists)}


def env(tmp: Path, **extra: str) -> dict[str, str]:
    """Environment for a subprocess under the stand-in (cwd must be the repo root)."""
    block_dir = tmp / "image_env"
    block_dir.mkdir(exist_ok=True)
    (block_dir / "sitecustomize.py").write_text(_BLOCKER)
    out = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out.update(PYTHONPATH=f"{block_dir}{os.pathsep}{REPO}",
               REHEARSAL_BLOCKED=",".join(sorted(blocked_modules())), **extra)
    return out
