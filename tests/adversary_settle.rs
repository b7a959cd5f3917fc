//! Adversarial review of 5eb8d98: the Redis writer settles an append whose outcome is unknown
//! (a transient error) by sending it again, same expected head and batch token, every 250 ms
//! until Redis answers or `settle_by` (last renewal + 3/4 of the lease) passes; the whole writer
//! turn waits meanwhile. Real `redis-server` on loopback; the owner (replica A) reaches it through
//! a relay that can cut the reply of the turn's transaction (the write lands, its reply is lost)
//! and then keep A's resends from reaching Redis, either all of A's traffic or only the commands
//! carrying the marked event (so A's reads and lease still work). Replica B talks to Redis
//! directly. FINDING tests failed on 5eb8d98 (fixed since: `refresh` answers `Unavailable`, a 503, for a record this replica owns at its epoch whose head is past its own); PROBE tests held.
//!
//! Run: `cargo test --test adversary_settle` (needs `redis-server`).

mod support;

use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use mcp_resume_proxy::config::Durability;
use mcp_resume_proxy::domain::Facade;
use mcp_resume_proxy::log::cursor::{check_resume, Cursor, Refusal, SessionId};
use mcp_resume_proxy::log::redis::{Fence, Shared};
use mcp_resume_proxy::log::{Event, Kind, Log, NewEvent, SessionLog, StreamTag};
use support::redis::{Persist, RedisServer};

const PREFIX: &str = "advs";
const MARK: &[u8] = b"MARK-SETTLE-7f3a";

fn ev(i: u64) -> NewEvent {
    NewEvent::new(
        StreamTag(2),
        Kind::Message,
        Bytes::from(format!("{{\"plain\":{i}}}")),
    )
}

/// The event whose append is cut: its bytes carry [`MARK`], which the relay looks for.
fn marked() -> NewEvent {
    let mut b = b"{\"marked\":\"".to_vec();
    b.extend_from_slice(MARK);
    b.extend_from_slice(b"\"}");
    NewEvent::new(StreamTag(2), Kind::Message, Bytes::from(b))
}

fn holds_mark(b: &[u8]) -> bool {
    b.windows(MARK.len()).any(|w| w == MARK)
}

/// What the relay does once it has cut a transaction's reply.
const AFTER_CUT_NOTHING: u8 = 0;
/// Drop (with its connection, unforwarded) every command that carries [`MARK`]: A's resends never
/// reach Redis, its reads and lease renewals do.
const AFTER_CUT_DROP_MARKED: u8 = 1;
/// Drop every connection and every byte: Redis is out of A's reach.
const AFTER_CUT_BLOCK: u8 = 2;

/// A TCP relay in front of Redis for replica A.
struct Relay {
    port: u16,
    /// Cut the next reply that answers a transaction (holds `+QUEUED`): Redis ran it.
    cut_queued: Arc<AtomicBool>,
    after_cut: Arc<AtomicU8>,
    drop_marked: Arc<AtomicBool>,
    blocked: Arc<AtomicBool>,
    cuts: Arc<AtomicUsize>,
    drops: Arc<AtomicUsize>,
    /// What a dropped command holds ([`MARK`] unless set).
    pattern: Arc<std::sync::Mutex<Vec<u8>>>,
}

