//! Adversary 17: attacks on `log.backend = "redis"` (src/log/shared.rs, design.md §13) with a real
//! `redis-server` on loopback and a real FastMCP upstream. Every test here is a reproduction of a
//! broken promise, `#[ignore]`d so the suite stays green; run them with
//! `cargo test --test adversary17 -- --ignored --test-threads=1` (after `scripts/install-peers`).

mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use mcp_resume_proxy::config::Backend;
use mcp_resume_proxy::log::cursor::SessionId;
use mcp_resume_proxy::log::redis::Shared;
use serde_json::{json, Value};
use support::redis::{Persist, RedisServer};
use support::streamable::*;
use support::*;

const PREFIX: &str = "mcp-resume";

async fn proxy(up: &Upstream, redis: &RedisServer, replica: &str) -> Proxy {
    proxy_with(up, redis, replica, |_| {}).await
}

async fn proxy_with(
    up: &Upstream,
    redis: &RedisServer,
    replica: &str,
    more: impl FnOnce(&mut mcp_resume_proxy::config::Config),
) -> Proxy {
    let (url, replica) = (redis.url(), replica.to_string());
    Proxy::start(up, move |c| {
        c.log.backend = Backend::Redis;
        c.log.redis.url = url;
        c.cluster.replica_id = replica;
        more(c);
    })
    .await
}

fn desc(evs: &[Ev]) -> Vec<String> {
    evs.iter()
        .filter(|e| !e.is_priming())
        .map(Ev::describe)
        .collect()
}

/// A slow `tick` call: `n` progress notifications, `ms` apart.
fn tick(n: u32, ms: u32) -> Value {
    json!({"n": n, "interval_ms": ms})
}

/// Every event Redis holds for `session`, as `id -> data` (the ids clients would see).
async fn redis_events(redis: &RedisServer, session: &str) -> Option<BTreeMap<String, String>> {
    let shared = Shared::connect(&redis.url(), PREFIX).await.unwrap();
    let sid = SessionId::parse(session).unwrap();
    let (_, evs) = shared.read(&sid, 0, 100_000).await.unwrap()?;
    Some(
        evs.into_iter()
            .map(|e| {
                (
                    format!("{session}:{}:{}", e.epoch, e.seq),
                    String::from_utf8_lossy(&e.payload).into_owned(),
                )
            })
            .collect(),
    )
}

/// Reads `s` until it ends or `d` passes without an event; `true` when it ended.
async fn drain(s: &mut Sse, out: &mut Vec<Ev>, d: Duration) -> bool {
    loop {
        match s.next_within(d).await {
            Ok(Some(e)) => out.push(e),
            Ok(None) => return true,
            Err(()) => return false,
        }
    }
}

/// The ids seen with different bytes in `a` and `b`.
fn conflicts(a: &BTreeMap<String, String>, b: &BTreeMap<String, String>) -> Vec<String> {
    a.iter()
        .filter_map(|(id, d)| {
            b.get(id)
                .filter(|d2| *d2 != d)
                .map(|d2| format!("{id}: delivered {d:?}, now {d2:?}"))
        })
        .collect()
}

fn by_id(evs: &[Ev]) -> BTreeMap<String, String> {
    evs.iter()
        .filter_map(|e| Some((e.id.clone()?, e.text().to_string())))
        .collect()
}

