//! The Tasks extension (`io.modelcontextprotocol/tasks`) backed by the durable log.
//!
//! A task is a log session of its own (face [`Facade::Task`], its [`SessionMeta`] carrying the
//! creating identity), written through the same writer as every other event:
//!
//! 1. its meta record (durable when [`Log::create`] returns);
//! 2. a creation event (`createdAt`, `ttlMs`, `pollIntervalMs`, the tool);
//! 3. an in-flight record for request `0` on stream `post(0)` — durable in either durability
//!    mode — and only then is the `CreateTaskResult` returned, so a `tasks/get` for the id
//!    resolves, after a restart too;
//! 4. at the end, a [`Kind::Final`] event holding the outcome as a JSON-RPC response (`result`, or
//!    `error`; a cancellation is an error with `data.reason = "task_cancelled"`), then the end
//!    marker.
//!
//! A restart needs nothing of its own: recovery hands back every log session that was live, and
//! [`crate::session::Registry::end_interrupted`] answers its in-flight request with a logged
//! -32091 error — so an unfinished task reads back as `failed` with -32091, and a finished one
//! with its result. Status messages (from upstream progress) and input requests live in memory
//! only: after a restart the upstream request they belong to is gone, and the task is failed.
//!
//! Task ids are the log session ids: 128 random bits, 32 hex characters. A task answers only the
//! identity that created it (others get "not found", exactly as for an unknown id); tasks created
//! without identity answer whoever has the id. After `tasks.ttl_secs` from creation a task is
//! gone: a live one is cancelled, its log removed.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use prometheus::IntCounterVec;
use serde::Deserialize;
use serde_json::{json, Map, Value};
use tokio::sync::mpsc;

use super::mrtr::{self, Pending, Responses};
use super::pool::{UpCall, UpMsg};
use super::subscriptions::Hub;
pub use crate::config::{TaskMode, TasksConfig};
use crate::domain::{EndReason, Facade};
use crate::error::{Error, Result, StoreError};
use crate::identity::Identity;
use crate::jsonrpc::Answer;
use crate::log::cursor::SessionId;
use crate::log::{Health, Kind, Log, NewEvent, SessionLog, StreamTag};
use crate::session::Owner;

/// The in-flight request id of a task's log (its one request).
const TASK_REQUEST: &str = "0";
/// The stream of a task's events.
const TASK_STREAM: StreamTag = StreamTag(2);
/// A task's status (`tasks/get`'s `status`); its serde name is its wire name ([`TaskStatus::as_str`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TaskStatus {
    /// Running upstream.
    Working,
    /// The upstream asked the client something (`inputRequests`); `tasks/update` answers.
    InputRequired,
    /// Finished with a result.
    Completed,
    /// Finished with an error (the upstream's, or `-32091` when its session was lost).
    Failed,
    /// Cancelled by the client (`tasks/cancel`) or by its TTL.
    Cancelled,
}

impl TaskStatus {
    /// Every status.
    pub const ALL: [TaskStatus; 5] = [
        TaskStatus::Working,
        TaskStatus::InputRequired,
        TaskStatus::Completed,
        TaskStatus::Failed,
        TaskStatus::Cancelled,
    ];

    /// Its wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            TaskStatus::Working => "working",
            TaskStatus::InputRequired => "input_required",
            TaskStatus::Completed => "completed",
            TaskStatus::Failed => "failed",
            TaskStatus::Cancelled => "cancelled",
        }
    }
}

/// A task's outcome when it ends without the upstream's answer: an error of its row of the answer
/// table (code and reason).
fn outcome_error(a: Answer, message: &str) -> Value {
    json!({"error": {"code": a.code(), "message": message, "data": {"reason": a.reason()}}})
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// ISO 8601 UTC with milliseconds and `Z` (`2026-12-01T11:46:18.806Z`).
pub fn iso(ms: u64) -> String {
    let secs = ms / 1000;
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        ms % 1000
    )
}

