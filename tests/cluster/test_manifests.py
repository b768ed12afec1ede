"""The deploy/ files: Kubernetes manifests valid against the API schemas (offline, from
kubernetes-validate), their drain settings consistent, and HAProxy's config valid, with
the Kubernetes copy routing exactly as the tested file does."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import yaml

# Installed by scripts/setup.sh test (requirements-test.txt); not carried to the GPU machine
# (its 22 MB of schemas would crowd the 64 MiB that travels), where this file is skipped.
kubernetes_validate = pytest.importorskip("kubernetes_validate")

from gateway.config import GatewayConfig

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
K8S_VERSION = "1.32.0"  # the oldest Kubernetes the manifests claim (preStop `sleep` is GA)
DEFAULTS = GatewayConfig()
MANIFESTS = sorted(p for p in (DEPLOY / "k8s").glob("*.yaml") if p.name != "kustomization.yaml")


def _docs(path: Path) -> list[dict]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def _resource(kind: str, name: str) -> dict:
    for path in MANIFESTS:
        for doc in _docs(path):
            if doc["kind"] == kind and doc["metadata"]["name"] == name:
                return doc
    raise LookupError(f"{kind}/{name}")


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_manifest_is_valid(path):
    for doc in _docs(path):
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_kustomization_lists_every_manifest():
    listed = yaml.safe_load((DEPLOY / "k8s" / "kustomization.yaml").read_text())["resources"]
    assert sorted(listed) == sorted(p.name for p in MANIFESTS)


def _flag(args: list[str], name: str, default: float) -> float:
    return float(args[args.index(name) + 1]) if name in args else default


def test_replicas_probe_drain_and_store_secret():
    spec = _resource("Deployment", "tokenwire")["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert container["livenessProbe"]["httpGet"]["path"] == "/health"
    args = container["args"]
    drain = _flag(args, "--drain-timeout", DEFAULTS.drain_timeout_s)
    grace = _flag(args, "--drain-grace", DEFAULTS.drain_grace_s)
    pre_stop = container["lifecycle"]["preStop"]["sleep"]["seconds"]
    assert spec["terminationGracePeriodSeconds"] > pre_stop + drain + grace
    store = args[args.index("--session-store") + 1]
    (env,) = [e for e in container["env"] if f"$({e['name']})" == store]
    secret = env["valueFrom"]["secretKeyRef"]
    assert _resource("Secret", secret["name"])["stringData"][secret["key"]].startswith("redis://")


def _haproxy_check(path: Path, env: dict) -> None:
    result = subprocess.run(["haproxy", "-c", "-f", str(path)], env={**os.environ, **env},
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stdout + result.stderr


def _routing(text: str) -> list[str]:
    """The directives from `defaults` on, without comments and server lines."""
    lines = [line.split("#")[0].strip() for line in text.splitlines()]
    lines = [line for line in lines if line]
    start = lines.index("defaults")
    return [line for line in lines[start:] if not line.startswith(("server ", "server-template"))]


def test_haproxy_configs_are_valid_and_route_alike(tmp_path):
    shipped = DEPLOY / "haproxy" / "haproxy.cfg"
    _haproxy_check(shipped, {"TOKENWIRE_LB_BIND": "127.0.0.1:1",
                             **{f"TOKENWIRE_REPLICA_{i}": "127.0.0.1:2" for i in (1, 2, 3)}})
    k8s = tmp_path / "k8s.cfg"
    k8s.write_text(_resource("ConfigMap", "tokenwire-haproxy")["data"]["haproxy.cfg"])
    _haproxy_check(k8s, {"TOKENWIRE_LB_BIND": ":1",
                         "TOKENWIRE_REPLICAS_DNS": "tokenwire.default.svc.cluster.local:8000"})
    assert _routing(k8s.read_text()) == _routing(shipped.read_text())