/// Starts a Redis without AOF (`durability = "relaxed"`: I2 holds in either durability), a
/// proxy, a session with a slow call; snapshots Redis (`SAVE`) after "progress 2", lets the call
/// go on to "progress 6", then restarts Redis from that snapshot (an RDB reload: the default
/// persistence of a Redis without AOF, and what a failover to a lagging replica looks like).
/// `reconnect`: make the proxy's multiplexed connection reconnect at once (a lookup of an unknown
/// session reads Redis) so that its next append meets the rewound record instead of the dead
/// connection.
async fn rewind(
    reconnect: bool,
) -> (
    RedisServer,
    Upstream,
    Proxy,
    Client,
    u64,
    Sse,
    Vec<Ev>,
    String,
) {
    let mut redis = RedisServer::start(Persist::None).await;
    let up = fastmcp().await;
    let a = proxy_with(&up, &redis, "pod-a", |c| {
        c.log.durability = mcp_resume_proxy::config::Durability::Relaxed
    })
    .await;
    let (mut c, _) = Client::init(a.addr(), "2025-11-25").await;
    let (id, mut s) = c
        .call("tick", tick(40, if reconnect { 1500 } else { 250 }), "T")
        .await;
    let mut seen = s
        .until(|e| !e.is_priming() && e.describe() == "progress 2")
        .await;
    let cursor = seen.last().unwrap().id.clone().unwrap();
    let mut admin = redis.admin().await;
    let _: () = ::redis::cmd("SAVE").query_async(&mut admin).await.unwrap();
    seen.extend(
        s.until(|e| !e.is_priming() && e.describe() == "progress 4")
            .await,
    );
    if reconnect {
        // "log tick 4" follows "progress 4" at once: let it be written before the restart, so
        // that no write is in flight when Redis goes (the next is 1.5 s away).
        tokio::time::sleep(Duration::from_millis(400)).await;
    }
    redis.restart().await;
    if reconnect {
        let mut other = c.at(a.addr());
        other.session = "0123456789abcdef0123456789abcdef".into();
        // Until the connection is back, whether a session exists cannot be told: 503 (never
        // 404 while Redis is unreachable); then 404 for this made-up one.
        let mut found = 0;
        for _ in 0..50 {
            let r = other
                .get(Some("0123456789abcdef0123456789abcdef:1:1"))
                .await;
            assert!(r.status == 404 || r.status == 503, "{}", r.status);
            if r.status == 404 {
                found += 1;
                if found == 3 {
                    break;
                }
            } else {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        assert_eq!(found, 3, "the connection to Redis never came back");
    }
    (redis, up, a, c, id, s, seen, cursor)
}

/// Redis rewinds under a live session and the proxy's connection is back before its next
/// append. The owner's compare-and-append sees the head mismatch (`Refused::Head`, a foreign
/// batch token) and `fenced()` makes the log *adopt* the record — which is *live*, at the
/// rewound head, in epoch 1. The session is then ended by the registry (store_error) through
/// the ordinary `end` script at that rewound head, in the same epoch: the call's -32091 and the
/// end marker take seqs `S:1:8`, `S:1:9`, … that the client already received as progress
/// notifications, and a resume from a cursor the client holds is served those other bytes
/// under the old ids. I2 (an id never names two events), I3/§13 ("a rewind ... ends the
/// session; cursors past what survived get cursor_ahead ... never a 200 with a gap").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rewound_redis_lets_the_owner_reuse_delivered_ids() {
    let (redis, _up, a, c, _id, mut s, mut seen, cursor) = rewind(true).await;
    drain(&mut s, &mut seen, Duration::from_secs(10)).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let delivered = by_id(&seen);
    let now = redis_events(&redis, &c.session).await.unwrap_or_default();
    let bad = conflicts(&delivered, &now);
    let r = c.get(Some(&cursor)).await;
    let status = r.status;
    let mut resumed = Vec::new();
    if status == 200 {
        let mut rs = r.sse();
        drain(&mut rs, &mut resumed, Duration::from_secs(5)).await;
    }
    eprintln!(
        "live {:?} resume {status} {:?} redis {:?}",
        desc(&seen),
        desc(&resumed),
        now.values()
            .map(|d| serde_json::from_str(d)
                .map(|v| describe(&v))
                .unwrap_or_default())
            .collect::<Vec<_>>()
    );
    let bad_resume = conflicts(&delivered, &by_id(&resumed));
    assert!(
        bad.is_empty() && bad_resume.is_empty(),
        "ids delivered with one payload now name another:\nlive stream: {:?}\nin redis: {bad:#?}\n\
         resume from {cursor} ({status}): {:?}\n{bad_resume:#?}",
        desc(&seen),
        desc(&resumed)
    );
    a.stop().await;
}

/// Redis rewinds under a live session while the proxy's connection is broken (the ordinary
/// case: the first append after the restart fails on the dead connection, an "unknown
/// outcome"). The session is ended (store_error) and its `end` script meets the rewound record:
/// `Refused::Head` with a batch token that is not the lost write's, so `end()` calls `fenced()`,
/// which adopts the *live* record and returns `Ok` — the end is considered written and never
/// retried. Nothing ever ends the session: the record stays live on Redis (no expiry), the
/// call's POST stream closed without an answer, and every resume is 503 `store_error` forever
/// (the log is `failed` and never reaches its end). I6 (every in-flight request gets a logged
/// -32091; the session ends, then 404), §13 ("a rewind: the owner's compare-and-append catches
/// it and ends the session").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rewound_redis_leaves_the_session_unended_and_its_call_unanswered() {
    let (redis, _up, a, c, id, mut s, mut seen, cursor) = rewind(false).await;
    let ended = drain(&mut s, &mut seen, Duration::from_secs(10)).await;
    assert!(ended, "the call's stream ends");
    // Give the writer every chance to place the end (it retries every 250 ms).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    let (status, resumed) = loop {
        let r = c.get(Some(&cursor)).await;
        let status = r.status;
        let mut resumed = Vec::new();
        if status == 200 {
            let mut rs = r.sse();
            drain(&mut rs, &mut resumed, Duration::from_secs(5)).await;
        }
        if status != 503 || tokio::time::Instant::now() > deadline {
            break (status, resumed);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let shared = Shared::connect(&redis.url(), PREFIX).await.unwrap();
    let sid = SessionId::parse(&c.session).unwrap();
    let rec = shared
        .read(&sid, u64::MAX, 1)
        .await
        .unwrap()
        .map(|(r, _)| r);
    let answered = seen
        .iter()
        .chain(resumed.iter())
        .filter(|e| !e.is_priming())
        .any(|e| {
            let d = e.describe();
            d == format!("response {id}") || d == format!("error {id} -32091")
        });
    assert!(
        status != 503 && answered && rec.as_ref().is_none_or(|r| r.ended.is_some()),
        "15 s after the rewind: resume {status}, the call answered: {answered}, \
         live stream {:?}, resumed {:?}, record on Redis: {rec:?}",
        desc(&seen),
        desc(&resumed)
    );
    a.stop().await;
}

/// `tasks/get` of `task` from `t`: the answer's JSON.
async fn task_get(t: &support::security::Target, task: &str) -> Value {
    let get = support::modern::req(json!(2), "tasks/get", json!({"taskId": task}), true);
    let mut h = support::modern::headers(&get, &None);
    h.push(("mcp-name", task));
    let r = t.send("POST", "/mcp", &h, Some(&get.to_string())).await;
    assert_eq!(r.status, 200);
    r.json().await
}

/// A task on the shared log whose result is larger than the in-memory window's byte budget
/// (512 KiB): publishing the final event pushes the task's creation event (seq 1) out of the
/// window, and the task code reads a task only through `Log::read_held`, which on Redis serves
/// the window and nothing else. Its creation is gone: `tasks/get` answers "not found" for a task
/// that completed, and its result is lost to its creator (the local backend reads its segments
/// and serves it). §12 (a task's result is durable and readable until its TTL), I4 (the log
/// holds it, the proxy answers that it does not exist). Upstream: the embedded demo server
/// (a real MCP server in-process; any upstream returning a large result does the same).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_with_a_large_result_is_lost_on_the_redis_backend() {
    use support::modern::{call, demo, post, req};
    use support::security::Target;
    let redis = RedisServer::start(Persist::AofAlways).await;
    let up = demo().await;
    let dir = tempfile::tempdir().unwrap();
    let url = redis.url();
    let p = start_in_process(&up.sse_url(), dir.path(), move |c| {
        c.log.backend = Backend::Redis;
        c.log.redis.url = url;
        c.cluster.replica_id = "pod-a".into();
        c.tasks.mode = mcp_resume_proxy::config::TaskMode::Always;
    })
    .await;
    let t = Target::plain(p.addr);
    let big = "x".repeat(600 * 1024);
    let r = post(&t, &call(1, "echo", json!({ "text": big }), true), None).await;
    let st = r.status;
    let v = r.json().await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(
        v["result"]["resultType"],
        "task",
        "{}",
        &v.to_string()[..200.min(v.to_string().len())]
    );
    let task = v["result"]["taskId"].as_str().unwrap().to_string();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let last = loop {
        let get = req(json!(2), "tasks/get", json!({"taskId": task}), true);
        let mut h = support::modern::headers(&get, &None);
        h.push(("mcp-name", task.as_str()));
        let r = t.send("POST", "/mcp", &h, Some(&get.to_string())).await;
        let st = r.status;
        let g = r.json().await;
        assert_eq!(st, 200, "tasks/get: {g}");
        let status = g["result"]["status"].as_str().map(str::to_string);
        if status.as_deref() != Some("working") || tokio::time::Instant::now() > deadline {
            break g;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let shown: String = last.to_string().chars().take(300).collect();
    assert_eq!(last["result"]["status"], "completed", "tasks/get: {shown}");
    assert_eq!(
        last["result"]["result"]["content"][0]["text"]
            .as_str()
            .map(str::len),
        Some(big.len()),
        "tasks/get: {shown}"
    );
    p.stop().await;
}

/// The pid of the `redis-server` (from `INFO server`), to signal it.
async fn redis_pid(redis: &RedisServer) -> u32 {
    let mut admin = redis.admin().await;
    let info: String = ::redis::cmd("INFO")
        .arg("server")
        .query_async(&mut admin)
        .await
        .unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("process_id:"))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

fn signal(pid: u32, sig: &str) {
    let ok = std::process::Command::new("kill")
        .args([&format!("-{sig}"), &pid.to_string()])
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill -{sig} {pid}");
}

/// Every session this replica creates is added to its `owned` set (`SADD` before `create`), and
/// nothing removes it when the session ends — only a restart or a clean stop drops the whole set.
/// A long-running replica's set grows by one id per session ever opened, with no expiry (the
/// session's own keys expire after `retain`; this set never does), and the next start's
/// `end_previous` reads the record of every one of them, one round trip each, before the proxy
/// listens. Unbounded memory (on Redis) and an unbounded start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_owned_set_keeps_every_session_ever_opened() {
    let redis = RedisServer::start(Persist::AofAlways).await;
    let up = fastmcp().await;
    let a = proxy_with(&up, &redis, "pod-a", |c| {
        c.sessions.retain_ended_secs = 1;
        c.tasks.ttl_secs = 1;
    })
    .await;
    for _ in 0..40 {
        let (c, _) = Client::init(a.addr(), "2025-11-25").await;
        assert_eq!(c.delete().await.status, 200);
    }
    // Every session ended and, after `retain`, its keys expired.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let mut admin = redis.admin().await;
    let owned: u64 = ::redis::cmd("SCARD")
        .arg(format!("{PREFIX}:{{pod-a}}:owned"))
        .query_async(&mut admin)
        .await
        .unwrap();
    let ttl: i64 = ::redis::cmd("TTL")
        .arg(format!("{PREFIX}:{{pod-a}}:owned"))
        .query_async(&mut admin)
        .await
        .unwrap();
    let live: u64 = ::redis::cmd("DBSIZE")
        .query_async(&mut admin)
        .await
        .unwrap();
    assert!(
        owned == 0 || ttl > 0,
        "no session is live, yet the owned set holds {owned} ids (TTL {ttl}); keys in Redis: {live}"
    );
    a.stop().await;
}

/// Two processes with the same `cluster.replica_id` at once (a copy-pasted config, two
/// containers with one host name, an old pod still draining while its replacement starts):
/// they share one `owned` set. A clean stop of one runs `disown_all(replica)`, which deletes the
/// set — including the live sessions of the other. When the other then dies (SIGKILL mid-call)
/// and restarts, its `end_previous` finds nothing to end: the session stays live on Redis for
/// good (a live record has no expiry), its call is never answered -32091, and a resume of it is
/// 404 on every replica (`lookup` only mirrors ended records) instead of the history and the
/// abort. I6 (every in-flight request gets a logged -32091 so no client await hangs), §13
/// ("a restarted replica ends what its previous run left live").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_twin_replica_id_stop_disowns_live_sessions_so_a_crash_leaves_them_unanswered() {
    let redis = RedisServer::start(Persist::AofAlways).await;
    let up = fastmcp().await;
    let twin = proxy(&up, &redis, "pod-a").await;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let url = format!("url = \"{}\"", redis.url());
    let extra = [
        ("[log]", "backend = \"redis\""),
        ("[log.redis]", url.as_str()),
        // The lease decides when a dead run's sessions are taken over (short here).
        ("[cluster]", "replica_id = \"pod-a\"\nlease_ms = 2000"),
    ];
    let mut p = ProxyProc::start(&up.sse_url(), &data, &extra).await;
    let addr = format!("127.0.0.1:{}", p.port).parse().unwrap();
    let (mut c, _) = Client::init(addr, "2025-11-25").await;
    let (id, mut s) = c.call("tick", tick(60, 200), "T").await;
    let first = s
        .until(|e| !e.is_priming() && e.describe() == "progress 2")
        .await;
    let cursor = first.last().unwrap().id.clone().unwrap();
    // The twin (which never held this session) stops cleanly.
    twin.stop().await;
    // The process that holds the session dies mid-call and comes back.
    p.proc.kill();
    drop(s);
    let p2 = ProxyProc::start(&up.sse_url(), &data, &extra).await;
    let addr2 = format!("127.0.0.1:{}", p2.port).parse().unwrap();
    let c2 = c.at(addr2);
    let r = c2.get(Some(&cursor)).await;
    let status = r.status;
    let mut rest = Vec::new();
    if status == 200 {
        drain(&mut r.sse(), &mut rest, Duration::from_secs(10)).await;
    } else {
        eprintln!("resume body: {}", r.json().await);
    }
    let shared = Shared::connect(&redis.url(), PREFIX).await.unwrap();
    let sid = SessionId::parse(&c.session).unwrap();
    let rec = shared
        .read(&sid, u64::MAX, 1)
        .await
        .unwrap()
        .map(|(r, _)| r);
    let d = desc(&rest);
    assert!(
        status == 200 && d.last() == Some(&format!("error {id} -32091")),
        "resume after the restart: {status} {d:?}; the record on Redis: {rec:?}"
    );
}

