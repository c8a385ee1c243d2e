// Interop driver for tests/http_interop.rs, built on the official MCP TypeScript SDK.
//
//   node http_client.mjs serve-everything
//     Starts @modelcontextprotocol/server-everything in streamableHttp mode, bound to 127.0.0.1
//     on an ephemeral port (its own CLI binds every interface on $PORT), and prints
//     `LISTENING <port>` on stdout once it accepts.
//   node http_client.mjs client <url>
//     Runs a fixed conversation with the SDK's Streamable HTTP client and prints one JSON line:
//     what the client saw (results, errors, progress), the HTTP trace (method, JSON-RPC method,
//     status, content type, whether a session id came back) and the session id it was given.
//   node http_client.mjs bench <url> <calls>
//     For bench/http.rs: connects, makes one untimed call, then <calls> sequential
//     `tools/call` of echo, and prints one JSON line with the seconds those calls took.

import net from "node:net";

const [mode, url] = process.argv.slice(2);

if (mode === "serve-everything") {
  const listen = net.Server.prototype.listen;
  net.Server.prototype.listen = function (...args) {
    // Loopback only: the tests never open a port on another interface.
    if (typeof args[0] === "number" || (typeof args[0] === "string" && /^\d+$/.test(args[0]))) {
      const port = Number(args[0]);
      const rest = args.slice(1).filter((a) => typeof a === "function");
      this.once("listening", () => {
        process.stdout.write(`LISTENING ${this.address().port}\n`);
      });
      return listen.call(this, port, "127.0.0.1", ...rest);
    }
    return listen.apply(this, args);
  };
  process.env.PORT = "0";
  // The server's own entry point, with the streamableHttp transport.
  process.argv = [process.argv[0], "server-everything", "streamableHttp"];
  await import("@modelcontextprotocol/server-everything/dist/index.js").catch(async () =>
    import(new URL("./node_modules/@modelcontextprotocol/server-everything/dist/index.js", import.meta.url)),
  );
} else if (mode === "client") {
  const { Client } = await import("@modelcontextprotocol/sdk/client/index.js");
  const { StreamableHTTPClientTransport } = await import(
    "@modelcontextprotocol/sdk/client/streamableHttp.js"
  );

  const trace = new Set();
  const tracingFetch = async (input, init = {}) => {
    const method = (init.method || "GET").toUpperCase();
    let rpc = "";
    if (typeof init.body === "string") {
      try {
        const msg = JSON.parse(init.body);
        rpc = Array.isArray(msg) ? "batch" : msg.method || "response";
      } catch {
        rpc = "unparsed";
      }
    }
    const resp = await fetch(input, init);
    const ctype = (resp.headers.get("content-type") || "").split(";")[0].trim();
    trace.add(
      JSON.stringify({
        method,
        rpc,
        status: resp.status,
        contentType: ctype,
        sessionHeader: resp.headers.has("mcp-session-id"),
        contentLength: resp.headers.get("content-length") !== null && ctype === "text/event-stream",
      }),
    );
    return resp;
  };

  const transport = new StreamableHTTPClientTransport(new URL(url), { fetch: tracingFetch });
  const client = new Client({ name: "interop-client", version: "1.0.0" });
  const out = {};
  await client.connect(transport);
  out.sessionId = transport.sessionId ?? null;
  out.server = client.getServerVersion()?.name ?? null;
  out.tools = (await client.listTools()).tools.map((t) => t.name).sort();
  out.echo = await client.callTool({ name: "echo", arguments: { message: "through the proxy" } });
  out.sum = await client.callTool({ name: "get-sum", arguments: { a: 40, b: 2 } });
  let progress = 0;
  out.longRunning = await client.callTool(
    { name: "trigger-long-running-operation", arguments: { duration: 1, steps: 3 } },
    undefined,
    { onprogress: () => (progress += 1) },
  );
  out.progressNotifications = progress;
  try {
    out.missing = await client.callTool({ name: "no-such-tool", arguments: {} });
  } catch (e) {
    out.missing = { thrown: String(e.message || e) };
  }
  out.ping = await client.ping();
  await transport.terminateSession();
  await client.close();
  out.trace = [...trace].sort().map((s) => JSON.parse(s));
  process.stdout.write(JSON.stringify(out) + "\n");
  process.exit(0);
} else if (mode === "bench") {
  const calls = Number(process.argv[4]);
  const { Client } = await import("@modelcontextprotocol/sdk/client/index.js");
  const { StreamableHTTPClientTransport } = await import(
    "@modelcontextprotocol/sdk/client/streamableHttp.js"
  );
  const transport = new StreamableHTTPClientTransport(new URL(url));
  const client = new Client({ name: "interop-client", version: "1.0.0" });
  await client.connect(transport);
  const echo = (message) => client.callTool({ name: "echo", arguments: { message } });
  // One call before the clock starts, so connection set-up is not timed.
  await echo("warm-up");
  const t = performance.now();
  for (let i = 0; i < calls; i++) {
    const r = await echo(`call ${i}`);
    if (r.isError) {
      console.error(`echo call ${i} failed: ${JSON.stringify(r)}`);
      process.exit(1);
    }
  }
  const seconds = (performance.now() - t) / 1e3;
  await transport.terminateSession();
  await client.close();
  process.stdout.write(JSON.stringify({ calls, seconds }) + "\n");
  process.exit(0);
} else {
  console.error("usage: http_client.mjs serve-everything | client <url> | bench <url> <calls>");
  process.exit(2);
}
