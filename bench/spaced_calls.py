#!/usr/bin/env python3
"""CPU per call when calls come apart: sequential `tools/call`s with a pause between each answer
and the next request, as an agent makes them, through the minimal relay and through observed
wrappers (`file:` sink), the driver, the target and its server pinned to one CPU.

The stdio benchmark's rows send calls back to back. There the observer's linger (2 ms,
`observe::TAP_LINGER`) always finds work, so they cannot show what the observer spends on its
wake-ups when traffic is sparse: this does. For each gap, each target runs `--runs` sessions
(targets interleaved run by run) of `--calls` calls against the stdio benchmark's mock server
(`--role server`); the table gives medians of:

  whole     the target and its server, spawn to exit (rusage of the reaped target), µs per call
  window    the target's threads over the calls alone (/proc/<pid>/task/*/schedstat), µs per call
  observer  the same for the threads named observe-mcp (the observer's runtime), µs per call
  wakes     their voluntary context switches per call: each is a sleep ended by an offer or a
            timer (a count the machine's speed does not move, where the CPU figures are noisy)

With --http the same over HTTP: each target is a long-lived process in front of an upstream
that this driver serves itself (Python's `http.server` on loopback, a JSON answer per POST),
driven by one keep-alive connection (Python's `http.client`); the relay is the HTTP benchmark's
minimal TCP relay (`cargo bench --bench http` builds it), the wrappers run `--http --upstream`.

Usage (after `cargo bench --bench stdio`, which builds the mock server and the wrapper):

  python3 bench/spaced_calls.py [--gaps 20,5,1,0] [--calls 150] [--runs 5] [--http]
                                [--wrapper NAME=PATH]...

Each --wrapper adds an observed target (default: wrap:file=target/release/bounded-observe-mcp);
give two to compare builds in one interleaved run. With gap 0 the calls are 2,000, back to back.
"""

from __future__ import annotations

import argparse
import collections
import glob
import http.client
import http.server
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
INIT = (
    b'{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18",'
    b'"capabilities":{},"clientInfo":{"name":"bench-driver","version":"1.0.0"}}}\n'
)
CALL = (
    b'{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"echo",'
    b'"arguments":{"amount_cents":4900,"currency":"EUR"}}}\n'
)


def bench_binary(bench: str = "stdio") -> str:
    """The newest benchmark binary cargo built: stdio's is also the mock server and relay,
    http's the minimal TCP relay."""
    found = [
        p
        for p in glob.glob(os.path.join(ROOT, f"target/release/deps/{bench}-*"))
        if os.access(p, os.X_OK) and not p.endswith(".d")
    ]
    if not found:
        sys.exit(f"no {bench} benchmark binary: run `cargo bench --bench {bench}` first")
    return max(found, key=os.path.getmtime)


# The observer's runtime thread: `observe-mcp` over stdio, `observe-mcp-obs` over HTTP (where
# `observe-mcp-htt` is the relay's).
OBSERVER_THREADS = ("observe-mcp", "observe-mcp-obs")


class Upstream(http.server.BaseHTTPRequestHandler):
    """A streamable-HTTP MCP server reduced to what the calls need: a JSON answer per request,
    202 for a notification."""

    protocol_version = "HTTP/1.1"
    # The head and the body are two writes: without this, Nagle's algorithm holds the body
    # until the proxy's delayed acknowledgement of the head, 40 ms a call.
    disable_nagle_algorithm = True

    def log_message(self, *args) -> None:
        pass

    def do_POST(self) -> None:
        msg = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))))
        if "id" not in msg:
            self.send_response(202)
            self.send_header("content-length", "0")
            self.end_headers()
            return
        result = {"content": [{"type": "text", "text": "ok"}], "isError": False}
        if msg.get("method") == "initialize":
            result = {
                "protocolVersion": "2025-06-18",
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "bench-upstream", "version": "1.0.0"},
            }
        body = json.dumps({"jsonrpc": "2.0", "id": msg["id"], "result": result}).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class UpstreamServer(http.server.ThreadingHTTPServer):
    daemon_threads = True


