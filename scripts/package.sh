#!/usr/bin/env bash
# Builds every installable artifact into dist/, publishing nothing:
#
#   dist/wheels/  the PyPI wheels (maturin, `bindings = "bin"`: the sensor binary as a console
#                 script), one per Linux target built here
#   dist/npm/     the npm tarballs (`npm pack`): the main package `bounded-observe-mcp` (a launcher
#                 and the platform packages as optionalDependencies) and one platform package per
#                 target built here, holding the very binary of that target's wheel
#   dist/crate/   the crate as `cargo package` made and verified it
#   dist/SHA256SUMS
#
# Targets: x86_64-unknown-linux-gnu, and aarch64-unknown-linux-gnu when its Rust target and
# cross linker are installed (scripts/package-deps.sh tries to); the other platforms listed in
# npm/ (macOS, Windows) cannot be built here and get no artifact. scripts/test-package.sh installs
# and runs what this leaves in dist/. One release build per target, reused (set CARGO_TARGET_DIR
# to a directory that already holds one to save the time), and for the host target an
# instrumented one before it, for its profile (scripts/pgo.sh; BOUNDED_PGO=0 skips it).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
bash scripts/package-deps.sh
tools=$root/target/package-tools/bin

meta=$(cargo metadata --no-deps --format-version 1 --locked)
version=$(python3 -c 'import json,sys; print(next(p["version"] for p in json.load(sys.stdin)["packages"] if p["name"] == "bounded-observe-mcp"))' <<<"$meta")
target_dir=$(python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])' <<<"$meta")
host=$(rustc -vV | sed -n 's/^host: //p')

# The npm packages must say what Cargo.toml says: one version everywhere, every platform the
# main package lists present in npm/platforms and in the launcher's table, and no install script.
python3 - "$version" <<'EOF'
import json, pathlib, re, sys
version = sys.argv[1]
main = json.loads(pathlib.Path("npm/bounded-observe-mcp/package.json").read_text())
launcher = pathlib.Path("npm/bounded-observe-mcp/bin/bounded-observe-mcp.js").read_text()
errors = []
if main["version"] != version:
    errors.append(f"npm/bounded-observe-mcp: version {main['version']}, Cargo.toml {version}")
listed = main.get("optionalDependencies", {})
platforms = {json.loads(p.read_text())["name"]: p.parent.name
             for p in pathlib.Path("npm/platforms").glob("*/package.json")}
for name, want in listed.items():
    if want != version:
        errors.append(f"optionalDependencies {name}: {want}, Cargo.toml {version}")
    if name not in platforms:
        errors.append(f"optionalDependencies {name}: no npm/platforms/*/package.json with that name")
    if f"'{name}'" not in launcher:
        errors.append(f"optionalDependencies {name}: not in the launcher's PLATFORM_PACKAGES")
for name, d in platforms.items():
    p = json.loads(pathlib.Path(f"npm/platforms/{d}/package.json").read_text())
    if name not in listed:
        errors.append(f"npm/platforms/{d}: {name} not in the main package's optionalDependencies")
    if p["version"] != version:
        errors.append(f"npm/platforms/{d}: version {p['version']}, Cargo.toml {version}")
for d, p in [("bounded-observe-mcp", main)] + [(d, json.loads(pathlib.Path(f"npm/platforms/{d}/package.json").read_text())) for d in platforms.values()]:
    scripts = set(p.get("scripts", {})) & {"preinstall", "install", "postinstall", "prepare"}
    if scripts:
        errors.append(f"{d}: install scripts {sorted(scripts)}; the packages must install without running code")
if errors:
    sys.exit("package.sh: npm/ disagrees:\n  " + "\n  ".join(errors))
EOF

# Rust target → npm platform directory, for the targets this script can build.
npm_platform() {
  case "$1" in
    x86_64-unknown-linux-gnu) echo linux-x64-gnu ;;
    aarch64-unknown-linux-gnu) echo linux-arm64-gnu ;;
    *) return 1 ;;
  esac
}
# ELF machine of each target, to check that the binary in a package is the one it claims.
elf_machine() {
  case "$1" in
    x86_64-*) echo 62 ;;
    aarch64-*) echo 183 ;;
  esac
}

targets=("$host")
if ! npm_platform "$host" >/dev/null; then
  echo "package.sh: no npm platform package for the host target $host (see npm/platforms)" >&2
  exit 1
fi
skipped=()
if [ "$host" != aarch64-unknown-linux-gnu ]; then
  if ! rustup target list --installed 2>/dev/null | grep -qx aarch64-unknown-linux-gnu; then
    skipped+=("aarch64-unknown-linux-gnu (Rust target not installed)")
  elif ! command -v aarch64-linux-gnu-gcc >/dev/null 2>&1; then
    skipped+=("aarch64-unknown-linux-gnu (no aarch64-linux-gnu-gcc: apt-get install gcc-aarch64-linux-gnu)")
  else
    targets+=(aarch64-unknown-linux-gnu)
    # Debian's cross toolchain, for the final link and for the C that ring and SQLite compile.
    export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
    export CC_aarch64_unknown_linux_gnu=aarch64-linux-gnu-gcc
    export AR_aarch64_unknown_linux_gnu=aarch64-linux-gnu-ar
  fi
fi

