//! The shared log's storage on a real `redis-server` (design.md §13; `src/log/redis.rs`): fenced
//! compare-and-append, takeover, reads from one snapshot with the §4 resume check, and what Redis
//! losing data looks like to the owner and to resumes. Each test starts its own server on
//! loopback, below port 32768; nothing is mocked.
//!
//! Run: `cargo test --test redis_log` (needs `redis-server`: `scripts/install-peers`).

mod support;

use bytes::Bytes;
use mcp_resume_proxy::log::cursor::{check_resume, Cursor, Refusal, SessionId};
use mcp_resume_proxy::log::redis::{Fence, ReadHint, Refused, Shared};
use mcp_resume_proxy::log::{Event, Kind, NewEvent, StreamTag};
use serde_json::Value;
use support::redis::{sent_bytes, Persist, RedisCluster, RedisServer};

const PREFIX: &str = "mrp";

fn ev(stream: StreamTag, kind: Kind, body: &str) -> NewEvent {
    NewEvent::new(stream, kind, Bytes::from(body.to_string()))
}

fn msg(i: u64) -> NewEvent {
    ev(
        StreamTag::STANDALONE,
        Kind::Message,
        &format!(r#"{{"jsonrpc":"2.0","method":"notifications/message","params":{{"n":{i}}}}}"#),
    )
}

fn owner(name: &str, epoch: u32) -> Fence {
    Fence {
        owner: name.to_string(),
        epoch,
    }
}

/// Every event of `id` after `after`, paging like a reader does.
async fn read_all(s: &Shared, id: &SessionId, mut after: u64) -> Vec<Event> {
    let mut out = Vec::new();
    loop {
        let (_, page) = s.read(id, after, 7).await.unwrap().expect("record");
        if page.is_empty() {
            return out;
        }
        after = page.last().unwrap().seq;
        out.extend(page);
    }
}

/// (seq, epoch, kind, payload) of each event.
fn shape(evs: &[Event]) -> Vec<(u64, u32, Kind, String)> {
    evs.iter()
        .map(|e| {
            (
                e.seq,
                e.epoch,
                e.kind,
                String::from_utf8(e.payload.to_vec()).unwrap(),
            )
        })
        .collect()
}

async fn new_session(s: &Shared, who: &str) -> SessionId {
    let id = SessionId::random();
    assert!(s
        .create(&id, who, r#"{"facade":"streamable"}"#)
        .await
        .unwrap());
    id
}

/// Appends run in order with contiguous seqs, and a reader pages through exactly what was
/// written: nothing missing, duplicated or reordered.
#[tokio::test]
async fn appends_read_back_exactly_in_order() {
    let r = RedisServer::start(Persist::AofAlways).await;
    let s = Shared::connect(&r.url(), PREFIX).await.unwrap();
    let id = new_session(&s, "a/1").await;
    assert!(
        !s.create(&id, "b/1", "{}").await.unwrap(),
        "a second create of the same id is refused"
    );
    let me = owner("a/1", 1);
    let mut head = 0;
    let mut want = Vec::new();
    for batch in 0..10u64 {
        let evs: Vec<NewEvent> = (0..5).map(|i| msg(batch * 5 + i)).collect();
        for e in &evs {
            want.push(String::from_utf8(e.payload.to_vec()).unwrap());
        }
        head = s
            .append(&id, &me, head, &format!("b{batch}"), &evs, None)
            .await
            .unwrap()
            .unwrap();
    }
    assert_eq!(head, 50);
    let got = read_all(&s, &id, 0).await;
    assert_eq!(
        got.iter().map(|e| e.seq).collect::<Vec<_>>(),
        (1..=50).collect::<Vec<_>>()
    );
    assert!(got
        .iter()
        .all(|e| e.epoch == 1 && e.stream == StreamTag::STANDALONE));
    let payloads: Vec<String> = shape(&got).into_iter().map(|x| x.3).collect();
    assert_eq!(payloads, want);
    // From the middle: exactly the rest.
    let rest = read_all(&s, &id, 37).await;
    assert_eq!(
        rest.iter().map(|e| e.seq).collect::<Vec<_>>(),
        (38..=50).collect::<Vec<_>>()
    );
}

/// Compare-and-append: a write that expects another head is refused and writes nothing; a retry of
/// a batch whose reply was lost finds its own token (it did land), a writer whose head Redis
/// rewound finds another.
#[tokio::test]
async fn an_append_at_the_wrong_head_is_refused_and_writes_nothing() {
    let r = RedisServer::start(Persist::AofAlways).await;
    let s = Shared::connect(&r.url(), PREFIX).await.unwrap();
    let id = new_session(&s, "a/1").await;
    let me = owner("a/1", 1);
    let h = s
        .append(&id, &me, 0, "t1", &[msg(1), msg(2)], None)
        .await
        .unwrap();
    assert_eq!(h, Ok(2));
    // The same batch again (its reply "lost"): refused, and the token says it landed.
    let again = s
        .append(&id, &me, 0, "t1", &[msg(1), msg(2)], None)
        .await
        .unwrap();
    assert_eq!(
        again,
        Err(Refused::Head {
            head: 2,
            batch: "t1".into()
        })
    );
    // A writer that believes the head is further on (Redis lost its writes): refused too.
    let ahead = s.append(&id, &me, 5, "t9", &[msg(6)], None).await.unwrap();
    assert_eq!(
        ahead,
        Err(Refused::Head {
            head: 2,
            batch: "t1".into()
        })
    );
    let got = read_all(&s, &id, 0).await;
    assert_eq!(got.iter().map(|e| e.seq).collect::<Vec<_>>(), vec![1, 2]);
}

/// The fence: after a takeover, the old owner's writes — append, in-flight, end — are all refused,
/// however late they arrive, and the taker's end holds: the history, one -32091 per request that
/// was in flight (on its stream, `Final` on a POST stream), the end marker, in epoch 2. A resume
/// into the old epoch up to its seal is served exactly that; past the seal it is refused.
#[tokio::test]
async fn a_takeover_fences_the_old_owner_and_ends_the_session_loudly() {
    let r = RedisServer::start(Persist::AofAlways).await;
    let s = Shared::connect(&r.url(), PREFIX).await.unwrap();
    let id = new_session(&s, "a/1").await;
    let old = owner("a/1", 1);
    let post = StreamTag::post(0);
    assert_eq!(
        s.inflight_add(&id, &old, "7", post).await.unwrap(),
        Ok(None)
    );
    assert_eq!(
        s.inflight_add(&id, &old, "\"x\"", StreamTag::STANDALONE)
            .await
            .unwrap(),
        Ok(None)
    );
    // A retried forward of the same request joins the first.
    assert_eq!(
        s.inflight_add(&id, &old, "7", StreamTag::post(3))
            .await
            .unwrap(),
        Ok(Some(post))
    );
    let h = s
        .append(&id, &old, 0, "t1", &[msg(1), msg(2), msg(3)], None)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(h, 3);

    // A takeover that names the wrong epoch does nothing.
    let wrong = s
        .takeover(&id, &owner("a/1", 2), "b/1", "owner_lost", "lost", 60)
        .await
        .unwrap();
    assert_eq!(wrong, Err(Refused::Fenced { epoch: 1, head: 3 }));
    let t = s
        .takeover(&id, &old, "b/1", "owner_lost", "owner replica lost", 60)
        .await
        .unwrap()
        .unwrap();
    assert_eq!((t.epoch, t.aborted), (2, 2));
    assert_eq!(t.head, 6, "two -32091s and the end marker after seq 3");
    // A second taker finds it ended.
    let twice = s
        .takeover(&id, &old, "c/1", "owner_lost", "lost", 60)
        .await
        .unwrap();
    assert_eq!(twice, Err(Refused::Fenced { epoch: 2, head: 6 }));

    // The old owner wakes up: every write is refused.
    let late = s.append(&id, &old, 3, "t2", &[msg(4)], None).await.unwrap();
    assert_eq!(late, Err(Refused::Fenced { epoch: 2, head: 6 }));
    let late = s.inflight_add(&id, &old, "8", post).await.unwrap();
    assert_eq!(late, Err(Refused::Fenced { epoch: 2, head: 6 }));
    let late = s.end(&id, &old, 3, "client_delete", &[], 60).await.unwrap();
    assert_eq!(late, Err(Refused::Fenced { epoch: 2, head: 6 }));
    // Nor may the taker append to an ended session.
    let after = s
        .append(&id, &owner("b/1", 2), 6, "t3", &[msg(9)], None)
        .await
        .unwrap();
    assert_eq!(after, Err(Refused::Ended { epoch: 2, head: 6 }));

    let all = read_all(&s, &id, 0).await;
    let got = shape(&all);
    assert_eq!(got.len(), 6);
    assert_eq!(
        got[..3].iter().map(|x| (x.0, x.1, x.2)).collect::<Vec<_>>(),
        vec![
            (1, 1, Kind::Message),
            (2, 1, Kind::Message),
            (3, 1, Kind::Message)
        ]
    );
    // The aborts, in epoch 2, each on its request's stream, with its id and the reason.
    let mut aborted = Vec::new();
    for e in &all[3..5] {
        assert_eq!(e.epoch, 2);
        let v: Value = serde_json::from_slice(&e.payload).unwrap();
        assert_eq!(v["error"]["code"], -32091);
        assert_eq!(v["error"]["data"]["reason"], "owner_lost");
        assert_eq!(v["error"]["message"], "owner replica lost");
        aborted.push((v["id"].clone(), e.stream, e.kind));
    }
    aborted.sort_by_key(|a| a.1);
    assert_eq!(
        aborted,
        vec![
            (Value::from("x"), StreamTag::STANDALONE, Kind::Message),
            (Value::from(7), post, Kind::Final),
        ]
    );
    assert_eq!((all[5].seq, all[5].epoch, all[5].kind), (6, 2, Kind::End));

    // The resume check against the shared record: the old epoch is sealed at 3.
    let (rec, _) = s.read(&id, 0, 1).await.unwrap().unwrap();
    assert_eq!(rec.fence, owner("b/1", 2));
    assert_eq!(rec.ended.as_deref(), Some("owner_lost"));
    let cursor = |epoch, seq| Cursor {
        session: id,
        epoch,
        seq,
    };
    assert_eq!(check_resume(&cursor(1, 2), &rec.ranges, true), Ok(2));
    assert_eq!(check_resume(&cursor(1, 3), &rec.ranges, true), Ok(3));
    assert_eq!(
        check_resume(&cursor(1, 4), &rec.ranges, true),
        Err(Refusal::CursorAhead),
        "an id past the seal was never an event of epoch 1"
    );
    assert_eq!(
        check_resume(&cursor(3, 1), &rec.ranges, true),
        Err(Refusal::UnknownEpoch)
    );
}

/// The owner's own end: the answers it owes, the end marker; after it nothing more is written.
#[tokio::test]
async fn the_owners_end_writes_its_answers_then_the_marker() {
    let r = RedisServer::start(Persist::AofAlways).await;
    let s = Shared::connect(&r.url(), PREFIX).await.unwrap();
    let id = new_session(&s, "a/1").await;
    let me = owner("a/1", 1);
    let post = StreamTag::post(0);
    s.inflight_add(&id, &me, "1", post).await.unwrap().unwrap();
    let mut answer = ev(post, Kind::Final, r#"{"jsonrpc":"2.0","id":1,"result":{}}"#);
    answer.completes = Some("1".into());
    let h = s
        .append(&id, &me, 0, "t1", &[msg(1), answer], None)
        .await
        .unwrap();
    assert_eq!(h, Ok(2));
    // Answered: no longer in flight, so a takeover now would abort nothing.
    let owed = ev(
        StreamTag::STANDALONE,
        Kind::Message,
        r#"{"jsonrpc":"2.0","id":2,"error":{"code":-32091}}"#,
    );
    let h = s
        .end(&id, &me, 2, "client_delete", &[owed], 60)
        .await
        .unwrap();
    assert_eq!(h, Ok(4));
    let all = read_all(&s, &id, 0).await;
    assert_eq!(
        shape(&all).iter().map(|x| (x.0, x.2)).collect::<Vec<_>>(),
        vec![
            (1, Kind::Message),
            (2, Kind::Final),
            (3, Kind::Message),
            (4, Kind::End)
        ]
    );
    let (rec, _) = s.read(&id, 0, 1).await.unwrap().unwrap();
    assert_eq!(rec.ended.as_deref(), Some("client_delete"));
    assert_eq!(
        s.append(&id, &me, 4, "t3", &[msg(5)], None).await.unwrap(),
        Err(Refused::Ended { epoch: 1, head: 4 })
    );
}

/// `MAXLEN` trims the oldest events; a resume into what was trimmed is refused (`cursor_trimmed`),
/// from the first retained one it is served exactly.
#[tokio::test]
async fn trimmed_events_are_refused_never_skipped() {
    let r = RedisServer::start(Persist::AofAlways).await;
    let s = Shared::connect(&r.url(), PREFIX).await.unwrap();
    let id = new_session(&s, "a/1").await;
    let me = owner("a/1", 1);
    let mut head = 0;
    for b in 0..4u64 {
        let evs: Vec<NewEvent> = (0..5).map(|i| msg(b * 5 + i)).collect();
        head = s
            .append(&id, &me, head, &format!("b{b}"), &evs, Some(8))
            .await
            .unwrap()
            .unwrap();
    }
    let (rec, _) = s.read(&id, 0, 1).await.unwrap().unwrap();
    assert_eq!((rec.ranges.oldest, rec.ranges.head), (13, 20));
    let c = |seq| Cursor {
        session: id,
        epoch: 1,
        seq,
    };
    assert_eq!(
        check_resume(&c(11), &rec.ranges, true),
        Err(Refusal::CursorTrimmed)
    );
    assert_eq!(check_resume(&c(13), &rec.ranges, true), Ok(13));
    let rest = read_all(&s, &id, 13).await;
    assert_eq!(
        rest.iter().map(|e| e.seq).collect::<Vec<_>>(),
        (14..=20).collect::<Vec<_>>()
    );
}

/// With `appendfsync always`, every acknowledged write survives a SIGKILL of Redis: the restarted
/// server holds exactly what was acknowledged, and the owner carries on at its head.
#[tokio::test]
async fn acknowledged_appends_survive_a_redis_sigkill_with_aof_always() {
    let mut r = RedisServer::start(Persist::AofAlways).await;
    let s = Shared::connect(&r.url(), PREFIX).await.unwrap();
    assert_eq!(s.fsync_refusal().await.unwrap(), None);
    let id = new_session(&s, "a/1").await;
    let me = owner("a/1", 1);
    let mut head = 0;
    for b in 0..20u64 {
        head = s
            .append(
                &id,
                &me,
                head,
                &format!("b{b}"),
                &[msg(2 * b), msg(2 * b + 1)],
                None,
            )
            .await
            .unwrap()
            .unwrap();
    }
    r.restart().await;
    let s = Shared::connect(&r.url(), PREFIX).await.unwrap();
    let got = read_all(&s, &id, 0).await;
    assert_eq!(
        got.iter().map(|e| e.seq).collect::<Vec<_>>(),
        (1..=40).collect::<Vec<_>>()
    );
    assert_eq!(
        s.append(&id, &me, head, "b20", &[msg(40)], None)
            .await
            .unwrap(),
        Ok(41)
    );
}

/// Redis losing everything (a restart without persistence, or `FLUSHALL`) is loud: the owner's
/// next write is refused `NoSession`, and a read finds no record (a resume gets 404), never an
/// empty 200.
#[tokio::test]
async fn lost_redis_data_refuses_the_owner_and_every_resume() {
    let mut r = RedisServer::start(Persist::None).await;
    let s = Shared::connect(&r.url(), PREFIX).await.unwrap();
    let refusal = s.fsync_refusal().await.unwrap();
    assert!(
        refusal.as_deref().is_some_and(|m| m.contains("appendonly")),
        "fsync needs the AOF: {refusal:?}"
    );
    let a = new_session(&s, "a/1").await;
    let me = owner("a/1", 1);
    s.append(&a, &me, 0, "t1", &[msg(1)], None)
        .await
        .unwrap()
        .unwrap();
    r.restart().await;
    let s = Shared::connect(&r.url(), PREFIX).await.unwrap();
    assert_eq!(
        s.append(&a, &me, 1, "t2", &[msg(2)], None).await.unwrap(),
        Err(Refused::NoSession)
    );
    assert!(s.read(&a, 0, 10).await.unwrap().is_none());

    let b = new_session(&s, "a/1").await;
    s.append(&b, &me, 0, "t1", &[msg(1)], None)
        .await
        .unwrap()
        .unwrap();
    let _: () = redis::cmd("FLUSHALL")
        .query_async(&mut r.admin().await)
        .await
        .unwrap();
    assert_eq!(
        s.inflight_add(&b, &me, "1", StreamTag::post(0))
            .await
            .unwrap(),
        Err(Refused::NoSession)
    );
    assert!(s.read(&b, 0, 10).await.unwrap().is_none());
}

/// `appendfsync everysec` can lose a second of acknowledged writes: `fsync` refuses it, naming
/// the setting.
#[tokio::test]
async fn fsync_durability_needs_appendfsync_always() {
    let r = RedisServer::start(Persist::AofEverysec).await;
    let s = Shared::connect(&r.url(), PREFIX).await.unwrap();
    let refusal = s.fsync_refusal().await.unwrap().unwrap();
    assert!(refusal.contains("appendfsync"), "{refusal}");
    assert!(refusal.contains("everysec"), "{refusal}");
}

/// The doorbell rings with `<epoch>:<head>` after each write, on the session's shard channel.
#[tokio::test]
async fn every_write_rings_the_doorbell() {
    let r = RedisServer::start(Persist::AofAlways).await;
    let s = Shared::connect(&r.url(), PREFIX).await.unwrap();
    let id = new_session(&s, "a/1").await;
    // A plain RESP2 connection in a thread: `SSUBSCRIBE`, then read the `smessage`s it pushes.
    let url = r.url();
    let channel = s.doorbell(&id);
    let (tx, rx) = std::sync::mpsc::channel();
    let (subscribed_tx, subscribed) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut con = redis::Client::open(url).unwrap().get_connection().unwrap();
        con.set_read_timeout(Some(std::time::Duration::from_secs(20)))
            .unwrap();
        con.send_packed_command(&redis::cmd("SSUBSCRIBE").arg(&channel).get_packed_command())
            .unwrap();
        let _ack = con.recv_response().unwrap();
        subscribed_tx.send(()).unwrap();
        while let Ok(v) = con.recv_response() {
            if let redis::Value::Array(parts) = v {
                if let [redis::Value::BulkString(k), _, redis::Value::BulkString(b)] =
                    parts.as_slice()
                {
                    if k == b"smessage" && tx.send(String::from_utf8(b.clone()).unwrap()).is_err() {
                        return;
                    }
                }
            }
        }
    });
    subscribed
        .recv_timeout(std::time::Duration::from_secs(20))
        .unwrap();
    let me = owner("a/1", 1);
    s.append(&id, &me, 0, "t1", &[msg(1), msg(2)], None)
        .await
        .unwrap()
        .unwrap();
    s.end(&id, &me, 2, "client_delete", &[], 60)
        .await
        .unwrap()
        .unwrap();
    let rings: Vec<String> = (0..2)
        .map(|_| {
            rx.recv_timeout(std::time::Duration::from_secs(20))
                .expect("a ring")
        })
        .collect();
    assert_eq!(rings, vec!["1:2", "1:3"]);
}

/// Redis lost the record while its owner still holds the session (`FLUSHALL` here): the owner's
/// write is refused, and `recreate_lost` writes an ended record whose new epoch answers the
/// requests the owner holds in flight -32091, then ends. Every id of the lost epoch is refused
/// `unknown_epoch`; the new epoch's ids are served.
#[tokio::test]
async fn a_lost_record_comes_back_ended_with_the_owners_answers() {
    let r = RedisServer::start(Persist::AofAlways).await;
    let s = Shared::connect(&r.url(), PREFIX).await.unwrap();
    assert!(!s.is_cluster());
    let id = new_session(&s, "a/1").await;
    let me = owner("a/1", 1);
    let post = StreamTag::post(1);
    s.inflight_add(&id, &me, "3", post).await.unwrap().unwrap();
    let evs: Vec<NewEvent> = (0..5).map(msg).collect();
    assert_eq!(
        s.append(&id, &me, 0, "t1", &evs, None).await.unwrap(),
        Ok(5)
    );
    let _: () = redis::cmd("FLUSHALL")
        .query_async(&mut r.admin().await)
        .await
        .unwrap();
    assert_eq!(
        s.append(&id, &me, 5, "t2", &[msg(5)], None).await.unwrap(),
        Err(Refused::NoSession)
    );
    let inflight = vec![("3".to_string(), post)];
    let made = s
        .recreate_lost(&id, "a/1", 1, 5, &inflight, "store_lost", "log lost", 60)
        .await
        .unwrap();
    assert!(made);
    assert!(
        !s.recreate_lost(&id, "a/1", 1, 5, &inflight, "store_lost", "log lost", 60)
            .await
            .unwrap(),
        "only where no record exists"
    );
    let all = read_all(&s, &id, 0).await;
    assert_eq!(
        all.iter()
            .map(|e| (e.seq, e.epoch, e.stream, e.kind))
            .collect::<Vec<_>>(),
        vec![(6, 2, post, Kind::Final), (7, 2, StreamTag(0), Kind::End)]
    );
    let v: Value = serde_json::from_slice(&all[0].payload).unwrap();
    assert_eq!(
        (v["id"].clone(), v["error"]["code"].clone()),
        (Value::from(3), Value::from(-32091))
    );
    assert_eq!(v["error"]["data"]["reason"], "store_lost");
    let (rec, _) = s.read(&id, 0, 1).await.unwrap().unwrap();
    assert_eq!(rec.ended.as_deref(), Some("store_lost"));
    let c = |epoch, seq| Cursor {
        session: id,
        epoch,
        seq,
    };
    for seq in [1, 4, 5] {
        assert_eq!(
            check_resume(&c(1, seq), &rec.ranges, true),
            Err(Refusal::UnknownEpoch),
            "an id of the lost epoch is never served other events"
        );
    }
    assert_eq!(check_resume(&c(2, 6), &rec.ranges, true), Ok(6));
}

/// Leases: a node's lease lapses on Redis's clock unless renewed; exactly one of two reapers
/// claims a lapsed node; the reaped node's next beat is told so (it must come back as a new
/// incarnation), and the sessions it noted as its own are there for the claimer.
#[tokio::test]
async fn a_lapsed_lease_is_claimed_once_and_the_node_learns_it_was_reaped() {
    let r = RedisServer::start(Persist::AofAlways).await;
    let s = Shared::connect(&r.url(), PREFIX).await.unwrap();
    let s2 = Shared::connect(&r.url(), PREFIX).await.unwrap();
    let beat = |node: &'static str, lease: u64, first: bool| {
        let s = &s;
        async move {
            s.heartbeat(node, lease, "127.0.0.1:9001", first)
                .await
                .unwrap()
        }
    };
    assert!(beat("a/1", 2000, true).await.is_some());
    assert!(s
        .heartbeat("b/1", 60_000, "127.0.0.1:9002", true)
        .await
        .unwrap()
        .is_some());
    let (x, y) = (SessionId::random(), SessionId::random());
    s.own("a/1", &x).await.unwrap();
    s.own("a/1", &y).await.unwrap();
    assert!(s.lapsed().await.unwrap().is_empty());
    assert!(
        !s.claim("a/1").await.unwrap(),
        "a live lease is not claimed"
    );
    // Renewed, it lives on from the renewal (checked at once: 2 s of margin).
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    assert!(beat("a/1", 2000, false).await.is_some());
    assert!(s.lapsed().await.unwrap().is_empty());
    // Not renewed, it lapses.
    tokio::time::sleep(std::time::Duration::from_millis(2200)).await;
    assert_eq!(s.lapsed().await.unwrap(), vec!["a/1".to_string()]);
    let (c1, c2) = tokio::join!(s.claim("a/1"), s2.claim("a/1"));
    assert_eq!(
        [c1.unwrap(), c2.unwrap()].iter().filter(|c| **c).count(),
        1,
        "exactly one reaper claims it"
    );
    assert_eq!(
        beat("a/1", 2000, false).await,
        None,
        "the reaped node is told"
    );
    let mut owned = s.owned("a/1").await.unwrap();
    owned.sort_by_key(|i| i.to_string());
    let mut want = vec![x, y];
    want.sort_by_key(|i| i.to_string());
    assert_eq!(owned, want);
    s.disown_all("a/1").await.unwrap();
    assert!(s.owned("a/1").await.unwrap().is_empty());
    assert_eq!(
        s.node_addr("b/1").await.unwrap().as_deref(),
        Some("127.0.0.1:9002")
    );
    assert!(s.lapsed().await.unwrap().is_empty(), "b/1 is alive");
}

