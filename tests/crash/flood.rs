//! The flood: legacy-face clients that open sessions (`GET /sse`), `initialize`, start `emit`
//! floods (unpaced or thousands per second, never finishing) plus short `emit`s and `echo`s that
//! do finish, and read their stream concurrently, recording every event (id and exact bytes).
//! Some cut their connection and resume mid-flood; some move on to a second session. They keep
//! going until the filesystem is aborted and the proxy is killed under them. With trimming on, a
//! client that falls behind retention has its stream closed, and its resume must be refused
//! `409 cursor_trimmed`; it then leaves that session.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc as sync_mpsc, Arc, Mutex};
use std::time::Duration;

use serde_json::json;
use tokio::sync::mpsc;
use tokio::time::{sleep, Instant};

use super::book::{self, Post, Req, Sess, Stats, V};
use super::procs::Mode;
use super::rng::Rng;
use super::wire::{self, Next, Opened, Posted, SseConn};

/// How long a POST may take before its outcome is "unknown".
const POST_WAIT: Duration = Duration::from_secs(8);
/// How long opening a stream may take.
const HEAD_TIMEOUT: Duration = Duration::from_secs(10);

/// What every client of one cycle shares.
pub struct Ctx {
    /// The proxy.
    pub addr: SocketAddr,
    /// The proxy instance (numbered over the run) and its mode.
    pub inst: u32,
    /// Its mode.
    pub mode: Mode,
    /// The cycle (numbered over the run).
    pub cycle: u32,
    /// Set the moment the filesystem is aborted: failures are expected from then on.
    pub aborted: AtomicBool,
    /// Set once the proxy is dead: clients finish.
    pub stop: AtomicBool,
    /// Counters and violations.
    pub stats: Arc<Mutex<Stats>>,
    /// The proxy trims (retention, eviction): a stream may be closed because its reader fell
    /// behind, and its resume refused `cursor_trimmed`.
    pub trim: bool,
    /// Told of every event a client records (the journal abort waits for one).
    pub delivery: Trigger,
}

/// Reports the next event a client records, once armed: the journal abort comes ~1 ms after a
/// delivery.
#[derive(Default)]
pub struct Trigger {
    armed: AtomicBool,
    tx: Mutex<Option<sync_mpsc::Sender<std::time::Instant>>>,
}

impl Trigger {
    /// The next event recorded is sent on `tx` (with the moment it was recorded).
    pub fn arm(&self, tx: sync_mpsc::Sender<std::time::Instant>) {
        *self.tx.lock().unwrap_or_else(|e| e.into_inner()) = Some(tx);
        self.armed.store(true, Ordering::SeqCst);
    }

    fn delivered(&self) {
        if self.armed.swap(false, Ordering::SeqCst) {
            if let Some(tx) = self.tx.lock().unwrap_or_else(|e| e.into_inner()).take() {
                let _ = tx.send(std::time::Instant::now());
            }
        }
    }
}

impl Ctx {
    fn stats(&self) -> std::sync::MutexGuard<'_, Stats> {
        self.stats.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn aborted(&self) -> bool {
        self.aborted.load(Ordering::SeqCst)
    }

    fn stopped(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }
}

/// One client: one or two sessions, until the proxy dies. Returns what it saw.
pub async fn client(ctx: Arc<Ctx>, mut rng: Rng) -> Vec<Sess> {
    let mut out = Vec::new();
    let mut left = if rng.chance(0.3) { 2 } else { 1 };
    while left > 0 && !ctx.stopped() {
        match open(&ctx).await {
            Some((s, conn)) => {
                left -= 1;
                out.push(drive(&ctx, &mut rng, s, conn, left > 0).await);
            }
            None => sleep(Duration::from_millis(30)).await,
        }
    }
    out
}

/// `GET /sse` and the endpoint event.
async fn open(ctx: &Ctx) -> Option<(Sess, Box<SseConn>)> {
    let mut c = match wire::open_sse(ctx.addr, "/sse", None, HEAD_TIMEOUT).await {
        Opened::Stream(c) => c,
        Opened::Status(st, body) => {
            if !ctx.aborted() {
                ctx.stats().violation(
                    V::Protocol,
                    format!("GET /sse answered {st} before the abort: {body}"),
                );
            }
            return None;
        }
        Opened::Failed => return None,
    };
    let ev = match c.next(Instant::now() + HEAD_TIMEOUT).await {
        Next::Event(ev) => ev,
        _ => return None,
    };
    let ep = String::from_utf8_lossy(&ev.data).into_owned();
    match ep.strip_prefix("/messages?session_id=") {
        Some(sid) if ev.event.as_deref() == Some("endpoint") && ev.id.is_none() => {
            ctx.stats().sessions += 1;
            Some((Sess::new(sid.to_string(), ctx.cycle, ctx.trim), c))
        }
        _ => {
            ctx.stats().violation(
                V::Protocol,
                format!("first event of GET /sse is not an id-less endpoint: {ev:?}"),
            );
            None
        }
    }
}

