//! Unit tests of the registry and its sessions: routing, takeover, eviction, the idle and unused
//! TTLs, the session cap and per-identity quotas. The upstream is the embedded demo server over
//! in-memory pipes (`tokio::io::duplex`), and time is tokio's paused clock, advanced by hand: no
//! sockets, no sleeps.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use serde_json::{json, Value};

use super::*;
use crate::config::{Config, Durability};
use crate::demo::upstream::{MemoryUpstream, UpstreamOptions};
use crate::identity::{AuthConfig, Keyring};

struct Fx {
    reg: Arc<Registry>,
    up: MemoryUpstream,
    _dir: tempfile::TempDir,
}

async fn fixture(f: impl FnOnce(&mut Config)) -> Fx {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = Config::default();
    cfg.log.dir = dir.path().join("data");
    cfg.log.durability = Durability::Relaxed;
    cfg.upstream.sse_url = "http://upstream.test/sse".into();
    f(&mut cfg);
    let metrics = Metrics::new();
    let (log, _, _) = Log::open(&cfg.log, metrics.clone()).await.unwrap();
    let up = MemoryUpstream::new(UpstreamOptions::default());
    let conn = up.clone();
    let client = upstream::memory_client(Arc::new(move |_| Ok(conn.connect())));
    let settings = UpstreamSettings::from_config(&cfg.upstream).expect("plain http");
    let reg = Registry::with_client(cfg.sessions, log, metrics, settings, client);
    Fx { reg, up, _dir: dir }
}

fn identity(token: &str) -> Identity {
    let mut h = http::HeaderMap::new();
    h.insert("authorization", token.parse().unwrap());
    Keyring::for_tests()
        .identity(&AuthConfig::default(), &h, None)
        .unwrap()
}

fn peer(last: u8) -> Owner {
    Owner::Peer(std::net::IpAddr::from([10, 0, 0, last]))
}

async fn open(fx: &Fx, facade: Facade, owner: Owner) -> Arc<Session> {
    let identity = match owner {
        Owner::Identity(i) => Some(i),
        _ => None,
    };
    let (s, _hold) = fx.reg.open(facade, None, identity, owner).await.unwrap();
    s
}

async fn send(fx: &Fx, s: &Arc<Session>, msg: Value, stream: StreamTag) {
    let body = Bytes::from(msg.to_string());
    let peek = jsonrpc::peek(&body).unwrap();
    s.forward(&fx.reg, body, &peek, stream).await.unwrap();
}

fn call(id: u64, tool: &str, args: Value, token: Option<&str>) -> Value {
    let mut params = json!({"name": tool, "arguments": args});
    if let Some(t) = token {
        params["_meta"] = json!({"progressToken": t});
    }
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params})
}

/// Every logged event of the session as (stream, kind, JSON).
fn events(fx: &Fx, s: &Session) -> Vec<(StreamTag, Kind, Value)> {
    fx.reg
        .log
        .read_held(&s.log, 0, 100_000)
        .unwrap()
        .iter()
        .map(|e| {
            let v = serde_json::from_slice(&e.payload).unwrap_or(Value::Null);
            (e.stream, e.kind, v)
        })
        .collect()
}