/// A Redis Cluster of three primaries: found from any one node, every primary's persistence
/// checked, and the fenced scripts work for sessions spread over all three (a session's keys
/// share its hash tag, so each script runs on one node).
#[tokio::test]
async fn the_fenced_scripts_hold_on_a_redis_cluster_of_three() {
    let c = RedisCluster::start().await;
    let s = Shared::connect(&c.url(1), PREFIX).await.unwrap();
    assert!(s.is_cluster());
    assert_eq!(s.fsync_refusal().await.unwrap(), None);
    let mut slots = std::collections::HashSet::new();
    let mut admin = redis::Client::open(c.url(0))
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    for n in 0..12u64 {
        let id = new_session(&s, "a/1").await;
        let slot: i64 = redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(format!("{PREFIX}:{{{id}}}:m"))
            .query_async(&mut admin)
            .await
            .unwrap();
        slots.insert(slot * 3 / 16384);
        let me = owner("a/1", 1);
        s.inflight_add(&id, &me, "1", StreamTag::post(0))
            .await
            .unwrap()
            .unwrap();
        let evs: Vec<NewEvent> = (0..3).map(|i| msg(n * 3 + i)).collect();
        assert_eq!(
            s.append(&id, &me, 0, "t1", &evs, None).await.unwrap(),
            Ok(3)
        );
        let t = s
            .takeover(&id, &me, "b/1", "owner_lost", "lost", 60)
            .await
            .unwrap()
            .unwrap();
        assert_eq!((t.epoch, t.head, t.aborted), (2, 5, 1));
        assert_eq!(
            s.append(&id, &me, 3, "t2", &[msg(0)], None).await.unwrap(),
            Err(Refused::Fenced { epoch: 2, head: 5 })
        );
        let all = read_all(&s, &id, 0).await;
        assert_eq!(
            all.iter().map(|e| (e.seq, e.epoch)).collect::<Vec<_>>(),
            vec![(1, 1), (2, 1), (3, 1), (4, 2), (5, 2)]
        );
    }
    assert!(
        slots.len() >= 2,
        "sessions landed on more than one primary: {slots:?}"
    );
}

