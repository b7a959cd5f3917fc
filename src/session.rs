//! [3] The session registry: proxy session id → live [`Session`] (upstream link, in-flight
//! requests, attached client streams) and, through the [`Log`], the logs of ended sessions that are
//! kept for late resumers.
//!
//! Each live session has one task reading its upstream stream ([`Session::pump`]): it routes every
//! upstream message to a stream (a response to the stream of its request, a progress notification to
//! the stream of the request that asked for it, everything else to the session's default stream)
//! and appends it to the log. Clients never read from the upstream, only from the log.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::config::SessionsConfig;
use crate::domain::{EndReason, Facade};
use crate::echo;
use crate::error::{Error, Result, StoreError};
use crate::identity::Identity;
use crate::jsonrpc;
use crate::log::cursor::SessionId;
use crate::log::{Health, Interrupted, Kind, Log, NewEvent, SessionLog, StreamTag};
use crate::metrics::Metrics;
/// Most upstream events queued to the log in one op.
const PUMP_BATCH: usize = 256;

use crate::upstream::{
    self, HttpClient, UpstreamItem, UpstreamLink, UpstreamReader, UpstreamSettings,
};

/// Ids of requests answered by their timeout, remembered per session so that a late upstream
/// response to one is dropped rather than delivered as a second answer.
const LATE_IDS: usize = 1024;

/// A request forwarded upstream and not yet answered.
#[derive(Debug)]
struct Inflight {
    stream: StreamTag,
    progress_token: Option<String>,
    /// Tells this forwarding of the id from an earlier one (a client may reuse an answered id).
    serial: u64,
    /// The `upstream.request_timeout_secs` timer, when there is one.
    timer: Option<TimerGuard>,
}

/// Aborts a request's timeout task when its in-flight record goes (answered, aborted, forgotten),
/// so a busy session does not keep one sleeping task per answered request.
#[derive(Debug)]
struct TimerGuard(Option<tokio::task::AbortHandle>);

impl TimerGuard {
    /// Lets the task run on: it is the timer itself, answering the request.
    fn disarm(mut self) {
        self.0 = None;
    }
}

impl Drop for TimerGuard {
    fn drop(&mut self) {
        if let Some(task) = self.0.take() {
            task.abort();
        }
    }
}

/// The tag of the hold [`Registry::open`] hands its caller: never a real stream (POST streams are
/// numbered up from 2).
const OPENING: StreamTag = StreamTag(u64::MAX);

/// The refusal of a request whose id is that of a request still in flight in its session (MCP:
/// "The request ID MUST NOT have been previously used by the requestor within the same
/// session"). Found by the adversary review of 2026-12-06: the second one's entry replaced the
/// first's, so the first answer went to the second's stream and the first's never ended.
pub fn id_in_flight() -> Error {
    Error::Invalid {
        answer: jsonrpc::Answer::InvalidRequest,
        message: "a request with this id is still in flight in this session".into(),
    }
}

/// The log kind of an answer on `stream`: it ends a POST stream.
fn answer_kind(stream: StreamTag) -> Kind {
    if stream.is_post() {
        Kind::Final
    } else {
        Kind::Message
    }
}

struct State {
    inflight: HashMap<String, Inflight>,
    progress: HashMap<String, StreamTag>,
    /// Attached client streams: stream → (attachment number, kick signal).
    attached: HashMap<StreamTag, (u64, watch::Sender<bool>)>,
    /// Per stream, the seq its client connections have been delivered through.
    positions: HashMap<StreamTag, u64>,
    next_attachment: u64,
    next_post_stream: u64,
    last_detach: Instant,
    ended: bool,
    pump: Option<tokio::task::AbortHandle>,
    /// Last [`Inflight::serial`] handed out.
    next_serial: u64,
    /// Requests the proxy answered (their timeout, their client's cancel) while the upstream may
    /// still answer them, most recent last (at most [`LATE_IDS`]): a late answer is dropped, and
    /// the id is not taken again meanwhile.
    late: VecDeque<String>,
    /// A client message beyond the opening ones arrived (see [`Session::used`]).
    used: bool,
}

impl State {
    /// A request with this id is in flight, or answered by the proxy with the upstream's answer
    /// still to come: a new request with it would take that late answer as its own (found by
    /// the adversary review of 2026-12-06, `tests/adversary25.rs`).
    fn in_flight(&self, id: &str) -> bool {
        self.inflight.contains_key(id) || self.late.iter().any(|t| t == id)
    }

    /// Takes `id`'s entry out of flight (and its progress token's route).
    fn take(&mut self, id: &str) -> Option<Inflight> {
        let inf = self.inflight.remove(id)?;
        if let Some(t) = &inf.progress_token {
            self.progress.remove(t);
        }
        Some(inf)
    }
}

/// A live session.
pub struct Session {
    /// Proxy session id.
    pub id: SessionId,
    /// Who holds it, for per-identity quotas.
    pub owner: Owner,
    /// Face that created it.
    pub facade: Facade,
    /// Its log.
    pub log: Arc<SessionLog>,
    /// Negotiated protocol version (Streamable HTTP face).
    pub protocol_version: Option<String>,
    link: UpstreamLink,
    default_stream: StreamTag,
    state: Mutex<State>,
    /// Orders the pump's appends against the end of the session (see [`Session::pump`]).
    pump_gate: tokio::sync::Mutex<()>,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session").field("id", &self.id).finish()
    }
}

