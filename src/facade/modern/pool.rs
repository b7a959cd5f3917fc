//! The pool of upstream legacy sessions that serve 2026-07-28 requests.
//!
//! A modern request carries no session, but the legacy upstream speaks only in sessions: the proxy
//! opens them itself (`GET sse_url`, `initialize` with the capabilities the clients declared,
//! `notifications/initialized`) and keeps them in a pool keyed by the caller's identity and those
//! capabilities, so an upstream session is never shared across identities and the upstream always
//! knows what the client in front of it can do (server-everything registers its sampling and
//! elicitation tools only for clients that declared them).
//!
//! Requests that may make the upstream ask the client something (`tools/call`, `prompts/get`,
//! `resources/read`) lease a session **exclusively**: the legacy protocol does not say which
//! request a server→client request belongs to, so the one request in flight on the session is the
//! only honest attribution. Other requests share sessions. Request ids and progress tokens are
//! rewritten to numbers unique per upstream session (modern clients reuse small integers).
//!
//! Each session has a pump task reading its upstream stream and routing every message: responses
//! and progress to the request they belong to, `notifications/message` to the single request in
//! flight (dropped when there are several), server→client requests to the lease holder (answered
//! with an error when nobody holds the session), list-changed and resource-updated notifications
//! to the [`Hub`] of listen streams. Idle sessions close after `modern.pool_idle_secs`.
//!
//! A request abandoned before its answer (timed out, its client gone, cancelled) retires its
//! session: the upstream is told (`notifications/cancelled`) but may go on, and its late messages
//! could only be told apart from the next request's by id — log lines and server→client requests
//! carry none — so the session takes no new request and closes once nothing uses it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use prometheus::IntGauge;
use serde_json::value::RawValue;
use serde_json::{json, Map, Value};
use tokio::sync::Notify;
use tokio::time::Instant;

use super::subscriptions::Hub;
pub use super::who::Who;
use crate::error::{Error, Result};
use crate::queue;
use crate::session::Owner;
use crate::upstream::{
    self, HttpClient, UpstreamItem, UpstreamLink, UpstreamReader, UpstreamSettings,
};

/// The protocol version the proxy asks the upstream for (the newest the legacy face knows).
pub const UPSTREAM_VERSION: &str = "2025-11-25";

/// What the pool is keyed by: who is asking, and what their client can do.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PoolKey {
    /// The caller.
    pub who: Who,
    /// The client capabilities the upstream must know, as compact JSON with sorted keys.
    pub caps: String,
}

impl PoolKey {
    /// The key for `who` and a request's declared client capabilities: only what a legacy
    /// server can act on (`sampling`, `elicitation`, `roots`) is kept.
    pub fn new(who: Who, caps: &Value) -> Self {
        let mut m = Map::new();
        for k in ["sampling", "elicitation", "roots"] {
            if let Some(v) = caps.get(k).filter(|v| v.is_object()) {
                m.insert(k.to_string(), v.clone());
            }
        }
        // serde_json's map is ordered by key: equal capabilities give equal keys.
        Self {
            who,
            caps: Value::Object(m).to_string(),
        }
    }

    fn upstream_caps(&self) -> Value {
        serde_json::from_str(&self.caps).unwrap_or_else(|_| json!({}))
    }
}

/// A message from the upstream for one request.
#[derive(Debug)]
pub enum UpMsg {
    /// `notifications/progress` params (the token is still the upstream one).
    Progress(Value),
    /// `notifications/message` params.
    Log(Value),
    /// A server→client request (sampling, elicitation, roots) while this request held the lease.
    Input {
        /// The upstream's id of its request (to answer it with).
        id: Value,
        /// Its method.
        method: String,
        /// Its params.
        params: Value,
    },
    /// The response (the whole JSON-RPC message).
    Response(Value),
    /// The upstream cancelled the request (`notifications/cancelled`).
    Cancelled,
    /// The upstream session is gone.
    Lost,
}

