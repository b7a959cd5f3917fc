//! [6] Log → client: a client SSE stream is a cursor reading the session log.
//!
//! Replay and live delivery are one loop: read the events after the cursor (from the in-memory
//! window or the segment files), send them, and when caught up wait for the head to move. There is no hand-off
//! between a "replay" phase and a "live" phase, so there is nothing to race. A slow client only
//! slows its own task; a client so slow that retention trimmed events it had not read yet gets its
//! stream closed (never skipped over) and meets a `cursor_trimmed` refusal when it resumes.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use prometheus::IntGauge;
use tokio::sync::watch;

use crate::domain::Facade;
use crate::log::cursor::{Cursor, MAX_EVENT_ID_LEN};
use crate::log::{Event, Kind, Log, SessionLog, StreamTag, READ_BYTES};
use crate::metrics::Metrics;
use crate::session::Attachment;
use crate::sse::encode;

/// `retry` (ms) sent with priming events: how long a polled client waits before reconnecting.
pub const PRIMING_RETRY_MS: u64 = 1000;
/// Events read from the log per turn at most: fewer when they are large, so that a turn reads
/// about [`READ_BYTES`] (see `deliver`).
const READ_BATCH: usize = 256;
/// Packs of frames buffered between the cursor task and the connection, and the bytes they hold
/// at most ([`crate::queue`]: one pack always fits, however large): a client that stopped
/// reading holds this much here, or one pack of a single large event. Counted in packs alone,
/// eight packs of one 4 MiB event each were 32 MiB per stalled client (`tests/adversary19.rs`).
const CHANNEL_FRAMES: usize = 8;
const CHANNEL_BYTES: usize = CHANNEL_FRAMES * PACK_BYTES;
/// A pack of consecutive frames is handed to the connection once it holds this many bytes.
const PACK_BYTES: usize = 16 * 1024;
/// A one-line payload at least this large goes to the client as it is (its `Bytes`, between
/// its frame's head and tail), not copied into a pack: a stream of large events holds each once
/// (the read, the queue and the connection share it), and replays of them copy nothing.
const SHARED_PAYLOAD_BYTES: usize = 64 * 1024;
/// Bytes of an event's frame besides its payload's (`id:`, `event: message`, `data:` and line
/// ends), when the payload is one line.
const FRAME_OVERHEAD: usize = 4 + MAX_EVENT_ID_LEN + 1 + 15 + 6 + 1 + 1;

/// The sending half of a cursor stream's frames.
type Tx = crate::queue::Tx<Bytes>;

/// Which events of the session log a stream delivers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Filter {
    /// Every event of one stream.
    Stream(StreamTag),
    /// The events of one Streamable HTTP POST stream, ending after `responses` [`Kind::Final`]
    /// events (one per request the POST carried; a 2025-03-26 batch carries several). With
    /// `responses == 0` the stream ends as soon as it has caught up with the log head.
    Post {
        /// The POST stream.
        stream: StreamTag,
        /// Final events still to deliver before the stream ends.
        responses: usize,
    },
}

/// Everything a client stream needs.
pub struct StreamSpec {
    /// The log to read.
    pub log: Arc<SessionLog>,
    /// Cursor: deliver events after this seq.
    pub after: u64,
    /// Which events.
    pub filter: Filter,
    /// Frames sent first (the legacy `endpoint` event, a priming event).
    pub preamble: Vec<Bytes>,
    /// Events up to this seq count as replayed.
    pub replay_until: u64,
    /// Face, for the metrics label.
    pub facade: Facade,
    /// The attachment (takeover signal), when the session is live.
    pub attachment: Option<Attachment>,
}

/// Shared things every stream uses.
#[derive(Clone)]
pub struct StreamEnv {
    /// The log.
    pub log: Arc<Log>,
    /// Metrics.
    pub metrics: Metrics,
    /// Keepalive period.
    pub keepalive: Duration,
    /// Becomes `true` when the proxy drains: every stream delivers what is already logged (when
    /// its client keeps up) and ends.
    pub drain: watch::Receiver<bool>,
}

/// The response body of a client SSE stream: frames from a queue bounded in bytes (a log
/// cursor's packs, the 2026-07-28 face's streams, another replica's stream relayed).
pub struct SseBody {
    rx: crate::queue::Rx<Bytes>,
    _gauge: GaugeGuard,
    /// What the stream holds while it lives (its caller's slot of
    /// `listen.max_connections_per_identity`).
    _hold: Option<Box<dyn Send + Sync>>,
}