impl Relay {
    async fn start(upstream: u16) -> Relay {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let relay = Relay {
            port,
            cut_queued: Arc::new(AtomicBool::new(false)),
            after_cut: Arc::new(AtomicU8::new(AFTER_CUT_NOTHING)),
            drop_marked: Arc::new(AtomicBool::new(false)),
            blocked: Arc::new(AtomicBool::new(false)),
            cuts: Arc::new(AtomicUsize::new(0)),
            drops: Arc::new(AtomicUsize::new(0)),
            pattern: Arc::new(std::sync::Mutex::new(MARK.to_vec())),
        };
        let relay_pattern = relay.pattern.clone();
        let (cq, ac, dm, bl, cuts, drops) = (
            relay.cut_queued.clone(),
            relay.after_cut.clone(),
            relay.drop_marked.clone(),
            relay.blocked.clone(),
            relay.cuts.clone(),
            relay.drops.clone(),
        );
        tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    return;
                };
                if bl.load(Ordering::SeqCst) {
                    drop(client);
                    continue;
                }
                let Ok(server) = tokio::net::TcpStream::connect(("127.0.0.1", upstream)).await
                else {
                    continue;
                };
                let (mut cr, mut cw) = client.into_split();
                let (mut sr, mut sw) = server.into_split();
                let (dm1, bl1, drops1) = (dm.clone(), bl.clone(), drops.clone());
                let pat = relay_pattern.clone();
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 256 * 1024];
                    loop {
                        let n = match cr.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => n,
                        };
                        if bl1.load(Ordering::SeqCst) {
                            drops1.fetch_add(1, Ordering::SeqCst);
                            return;
                        }
                        let marked = {
                            let p = pat.lock().unwrap();
                            buf[..n].windows(p.len()).any(|w| w == p.as_slice())
                        };
                        if dm1.load(Ordering::SeqCst) && marked {
                            drops1.fetch_add(1, Ordering::SeqCst);
                            return;
                        }
                        if sw.write_all(&buf[..n]).await.is_err() {
                            return;
                        }
                    }
                });
                let (cq2, ac2, dm2, bl2, cuts2) =
                    (cq.clone(), ac.clone(), dm.clone(), bl.clone(), cuts.clone());
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 256 * 1024];
                    loop {
                        let n = match sr.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => n,
                        };
                        if bl2.load(Ordering::SeqCst) {
                            return;
                        }
                        let tx = buf[..n].windows(8).any(|w| w == b"+QUEUED\r");
                        if tx && cq2.swap(false, Ordering::SeqCst) {
                            match ac2.load(Ordering::SeqCst) {
                                AFTER_CUT_DROP_MARKED => dm2.store(true, Ordering::SeqCst),
                                AFTER_CUT_BLOCK => bl2.store(true, Ordering::SeqCst),
                                _ => {}
                            }
                            cuts2.fetch_add(1, Ordering::SeqCst);
                            return;
                        }
                        if cw.write_all(&buf[..n]).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        relay
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Cut the next transaction's reply, then do `after`.
    fn arm(&self, after: u8) {
        self.after_cut.store(after, Ordering::SeqCst);
        self.cut_queued.store(true, Ordering::SeqCst);
    }

    /// Back to a plain relay.
    fn heal(&self) {
        self.drop_marked.store(false, Ordering::SeqCst);
        self.blocked.store(false, Ordering::SeqCst);
    }

    async fn until_cut(&self) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while self.cuts.load(Ordering::SeqCst) == 0 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the turn's reply was never cut"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

async fn open_replica(url: &str, replica: &str, dir: &std::path::Path, lease_ms: u64) -> Arc<Log> {
    open_replica_as(url, replica, dir, lease_ms, Durability::Fsync).await
}

/// [`open_replica`] with `log.durability` (`relaxed` opens on a Redis without persistence).
async fn open_replica_as(
    url: &str,
    replica: &str,
    dir: &std::path::Path,
    lease_ms: u64,
    durability: Durability,
) -> Arc<Log> {
    support::redis::open_log(support::redis::LogOn {
        url,
        prefix: PREFIX,
        replica,
        dir,
        max_events: 10_000,
        lease_ms,
        durability,
    })
    .await
}

fn keys(id: &SessionId) -> [String; 3] {
    [
        format!("{PREFIX}:{{{id}}}:m"),
        format!("{PREFIX}:{{{id}}}:ev"),
        format!("{PREFIX}:{{{id}}}:in"),
    ]
}

