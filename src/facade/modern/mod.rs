//! [2b] The MCP 2026-07-28 face, on the Streamable HTTP path (`/mcp`), chosen per request.
//!
//! 2026-07-28 is stateless: no `initialize`, no `Mcp-Session-Id`, no GET stream, no
//! `Last-Event-ID`; every request carries its `_meta` envelope (protocol version, client
//! capabilities) and the `MCP-Protocol-Version` / `Mcp-Method` / `Mcp-Name` headers. The era is
//! chosen per request, body first: a request whose `params._meta` claims a protocol version is
//! modern; `initialize` and anything else without a claim stays on the sessionful face
//! ([`crate::facade::streamable`]), untouched. See [`crate::facade::mcp::select`].
//!
//! - Validation ([`wire`]): JSON (`-32700`), shape (`-32600`), envelope (`-32602`), header
//!   cross-check (`-32020`), version (`-32022` with `data.supported`), method registry (404
//!   `-32601`), `Mcp-Method`/`Mcp-Name` (`-32020`), capabilities (`-32021`). Errors from the
//!   upstream and handlers are in-band (HTTP 200).
//! - Requests run on proxy-opened upstream legacy sessions from a [`pool`]; results get
//!   `resultType`, serverInfo `_meta`, and `ttlMs`/`cacheScope` where cacheable; progress and
//!   (with `logLevel`) log messages ride the POST's SSE stream, which always ends with the
//!   response and never carries event ids; closing it cancels the request upstream.
//! - `server/discover` is answered from the upstream's `initialize` result ([`discover`]).
//! - Upstream sampling / elicitation / roots requests become MRTR rounds ([`mrtr`]).
//! - `subscriptions/listen` streams ([`subscriptions`]); the Tasks extension backed by the log ([`tasks`]).
//! - Leaves every part names: the protocol's names ([`protocol`]) and who a caller is ([`who`]).

pub mod mrtr;
pub mod params;
pub mod pool;
pub mod protocol;
pub mod subscriptions;
pub mod task_support;
pub mod tasks;
pub mod who;
pub mod wire;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, StatusCode};
use serde_json::value::RawValue;
use serde_json::{json, Map, Value};
use tokio::sync::watch;

use crate::config::TasksConfig;
pub use crate::config::{Discover, ModernConfig};
use crate::domain::Facade;
use crate::facade::http::{plain, sse_response, Caller, Resp};
use crate::jsonrpc::Answer;
use crate::metrics::Metrics;
use crate::queue;
use crate::stream::{SseBody, StreamEnv};
use crate::upstream::UpstreamSettings;
use mrtr::{Binding, Mrtr, Pending};
use pool::{Pool, PoolSettings, UpCall, UpMsg, Who};
use protocol::level_rank;
pub use protocol::{MODERN_VERSION, SERVED_VERSIONS, SERVER_INFO, TASKS_EXT};
use subscriptions::{Filter, Hub};
use tasks::{TaskLimits, TaskMode, Tasks};
use wire::{Inbound, Refusal};

/// Methods whose requests may carry MRTR rounds (and lease an upstream session exclusively).
const MRTR_METHODS: [&str; 3] = ["tools/call", "prompts/get", "resources/read"];
/// How long after an upstream input request further ones are awaited for the same round.
const INPUT_GATHER: Duration = Duration::from_millis(50);
/// How long the proxy waits for its own `tools/list` (see [`task_support`]).
const OWN_LIST_WAIT: Duration = Duration::from_secs(10);
/// Frames queued for one client SSE stream of this face (each at most one upstream message,
/// `upstream.max_event_bytes`): a slow reader holds the upstream back, never grows memory.
const STREAM_FRAMES: usize = 32;
/// The bytes those frames may hold: a client that stops reading holds at most this much (or one
/// frame, however large) before the upstream is held back.
const STREAM_BYTES: usize = 1 << 20;
/// The most resource URIs one `subscriptions/listen` subscribes to (the rest are not honoured).
const MAX_SUBSCRIPTIONS: usize = 256;
/// Methods whose results are `CacheableResult`s.
const CACHEABLE: [&str; 5] = [
    "tools/list",
    "prompts/list",
    "resources/list",
    "resources/templates/list",
    "resources/read",
];

/// What tasks share with the registry: `sessions.max_sessions` bounds sessions and running tasks
/// together.
pub struct TaskSlots {
    /// `sessions.max_sessions`.
    pub max: usize,
    /// The registry's sessions, live or opening.
    pub sessions: Arc<dyn Fn() -> usize + Send + Sync>,
    /// The running tasks, published for the registry.
    pub running: Arc<std::sync::atomic::AtomicUsize>,
}

/// The state of the face.
pub struct Modern {
    cfg: ModernConfig,
    /// `upstream.request_timeout_secs` (`None`: no limit).
    request_timeout: Option<Duration>,
    /// Upstream sessions.
    pub pool: Arc<Pool>,
    /// Listen streams.
    pub hub: Arc<Hub>,
    /// Parked MRTR calls.
    pub mrtr: Mrtr,
    /// Tasks.
    pub tasks: Arc<Tasks>,
    /// `Mcp-Param-*` annotations learnt from `tools/list`.
    params: params::HeaderParams,
    /// The tools that require a task, learnt from `tools/list`.
    task_support: task_support::TaskSupport,
    metrics: Metrics,
    drain: watch::Receiver<bool>,
    keepalive: Duration,
    /// Calls in flight, by caller and JSON id: what that caller's `notifications/cancelled` ends.
    cancels: std::sync::Mutex<Cancels>,
}

