//! The 2026-07-28 workload: clients of the stateless face (raw HTTP, no SDK) with one identity
//! each (`Authorization`), calling the demo upstream's `count` tool long enough that it becomes a
//! task (`tasks.mode = "after"`), then polling `tasks/get` across the harness's faults — cuts of
//! their own connections, proxy SIGKILLs and SIGTERMs, upstream SIGKILLs. Now and then they cancel
//! a task, go away for a while, re-read a finished task later (often after a restart), wait for
//! one to pass its TTL, or ask for another worker's task with their own identity.
//!
//! The oracle here checks the tasks contract of design.md §12 per answer:
//!
//! - a task whose handle the client holds is never unknown before its TTL (`tasks_lost`);
//! - never `working` once the proxy process that ran it is gone, nor long after it should have
//!   finished, nor at the end of the run (`tasks_stuck`);
//! - another identity's `tasks/get` / `tasks/cancel` gets exactly the answer an unknown id gets
//!   (`foreign_visible`);
//! - what a task resolves to is explained by its history (`tasks_wrong`): `completed` only with
//!   the upstream's answer (`counted N`) and not before the upstream could have given it;
//!   `failed` only with -32091, and only when a fault began while it ran; `cancelled` only after
//!   this client sent `tasks/cancel`; a terminal state never changes; `statusMessage` progress
//!   belongs to this task's call and never goes back.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use tokio::time::{sleep, Instant};

use super::oracle::{wall_ns, Shared, Violation};
use super::rng::Rng;
use super::wire::{self, Cut, Reply};

/// `tasks.after_ms` of the proxy under test: a call still unanswered after this becomes a task.
pub const TASK_AFTER_MS: u64 = 300;
/// `tasks.poll_interval_ms`.
pub const TASK_POLL_MS: u64 = 500;
/// `tasks.ttl_secs`: short, so that tasks created early in a run can be seen to expire.
pub const TASK_TTL_SECS: u64 = 40;
/// How long past the later of "its upstream call should have finished" and "the last fault was
/// recovered from" a task may still be `working` before it counts as stuck.
pub const STUCK_BOUND: Duration = Duration::from_secs(20);
/// After an acknowledged `tasks/cancel`, how long a task may still say `working`.
const CANCEL_BOUND: Duration = Duration::from_secs(10);
/// A task acknowledged cancelled this long before its upstream call could have answered must not
/// complete (the cancel had that long to reach the task).
const CANCEL_MARGIN: Duration = Duration::from_secs(3);
/// A request with no answer, or a refusal, must have a fault within this of it.
const FAULT_SLACK: Duration = Duration::from_secs(5);
/// How long a POST may take.
const WAIT: Duration = Duration::from_secs(20);
/// Most unresolved tasks a worker holds at once.
const MAX_LIVE: usize = 3;
const VERSION: &str = "2026-07-28";
const TASKS_EXT: &str = "io.modelcontextprotocol/tasks";
const ABORTED: i64 = -32091;

fn wall_ms() -> u64 {
    (wall_ns() / 1_000_000) as u64
}

/// Parses the proxy's ISO 8601 UTC times (`2026-12-01T11:46:18.806Z`) to Unix milliseconds.
pub fn parse_iso_ms(s: &str) -> Option<u64> {
    let b = s.as_bytes();
    let seps = [
        (4, b'-'),
        (7, b'-'),
        (10, b'T'),
        (13, b':'),
        (16, b':'),
        (19, b'.'),
        (23, b'Z'),
    ];
    if b.len() != 24 || seps.iter().any(|&(i, c)| b[i] != c) {
        return None;
    }
    let n = |r: std::ops::Range<usize>| s.get(r)?.parse::<i64>().ok();
    let (y, m, d) = (n(0..4)?, n(5..7)?, n(8..10)?);
    let (hh, mm, ss, ms) = (n(11..13)?, n(14..16)?, n(17..19)?, n(20..23)?);
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * ((m + 9) % 12) + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    u64::try_from((days * 86_400 + hh * 3600 + mm * 60 + ss) * 1000 + ms).ok()
}

/// How a task ended, as the client saw it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Terminal {
    Completed,
    Failed(i64),
    Cancelled,
}