/// Every event of `id` from 1 up to the head, read from Redis; panics on a gap or a duplicate.
async fn all_events(s: &Shared, id: &SessionId) -> Vec<Event> {
    let mut out: Vec<Event> = Vec::new();
    let mut at = 0;
    loop {
        let (rec, evs) = s.read(id, at, 64).await.unwrap().expect("record");
        if evs.is_empty() {
            assert_eq!(at, rec.ranges.head, "read stopped short of the head");
            return out;
        }
        for e in evs {
            assert_eq!(e.seq, at + 1, "gap or duplicate after {at}");
            at = e.seq;
            out.push(e);
        }
    }
}

async fn head_in_redis(s: &Shared, id: &SessionId) -> Option<u64> {
    s.read(id, u64::MAX, 1)
        .await
        .unwrap()
        .map(|(r, _)| r.ranges.head)
}

/// A session on A with three events written normally (head 3).
async fn session_at_3(a: &Log) -> (SessionId, Arc<SessionLog>) {
    let id = SessionId::random();
    let sl = a.create(id, Facade::Streamable, None, None).await.unwrap();
    for i in 0..3 {
        a.append(&sl, ev(i)).await.unwrap();
    }
    assert_eq!(sl.head(), 3);
    (id, sl)
}

/// A's append of the marked event, waited for in a task of its own.
fn append_marked(
    a: &Arc<Log>,
    sl: &Arc<SessionLog>,
) -> tokio::task::JoinHandle<(mcp_resume_proxy::error::Result<u64>, Duration)> {
    let (a, sl) = (a.clone(), sl.clone());
    tokio::spawn(async move {
        let t = tokio::time::Instant::now();
        let r = a.append(&sl, marked()).await;
        (r, t.elapsed())
    })
}

