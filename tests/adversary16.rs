//! Adversarial reproductions against issue 16's quotas and bounded queues (commits 53990e0 and
//! 8319c0b), written by a review: each test states the promise it checks and failed while the
//! promise was broken (the names say what was broken); all pass since the fixes that followed
//! (opens dropped with their request, sends raced against the timers and the drain, shared
//! requests kept off leased sessions, stalled listens counted until their streams are gone).
//!
//! Everything on loopback (127.0.0.0/8), port 0, in front of the embedded demo upstream.
//!
//! Run: `cargo test --test adversary16`.

mod support;

use std::net::SocketAddr;
use std::time::Duration;

use serde_json::{json, Value};
use support::modern::{answer, call, demo, headers, listen, post, req};
use support::security::Target;
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The raw bytes of a modern POST (HTTP/1.1, `Connection: keep-alive`).
fn raw_post(addr: SocketAddr, msg: &Value, auth: Option<&str>) -> Vec<u8> {
    let bearer = auth.map(|a| format!("Bearer {a}"));
    let body = msg.to_string();
    let mut s = format!(
        "POST /mcp HTTP/1.1\r\nhost: {addr}\r\ncontent-length: {}\r\n",
        body.len()
    );
    for (k, v) in headers(msg, &bearer) {
        s.push_str(&format!("{k}: {v}\r\n"));
    }
    s.push_str("\r\n");
    s.push_str(&body);
    s.into_bytes()
}

/// A raw connection from loopback address `from`, with a small receive buffer (so a client that
/// stops reading fills the path quickly).
async fn raw_connect(addr: SocketAddr, from: &str, rcvbuf: Option<u32>) -> TcpStream {
    let sock = tokio::net::TcpSocket::new_v4().unwrap();
    if let Some(n) = rcvbuf {
        sock.set_recv_buffer_size(n).unwrap();
    }
    sock.bind(SocketAddr::new(from.parse().unwrap(), 0))
        .unwrap();
    sock.connect(addr).await.unwrap()
}

fn pool_sessions(p: &mcp_resume_proxy::app::Running) -> f64 {
    metric_value(&p.metrics.render(), "mcp_resume_upstream_pool_sessions")
}

// ---------------------------------------------------------------------------------------------
// 1. A request dropped while its upstream session is being opened leaks its `opening` count.

/// `Pool::lease` counts an open in `opening` (under the sessions lock) and uncounts it only after
/// `open().await` returns. A client that half-closes its connection right after its request makes
/// hyper drop the request future during that await: the count is never given back. Each address
/// can leak `modern.max_per_identity` of them, and every leaked open counts toward
/// `modern.pool_max_sessions` forever — here two anonymous addresses take the whole pool of 2 for
/// good, and a third caller (who never did anything wrong) is refused with `capacity` from then
/// on, though the pool holds no session at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_open_leaks_its_pool_slot_forever() {
    let up = demo().await;
    let dir = tempfile::tempdir().unwrap();
    let p = start_in_process(&up.sse_url(), dir.path(), |c| {
        c.modern.pool_max_sessions = 2;
        c.modern.max_per_identity = 1;
        c.modern.pool_wait_secs = 1;
    })
    .await;
    for from in ["127.0.0.3", "127.0.0.4", "127.0.0.3", "127.0.0.4"] {
        let mut s = raw_connect(p.addr, from, None).await;
        s.write_all(&raw_post(
            p.addr,
            &call(1, "echo", json!({"text": "x"}), false),
            None,
        ))
        .await
        .unwrap();
        // Half-close: hyper (no `half_close`) ends the connection, dropping the request future.
        s.shutdown().await.unwrap();
        let mut buf = Vec::new();
        let _ = tokio::time::timeout(WAIT, s.read_to_end(&mut buf)).await;
    }
    // (Each address tries twice: a drop that lands before the open leaks nothing.)
    // Whatever the dropped opens were doing is long over. A drop that lands after its open
    // finished (a loaded machine) leaves an idle pooled session, which is no leak: what the pool
    // counts must be what is open upstream, at most one per address.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let deadline = tokio::time::Instant::now() + WAIT;
    while pool_sessions(&p) as usize != up.open_sessions() && tokio::time::Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    eprintln!(
        "pool sessions {}, upstream sessions open {}",
        pool_sessions(&p),
        up.open_sessions()
    );
    assert_eq!(
        pool_sessions(&p) as usize,
        up.open_sessions(),
        "the pool counts exactly the upstream sessions that are open"
    );
    assert!(
        pool_sessions(&p) <= 2.0,
        "at most one pooled session per address"
    );
    let user = Target::plain(p.addr).via_peer("127.0.0.2");
    let v = answer(
        &user,
        &call(2, "echo", json!({"text": "hello"}), false),
        None,
    )
    .await;
    assert_eq!(
        v["result"]["content"][0]["text"], "hello",
        "an empty pool refused an innocent caller: {v}"
    );
    // And the dropped opens' own address is not locked out of its share for good either.
    let again = Target::plain(p.addr).via_peer("127.0.0.3");
    let v = answer(
        &again,
        &call(3, "echo", json!({"text": "again"}), false),
        None,
    )
    .await;
    assert_eq!(
        v["result"]["content"][0]["text"], "again",
        "an address is locked out for good by one dropped request: {v}"
    );
    p.stop().await;
}