/// Waits (in paused time) until the log holds an event satisfying `pred`.
async fn until_logged(fx: &Fx, s: &Session, pred: impl Fn(&(StreamTag, Kind, Value)) -> bool) {
    for _ in 0..10_000 {
        if events(fx, s).iter().any(&pred) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    panic!("not logged: {:?}", events(fx, s));
}

fn ended(fx: &Fx, reason: EndReason) -> f64 {
    let text = fx.reg.metrics.render();
    let series = format!(
        "mcp_resume_sessions_ended_total{{reason=\"{}\"}} ",
        reason.as_str()
    );
    text.lines()
        .find_map(|l| l.strip_prefix(&series))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn responses_and_their_progress_go_to_the_request_stream_the_rest_to_the_default() {
    let fx = fixture(|_| {}).await;
    let s = open(&fx, Facade::Streamable, Owner::Unknown).await;
    let post = s.new_post_stream();
    send(
        &fx,
        &s,
        call(7, "count", json!({"n": 3, "interval_ms": 10}), Some("tok")),
        post,
    )
    .await;
    until_logged(&fx, &s, |(_, k, v)| *k == Kind::Final && v["id"] == 7).await;
    let evs = events(&fx, &s);
    let on_post: Vec<String> = evs
        .iter()
        .filter(|(t, _, _)| *t == post)
        .map(|(_, k, v)| match k {
            Kind::Final => format!("response {}", v["id"]),
            _ => format!(
                "{} {}",
                v["method"].as_str().unwrap(),
                v["params"]["progress"]
            ),
        })
        .collect();
    assert_eq!(
        on_post,
        [
            "notifications/progress 1",
            "notifications/progress 2",
            "notifications/progress 3",
            "response 7"
        ]
    );
    // The log notifications (no token) and the upstream's own messages go to the standalone
    // stream; no message is on two streams.
    let standalone = evs
        .iter()
        .filter(|(t, _, _)| *t == StreamTag::STANDALONE)
        .count();
    assert_eq!(standalone, 3, "{evs:?}");
    assert_eq!(evs.len(), on_post.len() + standalone);
    fx.reg.end(&s, EndReason::Shutdown).await;
}

#[tokio::test(start_paused = true)]
async fn an_attachment_takes_its_stream_over_and_an_exclusive_one_is_refused() {
    let fx = fixture(|_| {}).await;
    let s = open(&fx, Facade::Streamable, Owner::Unknown).await;
    let first = s.attach(StreamTag::STANDALONE, true).unwrap();
    assert!(
        s.attach(StreamTag::STANDALONE, true).is_none(),
        "exclusive: taken"
    );
    let second = s.attach(StreamTag::STANDALONE, false).unwrap();
    assert!(*first.kicked.borrow(), "the old connection is told to go");
    assert!(!*second.kicked.borrow());
    // Positions survive connections: the next connection starts after what was delivered.
    second.advance(5);
    drop(second);
    drop(first);
    assert_eq!(s.position(StreamTag::STANDALONE), 5);
    assert!(s.idle_since().is_some());
    fx.reg.end(&s, EndReason::Shutdown).await;
}

#[tokio::test(start_paused = true)]
async fn idle_sessions_end_after_their_ttl_unused_ones_sooner() {
    let fx = fixture(|c| {
        c.sessions.idle_ttl_secs = 60;
        c.sessions.unused_ttl_secs = 5;
    })
    .await;
    let used = open(&fx, Facade::Legacy, Owner::Unknown).await;
    send(
        &fx,
        &used,
        call(1, "echo", json!({"text": "x"}), None),
        StreamTag::LEGACY,
    )
    .await;
    let unused = open(&fx, Facade::Legacy, Owner::Unknown).await;
    // Opening (initialize) does not count as use.
    send(
        &fx,
        &unused,
        json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}}),
        StreamTag::LEGACY,
    )
    .await;
    // A client attached: not idle, however long.
    let attached = open(&fx, Facade::Legacy, Owner::Unknown).await;
    let _client = attached.attach(StreamTag::LEGACY, false).unwrap();

    tokio::time::advance(Duration::from_secs(4)).await;
    fx.reg.sweep().await;
    assert_eq!(fx.reg.live_count(), 3);
    tokio::time::advance(Duration::from_secs(2)).await;
    fx.reg.sweep().await;
    assert!(
        unused.is_ended() && !used.is_ended(),
        "the unused session went first"
    );
    tokio::time::advance(Duration::from_secs(55)).await;
    fx.reg.sweep().await;
    assert!(used.is_ended() && !attached.is_ended());
    assert_eq!(ended(&fx, EndReason::IdleTimeout), 2.0);
    // Its upstream session is closed with it.
    for _ in 0..1000 {
        if fx.up.open_sessions() == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert_eq!(fx.up.open_sessions(), 1);
}

#[tokio::test(start_paused = true)]
async fn the_session_cap_evicts_the_longest_idle_and_holds_under_concurrent_opens() {
    let fx = fixture(|c| c.sessions.max_sessions = 3).await;
    let a = open(&fx, Facade::Legacy, Owner::Unknown).await;
    tokio::time::advance(Duration::from_secs(1)).await;
    let b = open(&fx, Facade::Legacy, Owner::Unknown).await;
    let c = open(&fx, Facade::Legacy, Owner::Unknown).await;
    let _c_client = c.attach(StreamTag::LEGACY, false).unwrap();
    // Full: the longest-idle session (a) makes room.
    let d = open(&fx, Facade::Legacy, Owner::Unknown).await;
    assert!(a.is_ended() && !b.is_ended() && !d.is_ended());
    assert_eq!(ended(&fx, EndReason::Evicted), 1.0);
    // Everyone attached: no room, and 20 concurrent opens change nothing.
    let _b_client = b.attach(StreamTag::LEGACY, false).unwrap();
    let _d_client = d.attach(StreamTag::LEGACY, false).unwrap();
    let opens: Vec<_> = (0..20)
        .map(|_| {
            let reg = fx.reg.clone();
            tokio::spawn(async move {
                reg.open(Facade::Legacy, None, None, Owner::Unknown)
                    .await
                    .map(|_| ())
            })
        })
        .collect();
    for o in opens {
        assert!(matches!(o.await.unwrap(), Err(Error::Capacity(_))));
    }
    assert_eq!(fx.reg.live_count(), 3);
}

