#!/usr/bin/env python3
"""Calls lost when they come back to back on one busy CPU for longer than a burst.

The stdio benchmark's sequential row makes 2,200 calls; its pipelined burst 20,000. Both fit in
the tap's budget (8 MiB) however far the observer falls behind, and the benchmark runs under
`nice`, so the observer's share of a shared CPU there is the one its priority is set for. This
makes one long session of back-to-back sequential `tools/call`s (50,000 by default) against the
stdio benchmark's mock server, with the driver, the wrapper and the server pinned to CPU 0, at
this script's own niceness (run it without `nice`, as an MCP client starts a server: the
observer's priority is relative to the wrapper's). A call the observer could not read before
the tap dropped it is counted as unobserved (`--debug` totals); this prints, per build and run
(builds interleaved run by run), the calls observed and those unobserved, and whether every
answer came back.

Usage (after `cargo bench --bench stdio`, which builds the mock server and the wrapper):

  python3 bench/sustained_calls.py [--calls 50000] [--runs 5] [--json] [--wrapper NAME=PATH]...

--json builds each request with `json.dumps`, as a Python client does, instead of writing
prepared bytes: a slower client, which leaves the observer more of the CPU.

Each --wrapper adds a build (default: now=target/release/bounded-observe-mcp); give two to
compare them.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import tempfile

# The same messages and mock server as the sparse-call benchmark (this directory is on the
# path when a script here runs).
from spaced_calls import CALL, INIT, ROOT, bench_binary


def request(i: int, built: bool) -> bytes:
    """Call `i`: prepared bytes, or (`built`) the same call built as a Python client builds it."""
    if not built:
        return CALL % i
    call = {"jsonrpc": "2.0", "id": i, "method": "tools/call",
            "params": {"name": "echo", "arguments": {"amount_cents": 4900, "currency": "EUR"}}}
    return (json.dumps(call, separators=(",", ":")) + "\n").encode()


def session(wrapper: str, server: str, calls: int, built: bool) -> tuple[int, int, bool]:
    """One pinned session: (events, unobserved, every answer read)."""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [wrapper, "--debug", "--ingest", f"file:{tmp}/events.jsonl"]
        cmd += ["--", server, "--role", "server"]
        p = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        answered = 0
        p.stdin.write(INIT)
        p.stdin.flush()
        answered += bool(p.stdout.readline())
        p.stdin.write(b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n')
        for i in range(1, calls + 1):
            p.stdin.write(request(i, built))
            p.stdin.flush()
            answered += bool(p.stdout.readline())
        p.stdin.close()
        stderr = p.stderr.read().decode(errors="replace")
        p.wait()
    totals = next((l for l in stderr.splitlines() if "Observer totals " in l), "")
    field = lambda k: int(m.group(1)) if (m := re.search(rf"\b{k}=(\d+)", totals)) else -1
    return field("events"), field("unobserved"), answered == calls + 1


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calls", type=int, default=50_000)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--json", action="store_true", help="build each request with json.dumps")
    ap.add_argument("--wrapper", action="append", default=[], metavar="NAME=PATH")
    args = ap.parse_args()
    wrappers = [w.split("=", 1) for w in args.wrapper] or [
        ["now", os.path.join(ROOT, "target/release/bounded-observe-mcp")]
    ]
    server = bench_binary()
    # The driver on CPU 0; the wrapper and its server inherit the affinity.
    os.sched_setaffinity(0, {0})
    how = "built with json.dumps" if args.json else "prepared bytes"
    print(f"{args.calls} back-to-back calls per session ({how}), pinned to CPU 0, nice {os.nice(0)}")
    print(f"{'run':>3}  {'build':<12} {'events':>8} {'unobserved':>10}  answers")
    for run in range(1, args.runs + 1):
        for name, path in wrappers:
            events, unobserved, whole = session(path, server, args.calls, args.json)
            print(f"{run:>3}  {name:<12} {events:>8} {unobserved:>10}  {'all' if whole else 'LOST'}")


if __name__ == "__main__":
    main()
