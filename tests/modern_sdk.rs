//! The 2026-07-28 face with the real 2026-07-28 clients, each in front of both real legacy
//! upstreams (Python FastMCP with its `--modern-tools`, server-everything in `sse` mode):
//!
//! - TypeScript `@modelcontextprotocol/client@2.4.0` pinned to 2026-07-28
//!   (`tests/peers/node-modern/modern_ts_client.mjs`);
//! - Python `mcp==2.3.0` with `mode="2026-07-28"` (`tests/peers/modern_py_client.py`);
//! - both dual-era clients in their auto mode, which now negotiate 2026-07-28.
//!
//! Each client run covers discover (TS), list, a call, a call with progress, logLevel-gated
//! log messages (FastMCP), an MRTR round trip (elicitation through FastMCP's `ask`, sampling
//! through server-everything's `trigger-sampling-request`) and a `subscriptions/listen` stream
//! that receives `notifications/tools/list_changed`; the peer checks each step and the test
//! requires every step to pass.
//!
//! Run: `cargo test --test modern_sdk` (after `scripts/install-peers`).

mod support;

use std::process::Command;

use serde_json::Value;
use support::*;

/// Which 2026-07-28 client.
#[derive(Clone, Copy, Debug)]
enum Client {
    Ts,
    Py,
}

fn modern_python() -> std::path::PathBuf {
    let p = peers_dir().join(".venv-modern/bin/python");
    assert!(
        p.exists(),
        "test peer missing: Python venv with mcp==2.3.0 ({}) — run scripts/install-peers",
        p.display()
    );
    p
}

fn modern_node_dir() -> std::path::PathBuf {
    let d = peers_dir().join("node-modern");
    let pkg = d.join("node_modules/@modelcontextprotocol/client/package.json");
    assert!(
        pkg.exists(),
        "test peer missing: @modelcontextprotocol/client in tests/peers/node-modern — run scripts/install-peers"
    );
    d
}

async fn upstream(kind: Kind) -> Upstream {
    match kind {
        Kind::FastMcp => tokio::task::spawn_blocking(fastmcp_modern).await.unwrap(),
        Kind::Everything => everything().await,
    }
}

fn client_proc(client: Client, url: &str, kind: Kind, mode: Option<&str>) -> Proc {
    let kind = match kind {
        Kind::FastMcp => "fastmcp",
        Kind::Everything => "everything",
    };
    let mut c = match client {
        Client::Ts => {
            let dir = modern_node_dir();
            let mut c = Command::new("node");
            c.current_dir(&dir).arg(dir.join("modern_ts_client.mjs"));
            c
        }
        Client::Py => {
            let mut c = Command::new(modern_python());
            c.arg(peers_dir().join("modern_py_client.py"));
            c
        }
    };
    c.arg(url).arg(kind).args(["--timeout", "90"]);
    if let Some(m) = mode {
        c.args(["--mode", m]);
    }
    Proc::spawn(&format!("{client:?} 2026-07-28 client"), c)
}

/// Runs `client` through a fresh proxy in front of `kind`; every step must pass.
async fn run(client: Client, kind: Kind, mode: Option<&str>) {
    let up = upstream(kind).await;
    let dir = tempfile::tempdir().unwrap();
    // `advertise`: the TS client discovers first, and the dual-era clients are to take 2026-07-28
    // (with the default `resumable` they fall back to 2025-11-25: tests/modern_discover.rs).
    let proxy = start_in_process(&up.sse_url(), dir.path(), |c| {
        c.modern.discover = mcp_resume_proxy::modern::Discover::Advertise
    })
    .await;
    let url = format!("http://{}/mcp", proxy.addr);
    let mut p = client_proc(client, &url, kind, mode);
    let mut steps = Vec::new();
    let done = loop {
        let Some(line) = p.line_async().await else {
            panic!(
                "{client:?} client exited early (status {:?}); steps: {steps:#?}",
                p.wait()
            );
        };
        let v: Value = serde_json::from_str(&line)
            .unwrap_or_else(|e| panic!("peer printed a non-JSON line ({e}): {line}"));
        if v["done"] == true {
            break v;
        }
        steps.push(v);
    };
    let failed: Vec<&Value> = steps.iter().filter(|s| s["ok"] != true).collect();
    assert!(
        failed.is_empty(),
        "{client:?} in front of {kind:?}: failed steps {failed:#?}"
    );
    assert_eq!(done["failed"], serde_json::json!([]), "{steps:#?}");
    assert_eq!(p.wait(), Some(0), "client exit status");
    let names: Vec<&str> = steps.iter().filter_map(|s| s["step"].as_str()).collect();
    for want in ["connect", "list", "call", "progress", "mrtr", "listen"] {
        assert!(names.contains(&want), "step {want} ran: {names:?}");
    }
    if kind == Kind::FastMcp {
        assert!(names.contains(&"loglevel"), "{names:?}");
    }
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ts_pinned_through_fastmcp() {
    run(Client::Ts, Kind::FastMcp, None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ts_pinned_through_everything() {
    run(Client::Ts, Kind::Everything, None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_pinned_through_fastmcp() {
    run(Client::Py, Kind::FastMcp, None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_pinned_through_everything() {
    run(Client::Py, Kind::Everything, None).await;
}

/// The dual-era clients in auto mode (Python's default) probe with `server/discover` and, with
/// `modern.discover = "advertise"`, settle on 2026-07-28.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dual_era_clients_negotiate_2026() {
    run(Client::Ts, Kind::Everything, Some("auto")).await;
    run(Client::Py, Kind::FastMcp, Some("auto")).await;
}