/// Held while a client stream is attached; dropping it detaches.
pub struct Attachment {
    session: Arc<Session>,
    stream: StreamTag,
    number: u64,
    /// Becomes `true` when a newer connection took this stream over.
    pub kicked: watch::Receiver<bool>,
}

impl Attachment {
    /// Records that this connection has delivered its stream through `seq`, so that a later
    /// connection to the stream without a cursor (a plain Streamable HTTP `GET`) starts after it.
    pub fn advance(&self, seq: u64) {
        let mut st = self.session.lock();
        let p = st.positions.entry(self.stream).or_insert(0);
        *p = (*p).max(seq);
    }
}

impl Drop for Attachment {
    fn drop(&mut self) {
        let mut st = self.session.lock();
        if st.attached.get(&self.stream).map(|a| a.0) == Some(self.number) {
            st.attached.remove(&self.stream);
        }
        if st.attached.is_empty() {
            st.last_detach = Instant::now();
        }
    }
}

impl Session {
    // Plain data, never held across an await: a std mutex is the cheaper lock here.
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Has the session ended (no more requests accepted)?
    pub fn is_ended(&self) -> bool {
        self.lock().ended
    }

    /// Attaches a client connection to `stream`, closing any connection already attached to it
    /// (it is usually half-open after an eviction). Returns `None` when `exclusive` is set and the
    /// stream already has a connection.
    pub fn attach(self: &Arc<Self>, stream: StreamTag, exclusive: bool) -> Option<Attachment> {
        let mut st = self.lock();
        if exclusive && st.attached.contains_key(&stream) {
            return None;
        }
        st.next_attachment += 1;
        let number = st.next_attachment;
        let (tx, rx) = watch::channel(false);
        if let Some((_, old)) = st.attached.insert(stream, (number, tx)) {
            let _ = old.send(true);
        }
        Some(Attachment {
            session: self.clone(),
            stream,
            number,
            kicked: rx,
        })
    }

    /// The seq through which client connections of `stream` have been delivered (0 before any).
    pub fn position(&self, stream: StreamTag) -> u64 {
        self.lock().positions.get(&stream).copied().unwrap_or(0)
    }

    /// A new POST stream tag (Streamable HTTP).
    pub fn new_post_stream(&self) -> StreamTag {
        let mut st = self.lock();
        let tag = StreamTag::post(st.next_post_stream);
        st.next_post_stream += 1;
        tag
    }

    fn idle_since(&self) -> Option<Instant> {
        let st = self.lock();
        st.attached.is_empty().then_some(st.last_detach)
    }

    /// Has a client sent it a message beyond opening it (`initialize`, `initialized`)?
    fn used(&self) -> bool {
        self.lock().used
    }

    /// Forwards one client message upstream. A request is first recorded as in flight (durably),
    /// so that whatever happens next it gets an answer: its response, or a -32091 error.
    ///
    /// # Errors
    /// [`Error::UnknownSession`] when the session has ended; upstream errors as
    /// [`UpstreamLink::post`] reports them (on [`Error::UpstreamLost`] the session is ended first).
    pub async fn forward(
        self: &Arc<Self>,
        reg: &Registry,
        body: Bytes,
        peek: &jsonrpc::Peek,
        stream: StreamTag,
    ) -> Result<()> {
        if self.is_ended() {
            return Err(Error::UnknownSession);
        }
        if !matches!(
            peek.method.as_deref(),
            Some("initialize" | "notifications/initialized")
        ) {
            self.lock().used = true;
        }
        let request_id = peek.id.clone().filter(|_| peek.is_request());
        if let Some(id) = &request_id {
            {
                let mut st = self.lock();
                if st.in_flight(id) {
                    // Its entry would replace the other request's: one answer would go to the
                    // other's stream and the other's stream would never end. Loud instead.
                    return Err(id_in_flight());
                }
                st.next_serial += 1;
                let serial = st.next_serial;
                let timer = reg.upstream.request_timeout.map(|after| {
                    self.time_out_after(reg.log.clone(), reg.metrics.clone(), id, serial, after)
                });
                st.inflight.insert(
                    id.clone(),
                    Inflight {
                        stream,
                        progress_token: peek.progress_token.clone(),
                        serial,
                        timer,
                    },
                );
                if let Some(t) = &peek.progress_token {
                    st.progress.insert(t.clone(), stream);
                }
            }
            if let Err(e) = reg.log.inflight_add(&self.log, id, stream).await {
                // Not recorded, so not forwarded: nothing will answer it, nothing may.
                self.forget(id);
                return Err(e);
            }
        }
        if request_id.is_none() && peek.method.as_deref() == Some("notifications/cancelled") {
            self.cancel(&reg.log, &body).await;
        }
        match self.link.post(body).await.map_err(Error::from) {
            Ok(()) => Ok(()),
            Err(Error::UpstreamLost) => {
                reg.metrics.upstream_error("status");
                tracing::warn!(session = %self.log.tag, "upstream answered 404 to a POST: session lost");
                reg.end(self, EndReason::UpstreamLost).await;
                if request_id.is_some() {
                    // The request was recorded in flight, so the end answered it (-32091, on its
                    // stream, with the end): that is its answer. A 404 besides would tell the
                    // client it was never taken while its stream says it was aborted.
                    return Ok(());
                }
                Err(Error::UpstreamLost)
            }
            Err(e) => {
                reg.metrics.upstream_error(if e.is_timeout() {
                    "post_timeout"
                } else {
                    "post_failed"
                });
                tracing::warn!(session = %self.log.tag, error = %e, "forwarding a client message failed");
                // On a timeout the upstream may still answer, so the request stays in flight;
                // any other failure means the upstream did not take it.
                if let (Some(id), false) = (&request_id, e.is_timeout()) {
                    if self.forget(id).is_none() {
                        // Already answered meanwhile (the session's end answered it -32091, or
                        // its timeout did): that logged answer is the one it gets.
                        return Ok(());
                    }
                    reg.log.inflight_done(&self.log, id).await?;
                }
                Err(e)
            }
        }
    }

