//! `subscriptions/listen`: the 2026-07-28 replacement for the standalone GET stream.
//!
//! A listen request opens an SSE stream whose first event acknowledges the subscription
//! (`notifications/subscriptions/acknowledged` with the honoured subset of the filter), tagged,
//! like every later notification, with `_meta["io.modelcontextprotocol/subscriptionId"]` = the
//! listen request's JSON-RPC id. The [`Hub`] fans out what the pool's upstream sessions report
//! (list changes, resource updates) and task state changes to the listens of the same identity
//! that opted in. A listen pins one upstream session of its caller open, so list changes reach
//! it even when nothing else is in flight, and its `resourceSubscriptions` are subscribed there
//! (when the upstream declares `resources.subscribe`). On drain the stream ends gracefully with the listen's
//! result; a client that closes the stream, or posts `notifications/cancelled` naming the
//! listen's id, ends it.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use bytes::Bytes;
use serde_json::{json, Map, Value};
use tokio::sync::mpsc;

use super::who::Who;
use crate::identity::Identity;
use crate::session::Owner;
use crate::sse::encode;

/// The `_meta` key that tags notifications with their subscription.
pub const SUBSCRIPTION_ID: &str = "io.modelcontextprotocol/subscriptionId";

/// What a listen asked for, as honoured.
#[derive(Clone, Debug, Default)]
pub struct Filter {
    /// `toolsListChanged`.
    pub tools: bool,
    /// `promptsListChanged`.
    pub prompts: bool,
    /// `resourcesListChanged`.
    pub resources: bool,
    /// `resourceSubscriptions`.
    pub resource_uris: Vec<String>,
    /// `taskIds` (tasks extension).
    pub task_ids: Option<HashSet<String>>,
}

impl Filter {
    /// The honoured filter as sent in the acknowledgement.
    pub fn to_json(&self) -> Value {
        let mut m = Map::new();
        if self.tools {
            m.insert("toolsListChanged".into(), json!(true));
        }
        if self.prompts {
            m.insert("promptsListChanged".into(), json!(true));
        }
        if self.resources {
            m.insert("resourcesListChanged".into(), json!(true));
        }
        if !self.resource_uris.is_empty() {
            m.insert("resourceSubscriptions".into(), json!(self.resource_uris));
        }
        if let Some(t) = &self.task_ids {
            let mut ids: Vec<&String> = t.iter().collect();
            ids.sort();
            m.insert("taskIds".into(), json!(ids));
        }
        Value::Object(m)
    }

    fn wants(&self, method: &str, params: &Value) -> bool {
        match method {
            "notifications/tools/list_changed" => self.tools,
            "notifications/prompts/list_changed" => self.prompts,
            "notifications/resources/list_changed" => self.resources,
            "notifications/resources/updated" => params
                .get("uri")
                .and_then(Value::as_str)
                .is_some_and(|u| self.resource_uris.iter().any(|r| r == u)),
            _ => false,
        }
    }
}

/// Notifications queued per listen before it counts as fallen behind.
const QUEUE: usize = 256;

struct Listener {
    who: Who,
    owner: Owner,
    sub_id: Value,
    filter: Filter,
    tx: mpsc::Sender<Bytes>,
}

/// Why a listen's inbox ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Closed {
    /// Its client cancelled it, or the proxy drains: a graceful end.
    Ended,
    /// Its reader fell [`QUEUE`] notifications behind: it is ended loudly rather than skip one.
    FellBehind,
}

/// The live listens.
pub struct Hub {
    listeners: Mutex<HashMap<u64, Listener>>,
    /// Listens ended because their reader fell behind, by owner, until their streams are gone
    /// (they still count against the owner: a stalled stream holds a connection and a session).
    behind: Mutex<HashMap<u64, Owner>>,
    next: AtomicU64,
    /// Most live listens of one owner (`modern.max_per_identity`).
    max_per_owner: usize,
    dropped: prometheus::IntCounter,
}

impl std::fmt::Debug for Hub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hub").finish_non_exhaustive()
    }
}

fn same_identity(a: Option<&Identity>, b: Option<&Identity>) -> bool {
    match (a, b) {
        (None, None) => true,
        (Some(a), Some(b)) => a.matches(b),
        _ => false,
    }
}

/// One SSE `message` event (no `id:`: modern streams are not resumable).
pub fn frame(msg: &Value) -> Bytes {
    encode::event(None, Some("message"), msg.to_string().as_bytes())
}

/// A notification tagged with a subscription id.
fn tagged(method: &str, params: &Value, sub_id: &Value) -> Value {
    let mut p = params.as_object().cloned().unwrap_or_default();
    let mut meta = p
        .get("_meta")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    meta.insert(SUBSCRIPTION_ID.into(), sub_id.clone());
    p.insert("_meta".into(), Value::Object(meta));
    json!({"jsonrpc": "2.0", "method": method, "params": p})
}

/// Removes its listener from the hub when dropped.
pub struct Registration<'a> {
    hub: &'a Hub,
    n: u64,
}

impl Drop for Registration<'_> {
    fn drop(&mut self) {
        self.hub.lock().remove(&self.n);
        self.hub
            .behind
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.n);
    }
}

