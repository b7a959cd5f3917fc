//! Audit of issue 16 (a reviewer's reproductions, 2026-12-02): each test states a promise
//! (design.md §11b/§12b, README) and failed while it was broken; the names say what was broken.
//! All pass since the fixes that followed: a per-caller share of the connection slots
//! (`listen.max_connections_per_identity`) and of the body budget, tasks counted with sessions
//! against `sessions.max_sessions`, anonymous tasks bound to their address, no upstream origin in
//! client errors, `x-mcp-header` arguments never built as a tree, `notifications/cancelled`
//! ending the sender's own calls, and eviction only from owners at least as heavy as the opener.
//!
//! Everything on loopback (127.0.0.0/8), port 0, in front of the embedded demo upstream.
//!
//! Run one: `cargo test --test audit16 <name>`.

mod support;

use std::time::Duration;

use serde_json::{json, Value};
use support::modern::{answer, call, demo, listen, post, req, V};
use support::security::{mcp_initialize, refused, StubUpstream, Target};
use support::*;

/// A `tasks/*` request of `method` for `task` (tasks extension declared), from `t`.
async fn task_request(t: &Target, id: i64, method: &str, task: &str) -> Value {
    let msg = req(json!(id), method, json!({"taskId": task}), true);
    let h = vec![
        ("content-type", "application/json"),
        ("accept", "application/json, text/event-stream"),
        ("mcp-protocol-version", V),
        ("mcp-method", method),
        ("mcp-name", task),
    ];
    let r = t.send("POST", "/mcp", &h, Some(&msg.to_string())).await;
    assert_eq!(r.status, 200, "{method}");
    r.json().await
}

// ---------------------------------------------------------------------------------------------
// 1. No per-peer connection cap: one anonymous address holds every `listen.max_connections` slot.

/// Issue 16: "Listens never time out and hold slots under one global connection cap: eight
/// listens locked out a ninth client with the cap at 8." §11b: listens "count against a
/// per-identity connection cap, not only the global one". The only per-owner bound is on
/// listens (`modern.max_per_identity`, 8); everything else one address opens — legacy `GET /sse`
/// streams here, equally sessionful GETs, streaming 2026 calls or idle connections — counts only
/// against the global cap. With the cap at 12, one anonymous address opens its 8 listens plus 4
/// legacy streams, and a client at another address gets no answer at all (the accept loop waits
/// for a slot).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_anonymous_peer_holds_every_connection_slot() {
    let up = demo().await;
    let dir = tempfile::tempdir().unwrap();
    let p = start_in_process(&up.sse_url(), dir.path(), |c| {
        c.listen.max_connections = 12;
    })
    .await;
    let t = Target::plain(p.addr);
    let (attacker, user) = (t.via_peer("127.0.0.3"), t.via_peer("127.0.0.2"));
    // It tries 8 listens and 4 legacy streams; past its share of the 12 slots it is refused.
    let mut held = Vec::new();
    let mut refused_here = 0;
    for i in 0..8 {
        let r = post(&attacker, &listen(&format!("l{i}")), None).await;
        match r.status {
            200 => held.push(r.sse()),
            503 => refused_here += 1,
            other => panic!("a listen answered {other}"),
        }
    }
    let mut streams = Vec::new();
    for _ in 0..4 {
        let r = attacker
            .send("GET", "/sse", &[("accept", "text/event-stream")], None)
            .await;
        match r.status {
            200 => streams.push(r.legacy_sse()),
            503 => refused_here += 1,
            other => panic!("GET /sse answered {other}"),
        }
    }
    assert_eq!(
        held.len() + streams.len(),
        6,
        "one address holds half of the 12 slots (listen.max_connections_per_identity's default)"
    );
    assert_eq!(refused_here, 6);
    let served = tokio::time::timeout(
        Duration::from_secs(5),
        answer(&user, &call(1, "echo", json!({"text": "hi"}), false), None),
    )
    .await;
    // Control: once the address lets go, the same request is served at once.
    drop((held, streams));
    let control = tokio::time::timeout(
        Duration::from_secs(10),
        answer(&user, &call(2, "echo", json!({"text": "hi"}), false), None),
    )
    .await
    .expect("served once the attacker's connections are gone");
    assert_eq!(control["result"]["content"][0]["text"], "hi", "{control}");
    assert!(
        served.is_ok(),
        "a client at 127.0.0.2 got no answer within 5 s: one anonymous address (127.0.0.3) holds \
         all 12 connection slots (its 8 listens + 4 legacy streams); there is no per-peer \
         connection cap beyond the listens'"
    );
    p.stop().await;
}

