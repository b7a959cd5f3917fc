//! The proxy with `log.backend = "redis"` (design.md §13) on a real `redis-server` (Debian's
//! package, started on loopback by the tests) in front of a real legacy upstream (Python
//! FastMCP): events are logged on Redis before any client sees them and resumed from it exactly;
//! an ended session's history is served by another replica from Redis alone; a restarted replica
//! ends what its previous run left live (every logged event, the -32091, the end, then 404); a
//! fenced owner stops writing and its clients get the taker's history; Redis losing the data
//! refuses every resume; `durability = "fsync"` refuses a server without `appendfsync always`;
//! a replica serving a session live on another follows it by the doorbell (its safety poll
//! stretched to ten minutes by a test hook), on one Redis, after its pub/sub connection was
//! killed, and on a Redis Cluster.
//!
//! Run: `cargo test --test redis_backend` (after `scripts/install-peers`).

mod support;

use std::collections::HashMap;
use std::process::{Command, Stdio};
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
    let (url, replica) = (redis.url(), replica.to_string());
    Proxy::start(up, move |c| {
        c.log.backend = Backend::Redis;
        c.log.redis.url = url;
        c.cluster.replica_id = replica;
    })
    .await
}

fn desc(evs: &[Ev]) -> Vec<String> {
    evs.iter()
        .filter(|e| !e.is_priming())
        .map(Ev::describe)
        .collect()
}

/// `progress a` .. `progress b`.
fn progress(a: u32, b: u32) -> Vec<String> {
    (a..=b)
        .map(|i| format!("progress {}", f64::from(i)))
        .collect()
}

/// A slow `tick` call: `n` progress notifications, `ms` apart.
fn tick(n: u32, ms: u32) -> Value {
    json!({"n": n, "interval_ms": ms})
}

