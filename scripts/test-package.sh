#!/usr/bin/env bash
# Installs what scripts/package.sh left in dist/ the way users will, and runs it: nothing is
# published and nothing is fetched for the packages themselves (npm and uv run offline; pip and
# cargo read the local artifacts).
#
#   crate  dist/crate/*.crate unpacked, `cargo install --path` from it into a temporary root
#          (both binaries); its bounded-ingest is the ingest the sessions below report to
#   npm    the main tarball installed offline into a temporary prefix, npm choosing this
#          machine's platform package among the built tarballs; `npx bounded-observe-mcp
#          --version`, `npx bounded-observe-mcp demo`, the README's npx snippet as a wrapped
#          session, and SIGTERM through the launcher
#   wheel  a fresh virtualenv with the wheel, its entry point for --version and the README's
#          absolute-path snippet; `uvx` (pinned uv, offline, the wheel as its only source) for
#          --version and the README's uvx snippet
#   arm64  where dist/ has the aarch64 packages and qemu-aarch64 is installed: npm's choice for
#          an arm64 machine (--cpu=arm64) and the wheel, --version and a wrapped session under
#          emulation
#
# Every session is scripts/package-session.py reading its snippet from README.md. Everything
# made outside dist/ and the target directory lives in one temporary directory, removed on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
if ! [ -d dist/npm ] || ! [ -d dist/wheels ] || ! [ -d dist/crate ]; then
  echo "test-package.sh: no dist/; run scripts/package.sh first" >&2
  exit 1
fi
bash scripts/package-deps.sh
tools=$root/target/package-tools/bin

meta=$(cargo metadata --no-deps --format-version 1 --locked)
version=$(python3 -c 'import json,sys; print(next(p["version"] for p in json.load(sys.stdin)["packages"] if p["name"] == "bounded-observe-mcp"))' <<<"$meta")
target_dir=$(python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])' <<<"$meta")
# cargo install below reuses the release dependencies package.sh built, instead of its own
# temporary target directory.
export CARGO_TARGET_DIR=$target_dir
want="bounded-observe-mcp $version"

tmp=$(mktemp -d)
ingest_pid=
cleanup() {
  [ -z "$ingest_pid" ] || { kill -TERM "$ingest_pid" 2>/dev/null && wait "$ingest_pid" 2>/dev/null; } || true
  rm -rf "$tmp"
}
trap cleanup EXIT

passed=0
pass() {
  passed=$((passed + 1))
  echo "ok: $*"
}
fail() {
  echo "test-package.sh: FAILED: $*" >&2
  echo "packages: $passed passed, 1 failed"
  exit 1
}
expect_version() { # what, then the command
  local what=$1 got
  shift
  got=$("$@" 2>"$tmp/stderr") || fail "$what: $* exited $? ($(cat "$tmp/stderr"))"
  [ "$got" = "$want" ] || fail "$what: $* printed '$got', expected '$want'"
  pass "$what: $* → $got"
}

echo "== wrapped server: the payments fixture"
# All examples, as scripts/test.sh builds them: the same dependency features, so after the tests
# nothing is rebuilt.
cargo build --quiet --examples
server=$(printf '["%s"]' "$target_dir/debug/examples/payments_server")

echo "== crate: cargo install --path from dist/crate"
crates=(dist/crate/bounded-observe-mcp-"$version".crate)
[ -f "${crates[0]}" ] || fail "no dist/crate/bounded-observe-mcp-$version.crate"
mkdir "$tmp/crate"
tar -xzf "${crates[0]}" -C "$tmp/crate"
src="$tmp/crate/bounded-observe-mcp-$version"
for f in LICENSE README.md Cargo.lock Cargo.toml schema/event.v2.schema.json; do
  [ -f "$src/$f" ] || fail "the crate has no $f"
