//! The Streamable HTTP face over raw HTTP, for what the SDK clients do not exercise: priming only
//! for 2025-11-25 clients, cross-stream isolation on resume, the §4 refusals on both stream kinds
//! (status, body, counter), takeover, 2025-03-26 batches, DELETE, request validation, and
//! upstream loss (-32091 on the request's own stream, then 404). Each test runs in front of both
//! real legacy upstreams: Python FastMCP and server-everything (`sse` mode).
//!
//! Run: `cargo test --test streamable_raw` (after `scripts/install-peers`).

mod support;

use serde_json::{json, Value};
use support::streamable::*;
use support::*;

/// One test per upstream.
macro_rules! both {
    ($name:ident) => {
        mod $name {
            use super::*;
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn fastmcp() {
                super::$name(Kind::FastMcp).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn everything() {
                super::$name(Kind::Everything).await
            }
        }
    };
}

fn desc(evs: &[Ev]) -> Vec<String> {
    evs.iter()
        .filter(|e| !e.is_priming())
        .map(Ev::describe)
        .collect()
}

fn progress_then(steps: std::ops::RangeInclusive<u32>, last: String) -> Vec<String> {
    steps
        .map(|i| format!("progress {}", f64::from(i)))
        .chain(std::iter::once(last))
        .collect()
}

fn is_log(e: &Ev) -> bool {
    !e.is_priming() && e.json()["method"] == "notifications/message"
}

/// Makes the upstream send at least one log notification on the standalone stream (FastMCP:
/// `burst 1`; server-everything: simulated logging switched on and off, which logs once at once).
async fn standalone_event(kind: Kind, c: &mut Client) {
    let calls: Vec<(&str, Value)> = match kind {
        Kind::FastMcp => vec![("burst", json!({"n": 1}))],
        Kind::Everything => vec![
            ("toggle-simulated-logging", json!({})),
            ("toggle-simulated-logging", json!({})),
        ],
    };
    for (tool, args) in calls {
        let (id, mut s) = c.call(tool, args, "log").await;
        let evs = s.rest().await;
        assert_eq!(desc(&evs), vec![format!("response {id}")], "{tool}");
    }
}

/// A §4 refusal: status, content type, JSON-RPC error body. Returns `error.data`.
async fn refused(r: Resp, status: u16, reason: &str, last_event_id: &str) -> Value {
    assert_eq!(r.status, status, "refusal status for {reason}");
    assert_eq!(
        r.header("content-type").as_deref(),
        Some("application/json")
    );
    let v = r.json().await;
    assert_eq!(v["jsonrpc"], "2.0", "{v}");
    assert_eq!(v["id"], Value::Null, "{v}");
    assert_eq!(v["error"]["code"], -32090, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("resume_gap"),
        "{v}"
    );
    let data = v["error"]["data"].clone();
    assert_eq!(data["reason"], reason, "{v}");
    assert_eq!(data["last_event_id"], last_event_id, "{v}");
    data
}

async fn start(kind: Kind) -> (Upstream, Proxy) {
    let up = Upstream::start(kind);
    let proxy = Proxy::start(&up, |_| {}).await;
    (up, proxy)
}

// ---------------------------------------------------------------------------------------------

async fn priming_only_for_2025_11_25(kind: Kind) {
    let (_up, proxy) = start(kind).await;

    // 2025-11-25: every POST stream starts with a logged priming event carrying `retry`.
    let (mut c, evs, raw) = Client::init_raw(proxy.addr(), "2025-11-25").await;
    assert_eq!(evs.len(), 2, "{evs:?}");
    let p = &evs[0];
    assert!(
        p.is_priming() && p.event.is_none() && p.retry == Some(1000),
        "{p:?}"
    );
    let pid = p.id.clone().expect("priming id");
    assert!(pid.starts_with(&format!("{}:1:", c.session)), "{pid}");
    assert!(
        raw.starts_with(&format!("id: {pid}\nretry: 1000\ndata: \n\n")),
        "priming frame: {raw:?}"
    );
    assert_eq!(evs[1].event.as_deref(), Some("message"));
    assert!(evs[1].seq() > p.seq());
    assert_eq!(c.version, "2025-11-25");
    let (id, mut s) = c.call("echo", kind.echo_args("a"), "t").await;
    let evs = s.rest().await;
    assert!(evs[0].is_priming() && evs[0].retry == Some(1000), "{evs:?}");
    assert_eq!(desc(&evs), vec![format!("response {id}")]);
    assert_eq!(evs.len(), 2);

    // The request's own version decides: a request at 2025-06-18 gets no priming.
    c.version = "2025-06-18".into();
    let (id, mut s) = c.call("echo", kind.echo_args("b"), "t").await;
    let evs = s.rest().await;
    assert_eq!(desc(&evs), vec![format!("response {id}")]);
    assert_eq!(evs.len(), 1, "no priming: {evs:?}");

    // Older clients never see a priming event (they would choke on empty data).
    for version in ["2025-06-18", "2025-03-26"] {
        let (mut c, evs) = Client::init(proxy.addr(), version).await;
        assert_eq!(evs.len(), 1, "{version}: {evs:?}");
        assert!(!evs[0].is_priming() && evs[0].id.is_some());
        let (id, mut s) = c.call("echo", kind.echo_args("c"), "t").await;
        let evs = s.rest().await;
        assert_eq!(evs.len(), 1, "{version}: {evs:?}");
        assert_eq!(desc(&evs), vec![format!("response {id}")]);
        assert!(evs[0].id.is_some(), "logged events always carry an id");
    }
    proxy.stop().await;
}
both!(priming_only_for_2025_11_25);

// ---------------------------------------------------------------------------------------------

async fn cross_stream_isolation_on_resume(kind: Kind) {
    let (_up, proxy) = start(kind).await;
    let (mut c, _) = Client::init(proxy.addr(), "2025-11-25").await;
    let mut g = c.get(None).await.sse();
    // The standalone stream of a 2025-11-25 client carries a logged priming event when it opens
    // (after what the upstream sent before, e.g. server-everything's early list_changed).
    let opened = g.until(|e| e.is_priming()).await;
    assert!(opened.last().unwrap().id.is_some(), "{opened:?}");
    let steps = 6;
    let (tool, args) = kind.long_call(steps);
    let (ida, mut a) = c.call(tool, args.clone(), "A").await;
    let (idb, mut b) = c.call(tool, args, "B").await;

    // A's connection drops after its second progress notification.
    let a1 = a
        .until(|e| !e.is_priming() && e.describe() == "progress 2")
        .await;
    assert!(a1[0].is_priming());
    assert_eq!(desc(&a1), ["progress 1", "progress 2"]);
    let cursor = a1.last().unwrap().id.clone().unwrap();
    a.cut();

    // B is unaffected and ends after its response.
    let b_all = b.rest().await;
    assert!(b_all[0].is_priming());
    assert_eq!(
        desc(&b_all),
        progress_then(1..=steps, format!("response {idb}"))
    );

    // A resumes: only A's stream, from the cursor on, then it ends after A's response.
    let r = c.get(Some(&cursor)).await;
    assert_eq!(r.status, 200);
    let a2 = r.sse().rest().await;
    assert_eq!(
        desc(&a2),
        progress_then(3..=steps, format!("response {ida}"))
    );
    assert!(a2.iter().all(|e| e.seq() > a1.last().unwrap().seq()));
    for (evs, token) in [(&a1, "A"), (&a2, "A"), (&b_all, "B")] {
        for e in evs.iter().filter(|e| !e.is_priming()) {
            let m = e.json();
            if m["method"] == "notifications/progress" {
                assert_eq!(m["params"]["progressToken"], token, "{m}");
            }
        }
    }

    // The standalone stream carries the rest, and nothing of A's or B's.
    standalone_event(kind, &mut c).await;
    // Everything the standalone stream carried, from its first event (what the upstream sent
    // before the GET, and the priming event) on.
    let mut g_all = opened;
    g_all.extend(
        g.until(|e| is_log(e) && kind == Kind::Everything || e.text().contains("burst 1"))
            .await,
    );
    assert_eq!(c.delete().await.status, 200);
    g_all.extend(g.rest().await);
    for e in g_all.iter().filter(|e| !e.is_priming()) {
        let m = e.json();
        assert!(
            m["method"] == "notifications/message"
                || m["method"] == "notifications/tools/list_changed",
            "only unrelated messages on the standalone stream: {m}"
        );
    }
    let logs: Vec<String> = g_all
        .iter()
        .filter(|e| is_log(e))
        .map(|e| {
            e.json()["params"]["data"]
                .as_str()
                .unwrap_or("")
                .to_string()
        })
        .collect();
    if kind == Kind::FastMcp {
        let mut want: Vec<String> = kind
            .long_logs(steps)
            .into_iter()
            .chain(kind.long_logs(steps))
            .collect();
        want.push("burst 1".into());
        let mut got = logs.clone();
        want.sort();
        got.sort();
        assert_eq!(got, want, "each log exactly once on the standalone stream");
    } else {
        assert_eq!(logs.len(), 1, "{logs:?}");
    }

    // No event on two streams: every id is unique, and each stream's ids increase.
    let mut ids: Vec<u64> = [&a1, &a2, &b_all, &g_all]
        .iter()
        .flat_map(|evs| evs.iter().map(Ev::seq))
        .collect();
    for evs in [&a1, &a2, &b_all, &g_all] {
        let s: Vec<u64> = evs.iter().map(Ev::seq).collect();
        assert!(s.windows(2).all(|w| w[0] < w[1]), "{s:?}");
    }
    let n = ids.len();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), n, "an event id appeared on two streams");

    // Resuming the standalone stream (session now ended, log kept) replays only its own events.
    let r = c.get(Some(g_all[0].id.as_deref().unwrap())).await;
    assert_eq!(r.status, 200);
    let replay = r.sse().rest().await;
    assert_eq!(replay, g_all[1..].to_vec());
    // A's cursor still replays A's stream to its end.
    let r = c.get(Some(&cursor)).await;
    assert_eq!(
        desc(&r.sse().rest().await),
        progress_then(3..=steps, format!("response {ida}"))
    );
    proxy.stop().await;
}
both!(cross_stream_isolation_on_resume);

