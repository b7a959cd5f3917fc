//! Adversarial review of `Shared::read`'s plain path on a single Redis (`read_plain`, commit
//! ab0e075): one `MULTI` with the record, `XREVRANGE <after+1>-0 - COUNT 1` and
//! `XRANGE (<after+1>-0 + COUNT c` (c from a `per_entry` estimate shared by every session), then
//! further `XRANGE` pages. Against a real `redis-server` on loopback; the script read
//! (`read_scripted`) is the reference, reached by hiding the record's `lo` (a record of the
//! earlier form goes to the script).
//!
//! Tests marked FINDING failed on ab0e075 (fixed since: reads stop at the head, check every page for holes, and never overflow on an absurd count); the others are probes that held.
//!
//! Run: `cargo test --test adversary_reads` (needs `redis-server`).

mod support;

use std::sync::Arc;

use bytes::Bytes;
use mcp_resume_proxy::log::cursor::SessionId;
use mcp_resume_proxy::log::redis::{Fence, Shared, CHUNK_EVENTS};
use mcp_resume_proxy::log::{Event, Kind, NewEvent, StreamTag};
use support::redis::{Persist, RedisServer};

const PREFIX: &str = "advr";

fn owner(name: &str, epoch: u32) -> Fence {
    Fence {
        owner: name.to_string(),
        epoch,
    }
}

/// Event `i` of a session: its payload names it, so a read can be checked byte for byte.
fn ev(i: u64) -> NewEvent {
    let kind = match i % 3 {
        0 => Kind::Priming,
        1 => Kind::Final,
        _ => Kind::Message,
    };
    NewEvent::new(
        StreamTag(i % 4),
        kind,
        Bytes::from(format!("{i} 0 3\n#{i}")),
    )
}

