//! The legacy HTTP+SSE face against real peers (Python SDK FastMCP server and client,
//! server-everything in `sse` mode), over real loopback sockets.

mod support;

use std::process::Command;
use std::time::Duration;

use serde_json::{json, Value};
use support::*;

fn run_py(script: &str, args: &[String]) -> Value {
    let py = require_peers();
    let out = Command::new(py)
        .arg(repo().join("tests/peers").join(script))
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{script} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    serde_json::from_str(text.lines().last().expect("a JSON line")).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_sse_client_full_session_through_proxy_to_fastmcp() {
    let up = fastmcp().await;
    let dir = tempfile::tempdir().unwrap();
    let p = start_in_process(&up.sse_url(), dir.path(), |_| {}).await;
    let url = format!("http://{}/sse", p.addr);
    let out = tokio::task::spawn_blocking(move || {
        run_py(
            "sse_client_session.py",
            &[
                url,
                "--tick".into(),
                "4".into(),
                "--interval-ms".into(),
                "50".into(),
            ],
        )
    })
    .await
    .unwrap();
    assert_eq!(out["tools"], json!(["tick", "echo", "burst"]));
    assert_eq!(
        out["progress"],
        json!([
            [1, 4, "step 1"],
            [2, 4, "step 2"],
            [3, 4, "step 3"],
            [4, 4, "step 4"]
        ])
    );
    assert_eq!(out["logs"], json!(["tick 1", "tick 2", "tick 3", "tick 4"]));
    assert_eq!(out["result"], "done 4");
    // The session id the client saw is the proxy's (32 hex), never the upstream's.
    let sid = out["session_id"].as_str().unwrap();
    assert!(p
        .registry
        .log
        .get(&mcp_resume_proxy::log::cursor::SessionId::parse(sid).unwrap())
        .is_some());
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_sse_client_full_session_through_proxy_to_server_everything() {
    let up = everything().await;
    let dir = tempfile::tempdir().unwrap();
    let p = start_in_process(&up.sse_url(), dir.path(), |_| {}).await;
    let url = format!("http://{}/sse", p.addr);
    let out = tokio::task::spawn_blocking(move || run_py("everything_session.py", &[url]))
        .await
        .unwrap();
    assert!(
        out["tools"]
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t == "trigger-long-running-operation"),
        "{out}"
    );
    let progress: Vec<i64> = out["progress"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p[0].as_i64().unwrap())
        .collect();
    assert_eq!(progress, vec![1, 2, 3, 4], "{out}");
    assert_eq!(out["echo"], "Echo: hello");
    assert!(
        out["result"]
            .as_str()
            .unwrap()
            .contains("Long running operation completed"),
        "{out}"
    );
    p.stop().await;
}

/// Reads messages until the response to `id`, returning (event id, message) pairs.
async fn until_response(sse: &mut Sse, id: u64) -> Vec<(String, Value)> {
    let mut got = Vec::new();
    loop {
        let (eid, msg) = sse.message().await;
        let done = msg["id"] == id && (msg.get("result").is_some() || msg.get("error").is_some());
        got.push((eid, msg));
        if done {
            return got;
        }
    }
}

/// Disconnect in the middle of a tool call and resume with `Last-Event-ID`: the second connection
/// gets exactly the events the first missed — nothing missing, duplicated or reordered — and the
/// session (and its upstream link) is the same one.
async fn resume_mid_call(up: &Upstream, tool: &str, args: Value, steps: usize, expect_logs: bool) {
    let dir = tempfile::tempdir().unwrap();
    let p = start_in_process(&up.sse_url(), dir.path(), |_| {}).await;
    let base = format!("http://{}", p.addr);
    let (mut sse, url, first_id) = legacy_session(&base).await;
    let session = first_id.split(':').next().unwrap().to_string();
    assert_eq!(post(&url, &call(2, tool, args, Some("tok-2"))).await.0, 202);
    let mut seen = vec![(first_id.clone(), Value::Null)];
    let mut progress_seen = 0;
    while progress_seen < 2 {
        let (eid, msg) = sse.message().await;
        progress_seen += is_progress(&msg) as usize;
        seen.push((eid, msg));
    }
    let cut_at = seen.last().unwrap().0.clone();
    drop(sse); // the client vanishes mid-call
    tokio::time::sleep(Duration::from_millis(600)).await;

    let (mut sse, err) = Sse::get(&format!("{base}/sse"), &[("last-event-id", &cut_at)]).await;
    assert!(err.is_none(), "resume refused: {err:?}");
    let ep = sse.endpoint().await;
    assert_eq!(
        ep,
        format!("/messages?session_id={session}"),
        "same session after resume"
    );
    let rest = until_response(&mut sse, 2).await;
    let all: Vec<(String, Value)> = seen.into_iter().chain(rest).collect();

    // Ids: one session, seq strictly +1 across the cut (the legacy stream carries every event).
    let seqs: Vec<u64> = all.iter().map(|(id, _)| seq_of(id)).collect();
    for (i, w) in seqs.windows(2).enumerate() {
        assert_eq!(w[1], w[0] + 1, "gap or duplicate at {i}: {seqs:?}");
    }
    assert!(all.iter().all(|(id, _)| id.starts_with(&session)));
    // Content: every progress step exactly once, in order, then the result.
    let msgs: Vec<&Value> = all
        .iter()
        .skip(1)
        .map(|(_, m)| m)
        .filter(|m| m["method"] != "notifications/tools/list_changed")
        .collect();
    let progress: Vec<i64> = msgs
        .iter()
        .filter(|m| is_progress(m))
        .map(|m| m["params"]["progress"].as_f64().unwrap() as i64)
        .collect();
    assert_eq!(progress, (1..=steps as i64).collect::<Vec<_>>());
    assert!(msgs
        .iter()
        .filter(|m| is_progress(m))
        .all(|m| m["params"]["progressToken"] == "tok-2"));
    if expect_logs {
        let logs: Vec<String> = msgs
            .iter()
            .filter(|m| m["method"] == "notifications/message")
            .map(|m| m["params"]["data"].as_str().unwrap().to_string())
            .collect();
        assert_eq!(
            logs,
            (1..=steps).map(|i| format!("tick {i}")).collect::<Vec<_>>()
        );
    }
    let last = msgs.last().unwrap();
    assert_eq!(last["id"], 2);
    assert!(last["result"].is_object(), "{last}");
    let admin = format!("http://{}/metrics", p.admin_addr);
    assert_eq!(
        metric(&admin, "mcp_resume_resumes_total{facade=\"legacy\"}").await,
        1.0
    );
    assert!(metric(&admin, "mcp_resume_replayed_events_total").await >= 1.0);
    assert_eq!(
        metric(
            &admin,
            "mcp_resume_sessions_started_total{facade=\"legacy\"}"
        )
        .await,
        1.0
    );
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resume_mid_tool_call_fastmcp() {
    let up = fastmcp().await;
    resume_mid_call(&up, "tick", json!({"n": 6, "interval_ms": 250}), 6, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resume_mid_tool_call_server_everything() {
    let up = everything().await;
    resume_mid_call(
        &up,
        "trigger-long-running-operation",
        json!({"duration": 3, "steps": 6}),
        6,
        false,
    )
    .await;
}

async fn refusal(base: &str, lei: &str) -> (u16, Value) {
    let (s, h, body) = request(
        "GET",
        &format!("{base}/sse"),
        &[("last-event-id", lei), ("accept", "text/event-stream")],
        "",
    )
    .await;
    assert_eq!(h.get("content-type").unwrap(), "application/json");
    (s, serde_json::from_str(&body).unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_refusal_has_its_status_body_and_counter() {
    let up = fastmcp().await;
    let dir = tempfile::tempdir().unwrap();
    let p = start_in_process(&up.sse_url(), dir.path(), |c| {
        c.log.max_events_per_session = 10
    })
    .await;
    let base = format!("http://{}", p.addr);
    let admin = format!("http://{}/metrics", p.admin_addr);
    let (sse, url, first) = legacy_session(&base).await;
    let session = first.split(':').next().unwrap().to_string();
    let sid = mcp_resume_proxy::log::cursor::SessionId::parse(&session).unwrap();
    let sl = p.registry.log.get(&sid).unwrap();
    assert_eq!(
        post(&url, &call(2, "burst", json!({"n": 40}), None))
            .await
            .0,
        202
    );
    // Retention (10 events) is far below the burst: a reader this slow would be cut off, so wait
    // for the whole burst to be logged without reading.
    let mut head_rx = sl.subscribe();
    tokio::time::timeout(WAIT, head_rx.wait_for(|h| *h >= 42))
        .await
        .expect("burst logged")
        .unwrap();
    drop(sse);
    let head_seq = sl.head();
    let head = format!("{session}:1:{head_seq}");
    assert_eq!(head_seq, 42, "initialize result + 40 logs + result");

    let cases: Vec<(String, u16, &str)> = vec![
        ("not-a-cursor".into(), 400, "malformed_cursor"),
        (format!("{session}:1:x"), 400, "malformed_cursor"),
        (format!("{}:1:5", "0".repeat(32)), 404, "unknown_session"),
        (format!("{session}:1:2"), 409, "cursor_trimmed"),
        (format!("{session}:1:{}", head_seq + 1), 409, "cursor_ahead"),
        (format!("{session}:7:3"), 409, "unknown_epoch"),
    ];
    for (lei, status, reason) in &cases {
        let (s, body) = refusal(&base, lei).await;
        assert_eq!(s, *status, "{lei}: {body}");
        assert_eq!(body["jsonrpc"], "2.0");
        assert_eq!(body["id"], Value::Null);
        assert_eq!(body["error"]["code"], -32090);
        assert!(
            body["error"]["message"]
                .as_str()
                .unwrap()
                .starts_with("resume_gap: "),
            "{body}"
        );
        let data = &body["error"]["data"];
        assert_eq!(data["reason"], *reason, "{lei}: {body}");
        assert_eq!(data["last_event_id"], lei.as_str());
        if *reason == "cursor_trimmed" || *reason == "cursor_ahead" || *reason == "unknown_epoch" {
            assert_eq!(data["session_id"], session.as_str());
            assert_eq!(data["log_head"], head.as_str());
            let oldest = data["oldest_retained"].as_str().unwrap();
            assert!(
                seq_of(oldest) > 2 && seq_of(oldest) <= head_seq - 8,
                "trimmed to within bounds: {oldest}"
            );
            assert_eq!(
                body["error"]["message"],
                format!("resume_gap: cursor {lei} is not contiguous with log head {head}")
            );
        }
    }
    for (reason, n) in [
        ("malformed_cursor", 2.0),
        ("unknown_session", 1.0),
        ("cursor_trimmed", 1.0),
        ("cursor_ahead", 1.0),
        ("unknown_epoch", 1.0),
        ("foreign_session", 0.0),
    ] {
        assert_eq!(
            metric(
                &admin,
                &format!("mcp_resume_refusals_total{{reason=\"{reason}\"}}")
            )
            .await,
            n,
            "{reason}"
        );
    }
    // A cursor just inside the retained window is still served, from the exact next event.
    let oldest = p
        .registry
        .log
        .get(&mcp_resume_proxy::log::cursor::SessionId::parse(&session).unwrap())
        .unwrap()
        .ranges()
        .oldest;
    let (mut again, err) = Sse::get(
        &format!("{base}/sse"),
        &[("last-event-id", &format!("{session}:1:{}", oldest - 1))],
    )
    .await;
    assert!(err.is_none());
    again.endpoint().await;
    let (id, _) = again.message().await;
    assert_eq!(seq_of(&id), oldest);
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resume_of_a_live_stream_takes_it_over() {
    let up = fastmcp().await;
    let dir = tempfile::tempdir().unwrap();
    let p = start_in_process(&up.sse_url(), dir.path(), |_| {}).await;
    let base = format!("http://{}", p.addr);
    let (mut old, url, first) = legacy_session(&base).await;
    let (mut new, err) = Sse::get(&format!("{base}/sse"), &[("last-event-id", &first)]).await;
    assert!(err.is_none());
    new.endpoint().await;
    // The old (half-open) connection is closed by the takeover.
    assert!(old.next().await.is_none(), "old stream must end");
    assert_eq!(
        post(&url, &call(2, "echo", json!({"text": "hi"}), None))
            .await
            .0,
        202
    );
    let (id, msg) = new.message().await;
    assert_eq!(seq_of(&id), seq_of(&first) + 1);
    assert_eq!(msg["result"]["content"][0]["text"], "hi");
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_killed_mid_call_aborts_inflight_and_ends_session() {
    let mut up = fastmcp().await;
    let dir = tempfile::tempdir().unwrap();
    let p = start_in_process(&up.sse_url(), dir.path(), |_| {}).await;
    let base = format!("http://{}", p.addr);
    let admin = format!("http://{}/metrics", p.admin_addr);
    let (mut sse, url, first) = legacy_session(&base).await;
    assert_eq!(
        post(
            &url,
            &call(2, "tick", json!({"n": 50, "interval_ms": 100}), Some("t"))
        )
        .await
        .0,
        202
    );
    let mut live = vec![];
    while live
        .iter()
        .filter(|(_, m): &&(String, Value)| is_progress(m))
        .count()
        < 2
    {
        live.push(sse.message().await);
    }
    up.proc.kill(); // SIGKILL: the upstream session dies mid-call
    let rest = until_response(&mut sse, 2).await;
    let abort = &rest.last().unwrap().1;
    assert_eq!(abort["error"]["code"], -32091, "{abort}");
    assert_eq!(abort["error"]["data"]["reason"], "upstream_lost");
    assert!(
        sse.next().await.is_none(),
        "stream ends after the session ends"
    );
    live.extend(rest);
    // Later requests: 404 with a JSON-RPC body.
    let (s, body) = post(&url, &call(3, "echo", json!({"text": "x"}), None)).await;
    assert_eq!(s, 404, "{body}");
    // A late resumer gets the whole history, then the end.
    let (mut late, err) = Sse::get(&format!("{base}/sse"), &[("last-event-id", &first)]).await;
    assert!(err.is_none(), "{err:?}");
    late.endpoint().await;
    for (id, msg) in &live {
        let (rid, rmsg) = late.message().await;
        assert_eq!((&rid, &rmsg), (id, msg));
    }
    assert!(late.next().await.is_none());
    // Resuming at the very end: nothing left, the session is over.
    let (s, _, _) = request(
        "GET",
        &format!("{base}/sse"),
        &[("last-event-id", &live.last().unwrap().0)],
        "",
    )
    .await;
    assert_eq!(s, 404);
    assert_eq!(
        metric(
            &admin,
            "mcp_resume_sessions_ended_total{reason=\"upstream_lost\"}"
        )
        .await,
        1.0,
        "{}",
        http_get(&admin).await.1
    );
    assert_eq!(
        metric(&admin, "mcp_resume_inflight_aborted_total").await,
        1.0,
        "{}",
        http_get(&admin).await.1
    );
    assert_eq!(metric(&admin, "mcp_resume_sessions_active").await, 0.0);
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn post_to_sse_path_is_405_and_bad_posts_are_explained() {
    let up = fastmcp().await;
    let dir = tempfile::tempdir().unwrap();
    let p = start_in_process(&up.sse_url(), dir.path(), |_| {}).await;
    let base = format!("http://{}", p.addr);
    let (s, _) = post(&format!("{base}/sse"), &initialize(1)).await;
    assert_eq!(s, 405);
    let (s, b) = post(&format!("{base}/messages"), &initialize(1)).await;
    assert_eq!(s, 400, "{b}");
    let (s, b) = post(&format!("{base}/messages?session_id=zz"), &initialize(1)).await;
    assert_eq!(s, 400, "{b}");
    let (s, b) = post(
        &format!("{base}/messages?session_id={}", "a".repeat(32)),
        &initialize(1),
    )
    .await;
    assert_eq!(s, 404, "{b}");
    let (_sse, url, _) = legacy_session(&base).await;
    let (s, _, b) = request(
        "POST",
        &url,
        &[("content-type", "application/json")],
        "{not json",
    )
    .await;
    assert_eq!(s, 400);
    assert_eq!(
        serde_json::from_str::<Value>(&b).unwrap()["error"]["code"],
        -32700
    );
    p.stop().await;
}

/// The process-wide bound: ended sessions' logs are evicted first, then new sessions get 503.
/// (The embedded demo upstream is used for its `emit` and `misbehave close` tools — an upstream
/// that drops a session on demand — which the real peers cannot do.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn log_size_bound_evicts_ended_sessions_then_refuses_new_ones() {
    use mcp_resume_proxy::demo::upstream::{Upstream, UpstreamOptions};
    const MAX: u64 = 48 * 1024;
    let up = Upstream::spawn(UpstreamOptions::default()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let p = start_in_process(&up.sse_url(), dir.path(), |c| {
        c.log.max_bytes_per_session = MAX;
        c.log.max_total_bytes = MAX;
    })
    .await;
    let base = format!("http://{}", p.addr);
    let emit = |id, count| {
        call(
            id,
            "emit",
            json!({"count": count, "rate_per_sec": 0, "size": 1000}),
            None,
        )
    };
    let (mut a, url_a, first_a) = legacy_session(&base).await;
    post(&url_a, &emit(2, 20)).await;
    until_response(&mut a, 2).await;
    let (mut b, url_b, _) = legacy_session(&base).await;
    // Fill, an event at a time, until the log holds more than 90% of its bound (new sessions
    // are refused there) without reaching the bound (where live sessions would be trimmed).
    let mut id = 10;
    while p.registry.log.total_bytes() <= MAX - MAX / 10 {
        id += 1;
        post(&url_b, &emit(id, 1)).await;
        until_response(&mut b, id).await;
    }
    assert!(p.registry.log.total_bytes() <= MAX);
    // Both sessions are live: no room.
    let (s, _, body) = request("GET", &format!("{base}/sse"), &[], "").await;
    assert_eq!(s, 503, "{body}");
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap()["error"]["data"]["reason"],
        "capacity"
    );
    // Session A's upstream drops it: A ends, and its log is the first to go for a new session.
    post(
        &url_a,
        &call(3, "misbehave", json!({"kind": "close"}), None),
    )
    .await;
    let rest = until_response(&mut a, 3).await;
    assert_eq!(rest.last().unwrap().1["error"]["code"], -32091);
    let (mut c, _, _) = legacy_session(&base).await;
    drop(c.next_within(Duration::from_millis(10)).await);
    let (s, _, _) = request(
        "GET",
        &format!("{base}/sse"),
        &[("last-event-id", &first_a)],
        "",
    )
    .await;
    assert_eq!(s, 404, "A's log was evicted for space");
    p.stop().await;
}

/// Client disconnects never reach the upstream; only the idle TTL (no client attached) closes it.
/// (The embedded demo upstream is used because it can count its open upstream sessions.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_disconnect_keeps_upstream_open_until_idle_ttl() {
    use mcp_resume_proxy::demo::upstream::{Upstream, UpstreamOptions};
    let up = Upstream::spawn(UpstreamOptions::default()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let p = start_in_process(&up.sse_url(), dir.path(), |c| c.sessions.idle_ttl_secs = 2).await;
    let base = format!("http://{}", p.addr);
    let admin = format!("http://{}/metrics", p.admin_addr);
    let (sse, _url, first) = legacy_session(&base).await;
    assert_eq!(up.open_sessions(), 1);
    drop(sse);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        up.open_sessions(),
        1,
        "a client disconnect must not close the upstream session"
    );
    // Reattaching within the TTL keeps it alive.
    let (mut again, err) = Sse::get(&format!("{base}/sse"), &[("last-event-id", &first)]).await;
    assert!(err.is_none());
    again.endpoint().await;
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(
        up.open_sessions(),
        1,
        "a client is attached: no idle timeout"
    );
    drop(again);
    let deadline = tokio::time::Instant::now() + WAIT;
    while up.open_sessions() != 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "idle session never ended"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        metric(
            &admin,
            "mcp_resume_sessions_ended_total{reason=\"idle_timeout\"}"
        )
        .await,
        1.0
    );
    assert_eq!(metric(&admin, "mcp_resume_sessions_active").await, 0.0);
    p.stop().await;
}

/// A real `EventSource` (the `eventsource` package the TypeScript SDK uses) whose connection is cut
/// mid-call reconnects to the same URL with `Last-Event-ID` on its own, keeps its session (no new
/// one) and receives every remaining event exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eventsource_reconnects_into_the_same_session_without_loss() {
    use std::io::BufRead;
    let up = fastmcp().await;
    let dir = tempfile::tempdir().unwrap();
    let p = start_in_process(&up.sse_url(), dir.path(), |_| {}).await;
    let relay = Relay::start(p.addr).await;
    let mut child = Command::new("node")
        .arg(repo().join("tests/peers/eventsource_client.mjs"))
        .arg(format!("http://{}/sse", relay.addr))
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("node");
    let stdout = child.stdout.take().unwrap();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Value>();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            if tx.send(serde_json::from_str(&line).unwrap()).is_err() {
                return;
            }
        }
    });
    let mut endpoints = Vec::new();
    let mut messages: Vec<(String, Value)> = Vec::new();
    let mut opens = 0;
    let base = format!("http://{}", p.addr);
    loop {
        let ev = tokio::time::timeout(WAIT, rx.recv())
            .await
            .expect("event in time")
            .expect("client alive");
        if ev["open"] == true {
            opens += 1;
        } else if ev["event"] == "endpoint" {
            endpoints.push(ev["data"].as_str().unwrap().to_string());
            if endpoints.len() == 1 {
                let url = format!("{base}{}", endpoints[0]);
                assert_eq!(post(&url, &initialize(1)).await.0, 202);
                assert_eq!(post(&url, &initialized()).await.0, 202);
                assert_eq!(
                    post(
                        &url,
                        &call(2, "tick", json!({"n": 6, "interval_ms": 400}), Some("es"))
                    )
                    .await
                    .0,
                    202
                );
            }
        } else if ev["event"] == "message" {
            let msg: Value = serde_json::from_str(ev["data"].as_str().unwrap()).unwrap();
            let done = msg["id"] == 2;
            messages.push((ev["id"].as_str().unwrap().to_string(), msg));
            if messages.iter().filter(|(_, m)| is_progress(m)).count() == 2 && opens == 1 {
                relay.sever(); // the network drops the connection mid-call
            }
            if done {
                break;
            }
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    assert!(opens >= 2, "the EventSource reconnected by itself");
    assert!(
        endpoints.iter().all(|e| e == &endpoints[0]),
        "one session throughout: {endpoints:?}"
    );
    let seqs: Vec<u64> = messages.iter().map(|(id, _)| seq_of(id)).collect();
    assert_eq!(
        seqs,
        (1..=seqs.len() as u64).collect::<Vec<_>>(),
        "every event exactly once, in order"
    );
    let progress: Vec<i64> = messages
        .iter()
        .filter(|(_, m)| is_progress(m))
        .map(|(_, m)| m["params"]["progress"].as_f64().unwrap() as i64)
        .collect();
    assert_eq!(progress, vec![1, 2, 3, 4, 5, 6]);
    assert_eq!(
        messages.last().unwrap().1["result"]["content"][0]["text"],
        "done 6"
    );
    assert_eq!(
        metric(
            &format!("http://{}/metrics", p.admin_addr),
            "mcp_resume_sessions_started_total{facade=\"legacy\"}"
        )
        .await,
        1.0
    );
    p.stop().await;
}