/// One attempt of [`an_answer_queued_before_the_end_in_one_turn_is_dropped`]: the call's answer
/// and the session's end reach the writer in one turn (the writer held on another session's
/// script by a short Redis pause). Returns the call's stream and what Redis holds.
async fn answer_then_end_in_one_turn(
    redis: &RedisServer,
    a: &Proxy,
    pid: u32,
) -> (u64, Vec<String>, Vec<String>) {
    let (mut c, _) = Client::init(a.addr(), "2025-11-25").await;
    let (id, mut s) = c.call("tick", tick(1, 1000), "T").await;
    let mut seen = s
        .until(|e| !e.is_priming() && e.describe() == "progress 1")
        .await;
    // The answer comes ~1000 ms after "progress 1". Hold the writer from ~750 ms to ~1150 ms:
    // Redis paused, and another session's `initialize` (a Create op) waiting on it.
    tokio::time::sleep(Duration::from_millis(720)).await;
    signal(pid, "STOP");
    let addr = a.addr();
    let other = tokio::spawn(async move {
        let body = json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{
            "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name":"b","version":"0"}}});
        send(
            addr,
            "POST",
            "/mcp",
            &[ACCEPT_BOTH, JSON_CT],
            Some(&body.to_string()),
        )
        .await
        .status
    });
    tokio::time::sleep(Duration::from_millis(330)).await;
    // The answer is in the writer's queue now; the client ends the session.
    let del = {
        let c = c.at(a.addr());
        tokio::spawn(async move { c.delete().await.status })
    };
    tokio::time::sleep(Duration::from_millis(80)).await;
    signal(pid, "CONT");
    let _ = other.await;
    let _ = del.await;
    drain(&mut s, &mut seen, Duration::from_secs(10)).await;
    let stored: Vec<String> = redis_events(redis, &c.session)
        .await
        .unwrap_or_default()
        .values()
        .filter(|d| !d.is_empty())
        .map(|d| describe(&serde_json::from_str(d).unwrap_or(Value::Null)))
        .collect();
    (id, desc(&seen), stored)
}