async fn new_session(s: &Shared) -> SessionId {
    let id = SessionId::random();
    assert!(s
        .create(&id, "a/1", r#"{"facade":"streamable"}"#)
        .await
        .unwrap());
    id
}

fn keys(id: &SessionId) -> (String, String) {
    (
        format!("{PREFIX}:{{{id}}}:m"),
        format!("{PREFIX}:{{{id}}}:ev"),
    )
}

/// Appends events `head + 1 ..= head + n` (one call: chunks of up to `CHUNK_EVENTS`).
async fn append(s: &Shared, id: &SessionId, head: u64, n: u64, maxlen: Option<u64>) -> u64 {
    let evs: Vec<NewEvent> = (head + 1..=head + n).map(ev).collect();
    s.append(
        id,
        &owner("a/1", 1),
        head,
        &format!("b{head}"),
        &evs,
        maxlen,
    )
    .await
    .unwrap()
    .unwrap()
}

/// A session of `head` events written `per` events per append (`per` 1: one entry per event).
async fn session_of(s: &Shared, head: u64, per: u64) -> SessionId {
    let id = new_session(s).await;
    let mut h = 0;
    while h < head {
        h = append(s, &id, h, per.min(head - h), None).await;
    }
    id
}

fn seqs(evs: &[Event]) -> Vec<u64> {
    evs.iter().map(|e| e.seq).collect()
}

/// Panics unless `evs` are exactly `after + 1 ..= want_last`, each with its own payload.
fn assert_exact(evs: &[Event], after: u64, want_last: u64, what: &str) {
    let want: Vec<u64> = (after.saturating_add(1)..=want_last)
        .filter(|_| after < want_last)
        .collect();
    assert_eq!(seqs(evs), want, "{what}");
    for e in evs {
        assert_eq!(e.payload, ev(e.seq).payload, "{what}: payload of {}", e.seq);
        assert_eq!(e.stream, ev(e.seq).stream, "{what}: tag of {}", e.seq);
    }
}

/// Panics unless `evs` go on from `after + 1` without a hole or a duplicate.
fn assert_contiguous(evs: &[Event], after: u64, what: &str) {
    for (i, e) in evs.iter().enumerate() {
        assert_eq!(
            e.seq,
            after + 1 + i as u64,
            "{what}: gap, duplicate or reorder in {:?}",
            seqs(evs)
        );
    }
}

async fn hset(r: &RedisServer, key: &str, kv: &[(&str, String)]) {
    let mut c = r.admin().await;
    let mut cmd = ::redis::cmd("HSET");
    cmd.arg(key);
    for (k, v) in kv {
        cmd.arg(*k).arg(v);
    }
    let _: i64 = cmd.query_async(&mut c).await.unwrap();
}

/// The same read through the script: `lo` hidden for it (a record of the earlier form), then put
/// back. Returns the events (or the error as text).
async fn scripted(
    r: &RedisServer,
    s: &Shared,
    id: &SessionId,
    after: u64,
    max: usize,
) -> Result<Vec<Event>, String> {
    let mut c = r.admin().await;
    let rec = keys(id).0;
    let lo: Option<String> = ::redis::cmd("HGET")
        .arg(&rec)
        .arg("lo")
        .query_async(&mut c)
        .await
        .unwrap();
    let _: i64 = ::redis::cmd("HDEL")
        .arg(&rec)
        .arg("lo")
        .query_async(&mut c)
        .await
        .unwrap();
    let out = s.read(id, after, max).await;
    if let Some(lo) = lo {
        hset(r, &rec, &[("lo", lo)]).await;
    }
    out.map(|o| o.expect("record").1).map_err(|e| e.to_string())
}

/// Plants an entry by hand (what nothing in the proxy writes).
async fn xadd(r: &RedisServer, id: &SessionId, entry_id: &str, fields: &[(&str, &[u8])]) {
    let mut c = r.admin().await;
    let mut cmd = ::redis::cmd("XADD");
    cmd.arg(keys(id).1).arg(entry_id);
    for (k, v) in fields {
        cmd.arg(*k).arg(*v);
    }
    let _: String = cmd.query_async(&mut c).await.unwrap();
}

async fn xdel(r: &RedisServer, id: &SessionId, entry_id: &str) {
    let mut c = r.admin().await;
    let n: i64 = ::redis::cmd("XDEL")
        .arg(keys(id).1)
        .arg(entry_id)
        .query_async(&mut c)
        .await
        .unwrap();
    assert_eq!(n, 1, "XDEL {entry_id}");
}

/// Sets the shared estimate: a read of full chunks (256 events per entry) or of one-event entries.
async fn poison(s: &Shared, per_entry_256: bool, big: &SessionId, small: &SessionId) {
    if per_entry_256 {
        let (_, got) = s.read(big, 0, 2 * CHUNK_EVENTS).await.unwrap().unwrap();
        assert_eq!(got.len(), 2 * CHUNK_EVENTS);
    } else {
        let (_, got) = s.read(small, 0, 8).await.unwrap().unwrap();
        assert_eq!(got.len(), 8);
    }
}

// ------------------------------------------------------------------------------------------
// Probes on well-formed logs.
// ------------------------------------------------------------------------------------------

/// PROBE. Sessions of varied chunk shapes (1, 3, 17, 255, 256, 257, 700 events per append; with
/// and without retention), read from every interesting cursor with many `max`, interleaved so
/// the shared `per_entry` estimate comes from another session each time: every read is exactly
/// `after + 1 ..= min(head, after + max)` and equals the script's read.
#[tokio::test]
async fn every_cursor_and_max_reads_exactly_whatever_the_estimate() {
    let r = RedisServer::start(Persist::None).await;
    let s = Shared::connect(&r.url(), PREFIX).await.unwrap();
    let mut sessions: Vec<(SessionId, u64)> = Vec::new();
    for (per, head) in [
        (1u64, 70u64),
        (3, 100),
        (17, 300),
        (255, 800),
        (256, 800),
        (257, 800),
        (700, 1500),
    ] {
        sessions.push((session_of(&s, head, per).await, head));
    }
    // Retention: a session trimmed to its newest 300 (chunks before lo stay when they reach it).
    let trimmed = new_session(&s).await;
    let mut h = 0;
    for n in [100u64, 256, 5, 1, 300, 77, 256, 256, 3] {
        h = append(&s, &trimmed, h, n, Some(300)).await;
    }
    sessions.push((trimmed, h));
    let maxes = [0usize, 1, 2, 15, 16, 17, 255, 256, 257, 1000, usize::MAX];
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    for round in 0..600 {
        let (id, head) = sessions[(next() % sessions.len() as u64) as usize];
        let (id, head) = (&id, head);
        let (rec, _) = s.read(id, u64::MAX, 1).await.unwrap().unwrap();
        assert_eq!(rec.ranges.head, head);
        let lo = rec.ranges.oldest;
        let span = head - (lo - 1);
        let after = match next() % 6 {
            0 => lo - 1,
            1 => head,
            2 => head.saturating_sub(1).max(lo - 1),
            3 => (lo - 1) + (next() % 3) * 256 % (span + 1),
            _ => (lo - 1) + next() % (span + 1),
        };
        let max = maxes[(next() % maxes.len() as u64) as usize];
        let (_, got) = s.read(id, after, max).await.unwrap().unwrap();
        let last = head.min(after.saturating_add(max.max(1) as u64));
        let what = format!("round {round} head {head} lo {lo} after {after} max {max}");
        assert_exact(&got, after, last, &what);
        if round % 5 == 0 {
            let by_script = scripted(&r, &s, id, after, max).await.unwrap();
            assert_eq!(seqs(&got), seqs(&by_script), "{what}: plain vs script");
        }
    }
}

/// PROBE. Edge cursors and `max`: past the head, `u64::MAX - 1`, `u64::MAX`, a session with no
/// events, `max` 0 and `usize::MAX`: no panic, nothing past the head, same as the script.
#[tokio::test]
async fn edge_cursors_and_max() {
    let r = RedisServer::start(Persist::None).await;
    let s = Shared::connect(&r.url(), PREFIX).await.unwrap();
    let empty = new_session(&s).await;
    let id = session_of(&s, 300, 256).await;
    for (id, head) in [(&empty, 0u64), (&id, 300)] {
        for after in [
            0,
            1,
            255,
            256,
            299,
            300,
            301,
            1 << 40,
            u64::MAX - 1,
            u64::MAX,
        ] {
            for max in [0usize, 1, 256, usize::MAX] {
                let what = format!("head {head} after {after} max {max}");
                let (rec, got) = s.read(id, after, max).await.unwrap().unwrap();
                assert_eq!(rec.ranges.head, head, "{what}");
                let last = if after >= head {
                    after
                } else {
                    head.min(after.saturating_add(max.max(1) as u64))
                };
                assert_exact(&got, after, last, &what);
                let by_script = scripted(&r, &s, id, after, max).await.unwrap();
                assert_eq!(seqs(&got), seqs(&by_script), "{what}: plain vs script");
            }
        }
    }
}

/// PROBE. A record upgraded from the earlier per-event form (entries `e t k d`, no `n`) that has a
/// `lo` and chunks after its per-event entries: reads across the seam count each per-event entry
/// as one event, as the script does.
#[tokio::test]
async fn per_event_entries_then_chunks_with_a_lo() {
    let r = RedisServer::start(Persist::None).await;
    let s = Shared::connect(&r.url(), PREFIX).await.unwrap();
    let id = SessionId::random();
    let (rec, _) = keys(&id);
    // The earlier form kept 11..=40 one entry per event.
    for seq in 11..=40u64 {
        let e = ev(seq);
        xadd(
            &r,
            &id,
            &format!("{seq}-0"),
            &[
                ("e", b"1"),
                ("t", e.stream.0.to_string().as_bytes()),
                ("k", (e.kind as u8).to_string().as_bytes()),
                ("d", &e.payload),
            ],
        )
        .await;
    }
    let ep = r#"[{"epoch":1,"first":1,"last":null}]"#;
    hset(
        &r,
        &rec,
        &[
            ("owner", "a/1".into()),
            ("epoch", "1".into()),
            ("head", "40".into()),
            ("state", "live".into()),
            ("ep", ep.into()),
            ("meta", "{}".into()),
            ("bt", "old".into()),
            ("lo", "11".into()),
        ],
    )
    .await;
    let mut h = 40;
    for n in [5u64, 256, 1, 40] {
        h = append(&s, &id, h, n, None).await;
    }
    let big = session_of(&s, 600, 300).await;
    let small = session_of(&s, 20, 1).await;
    for est in [true, false] {
        for after in [
            10u64,
            11,
            25,
            38,
            39,
            40,
            41,
            44,
            45,
            46,
            100,
            300,
            h - 1,
            h,
        ] {
            for max in [1usize, 2, 7, 16, 17, 100, 400] {
                poison(&s, est, &big, &small).await;
                let what = format!("after {after} max {max} estimate-256 {est}");
                let (_, got) = s.read(&id, after, max).await.unwrap().unwrap();
                let last = h.min(after + max as u64).max(after);
                assert_exact(&got, after, last, &what);
                let by_script = scripted(&r, &s, &id, after, max).await.unwrap();
                assert_eq!(seqs(&got), seqs(&by_script), "{what}: plain vs script");
            }
        }
    }
}

/// PROBE. Concurrent: one task appends (random sizes, retention of the newest 400: trims while
/// reads page), one keeps the shared estimate swinging (reads of a 256-per-entry session and of
/// a 1-per-entry session), eight read the live session from cursors at or after the snapshot's
/// `lo - 1`. Every read goes on from `after + 1` without a hole, never past its snapshot's head,
/// and is not empty while the cursor is before the head.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_appends_trims_and_estimates() {
    let r = RedisServer::start(Persist::None).await;
    let s = Arc::new(Shared::connect(&r.url(), PREFIX).await.unwrap());
    let big = session_of(&s, 1024, 256).await;
    let small = session_of(&s, 64, 1).await;
    let live = new_session(&s).await;
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (s, live, stop) = (s.clone(), live, stop.clone());
        tokio::spawn(async move {
            let mut h = 0u64;
            let mut i = 0u64;
            while h < 20_000 {
                let n = [1u64, 1, 2, 5, 30, 256, 300, 1][(i % 8) as usize];
                h = append(&s, &live, h, n, Some(400)).await;
                i += 1;
            }
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
        })
    };
    let swinger = {
        let (s, stop) = (s.clone(), stop.clone());
        tokio::spawn(async move {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let _ = s.read(&big, 0, 512).await.unwrap();
                let _ = s.read(&small, 3, 5).await.unwrap();
            }
        })
    };
    let mut readers = Vec::new();
    for t in 0..8u64 {
        let (s, stop) = (s.clone(), stop.clone());
        readers.push(tokio::spawn(async move {
            let mut k = t;
            let mut reads = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                k = k
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let (rec, _) = s.read(&live, u64::MAX, 1).await.unwrap().unwrap();
                let (lo, head) = (rec.ranges.oldest, rec.ranges.head);
                if head == 0 {
                    continue;
                }
                let after = (lo - 1) + (k >> 33) % (head - lo + 1);
                let max = [1usize, 16, 17, 256, 300, 1000][((k >> 20) % 6) as usize];
                let (rec, got) = s.read(&live, after, max).await.unwrap().unwrap();
                let what = format!("after {after} max {max} snapshot head {}", rec.ranges.head);
                if after + 1 < rec.ranges.oldest {
                    // Trimmed under the cursor since it was picked: the caller refuses it (§4).
                    continue;
                }
                assert_contiguous(&got, after, &what);
                assert!(got.len() <= max, "{what}: more than max");
                if let Some(e) = got.last() {
                    assert!(e.seq <= rec.ranges.head, "{what}: past the head");
                }
                for e in &got {
                    assert_eq!(e.payload, ev(e.seq).payload, "{what}: payload of {}", e.seq);
                }
                // The cursor was retained at the first snapshot; retention may have passed it
                // since (then the record says so).
                if after < rec.ranges.head && after + 1 >= rec.ranges.oldest {
                    assert!(!got.is_empty(), "{what}: empty while before the head");
                }
                reads += 1;
            }
            reads
        }));
    }
    writer.await.unwrap();
    swinger.await.unwrap();
    let mut total = 0;
    for t in readers {
        total += t.await.unwrap();
    }
    assert!(total > 100, "only {total} reads ran");
}