enum Ctl {
    /// `tasks/update`; acknowledged once the answered requests are off the task's view.
    Update(Responses, tokio::sync::oneshot::Sender<()>),
    Cancel,
}

struct View {
    status: TaskStatus,
    message: Option<String>,
    updated_ms: u64,
    inputs: Vec<Pending>,
}

/// A task running in this process.
struct Live {
    identity: Option<Identity>,
    /// Who it counts against (`modern.max_per_identity`).
    owner: Owner,
    created_ms: u64,
    ttl_ms: u64,
    view: Mutex<View>,
    ctl: mpsc::Sender<Ctl>,
}

/// A task log created, its handle not returned yet.
pub struct NewTask {
    sl: Arc<SessionLog>,
    created_ms: u64,
    identity: Option<Identity>,
    owner: Owner,
}

impl std::fmt::Debug for NewTask {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NewTask").field("id", &self.sl.id).finish()
    }
}

/// How many tasks may run at once.
#[derive(Clone)]
pub struct TaskLimits {
    /// In all, with the sessions (`sessions.max_sessions`: a running task holds an upstream
    /// request like a session).
    pub max_running: usize,
    /// Per owner (`modern.max_per_identity`).
    pub max_per_owner: usize,
    /// The sessions that count against `max_running` too (the registry's, live or opening).
    pub sessions: Arc<dyn Fn() -> usize + Send + Sync>,
    /// Where the running tasks are published, for the registry to count them against
    /// `sessions.max_sessions` in turn.
    pub running: Arc<std::sync::atomic::AtomicUsize>,
}

/// The tasks.
pub struct Tasks {
    cfg: TasksConfig,
    limits: TaskLimits,
    log: Arc<Log>,
    hub: Arc<Hub>,
    counter: IntCounterVec,
    live: Mutex<HashMap<SessionId, Arc<Live>>>,
    /// When each task expires (ms since the epoch), earliest first: the janitor reads only what
    /// is due, not every task each second. Filled by [`Tasks::begin`] and, on the first
    /// [`Tasks::expire`], from the tasks recovered from the log.
    deadlines: Mutex<BTreeSet<(u64, SessionId)>>,
    recovered: std::sync::atomic::AtomicBool,
}

impl std::fmt::Debug for Tasks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tasks").finish_non_exhaustive()
    }
}

fn same(bound: Option<&Identity>, caller: Option<&Identity>) -> bool {
    match bound {
        None => true,
        Some(b) => caller.is_some_and(|c| c.matches(b)),
    }
}

impl Tasks {
    /// What a task of this caller is bound to: its identity, or for an anonymous caller its
    /// address (keyed), so another address holding the task id finds no such task.
    pub fn principal(&self, identity: Option<&Identity>, owner: Owner) -> Option<Identity> {
        match (identity, owner) {
            (Some(i), _) => Some(*i),
            (None, Owner::Peer(ip)) => Some(self.log.keys().peer(ip)),
            (None, _) => None,
        }
    }

    /// The tasks over `log`.
    pub fn new(
        cfg: TasksConfig,
        limits: TaskLimits,
        log: Arc<Log>,
        hub: Arc<Hub>,
        counter: IntCounterVec,
    ) -> Arc<Self> {
        Arc::new(Self {
            cfg,
            limits,
            log,
            hub,
            counter,
            live: Mutex::new(HashMap::new()),
            deadlines: Mutex::new(BTreeSet::new()),
            recovered: std::sync::atomic::AtomicBool::new(false),
        })
    }