// ---------------------------------------------------------------------------------------------
// 2. Tasks do not count against `sessions.max_sessions`: they have a budget of their own.

/// README: "Running tasks also count against `sessions.max_sessions`"; issue 16 point 5: "tasks
/// under the session limits". With `sessions.max_sessions = 1` and one task running (it holds an
/// upstream request like a session), a new sessionful session should find no slot (503
/// `capacity`: nothing idle to evict). It is admitted: the registry never counts tasks, and the
/// tasks' own limit is a second `max_sessions` (so the proxy runs up to 2 × `max_sessions`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn running_tasks_do_not_count_against_max_sessions() {
    let up = demo().await;
    let dir = tempfile::tempdir().unwrap();
    let p = start_in_process(&up.sse_url(), dir.path(), |c| {
        c.sessions.max_sessions = 1;
        c.tasks.mode = mcp_resume_proxy::modern::tasks::TaskMode::Always;
    })
    .await;
    let t = Target::plain(p.addr);
    let (a, b) = (t.via_peer("127.0.0.2"), t.via_peer("127.0.0.3"));
    let long = call(1, "count", json!({"n": 600, "interval_ms": 100}), true);
    let v = answer(&a, &long, None).await;
    assert_eq!(v["result"]["resultType"], "task", "{v}");
    let r = mcp_initialize(&b, "2025-11-25", "second", &[]).await;
    let status = r.status;
    assert_eq!(
        status, 503,
        "with sessions.max_sessions = 1 and a task running, a sessionful initialize was answered \
         {status}: tasks and sessions each get max_sessions"
    );
    p.stop().await;
}

// ---------------------------------------------------------------------------------------------
// 3. An anonymous caller's task is another address's to read and cancel.

/// §11b: "Anonymous callers are not one principal: anonymous 2026 requests never share upstream
/// state with other peers"; README: "another identity's `tasks/get` is answered exactly like an
/// unknown id". Listens, pooled sessions and `notifications/cancelled` are keyed by address; a
/// task is keyed by identity only (`tasks::same(None, _) = true`): an anonymous task created at
/// 127.0.0.2 is read — and cancelled — by an anonymous caller at 127.0.0.3 that has its id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_anonymous_task_is_readable_and_cancellable_from_another_address() {
    let up = demo().await;
    let dir = tempfile::tempdir().unwrap();
    let p = start_in_process(&up.sse_url(), dir.path(), |c| {
        c.tasks.mode = mcp_resume_proxy::modern::tasks::TaskMode::Always;
    })
    .await;
    let t = Target::plain(p.addr);
    let (a, b) = (t.via_peer("127.0.0.2"), t.via_peer("127.0.0.3"));
    let long = call(1, "count", json!({"n": 600, "interval_ms": 100}), true);
    let v = answer(&a, &long, None).await;
    assert_eq!(v["result"]["resultType"], "task", "{v}");
    let id = v["result"]["task"]["taskId"]
        .as_str()
        .or(v["result"]["taskId"].as_str())
        .unwrap_or_else(|| panic!("a task id in {v}"))
        .to_string();
    let other = task_request(&b, 2, "tasks/get", &id).await;
    let cancel = task_request(&b, 3, "tasks/cancel", &id).await;
    // What its creator sees once the other address's cancel has landed.
    let mut mine = Value::Null;
    for i in 0..50 {
        mine = task_request(&a, 4 + i, "tasks/get", &id).await;
        if mine["result"]["status"] != "working" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        other["error"]["code"], -32602,
        "127.0.0.3 read 127.0.0.2's anonymous task: {other}\n(its cancel: {cancel})\n(127.0.0.2 \
         now sees: {mine})"
    );
    p.stop().await;
}

