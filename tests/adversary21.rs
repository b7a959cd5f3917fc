//! Adversarial review of commit 4c032c2: `Shared::read_within` (src/log/redis.rs) stops a read
//! from Redis after about `max_bytes` of stream-entry bytes (plain path `read_plain`: the first
//! `MULTI` asks for `min(max / per_entry, max_bytes / largest_entry)` entries, clamped to 1..=16,
//! then pages; the Lua `READ` script on a Cluster / records of the earlier form) and cuts the
//! returned events at about `max_bytes` of payload (at least one). Against a real `redis-server`
//! on loopback; the script read is reached by hiding the record's `lo` (as in
//! tests/adversary_reads.rs).
//!
//! Probes:
//! - `budget_reads_are_exact_from_every_cursor`: sessions of mixed small / 20 KiB / 300 KiB /
//!   1.5 MiB events (chunks of many, chunks of one, events larger than the budget), with and
//!   without retention; every cursor from `lo - 1` to the head, `max` 1..usize::MAX, budgets 0,
//!   1, 100, 30 KiB, 1 MiB, u64::MAX; the shared estimates swung by reads of other sessions
//!   before each read. Every read is exactly `after + 1 ..` (non-empty before the head, at most
//!   `max`), cut at the budget (the payloads before the last stay under it), equal to the
//!   script's read; walks with the budget deliver exactly `lo ..= head`. HELD.
//! - `a_hole_or_stray_under_a_budget_is_a_loud_gap`: an `XDEL`ed entry, an overlapping stray,
//!   walked with a budget of 1 byte and 1 MiB under both estimates: the walk returns exactly the
//!   events before the hole, then a read that does not start at the cursor (a gap the stream
//!   ends on), never a silent skip or duplicate. HELD.
//! - `a_cursor_trimmed_under_or_mid_chunk_with_a_budget`: retention trims while the cursor sits
//!   inside a chunk / before `lo`: reads are consecutive, never below `lo`, plain == script. HELD.
//! - FINDING `another_sessions_read_makes_a_budget_read_fetch_sixteen_large_entries`: the
//!   `largest_entry` estimate is one per `Shared` (every session of the process): a read of small
//!   entries of any other session sets it to a few bytes, and the next budget read of a session
//!   of large events asks its first `MULTI` for `clamp(1 MiB / tiny, 1, 16)` = 16 entries:
//!   Redis sends 16 × the entry (here 16 × 1 MiB = 16 MiB; with the default
//!   `max_event_bytes` 4 MiB, 64 MiB; at the configurable 255 MiB, 4 GiB) for a read that
//!   returns one event. The commit's own bound (tests/redis_log.rs: `sent < BUDGET + 512 KiB`)
//!   holds only when the same process read no smaller entries since. The script (Cluster) path
//!   itself stops at the budget, but a record the plain path hands to it (no `lo`; entries not
//!   starting at the cursor) first pays the plain `MULTI`'s 16 entries (measured: 18.9 MiB).
//! - FINDING `streamable_resumes_of_big_events_on_redis_count_them_unbudgeted`: a Streamable
//!   HTTP resume counts what it owes with the unbudgeted `Log::read_after(.., 256)` before its
//!   budgeted stream starts (src/facade/streamable.rs:569, src/log/mod.rs:528): eight resumes of
//!   24 × 3.9 MB events peak at +536..558 MiB RSS (bound +320 MiB); with that one call changed to
//!   `read_batch` the same test peaks at +13 MiB. (One run saw a resume answered 503; rerun.)
//!   Reproduction: single Redis; session L: 40 appends of one 1 MiB event; session S: 300 small
//!   events; `read_within(S, 0, 256, 1 MiB, hint(S))`; then `read_within(L, 0, 256, 1 MiB, hint(L))` → one event,
//!   `total_net_output_bytes` grows by ~16.8 MiB (vs ~1 MiB when L was read just before).
//!   Cause: src/log/redis.rs:1525-1529 (the first page sized by the process-wide
//!   `largest_entry`, stored at :1661 by whatever session read last); the `within` cut at
//!   :1596-1615 only drops what was already sent and parsed.
//!
//! Both FINDINGs are fixed since (their tests pass): the estimates are each session's own
//! (`ReadHint`, kept in its `SessionLog`; a session never read asks for one entry past the
//! cursor's), and `owed` reads with `Log::read_batch`. Where a probe swung the process-wide
//! estimates by reading other sessions, it now reads with a hint learnt from those sessions:
//! whatever the estimate, a read is exact.
//!
//! Run: `cargo test --test adversary21` (needs `redis-server`; the last probe runs the proxy
//! binary).

