//! Adversary 16b: reproductions against request forwarding between replicas (0353ab8,
//! src/facade/forward.rs), the one answer table, the legacy depth cap, the 2026-07-28
//! task-required check and the pool. Each test is a finding, ignored so the suite stays green;
//! it fails today and passes once the finding is fixed.
//!
//! Real peers on loopback: `redis-server` (Debian package), the Python FastMCP legacy upstream,
//! two in-process proxies as two replicas. Where an attacker sits between them, the test plays it
//! with a plain TCP relay (said in the test).
//!
//! Run: `cargo test --test adversary16b -- --ignored` (after `scripts/install-peers`).

mod support;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mcp_resume_proxy::config::Backend;
use serde_json::json;
use support::redis::{Persist, RedisServer};
use support::streamable::*;
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// A key file as the chart mounts it: 64 hex characters, mode 0600.
fn key_file(dir: &std::path::Path, byte: u8) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let p = dir.join(format!("key-{byte}"));
    std::fs::write(&p, format!("{}\n", format!("{byte:02x}").repeat(32))).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
    p
}

/// Two in-process replicas "pod-a" (the owner of the sessions the tests open) and "pod-b", with
/// internal listeners, one forwarding secret and one identity key. `tweak_a` adjusts pod-a's
/// config (after the cluster keys are set). Returns (a, b, a's internal port).
async fn pair(
    up: &Upstream,
    redis: &RedisServer,
    keys: &std::path::Path,
    tweak_a: impl FnOnce(&mut mcp_resume_proxy::config::Config) + Send + 'static,
) -> (Proxy, Proxy, u16) {
    let secret = key_file(keys, 0x77);
    let ident = key_file(keys, 0x33);
    let internal_a = port();
    let internal_b = port();
    let base = |name: &'static str, p: u16| {
        let (url, secret, ident) = (redis.url(), secret.clone(), ident.clone());
        move |c: &mut mcp_resume_proxy::config::Config| {
            c.log.backend = Backend::Redis;
            c.log.redis.url = url;
            c.cluster.replica_id = name.into();
            c.cluster.listen = format!("127.0.0.1:{p}");
            c.cluster.secret_file = Some(secret);
            c.cluster.forward_timeout_ms = 2000;
            c.auth.key_file = Some(ident);
        }
    };
    let fa = base("pod-a", internal_a);
    let a = Proxy::start(up, move |c| {
        fa(c);
        tweak_a(c);
    })
    .await;
    let b = Proxy::start(up, base("pod-b", internal_b)).await;
    (a, b, internal_a)
}

