//! Interop of the Streamable HTTP face with the real SDK clients, each in front of both real legacy
//! upstreams (Python FastMCP and server-everything in `sse` mode):
//!
//! - the TypeScript SDK `Client` + `StreamableHTTPClientTransport`: a full session and a long tool
//!   call with progress whose connection the test severs mid-call (through a TCP relay between the
//!   client and the proxy); the SDK resumes by itself with its resumption token (GET +
//!   `Last-Event-ID`), and every progress notification and the result arrive exactly once, in order;
//! - the Python SDK `streamablehttp_client`: a full session and a tool call with progress.
//!
//! Run: `cargo test --test streamable_sdk` (after `scripts/install-peers`).

mod support;

use serde_json::Value;
use support::streamable::*;
use support::*;

fn parse(line: &str) -> Value {
    serde_json::from_str(line)
        .unwrap_or_else(|e| panic!("peer printed a non-JSON line ({e}): {line}"))
}

async fn ts_cut_mid_call(kind: Kind) {
    let up = Upstream::start(kind);
    let proxy = Proxy::start(&up, |_| {}).await;
    let relay = Relay::start(proxy.addr()).await;
    let steps = 8;
    let (tool, args) = kind.long_call(steps);
    let logs = kind.long_logs(steps);
    let echo = kind.echo_args("after the cut").to_string();
    let n_logs = logs.len().to_string();
    let mut client = ts_client(
        &format!("http://{}/mcp", relay.addr),
        tool,
        &args,
        &["--echo", &echo, "--expect-logs", &n_logs],
    );

    // Watch the client's progress lines; cut every connection after the second one.
    let mut seen_progress = 0;
    let mut severed = 0;
    let out = loop {
        let line = client
            .line_async()
            .await
            .unwrap_or_else(|| panic!("client exited early (status {:?})", client.wait()));
        let v = parse(&line);
        if v["event"] == "progress" {
            seen_progress += 1;
            if seen_progress == 2 {
                severed = relay.sever();
            }
        }
        if v.get("result").is_some() {
            break v;
        }
    };
    assert_eq!(client.wait(), Some(0), "client exit status");
    assert!(severed >= 1, "the cut closed the call's connection");

    // Every progress notification and the result exactly once, in order.
    let want: Vec<f64> = (1..=steps).map(f64::from).collect();
    assert_eq!(progress_values(&out["progress"]), want, "{out}");
    assert_eq!(out["result"], kind.long_result(steps));
    let call_id = out["call_id"].clone();
    let msgs = out["messages"].as_array().expect("messages");
    let progress_msgs: Vec<f64> = msgs
        .iter()
        .filter(|m| m["method"] == "notifications/progress")
        .map(|m| m["progress"].as_f64().expect("progress"))
        .collect();
    assert_eq!(
        progress_msgs, want,
        "progress as the transport delivered it: {out}"
    );
    let responses = msgs
        .iter()
        .filter(|m| m["response"] == true && m["id"] == call_id)
        .count();
    assert_eq!(responses, 1, "the call's response exactly once: {out}");
    assert_eq!(out["echo"], kind.echo_result("after the cut"));
    assert_eq!(
        out["logs"],
        serde_json::json!(logs),
        "standalone stream logs exactly once: {out}"
    );
    assert_eq!(out["deleted"], true);
    assert_eq!(out["protocol_version"], "2025-11-25");

    // The resumption: a GET carrying a resumption token the SDK had reported for the call, and
    // nothing delivered twice on the call's stream (tokens strictly increase).
    let tokens: Vec<String> = out["tokens"]
        .as_array()
        .expect("tokens")
        .iter()
        .map(|t| t.as_str().expect("token").to_string())
        .collect();
    let seqs: Vec<u64> = tokens.iter().map(|t| seq_of(t)).collect();
    assert!(
        seqs.windows(2).all(|w| w[0] < w[1]),
        "tokens strictly increase: {tokens:?}"
    );
    let resumed_with: Vec<String> = relay
        .client_bytes()
        .iter()
        .flat_map(|c| {
            c.lines()
                .filter_map(|l| {
                    let (k, v) = l.split_once(':')?;
                    k.eq_ignore_ascii_case("last-event-id")
                        .then(|| v.trim().to_string())
                })
                .collect::<Vec<_>>()
        })
        .collect();
    assert!(
        resumed_with.iter().any(|t| tokens.contains(t)),
        "the SDK resumed the call with one of its resumption tokens {tokens:?}; Last-Event-IDs sent: {resumed_with:?}"
    );
    assert!(
        proxy
            .metric("mcp_resume_resumes_total{facade=\"streamable\"}")
            .await
            >= 1.0,
        "resume counted"
    );
    assert_eq!(
        proxy
            .metric("mcp_resume_sessions_started_total{facade=\"streamable\"}")
            .await,
        1.0
    );
    assert_eq!(
        proxy
            .metric("mcp_resume_sessions_ended_total{reason=\"client_delete\"}")
            .await,
        1.0
    );
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ts_sdk_resumes_a_cut_call_fastmcp() {
    ts_cut_mid_call(Kind::FastMcp).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ts_sdk_resumes_a_cut_call_everything() {
    ts_cut_mid_call(Kind::Everything).await;
}

async fn python_session(kind: Kind) {
    let up = Upstream::start(kind);
    let proxy = Proxy::start(&up, |_| {}).await;
    let steps = 4;
    let (tool, args) = kind.long_call(steps);
    let logs = kind.long_logs(steps);
    let echo = kind.echo_args("hello").to_string();
    let n_logs = logs.len().to_string();
    let mut client = py_client(
        &proxy.url(),
        tool,
        &args,
        &["--echo", &echo, "--expect-logs", &n_logs],
    );
    let line = client
        .line_async()
        .await
        .unwrap_or_else(|| panic!("client failed (status {:?})", client.wait()));
    assert_eq!(client.wait(), Some(0));
    let out = parse(&line);
    let want: Vec<f64> = (1..=steps).map(f64::from).collect();
    assert_eq!(progress_values(&out["progress"]), want, "{out}");
    assert_eq!(out["result"], kind.long_result(steps));
    assert_eq!(out["echo"], kind.echo_result("hello"));
    assert_eq!(out["logs"], serde_json::json!(logs));
    assert!(
        out["tools"].as_array().unwrap().iter().any(|t| t == tool),
        "{out}"
    );
    assert_eq!(out["protocol_version"], "2025-11-25");
    let sid = out["session_id"].as_str().expect("session id");
    assert!(
        sid.len() == 32 && sid.bytes().all(|b| b.is_ascii_hexdigit()),
        "{sid}"
    );
    assert_eq!(
        proxy
            .metric("mcp_resume_sessions_started_total{facade=\"streamable\"}")
            .await,
        1.0
    );
    // Leaving the client context DELETEs the session.
    assert_eq!(
        proxy
            .metric("mcp_resume_sessions_ended_total{reason=\"client_delete\"}")
            .await,
        1.0
    );
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_sdk_session_fastmcp() {
    python_session(Kind::FastMcp).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_sdk_session_everything() {
    python_session(Kind::Everything).await;
}