// ---------------------------------------------------------------------------------------------
// 4. The upstream's internal origin still reaches clients.

/// Issue 16 (lows): "the upstream's internal origin appears in client error messages". An
/// upstream whose `endpoint` event names an origin that is not allowed fails the session with
/// 502 `upstream_error` — and the client's error message spells out that origin (here an
/// in-cluster name the client has no business knowing).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rejected_endpoint_tells_clients_the_upstreams_internal_origin() {
    let stub = StubUpstream::start(|_, _| {
        "http://billing-db.internal.svc.cluster.local:5432/messages?s=1".to_string()
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let p = start_in_process(&stub.sse_url(), dir.path(), |_| {}).await;
    let t = Target::plain(p.addr);
    let r = t
        .send("GET", "/sse", &[("accept", "text/event-stream")], None)
        .await;
    let body = refused(r, 502, "upstream_error").await.to_string();
    assert!(
        !body.contains("billing-db"),
        "the client's 502 names the upstream's internal origin: {body}"
    );
    p.stop().await;
}

// ---------------------------------------------------------------------------------------------
// 5. Memory: a tool with `x-mcp-header` arguments gets its whole `arguments` built as a tree.

const BODY: usize = 4 * 1024 * 1024 - 4096;
const CONCURRENT: usize = 8;
const SLACK: u64 = 48 << 20;

fn status_bytes(pid: u32, field: &str) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib: u64 = s
        .lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap();
    kib * 1024
}

/// One raw 2026-07-28 POST on its own connection; the status.
async fn raw_modern(addr: std::net::SocketAddr, body: &[u8], extra: &str) -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "POST /mcp HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\n\
         accept: application/json, text/event-stream\r\ncontent-length: {}\r\n\
         connection: close\r\nmcp-protocol-version: 2026-07-28\r\n{extra}\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).await.unwrap();
    for chunk in body.chunks(64 * 1024) {
        if s.write_all(chunk).await.is_err() {
            break;
        }
    }
    let mut buf = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(60), s.read_to_end(&mut buf)).await;
    let text = String::from_utf8_lossy(&buf);
    text.strip_prefix("HTTP/1.1 ")
        .and_then(|r| r.get(..3))
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no HTTP response: {:?}", &text[..text.len().min(200)]))
}

