//! Since: the risk the fourth probe names is closed (a shared event is counted as soon as its
//! frame is queued, `Pack::count`), and `send_all`'s room is carried by its last item (held until
//! the reader has taken the whole frame, so a second large payload waits for the first).
//!
//! Adversarial review 22 of `22b8f13` (frames by `encode::message_into`, ids by
//! `Cursor::write_id`) and `ff913ad` + `5612adc` (a one-line payload of >= 64 KiB goes to the
//! connection as its own `Bytes` between a head and a tail, queued together by
//! `queue::Tx::send_all`, counted as delivered with the next pack send, `Pack.force`).
//!
//! Probes (all over loopback sockets against the proxy in process, the demo upstream or a raw stub):
//! - `adv22_legacy_frames_around_64k_byte_exact_live_and_replayed`: payloads of exactly 64 KiB - 1,
//!   64 KiB, 64 KiB + 1, tiny, 128 KiB, 1 MiB mixed on one legacy stream: the raw bytes after the
//!   `endpoint` event are exactly `id: ..\nevent: message\ndata: <payload>\n\n` per event, ids
//!   consecutive, payload sizes exact; a replay from the first id and a resume from the middle
//!   give byte-identical frames / exactly the events after the cursor.
//! - `adv22_streamable_post_ends_on_a_large_final`: a Streamable HTTP POST (2025-11-25 with
//!   priming, and a 2025-03-26 batch of two) whose responses are >= 64 KiB one-line payloads: the
//!   POST stream ends right after them, byte-exact (priming frame, response frames, nothing else).
//! - `adv22_multiline_large_payloads_are_split_not_shared`: a raw stub upstream sends >= 64 KiB
//!   payloads with LF joins (multi-`data:` events, LF and CRLF line endings) and one-line ones:
//!   the client gets one `data:` line per payload line, byte-exact, in order.
//! - `adv22_takeover_while_stalled_after_shared_frames_delivers_each_once`: an identity-bound
//!   Streamable session's standalone stream, client A stalled (4 KiB receive buffer, reads
//!   nothing): emits P (12 MiB), L (1 MiB), s (tiny), one call each. A plain GET by the same
//!   identity takes the stream over (it starts after the attachment position); A then reads what
//!   its connection still had. Across A and B every emit exactly once, in order. HELD (A got P, L;
//!   B got s): L ends its read batch, so its `Pack.force` is spent by the batch's last (empty)
//!   pack send at once. Not reached here, and left as a risk: a shared event followed in the SAME
//!   batch by a packed event whose pack send is then cut by a kick/drain is queued to the
//!   connection but never counted (src/stream.rs:328 sets `force`; the counting send at
//!   :311/:346/:354 -> :394 returns `Err(Kicked)` first), so a plain GET after the takeover would
//!   start at it again (a duplicate); before ff913ad a pack was counted exactly when queued.
//! - `adv22_drain_while_a_large_frame_waits_ends_between_frames_and_resumes_exactly`: a stalled
//!   legacy client of 1 MiB events, the proxy stopped (drain) while a large frame waits for room:
//!   the client's bytes end on a frame boundary with consecutive ids, and a resume on a restarted
//!   proxy from its last id delivers exactly the rest of the log.

mod support;

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use mcp_resume_proxy::demo::upstream::{Upstream, UpstreamOptions};
use serde_json::{json, Value};
use support::*;

const KIB: usize = 1024;
const MIB: usize = 1 << 20;

const EMIT_PREFIX: &str = r#"{"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info","logger":"emit","data":{"seq":"#;

/// The pad that makes the demo's emit payload of emit seq `seq` exactly `target` bytes (its
/// `t_ns` has 19 digits).
fn pad_for(seq: u64, target: usize) -> usize {
    let overhead = EMIT_PREFIX.len()
        + seq.to_string().len()
        + r#","t_ns":"#.len()
        + 19
        + r#","pad":""#.len()
        + r#""}}}"#.len();
    target - overhead
}

fn frame(id: &str, data: &[u8]) -> Vec<u8> {
    let mut f = format!("id: {id}\nevent: message\ndata: ").into_bytes();
    f.extend_from_slice(data);
    f.extend_from_slice(b"\n\n");
    f
}

fn relaxed(c: &mut mcp_resume_proxy::config::Config) {
    c.log.durability = mcp_resume_proxy::config::Durability::Relaxed;
    c.sessions.keepalive_secs = 3600;
}