async fn wait_for<F, Fut>(what: &str, secs: u64, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
    while !f().await {
        assert!(tokio::time::Instant::now() < deadline, "timed out: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// FINDING: while the owner settles a landed append, another replica serves that append's event
/// (it is durable in Redis), and the owner refuses the cursor of that very event as
/// `cursor_ahead` — a `resume_gap` refusal for a valid cursor of a delivered event.
///
/// Reproduction: Redis (AOF always); replica A (lease 10 s) reaches it through a relay, replica B
/// directly. A session on A at head 3. The relay cuts the reply of A's next transaction (the
/// watched `MULTI`/`EXEC` appending the marked event: it lands, head 4, A never hears) and from
/// then on drops, with its connection, every command that carries the marked event's bytes: A's
/// resends never reach Redis, while its reads and lease renewals do. A keeps resending until
/// `settle_by` (7.5 s after its last renewal), its head at 3 and the session not failed. B
/// (`lookup`, a mirror) reads seq 4 from Redis and serves it: a client holding cursor (epoch 1,
/// seq 4) from B resumes on A (the owner, as a load balancer may send it). A runs what
/// `facade::resume` runs: `check_resume` against its ranges → `cursor_ahead`; not failed, so
/// `refresh` → `Ok(false)` (a record head *past* the local one is not "moved") → the refusal
/// stands: the client is told `resume_gap` for an event it was given, although the owner will
/// publish that very event a moment later (or, past `settle_by`, end the session after it).
/// Before 5eb8d98 the cut append ended the session at once: `failed()` → 503 `Unavailable`
/// (retryable), never a refusal of a valid cursor. Expected: while an append is being settled
/// the owner answers such a cursor as unavailable (or reads past its head from Redis), never
/// `cursor_ahead`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_owner_refuses_the_cursor_of_a_landed_event_another_replica_served_while_it_settles() {
    let r = RedisServer::start(Persist::AofAlways).await;
    let relay = Relay::start(r.port).await;
    let (da, db) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a = open_replica(&relay.url(), "ra", da.path(), 10_000).await;
    let b = open_replica(&r.url(), "rb", db.path(), 10_000).await;
    let s = Shared::connect(&r.url(), PREFIX).await.unwrap();
    let (id, sl) = session_at_3(&a).await;

    relay.arm(AFTER_CUT_DROP_MARKED);
    let pending = append_marked(&a, &sl);
    relay.until_cut().await;
    wait_for("the cut append is in Redis", 10, || async {
        head_in_redis(&s, &id).await == Some(4)
    })
    .await;

    // B serves seq 4 from Redis.
    let mirror = b.lookup(&id).await.unwrap().expect("B knows the session");
    wait_for("B's mirror reaches 4", 10, || async { mirror.head() == 4 }).await;
    let served = b.read_after(&mirror, 3, 16).await.unwrap();
    assert_eq!(served.len(), 1);
    assert!(holds_mark(&served[0].payload), "B serves the landed event");
    let cursor = Cursor {
        session: id,
        epoch: served[0].epoch,
        seq: 4,
    };
    assert!(check_resume(&cursor, &mirror.ranges(), false).is_ok());

    // The same cursor on the owner, as `facade::resume` checks it.
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert!(!pending.is_finished(), "A is still settling its append");
    assert!(
        relay.drops.load(Ordering::SeqCst) >= 1,
        "A resent its append"
    );
    let mut checked = check_resume(&cursor, &sl.ranges(), false);
    let mut refreshed = None;
    // `refresh` answering `Unavailable` is what `facade::resume` turns into a 503 (retry): the
    // fix, since the record owned by A at its epoch is past A's head (A's own landed write).
    let mut unavailable = false;
    if checked.is_err() && !sl.failed() {
        // A's reads share the connection the relay drops with each resend: ask until one passes.
        for _ in 0..20 {
            match a.refresh(&sl).await {
                Ok(m) => {
                    refreshed = Some(m);
                    break;
                }
                Err(mcp_resume_proxy::error::Error::Store(
                    mcp_resume_proxy::error::StoreError::Unavailable,
                )) => {
                    unavailable = true;
                    break;
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
        if !unavailable {
            checked = check_resume(&cursor, &sl.ranges(), false);
        }
    }
    let (failed, head, still) = (sl.failed(), sl.head(), !pending.is_finished());
    relay.heal();
    let (settled, took) = pending.await.unwrap();
    assert!(
        failed || unavailable || checked.is_ok(),
        "the owner refuses cursor (epoch 1, seq 4) of an event replica B has served from Redis: \
         {checked:?} (owner head {head}, not failed, refresh {refreshed:?}, still settling {still}; \
         a resume there is answered resume_gap/cursor_ahead); the append then settled as \
         {settled:?} after {took:?}"
    );
    assert!(unavailable || checked != Err(Refusal::CursorAhead));
}

/// PROBE (held). A's append lands, its reply is cut, then Redis is out of A's reach; Redis is
/// SIGKILLed and restarted *without persistence* (the record is gone); A's resend must not
/// recreate the record or write into nothing: it meets `NOSESSION`, the append fails, A drops the
/// session, and Redis holds no key of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_without_persistence_during_the_settle_recreates_nothing() {
    let mut r = RedisServer::start(Persist::None).await;
    let relay = Relay::start(r.port).await;
    let da = tempfile::tempdir().unwrap();
    let a = open_replica_as(&relay.url(), "ra", da.path(), 10_000, Durability::Relaxed).await;
    let (id, sl) = session_at_3(&a).await;
    relay.arm(AFTER_CUT_BLOCK);
    let pending = append_marked(&a, &sl);
    relay.until_cut().await;
    r.restart().await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    relay.heal();
    let (res, took) = tokio::time::timeout(Duration::from_secs(30), pending)
        .await
        .expect("the settling append ends")
        .unwrap();
    assert!(
        res.is_err(),
        "an append into a lost record is never acknowledged: {res:?}"
    );
    assert!(took < Duration::from_secs(20), "the turn ended ({took:?})");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut c = r.admin().await;
    for k in keys(&id) {
        let n: i64 = ::redis::cmd("EXISTS")
            .arg(&k)
            .query_async(&mut c)
            .await
            .unwrap();
        assert_eq!(n, 0, "{k} was written after the record was lost");
    }
    assert_eq!(sl.head(), 3, "nothing published");
}

/// PROBE (held). As above with `FLUSHALL` (AOF always) while A's append settles.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flushall_during_the_settle_recreates_nothing() {
    let r = RedisServer::start(Persist::AofAlways).await;
    let relay = Relay::start(r.port).await;
    let da = tempfile::tempdir().unwrap();
    let a = open_replica(&relay.url(), "ra", da.path(), 10_000).await;
    let (id, sl) = session_at_3(&a).await;
    relay.arm(AFTER_CUT_BLOCK);
    let pending = append_marked(&a, &sl);
    relay.until_cut().await;
    let mut c = r.admin().await;
    let _: () = ::redis::cmd("FLUSHALL").query_async(&mut c).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    relay.heal();
    let (res, _) = tokio::time::timeout(Duration::from_secs(30), pending)
        .await
        .expect("the settling append ends")
        .unwrap();
    assert!(res.is_err(), "{res:?}");
    tokio::time::sleep(Duration::from_millis(500)).await;
    for k in keys(&id) {
        let n: i64 = ::redis::cmd("EXISTS")
            .arg(&k)
            .query_async(&mut c)
            .await
            .unwrap();
        assert_eq!(n, 0, "{k} was written after FLUSHALL");
    }
    assert_eq!(sl.head(), 3);
}

/// PROBE (held). A stale owner: its append lands (reply cut), Redis is out of its reach, and
/// another replica takes the session over (as its reaper does once A's lease lapsed: the epoch
/// sealed at 4, the end at 5 in epoch 2). A's resend then meets the fence: nothing more is
/// written, the landed event stays once, A's log adopts the taker's history.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_takeover_during_the_settle_fences_the_resend() {
    let r = RedisServer::start(Persist::AofAlways).await;
    let relay = Relay::start(r.port).await;
    let da = tempfile::tempdir().unwrap();
    let a = open_replica(&relay.url(), "ra", da.path(), 10_000).await;
    let s = Shared::connect(&r.url(), PREFIX).await.unwrap();
    let (id, sl) = session_at_3(&a).await;
    relay.arm(AFTER_CUT_BLOCK);
    let pending = append_marked(&a, &sl);
    relay.until_cut().await;
    let (rec, _) = s.read(&id, u64::MAX, 1).await.unwrap().unwrap();
    assert_eq!(rec.ranges.head, 4);
    let t = s
        .takeover(&id, &rec.fence, "rb/1", "upstream_lost", "lost", 600)
        .await
        .unwrap()
        .unwrap();
    assert_eq!((t.epoch, t.head), (2, 5));
    tokio::time::sleep(Duration::from_millis(300)).await;
    relay.heal();
    let (res, _) = tokio::time::timeout(Duration::from_secs(30), pending)
        .await
        .expect("the settling append ends")
        .unwrap();
    assert!(res.is_err(), "{res:?}");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (rec, _) = s.read(&id, u64::MAX, 1).await.unwrap().unwrap();
    assert_eq!(
        rec.fence,
        Fence {
            owner: "rb/1".into(),
            epoch: 2
        }
    );
    let evs = all_events(&s, &id).await;
    assert_eq!(evs.len(), 5);
    assert_eq!(evs.iter().filter(|e| holds_mark(&e.payload)).count(), 1);
    assert!(holds_mark(&evs[3].payload) && evs[3].epoch == 1);
    wait_for("A adopts the taker's end", 10, || async { sl.head() == 5 }).await;
}

/// PROBE (held). As above, but A's append never reached Redis (A was cut off before it): the
/// takeover seals at 3, and A's resends after it write nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_takeover_before_an_unsent_append_lands_fences_every_resend() {
    let r = RedisServer::start(Persist::AofAlways).await;
    let relay = Relay::start(r.port).await;
    let da = tempfile::tempdir().unwrap();
    let a = open_replica(&relay.url(), "ra", da.path(), 10_000).await;
    let s = Shared::connect(&r.url(), PREFIX).await.unwrap();
    let (id, sl) = session_at_3(&a).await;
    relay.blocked.store(true, Ordering::SeqCst);
    let pending = append_marked(&a, &sl);
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert!(!pending.is_finished(), "A settles");
    let (rec, _) = s.read(&id, u64::MAX, 1).await.unwrap().unwrap();
    assert_eq!(rec.ranges.head, 3, "nothing reached Redis");
    s.takeover(&id, &rec.fence, "rb/1", "upstream_lost", "lost", 600)
        .await
        .unwrap()
        .unwrap();
    relay.heal();
    let (res, _) = tokio::time::timeout(Duration::from_secs(30), pending)
        .await
        .expect("the settling append ends")
        .unwrap();
    assert!(res.is_err(), "{res:?}");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let evs = all_events(&s, &id).await;
    assert_eq!(evs.len(), 4, "three events and the taker's end");
    assert!(
        evs.iter().all(|e| !holds_mark(&e.payload)),
        "the stale owner wrote after the takeover"
    );
}

/// PROBE (held). Redis rewound under a settling append (as a restart from an older AOF would,
/// simulated on the live server: the landed event and the one before it removed, head and batch
/// token set back to seq 2's): A's resend meets a head that is neither its expected one nor its
/// own token, so it seals epoch 1 at 2 and ends the session; no id of epoch 1 past 2 is issued
/// again with other bytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rewind_during_the_settle_seals_and_never_reissues() {
    let r = RedisServer::start(Persist::AofAlways).await;
    let relay = Relay::start(r.port).await;
    let da = tempfile::tempdir().unwrap();
    let a = open_replica(&relay.url(), "ra", da.path(), 10_000).await;
    let s = Shared::connect(&r.url(), PREFIX).await.unwrap();
    let (id, sl) = session_at_3(&a).await;
    relay.arm(AFTER_CUT_BLOCK);
    let pending = append_marked(&a, &sl);
    relay.until_cut().await;
    let [m, stream, _] = keys(&id);
    let mut c = r.admin().await;
    let n: i64 = ::redis::cmd("XDEL")
        .arg(&stream)
        .arg("3-0")
        .arg("4-0")
        .query_async(&mut c)
        .await
        .unwrap();
    assert_eq!(n, 2);
    // An older AOF's stream never generated ids past 2.
    let _: () = ::redis::cmd("XSETID")
        .arg(&stream)
        .arg("2-0")
        .query_async(&mut c)
        .await
        .unwrap();
    let _: () = ::redis::cmd("HSET")
        .arg(&m)
        .arg("head")
        .arg("2")
        .arg("bt")
        .arg("older-token")
        .query_async(&mut c)
        .await
        .unwrap();
    relay.heal();
    let (res, _) = tokio::time::timeout(Duration::from_secs(30), pending)
        .await
        .expect("the settling append ends")
        .unwrap();
    assert!(res.is_err(), "{res:?}");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let (rec, evs) = s.read(&id, 0, 64).await.unwrap().unwrap();
    assert!(
        rec.ended.is_some(),
        "the session ends in Redis: {rec:?} {evs:?} (A: head {}, failed {}, ended {:?})",
        sl.head(),
        sl.failed(),
        sl.ended()
    );
    assert_eq!(
        rec.ranges.epochs[0].last,
        Some(2),
        "epoch 1 sealed at what survived"
    );
    let evs = s.read(&id, 2, 64).await.unwrap().unwrap().1;
    assert!(
        evs.iter().all(|e| e.epoch != 1),
        "an id of epoch 1 past 2 issued again: {evs:?}"
    );
    assert!(evs.iter().all(|e| !holds_mark(&e.payload)));
}