/// A task whose handle this client holds.
struct Task {
    id: String,
    /// `count` arguments: the upstream answers `counted {n}` after `n × interval` ms at least.
    n: u64,
    interval: u64,
    /// When the `tools/call` was sent.
    sent: Instant,
    /// When its `CreateTaskResult` arrived.
    handle: Instant,
    /// `createdAt + ttlMs`, Unix ms.
    expiry_ms: u64,
    terminal: Option<Terminal>,
    /// The result, once completed.
    result: Option<Value>,
    cancel_sent: Option<Instant>,
    cancel_acked: Option<Instant>,
    /// Highest `statusMessage` step seen.
    progress: u64,
    /// Last answer was `working` (to a poll sent then).
    last_working: Option<Instant>,
    /// Latest `lastUpdatedAt` seen, Unix ms.
    last_updated_ms: u64,
    /// Counted in `tasks_across_restart`.
    crossed: bool,
    /// Next poll.
    next: Instant,
    /// Re-reads left once terminal.
    rechecks: u32,
    /// Once terminal, keep it until its TTL has passed and check that it is gone.
    watch_expiry: bool,
    /// Reported (lost, stuck): forget it.
    dropped: bool,
}

impl Task {
    fn run_time(&self) -> Duration {
        Duration::from_millis(self.n * self.interval)
    }
}

/// A JSON-RPC exchange's outcome.
enum Answer {
    /// The response's `result`.
    Result(Value),
    /// The response's `error`.
    Error(Value),
    /// An HTTP error status without a JSON-RPC answer to the request.
    Refused(u16, String),
    /// The client cut it.
    Cut,
    /// Not delivered (no connection).
    NotSent,
    /// Sent; no complete answer came.
    Lost,
}

struct Client {
    sh: Arc<Shared>,
    w: u64,
    auth: String,
    rng: Rng,
    next_id: u64,
    /// What `tasks/get` of an id that was never a task answers (the `error` object).
    unknown: Option<Value>,
}

/// Runs a 2026-07-28 client until the run winds down and its tasks are resolved.
pub async fn worker(sh: Arc<Shared>, w: u64, end: Instant) {
    let mut c = Client {
        rng: Rng::fork(sh.seed, 5000 + w),
        auth: format!("Bearer chaos-modern-{w}-{}", sh.seed),
        sh,
        w,
        next_id: 1,
        unknown: None,
    };
    sleep(c.rng.ms(0, 500)).await;
    let mut live: Vec<Task> = Vec::new();
    let mut done: Vec<Task> = Vec::new();
    let mut next_call = Instant::now();
    let mut next_foreign = Instant::now() + c.rng.ms(1000, 4000);
    loop {
        let now = Instant::now();
        let stopping = c.sh.stopping();
        if let Some(hard) = c.sh.hard_deadline() {
            if now > hard {
                for t in &live {
                    c.sh.stats().tasks_unresolved += 1;
                    c.sh.violation(
                        Violation::TaskStuck,
                        format!(
                            "task {} ({}): still unresolved at the end of the run (created at t={:.3}s, should have finished by t={:.3}s; last seen working: {})",
                            t.id,
                            c.who(),
                            c.sh.at(t.sent),
                            c.sh.at(t.sent + t.run_time()),
                            t.last_working.map_or("never".into(), |p| format!("t={:.3}s", c.sh.at(p)))
                        ),
                    );
                }
                return;
            }
        }
        if stopping {
            done.clear();
            if live.is_empty() {
                return;
            }
        }
        if c.unknown.is_none() {
            c.learn_unknown().await;
        }
        if !stopping && c.unknown.is_some() && live.len() < MAX_LIVE && now >= next_call {
            if let Some(t) = c.call().await {
                live.push(t);
            }
            next_call = Instant::now() + c.rng.ms(200, 2500);
        }
        for t in live.iter_mut().filter(|t| t.next <= Instant::now()) {
            if t.cancel_sent.is_none() && !stopping && c.rng.chance(0.06) {
                c.cancel(t).await;
            } else {
                c.poll(t).await;
            }
            t.next = Instant::now()
                + if c.rng.chance(0.1) {
                    // The client goes away for a while (no polls, nothing open).
                    c.rng.ms(2000, 8000)
                } else {
                    c.rng.ms(100, 1000)
                };
        }
        // Resolved tasks move on to the re-reads.
        let mut i = 0;
        while i < live.len() {
            if live[i].dropped || live[i].terminal.is_some() {
                let mut t = live.swap_remove(i);
                if !t.dropped {
                    t.rechecks = c.rng.range(1, 3) as u32;
                    // Only if its TTL passes before the run's end.
                    let ttl_left = t.expiry_ms.saturating_sub(wall_ms());
                    t.watch_expiry = c.rng.chance(0.4)
                        && Instant::now() + Duration::from_millis(ttl_left + 2000) < end;
                    t.next = Instant::now() + c.rng.ms(500, 10_000);
                    done.push(t);
                }
            } else {
                i += 1;
            }
        }
        for t in done.iter_mut().filter(|t| t.next <= Instant::now()) {
            c.recheck(t).await;
        }
        done.retain(|t| !t.dropped);
        if !stopping && c.unknown.is_some() && now >= next_foreign {
            c.foreign().await;
            next_foreign = Instant::now() + c.rng.ms(500, 4000);
        }
        let next = live
            .iter()
            .chain(done.iter())
            .map(|t| t.next)
            .chain([next_call, next_foreign])
            .min()
            .unwrap_or(now);
        let nap = next
            .saturating_duration_since(Instant::now())
            .clamp(Duration::from_millis(20), Duration::from_millis(300));
        sleep(nap).await;
    }
}