#[tokio::test(start_paused = true)]
async fn concurrent_opens_never_exceed_the_cap() {
    let fx = fixture(|c| c.sessions.max_sessions = 5).await;
    let opens: Vec<_> = (0..30)
        .map(|_| {
            let reg = fx.reg.clone();
            tokio::spawn(async move {
                // Each keeps its hold: a session being opened is not idle, so not evictable.
                reg.open(Facade::Legacy, None, None, Owner::Unknown).await
            })
        })
        .collect();
    let mut held = Vec::new();
    let mut refused = 0;
    for o in opens {
        match o.await.unwrap() {
            Ok(s) => held.push(s),
            Err(Error::Capacity(_)) => refused += 1,
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!((held.len(), refused), (5, 25));
    assert_eq!(fx.reg.live_count(), 5);
}

#[tokio::test(start_paused = true)]
async fn quotas_bound_each_owner_and_a_flood_evicts_only_its_own_sessions() {
    let fx = fixture(|c| {
        c.sessions.max_sessions = 6;
        c.sessions.max_per_identity = 4;
    })
    .await;
    let alice = Owner::Identity(identity("Bearer alice"));
    let a1 = open(&fx, Facade::Streamable, alice).await;
    let a2 = open(&fx, Facade::Streamable, alice).await;
    // An anonymous flood from one address: its own quota caps it, and once it is at its quota
    // each new open evicts its own longest-idle session, never alice's.
    let mut flood = Vec::new();
    for _ in 0..10 {
        tokio::time::advance(Duration::from_millis(10)).await;
        flood.push(open(&fx, Facade::Legacy, peer(9)).await);
    }
    assert!(
        !a1.is_ended() && !a2.is_ended(),
        "alice's idle sessions survive"
    );
    let live_flood = flood.iter().filter(|s| !s.is_ended()).count();
    assert_eq!(live_flood, 4, "the flood holds its quota");
    // When the whole proxy is full, the heaviest owner gives way.
    let b = open(&fx, Facade::Legacy, peer(2)).await;
    assert!(!b.is_ended() && !a1.is_ended() && !a2.is_ended());
    assert_eq!(
        flood.iter().filter(|s| !s.is_ended()).count(),
        3,
        "one of the flood's sessions made room"
    );
    // An owner at its quota with every session attached is refused.
    let _c: Vec<_> = flood
        .iter()
        .filter(|s| !s.is_ended())
        .map(|s| s.attach(StreamTag::LEGACY, false).unwrap())
        .collect();
    let mut counts: HashMap<Owner, usize> = HashMap::new();
    for s in fx.reg.lock().values() {
        *counts.entry(s.owner).or_default() += 1;
    }
    assert_eq!(counts[&alice], 2);
    assert_eq!(counts[&peer(9)], 3);
}

#[tokio::test(start_paused = true)]
async fn the_end_answers_what_was_in_flight_and_no_more_events_are_logged() {
    let fx = fixture(|_| {}).await;
    let s = open(&fx, Facade::Legacy, Owner::Unknown).await;
    send(
        &fx,
        &s,
        call(3, "count", json!({"n": 100, "interval_ms": 50}), Some("t")),
        StreamTag::LEGACY,
    )
    .await;
    until_logged(&fx, &s, |(_, _, v)| v["method"] == "notifications/progress").await;
    fx.reg.end(&s, EndReason::ClientDelete).await;
    let evs = events(&fx, &s);
    let (last, rest) = evs.split_last().unwrap();
    assert_eq!(last.1, Kind::End);
    let answer = &rest.last().unwrap().2;
    assert_eq!(answer["id"], 3);
    assert_eq!(answer["error"]["code"], jsonrpc::INFLIGHT_ABORTED);
    // Nothing after the end, however long the upstream would have gone on.
    tokio::time::advance(Duration::from_secs(10)).await;
    tokio::task::yield_now().await;
    assert_eq!(events(&fx, &s).len(), evs.len());
    assert!(matches!(
        s.forward(
            &fx.reg,
            Bytes::from_static(b"{}"),
            &jsonrpc::peek(b"{\"jsonrpc\":\"2.0\",\"method\":\"x\"}").unwrap(),
            StreamTag::LEGACY
        )
        .await,
        Err(Error::UnknownSession)
    ));
}

/// A request the upstream refuses with 404 (it lost the session before its stream noticed) after
/// the proxy recorded it in flight: the session ends and the request's one answer is the end's
/// -32091 on its stream, so the POST is accepted (a 404 besides would tell the client it was
/// never taken). A notification in the same position gets the 404.
#[tokio::test(start_paused = true)]
async fn a_request_the_upstream_refuses_404_gets_its_answer_on_the_stream_not_a_404() {
    let fx = fixture(|_| {}).await;
    let s = open(&fx, Facade::Streamable, Owner::Unknown).await;
    let post = s.new_post_stream();
    let _open = fx.up.forget_sessions();
    let body = Bytes::from(call(9, "echo", json!({"text": "x"}), None).to_string());
    let peek = jsonrpc::peek(&body).unwrap();
    s.forward(&fx.reg, body, &peek, post)
        .await
        .expect("accepted: its answer is the end's -32091");
    assert!(s.is_ended());
    let evs = events(&fx, &s);
    let answers: Vec<&Value> = evs
        .iter()
        .filter(|(t, _, v)| *t == post && v["id"] == 9)
        .map(|(_, _, v)| v)
        .collect();
    assert_eq!(answers.len(), 1, "{evs:?}");
    assert_eq!(answers[0]["error"]["code"], -32091);
    assert_eq!(answers[0]["error"]["data"]["reason"], "upstream_lost");

    let t = open(&fx, Facade::Legacy, Owner::Unknown).await;
    let _open = fx.up.forget_sessions();
    let note = Bytes::from(r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{}}"#);
    let peek = jsonrpc::peek(&note).unwrap();
    let r = t
        .forward(&fx.reg, note, &peek, StreamTag::LEGACY)
        .await
        .expect_err("a notification has no answer to carry the news");
    assert!(matches!(r, Error::UpstreamLost), "{r:?}");
}

/// A request whose id is that of one still in flight is refused, not recorded over it (its entry
/// would replace the first's: the first answer would go to the second's stream). The session's
/// own check: the faces check first, and this one holds when two POSTs race.
#[tokio::test(start_paused = true)]
async fn a_request_whose_id_is_in_flight_is_refused_and_the_first_stays_recorded() {
    let fx = fixture(|_| {}).await;
    let s = open(&fx, Facade::Streamable, Owner::Unknown).await;
    let (a, b) = (s.new_post_stream(), s.new_post_stream());
    // `count` with a long interval answers only after it: the first stays in flight.
    let slow =
        Bytes::from(call(4, "count", json!({"n": 1, "interval_ms": 3_600_000}), None).to_string());
    let peek = jsonrpc::peek(&slow).unwrap();
    s.forward(&fx.reg, slow, &peek, a).await.expect("forwarded");
    assert!(s.in_flight("4"));
    for again in [
        call(4, "echo", json!({"text": "x"}), None).to_string(),
        r#"{"jsonrpc":"2.0","id":4.0,"method":"tools/call","params":{"name":"echo","arguments":{"text":"y"}}}"#.to_string(),
    ] {
        let body = Bytes::from(again);
        let peek = jsonrpc::peek(&body).unwrap();
        let e = s
            .forward(&fx.reg, body, &peek, b)
            .await
            .expect_err("an id in flight");
        assert!(matches!(e, Error::Invalid { .. }), "{e:?}");
    }
    // Still the first's entry, on its stream.
    assert_eq!(s.lock().inflight.get("4").map(|i| i.stream), Some(a));
    // A notification with that id's number in its params is no request: taken.
    let note = Bytes::from(
        r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":4}}"#,
    );
    let peek = jsonrpc::peek(&note).unwrap();
    s.forward(&fx.reg, note, &peek, StreamTag::STANDALONE)
        .await
        .expect("a notification is forwarded");
}