/// PROBE (held). An outage just past `settle_by` (lease 2 s: settle_by 1.5 s after the last
/// renewal): A's landed append is given up (the call fails, never acknowledged), A's lease
/// lapses, and B's reaper takes the session over: the landed event stays in Redis exactly once,
/// then the end. The settling turn ends (no hang).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outage_just_past_settle_by_gives_up_once_and_keeps_the_landed_event() {
    let r = RedisServer::start(Persist::AofAlways).await;
    let relay = Relay::start(r.port).await;
    let (da, db) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a = open_replica(&relay.url(), "ra", da.path(), 2_000).await;
    let _b = open_replica(&r.url(), "rb", db.path(), 2_000).await;
    let s = Shared::connect(&r.url(), PREFIX).await.unwrap();
    let (id, sl) = session_at_3(&a).await;
    relay.arm(AFTER_CUT_BLOCK);
    let pending = append_marked(&a, &sl);
    relay.until_cut().await;
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    relay.heal();
    let (res, took) = tokio::time::timeout(Duration::from_secs(30), pending)
        .await
        .expect("the settling append ends")
        .unwrap();
    assert!(
        res.is_err(),
        "given up past settle_by: {res:?} after {took:?}"
    );
    wait_for("the session is ended in Redis", 20, || async {
        s.read(&id, u64::MAX, 1)
            .await
            .unwrap()
            .unwrap()
            .0
            .ended
            .is_some()
    })
    .await;
    let evs = all_events(&s, &id).await;
    assert_eq!(evs.iter().filter(|e| holds_mark(&e.payload)).count(), 1);
    assert!(holds_mark(&evs[3].payload));
    assert_eq!(evs.last().unwrap().kind, Kind::End);
    let _ = sl;
}