mod support;

use bytes::Bytes;
use mcp_resume_proxy::log::cursor::SessionId;
use mcp_resume_proxy::log::redis::{Fence, ReadHint, Shared};
use mcp_resume_proxy::log::{Event, Kind, NewEvent, StreamTag};
use support::redis::{Persist, RedisServer};

const PREFIX: &str = "adv21";
const MIB: u64 = 1 << 20;

/// The session's own read hint, as its `SessionLog` holds it in the proxy (one per session,
/// kept across reads).
fn hint(id: &SessionId) -> &'static ReadHint {
    use std::collections::HashMap;
    use std::sync::{Mutex, OnceLock};
    static HINTS: OnceLock<Mutex<HashMap<SessionId, &'static ReadHint>>> = OnceLock::new();
    let mut hints = HINTS.get_or_init(Default::default).lock().unwrap();
    hints
        .entry(*id)
        .or_insert_with(|| Box::leak(Box::default()))
}

fn owner() -> Fence {
    Fence {
        owner: "a/1".to_string(),
        epoch: 1,
    }
}

/// The payload size of event `i` of a session of `shape`.
fn size_of(shape: u8, i: u64) -> usize {
    match shape {
        // All small.
        0 => 8 + (i % 7) as usize,
        // Mixed: mostly small, some 20 KiB, some 300 KiB (an entry of its own), rare 1.5 MiB
        // (larger than the budget).
        1 => match i % 23 {
            5 => 20 << 10,
            11 | 12 => 300 << 10,
            17 if i % 46 == 17 => 3 * MIB as usize / 2,
            _ => 10 + (i % 5) as usize,
        },
        // All 20 KiB: entries of one event each (two would pass the 30 KiB chunk bound).
        2 => 20 << 10,
        // 1 MiB each.
        _ => MIB as usize,
    }
}

/// Event `i`: its payload names it (checked byte for byte).
fn ev(shape: u8, i: u64) -> NewEvent {
    let mut b = format!("#{i}:").into_bytes();
    b.resize(size_of(shape, i).max(b.len()), b'a' + (i % 26) as u8);
    let kind = if i.is_multiple_of(3) {
        Kind::Final
    } else {
        Kind::Message
    };
    NewEvent::new(StreamTag(i % 3), kind, Bytes::from(b))
}