impl Client {
    fn who(&self) -> String {
        format!("modern worker {}", self.w)
    }

    /// POSTs one 2026-07-28 request (headers and `_meta` as the spec asks) and reads its answer.
    async fn post(
        &mut self,
        method: &str,
        name: &str,
        mut params: Value,
        progress: Option<&str>,
        cut: Cut,
    ) -> Answer {
        let id = self.next_id;
        self.next_id += 1;
        let mut meta = json!({
            "io.modelcontextprotocol/protocolVersion": VERSION,
            "io.modelcontextprotocol/clientCapabilities": {"extensions": {TASKS_EXT: {}}},
            "io.modelcontextprotocol/clientInfo": {"name": "chaos-modern", "version": "0"},
        });
        if let Some(p) = progress {
            meta["progressToken"] = json!(p);
        }
        params["_meta"] = meta;
        let body = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        let headers = [
            ("MCP-Protocol-Version", VERSION.to_string()),
            ("Mcp-Method", method.to_string()),
            ("Mcp-Name", name.to_string()),
            ("Authorization", self.auth.clone()),
        ];
        let reply = wire::post_modern(
            self.sh.addr,
            &headers,
            body.to_string().as_bytes(),
            WAIT,
            cut,
        )
        .await;
        self.answer(id, method, progress, reply)
    }

    fn protocol(&self, msg: String) {
        self.sh
            .violation(Violation::Protocol, format!("{}: {msg}", self.who()));
    }