/// Calls in flight by caller and JSON id.
type Cancels = HashMap<(Who, String), Arc<tokio::sync::Notify>>;

/// A call's entry in [`Modern::cancels`], taken out when the call ends.
struct Cancellable<'a> {
    map: &'a std::sync::Mutex<Cancels>,
    key: (Who, String),
    notify: Arc<tokio::sync::Notify>,
}

impl Drop for Cancellable<'_> {
    fn drop(&mut self) {
        let mut m = self.map.lock().unwrap_or_else(|e| e.into_inner());
        // A later call of the caller with the same id may have taken the key since.
        if m.get(&self.key)
            .is_some_and(|n| Arc::ptr_eq(n, &self.notify))
        {
            m.remove(&self.key);
        }
    }
}

impl std::fmt::Debug for Modern {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Modern").finish_non_exhaustive()
    }
}

impl Modern {
    /// The face of `[modern]` and `[tasks]` over the log of `env` (whose `drain` ends its
    /// streams), opening upstream sessions on `up`; its running tasks count against
    /// `sessions.max_sessions` with the registry's sessions (`slots`).
    pub fn new(
        cfg: ModernConfig,
        tasks: TasksConfig,
        slots: TaskSlots,
        up: UpstreamSettings,
        env: &StreamEnv,
    ) -> Arc<Self> {
        let metrics = env.metrics.clone();
        let hub = Arc::new(Hub::new(
            cfg.max_per_identity,
            metrics.dropped_counter("slow_reader"),
        ));
        let set = PoolSettings {
            max_sessions: cfg.pool_max_sessions,
            max_per_owner: cfg.max_per_identity,
            idle: Duration::from_secs(cfg.pool_idle_secs),
            wait: Duration::from_secs(cfg.pool_wait_secs),
        };
        let request_timeout = up.request_timeout;
        let pool = Pool::new(set, up, hub.clone(), metrics.pool_sessions.clone());
        let limits = TaskLimits {
            max_running: slots.max,
            max_per_owner: cfg.max_per_identity,
            sessions: slots.sessions,
            running: slots.running,
        };
        let tasks = Tasks::new(
            tasks,
            limits,
            env.log.clone(),
            hub.clone(),
            metrics.tasks.clone(),
        );
        Arc::new(Self {
            mrtr: Mrtr::new(Duration::from_secs(cfg.input_ttl_secs)),
            keepalive: env.keepalive,
            request_timeout,
            cfg,
            pool,
            hub,
            tasks,
            params: params::HeaderParams::default(),
            task_support: task_support::TaskSupport::default(),
            metrics,
            drain: env.drain.clone(),
            cancels: std::sync::Mutex::new(HashMap::new()),
        })
    }

    /// Housekeeping once per second until `stop` fires: idle upstream sessions close, parked
    /// calls whose retry never came are let go, expired tasks are removed.
    pub async fn janitor(self: Arc<Self>, mut stop: watch::Receiver<bool>) {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = stop.changed() => break,
            }
            for p in self.mrtr.expired() {
                release_parked(p).await;
            }
            self.pool.reap();
            self.tasks.expire().await;
        }
        // Shutdown: listens end gracefully, parked calls are let go, upstream sessions close
        // (requests in flight get their -32091 answer; live tasks log it as their outcome).
        self.hub.close_all();
        for p in self.mrtr.drain() {
            release_parked(p).await;
        }
        self.pool.close_all();
        self.tasks.wait_idle(Duration::from_secs(2)).await;
    }
}

async fn release_parked(p: mrtr::Parked) {
    for x in &p.pending {
        p.call
            .session()
            .answer(&x.upstream_id, mrtr::refusal(&x.method))
            .await;
    }
    // Dropped unfinished: the upstream call is cancelled.
    drop(p.call);
}

// ---------------------------------------------------------------------------------------------
// Responses

fn json_resp(status: StatusCode, body: &Value) -> Resp {
    plain(status, "application/json", body.to_string())
}

/// A JSON-RPC error answer, with the HTTP status and code of its row of the answer table.
fn rpc_error(answer: Answer, id: &Value, message: &str, data: Option<Value>) -> Resp {
    json_resp(
        answer.status(),
        &error_msg(id, answer.code(), message, data),
    )
}

fn error_msg(id: &Value, code: i64, message: &str, data: Option<Value>) -> Value {
    let mut e = json!({"code": code, "message": message});
    if let Some(d) = data {
        e["data"] = d;
    }
    json!({"jsonrpc": "2.0", "id": id, "error": e})
}

fn result_msg(id: &Value, result: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "result": result})
}

pub(crate) fn refusal_resp(id: &Value, r: Refusal) -> Resp {
    rpc_error(r.answer, id, &r.message, r.data)
}

/// An SSE response whose events come from `rx` (no event ids, no retry).
fn sse(rx: queue::Rx<Bytes>, metrics: &Metrics) -> Resp {
    let gauge = metrics.client_streams(Facade::Streamable);
    sse_response(SseBody::from_queue(rx, gauge), None)
}

const KEEPALIVE: &[u8] = b": keepalive\n\n";

/// Queues `frame` on a client stream (waiting for room in frames and bytes).
async fn send_frame(tx: &queue::Tx<Bytes>, frame: Bytes) -> Result<(), Bytes> {
    let len = frame.len();
    tx.send(frame, len).await
}