/// The shared writer plans a turn first (`Turn::plan` runs `begin_end` for an `End` op as it
/// reads it) and checks `takes_appends()` only when it runs the session's steps. An append
/// queued *before* the end — the upstream's answer to a call, routed by the pump, whose request
/// the registry already took out of its in-flight table — therefore finds the session "ending"
/// and is dropped (`append_nowait`: nobody is told), and the end owes no -32091 for it: the
/// call is answered neither with its result nor with an abort, and its POST stream ends with
/// nothing. (The local writer checks `takes_appends` at plan time, in queue order.) I6 (no
/// client await hangs: every request is answered), I1 (a received event is logged). The race
/// is made likely by pausing Redis (SIGSTOP, shorter than the client's 500 ms response timeout)
/// while another session's Create holds the writer; several attempts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_queued_before_the_end_in_one_turn_is_dropped() {
    let redis = RedisServer::start(Persist::AofAlways).await;
    let up = fastmcp().await;
    let a = proxy(&up, &redis, "pod-a").await;
    let pid = redis_pid(&redis).await;
    for attempt in 0..6 {
        let (id, live, stored) = answer_then_end_in_one_turn(&redis, &a, pid).await;
        eprintln!("attempt {attempt}: live {live:?} stored {stored:?}");
        let answered = |d: &Vec<String>| {
            d.iter()
                .any(|x| x == &format!("response {id}") || x == &format!("error {id} -32091"))
        };
        assert!(
            answered(&live) && answered(&stored),
            "attempt {attempt}: call {id} never answered: its stream {live:?}, on Redis {stored:?}"
        );
    }
    a.stop().await;
}

