//! The oracle: what every client must have seen, checked as it is seen.
//!
//! The demo upstream numbers the `emit` notifications of each of its sessions 1, 2, 3, … and every
//! proxy session has exactly one upstream session, so a client knows exactly what the upstream
//! emitted before each `emit` response. On top of that the proxy's own ids must be contiguous per
//! connection, a re-delivered id must carry the same bytes as the first time, and every refusal
//! must be explained by something the harness did (a trim it can bound, a relaxed-mode crash, a
//! fault that ended the session).

use std::collections::{BTreeMap, HashMap};
use std::hash::{Hash, Hasher};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use serde_json::Value;
use tokio::time::Instant;

use super::procs::Mode;
use super::wire::SseEvent;

/// How long an accepted request may stay unanswered after it should have finished (and after the
/// last fault recovered) before it counts as hung.
pub const HUNG_BOUND: Duration = Duration::from_secs(30);

/// The faults the controller injects.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultKind {
    /// SIGKILL of the proxy, restart on the same data dir.
    ProxyKill,
    /// SIGKILL of the upstream, restart on the same port.
    UpstreamKill,
    /// SIGTERM of the proxy under load, restart.
    Sigterm,
}

/// One injected fault and when it happened.
#[derive(Clone, Debug)]
pub struct Fault {
    /// What.
    pub kind: FaultKind,
    /// Durability mode of the proxy instance it hit.
    pub mode: Mode,
    /// Just before the signal.
    pub begin: Instant,
    /// The process is gone (reaped).
    pub dead: Option<Instant>,
    /// The replacement is ready.
    pub ready: Option<Instant>,
}

/// Kinds of violations.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Violation {
    /// An event missing between two received ones (or an id reused for other content).
    SilentGap,
    /// An event received twice, or out of order.
    Duplicate,
    /// A request with no answer.
    Hung,
    /// A refusal (409/404) that no real gap explains.
    WrongRefusal,
    /// Anything else the contract forbids (an event without id, a bad status, a proxy that did
    /// not stop on SIGTERM, …).
    Protocol,
    /// A task whose handle the client holds answered as unknown before its TTL passed.
    TaskLost,
    /// A task still `working` when it cannot be (after a restart of the proxy that ran it, long
    /// after its upstream call should have finished, or at the end of the run).
    TaskStuck,
    /// Another identity's `tasks/get` or `tasks/cancel` was answered otherwise than an unknown
    /// id is.
    TaskForeignVisible,
    /// A task resolved to something its history does not explain: another result than the
    /// upstream's, `cancelled` without a cancel, `failed` without a fault, a terminal state that
    /// changed, a task still served after its TTL.
    TaskWrong,
    /// The 2026-07-28 workload did too little for its zeros to mean anything (no tasks, none
    /// completed, none read across a proxy restart in a run that had restarts, no foreign poll).
    Unexercised,
}

/// Counters of the run.
#[derive(Default, Debug)]
pub struct Stats {
    pub sessions: u64,
    pub events: u64,
    pub emit_events: u64,
    pub disconnects: u64,
    pub mid_event_cuts: u64,
    pub replay_cuts: u64,
    pub stale_resumes: u64,
    pub takeovers: u64,
    pub long_pauses: u64,
    pub server_ends: u64,
    pub proxy_kills: u64,
    pub proxy_kills_relaxed: u64,
    pub double_kills: u64,
    pub upstream_kills: u64,
    pub sigterms: u64,
    pub resumes_served: u64,
    pub refusals: BTreeMap<String, u64>,
    pub requests: u64,
    pub answered: u64,
    pub aborted: u64,
    pub post_gone: u64,
    pub post_errors: u64,
    pub post_unknown: u64,
    pub relaxed_unanswered: u64,
    pub refused_unanswered: u64,
    pub redelivered: u64,
    pub keepalives: u64,
    pub orphaned: u64,
    pub open_failed: u64,
    pub rotated: u64,
    pub complete_ends: u64,
    pub forks: u64,
    pub idle_ends: u64,
    pub tasks: u64,
    pub tasks_completed: u64,
    pub tasks_failed_32091: u64,
    pub tasks_cancelled: u64,
    pub tasks_expired: u64,
    pub tasks_unresolved: u64,
    pub tasks_across_restart: u64,
    pub tasks_failed_by_restart: u64,
    pub tasks_rechecked: u64,
    pub modern_calls: u64,
    pub modern_streams: u64,
    pub modern_immediate: u64,
    pub modern_call_cuts: u64,
    pub modern_call_failed: u64,
    pub modern_aborted: u64,
    pub modern_unavailable: u64,
    pub task_polls: u64,
    pub task_poll_cuts: u64,
    pub task_poll_failed: u64,
    pub task_cancels: u64,
    pub foreign_polls: u64,
    pub violations: BTreeMap<Violation, u64>,
    pub details: Vec<String>,
}