/// Upstream messages queued per request before the session's pump waits for it to read them:
/// a slow reader holds back its upstream session (and, through it, the upstream), never grows
/// memory. At most this many, holding at most [`ROUTE_BYTES`] of upstream event bytes (one
/// message always fits, up to `upstream.max_event_bytes`).
const ROUTE_QUEUE: usize = 16;
/// The bytes a request's queued upstream messages may hold (see [`ROUTE_QUEUE`]).
const ROUTE_BYTES: usize = 1 << 20;

struct Route {
    tx: queue::Tx<UpMsg>,
}

struct State {
    next_id: u64,
    routes: HashMap<u64, Route>,
    /// The request holding the exclusive lease, when it has a route.
    lease_route: Option<u64>,
    leased: bool,
    /// Listen streams holding the session open.
    pins: usize,
    /// Upstream resource subscriptions of those listens: URI → how many listens want it.
    subs: HashMap<String, usize>,
    last_used: Instant,
    dead: bool,
    /// A request on it was abandoned before its answer (timed out, its client gone, cancelled):
    /// the upstream may still be working on it and sending its messages, which carry nothing
    /// that ties them to it but a log line's or a server→client request's timing. The session
    /// takes no new request; it closes once nothing uses it.
    retiring: bool,
    /// `notifications/cancelled` of abandoned requests still being posted: the session is not
    /// closed under them (the upstream hears the cancel before the session ends).
    cancels: usize,
}

impl State {
    /// A retiring session nothing uses any more: to be closed.
    fn spent(&self) -> bool {
        self.retiring
            && !self.leased
            && self.routes.is_empty()
            && self.pins == 0
            && self.cancels == 0
    }
}

/// One upstream legacy session opened by the pool.
pub struct UpSession {
    /// Pool-local number (for logs).
    pub n: u64,
    key: PoolKey,
    /// Who it counts against (`modern.max_per_identity`).
    owner: Owner,
    link: UpstreamLink,
    /// The upstream's `initialize` result (set once, before the session is shared).
    pub init: std::sync::OnceLock<Value>,
    st: Mutex<State>,
    pump: Mutex<Option<tokio::task::AbortHandle>>,
}

impl std::fmt::Debug for UpSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UpSession").field("n", &self.n).finish()
    }
}

impl UpSession {
    // Plain data, never held across an await.
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.st.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Is the upstream session gone?
    pub fn is_dead(&self) -> bool {
        self.lock().dead
    }

    /// Registers a request and returns its upstream id and the channel of its messages.
    fn route(&self, lease_holder: bool) -> (u64, queue::Rx<UpMsg>) {
        let (tx, rx) = queue::bounded(ROUTE_QUEUE, ROUTE_BYTES);
        let mut st = self.lock();
        st.next_id += 1;
        let id = st.next_id;
        if st.dead {
            let _ = tx.try_send(UpMsg::Lost, 0);
        }
        st.routes.insert(id, Route { tx });
        if lease_holder {
            st.lease_route = Some(id);
        }
        st.last_used = Instant::now();
        (id, rx)
    }

    fn unroute(&self, id: u64) {
        let mut st = self.lock();
        st.routes.remove(&id);
        if st.lease_route == Some(id) {
            st.lease_route = None;
        }
        st.last_used = Instant::now();
        drop(st);
        self.close_if_spent();
    }

    /// Request `id` is abandoned before its answer: its route goes, and the session retires (see
    /// [`State::retiring`]) with one more cancel to post.
    fn abandon(&self, id: u64) {
        let mut st = self.lock();
        st.routes.remove(&id);
        if st.lease_route == Some(id) {
            st.lease_route = None;
        }
        st.last_used = Instant::now();
        st.retiring = true;
        st.cancels += 1;
    }

    /// The cancel of an abandoned request was posted (or could not be).
    fn cancel_posted(&self) {
        let mut st = self.lock();
        st.cancels = st.cancels.saturating_sub(1);
        drop(st);
        self.close_if_spent();
    }

    /// Closes a retiring session once nothing uses it: the upstream session ends, and with it
    /// whatever it was still doing for the abandoned request.
    fn close_if_spent(&self) {
        let spent = self.lock().spent();
        if spent {
            tracing::debug!(
                upstream = self.n,
                "upstream session closed after an abandoned request"
            );
            self.kill();
        }
    }