// ---------------------------------------------------------------------------------------------
// 2. A listen whose client stops reading outlives `modern.listen_max_secs` and pins its session.

/// The listen task forwards each notification with `tx.send(b).await` *inside* its `select!`
/// arm: once the client stops reading (its TCP window and the 32-frame stream queue full), that
/// await never ends, and none of the other arms — `listen_max_secs`, drain, `tx.closed()` — is
/// polled again. The Hub then drops the listener as fallen behind (the owner's listen slot is
/// free again, `slow_reader` counted), but the task stays parked forever holding its `Pinned`
/// upstream session: the pool never reaps it, `listen_max_secs` never ends it, and the owner may
/// open another listen and park it the same way (listens of one owner beyond
/// `modern.max_per_identity`, each holding a connection and its buffers).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listen_that_stops_reading_outlives_listen_max_secs_and_pins_its_session() {
    let up = demo().await;
    let dir = tempfile::tempdir().unwrap();
    let p = start_in_process(&up.sse_url(), dir.path(), |c| {
        // Long enough for the listen to fall behind first on a loaded machine (the kernel's
        // send buffer for it grows to `net.ipv4.tcp_wmem`'s 4 MiB before the Hub sees it lag).
        c.modern.listen_max_secs = 12;
        c.modern.pool_idle_secs = 1;
        c.modern.max_per_identity = 1;
    })
    .await;
    let t = Target::plain(p.addr).via_peer("127.0.0.2");
    let dropped = || {
        metric_value(
            &p.metrics.render(),
            "mcp_resume_dropped_total{reason=\"slow_reader\"}",
        )
    };
    // A listen whose client never reads a byte (a 4 KiB receive buffer).
    let mut s = raw_connect(p.addr, "127.0.0.2", Some(4096)).await;
    s.write_all(&raw_post(p.addr, &listen("l0"), None))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    // Trickles of list changes (each under the Hub's 256) until the Hub gives up on it.
    let before = dropped();
    let mut n = 0;
    while dropped() == before {
        let v = answer(
            &t,
            &call(n, "list_changed", json!({"count": 200}), false),
            None,
        )
        .await;
        assert_eq!(v["result"]["content"][0]["text"], "sent 200", "{v}");
        n += 1;
        assert!(n < 500, "the listen never fell behind");
    }
    eprintln!("the listen fell behind after {n} calls");
    // While the stalled listen still holds its place (its task has not yet seen that it fell
    // behind), it counts against the owner: no second one beside it. Once its task has seen it,
    // it lets go of its slot and its session at once (only its last frame waits, a little, for
    // a client that may not read), so a second listen is rightly served — on a loaded machine
    // the task often gets there first. Either way, never two listens holding places at once.
    let r = post(&t, &listen("l1"), None).await;
    if r.header("content-type").as_deref() == Some("text/event-stream") {
        let pool = pool_sessions(&p);
        assert!(
            pool <= 1.0,
            "two listens of one owner hold {pool} upstream sessions (max_per_identity = 1)"
        );
        drop(r);
    } else {
        let v = r.json().await;
        assert_eq!(v["error"]["data"]["reason"], "capacity", "{v}");
    }
    // Long past `listen_max_secs` (12 s, then at most 5 s for its last frame): the stalled
    // listen is gone, and with it its hold on the upstream session (past `pool_idle_secs`).
    tokio::time::sleep(Duration::from_secs(19)).await;
    let streams = metric_value(
        &p.metrics.render(),
        "mcp_resume_client_streams_active{facade=\"streamable\"}",
    );
    let pool = pool_sessions(&p);
    assert_eq!(
        pool, 0.0,
        "a listen ended by listen_max_secs (after falling behind) still pins its upstream \
         session ({streams} client streams open, max_per_identity = 1)"
    );
    // And the owner may listen again.
    let r = post(&t, &listen("l2"), None).await;
    assert_eq!(
        r.header("content-type").as_deref(),
        Some("text/event-stream")
    );
    drop(s);
    p.stop().await;
}

