//! Issue 10, "A session belongs to whoever opened it" (design.md §11), over real loopback sockets:
//! every attack refused with its documented status and body and counted, every legitimate path
//! still working — with the real SDK clients where a client is involved (TypeScript SDK on both
//! transports, Python SDK on Streamable HTTP), raw HTTP for the attacker.
//!
//! 1. identity binding on the legacy face;
//! 2. identity binding on the Streamable HTTP face;
//! 3. face binding;
//! 4. bearer sessions and `auth.require_identity`;
//! 5. no ids in the info log;
//! 6. Origin, Host and Content-Type;
//! 7. the upstream `endpoint` origin check;
//! 8. quotas and probe sessions;
//! 9. standalone stream takeover.
//!
//! TLS is in tests/tls.rs.
//!
//! Run: `cargo test --test security` (after `scripts/install-peers`).

mod support;

use std::net::SocketAddr;
use std::time::Duration;

use serde_json::{json, Value};
use support::security::*;
use support::*;

const A: (&str, &str) = ("authorization", "Bearer token-A-2b1c5d");
const B: (&str, &str) = ("authorization", "Bearer token-B-9e4d77");
const A_HEADER: &str = "Authorization: Bearer token-A-2b1c5d";

fn parse(line: &str) -> Value {
    serde_json::from_str(line)
        .unwrap_or_else(|e| panic!("peer printed a non-JSON line ({e}): {line}"))
}

fn addr_of(port: u16) -> SocketAddr {
    ([127, 0, 0, 1], port).into()
}

/// Reads legacy `message` events until the response to `id`; returns them all.
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

fn seqs(events: &[(String, Value)]) -> Vec<u64> {
    events.iter().map(|(id, _)| seq_of(id)).collect()
}

fn echo(id: u64, text: &str) -> String {
    tool_call(id, "echo", json!({ "text": text }))
}

/// Every byte the proxy sent its upstream (through the tap relay), as one string.
fn upstream_saw(tap: &Relay) -> String {
    tap.client_bytes().concat()
}

/// A proxy in-process in front of FastMCP, through a tap relay that records what the proxy sends
/// upstream. Returns (upstream, tap, proxy).
async fn fastmcp_proxy(
    tweak: impl FnOnce(&mut mcp_resume_proxy::config::Config),
) -> (Upstream, Relay, streamable::Proxy) {
    let up = fastmcp().await;
    let tap = Relay::start(addr_of(up.port)).await;
    let tap_url = format!("http://{}/sse", tap.addr);
    let proxy = streamable::Proxy::start(&up, |c| {
        c.upstream.sse_url = tap_url;
        tweak(c);
    })
    .await;
    (up, tap, proxy)
}

// ---------------------------------------------------------------------------------------------
// 1. Identity binding, legacy face

/// A legacy session opened with `Authorization: Bearer A`: another identity (and no identity) who
/// knows its id cannot resume it or post into it — 404 `unknown_session`, byte for byte the answer
/// for a session that does not exist — the victim's stream is untouched, the upstream never sees
/// the attacker's message, and each refusal is counted. The same identity cut and resumed gets the
/// exact continuation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn legacy_session_is_bound_to_its_identity() {
    let (_up, tap, proxy) = fastmcp_proxy(|_| {}).await;
    let t = Target::plain(proxy.addr());
    let admin = proxy.running.admin_addr;
    let (mut sse, sid, c1) = legacy_session_as(&t, &[A]).await;
    assert_eq!(metric_at(admin, AUTH_REJECTED_LEGACY).await, 0.0);

    // Resume attacks with the victim's real cursor: another identity, no identity.
    let fake = random_session();
    let unknown = refused(
        legacy_resume(&t, &[B], &format!("{fake}:1:1")).await,
        404,
        "unknown_session",
    )
    .await;
    let forged = c1.replace(&sid, &fake);
    let unknown_same_shape = refused(
        legacy_resume(&t, &[B], &forged).await,
        404,
        "unknown_session",
    )
    .await;
    for who in [&[B][..], &[][..]] {
        let r = legacy_resume(&t, who, &c1).await;
        let body = refused(r, 404, "unknown_session").await;
        // No existence oracle: the same answer as for a session nobody has, ids aside.
        assert_eq!(
            masked(&body.to_string(), &[&sid]),
            masked(&unknown_same_shape.to_string(), &[&fake]),
            "refusal differs from an unknown session's"
        );
        assert_eq!(body["error"]["code"], unknown["error"]["code"]);
    }
    assert_eq!(metric_at(admin, AUTH_REJECTED_LEGACY).await, 2.0);
    // Cursors the owner would get a 409 for (beyond the head, unknown epoch): still 404 for
    // anyone else, so the session's head and epochs cannot be probed either.
    for (cursor, owner_reason) in [
        (format!("{sid}:1:999999"), "cursor_ahead"),
        (format!("{sid}:7:1"), "unknown_epoch"),
    ] {
        refused(
            legacy_resume(&t, &[B], &cursor).await,
            404,
            "unknown_session",
        )
        .await;
        refused(legacy_resume(&t, &[A], &cursor).await, 409, owner_reason).await;
    }
    assert_eq!(metric_at(admin, AUTH_REJECTED_LEGACY).await, 4.0);

    // Post attacks: 404 exactly as for an unknown session; nothing reaches the upstream.
    let unknown_post = legacy_post(&t, &fake, &[B], &echo(66, "ATTACK-unknown")).await;
    let unknown_post = refused(unknown_post, 404, "unknown_session").await;
    for (i, who) in [&[B][..], &[][..]].into_iter().enumerate() {
        let r = legacy_post(&t, &sid, who, &echo(67 + i as u64, "ATTACK-post")).await;
        let body = refused(r, 404, "unknown_session").await;
        assert_eq!(body, unknown_post, "same body as an unknown session");
    }
    assert_eq!(metric_at(admin, AUTH_REJECTED_LEGACY).await, 6.0);

    // The victim's stream was neither closed nor taken over: it still carries its answers, and
    // nothing of the attacker's.
    assert_eq!(
        legacy_post(&t, &sid, &[A], &echo(5, "victim")).await.status,
        202
    );
    let got = until_response(&mut sse, 5).await;
    assert_eq!(got.len(), 1, "only the victim's answer: {got:?}");
    assert_eq!(got[0].1["result"]["content"][0]["text"], "victim");
    assert!(seq_of(&got[0].0) > seq_of(&c1));
    let saw = upstream_saw(&tap);
    assert!(
        saw.contains("\"victim\""),
        "the tap sees the victim's traffic"
    );
    assert!(
        !saw.contains("ATTACK-"),
        "an attacker's message reached the upstream"
    );

    // The same identity, cut mid-call and resumed: exact continuation.
    let call = support::call(6, "tick", json!({"n": 6, "interval_ms": 150}), Some("t6"));
    assert_eq!(
        legacy_post(&t, &sid, &[A], &call.to_string()).await.status,
        202
    );
    let mut before = Vec::new();
    while before
        .iter()
        .filter(|(_, m): &&(String, Value)| is_progress(m))
        .count()
        < 2
    {
        before.push(sse.message().await);
    }
    let last = before.last().unwrap().0.clone();
    sse.cut();
    let resumes = proxy
        .metric("mcp_resume_resumes_total{facade=\"legacy\"}")
        .await;
    let r = legacy_resume(&t, &[A], &last).await;
    assert_eq!(r.status, 200);
    let mut sse = r.legacy_sse();
    sse.endpoint().await;
    let after = until_response(&mut sse, 6).await;
    let all: Vec<(String, Value)> = before.into_iter().chain(after).collect();
    let s = seqs(&all);
    assert!(
        s.windows(2).all(|w| w[1] == w[0] + 1),
        "contiguous ids across the cut: {s:?}"
    );
    let progress: Vec<f64> = all
        .iter()
        .filter(|(_, m)| is_progress(m))
        .map(|(_, m)| m["params"]["progress"].as_f64().unwrap())
        .collect();
    assert_eq!(progress, vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let logs: Vec<&str> = all
        .iter()
        .filter(|(_, m)| m["method"] == "notifications/message")
        .map(|(_, m)| m["params"]["data"].as_str().unwrap())
        .collect();
    assert_eq!(
        logs,
        ["tick 1", "tick 2", "tick 3", "tick 4", "tick 5", "tick 6"]
    );
    assert_eq!(
        all.last().unwrap().1["result"]["content"][0]["text"],
        "done 6"
    );
    assert_eq!(
        proxy
            .metric("mcp_resume_resumes_total{facade=\"legacy\"}")
            .await,
        resumes + 1.0
    );
    // The owner's own requests were never counted as rejections.
    assert_eq!(metric_at(admin, AUTH_REJECTED_LEGACY).await, 6.0);
    proxy.stop().await;
}