/// A result relayed from the legacy upstream, made a 2026-07-28 result.
fn finish_result(mut r: Value, method: &str, server_info: Option<&Value>, ttl_ms: u64) -> Value {
    let Some(o) = r.as_object_mut() else {
        return r;
    };
    o.insert("resultType".into(), json!("complete"));
    tasks::strip_related_task(o);
    if CACHEABLE.contains(&method) {
        o.insert("ttlMs".into(), json!(ttl_ms));
        o.insert("cacheScope".into(), json!("private"));
    }
    if method == "tools/list" {
        // 2025-only vocabulary (tasks v1 `execution.taskSupport`).
        if let Some(tools) = o.get_mut("tools").and_then(Value::as_array_mut) {
            for t in tools.iter_mut().filter_map(Value::as_object_mut) {
                t.remove("execution");
            }
        }
    }
    if let Some(si) = server_info {
        let meta = o
            .entry("_meta")
            .or_insert_with(|| json!({}))
            .as_object_mut();
        if let Some(m) = meta {
            m.insert(SERVER_INFO.into(), si.clone());
        }
    }
    r
}

/// The client's answer for the upstream's response `msg` to request `inb`.
fn map_response(msg: &Value, inb: &Inbound, server_info: Option<&Value>, ttl_ms: u64) -> Value {
    if let Some(r) = msg.get("result") {
        return result_msg(
            &inb.id,
            finish_result(r.clone(), &inb.method, server_info, ttl_ms),
        );
    }
    let e = &msg["error"];
    let code = e["code"].as_i64().unwrap_or(crate::jsonrpc::INTERNAL_ERROR);
    let message = e["message"].as_str().unwrap_or("upstream error");
    if code == crate::jsonrpc::RESOURCE_NOT_FOUND {
        // 2026-07-28 retired -32002 (resource not found) for -32602 with the URI.
        let uri = inb
            .fields()
            .uri
            .and_then(crate::jsonrpc::scalar)
            .unwrap_or(Value::Null);
        return error_msg(
            &inb.id,
            crate::jsonrpc::INVALID_PARAMS,
            message,
            Some(json!({"uri": uri})),
        );
    }
    error_msg(&inb.id, code, message, e.get("data").cloned())
}

fn lost(id: &Value) -> Value {
    let a = Answer::CallLost;
    error_msg(
        id,
        a.code(),
        "request aborted: upstream session lost",
        Some(json!({"reason": a.reason()})),
    )
}

fn upstream_unavailable(id: &Value, e: &crate::error::Error) -> Resp {
    tracing::warn!(error = %crate::error::chain(e), "no upstream session for a 2026-07-28 request");
    // A full pool (or the caller's full share of it) is not the upstream's fault: say which.
    let a = match e {
        crate::error::Error::Capacity(_) => Answer::CallerCapacity,
        _ => Answer::UpstreamUnavailable,
    };
    rpc_error(
        a,
        id,
        &format!("upstream unavailable: {e}"),
        Some(json!({"reason": a.reason()})),
    )
}

/// Completes when the proxy drains.
async fn draining(drain: &mut watch::Receiver<bool>) {
    // The `Ref` is dropped here: it must not live across the caller's awaits.
    let _ = drain.wait_for(|d| *d).await;
}

/// Sleeps until `at`; never wakes without one.
async fn until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Why a call stopped before its answer.
#[derive(Clone, Copy, Debug)]
enum Stop {
    /// Its client went away.
    Gone,
    /// `upstream.request_timeout_secs` passed.
    TimedOut,
    /// The proxy drains.
    Drained,
}

/// How long the last frame of a stream may wait for a client that does not read.
const LAST_FRAME_WAIT: Duration = Duration::from_secs(5);

/// Where a call's messages go: a client SSE stream, or nowhere (a JSON answer).
type Sink = Option<queue::Tx<Bytes>>;

/// How a call ended for the request driving it.
enum Ended {
    /// The answer to send.
    Answer(Value),
    /// Refused with an HTTP status of its own (on a stream already begun: its last event).
    Refused(Refusal),
    /// The client went away: nothing to send.
    Gone,
}

// ---------------------------------------------------------------------------------------------
// Requests

impl Modern {
    /// Serves one modern POST: the validation ladder, then the method.
    pub(crate) async fn post(
        self: &Arc<Self>,
        caller: &Caller,
        h: &HeaderMap,
        header_version: Option<&str>,
        body: &Bytes,
    ) -> Resp {
        let inb = match wire::validate(h, header_version, body) {
            Ok(wire::Checked::Request(inb)) => *inb,
            Ok(wire::Checked::Notification { method, request_id }) => {
                if method == "notifications/cancelled" {
                    if let Some(rid) = request_id {
                        // Only the sender's own calls and listens: an anonymous caller's, by
                        // address. (Closing a call's stream cancels it too, as the spec has it.)
                        let who = Who::of(caller.identity, caller.peer);
                        self.cancel_call(&who, &rid);
                        self.hub.close(&who, &rid);
                    }
                }
                return plain(StatusCode::ACCEPTED, "text/plain", Bytes::new());
            }
            Err((id, r)) => return refusal_resp(&id, r),
        };
        let inb = inb.with_caller(caller);
        if inb.method == "tools/call" {
            let f = inb.fields();
            let tool = f.name.and_then(crate::jsonrpc::string).unwrap_or_default();
            if let Err(r) = self.params.check(&tool, f.arguments, h) {
                return refusal_resp(&inb.id, r);
            }
        }
        match inb.method.as_str() {
            "server/discover" => self.discover(&inb).await,
            "subscriptions/listen" => self.listen(&inb).await,
            "tasks/get" | "tasks/update" | "tasks/cancel" => self.task_method(&inb).await,
            _ => self.forward(inb).await,
        }
    }