impl Hub {
    /// No listens yet; `max_per_owner` bounds each owner's; `dropped` counts the notifications
    /// that ended a listen whose reader fell behind.
    pub fn new(max_per_owner: usize, dropped: prometheus::IntCounter) -> Self {
        Self {
            listeners: Mutex::new(HashMap::new()),
            behind: Mutex::new(HashMap::new()),
            next: AtomicU64::new(0),
            max_per_owner,
            dropped,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Listener>> {
        self.listeners.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Registers a listen of `who`, counted against `owner`; its notifications arrive on the
    /// returned receiver, which ends when the listen is closed ([`Hub::close`], or its reader fell
    /// behind: [`Hub::closed`] tells which). `None` when `owner` already has
    /// `modern.max_per_identity` live listens.
    pub fn register(
        &self,
        who: Who,
        owner: Owner,
        sub_id: Value,
        filter: Filter,
    ) -> Option<(u64, mpsc::Receiver<Bytes>)> {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = mpsc::channel(QUEUE);
        let mut l = self.lock();
        if !self.room(&l, owner) {
            return None;
        }
        l.insert(
            n,
            Listener {
                who,
                owner,
                sub_id,
                filter,
                tx,
            },
        );
        Some((n, rx))
    }

    /// May `owner` open another listen now? (Checked again, atomically, by [`Hub::register`].)
    pub fn room_for(&self, owner: Owner) -> bool {
        self.room(&self.lock(), owner)
    }

    /// Lock order: listeners, then `behind`.
    fn room(&self, l: &HashMap<u64, Listener>, owner: Owner) -> bool {
        if owner == Owner::Unknown {
            return true;
        }
        let live = l.values().filter(|x| x.owner == owner).count();
        let stalled = self
            .behind
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .filter(|o| **o == owner)
            .count();
        live + stalled < self.max_per_owner
    }

    /// Why listen `n`'s inbox ended (asked once, after it did).
    pub fn closed(&self, n: u64) -> Closed {
        let behind = self
            .behind
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains_key(&n);
        if behind {
            Closed::FellBehind
        } else {
            Closed::Ended
        }
    }

    /// Queues `frame` for listener `n`; a listener whose queue is full is removed (its stream
    /// ends loudly) rather than silently miss a notification.
    fn offer(&self, l: &mut HashMap<u64, Listener>, n: u64, frame: Bytes) {
        let Some(x) = l.get(&n) else { return };
        if let Err(mpsc::error::TrySendError::Full(_)) = x.tx.try_send(frame) {
            let owner = x.owner;
            l.remove(&n);
            self.dropped.inc();
            self.behind
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(n, owner);
            tracing::warn!(
                listen = n,
                queued = QUEUE,
                "a subscriptions/listen reader fell behind: its stream is ended with an error"
            );
        }
    }

    /// A guard that deregisters listen `n` when dropped.
    pub fn guard(&self, n: u64) -> Registration<'_> {
        Registration { hub: self, n }
    }

    /// Number of live listens.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// No live listens?
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Ends the listens of `who` whose subscription id is `sub_id` (the client posted
    /// `notifications/cancelled` for it). Returns how many.
    pub fn close(&self, who: &Who, sub_id: &Value) -> usize {
        let mut l = self.lock();
        let before = l.len();
        l.retain(|_, x| !(x.who.same(who) && &x.sub_id == sub_id));
        before - l.len()
    }

    /// Ends every listen (shutdown): each stream ends with its graceful result.
    pub fn close_all(&self) {
        self.lock().clear();
    }

    /// An upstream notification (of an upstream session of `who`) for the listens of `who`
    /// that opted in.
    pub fn upstream_notification(&self, who: &Who, method: &str, params: &Value) {
        let mut params = params.clone();
        if let Some(p) = params.as_object_mut() {
            p.remove("_meta");
        }
        let mut l = self.lock();
        let to: Vec<(u64, Bytes)> = l
            .iter()
            .filter(|(_, x)| x.who.same(who) && x.filter.wants(method, &params))
            .map(|(n, x)| (*n, frame(&tagged(method, &params, &x.sub_id))))
            .collect();
        for (n, f) in to {
            self.offer(&mut l, n, f);
        }
    }

    /// A task's new state for the listens subscribed to it: of its identity (a task created
    /// without one answers whoever has its id, so does its listen).
    pub fn task_notification(&self, identity: Option<&Identity>, task_id: &str, task: &Value) {
        let mut l = self.lock();
        let to: Vec<(u64, Bytes)> = l
            .iter()
            .filter(|(_, x)| {
                let wants = x
                    .filter
                    .task_ids
                    .as_ref()
                    .is_some_and(|t| t.contains(task_id));
                wants && same_identity(x.who.identity(), identity)
            })
            .map(|(n, x)| (*n, frame(&tagged("notifications/tasks", task, &x.sub_id))))
            .collect();
        for (n, f) in to {
            self.offer(&mut l, n, f);
        }
    }
}

/// The acknowledgement, the listen's first event.
pub fn ack(filter: &Filter, sub_id: &Value) -> Bytes {
    frame(&tagged(
        "notifications/subscriptions/acknowledged",
        &json!({"notifications": filter.to_json()}),
        sub_id,
    ))
}

/// The graceful end of a listen: its JSON-RPC result.
pub fn end(sub_id: &Value, server_info: Option<&Value>) -> Bytes {
    let mut meta = Map::new();
    meta.insert(SUBSCRIPTION_ID.into(), sub_id.clone());
    if let Some(si) = server_info {
        meta.insert(super::protocol::SERVER_INFO.into(), si.clone());
    }
    frame(
        &json!({"jsonrpc": "2.0", "id": sub_id, "result": {"resultType": "complete", "_meta": meta}}),
    )
}