/// Reads `sse` up to and including the response to request `id`; returns every event read.
async fn until_response(sse: &mut Sse, id: u64) -> Vec<Ev> {
    let mut out = Vec::new();
    loop {
        let ev = tokio::time::timeout(Duration::from_secs(30), sse.next())
            .await
            .expect("events in time")
            .expect("stream open");
        let done = !ev.is_priming() && ev.json()["id"] == id;
        out.push(ev);
        if done {
            return out;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adv22_legacy_frames_around_64k_byte_exact_live_and_replayed() {
    let up = Upstream::spawn(UpstreamOptions::default()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let p = start_in_process(&up.sse_url(), dir.path(), relaxed).await;
    let base = format!("http://{}", p.addr);
    let (mut sse, url, first) = legacy_session(&base).await;
    let start = sse.raw.len();
    let targets = [
        64 * KIB - 1,
        64 * KIB,
        64 * KIB + 1,
        300,
        128 * KIB,
        64 * KIB,
        64 * KIB,
        200,
        MIB,
        64 * KIB - 1,
        64 * KIB,
    ];
    let mut got = Vec::new();
    for (k, t) in targets.iter().enumerate() {
        let seq = k as u64 + 1;
        let id = 10 + k as u64;
        let c = call(
            id,
            "emit",
            json!({"count": 1, "rate_per_sec": 0, "size": pad_for(seq, *t)}),
            None,
        );
        assert_eq!(post(&url, &c).await.0, 202);
        got.extend(until_response(&mut sse, id).await);
    }
    // Exactly the frames of the events, nothing between or around them.
    let live = sse.raw[start..].to_vec();
    let want: Vec<u8> = got
        .iter()
        .flat_map(|e| frame(e.id.as_deref().unwrap(), &e.data))
        .collect();
    assert!(live == want, "live bytes differ from the events' frames");
    // Consecutive ids after the first, sizes exact.
    let mut prev = seq_of(&first);
    let mut sizes = Vec::new();
    for e in &got {
        assert_eq!(e.event.as_deref(), Some("message"));
        assert_eq!(e.seq(), prev + 1, "ids consecutive");
        prev = e.seq();
        let m = e.json();
        if m["method"] == "notifications/message" {
            assert_eq!(m["params"]["data"]["seq"], sizes.len() as u64 + 1);
            sizes.push(e.data.len());
        }
    }
    assert_eq!(sizes, targets.to_vec(), "payload sizes exact");
    // Replay from the first id: byte-identical.
    let (mut all, err) = Sse::get(&format!("{base}/sse"), &[("last-event-id", &first)]).await;
    assert!(err.is_none(), "{err:?}");
    all.endpoint().await;
    let s0 = all.raw.len();
    let last = 10 + targets.len() as u64 - 1;
    until_response(&mut all, last).await;
    assert!(all.raw[s0..] == live[..], "replay differs from live");
    all.cut();
    // Resume from every event: exactly the ones after it.
    for (i, e) in got.iter().enumerate() {
        let (mut r, err) = Sse::get(
            &format!("{base}/sse"),
            &[("last-event-id", e.id.as_deref().unwrap())],
        )
        .await;
        assert!(err.is_none(), "{err:?}");
        r.endpoint().await;
        let s0 = r.raw.len();
        if i + 1 < got.len() {
            until_response(&mut r, last).await;
        }
        let rest: Vec<u8> = got[i + 1..]
            .iter()
            .flat_map(|e| frame(e.id.as_deref().unwrap(), &e.data))
            .collect();
        assert!(r.raw[s0..] == rest[..], "resume after event {i} differs");
        r.cut();
    }
    sse.cut();
    p.stop().await;
}

// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adv22_streamable_post_ends_on_a_large_final() {
    use support::streamable::Client;
    let up = Upstream::spawn(UpstreamOptions::default()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let p = start_in_process(&up.sse_url(), dir.path(), relaxed).await;
    for (version, text_len) in [
        ("2025-11-25", 64 * KIB),
        ("2025-11-25", 70 * KIB),
        ("2025-06-18", 300 * KIB),
    ] {
        let (mut c, _) = Client::init(p.addr, version).await;
        let text = "y".repeat(text_len);
        let (id, mut s) = c.call("echo", json!({"text": text}), "tok").await;
        let evs = tokio::time::timeout(Duration::from_secs(20), s.rest())
            .await
            .expect("the POST stream ends after its large response");
        let msgs: Vec<&Ev> = evs.iter().filter(|e| !e.is_priming()).collect();
        assert_eq!(msgs.len(), 1, "{version}: one response");
        let m = msgs[0].json();
        assert_eq!(m["id"], id);
        assert_eq!(m["result"]["content"][0]["text"], text.as_str());
        assert!(msgs[0].data.len() >= 64 * KIB);
        let mut want = Vec::new();
        for e in &evs {
            if e.is_priming() {
                want.extend_from_slice(
                    format!("id: {}\nretry: 1000\ndata: \n\n", e.id.as_deref().unwrap()).as_bytes(),
                );
            } else {
                want.extend(frame(e.id.as_deref().unwrap(), &e.data));
            }
        }
        assert!(
            s.raw == want,
            "{version}: POST stream bytes are not exactly its frames"
        );
    }
    // A 2025-03-26 batch of two large echoes: the stream ends after both responses.
    let (c, _) = Client::init(p.addr, "2025-03-26").await;
    let (a, b) = ("a".repeat(100 * KIB), "b".repeat(64 * KIB));
    let batch = json!([
        {"jsonrpc":"2.0","id":101,"method":"tools/call","params":{"name":"echo","arguments":{"text":a}}},
        {"jsonrpc":"2.0","id":102,"method":"tools/call","params":{"name":"echo","arguments":{"text":b}}}
    ]);
    let r = c.post(&batch).await;
    assert_eq!(r.status, 200);
    let mut s = r.sse();
    let evs = tokio::time::timeout(Duration::from_secs(20), s.rest())
        .await
        .expect("the batch stream ends");
    let mut ids: Vec<u64> = evs
        .iter()
        .filter(|e| !e.is_priming())
        .map(|e| e.json()["id"].as_u64().unwrap())
        .collect();
    ids.sort();
    assert_eq!(ids, vec![101, 102]);
    let want: Vec<u8> = evs
        .iter()
        .flat_map(|e| frame(e.id.as_deref().unwrap(), &e.data))
        .collect();
    assert!(
        s.raw == want,
        "batch stream bytes are not exactly its frames"
    );
    p.stop().await;
}

// ---------------------------------------------------------------------------------------------

/// A legacy upstream stub: answers `GET /sse` with an endpoint event and then `frames` as they
/// are (raw SSE bytes), then holds the stream open; answers any POST 202.
async fn raw_upstream(frames: Vec<Vec<u8>>) -> (u16, tokio::task::JoinHandle<()>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let l = tokio::net::TcpListener::bind(("127.0.0.1", port()))
        .await
        .unwrap();
    let p = l.local_addr().unwrap().port();
    let task = tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            let frames = frames.clone();
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut b = [0u8; 4096];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    let Ok(n) = s.read(&mut b).await else { return };
                    if n == 0 {
                        return;
                    }
                    head.extend_from_slice(&b[..n]);
                }
                if head.starts_with(b"GET") {
                    let _ = s
                        .write_all(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n\r\nevent: endpoint\ndata: /messages?session_id=stub\n\n")
                        .await;
                    for f in frames {
                        let _ = s.write_all(&f).await;
                    }
                    tokio::time::sleep(Duration::from_secs(3600)).await;
                } else {
                    let _ = s
                        .write_all(b"HTTP/1.1 202 Accepted\r\ncontent-length: 8\r\n\r\nAccepted")
                        .await;
                }
            });
        }
    });
    (p, task)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adv22_multiline_large_payloads_are_split_not_shared() {
    let big = |c: char, n: usize| c.to_string().repeat(n);
    // Payloads (as the proxy logs them: SSE data lines joined with LF).
    let p1 = format!(
        "{{\"jsonrpc\":\"2.0\",\"method\":\"notifications/message\",\"params\":{{\"a\":\"{}\",\n\"b\":\"{}\"}}}}",
        big('x', 40 * KIB),
        big('y', 40 * KIB)
    );
    let p2 = format!(
        "{{\"jsonrpc\":\"2.0\",\"method\":\"notifications/message\",\"params\":{{\"c\":\"{}\"}}}}",
        big('z', 64 * KIB)
    );
    let p3 = format!(
        "{{\"jsonrpc\":\"2.0\",\n\"method\":\"notifications/message\",\n\"params\":{{\"d\":\"{}\"}}\n}}",
        big('w', 70 * KIB)
    );
    let p4 = format!(
        "{{\"jsonrpc\":\"2.0\",\"method\":\"notifications/message\",\"params\":{{\"e\":\"{}\"}}}}",
        big('v', 10)
    );
    // p1 sent with LF endings, p2 one line, p3 with CRLF endings, p4 tiny.
    let as_sse = |p: &str, eol: &str| -> Vec<u8> {
        let mut s = String::from("event: message");
        s.push_str(eol);
        for line in p.split('\n') {
            s.push_str("data: ");
            s.push_str(line);
            s.push_str(eol);
        }
        s.push_str(eol);
        s.into_bytes()
    };
    let frames = vec![
        as_sse(&p1, "\n"),
        as_sse(&p2, "\n"),
        as_sse(&p3, "\r\n"),
        as_sse(&p4, "\n"),
        as_sse(&p2, "\r\n"),
    ];
    let (port, _stub) = raw_upstream(frames).await;
    let dir = tempfile::tempdir().unwrap();
    let p = start_in_process(&format!("http://127.0.0.1:{port}/sse"), dir.path(), relaxed).await;
    let base = format!("http://{}", p.addr);
    let (mut sse, err) = Sse::get(&format!("{base}/sse"), &[]).await;
    assert!(err.is_none(), "{err:?}");
    sse.endpoint().await;
    let s0 = sse.raw.len();
    let mut evs = Vec::new();
    for _ in 0..5 {
        evs.push(sse.next().await.expect("event"));
    }
    let payloads = [&p1, &p2, &p3, &p4, &p2];
    let mut want = Vec::new();
    for (e, p) in evs.iter().zip(payloads) {
        assert_eq!(e.text(), p.as_str(), "payload joined with LF as logged");
        want.extend_from_slice(
            format!("id: {}\nevent: message\n", e.id.as_deref().unwrap()).as_bytes(),
        );
        for line in p.split('\n') {
            want.extend_from_slice(b"data: ");
            want.extend_from_slice(line.as_bytes());
            want.push(b'\n');
        }
        want.push(b'\n');
    }
    let ids: Vec<u64> = evs.iter().map(|e| e.seq()).collect();
    assert!(ids.windows(2).all(|w| w[1] == w[0] + 1), "{ids:?}");
    assert!(
        sse.raw[s0..] == want[..],
        "frames of multi-line payloads not byte-exact"
    );
    sse.cut();
    p.stop().await;
}

