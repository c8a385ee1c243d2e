#!/usr/bin/env bash
# The observer's in-process work (bench/observe.rs) counted in instructions, under callgrind:
# a figure that does not move with the machine's speed, so a change of a few per cent shows,
# where the CPU-time figures of the same bench swing by a factor of two between invocations.
# Counts only what runs inside `Observer::on_message` (the observer, the L3 filter and the batch
# body, as the reporter does them), not the harness that makes the frames. (Not `on_frame`: it
# ends in a jump to `on_message`, which callgrind takes for its return.) Per call: the total,
# then the inclusive counts of the stages that keep a symbol of their own (inlined ones do not;
# the rows overlap where one stage calls another). Needs valgrind (`apt-get install valgrind`);
# about a minute per shape. Not part of CI: it measures, it does not gate.
#
#   bash bench/instructions.sh [sequential|pipelined ...]
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
command -v valgrind >/dev/null || { echo "needs valgrind (apt-get install valgrind)" >&2; exit 1; }
exe=$(cargo bench --bench observe --no-run 2>&1 | grep -o 'target/release/deps/observe-[0-9a-f]*' | tail -1)
[ -x "$exe" ] || { echo "no observe bench binary found" >&2; exit 1; }
out=$(mktemp -d)
[ -n "${KEEP:-}" ] && echo "callgrind output kept in $out" || trap 'rm -rf "$out"' EXIT
shapes=("$@")
[ ${#shapes[@]} -gt 0 ] || shapes=(sequential pipelined)
for shape in "${shapes[@]}"; do
    case "$shape" in
        sequential | pipelined) ;;
        *) echo "unknown shape: $shape (sequential or pipelined)" >&2; exit 2 ;;
    esac
done
for shape in "${shapes[@]}"; do
    # From the output directory, with the binary's absolute path (see the annotation below).
    (cd "$out" && valgrind --tool=callgrind --callgrind-out-file="$out/$shape" \
        --toggle-collect='bounded_observe_mcp::observe::observer::Observer<*>::on_message' \
        "$root/$exe" --bench --rounds 1 --only "$shape" >"$out/$shape.log" 2>&1)
    # Also from there: run where it finds the sources, callgrind_annotate counts an inlined
    # function's callees under other names, and the rows below come out short.
    (cd "$out" && callgrind_annotate --inclusive=yes --threshold=100 "$out/$shape" >"$out/$shape.txt" 2>/dev/null)
    # One warm-up round and one measured round (bench/observe.rs): every call of both goes
    # through `on_message`, so both count.
    per_round=$(grep -o 'observer alone: [0-9]* small' "$out/$shape.log" | grep -o '[0-9]*')
    calls=$((2 * per_round))
    echo "== $shape: instructions per tools/call (inclusive; rows overlap)"
    python3 - "$out/$shape.txt" "$calls" <<'EOF'
import re, sys
text, calls = open(sys.argv[1]).read(), int(sys.argv[2])
total = int(re.search(r"^([\d,]+) \(100\.0%\)\s+PROGRAM TOTALS", text, re.M).group(1).replace(",", ""))
rows = [
    ("observer, filter and batch body (all)", None),
    ("  JSON peek (both messages)", r"observe::peek::peek \["),
    ("  answer: correlation and the event", r"correlate::<impl .*>::on_response \["),
    ("    building and handing over the event", r"finish_action_answered \["),
    ("      L3 filter, batch body (the sink's emit)", r"as bounded_observe_mcp::event::EventSink>::emit \["),
    ("        L3's checks of metadata strings", r"event::filter::check_metadata \["),
    ("        writing the event's text", r"event::write_event::text \["),
    ("        dropping the event", r"drop_in_place<bounded_observe_mcp::event::Event> \["),
    ("  capture policy (argument keys)", r"CapturePolicy::decide \["),
    ("  malloc", r"malloc\.c:malloc \["),
    ("  free", r"malloc\.c:free \["),
    ("  realloc", r"malloc\.c:realloc \["),
]
for name, pat in rows:
    if pat is None:
        n = total
    else:
        n = sum(int(m.group(1).replace(",", "")) for m in
                re.finditer(r"^\s*([\d,]+) \([ \d.]+%\)\s+[^\n]*?" + pat, text, re.M))
    print(f"{name:<48} {n / calls:>9,.0f}")
EOF
done