/// The raw entries of `id`'s stream: (entry id, `n`, payload bytes of the chunk).
async fn entries(r: &RedisServer, id: &SessionId) -> Vec<(String, u64, usize)> {
    let mut c = r.admin().await;
    let raw: Vec<(String, std::collections::HashMap<String, Vec<u8>>)> = ::redis::cmd("XRANGE")
        .arg(format!("{PREFIX}:{{{id}}}:ev"))
        .arg("-")
        .arg("+")
        .query_async(&mut c)
        .await
        .unwrap();
    raw.into_iter()
        .map(|(e, f)| {
            let n = String::from_utf8(f["n"].clone()).unwrap().parse().unwrap();
            (e, n, f["b"].len())
        })
        .collect()
}

/// One append is one chunk entry while it fits; a larger one is cut at `CHUNK_EVENTS` events and
/// at `CHUNK_BYTES` bytes (an event larger than that alone). A read from every seq, with page
/// sizes that end inside, at and across chunks, gets exactly the events after it: the chunk
/// holding the cursor is cut, never skipped. Payloads holding the header's own characters
/// (newlines, spaces, digits) and every byte value come back byte for byte.
#[tokio::test]
async fn chunks_hold_whole_appends_and_every_cursor_reads_exactly_the_rest() {
    use mcp_resume_proxy::log::redis::{CHUNK_BYTES, CHUNK_EVENTS};
    let r = RedisServer::start(Persist::AofAlways).await;
    let s = Shared::connect(&r.url(), PREFIX).await.unwrap();
    let id = new_session(&s, "a/1").await;
    let me = owner("a/1", 1);
    let odd = |i: u64| -> NewEvent {
        let mut body = format!("{i} 7 12\n\n{i}\r\n 3 ").into_bytes();
        body.extend(
            (0..=255u8)
                .cycle()
                .skip(i as usize % 256)
                .take(i as usize % 300),
        );
        NewEvent::new(StreamTag(2 + i % 3), Kind::Message, Bytes::from(body))
    };
    let mut want: Vec<NewEvent> = Vec::new();
    let mut head = 0;
    // 3 events; CHUNK_EVENTS + 5 short ones (two chunks); three of half CHUNK_BYTES (two, then
    // one); two events around one of CHUNK_BYTES + 1 (three chunks: the big one alone); 1 event.
    let mut big = odd(9);
    big.payload = Bytes::from(vec![b'\n'; CHUNK_BYTES + 1]);
    // Short events (the event bound cuts), and events of half the byte bound (the byte bound
    // cuts: two fit, the third starts a chunk).
    let tiny = |i: u64| -> NewEvent {
        NewEvent::new(StreamTag(2), Kind::Message, Bytes::from(format!("{i} 1\n")))
    };
    let half = |i: u64| -> NewEvent {
        let mut e = odd(i);
        e.payload = Bytes::from(vec![b'0' + (i % 10) as u8; CHUNK_BYTES / 2]);
        e
    };
    let batches: Vec<Vec<NewEvent>> = vec![
        (0..3).map(odd).collect(),
        (0..CHUNK_EVENTS as u64 + 5).map(tiny).collect(),
        (0..3).map(half).collect(),
        vec![odd(1), big, odd(2)],
        vec![odd(4)],
    ];
    for (b, evs) in batches.iter().enumerate() {
        head = s
            .append(&id, &me, head, &format!("b{b}"), evs, None)
            .await
            .unwrap()
            .unwrap();
        want.extend(
            evs.iter()
                .map(|e| NewEvent::new(e.stream, e.kind, e.payload.clone())),
        );
    }
    assert_eq!(head, want.len() as u64);
    let got = entries(&r, &id).await;
    let shape: Vec<(String, u64)> = got.iter().map(|(e, n, _)| (e.clone(), *n)).collect();
    let c = CHUNK_EVENTS as u64;
    let want_shape: Vec<(u64, u64)> = vec![
        (1, 3),
        (4, c),
        (4 + c, 5),
        (9 + c, 2),
        (11 + c, 1),
        (12 + c, 1),
        (13 + c, 1),
        (14 + c, 1),
        (15 + c, 1),
    ];
    assert_eq!(
        shape,
        want_shape
            .iter()
            .map(|(first, n)| (format!("{first}-0"), *n))
            .collect::<Vec<_>>()
    );
    for after in 0..=head {
        for max in [1usize, 2, 3, 5, 300] {
            let (rec, page) = s.read(&id, after, max).await.unwrap().unwrap();
            assert_eq!(rec.ranges.head, head);
            let seqs: Vec<u64> = page.iter().map(|e| e.seq).collect();
            let end = head.min(after + max as u64);
            assert_eq!(
                seqs,
                (after + 1..=end).collect::<Vec<_>>(),
                "after {after} max {max}"
            );
            for e in &page {
                let w = &want[e.seq as usize - 1];
                assert_eq!((e.stream, e.kind, e.epoch), (w.stream, w.kind, 1));
                assert_eq!(e.payload, w.payload, "seq {}", e.seq);
            }
        }
    }
}

