#!/usr/bin/env bash
# Browser-side test tools: Debian's chromium, and npm's wscat + playwright-core in .tools/.
# Idempotent and quick when everything is already there. Needs root (or sudo) for apt-get
# the first time; `npx playwright install` is not used because it downloads browsers.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v chromium >/dev/null 2>&1; then
    SUDO=""
    [ "$(id -u)" = 0 ] || SUDO="sudo"
    $SUDO apt-get update -q
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends chromium
fi
if [ ! -x .tools/node_modules/.bin/wscat ] || [ ! -d .tools/node_modules/playwright-core ]; then
    npm install --silent --no-audit --no-fund --prefix .tools wscat@6.1.0 playwright-core@1.65.1
fi