    async fn discover(self: &Arc<Self>, inb: &Inbound) -> Resp {
        if self.cfg.discover == Discover::Resumable {
            return refusal_resp(&inb.id, Refusal::discover_resumable());
        }
        let init = match self.pool.latest_init() {
            Some(i) => i,
            None => match self.pool.lease(&inb.key, inb.owner, false).await {
                Ok(l) => l.session.init.get().cloned().unwrap_or_default(),
                Err(e) => return upstream_unavailable(&inb.id, &e),
            },
        };
        let mut caps = init
            .get("capabilities")
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default();
        caps.remove("tasks");
        caps.insert("extensions".into(), json!({TASKS_EXT: {}}));
        let mut r = json!({
            "supportedVersions": SERVED_VERSIONS,
            "capabilities": caps,
            "resultType": "complete",
            "ttlMs": self.cfg.cache_ttl_ms,
            "cacheScope": "private",
        });
        if let Some(i) = init.get("instructions").filter(|v| v.is_string()) {
            r["instructions"] = i.clone();
        }
        if let Some(si) = init.get("serverInfo") {
            r["_meta"] = json!({SERVER_INFO: si});
        }
        json_resp(StatusCode::OK, &result_msg(&inb.id, r))
    }

    async fn task_method(self: &Arc<Self>, inb: &Inbound) -> Resp {
        let id = inb.string(|f| f.task_id).unwrap_or_default();
        let id = id.as_str();
        let principal = self.tasks.principal(inb.identity.as_ref(), inb.owner);
        let who = principal.as_ref();
        let not_found = || {
            rpc_error(
                Answer::TaskNotFound,
                &inb.id,
                "Failed to retrieve task: Task not found",
                None,
            )
        };
        let ack = || {
            json_resp(
                StatusCode::OK,
                &result_msg(&inb.id, json!({"resultType": "complete"})),
            )
        };
        match inb.method.as_str() {
            "tasks/get" => match self.tasks.get(who, id).await {
                Some(mut t) => {
                    t["resultType"] = json!("complete");
                    json_resp(StatusCode::OK, &result_msg(&inb.id, t))
                }
                None => not_found(),
            },
            "tasks/update" => {
                let responses = inb
                    .responses()
                    .flatten()
                    .unwrap_or_else(|| mrtr::Responses::new(Bytes::from_static(b"{}")));
                if self.tasks.update(who, id, responses).await {
                    ack()
                } else {
                    not_found()
                }
            }
            _ => {
                if self.tasks.cancel(who, id).await {
                    ack()
                } else {
                    not_found()
                }
            }
        }
    }

    /// Forwards a request upstream (or continues a parked one) and answers it.
    async fn forward(self: &Arc<Self>, inb: Inbound) -> Resp {
        let mrtr_ok = MRTR_METHODS.contains(&inb.method.as_str());
        let binding = Binding::of(&inb.method, inb.params());
        let retry = inb.fields().request_state.map(crate::jsonrpc::string);
        let call = match retry {
            Some(state) => {
                let Some(state) = state.filter(|_| mrtr_ok) else {
                    return rpc_error(
                        Answer::InBandInvalidParams,
                        &inb.id,
                        "Invalid params: requestState",
                        None,
                    );
                };
                let state = state.as_str();
                let responses = match inb.responses() {
                    None => mrtr::Responses::new(Bytes::from_static(b"{}")),
                    Some(Some(r)) => r,
                    Some(None) => {
                        return rpc_error(
                            Answer::InBandInvalidParams,
                            &inb.id,
                            "Invalid params: inputResponses must be an object",
                            None,
                        )
                    }
                };
                let principal = self.tasks.principal(inb.identity.as_ref(), inb.owner);
                let parked = match self.mrtr.take(state, principal.as_ref(), &binding) {
                    Ok(p) => p,
                    Err(e) => {
                        return rpc_error(Answer::InBandInvalidParams, &inb.id, e.message(), None)
                    }
                };
                let mut waiting = Vec::new();
                for p in parked.pending {
                    match responses.get(&p.key) {
                        Some(r) => {
                            parked.call.session().answer_raw(&p.upstream_id, r).await;
                        }
                        // Missing (or not a result object): ask again.
                        _ => waiting.push(p),
                    }
                }
                if !waiting.is_empty() {
                    let answer = self.input_required(&inb, parked.call, waiting, &binding);
                    return json_resp(StatusCode::OK, &answer);
                }
                parked.call
            }
            None => {
                let tool = (inb.method == "tools/call")
                    .then(|| inb.string(|f| f.name).unwrap_or_default());
                let needs_task = |tool: &Option<String>| {
                    tool.as_deref()
                        .is_some_and(|t| !inb.tasks && self.task_support.required(t))
                };
                if needs_task(&tool) {
                    return refusal_resp(&inb.id, Refusal::missing_tasks());
                }
                let call = match self.pool.call(&inb.key, inb.owner, mrtr_ok).await {
                    Ok(c) => c,
                    Err(e) => return upstream_unavailable(&inb.id, &e),
                };
                if tool.is_some() && !self.task_support.listed() {
                    // No listing relayed yet: the proxy asks for one (once), so that a tool
                    // requiring a task is known before its first call.
                    let listed = call
                        .session()
                        .request("tools/list", json!({}), OWN_LIST_WAIT)
                        .await;
                    if let Some(r) = listed.as_ref().ok().and_then(|m| m.get("result")) {
                        self.params.learn(r);
                        self.task_support.learn(r);
                    }
                    if needs_task(&tool) {
                        // Never sent upstream: nothing to cancel.
                        call.finish();
                        return refusal_resp(&inb.id, Refusal::missing_tasks());
                    }
                }
                let msg = upstream_request(&inb.method, inb.params(), call.upstream_id, mrtr_ok);
                if let Err(e) = call.session().post_bytes(msg).await {
                    call.finish();
                    return upstream_unavailable(&inb.id, &e);
                }
                call
            }
        };
        let task_after =
            (inb.tasks && inb.method == "tools/call").then(|| match self.tasks.config().mode {
                TaskMode::Always => Duration::ZERO,
                TaskMode::After => Duration::from_millis(self.tasks.config().after_ms),
            });
        let streaming = inb.progress.is_some() || inb.log_level.is_some();
        if !streaming {
            return match self.drive(call, &inb, None, &binding, task_after).await {
                Ended::Answer(v) => json_resp(StatusCode::OK, &v),
                Ended::Refused(r) => refusal_resp(&inb.id, r),
                Ended::Gone => plain(crate::jsonrpc::CLIENT_GONE, "text/plain", Bytes::new()),
            };
        }
        let (tx, rx) = queue::bounded(STREAM_FRAMES, STREAM_BYTES);
        let me = self.clone();
        tokio::spawn(async move {
            let sink = Some(tx.clone());
            let last = match me.drive(call, &inb, sink, &binding, task_after).await {
                Ended::Answer(v) => v,
                Ended::Refused(r) => error_msg(&inb.id, r.code(), &r.message, r.data),
                Ended::Gone => return,
            };
            let _ = tokio::time::timeout(
                LAST_FRAME_WAIT,
                send_frame(&tx, subscriptions::frame(&last)),
            )
            .await;
        });
        sse(rx, &self.metrics)
    }