// ------------------------------------------------------------------------------------------
// Hostile stream contents (entries planted around the scripts by hand).
// ------------------------------------------------------------------------------------------

/// A stray entry's fields, by name.
type Fields = Vec<(&'static str, &'static [u8])>;

/// FINDING. A stray entry just past the head that does not parse (`n` = 2 over a blob of one
/// event; an id `4-1`; a per-event entry missing `k`. An `n` = 0 stray is probed too and held:
/// the contiguity check stops before it): the script never reads it (it ranges up to
/// `<head>-0`), but `read_plain` ranges to `+` — the first `XRANGE` asks for up to 16 entries
/// whatever the head, and its pages go on past the head — so every read whose entries reach the
/// stray fails with `read: entry` (even `read(id, 0, 1)`: one entry after `1-0` is asked for),
/// while the script reads 1..=3. (The caller cuts at the head only after every
/// entry parsed.)
///
/// Reproduction: a session of head 3 (one chunk `1-0`, n 3); `XADD <stream> 4-0 e 1 n 2 b
/// "0 0 1\nx"`; `read(id, 0, 3)` → `Err(read: entry)`; with `lo` hidden (the script) → 1..=3.
/// Even `read(id, 3, 256)` (at the head) fails: the `XREVRANGE 4-0` entry is kept unchecked.
/// (The earlier `read_plain` also ranged to `+`; ab0e075 keeps it.)
#[tokio::test]
async fn a_malformed_stray_entry_past_the_head_fails_the_plain_read_only() {
    let r = RedisServer::start(Persist::None).await;
    let s = Shared::connect(&r.url(), PREFIX).await.unwrap();
    let mut failures = Vec::new();
    let strays: [(&str, Fields); 4] = [
        ("4-0", vec![("e", b"1"), ("n", b"2"), ("b", b"0 0 1\nx")]),
        ("4-0", vec![("e", b"1"), ("n", b"0"), ("b", b"")]),
        ("4-1", vec![("e", b"1"), ("n", b"1"), ("b", b"0 0 1\nx")]),
        ("4-0", vec![("e", b"1"), ("t", b"0"), ("d", b"x")]),
    ];
    for (stray, fields) in &strays {
        let id = session_of(&s, 3, 3).await;
        xadd(&r, &id, stray, fields).await;
        for (after, max) in [(0u64, 3usize), (0, 1), (2, 1), (1, 100), (3, 256)] {
            let by_script = scripted(&r, &s, &id, after, max).await;
            let want: Vec<u64> = (after + 1..=3u64.min(after + max as u64)).collect();
            // (after 3: at the head, where a follower polls: the script reads no entry at all.)
            assert_eq!(
                by_script.as_ref().map(|e| seqs(e)),
                Ok(want.clone()),
                "the script reads around the stray {stray}"
            );
            match s.read(&id, after, max).await {
                Ok(Some((_, got))) if seqs(&got) == want => {}
                other => failures.push(format!(
                    "stray {stray} {fields:?}: read(after {after}, max {max}) = {:?}, the script: {want:?}",
                    other.map(|o| o.map(|(_, e)| seqs(&e)))
                )),
            }
        }
    }
    assert!(
        failures.is_empty(),
        "the plain read fails where the script reads (past-head entries parsed):\n{}",
        failures.join("\n")
    );
}

