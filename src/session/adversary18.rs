//! Adversarial review 18: distinct JSON-RPC ids that `jsonrpc::canonical` mapped to one string.
//!
//! Older than the 2026-12-04 hot-path commits (the scanner agrees with `peek_serde` here; the
//! collision was in `canonical`, which both use). The in-flight map is keyed by the canonical id,
//! and `canonical` re-serialised numbers through `serde_json::Value` (f64 beyond u64/i64), so two
//! requests whose integer ids differ beyond f64's precision shared one in-flight entry: the second
//! registration replaced the first, and an upstream that echoes ids exactly (the Python SDK:
//! arbitrary-precision ints) had its response to the first request routed to the second
//! request's stream, completing it; the first request was never answered. Both tests failed
//! before `canonical` kept such numbers as sent; they pass since.

use std::sync::Arc;

use bytes::Bytes;

use super::*;
use crate::config::{Config, Durability};
use crate::demo::upstream::{MemoryUpstream, UpstreamOptions};
use crate::upstream::UpstreamSettings;

async fn session() -> (Arc<Registry>, Arc<Session>, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = Config::default();
    cfg.log.dir = dir.path().join("data");
    cfg.log.durability = Durability::Relaxed;
    cfg.upstream.sse_url = "http://upstream.test/sse".into();
    let metrics = Metrics::new();
    let (log, _, _) = Log::open(&cfg.log, metrics.clone()).await.unwrap();
    let up = MemoryUpstream::new(UpstreamOptions::default());
    let client = crate::upstream::memory_client(Arc::new(move |_| Ok(up.connect())));
    let settings = UpstreamSettings::from_config(&cfg.upstream).expect("plain http");
    let reg = Registry::with_client(cfg.sessions, log, metrics, settings, client);
    let (s, _hold) = reg
        .open(Facade::Streamable, None, None, Owner::Unknown)
        .await
        .unwrap();
    (reg, s, dir)
}

/// Registers request `body` as in flight on `stream`, as `Session::forward` does.
fn register(s: &Session, body: &[u8], stream: StreamTag) {
    let p = jsonrpc::peek(body).unwrap();
    let mut st = s.lock();
    st.next_serial += 1;
    let serial = st.next_serial;
    st.inflight.insert(
        p.id.unwrap(),
        Inflight {
            stream,
            progress_token: None,
            serial,
            timer: None,
        },
    );
}

#[tokio::test(start_paused = true)]
async fn adv18_distinct_big_integer_ids_are_routed_to_their_own_streams() {
    let (reg, s, _dir) = session().await;
    let (a, b) = (s.new_post_stream(), s.new_post_stream());
    let req_a = br#"{"jsonrpc":"2.0","id":100000000000000000001,"method":"tools/call","params":{"name":"x"}}"#;
    let req_b = br#"{"jsonrpc":"2.0","id":100000000000000000002,"method":"tools/call","params":{"name":"y"}}"#;
    register(&s, req_a, a);
    register(&s, req_b, b);
    // The upstream answers A first, echoing its id exactly.
    let resp_a = Bytes::from_static(
        br#"{"jsonrpc":"2.0","id":100000000000000000001,"result":{"content":[]}}"#,
    );
    let ev = s
        .route(resp_a, Instant::now(), &reg.metrics)
        .expect("routed");
    assert_eq!(
        ev.stream, a,
        "the response to request A went to stream {:?} (B's is {b:?}), completing {:?}",
        ev.stream, ev.completes
    );
}

#[test]
fn adv18_distinct_ids_have_distinct_canonical_forms() {
    for (x, y) in [
        ("100000000000000000001", "100000000000000000002"),
        ("18446744073709551616", "18446744073709551617"),
        ("0.1", "0.10000000000000000001"),
    ] {
        let px = jsonrpc::peek(format!(r#"{{"id":{x},"method":"m"}}"#).as_bytes()).unwrap();
        let py = jsonrpc::peek(format!(r#"{{"id":{y},"result":{{}}}}"#).as_bytes()).unwrap();
        assert_ne!(px.id, py.id, "ids {x} and {y} collide");
    }
}