    /// Is a request with this (canonical) id in flight: not yet answered, or answered by the
    /// proxy (timeout, cancel) while the upstream may still answer it?
    pub fn in_flight(&self, id: &str) -> bool {
        self.lock().in_flight(id)
    }

    /// A client's `notifications/cancelled` for one of its requests in flight. MCP says the
    /// server SHOULD NOT answer a cancelled request, and the SDKs' servers do not, so its entry
    /// stayed for the session's life, its POST stream never ended, and the session's end
    /// answered it -32091 (found by the adversary review of 2026-12-06, `tests/adversary25.rs`).
    /// The proxy answers it instead (-32094, on its stream, logged like any answer: one answer
    /// per request), and drops a late upstream answer, as after a timeout. A response the
    /// upstream routed first wins.
    async fn cancel(&self, log: &Log, body: &[u8]) {
        let Some(id) = jsonrpc::cancelled_request(body) else {
            return;
        };
        let answer = (
            jsonrpc::REQUEST_CANCELLED,
            "request cancelled by the client",
            serde_json::json!({"reason": "cancelled"}),
        );
        if self.answer_early(log, &id, None, answer).await {
            tracing::debug!(session = %self.log.tag, request_id = echo::clip(&id), "request cancelled by its client; answered with -32094");
        }
    }

    fn forget(&self, id: &str) -> Option<Inflight> {
        self.lock().take(id)
    }

    /// Was `id` answered by the proxy (its timeout, its client's cancel)? (Forgets it: a second
    /// late response is not expected.)
    fn timed_out(&self, id: &str) -> bool {
        let mut st = self.lock();
        match st.late.iter().position(|t| t == id) {
            Some(i) => {
                st.late.remove(i);
                true
            }
            None => false,
        }
    }

    /// Answers `id` with the proxy's own error (its timeout, its client's cancel) when it is still
    /// in flight (and, with `serial`, still that forwarding of it): logged on its stream like any
    /// answer, and the upstream's late answer dropped ([`Session::route`]); the id stays taken
    /// until then. Ordered against the pump like its own appends, and against `Registry::end`: a
    /// response routed first wins. Whether it answered.
    async fn answer_early(
        &self,
        log: &Log,
        id: &str,
        serial: Option<u64>,
        answer: (i64, &str, serde_json::Value),
    ) -> bool {
        let _gate = self.pump_gate.lock().await;
        let inf = {
            let mut st = self.lock();
            let current = st.inflight.get(id).map(|i| i.serial);
            if st.ended || current.is_none() || serial.is_some_and(|s| current != Some(s)) {
                return false;
            }
            let Some(mut inf) = st.take(id) else {
                return false;
            };
            if let (Some(timer), Some(_)) = (inf.timer.take(), serial) {
                // Called from the timer's own task, which must not abort itself mid-answer
                // (otherwise dropping the guard aborts the timer).
                timer.disarm();
            }
            if st.late.len() >= LATE_IDS {
                st.late.pop_front();
            }
            st.late.push_back(id.to_string());
            inf
        };
        let (code, message, data) = answer;
        let ev = self.error_answer(id.to_string(), &inf, code, message, data, Instant::now());
        if let Err(e) = log.append_nowait(&self.log, ev).await {
            tracing::error!(session = %self.log.tag, error = %e, request_id = echo::clip(id), "cannot log the proxy's answer to a request");
        }
        true
    }

    /// The logged answer to in-flight request `id`: a JSON-RPC error on its stream that completes
    /// its in-flight record (in the same write).
    fn error_answer(
        &self,
        id: String,
        inf: &Inflight,
        code: i64,
        message: &str,
        data: serde_json::Value,
        received: Instant,
    ) -> NewEvent {
        let body = jsonrpc::error_response(&id, code, message, data);
        NewEvent {
            stream: inf.stream,
            kind: answer_kind(inf.stream),
            payload: Bytes::from(body),
            received,
            completes: Some(id),
        }
    }