fn keys(id: &SessionId) -> (String, String) {
    (
        format!("{PREFIX}:{{{id}}}:m"),
        format!("{PREFIX}:{{{id}}}:ev"),
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

/// A session of `shape`, appended in batches of the sizes `batches` (cycled) up to `head`.
async fn session(
    s: &Shared,
    shape: u8,
    head: u64,
    batches: &[u64],
    maxlen: Option<u64>,
) -> SessionId {
    let id = new_session(s).await;
    let mut h = 0;
    let mut k = 0;
    while h < head {
        let n = batches[k % batches.len()].min(head - h);
        k += 1;
        let evs: Vec<NewEvent> = (h + 1..=h + n).map(|i| ev(shape, i)).collect();
        h = s
            .append(&id, &owner(), h, &format!("b{h}"), &evs, maxlen)
            .await
            .unwrap()
            .unwrap();
    }
    id
}

fn seqs(evs: &[Event]) -> Vec<u64> {
    evs.iter().map(|e| e.seq).collect()
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

/// The same read through the script (`lo` hidden: a record of the earlier form).
async fn scripted(
    r: &RedisServer,
    s: &Shared,
    id: &SessionId,
    after: u64,
    max: usize,
    budget: u64,
) -> Vec<Event> {
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
    let out = s.read_within(id, after, max, budget, hint(id)).await;
    if let Some(lo) = lo {
        hset(r, &rec, &[("lo", lo)]).await;
    }
    out.unwrap().expect("record").1
}

/// Bytes Redis has sent its clients.
async fn net_out(r: &RedisServer) -> u64 {
    support::redis::sent_bytes(&[r.url()]).await
}

/// Checks one budget read: exactly `after + 1 ..` (consecutive, payloads of `shape`), at most
/// `max`, non-empty before the head, and cut at the budget.
fn check_read(
    got: &[Event],
    shape: u8,
    after: u64,
    head: u64,
    max: usize,
    budget: u64,
    what: &str,
) {
    for (i, e) in got.iter().enumerate() {
        assert_eq!(
            e.seq,
            after + 1 + i as u64,
            "{what}: not exact: {:?}",
            seqs(got)
        );
        assert_eq!(
            e.payload,
            ev(shape, e.seq).payload,
            "{what}: payload of {}",
            e.seq
        );
        assert_eq!(
            e.stream,
            ev(shape, e.seq).stream,
            "{what}: tag of {}",
            e.seq
        );
    }
    assert!(
        got.len() <= max.max(1),
        "{what}: {} events, max {max}",
        got.len()
    );
    if let Some(l) = got.last() {
        assert!(l.seq <= head, "{what}: past the head");
        let before: u64 = got[..got.len() - 1]
            .iter()
            .map(|e| e.payload.len() as u64)
            .sum();
        assert!(
            before < budget.max(1),
            "{what}: {before} bytes before the last event, budget {budget}"
        );
    }
    if after < head {
        assert!(!got.is_empty(), "{what}: empty before the head");
    }
}

/// PROBE (held). See the module doc.
#[tokio::test]
async fn budget_reads_are_exact_from_every_cursor() {
    let r = RedisServer::start(Persist::None).await;
    let s = Shared::connect(&r.url(), PREFIX).await.unwrap();
    // Estimate swingers: a read of small full chunks, a read of 1 MiB entries.
    let small = session(&s, 0, 600, &[300], None).await;
    let large = session(&s, 3, 6, &[1], None).await;
    let mut sessions: Vec<(SessionId, u8)> = Vec::new();
    sessions.push((session(&s, 1, 200, &[1, 7, 40, 256, 3], None).await, 1));
    sessions.push((session(&s, 1, 160, &[160], None).await, 1));
    sessions.push((session(&s, 2, 40, &[1, 5, 17], None).await, 2));
    sessions.push((session(&s, 0, 700, &[256, 1, 300, 5], None).await, 0));
    sessions.push((session(&s, 1, 260, &[13, 50, 2], Some(90)).await, 1));
    let budgets = [0u64, 1, 100, 30 << 10, MIB, u64::MAX];
    let maxes = [1usize, 2, 16, 17, 256, usize::MAX];
    let mut rng = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let mut reads = 0;
    for (id, shape) in &sessions {
        let (rec, _) = s.read(id, u64::MAX, 1).await.unwrap().unwrap();
        let (lo, head) = (rec.ranges.oldest, rec.ranges.head);
        for after in (lo - 1)..=head {
            for _ in 0..3 {
                let budget = budgets[(next() % budgets.len() as u64) as usize];
                let max = maxes[(next() % maxes.len() as u64) as usize];
                // The read's hint: the session's own, or one learnt from another session's
                // small or large entries (whatever the estimate, the read is exact).
                let swing = next() % 3;
                match swing {
                    0 => drop(
                        s.read_within(&small, 0, 600, u64::MAX, hint(&small))
                            .await
                            .unwrap(),
                    ),
                    1 => drop(
                        s.read_within(&large, 0, 256, MIB, hint(&large))
                            .await
                            .unwrap(),
                    ),
                    _ => {}
                }
                let est = [hint(&small), hint(&large), hint(id)][swing as usize];
                let what = format!(
                    "shape {shape} lo {lo} head {head} after {after} max {max} budget {budget} hint {swing}"
                );
                let (_, got) = s
                    .read_within(id, after, max, budget, est)
                    .await
                    .unwrap()
                    .unwrap();
                check_read(&got, *shape, after, head, max, budget, &what);
                reads += 1;
                if next() % 4 == 0 {
                    let by_script = scripted(&r, &s, id, after, max, budget).await;
                    check_read(
                        &by_script,
                        *shape,
                        after,
                        head,
                        max,
                        budget,
                        &format!("{what} (script)"),
                    );
                    assert_eq!(seqs(&got), seqs(&by_script), "{what}: plain vs script");
                }
            }
        }
        // Walks with the budget: exactly lo ..= head.
        for budget in budgets {
            let mut after = lo - 1;
            let mut all = Vec::new();
            while after < head {
                let (_, page) = s
                    .read_within(id, after, 256, budget, hint(id))
                    .await
                    .unwrap()
                    .unwrap();
                check_read(
                    &page,
                    *shape,
                    after,
                    head,
                    256,
                    budget,
                    &format!("walk budget {budget}"),
                );
                after = page.last().unwrap().seq;
                all.extend(seqs(&page));
            }
            assert_eq!(all, (lo..=head).collect::<Vec<_>>(), "walk budget {budget}");
        }
    }
    eprintln!("{reads} reads checked");
}

async fn xdel(r: &RedisServer, id: &SessionId, entry: &str) {
    let mut c = r.admin().await;
    let n: i64 = ::redis::cmd("XDEL")
        .arg(keys(id).1)
        .arg(entry)
        .query_async(&mut c)
        .await
        .unwrap();
    assert_eq!(n, 1);
}

/// The ids of a session's stream entries.
async fn entry_ids(r: &RedisServer, id: &SessionId) -> Vec<String> {
    let mut c = r.admin().await;
    type Entry = (String, Vec<(String, Vec<u8>)>);
    let v: Vec<Entry> = ::redis::cmd("XRANGE")
        .arg(keys(id).1)
        .arg("-")
        .arg("+")
        .query_async(&mut c)
        .await
        .unwrap();
    v.into_iter().map(|(i, _)| i).collect()
}

/// PROBE (held). See the module doc.
#[tokio::test]
async fn a_hole_or_stray_under_a_budget_is_a_loud_gap() {
    let r = RedisServer::start(Persist::None).await;
    let s = Shared::connect(&r.url(), PREFIX).await.unwrap();
    let small = session(&s, 0, 600, &[300], None).await;
    let large = session(&s, 3, 4, &[1], None).await;
    // Mixed entries: 1, 7, 40, ... events each; one entry in the middle deleted.
    let holed = session(&s, 1, 200, &[1, 7, 40, 3, 2], None).await;
    let ids = entry_ids(&r, &holed).await;
    let victim = ids[ids.len() / 2].clone();
    let first_lost: u64 = victim.trim_end_matches("-0").parse().unwrap();
    xdel(&r, &holed, &victim).await;
    for budget in [1u64, 100, 30 << 10, MIB, u64::MAX] {
        for est in 0..2 {
            for max in [1usize, 16, 256] {
                let what = format!("budget {budget} est {est} max {max} hole at {first_lost}");
                let mut after = 0;
                let mut gap = None;
                loop {
                    if est == 0 {
                        drop(
                            s.read_within(&small, 0, 600, u64::MAX, hint(&small))
                                .await
                                .unwrap(),
                        );
                    } else {
                        drop(
                            s.read_within(&large, 0, 256, MIB, hint(&large))
                                .await
                                .unwrap(),
                        );
                    }
                    let est = if est == 0 { hint(&small) } else { hint(&large) };
                    let (_, page) = s
                        .read_within(&holed, after, max, budget, est)
                        .await
                        .unwrap()
                        .unwrap();
                    let Some(first) = page.first() else {
                        panic!("{what}: empty read at {after} before the head 200");
                    };
                    if first.seq != after + 1 {
                        gap = Some((after, first.seq));
                        break;
                    }
                    check_read(&page, 1, after, 200, max, budget, &what);
                    after = page.last().unwrap().seq;
                    if after >= 200 {
                        break;
                    }
                }
                let (at, got) =
                    gap.unwrap_or_else(|| panic!("{what}: walked past the hole silently"));
                assert_eq!(
                    at,
                    first_lost - 1,
                    "{what}: the walk stopped at {at} (gap to {got})"
                );
                assert!(got > first_lost, "{what}");
            }
        }
    }
}

/// PROBE (held). See the module doc.
#[tokio::test]
async fn a_cursor_trimmed_under_or_mid_chunk_with_a_budget() {
    let r = RedisServer::start(Persist::None).await;
    let s = Shared::connect(&r.url(), PREFIX).await.unwrap();
    let id = new_session(&s).await;
    let mut h = 0u64;
    let mut k = 0;
    let sizes = [5u64, 100, 1, 33, 256, 2];
    while h < 1500 {
        let n = sizes[k % sizes.len()];
        k += 1;
        let evs: Vec<NewEvent> = (h + 1..=h + n).map(|i| ev(1, i)).collect();
        h = s
            .append(&id, &owner(), h, &format!("b{h}"), &evs, Some(120))
            .await
            .unwrap()
            .unwrap();
        if k % 3 != 0 {
            continue;
        }
        let (rec, _) = s.read(&id, u64::MAX, 1).await.unwrap().unwrap();
        let lo = rec.ranges.oldest;
        for after in [
            lo.saturating_sub(130),
            lo.saturating_sub(2),
            lo - 1,
            lo,
            lo + 3,
            h - 1,
        ] {
            for budget in [1u64, 20 << 10, MIB] {
                let what = format!("lo {lo} head {h} after {after} budget {budget}");
                let (_, got) = s
                    .read_within(&id, after, 256, budget, hint(&id))
                    .await
                    .unwrap()
                    .unwrap();
                let by_script = scripted(&r, &s, &id, after, 256, budget).await;
                assert_eq!(seqs(&got), seqs(&by_script), "{what}: plain vs script");
                if after + 1 >= lo {
                    check_read(&got, 1, after, h, 256, budget, &what);
                } else {
                    // Trimmed under the cursor (lo moved past it; chunks that reach lo stay, so
                    // events below lo may still be read): whatever comes is consecutive, and
                    // either exact or a gap the reader's check ends its stream on.
                    assert!(got.windows(2).all(|w| w[1].seq == w[0].seq + 1), "{what}");
                    for e in &got {
                        assert_eq!(e.payload, ev(1, e.seq).payload, "{what}");
                    }
                }
            }
        }
    }
}

/// FINDING. See the module doc.
#[tokio::test]
async fn another_sessions_read_makes_a_budget_read_fetch_sixteen_large_entries() {
    let r = RedisServer::start(Persist::None).await;
    let s = Shared::connect(&r.url(), PREFIX).await.unwrap();
    let large = session(&s, 3, 40, &[1], None).await;
    // Small events, one entry each (what a session of one-event appends holds).
    let small = session(&s, 0, 64, &[1], None).await;
    // Baseline: the previous read was of this session's 1 MiB entries.
    drop(
        s.read_within(&large, 0, 256, MIB, hint(&large))
            .await
            .unwrap(),
    );
    let before = net_out(&r).await;
    let (_, got) = s
        .read_within(&large, 10, 256, MIB, hint(&large))
        .await
        .unwrap()
        .unwrap();
    let alone = net_out(&r).await - before;
    assert_eq!(seqs(&got), vec![11]);
    // The script (a Cluster's path) after a read of small entries.
    drop(
        s.read_within(&small, 0, 256, MIB, hint(&small))
            .await
            .unwrap(),
    );
    let before = net_out(&r).await;
    let by_script = scripted(&r, &s, &large, 10, 256, MIB).await;
    let script = net_out(&r).await - before;
    assert_eq!(seqs(&by_script), vec![11]);
    // The plain path after a read of small entries of another session.
    drop(
        s.read_within(&small, 0, 256, MIB, hint(&small))
            .await
            .unwrap(),
    );
    let before = net_out(&r).await;
    let (_, got) = s
        .read_within(&large, 10, 256, MIB, hint(&large))
        .await
        .unwrap()
        .unwrap();
    let poisoned = net_out(&r).await - before;
    assert_eq!(seqs(&got), vec![11]);
    eprintln!(
        "Redis sent for one budget read of 1 MiB entries: {alone} bytes after a read of the \
         same session, {script} by the script, {poisoned} after a read of small entries of \
         another session"
    );
    let bound = MIB + MIB + (512 << 10);
    assert!(alone < bound, "baseline {alone}");
    // (The script's figure includes the plain path's MULTI that found no `lo` first.)
    assert!(
        poisoned < bound,
        "Redis sent {poisoned} bytes ({} MiB) for a read within 1 MiB that returned one event, \
         after another session's read of small entries (baseline {alone})",
        poisoned >> 20
    );
}

/// FINDING. A Streamable HTTP resume (`GET /mcp` + `Last-Event-ID`) first counts what its stream
/// owes (`owed`, src/facade/streamable.rs:552-590) with `Log::read_after(sl, cur, 256)`, which
/// 4c032c2 left unbudgeted (`shared::read_after(.., u64::MAX)`, src/log/mod.rs:528): on Redis
/// each of those reads fetches and parses up to 256 events of any size, before the stream's
/// budgeted `read_batch` ever runs. Eight sessions of 24 × 3.9 MiB events (as
/// `adv19_resumes_of_big_events_on_redis_read_a_few_of_them`, but on the Streamable face, at
/// 2025-11-25 so the POST stream's priming event is a cursor before the flood), resumed at once
/// from that priming event by clients that read nothing: the proxy's peak RSS passes the bound
/// adversary19 holds the legacy face to (8 × 34 MiB + 48 MiB).
///
/// Reproduction: proxy binary, `log.backend = "redis"`; per session `initialize` (2025-11-25),
/// `tools/call emit {count 24, rate_per_sec 0, size 4000000}`, keep the POST stream's first
/// (priming) event id, drop the stream; once the events are logged, eight concurrent
/// `GET /mcp` with that `Last-Event-ID`: `VmHWM` − `VmRSS` before ≈ 8 × 94 MB.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamable_resumes_of_big_events_on_redis_count_them_unbudgeted() {
    use mcp_resume_proxy::demo::upstream::{Upstream, UpstreamOptions};
    use serde_json::json;
    use std::time::Duration;
    use support::slow_disk::{reset_peak, status_kib};
    use support::streamable::Client;
    use support::{metric, ProxyProc};
    const SESSIONS: u64 = 8;
    const COUNT: u64 = 24;
    const SIZE: u64 = 4_000_000;
    const SLACK: u64 = 48 << 20;
    let redis = RedisServer::start(Persist::None).await;
    let up = Upstream::spawn(UpstreamOptions::default()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let url = format!("url = \"{}\"", redis.url());
    let extra = [
        ("[log]", "backend = \"redis\"\ndurability = \"relaxed\""),
        ("[log.redis]", url.as_str()),
    ];
    let mut proxy = ProxyProc::start(&up.sse_url(), &dir.path().join("data"), &extra).await;
    let pid = proxy.proc.pid();
    let metrics = proxy.metrics_url();
    let addr: std::net::SocketAddr = format!("127.0.0.1:{}", proxy.port).parse().unwrap();
    let logged_before = metric(&metrics, "mcp_resume_events_logged_total").await;
    let mut cursors = Vec::new();
    for _ in 0..SESSIONS {
        let (mut c, _) = Client::init(addr, "2025-11-25").await;
        let (_, mut sse) = c
            .call(
                "emit",
                json!({"count": COUNT, "rate_per_sec": 0, "size": SIZE}),
                "p",
            )
            .await;
        let first = sse.next().await.expect("the priming event");
        assert!(first.is_priming(), "{first:?}");
        let lei = first.id.clone().expect("an id");
        drop(sse);
        cursors.push((c, lei));
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
    while metric(&metrics, "mcp_resume_events_logged_total").await - logged_before
        < (SESSIONS * COUNT) as f64
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the floods never reached Redis"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    reset_peak(pid);
    let base = status_kib(pid, "VmRSS");
    let mut tasks = Vec::new();
    for (c, lei) in &cursors {
        let (addr, session, version, lei) =
            (c.addr, c.session.clone(), c.version.clone(), lei.clone());
        tasks.push(tokio::spawn(async move {
            let h = [
                ("mcp-session-id", session.as_str()),
                ("mcp-protocol-version", version.as_str()),
                ("accept", "text/event-stream"),
                ("last-event-id", lei.as_str()),
            ];
            support::send(addr, "GET", "/mcp", &h, None).await
        }));
    }
    let mut resumed = Vec::new();
    for t in tasks {
        let r = t.await.unwrap();
        if r.status != 200 {
            let st = r.status;
            let retry = r.header("retry-after");
            panic!(
                "resume refused: {st} retry-after {retry:?} {:?}",
                String::from_utf8_lossy(&r.bytes().await)
            );
        }
        resumed.push(r);
    }
    tokio::time::sleep(Duration::from_secs(4)).await;
    let peak = status_kib(pid, "VmHWM");
    proxy.proc.kill();
    drop(resumed);
    let bound = SESSIONS * (2 * (MIB + 4 * MIB) + 4 * 4 * MIB + 2 * 4 * MIB) + SLACK;
    eprintln!(
        "8 streamable resumes of 24 × 3.9 MB events on Redis: base {} MiB, peak {} MiB (+{} MiB), bound +{} MiB",
        base >> 20,
        peak >> 20,
        peak.saturating_sub(base) >> 20,
        bound >> 20
    );
    assert!(
        peak <= base + bound,
        "peak RSS {} MiB over base {} MiB + {} MiB",
        peak >> 20,
        base >> 20,
        bound >> 20
    );
}
