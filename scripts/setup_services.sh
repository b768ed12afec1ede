#!/usr/bin/env bash
# Services the tests start on free loopback ports: Debian's redis-server (the shared
# session store) and haproxy (the load balancer in front of replicas), and openssl, which
# makes the certificate for the balancer's TLS test. Idempotent: with all in place it
# does nothing.
set -euo pipefail

missing=()
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v haproxy >/dev/null 2>&1 || [ -x /usr/sbin/haproxy ] || missing+=(haproxy)
command -v openssl >/dev/null 2>&1 || missing+=(openssl)
[ ${#missing[@]} -eq 0 ] && exit 0

. "$(dirname "$0")/apt_install.sh"
apt_install setup_services "${missing[@]}"
# The packages' own daemons are not used (tests start their own): keep them stopped.
if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
    [ "$(id -u)" = 0 ] && sudo="" || sudo="sudo"
    $sudo systemctl disable --now redis-server haproxy >/dev/null 2>&1 || true
fi
