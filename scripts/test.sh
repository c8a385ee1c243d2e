#!/usr/bin/env bash
# The project's test command: installs pinned test dependencies, then runs every test
# (unit, property, integration against the real binaries, live pipeline tests).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/test-deps.sh
cargo test --all-targets "$@"