/// FINDING. A hole in the stream (entry `10-0` of a session of one-event entries deleted with
/// `XDEL`): whether one read hands the caller the gap depends on the *other* sessions' reads.
/// After a read of one-event entries (`per_entry` 1) the first `MULTI` asks for 16 entries, sees
/// `9-0` followed by `11-0` and stops at 9; after a read of full chunks (`per_entry` 256) it asks
/// for 1 entry and the rest comes in pages, which are checked only at their first entry: the read
/// returns 1..=9, 11..=40 — a gap, through the very check meant to stop at "a stray one".
///
/// Reproduction: session A: 40 appends of 1 event; session B: 512 events in two chunks;
/// `XDEL A 10-0`; `read(B, 0, 512)`; `read(A, 0, 40)` → seqs 1..=9, 11..=40 (the script
/// returns the same gap; `read(A, 0, 40)` after `read(A, 0, 8)` returns 1..=9).
#[tokio::test]
async fn a_hole_inside_a_page_is_read_past_depending_on_another_session() {
    let r = RedisServer::start(Persist::None).await;
    let s = Shared::connect(&r.url(), PREFIX).await.unwrap();
    let big = session_of(&s, 2 * CHUNK_EVENTS as u64, 256).await;
    let small = session_of(&s, 40, 1).await;
    let holed = session_of(&s, 40, 1).await;
    xdel(&r, &holed, "10-0").await;
    poison(&s, false, &big, &small).await;
    let (_, after_small) = s.read(&holed, 0, 40).await.unwrap().unwrap();
    poison(&s, true, &big, &small).await;
    let (_, after_big) = s.read(&holed, 0, 40).await.unwrap().unwrap();
    let by_script = scripted(&r, &s, &holed, 0, 40).await.unwrap();
    assert_eq!(
        seqs(&after_small),
        (1..=9).collect::<Vec<_>>(),
        "after a read of one-event entries the MULTI's check stops at the hole"
    );
    assert_contiguous(
        &after_big,
        0,
        &format!(
            "the same read after a read of full chunks of another session (script: {:?})",
            seqs(&by_script)
        ),
    );
}