    /// The JSON-RPC response to request `id` in `reply`, checking the stream around it.
    fn answer(&self, id: u64, method: &str, progress: Option<&str>, reply: Reply) -> Answer {
        let response = |v: &Value| -> Option<Answer> {
            if v["id"] != json!(id) || v["jsonrpc"] != "2.0" {
                self.protocol(format!("{method} {id} answered with another id: {v}"));
                return None;
            }
            match (v.get("result"), v.get("error")) {
                (Some(r), None) => Some(Answer::Result(r.clone())),
                (None, Some(e)) => Some(Answer::Error(e.clone())),
                _ => {
                    self.protocol(format!("{method} {id}: not a JSON-RPC response: {v}"));
                    None
                }
            }
        };
        match reply {
            Reply::Json(200, text) => match serde_json::from_str::<Value>(&text) {
                Ok(v) => response(&v).unwrap_or(Answer::Lost),
                Err(_) => {
                    self.protocol(format!(
                        "{method} {id}: 200 with a body that is not JSON: {text}"
                    ));
                    Answer::Lost
                }
            },
            Reply::Json(st, text) => {
                if (400..500).contains(&st) {
                    // The harness sends valid requests only.
                    self.protocol(format!(
                        "{method} {id}: a valid request refused {st}: {text}"
                    ));
                }
                Answer::Refused(st, text)
            }
            Reply::Sse(events) => {
                let mut out = None;
                for ev in events {
                    if ev.id.is_some() {
                        self.protocol(format!(
                            "{method} {id}: a 2026-07-28 stream event carries an id: {ev:?}"
                        ));
                    }
                    let Ok(v) = serde_json::from_slice::<Value>(&ev.data) else {
                        self.protocol(format!("{method} {id}: stream event not JSON: {ev:?}"));
                        continue;
                    };
                    if out.is_some() {
                        self.protocol(format!(
                            "{method} {id}: event after the response on its stream: {v}"
                        ));
                    }
                    if v.get("id").is_some() {
                        out = response(&v);
                        continue;
                    }
                    match v["method"].as_str() {
                        Some("notifications/progress") => {
                            if progress.is_none()
                                || v["params"]["progressToken"] != json!(progress)
                            {
                                self.protocol(format!(
                                    "{method} {id} (token {progress:?}): progress for another token: {v}"
                                ));
                            }
                        }
                        _ => self.protocol(format!(
                            "{method} {id}: unexpected message on its stream (no logLevel asked): {v}"
                        )),
                    }
                }
                out.unwrap_or(Answer::Lost)
            }
            Reply::Cut => Answer::Cut,
            Reply::NotSent => Answer::NotSent,
            Reply::Unknown => Answer::Lost,
        }
    }

    /// A cut for a poll: 10% of them.
    fn poll_cut(&mut self) -> Cut {
        if !self.rng.chance(0.1) {
            Cut::No
        } else if self.rng.chance(0.5) {
            Cut::After(self.rng.ms(0, 30))
        } else {
            Cut::AtByte(self.rng.range(1, 300) as usize)
        }
    }

    /// No answer, or a refusal: only a fault near `[sent, now]` explains it.
    fn unanswered(&self, what: &str, sent: Instant, how: &str) {
        if !self.sh.fault_near(sent, Instant::now(), FAULT_SLACK) {
            self.protocol(format!(
                "{what} sent at t={:.3}s: {how}, and no fault explains it",
                self.sh.at(sent)
            ));
        }
    }

    /// Learns what an unknown task id is answered with.
    async fn learn_unknown(&mut self) {
        let id = format!("{:016x}{:016x}", self.rng.next_u64(), self.rng.next_u64());
        let sent = Instant::now();
        match self
            .post("tasks/get", &id, json!({"taskId": id}), None, Cut::No)
            .await
        {
            Answer::Error(e) if e["code"] == -32602 => self.unknown = Some(e),
            Answer::Error(e) => self.protocol(format!("tasks/get of a random id answered {e}")),
            Answer::Result(r) => self.protocol(format!("a random id {id} is a task: {r}")),
            Answer::Refused(st, _) => self.unanswered("tasks/get", sent, &format!("refused {st}")),
            Answer::Lost => self.unanswered("tasks/get", sent, "no answer"),
            Answer::NotSent | Answer::Cut => sleep(self.rng.ms(100, 300)).await,
        }
    }