    /// Answers with an `InputRequiredResult`, parking `call`.
    fn input_required(
        &self,
        inb: &Inbound,
        call: UpCall,
        pending: Vec<Pending>,
        binding: &Binding,
    ) -> Value {
        let server_info = call
            .session()
            .init
            .get()
            .and_then(|i| i.get("serverInfo"))
            .cloned();
        let reqs: Map<String, Value> = pending
            .iter()
            .map(|p| {
                (
                    p.key.clone(),
                    json!({"method": p.method, "params": p.params}),
                )
            })
            .collect();
        // Bound to the caller: its identity, or an anonymous caller's address.
        let principal = self.tasks.principal(inb.identity.as_ref(), inb.owner);
        let state = self
            .mrtr
            .park(call, pending, binding.clone(), principal.as_ref());
        let mut r =
            json!({"resultType": "input_required", "inputRequests": reqs, "requestState": state});
        if let Some(si) = server_info {
            r["_meta"] = json!({SERVER_INFO: si});
        }
        result_msg(&inb.id, r)
    }

    /// Registers the call of `inb` as one its caller may cancel.
    fn cancellable(&self, inb: &Inbound) -> Cancellable<'_> {
        let key = (inb.who, inb.id.to_string());
        let notify = Arc::new(tokio::sync::Notify::new());
        self.cancels
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key.clone(), notify.clone());
        Cancellable {
            map: &self.cancels,
            key,
            notify,
        }
    }

    /// `notifications/cancelled` from `who` for request `id`: ends that call of `who`'s, if one
    /// is in flight (its upstream request is cancelled; no answer is sent).
    fn cancel_call(&self, who: &Who, id: &Value) {
        let m = self.cancels.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = m.get(&(*who, id.to_string())) {
            n.notify_one();
        }
    }

    /// Runs a call until it answers, needs input, becomes a task, or its client goes away.
    async fn drive(
        self: &Arc<Self>,
        mut call: UpCall,
        inb: &Inbound,
        sink: Sink,
        binding: &Binding,
        mut task_after: Option<Duration>,
    ) -> Ended {
        let server_info = call
            .session()
            .init
            .get()
            .and_then(|i| i.get("serverInfo"))
            .cloned();
        let ttl = self.cfg.cache_ttl_ms;
        let mut drain = self.drain.clone();
        let cancel = self.cancellable(inb);
        let started = tokio::time::Instant::now();
        let mut keepalive = tokio::time::interval_at(started + self.keepalive, self.keepalive);
        // `upstream.request_timeout_secs`, per client request (a retry starts it anew).
        let timeout_at = self.request_timeout.map(|d| started + d);
        // A send to a client that stops reading waits — but never past the request's timeout or
        // the drain: those end the call while the send is pending too.
        let emit = |frame: Bytes| {
            let sink = sink.clone();
            let mut drain = self.drain.clone();
            async move {
                let s = sink?;
                tokio::select! {
                    r = send_frame(&s, frame) => r.is_err().then_some(Stop::Gone),
                    _ = until(timeout_at) => Some(Stop::TimedOut),
                    _ = draining(&mut drain) => Some(Stop::Drained),
                }
            }
        };
        if task_after == Some(Duration::ZERO) {
            // `tasks.mode = "always"`: a task whatever the upstream's pace — not a race between
            // a zero timer and an answer that is already there.
            match self.into_task(inb, call, &server_info).await {
                Ok(answer) => return answer,
                Err(c) => {
                    call = c;
                    task_after = None;
                }
            }
        }
        // Input requests of the upstream being gathered into one round, and until when.
        let mut gathered: Vec<Pending> = Vec::new();
        let mut gather_until: Option<tokio::time::Instant> = None;
        loop {
            let task_at = task_after.map(|d| started + d);
            tokio::select! {
                m = call.rx.recv() => match m {
                    Some(UpMsg::Progress(mut p)) => {
                        if let (Some(tok), Some(o)) = (&inb.progress, p.as_object_mut()) {
                            o.insert("progressToken".into(), tok.clone());
                            let n = json!({"jsonrpc": "2.0", "method": "notifications/progress", "params": p});
                            if let Some(stop) = emit(subscriptions::frame(&n)).await {
                                return self.stopped(stop, inb);
                            }
                        }
                    }
                    Some(UpMsg::Log(p)) => {
                        let lvl = p.get("level").and_then(Value::as_str).and_then(level_rank);
                        if let (Some(want), Some(got)) = (inb.log_level, lvl) {
                            if got >= want {
                                let n = json!({"jsonrpc": "2.0", "method": "notifications/message", "params": p});
                                if let Some(stop) = emit(subscriptions::frame(&n)).await {
                                    return self.stopped(stop, inb);
                                }
                            }
                        }
                    }
                    Some(UpMsg::Input { id, method, params }) => {
                        if !MRTR_METHODS.contains(&inb.method.as_str()) {
                            call.session().answer(&id, Err(json!({"code": crate::jsonrpc::METHOD_NOT_FOUND,
                                "message": format!("{method} is not available to this request")}))).await;
                            continue;
                        }
                        if let Some(cap) = mrtr::undeclared(&inb.caps, &method) {
                            // The client cannot answer it: the call fails with -32021, naming
                            // what it lacks; the upstream's requests are refused, the call
                            // cancelled.
                            call.session().answer(&id, Err(json!({"code": crate::jsonrpc::METHOD_NOT_FOUND,
                                "message": format!("{method}: the client did not declare {cap}")}))).await;
                            for p in gathered.drain(..) {
                                call.session().answer(&p.upstream_id, mrtr::refusal(&p.method)).await;
                            }
                            drop(call);
                            return Ended::Refused(Refusal::missing_capability(cap));
                        }
                        // The upstream may ask several things at once: what arrives within
                        // INPUT_GATHER goes to the client in the same round.
                        gather_until.get_or_insert_with(|| tokio::time::Instant::now() + INPUT_GATHER);
                        let params = mrtr::client_params(&method, &params);
                        gathered.push(Pending { key: mrtr::input_key(&id), upstream_id: id, method, params });
                    }
                    Some(UpMsg::Response(msg)) => {
                        call.finish();
                        if inb.method == "tools/list" {
                            if let Some(r) = msg.get("result") {
                                self.params.learn(r);
                                self.task_support.learn(r);
                            }
                        }
                        return Ended::Answer(map_response(&msg, inb, server_info.as_ref(), ttl));
                    }
                    Some(UpMsg::Cancelled) => {
                        call.finish();
                        let a = Answer::UpstreamCancelled;
                        return Ended::Answer(error_msg(&inb.id, a.code(), "the upstream cancelled the request",
                            Some(json!({"reason": a.reason()}))));
                    }
                    Some(UpMsg::Lost) | None => {
                        call.finish();
                        return Ended::Answer(lost(&inb.id));
                    }
                },
                _ = async { tokio::time::sleep_until(gather_until.expect("guarded")).await }, if gather_until.is_some() => {
                    let pending = std::mem::take(&mut gathered);
                    return Ended::Answer(self.input_required(inb, call, pending, binding));
                }
                _ = async { tokio::time::sleep_until(task_at.expect("guarded")).await }, if task_at.is_some() && gathered.is_empty() => {
                    match self.into_task(inb, call, &server_info).await {
                        Ok(answer) => return answer,
                        Err(c) => {
                            call = c;
                            task_after = None;
                        }
                    }
                }
                // (The call, dropped unfinished on return, is cancelled upstream.)
                _ = until(timeout_at), if timeout_at.is_some() => return self.stopped(Stop::TimedOut, inb),
                _ = keepalive.tick(), if sink.is_some() => {
                    if let Some(stop) = emit(Bytes::from_static(KEEPALIVE)).await {
                        return self.stopped(stop, inb);
                    }
                }
                _ = async { if let Some(s) = &sink { s.closed().await } else { std::future::pending().await } } => {
                    return Ended::Gone;
                }
                _ = draining(&mut drain) => return self.stopped(Stop::Drained, inb),
                // Its caller's `notifications/cancelled`: no answer (the call, dropped
                // unfinished, is cancelled upstream).
                _ = cancel.notify.notified() => return Ended::Gone,
            }
        }
    }

    /// The end of a call stopped before its answer (its `UpCall`, dropped unfinished by the
    /// caller, is cancelled upstream).
    fn stopped(&self, why: Stop, inb: &Inbound) -> Ended {
        match why {
            Stop::Gone => Ended::Gone,
            Stop::TimedOut => {
                let secs = self.request_timeout.map_or(0, |d| d.as_secs());
                let a = Answer::RequestTimeout;
                Ended::Answer(error_msg(
                    &inb.id,
                    a.code(),
                    &format!(
                        "upstream did not answer within {secs} s (upstream.request_timeout_secs)"
                    ),
                    Some(json!({"reason": a.reason(), "timeout_secs": secs})),
                ))
            }
            Stop::Drained => Ended::Answer(error_msg(
                &inb.id,
                Answer::ShuttingDown.code(),
                "request aborted: the proxy is shutting down",
                Some(json!({"reason": Answer::ShuttingDown.reason()})),
            )),
        }
    }

    /// Makes `call` a task (its answer: the task's handle); `Err` gives the call back when no
    /// task can be created — it then stays a plain request.
    async fn into_task(
        self: &Arc<Self>,
        inb: &Inbound,
        call: UpCall,
        server_info: &Option<Value>,
    ) -> Result<Ended, UpCall> {
        let tool = inb.string(|f| f.name).unwrap_or_default();
        match self.tasks.begin(inb.identity, inb.owner, &tool).await {
            Ok(t) => {
                let r = self.tasks.start(t, call, server_info.clone());
                Ok(Ended::Answer(result_msg(&inb.id, r)))
            }
            Err(e @ crate::error::Error::Capacity(_)) => {
                tracing::info!(error = %e, "no room for a task; the call goes on without one");
                Err(call)
            }
            Err(e) => {
                tracing::error!(error = %e, "cannot create a task; the call goes on without one");
                Err(call)
            }
        }
    }

    fn too_many_listens(&self, id: &Value) -> Resp {
        let max = self.cfg.max_per_identity;
        let a = Answer::CallerCapacity;
        rpc_error(
            a,
            id,
            &format!("this caller has {max} live listens (modern.max_per_identity)"),
            Some(json!({"reason": a.reason()})),
        )
    }

    async fn listen(self: &Arc<Self>, inb: &Inbound) -> Resp {
        let want = inb.wanted();
        let task_ids = want.task_ids.filter(|r| r.get().starts_with('['));
        if task_ids.is_some() && !inb.tasks {
            return refusal_resp(&inb.id, Refusal::missing_tasks());
        }
        if !self.hub.room_for(inb.owner) {
            // Before any upstream work: refused listens open no upstream session.
            return self.too_many_listens(&inb.id);
        }
        let lease = match self.pool.lease(&inb.key, inb.owner, false).await {
            Ok(l) => l,
            Err(e) => return upstream_unavailable(&inb.id, &e),
        };
        let init = lease.session.init.get().cloned().unwrap_or_default();
        // List changes are honoured whenever asked for: the proxy relays whatever the upstream
        // sends, and some upstreams send them without declaring `listChanged` (FastMCP 1.x).
        let on = |k: Option<&RawValue>| k.is_some_and(|v| v.get() == "true");
        let mut filter = Filter {
            tools: on(want.tools),
            prompts: on(want.prompts),
            resources: on(want.resources),
            resource_uris: Vec::new(),
            task_ids: None,
        };
        if let Some(ids) = task_ids {
            let principal = self.tasks.principal(inb.identity.as_ref(), inb.owner);
            let mut named = Vec::new();
            let _ = crate::jsonrpc::for_each_item(ids, |id| {
                named.extend(crate::jsonrpc::string(id));
            });
            let mut known = std::collections::HashSet::new();
            for id in named {
                if self.tasks.exists(principal.as_ref(), &id).await {
                    known.insert(id);
                }
            }
            filter.task_ids = Some(known);
        }
        // Resource subscriptions: honoured when the upstream supports them, subscribed on the
        // upstream session this listen pins (and unsubscribed when it ends).
        if init.pointer("/capabilities/resources/subscribe") == Some(&json!(true)) {
            // At most MAX_SUBSCRIPTIONS URIs are read (the ack lists those honoured).
            let mut uris = Vec::new();
            if let Some(raw) = want.resource_subscriptions {
                let _ = crate::jsonrpc::for_each_item(raw, |uri| {
                    if uris.len() < MAX_SUBSCRIPTIONS {
                        uris.extend(crate::jsonrpc::string(uri));
                    }
                });
            }
            for uri in uris {
                if !filter.resource_uris.contains(&uri) && lease.session.subscribe(&uri).await {
                    filter.resource_uris.push(uri);
                }
            }
        }
        let server_info = init.get("serverInfo").cloned();
        let sub_id = inb.id.clone();
        let Some((n, mut inbox)) =
            self.hub
                .register(inb.who, inb.owner, sub_id.clone(), filter.clone())
        else {
            for uri in &filter.resource_uris {
                lease.session.unsubscribe(uri).await;
            }
            return self.too_many_listens(&inb.id);
        };
        let (tx, rx) = queue::bounded(STREAM_FRAMES, STREAM_BYTES);
        let me = self.clone();
        let pinned = lease.pin();
        let uris = filter.resource_uris.clone();
        let lifetime = Duration::from_secs(self.cfg.listen_max_secs);
        tokio::spawn(async move {
            let registered = me.hub.guard(n);
            let mut drain = me.drain.clone();
            let started = tokio::time::Instant::now();
            let mut keepalive = tokio::time::interval_at(started + me.keepalive, me.keepalive);
            let ended = async {
                if send_frame(&tx, subscriptions::ack(&filter, &sub_id))
                    .await
                    .is_err()
                {
                    return None;
                }
                let end_at = started + lifetime;
                // A send to a client that stops reading waits, but not past the listen's
                // lifetime or the drain (its session stays pinned only while it is served).
                let send = |b: Bytes| {
                    let (tx, mut drain) = (tx.clone(), me.drain.clone());
                    async move {
                        tokio::select! {
                            r = send_frame(&tx, b) => r.is_ok().then_some(()).ok_or(None),
                            _ = tokio::time::sleep_until(end_at) => Err(Some(subscriptions::Closed::Ended)),
                            _ = draining(&mut drain) => Err(Some(subscriptions::Closed::Ended)),
                        }
                    }
                };
                loop {
                    tokio::select! {
                        m = inbox.recv() => match m {
                            Some(b) => if let Err(end) = send(b).await { return end },
                            None => return Some(me.hub.closed(n)),
                        },
                        _ = keepalive.tick() => {
                            if let Err(end) = send(Bytes::from_static(KEEPALIVE)).await {
                                return end;
                            }
                        }
                        _ = tx.closed() => return None,
                        _ = draining(&mut drain) => return Some(subscriptions::Closed::Ended),
                        // `modern.listen_max_secs`: a graceful end; the client listens again.
                        _ = tokio::time::sleep_until(started + lifetime) => {
                            return Some(subscriptions::Closed::Ended);
                        }
                    }
                }
            };
            let last = match ended.await {
                Some(subscriptions::Closed::Ended) => {
                    Some(subscriptions::end(&sub_id, server_info.as_ref()))
                }
                Some(subscriptions::Closed::FellBehind) => Some(subscriptions::frame(&error_msg(
                    &sub_id,
                    Answer::SlowReader.code(),
                    "listen ended: its reader fell behind the notifications queued for it",
                    Some(json!({"reason": Answer::SlowReader.reason()})),
                ))),
                None => None,
            };
            // The listen's hold on its session and its slot end first; then its last frame
            // waits (a little) for a client that may not read.
            drop(registered);
            for uri in &uris {
                pinned.session().unsubscribe(uri).await;
            }
            drop(pinned);
            if let Some(last) = last {
                let _ = tokio::time::timeout(LAST_FRAME_WAIT, send_frame(&tx, last)).await;
            }
        });
        sse(rx, &self.metrics)
    }
}