done
# crates.io takes no path-only (or git) dependency; cargo package refuses them too, and this
# says so should that ever change.
python3 - "$src/Cargo.toml" <<'EOF' || fail "the crate's manifest has a path or git dependency"
import sys, tomllib
m = tomllib.load(open(sys.argv[1], "rb"))
tables = [m.get(k, {}) for k in ("dependencies", "dev-dependencies", "build-dependencies")]
tables += [t.get(k, {}) for t in m.get("target", {}).values() for k in ("dependencies", "build-dependencies")]
bad = [n for t in tables for n, d in t.items() if isinstance(d, dict) and ("path" in d or "git" in d)]
sys.exit(f"path/git dependencies: {bad}" if bad else 0)
EOF
pass "crate: holds LICENSE, README.md, Cargo.lock and the schemas; no path or git dependency"
cargo install --quiet --locked --path "$src" --root "$tmp/cargo" \
  || fail "cargo install --path from the packaged crate"
expect_version "crate" "$tmp/cargo/bin/bounded-observe-mcp" --version
[ -x "$tmp/cargo/bin/bounded-ingest" ] || fail "cargo install did not install bounded-ingest"
# The install shared the repository's release build directory, build-script output included,
# which cargo reuses for the repository's own next build. Its link arguments must name no file in
# the unpacked crate, deleted at exit (build.rs says why).
outputs=("$CARGO_TARGET_DIR"/release/build/bounded-observe-mcp-*/output)
[ -f "${outputs[0]}" ] || fail "no build-script output under $CARGO_TARGET_DIR/release/build"
while IFS= read -r arg; do
  [[ $arg != /* || ($arg != "$tmp"/* && -f $arg) ]] \
    || fail "the build script links a file that will not outlive this test: $arg"
done < <(sed -n 's/^cargo:rustc-link-arg-bin=bounded-observe-mcp=//p' "${outputs[@]}")
pass "crate: its build-script output names no file in the unpacked source"

echo "== reference ingest (from the installed crate) on loopback"
export BOUNDED_INGEST_ADMIN_SECRET="package-test-admin-$RANDOM$RANDOM$RANDOM"
"$tmp/cargo/bin/bounded-ingest" serve --listen 127.0.0.1:0 --db "$tmp/ingest.db" 2>"$tmp/ingest.log" &
ingest_pid=$!
ingest=
for _ in $(seq 100); do
  ingest=$(sed -n 's/.*listening \(http:\/\/127\.0\.0\.1:[0-9]*\).*/\1/p' "$tmp/ingest.log" | head -1)
  [ -n "$ingest" ] && break
  kill -0 "$ingest_pid" 2>/dev/null || fail "bounded-ingest exited: $(cat "$tmp/ingest.log")"
  sleep 0.1
done
[ -n "$ingest" ] || fail "bounded-ingest did not say where it listens: $(cat "$tmp/ingest.log")"
org=package-test
# One key per session, so that each session's event is told apart by its actor (mcp:<keyId>).
mint() { "$tmp/cargo/bin/bounded-ingest" mint --org "$org" --ingest "$ingest" 2>/dev/null; }
session() { # snippet name, then package-session.py options
  local snippet=$1 token
  shift
  token=$(mint) || fail "bounded-ingest mint"
  python3 scripts/package-session.py --readme README.md --snippet "$snippet" --server "$server" \
    --ingest "$ingest" --token "$token" --org "$org" "$@" || fail "session with the $snippet snippet"
  passed=$((passed + 1))
}
session absolute-path --binary "$tmp/cargo/bin/bounded-observe-mcp"

echo "== npm: the tarballs installed offline into a temporary prefix"
case "$(node -p 'process.platform + "-" + process.arch')" in
  linux-x64) platform=linux-x64-gnu ;;
  linux-arm64) platform=linux-arm64-gnu ;;
  *) fail "no platform package is built for this machine" ;;
esac
main_tgz=$root/dist/npm/bounded-observe-mcp-$version.tgz
[ -f "$main_tgz" ] || fail "no $main_tgz"
tar -xzOf "$main_tgz" package/package.json >"$tmp/npm-main.json"
python3 - "$tmp/npm-main.json" <<'EOF' || fail "the npm main package has an install script"
import json, sys
p = json.load(open(sys.argv[1]))
bad = set(p.get("scripts", {})) & {"preinstall", "install", "postinstall", "prepare"}
sys.exit(f"install scripts: {sorted(bad)}" if bad else 0)
EOF
# Offline, with a cache of its own: nothing is fetched and the user's cache is not touched.
export npm_config_cache="$tmp/npm-cache" npm_config_offline=true npm_config_update_notifier=false \
  npm_config_audit=false npm_config_fund=false