impl Stats {
    /// Count of one kind of violation.
    pub fn count(&self, v: Violation) -> u64 {
        self.violations.get(&v).copied().unwrap_or(0)
    }
}

/// What every task shares.
pub struct Shared {
    /// Start of the run.
    pub t0: Instant,
    /// The seed.
    pub seed: u64,
    /// The proxy's client address.
    pub addr: SocketAddr,
    /// `log.max_events_per_session`.
    pub max_events: u64,
    /// `sessions.idle_ttl_secs`.
    pub idle_ttl: Duration,
    /// `tasks.ttl_secs`.
    pub task_ttl: Duration,
    /// Task ids handed out, with the worker that holds each (for foreign polls).
    task_ids: Mutex<Vec<(u64, String)>>,
    stop: AtomicBool,
    hard_deadline: Mutex<Option<Instant>>,
    faults: Mutex<Vec<Fault>>,
    stats: Mutex<Stats>,
}

impl Shared {
    /// New shared state.
    pub fn new(
        seed: u64,
        addr: SocketAddr,
        max_events: u64,
        idle_ttl: Duration,
        task_ttl: Duration,
    ) -> Self {
        Self {
            t0: Instant::now(),
            seed,
            addr,
            max_events,
            idle_ttl,
            task_ttl,
            task_ids: Mutex::new(Vec::new()),
            stop: AtomicBool::new(false),
            hard_deadline: Mutex::new(None),
            faults: Mutex::new(Vec::new()),
            stats: Mutex::new(Stats::default()),
        }
    }

    /// The counters.
    pub fn stats(&self) -> MutexGuard<'_, Stats> {
        self.stats.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn faults(&self) -> MutexGuard<'_, Vec<Fault>> {
        self.faults.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Seconds since the start, for messages.
    pub fn at(&self, t: Instant) -> f64 {
        t.saturating_duration_since(self.t0).as_secs_f64()
    }

    /// Records a violation.
    pub fn violation(&self, kind: Violation, msg: String) {
        let t = self.at(Instant::now());
        let mut st = self.stats();
        *st.violations.entry(kind).or_default() += 1;
        if st.details.len() < 40 {
            st.details.push(format!("[t={t:.3}s] {kind:?}: {msg}"));
        }
    }

    /// Wind-down: no new sessions or requests; outstanding ones get until `hard_deadline`.
    pub fn begin_stop(&self, hard_deadline: Instant) {
        *self.hard_deadline.lock().unwrap_or_else(|e| e.into_inner()) = Some(hard_deadline);
        self.stop.store(true, Ordering::SeqCst);
    }