// ---------------------------------------------------------------------------------------------

async fn refusals_on_both_stream_kinds(kind: Kind) {
    let up = Upstream::start(kind);
    let proxy = Proxy::start(&up, |cfg| cfg.log.max_events_per_session = 20).await;
    let (mut c, init_evs) = Client::init(proxy.addr(), "2025-11-25").await;
    let post_cursor = init_evs[0].id.clone().unwrap(); // the initialize stream's priming event
    let mut g = c.get(None).await.sse();
    standalone_event(kind, &mut c).await;
    let std_cursor = g.until(is_log).await.last().unwrap().id.clone().unwrap();
    let (c2, _) = Client::init(proxy.addr(), "2025-11-25").await;
    let sid = c.session.clone();

    // malformed_cursor
    let d = refused(
        c.get(Some("not-a-cursor")).await,
        400,
        "malformed_cursor",
        "not-a-cursor",
    )
    .await;
    assert_eq!(d["session_id"], Value::Null);
    // foreign_session, with a cursor of each stream kind
    for cur in [&post_cursor, &std_cursor] {
        let d = refused(c2.get(Some(cur)).await, 409, "foreign_session", cur).await;
        assert_eq!(d["session_id"], sid.as_str());
    }
    // unknown_session
    let other = "0123456789abcdef0123456789abcdef";
    let lei = format!("{other}:1:1");
    let r = send(
        proxy.addr(),
        "GET",
        "/mcp",
        &[
            ACCEPT_SSE,
            ("mcp-session-id", other),
            ("last-event-id", &lei),
        ],
        None,
    )
    .await;
    let d = refused(r, 404, "unknown_session", &lei).await;
    assert_eq!(d["session_id"], other);
    // cursor_ahead
    let lei = format!("{sid}:1:1000000");
    let d = refused(c.get(Some(&lei)).await, 409, "cursor_ahead", &lei).await;
    let head: u64 = d["log_head"]
        .as_str()
        .unwrap()
        .strip_prefix(&format!("{sid}:1:"))
        .unwrap()
        .parse()
        .unwrap();
    assert!((4..1000000).contains(&head), "{d}");
    assert_eq!(d["session_id"], sid.as_str());
    // unknown_epoch
    let lei = format!("{sid}:2:1");
    refused(c.get(Some(&lei)).await, 409, "unknown_epoch", &lei).await;

    // cursor_trimmed, on both kinds: 12 calls log 24 events; 20 are retained at most.
    for i in 0..12 {
        let (_, mut s) = c.call("echo", kind.echo_args(&format!("e{i}")), "t").await;
        assert_eq!(s.rest().await.len(), 2);
    }
    for cur in [&post_cursor, &std_cursor] {
        let d = refused(c.get(Some(cur)).await, 409, "cursor_trimmed", cur).await;
        let oldest: u64 = d["oldest_retained"]
            .as_str()
            .unwrap()
            .strip_prefix(&format!("{sid}:1:"))
            .unwrap()
            .parse()
            .unwrap();
        let cur_seq: u64 = cur.rsplit(':').next().unwrap().parse().unwrap();
        assert!(oldest > cur_seq, "{d}");
        assert!(d["log_head"].as_str().unwrap().starts_with(&sid), "{d}");
    }

    let m = proxy.metrics().await;
    for (reason, n) in [
        ("malformed_cursor", 1.0),
        ("foreign_session", 2.0),
        ("unknown_session", 1.0),
        ("cursor_ahead", 1.0),
        ("unknown_epoch", 1.0),
        ("cursor_trimmed", 2.0),
    ] {
        assert_eq!(
            metric_value(
                &m,
                &format!("mcp_resume_refusals_total{{reason=\"{reason}\"}}")
            ),
            n,
            "{reason}"
        );
    }
    assert_eq!(
        metric_value(&m, "mcp_resume_resumes_total{facade=\"streamable\"}"),
        0.0
    );
    drop(g);
    proxy.stop().await;
}
both!(refusals_on_both_stream_kinds);