/// The seq of the last event of `session`'s stream on Redis, checking on the way that its
/// entries (chunks: id `<first seq>-0`, `n` events) hold every seq from 1, each once.
async fn logged_head(redis: &RedisServer, session: &str) -> u64 {
    let mut c = redis.admin().await;
    let entries: Vec<(String, HashMap<String, String>)> = ::redis::cmd("XRANGE")
        .arg(format!("{PREFIX}:{{{session}}}:ev"))
        .arg("-")
        .arg("+")
        .query_async(&mut c)
        .await
        .unwrap();
    let mut next = 1;
    for (id, fields) in entries {
        assert_eq!(id, format!("{next}-0"), "chunks are contiguous");
        let n: u64 = fields["n"].parse().unwrap();
        assert!(n >= 1);
        next += n;
    }
    next - 1
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_call_resumes_exactly_and_another_replica_serves_the_ended_history() {
    let redis = RedisServer::start(Persist::AofAlways).await;
    let up = fastmcp().await;
    let a = proxy(&up, &redis, "pod-a").await;
    let (mut c, _) = Client::init(a.addr(), "2025-11-25").await;
    let (id, mut s) = c.call("tick", tick(6, 200), "T").await;
    let first = s
        .until(|e| !e.is_priming() && e.describe() == "progress 2")
        .await;
    assert_eq!(desc(&first), progress(1, 2));
    let cursor = first.last().unwrap().id.clone().unwrap();
    s.cut();

    // The resume reads the rest, exactly, on the replica that owns the session.
    let r = c.get(Some(&cursor)).await;
    assert_eq!(r.status, 200);
    let rest = r.sse().rest().await;
    let mut want = progress(3, 6);
    want.push(format!("response {id}"));
    assert_eq!(desc(&rest), want);
    assert_eq!(
        rest.last().unwrap().json()["result"]["content"][0]["text"],
        "done 6"
    );
    // Every event is on Redis, under its seq: the priming events and the initialize answer
    // before, the call's stream.
    let head = rest.last().unwrap().seq();
    assert_eq!(logged_head(&redis, &c.session).await, head);

    // The session ends; another replica, which never held it, serves its history from Redis:
    // the same events under the same ids.
    assert_eq!(c.delete().await.status, 200);
    let b = proxy(&up, &redis, "pod-b").await;
    let cb = c.at(b.addr());
    let r = cb.get(Some(&cursor)).await;
    assert_eq!(r.status, 200);
    let again = r.sse().rest().await;
    assert_eq!(
        again, rest,
        "the same events, ids and bytes from the other replica"
    );
    // Its end marker is the end: a resume from the last answer gets 404, as on one proxy.
    let last = again.last().unwrap().id.clone().unwrap();
    let r = cb.get(Some(&last)).await;
    assert_eq!(r.status, 404);
    assert_eq!(r.json().await["error"]["data"]["reason"], "unknown_session");
    // A cursor past the head is refused by the record, on either replica.
    let ahead = format!("{}:1:{}", cb.session, head + 5);
    let r = cb.get(Some(&ahead)).await;
    assert_eq!(r.status, 409);
    assert_eq!(r.json().await["error"]["data"]["reason"], "cursor_ahead");
    a.stop().await;
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_replica_ends_what_its_previous_run_left_live() {
    let redis = RedisServer::start(Persist::AofAlways).await;
    let up = fastmcp().await;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let url = format!("url = \"{}\"", redis.url());
    let extra = [
        ("[log]", "backend = \"redis\""),
        ("[log.redis]", url.as_str()),
        ("[cluster]", "replica_id = \"pod-a\"\nlease_ms = 2000"),
    ];
    let mut p = ProxyProc::start(&up.sse_url(), &data, &extra).await;
    let addr = format!("127.0.0.1:{}", p.port).parse().unwrap();
    let (mut c, _) = Client::init(addr, "2025-11-25").await;
    let (id, mut s) = c.call("tick", tick(40, 100), "T").await;
    let first = s
        .until(|e| !e.is_priming() && e.describe() == "progress 3")
        .await;
    let cursor = first.last().unwrap().id.clone().unwrap();
    // The pod dies mid-call.
    p.proc.kill();
    drop(s);

    let p2 = ProxyProc::start(&up.sse_url(), &data, &extra).await;
    let addr2 = format!("127.0.0.1:{}", p2.port).parse().unwrap();
    let c2 = c.at(addr2);
    let r = c2.get(Some(&cursor)).await;
    assert_eq!(r.status, 200);
    let rest = r.sse().rest().await;
    // Whatever was logged after the cursor, contiguous and exactly once, then the call's -32091.
    let d = desc(&rest);
    let (answer, progressed) = d.split_last().expect("at least the abort");
    assert_eq!(answer, &format!("error {id} -32091"));
    assert_eq!(progressed, progress(4, 3 + progressed.len() as u32));
    let err = rest.last().unwrap().json();
    assert_eq!(err["error"]["code"], -32091, "{err}");
    let seqs: Vec<u64> = rest.iter().map(Ev::seq).collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{seqs:?}");
    // Then the session is over on this replica too.
    let last = rest.last().unwrap().id.clone().unwrap();
    let r = c2.get(Some(&last)).await;
    assert_eq!(r.status, 404);
    let r = c2
        .post(&json!({"jsonrpc":"2.0","id":99,"method":"ping"}))
        .await;
    assert_eq!(r.status, 404);
    let m = http_get(&p2.metrics_url()).await.1;
    assert_eq!(
        metric_value(&m, "mcp_resume_inflight_aborted_total"),
        1.0,
        "{m}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_owner_stops_and_its_client_gets_the_takers_history() {
    let redis = RedisServer::start(Persist::AofAlways).await;
    let up = fastmcp().await;
    let a = proxy(&up, &redis, "pod-a").await;
    let (mut c, _) = Client::init(a.addr(), "2025-11-25").await;
    let (id, mut s) = c.call("tick", tick(20, 400), "T").await;
    let mut seen = s
        .until(|e| !e.is_priming() && e.describe() == "progress 2")
        .await;
    // Another replica takes the session over, as it would once this one's lease lapsed: the
    // epoch sealed at the head, a -32091 for the call in flight, the end.
    let shared = Shared::connect(&redis.url(), PREFIX).await.unwrap();
    let sid = SessionId::parse(&c.session).unwrap();
    let (rec, _) = shared.read(&sid, u64::MAX, 1).await.unwrap().unwrap();
    let t = shared
        .takeover(
            &sid,
            &rec.fence,
            "pod-b/1",
            "upstream_lost",
            "taken over",
            60,
        )
        .await
        .unwrap()
        .expect("the takeover is taken");
    assert_eq!(t.aborted, 1);
    // The owner's next append is refused by the fence; its client's live stream goes on with
    // what Redis holds: the taker's answer for the call, and nothing the owner wrote after.
    seen.extend(s.rest().await);
    let d = desc(&seen);
    let (answer, progressed) = d.split_last().unwrap();
    assert_eq!(answer, &format!("error {id} -32091"), "{d:?}");
    assert_eq!(progressed, progress(1, progressed.len() as u32));
    let err = seen.last().unwrap().json();
    assert_eq!(err["error"]["code"], -32091, "{err}");
    assert_eq!(
        seen.last().unwrap().id.as_ref().unwrap().split(':').nth(1),
        Some("2")
    );
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while a.metric("mcp_resume_fenced_total").await < 1.0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no fenced write counted"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The owner wrote nothing after the takeover: Redis's head is the taker's end marker.
    let (after, _) = shared.read(&sid, u64::MAX, 1).await.unwrap().unwrap();
    assert_eq!(after.ranges.head, t.head);
    assert_eq!(after.fence.owner, "pod-b/1");
    a.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_losing_the_data_refuses_every_resume() {
    let redis = RedisServer::start(Persist::AofAlways).await;
    let up = fastmcp().await;
    let a = proxy(&up, &redis, "pod-a").await;
    let (mut c, _) = Client::init(a.addr(), "2025-11-25").await;
    let (_, mut s) = c.call("tick", tick(20, 300), "T").await;
    let first = s
        .until(|e| !e.is_priming() && e.describe() == "progress 2")
        .await;
    let cursor = first.last().unwrap().id.clone().unwrap();
    let mut admin = redis.admin().await;
    let _: () = ::redis::cmd("FLUSHALL")
        .query_async(&mut admin)
        .await
        .unwrap();
    // The owner learns it at its next write (the record is gone): fenced, the session ends.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while a.metric("mcp_resume_fenced_total").await < 1.0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no fenced write counted"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The cut stream ends without a 200-with-gap, and every resume is refused.
    let tail = tokio::time::timeout(Duration::from_secs(10), s.rest())
        .await
        .expect("the live stream ends");
    assert!(
        tail.iter().all(|e| e.describe() != "progress 4"),
        "nothing after the loss: {:?}",
        desc(&tail)
    );
    let r = c.get(Some(&cursor)).await;
    assert_eq!(r.status, 404);
    assert_eq!(r.json().await["error"]["data"]["reason"], "unknown_session");
    a.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fsync_durability_refuses_a_server_without_appendfsync_always() {
    let redis = RedisServer::start(Persist::AofEverysec).await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("proxy.toml");
    std::fs::write(
        &cfg,
        format!(
            "[listen]\naddr = \"127.0.0.1:{}\"\n[admin]\naddr = \"127.0.0.1:{}\"\n\
             [upstream]\nsse_url = \"http://127.0.0.1:9/sse\"\n\
             [log]\ndir = \"{}\"\nbackend = \"redis\"\ndurability = \"fsync\"\n\
             [log.redis]\nurl = \"{}\"\n",
            port(),
            port(),
            dir.path().join("data").display(),
            redis.url()
        ),
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_mcp-resume-proxy"))
        .args(["run", "--config"])
        .arg(&cfg)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(64), "{err}");
    assert!(err.contains("appendfsync"), "names the setting: {err}");
    // `relaxed` asks nothing of the server: it starts (and is stopped at once).
    std::fs::write(
        &cfg,
        std::fs::read_to_string(&cfg)
            .unwrap()
            .replace("durability = \"fsync\"", "durability = \"relaxed\""),
    )
    .unwrap();
    let mut p = Command::new(env!("CARGO_BIN_EXE_mcp-resume-proxy"))
        .args(["run", "--config"])
        .arg(&cfg)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    let stdout = p.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        use std::io::BufRead;
        std::io::BufReader::new(stdout)
            .read_line(&mut line)
            .map(|_| line)
    });
    let line = reader.join().unwrap().unwrap();
    assert!(line.contains("listening"), "{line}");
    let _ = p.kill();
    let _ = p.wait();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn any_replica_serves_a_live_session_its_owner_is_still_writing() {
    let redis = RedisServer::start(Persist::AofAlways).await;
    let up = fastmcp().await;
    let a = proxy(&up, &redis, "pod-a").await;
    let b = proxy(&up, &redis, "pod-b").await;
    let (mut c, _) = Client::init(a.addr(), "2025-11-25").await;
    let (id, mut s) = c.call("tick", tick(8, 250), "T").await;
    let first = s
        .until(|e| !e.is_priming() && e.describe() == "progress 2")
        .await;
    let cursor = first.last().unwrap().id.clone().unwrap();
    s.cut();
    // The client lands on the other replica, mid-call: it reads the rest as the owner logs it,
    // live, exactly once, then the answer, and the stream ends.
    let cb = c.at(b.addr());
    let r = cb.get(Some(&cursor)).await;
    assert_eq!(r.status, 200);
    let rest = tokio::time::timeout(Duration::from_secs(60), r.sse().rest())
        .await
        .expect("the non-owner's stream follows the owner to the answer");
    let mut want = progress(3, 8);
    want.push(format!("response {id}"));
    assert_eq!(desc(&rest), want);
    assert_eq!(
        rest.last().unwrap().json()["result"]["content"][0]["text"],
        "done 8"
    );
    // The owner serves the same events under the same ids.
    let r = c.get(Some(&cursor)).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.sse().rest().await, rest);
    // A session that does not exist is 404 on the non-owner too.
    let other = format!("{}:1:3", "0".repeat(32));
    let r = send(
        b.addr(),
        "GET",
        "/mcp",
        &[
            ("mcp-session-id", &"0".repeat(32)),
            ("mcp-protocol-version", "2025-11-25"),
            ACCEPT_SSE,
            ("last-event-id", &other),
        ],
        None,
    )
    .await;
    assert_eq!(r.status, 404);
    a.stop().await;
    b.stop().await;
}

/// A key file as the chart mounts it: 64 hex characters, mode 0600.
fn key_file(dir: &std::path::Path, byte: u8) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let p = dir.join(format!("key-{byte}"));
    std::fs::write(&p, format!("{}\n", format!("{byte:02x}").repeat(32))).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
    p
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_sharing_auth_key_file_check_identities_alike() {
    let redis = RedisServer::start(Persist::AofAlways).await;
    let up = fastmcp().await;
    let keys = tempfile::tempdir().unwrap();
    let shared_key = key_file(keys.path(), 0x5a);
    let start = |replica: &'static str, key: std::path::PathBuf| {
        let url = redis.url();
        let up = &up;
        async move {
            Proxy::start(up, move |c| {
                c.log.backend = Backend::Redis;
                c.log.redis.url = url;
                c.cluster.replica_id = replica.into();
                c.auth.key_file = Some(key);
            })
            .await
        }
    };
    let a = start("pod-a", shared_key.clone()).await;
    let b = start("pod-b", shared_key).await;
    // A replica with its own key cannot tell whose session it is: 404, like another identity's.
    let c_own = start("pod-c", key_file(keys.path(), 0x11)).await;
    let alice = ("authorization", "Bearer alice");
    let init = json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{
        "protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"0"}}});
    let r = send(
        a.addr(),
        "POST",
        "/mcp",
        &[ACCEPT_BOTH, JSON_CT, alice],
        Some(&init.to_string()),
    )
    .await;
    assert_eq!(r.status, 200);
    let sid = r.header("mcp-session-id").unwrap();
    r.sse().rest().await;
    let h = |extra: (&'static str, &'static str)| {
        vec![
            ACCEPT_BOTH,
            JSON_CT,
            ("mcp-protocol-version", "2025-11-25"),
            extra,
        ]
    };
    let mut with_session = h(alice);
    with_session.push(("mcp-session-id", sid.as_str()));
    let r = send(
        a.addr(),
        "POST",
        "/mcp",
        &with_session,
        Some(&json!({"jsonrpc":"2.0","method":"notifications/initialized"}).to_string()),
    )
    .await;
    assert_eq!(r.status, 202);
    let call = json!({"jsonrpc":"2.0","id":5,"method":"tools/call",
        "params":{"name":"echo","arguments":{"text":"hi"}}});
    let r = send(
        a.addr(),
        "POST",
        "/mcp",
        &with_session,
        Some(&call.to_string()),
    )
    .await;
    assert_eq!(r.status, 200);
    let evs = r.sse().rest().await;
    assert!(evs[0].is_priming());
    let cursor = evs[0].id.clone().unwrap();
    let resume = |addr, who: Option<(&'static str, &'static str)>| {
        let (sid, cursor) = (sid.clone(), cursor.clone());
        async move {
            let mut h = vec![
                ACCEPT_SSE,
                ("mcp-protocol-version", "2025-11-25"),
                ("mcp-session-id", sid.as_str()),
                ("last-event-id", cursor.as_str()),
            ];
            h.extend(who);
            send(addr, "GET", "/mcp", &h, None).await
        }
    };
    // The other replica with the shared key serves alice's stream; nobody else gets it.
    let r = resume(b.addr(), Some(alice)).await;
    assert_eq!(r.status, 200);
    let rest = r.sse().rest().await;
    assert_eq!(desc(&rest), ["response 5"]);
    assert_eq!(rest, evs[1..].to_vec());
    for who in [Some(("authorization", "Bearer mallory")), None] {
        let r = resume(b.addr(), who).await;
        assert_eq!(r.status, 404, "{who:?}");
    }
    assert_eq!(resume(c_own.addr(), Some(alice)).await.status, 404);
    for p in [a, b, c_own] {
        p.stop().await;
    }
}

/// Three pods: each a proxy binary beside its own FastMCP upstream, one Redis, leases of 2 s.
struct Pods {
    _dirs: tempfile::TempDir,
    _ups: Vec<Upstream>,
    pods: Vec<ProxyProc>,
}

impl Pods {
    async fn start(redis: &RedisServer) -> Pods {
        let dirs = tempfile::tempdir().unwrap();
        let url = format!("url = \"{}\"", redis.url());
        let mut ups = Vec::new();
        let mut pods = Vec::new();
        for name in ["pod-a", "pod-b", "pod-c"] {
            let up = fastmcp().await;
            let replica = format!("replica_id = \"{name}\"\nlease_ms = 2000");
            let extra = [
                ("[log]", "backend = \"redis\""),
                ("[log.redis]", url.as_str()),
                ("[cluster]", replica.as_str()),
            ];
            pods.push(ProxyProc::start(&up.sse_url(), &dirs.path().join(name), &extra).await);
            ups.push(up);
        }
        Pods {
            _dirs: dirs,
            _ups: ups,
            pods,
        }
    }

    fn base(&self, i: usize) -> String {
        self.pods[i].base()
    }

    fn addr(&self, i: usize) -> std::net::SocketAddr {
        format!("127.0.0.1:{}", self.pods[i].port).parse().unwrap()
    }

    async fn takeovers(&self) -> f64 {
        let mut n = 0.0;
        for p in self.pods.iter().skip(1) {
            n += metric(&p.metrics_url(), "mcp_resume_takeovers_total").await;
        }
        n
    }
}

/// The seed's scenario on the Streamable HTTP face: the pod serving the session is killed
/// mid-call; the client reconnects with its last id to another pod, which never held the session:
/// every event the dead pod logged after the cursor, exactly once, then the call's -32091 (in the
/// taker's epoch), then the end; then 404 everywhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_seed_scenario_on_the_streamable_face() {
    let redis = RedisServer::start(Persist::AofAlways).await;
    let mut pods = Pods::start(&redis).await;
    let (mut c, _) = Client::init(pods.addr(0), "2025-11-25").await;
    let (id, mut s) = c.call("tick", tick(60, 100), "T").await;
    let first = s
        .until(|e| !e.is_priming() && e.describe() == "progress 3")
        .await;
    let cursor = first.last().unwrap().id.clone().unwrap();
    pods.pods[0].proc.kill();
    drop(s);

    let on_b = c.at(pods.addr(1));
    let r = on_b.get(Some(&cursor)).await;
    assert_eq!(r.status, 200);
    let rest = tokio::time::timeout(Duration::from_secs(60), r.sse().rest())
        .await
        .expect("the stream ends once the dead pod's sessions are taken over");
    let d = desc(&rest);
    let (answer, progressed) = d.split_last().expect("at least the abort");
    assert_eq!(answer, &format!("error {id} -32091"), "{d:?}");
    assert_eq!(progressed, progress(4, 3 + progressed.len() as u32));
    let last = rest.last().unwrap().id.clone().unwrap();
    assert_eq!(
        last.split(':').nth(1),
        Some("2"),
        "the abort is in the taker's epoch"
    );
    let seqs: Vec<u64> = rest.iter().map(Ev::seq).collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{seqs:?}");
    assert_eq!(pods.takeovers().await, 1.0);
    // The third pod serves the same history, and the session is over everywhere.
    let on_c = c.at(pods.addr(2));
    let r = on_c.get(Some(&cursor)).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.sse().rest().await, rest);
    for at in [&on_b, &on_c] {
        let r = at.get(Some(&last)).await;
        assert_eq!(r.status, 404);
        assert_eq!(r.json().await["error"]["data"]["reason"], "unknown_session");
    }
}

/// The seed's scenario on the legacy HTTP+SSE face (an `EventSource` reconnecting to the same
/// URL with `Last-Event-ID`, through the load balancer to another pod).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_seed_scenario_on_the_legacy_face() {
    let redis = RedisServer::start(Persist::AofAlways).await;
    let mut pods = Pods::start(&redis).await;
    let (mut sse, url, _) = legacy_session(&pods.base(0)).await;
    assert_eq!(
        post(&url, &call(7, "tick", tick(60, 100), Some("T")))
            .await
            .0,
        202
    );
    let mut seen = Vec::new();
    loop {
        let (eid, m) = sse.message().await;
        let p = m["params"]["progress"].as_f64();
        seen.push((eid, m));
        if p == Some(3.0) {
            break;
        }
    }
    let cursor = seen.last().unwrap().0.clone();
    pods.pods[0].proc.kill();
    drop(sse);

    let (mut again, err) = Sse::get(
        &format!("{}/sse", pods.base(1)),
        &[("last-event-id", cursor.as_str())],
    )
    .await;
    assert!(
        err.is_none(),
        "resume on another pod: {} {err:?}",
        again.status
    );
    assert_eq!(again.status, 200);
    let ep = again.endpoint().await;
    assert!(ep.starts_with("/messages?session_id="), "{ep}");
    let rest = tokio::time::timeout(Duration::from_secs(60), rest_of_stream(&mut again))
        .await
        .expect("the stream ends once the dead pod's sessions are taken over");
    let (answer, progressed) = rest.split_last().expect("at least the abort");
    assert_eq!(answer.1["id"], 7, "{answer:?}");
    assert_eq!(answer.1["error"]["code"], -32091, "{answer:?}");
    let values: Vec<f64> = progressed
        .iter()
        .filter_map(|(_, m)| m["params"]["progress"].as_f64())
        .collect();
    // FastMCP's tick also logs each step (`notifications/message`) on the legacy stream.
    assert!(
        progressed
            .iter()
            .all(|(_, m)| m["method"] == "notifications/progress"
                || m["method"] == "notifications/message"),
        "{progressed:?}"
    );
    let seqs: Vec<u64> = rest.iter().map(|(id, _)| seq_of(id)).collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{seqs:?}");
    let want: Vec<f64> = (4..4 + values.len()).map(|i| i as f64).collect();
    assert_eq!(
        values, want,
        "every logged progress after the cursor, once, in order"
    );
    assert_eq!(pods.takeovers().await, 1.0);
    let (gone, _) = Sse::get(
        &format!("{}/sse", pods.base(2)),
        &[("last-event-id", answer.0.as_str())],
    )
    .await;
    assert_eq!(gone.status, 404);
}