impl std::fmt::Debug for SseBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SseBody").finish_non_exhaustive()
    }
}

struct GaugeGuard(IntGauge);

impl Drop for GaugeGuard {
    fn drop(&mut self) {
        self.0.dec();
    }
}

impl SseBody {
    /// A body whose frames come from `rx` (streams that are not log cursors: the 2026-07-28
    /// face's request and listen streams, another replica's stream relayed). `gauge` counts it
    /// while it lives.
    pub fn from_queue(rx: crate::queue::Rx<Bytes>, gauge: IntGauge) -> Self {
        gauge.inc();
        Self {
            rx,
            _gauge: GaugeGuard(gauge),
            _hold: None,
        }
    }

    /// Keeps `guard` until the stream ends.
    pub fn hold(&mut self, guard: Box<dyn Send + Sync>) {
        self._hold = Some(guard);
    }
}

impl Body for SseBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.rx.poll_recv(cx).map(|o| o.map(|b| Ok(Frame::data(b))))
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}

/// Starts the cursor task of one client stream and returns its body.
pub fn spawn(spec: StreamSpec, env: StreamEnv) -> SseBody {
    let gauge = env.metrics.client_streams(spec.facade);
    gauge.inc();
    let (tx, rx) = crate::queue::bounded(CHANNEL_FRAMES, CHANNEL_BYTES);
    tokio::spawn(run(spec, env, tx));
    SseBody {
        rx,
        _gauge: GaugeGuard(gauge),
        _hold: None,
    }
}

/// Why a stream ended (for the log line).
#[derive(Debug)]
enum End {
    ClientGone,
    Drain,
    Kicked,
    SessionEnded,
    StreamComplete,
    Gap { wanted: u64, got: u64 },
    Store,
    StoreFailed,
    Removed,
}

async fn run(mut spec: StreamSpec, mut env: StreamEnv, tx: Tx) {
    let end = deliver(&mut spec, &mut env, &tx).await;
    match end {
        End::Gap { wanted, got } => {
            env.metrics.dropped("reader_trimmed");
            tracing::warn!(session = %spec.log.tag, wanted, got, "client fell behind retention; stream closed so its resume is refused, never skipped");
        }
        ref other => {
            tracing::debug!(session = %spec.log.tag, end = ?other, "client stream ended");
        }
    }
}