/// The TypeScript SDK's legacy transport (`SSEClientTransport`) sending `Authorization` works
/// through the proxy (a long call: every progress notification, log and the result exactly once),
/// while another identity posting into its session gets 404. (The SDK's transport itself cannot
/// resume — it reconnects without `Last-Event-ID`, mcp-wire.md — so the cut is shown with the
/// `eventsource` package it is built on, next.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ts_sdk_legacy_client_with_authorization() {
    let (_up, tap, proxy) = fastmcp_proxy(|_| {}).await;
    let t = Target::plain(proxy.addr());
    let admin = proxy.running.admin_addr;
    let mut client = ts_auth_client(
        &format!("http://{}/sse", proxy.addr()),
        "sse",
        "tick",
        &json!({"n": 4, "interval_ms": 200}),
        &["--header", A_HEADER, "--expect-logs", "4"],
    );
    let out = loop {
        let line = client
            .line_async()
            .await
            .unwrap_or_else(|| panic!("client exited early (status {:?})", client.wait()));
        let v = parse(&line);
        if v["event"] == "connected" {
            let session = v["session_id"].as_str().expect("session id").to_string();
            assert_eq!(session.len(), 32);
            let r = legacy_post(&t, &session, &[B], &echo(90, "ATTACK-ts")).await;
            refused(r, 404, "unknown_session").await;
        }
        if v.get("result").is_some() {
            break v;
        }
    };
    assert_eq!(client.wait(), Some(0));
    assert_eq!(out["result"], "done 4", "{out}");
    assert_eq!(out["progress"], json!([1, 2, 3, 4]), "{out}");
    assert_eq!(
        out["logs"],
        json!(["tick 1", "tick 2", "tick 3", "tick 4"]),
        "{out}"
    );
    assert_eq!(metric_at(admin, AUTH_REJECTED_LEGACY).await, 1.0);
    assert!(!upstream_saw(&tap).contains("ATTACK-"));
    proxy.stop().await;
}

/// A real `EventSource` (the `eventsource` package under the TypeScript SDK) sending
/// `Authorization` on every request, cut mid-call through a relay: it reconnects by itself with
/// `Last-Event-ID` and its identity, keeps its session and gets every event exactly once, in order;
/// another identity's posts into that session meanwhile get 404 and reach nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eventsource_with_authorization_resumes_its_own_session() {
    let (_up, tap, proxy) = fastmcp_proxy(|_| {}).await;
    let relay = HalfOpenRelay::start(proxy.addr()).await;
    let t = Target::plain(proxy.addr());
    let admin = proxy.running.admin_addr;
    let _ = node_modules();
    let mut cmd = std::process::Command::new("node");
    cmd.arg(peers_dir().join("eventsource_auth_client.mjs"))
        .arg(format!("http://{}/sse", relay.addr))
        .args(["--header", A_HEADER]);
    let es = Proc::spawn("eventsource_auth_client", cmd);
    let mut endpoints = Vec::new();
    let mut messages: Vec<(String, Value)> = Vec::new();
    let mut opens = 0;
    let mut severed = false;
    loop {
        let line = tokio::time::timeout(WAIT, es.line_async())
            .await
            .expect("event in time")
            .expect("client alive");
        let ev = parse(&line);
        if ev["open"] == true {
            opens += 1;
        } else if ev["event"] == "endpoint" {
            let ep = ev["data"].as_str().unwrap().to_string();
            endpoints.push(ep.clone());
            if endpoints.len() == 1 {
                let sid = ep
                    .strip_prefix("/messages?session_id=")
                    .unwrap()
                    .to_string();
                for body in [
                    support::initialize(1).to_string(),
                    support::initialized().to_string(),
                    support::call(2, "tick", json!({"n": 6, "interval_ms": 300}), Some("es"))
                        .to_string(),
                ] {
                    assert_eq!(legacy_post(&t, &sid, &[A], &body).await.status, 202);
                }
            }
        } else if ev["event"] == "message" {
            let msg: Value = serde_json::from_str(ev["data"].as_str().unwrap()).unwrap();
            let done = msg["id"] == 2;
            messages.push((ev["id"].as_str().unwrap().to_string(), msg));
            if messages.iter().filter(|(_, m)| is_progress(m)).count() == 2 && !severed {
                severed = true;
                assert_eq!(relay.sever(), 1, "the stream's connection was open");
                // While it is away, another identity tries its session.
                let sid = endpoints[0].strip_prefix("/messages?session_id=").unwrap();
                let r = legacy_post(&t, sid, &[B], &echo(77, "ATTACK-es")).await;
                refused(r, 404, "unknown_session").await;
                let r = legacy_resume(&t, &[B], &messages[0].0).await;
                refused(r, 404, "unknown_session").await;
            }
            if done {
                break;
            }
        }
    }
    drop(es);
    assert!(opens >= 2, "the EventSource reconnected by itself");
    assert!(
        endpoints.iter().all(|e| e == &endpoints[0]),
        "one session throughout: {endpoints:?}"
    );
    let s = seqs(&messages);
    assert_eq!(
        s,
        (1..=s.len() as u64).collect::<Vec<_>>(),
        "every event once, in order"
    );
    let progress: Vec<f64> = messages
        .iter()
        .filter(|(_, m)| is_progress(m))
        .map(|(_, m)| m["params"]["progress"].as_f64().unwrap())
        .collect();
    assert_eq!(progress, vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    assert_eq!(
        messages.last().unwrap().1["result"]["content"][0]["text"],
        "done 6"
    );
    let resumed: Vec<String> = relay
        .client_bytes()
        .into_iter()
        .filter(|c| c.to_ascii_lowercase().contains("last-event-id:"))
        .collect();
    assert!(!resumed.is_empty(), "reconnected with Last-Event-ID");
    assert!(
        resumed.iter().all(|c| c.contains("token-A-2b1c5d")),
        "with its Authorization"
    );
    assert_eq!(
        proxy
            .metric("mcp_resume_sessions_started_total{facade=\"legacy\"}")
            .await,
        1.0
    );
    assert!(
        proxy
            .metric("mcp_resume_resumes_total{facade=\"legacy\"}")
            .await
            >= 1.0
    );
    assert_eq!(metric_at(admin, AUTH_REJECTED_LEGACY).await, 2.0);
    assert!(!upstream_saw(&tap).contains("ATTACK-"));
    proxy.stop().await;
}

/// The TypeScript SDK client peer with identity headers (tests/peers/ts_auth_client.mjs).
fn ts_auth_client(url: &str, transport: &str, tool: &str, args: &Value, extra: &[&str]) -> Proc {
    let _ = node_modules();
    let mut c = std::process::Command::new("node");
    c.arg(peers_dir().join("ts_auth_client.mjs"))
        .arg(url)
        .args(["--transport", transport, "--tool", tool, "--args"])
        .arg(args.to_string())
        .args(extra)
        .args(["--timeout", "90"]);
    Proc::spawn("ts_auth_client", c)
}

/// The Python SDK client peer with identity headers and TLS options (tests/peers/py_auth_client.py).
fn py_auth_client(url: &str, extra: &[&str]) -> Proc {
    let mut c = std::process::Command::new(python());
    c.arg(peers_dir().join("py_auth_client.py"))
        .arg(url)
        .args(extra)
        .args(["--timeout", "90"]);
    Proc::spawn("py_auth_client", c)
}

// ---------------------------------------------------------------------------------------------
// 2. Identity binding, Streamable HTTP face

/// A Streamable HTTP session opened with `Bearer A`: `Bearer B` (and no identity) with its
/// `Mcp-Session-Id` gets 404 on a plain GET, a GET with a forged or a stolen cursor, a POST and a
/// DELETE — each the answer for an unknown session, each counted — and the victim's standalone
/// stream, its session and its later requests are untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamable_session_is_bound_to_its_identity() {
    let (_up, tap, proxy) = fastmcp_proxy(|_| {}).await;
    let t = Target::plain(proxy.addr());
    let admin = proxy.running.admin_addr;
    let sid = mcp_init(&t, V_NEW, &[A]).await;
    let r = mcp_get(&t, &sid, &[A], None).await;
    let mut standalone = r.sse();
    let priming = standalone.next().await.expect("priming event");
    assert!(priming.is_priming(), "{priming:?}");
    let stolen = priming.id.clone().expect("a logged id");

    let fake = random_session();
    let unknown_get = refused(mcp_get(&t, &fake, &[B], None).await, 404, "unknown_session").await;
    let forged_of = |s: &str| format!("{s}:1:1");
    let unknown_resume = refused(
        mcp_get(&t, &fake, &[B], Some(&forged_of(&fake))).await,
        404,
        "unknown_session",
    )
    .await;
    let unknown_post = refused(
        mcp_post(&t, &fake, &[B], &echo(9, "ATTACK-x")).await,
        404,
        "unknown_session",
    )
    .await;
    let unknown_delete = refused(mcp_delete(&t, &fake, &[B]).await, 404, "unknown_session").await;
    assert_eq!(metric_at(admin, AUTH_REJECTED_STREAMABLE).await, 0.0);

    let mut rejected = 0.0;
    for who in [&[B][..], &[][..]] {
        let body = refused(mcp_get(&t, &sid, who, None).await, 404, "unknown_session").await;
        assert_eq!(body, unknown_get);
        let forged = mcp_get(&t, &sid, who, Some(&forged_of(&sid))).await;
        let body = refused(forged, 404, "unknown_session").await;
        assert_eq!(
            masked(&body.to_string(), &[&sid]),
            masked(&unknown_resume.to_string(), &[&fake])
        );
        let body = refused(
            mcp_get(&t, &sid, who, Some(&stolen)).await,
            404,
            "unknown_session",
        )
        .await;
        assert_eq!(body["error"]["data"]["reason"], "unknown_session");
        assert_eq!(
            body["error"]["data"]["log_head"],
            Value::Null,
            "no head leaked"
        );
        for cursor in [format!("{sid}:1:999999"), format!("{sid}:7:1")] {
            let r = mcp_get(&t, &sid, who, Some(&cursor)).await;
            refused(r, 404, "unknown_session").await;
        }
        let body = refused(
            mcp_post(&t, &sid, who, &echo(10, "ATTACK-post")).await,
            404,
            "unknown_session",
        )
        .await;
        assert_eq!(body, unknown_post);
        let body = refused(mcp_delete(&t, &sid, who).await, 404, "unknown_session").await;
        assert_eq!(body, unknown_delete);
        // A notification (e.g. cancelling the victim's request) and a response (e.g. answering a
        // server-to-client request in the victim's place) take the same path.
        for body in [
            json!({"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":11,"reason":"ATTACK-cancel"}}),
            json!({"jsonrpc":"2.0","id":"srv-1","result":{"ATTACK-answer":true}}),
        ] {
            let r = mcp_post(&t, &sid, who, &body.to_string()).await;
            assert_eq!(refused(r, 404, "unknown_session").await, unknown_post);
        }
        rejected += 9.0;
        assert_eq!(metric_at(admin, AUTH_REJECTED_STREAMABLE).await, rejected);
    }

    // The session lives, its standalone stream was not taken over, and it still flows.
    assert_eq!(
        proxy
            .metric("mcp_resume_sessions_ended_total{reason=\"client_delete\"}")
            .await,
        0.0
    );
    let done = mcp_call(&t, &sid, &[A], &tool_call(11, "burst", json!({"n": 3}))).await;
    assert_eq!(done["result"]["content"][0]["text"], "burst 3", "{done}");
    let mut logs = Vec::new();
    while logs.len() < 3 {
        let ev = standalone
            .next()
            .await
            .expect("the standalone stream still flows");
        if !ev.is_priming() {
            logs.push(ev.json()["params"]["data"].as_str().unwrap().to_string());
        }
    }
    assert_eq!(logs, ["burst 1", "burst 2", "burst 3"]);
    assert!(
        !upstream_saw(&tap).contains("ATTACK-"),
        "an attacker's message reached the upstream"
    );
    // The owner can still end it.
    assert_eq!(mcp_delete(&t, &sid, &[A]).await.status, 200);
    assert_eq!(metric_at(admin, AUTH_REJECTED_STREAMABLE).await, rejected);
    proxy.stop().await;
}

