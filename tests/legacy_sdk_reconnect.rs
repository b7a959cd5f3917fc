//! What the SDKs' own legacy HTTP+SSE clients do when their connection is cut mid-call, through
//! the legacy face (`/sse`) in front of FastMCP — measured, for the README's client table:
//!
//! - TypeScript SDK 1.32.2 `SSEClientTransport`: its `EventSource` reconnects, but the reconnect
//!   carries no `Last-Event-ID` (so the proxy cannot resume it; the call's remaining events are
//!   lost to it);
//! - Python SDK 1.30 `sse_client`: does not reconnect at all.
//!
//! (A plain `EventSource` *does* resume: `tests/legacy.rs`.) These tests pin today's behaviour of
//! the pinned SDKs; if an SDK starts resuming, they fail and the README table needs updating.
//!
//! Run: `cargo test --test legacy_sdk_reconnect` (after `scripts/install-peers`).

mod support;

use std::process::Command;
use std::time::Duration;

use serde_json::Value;
use support::*;

/// Runs `cmd` through a relay, cuts every connection after the second progress line, waits for
/// the client to finish; returns its lines and what it sent after the cut.
async fn cut_mid_call(mut cmd: Command, relay: &Relay) -> (Vec<Value>, Vec<String>) {
    cmd.arg(format!("http://{}/sse", relay.addr)).args([
        "--n",
        "10",
        "--interval-ms",
        "300",
        "--timeout",
        "12",
    ]);
    let mut p = Proc::spawn("legacy SDK client", cmd);
    let mut lines = Vec::new();
    let mut before = 0;
    loop {
        let Some(l) = p.line_async().await else { break };
        let v: Value = serde_json::from_str(&l).unwrap_or_else(|e| panic!("bad line ({e}): {l}"));
        let progress = v["event"] == "progress";
        lines.push(v);
        if progress && lines.iter().filter(|v| v["event"] == "progress").count() == 2 {
            before = relay.client_bytes().len();
            assert!(relay.sever() >= 1, "something to cut");
        }
        if lines
            .last()
            .is_some_and(|v| v.get("result").is_some() || v.get("error").is_some())
        {
            break;
        }
    }
    let _ = p.wait();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let after = relay.client_bytes().split_off(before);
    (lines, after)
}

fn gets(sent: &[String]) -> Vec<&String> {
    sent.iter().filter(|c| c.starts_with("GET ")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ts_sse_client_transport_reconnects_without_last_event_id() {
    let up = fastmcp().await;
    let dir = tempfile::tempdir().unwrap();
    let proxy = start_in_process(&up.sse_url(), dir.path(), |_| {}).await;
    let relay = Relay::start(proxy.addr).await;
    let _ = node_modules();
    let mut cmd = Command::new("node");
    cmd.arg(peers_dir().join("sse_transport_client.mjs"));
    let (lines, after) = cut_mid_call(cmd, &relay).await;
    let reconnects = gets(&after);
    assert!(!reconnects.is_empty(), "it reconnects: {after:?} {lines:?}");
    for g in &reconnects {
        assert!(
            !g.to_ascii_lowercase().contains("last-event-id"),
            "no Last-Event-ID on the reconnect: {g}"
        );
    }
    assert!(
        lines.last().is_some_and(|v| v.get("result").is_none()),
        "the call does not complete for it: {lines:?}"
    );
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_sse_client_does_not_reconnect() {
    let up = fastmcp().await;
    let dir = tempfile::tempdir().unwrap();
    let proxy = start_in_process(&up.sse_url(), dir.path(), |_| {}).await;
    let relay = Relay::start(proxy.addr).await;
    let mut cmd = Command::new(python());
    cmd.arg(peers_dir().join("sse_client_cut.py"));
    let (lines, after) = cut_mid_call(cmd, &relay).await;
    assert!(
        gets(&after).is_empty(),
        "no new GET after the cut: {after:?}"
    );
    assert!(
        lines.last().is_some_and(|v| v.get("result").is_none()),
        "the call does not complete for it: {lines:?}"
    );
    proxy.stop().await;
}