    /// `tools/call count`: a task when it takes longer than `tasks.after_ms`.
    async fn call(&mut self) -> Option<Task> {
        let quick = self.rng.chance(0.15);
        let (n, interval) = if quick {
            (1, 20)
        } else {
            (self.rng.range(3, 30), self.rng.range(100, 250))
        };
        let token = self
            .rng
            .chance(0.5)
            .then(|| format!("chaos-{}-{}", self.w, self.next_id));
        let cut = if self.rng.chance(0.1) {
            if self.rng.chance(0.5) {
                Cut::After(self.rng.ms(10, 600))
            } else {
                Cut::AtByte(self.rng.range(1, 300) as usize)
            }
        } else {
            Cut::No
        };
        {
            let mut st = self.sh.stats();
            st.modern_calls += 1;
            st.modern_streams += token.is_some() as u64;
        }
        let sent = Instant::now();
        let sent_ms = wall_ms();
        let args = json!({"name": "count", "arguments": {"n": n, "interval_ms": interval}});
        let a = self
            .post("tools/call", "count", args, token.as_deref(), cut)
            .await;
        let recv = Instant::now();
        let recv_ms = wall_ms();
        let run_time = Duration::from_millis(n * interval);
        match a {
            Answer::Cut => self.sh.stats().modern_call_cuts += 1,
            Answer::NotSent => {
                self.sh.stats().modern_call_failed += 1;
                self.unanswered("tools/call", sent, "no connection");
            }
            Answer::Lost => {
                self.sh.stats().modern_call_failed += 1;
                self.unanswered("tools/call", sent, "no complete answer");
            }
            Answer::Refused(st, body) => {
                self.sh.stats().modern_call_failed += 1;
                self.unanswered("tools/call", sent, &format!("refused {st}: {body}"));
            }
            Answer::Error(e) => {
                let code = e["code"].as_i64().unwrap_or(0);
                if code == ABORTED {
                    self.sh.stats().modern_aborted += 1;
                    self.unanswered("tools/call", sent, &format!("answered -32091 {e}"));
                } else if e["data"]["reason"] == "upstream_unavailable" {
                    self.sh.stats().modern_unavailable += 1;
                    self.unanswered("tools/call", sent, &format!("answered {e}"));
                } else {
                    self.protocol(format!("tools/call count({n}, {interval}) answered {e}"));
                }
            }
            Answer::Result(r) => match r["resultType"].as_str() {
                Some("complete") => {
                    self.sh.stats().modern_immediate += 1;
                    if r["content"][0]["text"] != format!("counted {n}") {
                        self.sh.violation(
                            Violation::TaskWrong,
                            format!("{}: tools/call count({n}) answered {r}", self.who()),
                        );
                    }
                    if run_time >= Duration::from_millis(TASK_AFTER_MS + 2000) {
                        self.protocol(format!(
                            "count({n}, {interval}) ran {:?} and was answered as a plain result, not made a task after tasks.after_ms",
                            recv - sent
                        ));
                    }
                    if recv < sent + run_time {
                        self.sh.violation(
                            Violation::TaskWrong,
                            format!(
                                "{}: count({n}, {interval}) answered after {:?}, before the upstream could have",
                                self.who(),
                                recv - sent
                            ),
                        );
                    }
                }
                Some("task") => return self.created(&r, n, interval, sent, recv, sent_ms, recv_ms),
                _ => self.protocol(format!(
                    "tools/call answered without a known resultType: {r}"
                )),
            },
        }
        None
    }

    /// Checks a `CreateTaskResult` and makes it a held task.
    #[allow(clippy::too_many_arguments)]
    fn created(
        &mut self,
        r: &Value,
        n: u64,
        interval: u64,
        sent: Instant,
        recv: Instant,
        sent_ms: u64,
        recv_ms: u64,
    ) -> Option<Task> {
        let id = r["taskId"].as_str().unwrap_or_default().to_string();
        let created = r["createdAt"].as_str().and_then(parse_iso_ms);
        let ttl = r["ttlMs"].as_u64();
        let well_formed = id.len() == 32
            && id.bytes().all(|b| b.is_ascii_hexdigit())
            && r["status"] == "working"
            && ttl == Some(self.sh.task_ttl.as_millis() as u64)
            && r["pollIntervalMs"] == TASK_POLL_MS
            && created.is_some_and(|c| c + 1000 >= sent_ms && c <= recv_ms + 1000);
        if !well_formed {
            self.protocol(format!(
                "bad CreateTaskResult (sent at {sent_ms}, received at {recv_ms}): {r}"
            ));
            return None;
        }
        self.sh.stats().tasks += 1;
        self.sh.task_created(self.w, &id);
        let (created, ttl) = (created.expect("checked"), ttl.expect("checked"));
        Some(Task {
            id,
            n,
            interval,
            sent,
            handle: recv,
            expiry_ms: created + ttl,
            terminal: None,
            result: None,
            cancel_sent: None,
            cancel_acked: None,
            progress: 0,
            last_working: None,
            last_updated_ms: 0,
            crossed: false,
            next: recv + self.rng.ms(0, 600),
            rechecks: 0,
            watch_expiry: false,
            dropped: false,
        })
    }

