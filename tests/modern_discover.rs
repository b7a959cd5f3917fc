//! `modern.discover` with the real dual-era clients (design.md §12b; issue 16, point 6): the Python
//! SDK `mcp==2.3.0` `Client` and `fastmcp==4.1.6`'s `Client` (both `auto` by default:
//! `tests/peers/dual_era_client.py`), and the TypeScript `@modelcontextprotocol/client@2.4.0` in
//! `auto` and pinned to 2026-07-28 (`tests/peers/node-modern/dual_era_client.mjs`), through the
//! proxy in front of FastMCP, each making a long call with progress whose connection the test
//! severs (a TCP relay between client and proxy) after the second progress notification.
//!
//! - `resumable` (the default): `server/discover` does not offer 2026-07-28, every dual-era client
//!   falls back to 2025-11-25 and the cut call completes: every progress notification exactly
//!   once, in order, then the result. A client pinned to 2026-07-28 without discovery (Python
//!   `mode="2026-07-28"`) is still served; the TS client pinned to 2026-07-28 discovers first and
//!   fails at connect, told why.
//! - `advertise`: the dual-era clients and the TS client pinned to 2026-07-28 negotiate
//!   2026-07-28; the cut loses the call (the spec's rule), which each client reports as an error —
//!   loudly, never a result that skipped (the TS client, auto or pinned, only at its request
//!   timeout).
//!
//! Run: `cargo test --test modern_discover` (after `scripts/install-peers`).

mod support;

use std::process::Command;

use mcp_resume_proxy::modern::Discover;
use serde_json::Value;
use support::*;