/// The owner's internal listener (`cluster.listen`) reads a request's whole body *before* it
/// checks the forward's proof, with no `listen.body_timeout_secs` and outside
/// `listen.max_body_bytes_in_flight` (forward.rs `accept`: `Limited::new(body, MAX_BODY)`
/// collected with no timeout), and it shares `listen.max_connections` as its connection bound.
/// So anyone who can reach the internal port — any pod on the network, no secret needed — opens
/// `max_connections` connections, sends a head and part of a body, and holds them: every slot of
/// the internal listener is taken for good, and every forward from every other replica times out
/// (504 to clients whose requests land on a non-owner). Each held connection may also hold up to
/// 4 MiB unverified (max_connections × 4 MiB, none of it in the body budget).
///
/// Contract: design.md §11b (memory per request bounded, body budget; "a proxy that one request
/// cannot take down"), §13 (writes reach the owner), the public face's 408 after
/// `listen.body_timeout_secs`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unverified_slow_bodies_on_the_internal_listener_lock_out_every_forward() {
    let redis = RedisServer::start(Persist::AofAlways).await;
    let up = fastmcp().await;
    let keys = tempfile::tempdir().unwrap();
    const SLOTS: usize = 6;
    let (a, b, internal_a) = pair(&up, &redis, keys.path(), |c| {
        c.listen.max_connections = SLOTS;
        c.listen.body_timeout_secs = 1;
    })
    .await;
    let (c, _) = Client::init(a.addr(), "2025-11-25").await;
    let via_b = c.at(b.addr());
    // (No forward before the attack: pod-b's client would keep that connection to pod-a in its
    // pool, and it would keep working until it idles out; every new connection is locked out.)

    // The attacker: no secret, no proof header even; a head and 64 KiB of a 4 MiB body, held.
    let target: SocketAddr = format!("127.0.0.1:{internal_a}").parse().unwrap();
    let mut held = Vec::new();
    for _ in 0..SLOTS {
        let mut s = TcpStream::connect(target).await.unwrap();
        s.write_all(b"POST /mcp HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 4194304\r\n\r\n")
            .await
            .unwrap();
        s.write_all(&vec![b' '; 64 * 1024]).await.unwrap();
        held.push(s);
    }
    // Three body timeouts later.
    tokio::time::sleep(Duration::from_secs(3)).await;

    // A client whose request lands on the non-owner: its forward must still reach the owner.
    let r = via_b
        .post(&json!({"jsonrpc":"2.0","id":2,"method":"ping"}))
        .await;
    assert_eq!(
        r.status, 200,
        "a forward while {SLOTS} unverified slow bodies sit on the owner's internal listener \
         (expected 200; 504 = the internal listener's slots are all held by the attacker)"
    );
    drop(r);
    // And each slow body was answered (408, as on the public listener) and its connection closed.
    for (i, s) in held.iter_mut().enumerate() {
        let mut buf = [0u8; 256];
        let n = tokio::time::timeout(Duration::from_millis(200), s.read(&mut buf)).await;
        assert!(
            n.is_ok(),
            "held connection {i}: no answer {}s after its body stalled (body_timeout_secs = 1)",
            3
        );
    }
    a.stop().await;
    b.stop().await;
}

/// A relay that plays an attacker on the pod network between the replicas: it passes every byte
/// from the forwarding replica to the owner's internal listener, replacing `from` with `to` (same
/// length) once it is told to. A real peer cannot tamper with a forward; this is the only way to
/// show what the proof covers.
/// The bytes a relay replaces, and what it puts instead.
type Swap = Arc<Mutex<Option<(Vec<u8>, Vec<u8>)>>>;

async fn tampering_relay(target: SocketAddr, swap: Swap) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let p = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let Ok(server) = TcpStream::connect(target).await else {
                continue;
            };
            let swap = swap.clone();
            tokio::spawn(async move {
                let (mut cr, mut cw) = client.into_split();
                let (mut sr, mut sw) = server.into_split();
                let up = async move {
                    let mut buf = vec![0u8; 64 * 1024];
                    loop {
                        let n = match cr.read(&mut buf).await {
                            Ok(0) | Err(_) => break,
                            Ok(n) => n,
                        };
                        let mut chunk = buf[..n].to_vec();
                        if let Some((from, to)) = swap.lock().unwrap().clone() {
                            let mut i = 0;
                            while i + from.len() <= chunk.len() {
                                if chunk[i..i + from.len()] == from[..] {
                                    chunk[i..i + from.len()].copy_from_slice(&to);
                                    i += from.len();
                                } else {
                                    i += 1;
                                }
                            }
                        }
                        if sw.write_all(&chunk).await.is_err() {
                            break;
                        }
                    }
                };
                let down = async move {
                    let _ = tokio::io::copy(&mut sr, &mut cw).await;
                };
                tokio::join!(up, down);
            });
        }
    });
    p
}