    /// `tasks/get` of a held task.
    async fn poll(&mut self, t: &mut Task) {
        let cut = self.poll_cut();
        let sent = (Instant::now(), wall_ms());
        let a = self
            .post(
                "tasks/get",
                &t.id.clone(),
                json!({"taskId": t.id}),
                None,
                cut,
            )
            .await;
        self.sh.stats().task_polls += 1;
        self.on_answer(t, a, "tasks/get", sent);
    }

    /// A finished task read again (after a restart, often), or checked to be gone after its TTL.
    async fn recheck(&mut self, t: &mut Task) {
        let expired = wall_ms() > t.expiry_ms + 300;
        self.poll(t).await;
        if t.dropped {
            return;
        }
        if expired {
            // The poll above checked it is gone.
            t.dropped = true;
            return;
        }
        if t.rechecks > 0 {
            t.rechecks -= 1;
            self.sh.stats().tasks_rechecked += 1;
        }
        if t.rechecks > 0 {
            t.next = Instant::now() + self.rng.ms(1000, 10_000);
        } else if t.watch_expiry {
            let left = t.expiry_ms.saturating_sub(wall_ms());
            t.next = Instant::now() + Duration::from_millis(left + self.rng.range(300, 1500));
        } else {
            t.dropped = true;
        }
    }

    /// `tasks/cancel` of a held task.
    async fn cancel(&mut self, t: &mut Task) {
        let sent = (Instant::now(), wall_ms());
        t.cancel_sent = Some(sent.0);
        let a = self
            .post(
                "tasks/cancel",
                &t.id.clone(),
                json!({"taskId": t.id}),
                None,
                Cut::No,
            )
            .await;
        self.sh.stats().task_cancels += 1;
        if let Answer::Result(r) = &a {
            if r["resultType"] != "complete" {
                self.protocol(format!("tasks/cancel answered {r}"));
            }
            t.cancel_acked = Some(Instant::now());
            return;
        }
        self.on_answer(t, a, "tasks/cancel", sent);
    }

    /// An answer about held task `t` to a request sent at `sent` (instant, Unix ms).
    fn on_answer(&mut self, t: &mut Task, a: Answer, what: &str, (sent, sent_ms): (Instant, u64)) {
        let recv_ms = wall_ms();
        match a {
            Answer::Cut => self.sh.stats().task_poll_cuts += 1,
            Answer::NotSent => self.sh.stats().task_poll_failed += 1,
            Answer::Lost => {
                self.sh.stats().task_poll_failed += 1;
                self.unanswered(what, sent, "no complete answer");
            }
            Answer::Refused(st, body) => {
                self.sh.stats().task_poll_failed += 1;
                self.unanswered(what, sent, &format!("refused {st}: {body}"));
            }
            Answer::Error(e) if e["code"] == -32602 => {
                if self.unknown.as_ref().is_some_and(|u| *u != e) {
                    self.protocol(format!(
                        "{what} {}: -32602 unlike an unknown id's: {e}",
                        t.id
                    ));
                }
                self.gone(t, recv_ms, sent, what);
            }
            Answer::Error(e) => self.protocol(format!("{what} {} answered {e}", t.id)),
            Answer::Result(r) => self.on_task(t, &r, sent, sent_ms),
        }
    }

    /// The proxy does not know held task `t` (answered at `recv_ms`).
    fn gone(&mut self, t: &mut Task, recv_ms: u64, sent: Instant, what: &str) {
        if recv_ms < t.expiry_ms {
            self.sh.violation(
                Violation::TaskLost,
                format!(
                    "task {} ({}): {what} sent at t={:.3}s answered unknown {} ms before its TTL ends (handle at t={:.3}s; proxy restarted since: {}; last state {:?})",
                    t.id,
                    self.who(),
                    self.sh.at(sent),
                    t.expiry_ms - recv_ms,
                    self.sh.at(t.handle),
                    self.sh.proxy_restarted_between(t.handle, sent),
                    t.terminal
                ),
            );
        } else if t.terminal.is_none() {
            self.sh.violation(
                Violation::TaskStuck,
                format!(
                    "task {} ({}): reached its TTL and was never seen finished (created at t={:.3}s, should have finished by t={:.3}s)",
                    t.id,
                    self.who(),
                    self.sh.at(t.sent),
                    self.sh.at(t.sent + t.run_time())
                ),
            );
        } else {
            self.sh.stats().tasks_expired += 1;
        }
        t.dropped = true;
    }

