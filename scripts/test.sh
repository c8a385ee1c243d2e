#!/usr/bin/env bash
# The project's test command: installs pinned test dependencies, then runs every test
# (unit, property, integration against the real binaries, live pipeline tests).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/test-deps.sh
# Integration tests run the fixture programs in examples/; `--all-targets` builds examples as
# test harnesses, not as the runnable programs the tests spawn.
cargo build --examples
cargo test --all-targets "$@"