/// The TypeScript SDK's Streamable HTTP client sending `Authorization`: a long call cut mid-way
/// (through a relay) is resumed by the SDK with its token into its own session, exactly; its
/// DELETE (with its identity) ends the session. Meanwhile another identity is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ts_sdk_streamable_client_with_authorization_resumes_after_a_cut() {
    let (_up, tap, proxy) = fastmcp_proxy(|_| {}).await;
    let relay = Relay::start(proxy.addr()).await;
    let t = Target::plain(proxy.addr());
    let admin = proxy.running.admin_addr;
    let mut client = ts_auth_client(
        &format!("http://{}/mcp", relay.addr),
        "streamable",
        "tick",
        &json!({"n": 8, "interval_ms": 250}),
        &["--header", A_HEADER, "--expect-logs", "8"],
    );
    let mut progress_seen = 0;
    let out = loop {
        let line = client
            .line_async()
            .await
            .unwrap_or_else(|| panic!("client exited early (status {:?})", client.wait()));
        let v = parse(&line);
        if v["event"] == "connected" {
            let sid = v["session_id"].as_str().unwrap().to_string();
            let r = mcp_post(&t, &sid, &[B], &echo(90, "ATTACK-ts")).await;
            refused(r, 404, "unknown_session").await;
            let r = mcp_get(&t, &sid, &[B], None).await;
            refused(r, 404, "unknown_session").await;
        }
        if v["event"] == "progress" {
            progress_seen += 1;
            if progress_seen == 2 {
                assert!(relay.sever() >= 1);
            }
        }
        if v.get("result").is_some() {
            break v;
        }
    };
    assert_eq!(client.wait(), Some(0));
    assert_eq!(out["result"], "done 8", "{out}");
    let got: Vec<f64> = out["progress"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_f64().unwrap())
        .collect();
    assert_eq!(got, (1..=8).map(f64::from).collect::<Vec<_>>(), "{out}");
    let logs: Vec<String> = (1..=8).map(|i| format!("tick {i}")).collect();
    assert_eq!(out["logs"], json!(logs), "{out}");
    let responses = out["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["response"] == true)
        .count();
    assert_eq!(responses, 1, "{out}");
    let resumed = relay
        .client_bytes()
        .into_iter()
        .filter(|c| c.to_ascii_lowercase().contains("last-event-id:"))
        .collect::<Vec<_>>();
    assert!(!resumed.is_empty(), "the SDK resumed with Last-Event-ID");
    assert!(resumed.iter().all(|c| c.contains("token-A-2b1c5d")));
    assert!(
        proxy
            .metric("mcp_resume_resumes_total{facade=\"streamable\"}")
            .await
            >= 1.0
    );
    assert_eq!(
        proxy
            .metric("mcp_resume_sessions_ended_total{reason=\"client_delete\"}")
            .await,
        1.0,
        "the SDK's DELETE with its identity ended the session"
    );
    assert_eq!(metric_at(admin, AUTH_REJECTED_STREAMABLE).await, 2.0);
    assert!(!upstream_saw(&tap).contains("ATTACK-"));
    proxy.stop().await;
}

// ---------------------------------------------------------------------------------------------
// 3. Face binding

/// A session opened on one face cannot be used through the other: 404, counted on the face used.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_is_bound_to_its_face() {
    let (_up, tap, proxy) = fastmcp_proxy(|_| {}).await;
    let t = Target::plain(proxy.addr());
    let admin = proxy.running.admin_addr;

    // A Streamable HTTP session (bearer, so only the face differs) and a cursor of it.
    let s = mcp_init(&t, V_NEW, &[]).await;
    let r = mcp_post(&t, &s, &[], &echo(2, "own face")).await;
    let evs = r.sse().rest().await;
    let cursor = evs[0].id.clone().expect("priming id");
    assert!(cursor.starts_with(&s));
    let r = legacy_post(&t, &s, &[], &echo(3, "ATTACK-face")).await;
    refused(r, 404, "unknown_session").await;
    let r = legacy_resume(&t, &[], &cursor).await;
    refused(r, 404, "unknown_session").await;
    assert_eq!(metric_at(admin, AUTH_REJECTED_LEGACY).await, 2.0);

    // A legacy session through /mcp.
    let (mut sse, l, c1) = legacy_session_as(&t, &[]).await;
    refused(
        mcp_post(&t, &l, &[], &echo(4, "ATTACK-face")).await,
        404,
        "unknown_session",
    )
    .await;
    refused(mcp_get(&t, &l, &[], None).await, 404, "unknown_session").await;
    refused(
        mcp_get(&t, &l, &[], Some(&c1)).await,
        404,
        "unknown_session",
    )
    .await;
    refused(mcp_delete(&t, &l, &[]).await, 404, "unknown_session").await;
    assert_eq!(metric_at(admin, AUTH_REJECTED_STREAMABLE).await, 4.0);

    // Both still work on their own face.
    assert_eq!(
        legacy_post(&t, &l, &[], &echo(5, "legacy ok")).await.status,
        202
    );
    let got = until_response(&mut sse, 5).await;
    assert_eq!(
        got.last().unwrap().1["result"]["content"][0]["text"],
        "legacy ok"
    );
    let done = mcp_call(&t, &s, &[], &echo(6, "streamable ok")).await;
    assert_eq!(done["result"]["content"][0]["text"], "streamable ok");
    assert!(!upstream_saw(&tap).contains("ATTACK-"));
    proxy.stop().await;
}

// ---------------------------------------------------------------------------------------------
// 4. Bearer sessions; auth.require_identity

/// Sessions opened without identity are bearer sessions (documented): whoever names the id may
/// use them, with or without an identity of its own, and nothing is counted as a rejection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_opened_without_identity_are_bearer_sessions() {
    let (_up, _tap, proxy) = fastmcp_proxy(|_| {}).await;
    let t = Target::plain(proxy.addr());
    let admin = proxy.running.admin_addr;
    let (sse, l, c1) = legacy_session_as(&t, &[]).await;
    sse.cut();
    assert_eq!(
        legacy_post(&t, &l, &[B], &echo(2, "by B")).await.status,
        202
    );
    let r = legacy_resume(&t, &[A], &c1).await;
    assert_eq!(r.status, 200, "anyone naming a bearer session resumes it");
    let mut sse = r.legacy_sse();
    sse.endpoint().await;
    let got = until_response(&mut sse, 2).await;
    assert_eq!(
        got.last().unwrap().1["result"]["content"][0]["text"],
        "by B"
    );

    let s = mcp_init(&t, V_NEW, &[]).await;
    let done = mcp_call(&t, &s, &[B], &echo(3, "by B too")).await;
    assert_eq!(done["result"]["content"][0]["text"], "by B too");
    assert_eq!(mcp_delete(&t, &s, &[A]).await.status, 200);
    assert_eq!(metric_at(admin, AUTH_REJECTED_LEGACY).await, 0.0);
    assert_eq!(metric_at(admin, AUTH_REJECTED_STREAMABLE).await, 0.0);
    proxy.stop().await;
}

