//! A client worker: opens legacy sessions through the proxy, runs `emit` calls (and some `echo`s)
//! on them, cuts its own connections at random bytes and times, pauses, resumes with its cursor
//! (sometimes a stale one), and opens a new session when the old one is gone or refused — as a
//! well-behaved client would.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tokio::sync::mpsc;
use tokio::time::{sleep, Instant};

use super::oracle::{ConnState, Req, ReqState, Sess, Shared, Violation};
use super::rng::Rng;
use super::wire::{self, Next, Opened, Posted, SseConn};

const HEAD_TIMEOUT: Duration = Duration::from_secs(15);
const POST_WAIT: Duration = Duration::from_secs(20);

struct Conn {
    sse: Box<SseConn>,
    st: ConnState,
    cut_at: Option<Instant>,
}

/// Share of `emit` calls sent unpaced: `CHAOS_UNPACED` (0..1), default 0.1.
fn unpaced_share() -> f64 {
    std::env::var("CHAOS_UNPACED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.1)
}

/// Runs sessions until the run winds down.
pub async fn worker(sh: Arc<Shared>, w: u64) {
    let mut rng = Rng::fork(sh.seed, 1000 + w);
    sleep(rng.ms(0, 500)).await;
    while !sh.stopping() {
        match open(&sh, &mut rng).await {
            Some((s, c)) => session(&sh, &mut rng, s, c).await,
            None => sleep(rng.ms(100, 300)).await,
        }
    }
}

async fn open(sh: &Shared, rng: &mut Rng) -> Option<(Sess, Conn)> {
    let mut c = match wire::open_sse(sh.addr, "/sse", None, HEAD_TIMEOUT).await {
        Opened::Stream(c) => c,
        Opened::Status(st, body) => {
            sh.stats().open_failed += 1;
            if st != 502 && st != 503 && st != 504 {
                sh.violation(
                    Violation::Protocol,
                    format!("GET /sse answered {st}: {body}"),
                );
            }
            return None;
        }
        Opened::Failed => {
            sh.stats().open_failed += 1;
            return None;
        }
    };
    let ev = match c.next(Instant::now() + HEAD_TIMEOUT).await {
        Next::Event(ev) => ev,
        _ => {
            sh.stats().open_failed += 1;
            return None;
        }
    };
    let ep = String::from_utf8_lossy(&ev.data).into_owned();
    let sid = ep.strip_prefix("/messages?session_id=").map(str::to_owned);
    match sid {
        Some(sid) if ev.event.as_deref() == Some("endpoint") && ev.id.is_none() => {
            sh.stats().sessions += 1;
            let s = Sess::new(sid);
            let cut_at = Some(Instant::now() + rng.ms(1000, 4000));
            Some((
                s,
                Conn {
                    sse: c,
                    st: ConnState::new(None),
                    cut_at,
                },
            ))
        }
        _ => {
            sh.violation(
                Violation::Protocol,
                format!("first event of GET /sse is not an id-less endpoint: {ev:?}"),
            );
            None
        }
    }
}

/// Sets how a new connection will be cut: at a random byte of the body (usually mid-event), or
/// after a random time, whichever comes first.
fn cut_policy(rng: &mut Rng, c: &mut SseConn, after_pause: bool) -> Option<Instant> {
    if after_pause && rng.chance(0.5) {
        // Small budget right after a pause: the cut lands in the middle of the replay.
        c.set_budget(rng.range(50, 4000) as usize);
    } else if rng.chance(0.55) {
        c.set_budget(rng.range(1, 20_000) as usize);
    }
    Some(Instant::now() + rng.ms(200, 3000))
}

async fn post_json(sh: &Shared, sid: &str, body: &serde_json::Value) -> Posted {
    let path = format!("/messages?session_id={sid}");
    wire::post(sh.addr, &path, body.to_string().as_bytes(), POST_WAIT).await
}

/// The answer to a POST, sent back to the session loop.
type PostDone = (u64, Posted);

/// Sends a request without waiting for the POST: it is recorded as posting at once (its answer
/// may come on the stream before the 202 does), and the POST's outcome arrives on `done`.
fn request(
    sh: &Arc<Shared>,
    s: &mut Sess,
    done: &mpsc::UnboundedSender<PostDone>,
    method: &'static str,
    params: serde_json::Value,
    count: u64,
    expect: Duration,
) {
    let id = s.next_id;
    s.next_id += 1;
    let body = if method == "initialize" {
        json!({"jsonrpc":"2.0","id":id,"method":"initialize","params":{"protocolVersion":"2024-11-05","capabilities":{},"clientInfo":{"name":"chaos","version":"0"}}})
    } else {
        json!({"jsonrpc":"2.0","id":id,"method":"tools/call","params":{"name":method,"arguments":params}})
    };
    s.sent_requests += 1;
    if method == "emit" {
        s.emit_requested += count;
        s.emit_inflight = Some(id);
    }
    sh.stats().requests += 1;
    s.reqs.insert(
        id,
        Req {
            method,
            issued: Instant::now(),
            expect,
            count,
            state: ReqState::Posting,
            accepted_wall_ns: u128::MAX,
        },
    );
    let (sh, sid, done) = (sh.clone(), s.sid.clone(), done.clone());
    tokio::spawn(async move {
        let r = post_json(&sh, &sid, &body).await;
        let _ = done.send((id, r));
    });
}

/// Applies the outcome of a POST.
fn posted(sh: &Shared, s: &mut Sess, id: u64, r: Posted) {
    let next = match r {
        Posted::Status(202, _) => Some(ReqState::Accepted),
        Posted::Status(404, _) => {
            sh.stats().post_gone += 1;
            s.check_gone(sh, "POST answered 404");
            s.gone = true;
            None
        }
        Posted::Status(st, text) => {
            sh.stats().post_errors += 1;
            let v: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
            if v["error"]["code"].as_i64().is_none() || v["id"] != json!(id) {
                sh.violation(
                    Violation::Protocol,
                    format!(
                        "POST of request {id} answered {st} without a JSON-RPC error for it: {text}"
                    ),
                );
            }
            s.soft_done = true;
            (st == 504).then_some(ReqState::TimedOut)
        }
        Posted::NotSent => {
            sh.stats().post_errors += 1;
            s.soft_done = true;
            None
        }
        Posted::Unknown => {
            sh.stats().post_unknown += 1;
            s.soft_done = true;
            Some(ReqState::Uncertain)
        }
    };
    // Already answered on the stream: nothing left to track.
    let Some(req) = s.reqs.get_mut(&id) else {
        return;
    };
    match next {
        Some(state) => {
            req.state = state;
            // The stream answer must come within the bound from now on.
            req.issued = Instant::now();
            if state == ReqState::Accepted {
                req.accepted_wall_ns = super::oracle::wall_ns();
            }
        }
        None => {
            s.reqs.remove(&id);
            if s.emit_inflight == Some(id) {
                s.emit_inflight = None;
            }
        }
    }
}

async fn session(sh: &Arc<Shared>, rng: &mut Rng, mut s: Sess, first: Conn) {
    let (done_tx, mut done_rx) = mpsc::unbounded_channel::<PostDone>();
    let mut conn = Some(first);
    // A connection the client left open (half-open, as after an eviction) while it reconnects:
    // the resume must take the stream over.
    let mut lingering: Option<Box<SseConn>> = None;
    let rotate_after = rng.range(3, 12);
    let mut next_echo = Instant::now() + rng.ms(300, 3000);
    let mut force_latest = false;
    let mut after_pause = false;
    let mut empty_ends = 0u32;
    request(
        sh,
        &mut s,
        &done_tx,
        "initialize",
        json!({}),
        0,
        Duration::ZERO,
    );
    loop {
        while let Ok((id, r)) = done_rx.try_recv() {
            posted(sh, &mut s, id, r);
        }
        let now = Instant::now();
        if s.check_hung(sh, now) {
            return;
        }
        let stopping = sh.stopping();
        let done = stopping || s.soft_done || s.gone || s.emits_completed >= rotate_after;
        if done && s.outstanding() == 0 && !s.aborted {
            sh.stats().rotated += 1;
            return;
        }
        if let Some(hard) = sh.hard_deadline() {
            if now > hard {
                for (id, r) in s.reqs.iter().filter(|(_, r)| r.state == ReqState::Accepted) {
                    sh.violation(
                        Violation::Hung,
                        format!(
                            "session {}: request {id} ({}) accepted at t={:.3}s still unanswered at the end of the run",
                            s.sid,
                            r.method,
                            sh.at(r.issued)
                        ),
                    );
                }
                return;
            }
        }

        let Some(c) = conn.as_mut() else {
            let Some(latest) = s.last else {
                // No event yet, so no cursor: a legacy client can only start over.
                sh.stats().orphaned += 1;
                return;
            };
            let mut cursor = latest;
            let mut stale = false;
            if !force_latest && s.seen_len() > 2 && rng.chance(0.12) {
                let n = s.seen_len() - 1;
                let back = if rng.chance(0.5) {
                    rng.range(1, n.min(30) as u64)
                } else {
                    rng.range(1, n as u64)
                };
                if let Some(c) = s.stale_cursor(back as usize) {
                    cursor = c;
                    stale = true;
                }
            }
            force_latest = false;
            let cstr = s.cursor(cursor);
            match wire::open_sse(sh.addr, "/sse", Some(&cstr), HEAD_TIMEOUT).await {
                Opened::Stream(mut sse) => {
                    s.attach();
                    {
                        let mut st = sh.stats();
                        st.resumes_served += 1;
                        st.stale_resumes += stale as u64;
                        st.takeovers += lingering.is_some() as u64;
                    }
                    lingering = None;
                    match sse.next(Instant::now() + HEAD_TIMEOUT).await {
                        Next::Event(ev) => {
                            let want = format!("/messages?session_id={}", s.sid);
                            if ev.event.as_deref() != Some("endpoint")
                                || ev.id.is_some()
                                || ev.data != want.as_bytes()
                            {
                                sh.violation(
                                    Violation::Protocol,
                                    format!("resume of {cstr} did not start with this session's endpoint: {ev:?}"),
                                );
                                return;
                            }
                        }
                        _ => {
                            // Ended before the preamble (the proxy just died): retry.
                            sh.stats().server_ends += 1;
                            s.detach();
                            continue;
                        }
                    }
                    let cut_at = cut_policy(rng, &mut sse, after_pause);
                    after_pause = false;
                    conn = Some(Conn {
                        sse,
                        st: ConnState::new(Some(cursor)),
                        cut_at,
                    });
                }
                Opened::Status(404, body) => {
                    *sh.stats()
                        .refusals
                        .entry("unknown_session".into())
                        .or_default() += 1;
                    let v: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
                    if v["error"]["data"]["reason"] != "unknown_session" {
                        sh.violation(
                            Violation::Protocol,
                            format!("404 on resume without reason unknown_session: {body}"),
                        );
                    }
                    if stale {
                        sh.violation(
                            Violation::WrongRefusal,
                            format!(
                                "session {}: resume from stale cursor {cstr} answered 404 although events after it up to {:?} were delivered",
                                s.sid, s.last
                            ),
                        );
                    }
                    s.check_gone(sh, "resume answered 404");
                    // POSTs still on their way settle first (bounded by their own timeout).
                    while s.reqs.values().any(|r| r.state == ReqState::Posting) {
                        match tokio::time::timeout(POST_WAIT, done_rx.recv()).await {
                            Ok(Some((id, r))) => posted(sh, &mut s, id, r),
                            _ => break,
                        }
                    }
                    s.check_complete_end(sh);
                    return;
                }
                Opened::Status(st @ (400 | 409), body) => {
                    let reason = s.check_refusal(sh, st, &body, cursor);
                    *sh.stats().refusals.entry(reason).or_default() += 1;
                    if stale {
                        // The client chose an old cursor on purpose; its newest one is still good.
                        force_latest = true;
                        continue;
                    }
                    sh.stats().refused_unanswered += s.outstanding() as u64;
                    return;
                }
                Opened::Status(st, body) => {
                    sh.violation(
                        Violation::Protocol,
                        format!("resume of {cstr} answered {st}: {body}"),
                    );
                    sleep(rng.ms(100, 300)).await;
                }
                Opened::Failed => sleep(rng.ms(50, 250)).await,
            }
            continue;
        };

        // Work: one emit at a time; echoes now and then, sometimes several at once.
        if s.initialized && !stopping && !s.gone && !s.soft_done && !s.aborted {
            if s.emit_inflight.is_none() && s.emits_completed < rotate_after {
                let count = rng.range(20, 400);
                // Now and then unpaced (as fast as the upstream can): the proxy's upstream reader
                // then has a backlog when a fault or an end hits it.
                let rate = if rng.chance(unpaced_share()) {
                    0
                } else {
                    rng.range(100, 600)
                };
                let size = rng.range(0, 300);
                let paced = if rate == 0 { 1000 } else { rate };
                let expect = Duration::from_millis(count * 1000 / paced);
                let args = json!({"count": count, "rate_per_sec": rate, "size": size});
                request(sh, &mut s, &done_tx, "emit", args, count, expect);
            }
            if now >= next_echo {
                next_echo = now + rng.ms(300, 3000);
                for _ in 0..rng.range(1, 4) {
                    let args = json!({"text": format!("echo {}", rng.next_u64())});
                    request(sh, &mut s, &done_tx, "echo", args, 0, Duration::ZERO);
                }
            }
        }

        let deadline = match c.cut_at {
            Some(t) if s.last.is_some() => t.min(now + Duration::from_millis(100)),
            _ => now + Duration::from_millis(100),
        };
        let ended = match c.sse.next(deadline).await {
            Next::Event(ev) if ev.event.as_deref() == Some("message") => {
                s.on_message(sh, &mut c.st, &ev);
                if s.forked {
                    sh.stats().refused_unanswered += s.outstanding() as u64;
                    return;
                }
                if s.initialized && !s.init_notified {
                    s.init_notified = true;
                    let note = json!({"jsonrpc":"2.0","method":"notifications/initialized"});
                    if let Posted::Status(404, _) = post_json(sh, &s.sid, &note).await {
                        s.check_gone(sh, "POST answered 404");
                        s.gone = true;
                    }
                }
                None
            }
            Next::Event(ev) => {
                sh.violation(
                    Violation::Protocol,
                    format!("session {}: unexpected event mid-stream: {ev:?}", s.sid),
                );
                None
            }
            Next::Comment => {
                sh.stats().keepalives += 1;
                None
            }
            Next::End => {
                let events = c.st.events;
                conn = None;
                s.detach();
                sh.stats().server_ends += 1;
                empty_ends = if events == 0 { empty_ends + 1 } else { 0 };
                if empty_ends > 50 {
                    sh.violation(
                        Violation::Hung,
                        format!(
                            "session {}: 50 resumes in a row served and ended with nothing (livelock)",
                            s.sid
                        ),
                    );
                    return;
                }
                sleep(rng.ms(10, 100)).await;
                None
            }
            Next::Cut { mid_event } => Some(mid_event),
            Next::Timeout => (s.last.is_some() && c.cut_at.is_some_and(|t| Instant::now() >= t))
                .then(|| c.sse.mid_event()),
        };
        if let Some(mid_event) = ended {
            let Some(c) = conn.take() else { continue };
            s.detach();
            let replay = c.st.resume && c.st.last_replay;
            if rng.chance(0.1) {
                lingering = Some(c.sse);
            }
            after_pause = cut(sh, rng, &mut s, &done_tx, mid_event, replay).await;
        }
    }
}

/// Counts a client cut and pauses; returns whether the pause was long enough to matter. Before a
/// long pause the client starts a big `emit` (POSTs need no stream), so that the backlog outgrows
/// `log.max_events_per_session` while it is away and trimming bites.
async fn cut(
    sh: &Arc<Shared>,
    rng: &mut Rng,
    s: &mut Sess,
    done: &mpsc::UnboundedSender<PostDone>,
    mid_event: bool,
    replay: bool,
) -> bool {
    {
        let mut st = sh.stats();
        st.disconnects += 1;
        st.mid_event_cuts += mid_event as u64;
        st.replay_cuts += replay as u64;
    }
    let p = rng.unit();
    let pause = if p < 0.65 {
        rng.ms(0, 200)
    } else if p < 0.88 {
        rng.ms(300, 1500)
    } else {
        sh.stats().long_pauses += 1;
        if s.initialized
            && s.emit_inflight.is_none()
            && !sh.stopping()
            && !s.soft_done
            && !s.gone
            && !s.aborted
        {
            let count = rng.range(2 * sh.max_events, 5 * sh.max_events);
            let rate = rng.range(400, 1000);
            let args = json!({"count": count, "rate_per_sec": rate, "size": rng.range(0, 100)});
            let expect = Duration::from_millis(count * 1000 / rate);
            request(sh, s, done, "emit", args, count, expect);
        }
        if rng.chance(0.35) {
            // Longer than sessions.idle_ttl_secs: the janitor may end the session meanwhile.
            let ttl = 1000 * super::IDLE_TTL_SECS;
            rng.ms(ttl + 1000, ttl + 4000)
        } else {
            rng.ms(1500, 4000)
        }
    };
    sleep(pause).await;
    p >= 0.65
}