/// The forward's proof (HMAC over method, path and query, identity, verified identity, peer, body
/// digest, time, nonce) does not cover the headers it passes — `Mcp-Session-Id`,
/// `MCP-Protocol-Version`, `Last-Event-ID`, `Accept`, `Content-Type` — and on the Streamable face
/// the session *is* a header. Whoever sits on the plaintext path between replicas (the internal
/// listener has no TLS) rewrites `Mcp-Session-Id` in a forward in flight and the owner accepts
/// the forward (the nonce is fresh: the original never arrived) and runs the client's tool call
/// on another session: here, client 1's call lands on client 2's session, whose log and stream
/// then carry it. (Sessions are anonymous here, so the owner admits the caller on either; with
/// identities the retarget stays within one identity's sessions, or any header-only identity.)
///
/// Contract: design.md §13 "an HMAC over the whole request"; §2/§11 a request reaches the session
/// it names.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forward_rewritten_in_flight_runs_on_another_session() {
    let redis = RedisServer::start(Persist::AofAlways).await;
    let up = fastmcp().await;
    let keys = tempfile::tempdir().unwrap();
    let swap: Swap = Arc::default();
    // pod-a advertises the relay: forwards to it cross the attacker.
    let relay_target_port = port();
    let relay = tampering_relay(
        format!("127.0.0.1:{relay_target_port}").parse().unwrap(),
        swap.clone(),
    )
    .await;
    let (a, b, internal_a) = pair(&up, &redis, keys.path(), move |c| {
        c.cluster.listen = format!("127.0.0.1:{relay_target_port}");
        c.cluster.advertise_addr = format!("127.0.0.1:{relay}");
    })
    .await;
    let _ = internal_a; // pod-a listens on relay_target_port instead
    let (c1, _) = Client::init(a.addr(), "2025-11-25").await;
    let (c2, _) = Client::init(a.addr(), "2025-11-25").await;
    assert_ne!(c1.session, c2.session);
    *swap.lock().unwrap() = Some((
        c1.session.as_bytes().to_vec(),
        c2.session.as_bytes().to_vec(),
    ));
    // Client 1's call lands on pod-b and is forwarded to pod-a through the attacker: the
    // owner refuses the rewritten forward (its MAC covers the session header) and runs nothing.
    let via_b = c1.at(b.addr());
    let call = json!({"jsonrpc":"2.0","id":7,"method":"tools/call",
        "params":{"name":"echo","arguments":{"text":"client 1's call"}}});
    let r = via_b.post(&call).await;
    assert_eq!(
        r.status, 404,
        "a rewritten forward is refused like an unknown session"
    );
    assert_eq!(
        a.metric("mcp_resume_forwards_total{outcome=\"refused\"}")
            .await,
        1.0
    );
    // Nothing of it was logged on the session the attacker named: its stream resumed from the
    // start holds no answer to request 7.
    *swap.lock().unwrap() = None;
    let c2_first = format!("{}:1:1", c2.session);
    let r = c2.get(Some(&c2_first)).await;
    if r.status == 200 {
        let evs = tokio::time::timeout(Duration::from_secs(3), r.sse().rest())
            .await
            .unwrap_or_default();
        assert!(
            evs.iter().all(|e| e.is_priming() || e.json()["id"] != 7),
            "client 1's call ran on client 2's session"
        );
    }
    a.stop().await;
    b.stop().await;
}

/// The process's resident set, in bytes (Linux).
fn rss() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    let kib: u64 = s
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap();
    kib * 1024
}

/// The same hole, as memory: the internal listener buffers each request's body up to 4 MiB
/// before it looks at the proof, outside `listen.max_body_bytes_in_flight`. Sixteen
/// unauthenticated connections that each send 4 MiB less one byte (so the body never completes
/// and is never refused) make the owner hold ~64 MiB with the body budget set to 1 MiB — with
/// the default `listen.max_connections` (10 000) that is up to 40 GiB from anyone who can reach
/// the internal port, no secret needed. The proxy runs in the test process: its RSS is measured.
///
/// Contract: design.md §11b "Memory per request is bounded … Peak RSS under
/// `listen.max_connections` worst-case bodies is documented and below the chart's limit"; the
/// body budget (`listen.max_body_bytes_in_flight`) bounds the bodies held at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unverified_bodies_on_the_internal_listener_escape_the_body_budget() {
    let redis = RedisServer::start(Persist::AofAlways).await;
    let up = fastmcp().await;
    let keys = tempfile::tempdir().unwrap();
    const CONNS: usize = 16;
    let (a, b, internal_a) = pair(&up, &redis, keys.path(), |c| {
        c.listen.max_connections = CONNS + 4;
        c.listen.max_body_bytes_in_flight = 1024 * 1024;
    })
    .await;
    let target: SocketAddr = format!("127.0.0.1:{internal_a}").parse().unwrap();
    let before = rss();
    let chunk = vec![b' '; 1024 * 1024];
    let mut held = Vec::new();
    for _ in 0..CONNS {
        let mut s = TcpStream::connect(target).await.unwrap();
        s.write_all(b"POST /mcp HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 4194304\r\n\r\n")
            .await
            .unwrap();
        // The owner may refuse the head at once and close (a broken pipe here): that is the
        // fix, not a failure; whatever it took in stays counted below.
        for i in 0..4 {
            let part = if i < 3 {
                &chunk[..]
            } else {
                &chunk[..1024 * 1024 - 1]
            };
            if s.write_all(part).await.is_err() {
                break;
            }
        }
        held.push(s);
    }
    // Let the owner read what was sent.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let grown = rss().saturating_sub(before);
    assert!(
        grown < 16 * 1024 * 1024,
        "{CONNS} unverified bodies of 4 MiB - 1 on the internal listener grew the owner by {} MiB \
         (body budget: 1 MiB)",
        grown / (1024 * 1024)
    );
    drop(held);
    a.stop().await;
    b.stop().await;
}