/// `auth.require_identity = true`: a request without identity gets 401 `identity_required` on
/// every path of both faces; with one it is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn require_identity_answers_401_without_one() {
    let (_up, _tap, proxy) = fastmcp_proxy(|c| c.auth.require_identity = true).await;
    let t = Target::plain(proxy.addr());
    let started = "mcp_resume_sessions_started_total{facade=\"legacy\"}";
    refused(
        t.send("GET", "/sse", &[("accept", "text/event-stream")], None)
            .await,
        401,
        "identity_required",
    )
    .await;
    let r = mcp_initialize(&t, V_NEW, "anonymous", &[]).await;
    refused(r, 401, "identity_required").await;
    assert_eq!(proxy.metric(started).await, 0.0);

    // With an identity: served; the session's own paths still answer 401 without it.
    let (mut sse, l, c1) = legacy_session_as(&t, &[A]).await;
    refused(
        legacy_post(&t, &l, &[], &echo(2, "x")).await,
        401,
        "identity_required",
    )
    .await;
    refused(legacy_resume(&t, &[], &c1).await, 401, "identity_required").await;
    let s = mcp_init(&t, V_NEW, &[A]).await;
    refused(
        mcp_post(&t, &s, &[], &echo(3, "x")).await,
        401,
        "identity_required",
    )
    .await;
    refused(mcp_get(&t, &s, &[], None).await, 401, "identity_required").await;
    refused(mcp_delete(&t, &s, &[]).await, 401, "identity_required").await;
    assert_eq!(legacy_post(&t, &l, &[A], &echo(4, "ok")).await.status, 202);
    assert_eq!(until_response(&mut sse, 4).await.len(), 1);
    assert_eq!(proxy.metric(started).await, 1.0);
    proxy.stop().await;
}

/// An Ed25519 signing key and its JWKS (`kid` = `kid`).
fn jwt_key(kid: &str) -> (jsonwebtoken::EncodingKey, Value) {
    use base64::Engine;
    use ring::signature::KeyPair;
    let pkcs8 =
        ring::signature::Ed25519KeyPair::generate_pkcs8(&ring::rand::SystemRandom::new()).unwrap();
    let pair = ring::signature::Ed25519KeyPair::from_pkcs8(pkcs8.as_ref()).unwrap();
    let x = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(pair.public_key().as_ref());
    (
        jsonwebtoken::EncodingKey::from_ed_der(pkcs8.as_ref()),
        json!({"kty": "OKP", "crv": "Ed25519", "x": x, "kid": kid, "alg": "EdDSA", "use": "sig"}),
    )
}

fn jwt(key: &jsonwebtoken::EncodingKey, kid: &str, sub: &str, exp_in: i64) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let mut h = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::EdDSA);
    h.kid = Some(kid.into());
    let claims = json!({
        "iss": "https://auth.test", "aud": "https://mcp.test/mcp", "sub": sub,
        "iat": now, "exp": now + exp_in, "jti": format!("{sub}-{exp_in}"),
    });
    format!("Bearer {}", jsonwebtoken::encode(&h, &claims, key).unwrap())
}

/// `auth.mode = "jwt"` (design.md §11b): the proxy is an OAuth 2.1 resource server on every face.
/// No token: 401 with `WWW-Authenticate: Bearer resource_metadata=…`; a bad one (another key,
/// expired, HMAC with the public key): 401 with `error="invalid_token"`; a valid one is served,
/// and the session belongs to its (iss, sub) — a refreshed token of the same subject keeps it,
/// another subject's valid token gets 404 as for any unknown session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jwt_mode_verifies_bearer_tokens_on_every_face() {
    let (key, jwk) = jwt_key("k1");
    let (other, _) = jwt_key("k1");
    let jwks = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(jwks.path(), json!({"keys": [jwk.clone()]}).to_string()).unwrap();
    let meta = "https://mcp.test/.well-known/oauth-protected-resource";
    let path = jwks.path().to_path_buf();
    let (_up, _tap, proxy) = fastmcp_proxy(|c| {
        c.auth.mode = mcp_resume_proxy::identity::AuthMode::Jwt;
        c.auth.jwks_file = Some(path);
        c.auth.issuer = "https://auth.test".into();
        c.auth.audience = vec!["https://mcp.test/mcp".into()];
        c.auth.resource_metadata_url = meta.into();
    })
    .await;
    let t = Target::plain(proxy.addr());
    let alice = jwt(&key, "k1", "alice", 300);
    let alice_refreshed = jwt(&key, "k1", "alice", 600);
    let bob = jwt(&key, "k1", "bob", 300);
    let forged = jwt(&other, "k1", "alice", 300);
    let expired = jwt(&key, "k1", "alice", -3600);
    let hmac = {
        let secret = serde_json::to_vec(&jwk).unwrap();
        let claims = json!({"iss": "https://auth.test", "aud": "https://mcp.test/mcp", "sub": "alice", "exp": 4_000_000_000u64});
        let tok = jsonwebtoken::encode(
            &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
            &claims,
            &jsonwebtoken::EncodingKey::from_secret(&secret),
        )
        .unwrap();
        format!("Bearer {tok}")
    };
    let challenge = |r: &Resp| r.header("www-authenticate").unwrap_or_default();

    // No token, on each face.
    let r = t
        .send("GET", "/sse", &[("accept", "text/event-stream")], None)
        .await;
    assert_eq!(
        challenge(&r),
        format!("Bearer resource_metadata=\"{meta}\"")
    );
    refused(r, 401, "invalid_token").await;
    let r = mcp_initialize(&t, V_NEW, "anonymous", &[]).await;
    assert_eq!(
        challenge(&r),
        format!("Bearer resource_metadata=\"{meta}\"")
    );
    refused(r, 401, "invalid_token").await;
    // Bad tokens.
    for bad in [&forged, &expired, &hmac, &"Bearer x.y.z".to_string()] {
        let r = mcp_initialize(&t, V_NEW, "bad", &[("authorization", bad)]).await;
        assert_eq!(
            challenge(&r),
            format!("Bearer error=\"invalid_token\", resource_metadata=\"{meta}\""),
            "{bad}"
        );
        refused(r, 401, "invalid_token").await;
        let r = t
            .send(
                "GET",
                "/sse",
                &[("accept", "text/event-stream"), ("authorization", bad)],
                None,
            )
            .await;
        refused(r, 401, "invalid_token").await;
    }
    // The 2026-07-28 face answers the same before it reads the body.
    let modern = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {"_meta": {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
        "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "0"}}}})
    .to_string();
    let modern_headers = |auth: &'static str| -> Vec<(&'static str, &'static str)> {
        vec![
            ("content-type", "application/json"),
            ("accept", "application/json, text/event-stream"),
            ("mcp-protocol-version", "2026-07-28"),
            ("mcp-method", "tools/list"),
            ("authorization", auth),
        ]
    };
    let forged_static: &'static str = Box::leak(forged.clone().into_boxed_str());
    let alice_static: &'static str = Box::leak(alice.clone().into_boxed_str());
    let r = t
        .send(
            "POST",
            "/mcp",
            &modern_headers(forged_static),
            Some(&modern),
        )
        .await;
    refused(r, 401, "invalid_token").await;
    let r = t
        .send("POST", "/mcp", &modern_headers(alice_static), Some(&modern))
        .await;
    assert_eq!(r.status, 200, "a valid token is served on the 2026 face");

    // Valid: served, and the session is alice's whatever token of hers she shows.
    let a = [("authorization", alice.as_str())];
    let a2 = [("authorization", alice_refreshed.as_str())];
    let b = [("authorization", bob.as_str())];
    let (mut sse, l, _c1) = legacy_session_as(&t, &a).await;
    assert_eq!(
        legacy_post(&t, &l, &a2, &echo(2, "refreshed")).await.status,
        202
    );
    assert_eq!(until_response(&mut sse, 2).await.len(), 1);
    refused(
        legacy_post(&t, &l, &b, &echo(3, "bob")).await,
        404,
        "unknown_session",
    )
    .await;
    let s = mcp_init(&t, V_NEW, &a).await;
    assert_eq!(mcp_post(&t, &s, &a2, &echo(4, "x")).await.status, 200);
    refused(
        mcp_post(&t, &s, &b, &echo(5, "x")).await,
        404,
        "unknown_session",
    )
    .await;
    refused(
        mcp_post(&t, &s, &[], &echo(6, "x")).await,
        401,
        "invalid_token",
    )
    .await;
    let rejected = |r: &str| format!("mcp_resume_requests_rejected_total{{reason=\"{r}\"}}");
    assert_eq!(proxy.metric(&rejected("invalid_token")).await, 9.0);
    assert_eq!(proxy.metric(&rejected("token_required")).await, 3.0);
    proxy.stop().await;
}

// ---------------------------------------------------------------------------------------------
// 5. No ids in logs

