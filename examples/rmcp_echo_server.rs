//! A small MCP stdio server built on the official Rust SDK (rmcp), for interoperability tests:
//! the wrapper must be invisible between an rmcp client and this server.
//!
//! Tools: `echo {text}` → the text; `sum {a, b}` → a+b; `notify {count}` → sends `count`
//! logging notifications (and progress notifications when the call carries a progress token)
//! before answering; `big {bytes}` → a text of that many bytes (multi-MB frames through the
//! relay). Speaks both protocol eras (initialize and server/discover) as rmcp does.

// Logging notifications are deprecated by the newest protocol era (SEP-2577) but still sent
// by servers in the field, so the relay must carry them.
#![allow(deprecated)]

use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{
    Implementation, LoggingLevel, LoggingMessageNotificationParam, ProgressNotificationParam,
    RequestMetaObject, ServerCapabilities, ServerConfig,
};
use rmcp::{
    schemars, tool, tool_handler, tool_router, ErrorData, Peer, RoleServer, ServerHandler,
    ServiceExt,
};

/// Name in `serverInfo`, checked by the tests.
const SERVER_NAME: &str = "rmcp-echo";

#[derive(Debug, serde::Deserialize, schemars::JsonSchema)]
struct EchoArgs {
    text: String,
}

#[derive(Debug, serde::Deserialize, schemars::JsonSchema)]
struct SumArgs {
    a: i64,
    b: i64,
}

#[derive(Debug, serde::Deserialize, schemars::JsonSchema)]
struct NotifyArgs {
    count: u32,
}

#[derive(Debug, serde::Deserialize, schemars::JsonSchema)]
struct BigArgs {
    bytes: usize,
}

#[derive(Debug, Clone)]
struct EchoServer {
    #[allow(dead_code)] // read by the code #[tool_handler] generates
    tool_router: ToolRouter<Self>,
}

#[tool_router]
impl EchoServer {
    fn new() -> Self {
        EchoServer {
            tool_router: Self::tool_router(),
        }
    }

    #[tool(description = "Echo the text back")]
    fn echo(&self, Parameters(EchoArgs { text }): Parameters<EchoArgs>) -> String {
        text
    }

    #[tool(description = "Add two integers")]
    fn sum(&self, Parameters(SumArgs { a, b }): Parameters<SumArgs>) -> String {
        (a + b).to_string()
    }

    #[tool(description = "Send `count` logging (and progress) notifications, then answer")]
    async fn notify(
        &self,
        Parameters(NotifyArgs { count }): Parameters<NotifyArgs>,
        meta: RequestMetaObject,
        peer: Peer<RoleServer>,
    ) -> Result<String, ErrorData> {
        let token = meta.get_progress_token();
        for step in 0..count {
            peer.notify_logging_message(
                LoggingMessageNotificationParam::new(
                    LoggingLevel::Info,
                    serde_json::json!({ "step": step }),
                )
                .with_logger("rmcp-echo"),
            )
            .await
            .map_err(|e| ErrorData::internal_error(e.to_string(), None))?;
            if let Some(token) = &token {
                peer.notify_progress(
                    ProgressNotificationParam::new(token.clone(), f64::from(step + 1))
                        .with_total(f64::from(count)),
                )
                .await
                .map_err(|e| ErrorData::internal_error(e.to_string(), None))?;
            }
        }
        Ok(format!("sent {count}"))
    }

    /// Every 10 bytes of the text say where they stand (`000000010|`, ...), so a client that
    /// got a chunk twice, lost one or got them out of order sees a different text from the one
    /// it can compute for itself.
    #[tool(description = "Answer with a text of `bytes` bytes, each 10 stamped with its offset")]
    fn big(&self, Parameters(BigArgs { bytes }): Parameters<BigArgs>) -> String {
        let mut text = String::with_capacity(bytes + 10);
        let mut at = 0;
        while text.len() < bytes {
            text.push_str(&format!("{at:09}|"));
            at += 10;
        }
        text.truncate(bytes);
        text
    }
}

#[tool_handler]
impl ServerHandler for EchoServer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_logging()
                .build(),
        )
        .with_server_info(Implementation::new(SERVER_NAME, env!("CARGO_PKG_VERSION")))
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let service = EchoServer::new().serve(rmcp::transport::stdio()).await?;
    service.waiting().await?;
    Ok(())
}