// ---------------------------------------------------------------------------------------------

async fn takeover_of_live_streams(kind: Kind) {
    let (_up, proxy) = start(kind).await;
    let (mut c, _) = Client::init(proxy.addr(), "2025-11-25").await;

    // A POST stream: a resume while its connection is still open takes it over.
    let steps = 6;
    let (tool, args) = kind.long_call(steps);
    let (id, mut a) = c.call(tool, args, "T").await;
    let first = a
        .until(|e| !e.is_priming() && e.describe() == "progress 1")
        .await;
    let cursor = first.last().unwrap().id.clone().unwrap();
    let r = c.get(Some(&cursor)).await;
    assert_eq!(r.status, 200);
    let mut a2 = r.sse();
    let old_rest = a.rest().await; // the old connection is closed, without the response
    assert!(
        old_rest
            .iter()
            .all(|e| e.describe().starts_with("progress")),
        "{old_rest:?}"
    );
    assert_eq!(
        desc(&a2.rest().await),
        progress_then(2..=steps, format!("response {id}"))
    );

    // The standalone stream: a plain GET while it is live gets 409; a resume takes it over.
    let mut g = c.get(None).await.sse();
    let r = c.get(None).await;
    assert_eq!(r.status, 409);
    let v = r.json().await;
    assert_eq!(v["error"]["data"]["reason"], "stream_active", "{v}");
    standalone_event(kind, &mut c).await;
    let cursor = g.until(is_log).await.last().unwrap().id.clone().unwrap();
    let r = c.get(Some(&cursor)).await;
    assert_eq!(r.status, 200);
    let mut g2 = r.sse();
    let _ = g.rest().await; // ends: taken over
    assert_eq!(
        c.get(None).await.status,
        409,
        "the resumed connection is the live one"
    );
    standalone_event(kind, &mut c).await;
    let got = g2.until(is_log).await;
    let cur_seq: u64 = cursor.rsplit(':').next().unwrap().parse().unwrap();
    assert!(got.iter().all(|e| e.seq() > cur_seq), "{got:?}");
    assert!(
        proxy
            .metric("mcp_resume_resumes_total{facade=\"streamable\"}")
            .await
            >= 2.0,
        "resumes counted"
    );
    proxy.stop().await;
}
both!(takeover_of_live_streams);

