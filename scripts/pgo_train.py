#!/usr/bin/env python3
"""The training run of a profile-guided build (scripts/pgo.sh): drives an instrumented wrapper
through every path a user's session takes, so that the profile marks none of them cold.

Code the profile never saw is laid out and optimised as cold (for size, out of the hot path),
so a training run that covered only the stdio benchmark's shape would make every other mode
slower. This one covers, with the demo's bundled server (`__demo-server`, in the binary itself,
so nothing else is needed) and servers this script serves on loopback:

  stdio, `file:` sink      sequential calls of every demo tool (captured keys, PII-shaped
                           arguments, a tool error), tools/list, ping, an unknown method, a
                           malformed line, a pipelined burst, large arguments (the large-frame path)
  stdio, HTTP ingest       a token and the reference ingest's route (`/v1/events`, answered 202)
  stdio, OTLP              `--otlp-endpoint` (traces and metrics, answered 200)
  HTTP proxy, `file:` sink `--http --upstream`: JSON answers and event-stream answers

It does not measure anything and its messages are not the stdio benchmark's, so the benchmark
is not judged on the very calls the build was trained on.

  python3 scripts/pgo_train.py <instrumented bounded-observe-mcp>
"""

from __future__ import annotations

import http.client
import http.server
import json
import os
import subprocess
import sys
import tempfile
import threading

WRAPPER = os.path.abspath(sys.argv[1])
SERVER = [WRAPPER, "__demo-server"]


def line(msg: dict) -> bytes:
    return (json.dumps(msg, separators=(",", ":")) + "\n").encode()


INIT = {
    "jsonrpc": "2.0",
    "id": 0,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "pgo-train", "version": "1.0.0"},
    },
}
INITIALIZED = {"jsonrpc": "2.0", "method": "notifications/initialized"}


def call(i: int) -> dict:
    """A `tools/call` of one of the demo's three tools, by `i`."""
    tool, args = [
        ("issue_refund", {"amount_cents": 100 + i, "currency": "EUR", "customer_email": f"c{i}@example.com", "reason": "duplicate charge"}),
        ("lookup_customer", {"email": f"c{i}@example.com", "card": "4111 1111 1111 1111"}),
        ("void_payment", {"payment_id": f"pay_{i:06d}"}),
    ][i % 3]
    meta = {"bounded/onBehalfOf": f"cust_{i % 17}"} if i % 2 else {"progressToken": i}
    return {"jsonrpc": "2.0", "id": i, "method": "tools/call", "params": {"name": tool, "arguments": args, "_meta": meta}}