// ---------------------------------------------------------------------------------------------
// 3. One slow reader stalls the shared requests that land on its upstream session.

/// A streaming `tools/call` (it asked for progress) whose client stops reading: its 32-frame
/// stream queue fills, its route's 16 messages fill, and the session's pump blocks in
/// `tx.send(..).await` — as designed, the slow reader holds its upstream back. But shared
/// (non-exclusive) requests are placed on the least busy session of the key *including leased
/// ones*: a `tools/list` of the same caller lands on the stalled session and its response, stuck
/// behind the pump, never comes (there is no `upstream.request_timeout_secs` by default). Any
/// other client sharing that identity (a JWT principal used by two agents, or a header identity
/// used from two addresses) is stalled the same way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_streaming_reader_stalls_shared_requests_on_its_session() {
    let up = demo().await;
    let dir = tempfile::tempdir().unwrap();
    let p = start_in_process(&up.sse_url(), dir.path(), |_| {}).await;
    // Progress for each of 200 000 steps, unpaced; the client never reads.
    let mut flood = call(1, "count", json!({"n": 200_000, "interval_ms": 0}), false);
    flood["params"]["_meta"]["progressToken"] = json!("p");
    let mut s = raw_connect(p.addr, "127.0.0.2", Some(4096)).await;
    s.write_all(&raw_post(p.addr, &flood, Some("alice")))
        .await
        .unwrap();
    // Long enough for the path to fill and the pump to block.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(pool_sessions(&p), 1.0);
    // The same caller lists its tools: a shared request, placed on that session.
    let t = Target::plain(p.addr).via_peer("127.0.0.2");
    let list = req(json!(2), "tools/list", json!({}), false);
    let got = tokio::time::timeout(Duration::from_secs(10), answer(&t, &list, Some("alice"))).await;
    match got {
        Ok(v) => assert!(v["result"]["tools"].is_array(), "{v}"),
        Err(_) => panic!(
            "tools/list unanswered after 10 s: it shares the upstream session whose pump is \
             blocked behind another request's slow reader"
        ),
    }
    drop(s);
    p.stop().await;
}

