#!/usr/bin/env bash
# The profile for a profile-guided (PGO) release build of the wrapper: an instrumented build,
# then a training run (scripts/pgo_train.py: every mode a session can take, not the stdio
# benchmark's calls), merged into target/pgo/merged.profdata. scripts/package.sh builds the
# packaged binaries with it (`-Cprofile-use`); `--build` also builds that binary here, into
# target/pgo/bounded-observe-mcp, to measure it (bench/README.md, "A profile-guided build").
#
# Needs llvm-profdata of the toolchain's own LLVM (rustup's llvm-tools component, added here
# when missing): the raw profile's format follows rustc's LLVM, which Debian's llvm packages do
# not match. One release build with fat LTO (two with --build): about 4 minutes each on two cores.
#
#   bash scripts/pgo.sh [--build]
set -euo pipefail
cd "$(dirname "$0")/.."
find_profdata() {
  find "$(rustc --print sysroot)/lib/rustlib" -name llvm-profdata -type f 2>/dev/null | head -1
}
profdata=$(find_profdata)
if [ -z "$profdata" ] && command -v rustup >/dev/null 2>&1; then
  rustup component add llvm-tools >&2
  profdata=$(find_profdata)
fi
[ -n "$profdata" ] || { echo "pgo.sh: needs llvm-profdata: rustup component add llvm-tools" >&2; exit 1; }
work=$PWD/target/pgo
rm -rf "$work/profiles" "$work/merged.profdata"
mkdir -p "$work/profiles"
# Built as package.sh's wheel is (the host target, no --target): a profile applies to the
# functions whose symbol names it recorded, and cargo names a crate's symbols differently when a
# target is given. So build scripts and proc macros are instrumented too, and their runs during
# the build leave profiles, removed before the training run.
build() {
  RUSTFLAGS="$1" CARGO_TARGET_DIR="$2" cargo build --release --locked --quiet --bin bounded-observe-mcp
}
echo "== pgo: instrumented build"
build "-Cprofile-generate=$work/profiles" "$work/gen"
rm -f "$work"/profiles/*.profraw
echo "== pgo: training run"
LLVM_PROFILE_FILE="$work/profiles/%m_%p.profraw" \
  python3 scripts/pgo_train.py "$work/gen/release/bounded-observe-mcp"
"$profdata" merge -o "$work/merged.profdata" "$work"/profiles/*.profraw
echo "pgo.sh: $work/merged.profdata"
if [ "${1:-}" = --build ]; then
  echo "== pgo: optimised build"
  build "-Cprofile-use=$work/merged.profdata" "$work/use"
  cp "$work/use/release/bounded-observe-mcp" "$work/bounded-observe-mcp"
  echo "pgo.sh: $work/bounded-observe-mcp"
fi