    /// Is the run winding down?
    pub fn stopping(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    /// When winding down must be over.
    pub fn hard_deadline(&self) -> Option<Instant> {
        *self.hard_deadline.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A fault starts now; returns its index.
    pub fn fault_begin(&self, kind: FaultKind, mode: Mode) -> usize {
        let mut f = self.faults();
        f.push(Fault {
            kind,
            mode,
            begin: Instant::now(),
            dead: None,
            ready: None,
        });
        f.len() - 1
    }

    /// The process hit by fault `i` is gone.
    pub fn fault_dead(&self, i: usize) {
        self.faults()[i].dead = Some(Instant::now());
    }

    /// Fault `i` is recovered from.
    pub fn fault_ready(&self, i: usize) {
        self.faults()[i].ready = Some(Instant::now());
    }

    /// The faults so far (for the report).
    pub fn fault_log(&self) -> Vec<Fault> {
        self.faults().clone()
    }

    /// Could a fault have ended a session created at `created`, as observed at `at`?
    pub fn end_explained(&self, created: Instant, at: Instant) -> bool {
        self.faults()
            .iter()
            .any(|f| f.begin < at && f.ready.is_none_or(|r| r > created))
    }

    /// Was a relaxed-mode proxy SIGKILLed after `after` (its process still alive then) and
    /// before `before`?
    pub fn relaxed_kill_between(&self, after: Instant, before: Instant) -> bool {
        self.faults().iter().any(|f| {
            f.kind == FaultKind::ProxyKill
                && f.mode == Mode::Relaxed
                && f.begin < before
                && f.dead.is_none_or(|d| d > after)
        })
    }

    /// Did a fault (of any kind) overlap `[a, b]`, or end less than `slack` before `a`? (From
    /// its signal until the replacement is ready; one in progress lasts until now.)
    pub fn fault_near(&self, a: Instant, b: Instant, slack: Duration) -> bool {
        let now = Instant::now();
        self.faults()
            .iter()
            .any(|f| f.begin <= b && f.ready.unwrap_or(now) + slack >= a)
    }

    /// Was the proxy process that was running at `a` replaced by one that was ready before `b`
    /// (a SIGKILL or SIGTERM began after `a` and its replacement was ready before `b`)?
    pub fn proxy_restarted_between(&self, a: Instant, b: Instant) -> bool {
        self.faults().iter().any(|f| {
            f.kind != FaultKind::UpstreamKill && f.begin > a && f.ready.is_some_and(|r| r < b)
        })
    }

    /// Worker `owner` holds task `id`.
    pub fn task_created(&self, owner: u64, id: &str) {
        let mut t = self.task_ids.lock().unwrap_or_else(|e| e.into_inner());
        if t.len() >= 500 {
            t.remove(0);
        }
        t.push((owner, id.to_string()));
    }

    /// A task id held by another worker than `me` (picked with `pick`).
    pub fn foreign_task(&self, me: u64, pick: u64) -> Option<String> {
        let t = self.task_ids.lock().unwrap_or_else(|e| e.into_inner());
        let theirs: Vec<&String> = t
            .iter()
            .filter(|(o, _)| *o != me)
            .map(|(_, id)| id)
            .collect();
        (!theirs.is_empty()).then(|| theirs[(pick % theirs.len() as u64) as usize].clone())
    }

    /// When the last fault was recovered from (now while one is in progress).
    pub fn last_recovery(&self) -> Option<Instant> {
        let now = Instant::now();
        self.faults().iter().map(|f| f.ready.unwrap_or(now)).max()
    }
}

/// How a request stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReqState {
    /// The POST is on its way (its answer may already arrive on the stream).
    Posting,
    /// 202: the proxy took it; an answer must come on the stream.
    Accepted,
    /// The POST got no response: it may or may not have arrived.
    Uncertain,
    /// 504: the proxy keeps it in flight; an answer may still come.
    TimedOut,
}

/// One request of a session.
#[derive(Clone, Debug)]
pub struct Req {
    /// `initialize`, `emit`, `echo`.
    pub method: &'static str,
    /// When it was sent.
    pub issued: Instant,
    /// How long it should take.
    pub expect: Duration,
    /// `emit` count.
    pub count: u64,
    /// State.
    pub state: ReqState,
    /// Wall clock (ns) when the 202 arrived: an event the upstream emitted later was logged after
    /// this request's in-flight record.
    pub accepted_wall_ns: u128,
}

#[derive(Clone, Copy, Debug)]
struct Seen {
    epoch: u32,
    digest: u64,
    recv: Instant,
}

/// Per connection: the id of the last event it delivered (or its cursor).
#[derive(Debug)]
pub struct ConnState {
    /// The previous id on this connection (the cursor at first).
    pub prev: Option<(u32, u64)>,
    /// A resume (`Last-Event-ID`)?
    pub resume: bool,
    /// Wall clock at connect, ns (compared with the upstream's `t_ns`).
    pub started_wall_ns: u128,
    /// Was the last event on this connection a replay (emitted before the connection)?
    pub last_replay: bool,
    /// Events delivered on this connection.
    pub events: u64,
}

impl ConnState {
    /// A new connection after `cursor`.
    pub fn new(cursor: Option<(u32, u64)>) -> Self {
        Self {
            prev: cursor,
            resume: cursor.is_some(),
            started_wall_ns: wall_ns(),
            last_replay: false,
            events: 0,
        }
    }
}

/// Wall clock in ns.
pub fn wall_ns() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}