/// Per connection: the next seq expected and the last epoch, for the live checks.
struct Conn {
    sse: Box<SseConn>,
    expect: u64,
    epoch: u32,
}

type Done = (u64, Posted);

/// Sends a request (the POST runs on its own; its outcome comes back on `done`).
fn request(
    ctx: &Ctx,
    s: &mut Sess,
    done: &mpsc::UnboundedSender<Done>,
    method: &'static str,
    args: serde_json::Value,
) {
    let id = s.next_id;
    s.next_id += 1;
    let body = if method == "initialize" {
        json!({"jsonrpc":"2.0","id":id,"method":"initialize","params":{"protocolVersion":"2024-11-05","capabilities":{},"clientInfo":{"name":"crash","version":"0"}}})
    } else {
        json!({"jsonrpc":"2.0","id":id,"method":"tools/call","params":{"name":method,"arguments":args}})
    };
    s.reqs.insert(
        id,
        Req {
            method,
            post: Post::Pending,
            mode: ctx.mode,
        },
    );
    ctx.stats().requests += 1;
    let (addr, path, done) = (
        ctx.addr,
        format!("/messages?session_id={}", s.sid),
        done.clone(),
    );
    tokio::spawn(async move {
        let r = wire::post(addr, &path, body.to_string().as_bytes(), POST_WAIT).await;
        let _ = done.send((id, r));
    });
}

fn posted(ctx: &Ctx, s: &mut Sess, id: u64, r: Posted) {
    let post = match r {
        Posted::Status(202, _) => Post::Accepted {
            wall_ns: book::wall_ns(),
        },
        Posted::Status(st, body) => {
            if !ctx.aborted() {
                ctx.stats().violation(
                    V::Protocol,
                    format!(
                        "session {}: POST of request {id} answered {st} before the abort: {body}",
                        s.short()
                    ),
                );
            }
            Post::Status(st)
        }
        Posted::NotSent => Post::NotSent,
        Posted::Unknown => Post::Unknown,
    };
    if let Some(r) = s.reqs.get_mut(&id) {
        r.post = post;
    }
}

/// Handles one event of a stream: the live checks (contiguous ids, this session's), then records it.
fn on_event(ctx: &Ctx, s: &mut Sess, c: &mut Conn, ev: wire::SseEvent) {
    let mut st = ctx.stats();
    if ctx.aborted() {
        st.events_read_after_abort += 1;
    }
    let parsed = ev.id.as_deref().and_then(book::parse_cursor);
    let Some((sid, id)) = parsed.filter(|(sid, _)| *sid == s.sid) else {
        st.violation(
            V::Protocol,
            format!(
                "session {}: event without a valid id of this session: id={:?} event={:?} data={}",
                s.short(),
                ev.id,
                ev.event,
                book::snip(&ev.data)
            ),
        );
        return;
    };
    debug_assert_eq!(sid, s.sid);
    if id.1 != c.expect || id.0 < c.epoch {
        let v = if id.1 > c.expect && id.0 >= c.epoch {
            V::SilentGap
        } else {
            V::Duplicate
        };
        st.violation(
            v,
            format!(
                "session {} (live, instance {} {}): expected seq {} (epoch >= {}), got {}",
                s.short(),
                ctx.inst,
                ctx.mode.as_str(),
                c.expect,
                c.epoch,
                book::cursor(&s.sid, id)
            ),
        );
    }
    c.expect = id.1 + 1;
    c.epoch = c.epoch.max(id.0);
    s.record(&mut st, id, &ev.data, ctx.inst, ctx.mode);
    drop(st);
    ctx.delivery.delivered();
}

