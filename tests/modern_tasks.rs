//! The Tasks extension on the 2026-07-28 face, driven by the real `@modelcontextprotocol/ext-tasks`
//! 0.2.2 client (`tests/peers/node-modern/tasks_client.mjs`) through the proxy binary in front of
//! FastMCP (`--modern-tools`: `slow(seconds)`):
//!
//! - a long call becomes a task (`tasks.mode = "after"`); the client goes away;
//! - the proxy is SIGKILLed and restarted on the same data dir: the task that finished before the
//!   kill still returns its result, the unfinished one is `failed` with -32091 (never `working`);
//! - another identity's `tasks/get` is answered exactly as an unknown task;
//! - `tasks/cancel` ends a live task `cancelled`;
//! - a task past `tasks.ttl_secs` is gone.
//!
//! Run: `cargo test --test modern_tasks` (after `scripts/install-peers`).

mod support;

use std::process::Command;
use std::time::Duration;

use serde_json::{json, Value};
use support::*;

fn tasks_client(url: &str, args: &[&str], auth: &str) -> Value {
    let dir = peers_dir().join("node-modern");
    assert!(
        dir.join("node_modules/@modelcontextprotocol/ext-tasks/package.json")
            .exists(),
        "test peer missing: @modelcontextprotocol/ext-tasks in tests/peers/node-modern — run scripts/install-peers"
    );
    let out = Command::new("node")
        .current_dir(&dir)
        .arg("tasks_client.mjs")
        .arg(url)
        .args(args)
        .args(["--auth", auth, "--timeout", "60"])
        .output()
        .expect("node runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout.lines().last().unwrap_or_else(|| {
        panic!(
            "tasks client printed nothing (status {:?}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        )
    });
    serde_json::from_str(line).unwrap_or_else(|e| panic!("bad line ({e}): {line}"))
}

async fn client(url: &str, args: Vec<String>, auth: &str) -> Value {
    let (url, auth) = (url.to_string(), auth.to_string());
    tokio::task::spawn_blocking(move || {
        let a: Vec<&str> = args.iter().map(String::as_str).collect();
        tasks_client(&url, &a, &auth)
    })
    .await
    .unwrap()
}

/// The ext-tasks client learns of tasks from `server/discover`: offered only in this mode.
const ADVERTISE: (&str, &str) = ("[modern]", "discover = \"advertise\"");