/// §11b: "Memory per request is bounded by a small factor of its size (≤ 4× the body plus a
/// constant), whatever its shape: … never clone params"; README: "a request body … is never
/// built as a JSON tree". `HeaderParams::check` (src/facade/modern/params.rs) parses the whole
/// `arguments` of every `tools/call` of a tool that declares `x-mcp-header` into a
/// `serde_json::Value` — before the header is even compared. FastMCP's `routed` tool declares one;
/// once a `tools/list` has been relayed, 8 concurrent 4 MiB calls of it with `arguments` =
/// `{"region": "eu", "pad": [0,0,…]}` take the proxy binary far past `4 × bytes in flight + 48
/// MiB` (tests/memory.rs's bound, which only ever calls `echo`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_annotated_tools_arguments_are_built_as_a_tree() {
    let up = tokio::task::spawn_blocking(fastmcp_modern).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let proxy = ProxyProc::start(&up.sse_url(), &dir.path().join("data"), &[]).await;
    let addr: std::net::SocketAddr = format!("127.0.0.1:{}", proxy.port).parse().unwrap();
    let meta = r#"{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}"#;
    let list =
        format!(r#"{{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{{"_meta":{meta}}}}}"#);
    let s = raw_modern(addr, list.as_bytes(), "mcp-method: tools/list\r\n").await;
    assert_eq!(s, 200, "tools/list");
    let prefix = format!(
        r#"{{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{{"name":"routed","_meta":{meta},"arguments":{{"region":"eu","pad":["#
    );
    let suffix = "]}}}";
    let mut body = prefix.into_bytes();
    let mut first = true;
    while body.len() + 2 + suffix.len() <= BODY {
        if !first {
            body.push(b',');
        }
        body.push(b'0');
        first = false;
    }
    body.extend_from_slice(suffix.as_bytes());
    let pid = proxy.proc.pid();
    let body = std::sync::Arc::new(body);
    let mut report = Vec::new();
    let mut over = Vec::new();
    for n in [1usize, 2, CONCURRENT] {
        std::fs::write(format!("/proc/{pid}/clear_refs"), "5").unwrap();
        let base = status_bytes(pid, "VmRSS");
        let mut sends = tokio::task::JoinSet::new();
        for _ in 0..n {
            let body = body.clone();
            sends.spawn(async move {
                raw_modern(
                    addr,
                    &body,
                    "mcp-method: tools/call\r\nmcp-name: routed\r\nmcp-param-region: eu\r\n",
                )
                .await
            });
        }
        let statuses = sends.join_all().await;
        let peak = status_bytes(pid, "VmHWM");
        let in_flight = (n * body.len()) as u64;
        let bound = 4 * in_flight + SLACK;
        let grown = peak.saturating_sub(base);
        let line = format!(
            "{n} x 4 MiB: statuses {statuses:?}; RSS {} MiB before, peak +{} MiB; bound +{} MiB",
            base >> 20,
            grown >> 20,
            bound >> 20
        );
        println!("{line}");
        if grown > bound {
            over.push(line.clone());
        }
        report.push(line);
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    assert!(
        over.is_empty(),
        "calls of an x-mcp-header tool with arguments [0,0,…] exceed 4 x the bytes in flight + 48 \
         MiB: {over:#?}\nall: {report:#?}"
    );
    drop(proxy);
}

// ---------------------------------------------------------------------------------------------
// 6. `notifications/cancelled` reaches no request at all, only listens.

/// §11b: "`notifications/cancelled` only reaches the sender's own requests and listens". The face
/// hands a cancellation to the listen hub only (`Hub::close`, src/facade/modern/mod.rs ~363): a
/// caller that cancels its own in-flight `tools/call` (a 3 s `count` on a progress stream) gets
/// every progress notification and the result anyway — nothing is cancelled, upstream or here.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notifications_cancelled_does_not_reach_the_senders_own_request() {
    let up = demo().await;
    let dir = tempfile::tempdir().unwrap();
    let p = start_in_process(&up.sse_url(), dir.path(), |_| {}).await;
    let a = Target::plain(p.addr).via_peer("127.0.0.2");
    let mut msg = call(7, "count", json!({"n": 30, "interval_ms": 100}), false);
    msg["params"]["_meta"]["progressToken"] = json!("p7");
    let mut sse = post(&a, &msg, None).await.sse();
    let first = sse.next().await.expect("a first progress").json();
    assert_eq!(first["method"], "notifications/progress", "{first}");
    let cancel = json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
        "params": {"requestId": 7, "reason": "user",
            "_meta": {"io.modelcontextprotocol/protocolVersion": V}}});
    let r = post(&a, &cancel, None).await;
    assert_eq!(r.status, 202);
    let started = std::time::Instant::now();
    let mut progress = 1;
    let mut last = Value::Null;
    loop {
        match sse.next_within(Duration::from_secs(10)).await {
            Ok(Some(e)) if e.data.is_empty() => continue,
            Ok(Some(e)) => {
                let v = e.json();
                if v["method"] == "notifications/progress" {
                    progress += 1;
                } else {
                    last = v;
                    break;
                }
            }
            Ok(None) | Err(()) => break,
        }
    }
    assert!(
        last.get("result").is_none(),
        "the sender cancelled its own request 7, yet {:?} later it got {progress} of 30 progress \
         notifications and the result: {last}",
        started.elapsed()
    );
    p.stop().await;
}

// ---------------------------------------------------------------------------------------------
// 7. One anonymous address holds the whole body budget: every other POST waits it out.

