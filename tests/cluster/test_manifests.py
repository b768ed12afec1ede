"""The deploy/ files: Kubernetes manifests valid against the API schemas (offline, from
kubernetes-validate), their drain settings consistent, every container locked down,
Redis behind AUTH and a memory cap, network policies that admit only who must connect,
no secret outside the Secret template, images pinned; and HAProxy's config valid, plain
and with TLS, with the Kubernetes copy routing exactly as the tested file does."""
from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
import yaml

# Installed by scripts/setup.sh test (requirements-test.txt); not carried to the GPU machine
# (its 22 MB of schemas would crowd the 64 MiB that travels), where this file is skipped.
kubernetes_validate = pytest.importorskip("kubernetes_validate")

from gateway.config import GatewayConfig
from loadtest.haproxy_process import render_config

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
K8S_VERSION = "1.32.0"  # the oldest Kubernetes the manifests claim (preStop `sleep` is GA)
DEFAULTS = GatewayConfig()
SECRET_TEMPLATE = DEPLOY / "k8s" / "secrets-template.yaml"
MANIFESTS = sorted(p for p in (DEPLOY / "k8s").glob("*.yaml") if p.name != "kustomization.yaml")
APPLIED = [p for p in MANIFESTS if p != SECRET_TEMPLATE]
BUILT_HERE = "tokenwire:"  # the image deploy/Dockerfile builds; pinned where it is pushed
DIGEST = re.compile(r"^[^@\s]+@sha256:[0-9a-f]{64}$")
SECRET_ARGS = ("--requirepass", "--api-key", "--masterauth")
SECRET_ENV = re.compile(r"(^|_)(API_KEYS?|KEY|PASSWORD|SECRET|TOKEN|AUTH)(_|$)")
REFERENCE = re.compile(r"^\$\([A-Z_]+\)$")  # $(VAR): Kubernetes fills it in from env


def _docs(path: Path) -> list[dict]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def _resource(kind: str, name: str) -> dict:
    for path in MANIFESTS:
        for doc in _docs(path):
            if doc["kind"] == kind and doc["metadata"]["name"] == name:
                return doc
    raise LookupError(f"{kind}/{name}")


def _pod_specs() -> dict[str, dict]:
    return {doc["metadata"]["name"]: doc["spec"]["template"]["spec"]
            for path in APPLIED for doc in _docs(path) if doc["kind"] == "Deployment"}


def _env(container: dict) -> dict[str, dict]:
    return {e["name"]: e for e in container.get("env", ())}


def _secret_ref(container: dict, value: str) -> tuple[str, str]:
    """The (Secret, key) a "$(VAR)" argument comes from."""
    ref = _env(container)[value.removeprefix("$(").removesuffix(")")]
    ref = ref["valueFrom"]["secretKeyRef"]
    return ref["name"], ref["key"]


def _flag(args: list[str], name: str, default=None):
    return args[args.index(name) + 1] if name in args else default


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_manifest_is_valid(path):
    for doc in _docs(path):
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_kustomization_lists_every_manifest_but_the_secret_template():
    listed = yaml.safe_load((DEPLOY / "k8s" / "kustomization.yaml").read_text())["resources"]
    assert sorted(listed) == sorted(p.name for p in APPLIED)