/// A paused owner (SIGSTOP past its lease) is taken over; when it wakes it writes nothing more
/// (its lease is gone: it stops, exit 74, and restarts as a new incarnation), so the history the
/// taker wrote stays the whole history.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_owner_that_wakes_after_its_takeover_writes_nothing() {
    let redis = RedisServer::start(Persist::AofAlways).await;
    let mut pods = Pods::start(&redis).await;
    let (mut c, _) = Client::init(pods.addr(0), "2025-11-25").await;
    let (id, mut s) = c.call("tick", tick(60, 100), "T").await;
    s.until(|e| !e.is_priming() && e.describe() == "progress 3")
        .await;
    pods.pods[0].proc.signal("STOP");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while pods.takeovers().await < 1.0 {
        assert!(tokio::time::Instant::now() < deadline, "no takeover");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let shared = Shared::connect(&redis.url(), PREFIX).await.unwrap();
    let sid = SessionId::parse(&c.session).unwrap();
    let (taken, _) = shared.read(&sid, u64::MAX, 1).await.unwrap().unwrap();
    assert!(taken.ended.is_some());
    // It wakes with the upstream's progress queued and its own turn half done.
    pods.pods[0].proc.signal("CONT");
    let code = tokio::task::spawn_blocking(move || {
        let mut p = pods.pods.remove(0);
        (p.proc.wait(), pods)
    });
    let (code, _pods) = tokio::time::timeout(Duration::from_secs(60), code)
        .await
        .expect("the woken owner stops")
        .unwrap();
    assert_eq!(code, Some(74), "a replica whose lease was lost exits 74");
    let (after, evs) = shared.read(&sid, 0, 10_000).await.unwrap().unwrap();
    assert_eq!(
        after.ranges.head, taken.ranges.head,
        "nothing written after the takeover"
    );
    assert_eq!(after.fence, taken.fence);
    let last = evs.last().unwrap();
    assert_eq!(last.kind, mcp_resume_proxy::log::Kind::End);
    let abort: Value = serde_json::from_slice(&evs[evs.len() - 2].payload).unwrap();
    assert_eq!(abort["id"], id);
    assert_eq!(abort["error"]["code"], -32091);
}