/// FINDING (the same as above, seen by a client through two real proxies). While the owner
/// settles a landed append, a client holding the cursor of an event it was served by another
/// replica is refused by the owner (`resume_gap` / `cursor_ahead`, HTTP 4xx) for a valid cursor.
///
/// Reproduction: Redis (AOF always), FastMCP upstream; proxy A (`pod-a`, default lease 10 s)
/// reaches Redis through a relay, proxy B (`pod-b`) directly. A client calls `tick` (40 progress
/// notifications, 100 ms apart) on A and reads up to `progress 2`. The relay then cuts the reply
/// of A's next transaction (an append of the next progress event(s): it lands) and drops, with
/// its connection, every later `EVALSHA` of A (its resends; A's plain reads still pass). The
/// client's stream is cut; it resumes on B from `progress 2` and is served the landed event from
/// Redis (id `<s>:1:k`); its next resume, from that id, lands on A (the owner) while A is still
/// settling: A answers it with a refusal instead of 200 (or a retryable 503, as before 5eb8d98,
/// when the cut append ended the session at once).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_the_proxies_the_owner_refuses_a_cursor_another_replica_served_while_it_settles() {
    use mcp_resume_proxy::config::Backend;
    use support::fastmcp;
    use support::streamable::*;
    let r = RedisServer::start(Persist::AofAlways).await;
    let relay = Relay::start(r.port).await;
    *relay.pattern.lock().unwrap() = b"EVALSHA".to_vec();
    if std::env::var("ADV_TRACE").is_ok() {
        let _ = tracing_subscriber::fmt()
            .with_env_filter("mcp_resume_proxy=debug")
            .with_test_writer()
            .try_init();
    }
    let up = fastmcp().await;
    let start = |url: String, replica: &'static str| {
        let up = &up;
        async move {
            Proxy::start(up, move |c| {
                c.log.backend = Backend::Redis;
                c.log.redis.url = url;
                c.cluster.replica_id = replica.to_string();
            })
            .await
        }
    };
    let a = start(relay.url(), "pod-a").await;
    let b = start(r.url(), "pod-b").await;
    let shared = Shared::connect(&r.url(), "mcp-resume").await.unwrap();
    // The cut may fall between the transaction's `+QUEUED`s and its `EXEC` (then nothing
    // landed): try again on a new session until the cut append is in Redis.
    let mut landed = None;
    for _ in 0..6 {
        let (mut c, _) = Client::init(a.addr(), "2025-11-25").await;
        let (_id, mut s) = c
            .call(
                "tick",
                serde_json::json!({"n": 40, "interval_ms": 100}),
                "T",
            )
            .await;
        let first = s
            .until(|e| !e.is_priming() && e.describe() == "progress 2")
            .await;
        let cursor2 = first.last().unwrap().id.clone().unwrap();
        let mut parts = cursor2.split(':');
        let sid = SessionId::parse(parts.next().unwrap()).unwrap();
        let seq2: u64 = parts.nth(1).unwrap().parse().unwrap();
        let cuts = relay.cuts.load(Ordering::SeqCst);
        relay.drops.store(0, Ordering::SeqCst);
        relay.arm(AFTER_CUT_DROP_MARKED);
        while relay.cuts.load(Ordering::SeqCst) == cuts {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        s.cut();
        let mut ok = false;
        for _ in 0..40 {
            if head_in_redis(&shared, &sid).await.unwrap_or(0) > seq2 {
                ok = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        if ok {
            // On B: the landed event, from Redis (when the landed write holds one of this
            // call's stream: it may hold only events of other streams).
            let rb = c.at(b.addr()).get(Some(&cursor2)).await;
            assert_eq!(rb.status, 200);
            let mut sb = rb.sse();
            let mut got = None;
            while let Ok(Some(e)) = sb.next_within(Duration::from_secs(2)).await {
                if !e.is_priming() {
                    got = Some(e);
                    break;
                }
            }
            if let Some(got) = got {
                let served = got.id.clone().expect("with an id");
                landed = Some((c, served, got.describe()));
                break;
            }
        }
        // Not this time: let A settle, and end that session so that its writes do not take
        // the next cut.
        relay.heal();
        tokio::time::sleep(Duration::from_millis(800)).await;
        let _ = c.delete().await;
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let (c, served, what) = landed.expect("B served a cut append that landed, in one of six tries");
    // A has resent its append at least once (the relay dropped it): A is settling.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while relay.drops.load(Ordering::SeqCst) == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "A never resent its append"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The next resume, from what B served, on the owner (still settling).
    let ra = c.get(Some(&served)).await;
    let status = ra.status;
    let body = if status == 200 {
        String::new()
    } else {
        String::from_utf8_lossy(&ra.bytes().await).into_owned()
    };
    let drops = relay.drops.load(Ordering::SeqCst);
    relay.heal();
    assert!(
        status == 200 || status == 503,
        "owner A refuses cursor {served} ({what}) that replica B served from Redis while A \
         settles its cut append ({drops} resends dropped): {status} {body}"
    );
    a.stop().await;
    b.stop().await;
}

/// PROBE (held; measures what the design accepts). While one session settles (its resends
/// dropped, Redis otherwise answering A), another session's append waits for the whole turn:
/// up to `settle_by` (lease 4 s: 3 s after the last renewal), never past the lease, and A keeps
/// its lease (a later append is quick and the settled session goes on).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_settling_session_stalls_the_others_within_the_lease_only() {
    let r = RedisServer::start(Persist::AofAlways).await;
    let relay = Relay::start(r.port).await;
    let da = tempfile::tempdir().unwrap();
    let a = open_replica(&relay.url(), "ra", da.path(), 4_000).await;
    let (_x, xl) = session_at_3(&a).await;
    let (_y, yl) = session_at_3(&a).await;
    relay.arm(AFTER_CUT_DROP_MARKED);
    let pending = append_marked(&a, &xl);
    relay.until_cut().await;
    let t = tokio::time::Instant::now();
    let yr = a.append(&yl, ev(9)).await;
    let stalled = t.elapsed();
    assert!(yr.is_ok(), "{yr:?}");
    assert!(
        stalled < Duration::from_millis(4_000),
        "an unrelated session waited {stalled:?}, past the lease"
    );
    eprintln!("an unrelated session's append waited {stalled:?} behind the settling one");
    let (xr, _) = pending.await.unwrap();
    assert!(
        xr.is_err(),
        "X's resends never reached Redis: given up ({xr:?})"
    );
    relay.heal();
    let t = tokio::time::Instant::now();
    a.append(&yl, ev(10)).await.unwrap();
    assert!(
        t.elapsed() < Duration::from_secs(2),
        "A still holds its lease and writes"
    );
}