def test_replicas_probe_drain_and_secrets():
    spec = _pod_specs()["tokenwire"]
    (container,) = spec["containers"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert container["livenessProbe"]["httpGet"]["path"] == "/health"
    args = container["args"]
    drain = float(_flag(args, "--drain-timeout", DEFAULTS.drain_timeout_s))
    grace = float(_flag(args, "--drain-grace", DEFAULTS.drain_grace_s))
    pre_stop = container["lifecycle"]["preStop"]["sleep"]["seconds"]
    assert spec["terminationGracePeriodSeconds"] > pre_stop + drain + grace
    # The API keys: a file from the Secret's volume.
    key_file = Path(_flag(args, "--api-key-file"))
    (mount,) = [m for m in container["volumeMounts"] if key_file.parent == Path(m["mountPath"])]
    (volume,) = [v for v in spec["volumes"] if v["name"] == mount["name"]]
    assert {"key": "api-keys", "path": key_file.name} in volume["secret"]["items"]
    assert "api-keys" in _resource("Secret", volume["secret"]["secretName"])["stringData"]
    # The store: Redis AUTH with the password Redis itself requires.
    store = _env(container)[_flag(args, "--session-store").strip("$()")]["value"]
    host = _resource("Service", "tokenwire-redis")["metadata"]["name"]
    match = re.fullmatch(rf"redis://:(\$\(\w+\))@{host}:6379/0", store)
    assert match, store
    (redis,) = _pod_specs()["tokenwire-redis"]["containers"]
    assert (_secret_ref(container, match[1])
            == _secret_ref(redis, _flag(redis["args"], "--requirepass")))


def _mebibytes(quantity: str) -> float:
    units = {"mb": 1e6 / 2**20, "gb": 1e9 / 2**20, "mi": 1, "gi": 1024}
    number, unit = re.fullmatch(r"(\d+)([a-z]+)", quantity.lower()).groups()
    return int(number) * units[unit]


def test_redis_refuses_writes_when_full_rather_than_dying():
    (redis,) = _pod_specs()["tokenwire-redis"]["containers"]
    args = redis["args"]
    assert _flag(args, "--maxmemory-policy") == "noeviction"
    limit = _mebibytes(redis["resources"]["limits"]["memory"])
    assert 0 < _mebibytes(_flag(args, "--maxmemory")) <= 0.8 * limit  # room for overhead
    assert REFERENCE.match(_flag(args, "--requirepass"))


@pytest.mark.parametrize("name", ["tokenwire", "tokenwire-haproxy", "tokenwire-redis"])
def test_containers_are_locked_down(name):
    spec = _pod_specs()[name]
    pod = spec["securityContext"]
    assert pod["seccompProfile"] == {"type": "RuntimeDefault"}
    assert spec["automountServiceAccountToken"] is False
    for container in spec.get("initContainers", []) + spec["containers"]:
        ctx = {**pod, **container.get("securityContext", {})}
        assert ctx["runAsNonRoot"] is True and isinstance(ctx["runAsUser"], int), name
        assert ctx["runAsUser"] > 0
        assert ctx["readOnlyRootFilesystem"] is True
        assert ctx["allowPrivilegeEscalation"] is False
        assert ctx["capabilities"] == {"drop": ["ALL"]}


def test_writable_directories_are_empty_dirs():
    """What each process writes, on a read-only root: tokenwire's $HOME (state, the CPU
    kernels' build cache) and /tmp, Redis's working directory."""
    expected = {"tokenwire": {"/var/lib/tokenwire", "/tmp"}, "tokenwire-redis": {"/data"}}
    for name, paths in expected.items():
        spec = _pod_specs()[name]
        empty = {v["name"] for v in spec["volumes"] if "emptyDir" in v}
        (container,) = spec["containers"]
        mounted = {m["mountPath"] for m in container["volumeMounts"] if m["name"] in empty}
        assert mounted == paths, name
    home = re.search(r"HOME=(\S+)", (DEPLOY / "Dockerfile").read_text())[1]
    assert home in expected["tokenwire"]


def _ingress_peers(policy: dict) -> list[tuple[dict, list]]:
    return [(peer, rule["ports"]) for rule in policy["spec"]["ingress"]
            for peer in rule["from"]]


def test_network_policies_admit_only_who_must_connect():
    labels = {name: spec_labels for name, spec_labels in (
        (doc["metadata"]["name"], doc["spec"]["template"]["metadata"]["labels"])
        for path in APPLIED for doc in _docs(path) if doc["kind"] == "Deployment")}
    redis = _resource("NetworkPolicy", "tokenwire-redis")["spec"]
    assert redis["podSelector"]["matchLabels"] == labels["tokenwire-redis"]
    assert redis["policyTypes"] == ["Ingress"]
    assert _ingress_peers(_resource("NetworkPolicy", "tokenwire-redis")) == [
        ({"podSelector": {"matchLabels": labels["tokenwire"]}},
         [{"protocol": "TCP", "port": 6379}])]
    replicas = _resource("NetworkPolicy", "tokenwire")
    assert replicas["spec"]["podSelector"]["matchLabels"] == labels["tokenwire"]
    assert replicas["spec"]["policyTypes"] == ["Ingress"]
    peers = _ingress_peers(replicas)
    assert peers[0] == ({"podSelector": {"matchLabels": labels["tokenwire-haproxy"]}},
                        [{"protocol": "TCP", "port": 8000}])
    for peer, ports in peers[1:]:  # the metrics scraper: one namespace's named pods only
        assert set(peer) == {"namespaceSelector", "podSelector"}, peer
        assert ports == [{"protocol": "TCP", "port": 9100}]  # --metrics-port alone


def test_only_haproxy_is_public():
    exposed = [doc for path in APPLIED for doc in _docs(path) if doc["kind"] == "Service"
               and doc["spec"].get("type") in ("LoadBalancer", "NodePort")]
    assert [svc["spec"]["selector"] for svc in exposed] == [
        {"app.kubernetes.io/name": "tokenwire-haproxy"}]
    assert _resource("Service", "tokenwire")["spec"]["clusterIP"] == "None"


def _strings(node):
    if isinstance(node, dict):
        for value in node.values():
            yield from _strings(value)
    elif isinstance(node, list):
        yield from (s for item in node for s in _strings(item))
    elif isinstance(node, str):
        yield node


def test_no_secret_outside_the_secret_template():
    template_values = [v.strip() for doc in _docs(SECRET_TEMPLATE)
                       for v in doc["stringData"].values()]
    for path in APPLIED + [DEPLOY / "Dockerfile", DEPLOY / "haproxy" / "haproxy.cfg"]:
        text = path.read_text()
        assert not any(v in text for v in template_values), path
        assert "kind: Secret" not in text, path
    for spec in _pod_specs().values():
        for container in spec["containers"]:
            for name, env in _env(container).items():
                assert not (SECRET_ENV.search(name) and "value" in env), name
            args = container.get("args", [])
            for flag in SECRET_ARGS:
                assert _flag(args, flag) is None or REFERENCE.match(_flag(args, flag))
            for text in _strings(container):
                for password in re.findall(r"redis://[^:@/]*:([^@]*)@", text):
                    assert REFERENCE.match(password), text


def test_images_are_pinned_by_digest():
    for spec in _pod_specs().values():
        for container in spec.get("initContainers", []) + spec["containers"]:
            image = container["image"]
            assert image.startswith(BUILT_HERE) or DIGEST.match(image), image
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    base = re.search(r"^ARG BASE=(\S+)$", dockerfile, re.M)[1]
    assert DIGEST.match(base) and re.search(r"^FROM \$\{BASE\}$", dockerfile, re.M)


def _haproxy_check(path: Path, env: dict, ok: bool = True) -> None:
    result = subprocess.run(["haproxy", "-c", "-f", str(path)], env={**os.environ, **env},
                            capture_output=True, text=True, timeout=30)
    assert (result.returncode == 0) == ok, result.stdout + result.stderr


def _routing(text: str) -> list[str]:
    """The directives from `defaults` on, without comments and server lines."""
    lines = [line.split("#")[0].strip() for line in text.splitlines()]
    lines = [line for line in lines if line]
    start = lines.index("defaults")
    return [line for line in lines[start:] if not line.startswith(("server ", "server-template"))]


def test_haproxy_configs_are_valid_and_route_alike(tmp_path, tls_pem):
    shipped = DEPLOY / "haproxy" / "haproxy.cfg"
    _haproxy_check(shipped, {"TOKENWIRE_LB_BIND": "127.0.0.1:1"})
    rendered = tmp_path / "rendered.cfg"
    rendered.write_text(render_config(["127.0.0.1:2", "127.0.0.1:3"], tmp_path / "admin.sock"))
    _haproxy_check(rendered, {"TOKENWIRE_LB_BIND": "127.0.0.1:1"})
    _haproxy_check(rendered, {"TOKENWIRE_LB_BIND": "127.0.0.1:1",
                              "TOKENWIRE_TLS_CERT": str(tls_pem[0])})
    _haproxy_check(rendered, {"TOKENWIRE_LB_BIND": "127.0.0.1:1",  # the variable is read
                              "TOKENWIRE_TLS_CERT": str(tmp_path / "absent.pem")}, ok=False)
    k8s = tmp_path / "k8s.cfg"
    k8s.write_text(_resource("ConfigMap", "tokenwire-haproxy")["data"]["haproxy.cfg"])
    _haproxy_check(k8s, {"TOKENWIRE_LB_BIND": ":1",
                         "TOKENWIRE_REPLICAS_DNS": "tokenwire.default.svc.cluster.local:8000"})
    assert _routing(k8s.read_text()) == _routing(shipped.read_text())
