#!/usr/bin/env bash
# Services the tests start on free loopback ports: Debian's redis-server (the shared
# session store) and haproxy (the load balancer in front of replicas). Idempotent: with
# both in place it does nothing.
set -euo pipefail

missing=()
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v haproxy >/dev/null 2>&1 || [ -x /usr/sbin/haproxy ] || missing+=(haproxy)
[ ${#missing[@]} -eq 0 ] && exit 0

sudo=""
if [ "$(id -u)" != 0 ]; then
    command -v sudo >/dev/null 2>&1 || {
        echo "setup_services: need root or sudo to apt-get install ${missing[*]}" >&2; exit 1; }
    sudo="sudo"
fi
command -v apt-get >/dev/null 2>&1 || {
    echo "setup_services: no apt-get; install ${missing[*]} by hand" >&2; exit 1; }
$sudo apt-get update -q
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
# The packages' own daemons are not used (tests start their own): keep them stopped.
if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
    $sudo systemctl disable --now redis-server haproxy >/dev/null 2>&1 || true
fi