    /// Posts one message upstream.
    ///
    /// # Errors
    /// As [`UpstreamLink::post`].
    pub async fn post(&self, msg: &Value) -> Result<()> {
        Ok(self.link.post(Bytes::from(msg.to_string())).await?)
    }

    /// Posts one message upstream, already serialised.
    ///
    /// # Errors
    /// As [`UpstreamLink::post`].
    pub async fn post_bytes(&self, msg: Bytes) -> Result<()> {
        Ok(self.link.post(msg).await?)
    }

    /// Sends a request of the proxy's own and waits (at most `limit`) for its response.
    ///
    /// # Errors
    /// Upstream errors; [`Error::UpstreamTimeout`] past `limit`; [`Error::UpstreamLost`].
    pub async fn request(&self, method: &str, params: Value, limit: Duration) -> Result<Value> {
        let (id, mut rx) = self.route(false);
        let msg = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        let r = async {
            self.post(&msg).await?;
            loop {
                match rx.recv().await {
                    Some(UpMsg::Response(r)) => return Ok(r),
                    // Its log messages and progress are nobody's concern.
                    Some(UpMsg::Log(_) | UpMsg::Progress(_)) => {}
                    Some(UpMsg::Input { id, method, .. }) => {
                        self.answer(&id, Err(json!({"code": crate::jsonrpc::METHOD_NOT_FOUND,
                            "message": format!("{method} is not available to the proxy's own requests")})))
                            .await;
                    }
                    _ => return Err(Error::UpstreamLost),
                }
            }
        };
        let out = tokio::time::timeout(limit, r).await.unwrap_or_else(|_| {
            Err(Error::UpstreamTimeout(format!(
                "{method} not answered in time"
            )))
        });
        self.unroute(id);
        out
    }

    /// Subscribes to `uri` upstream unless a listen on this session already did. `false` when
    /// the upstream refused.
    pub async fn subscribe(&self, uri: &str) -> bool {
        let first = {
            let mut st = self.lock();
            let n = st.subs.entry(uri.to_string()).or_insert(0);
            *n += 1;
            *n == 1
        };
        if !first {
            return true;
        }
        let r = self
            .request(
                "resources/subscribe",
                json!({"uri": uri}),
                Duration::from_secs(10),
            )
            .await;
        let ok = matches!(&r, Ok(m) if m.get("result").is_some());
        tracing::debug!(upstream = self.n, ok, answer = ?r, "resources/subscribe");
        if !ok {
            self.lock().subs.remove(uri);
        }
        ok
    }

    /// Drops one listen's interest in `uri`; unsubscribes upstream when it was the last.
    pub async fn unsubscribe(&self, uri: &str) {
        let last = {
            let mut st = self.lock();
            match st.subs.get_mut(uri) {
                Some(n) if *n > 1 => {
                    *n -= 1;
                    false
                }
                Some(_) => {
                    st.subs.remove(uri);
                    true
                }
                None => false,
            }
        };
        if last && !self.is_dead() {
            let _ = self
                .request(
                    "resources/unsubscribe",
                    json!({"uri": uri}),
                    Duration::from_secs(10),
                )
                .await;
        }
    }

    /// Answers a server→client request of the upstream.
    pub async fn answer(&self, id: &Value, outcome: std::result::Result<Value, Value>) {
        let msg = match outcome {
            Ok(result) => json!({"jsonrpc": "2.0", "id": id, "result": result}),
            Err(error) => json!({"jsonrpc": "2.0", "id": id, "error": error}),
        };
        if let Err(e) = self.post(&msg).await {
            tracing::warn!(upstream = self.n, error = %e, "answering an upstream request failed");
        }
    }