    /// Routes one upstream message to its log event (a response to the stream of its request, a
    /// progress notification to the stream that asked for it, the rest to the default stream);
    /// `None` when it is dropped.
    fn route(&self, payload: Bytes, received: Instant, metrics: &Metrics) -> Option<NewEvent> {
        let event = |stream, kind, payload, completes| NewEvent {
            stream,
            kind,
            payload,
            received,
            completes,
        };
        let Some(p) = jsonrpc::peek(&payload) else {
            return self.bad_event(payload, received, metrics);
        };
        if p.is_response {
            if let Some(id) = p.id {
                if let Some(inf) = self.forget(&id) {
                    return Some(event(
                        inf.stream,
                        answer_kind(inf.stream),
                        payload,
                        Some(id),
                    ));
                }
                if self.timed_out(&id) {
                    // Its request was answered with -32093 already: one answer per request.
                    metrics.dropped("late_response");
                    tracing::debug!(session = %self.log.tag, request_id = echo::clip(&id), "late upstream response to a timed-out request dropped");
                    return None;
                }
            }
            return Some(event(self.default_stream, Kind::Message, payload, None));
        }
        if p.method.as_deref() == Some("notifications/progress") {
            if let Some(t) = &p.progress_token {
                if let Some(&s) = self.lock().progress.get(t) {
                    return Some(event(s, Kind::Message, payload, None));
                }
            }
        }
        Some(event(self.default_stream, Kind::Message, payload, None))
    }

    /// An upstream message that is not a JSON-RPC object (not JSON, not UTF-8). When it reads like
    /// the response to a request in flight ([`jsonrpc::scan_response_id`]) that request is answered
    /// with a logged -32092 instead, so its client await resolves (and a POST stream ends);
    /// otherwise it is delivered as is on the default stream. Counted and logged once either way.
    fn bad_event(&self, payload: Bytes, received: Instant, metrics: &Metrics) -> Option<NewEvent> {
        metrics.upstream_error("bad_event");
        let id = jsonrpc::scan_response_id(&payload);
        let inflight = id
            .as_ref()
            .and_then(|id| self.forget(id).map(|inf| (id.clone(), inf)));
        if let Some((id, inf)) = inflight {
            metrics.dropped("bad_event");
            tracing::warn!(session = %self.log.tag, bytes = payload.len(), request_id = echo::clip(&id), "upstream response is not valid JSON-RPC; its request is answered with -32092");
            return Some(self.error_answer(
                id,
                &inf,
                jsonrpc::UNDELIVERABLE,
                "upstream response was not valid JSON-RPC and was dropped",
                serde_json::json!({"reason": "bad_event", "bytes": payload.len()}),
                received,
            ));
        }
        if let Some(id) = id.filter(|id| self.timed_out(id)) {
            metrics.dropped("late_response");
            tracing::warn!(session = %self.log.tag, bytes = payload.len(), request_id = echo::clip(&id), "upstream message is not valid JSON-RPC, a late response to a timed-out request; dropped");
            return None;
        }
        tracing::warn!(session = %self.log.tag, bytes = payload.len(), "upstream message is not a JSON-RPC object; delivered as is on the default stream");
        Some(NewEvent {
            stream: self.default_stream,
            kind: Kind::Message,
            payload,
            received,
            completes: None,
        })
    }

    /// Starts the `upstream.request_timeout_secs` timer of request `id` (forwarding `serial`).
    fn time_out_after(
        self: &Arc<Self>,
        log: Arc<Log>,
        metrics: Metrics,
        id: &str,
        serial: u64,
        after: Duration,
    ) -> TimerGuard {
        // Weak: a pending timer does not keep an ended session alive.
        let session = Arc::downgrade(self);
        let id = id.to_string();
        let task = tokio::spawn(async move {
            tokio::time::sleep(after).await;
            if let Some(s) = session.upgrade() {
                s.time_out(&log, &metrics, id, serial, after).await;
            }
        });
        TimerGuard(Some(task.abort_handle()))
    }

    /// Answers request `id` with a logged -32093 if this forwarding of it (`serial`) is still
    /// unanswered. The answer completes its in-flight record in the same write, so a restart does
    /// not answer it again; a late upstream response to it is dropped ([`Session::route`]).
    async fn time_out(
        &self,
        log: &Log,
        metrics: &Metrics,
        id: String,
        serial: u64,
        after: Duration,
    ) {
        let secs = after.as_secs();
        let answer = (
            jsonrpc::REQUEST_TIMEOUT,
            &*format!("upstream did not answer within {secs} s (upstream.request_timeout_secs)"),
            serde_json::json!({"reason": "request_timeout", "timeout_secs": secs}),
        );
        if self.answer_early(log, &id, Some(serial), answer).await {
            metrics.upstream_error("request_timeout");
            tracing::warn!(session = %self.log.tag, request_id = echo::clip(&id), timeout_secs = secs, "request unanswered within upstream.request_timeout_secs; answered with -32093");
        }
    }