/// Retention keeps exactly the newest `max` events in the record (`oldest`, what resumes are
/// checked against, moves one event at a time) while the stream drops only chunks wholly before
/// it, so a long session's stream stays bounded.
#[tokio::test]
async fn retention_moves_oldest_exactly_and_trims_whole_chunks() {
    let r = RedisServer::start(Persist::AofAlways).await;
    let s = Shared::connect(&r.url(), PREFIX).await.unwrap();
    let id = new_session(&s, "a/1").await;
    let me = owner("a/1", 1);
    let mut head = 0;
    for b in 0..200u64 {
        let evs: Vec<NewEvent> = (0..7).map(|i| msg(b * 7 + i)).collect();
        head = s
            .append(&id, &me, head, &format!("b{b}"), &evs, Some(30))
            .await
            .unwrap()
            .unwrap();
        let (rec, _) = s.read(&id, u64::MAX, 1).await.unwrap().unwrap();
        assert_eq!(rec.ranges.oldest, head.saturating_sub(29).max(1));
    }
    assert_eq!(head, 1400);
    let got = entries(&r, &id).await;
    // The oldest retained seq, 1371, is in the chunk 1366..=1372; every chunk before it within
    // CHUNK_EVENTS of it may stay, none older.
    let first: u64 = got[0].0.trim_end_matches("-0").parse().unwrap();
    assert!(
        first <= 1371,
        "the chunk holding the oldest event stays: {first}"
    );
    assert!(
        first + mcp_resume_proxy::log::redis::CHUNK_EVENTS as u64 > 1371,
        "older chunks are trimmed: the first starts at {first}"
    );
    let rest = read_all(&s, &id, 1370).await;
    assert_eq!(
        rest.iter().map(|e| e.seq).collect::<Vec<_>>(),
        (1371..=1400).collect::<Vec<_>>()
    );
}

