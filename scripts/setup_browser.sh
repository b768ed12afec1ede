#!/usr/bin/env bash
# Third-party clients for the gateway tests: Debian's chromium (and node and openssl, if
# missing) from apt, then wscat, playwright-core and the openai npm package's realtime
# client (openai + ws) from tests/gateway/js/package-lock.json into tests/gateway/js/node_modules.
# Idempotent: a second run with everything in place does nothing. Playwright's own browser download is never used; it drives /usr/bin/chromium.
set -euo pipefail
cd "$(dirname "$0")/.."

. scripts/apt_install.sh

missing=()
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
command -v npm >/dev/null 2>&1 || missing+=(nodejs npm)
command -v openssl >/dev/null 2>&1 || missing+=(openssl)  # the realtime node test's TLS cert
[ ${#missing[@]} -eq 0 ] || apt_install setup_browser "${missing[@]}"

# npm ci wipes and reinstalls, so run it only when the lockfile is newer than the install.
stamp=tests/gateway/js/node_modules/.package-lock.json
if [ ! -f "$stamp" ] || [ tests/gateway/js/package-lock.json -nt "$stamp" ]; then
    npm ci --prefix tests/gateway/js --no-audit --no-fund --loglevel=error
fi