/// The same slow streaming reader with `upstream.request_timeout_secs = 2`: `drive` awaits
/// `emit` (a bounded `sink.send`) inside its `select!` arm, so while the client does not read,
/// neither the request timeout, nor drain, nor `sink.closed()` is ever polled. The call holds its
/// exclusive upstream session (the owner's whole share here) long past the timeout. (Timing
/// dependent: the timeout still fires when a send happens to complete after the deadline; this
/// failed 5 runs in 7 here.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_streaming_reader_is_never_timed_out() {
    let up = demo().await;
    let dir = tempfile::tempdir().unwrap();
    let p = start_in_process(&up.sse_url(), dir.path(), |c| {
        c.upstream.request_timeout_secs = 2;
        c.modern.max_per_identity = 1;
        c.modern.pool_wait_secs = 1;
    })
    .await;
    // 50 000 progress frames (~8 MB): more than the path holds with the kernel's send buffer
    // grown to 4 MiB, and few enough that the upstream is done with them soon after the timeout.
    let mut flood = call(1, "count", json!({"n": 50_000, "interval_ms": 0}), false);
    flood["params"]["_meta"]["progressToken"] = json!("p");
    let mut s = raw_connect(p.addr, "127.0.0.2", Some(4096)).await;
    s.write_all(&raw_post(p.addr, &flood, None)).await.unwrap();
    // Twice the request timeout.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let t = Target::plain(p.addr).via_peer("127.0.0.2");
    // Held, the session leaves the caller none: the call waits `pool_wait_secs` and is refused
    // (`capacity`). Released, the call goes upstream; on a loaded machine the upstream may
    // still be working through the abandoned flood and let the first tries time out (-32093
    // `request_timeout`, an upstream answer late, not a session held), so it is tried again.
    let mut got = Value::Null;
    for id in 2..12 {
        let v = answer(&t, &call(id, "echo", json!({"text": "hello"}), false), None).await;
        if v["result"]["content"][0]["text"] == "hello" {
            got = v;
            break;
        }
        assert_eq!(
            v["error"]["data"]["reason"], "request_timeout",
            "a call past upstream.request_timeout_secs still holds the caller's upstream \
             session: {v}"
        );
    }
    assert_eq!(
        got["result"]["content"][0]["text"], "hello",
        "no echo answered in 10 tries"
    );
    drop(s);
    p.stop().await;
}

// ---------------------------------------------------------------------------------------------
// 1b. The same drop during the handshake leaks the upstream session itself.

/// A relay to `target` that holds every chunk starting with `POST` back for `delay` (so the
/// `initialize` POST of a pool open takes that long); everything else passes at once.
async fn slow_post_relay(target: SocketAddr, delay: Duration) -> SocketAddr {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((c, _)) = l.accept().await {
            tokio::spawn(async move {
                let Ok(u) = TcpStream::connect(target).await else {
                    return;
                };
                let (mut cr, mut cw) = c.into_split();
                let (mut ur, mut uw) = u.into_split();
                let up = async move {
                    let mut buf = vec![0u8; 64 * 1024];
                    loop {
                        let n = match cr.read(&mut buf).await {
                            Ok(0) | Err(_) => break,
                            Ok(n) => n,
                        };
                        if buf[..n].starts_with(b"POST") {
                            tokio::time::sleep(delay).await;
                        }
                        if uw.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                    }
                    let _ = uw.shutdown().await;
                };
                let down = async move {
                    let _ = tokio::io::copy(&mut ur, &mut cw).await;
                };
                tokio::join!(up, down);
            });
        }
    });
    addr
}

/// `Pool::open` spawns the session's pump (which owns the upstream reader) before the
/// `initialize` handshake; when the request future is dropped during the handshake nothing kills
/// it: the upstream session stays open for good, outside the pool — never reaped, never counted
/// by `mcp_resume_upstream_pool_sessions`, never closed at shutdown by `close_all`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_dropped_during_its_handshake_leaks_the_upstream_session() {
    let up = demo().await;
    let relay = slow_post_relay(up.addr, Duration::from_millis(1500)).await;
    let dir = tempfile::tempdir().unwrap();
    let p = start_in_process(&format!("http://{relay}/sse"), dir.path(), |c| {
        c.modern.pool_idle_secs = 1;
    })
    .await;
    let mut s = raw_connect(p.addr, "127.0.0.3", None).await;
    s.write_all(&raw_post(
        p.addr,
        &call(1, "echo", json!({"text": "x"}), false),
        None,
    ))
    .await
    .unwrap();
    // The upstream GET is through (its endpoint event came back); `initialize` is held.
    let deadline = tokio::time::Instant::now() + WAIT;
    while up.open_sessions() == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no upstream session"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    // The client goes: hyper drops the request future inside `open()`'s handshake.
    s.shutdown().await.unwrap();
    let mut buf = Vec::new();
    let _ = tokio::time::timeout(WAIT, s.read_to_end(&mut buf)).await;
    drop(s);
    // Past the held POST, past pool_idle_secs.
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(pool_sessions(&p), 0.0);
    assert_eq!(
        up.open_sessions(),
        0,
        "an upstream session outlives the request that opened it, outside the pool"
    );
    p.stop().await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        up.open_sessions(),
        0,
        "…and outlives the proxy's shutdown too"
    );
}