/// FINDING (debug builds; overflow wraps in release). A stray entry whose `n` is near `u64::MAX`
/// makes `read_plain` add `first + n` unchecked: a panic ("attempt to add with overflow") in the
/// reading task, where the script reads 1..=3 (the stray is past the head); at the head
/// (`read(id, 3, 256)`) the overflow is in the `holds` filter of the `XREVRANGE` entry.
///
/// Reproduction: a session of head 3; `XADD <stream> 4-0 e 1 n 18446744073709551615 b
/// "0 0 1\nx"`; `read(id, 0, 3)` panics.
#[tokio::test]
async fn a_huge_n_past_the_head_panics_the_plain_read() {
    let r = RedisServer::start(Persist::None).await;
    let s = Arc::new(Shared::connect(&r.url(), PREFIX).await.unwrap());
    let id = session_of(&s, 3, 3).await;
    xadd(
        &r,
        &id,
        "4-0",
        &[
            ("e", b"1"),
            ("n", u64::MAX.to_string().as_bytes()),
            ("b", b"0 0 1\nx"),
        ],
    )
    .await;
    let by_script = scripted(&r, &s, &id, 0, 3).await.unwrap();
    assert_eq!(seqs(&by_script), vec![1, 2, 3]);
    let mut panics = Vec::new();
    for (after, max, want) in [(0u64, 3usize, vec![1u64, 2, 3]), (3, 256, vec![])] {
        let task = {
            let s = s.clone();
            tokio::spawn(async move {
                s.read(&id, after, max)
                    .await
                    .map(|o| o.map(|(_, e)| seqs(&e)))
            })
        };
        match task.await {
            Ok(got) => assert_eq!(got.unwrap(), Some(want)),
            Err(e) => panics.push(format!(
                "read(after {after}, max {max}): {e} (script: {want:?})"
            )),
        }
    }
    assert!(
        panics.is_empty(),
        "the plain read panicked where the script reads:\n{}",
        panics.join("\n")
    );
}

