//! Adversarial review 19b of `db98611` (client streams: frames queued in bytes through
//! `crate::queue`, reads of large events a few at a time): exact event sequences when event sizes
//! alternate wildly (the read size shrinks to one event and grows back), a slow reader resuming
//! mid-way through large events, and what becomes of a stream's cursor task when its client goes
//! away while a large pack waits for room in the byte-bounded queue.

mod support;

use std::time::Duration;

use mcp_resume_proxy::demo::upstream::{Upstream, UpstreamOptions};
use serde_json::{json, Value};
use support::*;

const MIB: u64 = 1 << 20;

/// The emit seq and pad length of a `notifications/message` from the demo's `emit`.
fn emitted(m: &Value) -> Option<(u64, usize)> {
    (m["method"] == "notifications/message" && m["params"]["logger"] == "emit").then(|| {
        (
            m["params"]["data"]["seq"].as_u64().unwrap(),
            m["params"]["data"]["pad"].as_str().unwrap().len(),
        )
    })
}

/// The sizes of the emit bursts, in order: tiny, 1 MiB, 3.9 MiB, tiny, 3.9 MiB, 1 MiB, tiny...
const BURSTS: [(u64, u64); 8] = [
    (300, 10),
    (3, MIB),
    (2, 3 * MIB + 900 * 1024),
    (300, 0),
    (1, 3 * MIB + 900 * 1024),
    (40, 64 * 1024),
    (2, MIB),
    (200, 10),
];

fn expected() -> Vec<(u64, usize)> {
    let mut out = Vec::new();
    let mut seq = 0;
    for (count, size) in BURSTS {
        for _ in 0..count {
            seq += 1;
            out.push((seq, size as usize));
        }
    }
    out
}

/// Emits every burst on the session at `url` read by `sse`, each answered before the next (the
/// demo runs calls concurrently); returns the emitted (seq, pad) read and the last event seq.
async fn emit_and_read(url: &str, sse: &mut Sse, mut prev: u64) -> (Vec<(u64, usize)>, u64) {
    let mut got = Vec::new();
    for (i, (count, size)) in BURSTS.iter().enumerate() {
        let id = 10 + i as u64;
        let c = call(
            id,
            "emit",
            json!({"count": count, "rate_per_sec": 0, "size": size}),
            None,
        );
        assert_eq!(post(url, &c).await.0, 202);
        let (g, p) = read_until_response(sse, prev, id).await;
        got.extend(g);
        prev = p;
    }
    (got, prev)
}

/// Reads `sse` until the response to id `last`; returns the emitted (seq, pad) and the event
/// seqs of every message, checking ids strictly increase by one.
async fn read_until_response(sse: &mut Sse, mut prev: u64, last: u64) -> (Vec<(u64, usize)>, u64) {
    let mut got = Vec::new();
    loop {
        let (id, m) = sse.message().await;
        let s = seq_of(&id);
        assert_eq!(
            s,
            prev + 1,
            "event ids must be consecutive: {id} after seq {prev}"
        );
        prev = s;
        if let Some(e) = emitted(&m) {
            got.push(e);
        }
        if m["id"] == last {
            return (got, prev);
        }
    }
}

/// A live reader of alternating tiny / 1 MiB / 3.9 MiB events gets every one, once, in order,
/// with consecutive ids (the read size goes 256 → 1 → 256 and back).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adv19b_alternating_sizes_live_exact() {
    let up = Upstream::spawn(UpstreamOptions::default()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let p = start_in_process(&up.sse_url(), dir.path(), |c| {
        c.log.durability = mcp_resume_proxy::config::Durability::Relaxed;
    })
    .await;
    let base = format!("http://{}", p.addr);
    let (mut sse, url, first) = legacy_session(&base).await;
    let (got, _) = tokio::time::timeout(
        Duration::from_secs(25),
        emit_and_read(&url, &mut sse, seq_of(&first)),
    )
    .await
    .expect("bursts read in time");
    assert_eq!(got.len(), expected().len());
    assert_eq!(got, expected());
    p.stop().await;
}