async fn deliver(spec: &mut StreamSpec, env: &mut StreamEnv, tx: &Tx) -> End {
    let mut kicked = spec.attachment.as_ref().map(|a| a.kicked.clone());
    let mut head_rx = spec.log.subscribe();
    let mut keepalive = tokio::time::interval(env.keepalive);
    keepalive.reset();
    let (tag, mut finals_left) = match spec.filter {
        Filter::Stream(tag) => (tag, None),
        Filter::Post { stream, responses } => (stream, Some(responses)),
    };

    let mut max = READ_BATCH;
    for frame in std::mem::take(&mut spec.preamble) {
        let len = frame.len();
        if tx.send(frame, len).await.is_err() {
            return End::ClientGone;
        }
    }
    loop {
        head_rx.borrow_and_update();
        let batch = match env.log.read_batch(&spec.log, spec.after, max).await {
            Ok(b) => b,
            Err(e) => {
                tracing::error!(session = %spec.log.tag, error = %e, "log read failed");
                return End::Store;
            }
        };
        if batch.is_empty() {
            if finals_left == Some(0) {
                return End::StreamComplete;
            }
            if spec.log.failed() {
                // Events of this session were lost to a storage failure: its history is not
                // complete, so the stream closes (a resume is answered 503 until the log has
                // recorded the session's end).
                return End::StoreFailed;
            }
            if spec.log.removed() {
                return End::Removed;
            }
            if spec.log.end_published() && spec.after >= spec.log.head() {
                // The session is over and this reader stands at or past its last event: only a
                // history rewritten under it (a shared log rewound, its epoch sealed below the
                // reader) gets here. Nothing more comes; a resume from its cursor is refused.
                return End::SessionEnded;
            }
            if *env.drain.borrow() {
                // Draining and caught up: everything logged before the drain (the in-flight aborts
                // and end markers of the sessions shutdown ended) has been delivered.
                return End::Drain;
            }
            tokio::select! {
                // The head moved: read again.
                r = head_rx.changed() => if r.is_err() { return End::Store },
                _ = keepalive.tick() => {
                    // Only when there is room: a queue full of frames the client has not read
                    // needs no ping, and waiting for room here would not see a takeover or a
                    // drain (`Pack::send` does).
                    let ping = encode::comment("keepalive");
                    let len = ping.len();
                    if tx.try_send(ping, len).is_err() && tx.is_closed() {
                        return End::ClientGone;
                    }
                }
                _ = wait_true(&mut kicked) => return End::Kicked,
                // Draining: read once more, deliver what is logged, then end (above).
                r = env.drain.changed() => if r.is_err() { return End::Drain },
                _ = tx.closed() => return End::ClientGone,
            }
            continue;
        }
        // The next read asks for about `READ_BYTES` of events the size of these (both logs also
        // stop at about `READ_BYTES` by themselves, whatever is asked).
        let bytes: usize = batch.iter().map(|e| e.payload.len()).sum();
        max = (READ_BYTES as usize / (bytes / batch.len()).max(1)).clamp(1, READ_BATCH);
        if batch[0].seq != spec.after + 1 {
            return End::Gap {
                wanted: spec.after + 1,
                got: batch[0].seq,
            };
        }
        // The frames of consecutive events go out packed in one buffer (up to `PACK_BYTES`): one
        // channel send and one body chunk per pack instead of per event, which is what a replay
        // or a busy live stream spends its time on. Events are counted as delivered (metrics,
        // attachment position) once the pack holding them has been handed to the connection.
        let mut pack = Pack::default();
        let session_hex = spec.log.id.hex();
        let mut left: usize = batch.iter().map(|e| FRAME_OVERHEAD + e.payload.len()).sum();
        for ev in batch {
            spec.after = ev.seq;
            if ev.kind == Kind::End {
                if let Err(end) = pack.send(tx, spec, env, &mut kicked, &mut keepalive).await {
                    return end;
                }
                return End::SessionEnded;
            }
            if ev.stream != tag {
                continue;
            }
            let shared = ev.payload.len() >= SHARED_PAYLOAD_BYTES
                && ev.kind != Kind::Priming
                && encode::one_line(&ev.payload);
            if pack.buf.is_empty() {
                // Room for the pack at once (what is left of the batch, up to a pack) rather
                // than growing it frame by frame.
                let own = if shared { 0 } else { ev.payload.len() };
                pack.buf
                    .reserve(left.min(PACK_BYTES) + FRAME_OVERHEAD + own);
            }
            left = left.saturating_sub(FRAME_OVERHEAD + ev.payload.len());
            if shared {
                // What is packed goes first; then the frame's head, the payload as it is and the
                // tail, queued together: a drain or a takeover ends the stream between frames,
                // never inside one.
                if let Err(end) = pack.send(tx, spec, env, &mut kicked, &mut keepalive).await {
                    return end;
                }
                let mut buf = [0u8; MAX_EVENT_ID_LEN];
                let id = Cursor::write_id(&session_hex, ev.epoch, ev.seq, &mut buf);
                let mut head = Vec::new();
                encode::message_head_into(&mut head, id);
                let len = head.len() + ev.payload.len() + encode::MESSAGE_TAIL.len();
                let tail = Bytes::from_static(encode::MESSAGE_TAIL);
                let frame = [Bytes::from(head), ev.payload, tail];
                let send = async { tx.send_all(frame, len).await.is_ok() };
                if let Err(end) = handed(send, env, &mut kicked).await {
                    return end;
                }
            } else {
                write_frame(&mut pack.buf, &session_hex, &ev);
            }
            pack.last = ev.seq;
            if ev.kind != Kind::Priming {
                pack.delivered += 1;
                if ev.seq <= spec.replay_until {
                    pack.replayed += 1;
                }
            }
            if shared {
                // Handed to the connection: counted now, as a pack is once it is sent (not with
                // a later pack whose send a takeover may cut).
                pack.count(spec, env, &mut keepalive);
            }
            // Only POST streams ([`Filter::Post`]) end on their responses.
            let complete = ev.kind == Kind::Final
                && finals_left.as_mut().is_some_and(|n| {
                    *n = n.saturating_sub(1);
                    *n == 0
                });
            if complete || pack.buf.len() >= PACK_BYTES {
                if let Err(end) = pack.send(tx, spec, env, &mut kicked, &mut keepalive).await {
                    return end;
                }
            }
            if complete {
                return End::StreamComplete;
            }
        }
        if let Err(end) = pack.send(tx, spec, env, &mut kicked, &mut keepalive).await {
            return end;
        }
        if let Some(a) = &spec.attachment {
            // Events of other streams read past count as delivered for this one.
            a.advance(spec.after);
        }
    }
}

