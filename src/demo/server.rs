//! The demo's sample MCP server: a tiny payments-style tool server on stdio.
//!
//! Bundled in the binary (hidden argument `__demo-server`) so the demo needs nothing installed.
//! It speaks newline-delimited JSON-RPC 2.0 with just enough MCP for the scripted session:
//! `initialize`, `tools/list`, `tools/call` for `issue_refund`, `lookup_customer` (PII-shaped
//! arguments) and `void_payment` (always fails with `isError`), and `ping`. It is a fixture for
//! the demo, not a template for real servers: use an MCP SDK for those.

use std::io::{BufRead, Write};

use serde_json::{json, Value};

/// The protocol revision the sample server answers with.
const PROTOCOL: &str = "2025-06-18";

fn tools() -> Value {
    json!([
        {
            "name": "issue_refund",
            "description": "Refund part or all of a payment to the customer.",
            "inputSchema": {
                "type": "object",
                "properties": {
                    "amount_cents": {"type": "integer"},
                    "currency": {"type": "string"},
                    "customer_email": {"type": "string"},
                    "reason": {"type": "string"}
                },
                "required": ["amount_cents", "currency"]
            }
        },
        {
            "name": "lookup_customer",
            "description": "Find a customer record by e-mail or id.",
            "inputSchema": {
                "type": "object",
                "properties": {
                    "email": {"type": "string"},
                    "customer_id": {"type": "string"},
                    "phone": {"type": "string"}
                }
            }
        },
        {
            "name": "void_payment",
            "description": "Void an authorised card payment.",
            "inputSchema": {
                "type": "object",
                "properties": {
                    "payment_id": {"type": "string"},
                    "card_number": {"type": "string"}
                },
                "required": ["payment_id"]
            }
        }
    ])
}

fn call(name: &str, args: &Value) -> Result<Value, (i64, String)> {
    let text = |t: String, is_error: bool| json!({"content": [{"type": "text", "text": t}], "isError": is_error});
    match name {
        "issue_refund" => {
            let cents = args
                .get("amount_cents")
                .and_then(Value::as_i64)
                .unwrap_or(0);
            let cur = args
                .get("currency")
                .and_then(Value::as_str)
                .unwrap_or("USD");
            Ok(text(
                format!("refunded {}.{:02} {cur}", cents / 100, cents % 100),
                false,
            ))
        }
        "lookup_customer" => Ok(text(
            "customer cus_123: Jane Doe, 3 orders".to_string(),
            false,
        )),
        "void_payment" => Ok(text(
            "processor unavailable: payment not voided".to_string(),
            true,
        )),
        other => Err((-32602, format!("unknown tool {other}"))),
    }
}

fn answer(msg: &Value) -> Option<Value> {
    let id = msg.get("id")?.clone();
    let method = msg.get("method").and_then(Value::as_str)?;
    let params = msg.get("params").cloned().unwrap_or(Value::Null);
    let result = match method {
        "initialize" => Ok(json!({
            "protocolVersion": PROTOCOL,
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "demo-payments", "version": env!("CARGO_PKG_VERSION")}
        })),
        "tools/list" => Ok(json!({"tools": tools()})),
        "tools/call" => {
            let name = params.get("name").and_then(Value::as_str).unwrap_or("");
            call(name, params.get("arguments").unwrap_or(&Value::Null))
        }
        "ping" => Ok(json!({})),
        other => Err((-32601, format!("method not found: {other}"))),
    };
    Some(match result {
        Ok(r) => json!({"jsonrpc": "2.0", "id": id, "result": r}),
        Err((code, message)) => {
            json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}})
        }
    })
}

/// Serves stdin → stdout until EOF. Returns the exit code.
pub fn run() -> i32 {
    let stdin = std::io::stdin();
    let mut out = std::io::stdout().lock();
    for line in stdin.lock().lines() {
        let Ok(line) = line else { return 1 };
        let Ok(msg) = serde_json::from_str::<Value>(&line) else {
            continue;
        };
        if let Some(reply) = answer(&msg) {
            if writeln!(out, "{reply}").and_then(|_| out.flush()).is_err() {
                return 0;
            }
        }
    }
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refund_answers_with_amount() {
        let r = answer(&json!({"jsonrpc":"2.0","id":1,"method":"tools/call",
            "params":{"name":"issue_refund","arguments":{"amount_cents":4900,"currency":"EUR"}}}))
        .expect("a reply");
        assert_eq!(r["result"]["content"][0]["text"], "refunded 49.00 EUR");
        assert_eq!(r["result"]["isError"], false);
    }

    #[test]
    fn void_payment_fails_as_a_tool_error() {
        let r = answer(&json!({"jsonrpc":"2.0","id":"a","method":"tools/call",
            "params":{"name":"void_payment","arguments":{"payment_id":"p"}}}))
        .expect("a reply");
        assert_eq!(r["result"]["isError"], true);
    }

    #[test]
    fn notifications_get_no_reply() {
        assert!(answer(&json!({"jsonrpc":"2.0","method":"notifications/initialized"})).is_none());
    }
}