/// Parses `{session}:{epoch}:{seq}`.
pub fn parse_id(id: &str) -> Option<(&str, u32, u64)> {
    let mut p = id.split(':');
    let (s, e, q) = (p.next()?, p.next()?, p.next()?);
    if p.next().is_some() || s.len() != 32 {
        return None;
    }
    Some((s, e.parse().ok()?, q.parse().ok()?))
}

fn digest(b: &[u8]) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    b.hash(&mut h);
    h.finish()
}

/// What the oracle knows about one session, from its client's side.
pub struct Sess {
    /// Session id.
    pub sid: String,
    /// When its `endpoint` event arrived.
    pub created: Instant,
    /// The highest id delivered.
    pub last: Option<(u32, u64)>,
    seen: BTreeMap<u64, Seen>,
    /// Highest `emit` seq received.
    pub last_emit: u64,
    /// `emit` events the completed calls account for.
    pub emit_done: u64,
    /// The `emit` call in flight.
    pub emit_inflight: Option<u64>,
    /// Requests not answered yet.
    pub reqs: HashMap<u64, Req>,
    /// Requests POSTed (an upper bound on responses).
    pub sent_requests: u64,
    /// Sum of the `count` of every `emit` POSTed.
    pub emit_requested: u64,
    /// Next request id.
    pub next_id: u64,
    /// `initialize` answered.
    pub initialized: bool,
    /// `notifications/initialized` sent.
    pub init_notified: bool,
    /// A -32091 arrived: the session is ending.
    pub aborted: bool,
    /// A POST got 404.
    pub gone: bool,
    /// A POST failed: send nothing more, rotate once answered.
    pub soft_done: bool,
    /// Completed `emit` calls.
    pub emits_completed: u64,
    /// Since when no connection of the client is open (from the client's side).
    pub detached_since: Option<Instant>,
    /// Longest such period so far.
    pub max_detach: Duration,
    /// Latest upstream emit time (`t_ns`) among the events delivered.
    pub max_emit_t_ns: u128,
    /// A stale resume continued on a newer epoch than events delivered before (see
    /// [`Sess::on_message`]): the client's own history forked, so it starts over.
    pub forked: bool,
}

impl Sess {
    /// A session whose endpoint arrived now.
    pub fn new(sid: String) -> Self {
        Self {
            sid,
            created: Instant::now(),
            last: None,
            seen: BTreeMap::new(),
            last_emit: 0,
            emit_done: 0,
            emit_inflight: None,
            reqs: HashMap::new(),
            sent_requests: 0,
            emit_requested: 0,
            next_id: 1,
            initialized: false,
            init_notified: false,
            aborted: false,
            gone: false,
            soft_done: false,
            emits_completed: 0,
            detached_since: None,
            max_detach: Duration::ZERO,
            forked: false,
            max_emit_t_ns: 0,
        }
    }

