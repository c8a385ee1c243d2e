#!/usr/bin/env bash
# Full stdio benchmark at low priority (so a shared machine stays usable); the report is also
# saved to bench/out/stdio.txt. Extra arguments go to the harness, e.g. `bash bench/run.sh --quick`.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p bench/out
nice -n 10 cargo bench --bench stdio -- "$@" | tee bench/out/stdio.txt