    /// Reads the upstream stream until it ends, logging every message. Ends the session when the
    /// upstream stream ends or fails.
    async fn pump(self: Arc<Self>, reg: Arc<Registry>, mut reader: UpstreamReader) {
        let why = loop {
            let first = match reader.next().await.map_err(Error::from) {
                Ok(Some(item)) => item,
                Ok(None) => break "stream_eof",
                Err(e) => {
                    tracing::warn!(session = %self.log.tag, error = %e, "upstream stream failed");
                    break "stream_error";
                }
            };
            let received = Instant::now();
            // Held across routing and queueing: `Registry::end` takes it before it answers the
            // in-flight requests, so no upstream message is queued after those answers.
            let _gate = self.pump_gate.lock().await;
            if self.is_ended() {
                return;
            }
            // Every event the last read already delivered goes to the log in one op: one
            // channel send and one writer wake-up per upstream read instead of per event.
            let mut batch = reg.log.batch();
            let mut item = Some(first);
            while let Some(it) = item.take() {
                if let Some(ev) = self.to_event(it, received, &reg.metrics) {
                    batch.push(ev);
                }
                if batch.len() < PUMP_BATCH {
                    item = reader.next_buffered();
                }
            }
            if batch.is_empty() {
                continue;
            }
            if let Err(e) = reg.log.append_many_nowait(&self.log, batch).await {
                tracing::error!(session = %self.log.tag, error = %e, "cannot log upstream event");
                drop(_gate); // `end` takes it
                reg.end(&self, EndReason::StoreError).await;
                return;
            }
            drop(_gate);
            // A read of a flooding upstream yields a hundred events or more, and the pump would
            // loop until its budget ran out: the session's client streams then trailed the head
            // by more than the page cache keeps (src/log/pagecache.rs) and read their events
            // back from the disk. Letting the other tasks run after each batch keeps them near
            // the head (docs/benchmarks.md round 8); the upstream is still read at once.
            tokio::task::yield_now().await;
        };
        reg.metrics.upstream_error(why);
        tracing::warn!(session = %self.log.tag, cause = why, "upstream session lost");
        reg.end(&self, EndReason::UpstreamLost).await;
    }

    /// The log event for one upstream item, routed; `None` when it is dropped.
    fn to_event(
        &self,
        item: UpstreamItem,
        received: Instant,
        metrics: &Metrics,
    ) -> Option<NewEvent> {
        match item {
            UpstreamItem::Event(ev) => {
                if ev.event.as_deref().is_some_and(|t| t != "message") {
                    metrics.dropped("non_message_event");
                    tracing::warn!(session = %self.log.tag, event = ?ev.event, "upstream event of unknown type ignored");
                    return None;
                }
                self.route(ev.data, received, metrics)
            }
            UpstreamItem::Oversized { len, head, tail } => {
                metrics.upstream_error("oversized_event");
                metrics.dropped("oversized_event");
                let id =
                    jsonrpc::scan_id(&head, &tail).filter(|_| jsonrpc::looks_like_response(&head));
                let inflight = id
                    .as_ref()
                    .and_then(|id| self.forget(id).map(|i| (id.clone(), i)));
                tracing::error!(session = %self.log.tag, bytes = len, request_id = ?id.as_deref().map(echo::clip), answered = inflight.is_some(), "upstream event over upstream.max_event_bytes dropped");
                let (id, inf) = inflight?;
                // Answer the request it belonged to, so the client's await resolves.
                Some(self.error_answer(
                    id,
                    &inf,
                    jsonrpc::UNDELIVERABLE,
                    "upstream response exceeded upstream.max_event_bytes and was dropped",
                    serde_json::json!({"reason": "oversized_event", "bytes": len}),
                    received,
                ))
            }
        }
    }
}

/// The registry of live sessions.
pub struct Registry {
    /// The log.
    pub log: Arc<Log>,
    /// Metrics.
    pub metrics: Metrics,
    cfg: SessionsConfig,
    upstream: UpstreamSettings,
    client: HttpClient,
    /// The 2026-07-28 face's running tasks: they count against `sessions.max_sessions` too.
    tasks: Arc<AtomicUsize>,
    live: Mutex<HashMap<SessionId, Arc<Session>>>,
    /// Sessions being opened: slots taken before their upstream connect (see [`Slot`]).
    opening: AtomicUsize,
    /// The same, by owner. Locked only while `live` is held (lock order: `live`, then this).
    opening_owners: Mutex<HashMap<Owner, usize>>,
}

/// A session slot taken before the upstream connect, so `sessions.max_sessions` (and
/// `sessions.max_per_identity`) hold however many opens run at once: live sessions plus slots
/// never exceed them. Given back on drop — by a failed open, or by a successful one under the
/// registry lock as its session becomes live.
struct Slot<'a> {
    opening: &'a AtomicUsize,
    owners: &'a Mutex<HashMap<Owner, usize>>,
    owner: Owner,
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        self.opening.fetch_sub(1, Ordering::SeqCst);
        let mut o = self.owners.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = o.get_mut(&self.owner) {
            *n -= 1;
            if *n == 0 {
                o.remove(&self.owner);
            }
        }
    }
}

/// The live session that has had no client the longest, among `sessions`.
fn longest_idle<'a>(sessions: impl Iterator<Item = &'a Arc<Session>>) -> Option<Arc<Session>> {
    sessions
        .filter(|s| !s.is_ended())
        .filter_map(|s| s.idle_since().map(|t| (t, s)))
        .min_by_key(|(t, _)| *t)
        .map(|(_, s)| s.clone())
}

/// Who holds a session, for quotas: its identity, or for an anonymous caller its address.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Owner {
    /// An identified caller.
    Identity(Identity),
    /// An anonymous caller, by peer address.
    Peer(std::net::IpAddr),
    /// Nothing known (in-process callers, tests).
    Unknown,
}

impl Owner {
    /// The owner of a session opened by `caller`.
    pub fn of(identity: Option<Identity>, peer: Option<std::net::IpAddr>) -> Owner {
        match (identity, peer) {
            (Some(i), _) => Owner::Identity(i),
            (None, Some(p)) => Owner::Peer(p),
            (None, None) => Owner::Unknown,
        }
    }
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry").finish_non_exhaustive()
    }
}