    /// The client has no connection from now on.
    pub fn detach(&mut self) {
        self.detached_since.get_or_insert_with(Instant::now);
    }

    /// The client is connected again (or was just answered).
    pub fn attach(&mut self) {
        if let Some(t) = self.detached_since.take() {
            self.max_detach = self.max_detach.max(t.elapsed());
        }
    }

    fn short(&self) -> &str {
        &self.sid[..8]
    }

    /// Requests accepted or being posted, not answered yet.
    pub fn outstanding(&self) -> usize {
        self.reqs
            .values()
            .filter(|r| matches!(r.state, ReqState::Accepted | ReqState::Posting))
            .count()
    }

    /// The cursor string of `(epoch, seq)`.
    pub fn cursor(&self, c: (u32, u64)) -> String {
        format!("{}:{}:{}", self.sid, c.0, c.1)
    }

    /// A cursor `back` events before the newest (by delivered id).
    pub fn stale_cursor(&self, back: usize) -> Option<(u32, u64)> {
        self.seen
            .iter()
            .rev()
            .nth(back)
            .map(|(seq, s)| (s.epoch, *seq))
    }

    /// Events delivered so far.
    pub fn seen_len(&self) -> usize {
        self.seen.len()
    }

    /// One `message` event on a connection of this session.
    pub fn on_message(&mut self, sh: &Shared, conn: &mut ConnState, ev: &SseEvent) {
        let Some(id) = ev.id.as_deref() else {
            sh.violation(
                Violation::Protocol,
                format!("session {}: message event without an id (I5)", self.short()),
            );
            return;
        };
        let Some((sid, epoch, seq)) = parse_id(id) else {
            sh.violation(Violation::Protocol, format!("malformed event id {id:?}"));
            return;
        };
        if sid != self.sid {
            sh.violation(
                Violation::Protocol,
                format!("event {id} on a stream of session {}", self.sid),
            );
            return;
        }
        match conn.prev {
            None if seq != 1 => sh.violation(
                Violation::SilentGap,
                format!(
                    "first event of new session {} is {epoch}:{seq}",
                    self.short()
                ),
            ),
            None => {}
            Some((pe, ps)) => {
                if seq > ps + 1 {
                    sh.violation(
                        Violation::SilentGap,
                        format!(
                            "session {}: stream after {pe}:{ps} delivered {epoch}:{seq} (resume={}, events on conn={})",
                            self.short(),
                            conn.resume,
                            conn.events
                        ),
                    );
                } else if seq <= ps {
                    sh.violation(
                        Violation::Duplicate,
                        format!(
                            "session {}: stream after {pe}:{ps} went back to {epoch}:{seq}",
                            self.short()
                        ),
                    );
                }
                if epoch < pe {
                    sh.violation(
                        Violation::Duplicate,
                        format!(
                            "session {}: epoch went back {pe} -> {epoch} at seq {seq}",
                            self.short()
                        ),
                    );
                }
            }
        }
        conn.prev = Some((epoch, seq));
        conn.events += 1;
        let d = digest(&ev.data);
        if let Some((_, ls)) = self.last {
            if seq <= ls {
                match self.seen.get(&seq) {
                    Some(s) if s.epoch == epoch && s.digest == d => {
                        sh.stats().redelivered += 1;
                        conn.last_replay = true;
                    }
                    Some(s)
                        if epoch > s.epoch
                            && sh.relaxed_kill_between(s.recv, Instant::now()) =>
                    {
                        // A relaxed-mode crash lost the tail from here on (the client's events
                        // {s.epoch}:{seq}.. were never durable) and the epoch was sealed before it:
                        // a cursor from the durable part (a stale one: the newest gets
                        // cursor_ahead) continues on the new epoch. Ids differ, so this is no
                        // reuse; the client, which chose the old cursor, reconciles.
                        sh.stats().forks += 1;
                        self.forked = true;
                    }
                    Some(s) if epoch > s.epoch => sh.violation(
                        Violation::SilentGap,
                        format!(
                            "session {}: {epoch}:{seq} delivered where {}:{seq} was delivered before, with no relaxed-mode crash since",
                            self.short(),
                            s.epoch
                        ),
                    ),
                    Some(s) => sh.violation(
                        Violation::SilentGap,
                        format!(
                            "session {}: id {epoch}:{seq} re-delivered with other content than when first seen as {}:{seq} (an id was reused; whatever it named first is lost to resumers)",
                            self.short(),
                            s.epoch
                        ),
                    ),
                    None => sh.violation(
                        Violation::Protocol,
                        format!("session {}: re-delivered id {epoch}:{seq} never seen", self.short()),
                    ),
                }
                return;
            }
        }
        self.last = Some((epoch, seq));
        self.seen.insert(
            seq,
            Seen {
                epoch,
                digest: d,
                recv: Instant::now(),
            },
        );
        sh.stats().events += 1;
        let Ok(v) = serde_json::from_slice::<Value>(&ev.data) else {
            sh.violation(
                Violation::Protocol,
                format!("session {}: event {id} is not JSON", self.short()),
            );
            return;
        };
        if v["method"] == "notifications/message" && v["params"]["logger"] == "emit" {
            let t_ns = v["params"]["data"]["t_ns"].as_u64().unwrap_or(0) as u128;
            conn.last_replay = t_ns < conn.started_wall_ns;
            self.max_emit_t_ns = self.max_emit_t_ns.max(t_ns);
            self.on_emit(sh, id, &v);
        } else if v.get("result").is_some() || v.get("error").is_some() {
            conn.last_replay = false;
            self.on_response(sh, id, &v);
        } else {
            conn.last_replay = false;
        }
    }