    /// Answers the upstream's request `id` with a result passed through as sent (a client's
    /// `inputResponses` member: never parsed into a tree).
    pub async fn answer_raw(&self, id: &Value, result: &RawValue) {
        let msg = format!(r#"{{"jsonrpc":"2.0","id":{id},"result":{}}}"#, result.get());
        if let Err(e) = self.post_bytes(Bytes::from(msg)).await {
            tracing::warn!(upstream = self.n, error = %e, "answering an upstream request failed");
        }
    }

    fn kill(&self) {
        let routes: Vec<Route> = {
            let mut st = self.lock();
            st.dead = true;
            st.lease_route = None;
            st.routes.drain().map(|(_, r)| r).collect()
        };
        for r in routes {
            // A full queue ends with the sender dropped here: its reader sees `None`, which
            // means the same.
            let _ = r.tx.try_send(UpMsg::Lost, 0);
        }
        if let Some(p) = self.pump.lock().unwrap_or_else(|e| e.into_inner()).take() {
            // Dropping the reader closes the upstream GET: the upstream session ends.
            p.abort();
        }
    }

    /// Routes one upstream message.
    /// Routes one upstream message of `len` bytes.
    async fn dispatch(&self, msg: Value, len: usize, hub: &Hub) {
        let method = msg
            .get("method")
            .and_then(Value::as_str)
            .map(str::to_string);
        let id = msg.get("id").filter(|v| !v.is_null()).cloned();
        match (method, id) {
            (None, Some(id)) => {
                let route = id.as_u64().and_then(|n| self.lock().routes.remove(&n));
                match route {
                    Some(r) => {
                        let _ = r.tx.send(UpMsg::Response(msg), len).await;
                    }
                    None => {
                        tracing::debug!(
                            upstream = self.n,
                            "upstream response to no request in flight dropped"
                        )
                    }
                }
            }
            (Some(method), Some(id)) => {
                let params = msg.get("params").cloned().unwrap_or_else(|| json!({}));
                if method == "ping" {
                    self.answer(&id, Ok(json!({}))).await;
                    return;
                }
                let holder = {
                    let st = self.lock();
                    st.lease_route
                        .and_then(|r| st.routes.get(&r).map(|x| x.tx.clone()))
                };
                let known = matches!(
                    method.as_str(),
                    "sampling/createMessage" | "elicitation/create" | "roots/list"
                );
                match holder.filter(|_| known) {
                    Some(tx) => {
                        let _ = tx.send(UpMsg::Input { id, method, params }, len).await;
                    }
                    None => {
                        // No client request to carry it (an upstream asking right after
                        // `initialized`, or a method 2026-07-28 has no MRTR form for).
                        tracing::info!(upstream = self.n, method, "upstream request with no client request to carry it answered with an error");
                        self.answer(
                            &id,
                            Err(json!({"code": crate::jsonrpc::METHOD_NOT_FOUND, "message": format!("{method} is not available: no client request is waiting on this upstream session")})),
                        )
                        .await;
                    }
                }
            }
            (Some(method), None) => {
                let params = msg.get("params").cloned().unwrap_or_else(|| json!({}));
                match method.as_str() {
                    "notifications/progress" => {
                        let token = params.get("progressToken").and_then(Value::as_u64);
                        let tx = {
                            let st = self.lock();
                            token.and_then(|t| st.routes.get(&t)).map(|r| r.tx.clone())
                        };
                        if let Some(tx) = tx {
                            let _ = tx.send(UpMsg::Progress(params), len).await;
                        }
                    }
                    "notifications/message" => {
                        let tx = {
                            let st = self.lock();
                            // Attributable only when exactly one request is in flight.
                            (st.routes.len() == 1)
                                .then(|| st.routes.values().next().map(|r| r.tx.clone()))
                                .flatten()
                        };
                        if let Some(tx) = tx {
                            let _ = tx.send(UpMsg::Log(params), len).await;
                        }
                    }
                    "notifications/cancelled" => {
                        let rid = params.get("requestId").and_then(Value::as_u64);
                        let route = rid.and_then(|n| self.lock().routes.remove(&n));
                        if let Some(r) = route {
                            let _ = r.tx.send(UpMsg::Cancelled, 0).await;
                        }
                    }
                    "notifications/tools/list_changed"
                    | "notifications/prompts/list_changed"
                    | "notifications/resources/list_changed"
                    | "notifications/resources/updated" => {
                        hub.upstream_notification(&self.key.who, &method, &params);
                    }
                    _ => {}
                }
            }
            (None, None) => {}
        }
    }
}

/// A lease on an upstream session: dropping it gives the session back.
pub struct Lease {
    /// The session.
    pub session: Arc<UpSession>,
    exclusive: bool,
    pool: Arc<Pool>,
}

impl std::fmt::Debug for Lease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lease")
            .field("session", &self.session.n)
            .field("exclusive", &self.exclusive)
            .finish()
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        {
            let mut st = self.session.lock();
            if self.exclusive {
                st.leased = false;
                st.lease_route = None;
            }
            st.last_used = Instant::now();
        }
        self.session.close_if_spent();
        self.pool.freed.notify_waiters();
    }
}