impl Registry {
    /// A registry over `log`, with the limits of `[sessions]`, opening sessions on `upstream`.
    pub fn new(
        cfg: SessionsConfig,
        upstream: UpstreamSettings,
        log: Arc<Log>,
        metrics: Metrics,
    ) -> Arc<Self> {
        let client = upstream::client(&upstream);
        Self::with_client(cfg, log, metrics, upstream, client)
    }

    /// A registry whose upstream connections go through `client` (unit tests: in memory).
    fn with_client(
        cfg: SessionsConfig,
        log: Arc<Log>,
        metrics: Metrics,
        upstream: UpstreamSettings,
        client: HttpClient,
    ) -> Arc<Self> {
        Arc::new(Self {
            client,
            upstream,
            cfg,
            tasks: Arc::new(AtomicUsize::new(0)),
            log,
            metrics,
            live: Mutex::new(HashMap::new()),
            opening: AtomicUsize::new(0),
            opening_owners: Mutex::new(HashMap::new()),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<SessionId, Arc<Session>>> {
        self.live.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The live session `id`.
    pub fn live(&self, id: &SessionId) -> Option<Arc<Session>> {
        self.lock().get(id).cloned().filter(|s| !s.is_ended())
    }

    /// Number of live sessions.
    pub fn live_count(&self) -> usize {
        self.lock().len()
    }

    /// Sessions live or being opened: what counts against `sessions.max_sessions` besides the
    /// running tasks.
    pub fn held(&self) -> usize {
        let live = self.lock();
        live.len() + self.opening.load(Ordering::SeqCst)
    }

    /// Where the 2026-07-28 face publishes its running tasks, which count against
    /// `sessions.max_sessions` with the sessions.
    pub fn task_counter(&self) -> Arc<AtomicUsize> {
        self.tasks.clone()
    }

    /// Opens a new session: takes a slot (making room if needed), connects upstream, creates the
    /// log and starts the pump.
    ///
    /// Also returns a hold: an attachment that counts as the session's client until the caller
    /// has attached the session's first client stream and drops it. Until then the session is not
    /// idle, so a concurrent open cannot evict it (nor the janitor end it) before its client is
    /// even attached; a caller that is cancelled drops the hold, and the session idles out.
    ///
    /// # Errors
    /// [`Error::Capacity`] when no room can be made; upstream connect errors; store errors.
    pub async fn open(
        self: &Arc<Self>,
        facade: Facade,
        protocol_version: Option<String>,
        identity: Option<Identity>,
        owner: Owner,
    ) -> Result<(Arc<Session>, Attachment)> {
        if *self.log.health().borrow() != Health::Ok {
            // The log cannot take this session's events: say so now rather than lose them.
            return Err(Error::Store(StoreError::Unavailable));
        }
        let slot = self.make_room(owner).await?;
        let (link, reader) = match upstream::connect(&self.upstream, &self.client)
            .await
            .map_err(Error::from)
        {
            Ok(x) => x,
            Err(e) => {
                let kind = match &e {
                    Error::Upstream(u) => u.connect_kind(),
                    _ => "connect",
                };
                self.metrics.upstream_error(kind);
                tracing::warn!(error = %crate::error::chain(&e), kind, "cannot open upstream session");
                return Err(e);
            }
        };
        let id = SessionId::random();
        let log = self
            .log
            .create(id, facade, protocol_version.clone(), identity)
            .await?;
        let session = Arc::new(Session {
            id,
            owner,
            facade,
            log,
            protocol_version,
            link,
            default_stream: match facade {
                Facade::Legacy => StreamTag::LEGACY,
                Facade::Streamable | Facade::Task => StreamTag::STANDALONE,
            },
            state: Mutex::new(State {
                inflight: HashMap::new(),
                progress: HashMap::new(),
                attached: HashMap::new(),
                positions: HashMap::new(),
                next_attachment: 0,
                next_post_stream: 0,
                last_detach: Instant::now(),
                ended: false,
                pump: None,
                next_serial: 0,
                late: VecDeque::new(),
                used: false,
            }),
            pump_gate: tokio::sync::Mutex::new(()),
        });
        let hold = session.attach(OPENING, false).expect("non-exclusive");
        {
            let mut live = self.lock();
            live.insert(id, session.clone());
            // Under the same lock: the slot becomes the live entry in one step.
            drop(slot);
        }
        let pump = tokio::spawn(session.clone().pump(self.clone(), reader));
        session.lock().pump = Some(pump.abort_handle());
        self.metrics.sessions_active.inc();
        self.metrics.session_started(facade);
        // The upstream's message URL carries the upstream's own session id: debug only.
        tracing::info!(session = %session.log.tag, facade = facade.as_str(), bound = session.log.identity.is_some(), "session started");
        tracing::debug!(session = %id, upstream = %session.link.post_uri(), "session started");
        Ok((session, hold))
    }

    /// Takes a session slot, first making room: ended logs evicted for space, and when
    /// `sessions.max_sessions` are live or being opened, the session idle the longest is ended.
    async fn make_room(&self, owner: Owner) -> Result<Slot<'_>> {
        // New sessions are admitted while the log holds at most 90% of its bound, so the ones
        // already live keep their retained history (the log trims live sessions only to hold the
        // bound itself). Ended sessions' logs are evicted first to make that room.
        let max_total = self.log.max_total_bytes();
        let admit = max_total - max_total / 10;
        if self.log.total_bytes() > admit {
            let held = self.log.make_room(admit).await?;
            if held > admit {
                return Err(Error::Capacity(format!(
                    "log holds {held} bytes; new sessions wait until it holds at most 90% of log.max_total_bytes ({max_total})"
                )));
            }
        }
        let max = self.cfg.max_sessions;
        let per_owner = self.cfg.max_per_identity;
        let victim = {
            // Counting and taking under one lock: concurrent opens cannot all see the last slot.
            let mut live = self.lock();
            let mut owners = self
                .opening_owners
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            let held = live
                .values()
                .filter(|s| s.owner == owner && !s.is_ended())
                .count()
                + owners.get(&owner).copied().unwrap_or(0);
            let victim = if held >= per_owner && owner != Owner::Unknown {
                // The owner is at its quota: only its own longest-idle session can make room.
                let Some(v) = longest_idle(live.values().filter(|s| s.owner == owner)) else {
                    return Err(Error::Capacity(format!(
                        "{held} live sessions of this caller, all with clients attached (sessions.max_per_identity)"
                    )));
                };
                Some(v)
            } else if live.len()
                + self.opening.load(Ordering::SeqCst)
                + self.tasks.load(Ordering::SeqCst)
                < max
            {
                None
            } else {
                // Full: evict from the owner holding the most sessions, its longest-idle one, so
                // that one caller's flood cannot evict everyone else's idle sessions. Its slot
                // passes to this open here, under the lock, so no concurrent open counts it too.
                let mut counts: HashMap<Owner, usize> = HashMap::new();
                for s in live.values().filter(|s| !s.is_ended()) {
                    *counts.entry(s.owner).or_default() += 1;
                }
                // The opener weighs what it will hold once its opens succeed (this one
                // included), and goes first among equals: a flood that has grown as large as
                // another owner's share evicts its own sessions, never that owner's.
                let mine = owners.get(&owner).copied().unwrap_or(0) + 1;
                *counts.entry(owner).or_default() += mine;
                let mine = counts[&owner];
                let mut by_weight: Vec<(usize, Owner)> =
                    counts.into_iter().map(|(o, n)| (n, o)).collect();
                by_weight.sort_by_key(|&(n, o)| (std::cmp::Reverse(n), o != owner));
                // Only an owner at least as heavy as the opener gives up a session: a flood
                // whose own sessions all have clients attached is refused, never paid for with
                // a lighter owner's idle sessions.
                let v = by_weight
                    .iter()
                    .take_while(|(n, _)| *n >= mine)
                    .find_map(|(_, o)| longest_idle(live.values().filter(|s| s.owner == *o)));
                let Some(v) = v else {
                    return Err(Error::Capacity(format!(
                        "{} live sessions, all with clients attached, and {} running tasks (sessions.max_sessions)",
                        live.len(),
                        self.tasks.load(Ordering::SeqCst)
                    )));
                };
                Some(v)
            };
            if let Some(v) = &victim {
                live.remove(&v.id);
            }
            self.opening.fetch_add(1, Ordering::SeqCst);
            *owners.entry(owner).or_default() += 1;
            victim
        };
        let slot = Slot {
            opening: &self.opening,
            owners: &self.opening_owners,
            owner,
        };
        if let Some(s) = victim {
            // Done (its gauge decremented) before this open connects upstream.
            self.end(&s, EndReason::Evicted).await;
        }
        Ok(slot)
    }

    /// Ends a live session: no new requests; the upstream stream is closed; every in-flight request
    /// is answered with a logged -32091 error on its stream; the end marker ends every client stream.
    pub async fn end(&self, session: &Arc<Session>, reason: EndReason) {
        // Wait for a message the pump is queueing; after this no further one is (it sees `ended`).
        let _gate = session.pump_gate.lock().await;
        let (aborts, pump) = {
            let mut st = session.lock();
            if st.ended {
                return;
            }
            st.ended = true;
            st.progress.clear();
            let aborts: Vec<(String, StreamTag)> = st
                .inflight
                .drain()
                .map(|(id, inf)| (id, inf.stream))
                .collect();
            (aborts, st.pump.take())
        };
        if let Some(p) = pump {
            // Dropping the reader closes the upstream GET: the upstream session ends with ours.
            // (When the pump itself is ending the session, this cancels it at its next await,
            // which is the wait below; the end work runs in its own task and is not cancelled.)
            p.abort();
        }
        self.lock().remove(&session.id);
        self.metrics.sessions_active.dec();
        // Own task: neither a dropped request future nor the pump's abort may cut the end short,
        // or readers would never see the end marker and in-flight awaits would hang.
        let (log, metrics, sl) = (self.log.clone(), self.metrics.clone(), session.log.clone());
        let work = tokio::spawn(async move { end_log(&log, &metrics, &sl, reason, aborts).await });
        let _ = work.await;
    }

    /// Ends the sessions a previous run left live (their upstream sessions died with it),
    /// answering what they had in flight: the same end as at runtime, reason `upstream_lost`.
    pub async fn end_interrupted(&self, interrupted: Vec<Interrupted>) {
        let mut ends = tokio::task::JoinSet::new();
        for i in interrupted {
            if i.log.facade == Facade::Task {
                // A task the previous run left unfinished reads back as `failed` (-32091): it is
                // counted as one, so the failed-tasks alert sees crashes too.
                self.metrics.tasks.with_label_values(&["failed"]).inc();
            }
            let (log, metrics) = (self.log.clone(), self.metrics.clone());
            ends.spawn(async move {
                end_log(&log, &metrics, &i.log, EndReason::UpstreamLost, i.inflight).await;
            });
        }
        while ends.join_next().await.is_some() {}
    }

    /// Ends every live session whose events the log lost to a storage failure, as the log reports
    /// them, until the log is dropped.
    pub async fn watch_store_failures(self: Arc<Self>) {
        let Some(mut failures) = self.log.take_failures() else {
            return;
        };
        // Weak: this task must not keep the registry (and through it the log and its directory
        // lock) alive after the proxy stopped; the channel ends when the log goes.
        let me = Arc::downgrade(&self);
        drop(self);
        while let Some(id) = failures.recv().await {
            let Some(this) = me.upgrade() else { return };
            let Some(s) = this.live(&id) else { continue };
            tracing::error!(session = %s.log.tag, "events of this session could not be logged; ending it (store_error)");
            let reg = this.clone();
            tokio::spawn(async move { reg.end(&s, EndReason::StoreError).await });
        }
    }

    /// Ends every live session (shutdown).
    pub async fn end_all(&self, reason: EndReason) {
        let all: Vec<_> = self.lock().values().cloned().collect();
        for s in all {
            self.end(&s, reason).await;
        }
    }

    /// Housekeeping once per second until `stop` fires: idle sessions end after
    /// `sessions.idle_ttl_secs`; ended logs are deleted after `sessions.retain_ended_secs` (the log
    /// itself evicts ended logs while it is over `log.max_total_bytes`).
    pub async fn janitor(self: Arc<Self>, mut stop: watch::Receiver<bool>) {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = stop.changed() => return,
            }
            self.sweep().await;
        }
    }

    /// One round of housekeeping (see [`Registry::janitor`]).
    pub(crate) async fn sweep(&self) {
        let idle_ttl = Duration::from_secs(self.cfg.idle_ttl_secs);
        let unused_ttl = Duration::from_secs(self.cfg.unused_ttl_secs);
        let retain = self.cfg.retain_ended_secs;
        let idle: Vec<_> = self
            .lock()
            .values()
            .filter_map(|s| {
                let ttl = if s.used() { idle_ttl } else { unused_ttl };
                s.idle_since()
                    .is_some_and(|t| t.elapsed() >= ttl)
                    .then(|| (s.clone(), s.used()))
            })
            .collect();
        for (s, used) in idle {
            if used {
                tracing::info!(session = %s.log.tag, "no client attached for sessions.idle_ttl_secs");
            } else {
                tracing::info!(session = %s.log.tag, "never used and no client attached for sessions.unused_ttl_secs");
            }
            self.end(&s, EndReason::IdleTimeout).await;
        }
        let now = crate::log::unix_now();
        // Task logs keep their own time (`tasks.ttl_secs`, `modern::tasks`).
        for l in self
            .log
            .all()
            .into_iter()
            .filter(|l| l.facade != Facade::Task)
        {
            if l.end_published()
                && l.ended_unix()
                    .is_some_and(|t| now.saturating_sub(t) >= retain)
            {
                if let Err(e) = self.log.remove(&l.id).await {
                    tracing::error!(error = %e, "deleting an expired log failed");
                }
            }
        }
    }
}

/// Ends a session's log, the one way sessions end (at runtime and in recovery alike): every
/// request still in flight is answered with a logged JSON-RPC error -32091 on its stream (I6), then
/// the end marker ends every stream of the session. Counted and logged here; if storage is failing
/// the log keeps the end and writes it once it can (or the next start's recovery does).
pub async fn end_log(
    log: &Log,
    metrics: &Metrics,
    sl: &Arc<SessionLog>,
    reason: EndReason,
    aborts: Vec<(String, StreamTag)>,
) {
    let mut evs = Vec::with_capacity(aborts.len());
    for (req_id, stream) in aborts {
        let body = jsonrpc::error_response(
            &req_id,
            jsonrpc::INFLIGHT_ABORTED,
            &format!(
                "request aborted: upstream session ended ({})",
                reason.as_str()
            ),
            serde_json::json!({"reason": reason.as_str(), "session_id": sl.id.to_string()}),
        );
        let kind = if stream.is_post() {
            Kind::Final
        } else {
            Kind::Message
        };
        let mut ev = NewEvent::new(stream, kind, Bytes::from(body));
        tracing::warn!(session = %sl.tag, request_id = crate::echo::clip(&req_id), reason = reason.as_str(), "in-flight request aborted");
        ev.completes = Some(req_id);
        evs.push(ev);
    }
    metrics.inflight_aborted.inc_by(evs.len() as u64);
    metrics.session_ended(reason);
    match log.end(sl, reason, evs).await {
        Ok(()) => tracing::info!(session = %sl.tag, reason = reason.as_str(), "session ended"),
        Err(e) => {
            tracing::error!(session = %sl.tag, reason = reason.as_str(), error = %e, "the end of a session is not logged yet (the log retries it)")
        }
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod adversary18;