/// README: "All bodies held at once … fit in `listen.max_body_bytes_in_flight`"; the budget has no
/// per-peer share. One anonymous address sends two 4 MiB bodies all but their last byte and
/// stalls: they hold the whole budget (here 8 MiB) until `listen.body_timeout_secs` (here 10 s;
/// 30 s by default) cuts them. Every other caller's POST — a 200-byte `echo` from another
/// address — waits for room all that time (an attacker refreshing its stalled bodies keeps every
/// POST of the proxy that slow at about 64 MiB per 30 s, ~2 MiB/s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_peer_holds_the_body_budget_and_stalls_every_post() {
    use tokio::io::AsyncWriteExt;
    let up = demo().await;
    let dir = tempfile::tempdir().unwrap();
    let p = start_in_process(&up.sse_url(), dir.path(), |c| {
        c.listen.max_body_bytes_in_flight = 8 << 20;
        c.listen.body_timeout_secs = 10;
    })
    .await;
    let t = Target::plain(p.addr);
    let user = t.via_peer("127.0.0.2");
    // Warm the user's pooled session first, so the measured call only waits for its body.
    let v = answer(
        &user,
        &call(1, "echo", json!({"text": "warm"}), false),
        None,
    )
    .await;
    assert_eq!(v["result"]["content"][0]["text"], "warm", "{v}");
    let mut stalled = Vec::new();
    for _ in 0..2 {
        let sock = tokio::net::TcpSocket::new_v4().unwrap();
        sock.bind("127.0.0.3:0".parse().unwrap()).unwrap();
        let mut s = sock.connect(p.addr).await.unwrap();
        let len = 4 << 20;
        let head = format!(
            "POST /mcp HTTP/1.1\r\nhost: {}\r\ncontent-type: application/json\r\n\
             content-length: {len}\r\n\r\n",
            p.addr
        );
        // Past the address's share of the budget (a quarter, at least one 4 MiB body), the
        // second is refused at once and its connection closed: its writes may fail.
        let _ = s.write_all(head.as_bytes()).await;
        let _ = s.write_all(&vec![b' '; len - 1]).await;
        stalled.push(s);
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let started = std::time::Instant::now();
    let v = answer(&user, &call(2, "echo", json!({"text": "hi"}), false), None).await;
    let took = started.elapsed();
    assert_eq!(v["result"]["content"][0]["text"], "hi", "{v}");
    assert!(
        took < Duration::from_secs(3),
        "a 200-byte echo from 127.0.0.2 took {took:?}: two stalled bodies from 127.0.0.3 hold the \
         whole body budget until listen.body_timeout_secs"
    );
    drop(stalled);
    p.stop().await;
}

// ---------------------------------------------------------------------------------------------
// 8. A flood that keeps its clients attached evicts a lighter owner's idle sessions.

/// README (Floods): "a full proxy evicts from the owner holding the most sessions"; §11b: six
/// made-up values must not evict a real user's idle sessions. `make_room` takes the heaviest
/// owner *that has an idle session*: an attacker whose sessions all have a client attached (held
/// `GET /sse` streams, one connection each) is skipped, and the next owner — a real user with
/// three idle sessions — pays. With `sessions.max_sessions = 6`: the user holds 3 idle, one
/// anonymous address holds 3 attached; each further open of the attacker (weight 4, 5, 6 against
/// the user's 3, 2, 1) evicts one of the user's, until the user has none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attached_flood_evicts_a_lighter_owners_idle_sessions() {
    use support::security::{mcp_call, mcp_init, mcp_post, tool_call};
    let stub =
        StubUpstream::start(|p, _| format!("http://127.0.0.1:{p}/messages?sid={{sid}}")).await;
    let dir = tempfile::tempdir().unwrap();
    let p = start_in_process(&stub.sse_url(), dir.path(), |c| {
        c.sessions.max_sessions = 6;
        c.sessions.unused_ttl_secs = 600;
    })
    .await;
    let t = Target::plain(p.addr);
    let (user, attacker) = (t.via_peer("127.0.0.2"), t.via_peer("127.0.0.3"));
    let a = [("authorization", "Bearer token-A-2b1c5d")];
    let mut mine = Vec::new();
    for _ in 0..3 {
        let s = mcp_init(&user, "2025-11-25", &a).await;
        let done = mcp_call(&user, &s, &a, &tool_call(1, "echo", json!({"text": "use"}))).await;
        assert_eq!(done["result"]["ok"], true, "{done}");
        mine.push(s);
    }
    // The attacker opens 6, each with its stream held: once it outweighs the user, its further
    // opens find no session of an owner as heavy as itself to evict, and are refused.
    let mut held = Vec::new();
    let mut refused_opens = 0;
    for _ in 0..6 {
        let r = attacker
            .send("GET", "/sse", &[("accept", "text/event-stream")], None)
            .await;
        match r.status {
            200 => held.push(r.legacy_sse()),
            503 => refused_opens += 1,
            other => panic!("GET /sse answered {other}"),
        }
    }
    assert_eq!(
        (held.len(), refused_opens),
        (3, 3),
        "the full proxy refuses the flood"
    );
    let mut lost = 0;
    for s in &mine {
        let r = mcp_post(
            &user,
            s,
            &a,
            &tool_call(2, "echo", json!({"text": "alive?"})),
        )
        .await;
        match r.status {
            200 => {
                r.sse().rest().await;
            }
            404 => lost += 1,
            other => panic!("unexpected status {other}"),
        }
    }
    assert_eq!(
        lost, 0,
        "one anonymous address with 6 attached sessions evicted {lost} of the user's 3 idle \
         sessions (it held more, but none idle)"
    );
    drop(held);
    p.stop().await;
}