/// Holds an upstream session open (a listen stream waiting for its notifications).
pub struct Pinned(Lease);

impl Drop for Pinned {
    fn drop(&mut self) {
        let mut st = self.0.session.lock();
        st.pins = st.pins.saturating_sub(1);
        st.last_used = Instant::now();
        drop(st);
        self.0.session.close_if_spent();
    }
}

impl Pinned {
    /// The pinned session.
    pub fn session(&self) -> &Arc<UpSession> {
        &self.0.session
    }
}

impl Lease {
    /// Keeps the session open while the returned guard lives.
    pub fn pin(self) -> Pinned {
        self.session.lock().pins += 1;
        Pinned(self)
    }
}

/// A request in flight on an upstream session: its messages arrive on `rx`. Dropped before it
/// is finished (its client went away), it cancels the request upstream.
pub struct UpCall {
    /// The lease it runs on.
    pub lease: Lease,
    /// Its upstream id (also its upstream progress token).
    pub upstream_id: u64,
    /// Its messages.
    pub rx: queue::Rx<UpMsg>,
    done: bool,
}

impl std::fmt::Debug for UpCall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UpCall")
            .field("upstream_id", &self.upstream_id)
            .finish()
    }
}

impl UpCall {
    /// Marks it finished: answered, or already cancelled upstream.
    pub fn finish(mut self) {
        self.done = true;
    }

    /// The session.
    pub fn session(&self) -> &Arc<UpSession> {
        &self.lease.session
    }
}

impl Drop for UpCall {
    fn drop(&mut self) {
        let session = self.lease.session.clone();
        let id = self.upstream_id;
        if self.done || session.is_dead() {
            session.unroute(id);
            return;
        }
        // The client went away, the request timed out or was cancelled before its answer: tell
        // the upstream. It may go on regardless (a legacy server need not honour a cancel, and
        // the demo upstream does not) and its messages for this request would reach the next
        // request on the session — a log line goes to the one request in flight, a server→client
        // request to the lease holder — so the session is never used again: it closes once the
        // cancel is posted and nothing else uses it.
        session.abandon(id);
        tracing::debug!(
            upstream = session.n,
            request = id,
            "request abandoned: cancelling it upstream, retiring its session"
        );
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                rt.spawn(async move {
                    let msg = json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
                        "params": {"requestId": id, "reason": "client closed the request stream"}});
                    let _ = session.post(&msg).await;
                    session.cancel_posted();
                });
            }
            Err(_) => session.cancel_posted(),
        }
    }
}

/// Pool settings.
#[derive(Clone, Debug)]
pub struct PoolSettings {
    /// Most upstream sessions open at once.
    pub max_sessions: usize,
    /// Most upstream sessions one owner may hold (`modern.max_per_identity`).
    pub max_per_owner: usize,
    /// An upstream session with nothing in flight closes after this long.
    pub idle: Duration,
    /// How long a request waits for a session when the pool is full.
    pub wait: Duration,
}

/// The pool.
pub struct Pool {
    set: PoolSettings,
    upstream: UpstreamSettings,
    client: HttpClient,
    hub: Arc<Hub>,
    sessions: Mutex<Vec<Arc<UpSession>>>,
    /// Sessions being opened (count toward the bounds), by owner.
    opening: Mutex<HashMap<Owner, usize>>,
    freed: Notify,
    next: AtomicU64,
    gauge: IntGauge,
    /// The newest `initialize` result seen (for `server/discover`).
    latest_init: Mutex<Option<Value>>,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool").finish_non_exhaustive()
    }
}