/// The proxy binary at its default level (info) through a session, a cut and resume, refusals and
/// session ends on both faces: its log holds no session id, no cursor, no `Authorization` value,
/// and not the upstream's session id either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn info_log_holds_no_ids_cursors_or_credentials() {
    let up = fastmcp().await;
    let tap = Relay::start(addr_of(up.port)).await;
    let dir = tempfile::tempdir().unwrap();
    let proxy = ProxyBin::start(&format!("http://{}/sse", tap.addr), dir.path(), "").await;
    let t = Target::plain(proxy.addr);
    let secret = ("authorization", "Bearer s3cr3t-credential-Q7");
    let mut cursors: Vec<String> = Vec::new();

    // Legacy: a session, a call cut mid-way and resumed, refusals.
    let (mut sse, l, c1) = legacy_session_as(&t, &[secret]).await;
    cursors.push(c1.clone());
    let call = support::call(2, "tick", json!({"n": 4, "interval_ms": 100}), Some("p"));
    assert_eq!(
        legacy_post(&t, &l, &[secret], &call.to_string())
            .await
            .status,
        202
    );
    let (id, _) = sse.message().await;
    cursors.push(id.clone());
    sse.cut();
    let r = legacy_resume(&t, &[secret], &id).await;
    let mut sse = r.legacy_sse();
    sse.endpoint().await;
    cursors.extend(
        until_response(&mut sse, 2)
            .await
            .into_iter()
            .map(|(i, _)| i),
    );
    refused(legacy_resume(&t, &[B], &c1).await, 404, "unknown_session").await;
    refused(
        legacy_resume(&t, &[secret], "garbage").await,
        400,
        "malformed_cursor",
    )
    .await;
    let ahead = format!("{l}:1:999");
    refused(
        legacy_resume(&t, &[secret], &ahead).await,
        409,
        "cursor_ahead",
    )
    .await;
    refused(
        legacy_post(&t, &l, &[B], &echo(3, "x")).await,
        404,
        "unknown_session",
    )
    .await;

    // Streamable: a session, a call, a resume of its POST stream, a refusal, the end.
    let s = mcp_init(&t, V_NEW, &[secret]).await;
    let r = mcp_post(&t, &s, &[secret], &echo(4, "hello")).await;
    let evs = r.sse().rest().await;
    cursors.extend(evs.iter().filter_map(|e| e.id.clone()));
    let r = mcp_get(&t, &s, &[secret], evs[0].id.as_deref()).await;
    cursors.extend(r.sse().rest().await.iter().filter_map(|e| e.id.clone()));
    refused(mcp_get(&t, &s, &[B], None).await, 404, "unknown_session").await;
    refused(
        mcp_get(&t, &s, &[secret], Some(&format!("{s}:1:999"))).await,
        409,
        "cursor_ahead",
    )
    .await;
    assert_eq!(mcp_delete(&t, &s, &[secret]).await.status, 200);

    // The upstream's own session id, as the proxy posted to it.
    let saw = upstream_saw(&tap);
    let upstream_sid = saw
        .split("session_id=")
        .nth(1)
        .map(|r| {
            r.chars()
                .take_while(|c| c.is_ascii_hexdigit())
                .collect::<String>()
        })
        .expect("the proxy posted to the upstream's message URL");
    assert!(upstream_sid.len() >= 16, "{upstream_sid}");

    // Nor in the metrics.
    let metrics = metrics_text(proxy.admin).await;
    for id in [&l, &s] {
        assert!(!metrics.contains(id.as_str()), "a session id in /metrics");
    }
    let log = proxy.stop();
    // The log is at info and covers what happened (else the check below proves nothing): the
    // sessions' lines and the refusals' warn lines are there.
    let lines = |level: &str| log.lines().filter(|l| l.contains(level)).count();
    assert!(lines("INFO") >= 8, "too few info lines:\n{log}");
    assert!(
        lines("WARN") >= 3,
        "the refusals' warn lines are missing:\n{log}"
    );
    for (what, needle) in [
        ("legacy session id", l.as_str()),
        ("streamable session id", s.as_str()),
        ("upstream session id", upstream_sid.as_str()),
        ("credential", "s3cr3t-credential-Q7"),
        ("other credential", "token-B-9e4d77"),
    ] {
        assert!(!log.contains(needle), "{what} in the info log:\n{log}");
    }
    for c in &cursors {
        assert!(
            !log.contains(c.as_str()),
            "cursor {c} in the info log:\n{log}"
        );
    }
    // Not even a prefix long enough to find a session by.
    for id in [&l, &s] {
        assert!(
            !log.contains(&id[..12]),
            "a 12-char prefix of an id in the log:\n{log}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// 6. Origin, Host, Content-Type

/// A web page's simple request (`Content-Type: text/plain`) cannot run `initialize` through the
/// legacy face (415, nothing forwarded); a foreign `Origin` is refused on both faces (403
/// `origin_not_allowed`), an allowed one passes; with `listen.allowed_hosts`, a foreign `Host` is
/// refused on both faces (403 `host_not_allowed`; DNS rebinding) and the right one passes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn origin_host_and_content_type_are_checked_on_both_faces() {
    let (_up, tap, proxy) = fastmcp_proxy(|c| {
        c.listen.allowed_origins = vec!["http://app.example".into()];
    })
    .await;
    let t = Target::plain(proxy.addr());
    let started = |f: &str| format!("mcp_resume_sessions_started_total{{facade=\"{f}\"}}");

    // 415: a text/plain POST (what a page may send cross-origin without a preflight).
    let (_sse, l) = legacy_open(&t, &[]).await;
    let init = json!({"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2024-11-05",
        "capabilities":{},"clientInfo":{"name":"TEXTPLAIN-MARK","version":"0"}}})
    .to_string();
    for ct in [
        "text/plain",
        "text/plain;charset=UTF-8",
        "application/x-www-form-urlencoded",
    ] {
        let r = t
            .send(
                "POST",
                &format!("/messages?session_id={l}"),
                &[("content-type", ct)],
                Some(&init),
            )
            .await;
        refused(r, 415, "unsupported_media_type").await;
    }
    let r = t
        .send(
            "POST",
            &format!("/messages?session_id={l}"),
            &[],
            Some(&init),
        )
        .await;
    refused(r, 415, "unsupported_media_type").await;
    assert!(
        !upstream_saw(&tap).contains("TEXTPLAIN-MARK"),
        "a text/plain body was forwarded"
    );

    // 403 for a foreign Origin on every path of both faces.
    let evil = ("origin", "http://evil.example");
    let sse_h = [("accept", "text/event-stream"), evil];
    refused(
        t.send("GET", "/sse", &sse_h, None).await,
        403,
        "origin_not_allowed",
    )
    .await;
    let r = t
        .send(
            "POST",
            &format!("/messages?session_id={l}"),
            &[("content-type", "application/json"), evil],
            Some(&init),
        )
        .await;
    refused(r, 403, "origin_not_allowed").await;
    let mcp_h = [
        ("accept", "application/json, text/event-stream"),
        ("content-type", "application/json"),
        evil,
    ];
    let body = refused(
        t.send("POST", "/mcp", &mcp_h, Some(&init_body(V_NEW, "x")))
            .await,
        403,
        "origin_not_allowed",
    )
    .await;
    assert_eq!(body["error"]["data"]["origin"], "http://evil.example");
    // Lookalikes of the allowed origin are foreign too.
    for o in [
        "https://app.example",
        "http://app.example:8080",
        "http://app.example.evil.example",
        "null",
    ] {
        let r = t
            .send(
                "GET",
                "/sse",
                &[("accept", "text/event-stream"), ("origin", o)],
                None,
            )
            .await;
        refused(r, 403, "origin_not_allowed").await;
    }
    assert!(!upstream_saw(&tap).contains("TEXTPLAIN-MARK"));
    assert_eq!(proxy.metric(&started("streamable")).await, 0.0);
    assert_eq!(proxy.metric(&started("legacy")).await, 1.0);
    // Counted: 4 non-JSON posts, 3 foreign origins on the three paths, 4 lookalikes.
    let rejected = |r: &str| format!("mcp_resume_requests_rejected_total{{reason=\"{r}\"}}");
    assert_eq!(proxy.metric(&rejected("unsupported_media_type")).await, 4.0);
    assert_eq!(proxy.metric(&rejected("origin_not_allowed")).await, 7.0);

    // The allowed origin passes on both faces.
    let good = ("origin", "http://app.example");
    let r = t
        .send(
            "GET",
            "/sse",
            &[("accept", "text/event-stream"), good],
            None,
        )
        .await;
    assert_eq!(r.status, 200);
    let s = mcp_init(&t, V_NEW, &[good]).await;
    assert_eq!(s.len(), 32);
    assert_eq!(proxy.metric(&started("legacy")).await, 2.0);
    assert_eq!(proxy.metric(&started("streamable")).await, 1.0);
    assert_eq!(proxy.metric(AUTH_REJECTED_LEGACY).await, 0.0);
    proxy.stop().await;

    // Host allowlist.
    let (_up2, _tap2, proxy) = fastmcp_proxy(|c| {
        c.listen.allowed_hosts = vec!["127.0.0.1".into()];
    })
    .await;
    let t = Target::plain(proxy.addr());
    let port = proxy.addr().port().to_string();
    for host in [
        "attacker.example".to_string(),
        format!("attacker.example:{port}"),
        format!("127.0.0.1.attacker.example:{port}"),
        "localhost".to_string(),
    ] {
        let h = [("accept", "text/event-stream"), ("host", host.as_str())];
        refused(
            t.send("GET", "/sse", &h, None).await,
            403,
            "host_not_allowed",
        )
        .await;
        let h = [
            ("accept", "application/json, text/event-stream"),
            ("content-type", "application/json"),
            ("host", host.as_str()),
        ];
        let r = t
            .send("POST", "/mcp", &h, Some(&init_body(V_NEW, "x")))
            .await;
        refused(r, 403, "host_not_allowed").await;
        let r = t
            .send(
                "GET",
                "/mcp",
                &[("accept", "text/event-stream"), ("host", host.as_str())],
                None,
            )
            .await;
        refused(r, 403, "host_not_allowed").await;
    }
    assert_eq!(proxy.metric(&started("legacy")).await, 0.0);
    assert_eq!(proxy.metric(&started("streamable")).await, 0.0);
    assert_eq!(
        proxy
            .metric("mcp_resume_requests_rejected_total{reason=\"host_not_allowed\"}")
            .await,
        12.0
    );
    // The right host (with the port, as clients send it; and without) passes on both faces.
    let (_sse, _) = legacy_open(&t, &[]).await;
    let (_sse, _) = legacy_open(&t, &[("host", "127.0.0.1")]).await;
    let s = mcp_init(&t, V_NEW, &[]).await;
    assert_eq!(s.len(), 32);
    assert_eq!(proxy.metric(&started("legacy")).await, 2.0);
    assert_eq!(proxy.metric(&started("streamable")).await, 1.0);
    proxy.stop().await;
}

