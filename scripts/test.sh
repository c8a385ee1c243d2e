#!/usr/bin/env bash
# The project's test command: installs pinned test dependencies, then runs every test
# (unit, property, integration against the real binaries, live pipeline tests, benchmark smoke
# runs) and ends with one line totalling what ran.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/test-deps.sh
# Integration tests spawn the fixture programs in examples/; cargo test builds examples only as
# test harnesses, not as the runnable programs the tests start.
cargo build --examples
log=$(mktemp)
trap 'rm -f "$log"' EXIT
# Library, binaries, tests/ and live-tests/, and the benchmarks (which do a short smoke run
# when cargo test starts them). Examples have no tests of their own.
status=0
cargo test --lib --bins --tests --benches "$@" 2>&1 | tee "$log" || status=$?
cargo test --doc "$@" 2>&1 | tee -a "$log" || status=$?
awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($(i) ~ /^passed;?$/) p += $(i-1); if ($(i) ~ /^failed;?$/) f += $(i-1) } }
     END { printf "summary: %d passed, %d failed\n", p, f; if (p == 0) exit 1 }' "$log" || status=1
exit "$status"