// ---------------------------------------------------------------------------------------------

/// A request on a connection whose receive buffer is `rcvbuf` bytes; the body is not read until
/// the caller polls it.
async fn stalled_request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    rcvbuf: u32,
) -> (u16, Incoming) {
    let sock = tokio::net::TcpSocket::new_v4().unwrap();
    sock.set_recv_buffer_size(rcvbuf).unwrap();
    let tcp = sock.connect(addr).await.unwrap();
    let (mut tx, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .unwrap();
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let mut req = http::Request::builder()
        .method(method)
        .uri(path)
        .header("host", addr.to_string());
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = tx
        .send_request(req.body(Full::new(Bytes::new())).unwrap())
        .await
        .unwrap();
    let status = resp.status().as_u16();
    (status, resp.into_body())
}

/// Reads `body` to its end (within `d`); returns the bytes.
async fn drain_body(mut body: Incoming, d: Duration) -> Vec<u8> {
    let mut out = Vec::new();
    let _ = tokio::time::timeout(d, async {
        while let Some(f) = body.frame().await {
            let Ok(f) = f else { break };
            if let Ok(b) = f.into_data() {
                out.extend_from_slice(&b);
            }
        }
    })
    .await;
    out
}

fn parse(raw: &[u8]) -> Vec<Ev> {
    let mut p = support::sse::Parser::new();
    p.feed(raw)
}

/// The emit seqs of the `emit` notifications among `evs`, with their pad length.
fn emits(evs: &[Ev]) -> Vec<(u64, usize)> {
    evs.iter()
        .filter(|e| !e.is_priming())
        .filter_map(|e| {
            let m: Value = serde_json::from_slice(&e.data).ok()?;
            (m["params"]["logger"] == "emit").then(|| {
                (
                    m["params"]["data"]["seq"].as_u64().unwrap(),
                    m["params"]["data"]["pad"].as_str().unwrap().len(),
                )
            })
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adv22_takeover_while_stalled_after_shared_frames_delivers_each_once() {
    let up = Upstream::spawn(UpstreamOptions::default()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let p = start_in_process(&up.sse_url(), dir.path(), |c| {
        relaxed(c);
        c.upstream.max_event_bytes = 20 * MIB;
    })
    .await;
    let admin = format!("http://{}/metrics", p.admin_addr);
    let auth = ("authorization", "Bearer adv22-user");
    // An identity-bound session (a plain GET of the same identity takes the stream over).
    let init = json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{
        "protocolVersion": "2025-03-26", "capabilities": {}, "clientInfo": {"name":"adv22","version":"0"}}});
    let r = send(
        p.addr,
        "POST",
        "/mcp",
        &[
            ("accept", "application/json, text/event-stream"),
            ("content-type", "application/json"),
            auth,
        ],
        Some(&init.to_string()),
    )
    .await;
    assert_eq!(r.status, 200);
    let sid = r.header("mcp-session-id").unwrap();
    let _ = r.sse().rest().await;
    let h = |extra: &[(&'static str, &'static str)]| {
        let mut v: Vec<(String, String)> = vec![
            ("mcp-session-id".into(), sid.clone()),
            ("mcp-protocol-version".into(), "2025-03-26".into()),
            (auth.0.into(), auth.1.into()),
        ];
        v.extend(extra.iter().map(|(a, b)| (a.to_string(), b.to_string())));
        v
    };
    let post_json = |msg: Value| {
        let hs = h(&[
            ("accept", "application/json, text/event-stream"),
            ("content-type", "application/json"),
        ]);
        let addr = p.addr;
        async move {
            let hv: Vec<(&str, &str)> = hs.iter().map(|(a, b)| (a.as_str(), b.as_str())).collect();
            send(addr, "POST", "/mcp", &hv, Some(&msg.to_string())).await
        }
    };
    assert_eq!(
        post_json(json!({"jsonrpc":"2.0","method":"notifications/initialized"}))
            .await
            .status,
        202
    );
    // A: the standalone stream, on a connection that reads nothing.
    let get_h = h(&[("accept", "text/event-stream")]);
    let get_hv: Vec<(&str, &str)> = get_h
        .iter()
        .map(|(a, b)| (a.as_str(), b.as_str()))
        .collect();
    let (status, body_a) = stalled_request(p.addr, "GET", "/mcp", &get_hv, 4096).await;
    assert_eq!(status, 200);
    let logged0 = metric(&admin, "mcp_resume_events_logged_total").await;
    // P (12 MiB) and L (1 MiB), then s (tiny), all on the standalone stream.
    for (id, count, size) in [(5u64, 1u64, 12 * MIB), (6, 1, MIB), (7, 1, 10)] {
        let r = post_json(json!({"jsonrpc":"2.0","id":id,"method":"tools/call",
            "params":{"name":"emit","arguments":{"count":count,"rate_per_sec":0,"size":size}}}))
        .await;
        assert_eq!(r.status, 200);
        let _ = r.sse().rest().await;
    }
    // 3 notifications + 3 responses logged; let the stream's task get as far as it can.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    while metric(&admin, "mcp_resume_events_logged_total").await - logged0 < 6.0 {
        assert!(tokio::time::Instant::now() < deadline, "events not logged");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(800)).await;
    // B: a plain GET of the same identity takes the stream over.
    let b = send(p.addr, "GET", "/mcp", &get_hv, None).await;
    assert_eq!(b.status, 200);
    let mut b = b.sse();
    // A reads again: what its connection still had (its stream ended by the takeover).
    let raw_a = drain_body(body_a, Duration::from_secs(20)).await;
    let a_emits = emits(&parse(&raw_a));
    // B: until the tiny event.
    let mut b_evs = Vec::new();
    while let Ok(Some(e)) = b.next_within(Duration::from_secs(10)).await {
        let done = emits(std::slice::from_ref(&e)).iter().any(|(s, _)| *s == 3);
        b_evs.push(e);
        if done {
            break;
        }
    }
    let b_emits = emits(&b_evs);
    let a_seqs: Vec<u64> = a_emits.iter().map(|x| x.0).collect();
    let b_seqs: Vec<u64> = b_emits.iter().map(|x| x.0).collect();
    eprintln!("A received emits {a_seqs:?}; B received {b_seqs:?}");
    let mut union = a_seqs.clone();
    union.extend(&b_seqs);
    assert_eq!(
        union,
        vec![1, 2, 3],
        "across the takeover every event exactly once, in order: A got {a_seqs:?}, B got {b_seqs:?}"
    );
    b.cut();
    p.stop().await;
}

// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adv22_drain_while_a_large_frame_waits_ends_between_frames_and_resumes_exactly() {
    let up = Upstream::spawn(UpstreamOptions::default()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let p = start_in_process(&up.sse_url(), dir.path(), |c| {
        relaxed(c);
        c.shutdown.grace_secs = 2;
    })
    .await;
    let admin = format!("http://{}/metrics", p.admin_addr);
    let (status, body) = stalled_request(
        p.addr,
        "GET",
        "/sse",
        &[("accept", "text/event-stream")],
        4096,
    )
    .await;
    assert_eq!(status, 200);
    // The endpoint event: read it from the first frame (the connection stays unread after).
    let mut body = body;
    let mut raw = Vec::new();
    while !raw.windows(2).any(|w| w == b"\n\n") {
        let f = body.frame().await.unwrap().unwrap();
        raw.extend_from_slice(&f.into_data().unwrap());
    }
    let text = String::from_utf8_lossy(&raw).to_string();
    let ep = text
        .lines()
        .find_map(|l| l.strip_prefix("data: "))
        .unwrap()
        .to_string();
    let url = format!("http://{}{ep}", p.addr);
    assert_eq!(post(&url, &initialize(1)).await.0, 202);
    let logged0 = metric(&admin, "mcp_resume_events_logged_total").await;
    assert_eq!(
        post(
            &url,
            &call(
                2,
                "emit",
                json!({"count": 24, "rate_per_sec": 0, "size": MIB}),
                None
            )
        )
        .await
        .0,
        202
    );
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while metric(&admin, "mcp_resume_events_logged_total").await - logged0 < 25.0 {
        assert!(tokio::time::Instant::now() < deadline, "events not logged");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    // Drain while the stalled client's stream waits for room; read concurrently once stopping.
    let reader = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        drain_body(body, Duration::from_secs(30)).await
    });
    p.stop().await;
    raw.extend(reader.await.unwrap());
    let evs = parse(&raw);
    // The bytes end on a frame boundary (nothing partial) and the events are consecutive.
    assert!(raw.ends_with(b"\n\n"), "stream ends inside a frame");
    let msgs: Vec<&Ev> = evs.iter().filter(|e| e.id.is_some()).collect();
    assert!(!msgs.is_empty());
    let seqs: Vec<u64> = msgs.iter().map(|e| e.seq()).collect();
    assert!(seqs.windows(2).all(|w| w[1] == w[0] + 1), "{seqs:?}");
    let last_id = msgs.last().unwrap().id.clone().unwrap();
    let got_emits = emits(&evs);
    let n = got_emits.len() as u64;
    assert!(got_emits
        .iter()
        .enumerate()
        .all(|(i, (s, pad))| *s == i as u64 + 1 && *pad == MIB));
    eprintln!("drained client got {n} of 24 emits, last id {last_id}");
    // Restart on the same data dir and resume from the last id: exactly the rest.
    let p2 = start_in_process(&up.sse_url(), dir.path(), relaxed).await;
    let (mut r, err) = Sse::get(
        &format!("http://{}/sse", p2.addr),
        &[("last-event-id", &last_id)],
    )
    .await;
    assert!(err.is_none(), "resume refused: {err:?}");
    r.endpoint().await;
    let rest = tokio::time::timeout(Duration::from_secs(30), r.rest())
        .await
        .expect("the rest in time");
    let rest_seqs: Vec<u64> = rest
        .iter()
        .filter(|e| e.id.is_some())
        .map(|e| e.seq())
        .collect();
    assert_eq!(
        rest_seqs.first().copied(),
        Some(seq_of(&last_id) + 1),
        "{rest_seqs:?}"
    );
    assert!(
        rest_seqs.windows(2).all(|w| w[1] == w[0] + 1),
        "{rest_seqs:?}"
    );
    let rest_emits: Vec<u64> = emits(&rest).iter().map(|x| x.0).collect();
    assert_eq!(rest_emits, (n + 1..=24).collect::<Vec<_>>());
    p2.stop().await;
}
