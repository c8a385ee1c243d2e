//! Fixture: a hand-written stdio MCP server of the 2026-07-28 era (no `initialize`, no
//! server→client requests; multi round-trip tool calls instead).
//!
//! Answers, one JSON-RPC message per line:
//! * `server/discover` → `serverInfo {name: "era2026"}`, `supportedVersions: ["2026-07-28"]`.
//! * `tools/list` → one tool, `book_table {party_size, date, guest_name, rounds?}`.
//! * `tools/call book_table` → first `{resultType: "input_required", inputRequests, requestState:
//!   "round-1"}`; the client retries with a new id, echoing `requestState` and sending
//!   `inputResponses`; after `rounds` rounds (default 1) the final result comes, with `delay_ms`
//!   (argument, default 0) slept before it.
//! * `tools/call export {bytes, is_error}` → a result whose text is `bytes` bytes long, written
//!   in the TypeScript SDK's field order (`result` first, `id` last), with `isError` after the
//!   content: a large message whose facts sit at its end.
//! * `tools/call crash` → the process exits with code 3 without answering (a server dying
//!   mid-call).
//! * anything else with an id → JSON-RPC error −32601.
//!
//! Follows the draft's multi round-trip pattern (modelcontextprotocol/modelcontextprotocol,
//! docs/specification/draft/basic/utilities/mrtr.mdx), using the `resultType: "input_required"`
//! value of DESIGN §2a.

use std::io::{BufRead, Write};
use std::time::Duration;

use serde_json::{json, Value};

fn reply(out: &mut impl Write, v: &Value) -> std::io::Result<()> {
    let mut line = v.to_string();
    line.push('\n');
    out.write_all(line.as_bytes())?;
    out.flush()
}

fn call(id: &Value, params: &Value) -> Value {
    let args = &params["arguments"];
    let rounds = args["rounds"].as_u64().unwrap_or(1);
    let delay = args["delay_ms"].as_u64().unwrap_or(0);
    let done = params["requestState"]
        .as_str()
        .and_then(|s| s.strip_prefix("round-"))
        .and_then(|n| n.parse::<u64>().ok())
        .unwrap_or(0);
    if params["requestState"].is_string() && params.get("inputResponses").is_none() {
        return json!({"jsonrpc":"2.0","id":id,"error":{"code":-32602,"message":"inputResponses missing"}});
    }
    if done < rounds {
        return json!({"jsonrpc":"2.0","id":id,"result":{
            "resultType":"input_required",
            "inputRequests":{"confirm":{"method":"elicitation/create","params":{
                "mode":"form","message":"Confirm the booking?",
                "requestedSchema":{"type":"object","properties":{"ok":{"type":"boolean"}},"required":["ok"]}}}},
            "requestState": format!("round-{}", done + 1)
        }});
    }
    std::thread::sleep(Duration::from_millis(delay));
    json!({"jsonrpc":"2.0","id":id,"result":{
        "resultType":"complete",
        "content":[{"type":"text","text":format!("booked for {}", args["party_size"])}],
        "isError":false
    }})
}

fn main() -> std::io::Result<()> {
    let stdin = std::io::stdin();
    let mut out = std::io::stdout().lock();
    for line in stdin.lock().lines() {
        let line = line?;
        let Ok(msg) = serde_json::from_str::<Value>(&line) else {
            continue;
        };
        let Some(id) = msg.get("id").cloned() else {
            continue; // notification
        };
        let method = msg["method"].as_str().unwrap_or("");
        let answer = match method {
            "server/discover" => json!({"jsonrpc":"2.0","id":id,"result":{
                "resultType":"complete",
                "supportedVersions":["2026-07-28"],
                "capabilities":{"tools":{}},
                "serverInfo":{"name":"era2026","version":"1.0.0"}
            }}),
            "tools/list" => {
                json!({"jsonrpc":"2.0","id":id,"result":{"resultType":"complete","tools":[{
                    "name":"book_table",
                    "description":"Books a table after the guest confirms",
                    "inputSchema":{"type":"object","properties":{
                        "party_size":{"type":"integer"},"date":{"type":"string"},
                        "guest_name":{"type":"string"},"rounds":{"type":"integer"},"delay_ms":{"type":"integer"}}}
                }]}})
            }
            "tools/call" if msg["params"]["name"] == "book_table" => call(&id, &msg["params"]),
            "tools/call" if msg["params"]["name"] == "crash" => std::process::exit(3),
            "tools/call" if msg["params"]["name"] == "export" => {
                let args = &msg["params"]["arguments"];
                let n = args["bytes"].as_u64().unwrap_or(0) as usize;
                let line = format!(
                    r#"{{"result":{{"content":[{{"type":"text","text":"{}"}}],"isError":{}}},"jsonrpc":"2.0","id":{id}}}"#,
                    "e".repeat(n),
                    args["is_error"].as_bool().unwrap_or(false)
                );
                out.write_all(line.as_bytes())?;
                out.write_all(b"\n")?;
                out.flush()?;
                continue;
            }
            _ => {
                json!({"jsonrpc":"2.0","id":id,"error":{"code":-32601,"message":"Method not found"}})
            }
        };
        reply(&mut out, &answer)?;
    }
    Ok(())
}