/// Runs one session until the proxy dies (or, when `more` is set, until the client moves on to
/// another session at a random moment, leaving this one live).
async fn drive(ctx: &Ctx, rng: &mut Rng, mut s: Sess, first: Box<SseConn>, more: bool) -> Sess {
    let (tx, mut rx) = mpsc::unbounded_channel::<Done>();
    let mut conn = Some(Conn {
        sse: first,
        expect: 1,
        epoch: 1,
    });
    request(ctx, &mut s, &tx, "initialize", json!({}));
    let start = Instant::now();
    let switch_at = more.then(|| start + rng.ms(300, 1500));
    let mut cut_at = rng.chance(0.35).then(|| start + rng.ms(150, 1500));
    let mut flooding = false;
    let mut next_echo = start + rng.ms(20, 200);
    let mut next_small = start + rng.ms(100, 600);
    loop {
        while let Ok((id, r)) = rx.try_recv() {
            posted(ctx, &mut s, id, r);
        }
        let now = Instant::now();
        if switch_at.is_some_and(|t| now >= t) || ctx.stopped() {
            break;
        }
        if !flooding && s.answers.contains_key(&1) {
            flooding = true;
            let note = json!({"jsonrpc":"2.0","method":"notifications/initialized"});
            let path = format!("/messages?session_id={}", s.sid);
            let _ = wire::post(ctx.addr, &path, note.to_string().as_bytes(), POST_WAIT).await;
            for _ in 0..rng.range(1, 2) {
                // Never finishes: the flood runs until the abort.
                let rate = if rng.chance(0.5) {
                    0
                } else {
                    rng.range(2000, 20000)
                };
                let args = json!({"count": 100_000_000u64, "rate_per_sec": rate, "size": rng.range(0, 400)});
                request(ctx, &mut s, &tx, "emit", args);
            }
        }
        if flooding && !ctx.aborted() {
            if now >= next_echo {
                next_echo = now + rng.ms(20, 250);
                for _ in 0..rng.range(1, 3) {
                    let args = json!({"text": format!("echo {}", rng.next_u64())});
                    request(ctx, &mut s, &tx, "echo", args);
                }
            }
            if now >= next_small {
                next_small = now + rng.ms(200, 900);
                let args = json!({"count": rng.range(5, 200), "rate_per_sec": 0, "size": rng.range(0, 100)});
                request(ctx, &mut s, &tx, "emit", args);
            }
        }
        let Some(c) = conn.as_mut() else {
            // Resume with the last cursor (cut below, or the stream ended before the abort).
            let Some(last) = s.last else { break };
            match wire::open_sse(
                ctx.addr,
                "/sse",
                Some(&book::cursor(&s.sid, last)),
                HEAD_TIMEOUT,
            )
            .await
            {
                Opened::Stream(mut sse) => match sse.next(Instant::now() + HEAD_TIMEOUT).await {
                    Next::Event(ev)
                        if ev.event.as_deref() == Some("endpoint") && ev.id.is_none() =>
                    {
                        conn = Some(Conn {
                            sse,
                            expect: last.1 + 1,
                            epoch: last.0,
                        });
                    }
                    _ => {
                        if !ctx.aborted() {
                            ctx.stats().violation(
                                V::Protocol,
                                format!("session {}: mid-flood resume did not start with the endpoint event", s.short()),
                            );
                        }
                        break;
                    }
                },
                Opened::Status(409, body) if ctx.trim && body.contains("\"cursor_trimmed\"") => {
                    // It fell behind retention: refused, never skipped. A fresh stream would be
                    // a new session; the client leaves this one (the oracle resumes it later).
                    ctx.stats().flood_trimmed += 1;
                    break;
                }
                Opened::Status(st, body) => {
                    if !ctx.aborted() {
                        ctx.stats().violation(
                            V::Protocol,
                            format!(
                                "session {}: mid-flood resume from {} answered {st}: {body}",
                                s.short(),
                                book::cursor(&s.sid, last)
                            ),
                        );
                    }
                    break;
                }
                Opened::Failed => break,
            }
            continue;
        };
        match c.sse.next(now + Duration::from_millis(20)).await {
            Next::Event(ev) if ev.event.as_deref() == Some("message") => {
                on_event(ctx, &mut s, c, ev);
            }
            Next::Event(ev) => {
                ctx.stats().violation(
                    V::Protocol,
                    format!("session {}: unexpected event mid-stream: {ev:?}", s.short()),
                );
            }
            Next::Comment | Next::Timeout => {}
            Next::End | Next::Cut { .. } => {
                if ctx.aborted() {
                    break;
                }
                if ctx.trim {
                    // Closed because it fell behind retention (the resume must then be
                    // refused), or for no reason (then the resume continues it exactly).
                    conn = None;
                    continue;
                }
                ctx.stats().violation(
                    V::Protocol,
                    format!(
                        "session {}: the stream ended before the abort (last {:?})",
                        s.short(),
                        s.last
                    ),
                );
                conn = None;
            }
        }
        if cut_at.is_some_and(|t| Instant::now() >= t) && s.last.is_some() {
            // The client drops its connection and resumes at once with its last cursor.
            cut_at = None;
            conn = None;
        }
    }
    drop(conn);
    // Settle the POSTs still on their way (they fail fast once the proxy is dead).
    let deadline = Instant::now() + POST_WAIT + Duration::from_secs(2);
    while s.reqs.values().any(|r| r.post == Post::Pending) {
        match tokio::time::timeout_at(deadline, rx.recv()).await {
            Ok(Some((id, r))) => posted(ctx, &mut s, id, r),
            _ => break,
        }
    }
    s
}