/// A record written by the earlier form (one stream entry per event, fields `e`, `t`, `k`, `d`,
/// no `lo` in the record) still reads exactly, and an owner appending to it adds chunks after
/// those entries.
#[tokio::test]
async fn a_record_of_the_earlier_form_still_reads_and_takes_chunks() {
    let r = RedisServer::start(Persist::AofAlways).await;
    let s = Shared::connect(&r.url(), PREFIX).await.unwrap();
    let id = SessionId::random();
    let mut c = r.admin().await;
    let rec = format!("{PREFIX}:{{{id}}}:m");
    let stream = format!("{PREFIX}:{{{id}}}:ev");
    let ep = r#"[{"epoch":1,"first":1,"last":null}]"#;
    let _: () = ::redis::cmd("HSET")
        .arg(&rec)
        .arg(&["owner", "a/1", "epoch", "1", "head", "3", "state", "live"])
        .arg(&["ep", ep, "meta", "{}", "bt", "old"])
        .query_async(&mut c)
        .await
        .unwrap();
    // The first event was trimmed (MAXLEN) by the earlier form.
    for seq in 2..=3u64 {
        let _: String = ::redis::cmd("XADD")
            .arg(&stream)
            .arg(format!("{seq}-0"))
            .arg(&["e", "1", "t", "0", "k", "0", "d"])
            .arg(format!("old {seq}"))
            .query_async(&mut c)
            .await
            .unwrap();
    }
    let (rec0, page) = s.read(&id, 0, 10).await.unwrap().unwrap();
    assert_eq!((rec0.ranges.oldest, rec0.ranges.head), (2, 3));
    assert_eq!(
        shape(&page),
        vec![
            (2, 1, Kind::Message, "old 2".to_string()),
            (3, 1, Kind::Message, "old 3".to_string())
        ]
    );
    let me = owner("a/1", 1);
    let head = s
        .append(&id, &me, 3, "new", &[msg(4), msg(5)], None)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(head, 5);
    let all = read_all(&s, &id, 1).await;
    assert_eq!(
        all.iter().map(|e| e.seq).collect::<Vec<_>>(),
        vec![2, 3, 4, 5]
    );
    assert_eq!(shape(&all)[1].3, "old 3");
}

