//! SIGTERM shutdown of the proxy binary (issue 2, point 12), against the Python SDK's FastMCP
//! legacy SSE server: the in-flight request is answered, the client stream ends, the process exits
//! 0 within its grace period, and the next start keeps the epoch and replays the exact history.

mod support;

use std::time::Duration;

use serde_json::{json, Value};
use support::*;

const GRACE_SECS: u64 = 5;

/// Sends SIGTERM; returns the deadline for the exit: the grace period plus a little for the
/// process to tear down.
fn sigterm(proxy: &ProxyProc) -> tokio::time::Instant {
    proxy.proc.signal("TERM");
    tokio::time::Instant::now() + Duration::from_secs(GRACE_SECS + 3)
}

/// Waits (until `deadline`) for the exit; the status must be 0.
async fn wait_exit(proxy: &mut ProxyProc, deadline: tokio::time::Instant) {
    loop {
        if let Some(status) = proxy.proc.child.try_wait().unwrap() {
            assert!(status.success(), "proxy exited with {status} after SIGTERM");
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "proxy still running {GRACE_SECS} s (its grace period) after SIGTERM"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_answers_inflight_ends_streams_exits_zero_and_keeps_the_epoch() {
    let up = fastmcp().await;
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    // Relaxed durability: only a clean stop keeps the epoch, so a restart proves the stop was clean.
    let grace = format!("grace_secs = {GRACE_SECS}");
    let extra = [
        ("[log]", "durability = \"relaxed\""),
        ("[shutdown]", grace.as_str()),
    ];
    let mut proxy = ProxyProc::start(&up.sse_url(), &data, &extra).await;
    let (mut sse, url, first) = legacy_session(&proxy.base()).await;
    let session = first.split(':').next().unwrap().to_string();
    let tick = call(2, "tick", json!({"n": 100, "interval_ms": 100}), Some("t"));
    assert_eq!(post(&url, &tick).await.0, 202);
    let mut live: Vec<(String, Value)> = Vec::new();
    while live.iter().filter(|(_, m)| is_progress(m)).count() < 2 {
        live.push(sse.message().await);
    }

    let deadline = sigterm(&proxy);
    // The open client stream gets the rest, then the -32091 for the in-flight request, then ends.
    live.extend(rest_of_stream(&mut sse).await);
    wait_exit(&mut proxy, deadline).await;
    let (_, abort) = live.last().unwrap();
    assert_eq!(
        abort,
        &json!({"jsonrpc": "2.0", "id": 2, "error": {"code": -32091,
            "message": "request aborted: upstream session ended (shutdown)",
            "data": {"reason": "shutdown", "session_id": session}}}),
        "{live:?}"
    );
    let seqs: Vec<u64> = live.iter().map(|(id, _)| seq_of(id)).collect();
    assert_eq!(seqs, (2..2 + live.len() as u64).collect::<Vec<_>>());
    assert!(live
        .iter()
        .all(|(id, _)| id.starts_with(&format!("{session}:1:"))));

    // Restart on the same dir: the stop was clean, so nothing is sealed and the epoch stays 1;
    // nothing was live, so recovery ends nothing.
    let mut proxy = ProxyProc::start(&up.sse_url(), &data, &extra).await;
    let (base, admin) = (proxy.base(), proxy.metrics_url());
    for cursor in [first.as_str(), live[1].0.as_str()] {
        let (mut again, err) = Sse::get(&format!("{base}/sse"), &[("last-event-id", cursor)]).await;
        assert!(err.is_none(), "resume from {cursor} refused: {err:?}");
        assert_eq!(
            again.endpoint().await,
            format!("/messages?session_id={session}")
        );
        let from = live
            .iter()
            .position(|(id, _)| id == cursor)
            .map_or(0, |i| i + 1);
        assert_eq!(rest_of_stream(&mut again).await, live[from..]);
    }
    let (s, body) = post(
        &format!("{base}/messages?session_id={session}"),
        &call(3, "echo", json!({"text": "x"}), None),
    )
    .await;
    assert_eq!(s, 404, "{body}");
    for reason in ["upstream_lost", "shutdown"] {
        let series = format!("mcp_resume_sessions_ended_total{{reason=\"{reason}\"}}");
        assert_eq!(metric(&admin, &series).await, 0.0, "{series}");
    }
    assert_eq!(
        metric(&admin, "mcp_resume_inflight_aborted_total").await,
        0.0
    );

    let deadline = sigterm(&proxy);
    wait_exit(&mut proxy, deadline).await;
    let list = inspect(&data, None);
    let line = list
        .lines()
        .find(|l| l.starts_with(&session))
        .unwrap_or_else(|| panic!("session not listed:\n{list}"));
    let cols: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(cols[2], "ended:shutdown", "{line}");
    assert_eq!(cols.last(), Some(&"1[1..]"), "one open epoch: {line}");
    let events = inspect(&data, Some(&session));
    let ids: Vec<&str> = events
        .lines()
        .map(|l| l.split_whitespace().next().unwrap())
        .collect();
    let end_marker = format!("{session}:1:{}", live.len() + 2);
    let expected: Vec<&str> = std::iter::once(first.as_str())
        .chain(live.iter().map(|(id, _)| id.as_str()))
        .chain(std::iter::once(end_marker.as_str()))
        .collect();
    assert_eq!(ids, expected, "{events}");
}