fn s(v: &[&str]) -> Vec<String> {
    v.iter().map(|x| x.to_string()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_survive_a_sigkill_of_the_proxy() {
    let up = tokio::task::spawn_blocking(fastmcp_modern).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let tasks = ("[tasks]", "mode = \"after\"\nafter_ms = 300");
    let mut proxy = ProxyProc::start(&up.sse_url(), &data, &[tasks, ADVERTISE]).await;
    let url = format!("{}/mcp", proxy.base());

    // A quick call stays a plain result; a slower one becomes a task and is followed to its end.
    let quick = client(&url, s(&["settle", "echo", r#"{"text":"now"}"#]), "alice").await;
    assert_eq!(quick["kind"], "immediate", "{quick}");
    let done = client(&url, s(&["settle", "slow", r#"{"seconds":1}"#]), "alice").await;
    assert_eq!(done["kind"], "task", "{done}");
    assert_eq!(done["outcome"]["status"], "completed", "{done}");
    let finished = done["taskId"].as_str().unwrap().to_string();
    assert_eq!(finished.len(), 32, "128-bit hex task id");

    // A long one: the client takes the handle and goes away.
    let long = client(&url, s(&["create", "slow", r#"{"seconds":60}"#]), "alice").await;
    assert_eq!(long["kind"], "task", "{long}");
    let unfinished = long["taskId"].as_str().unwrap().to_string();
    let snap = client(&url, s(&["snapshot", &unfinished]), "alice").await;
    assert_eq!(snap["status"], "working", "{snap}");

    // Another identity learns nothing.
    let other = client(&url, s(&["snapshot", &finished]), "mallory").await;
    assert_eq!(other["ok"], false, "{other}");
    assert_eq!(other["error"]["code"], -32602, "{other}");
    let unknown = client(
        &url,
        s(&["snapshot", "0123456789abcdef0123456789abcdef"]),
        "alice",
    )
    .await;
    assert_eq!(
        unknown["error"], other["error"],
        "unknown and foreign look alike"
    );

    let m = metric(
        &proxy.metrics_url(),
        "mcp_resume_tasks_total{status=\"created\"}",
    )
    .await;
    assert_eq!(m, 2.0);

    // SIGKILL, restart on the same data dir.
    proxy.proc.kill();
    let proxy = ProxyProc::start(&up.sse_url(), &data, &[tasks, ADVERTISE]).await;
    let url = format!("{}/mcp", proxy.base());

    let r = client(&url, s(&["result", &finished]), "alice").await;
    assert_eq!(r["outcome"]["status"], "completed", "{r}");
    assert_eq!(
        r["outcome"]["result"]["content"][0]["text"], "slept 1",
        "{r}"
    );
    let r = client(&url, s(&["result", &unfinished]), "alice").await;
    assert_eq!(r["outcome"]["status"], "failed", "{r}");
    assert_eq!(r["outcome"]["error"]["code"], -32091, "{r}");
    let snap = client(&url, s(&["snapshot", &unfinished]), "alice").await;
    assert_eq!(snap["status"], "failed", "{snap}");
    assert_eq!(snap["raw"]["error"]["code"], -32091, "{snap}");
    let other = client(&url, s(&["snapshot", &unfinished]), "mallory").await;
    assert_eq!(other["error"]["code"], -32602, "{other}");
    // The restarted proxy counts the task the kill left unfinished as failed (the failed-tasks
    // alert sees crashes too); the finished one was counted by the run that finished it.
    let m = metric(
        &proxy.metrics_url(),
        "mcp_resume_tasks_total{status=\"failed\"}",
    )
    .await;
    assert_eq!(m, 1.0);

    // Cancel a live task.
    let c = client(&url, s(&["create", "slow", r#"{"seconds":30}"#]), "alice").await;
    let cid = c["taskId"].as_str().unwrap().to_string();
    let cancelled = client(&url, s(&["cancel", &cid]), "alice").await;
    assert_eq!(cancelled["ok"], true, "{cancelled}");
    let r = client(&url, s(&["result", &cid]), "alice").await;
    assert_eq!(r["outcome"]["status"], "cancelled", "{r}");
    // Idempotent on a terminal task.
    let again = client(&url, s(&["cancel", &cid]), "alice").await;
    assert_eq!(again["status"], "cancelled", "{again}");
    let m = metric(
        &proxy.metrics_url(),
        "mcp_resume_tasks_total{status=\"cancelled\"}",
    )
    .await;
    assert_eq!(m, 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_expire_after_their_ttl() {
    let up = tokio::task::spawn_blocking(fastmcp_modern).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let proxy = start_in_process(&up.sse_url(), dir.path(), |c| {
        c.tasks.mode = mcp_resume_proxy::modern::tasks::TaskMode::Always;
        c.tasks.ttl_secs = 8;
        c.modern.discover = mcp_resume_proxy::modern::Discover::Advertise;
    })
    .await;
    let url = format!("http://{}/mcp", proxy.addr);
    let done = client(&url, s(&["settle", "echo", r#"{"text":"t"}"#]), "alice").await;
    assert_eq!(done["kind"], "task", "mode always: {done}");
    assert_eq!(done["lastTask"]["ttlMs"], json!(8000), "{done}");
    let id = done["taskId"].as_str().unwrap().to_string();
    let snap = client(&url, s(&["snapshot", &id]), "alice").await;
    assert_eq!(snap["status"], "completed", "{snap}");
    tokio::time::sleep(Duration::from_millis(8500)).await;
    let gone = client(&url, s(&["snapshot", &id]), "alice").await;
    assert_eq!(gone["error"]["code"], -32602, "{gone}");
    // The janitor removes it within a second or so of its expiry.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    let expired = loop {
        let text = proxy.metrics.render();
        let v = metric_value(&text, "mcp_resume_tasks_total{status=\"expired\"}");
        if v >= 1.0 || tokio::time::Instant::now() > deadline {
            break v;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(expired, 1.0);
    // An upstream elicitation inside a task: input_required, answered by tasks/update.
    let asked = client(&url, s(&["settle", "ask", r#"{"question":"q?"}"#]), "alice").await;
    assert_eq!(asked["kind"], "task", "{asked}");
    assert_eq!(asked["outcome"]["status"], "completed", "{asked}");
    assert_eq!(
        asked["outcome"]["result"]["content"][0]["text"], "answer: from tasks",
        "{asked}"
    );
    proxy.stop().await;
}