/// A writer turn's appends of several sessions go as one transaction: each script still fences
/// its own session (a stale owner's append is refused and writes nothing, the others land), and
/// after Redis forgot its scripts (`SCRIPT FLUSH`, as after a restart) the turn still writes
/// every append exactly once.
#[tokio::test]
async fn a_turns_appends_go_together_and_each_is_fenced_on_its_own() {
    use mcp_resume_proxy::log::redis::Append;
    let r = RedisServer::start(Persist::AofAlways).await;
    let s = Shared::connect(&r.url(), PREFIX).await.unwrap();
    let me = owner("a/1", 1);
    let stale = owner("a/0", 1);
    let ids: Vec<SessionId> = {
        let mut v = Vec::new();
        for _ in 0..4 {
            v.push(new_session(&s, "a/1").await);
        }
        v
    };
    let batches: Vec<Vec<NewEvent>> = (0..4u64)
        .map(|i| (0..=i).map(|j| msg(10 * i + j)).collect())
        .collect();
    let mut heads = [0u64; 4];
    for round in 0..3 {
        if round == 1 {
            let mut c = r.admin().await;
            let _: () = ::redis::cmd("SCRIPT")
                .arg("FLUSH")
                .query_async(&mut c)
                .await
                .unwrap();
        }
        let tokens: Vec<String> = (0..4).map(|i| format!("r{round}s{i}")).collect();
        let reqs: Vec<Append<'_>> = (0..4)
            .map(|i| Append {
                id: &ids[i],
                // Session 2 is written by a stale owner in round 2.
                fence: if round == 2 && i == 2 { &stale } else { &me },
                expected_head: heads[i],
                batch: &tokens[i],
                evs: &batches[i],
                maxlen: None,
            })
            .collect();
        let out = s.append_turn(&reqs).await;
        assert_eq!(out.len(), 4);
        for (i, o) in out.into_iter().enumerate() {
            if round == 2 && i == 2 {
                assert_eq!(
                    o.unwrap(),
                    Err(Refused::Fenced {
                        epoch: 1,
                        head: heads[2]
                    })
                );
                continue;
            }
            let new = o.unwrap().unwrap();
            assert_eq!(new, heads[i] + batches[i].len() as u64);
            heads[i] = new;
        }
    }
    for (i, id) in ids.iter().enumerate() {
        let rounds = if i == 2 { 2 } else { 3 };
        let got = read_all(&s, id, 0).await;
        let want: Vec<String> = (0..rounds)
            .flat_map(|_| batches[i].iter())
            .map(|e| String::from_utf8(e.payload.to_vec()).unwrap())
            .collect();
        assert_eq!(
            shape(&got).into_iter().map(|x| x.3).collect::<Vec<_>>(),
            want
        );
        assert_eq!(got.last().map(|e| e.seq), Some(heads[i]));
    }
}

