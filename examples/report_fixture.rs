//! A minimal newline-delimited JSON-RPC MCP server for the reporter pipeline tests.
//!
//! Answers `initialize` (serverInfo `payments`), `tools/list` (one tool, `issue_refund`) and
//! every `tools/call` with a small text result; ignores notifications; answers any other
//! request with JSON-RPC error -32601. One response line per request, written and flushed at
//! once. Exits 0 on stdin EOF. It is a stand-in, not a conformance target: the interop tests
//! use the official SDKs.

use std::io::{self, BufRead, Write};

use serde_json::{json, Value};

fn answer(req: &Value) -> Option<Value> {
    let id = req.get("id")?.clone();
    let method = req.get("method")?.as_str()?;
    let result = match method {
        "initialize" => json!({
            "protocolVersion": req["params"]["protocolVersion"].as_str().unwrap_or("2025-06-18"),
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "payments", "version": "1.0.0"}
        }),
        "tools/list" => json!({"tools": [{
            "name": "issue_refund",
            "description": "Refund a customer",
            "inputSchema": {"type": "object", "properties": {
                "amount_cents": {"type": "integer"},
                "currency": {"type": "string"},
                "customer_email": {"type": "string"},
                "reason": {"type": "string"}
            }}
        }]}),
        "tools/call" => json!({
            "content": [{"type": "text", "text": format!("done: {}", req["params"]["name"].as_str().unwrap_or("?"))}],
            "isError": false
        }),
        "ping" => json!({}),
        _ => {
            return Some(json!({"jsonrpc": "2.0", "id": id,
                "error": {"code": -32601, "message": "method not found"}}))
        }
    };
    Some(json!({"jsonrpc": "2.0", "id": id, "result": result}))
}

fn main() {
    let stdin = io::stdin();
    let mut out = io::stdout().lock();
    for line in stdin.lock().lines() {
        let Ok(line) = line else { return };
        let Ok(req) = serde_json::from_str::<Value>(&line) else {
            continue;
        };
        if let Some(resp) = answer(&req) {
            if writeln!(out, "{resp}").and_then(|_| out.flush()).is_err() {
                return;
            }
        }
    }
}