/// Two in-process replicas with internal listeners and one shared secret and identity key.
async fn forwarding_pair(
    up: &Upstream,
    redis: &RedisServer,
    keys: &std::path::Path,
) -> (Proxy, Proxy, u16) {
    let secret = key_file(keys, 0x77);
    let ident = key_file(keys, 0x33);
    let mut out = Vec::new();
    let mut internal_a = 0;
    for name in ["pod-a", "pod-b"] {
        let p = port();
        if name == "pod-a" {
            internal_a = p;
        }
        let (url, secret, ident) = (redis.url(), secret.clone(), ident.clone());
        out.push(
            Proxy::start(up, move |c| {
                c.log.backend = Backend::Redis;
                c.log.redis.url = url;
                c.cluster.replica_id = name.into();
                c.cluster.listen = format!("127.0.0.1:{p}");
                c.cluster.secret_file = Some(secret);
                c.auth.key_file = Some(ident);
            })
            .await,
        );
    }
    let b = out.pop().unwrap();
    let a = out.pop().unwrap();
    (a, b, internal_a)
}

/// Writes reach the owner: a client whose requests land on the replica that does not own its
/// session is served by the owner through it — a tool call's stream relayed exactly, a
/// notification, the DELETE — and a forward whose proof does not hold is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_through_a_replica_that_does_not_own_the_session_reach_the_owner() {
    let redis = RedisServer::start(Persist::AofAlways).await;
    let up = fastmcp().await;
    let keys = tempfile::tempdir().unwrap();
    let (a, b, internal_a) = forwarding_pair(&up, &redis, keys.path()).await;
    let (c, _) = Client::init(a.addr(), "2025-11-25").await;
    let mut via_b = c.at(b.addr());
    // A call through B: the owner runs it; its stream comes back through B, exactly.
    let (id, mut s) = via_b.call("tick", tick(4, 50), "T").await;
    let evs = s.rest().await;
    assert!(evs[0].is_priming());
    let mut want = progress(1, 4);
    want.push(format!("response {id}"));
    assert_eq!(desc(&evs), want);
    assert_eq!(
        evs.last().unwrap().json()["result"]["content"][0]["text"],
        "done 4"
    );
    // Its ids are the owner's: a resume of that stream on the owner replays the same events.
    let r = c.get(Some(evs[0].id.as_deref().unwrap())).await;
    assert_eq!(r.sse().rest().await, evs[1..].to_vec());
    // A notification through B is accepted by the owner.
    let r = via_b
        .post(&json!({"jsonrpc":"2.0","method":"notifications/roots/list_changed"}))
        .await;
    assert_eq!(r.status, 202);
    assert_eq!(
        b.metric("mcp_resume_forwards_total{outcome=\"ok\"}").await,
        2.0
    );
    // A forged forward straight to the owner's internal listener: 404, counted, nothing run.
    let forged = send(
        format!("127.0.0.1:{internal_a}").parse().unwrap(),
        "POST",
        "/mcp",
        &[
            ACCEPT_BOTH,
            JSON_CT,
            ("mcp-session-id", c.session.as_str()),
            ("mcp-protocol-version", "2025-11-25"),
            (
                "x-mcp-resume-forward",
                "1 00000000000000000000000000000000 00",
            ),
        ],
        Some(&json!({"jsonrpc":"2.0","id":77,"method":"ping"}).to_string()),
    )
    .await;
    assert_eq!(forged.status, 404);
    assert_eq!(
        a.metric("mcp_resume_forwards_total{outcome=\"refused\"}")
            .await,
        1.0
    );
    // The DELETE through B ends the session on its owner.
    assert_eq!(via_b.delete().await.status, 200);
    let r = c
        .post(&json!({"jsonrpc":"2.0","id":99,"method":"ping"}))
        .await;
    assert_eq!(r.status, 404);
    a.stop().await;
    b.stop().await;
}

