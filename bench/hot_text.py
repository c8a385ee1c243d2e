#!/usr/bin/env python3
"""Regenerates link/hot-text.ld: the functions a typical session runs, placed together.

    python3 bench/hot_text.py [-o link/hot-text.ld] [--keep link/hot-text.ld] <bounded-observe-mcp>...
    python3 bench/hot_text.py --check <bounded-observe-mcp>

Runs the typical session of bench/stdio.rs (the official Python SDK client, tests/python, making
50 `echo` calls to server-everything, tests/node) through each given wrapper under valgrind's
callgrind, four ways: unobserved, a `file:` sink, a loopback ingest, and OTLP to a loopback
receiver (both a thread here answering 200 to every POST). Every function of the wrapper that ran
becomes a line of the linker script, in that order (start-up and relay first), with its hash
replaced by a wildcard, so that the script survives a new compiler or a small change elsewhere.
Give it the three release builds: `cargo build --release`'s, `cargo bench`'s (the benchmark's
dev-dependencies change the features of tokio and so every symbol's hash) and the profile-guided
one the packages ship (`bash scripts/pgo.sh --build`: a profile inlines other functions, so
other symbols run; a list made without it left that build's session code over 18 windows).
`--keep` adds the patterns of an earlier list after the new ones: a profile-guided build made
anew inlines a little differently and its sessions take timing-dependent paths (which thread
frees what is shared at exit), so what one generation did not run, the next build may. A line
that matches nothing costs nothing; leave `--keep` out to start afresh.
Needs valgrind, the venv and node packages scripts/test-deps.sh installs. Why this exists and
what it saved: bench/README.md, "Code layout".

`--check` runs one session (`file:` sink) through a built wrapper and fails when the code that ran
outside the list's section spreads over more than CHECK_LIMIT of the 64 KiB windows the kernel
keeps resident around each page run: the list has gone stale, regenerate it (`cargo build
--release`, copy the binary, `cargo bench --no-run`, copy that one, `bash scripts/pgo.sh
--build`, then the first form with `--keep link/hot-text.ld`, the two copies and
target/pgo/bounded-observe-mcp). CI runs it on the release build it packages, the profile-guided
one, whose profile CI trains anew.
"""

from __future__ import annotations

import http.server
import json
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CALLS = 50
# How many 64 KiB windows of `.text` a session's code may touch under `--check`: see `check`.
# A list gone stale by a refactor of the observer's path touched 13, one made without the
# profile-guided build 18 on that build. A current list touched 1 here and 6 in CI on the same
# code: CI trains its own profile, which outlined the exit's drop glue (bench/README.md, "Code
# layout").
CHECK_LIMIT = 8


class Answer200(http.server.BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # noqa: N802 (the stdlib's name)
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *_: object) -> None:
        pass


def session(wrapper: str, args: list[str], out: Path) -> None:
    """One typical session through `valgrind wrapper args`, callgrind's record written to `out`."""
    node = shutil.which("node") or "node"
    everything = ROOT / "tests/node/node_modules/@modelcontextprotocol/server-everything/dist/index.js"
    argv = [
        "valgrind", "--tool=callgrind", "--demangle=no", "--dump-instr=no",
        f"--callgrind-out-file={out}", wrapper, *args, "--", node, str(everything), "stdio",
    ]
    client = subprocess.Popen(
        [str(ROOT / "tests/python/.venv/bin/python"), "mcp_client.py", "stdio-session", str(CALLS),
         "--", *argv],
        cwd=ROOT / "tests/python", stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL, text=True,
    )
    assert client.stdin and client.stdout
    first = json.loads(client.stdout.readline())
    if not first.get("pid"):
        sys.exit(f"the session through {args} made no calls")
    client.stdin.write("go\n")
    client.stdin.flush()
    client.communicate(timeout=120)
    if not out.exists():
        sys.exit(f"no callgrind record for {args}")


def functions(record: Path, wrapper: str) -> list[str]:
    """The wrapper's functions that ran, in the order the record names them."""
    objects: dict[str, str] = {}
    names: dict[str, str] = {}
    obj = None
    seen: dict[str, None] = {}
    for line in record.read_text().splitlines():
        m = re.match(r"(c?ob|c?fn)=\((\d+)\)(?: (.*))?", line)
        if not m:
            continue
        kind, key, name = m.groups()
        table = objects if kind.endswith("ob") else names
        if name is not None:
            table[key] = name
        if kind == "ob":
            obj = objects.get(key)
        elif kind == "fn" and obj in (wrapper, "???"):
            # `???`: callgrind names no object for code outside the section called `.text`.
            seen.setdefault(re.sub(r"'\d+$", "", names[key]), None)
    return list(seen)


def symbols(wrapper: str) -> dict[str, tuple[str, int, int | None]]:
    """Every defined symbol of the wrapper: its type letter, address and size (None where `nm`
    knows none), the first definition of a name."""
    out = subprocess.run(["nm", "-S", "--defined-only", wrapper], capture_output=True, text=True,
                         check=True)
    found: dict[str, tuple[str, int, int | None]] = {}
    for p in (line.split() for line in out.stdout.splitlines()):
        if len(p) == 4:
            found.setdefault(p[3], (p[2], int(p[0], 16), int(p[1], 16)))
        elif len(p) == 3:
            found.setdefault(p[2], (p[1], int(p[0], 16), None))
    return found


def pattern(name: str) -> str:
    """A symbol as a section-name pattern that the next build still matches."""
    name = re.sub(r"17h[0-9a-f]{16}E$", "17h*E", name)  # legacy mangling: the hash
    name = re.sub(r"Cs[0-9A-Za-z]+_(?=\d)", "Cs*_", name)  # v0 mangling: crate disambiguators
    return re.sub(r"\.\d+$", ".*", name)  # LLVM's suffix on a local symbol