// ---------------------------------------------------------------------------------------------
// 9. The per-request queues are bounded in messages, not bytes: slow readers of big messages.

/// §11b: "Every queue is bounded … a slow reader gets backpressure or its stream ends loudly,
/// never unbounded RAM"; README: a request's upstream messages (16) and its stream's frames (32)
/// are bounded queues, "the proxy's RSS stays flat" — measured with small progress messages.
/// Counted in messages, each may be up to `upstream.max_event_bytes` (4 MiB by default), parsed
/// as a `Value` in the route queue and encoded again as a frame: about 48 messages held per slow
/// reader. Eight 2026-07-28 callers (eight addresses) each call the demo's `emit` (1 MB log
/// notifications, `logLevel` on) and never read: the proxy binary holds hundreds of MiB, which the
/// README's worst case (connections + the body budget, ≈ 350 MiB) does not count; with the default
/// pool of 64 sessions and 4 MiB events the bound is 64 × 48 × 4 MiB.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_readers_of_big_messages_hold_48_messages_each() {
    use tokio::io::AsyncWriteExt;
    let up = demo().await;
    let dir = tempfile::tempdir().unwrap();
    let proxy = ProxyProc::start(&up.sse_url(), &dir.path().join("data"), &[]).await;
    let addr: std::net::SocketAddr = format!("127.0.0.1:{}", proxy.port).parse().unwrap();
    let pid = proxy.proc.pid();
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5").unwrap();
    let base = status_bytes(pid, "VmRSS");
    let mut readers = Vec::new();
    for i in 0..8 {
        let mut msg = call(i, "emit", json!({"count": 200, "size": 1_000_000}), false);
        msg["params"]["_meta"]["io.modelcontextprotocol/logLevel"] = json!("info");
        let body = msg.to_string();
        let sock = tokio::net::TcpSocket::new_v4().unwrap();
        sock.set_recv_buffer_size(4096).unwrap();
        sock.bind(format!("127.0.0.{}:0", i + 2).parse().unwrap())
            .unwrap();
        let mut s = sock.connect(addr).await.unwrap();
        let head = format!(
            "POST /mcp HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\n\
             accept: application/json, text/event-stream\r\ncontent-length: {}\r\n\
             mcp-protocol-version: {V}\r\nmcp-method: tools/call\r\nmcp-name: emit\r\n\r\n",
            body.len()
        );
        s.write_all(head.as_bytes()).await.unwrap();
        s.write_all(body.as_bytes()).await.unwrap();
        readers.push(s); // never read
    }
    let mut peak = 0;
    for _ in 0..20 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        peak = peak.max(status_bytes(pid, "VmHWM"));
    }
    let grown = peak.saturating_sub(base);
    println!(
        "proxy RSS {} MiB before, peak +{} MiB with 8 slow readers of 1 MB messages",
        base >> 20,
        grown >> 20
    );
    assert!(
        grown < 128 << 20,
        "8 slow readers of 1 MB log messages: the proxy's peak RSS grew by {} MiB (clients sent \
         under 2 KiB each)",
        grown >> 20
    );
    drop(readers);
    drop(proxy);
}
