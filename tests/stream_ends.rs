//! Every stream ends (design.md §10; issue 9, point 4): a resume from an ended session's last
//! event is 404, never an endless stream; an upstream response the proxy cannot parse answers its
//! request with -32092; `upstream.request_timeout_secs` answers a request still unanswered with
//! -32093, once, durably, and drops the late response. Real loopback sockets; real peers, except
//! where a peer cannot do what the test needs on demand (said at the test).

mod support;

use std::time::Duration;

use mcp_resume_proxy::demo::upstream::{Upstream as DemoUpstream, UpstreamOptions};
use mcp_resume_proxy::log::cursor::SessionId;
use mcp_resume_proxy::log::Kind as EventKind;
use serde_json::{json, Value};
use support::streamable::{Client, Proxy};
use support::*;

/// Waits (bounded) until `series` at the admin `url` satisfies `ok`.
async fn wait_metric(url: &str, series: &str, ok: impl Fn(f64) -> bool) -> f64 {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let v = metric(url, series).await;
        if ok(v) {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{series} stuck at {v}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The id of the end marker of ended session `session` (its log's head), checked to be one.
fn end_marker(p: &mcp_resume_proxy::app::Running, session: &str) -> String {
    let sid = SessionId::parse(session).unwrap();
    let sl = p.registry.log.get(&sid).expect("log kept");
    let head = sl.head();
    let ev = p
        .registry
        .log
        .read_held(&sl, head - 1, 1)
        .unwrap()
        .into_iter()
        .next()
        .unwrap();
    assert_eq!(ev.kind, EventKind::End, "the head of an ended session");
    sl.event_id(ev.epoch, head)
}

/// A GET that must be answered 404 `unknown_session` at once (not a 200 stream).
async fn gone(r: Resp, what: &str) {
    assert_eq!(r.status, 404, "{what}");
    let v = r.json().await;
    assert_eq!(
        v["error"]["data"]["reason"], "unknown_session",
        "{what}: {v}"
    );
}

// ---------------------------------------------------------------------------------------------
// 1a: resumes after the end

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn legacy_resume_from_the_end_marker_is_404() {
    let mut up = fastmcp().await;
    let dir = tempfile::tempdir().unwrap();
    let p = start_in_process(&up.sse_url(), dir.path(), |_| {}).await;
    let base = format!("http://{}", p.addr);
    let (mut sse, url, first) = legacy_session(&base).await;
    let session = first[..32].to_string();
    assert_eq!(
        post(&url, &call(2, "echo", json!({"text": "hi"}), None))
            .await
            .0,
        202
    );
    let (last, msg) = sse.message().await;
    assert_eq!(msg["id"], 2, "{msg}");

    // The upstream goes away: the session ends (nothing in flight, so only the end marker).
    up.proc.kill();
    assert!(rest_of_stream(&mut sse).await.is_empty());
    let marker = end_marker(&p, &session);
    assert_eq!(seq_of(&marker), seq_of(&last) + 1);

    let get = |cursor: String| {
        let addr = p.addr;
        async move {
            send(
                addr,
                "GET",
                "/sse",
                &[("accept", "text/event-stream"), ("last-event-id", &cursor)],
                None,
            )
            .await
        }
    };
    // From the end marker itself (before: 200 and keepalives forever).
    gone(get(marker.clone()).await, "cursor = end marker").await;
    // From the last message: nothing but the end is left.
    gone(get(last.clone()).await, "cursor = last message").await;
    // From earlier: the rest is replayed and the stream ends.
    let mut again = Sse::get(&format!("{base}/sse"), &[("last-event-id", &first)])
        .await
        .0;
    assert_eq!(
        again.endpoint().await,
        format!("/messages?session_id={session}")
    );
    let rest = rest_of_stream(&mut again).await;
    assert_eq!(rest.len(), 1);
    assert_eq!(rest[0].0, last);
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamable_resume_from_the_end_marker_is_404() {
    let up = fastmcp().await;
    let proxy = Proxy::start(&up, |_| {}).await;
    let (mut c, _) = Client::init(proxy.addr(), "2025-11-25").await;
    let (id, mut s) = c.call("echo", json!({"text": "x"}), "t").await;
    let evs = s.rest().await;
    let response = evs.last().unwrap();
    assert_eq!(response.json()["id"], id);
    assert_eq!(c.delete().await.status, 200);
    let marker = end_marker(&proxy.running, &c.session);

    // From the end marker (before: 409 unknown_epoch), and from the response after which only
    // the end is left: the session is over.
    gone(c.get(Some(&marker)).await, "cursor = end marker").await;
    gone(c.get(response.id.as_deref()).await, "cursor = response").await;
    // From the priming event: the response is replayed, then the stream ends.
    let r = c.get(evs[0].id.as_deref()).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.sse().rest().await, evs[1..].to_vec());
    proxy.stop().await;
}

// ---------------------------------------------------------------------------------------------
// 1b: an unparseable upstream response

/// The embedded demo upstream is the declared mock here: no real peer sends a broken response on
/// demand; its `misbehave {kind: "malformed_response"}` answers the call with bytes that are not
/// JSON but start like a response with the call's id.
fn malformed_call(id: u64) -> Value {
    call(
        id,
        "misbehave",
        json!({"kind": "malformed_response"}),
        Some("m"),
    )
}

fn assert_bad_event_answer(msg: &Value, id: u64) {
    assert_eq!(msg["jsonrpc"], "2.0", "{msg}");
    assert_eq!(msg["id"], id, "{msg}");
    assert_eq!(msg["error"]["code"], -32092, "{msg}");
    assert_eq!(msg["error"]["data"]["reason"], "bad_event", "{msg}");
    assert!(
        msg["error"]["data"]["bytes"].as_u64().unwrap() > 30,
        "{msg}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn legacy_unparseable_response_answers_its_request_with_32092() {
    let up = DemoUpstream::spawn(UpstreamOptions::default())
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let p = start_in_process(&up.sse_url(), dir.path(), |_| {}).await;
    let base = format!("http://{}", p.addr);
    let admin = format!("http://{}/metrics", p.admin_addr);
    let (mut sse, url, first) = legacy_session(&base).await;

    assert_eq!(post(&url, &malformed_call(2)).await.0, 202);
    let (answer_id, msg) = sse.message().await;
    assert_eq!(
        seq_of(&answer_id),
        seq_of(&first) + 1,
        "the bad bytes took no seq"
    );
    assert_bad_event_answer(&msg, 2);
    // The session goes on.
    assert_eq!(
        post(&url, &call(3, "echo", json!({"text": "after"}), None))
            .await
            .0,
        202
    );
    let (_, msg) = sse.message().await;
    assert_eq!(msg["id"], 3, "{msg}");
    assert_eq!(msg["result"]["content"][0]["text"], "after");
    for (series, v) in [
        ("mcp_resume_upstream_errors_total{kind=\"bad_event\"}", 1.0),
        ("mcp_resume_dropped_total{reason=\"bad_event\"}", 1.0),
    ] {
        assert_eq!(metric(&admin, series).await, v, "{series}");
    }
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamable_unparseable_response_ends_its_post_stream() {
    let up = DemoUpstream::spawn(UpstreamOptions::default())
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let p = start_in_process(&up.sse_url(), dir.path(), |_| {}).await;
    let admin = format!("http://{}/metrics", p.admin_addr);
    let (mut c, _) = Client::init(p.addr, "2025-11-25").await;
    let mut g = c.get(None).await.sse();
    assert!(g.next().await.expect("priming").is_priming());

    // Before: the bytes went to the GET stream and this POST stream waited forever.
    let (id, mut s) = c
        .call("misbehave", json!({"kind": "malformed_response"}), "m")
        .await;
    let evs = s.rest().await;
    assert_eq!(
        evs.len(),
        2,
        "priming, then the answer, then the end: {evs:?}"
    );
    assert!(evs[0].is_priming());
    assert_bad_event_answer(&evs[1].json(), id);

    // The standalone stream never saw it: the next thing there is the log of a later call.
    let (id2, mut s2) = c
        .call("count", json!({"n": 1, "interval_ms": 0}), "c")
        .await;
    let evs2 = s2.rest().await;
    assert_eq!(evs2.last().unwrap().json()["id"], id2);
    let seen = g
        .until(|e| e.json()["method"] == "notifications/message")
        .await;
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(seen[0].json()["params"]["data"]["request"], id2);
    assert_eq!(
        metric(
            &admin,
            "mcp_resume_upstream_errors_total{kind=\"bad_event\"}"
        )
        .await,
        1.0
    );
    p.stop().await;
}

// ---------------------------------------------------------------------------------------------
// 1c: upstream.request_timeout_secs

/// FastMCP's `tick` (a real peer) answers after `n × interval_ms`; with a 1 s request timeout a
/// 3 × 1 s tick is answered by the proxy first, and the upstream's own response comes late.
fn slow_tick(id: u64) -> Value {
    call(id, "tick", json!({"n": 3, "interval_ms": 1000}), Some("k"))
}

fn assert_timeout_answer(msg: &Value, id: u64) {
    assert_eq!(msg["id"], id, "{msg}");
    assert_eq!(msg["error"]["code"], -32093, "{msg}");
    assert_eq!(msg["error"]["data"]["reason"], "request_timeout", "{msg}");
    assert_eq!(msg["error"]["data"]["timeout_secs"], 1, "{msg}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn legacy_request_timeout_answers_once_and_drops_the_late_response() {
    let up = fastmcp().await;
    let dir = tempfile::tempdir().unwrap();
    let p = start_in_process(&up.sse_url(), dir.path(), |c| {
        c.upstream.request_timeout_secs = 1
    })
    .await;
    let base = format!("http://{}", p.addr);
    let admin = format!("http://{}/metrics", p.admin_addr);
    let (mut sse, url, _) = legacy_session(&base).await;
    // A quick request is not affected.
    assert_eq!(
        post(&url, &call(2, "echo", json!({"text": "quick"}), None))
            .await
            .0,
        202
    );
    assert_eq!(sse.message().await.1["id"], 2);

    let started = tokio::time::Instant::now();
    assert_eq!(post(&url, &slow_tick(3)).await.0, 202);
    let mut seen: Vec<Value> = Vec::new();
    loop {
        let (_, m) = sse.message().await;
        let done = m["id"] == 3;
        seen.push(m);
        if done {
            break;
        }
    }
    let elapsed = started.elapsed();
    assert!(
        elapsed >= Duration::from_millis(900) && elapsed < Duration::from_millis(2900),
        "answered after {elapsed:?}"
    );
    assert_timeout_answer(seen.last().unwrap(), 3);
    assert_eq!(
        metric(
            &admin,
            "mcp_resume_upstream_errors_total{kind=\"request_timeout\"}"
        )
        .await,
        1.0
    );
    // The upstream's own response arrives ~3 s after the call: dropped, counted.
    wait_metric(
        &admin,
        "mcp_resume_dropped_total{reason=\"late_response\"}",
        |v| v == 1.0,
    )
    .await;
    // Everything delivered since, up to a later call's answer: no second answer to 3.
    assert_eq!(
        post(&url, &call(4, "echo", json!({"text": "later"}), None))
            .await
            .0,
        202
    );
    loop {
        let (_, m) = sse.message().await;
        assert_ne!(m["id"], 3, "a second answer to request 3: {m}");
        if m["id"] == 4 {
            break;
        }
    }
    assert_eq!(
        metric(
            &admin,
            "mcp_resume_upstream_errors_total{kind=\"request_timeout\"}"
        )
        .await,
        1.0
    );
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamable_request_timeout_ends_the_post_stream() {
    let up = fastmcp().await;
    let proxy = Proxy::start(&up, |c| c.upstream.request_timeout_secs = 1).await;
    let (mut c, _) = Client::init(proxy.addr(), "2025-11-25").await;
    let (id, mut s) = c
        .call("tick", json!({"n": 3, "interval_ms": 1000}), "k")
        .await;
    let evs = s.rest().await;
    let (last, before) = evs.split_last().unwrap();
    assert_timeout_answer(&last.json(), id);
    assert!(before[0].is_priming());
    assert!(
        before[1..]
            .iter()
            .all(|e| e.json()["method"] == "notifications/progress"),
        "{evs:?}"
    );
    assert_eq!(
        proxy
            .metric("mcp_resume_upstream_errors_total{kind=\"request_timeout\"}")
            .await,
        1.0
    );
    let admin = format!("http://{}/metrics", proxy.running.admin_addr);
    wait_metric(
        &admin,
        "mcp_resume_dropped_total{reason=\"late_response\"}",
        |v| v == 1.0,
    )
    .await;
    // The late response reached no stream: the standalone stream has the tool's logs (and the
    // progress that came after the timeout), never a response to the call.
    let mut g = c.get(None).await.sse();
    let mut standalone = Vec::new();
    while let Ok(Some(e)) = g.next_within(Duration::from_millis(700)).await {
        if !e.is_priming() {
            standalone.push(e.json());
        }
    }
    assert!(
        standalone
            .iter()
            .filter(|m| m["method"] == "notifications/message")
            .count()
            == 3,
        "{standalone:?}"
    );
    assert!(standalone.iter().all(|m| m["id"] != id), "{standalone:?}");
    // A POST-stream resume from the priming event replays the one answer, then ends.
    let r = c.get(evs[0].id.as_deref()).await;
    assert_eq!(r.sse().rest().await, evs[1..].to_vec());
    proxy.stop().await;
}

/// The timeout answer completes the request's in-flight record durably: after a SIGKILL and a
/// restart on the same data dir, recovery does not answer it a second time (-32091).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_timeout_answer_survives_a_crash_without_a_second_answer() {
    let up = fastmcp().await;
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let extra = [("[upstream]", "request_timeout_secs = 1")];
    let mut proxy = ProxyProc::start(&up.sse_url(), &data, &extra).await;
    let (mut sse, url, first) = legacy_session(&proxy.base()).await;
    let tick = call(2, "tick", json!({"n": 2, "interval_ms": 3000}), Some("k"));
    assert_eq!(post(&url, &tick).await.0, 202);
    let answer = loop {
        let (id, m) = sse.message().await;
        if m["id"] == 2 {
            break (id, m);
        }
    };
    assert_timeout_answer(&answer.1, 2);
    proxy.proc.kill(); // SIGKILL, long before the upstream's own response (6 s)
    drop(sse);

    let proxy = ProxyProc::start(&up.sse_url(), &data, &extra).await;
    let (mut again, err) = Sse::get(
        &format!("{}/sse", proxy.base()),
        &[("last-event-id", &first)],
    )
    .await;
    assert!(err.is_none(), "{err:?}");
    again.endpoint().await;
    let history = rest_of_stream(&mut again).await;
    let answers: Vec<_> = history.iter().filter(|(_, m)| m["id"] == 2).collect();
    assert_eq!(answers.len(), 1, "one answer to request 2: {history:?}");
    assert_eq!(answers[0], &answer);
    assert!(
        history.iter().all(|(_, m)| m["error"]["code"] != -32091),
        "nothing left in flight to abort: {history:?}"
    );
}