    fn on_emit(&mut self, sh: &Shared, id: &str, v: &Value) {
        sh.stats().emit_events += 1;
        let Some(s) = v["params"]["data"]["seq"].as_u64() else {
            sh.violation(Violation::Protocol, format!("emit event {id} without seq"));
            return;
        };
        if self.aborted {
            sh.violation(
                Violation::Protocol,
                format!(
                    "session {}: emit seq {s} ({id}) logged after the session's -32091",
                    self.short()
                ),
            );
        }
        if self.emit_inflight.is_none() {
            sh.violation(
                Violation::Duplicate,
                format!(
                    "session {}: emit seq {s} ({id}) with no emit call in flight",
                    self.short()
                ),
            );
        }
        if s > self.last_emit + 1 {
            sh.violation(
                Violation::SilentGap,
                format!(
                    "session {}: upstream emit seq jumped {} -> {s} at {id}",
                    self.short(),
                    self.last_emit
                ),
            );
        } else if s <= self.last_emit {
            sh.violation(
                Violation::Duplicate,
                format!(
                    "session {}: upstream emit seq {s} after {} at {id}",
                    self.short(),
                    self.last_emit
                ),
            );
        }
        self.last_emit = self.last_emit.max(s);
    }

    fn on_response(&mut self, sh: &Shared, id: &str, v: &Value) {
        let Some(rid) = v["id"].as_u64() else {
            sh.violation(
                Violation::Protocol,
                format!("response {id} without a numeric id: {v}"),
            );
            return;
        };
        let Some(req) = self.reqs.remove(&rid) else {
            sh.violation(
                Violation::Duplicate,
                format!(
                    "session {}: answer {id} to request {rid}, which is not awaiting one (answered twice?)",
                    self.short()
                ),
            );
            return;
        };
        sh.stats().answered += 1;
        if let Some(err) = v.get("error") {
            let code = err["code"].as_i64().unwrap_or(0);
            if code == -32091 {
                self.aborted = true;
                sh.stats().aborted += 1;
                if err["data"]["reason"].as_str().is_none() {
                    sh.violation(
                        Violation::Protocol,
                        format!("-32091 without data.reason: {v}"),
                    );
                }
            } else if code != -32092 {
                sh.violation(
                    Violation::Protocol,
                    format!(
                        "session {}: unexpected error answer to {} {rid}: {v}",
                        self.short(),
                        req.method
                    ),
                );
            }
            if req.method == "emit" {
                self.emit_inflight = None;
                self.soft_done = true;
            }
            return;
        }
        match req.method {
            "emit" => {
                let expected = self.emit_done + req.count;
                if self.last_emit != expected {
                    let kind = if self.last_emit < expected {
                        Violation::SilentGap
                    } else {
                        Violation::Duplicate
                    };
                    sh.violation(
                        kind,
                        format!(
                            "session {}: emit call {rid} (count {}) answered at {id} after emit seq {}, expected {expected}",
                            self.short(),
                            req.count,
                            self.last_emit
                        ),
                    );
                }
                self.emit_done = self.last_emit.max(expected);
                self.emit_inflight = None;
                self.emits_completed += 1;
            }
            "initialize" => {
                if v["result"]["protocolVersion"].as_str().is_none() {
                    sh.violation(Violation::Protocol, format!("bad initialize result {v}"));
                }
                self.initialized = true;
            }
            _ => {}
        }
    }