    /// A `tasks/get` result for held task `t`, to a poll sent at `sent` (`sent_ms` Unix ms).
    fn on_task(&mut self, t: &mut Task, r: &Value, sent: Instant, sent_ms: u64) {
        let recv = Instant::now();
        if r["taskId"] != json!(t.id) || r["resultType"] != "complete" {
            self.protocol(format!("tasks/get {} answered {r}", t.id));
            return;
        }
        let sh = self.sh.clone();
        let ctx = format!(
            "task {} ({}, count({}, {}) sent at t={:.3}s, handle at t={:.3}s, poll at t={:.3}s)",
            t.id,
            self.who(),
            t.n,
            t.interval,
            sh.at(t.sent),
            sh.at(t.handle),
            sh.at(sent)
        );
        let wrong = |why: String| sh.violation(Violation::TaskWrong, format!("{ctx}: {why}: {r}"));
        if sent_ms > t.expiry_ms + 5 {
            // The proxy read its clock after the client sent the poll.
            wrong(format!(
                "still served {} ms after its TTL",
                sent_ms - t.expiry_ms
            ));
        }
        let restarted = sh.proxy_restarted_between(t.handle, sent);
        if restarted && !t.crossed {
            t.crossed = true;
            sh.stats().tasks_across_restart += 1;
        }
        let status = r["status"].as_str().unwrap_or("");
        let updated = r["lastUpdatedAt"].as_str().and_then(parse_iso_ms);
        // A task the running proxy finished keeps a `lastUpdatedAt` no earlier than any update a
        // poll showed. (One that recovery failed after a kill has its end time in whole seconds.)
        if matches!(status, "completed" | "cancelled")
            && updated.is_some_and(|u| u < t.last_updated_ms)
        {
            wrong(format!(
                "lastUpdatedAt went back from {} ms to {updated:?}",
                t.last_updated_ms
            ));
        }
        t.last_updated_ms = t.last_updated_ms.max(updated.unwrap_or(0));
        let terminal = match status {
            "working" => {
                if let Some(was) = t.terminal {
                    wrong(format!("was {was:?}, now working again"));
                    return;
                }
                let due = (t.sent + t.run_time()).max(sh.last_recovery().unwrap_or(t.sent));
                let stuck = if restarted {
                    Some("working after the proxy process that ran it was replaced".to_string())
                } else if t.cancel_acked.is_some_and(|a| sent > a + CANCEL_BOUND) {
                    Some(format!(
                        "working {:.1}s after its tasks/cancel was acknowledged",
                        (sent - t.cancel_acked.expect("checked")).as_secs_f64()
                    ))
                } else if sent > due + STUCK_BOUND {
                    Some(format!(
                        "working {:.1}s after it should have finished (and after the last fault was recovered from)",
                        (sent - due).as_secs_f64()
                    ))
                } else {
                    None
                };
                if let Some(why) = stuck {
                    sh.violation(Violation::TaskStuck, format!("{ctx}: {why}: {r}"));
                    t.dropped = true;
                    return;
                }
                if let Some(m) = r["statusMessage"].as_str() {
                    // `{i}/{n} step {i}` from the upstream's progress.
                    let step = m
                        .split_once('/')
                        .and_then(|(i, rest)| Some((i.parse::<u64>().ok()?, rest)))
                        .and_then(|(i, rest)| {
                            let total = rest.split(' ').next()?.parse::<u64>().ok()?;
                            Some((i, total))
                        });
                    match step {
                        Some((i, total)) if total == t.n && i <= t.n && i >= t.progress => {
                            t.progress = i;
                        }
                        _ => wrong(format!(
                            "statusMessage {m:?} is not this call's progress (after step {})",
                            t.progress
                        )),
                    }
                }
                t.last_working = Some(sent);
                return;
            }
            // Once terminal, later reads must give the same state and result; the checks
            // against the task's history are made when it is first seen terminal.
            "completed" if t.terminal.is_some() => {
                if t.result.as_ref() != Some(&r["result"]) {
                    wrong(format!(
                        "completed again with another result than first seen ({:?})",
                        t.result
                    ));
                }
                Terminal::Completed
            }
            "failed" if t.terminal.is_some() => {
                Terminal::Failed(r["error"]["code"].as_i64().unwrap_or(0))
            }
            "cancelled" if t.terminal.is_some() => Terminal::Cancelled,
            "completed" => {
                let text = format!("counted {}", t.n);
                if r["result"]["content"][0]["text"] != json!(text)
                    || r["result"]["resultType"] != "complete"
                {
                    wrong(format!("completed with another result than {text:?}"));
                }
                t.result = Some(r["result"].clone());
                if recv < t.sent + t.run_time() {
                    wrong(format!(
                        "completed {:?} after the call, before the upstream could have answered",
                        recv - t.sent
                    ));
                }
                if let Some(a) = t
                    .cancel_acked
                    .filter(|a| *a + CANCEL_MARGIN < t.sent + t.run_time())
                {
                    wrong(format!(
                        "completed although its tasks/cancel was acknowledged at t={:.3}s, at least {}s before the upstream could answer",
                        sh.at(a),
                        CANCEL_MARGIN.as_secs()
                    ));
                }
                Terminal::Completed
            }
            "failed" => {
                let code = r["error"]["code"].as_i64().unwrap_or(0);
                if code != ABORTED {
                    wrong(format!("failed with {code}, not -32091"));
                } else if !sh.fault_near(t.sent, recv, Duration::ZERO) {
                    wrong("failed -32091 although no fault (proxy restart, upstream loss) overlapped its life".into());
                }
                Terminal::Failed(code)
            }
            "cancelled" => {
                if t.cancel_sent.is_none() {
                    wrong("cancelled although this client never cancelled it".into());
                }
                Terminal::Cancelled
            }
            _ => {
                wrong(format!("status {status:?}"));
                return;
            }
        };
        match t.terminal {
            Some(was) if was != terminal => {
                wrong(format!("was {was:?}, now {terminal:?}"));
            }
            Some(_) => {}
            None => {
                t.terminal = Some(terminal);
                let mut st = sh.stats();
                match terminal {
                    Terminal::Completed => st.tasks_completed += 1,
                    Terminal::Failed(_) => {
                        st.tasks_failed_32091 += 1;
                        st.tasks_failed_by_restart += restarted as u64;
                    }
                    Terminal::Cancelled => st.tasks_cancelled += 1,
                }
            }
        }
    }