# The host target's binary is built with a profile of a training run (scripts/pgo.sh): 12 % less
# of the observer's CPU per call (bench/README.md, "A profile-guided build"). The profile names
# functions by symbol, and symbols differ by target, so a cross build cannot use it: aarch64 is
# built without. BOUNDED_PGO=0 builds the host's without it too.
pgo_flags=""
if [ "${BOUNDED_PGO:-1}" != 0 ]; then
  bash scripts/pgo.sh
  pgo_flags="-Cprofile-use=$root/target/pgo/merged.profdata"
fi

rm -rf dist
mkdir -p dist/wheels dist/npm dist/crate
stage="$target_dir/package-stage"
rm -rf "$stage"
mkdir -p "$stage"

platform_readme() {
  cat <<EOF
# $1

The \`bounded-observe-mcp\` binary for $2. npm installs it as an optional dependency of the
\`bounded-observe-mcp\` package, whose launcher runs it: install that package, not this one.
EOF
}

for target in "${targets[@]}"; do
  platform=$(npm_platform "$target")
  echo "== wheel for $target"
  out="$stage/wheels-$target"
  # The host target is built without --target, into the same release directory that
  # `cargo install` uses in the packaging test, so that one release build serves both.
  target_args=()
  [ "$target" = "$host" ] || target_args=(--target "$target")
  if [ "$target" = "$host" ] && [ -n "$pgo_flags" ]; then
    RUSTFLAGS="$pgo_flags" "$tools/maturin" build --release "${target_args[@]}" --out "$out"
    # A profile that named no function of this build would leave it unoptimised, silently: the
    # trained binary and this one must name the crate's functions alike.
    # (516 of 533 are, the rest inlined differently.)
    crate_symbols() { nm "$1" | awk '/ _ZN19bounded_observe_mcp/ {print $3}' | sort -u; }
    built=$(crate_symbols "$target_dir/release/bounded-observe-mcp" | wc -l)
    shared=$(comm -12 <(crate_symbols "$root/target/pgo/gen/release/bounded-observe-mcp") \
      <(crate_symbols "$target_dir/release/bounded-observe-mcp") | wc -l)
    if [ $((shared * 2)) -lt "$built" ]; then
      echo "package.sh: only $shared of the crate's $built symbols are named as in the trained build: the profile did not apply" >&2
      exit 1
    fi
    echo "package.sh: $target built with the profile ($shared of the crate's $built symbols named as in the trained build)"
  else
    "$tools/maturin" build --release "${target_args[@]}" --out "$out"
  fi
  wheels=("$out"/*.whl)
  if [ ${#wheels[@]} -ne 1 ]; then
    echo "package.sh: expected one wheel for $target, got ${wheels[*]}" >&2
    exit 1
  fi
  wheel=${wheels[0]}
  cp "$wheel" dist/wheels/

  echo "== npm platform package $platform"
  pkg="$stage/npm-$platform"
  mkdir -p "$pkg/bin"
  cp "npm/platforms/$platform/package.json" LICENSE "$pkg/"
  name=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["name"])' "$pkg/package.json")
  platform_readme "$name" "$target" >"$pkg/README.md"
  # The binary of the wheel, byte for byte: one build, the same program from npm and PyPI.
  python3 - "$wheel" "$version" "$pkg/bin/bounded-observe-mcp" "$(elf_machine "$target")" <<'EOF'
import os, sys, zipfile
wheel, version, dest, machine = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
data = zipfile.ZipFile(wheel).read(f"bounded_observe_mcp-{version}.data/scripts/bounded-observe-mcp")
if data[:4] != b"\x7fELF" or int.from_bytes(data[18:20], "little") != machine:
    sys.exit(f"package.sh: the binary in {wheel} is not an ELF for machine {machine}")
with open(dest, "wb") as f:
    f.write(data)
os.chmod(dest, 0o755)
EOF
  (cd "$pkg" && npm pack --silent --pack-destination "$root/dist/npm" >/dev/null)
done

echo "== npm main package"
main="$stage/npm-main"
cp -r npm/bounded-observe-mcp "$main"
# The project's README, as on PyPI and crates.io: its mcp.json snippets are the tested ones.
cp LICENSE README.md "$main/"
(cd "$main" && npm pack --silent --pack-destination "$root/dist/npm" >/dev/null)

echo "== crate (cargo package builds and verifies it)"
# --allow-dirty: this builds a local artifact from the tree as it is; nothing is published.
# The tests, benchmarks and examples stay in the repository (Cargo.toml's `exclude`); cargo names
# each target it leaves out of the packaged manifest, which says nothing new: one line instead.
cargo package --locked --allow-dirty 2>&1 \
  | { grep -Ev '^warning: ignoring (test|benchmark|example) `[^`]+` as `[^`]+` is not included in the published package$' || true; }
test "${PIPESTATUS[0]}" -eq 0
echo "(tests, benchmarks and examples are not in the crate: they need the repository's fixtures)"
cp "$target_dir/package/bounded-observe-mcp-$version.crate" dist/crate/

(cd dist && find . -type f ! -name SHA256SUMS | sort | xargs sha256sum >SHA256SUMS)
echo "== dist/"
(cd dist && find . -type f | sort | xargs ls -l | awk '{ printf "%12d  %s\n", $5, $9 }')
for s in "${skipped[@]}"; do
  echo "package.sh: not built: $s" >&2
done
echo "package.sh: not built here: macOS and Windows (npm/platforms lists them; they need their own build machines)" >&2