/// The legacy face: an `EventSource` client's message POSTs land on any replica (the endpoint
/// event's path is relative to the load balancer's origin) and reach the owner.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn legacy_messages_through_a_replica_that_does_not_own_the_session_reach_the_owner() {
    let redis = RedisServer::start(Persist::AofAlways).await;
    let up = fastmcp().await;
    let keys = tempfile::tempdir().unwrap();
    let (a, b, _) = forwarding_pair(&up, &redis, keys.path()).await;
    let base_a = format!("http://{}", a.addr());
    let (mut sse, url, _) = legacy_session(&base_a).await;
    let via_b = url.replace(&base_a, &format!("http://{}", b.addr()));
    assert_ne!(via_b, url);
    let echo = call(9, "echo", json!({"text": "through b"}), None);
    assert_eq!(post(&via_b, &echo).await.0, 202);
    let (_, m) = sse.message().await;
    assert_eq!(m["id"], 9, "{m}");
    assert_eq!(m["result"]["content"][0]["text"], "through b");
    assert_eq!(
        b.metric("mcp_resume_forwards_total{outcome=\"ok\"}").await,
        1.0
    );
    a.stop().await;
    b.stop().await;
}

/// The whole proxy on a Redis Cluster of three primaries (found from any node): sessions'
/// keys spread over the primaries by their hash tags; a call is cut and resumed exactly on the
/// owner, resumed mid-call on a replica that does not own it (connected to another node), and
/// written through it (forwarded).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_proxy_on_a_redis_cluster_of_three() {
    let cluster = support::redis::RedisCluster::start().await;
    let up = fastmcp().await;
    let keys = tempfile::tempdir().unwrap();
    let secret = key_file(keys.path(), 0x44);
    let mut pods = Vec::new();
    for (i, name) in ["pod-a", "pod-b"].into_iter().enumerate() {
        let (url, secret, p) = (cluster.url(i), secret.clone(), port());
        pods.push(
            Proxy::start(&up, move |c| {
                c.log.backend = Backend::Redis;
                c.log.redis.url = url;
                c.cluster.replica_id = name.into();
                c.cluster.listen = format!("127.0.0.1:{p}");
                c.cluster.secret_file = Some(secret);
            })
            .await,
        );
    }
    let (a, b) = (&pods[0], &pods[1]);
    let mut seen = Vec::new();
    for _ in 0..8 {
        // Several sessions, so that their keys land on more than one primary (with three, all
        // on one primary happened once in many runs).
        let (mut c, _) = Client::init(a.addr(), "2025-11-25").await;
        let (id, mut s) = c.call("tick", tick(6, 150), "T").await;
        let first = s
            .until(|e| !e.is_priming() && e.describe() == "progress 2")
            .await;
        let cursor = first.last().unwrap().id.clone().unwrap();
        s.cut();
        let r = c.at(b.addr()).get(Some(&cursor)).await;
        assert_eq!(r.status, 200);
        let rest = tokio::time::timeout(Duration::from_secs(60), r.sse().rest())
            .await
            .expect("the non-owner follows the owner to the answer");
        let mut want = progress(3, 6);
        want.push(format!("response {id}"));
        assert_eq!(desc(&rest), want);
        let r = c.get(Some(&cursor)).await;
        assert_eq!(
            r.sse().rest().await,
            rest,
            "the owner serves the same events"
        );
        let mut via_b = c.at(b.addr());
        let (id2, mut s2) = via_b
            .call("echo", json!({"text": "on the cluster"}), "E")
            .await;
        let evs = s2.rest().await;
        assert_eq!(desc(&evs), [format!("response {id2}")]);
        seen.push(c.session.clone());
    }
    // The sessions' keys are spread: more than one primary holds some.
    let mut holders = 0;
    for i in 0..3 {
        let mut conn = ::redis::Client::open(cluster.url(i))
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        let n: u64 = ::redis::cmd("DBSIZE").query_async(&mut conn).await.unwrap();
        if n > 0 {
            holders += 1;
        }
    }
    assert!(holders >= 2, "keys on {holders} primaries");
    for p in pods {
        p.stop().await;
    }
}

