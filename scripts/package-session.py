#!/usr/bin/env python3
"""One MCP session through an installed package, started as README.md tells an MCP client to.

scripts/test-package.sh runs this once per install. It reads the `mcp.json` snippet marked
`<!-- mcp.json: NAME -->` in README.md and starts exactly its `command` and the `args` up to `--`,
with its `env`. Three things in a snippet are placeholders and only those are replaced: the
wrapped server after `--` (the payments fixture here), the token and the ingest URL (a real
reference ingest on loopback). For the absolute-path snippet the path is one too (--binary). Then it
speaks MCP over the pipes as a client does (initialize, tools/list, one tools/call carrying
PII canaries), closes stdin, and checks: every stdout line is the server's JSON-RPC, the exit code
is 0, and the event landed in the ingest with the snippet's `onBehalfOf` and without the canaries.
Standard library only; stdout gets one `ok:` line, failures exit 1 with the reason on stderr.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.request

SNIPPET_MARK = re.compile(r"<!-- mcp\.json: ([a-z0-9-]+) -->\s*```json\n(.*?)\n```", re.S)
PLACEHOLDER_ENV = ("BOUNDED_SENSOR_TOKEN", "BOUNDED_INGEST_BASE")
# Values that must never reach the ingest: the refund's arguments carry them under a denied key
# (customer_email) and inside an allowed free-text key (reason).
CANARIES = ("jane.canary@example.com", "4111 1111 1111 1111")
SESSION_TIMEOUT_S = 60


def fail(msg):
    sys.stderr.write(f"package-session: {msg}\n")
    sys.exit(1)


def snippets(readme):
    found = {}
    for name, body in SNIPPET_MARK.findall(readme):
        if name in found:
            fail(f"README.md: two snippets named {name}")
        found[name] = json.loads(body)
    return found


def server_entry(snippet, name):
    servers = snippet.get("mcpServers", {})
    if len(servers) != 1:
        fail(f"snippet {name}: expected one server in mcpServers, got {list(servers)}")
    return next(iter(servers.values()))


class Session:
    """A client on the child's pipes: requests out, one reader thread collecting stdout lines."""

    def __init__(self, argv, env, cwd):
        self.proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, cwd=cwd
        )
        self.lines = []
        self.eof = False
        self.cond = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for raw in self.proc.stdout:
            with self.cond:
                self.lines.append(raw)
                self.cond.notify_all()
        with self.cond:
            self.eof = True
            self.cond.notify_all()

    def send(self, msg):
        self.proc.stdin.write(json.dumps(msg).encode() + b"\n")
        self.proc.stdin.flush()

    def request(self, id_, method, params):
        self.send({"jsonrpc": "2.0", "id": id_, "method": method, "params": params})
        deadline = time.monotonic() + SESSION_TIMEOUT_S
        with self.cond:
            while True:
                for raw in self.lines:
                    try:
                        msg = json.loads(raw)
                    except ValueError:
                        fail(f"stdout carried a line that is not JSON: {raw[:200]!r}")
                    if msg.get("id") == id_:
                        return msg
                left = deadline - time.monotonic()
                if self.eof or left <= 0:
                    fail(f"no answer to {method} (stdout closed: {self.eof})")
                self.cond.wait(min(left, 0.5))

    def close(self):
        self.proc.stdin.close()
        try:
            return self.proc.wait(SESSION_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            fail("the wrapper did not exit after stdin closed")


def ingest_events(base, admin_secret, org, actor):
    url = f"{base}/v1/events?org={org}&actor={actor}&limit=100"
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {admin_secret}"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return resp.read()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--readme", required=True)
    ap.add_argument("--snippet", required=True, help="the NAME of <!-- mcp.json: NAME -->")
    ap.add_argument("--server", required=True, help="JSON array: the wrapped server's argv")
    ap.add_argument("--ingest", required=True)
    ap.add_argument("--token", required=True)
    ap.add_argument("--org", required=True)
    ap.add_argument("--binary", help="for the absolute-path snippet: where the binary really is")
    ap.add_argument("--emulator", default="", help="JSON array run before the command (qemu)")
    ap.add_argument("--cwd", default=None)
    a = ap.parse_args()

    with open(a.readme, encoding="utf-8") as f:
        found = snippets(f.read())
    if a.snippet not in found:
        fail(f"README.md: no snippet {a.snippet} (found {sorted(found)})")
    entry = server_entry(found[a.snippet], a.snippet)
    command, args, env_in = entry["command"], entry["args"], entry.get("env", {})
    if "--" not in args:
        fail(f"snippet {a.snippet}: no `--` before the server command in args")
    own_args = args[: args.index("--") + 1]
    if a.binary:
        if not (os.path.isabs(command) and os.path.basename(command) == "bounded-observe-mcp"):
            fail(f"snippet {a.snippet}: command {command!r} is not an absolute path to bounded-observe-mcp")
        command = a.binary
    for key in PLACEHOLDER_ENV:
        if key not in env_in:
            fail(f"snippet {a.snippet}: env has no {key}")
    on_behalf_of = env_in.get("BOUNDED_ON_BEHALF_OF")

    env = {k: v for k, v in os.environ.items() if not k.startswith("BOUNDED_")}
    env.update(env_in)
    env["BOUNDED_SENSOR_TOKEN"] = a.token
    env["BOUNDED_INGEST_BASE"] = a.ingest
    emulator = json.loads(a.emulator) if a.emulator else []
    argv = emulator + [command] + own_args + json.loads(a.server)

    s = Session(argv, env, a.cwd)
    init = s.request(1, "initialize", {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "package-test", "version": "1"},
    })
    if "result" not in init:
        fail(f"initialize failed: {init}")
    s.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
    tools = s.request(2, "tools/list", {})
    names = {t["name"] for t in tools.get("result", {}).get("tools", [])}
    if "issue_refund" not in names:
        fail(f"tools/list has no issue_refund: {sorted(names)}")
    call = s.request(3, "tools/call", {"name": "issue_refund", "arguments": {
        "amount_cents": 4900,
        "currency": "EUR",
        "customer_email": CANARIES[0],
        "reason": f"card {CANARIES[1]}",
    }})
    if call.get("result", {}).get("isError"):
        fail(f"issue_refund failed: {call}")
    code = s.close()
    if code != 0:
        fail(f"exit code {code}, expected 0")
    for raw in s.lines:
        try:
            msg = json.loads(raw)
        except ValueError:
            fail(f"stdout carried a line that is not JSON-RPC: {raw[:200]!r}")
        if msg.get("jsonrpc") != "2.0":
            fail(f"stdout carried a line that is not JSON-RPC: {raw[:200]!r}")

    # The wrapper delivers before it exits; the poll only allows for the ingest's commit.
    key_id = a.token.split(".")[1]
    actor = f"mcp:{key_id}"
    deadline = time.monotonic() + 15
    while True:
        raw = ingest_events(a.ingest, os.environ["BOUNDED_INGEST_ADMIN_SECRET"], a.org, actor)
        events = json.loads(raw)["events"]
        if events or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    if len(events) != 1:
        fail(f"expected one event for {actor}, got {len(events)}")
    ev = events[0]
    checks = {
        "action": ev["rec"]["action"] == "issue_refund",
        "status": ev["status"] == 200,
        "amount_cents captured": ev["rec"].get("fields", {}).get("amount_cents") == 4900,
        "onBehalfOf from the snippet": ev.get("onBehalfOf") == on_behalf_of,
        "dest.host": ev["dest"]["host"] == "mcp://payments",
    }
    bad = [k for k, ok in checks.items() if not ok]
    if bad:
        fail(f"event does not match ({', '.join(bad)}): {json.dumps(ev)}")
    for canary in CANARIES:
        if canary.encode() in raw:
            fail(f"the canary {canary!r} reached the ingest")
    print(f"ok: {a.snippet} snippet via {' '.join(emulator + [command] + own_args)}: "
          f"session exit 0, event {ev['id']} landed, no canary")


if __name__ == "__main__":
    main()
