#!/usr/bin/env bash
# The whole wrapper process counted in instructions, under callgrind: every thread (the relay
# loops and their tap, the observer, the batcher and its `file:` sink, start-up and exit), where
# bench/instructions.sh counts only the observer's own work inside one thread of a bench.
# Deterministic to about 0.5 %, where the CPU figures of the stdio bench move by a factor of two
# on a shared VM. A small Python driver speaks to the release wrapper, which wraps the stdio
# bench's mock server (`--role server`); sessions of 500 and 5,000 small `tools/call`s, and the
# difference between the two divided by 4,500 is a call's cost (start-up and exit cancel out).
# `seq`: one call in flight; `pipe`: every request written before the first answer is read.
# LISTED=1: the driver lists the tools first, as real clients do, so each call is also looked up
# in the catalog and its event carries the tool's hash and hints.
# It counts instructions, not cache misses, stalls or system calls: read it beside the stdio
# bench's whole-session CPU, never instead of it. Not part of CI: it measures, it does not gate.
#
#   bash bench/process-instructions.sh [seq|pipe ...]       (needs valgrind and python3)
#   WRAPPER=/path/to/bounded-observe-mcp bash bench/process-instructions.sh   (another build)
#   LISTED=1 bash bench/process-instructions.sh seq                            (tools/list first)
set -euo pipefail
cd "$(dirname "$0")/.."
command -v valgrind >/dev/null || { echo "needs valgrind (apt-get install valgrind)" >&2; exit 1; }
cargo build --release --quiet --bin bounded-observe-mcp
wrapper=${WRAPPER:-$PWD/target/release/bounded-observe-mcp}
server=$(cargo bench --bench stdio --no-run 2>&1 | grep -o 'target/release/deps/stdio-[0-9a-f]*' | tail -1)
[ -x "$server" ] || { echo "no stdio bench binary found" >&2; exit 1; }
server=$PWD/$server
out=$(mktemp -d)
[ -n "${KEEP:-}" ] && echo "callgrind output kept in $out" || trap 'rm -rf "$out"' EXIT
cat >"$out/driver.py" <<'EOF'
import json, os, subprocess, sys, threading
mode, n = sys.argv[1], int(sys.argv[2])
listed = os.environ.get("LISTED") == "1"
p = subprocess.Popen(sys.argv[3:], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
# Compact separators: the mock server matches `"method":"tools/call"` as written.
line = lambda m: (json.dumps(m, separators=(",", ":")) + "\n").encode()
def call(m):
    p.stdin.write(line(m)); p.stdin.flush()
    if "id" in m and not p.stdout.readline():
        sys.exit("the wrapper closed its stdout")
call({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"protocolVersion": "2025-06-18",
      "capabilities": {}, "clientInfo": {"name": "bench-driver", "version": "1.0.0"}}})
call({"jsonrpc": "2.0", "method": "notifications/initialized"})
if listed:
    # The mock server reads unsigned ids only; the calls take 1..n.
    call({"jsonrpc": "2.0", "id": 10**9, "method": "tools/list", "params": {}})
req = lambda i: {"jsonrpc": "2.0", "id": i, "method": "tools/call",
                 "params": {"name": "echo", "arguments": {"amount_cents": 4900, "currency": "EUR"}}}
if mode == "seq":
    for i in range(1, n + 1):
        call(req(i))
else:
    got = []
    reader = threading.Thread(target=lambda: got.extend(p.stdout.readline() for _ in range(n)))
    reader.start()
    p.stdin.write(b"".join(line(req(i)) for i in range(1, n + 1))); p.stdin.flush()
    reader.join()
    if not all(got):
        sys.exit("the wrapper closed its stdout")
p.stdin.close()
sys.exit(p.wait())
EOF
# Total instructions of one wrapper session of $2 calls, shape $1; checks every event was written.
count() {
    local shape=$1 n=$2 dir=$out/$1-$2
    mkdir -p "$dir"
    timeout 600 python3 "$out/driver.py" "$shape" "$n" valgrind --tool=callgrind \
        --callgrind-out-file="$dir/cg" "$wrapper" --ingest "file:$dir/events.jsonl" \
        -- "$server" --role server >/dev/null 2>"$dir/stderr" \
        || { echo "session failed ($shape, $n calls):" >&2; tail -5 "$dir/stderr" >&2; exit 1; }
    local events
    events=$(grep -o '"class":"action"' "$dir/events.jsonl" | wc -l)
    [ "$events" -eq "$n" ] || { echo "$shape, $n calls: $events events written" >&2; exit 1; }
    callgrind_annotate "$dir/cg" 2>/dev/null | awk '/PROGRAM TOTALS/ { gsub(",", "", $1); print $1 }'
}
shapes=("$@")
[ ${#shapes[@]} -gt 0 ] || shapes=(seq pipe)
echo "== whole wrapper process, instructions per small tools/call (file sink${LISTED:+, tools listed first}): $wrapper"
for shape in "${shapes[@]}"; do
    case "$shape" in seq | pipe) ;; *) echo "unknown shape: $shape (seq or pipe)" >&2; exit 2 ;; esac
    small=$(count "$shape" 500)
    large=$(count "$shape" 5000)
    printf '%-5s %9d per call   (sessions: 500 calls %d, 5,000 calls %d)\n' \
        "$shape" $(((large - small) / 4500)) "$small" "$large"
done