// ---------------------------------------------------------------------------------------------
// 7. The upstream's endpoint origin

/// An upstream whose `endpoint` event names another origin: the session fails loudly (502
/// `upstream_error`, `upstream_errors_total{kind="endpoint_rejected"}`), nothing ever connects to
/// the other origin, and no proxy answer carries an upstream body. Pointing it at the proxy's own
/// `/mcp` is refused too (no session loop). Listed in `upstream.allowed_endpoint_origins`, the
/// other origin works — and the bodies of its error answers are still never reflected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endpoint_naming_another_origin_fails_the_session() {
    let trap = Trap::start().await;
    let trap_port = trap.port;
    let stub =
        StubUpstream::start(move |_, _| format!("http://127.0.0.1:{trap_port}/messages?s=1")).await;
    let dir = tempfile::tempdir().unwrap();
    let p = start_in_process(&stub.sse_url(), dir.path(), |_| {}).await;
    let t = Target::plain(p.addr);
    let admin = p.admin_addr;
    let rejected = "mcp_resume_upstream_errors_total{kind=\"endpoint_rejected\"}";
    let mut answers = String::new();

    let r = t
        .send("GET", "/sse", &[("accept", "text/event-stream")], None)
        .await;
    answers += &refused(r, 502, "upstream_error").await.to_string();
    let r = mcp_initialize(&t, V_NEW, "x", &[]).await;
    answers += &refused(r, 502, "upstream_error").await.to_string();
    assert_eq!(metric_at(admin, rejected).await, 2.0);
    // Other spellings of a foreign origin.
    for ep in [
        format!("//127.0.0.1:{trap_port}/messages"),
        format!("http://localhost:{}/messages", stub.port),
        format!("https://127.0.0.1:{}/messages", stub.port),
    ] {
        *stub.endpoint.lock().unwrap() = ep;
        let r = t
            .send("GET", "/sse", &[("accept", "text/event-stream")], None)
            .await;
        answers += &refused(r, 502, "upstream_error").await.to_string();
    }
    assert_eq!(metric_at(admin, rejected).await, 5.0);
    // The proxy's own /mcp.
    *stub.endpoint.lock().unwrap() = format!("http://{}/mcp", p.addr);
    let r = t
        .send("GET", "/sse", &[("accept", "text/event-stream")], None)
        .await;
    answers += &refused(r, 502, "upstream_error").await.to_string();
    assert_eq!(metric_at(admin, rejected).await, 6.0);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        trap.hits(),
        0,
        "something connected to the endpoint's origin"
    );
    assert!(stub.posts().is_empty());
    assert!(!answers.contains(TRAP_BODY));
    assert_eq!(stub.sse_opens.load(std::sync::atomic::Ordering::SeqCst), 6);
    for f in ["legacy", "streamable"] {
        let started = format!("mcp_resume_sessions_started_total{{facade=\"{f}\"}}");
        assert_eq!(
            metric_at(admin, &started).await,
            0.0,
            "no session from a rejected endpoint"
        );
    }
    assert_eq!(metric_at(admin, "mcp_resume_sessions_active").await, 0.0);
    p.stop().await;

    // An upstream whose SSE endpoint itself answers 500 with a body: 502, without that body.
    let dir = tempfile::tempdir().unwrap();
    let p = start_in_process(
        &format!("http://127.0.0.1:{trap_port}/sse"),
        dir.path(),
        |_| {},
    )
    .await;
    let t = Target::plain(p.addr);
    let r = t
        .send("GET", "/sse", &[("accept", "text/event-stream")], None)
        .await;
    let body = refused(r, 502, "upstream_error").await;
    assert!(!body.to_string().contains(TRAP_BODY), "{body}");
    assert_eq!(
        metric_at(
            p.admin_addr,
            "mcp_resume_upstream_errors_total{kind=\"status\"}"
        )
        .await,
        1.0
    );
    p.stop().await;

    // Allowed: the other origin gets the POSTs and the session works.
    let stub =
        StubUpstream::start(|_, sink| format!("http://127.0.0.1:{sink}/messages?sid={{sid}}"))
            .await;
    let sink_origin = format!("http://127.0.0.1:{}", stub.sink_port);
    let dir = tempfile::tempdir().unwrap();
    let p = start_in_process(&stub.sse_url(), dir.path(), |c| {
        c.upstream.allowed_endpoint_origins = vec![sink_origin];
    })
    .await;
    let t = Target::plain(p.addr);
    let (mut sse, sid, _) = legacy_session_as(&t, &[]).await;
    assert!(stub.posts().iter().any(|b| b.contains("\"initialize\"")));
    // The upstream refuses a POST with a body of its own: 502, without that body.
    let r = legacy_post(&t, &sid, &[], &tool_call(7, "fail", json!({}))).await;
    let body = refused(r, 502, "upstream_error").await;
    assert!(!body.to_string().contains(TRAP_BODY), "{body}");
    assert_eq!(
        metric_at(
            p.admin_addr,
            "mcp_resume_upstream_errors_total{kind=\"post_failed\"}"
        )
        .await,
        1.0
    );
    assert_eq!(
        legacy_post(&t, &sid, &[], &echo(8, "fine")).await.status,
        202
    );
    let got = until_response(&mut sse, 8).await;
    assert_eq!(got.last().unwrap().1["result"]["ok"], true);
    for (_, m) in &got {
        assert!(!m.to_string().contains(TRAP_BODY));
    }
    // A second `endpoint` event mid-session naming the trap moves nothing: later posts still go
    // where the first (allowed) one said.
    let trap_url = format!("http://127.0.0.1:{trap_port}/messages?s=2");
    let re = tool_call(10, "reendpoint", json!({ "url": trap_url }));
    assert_eq!(legacy_post(&t, &sid, &[], &re).await.status, 202);
    until_response(&mut sse, 10).await;
    let before = stub.posts().len();
    assert_eq!(
        legacy_post(&t, &sid, &[], &echo(11, "still here"))
            .await
            .status,
        202
    );
    let got = until_response(&mut sse, 11).await;
    assert_eq!(got.last().unwrap().1["result"]["ok"], true);
    assert_eq!(
        stub.posts().len(),
        before + 1,
        "the post went to the first endpoint"
    );
    assert_eq!(
        trap.hits(),
        1,
        "only the upstream GET of the 500 case reached the trap; no client body did"
    );
    let s = mcp_init(&t, V_NEW, &[]).await;
    let r = mcp_post(&t, &s, &[], &tool_call(9, "fail", json!({}))).await;
    let body = refused(r, 502, "upstream_error").await;
    assert!(!body.to_string().contains(TRAP_BODY), "{body}");
    assert_eq!(metric_at(p.admin_addr, rejected).await, 0.0);
    p.stop().await;
}

// ---------------------------------------------------------------------------------------------
// 8. Quotas, probe sessions

/// A session's id, opened as `who` on the Streamable face and used once (so it is not a probe);
/// no client stays attached (idle).
async fn idle_used_session(t: &Target, who: &[(&str, &str)]) -> String {
    let s = mcp_init(t, V_NEW, who).await;
    let done = mcp_call(t, &s, who, &echo(1, "use")).await;
    assert_eq!(done["result"]["ok"], true, "{done}");
    s
}

async fn alive(t: &Target, s: &str, who: &[(&str, &str)]) -> bool {
    let r = mcp_post(t, s, who, &echo(2, "alive?")).await;
    match r.status {
        200 => {
            r.sse().rest().await;
            true
        }
        404 => false,
        other => panic!("unexpected status {other}"),
    }
}