/// Frames of consecutive events not yet handed to the connection, and what they count for.
#[derive(Default)]
struct Pack {
    buf: Vec<u8>,
    /// Seq of the last event in `buf`.
    last: u64,
    /// Events in `buf` that count as delivered (priming events do not).
    delivered: u64,
    /// Of those, events logged before the resume.
    replayed: u64,
}

impl Pack {
    /// Sends the pack (if any) and counts its events as delivered.
    async fn send(
        &mut self,
        tx: &Tx,
        spec: &StreamSpec,
        env: &mut StreamEnv,
        kicked: &mut Option<watch::Receiver<bool>>,
        keepalive: &mut tokio::time::Interval,
    ) -> Result<(), End> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let frames = Bytes::from(std::mem::take(&mut self.buf));
        let len = frames.len();
        handed(async { tx.send(frames, len).await.is_ok() }, env, kicked).await?;
        self.count(spec, env, keepalive);
        Ok(())
    }

    /// Counts the events handed to the connection as delivered.
    fn count(
        &mut self,
        spec: &StreamSpec,
        env: &mut StreamEnv,
        keepalive: &mut tokio::time::Interval,
    ) {
        env.metrics
            .delivered
            .inc_by(std::mem::take(&mut self.delivered));
        env.metrics
            .replayed
            .inc_by(std::mem::take(&mut self.replayed));
        keepalive.reset();
        if let Some(a) = &spec.attachment {
            a.advance(self.last);
        }
    }
}

/// Runs `send` (frames handed to the connection: `false` when the client is gone). Sending waits
/// while the client is slow; a takeover or a drain must still end it. A send that can complete
/// goes first, so a drain cuts only a client that is not keeping up, never one that is.
async fn handed(
    send: impl std::future::Future<Output = bool>,
    env: &mut StreamEnv,
    kicked: &mut Option<watch::Receiver<bool>>,
) -> Result<(), End> {
    tokio::select! {
        biased;
        ok = send => if !ok { return Err(End::ClientGone) },
        _ = wait_true(kicked) => return Err(End::Kicked),
        _ = drain_started(&mut env.drain) => return Err(End::Drain),
    }
    Ok(())
}

/// Completes once the proxy drains (or the drain signal is gone).
async fn drain_started(rx: &mut watch::Receiver<bool>) {
    let _ = rx.wait_for(|v| *v).await;
}

/// Completes when the watch turns `true`; never when there is none.
async fn wait_true(rx: &mut Option<watch::Receiver<bool>>) {
    match rx {
        Some(rx) => {
            if rx.wait_for(|v| *v).await.is_err() {
                std::future::pending::<()>().await;
            }
        }
        None => std::future::pending().await,
    }
}

/// The SSE frame of a logged event (I5: only logged events carry an id).
pub fn frame_of(log: &SessionLog, ev: &Event) -> Bytes {
    let mut out = Vec::new();
    write_frame(&mut out, &log.id.hex(), ev);
    Bytes::from(out)
}

/// Appends the SSE frame of a logged event of the session whose id is `session_hex` to `out`;
/// the id is built on the stack.
pub fn write_frame(out: &mut Vec<u8>, session_hex: &[u8; 32], ev: &Event) {
    let mut buf = [0u8; MAX_EVENT_ID_LEN];
    let id = Cursor::write_id(session_hex, ev.epoch, ev.seq, &mut buf);
    match ev.kind {
        Kind::Priming => encode::priming_into(
            out,
            std::str::from_utf8(id).expect("event ids are ASCII"),
            Some(PRIMING_RETRY_MS),
        ),
        _ => encode::message_into(out, id, &ev.payload),
    };
}