    /// A request is overdue? Returns true (after recording it) when one hung.
    pub fn check_hung(&mut self, sh: &Shared, now: Instant) -> bool {
        let recovered = sh.last_recovery();
        let hung: Vec<u64> = self
            .reqs
            .iter()
            .filter(|(_, r)| r.state == ReqState::Accepted)
            .filter(|(_, r)| {
                let due = (r.issued + r.expect).max(recovered.unwrap_or(r.issued));
                now > due + HUNG_BOUND
            })
            .map(|(id, _)| *id)
            .collect();
        for id in &hung {
            let r = self.reqs.remove(id).expect("listed");
            sh.violation(
                Violation::Hung,
                format!(
                    "session {}: request {id} ({}) accepted at t={:.3}s unanswered for {:.1}s (last id {:?}, aborted={}, gone={})",
                    self.sid,
                    r.method,
                    sh.at(r.issued),
                    now.duration_since(r.issued).as_secs_f64(),
                    self.last,
                    self.aborted,
                    self.gone
                ),
            );
        }
        !hung.is_empty()
    }

    /// The proxy said the session is gone (`what`): a fault, or a client absence of at least
    /// `sessions.idle_ttl_secs`, must explain it.
    pub fn check_gone(&self, sh: &Shared, what: &str) {
        let now = Instant::now();
        let detach = self
            .max_detach
            .max(self.detached_since.map_or(Duration::ZERO, |t| t.elapsed()));
        if detach >= sh.idle_ttl {
            sh.stats().idle_ends += 1;
            return;
        }
        if sh.end_explained(self.created, now) {
            return;
        }
        sh.violation(
            Violation::WrongRefusal,
            format!(
                "session {}: {what} although no fault since its start at t={:.3}s could have ended it and the client was never away longer than {:.1}s (idle ttl {}s)",
                self.sid,
                sh.at(self.created),
                detach.as_secs_f64(),
                sh.idle_ttl.as_secs()
            ),
        );
    }