# Only the main package is asked for, as `npx -y bounded-observe-mcp` does: npm resolves its
# optionalDependencies and installs the one whose os/cpu/libc match. Overrides stand in for the
# registry: each platform package built is found as its tarball in dist/npm; the others are not
# found offline, and are skipped as optional. $1: the prefix, then npm options.
npm_install() {
  local prefix=$1
  shift
  mkdir "$prefix"
  python3 - "$root/dist/npm" "$main_tgz" "$tmp/npm-main.json" >"$prefix/package.json" <<'EOF'
import json, pathlib, sys
dist, main, manifest = pathlib.Path(sys.argv[1]), sys.argv[2], sys.argv[3]
listed = json.load(open(manifest))["optionalDependencies"]
overrides = {}
for name, version in listed.items():
    tgz = dist / f"{name.lstrip('@').replace('/', '-')}-{version}.tgz"
    if tgz.exists():
        overrides[name] = f"file:{tgz}"
json.dump({"private": True, "dependencies": {"bounded-observe-mcp": f"file:{main}"},
           "overrides": overrides}, sys.stdout, indent=2)
EOF
  (cd "$prefix" && npm install --silent "$@") || fail "npm install in $prefix"
}
npm_install "$tmp/npm"
installed=$(ls "$tmp/npm/node_modules/@bounded")
[ "$installed" = "observe-mcp-$platform" ] \
  || fail "npm installed the platform packages '$installed', expected observe-mcp-$platform"
pass "npm: installed offline, no install script, npm picked @bounded/observe-mcp-$platform"
(cd "$tmp/npm" && expect_version "npm" npx bounded-observe-mcp --version)
passed=$((passed + 1))
(cd "$tmp/npm" && npx bounded-observe-mcp demo >"$tmp/demo.out" 2>&1) \
  || fail "npx bounded-observe-mcp demo: $(tail -20 "$tmp/demo.out")"
pass "npm: npx bounded-observe-mcp demo exits 0"
session npx --cwd "$tmp/npm"

# The launcher between the client and the binary: once the session is up (an answer to
# initialize), a SIGTERM sent to the launcher must reach the binary, which forwards it to the
# server and exits 128+15, and the launcher must exit with that code. Had the launcher not passed
# it on, it would die of the signal itself (-15 below) and leave the binary running.
python3 - "$tmp/npm/node_modules/.bin/bounded-observe-mcp" "$target_dir/debug/examples/payments_server" <<'EOF' \
  || fail "npm launcher: SIGTERM"
import json, signal, subprocess, sys
launcher, server = sys.argv[1], sys.argv[2]
signal.alarm(60)  # a hung session fails the test instead of the run
p = subprocess.Popen([launcher, "--", server], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                     stderr=subprocess.DEVNULL)  # the no-token warning, expected here
try:
    p.stdin.write(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "package-test", "version": "1"}}}).encode() + b"\n")
    p.stdin.flush()
    line = p.stdout.readline()
    if not line or json.loads(line).get("id") != 1:
        sys.exit(f"no answer to initialize: {line[:200]!r}")
    p.send_signal(signal.SIGTERM)
    code = p.wait(30)
    sys.exit(0 if code == 143 else f"launcher exit status {code}, expected 143")
finally:
    if p.poll() is None:
        p.kill()
EOF
pass "npm: the launcher passes SIGTERM on and exits 143 as the binary did"

echo "== wheel: a fresh virtualenv"
wheels=(dist/wheels/bounded_observe_mcp-"$version"-py3-none-manylinux_*_"$(uname -m)".whl)
[ -f "${wheels[0]}" ] || fail "no wheel for $(uname -m) in dist/wheels"
python3 -m venv "$tmp/venv"
"$tmp/venv/bin/pip" install --quiet --disable-pip-version-check --no-cache-dir --no-index "$root/${wheels[0]}" \
  || fail "pip install of the wheel"
