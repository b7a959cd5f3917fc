//! Raw 2026-07-28 requests for the pool and limits tests (tests/modern_limits.rs,
//! tests/adversary16.rs): the envelope, the headers the ladder wants, a POST from a [`Target`]
//! (any loopback address), and the embedded demo upstream they run in front of.

use mcp_resume_proxy::demo::upstream::{Upstream, UpstreamOptions};
use serde_json::{json, Value};

use super::security::Target;
use super::Resp;

/// The protocol version.
pub const V: &str = "2026-07-28";
const TASKS: &str = "io.modelcontextprotocol/tasks";

/// A modern request; `tasks` declares the tasks extension.
pub fn req(id: Value, method: &str, mut params: Value, tasks: bool) -> Value {
    let mut caps = json!({});
    if tasks {
        caps["extensions"] = json!({TASKS: {}});
    }
    params["_meta"] = json!({
        "io.modelcontextprotocol/protocolVersion": V,
        "io.modelcontextprotocol/clientCapabilities": caps,
        "io.modelcontextprotocol/clientInfo": {"name": "limits", "version": "0"},
    });
    json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params})
}

/// A `tools/call` of `tool`.
pub fn call(id: i64, tool: &str, args: Value, tasks: bool) -> Value {
    req(
        json!(id),
        "tools/call",
        json!({"name": tool, "arguments": args}),
        tasks,
    )
}

/// A `subscriptions/listen` for tool list changes.
pub fn listen(id: &str) -> Value {
    req(
        json!(id),
        "subscriptions/listen",
        json!({"notifications": {"toolsListChanged": true}}),
        false,
    )
}

/// The headers of a modern POST of `msg` (with `bearer` as `Authorization`, if any).
pub fn headers<'a>(msg: &'a Value, bearer: &'a Option<String>) -> Vec<(&'a str, &'a str)> {
    let mut h: Vec<(&str, &str)> = vec![
        ("content-type", "application/json"),
        ("accept", "application/json, text/event-stream"),
        ("mcp-protocol-version", V),
        ("mcp-method", msg["method"].as_str().unwrap_or("")),
    ];
    if let Some(n) = msg["params"]["name"].as_str() {
        h.push(("mcp-name", n));
    }
    if let Some(b) = bearer {
        h.push(("authorization", b));
    }
    h
}

/// POSTs `msg` from `t` as `Bearer <auth>` (if any).
pub async fn post(t: &Target, msg: &Value, auth: Option<&str>) -> Resp {
    let bearer = auth.map(|a| format!("Bearer {a}"));
    let h = headers(msg, &bearer);
    t.send("POST", "/mcp", &h, Some(&msg.to_string())).await
}

/// A JSON answer (not a stream).
pub async fn answer(t: &Target, msg: &Value, auth: Option<&str>) -> Value {
    let r = post(t, msg, auth).await;
    assert_eq!(r.status, 200);
    r.json().await
}

/// The embedded demo upstream.
pub async fn demo() -> Upstream {
    Upstream::spawn(UpstreamOptions::default()).await.unwrap()
}