    /// A resume with the newest cursor got 404: the client has read the session's complete
    /// history, so every accepted request must have been answered (I6) — unless a relaxed-mode
    /// crash lost its in-flight record.
    pub fn check_complete_end(&mut self, sh: &Shared) {
        let now = Instant::now();
        sh.stats().complete_ends += 1;
        let mut left: Vec<(u64, Req)> = self.reqs.drain().collect();
        left.sort_by_key(|(id, _)| *id);
        for (id, r) in left {
            if r.state != ReqState::Accepted {
                continue;
            }
            // A relaxed-mode crash may lose the in-flight record of a request — but not one
            // written before an event the client was delivered and could still resume after
            // (one the upstream emitted after the 202): sled recovers a prefix of its writes.
            let later_event_durable = self.max_emit_t_ns > r.accepted_wall_ns;
            if !later_event_durable && sh.relaxed_kill_between(r.issued, now) {
                sh.stats().relaxed_unanswered += 1;
            } else {
                sh.violation(
                    Violation::Hung,
                    format!(
                        "session {}: request {id} ({}) accepted at t={:.3}s; the session's history ended (resume after {:?} -> 404) without its answer (I6)",
                        self.sid,
                        r.method,
                        sh.at(r.issued),
                        self.last
                    ),
                );
            }
        }
    }

    /// A 409/400 answer to a resume after `cursor`: it must match a real gap. Returns the reason.
    pub fn check_refusal(
        &self,
        sh: &Shared,
        status: u16,
        body: &str,
        cursor: (u32, u64),
    ) -> String {
        let now = Instant::now();
        let v: Value = serde_json::from_str(body).unwrap_or(Value::Null);
        let reason = v["error"]["data"]["reason"]
            .as_str()
            .unwrap_or("unparsable")
            .to_string();
        if v["error"]["code"] != -32090 {
            sh.violation(
                Violation::Protocol,
                format!("refusal {status} without code -32090: {body}"),
            );
        }
        let seq_of = |k: &str| {
            v["error"]["data"][k]
                .as_str()
                .and_then(parse_id)
                .map(|(_, e, s)| (e, s))
        };
        let head = seq_of("log_head");
        let oldest = seq_of("oldest_retained");
        let ctx = format!(
            "session {} cursor {}:{} ({status} {reason}): log_head={head:?} oldest_retained={oldest:?} last_delivered={:?} sent_requests={} emit_requested={}",
            self.sid, cursor.0, cursor.1, self.last, self.sent_requests, self.emit_requested
        );
        match reason.as_str() {
            "cursor_trimmed" => {
                let m = sh.max_events;
                let ub = self.sent_requests + self.emit_requested + 2;
                let relaxed = sh.relaxed_kill_between(self.created, now);
                let why = match (head, oldest) {
                    (Some((_, h)), Some((_, o))) => {
                        if cursor.1 + 1 >= o {
                            Some("the event after the cursor is retained".to_string())
                        } else if h + 1 - o < m - m / 10 {
                            Some(format!(
                                "only {} events retained, trimming keeps at least {}",
                                h + 1 - o,
                                m - m / 10
                            ))
                        } else if h > ub {
                            Some(format!(
                                "log head {h} exceeds the {ub} events this session can have logged"
                            ))
                        } else if !relaxed && h < self.last.map_or(0, |l| l.1) {
                            Some("log head is behind what the client was delivered".into())
                        } else {
                            None
                        }
                    }
                    _ => Some("refusal lacks log_head/oldest_retained".into()),
                };
                if let Some(why) = why {
                    sh.violation(Violation::WrongRefusal, format!("{ctx}: {why}"));
                }
            }
            "cursor_ahead" => {
                let recv = self.seen.get(&cursor.1).map_or(self.created, |s| s.recv);
                if !sh.relaxed_kill_between(recv, now) {
                    sh.violation(
                        Violation::WrongRefusal,
                        format!("{ctx}: no relaxed-mode crash since the cursor was delivered"),
                    );
                } else if head.is_some_and(|(e, _)| e <= cursor.0) {
                    sh.violation(
                        Violation::WrongRefusal,
                        format!("{ctx}: cursor_ahead but the head is still in the cursor's epoch"),
                    );
                }
            }
            _ => sh.violation(
                Violation::WrongRefusal,
                format!("{ctx}: a cursor this proxy issued refused as {reason}: {body}"),
            ),
        }
        reason
    }
}