/// Redis goes away for good (SIGKILL, not restarted) while a session is live, and the proxy is
/// stopped. The session's end cannot be written, so the shared writer keeps it `pending` and
/// retries it every 250 ms; `Log::close` acknowledges the Close op and then awaits the writer
/// task — which only returns once `pending` is empty or every sender is gone, and the `Log`
/// itself holds a sender. `Running::stop` has a grace period for the sessions and the
/// connections (`shutdown.grace_secs`, 10 s), none for `log.close()`: the stop never returns (45 s
/// here; a SIGTERMed pod hangs until it
/// is SIGKILLed). A writer that never stops; shutdown (§7) bounded by `shutdown grace`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopping_with_redis_gone_never_returns() {
    let mut redis = RedisServer::start(Persist::AofAlways).await;
    let up = fastmcp().await;
    let a = proxy(&up, &redis, "pod-a").await;
    let (mut c, _) = Client::init(a.addr(), "2025-11-25").await;
    let (_id, mut s) = c.call("tick", tick(100, 200), "T").await;
    s.until(|e| !e.is_priming() && e.describe() == "progress 2")
        .await;
    redis.kill9();
    let t0 = tokio::time::Instant::now();
    let stopped = tokio::time::timeout(Duration::from_secs(45), a.stop()).await;
    assert!(
        stopped.is_ok(),
        "the proxy's stop had not returned {:?} after it began (Redis unreachable)",
        t0.elapsed()
    );
}