/// `sessions.max_per_identity` for an anonymous flood from one address: 400 `initialize`s take
/// only from the flood's own sessions (another peer's idle sessions all survive, the flood never
/// holds more than its quota), and once every one of its sessions has a client attached (held
/// `GET /sse` streams) the next one gets 503 `capacity`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_anonymous_flood_is_bounded_by_its_own_quota() {
    let stub =
        StubUpstream::start(|p, _| format!("http://127.0.0.1:{p}/messages?sid={{sid}}")).await;
    let dir = tempfile::tempdir().unwrap();
    let p = start_in_process(&stub.sse_url(), dir.path(), |c| {
        c.sessions.max_sessions = 20;
        c.sessions.max_per_identity = 8;
        c.sessions.unused_ttl_secs = 600;
    })
    .await;
    let t = Target::plain(p.addr);
    // A connects from its own address: header identities count per peer (see
    // `forged_identities_from_one_peer_are_one_owner`).
    let ta = t.via_peer("127.0.0.2");
    let admin = p.admin_addr;
    let mut mine = Vec::new();
    for _ in 0..6 {
        mine.push(idle_used_session(&ta, &[A]).await);
    }
    let init = init_body(V_NEW, "flood");
    let h = [
        ("accept", "application/json, text/event-stream"),
        ("content-type", "application/json"),
    ];
    for i in 0..400 {
        let r = t.send("POST", "/mcp", &h, Some(&init)).await;
        assert_eq!(r.status, 200, "flood initialize {i}");
        r.sse().rest().await;
    }
    assert_eq!(
        metric_at(admin, "mcp_resume_sessions_active").await,
        14.0,
        "6 + the flood's 8"
    );
    assert_eq!(
        metric_at(admin, "mcp_resume_sessions_ended_total{reason=\"evicted\"}").await,
        392.0,
        "the flood evicted only its own"
    );
    for s in &mine {
        assert!(
            alive(&ta, s, &[A]).await,
            "an idle session of A was evicted by the flood"
        );
    }
    // Held streams: once all 8 of the flood's sessions have a client, the 9th is refused.
    let mut held = Vec::new();
    for _ in 0..8 {
        let (sse, _) = legacy_open(&t, &[]).await;
        held.push(sse);
    }
    let r = t
        .send("GET", "/sse", &[("accept", "text/event-stream")], None)
        .await;
    refused(r, 503, "capacity").await;
    let r = t.send("POST", "/mcp", &h, Some(&init)).await;
    refused(r, 503, "capacity").await;
    for s in &mine {
        assert!(alive(&ta, s, &[A]).await);
    }
    // A is still served: it has quota and the proxy has room.
    assert!(alive(&ta, &idle_used_session(&ta, &[A]).await, &[A]).await);
    drop(held);
    p.stop().await;
}

/// When the proxy is full, eviction takes from the owner holding the most sessions — and an
/// anonymous flood that has grown as large as another peer's share evicts its own, never that
/// peer's (`max_per_identity` left at its default, so only `max_sessions` bounds the flood).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_proxy_evicts_from_the_heaviest_owner() {
    let stub =
        StubUpstream::start(|p, _| format!("http://127.0.0.1:{p}/messages?sid={{sid}}")).await;
    let dir = tempfile::tempdir().unwrap();
    let p = start_in_process(&stub.sse_url(), dir.path(), |c| {
        c.sessions.max_sessions = 20;
        c.sessions.unused_ttl_secs = 600;
    })
    .await;
    let t = Target::plain(p.addr);
    let (ta, tb, tc) = (
        t.via_peer("127.0.0.2"),
        t.via_peer("127.0.0.3"),
        t.via_peer("127.0.0.4"),
    );
    let admin = p.admin_addr;
    let evicted = "mcp_resume_sessions_ended_total{reason=\"evicted\"}";
    // A holds 5, B 12 (the heaviest), and 3 anonymous: full.
    let mut a = Vec::new();
    let mut b = Vec::new();
    for _ in 0..5 {
        a.push(idle_used_session(&ta, &[A]).await);
    }
    for _ in 0..12 {
        b.push(idle_used_session(&tb, &[B]).await);
    }
    let mut anon = Vec::new();
    for _ in 0..3 {
        anon.push(idle_used_session(&t, &[]).await);
    }
    assert_eq!(metric_at(admin, "mcp_resume_sessions_active").await, 20.0);
    let c = ("authorization", "Bearer C");
    let s = idle_used_session(&tc, &[c]).await;
    assert_eq!(metric_at(admin, evicted).await, 1.0);
    assert!(
        !alive(&tb, &b[0], &[B]).await,
        "B's longest-idle session goes first"
    );
    for s in &a {
        assert!(alive(&ta, s, &[A]).await);
    }
    for s in &anon {
        assert!(alive(&t, s, &[]).await);
    }
    assert!(alive(&tc, &s, &[c]).await);
    p.stop().await;

    // A holds half the proxy; an anonymous flood fills the other half, then keeps opening.
    let dir = tempfile::tempdir().unwrap();
    let p = start_in_process(&stub.sse_url(), dir.path(), |c| {
        c.sessions.max_sessions = 20;
        c.sessions.unused_ttl_secs = 600;
    })
    .await;
    let t = Target::plain(p.addr);
    let ta = t.via_peer("127.0.0.2");
    let mut a = Vec::new();
    for _ in 0..10 {
        a.push(idle_used_session(&ta, &[A]).await);
    }
    let init = init_body(V_NEW, "flood");
    let h = [
        ("accept", "application/json, text/event-stream"),
        ("content-type", "application/json"),
    ];
    for i in 0..400 {
        let r = t.send("POST", "/mcp", &h, Some(&init)).await;
        assert_eq!(r.status, 200, "flood initialize {i}");
        r.sse().rest().await;
    }
    let mut lost = 0;
    for s in &a {
        if !alive(&ta, s, &[A]).await {
            lost += 1;
        }
    }
    assert_eq!(
        lost, 0,
        "an anonymous flood evicted {lost} of A's idle sessions"
    );
    p.stop().await;
}

/// Header identities are unverified: anyone can send a new `Authorization` value with every
/// request. Quotas and eviction count every one of them from one address as one owner, so six
/// made-up values cannot outweigh a real user's three idle sessions and evict them (they did:
/// each forged value counted as an owner of one). The binding still uses the full identity: the
/// forged sessions are not each other's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_identities_from_one_peer_are_one_owner() {
    let stub =
        StubUpstream::start(|p, _| format!("http://127.0.0.1:{p}/messages?sid={{sid}}")).await;
    let dir = tempfile::tempdir().unwrap();
    let p = start_in_process(&stub.sse_url(), dir.path(), |c| {
        c.sessions.max_sessions = 6;
        c.sessions.unused_ttl_secs = 600;
    })
    .await;
    let t = Target::plain(p.addr);
    let (user, attacker) = (t.via_peer("127.0.0.2"), t.via_peer("127.0.0.3"));
    let admin = p.admin_addr;
    let mut mine = Vec::new();
    for _ in 0..3 {
        mine.push(idle_used_session(&user, &[A]).await);
    }
    let forged: Vec<String> = (0..6).map(|i| format!("Bearer made-up-{i}")).collect();
    let mut theirs = Vec::new();
    for f in &forged {
        let who = [("authorization", f.as_str())];
        theirs.push(idle_used_session(&attacker, &who).await);
    }
    // Their six values are one owner: once the proxy was full, each of the 4th to 6th opens
    // weighed 4 against the user's 3 and evicted the attacker's own oldest.
    assert_eq!(metric_at(admin, "mcp_resume_sessions_active").await, 6.0);
    assert_eq!(
        metric_at(admin, "mcp_resume_sessions_ended_total{reason=\"evicted\"}").await,
        3.0
    );
    for s in &mine {
        assert!(
            alive(&user, s, &[A]).await,
            "made-up identities evicted a real user's idle session"
        );
    }
    for i in 0..3 {
        let who = [("authorization", forged[i].as_str())];
        assert!(
            !alive(&attacker, &theirs[i], &who).await,
            "forged session {i}"
        );
    }
    for i in 3..6 {
        let who = [("authorization", forged[i].as_str())];
        assert!(
            alive(&attacker, &theirs[i], &who).await,
            "forged session {i}"
        );
        // Bound to its own value: another forged value does not reach it.
        let other = [("authorization", forged[(i + 1) % 6].as_str())];
        let r = mcp_post(&attacker, &theirs[i], &other, &echo(3, "steal")).await;
        assert_eq!(r.status, 404, "a session reached with another identity");
    }
    p.stop().await;
}

/// `sessions.unused_ttl_secs`: a probing client — the Python SDK opening a session, initializing
/// and leaving without DELETE (what mcp-remote-style transport probes do) — and a legacy probe
/// (open, initialize, leave) are closed once it has passed (`idle_timeout`); a session that was
/// used survives until `idle_ttl_secs`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probe_sessions_end_after_unused_ttl_used_ones_stay() {
    let (_up, _tap, proxy) = fastmcp_proxy(|c| {
        c.sessions.unused_ttl_secs = 1;
        c.sessions.idle_ttl_secs = 60;
    })
    .await;
    let t = Target::plain(proxy.addr());
    let admin = proxy.running.admin_addr;
    let idle = "mcp_resume_sessions_ended_total{reason=\"idle_timeout\"}";
    let used = mcp_init(&t, V_NEW, &[A]).await;
    let done = mcp_call(&t, &used, &[A], &echo(1, "used")).await;
    assert_eq!(done["result"]["content"][0]["text"], "used");

    let mut probe = py_auth_client(&proxy.url(), &["--header", A_HEADER, "--probe"]);
    let connected = parse(&probe.line_async().await.expect("connected line"));
    let probed = connected["session_id"].as_str().unwrap().to_string();
    assert_eq!(
        probe
            .line_async()
            .await
            .map(|l| parse(&l)["result"].is_null()),
        Some(true)
    );
    assert_eq!(probe.wait(), Some(0));
    let (sse, legacy_probe, _) = legacy_session_as(&t, &[A]).await;
    sse.cut();

    wait_metric(admin, idle, |v| v >= 2.0).await;
    assert!(
        !alive(&t, &probed, &[A]).await,
        "the SDK's probe session still lives"
    );
    let r = legacy_post(&t, &legacy_probe, &[A], &echo(3, "x")).await;
    refused(r, 404, "unknown_session").await;
    assert_eq!(
        metric_at(
            admin,
            "mcp_resume_sessions_ended_total{reason=\"client_delete\"}"
        )
        .await,
        0.0,
        "the probe left without DELETE"
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        alive(&t, &used, &[A]).await,
        "a used session ended before idle_ttl_secs"
    );
    assert_eq!(metric_at(admin, idle).await, 2.0);
    proxy.stop().await;
}