/// The blob of a chunk of events `first ..= last` (as the scripts write it).
fn blob(first: u64, last: u64) -> Vec<u8> {
    let mut b = Vec::new();
    for seq in first..=last {
        let e = ev(seq);
        b.extend_from_slice(
            format!("{} {} {}\n", e.stream.0, e.kind as u8, e.payload.len()).as_bytes(),
        );
        b.extend_from_slice(&e.payload);
    }
    b
}

/// A record of head `head`, `lo` 1, whose stream is `entries` (id, first, n) written by hand in
/// id order (blobs of the events `first ..`).
async fn hand_built(r: &RedisServer, head: u64, entries: &[(&str, u64, u64)]) -> SessionId {
    let id = SessionId::random();
    for (eid, first, n) in entries {
        let b = blob(*first, first + n - 1);
        xadd(
            r,
            &id,
            eid,
            &[("e", b"1"), ("n", n.to_string().as_bytes()), ("b", &b)],
        )
        .await;
    }
    let ep = r#"[{"epoch":1,"first":1,"last":null}]"#;
    hset(
        r,
        &keys(&id).0,
        &[
            ("owner", "a/1".into()),
            ("epoch", "1".into()),
            ("head", head.to_string()),
            ("state", "live".into()),
            ("ep", ep.into()),
            ("meta", "{}".into()),
            ("bt", "".into()),
            ("lo", "1".into()),
        ],
    )
    .await;
    id
}