    fn deadlines(&self) -> std::sync::MutexGuard<'_, BTreeSet<(u64, SessionId)>> {
        self.deadlines.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The configuration.
    pub fn config(&self) -> &TasksConfig {
        &self.cfg
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<SessionId, Arc<Live>>> {
        self.live.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes task `id` off the running ones.
    fn unlist(&self, id: &SessionId) -> Option<Arc<Live>> {
        let mut running = self.lock();
        let l = running.remove(id);
        self.limits.running.store(running.len(), Ordering::SeqCst);
        l
    }

    fn ttl_ms(&self) -> u64 {
        self.cfg.ttl_secs.saturating_mul(1000)
    }

    /// Creates a task durably (steps 1–3 of the module docs), before any handle exists.
    ///
    /// # Errors
    /// [`Error::Store`] when the log does not take it; [`Error::Capacity`] when `owner` (or the
    /// proxy) already runs as many tasks as it may — the call then goes on as a plain request.
    pub async fn begin(
        &self,
        identity: Option<Identity>,
        owner: Owner,
        tool: &str,
    ) -> Result<NewTask> {
        if *self.log.health().borrow() != Health::Ok {
            return Err(Error::Store(StoreError::Unavailable));
        }
        {
            // Counted on what runs: a task being created here is not yet live, so concurrent
            // creations may pass this check together — by at most the requests in flight.
            let live = self.lock();
            let sessions = (self.limits.sessions)();
            if live.len() + sessions >= self.limits.max_running {
                return Err(Error::Capacity(format!(
                    "{} tasks running and {sessions} sessions (sessions.max_sessions)",
                    live.len()
                )));
            }
            let mine = live.values().filter(|l| l.owner == owner).count();
            if owner != Owner::Unknown && mine >= self.limits.max_per_owner {
                return Err(Error::Capacity(format!(
                    "this caller runs {mine} tasks (modern.max_per_identity)"
                )));
            }
        }
        let id = SessionId::random();
        let sl = self
            .log
            .create(
                id,
                Facade::Task,
                Some(super::protocol::MODERN_VERSION.into()),
                self.principal(identity.as_ref(), owner),
            )
            .await?;
        let created_ms = now_ms();
        let creation = json!({"task": {"createdAt": created_ms, "ttlMs": self.ttl_ms(),
            "pollIntervalMs": self.cfg.poll_interval_ms, "tool": tool}});
        let ev = NewEvent::new(
            TASK_STREAM,
            Kind::Message,
            Bytes::from(creation.to_string()),
        );
        let created = async {
            self.log.append(&sl, ev).await?;
            self.log.inflight_add(&sl, TASK_REQUEST, TASK_STREAM).await
        };
        if let Err(e) = created.await {
            let _ = self.log.remove(&id).await;
            return Err(e);
        }
        self.deadlines()
            .insert((created_ms.saturating_add(self.ttl_ms()), id));
        Ok(NewTask {
            sl,
            created_ms,
            identity,
            owner,
        })
    }

    /// Starts running a created task on `call` and returns its `CreateTaskResult`.
    pub fn start(
        self: &Arc<Self>,
        task: NewTask,
        call: UpCall,
        server_info: Option<Value>,
    ) -> Value {
        // Bounded: a client posting `tasks/update` faster than the task takes them waits.
        let (ctl, ctl_rx) = mpsc::channel(4);
        let live = Arc::new(Live {
            identity: task.identity,
            owner: task.owner,
            created_ms: task.created_ms,
            ttl_ms: self.ttl_ms(),
            view: Mutex::new(View {
                status: TaskStatus::Working,
                message: None,
                updated_ms: task.created_ms,
                inputs: Vec::new(),
            }),
            ctl,
        });
        let id = task.sl.id;
        {
            let mut running = self.lock();
            running.insert(id, live.clone());
            self.limits.running.store(running.len(), Ordering::SeqCst);
        }
        self.counter.with_label_values(&["created"]).inc();
        tracing::info!(task = %task.sl.tag, "task created");
        let mut result = self.live_json(&id, &live);
        tokio::spawn(self.clone().run(task.sl, live, call, ctl_rx));
        let r = result.as_object_mut().expect("object");
        r.insert("resultType".into(), json!("task"));
        if let Some(si) = server_info {
            r.insert("_meta".into(), json!({super::protocol::SERVER_INFO: si}));
        }
        result
    }

    fn live_json(&self, id: &SessionId, live: &Live) -> Value {
        let v = live.view.lock().unwrap_or_else(|e| e.into_inner());
        let mut t = json!({
            "taskId": id.to_string(),
            "status": v.status,
            "createdAt": iso(live.created_ms),
            "lastUpdatedAt": iso(v.updated_ms),
            "ttlMs": live.ttl_ms,
            "pollIntervalMs": self.cfg.poll_interval_ms,
        });
        if let Some(m) = &v.message {
            t["statusMessage"] = json!(m);
        }
        if v.status == TaskStatus::InputRequired {
            let reqs: Map<String, Value> = v
                .inputs
                .iter()
                .map(|p| {
                    (
                        p.key.clone(),
                        json!({"method": p.method, "params": p.params}),
                    )
                })
                .collect();
            t["inputRequests"] = Value::Object(reqs);
        }
        t
    }

    fn changed(&self, id: &SessionId, live: &Live, f: impl FnOnce(&mut View)) {
        {
            let mut v = live.view.lock().unwrap_or_else(|e| e.into_inner());
            f(&mut v);
            v.updated_ms = now_ms();
        }
        let t = self.live_json(id, live);
        self.hub
            .task_notification(live.identity.as_ref(), &id.to_string(), &t);
    }

    async fn run(
        self: Arc<Self>,
        sl: Arc<SessionLog>,
        live: Arc<Live>,
        mut call: UpCall,
        mut ctl: mpsc::Receiver<Ctl>,
    ) {
        let id = sl.id;
        let outcome: Value = loop {
            tokio::select! {
                m = call.rx.recv() => match m {
                    Some(UpMsg::Progress(p)) => {
                        let msg = status_message(&p);
                        self.changed(&id, &live, |v| v.message = Some(msg));
                    }
                    Some(UpMsg::Log(_)) => {}
                    Some(UpMsg::Input { id: uid, method, params }) => {
                        let key = mrtr::input_key(&uid);
                        let params = mrtr::client_params(&method, &params);
                        self.changed(&id, &live, |v| {
                            v.inputs.push(Pending { key, upstream_id: uid, method, params });
                            v.status = TaskStatus::InputRequired;
                        });
                    }
                    Some(UpMsg::Response(msg)) => {
                        call.finish();
                        break msg;
                    }
                    Some(UpMsg::Cancelled) => {
                        call.finish();
                        break outcome_error(Answer::UpstreamCancelled, "the upstream cancelled the request");
                    }
                    Some(UpMsg::Lost) | None => {
                        call.finish();
                        break outcome_error(Answer::CallLost, "request aborted: upstream session lost");
                    }
                },
                c = ctl.recv() => match c {
                    Some(Ctl::Update(responses, applied)) => {
                        let answered: Vec<Pending> = {
                            let mut v = live.view.lock().unwrap_or_else(|e| e.into_inner());
                            let (hit, keep): (Vec<_>, Vec<_>) = v.inputs.drain(..).partition(|p| {
                                responses.get(&p.key).is_some()
                            });
                            v.inputs = keep;
                            if !hit.is_empty() && v.inputs.is_empty() {
                                v.status = TaskStatus::Working;
                            }
                            hit
                        };
                        // A `tasks/get` after the acknowledgement sees the answered requests gone.
                        let _ = applied.send(());
                        if answered.is_empty() {
                            continue;
                        }
                        for p in &answered {
                            if let Some(r) = responses.get(&p.key) {
                                call.session().answer_raw(&p.upstream_id, r).await;
                            }
                        }
                        self.changed(&id, &live, |v| {
                            if v.inputs.is_empty() {
                                v.status = TaskStatus::Working;
                            }
                        });
                    }
                    Some(Ctl::Cancel) | None => {
                        let inputs = std::mem::take(
                            &mut live.view.lock().unwrap_or_else(|e| e.into_inner()).inputs,
                        );
                        for p in inputs {
                            call.session().answer(&p.upstream_id, mrtr::refusal(&p.method)).await;
                        }
                        // Dropped unfinished: `notifications/cancelled` goes upstream.
                        drop(call);
                        break outcome_error(Answer::TaskCancelled, "task cancelled");
                    }
                },
            }
        };
        let mut fin = Map::new();
        fin.insert("jsonrpc".into(), json!("2.0"));
        fin.insert("id".into(), json!(0));
        // When it finished, in ms: `lastUpdatedAt` of the finished task, never earlier than the
        // last update a poll of the live task showed (the session's end time has whole seconds).
        fin.insert("finishedAtMs".into(), json!(now_ms()));
        if let Some(r) = outcome.get("result") {
            fin.insert("result".into(), r.clone());
        } else {
            fin.insert(
                "error".into(),
                outcome.get("error").cloned().unwrap_or_else(
                    || json!({"code": crate::jsonrpc::INTERNAL_ERROR, "message": "no result"}),
                ),
            );
        }
        let payload = Bytes::from(Value::Object(fin).to_string());
        let mut ev = NewEvent::new(TASK_STREAM, Kind::Final, payload);
        ev.completes = Some(TASK_REQUEST.into());
        if let Err(e) = self.log.end(&sl, EndReason::TaskFinished, vec![ev]).await {
            tracing::error!(task = %sl.tag, error = %e, "a task's outcome is not logged yet (the log retries it)");
        }
        self.unlist(&id);
        let task = self.read(&sl).await;
        let status = task
            .as_ref()
            .and_then(|t| TaskStatus::deserialize(&t["status"]).ok())
            .unwrap_or(TaskStatus::Failed)
            .as_str();
        if let Some(l) = crate::metrics::TASK_STATUSES.iter().find(|s| **s == status) {
            self.counter.with_label_values(&[l]).inc();
        }
        tracing::info!(task = %sl.tag, status, "task finished");
        if let Some(t) = task {
            self.hub
                .task_notification(live.identity.as_ref(), &id.to_string(), &t);
        }
    }

    /// The task's creation event.
    async fn creation(&self, sl: &SessionLog) -> Option<(u64, u64, u64)> {
        let evs = self.log.read_after(sl, 0, 1).await.ok()?;
        let c = evs.first().filter(|e| e.seq == 1)?;
        let v: Value = serde_json::from_slice(&c.payload).ok()?;
        let t = v.get("task")?;
        Some((
            t["createdAt"].as_u64()?,
            t["ttlMs"].as_u64()?,
            t["pollIntervalMs"]
                .as_u64()
                .unwrap_or(self.cfg.poll_interval_ms),
        ))
    }

    /// A task's state as `tasks/get` shows it, read from the log (finished, or left unfinished
    /// by an earlier run).
    async fn read(&self, sl: &SessionLog) -> Option<Value> {
        let (created, ttl, poll) = self.creation(sl).await?;
        let evs = self.log.read_after(sl, 0, 16).await.ok()?;
        let fin = evs
            .iter()
            .find(|e| e.kind == Kind::Final)
            .and_then(|e| serde_json::from_slice::<Value>(&e.payload).ok());
        let updated = fin
            .as_ref()
            .and_then(|f| f["finishedAtMs"].as_u64())
            .or_else(|| sl.ended_unix().map(|s| s * 1000))
            .map_or(created, |u| u.max(created));
        let mut t = json!({
            "taskId": sl.id.to_string(),
            "createdAt": iso(created),
            "lastUpdatedAt": iso(updated),
            "ttlMs": ttl,
            "pollIntervalMs": poll,
        });
        match fin {
            Some(f) if f.get("result").is_some() => {
                let mut r = f["result"].clone();
                if let Some(o) = r.as_object_mut() {
                    o.insert("resultType".into(), json!("complete"));
                    strip_related_task(o);
                }
                t["status"] = json!(TaskStatus::Completed);
                t["result"] = r;
            }
            Some(f)
                if f.pointer("/error/data/reason").and_then(Value::as_str)
                    == Some(Answer::TaskCancelled.reason()) =>
            {
                t["status"] = json!(TaskStatus::Cancelled);
                t["statusMessage"] = json!("cancelled by the client");
            }
            Some(f) => {
                let e = &f["error"];
                t["status"] = json!(TaskStatus::Failed);
                t["statusMessage"] = json!(e["message"].as_str().unwrap_or("failed"));
                let mut err = json!({"code": e["code"].as_i64().unwrap_or(crate::jsonrpc::INTERNAL_ERROR),
                    "message": e["message"].as_str().unwrap_or("failed")});
                if let Some(d) = e.get("data") {
                    err["data"] = d.clone();
                }
                t["error"] = err;
            }
            None if sl.ended().is_none() => {
                // Running on another replica (read from the shared log without forwarding):
                // its live state is there; here, only that it runs.
                t["status"] = json!(TaskStatus::Working);
            }
            None => {
                // Ended (or being ended by recovery) without an outcome: the run that held it died.
                t["status"] = json!(TaskStatus::Failed);
                t["statusMessage"] = json!("upstream session lost");
                t["error"] = json!({"code": Answer::CallLost.code(),
                    "message": "request aborted: upstream session ended (upstream_lost)"});
            }
        }
        Some(t)
    }

    /// The log of task `id` if `caller` may see it and it has not expired.
    async fn find(&self, caller: Option<&Identity>, id: &str) -> Option<Arc<SessionLog>> {
        let sid = SessionId::parse(id)?;
        // Held here, or (shared log) read from Redis: a task finished before this replica's
        // restart, or run by another replica.
        let sl = match self.log.lookup(&sid).await {
            Ok(sl) => sl?,
            Err(e) => {
                tracing::error!(error = %e, "looking a task up in the shared log failed");
                return None;
            }
        };
        if sl.facade != Facade::Task || sl.removed() || !same(sl.identity.as_ref(), caller) {
            return None;
        }
        let (created, ttl, _) = self.creation(&sl).await?;
        (created.saturating_add(ttl) > now_ms()).then_some(sl)
    }

    /// `tasks/get`: the task, or `None` (unknown, expired, or another identity's).
    pub async fn get(&self, caller: Option<&Identity>, id: &str) -> Option<Value> {
        let sl = self.find(caller, id).await?;
        let live = self.lock().get(&sl.id).cloned();
        match live {
            Some(l) => Some(self.live_json(&sl.id, &l)),
            None => self.read(&sl).await,
        }
    }

    /// Is `id` a task `caller` may see?
    pub async fn exists(&self, caller: Option<&Identity>, id: &str) -> bool {
        self.find(caller, id).await.is_some()
    }

    /// `tasks/update`: forwards the responses to outstanding input requests. `false`: no such task.
    pub async fn update(&self, caller: Option<&Identity>, id: &str, responses: Responses) -> bool {
        let Some(sl) = self.find(caller, id).await else {
            return false;
        };
        let ctl = self.lock().get(&sl.id).map(|l| l.ctl.clone());
        if let Some(ctl) = ctl {
            let (applied, done) = tokio::sync::oneshot::channel();
            if ctl.send(Ctl::Update(responses, applied)).await.is_ok() {
                // (A task that finishes meanwhile drops it: nothing left to apply.)
                let _ = tokio::time::timeout(Duration::from_secs(5), done).await;
            }
        }
        true
    }

    /// `tasks/cancel`: cancels a live task (a finished one stays as it is). `false`: no such task.
    pub async fn cancel(&self, caller: Option<&Identity>, id: &str) -> bool {
        let Some(sl) = self.find(caller, id).await else {
            return false;
        };
        let ctl = self.lock().get(&sl.id).map(|l| l.ctl.clone());
        if let Some(ctl) = ctl {
            let _ = ctl.send(Ctl::Cancel).await;
        }
        true
    }

    /// Waits (at most `limit`) until no task runs in this process: on shutdown, after the pool
    /// closed, each live task logs its -32091 outcome before the log is closed.
    pub async fn wait_idle(&self, limit: Duration) {
        let deadline = tokio::time::Instant::now() + limit;
        while !self.lock().is_empty() && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Cancels and removes the tasks past their TTL: those whose deadline is due (the first call
    /// also indexes the tasks an earlier run left in the log).
    pub async fn expire(&self) {
        if !self
            .recovered
            .swap(true, std::sync::atomic::Ordering::Relaxed)
        {
            for sl in self.log.all() {
                if sl.facade != Facade::Task || sl.removed() {
                    continue;
                }
                let due = match self.creation(&sl).await {
                    Some((created, ttl, _)) => created.saturating_add(ttl),
                    // Unreadable creation (trimmed, or a crash between create and the event):
                    // kept no longer than the configured TTL from its meta time.
                    None => (sl.meta().created_unix * 1000).saturating_add(self.ttl_ms()),
                };
                self.deadlines().insert((due, sl.id));
            }
        }
        let now = now_ms();
        loop {
            let next = {
                let mut d = self.deadlines();
                match d.first().copied() {
                    Some(first) if first.0 <= now => d.pop_first(),
                    _ => None,
                }
            };
            let Some((_, id)) = next else { break };
            let Some(sl) = self.log.get(&id).filter(|sl| !sl.removed()) else {
                continue;
            };
            let live = self.unlist(&sl.id);
            if let Some(l) = live {
                let _ = l.ctl.send(Ctl::Cancel).await;
                // Let it write its end before the log goes.
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            self.counter.with_label_values(&["expired"]).inc();
            tracing::info!(task = %sl.tag, "task expired (tasks.ttl_secs)");
            if let Err(e) = self.log.remove(&sl.id).await {
                tracing::error!(error = %e, "deleting an expired task failed");
            }
        }
    }
}

/// `statusMessage` from an upstream progress notification: `"<progress>/<total> <message>"`.
pub fn status_message(p: &Value) -> String {
    let num = |v: &Value| {
        v.as_f64().map(|f| {
            if f.fract() == 0.0 {
                format!("{}", f as i64)
            } else {
                format!("{f}")
            }
        })
    };
    let mut s = match (
        p.get("progress").and_then(num),
        p.get("total").and_then(num),
    ) {
        (Some(a), Some(b)) => format!("{a}/{b}"),
        (Some(a), None) => a,
        _ => String::new(),
    };
    if let Some(m) = p.get("message").and_then(Value::as_str) {
        if !s.is_empty() {
            s.push(' ');
        }
        s.push_str(m);
    }
    s
}

/// Removes the v1 `related-task` key from a result's `_meta`.
pub fn strip_related_task(o: &mut Map<String, Value>) {
    if let Some(m) = o.get_mut("_meta").and_then(Value::as_object_mut) {
        m.remove("io.modelcontextprotocol/related-task");
        if m.is_empty() {
            o.remove("_meta");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_names() {
        let names: Vec<&str> = TaskStatus::ALL.iter().map(|s| s.as_str()).collect();
        assert_eq!(
            names,
            [
                "working",
                "input_required",
                "completed",
                "failed",
                "cancelled"
            ]
        );
        for s in TaskStatus::ALL {
            assert_eq!(json!(s), json!(s.as_str()));
            assert_eq!(TaskStatus::deserialize(&json!(s.as_str())).ok(), Some(s));
        }
    }

    #[test]
    fn iso_dates() {
        assert_eq!(iso(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(iso(1_795_000_000_123), "2026-11-18T11:06:40.123Z");
        assert_eq!(iso(951_782_400_000), "2000-02-29T00:00:00.000Z");
    }

    #[test]
    fn status_messages() {
        assert_eq!(
            status_message(&json!({"progress": 1, "total": 3, "message": "step 1"})),
            "1/3 step 1"
        );
        assert_eq!(status_message(&json!({"progress": 0.5})), "0.5");
        assert_eq!(
            status_message(&json!({"progress": 2, "message": "x"})),
            "2 x"
        );
    }
}