impl Pool {
    /// A new, empty pool.
    pub fn new(
        set: PoolSettings,
        upstream: UpstreamSettings,
        hub: Arc<Hub>,
        gauge: IntGauge,
    ) -> Arc<Self> {
        Arc::new(Self {
            client: upstream::client(&upstream),
            set,
            upstream,
            hub,
            sessions: Mutex::new(Vec::new()),
            opening: Mutex::new(HashMap::new()),
            freed: Notify::new(),
            next: AtomicU64::new(0),
            gauge,
            latest_init: Mutex::new(None),
        })
    }

    fn sessions(&self) -> std::sync::MutexGuard<'_, Vec<Arc<UpSession>>> {
        self.sessions.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The newest upstream `initialize` result, if any session was ever opened.
    pub fn latest_init(&self) -> Option<Value> {
        self.latest_init
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Number of open upstream sessions.
    pub fn len(&self) -> usize {
        self.sessions().len()
    }

    /// Is the pool empty?
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Starts a request on a session for `key`, held by `owner`: exclusive (the session is
    /// leased to it alone), or shared. Opens a session when none fits, waiting up to
    /// `modern.pool_wait_secs` when the pool (or the owner's share of it) is full of busy
    /// sessions.
    ///
    /// # Errors
    /// [`Error::Capacity`] when no session could be had in time; upstream errors of the open.
    pub async fn call(
        self: &Arc<Self>,
        key: &PoolKey,
        owner: Owner,
        exclusive: bool,
    ) -> Result<UpCall> {
        let lease = self.lease(key, owner, exclusive).await?;
        let (upstream_id, rx) = lease.session.route(exclusive);
        Ok(UpCall {
            lease,
            upstream_id,
            rx,
            done: false,
        })
    }

    /// A lease on a session for `key` (see [`Pool::call`]).
    ///
    /// # Errors
    /// As [`Pool::call`].
    pub async fn lease(
        self: &Arc<Self>,
        key: &PoolKey,
        owner: Owner,
        exclusive: bool,
    ) -> Result<Lease> {
        let deadline = Instant::now() + self.set.wait;
        loop {
            let freed = self.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            let full = match self.try_take(key, owner, exclusive) {
                Take::Got(session) => {
                    return Ok(Lease {
                        session,
                        exclusive,
                        pool: self.clone(),
                    })
                }
                Take::Open => {
                    // Given back however the open ends: with its session, failed, or dropped
                    // with the request future (a client that went away mid-open).
                    let slot = OpenSlot { pool: self, owner };
                    let session = self.open(key, owner).await?;
                    let mut st = session.lock();
                    if exclusive {
                        st.leased = true;
                    }
                    drop(st);
                    {
                        // The count becomes the session in one step (lock order: sessions,
                        // then opening, as in `try_take`).
                        let mut all = self.sessions();
                        all.push(session.clone());
                        drop(slot);
                        self.gauge.set(all.len() as i64);
                    }
                    return Ok(Lease {
                        session,
                        exclusive,
                        pool: self.clone(),
                    });
                }
                Take::Full => format!(
                    "all {} upstream sessions of the pool are busy (modern.pool_max_sessions)",
                    self.set.max_sessions
                ),
                Take::OwnerFull => format!(
                    "this caller's {} upstream sessions are all busy (modern.max_per_identity)",
                    self.set.max_per_owner
                ),
            };
            if tokio::time::timeout_at(deadline, freed).await.is_err() {
                return Err(Error::Capacity(full));
            }
        }
    }

    /// An open for `owner` is over (its session is in the pool, or it failed).
    fn opened(&self, owner: Owner) {
        let mut o = self.opening.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = o.get_mut(&owner) {
            *n -= 1;
            if *n == 0 {
                o.remove(&owner);
            }
        }
    }

    fn try_take(&self, key: &PoolKey, owner: Owner, exclusive: bool) -> Take {
        let mut all = self.sessions();
        all.retain(|s| !s.is_dead());
        self.gauge.set(all.len() as i64);
        // A retiring session takes no new request (see `State::retiring`).
        let mine = || all.iter().filter(|s| &s.key == key && !s.lock().retiring);
        if exclusive {
            for s in mine() {
                let mut st = s.lock();
                if !st.leased && st.routes.is_empty() {
                    st.leased = true;
                    st.last_used = Instant::now();
                    return Take::Got(s.clone());
                }
            }
        }
        // A shared request: the least busy session of the key nobody leased. A leased one only
        // when no other can be opened: its lease holder's slow reader may hold its pump back, and
        // a shared answer would wait behind it.
        let mut leased: Option<Arc<UpSession>> = None;
        if !exclusive {
            let best = mine()
                .map(|s| {
                    let st = s.lock();
                    ((st.leased, st.routes.len()), s)
                })
                .min_by_key(|(k, _)| *k);
            match best {
                Some(((false, _), s)) => return Take::Got(s.clone()),
                Some((_, s)) => leased = Some(s.clone()),
                None => {}
            }
        }
        let idle = |s: &Arc<UpSession>| {
            let st = s.lock();
            !st.leased && st.routes.is_empty() && st.pins == 0
        };
        // Counting and taking under the sessions lock: concurrent opens cannot all see the last
        // slot.
        let mut opening = self.opening.lock().unwrap_or_else(|e| e.into_inner());
        let opening_total: usize = opening.values().sum();
        let mut victim = None;
        if owner != Owner::Unknown {
            let held = all.iter().filter(|s| s.owner == owner).count()
                + opening.get(&owner).copied().unwrap_or(0);
            if held >= self.set.max_per_owner {
                // At its share: only one of its own idle sessions can make room (its other keys:
                // other capabilities, other made-up header values from the same address).
                let own = all
                    .iter()
                    .enumerate()
                    .filter(|(_, s)| s.owner == owner && idle(s))
                    .min_by_key(|(_, s)| s.lock().last_used)
                    .map(|(i, _)| i);
                match (own, leased.clone()) {
                    (Some(i), _) => victim = Some(i),
                    (None, Some(s)) => return Take::Got(s),
                    (None, None) => return Take::OwnerFull,
                }
            }
        }
        if victim.is_none() && all.len() + opening_total >= self.set.max_sessions {
            // Full: close the session idle the longest (any key) to make room.
            victim = all
                .iter()
                .enumerate()
                .filter(|(_, s)| idle(s))
                .min_by_key(|(_, s)| s.lock().last_used)
                .map(|(i, _)| i);
            if victim.is_none() {
                return leased.map_or(Take::Full, Take::Got);
            }
        }
        if let Some(i) = victim {
            let v = all.remove(i);
            tracing::debug!(upstream = v.n, "idle upstream session closed to make room");
            v.kill();
        }
        *opening.entry(owner).or_default() += 1;
        Take::Open
    }

    /// Opens and initializes an upstream session for `key`.
    async fn open(self: &Arc<Self>, key: &PoolKey, owner: Owner) -> Result<Arc<UpSession>> {
        let (link, reader) = upstream::connect(&self.upstream, &self.client).await?;
        let n = self.next.fetch_add(1, Ordering::Relaxed) + 1;
        let session = Arc::new(UpSession {
            n,
            key: key.clone(),
            owner,
            link,
            init: std::sync::OnceLock::new(),
            st: Mutex::new(State {
                next_id: 0,
                routes: HashMap::new(),
                lease_route: None,
                leased: false,
                pins: 0,
                subs: HashMap::new(),
                last_used: Instant::now(),
                dead: false,
                retiring: false,
                cancels: 0,
            }),
            pump: Mutex::new(None),
        });
        let pump = tokio::spawn(pump(session.clone(), reader, self.hub.clone()));
        *session.pump.lock().unwrap_or_else(|e| e.into_inner()) = Some(pump.abort_handle());
        let mut armed = KillUnlessOpened(Some(session.clone()));
        let (id, mut rx) = session.route(false);
        let init = json!({"jsonrpc": "2.0", "id": id, "method": "initialize", "params": {
            "protocolVersion": UPSTREAM_VERSION,
            "capabilities": key.upstream_caps(),
            "clientInfo": {"name": "mcp-resume-proxy", "version": env!("CARGO_PKG_VERSION")},
        }});
        let handshake = async {
            session.post(&init).await?;
            match rx.recv().await {
                Some(UpMsg::Response(r)) if r.get("result").is_some() => Ok(r["result"].clone()),
                Some(UpMsg::Response(_)) => {
                    Err(Error::Upstream(upstream::UpstreamError::InitializeRefused))
                }
                _ => Err(Error::UpstreamLost),
            }
        };
        let result = match tokio::time::timeout(self.upstream.connect_timeout, handshake).await {
            Ok(Ok(r)) => r,
            Ok(Err(e)) => {
                session.kill();
                return Err(e);
            }
            Err(_) => {
                session.kill();
                return Err(Error::UpstreamTimeout(
                    "initialize not answered in time".into(),
                ));
            }
        };
        session.unroute(id);
        session
            .post(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
            .await
            .inspect_err(|_| session.kill())?;
        let _ = session.init.set(result.clone());
        *self.latest_init.lock().unwrap_or_else(|e| e.into_inner()) = Some(result.clone());
        if result.pointer("/capabilities/logging").is_some() {
            // Per-request logLevel filtering happens here; the upstream sends everything.
            let _ = session
                .request(
                    "logging/setLevel",
                    json!({"level": "debug"}),
                    self.upstream.connect_timeout,
                )
                .await;
        }
        armed.0 = None;
        tracing::debug!(upstream = session.n, "upstream session of the pool opened");
        Ok(session)
    }

    /// Closes sessions idle longer than `modern.pool_idle_secs`.
    pub fn reap(&self) {
        let mut all = self.sessions();
        let idle = self.set.idle;
        all.retain(|s| {
            let st = s.lock();
            let keep = !st.dead
                && !st.spent()
                && (st.leased
                    || !st.routes.is_empty()
                    || st.pins > 0
                    || st.last_used.elapsed() < idle);
            drop(st);
            if !keep {
                tracing::debug!(upstream = s.n, "idle upstream session closed");
                s.kill();
            }
            keep
        });
        self.gauge.set(all.len() as i64);
    }

    /// Closes every session (shutdown): requests in flight get their [`UpMsg::Lost`].
    pub fn close_all(&self) {
        let all: Vec<_> = self.sessions().drain(..).collect();
        for s in all {
            s.kill();
        }
        self.gauge.set(0);
    }
}

/// An open counted in [`Pool::opening`]; uncounted when dropped.
struct OpenSlot<'a> {
    pool: &'a Pool,
    owner: Owner,
}

impl Drop for OpenSlot<'_> {
    fn drop(&mut self) {
        self.pool.opened(self.owner);
    }
}

/// Kills a session being opened unless disarmed: an open dropped mid-handshake leaves no pump
/// (and no upstream session) behind.
struct KillUnlessOpened(Option<Arc<UpSession>>);

impl Drop for KillUnlessOpened {
    fn drop(&mut self) {
        if let Some(s) = self.0.take() {
            s.kill();
        }
    }
}

enum Take {
    Got(Arc<UpSession>),
    Open,
    /// The pool is full of busy sessions.
    Full,
    /// The owner holds its share, all busy.
    OwnerFull,
}

async fn pump(session: Arc<UpSession>, mut reader: UpstreamReader, hub: Arc<Hub>) {
    loop {
        match reader.next().await.map_err(Error::from) {
            Ok(Some(UpstreamItem::Event(ev))) => {
                if ev.event.as_deref().is_some_and(|t| t != "message") {
                    continue;
                }
                match serde_json::from_slice::<Value>(&ev.data) {
                    Ok(msg) if msg.is_object() => session.dispatch(msg, ev.data.len(), &hub).await,
                    _ => tracing::warn!(
                        upstream = session.n,
                        "upstream message is not a JSON-RPC object; dropped"
                    ),
                }
            }
            Ok(Some(UpstreamItem::Oversized { len, .. })) => {
                tracing::error!(
                    upstream = session.n,
                    bytes = len,
                    "upstream event over upstream.max_event_bytes dropped"
                );
            }
            Ok(None) => {
                tracing::info!(
                    upstream = session.n,
                    "the upstream ended the stream of a pool session"
                );
                break;
            }
            Err(e) => {
                // (How the stream failed: a connection cut under it, or a malformed stream.)
                tracing::warn!(upstream = session.n, error = %crate::error::chain(&e), "upstream stream of a pool session failed");
                break;
            }
        }
    }
    tracing::info!(upstream = session.n, "upstream session of the pool lost");
    session.kill();
}
