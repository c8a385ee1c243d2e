#!/usr/bin/env bash
# Installs the pinned non-Rust packages the interoperability tests and the HTTP benchmark run
# against: the official MCP TypeScript SDK and server-everything (tests/node/package-lock.json),
# and the official MCP Python SDK in a virtualenv (tests/python/requirements.txt →
# tests/python/.venv), and headless Chromium with its WebDriver (Debian's `chromium` and
# `chromium-driver`) for the live view's browser test (tests/web_browser.rs), and Debian's
# `postgresql` (its server binaries under /usr/lib/postgresql/<major>/bin) for the tests that run
# the ingest over a real PostgreSQL cluster (tests/pg_support). Idempotent and
# quick once installed; needs node/npm, python3 (with the venv module), the npm and PyPI
# registries, and apt-get (as root, or through sudo) the first time.
set -euo pipefail
cd "$(dirname "$0")/.."

apt_missing=()
if ! command -v chromium >/dev/null 2>&1 || ! command -v chromedriver >/dev/null 2>&1; then
  apt_missing+=(chromium chromium-driver)
fi
# The tests start their own cluster with initdb and pg_ctl, which Debian keeps off PATH.
if ! compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null; then
  apt_missing+=(postgresql)
fi
if [ "${#apt_missing[@]}" -gt 0 ]; then
  as_root=()
  if [ "$(id -u)" -ne 0 ]; then
    as_root=(sudo)
  fi
  "${as_root[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${as_root[@]}" apt-get install -y -qq --no-install-recommends \
    "${apt_missing[@]}" >/dev/null
fi
if ! command -v npm >/dev/null 2>&1; then
  echo "npm is required for the interoperability tests (apt-get install nodejs npm)" >&2
  exit 1
fi
npm ci --prefix tests/node --no-audit --no-fund --loglevel=error

if ! command -v python3 >/dev/null 2>&1; then
  echo "python3 is required for the Python SDK interoperability test (apt-get install python3 python3-venv)" >&2
  exit 1
fi
venv=tests/python/.venv
reqs=tests/python/requirements.txt
# The venv records the requirements it was built from; the same file again means nothing to do.
stamp="$venv/.requirements.sha256"
want=$(sha256sum "$reqs" | cut -d' ' -f1)
if [ -x "$venv/bin/python" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then
  exit 0
fi
# From nothing each time the pins change: a venv never carries packages of an older set.
python3 -m venv --clear "$venv"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-input -r "$reqs"
"$venv/bin/python" -m pip check --disable-pip-version-check >/dev/null
echo "$want" >"$stamp"