// ---------------------------------------------------------------------------------------------
// 9. Standalone stream takeover

/// Reads the standalone stream until `n` messages (not priming events) have arrived.
async fn messages(sse: &mut Sse, n: usize) -> Vec<Ev> {
    let mut out = Vec::new();
    while out.len() < n {
        let ev = sse.next().await.expect("stream open");
        if !ev.is_priming() {
            out.push(ev);
        }
    }
    out
}

fn log_data(evs: &[Ev]) -> Vec<String> {
    evs.iter()
        .map(|e| e.json()["params"]["data"].as_str().unwrap().to_string())
        .collect()
}

/// A session bound to an identity whose standalone GET stream was cut half-open (the proxy still
/// sees it attached): the same identity's plain GET gets 200 — not 409 — and the later
/// notifications; the 2025-11-25 stream started with a logged priming event, whose cursor
/// resumes exactly. Another identity's GET is still 404. A bearer session answers a second plain
/// GET with 409 `stream_active`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_owner_takes_over_a_half_open_standalone_stream() {
    let (_up, _tap, proxy) = fastmcp_proxy(|_| {}).await;
    let relay = HalfOpenRelay::start(proxy.addr()).await;
    let direct = Target::plain(proxy.addr());
    let via = Target::plain(relay.addr);
    let sid = mcp_init(&direct, V_NEW, &[A]).await;
    let mut first = mcp_get(&via, &sid, &[A], None).await.sse();
    let priming = first.next().await.expect("priming");
    assert!(priming.is_priming() && priming.id.is_some(), "{priming:?}");
    let p1 = priming.id.unwrap();
    assert!(p1.starts_with(&format!("{sid}:")));
    assert_eq!(relay.half_open(|b| b.starts_with("GET /mcp")), 1);
    drop(first);

    refused(
        mcp_get(&direct, &sid, &[B], None).await,
        404,
        "unknown_session",
    )
    .await;
    let r = mcp_get(&direct, &sid, &[A], None).await;
    assert_eq!(r.status, 200, "the owner's plain GET takes the stream over");
    let mut second = r.sse();
    let done = mcp_call(&direct, &sid, &[A], &tool_call(5, "burst", json!({"n": 3}))).await;
    assert_eq!(done["result"]["content"][0]["text"], "burst 3");
    let live = messages(&mut second, 3).await;
    assert_eq!(log_data(&live), ["burst 1", "burst 2", "burst 3"]);

    // The priming cursor of the first connection resumes exactly what came after it.
    let r = mcp_get(&direct, &sid, &[A], Some(&p1)).await;
    assert_eq!(r.status, 200);
    let mut third = r.sse();
    let replay = messages(&mut third, 3).await;
    assert_eq!(log_data(&replay), ["burst 1", "burst 2", "burst 3"]);
    let ids: Vec<u64> = replay.iter().map(|e| e.seq()).collect();
    assert_eq!(
        ids,
        live.iter().map(|e| e.seq()).collect::<Vec<_>>(),
        "same ids"
    );
    assert!(ids.windows(2).all(|w| w[0] < w[1]) && ids[0] > seq_of(&p1));
    // The resume took the stream over from the plain GET's connection.
    assert_eq!(
        second.next_within(WAIT).await,
        Ok(None),
        "old connection closed"
    );
    assert_eq!(proxy.metric(AUTH_REJECTED_STREAMABLE).await, 1.0);

    // A bearer session keeps one standalone connection.
    let bearer = mcp_init(&direct, V_NEW, &[]).await;
    let _one = mcp_get(&direct, &bearer, &[], None).await.sse();
    refused(
        mcp_get(&direct, &bearer, &[], None).await,
        409,
        "stream_active",
    )
    .await;
    refused(
        mcp_get(&direct, &bearer, &[A], None).await,
        409,
        "stream_active",
    )
    .await;
    proxy.stop().await;
}

/// The Python SDK (it opens the standalone GET itself and reconnects it with `Last-Event-ID`),
/// sending `Authorization`: after a half-open cut of its standalone stream, log notifications sent
/// meanwhile reach it, each exactly once, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_sdk_standalone_stream_survives_a_half_open_cut() {
    let (_up, _tap, proxy) = fastmcp_proxy(|_| {}).await;
    let relay = HalfOpenRelay::start(proxy.addr()).await;
    let direct = Target::plain(proxy.addr());
    let mut client = py_auth_client(
        &format!("http://{}/mcp", relay.addr),
        &["--header", A_HEADER, "--expect-logs", "3"],
    );
    let connected = parse(&client.line_async().await.expect("connected"));
    let sid = connected["session_id"].as_str().unwrap().to_string();
    assert_eq!(connected["protocol_version"], V_NEW);
    // Wait for its standalone GET, and give it time to read the priming event.
    let deadline = tokio::time::Instant::now() + WAIT;
    while relay.open_matching(|b| b.starts_with("GET /mcp")) == 0 {
        assert!(tokio::time::Instant::now() < deadline, "no standalone GET");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(relay.half_open(|b| b.starts_with("GET /mcp")), 1);
    let done = mcp_call(
        &direct,
        &sid,
        &[A],
        &tool_call(50, "burst", json!({"n": 3})),
    )
    .await;
    assert_eq!(done["result"]["content"][0]["text"], "burst 3");
    let mut out = None;
    while let Some(line) = client.line_async().await {
        let v = parse(&line);
        if v.get("logs").is_some() {
            out = Some(v);
        }
    }
    assert_eq!(client.wait(), Some(0));
    let out = out.expect("result line");
    assert_eq!(
        out["logs"],
        json!(["burst 1", "burst 2", "burst 3"]),
        "{out}"
    );
    let gets: Vec<String> = relay
        .client_bytes()
        .into_iter()
        .filter(|c| c.starts_with("GET /mcp"))
        .collect();
    assert!(gets.len() >= 2, "the SDK reconnected its standalone stream");
    assert!(
        gets[1..].iter().all(|g| g
            .to_ascii_lowercase()
            .contains(&format!("last-event-id: {sid}:"))),
        "it resumed with its cursor: {gets:?}"
    );
    assert_eq!(proxy.metric(AUTH_REJECTED_STREAMABLE).await, 0.0);
    proxy.stop().await;
}

// ---------------------------------------------------------------------------------------------
// 10. JSON depth on the legacy face

/// §11b caps JSON depth on every face (`jsonrpc::MAX_DEPTH` = 64): the legacy face's
/// `POST /messages` refuses a body nested 100 deep as the sessionful face does (400 `-32600`
/// `invalid_request`, "nested deeper than 64 levels") and forwards nothing; one nested 60 deep
/// reaches the upstream. (The JSON parser's own limit is 128: 65–127 used to pass.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn legacy_posts_nested_too_deep_are_refused_before_the_upstream() {
    let stub =
        StubUpstream::start(|p, _| format!("http://127.0.0.1:{p}/messages?sid={{sid}}")).await;
    let dir = tempfile::tempdir().unwrap();
    let p = start_in_process(&stub.sse_url(), dir.path(), |_| {}).await;
    let t = Target::plain(p.addr);
    let (_sse, session) = legacy_open(&t, &[]).await;
    // Depth = the message object, its params object, then the arrays.
    let nested = |depth: usize| {
        let n = depth - 2;
        format!(
            r#"{{"jsonrpc":"2.0","method":"notifications/deep","params":{{"x":{}{}}}}}"#,
            "[".repeat(n),
            "]".repeat(n)
        )
    };
    let v = refused(
        legacy_post(&t, &session, &[], &nested(100)).await,
        400,
        "invalid_request",
    )
    .await;
    assert_eq!(v["error"]["code"], -32600, "{v}");
    let message = v["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("nested deeper than 64"), "{v}");
    let r = legacy_post(&t, &session, &[], &nested(65)).await;
    assert_eq!(r.status, 400, "65 deep is refused too");
    assert!(
        stub.posts().is_empty(),
        "a too-deep body reached the upstream: {:?}",
        stub.posts().iter().map(|b| b.len()).collect::<Vec<_>>()
    );

    let r = legacy_post(&t, &session, &[], &nested(60)).await;
    assert_eq!(r.status, 202, "60 deep is forwarded");
    let deadline = tokio::time::Instant::now() + WAIT;
    while stub.posts().is_empty() && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let posts = stub.posts();
    assert_eq!(posts.len(), 1, "one body reached the upstream");
    assert!(posts[0].contains("notifications/deep"), "{}", posts[0]);
    p.stop().await;
}
