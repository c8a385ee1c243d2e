#!/usr/bin/env bash
# Installs the pinned non-Rust packages the interoperability tests run against:
# the official MCP TypeScript SDK and server-everything (tests/node/package-lock.json).
# Idempotent; needs only node/npm and the npm registry.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v npm >/dev/null 2>&1; then
  echo "npm is required for the interoperability tests (apt-get install nodejs npm)" >&2
  exit 1
fi
npm ci --prefix tests/node --no-audit --no-fund --loglevel=error