/// A client that reads nothing while the bursts are logged (most of them from the segments, past
/// the in-memory window), then resumes with Last-Event-ID from a point inside the large events,
/// gets exactly the rest, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adv19b_resume_mid_large_events_exact() {
    let up = Upstream::spawn(UpstreamOptions::default()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let p = start_in_process(&up.sse_url(), dir.path(), |c| {
        c.log.durability = mcp_resume_proxy::config::Durability::Relaxed;
    })
    .await;
    let base = format!("http://{}", p.addr);
    let (mut sse, url, first) = legacy_session(&base).await;
    let (live, _) = tokio::time::timeout(
        Duration::from_secs(25),
        emit_and_read(&url, &mut sse, seq_of(&first)),
    )
    .await
    .expect("bursts read in time");
    assert_eq!(live, expected());
    sse.cut();
    // Read the whole history once from the start (past the in-memory window: the segments).
    let (mut all, err) = Sse::get(&format!("{base}/sse"), &[("last-event-id", &first)]).await;
    assert!(err.is_none(), "{err:?}");
    all.endpoint().await;
    let last = 10 + BURSTS.len() as u64 - 1;
    let (got, _) = tokio::time::timeout(
        Duration::from_secs(20),
        read_until_response(&mut all, seq_of(&first), last),
    )
    .await
    .expect("full replay in time");
    assert_eq!(got, expected());
    // Note the ids of the emitted events, then resume from inside the large ones (after the first
    // 3.9 MiB event) by a fresh connection: a takeover of the first.
    drop(all);
    let (mut again, err) = Sse::get(&format!("{base}/sse"), &[("last-event-id", &first)]).await;
    assert!(err.is_none(), "{err:?}");
    again.endpoint().await;
    let mut ids = Vec::new();
    let mut prev = seq_of(&first);
    loop {
        let (id, m) = again.message().await;
        assert_eq!(seq_of(&id), prev + 1);
        prev = seq_of(&id);
        let e = emitted(&m);
        ids.push((id.clone(), e));
        if e.map(|(_, pad)| pad) == Some((3 * MIB + 900 * 1024) as usize) {
            break;
        }
    }
    let (cut_id, cut_ev) = ids.last().cloned().unwrap();
    let (cut_seq, _) = cut_ev.unwrap();
    again.cut();
    let (mut resumed, err) = Sse::get(&format!("{base}/sse"), &[("last-event-id", &cut_id)]).await;
    assert!(err.is_none(), "{err:?}");
    resumed.endpoint().await;
    let (rest, _) = tokio::time::timeout(
        Duration::from_secs(20),
        read_until_response(&mut resumed, seq_of(&cut_id), last),
    )
    .await
    .expect("resumed replay in time");
    let want: Vec<_> = expected()
        .into_iter()
        .filter(|(s, _)| *s > cut_seq)
        .collect();
    assert_eq!(rest, want);
    p.stop().await;
}

/// A client stops reading a stream of 1 MiB events (the proxy's socket buffers fill, a 1 MiB pack
/// waits in the byte-bounded queue and the next one waits for room), then goes away. Its cursor
/// task must end (the queue's receiver is gone) and release the session's attachment: with no
/// client attached, `sessions.idle_ttl_secs` (2 s) ends the session. Before `db98611` the
/// channel's send failed at once when the receiver was dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adv19b_client_gone_while_a_large_pack_waits_releases_the_session() {
    let up = Upstream::spawn(UpstreamOptions::default()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let p = start_in_process(&up.sse_url(), dir.path(), |c| {
        c.sessions.idle_ttl_secs = 2;
        c.log.durability = mcp_resume_proxy::config::Durability::Relaxed;
    })
    .await;
    let base = format!("http://{}", p.addr);
    let admin = format!("http://{}/metrics", p.admin_addr);
    let (sse, url, _) = legacy_session(&base).await;
    let logged0 = metric(&admin, "mcp_resume_events_logged_total").await;
    // 32 MiB: more than the loopback socket buffers on both sides hold.
    let flood = call(
        2,
        "emit",
        json!({"count": 32, "rate_per_sec": 0, "size": MIB}),
        None,
    );
    assert_eq!(post(&url, &flood).await.0, 202);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    while metric(&admin, "mcp_resume_events_logged_total").await - logged0 < 33.0 {
        assert!(tokio::time::Instant::now() < deadline, "flood not logged");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(up.open_sessions(), 1);
    // The client goes away without having read the flood.
    sse.cut();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while up.open_sessions() != 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the session never idled out: the stream of a client gone still holds its attachment \
             (its cursor task waits forever for room in the byte-bounded queue)"
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
    p.stop().await;
}

/// The Streamable HTTP face: a bearer session's standalone stream keeps one connection (a plain
/// GET while it is live gets 409). Its client stops reading a flood of 1 MiB events (on the
/// standalone stream), then goes away: a plain GET afterwards must get the stream (200), not a
/// 409 for a connection that is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adv19b_standalone_gone_while_a_large_pack_waits_is_not_stream_active() {
    use support::streamable::Client;
    let up = Upstream::spawn(UpstreamOptions::default()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let p = start_in_process(&up.sse_url(), dir.path(), |c| {
        c.log.durability = mcp_resume_proxy::config::Durability::Relaxed;
    })
    .await;
    let admin = format!("http://{}/metrics", p.admin_addr);
    let (mut c, _) = Client::init(p.addr, "2025-03-26").await;
    let g = c.get(None).await;
    assert_eq!(g.status, 200);
    let g = g.sse();
    assert_eq!(c.get(None).await.status, 409, "one connection while live");
    let logged0 = metric(&admin, "mcp_resume_events_logged_total").await;
    let (_, mut call) = c
        .call(
            "emit",
            json!({"count": 32, "rate_per_sec": 0, "size": MIB}),
            "t",
        )
        .await;
    let evs = call.rest().await;
    assert_eq!(evs.len(), 1, "the call's stream holds only its response");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    while metric(&admin, "mcp_resume_events_logged_total").await - logged0 < 33.0 {
        assert!(tokio::time::Instant::now() < deadline, "flood not logged");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    g.cut();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(8);
    loop {
        let r = c.get(None).await;
        if r.status == 200 {
            break;
        }
        assert_eq!(r.status, 409);
        assert!(
            tokio::time::Instant::now() < deadline,
            "a plain GET still refused 409 stream_active 8 s after the standalone stream's \
             client went away: its cursor task waits forever for room in the byte-bounded queue"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    p.stop().await;
}