/// PROBE. Overlapping chunks (a stray `5-1` of 4 events inside chunk `1-0` of 10; a stray `15-0`
/// inside `11-0`), a chunk of the same first seq with a non-zero sequence part: the plain read
/// never returns a duplicate or a hole, whatever the shared estimate, and never errors where
/// the script reads. The script read (a Cluster's only path) returned duplicates and holes here
/// (116 reads) until `Shared::read` cut every read where its seqs stop being consecutive: now
/// neither path returns anything but consecutive seqs (a read that does not start at the cursor
/// is what the reader's gap check ends the stream on).
#[tokio::test]
async fn overlapping_and_odd_id_strays_never_duplicate() {
    let r = RedisServer::start(Persist::None).await;
    let s = Shared::connect(&r.url(), PREFIX).await.unwrap();
    let big = session_of(&s, 600, 300).await;
    let small = session_of(&s, 20, 1).await;
    let layouts: [&[(&str, u64, u64)]; 3] = [
        &[
            ("1-0", 1, 10),
            ("5-1", 5, 4),
            ("11-0", 11, 10),
            ("21-0", 21, 10),
        ],
        &[
            ("1-0", 1, 10),
            ("11-0", 11, 10),
            ("15-0", 15, 3),
            ("21-0", 21, 10),
        ],
        &[
            ("1-0", 1, 10),
            ("11-0", 11, 10),
            ("11-1", 11, 10),
            ("21-0", 21, 10),
        ],
    ];
    let mut script_dups = 0;
    let mut plain_like_script_gaps = 0;
    for layout in layouts {
        let id = hand_built(&r, 30, layout).await;
        for est in [true, false] {
            for after in 0..30u64 {
                for max in [1usize, 5, 10, 11, 30] {
                    poison(&s, est, &big, &small).await;
                    let what = format!("{layout:?} after {after} max {max} estimate-256 {est}");
                    let plain = s.read(&id, after, max).await;
                    let by_script = scripted(&r, &s, &id, after, max).await;
                    if let Ok(sc) = &by_script {
                        let ok = seqs(sc)
                            .iter()
                            .enumerate()
                            .all(|(i, q)| *q == after + 1 + i as u64);
                        script_dups += usize::from(!ok);
                        let q = seqs(sc);
                        assert!(
                            q.windows(2).all(|w| w[1] == w[0] + 1),
                            "{what}: the script read is not consecutive: {q:?}"
                        );
                    }
                    match plain {
                        Ok(Some((_, got)))
                            if by_script.as_ref().is_ok_and(|sc| seqs(sc) == seqs(&got)) =>
                        {
                            // The script's answer (a fallback, or the same entries).
                            let ok = seqs(&got)
                                .iter()
                                .enumerate()
                                .all(|(i, q)| *q == after + 1 + i as u64);
                            plain_like_script_gaps += usize::from(!ok);
                        }
                        Ok(Some((_, got))) => {
                            assert_contiguous(&got, after, &what);
                            assert!(
                                !got.is_empty() || by_script.as_ref().is_ok_and(|e| e.is_empty()),
                                "{what}: plain read empty, script {by_script:?}",
                                by_script = by_script.as_ref().map(|e| seqs(e))
                            );
                        }
                        other => assert!(
                            by_script.is_err(),
                            "{what}: plain {:?} where the script reads {:?}",
                            other.map(|o| o.map(|(_, e)| seqs(&e))),
                            by_script.map(|e| seqs(&e))
                        ),
                    }
                }
            }
        }
    }
    eprintln!(
        "script reads with a duplicate or hole: {script_dups}; plain reads with the script's \
         own hole (its fallback): {plain_like_script_gaps}"
    );
}
