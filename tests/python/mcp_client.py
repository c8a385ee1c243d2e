"""Interop driver built on the official MCP Python SDK (PyPI `mcp`, pinned in requirements.txt).

Used by tests/python_interop.rs and bench/http.rs, against an MCP server's Streamable HTTP
endpoint, directly or through the proxy, and by bench/stdio.rs and tests/stdio_sdk_clients.rs
over stdio:

  python mcp_client.py transcript <url>
    Runs a fixed session (connect, list tools, call echo, get-sum, a tool that streams progress
    notifications, an unknown tool, close) and prints one JSON line: every JSON-RPC message
    the SDK's transport sent and received, in the order the SDK saw them, and the set of HTTP
    exchanges (method, status, content type, whether a session id came back).

  python mcp_client.py bench <url> <calls>
    Connects, then makes <calls> sequential `tools/call` of echo, and prints one JSON line with
    the seconds those calls took (connecting and closing are not timed).

  python mcp_client.py stdio-session <calls> [--env NAME=VALUE]... -- <command> [args...]
    The SDK's own stdio client launches <command> (the environment it passes is the SDK's
    default plus each --env), makes <calls> sequential `tools/call` of echo, then prints one
    JSON line: the launched process's pid and the seconds the calls took. It then waits for a
    line on its own stdin before closing the session, so the caller can look at the process
    while it is still running, and prints a second JSON line: when the SDK closed the server's
    stdin (`close_ns`, CLOCK_MONOTONIC, just after the close returned) and when the client's
    session context had exited (`context_exit_ns`). The two timestamps come from read-only
    wrappers around two of the SDK's private helpers (`_create_platform_compatible_process`,
    `_close_pipe`, pinned SDK); everything else is the SDK as it is.

  python mcp_client.py stdio-transcript <echo text> -- <command> [args...]
    The SDK's own stdio client launches <command> (an rmcp_echo_server, directly or wrapped)
    and runs a fixed session: list tools, echo <echo text>, sum, `notify` with progress and logging
    notifications, one large answer (`big`, 5,000,000 bytes), an unknown tool, 20 echoes in
    flight at once, then close. Prints one JSON line with what the client saw; the large text
    is given as its length and SHA-256, the notifications as sorted values.

The transcript is taken between the SDK's client session and its Streamable HTTP transport, so
it shows what a real SDK client receives, including notifications it did not ask for.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator

import anyio
import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.message import SessionMessage
from mcp.types import Implementation

# The client name the server sees; fixed so both runs of a transcript send the same bytes.
CLIENT_INFO = Implementation(name="python-interop-client", version="1.0.0")
# Long enough for the slowest scripted call (the progress tool runs for 1 s) on a loaded machine.
READ_TIMEOUT_S = 60.0


def dump(item: Any) -> Any:
    """A transport item as JSON: the message as the SDK puts it on the wire, or the error."""
    if isinstance(item, SessionMessage):
        return item.message.model_dump(by_alias=True, mode="json", exclude_unset=True)
    return {"transportError": type(item).__name__}


class RecordingRead:
    """The transport's read stream, noting every item the session receives from it."""

    def __init__(self, inner: Any, log: list[dict[str, Any]]) -> None:
        self._inner = inner
        self._log = log

    @property
    def last_context(self) -> Any:
        return getattr(self._inner, "last_context", None)

    async def receive(self) -> Any:
        item = await self._inner.receive()
        self._log.append({"received": dump(item)})
        return item

    async def aclose(self) -> None:
        await self._inner.aclose()

    def __aiter__(self) -> RecordingRead:
        return self

    async def __anext__(self) -> Any:
        try:
            return await self.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            raise StopAsyncIteration from None

    async def __aenter__(self) -> RecordingRead:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()


class RecordingWrite:
    """The transport's write stream, noting every message the session sends on it."""

    def __init__(self, inner: Any, log: list[dict[str, Any]]) -> None:
        self._inner = inner
        self._log = log

    async def send(self, item: SessionMessage, /) -> None:
        self._log.append({"sent": dump(item)})
        await self._inner.send(item)

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def __aenter__(self) -> RecordingWrite:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()