const STEPS: u64 = 8;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Peer {
    /// Python `mcp` 2.3.0's `Client`, with its `mode`.
    Mcp(&'static str),
    /// fastmcp 4.1.6's `Client` (`auto`).
    FastMcp,
    /// TypeScript 2.4.0, `auto` or `pin`.
    Ts(&'static str),
}

fn peer_proc(peer: Peer, url: &str) -> Proc {
    let steps = STEPS.to_string();
    let mut c = match peer {
        Peer::Mcp(_) | Peer::FastMcp => {
            let py = peers_dir().join(".venv-modern/bin/python");
            assert!(
                py.exists(),
                "test peer missing: {} — run scripts/install-peers",
                py.display()
            );
            let mut c = Command::new(py);
            c.arg(peers_dir().join("dual_era_client.py")).arg(url);
            match peer {
                Peer::Mcp(mode) => c.args(["--client", "mcp", "--mode", mode]),
                _ => c.args(["--client", "fastmcp", "--mode", "auto"]),
            };
            c
        }
        Peer::Ts(mode) => {
            let dir = peers_dir().join("node-modern");
            assert!(
                dir.join("node_modules/@modelcontextprotocol/client/package.json")
                    .exists(),
                "test peer missing: @modelcontextprotocol/client — run scripts/install-peers"
            );
            let mut c = Command::new("node");
            c.current_dir(&dir)
                .arg(dir.join("dual_era_client.mjs"))
                .arg(url)
                .args(["--mode", mode]);
            c
        }
    };
    c.args(["--steps", &steps]);
    Proc::spawn(&format!("{peer:?}"), c)
}

/// What a peer printed.
#[derive(Debug, Default)]
struct Run {
    version: Option<String>,
    connect_failed: Option<Value>,
    progress: Vec<u64>,
    call: Option<Value>,
    echo: Option<Value>,
    severed: usize,
}

/// Runs `peer` through a proxy in `mode` in front of FastMCP, severing every client connection
/// after the call's second progress notification.
async fn run(peer: Peer, mode: Discover) -> Run {
    let up = tokio::task::spawn_blocking(fastmcp_modern).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let proxy = start_in_process(&up.sse_url(), dir.path(), |c| c.modern.discover = mode).await;
    let relay = Relay::start(proxy.addr).await;
    let mut p = peer_proc(peer, &format!("http://{}/mcp", relay.addr));
    let mut r = Run::default();
    loop {
        let Some(line) = p.line_async().await else {
            panic!("{peer:?} exited early (status {:?}): {r:?}", p.wait());
        };
        let v: Value = serde_json::from_str(&line)
            .unwrap_or_else(|e| panic!("{peer:?} printed a non-JSON line ({e}): {line}"));
        if v["done"] == true {
            break;
        }
        match v["event"].as_str() {
            Some("connected") => r.version = v["version"].as_str().map(str::to_string),
            Some("connect_failed") => r.connect_failed = Some(v["error"].clone()),
            Some("progress") => {
                r.progress
                    .push(v["progress"].as_f64().expect("progress") as u64);
                if r.progress.len() == 2 {
                    r.severed = relay.sever();
                }
            }
            Some("call") => r.call = Some(v),
            Some("echo") => r.echo = Some(v),
            other => panic!("{peer:?}: unexpected line {other:?}: {v}"),
        }
    }
    assert_eq!(p.wait(), Some(0), "{peer:?} exit status");
    proxy.stop().await;
    r
}

/// The cut call completed exactly: progress 1..=STEPS once each, in order, then its result; the
/// client went on to a second call.
fn resumed_exactly(peer: Peer, r: &Run) {
    assert_eq!(r.version.as_deref(), Some("2025-11-25"), "{peer:?}: {r:?}");
    assert!(
        r.severed >= 1,
        "{peer:?}: the cut closed a connection: {r:?}"
    );
    let want: Vec<u64> = (1..=STEPS).collect();
    assert_eq!(
        r.progress, want,
        "{peer:?}: every progress once, in order: {r:?}"
    );
    let call = r.call.as_ref().expect("the call's outcome");
    assert_eq!(call["result"], format!("done {STEPS}"), "{peer:?}: {r:?}");
    assert_eq!(call["is_error"], false, "{peer:?}: {r:?}");
    assert_eq!(
        r.echo.as_ref().unwrap()["result"],
        "after the cut",
        "{peer:?}"
    );
}

/// The cut lost the call, and the client was told: an error, never a result.
fn lost_loudly(peer: Peer, r: &Run) {
    assert_eq!(r.version.as_deref(), Some("2026-07-28"), "{peer:?}: {r:?}");
    assert!(
        r.severed >= 1,
        "{peer:?}: the cut closed a connection: {r:?}"
    );
    let call = r.call.as_ref().expect("the call's outcome");
    let failed = call.get("error").is_some() || call["is_error"] == true;
    assert!(
        failed,
        "{peer:?}: a cut 2026-07-28 call must fail loudly: {r:?}"
    );
    assert_ne!(call["result"], format!("done {STEPS}"), "{peer:?}: {r:?}");
    assert!(
        r.progress.len() < STEPS as usize,
        "{peer:?}: progress after the cut: {r:?}"
    );
    assert_eq!(
        r.echo.as_ref().unwrap()["result"],
        "after the cut",
        "{peer:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resumable_python_mcp_auto_resumes_a_cut_call() {
    let peer = Peer::Mcp("auto");
    resumed_exactly(peer, &run(peer, Discover::Resumable).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resumable_fastmcp_client_resumes_a_cut_call() {
    let peer = Peer::FastMcp;
    resumed_exactly(peer, &run(peer, Discover::Resumable).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resumable_ts_auto_resumes_a_cut_call() {
    let peer = Peer::Ts("auto");
    resumed_exactly(peer, &run(peer, Discover::Resumable).await);
}

/// Pinned clients in `resumable` mode: one that sends requests straight away is served (its cut
/// call is lost loudly, as 2026-07-28 says); one that discovers first is refused at connect with
/// the reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resumable_pinned_clients() {
    let peer = Peer::Mcp("2026-07-28");
    lost_loudly(peer, &run(peer, Discover::Resumable).await);
    let peer = Peer::Ts("pin");
    let r = run(peer, Discover::Resumable).await;
    let e = r.connect_failed.as_ref().expect("connect fails");
    let msg = e["message"].as_str().unwrap_or_default();
    assert!(msg.contains("resumable"), "told why: {e}");
    assert!(r.call.is_none(), "{r:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn advertise_dual_era_clients_lose_a_cut_call_loudly() {
    for peer in [Peer::Mcp("auto"), Peer::FastMcp, Peer::Ts("auto")] {
        let t = std::time::Instant::now();
        let r = run(peer, Discover::Advertise).await;
        lost_loudly(peer, &r);
        eprintln!("{peer:?}: lost loudly in {:?}: {r:?}", t.elapsed());
    }
}

/// The TypeScript client pinned to 2026-07-28 under `advertise`: it discovers 2026-07-28 and
/// connects; its cut call is lost — the spec's rule for a broken response stream of a call that
/// did not become a task (this client does not declare the tasks extension). Exactly what it
/// sees: the two progress notifications read before the cut, then nothing until its own request
/// timeout (`--call-timeout-ms`, 15 s here) fails the call with the SDK's `REQUEST_TIMEOUT` — the
/// broken stream itself does not fail the pending request in this client; the next call on the
/// same client is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn advertise_ts_pinned_loses_a_cut_call_at_its_request_timeout() {
    let peer = Peer::Ts("pin");
    let r = run(peer, Discover::Advertise).await;
    assert!(r.connect_failed.is_none(), "{r:?}");
    lost_loudly(peer, &r);
    assert_eq!(r.progress, vec![1, 2], "{r:?}");
    assert_eq!(
        r.call.as_ref().unwrap()["error"],
        serde_json::json!({"code": "REQUEST_TIMEOUT", "message": "Request timed out", "name": "SdkError"}),
        "{r:?}"
    );
}