// ---------------------------------------------------------------------------------------------

async fn batches_2025_03_26(kind: Kind) {
    let (_up, proxy) = start(kind).await;
    let (c, _) = Client::init(proxy.addr(), "2025-03-26").await;
    assert_eq!(c.version, "2025-03-26");
    let call = |id: u64, tool: &str, args: Value, token: &str| {
        json!({"jsonrpc":"2.0","id":id,"method":"tools/call",
            "params":{"name":tool,"arguments":args,"_meta":{"progressToken":token}}})
    };

    // Two requests and a notification: one stream, both responses, then it ends.
    let batch = json!([
        call(100, "echo", kind.echo_args("one"), "x"),
        {"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":999,"reason":"test"}},
        call(101, "echo", kind.echo_args("two"), "y"),
    ]);
    let r = c.post(&batch).await;
    assert_eq!(r.status, 200);
    let evs = r.sse().rest().await;
    let mut d = desc(&evs);
    d.sort();
    assert_eq!(d, ["response 100", "response 101"], "{evs:?}");
    assert!(evs.iter().all(|e| !e.is_priming() && e.id.is_some()));
    for e in &evs {
        let m = e.json();
        let want = if m["id"] == 100 { "one" } else { "two" };
        assert_eq!(m["result"]["content"][0]["text"], kind.echo_result(want));
    }

    // Two long calls in one batch, cut mid-way and resumed: the resumed stream ends after both
    // responses, and each message arrives exactly once.
    let (tool, args) = kind.long_call(4);
    let batch = json!([
        call(102, tool, args.clone(), "BA"),
        call(103, tool, args, "BB")
    ]);
    let r = c.post(&batch).await;
    assert_eq!(r.status, 200);
    let mut s = r.sse();
    let mut first = Vec::new();
    for _ in 0..3 {
        first.push(s.next().await.expect("event"));
    }
    s.cut();
    let cursor = first.last().unwrap().id.clone().unwrap();
    let r = c.get(Some(&cursor)).await;
    assert_eq!(r.status, 200);
    let all: Vec<Ev> = first.into_iter().chain(r.sse().rest().await).collect();
    let seqs: Vec<u64> = all.iter().map(Ev::seq).collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{seqs:?}");
    for (token, id) in [("BA", 102), ("BB", 103)] {
        let mine: Vec<String> = all
            .iter()
            .filter(|e| {
                let m = e.json();
                m["params"]["progressToken"] == token || m["id"] == id
            })
            .map(Ev::describe)
            .collect();
        assert_eq!(
            mine,
            progress_then(1..=4, format!("response {id}")),
            "{token}"
        );
    }
    assert_eq!(all.len(), 10);

    // Notifications alone: 202.
    let r = c
        .post(&json!([{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":998}}]))
        .await;
    assert_eq!(r.status, 202);
    // Batches are 2025-03-26 only; never with initialize; never empty.
    let mut c = c;
    c.version = "2025-06-18".into();
    let r = c
        .post(&json!([call(104, "echo", kind.echo_args("x"), "z")]))
        .await;
    c.version = "2025-03-26".into();
    assert_eq!(r.status, 400);
    assert_eq!(
        r.json().await["error"]["data"]["reason"],
        "batch_not_supported"
    );
    let init = json!([{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-03-26","capabilities":{},"clientInfo":{"name":"x","version":"0"}}}]);
    assert_eq!(c.post(&init).await.status, 400);
    assert_eq!(c.post_raw("[]", &[]).await.status, 400);
    proxy.stop().await;
}
both!(batches_2025_03_26);

/// Why the proxy splits a 2025-03-26 batch into one upstream POST per member: neither legacy
/// server takes a batch. Posted straight to the upstream's own message endpoint (no proxy), the
/// batch is refused 400 — the Python SDK's `SseServerTransport` validates the body as one
/// `JSONRPCMessage` ("Could not parse message"), the TypeScript SDK's `SSEServerTransport` parses
/// it with `JSONRPCMessageSchema` ("Invalid message") — while one of its members alone is accepted
/// (202). Through the proxy each member gets its own answer (`batches_2025_03_26`).
async fn legacy_upstreams_refuse_a_batch(kind: Kind) {
    let up = Upstream::start(kind);
    let (mut sse, err) = Sse::get(&up.sse_url(), &[]).await;
    assert!(err.is_none(), "GET {} failed: {err:?}", up.sse_url());
    let ep = sse.endpoint().await;
    let base = up.sse_url().trim_end_matches("/sse").to_string();
    let url = format!("{base}{ep}");
    let echo = |id: u64| {
        json!({"jsonrpc":"2.0","id":id,"method":"tools/call",
            "params":{"name":"echo","arguments":kind.echo_args("x")}})
    };
    let (status, body) = post(&url, &json!([echo(1), echo(2)])).await;
    assert_eq!(status, 400, "{kind:?} took a batch: {body}");
    let (status, body) = post(&url, &initialize(3)).await;
    assert_eq!(status, 202, "{kind:?}: {body}");
}
both!(legacy_upstreams_refuse_a_batch);

// ---------------------------------------------------------------------------------------------

async fn delete_ends_the_session(kind: Kind) {
    let (_up, proxy) = start(kind).await;
    let (c, _) = Client::init(proxy.addr(), "2025-11-25").await;
    let mut g = c.get(None).await.sse();
    assert_eq!(proxy.metric("mcp_resume_sessions_active").await, 1.0);
    let r = c.delete().await;
    assert_eq!(r.status, 200);
    let _ = g.rest().await; // the standalone stream ends with the session
    let r = c
        .post(&json!({"jsonrpc":"2.0","id":5,"method":"tools/list"}))
        .await;
    assert_eq!(r.status, 404);
    let v = r.json().await;
    assert_eq!(v["error"]["data"]["reason"], "unknown_session", "{v}");
    assert_eq!(v["id"], Value::Null, "session errors name no request");
    assert_eq!(c.get(None).await.status, 404);
    assert_eq!(c.delete().await.status, 404);
    let m = proxy.metrics().await;
    assert_eq!(
        metric_value(
            &m,
            "mcp_resume_sessions_ended_total{reason=\"client_delete\"}"
        ),
        1.0
    );
    assert_eq!(metric_value(&m, "mcp_resume_sessions_active"), 0.0);
    assert_eq!(
        metric_value(
            &m,
            "mcp_resume_client_streams_active{facade=\"streamable\"}"
        ),
        0.0
    );
    proxy.stop().await;
}
both!(delete_ends_the_session);

// ---------------------------------------------------------------------------------------------

async fn request_validation(kind: Kind) {
    let up = Upstream::start(kind);
    let proxy = Proxy::start(&up, |cfg| {
        cfg.streamable.allowed_origins = vec!["http://allowed.example".into()];
    })
    .await;
    let addr = proxy.addr();
    let init = json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{
        "protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"v","version":"0"}}})
    .to_string();
    let list = json!({"jsonrpc":"2.0","id":1,"method":"tools/list"}).to_string();

    // Refused before any session exists: nothing is started.
    let r = send(
        addr,
        "POST",
        "/mcp",
        &[("accept", "application/json"), JSON_CT],
        Some(&init),
    )
    .await;
    assert_eq!(r.status, 406);
    let r = send(
        addr,
        "POST",
        "/mcp",
        &[ACCEPT_BOTH, ("content-type", "text/plain")],
        Some(&init),
    )
    .await;
    assert_eq!(r.status, 415);
    let r = send(
        addr,
        "POST",
        "/mcp",
        &[ACCEPT_BOTH, JSON_CT, ("mcp-protocol-version", "1999-01-01")],
        Some(&init),
    )
    .await;
    assert_eq!(r.status, 400);
    assert_eq!(
        r.json().await["error"]["data"]["reason"],
        "unsupported_protocol_version"
    );
    for origin in ["http://evil.example", &format!("http://{addr}"), "null"] {
        let r = send(
            addr,
            "POST",
            "/mcp",
            &[ACCEPT_BOTH, JSON_CT, ("origin", origin)],
            Some(&init),
        )
        .await;
        assert_eq!(r.status, 403, "{origin}");
        let v = r.json().await;
        assert_eq!(v["error"]["data"]["reason"], "origin_not_allowed", "{v}");
    }
    let r = send(
        addr,
        "POST",
        "/mcp",
        &[ACCEPT_BOTH, JSON_CT],
        Some("{not json"),
    )
    .await;
    assert_eq!(r.status, 400);
    assert_eq!(r.json().await["error"]["code"], -32700);
    let r = send(addr, "POST", "/mcp", &[ACCEPT_BOTH, JSON_CT], Some(&list)).await;
    assert_eq!(r.status, 400, "no Mcp-Session-Id");
    assert_eq!(
        r.json().await["error"]["data"]["reason"],
        "missing_session_id"
    );
    let r = send(
        addr,
        "POST",
        "/mcp",
        &[
            ACCEPT_BOTH,
            JSON_CT,
            ("mcp-session-id", "0123456789abcdef0123456789abcdef"),
        ],
        Some(&list),
    )
    .await;
    assert_eq!(r.status, 404);
    assert_eq!(r.json().await["error"]["data"]["reason"], "unknown_session");
    let r = send(addr, "GET", "/mcp", &[ACCEPT_SSE], None).await;
    assert_eq!(r.status, 400);
    let r = send(addr, "PUT", "/mcp", &[], None).await;
    assert_eq!(r.status, 405);
    assert_eq!(r.header("allow").as_deref(), Some("GET, POST, DELETE"));
    assert_eq!(
        proxy
            .metric("mcp_resume_sessions_started_total{facade=\"streamable\"}")
            .await,
        0.0
    );

    // An allowed Origin, and none at all, are served.
    let r = send(
        addr,
        "POST",
        "/mcp",
        &[ACCEPT_BOTH, JSON_CT, ("origin", "http://allowed.example")],
        Some(&init),
    )
    .await;
    assert_eq!(r.status, 200);
    let sid = r.header("mcp-session-id").expect("session");
    let _ = r.sse().rest().await;
    let (c, _) = Client::init(addr, "2025-11-25").await;
    assert_ne!(c.session, sid);

    // With a session.
    let r = c
        .post(&json!({"jsonrpc":"2.0","method":"notifications/initialized"}))
        .await;
    assert_eq!(r.status, 202);
    assert!(r.bytes().await.is_empty(), "202 has no body");
    let r = c.post_raw(&init, &[]).await;
    assert_eq!(r.status, 400, "initialize inside a session");
    let mut c = c;
    c.version = "2099-01-01".into();
    let r = c.post_raw(&list, &[]).await;
    c.version = "2025-11-25".into();
    assert_eq!(r.status, 400);
    let mut h = c.headers();
    h.push(("accept", "application/json"));
    assert_eq!(send(addr, "GET", "/mcp", &h, None).await.status, 406);
    let mut h = c.headers();
    h.extend([ACCEPT_SSE, ("origin", "http://evil.example")]);
    assert_eq!(send(addr, "GET", "/mcp", &h, None).await.status, 403);
    let mut h = c.headers();
    h.push(("origin", "http://evil.example"));
    assert_eq!(send(addr, "DELETE", "/mcp", &h, None).await.status, 403);
    // A request without MCP-Protocol-Version is served (the session's version is assumed).
    let r = send(
        addr,
        "POST",
        "/mcp",
        &[ACCEPT_BOTH, JSON_CT, ("mcp-session-id", &c.session)],
        Some(&list),
    )
    .await;
    assert_eq!(r.status, 200);
    let evs = r.sse().rest().await;
    assert_eq!(desc(&evs), ["response 1"]);
    assert_eq!(
        proxy
            .metric("mcp_resume_sessions_started_total{facade=\"streamable\"}")
            .await,
        2.0
    );
    proxy.stop().await;
}
both!(request_validation);

// ---------------------------------------------------------------------------------------------

async fn upstream_loss_aborts_then_404(kind: Kind) {
    let (mut up, proxy) = start(kind).await;
    let (mut c, _) = Client::init(proxy.addr(), "2025-11-25").await;
    let mut g = c.get(None).await.sse();
    g.until(|e| e.is_priming()).await;
    let (tool, args) = kind.long_call(40);
    let (id, mut a) = c.call(tool, args, "L").await;
    let first = a
        .until(|e| !e.is_priming() && e.describe() == "progress 1")
        .await;
    let cursor = first.last().unwrap().id.clone().unwrap();

    up.proc.kill();

    // The in-flight request gets its -32091 error on its own stream, which then ends.
    let rest = a.rest().await;
    let (last, before) = rest.split_last().expect("the abort");
    let m = last.json();
    assert_eq!(m["id"], id, "{m}");
    assert_eq!(m["error"]["code"], -32091, "{m}");
    assert_eq!(m["error"]["data"]["reason"], "upstream_lost", "{m}");
    assert!(
        before.iter().all(|e| e.describe().starts_with("progress")),
        "{rest:?}"
    );
    // The standalone stream ends, and never carried the abort.
    let g_rest = g.rest().await;
    assert!(g_rest.iter().all(|e| e.json()["id"] != id), "{g_rest:?}");

    // Later requests: 404.
    let r = c
        .post(&json!({"jsonrpc":"2.0","id":77,"method":"tools/list"}))
        .await;
    assert_eq!(r.status, 404);
    assert_eq!(r.json().await["error"]["data"]["reason"], "unknown_session");
    assert_eq!(c.get(None).await.status, 404);
    assert_eq!(c.delete().await.status, 404);

    // The log is kept: a client that missed the end still gets it, then the stream ends.
    let r = c.get(Some(&cursor)).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.sse().rest().await, rest);
    // Nothing left after the abort: the session is over.
    let r = c.get(Some(last.id.as_deref().unwrap())).await;
    assert_eq!(r.status, 404);

    let m = proxy.metrics().await;
    assert_eq!(
        metric_value(
            &m,
            "mcp_resume_sessions_ended_total{reason=\"upstream_lost\"}"
        ),
        1.0
    );
    assert_eq!(metric_value(&m, "mcp_resume_inflight_aborted_total"), 1.0);
    proxy.stop().await;
}
both!(upstream_loss_aborts_then_404);

// ---------------------------------------------------------------------------------------------

async fn plain_get_and_completed_post_streams(kind: Kind) {
    let (_up, proxy) = start(kind).await;
    let (mut c, _) = Client::init(proxy.addr(), "2025-11-25").await;

    // What the upstream sent before any GET connected reaches the first plain GET.
    standalone_event(kind, &mut c).await;
    let mut g = c.get(None).await.sse();
    let first = g.until(is_log).await;
    let delivered = first.last().unwrap().seq();
    g.cut();
    // A later plain GET continues after what the previous connection delivered. (Until the
    // proxy notices the cut, the old connection still counts as live: 409.)
    let mut g2 = None;
    for _ in 0..400 {
        let r = c.get(None).await;
        if r.status == 200 {
            g2 = Some(r.sse());
            break;
        }
        assert_eq!(r.status, 409);
        let _ = r.bytes().await;
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let mut g2 = g2.expect("the proxy noticed the cut connection");
    standalone_event(kind, &mut c).await;
    let next = g2.until(is_log).await;
    assert!(
        next.iter().all(|e| e.seq() > delivered),
        "nothing delivered twice: {first:?} then {next:?}"
    );

    // A POST stream whose response was delivered: from its priming event the response is
    // replayed and the stream ends; from the response itself the stream ends at once.
    let (id, mut s) = c.call("echo", kind.echo_args("done"), "t").await;
    let evs = s.rest().await;
    assert_eq!(desc(&evs), vec![format!("response {id}")]);
    let r = c.get(evs[0].id.as_deref()).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.sse().rest().await, evs[1..].to_vec());
    let r = c.get(evs[1].id.as_deref()).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.sse().rest().await, Vec::<Ev>::new());
    assert_eq!(
        proxy
            .metric("mcp_resume_resumes_total{facade=\"streamable\"}")
            .await,
        2.0
    );
    proxy.stop().await;
}
both!(plain_get_and_completed_post_streams);