    /// Another worker's task, asked for with this worker's identity: must look unknown.
    async fn foreign(&mut self) {
        let pick = self.rng.next_u64();
        let Some(id) = self.sh.foreign_task(self.w, pick) else {
            return;
        };
        let method = if self.rng.chance(0.2) {
            "tasks/cancel"
        } else {
            "tasks/get"
        };
        let sent = Instant::now();
        let a = self
            .post(method, &id, json!({"taskId": id}), None, Cut::No)
            .await;
        self.sh.stats().foreign_polls += 1;
        match a {
            Answer::Error(e) if Some(&e) == self.unknown.as_ref() => {}
            Answer::Result(r) => self.sh.violation(
                Violation::TaskForeignVisible,
                format!(
                    "{} ({}) asked {method} for another worker's task {id} and got {r}",
                    self.who(),
                    self.auth
                ),
            ),
            Answer::Error(e) => self.sh.violation(
                Violation::TaskForeignVisible,
                format!(
                    "{}: {method} of another worker's task {id} answered {e}, not as an unknown id ({:?})",
                    self.who(),
                    self.unknown
                ),
            ),
            Answer::Lost => self.unanswered(method, sent, "no complete answer"),
            Answer::Refused(st, body) => {
                self.unanswered(method, sent, &format!("refused {st}: {body}"))
            }
            Answer::Cut | Answer::NotSent => {}
        }
    }
}

#[test]
fn iso_times_parse() {
    assert_eq!(parse_iso_ms("1970-01-01T00:00:00.000Z"), Some(0));
    assert_eq!(
        parse_iso_ms("2026-11-18T11:06:40.123Z"),
        Some(1_795_000_000_123)
    );
    assert_eq!(
        parse_iso_ms("2000-02-29T00:00:00.000Z"),
        Some(951_782_400_000)
    );
    assert_eq!(parse_iso_ms("2000-02-29 00:00:00"), None);
}
