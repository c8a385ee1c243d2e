//! Fixture: a payments MCP server on stdio, built with the official Rust SDK (rmcp).
//!
//! Used by the observer's integration tests through the real wrapper binary. Its tools cover
//! every outcome the observer must tell apart:
//!
//! * `issue_refund {amount_cents, currency, customer_email, reason}` — success; the arguments
//!   mix a capturable amount with PII.
//! * `lookup_customer {email, customer_id}` — success; PII-only arguments.
//! * `void_charge {charge_id}` — answers `result.isError: true`.
//! * `explode {}` — answers a JSON-RPC error (internal error, −32603).
//! * `slow {ms}` — sleeps `ms` milliseconds (cancellation and timing tests).
//! * `confirm_refund {amount_cents}` — asks the client for input (elicitation) mid-call.
//! * `summarize {text}` — asks the client for a completion (sampling) mid-call.
//!
//! The server name is `payments` (`serverInfo.name`). It writes nothing but JSON-RPC to stdout.

#![allow(deprecated)] // Sampling is deprecated in the 2026-07-28 era; this fixture is 2025-era.

use std::time::Duration;

use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{
    CallToolResult, ClientResult, ContentBlock, CreateMessageRequestParams, ElicitRequest,
    ElicitRequestParams, ElicitationAction, Implementation, SamplingMessage, ServerCapabilities,
    ServerConfig, ServerRequest,
};
use rmcp::service::RequestContext;
use rmcp::{tool, tool_handler, tool_router, ErrorData, RoleServer, ServerHandler, ServiceExt};
use schemars::JsonSchema;
use serde::Deserialize;

#[derive(Debug, Deserialize, JsonSchema)]
struct Refund {
    amount_cents: i64,
    currency: String,
    customer_email: String,
    reason: String,
}

#[derive(Debug, Deserialize, JsonSchema)]
struct Lookup {
    email: String,
    customer_id: String,
}

#[derive(Debug, Deserialize, JsonSchema)]
struct Charge {
    charge_id: String,
}

#[derive(Debug, Deserialize, JsonSchema)]
struct Slow {
    ms: u64,
}

#[derive(Debug, Deserialize, JsonSchema)]
struct Confirm {
    amount_cents: i64,
}

#[derive(Debug, Deserialize, JsonSchema)]
struct Summarize {
    text: String,
}

#[derive(Clone)]
struct Payments {
    tool_router: ToolRouter<Self>,
}

fn text(s: impl Into<String>) -> CallToolResult {
    CallToolResult::success(vec![ContentBlock::text(s.into())])
}

#[tool_router]
impl Payments {
    fn new() -> Self {
        Payments {
            tool_router: Self::tool_router(),
        }
    }

    #[tool(description = "Refund part or all of a charge to a customer")]
    async fn issue_refund(
        &self,
        Parameters(r): Parameters<Refund>,
    ) -> Result<CallToolResult, ErrorData> {
        // Touch every field so the fixture really consumes what it was sent.
        let n = r.customer_email.len() + r.reason.len();
        Ok(text(format!(
            "refunded {} {} ({n})",
            r.amount_cents, r.currency
        )))
    }

    #[tool(description = "Find a customer by e-mail or id")]
    async fn lookup_customer(
        &self,
        Parameters(l): Parameters<Lookup>,
    ) -> Result<CallToolResult, ErrorData> {
        Ok(text(format!("customer {} <{}>", l.customer_id, l.email)))
    }

    #[tool(description = "Void a charge (always refused by this fixture)")]
    async fn void_charge(
        &self,
        Parameters(c): Parameters<Charge>,
    ) -> Result<CallToolResult, ErrorData> {
        Ok(CallToolResult::error(vec![ContentBlock::text(format!(
            "charge {} cannot be voided",
            c.charge_id
        ))]))
    }

    #[tool(description = "Always fails with a JSON-RPC internal error")]
    async fn explode(&self) -> Result<CallToolResult, ErrorData> {
        Err(ErrorData::internal_error("the ledger is on fire", None))
    }

    #[tool(description = "Sleeps for ms milliseconds, then answers")]
    async fn slow(&self, Parameters(s): Parameters<Slow>) -> Result<CallToolResult, ErrorData> {
        tokio::time::sleep(Duration::from_millis(s.ms)).await;
        Ok(text(format!("slept {} ms", s.ms)))
    }

    #[tool(description = "Asks the user to confirm a refund before issuing it")]
    async fn confirm_refund(
        &self,
        Parameters(c): Parameters<Confirm>,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let schema = serde_json::from_value(serde_json::json!({
            "type": "object",
            "properties": {"confirm": {"type": "boolean"}},
            "required": ["confirm"]
        }))
        .map_err(|e| ErrorData::internal_error(e.to_string(), None))?;
        // The SDK's typed helper sits behind a feature this crate does not enable; the request
        // on the wire is the same.
        let request = ServerRequest::ElicitRequest(ElicitRequest::new(
            ElicitRequestParams::FormElicitationParams {
                meta: None,
                message: format!("Refund {} cents?", c.amount_cents),
                requested_schema: schema,
            },
        ));
        let answer = match context.peer.send_request(request).await {
            Ok(ClientResult::ElicitResult(r)) => r,
            Ok(_) => return Err(ErrorData::internal_error("unexpected answer", None)),
            Err(e) => return Err(ErrorData::internal_error(e.to_string(), None)),
        };
        Ok(match answer.action {
            ElicitationAction::Accept => text("refund confirmed"),
            _ => text("refund not confirmed"),
        })
    }

    #[tool(description = "Summarises a text with the client's model")]
    async fn summarize(
        &self,
        Parameters(s): Parameters<Summarize>,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let params = CreateMessageRequestParams::new(vec![SamplingMessage::user_text(s.text)], 32);
        let reply = context
            .peer
            .create_message(params)
            .await
            .map_err(|e| ErrorData::internal_error(e.to_string(), None))?;
        Ok(text(format!("summary from {}", reply.model)))
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for Payments {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("payments", "1.0.0"))
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let service = Payments::new().serve(rmcp::transport::stdio()).await?;
    service.waiting().await?;
    Ok(())
}