/// 2026-07-28 tasks across replicas: a task runs on the replica that created it; `tasks/get` and
/// `tasks/cancel` sent to another replica reach it (forwarded), so the answers are the owner's:
/// `working` while it runs (never `failed` because another replica cannot see its upstream
/// call), then `cancelled`; after it ended, any replica reads its outcome from Redis.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_created_on_one_replica_is_polled_and_cancelled_on_another() {
    use support::modern::{call, demo, headers, req};
    use support::security::Target;
    let redis = RedisServer::start(Persist::AofAlways).await;
    let up = demo().await;
    let keys = tempfile::tempdir().unwrap();
    let secret = key_file(keys.path(), 0x66);
    // One identity key: an ended task's owner is checked by any replica alike.
    let ident = key_file(keys.path(), 0x67);
    let mut pods = Vec::new();
    let mut dirs = Vec::new();
    for name in ["pod-a", "pod-b"] {
        let dir = tempfile::tempdir().unwrap();
        let (url, secret, ident, p) = (redis.url(), secret.clone(), ident.clone(), port());
        pods.push(
            start_in_process(&up.sse_url(), dir.path(), move |c| {
                c.auth.key_file = Some(ident);
                c.log.backend = Backend::Redis;
                c.log.redis.url = url;
                c.cluster.replica_id = name.into();
                c.cluster.listen = format!("127.0.0.1:{p}");
                c.cluster.secret_file = Some(secret);
                c.tasks.mode = mcp_resume_proxy::config::TaskMode::Always;
            })
            .await,
        );
        dirs.push(dir);
    }
    let (a, b) = (Target::plain(pods[0].addr), Target::plain(pods[1].addr));
    let task_op = |t: &Target, method: &'static str, task: &str| {
        let msg = req(json!(2), method, json!({"taskId": task}), true);
        let mut h: Vec<(String, String)> = headers(&msg, &None)
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        h.push(("mcp-name".into(), task.to_string()));
        let t = t.clone();
        async move {
            let h: Vec<(&str, &str)> = h.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
            let r = t.send("POST", "/mcp", &h, Some(&msg.to_string())).await;
            assert_eq!(r.status, 200);
            r.json().await
        }
    };
    let slow = call(1, "count", json!({"n": 50, "interval_ms": 200}), true);
    let r = support::modern::post(&a, &slow, None).await;
    let v = r.json().await;
    assert_eq!(v["result"]["resultType"], "task", "{v}");
    let task = v["result"]["taskId"].as_str().unwrap().to_string();
    // Polled on the other replica: the owner's live answer.
    let g = task_op(&b, "tasks/get", &task).await;
    assert_eq!(g["result"]["status"], "working", "{g}");
    assert!(
        g["result"]["statusMessage"].is_string(),
        "the owner's live state (its progress), not a guess: {g}"
    );
    // Cancelled on the other replica: the owner cancels it.
    let c = task_op(&b, "tasks/cancel", &task).await;
    assert!(c.get("error").is_none(), "{c}");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let g = task_op(&b, "tasks/get", &task).await;
        if g["result"]["status"] == "cancelled" {
            break;
        }
        assert_eq!(g["result"]["status"], "working", "{g}");
        assert!(
            tokio::time::Instant::now() < deadline,
            "never cancelled: {g}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The owner agrees, and so does a read from Redis alone (a replica without forwarding).
    let g = task_op(&a, "tasks/get", &task).await;
    assert_eq!(g["result"]["status"], "cancelled", "{g}");
    let forwarded = metric_value(
        &pods[1].metrics.render(),
        "mcp_resume_forwards_total{outcome=\"ok\"}",
    );
    assert!(
        forwarded >= 2.0,
        "the task methods went through the owner ({forwarded})"
    );
    for p in pods {
        p.stop().await;
    }
}