class RecordingTransport:
    """The SDK's own Streamable HTTP transport, with its two streams recorded."""

    def __init__(self, url: str, http_client: httpx2.AsyncClient, log: list[dict[str, Any]]) -> None:
        self._url = url
        self._http = http_client
        self._log = log
        self._cm: Any = None

    async def __aenter__(self) -> tuple[RecordingRead, RecordingWrite]:
        self._cm = streamable_http_client(self._url, http_client=self._http)
        read, write = await self._cm.__aenter__()
        return RecordingRead(read, self._log), RecordingWrite(write, self._log)

    async def __aexit__(self, *exc: Any) -> Any:
        return await self._cm.__aexit__(*exc)


@asynccontextmanager
async def traced_http(exchanges: set[str]) -> AsyncIterator[httpx2.AsyncClient]:
    """The SDK's default HTTP client, noting the shape of every response it gets; its timing is
    left as it is."""

    async def on_response(response: httpx2.Response) -> None:
        ctype = response.headers.get("content-type", "").split(";")[0].strip()
        exchanges.add(
            json.dumps(
                {
                    "method": response.request.method,
                    "status": response.status_code,
                    "contentType": ctype,
                    "sessionHeader": "mcp-session-id" in response.headers,
                },
                sort_keys=True,
            )
        )

    http = create_mcp_http_client()
    http.event_hooks["response"].append(on_response)
    async with http:
        yield http


async def transcript(url: str) -> dict[str, Any]:
    log: list[dict[str, Any]] = []
    exchanges: set[str] = set()
    progress: list[float] = []

    async def on_progress(done: float, total: float | None, message: str | None) -> None:
        progress.append(done)

    async with traced_http(exchanges) as http:
        async with Client(
            RecordingTransport(url, http, log),
            client_info=CLIENT_INFO,
            read_timeout_seconds=READ_TIMEOUT_S,
        ) as client:
            await client.list_tools()
            await client.call_tool("echo", {"message": "through the proxy"})
            await client.call_tool("get-sum", {"a": 40, "b": 2})
            await client.call_tool(
                "trigger-long-running-operation",
                {"duration": 1, "steps": 3},
                progress_callback=on_progress,
            )
            await client.call_tool("no-such-tool", {})
    return {
        "messages": log,
        "progress": progress,
        "http": [json.loads(e) for e in sorted(exchanges)],
    }


async def bench(url: str, calls: int) -> dict[str, Any]:
    async with Client(url, client_info=CLIENT_INFO, read_timeout_seconds=READ_TIMEOUT_S) as client:
        # One call before the clock starts, so connection set-up is not timed.
        await client.call_tool("echo", {"message": "warm-up"})
        t = time.perf_counter()
        for i in range(calls):
            r = await client.call_tool("echo", {"message": f"call {i}"})
            if r.is_error:
                raise SystemExit(f"echo call {i} failed: {r}")
        secs = time.perf_counter() - t
    return {"calls": calls, "seconds": secs}


async def stdio_session(calls: int, env: dict[str, str], argv: list[str]) -> dict[str, Any]:
    from mcp.client import stdio as sdk_stdio
    from mcp.client.stdio import StdioServerParameters

    seen: dict[str, Any] = {}
    create = sdk_stdio._create_platform_compatible_process
    close_pipe = sdk_stdio._close_pipe

    async def noting_create(*args: Any, **kwargs: Any) -> Any:
        process = await create(*args, **kwargs)
        seen["process"] = process
        return process

    async def noting_close(stream: Any) -> None:
        await close_pipe(stream)
        process = seen.get("process")
        if process is not None and stream is process.stdin and "close_ns" not in seen:
            seen["close_ns"] = time.monotonic_ns()

    sdk_stdio._create_platform_compatible_process = noting_create
    sdk_stdio._close_pipe = noting_close

    params = StdioServerParameters(command=argv[0], args=argv[1:], env=env)
    async with Client(params, client_info=CLIENT_INFO, read_timeout_seconds=READ_TIMEOUT_S) as client:
        t = time.perf_counter()
        for i in range(calls):
            r = await client.call_tool("echo", {"message": f"call {i}"})
            if r.is_error:
                raise SystemExit(f"echo call {i} failed: {r}")
        secs = time.perf_counter() - t
        process = seen.get("process")
        print(
            json.dumps({"pid": process.pid if process else None, "calls": calls, "seconds": secs}),
            flush=True,
        )
        await anyio.to_thread.run_sync(sys.stdin.readline)
    return {"close_ns": seen.get("close_ns"), "context_exit_ns": time.monotonic_ns()}