def stdio_session(args: list[str], sequential: int, burst: int, large: int) -> None:
    p = subprocess.Popen([WRAPPER, *args, "--", *SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    out = p.stdout

    def ask(msg: dict) -> None:
        p.stdin.write(line(msg))
        p.stdin.flush()
        if "id" in msg and not out.readline():
            sys.exit("pgo_train: the wrapper closed its stdout")

    ask(INIT)
    p.stdin.write(line(INITIALIZED))
    ask({"jsonrpc": "2.0", "id": "list-1", "method": "tools/list", "params": {}})
    ask({"jsonrpc": "2.0", "id": "ping-1", "method": "ping"})
    ask({"jsonrpc": "2.0", "id": "x-1", "method": "resources/list", "params": {}})
    for i in range(1, sequential + 1):
        ask(call(i))
    # A malformed line: the demo server answers it with nothing; the wrapper passes it on.
    p.stdin.write(b'{"jsonrpc":"2.0","id":\n')
    for i in range(large):
        big = {"jsonrpc": "2.0", "id": f"big-{i}", "method": "tools/call", "params": {"name": "issue_refund", "arguments": {"amount_cents": 1, "currency": "EUR", "reason": "x" * (3 << 20)}}}
        ask(big)
    if burst:
        first = 10_000_000
        reqs = b"".join(line(call(first + i)) for i in range(burst))

        def write() -> None:
            p.stdin.write(reqs)
            p.stdin.flush()

        writer = threading.Thread(target=write)
        writer.start()
        seen = 0
        while seen < burst:
            chunk = out.read1(1 << 16)
            if not chunk:
                break
            seen += chunk.count(b"\n")
        writer.join()
    p.stdin.close()
    out.read()
    p.wait(timeout=60)


class Sink(http.server.BaseHTTPRequestHandler):
    """The reference ingest's event route and an OTLP receiver, reduced to their answers."""

    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    # The paths posted to, checked at the end.
    seen: set[str] = set()

    def log_message(self, *args) -> None:
        pass

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length", 0)))
        Sink.seen.add(self.path)
        status = 202 if self.path.endswith("/v1/events") else 200
        body = b"{}"
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class Upstream(http.server.BaseHTTPRequestHandler):
    """A Streamable HTTP MCP server reduced to its answers: JSON for even ids, an event stream
    for odd ones, 202 for a notification."""

    protocol_version = "HTTP/1.1"
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
        result: dict = {"content": [{"type": "text", "text": "ok"}], "isError": msg["id"] % 5 == 0}
        if msg.get("method") == "initialize":
            result = {"protocolVersion": "2025-06-18", "capabilities": {"tools": {}}, "serverInfo": {"name": "pgo-upstream", "version": "1.0.0"}}
        answer = json.dumps({"jsonrpc": "2.0", "id": msg["id"], "result": result})
        if msg["id"] % 2:
            body = f"event: message\ndata: {answer}\n\n".encode()
            kind = "text/event-stream"
        else:
            body, kind = answer.encode(), "application/json"
        self.send_response(200)
        self.send_header("content-type", kind)
        self.send_header("mcp-session-id", "pgo-session")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def serve(handler) -> tuple[http.server.ThreadingHTTPServer, int]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, server.server_address[1]


def http_session(args: list[str], calls: int, upstream_port: int) -> None:
    p = subprocess.Popen([WRAPPER, "--http", "--upstream", f"http://127.0.0.1:{upstream_port}/mcp", *args], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    while True:
        text = p.stderr.readline().decode()
        if not text:
            sys.exit("pgo_train: the proxy exited before listening")
        if "listening http://127.0.0.1:" in text:
            port = int(text.split("127.0.0.1:")[1].split("/")[0].split()[0])
            break
    threading.Thread(target=p.stderr.read, daemon=True).start()
    conn = http.client.HTTPConnection("127.0.0.1", port)
    headers = {"content-type": "application/json", "accept": "application/json, text/event-stream"}

    def post(msg: dict) -> None:
        conn.request("POST", "/mcp", json.dumps(msg).encode(), {**headers, "mcp-session-id": "pgo-session"})
        answer = conn.getresponse()
        answer.read()
        if answer.status >= 300:
            sys.exit(f"pgo_train: the proxy answered HTTP {answer.status}")

    post(INIT)
    post(INITIALIZED)
    for i in range(1, calls + 1):
        post(call(i))
    conn.close()
    p.terminate()
    p.wait(timeout=30)


def main() -> None:
    sink, sink_port = serve(Sink)
    upstream, upstream_port = serve(Upstream)
    with tempfile.TemporaryDirectory() as tmp:
        events = os.path.join(tmp, "events.jsonl")
        fast = ["--flush-ms", "50"]
        for _ in range(2):
            stdio_session(["--ingest", f"file:{events}", *fast], sequential=3_000, burst=20_000, large=2)
        stdio_session(["--token", "obs1.pgo.c2lnbmF0dXJl", "--ingest", f"http://127.0.0.1:{sink_port}", *fast], sequential=2_000, burst=5_000, large=0)
        stdio_session(["--ingest", f"file:{events}", "--otlp-endpoint", f"http://127.0.0.1:{sink_port}", *fast], sequential=2_000, burst=0, large=0)
        http_session(["--ingest", f"file:{events}", *fast], calls=2_000, upstream_port=upstream_port)
        # A run that trained nothing must not pass for one: every sink got what it should.
        with open(events, "rb") as f:
            written = f.read().count(b'"class"')
    want = 2 * (3_000 + 20_000) + 2_000 + 2_000
    missing = {"/v1/events", "/v1/traces", "/v1/metrics"} - Sink.seen
    if written < want or missing:
        sys.exit(f"pgo_train: {written} events written to the file (want {want} at least); not posted to: {sorted(missing)}")
    print(f"pgo_train: {written} events written, posted to {sorted(Sink.seen)}")
    sink.shutdown()
    upstream.shutdown()


if __name__ == "__main__":
    main()