def threads(pid: int) -> dict[str, tuple[int, int]]:
    """CPU time (ns) and voluntary context switches of each live thread of `pid`, by `name:tid`."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            name = open(f"/proc/{pid}/task/{tid}/comm").read().strip()
            ns = int(open(f"/proc/{pid}/task/{tid}/schedstat").read().split()[0])
            status = open(f"/proc/{pid}/task/{tid}/status").read()
            switches = int(status.split("voluntary_ctxt_switches:")[1].split()[0])
            out[f"{name}:{tid}"] = (ns, switches)
        except (OSError, IndexError, ValueError):
            pass
    return out


def session(cmd: list[str], calls: int, gap_s: float) -> dict[str, float]:
    p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0)
    p.stdin.write(INIT)
    p.stdout.readline()
    p.stdin.write(b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n')
    time.sleep(0.05)
    before = threads(p.pid)
    for i in range(1, calls + 1):
        p.stdin.write(CALL % i)
        if gap_s:
            time.sleep(gap_s)
        if not p.stdout.readline():
            sys.exit(f"{cmd[0]}: the session ended early")
    # Past the linger and any hold, so the observer's work for the last call is counted.
    time.sleep(0.05)
    after = threads(p.pid)
    p.stdin.close()
    _, _, ru = os.wait4(p.pid, 0)
    return figures(ru, calls, before, after)


def http_session(cmd: list[str], calls: int, gap_s: float) -> dict[str, float]:
    p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    # Both the proxy and the relay print the proxy's listening line.
    while True:
        line = p.stderr.readline().decode()
        if not line:
            sys.exit(f"{cmd[0]}: exited before listening")
        if "listening http://127.0.0.1:" in line:
            port = int(line.split("127.0.0.1:")[1].split("/")[0].split()[0])
            break
    threading.Thread(target=p.stderr.read, daemon=True).start()
    conn = http.client.HTTPConnection("127.0.0.1", port)
    headers = {"content-type": "application/json", "accept": "application/json, text/event-stream"}

    def post(body: bytes) -> None:
        conn.request("POST", "/mcp", body, headers)
        answer = conn.getresponse()
        answer.read()
        if answer.status >= 300:
            sys.exit(f"{cmd[0]}: HTTP {answer.status}")

    post(INIT.strip())
    post(b'{"jsonrpc":"2.0","method":"notifications/initialized"}')
    time.sleep(0.05)
    before = threads(p.pid)
    for i in range(1, calls + 1):
        post((CALL % i).strip())
        if gap_s:
            time.sleep(gap_s)
    time.sleep(0.05)
    after = threads(p.pid)
    conn.close()
    p.terminate()
    _, _, ru = os.wait4(p.pid, 0)
    return figures(ru, calls, before, after)


def figures(ru, calls: int, before: dict, after: dict) -> dict[str, float]:
    zero = (0, 0)
    cpu = {k: (after[k][0] - before.get(k, zero)[0]) / 1e3 / calls for k in after}
    wakes = {k: (after[k][1] - before.get(k, zero)[1]) / calls for k in after}
    observer = [k for k in after if k.split(":")[0] in OBSERVER_THREADS]
    return {
        "whole": (ru.ru_utime + ru.ru_stime) * 1e6 / calls,
        "window": sum(cpu.values()),
        "observer": sum(cpu[k] for k in observer),
        "wakes": sum(wakes[k] for k in observer),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gaps", default="20,5,1,0", help="ms between an answer and the next call")
    ap.add_argument("--calls", type=int, default=150)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--wrapper", action="append", default=[], metavar="NAME=PATH")
    ap.add_argument("--http", action="store_true", help="over HTTP (see above)")
    args = ap.parse_args()
    server = bench_binary("http" if args.http else "stdio")
    wrappers = [w.split("=", 1) for w in args.wrapper] or [
        ["wrap:file", os.path.join(ROOT, "target/release/bounded-observe-mcp")]
    ]
    # The driver, the target and its server share CPU 0, as in the stdio benchmark's pinned
    # phase (children inherit the affinity).
    os.sched_setaffinity(0, {0})
    with tempfile.TemporaryDirectory() as tmp:
        run_session = session
        targets = [("relay", lambda: [server, "--role", "relay", "--", server, "--role", "server"])]
        upstream_args = ["--", server, "--role", "server"]
        if args.http:
            upstream = UpstreamServer(("127.0.0.1", 0), Upstream)
            threading.Thread(target=upstream.serve_forever, daemon=True).start()
            at = f"127.0.0.1:{upstream.server_address[1]}"
            run_session = http_session
            targets = [("relay", lambda: [server, "--relay-to", at])]
            upstream_args = ["--http", "--upstream", f"http://{at}/mcp"]
        for name, path in wrappers:
            targets.append(
                (
                    name,
                    lambda path=path: [
                        path,
                        "--ingest",
                        f"file:{tmp}/events-{time.monotonic_ns()}.jsonl",
                        *upstream_args,
                    ],
                )
            )
        over = "HTTP" if args.http else "stdio"
        print(f"{over}, calls {args.calls} per session (2,000 at gap 0), medians of {args.runs} interleaved runs, pinned to CPU 0")
        print(f"{'gap ms':>6}  {'target':<16} {'whole µs/call':>14} {'window':>8} {'observer':>9} {'wakes':>6}")
        for gap in [float(g) for g in args.gaps.split(",")]:
            calls = args.calls if gap else 2000
            got = collections.defaultdict(list)
            for run in range(args.runs):
                for k in range(len(targets)):
                    name, cmd = targets[(k + run) % len(targets)]
                    got[name].append(run_session(cmd(), calls, gap / 1e3))
            for name, _ in targets:
                fields = ("whole", "window", "observer", "wakes")
                med = {f: statistics.median(r[f] for r in got[name]) for f in fields}
                print(
                    f"{gap:>6g}  {name:<16} {med['whole']:>14.1f} {med['window']:>8.1f} "
                    f"{med['observer']:>9.1f} {med['wakes']:>6.2f}"
                )
                print(json.dumps({"gap_ms": gap, "target": name, "runs": got[name]}), file=sys.stderr)


if __name__ == "__main__":
    main()