/// Two proxy binaries on one Redis, each beside its own FastMCP upstream, whose mirrors'
/// safety poll is ten minutes (the test hook `MCP_RESUME_PROXY_FOLLOW_POLL_MS`): a mirror then
/// learns of its owner's writes from the doorbell alone (or, while the doorbell is down, from
/// the fast poll).
struct Pair {
    _dirs: tempfile::TempDir,
    _ups: Vec<Upstream>,
    pods: Vec<ProxyProc>,
}

impl Pair {
    /// Pod A connected to `urls[0]`, pod B to `urls[1]` (one Redis, or two nodes of a Cluster).
    async fn start(urls: [String; 2]) -> Pair {
        let dirs = tempfile::tempdir().unwrap();
        let (mut ups, mut pods) = (Vec::new(), Vec::new());
        for (name, url) in ["pod-a", "pod-b"].into_iter().zip(urls) {
            let url = format!("url = \"{url}\"");
            let up = fastmcp().await;
            let replica = format!("replica_id = \"{name}\"");
            let extra = [
                ("[log]", "backend = \"redis\""),
                ("[log.redis]", url.as_str()),
                ("[cluster]", replica.as_str()),
            ];
            let env = [("MCP_RESUME_PROXY_FOLLOW_POLL_MS", "600000")];
            let dir = dirs.path().join(name);
            pods.push(
                ProxyProc::start_env(&up.sse_url(), &dir, &extra, &env, Stdio::inherit()).await,
            );
            ups.push(up);
        }
        Pair {
            _dirs: dirs,
            _ups: ups,
            pods,
        }
    }

    fn addr(&self, i: usize) -> std::net::SocketAddr {
        format!("127.0.0.1:{}", self.pods[i].port).parse().unwrap()
    }
}

/// How many subscribers the doorbell of `session` has.
async fn doorbell_subscribers(redis: &RedisServer, session: &str) -> i64 {
    let mut c = redis.admin().await;
    let channel = format!("{PREFIX}:{{{session}}}:m:n");
    let (_, n): (String, i64) = ::redis::cmd("PUBSUB")
        .arg("SHARDNUMSUB")
        .arg(&channel)
        .query_async(&mut c)
        .await
        .unwrap();
    n
}

/// Waits (bounded: fails the test) until the doorbell of `session` has `n` subscribers.
async fn until_subscribers(redis: &RedisServer, session: &str, n: i64) {
    let deadline = tokio::time::Instant::now() + WAIT;
    while doorbell_subscribers(redis, session).await != n {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the doorbell of the session never had {n} subscriber(s)"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A client cut from the owner mid-call lands on the other replica, whose mirror polls only every
/// ten minutes: it reads the rest as the owner logs it, exactly once, then the answer — which
/// only the doorbell can bring in time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mirror_follows_its_owner_by_the_doorbell() {
    let redis = RedisServer::start(Persist::AofAlways).await;
    let pair = Pair::start([redis.url(), redis.url()]).await;
    resume_on_b(&pair, 8).await;
}

/// A client cut from its session's owner and resumed on the other replica reads the rest of the
/// call exactly, then the answer (the owner serves the same); returns the session.
async fn resume_on_b(pair: &Pair, n: u32) -> String {
    let (mut c, _) = Client::init(pair.addr(0), "2025-11-25").await;
    let (id, mut s) = c.call("tick", tick(n, 200), "T").await;
    let first = s
        .until(|e| !e.is_priming() && e.describe() == "progress 2")
        .await;
    let cursor = first.last().unwrap().id.clone().unwrap();
    s.cut();
    let r = c.at(pair.addr(1)).get(Some(&cursor)).await;
    assert_eq!(r.status, 200);
    let rest = tokio::time::timeout(Duration::from_secs(60), r.sse().rest())
        .await
        .expect("the mirror follows the owner by the doorbell");
    let mut want = progress(3, n);
    want.push(format!("response {id}"));
    assert_eq!(desc(&rest), want);
    let r = c.get(Some(&cursor)).await;
    assert_eq!(r.sse().rest().await, rest, "the owner serves the same");
    c.session.clone()
}

/// On a Redis Cluster of three, pod B connected to another node than pod A: sessions whose
/// doorbells live on different primaries are each followed live by the doorbell alone (the
/// safety poll is ten minutes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_redis_cluster_mirrors_follow_by_the_doorbell_on_each_primary() {
    let cluster = support::redis::RedisCluster::start().await;
    let pair = Pair::start([cluster.url(0), cluster.url(1)]).await;
    let mut primaries = std::collections::BTreeSet::new();
    for _ in 0..8 {
        let session = resume_on_b(&pair, 6).await;
        for i in 0..3 {
            let mut conn = ::redis::Client::open(cluster.url(i))
                .unwrap()
                .get_multiplexed_async_connection()
                .await
                .unwrap();
            // Only the primary holding the session's slot answers (the others: MOVED).
            let n: i64 = ::redis::cmd("EXISTS")
                .arg(format!("{PREFIX}:{{{session}}}:m"))
                .query_async(&mut conn)
                .await
                .unwrap_or(0);
            if n == 1 {
                primaries.insert(i);
            }
        }
        if primaries.len() >= 2 {
            break;
        }
    }
    assert!(
        primaries.len() >= 2,
        "sessions on {} primaries",
        primaries.len()
    );
}

