#!/usr/bin/env bash
# SIMDe's headers (Debian's libsimde-dev) for the kernel tests that emulate AVX-512 in
# portable C on CPUs without it (tests/kernels/emulated_avx512.py). Idempotent: with the
# headers in place it does nothing.
set -euo pipefail

[ -f /usr/include/simde/x86/avx512.h ] && exit 0
. "$(dirname "$0")/apt_install.sh"
apt_install setup_simde libsimde-dev