def hot_range(wrapper: str) -> tuple[int, int]:
    """Start and end address of the wrapper's `.text.hot` (0, 0 when it has none)."""
    out = subprocess.run(["readelf", "-SW", wrapper], capture_output=True, text=True, check=True)
    for line in out.stdout.splitlines():
        m = re.search(r"\]\s+\.text\.hot\s+\S+\s+([0-9a-f]+)\s+[0-9a-f]+\s+([0-9a-f]+)", line)
        if m:
            start = int(m.group(1), 16)
            return start, start + int(m.group(2), 16)
    return 0, 0


def check(wrapper: str, limit: int) -> None:
    """Fails when the code a typical session runs outside `.text.hot` touches more than `limit`
    of the 64 KiB windows the kernel maps around a page fault of a file (fault-around).

    The list names functions, some by their exact symbol, so it goes stale as the code changes:
    a function added or renamed on the session's path lands in `.text` again, and the window
    around it stays resident (bench/README.md, "Code layout"). Measured by what ran, not by the
    list, so a stale line that matches nothing costs nothing here. One session, the `file:` sink.
    """
    wrapper = str(Path(wrapper).resolve())
    start, end = hot_range(wrapper)
    place = {name: (addr, size) for name, (kind, addr, size) in symbols(wrapper).items()
             if kind in "tTwW" and size is not None}
    with tempfile.TemporaryDirectory() as tmp:
        record = Path(tmp) / "callgrind"
        session(wrapper, ["--ingest", f"file:{tmp}/events.jsonl"], record)
        ran = [f for f in functions(record, wrapper) if f in place]
    outside = [f for f in ran if not start <= place[f][0] < end]
    window = 64 * 1024
    windows = {w for f in outside
               for w in range(place[f][0] // window, (place[f][0] + max(place[f][1], 1) - 1) // window + 1)}
    print(f"{wrapper}: {len(ran)} functions ran in a typical session,"
          f" {sum(place[f][1] for f in ran) / 1024:.0f} KiB; outside .text.hot: {len(outside)},"
          f" {sum(place[f][1] for f in outside) / 1024:.0f} KiB; 64 KiB windows they touch: {len(windows)}")
    for f in sorted(outside, key=lambda f: -place[f][1])[:10]:
        print(f"  {place[f][1]:>7} {f}")
    if len(windows) > limit:
        sys.exit(f"the code a typical session runs outside .text.hot touches {len(windows)} windows"
                 f" of 64 KiB (at most {limit}): regenerate link/hot-text.ld (this script's docstring)")


def main() -> None:
    args = sys.argv[1:]
    if len(args) == 2 and args[0] == "--check":
        return check(args[1], CHECK_LIMIT)
    dest = ROOT / "link/hot-text.ld"
    kept: list[str] = []
    while len(args) >= 2 and args[0] in ("-o", "--keep"):
        if args[0] == "-o":
            dest = Path(args[1])
        else:
            kept = re.findall(r"^    \*\(\.text\.\*(.+)\)$", Path(args[1]).read_text(), re.M)
            if not kept:
                sys.exit(f"{args[1]}: no patterns to keep")
        args = args[2:]
    if not args:
        sys.exit(__doc__)
    wrappers = [str(Path(a).resolve()) for a in args]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Answer200)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    # A pattern that names one function is its line. Where it names several (instances of one
    # generic function), each instance that ran gets a line of its own and the pattern follows
    # every such line, so the instances that did not run stay after every function that did.
    lines: dict[str, None] = {}
    after: dict[str, None] = {}
    with tempfile.TemporaryDirectory() as tmp:
        ways = [
            ("unobserved", []),
            ("file sink", ["--ingest", f"file:{tmp}/events.jsonl"]),
            ("loopback ingest", ["--token", "obs1.bench.c2ln", "--ingest", url]),
            ("OTLP", ["--otlp-endpoint", url]),
        ]
        known = {w: symbols(w) for w in wrappers}
        instances: dict[str, dict[str, int]] = {}
        for w in wrappers:
            counts = instances.setdefault(w, {})
            for name in known[w]:
                counts[pattern(name)] = counts.get(pattern(name), 0) + 1
        for i, (label, way) in enumerate(ways):
            for j, w in enumerate(wrappers):
                record = Path(tmp) / f"callgrind.{i}.{j}"
                session(w, way, record)
                ran = [f for f in functions(record, w) if f in known[w]]
                new = 0
                for name in ran:
                    p = pattern(name)
                    several = instances[w][p] > 1
                    if several:
                        after.setdefault(p, None)
                    line = name if several else p
                    if line not in lines:
                        lines[line] = None
                        new += 1
                print(f"{label}, {w}: {len(ran)} functions ran, {new} new", file=sys.stderr)
    server.shutdown()
    lines.update(after)
    fresh = len(lines)
    lines.update(dict.fromkeys(kept))
    # `.text.*`: the section of a function LLVM deems cold is `.text.unlikely.<symbol>`.
    body = "".join(f"    *(.text.*{p})\n" for p in lines)
    dest.write_text(
        "/* Generated by bench/hot_text.py from a typical session; do not edit by hand.\n"
        "   The functions the wrapper runs in a session, first in its machine code: see build.rs. */\n"
        "SECTIONS {\n  .text.hot : {\n" + body + "  }\n} INSERT BEFORE .text;\n"
    )
    print(f"{dest}: {len(lines)} patterns, {len(lines) - fresh} of them kept", file=sys.stderr)


if __name__ == "__main__":
    main()