/// A task finished on a replica with `log.backend = "redis"`; the replica is SIGKILLed and
/// restarts (same data dir, same `cluster.replica_id`). The task's log and result are on Redis
/// (its keys expire after `tasks.ttl_secs`), but the tasks code finds a task only through
/// `Log::get` — the logs this process holds — and a shared-log start hands back no logs
/// (`open_shared` returns no `Interrupted`, `lookup` is not used for tasks): `tasks/get` answers
/// "not found" for a completed task within its TTL. With the local backend the same restart
/// reads it back completed (tests/modern_tasks.rs `tasks_survive_a_sigkill_of_the_proxy`).
/// §12 (a task's outcome is durable and readable until its TTL, across restarts).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finished_task_is_lost_when_its_replica_restarts() {
    use support::modern::{call, demo, post};
    use support::security::Target;
    let redis = RedisServer::start(Persist::AofAlways).await;
    let up = demo().await;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let url = format!("url = \"{}\"", redis.url());
    let extra = [
        ("[log]", "backend = \"redis\""),
        ("[log.redis]", url.as_str()),
        ("[cluster]", "replica_id = \"pod-a\""),
        ("[tasks]", "mode = \"always\""),
    ];
    let mut p = ProxyProc::start(&up.sse_url(), &data, &extra).await;
    let t = Target::plain(format!("127.0.0.1:{}", p.port).parse().unwrap());
    let r = post(&t, &call(1, "echo", json!({"text": "kept"}), true), None).await;
    assert_eq!(r.status, 200);
    let v = r.json().await;
    assert_eq!(v["result"]["resultType"], "task", "{v}");
    let task = v["result"]["taskId"].as_str().unwrap().to_string();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let g = task_get(&t, &task).await;
        if g["result"]["status"] == "completed" {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "never completed: {g}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    p.proc.kill();
    let p2 = ProxyProc::start(&up.sse_url(), &data, &extra).await;
    let t2 = Target::plain(format!("127.0.0.1:{}", p2.port).parse().unwrap());
    let g = task_get(&t2, &task).await;
    assert_eq!(
        (
            g["result"]["status"].clone(),
            g["result"]["result"]["content"][0]["text"].clone()
        ),
        (json!("completed"), json!("kept")),
        "tasks/get after the restart: {g}"
    );
}
