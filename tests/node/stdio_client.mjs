// Interop driver built on the official MCP TypeScript SDK's stdio client, for
// tests/stdio_sdk_clients.rs and the `typical` row of bench/stdio.rs:
//
//   node stdio_client.mjs transcript <echo text> -- <command> [args...]
//     The SDK's StdioClientTransport launches <command> (an rmcp_echo_server, directly or
//     wrapped) and runs the session tests/python/mcp_client.py's stdio-transcript runs: list
//     tools, echo <echo text>, sum, `notify` with progress and logging notifications, one large
//     answer (`big`, 5,000,000 bytes), an unknown tool, 20 echoes in flight at once, then close.
//     Prints one JSON line with what the client saw, in the same shape as the Python driver's.
//
//   node stdio_client.mjs session <calls> [--env NAME=VALUE]... -- <command> [args...]
//     As mcp_client.py's stdio-session: launches <command> (the environment is the SDK's
//     default plus each --env), makes <calls> sequential `tools/call` of echo, prints the
//     launched process's pid and the seconds the calls took, waits for a line on its own stdin,
//     closes, and prints when the server's stdin was shut down (`close_ns`, CLOCK_MONOTONIC,
//     from the socket's 'finish', which follows the shutdown(2)) and when the client was done
//     (`context_exit_ns`). Only the stdin's `end` is watched; the SDK is used as it is.
//
// Node gives a child's stdio as socket pairs, not pipes, so through the wrapper this client
// takes the relay's write path where pipe clients take tee(2).

import { createHash } from "node:crypto";
import { createInterface } from "node:readline";

const BIG_BYTES = 5_000_000;
const IN_FLIGHT = 20;
const USAGE =
  "usage: stdio_client.mjs transcript <echo text> -- <command> [args...]" +
  " | session <calls> [--env NAME=VALUE]... -- <command> [args...]";

function usage() {
  console.error(USAGE);
  process.exit(2);
}

const [mode, ...rest] = process.argv.slice(2);
const dashes = rest.indexOf("--");
if (dashes < 1 || dashes === rest.length - 1) usage();
const [head, [command, ...args]] = [rest.slice(0, dashes), rest.slice(dashes + 1)];

const { Client } = await import("@modelcontextprotocol/sdk/client/index.js");
const { StdioClientTransport } = await import("@modelcontextprotocol/sdk/client/stdio.js");

const texts = (result) => result.content.filter((c) => c.type === "text").map((c) => c.text);
// Generous for a loaded machine: the SDK's default is 60 s per request.
const options = { timeout: 120_000 };

const clientInfo = { name: "typescript-interop-client", version: "1.0.0" };
const monotonicNs = () => Number(process.hrtime.bigint());

if (mode === "session") {
  const calls = Number(head[0]);
  const env = {};
  for (let i = 1; i < head.length; i += 2) {
    const pair = head[i + 1] ?? "";
    if (head[i] !== "--env" || !pair.includes("=")) usage();
    env[pair.slice(0, pair.indexOf("="))] = pair.slice(pair.indexOf("=") + 1);
  }
  if (!Number.isInteger(calls) || calls < 0) usage();
  const transport = new StdioClientTransport({ command, args, env, stderr: "inherit" });
  const client = new Client(clientInfo);
  await client.connect(transport);
  const t = performance.now();
  for (let i = 0; i < calls; i++) {
    const r = await client.callTool({ name: "echo", arguments: { message: `call ${i}` } });
    if (r.isError) {
      console.error(`echo call ${i} failed: ${JSON.stringify(r)}`);
      process.exit(1);
    }
  }
  const seconds = (performance.now() - t) / 1e3;
  process.stdout.write(JSON.stringify({ pid: transport.pid, calls, seconds }) + "\n");
  const lines = createInterface({ input: process.stdin });
  await new Promise((resolve) => lines.once("line", resolve));
  lines.close();
  let closeNs = null;
  transport._process?.stdin?.once("finish", () => (closeNs = monotonicNs()));
  await client.close();
  process.stdout.write(
    JSON.stringify({ close_ns: closeNs, context_exit_ns: monotonicNs() }) + "\n",
  );
  process.exit(0);
}
if (mode !== "transcript" || head.length !== 1) usage();
const echoText = head[0];

const transport = new StdioClientTransport({ command, args, stderr: "inherit" });
const client = new Client(clientInfo);
await client.connect(transport);
// The notifications are taken as the transport hands them to the SDK: the SDK dispatches
// notifications a tick later than responses, so a progress handler is already gone when the
// progress sent just before its answer is dispatched (direct as well as wrapped).
const logs = [];
const progress = [];
const dispatch = transport.onmessage;
transport.onmessage = (message, extra) => {
  if (message.method === "notifications/message") logs.push(message.params.data);
  if (message.method === "notifications/progress") progress.push(message.params.progress);
  dispatch(message, extra);
};

const call = (name, args, extra = {}) =>
  client.callTool({ name, arguments: args }, undefined, { ...options, ...extra });

const out = {};
out.tools = (await client.listTools()).tools.map((t) => t.name).sort();
out.echo = texts(await call("echo", { text: echoText }));
out.sum = texts(await call("sum", { a: 2, b: 40 }));
out.notify = texts(await call("notify", { count: 3 }, { onprogress: () => {} }));
const big = Buffer.from(texts(await call("big", { bytes: BIG_BYTES })).join(""), "utf8");
out.big = { bytes: big.length, sha256: createHash("sha256").update(big).digest("hex") };
try {
  const missing = await call("no-such-tool", {});
  out.missing = { isError: missing.isError === true };
} catch (e) {
  out.missing = { code: e.code };
}
const answers = await Promise.all(
  Array.from({ length: IN_FLIGHT }, (_, i) => call("echo", { text: `msg-${i}` })),
);
out.inFlight = answers.map(texts);
// The same closing call as the Python driver's, so both sessions make the same calls.
await call("sum", { a: 0, b: 0 });
await client.close();
out.logSteps = logs.map((d) => d.step).sort((a, b) => a - b);
out.progress = progress.map(Number).sort((a, b) => a - b);
process.stdout.write(JSON.stringify(out) + "\n");
process.exit(0);
