#!/usr/bin/env bash
# Installs what scripts/package.sh and scripts/test-package.sh need beyond the Rust toolchain:
# the pinned packaging tools (scripts/package-requirements.txt: maturin, uv) in a virtualenv at
# target/package-tools, and, for the Linux aarch64 packages, the Rust target
# aarch64-unknown-linux-gnu (rustup), Debian's cross linker gcc-aarch64-linux-gnu and qemu-user
# (the test runs the aarch64 binary under it). Idempotent and quick once installed. The aarch64
# part is best effort: where it cannot be installed, package.sh says so and builds x86_64 only.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v python3 >/dev/null 2>&1; then
  echo "python3 is required to build the wheel (apt-get install python3 python3-venv)" >&2
  exit 1
fi
venv=target/package-tools
reqs=scripts/package-requirements.txt
stamp="$venv/.requirements.sha256"
want=$(sha256sum "$reqs" | cut -d' ' -f1)
if ! [ -x "$venv/bin/maturin" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  python3 -m venv --clear "$venv"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-input -r "$reqs"
  echo "$want" >"$stamp"
fi

# aarch64: the Rust standard library for the target, a linker and C compiler for it (ring and
# the bundled SQLite compile C), and an emulator to run what was built.
if command -v rustup >/dev/null 2>&1 \
  && ! rustup target list --installed 2>/dev/null | grep -qx aarch64-unknown-linux-gnu; then
  rustup target add aarch64-unknown-linux-gnu >&2 \
    || echo "package-deps: cannot add the Rust target aarch64-unknown-linux-gnu; aarch64 packages will not be built" >&2
fi
missing=()
command -v aarch64-linux-gnu-gcc >/dev/null 2>&1 || missing+=(gcc-aarch64-linux-gnu)
command -v qemu-aarch64 >/dev/null 2>&1 || missing+=(qemu-user)
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"; } >&2 \
      || echo "package-deps: cannot install ${missing[*]}; aarch64 packages will not be built or run" >&2
  else
    echo "package-deps: ${missing[*]} missing (apt-get install ${missing[*]}); aarch64 packages will not be built or run" >&2
  fi
fi