/// The request sent upstream for `method`: the client's params without the 2026 envelope and the
/// MRTR fields, the progress token replaced by the upstream id (always set for calls that may
/// become tasks or report status).
///
/// Written from the params' bytes member by member: what is forwarded is copied once, never
/// built as a tree.
fn upstream_request(
    method: &str,
    params: &RawValue,
    upstream_id: u64,
    always_progress: bool,
) -> Bytes {
    let mut out = String::with_capacity(params.get().len() + method.len() + 64);
    out.push_str(r#"{"jsonrpc":"2.0","id":"#);
    out.push_str(&upstream_id.to_string());
    out.push_str(r#","method":"#);
    out.push_str(&Value::from(method).to_string());
    out.push_str(r#","params":"#);
    upstream_params(&mut out, params, upstream_id, always_progress);
    out.push('}');
    Bytes::from(out)
}

/// [`upstream_request`]'s params, appended to `out`.
fn upstream_params(out: &mut String, params: &RawValue, upstream_id: u64, always_progress: bool) {
    let mut first = true;
    let mut meta = None;
    out.push('{');
    let _ = crate::jsonrpc::for_each_member(params, |k, v| match k {
        // The MRTR fields, and 2025-11-25's `task` hint (a legacy upstream refuses it; tasks are
        // the proxy's own here).
        "inputResponses" | "requestState" | "task" => {}
        "_meta" => meta = Some(v),
        _ => member(out, &mut first, k, v.get()),
    });
    let (mut m, mut m_first, mut asked) = (String::new(), true, false);
    if let Some(meta) = meta {
        let _ = crate::jsonrpc::for_each_member(meta, |k, v| {
            if k == "progressToken" {
                asked = true;
            } else if !k.starts_with("io.modelcontextprotocol/") {
                member(&mut m, &mut m_first, k, v.get());
            }
        });
    }
    if asked || always_progress {
        member(
            &mut m,
            &mut m_first,
            "progressToken",
            &upstream_id.to_string(),
        );
    }
    if !m.is_empty() {
        m.insert(0, '{');
        m.push('}');
        member(out, &mut first, "_meta", &m);
    }
    out.push('}');
}

/// Appends `"k":v` to an object being written.
fn member(out: &mut String, first: &mut bool, k: &str, v: &str) {
    if !std::mem::take(first) {
        out.push(',');
    }
    out.push_str(&Value::from(k).to_string());
    out.push(':');
    out.push_str(v);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upstream_params_drop_the_envelope() {
        let sent = |p: &str, always: bool| -> Value {
            let p: &RawValue = serde_json::from_str(p).unwrap();
            serde_json::from_slice(&upstream_request("tools/call", p, 3, always)).unwrap()
        };
        let p = r#"{"name": "x", "requestState": "s", "inputResponses": {}, "task": {"ttl": 1},
            "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28", "progressToken": 7, "k": 1}}"#;
        assert_eq!(
            sent(p, false),
            json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
                "params": {"name": "x", "_meta": {"k": 1, "progressToken": 3}}})
        );
        assert_eq!(sent(r#"{"_meta": {}}"#, false)["params"], json!({}));
        assert_eq!(
            sent(r#"{"_meta": {}}"#, true)["params"],
            json!({"_meta": {"progressToken": 3}})
        );
        // A `_meta` that is not an object is dropped (as before).
        assert_eq!(
            sent(r#"{"a": [1, {"b": 2}], "_meta": 5}"#, false)["params"],
            json!({"a": [1, {"b": 2}]})
        );
    }

    #[test]
    fn results_become_modern() {
        let r = finish_result(
            json!({"tools": [{"name": "a", "execution": {"taskSupport": "optional"}}]}),
            "tools/list",
            Some(&json!({"name": "up", "version": "1"})),
            0,
        );
        assert_eq!(
            r,
            json!({"tools": [{"name": "a"}], "resultType": "complete", "ttlMs": 0,
                "cacheScope": "private", "_meta": {SERVER_INFO: {"name": "up", "version": "1"}}})
        );
        let r = finish_result(json!({"content": []}), "tools/call", None, 5);
        assert_eq!(r, json!({"content": [], "resultType": "complete"}));
    }
}