/// A client stream's read (`read_within`, what `Log::read_batch` asks of the shared log) holds
/// about its byte budget, not `max` events of any size: after 300 small events, 40 of 256 KiB
/// (each its own entry) come back four at a time within 1 MiB, on a single Redis (no Lua) and on
/// a Cluster (the script); 256 small events fit whole; and paging with the budget reads exactly
/// every event once, in order. The unbudgeted read still returns all 40.
#[tokio::test]
async fn a_read_within_a_byte_budget_holds_about_that_much() {
    const BUDGET: u64 = 1 << 20;
    let r = RedisServer::start(Persist::None).await;
    let c = RedisCluster::start().await;
    let single = Shared::connect(&r.url(), PREFIX).await.unwrap();
    let cluster = Shared::connect(&c.url(0), PREFIX).await.unwrap();
    assert!(!single.is_cluster() && cluster.is_cluster());
    let big = |i: u64| {
        let mut body = format!("{i}:").into_bytes();
        body.resize(256 << 10, b'x');
        NewEvent::new(StreamTag::STANDALONE, Kind::Message, Bytes::from(body))
    };
    let nodes = [vec![r.url()], (0..3).map(|i| c.url(i)).collect()];
    for (s, urls) in [&single, &cluster].into_iter().zip(&nodes) {
        let id = new_session(s, "a/1").await;
        let me = owner("a/1", 1);
        let mut want: Vec<Bytes> = Vec::new();
        let small: Vec<NewEvent> = (1..=300).map(msg).collect();
        let large: Vec<NewEvent> = (301..=340).map(big).collect();
        let mut head = 0;
        for (t, evs) in [small, large].iter().enumerate() {
            want.extend(evs.iter().map(|e| e.payload.clone()));
            head = s
                .append(&id, &me, head, &format!("t{t}"), evs, None)
                .await
                .unwrap()
                .unwrap();
        }
        assert_eq!(head, 340);
        // The session's own hint, as its `SessionLog` keeps it.
        let own = ReadHint::default();

        let (_, first) = s
            .read_within(&id, 0, 256, BUDGET, &own)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            first.iter().map(|e| e.seq).collect::<Vec<_>>(),
            (1..=256).collect::<Vec<_>>(),
            "small events are not cut"
        );
        let sent = sent_bytes(urls).await;
        let (_, four) = s
            .read_within(&id, 300, 256, BUDGET, &own)
            .await
            .unwrap()
            .unwrap();
        let sent = sent_bytes(urls).await - sent;
        // What Redis sent for it: about the budget and one entry (never the 10 MiB after 300).
        assert!(
            sent < BUDGET + (512 << 10),
            "Redis sent {sent} bytes for a read within {BUDGET} (cluster: {})",
            s.is_cluster()
        );
        assert_eq!(
            four.iter().map(|e| e.seq).collect::<Vec<_>>(),
            (301..=304).collect::<Vec<_>>(),
            "four events of 256 KiB reach 1 MiB"
        );
        let (_, all) = s.read(&id, 300, 256).await.unwrap().unwrap();
        assert_eq!(all.len(), 40, "without a budget, every event asked for");

        let mut got = Vec::new();
        let mut after = 0;
        loop {
            let (_, page) = s
                .read_within(&id, after, 256, BUDGET, &own)
                .await
                .unwrap()
                .unwrap();
            let Some(last) = page.last() else { break };
            let bytes: u64 = page.iter().map(|e| e.payload.len() as u64).sum();
            let last_len = last.payload.len() as u64;
            assert!(
                bytes - last_len < BUDGET,
                "a page ends once it reaches the budget: {bytes} bytes in {}",
                page.len()
            );
            after = last.seq;
            got.extend(page);
        }
        assert_eq!(
            got.iter().map(|e| e.seq).collect::<Vec<_>>(),
            (1..=340).collect::<Vec<_>>()
        );
        assert!(got.iter().map(|e| &e.payload).eq(want.iter()));
    }
}