/// "A forwarded request is never forwarded again" holds only when the forward arrives on the
/// internal listener: the mark is an extension set there, and nothing on the public listener
/// refuses a request that already is a forward. With `cluster.advertise_addr` naming a public
/// port — the Service address, a port mix-up in a values file: nothing in the config check
/// catches it — a request for a session owned there is forwarded to a public listener, which
/// forwards it again, and again: one client request becomes a chain of forwards that holds a
/// connection per hop until `listen.max_connections` is full, then 504s. Here pod-a advertises
/// pod-b's public port; one ping through pod-b is forwarded dozens of times.
///
/// Contract: design.md §13 (writes reach the owner: one forward, never a retry); the commit's
/// "a forward is never forwarded again".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forward_landing_on_a_public_listener_is_forwarded_again() {
    let redis = RedisServer::start(Persist::AofAlways).await;
    let up = fastmcp().await;
    let keys = tempfile::tempdir().unwrap();
    let secret = key_file(keys.path(), 0x77);
    let ident = key_file(keys.path(), 0x33);
    let public_b = port();
    let mk = |name: &'static str, advertise: Option<u16>, public: Option<u16>| {
        let (url, secret, ident) = (redis.url(), secret.clone(), ident.clone());
        let internal = port();
        move |c: &mut mcp_resume_proxy::config::Config| {
            c.log.backend = Backend::Redis;
            c.log.redis.url = url;
            c.cluster.replica_id = name.into();
            c.cluster.listen = format!("127.0.0.1:{internal}");
            if let Some(p) = advertise {
                c.cluster.advertise_addr = format!("127.0.0.1:{p}");
            }
            if let Some(p) = public {
                c.listen.addr = format!("127.0.0.1:{p}");
            }
            c.cluster.secret_file = Some(secret);
            c.cluster.forward_timeout_ms = 2000;
            c.listen.max_connections = 40;
            c.auth.key_file = Some(ident);
        }
    };
    let a = Proxy::start(&up, mk("pod-a", Some(public_b), None)).await;
    let b = Proxy::start(&up, mk("pod-b", None, Some(public_b))).await;
    assert_eq!(b.addr().port(), public_b);
    let (c, _) = Client::init(a.addr(), "2025-11-25").await;
    let via_b = c.at(b.addr());
    let r = via_b
        .post(&json!({"jsonrpc":"2.0","id":1,"method":"ping"}))
        .await;
    let status = r.status;
    drop(r);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let m = b.metrics().await;
    let forwards: f64 = ["ok", "error", "timeout"]
        .iter()
        .map(|o| metric_value(&m, &format!("mcp_resume_forwards_total{{outcome=\"{o}\"}}")))
        .sum();
    assert!(
        forwards <= 1.0,
        "one client request (answered {status}) was forwarded {forwards} times by pod-b"
    );
    a.stop().await;
    b.stop().await;
}