/// The doorbell's pub/sub connection is killed while a mirror follows a live call: the replica
/// reconnects and subscribes the channel again, and the client reads every event exactly once
/// (those logged while the doorbell was down by the fast poll and the wake on reconnect; those
/// after it by the doorbell again, the safety poll being ten minutes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mirror_keeps_following_when_the_doorbell_connection_is_killed() {
    let redis = RedisServer::start(Persist::AofAlways).await;
    let pair = Pair::start([redis.url(), redis.url()]).await;
    let (mut c, _) = Client::init(pair.addr(0), "2025-11-25").await;
    let (id, mut s) = c.call("tick", tick(16, 300), "T").await;
    let first = s
        .until(|e| !e.is_priming() && e.describe() == "progress 2")
        .await;
    let cursor = first.last().unwrap().id.clone().unwrap();
    s.cut();
    let r = c.at(pair.addr(1)).get(Some(&cursor)).await;
    assert_eq!(r.status, 200);
    let mut sb = r.sse();
    let mut got = sb
        .until(|e| !e.is_priming() && e.describe() == "progress 4")
        .await;
    until_subscribers(&redis, &c.session, 1).await;
    let mut admin = redis.admin().await;
    let killed: i64 = ::redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("pubsub")
        .query_async(&mut admin)
        .await
        .unwrap();
    assert!(killed >= 1, "the doorbell's connection was not killed");
    // Subscribed again on the new connection (the channel's only subscriber is replica B's).
    until_subscribers(&redis, &c.session, 1).await;
    let rest = tokio::time::timeout(Duration::from_secs(60), sb.rest())
        .await
        .expect("the mirror keeps following after the doorbell's connection was killed");
    got.extend(rest);
    let mut want = progress(3, 16);
    want.push(format!("response {id}"));
    assert_eq!(desc(&got), want);
    let r = c.get(Some(&cursor)).await;
    assert_eq!(r.status, 200);
    assert_eq!(desc(&r.sse().rest().await), want);
}

/// Waits (bounded: fails the test) until `series` of `p`'s `/metrics` is `want`.
async fn until_metric(p: &Proxy, series: &str, want: f64) {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let has = p.metric(series).await;
        if has == want {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{series} never became {want} (is {has})"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The Redis backend's own metrics: every round trip is timed by op
/// (`mcp_resume_redis_seconds{op}`), and `mcp_resume_redis_doorbell_up` follows the doorbell's
/// pub/sub connection: 1 while it is up, 0 while Redis is gone, 1 again once it is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_round_trips_and_the_doorbell_connection_are_exported() {
    let mut redis = RedisServer::start(Persist::AofAlways).await;
    let up = fastmcp().await;
    let a = proxy(&up, &redis, "pod-a").await;
    let doorbell = "mcp_resume_redis_doorbell_up";
    until_metric(&a, doorbell, 1.0).await;
    let (mut c, _) = Client::init(a.addr(), "2025-11-25").await;
    let (id, mut s) = c.call("tick", tick(2, 50), "T").await;
    let evs = s.rest().await;
    assert_eq!(desc(&evs).last(), Some(&format!("response {id}")));
    for op in ["append", "write", "read", "lease"] {
        let series = format!("mcp_resume_redis_seconds_count{{op=\"{op}\"}}");
        let n = a.metric(&series).await;
        // Reads: the resume check of a GET and the reaper's; every other op is certain here.
        if op != "read" {
            assert!(n >= 1.0, "{series} is {n}");
        }
    }
    redis.kill9();
    until_metric(&a, doorbell, 0.0).await;
    redis.restart().await;
    until_metric(&a, doorbell, 1.0).await;
}

/// Redis SIGKILLed and restarted (AOF `always`) while a call streams its progress, well within
/// the lease: the owner's appends stall and are sent again with the same expected head and batch
/// token once Redis is back (one that landed before the kill reads as landed), so the call goes
/// on: every event exactly once, in order, and its answer, on the stream and on a resume from
/// Redis alone on another replica. Before, the first append that met the dead Redis ended the
/// session (`store_error`: a -32091 and the end).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_restart_shorter_than_the_lease_stalls_a_call_and_loses_nothing() {
    let mut redis = RedisServer::start(Persist::AofAlways).await;
    let up = fastmcp().await;
    let a = proxy(&up, &redis, "pod-a").await;
    let (mut c, _) = Client::init(a.addr(), "2025-11-25").await;
    let (id, mut s) = c.call("tick", tick(30, 60), "T").await;
    let first = s
        .until(|e| !e.is_priming() && e.describe() == "progress 5")
        .await;
    let cursor = first
        .iter()
        .find(|e| e.describe() == "progress 1")
        .and_then(|e| e.id.clone())
        .unwrap();
    redis.restart().await;
    let rest = s.rest().await;
    let mut got = desc(&first);
    got.extend(desc(&rest));
    let mut want = progress(1, 30);
    want.push(format!("response {id}"));
    assert_eq!(got, want, "every event once, in order, and the answer");
    assert!(a.metric("mcp_resume_store_errors_total").await >= 1.0);
    assert_eq!(a.metric("mcp_resume_fenced_total").await, 0.0);

    // Another replica serves the same history from Redis alone.
    let b = proxy(&up, &redis, "pod-b").await;
    let r = c.at(b.addr()).get(Some(&cursor)).await;
    assert_eq!(r.status, 200);
    let mut s = r.sse();
    let again = s.until(|e| e.describe() == format!("response {id}")).await;
    assert_eq!(desc(&again), want[1..].to_vec());
    a.stop().await;
    b.stop().await;
}