# The session stdio-transcript runs; tests/node/stdio_client.mjs runs the same one, and
# tests/stdio_sdk_clients.rs checks what both saw.
BIG_BYTES = 5_000_000
IN_FLIGHT = 20


async def stdio_transcript(argv: list[str], echo_text: str) -> dict[str, Any]:
    from mcp.client.stdio import StdioServerParameters
    from mcp.shared.exceptions import MCPError

    logs: list[Any] = []
    progress: list[float] = []

    async def on_log(params: Any) -> None:
        logs.append(params.data)

    async def on_progress(done: float, total: float | None, message: str | None) -> None:
        progress.append(done)

    def texts(result: Any) -> list[str]:
        return [c.text for c in result.content if getattr(c, "type", None) == "text"]

    out: dict[str, Any] = {}
    params = StdioServerParameters(command=argv[0], args=argv[1:])
    async with Client(
        params,
        client_info=CLIENT_INFO,
        read_timeout_seconds=READ_TIMEOUT_S,
        logging_callback=on_log,
    ) as client:
        out["tools"] = sorted(t.name for t in (await client.list_tools()).tools)
        out["echo"] = texts(await client.call_tool("echo", {"text": echo_text}))
        out["sum"] = texts(await client.call_tool("sum", {"a": 2, "b": 40}))
        out["notify"] = texts(
            await client.call_tool("notify", {"count": 3}, progress_callback=on_progress)
        )
        big = "".join(texts(await client.call_tool("big", {"bytes": BIG_BYTES})))
        out["big"] = {
            "bytes": len(big.encode()),
            "sha256": hashlib.sha256(big.encode()).hexdigest(),
        }
        try:
            missing = await client.call_tool("no-such-tool", {})
            out["missing"] = {"isError": missing.is_error}
        except MCPError as e:
            out["missing"] = {"code": e.code}
        answers: dict[int, list[str]] = {}

        async def one(i: int) -> None:
            answers[i] = texts(await client.call_tool("echo", {"text": f"msg-{i}"}))

        async with anyio.create_task_group() as tg:
            for i in range(IN_FLIGHT):
                tg.start_soon(one, i)
        out["inFlight"] = [answers[i] for i in range(IN_FLIGHT)]
        # Notifications travel ahead of their answer, but the SDK may still be handing them to
        # the callbacks: the answer to a later request says they have all been read.
        await client.call_tool("sum", {"a": 0, "b": 0})
    out["logSteps"] = sorted(d["step"] for d in logs)
    out["progress"] = sorted(progress)
    return out


def parse_stdio_session(args: list[str]) -> tuple[int, dict[str, str], list[str]] | None:
    """`<calls> [--env NAME=VALUE]... -- <command> [args...]`, or None when malformed."""
    if not args or "--" not in args:
        return None
    head, argv = args[: args.index("--")], args[args.index("--") + 1 :]
    if not head or not head[0].isdigit() or not argv:
        return None
    env: dict[str, str] = {}
    rest = head[1:]
    while rest:
        if len(rest) < 2 or rest[0] != "--env" or "=" not in rest[1]:
            return None
        name, value = rest[1].split("=", 1)
        env[name] = value
        rest = rest[2:]
    return int(head[0]), env, argv


def main() -> None:
    args = sys.argv[1:]
    if len(args) == 2 and args[0] == "transcript":
        out = anyio.run(transcript, args[1])
    elif len(args) == 3 and args[0] == "bench":
        out = anyio.run(bench, args[1], int(args[2]))
    elif args and args[0] == "stdio-session" and (parsed := parse_stdio_session(args[1:])):
        out = anyio.run(stdio_session, *parsed)
    elif len(args) >= 4 and args[0] == "stdio-transcript" and args[2] == "--":
        out = anyio.run(stdio_transcript, args[3:], args[1])
    else:
        print(
            "usage: mcp_client.py transcript <url> | bench <url> <calls>"
            " | stdio-session <calls> [--env NAME=VALUE]... -- <command> [args...]"
            " | stdio-transcript <echo text> -- <command> [args...]",
            file=sys.stderr,
        )
        sys.exit(2)
    print(json.dumps(out, sort_keys=True))


if __name__ == "__main__":
    main()