expect_version "wheel" "$tmp/venv/bin/bounded-observe-mcp" --version
cmp -s "$tmp/venv/bin/bounded-observe-mcp" "$tmp/npm/node_modules/@bounded/observe-mcp-$platform/bin/bounded-observe-mcp" \
  || fail "the wheel's binary and the npm package's differ"
pass "wheel: the same binary as the npm package, byte for byte"
session absolute-path --binary "$tmp/venv/bin/bounded-observe-mcp"

echo "== wheel: uvx, offline, the wheel as its only source"
export UV_OFFLINE=1 UV_NO_INDEX=1 UV_FIND_LINKS="$root/dist/wheels" UV_NO_CONFIG=1 \
  UV_PYTHON_DOWNLOADS=never UV_CACHE_DIR="$tmp/uv-cache" UV_TOOL_DIR="$tmp/uv-tools" \
  UV_TOOL_BIN_DIR="$tmp/uv-bin"
export PATH="$tools:$PATH"
expect_version "uvx" uvx bounded-observe-mcp --version
session uvx

echo "== aarch64"
arm_tgz=$root/dist/npm/bounded-observe-mcp-linux-arm64-gnu-$version.tgz
arm_wheels=(dist/wheels/bounded_observe_mcp-"$version"-py3-none-manylinux_*_aarch64.whl)
if [ "$platform" = linux-arm64-gnu ]; then
  echo "(this machine is aarch64: tested natively above)"
elif ! [ -f "$arm_tgz" ] || ! [ -f "${arm_wheels[0]}" ]; then
  echo "test-package.sh: not tested: aarch64 (package.sh did not build it)" >&2
elif ! command -v qemu-aarch64 >/dev/null 2>&1 || ! [ -d /usr/aarch64-linux-gnu ]; then
  echo "test-package.sh: not tested: aarch64 (no qemu-aarch64 or aarch64 libc: apt-get install qemu-user gcc-aarch64-linux-gnu)" >&2
else
  emu='["qemu-aarch64", "-L", "/usr/aarch64-linux-gnu"]'
  # npm picks the platform package by cpu: --cpu=arm64 makes the pick an arm64 machine makes.
  npm_install "$tmp/npm-arm64" --cpu=arm64
  installed=$(ls "$tmp/npm-arm64/node_modules/@bounded")
  [ "$installed" = observe-mcp-linux-arm64-gnu ] \
    || fail "npm --cpu=arm64 installed the platform packages '$installed'"
  arm_bin=$tmp/npm-arm64/node_modules/@bounded/observe-mcp-linux-arm64-gnu/bin/bounded-observe-mcp
  expect_version "npm arm64" qemu-aarch64 -L /usr/aarch64-linux-gnu "$arm_bin" --version
  session absolute-path --binary "$arm_bin" --emulator "$emu"
  # The server is started with clone(CLONE_VM | CLONE_VFORK), which qemu runs as a plain fork:
  # a command that cannot start must still give the shell's exit code and its message.
  code=0
  qemu-aarch64 -L /usr/aarch64-linux-gnu "$arm_bin" --ingest "file:$tmp/arm-none.jsonl" \
    -- "$tmp/no-such-server" </dev/null >/dev/null 2>"$tmp/stderr" || code=$?
  [ "$code" = 127 ] && grep -q "command not found" "$tmp/stderr" \
    || fail "arm64: a missing server exited $code ($(cat "$tmp/stderr"))"
  pass "arm64: a missing server exits 127 with its message under qemu"
  "$tmp/venv/bin/pip" install --quiet --disable-pip-version-check --no-cache-dir --no-index --no-deps \
    --platform manylinux_2_34_aarch64 --only-binary=:all: --target "$tmp/wheel-arm64" \
    "$root/${arm_wheels[0]}" || fail "pip install of the aarch64 wheel"
  expect_version "wheel arm64" qemu-aarch64 -L /usr/aarch64-linux-gnu "$tmp/wheel-arm64/bin/bounded-observe-mcp" --version
  cmp -s "$tmp/wheel-arm64/bin/bounded-observe-mcp" "$arm_bin" \
    || fail "the aarch64 wheel's binary and the npm package's differ"
  pass "arm64: the same binary in the wheel and the npm package"
fi

echo "packages: $passed passed, 0 failed"
