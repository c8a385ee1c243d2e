// Interop driver for tests/stdio_sdk_clients.rs, built on the official MCP TypeScript SDK.
//
//   node stdio_client.mjs <echo text> <command> [args...]
//     The SDK's StdioClientTransport launches <command> (an rmcp_echo_server, directly or
//     wrapped) and runs the session tests/python/mcp_client.py's stdio-transcript runs: list
//     tools, echo <echo text>, sum, `notify` with progress and logging notifications, one large
//     answer (`big`, 5,000,000 bytes), an unknown tool, 20 echoes in flight at once, then close.
//     Prints one JSON line with what the client saw, in the same shape as the Python driver's.
//
// Node gives a child's stdio as socket pairs, not pipes, so through the wrapper this client
// takes the relay's write path where pipe clients take tee(2).

import { createHash } from "node:crypto";

const BIG_BYTES = 5_000_000;
const IN_FLIGHT = 20;

const [echoText, command, ...args] = process.argv.slice(2);
if (echoText === undefined || command === undefined) {
  console.error("usage: stdio_client.mjs <echo text> <command> [args...]");
  process.exit(2);
}

const { Client } = await import("@modelcontextprotocol/sdk/client/index.js");
const { StdioClientTransport } = await import("@modelcontextprotocol/sdk/client/stdio.js");

const texts = (result) => result.content.filter((c) => c.type === "text").map((c) => c.text);
// Generous for a loaded machine: the SDK's default is 60 s per request.
const options = { timeout: 120_000 };

const transport = new StdioClientTransport({ command, args, stderr: "inherit" });
const client = new Client({ name: "typescript-interop-client", version: "1.0.0" });
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
