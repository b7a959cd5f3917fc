//! The single writer (on its own thread, see [`spawn`]): group commit.
//!
//! Ops arrive over a bounded channel. Each turn takes everything queued (up to [`MAX_BATCH`]),
//! assigns seqs, packs each session's events of the turn into chunks (one sled key each, see
//! [`key`]), writes one sled batch per tree, flushes once when durability is `fsync`, and only
//! then publishes: heads move, windows grow, acks fire. Throughput scales with the batch size, not
//! with fsync latency or sled's per-key cost. A failed write rolls the assigned seqs back, so seqs
//! never have holes (I2).

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use tokio::sync::{mpsc, oneshot};

use super::{key, Event, LogState, Op, SessionLog, Store, WINDOW_BYTES, WINDOW_EVENTS};
use crate::config::Durability;
use crate::error::{Error, Result};
use crate::log::cursor::SessionId;

/// Most ops written in one batch.
pub(crate) const MAX_BATCH: usize = 1024;
/// Most events in one chunk. Bounds what a read of one event decodes.
const CHUNK_EVENTS: u32 = 256;
/// A chunk is closed once its encoding reaches this size (one large event may exceed it).
const CHUNK_BYTES: usize = 64 * 1024;

type Ack = Option<oneshot::Sender<Result<u64>>>;

struct Pending {
    log: Arc<SessionLog>,
    event: Arc<Event>,
    received: tokio::time::Instant,
    done: Ack,
}

/// Turns written to sled whose flush is still running. Turn N+1 is assembled and applied while
/// turn N's fsync is in flight, so an event that arrives during a flush waits for its own turn
/// only; turns still publish strictly in order.
const PIPELINE: usize = 2;

/// A turn written to sled, waiting to become durable and then published.
struct Turn {
    pending: Vec<Pending>,
    acks: Vec<oneshot::Sender<Result<u64>>>,
    /// Chunk keys it inserted: removed again if the turn fails, so no stale chunk survives a
    /// rollback of its seqs.
    keys: Vec<[u8; 24]>,
    durable: Durable,
}

enum Durable {
    /// Applied (and needing no flush), or failed.
    Ready(std::result::Result<(), String>),
    /// Applied; the flush runs in a task on the writer's runtime.
    Flushing(tokio::task::JoinHandle<std::result::Result<(), String>>),
}

impl Durable {
    async fn wait(&mut self) -> std::result::Result<(), String> {
        match self {
            Durable::Ready(r) => r.clone(),
            Durable::Flushing(h) => match h.await {
                Ok(r) => r,
                Err(e) => Err(format!("log flush task failed: {e}")),
            },
        }
    }
}

/// The writer's thread. The writer runs on a thread of its own (with a single-threaded runtime)
/// rather than as a task of the proxy's runtime: its sled work is CPU-bound, and on a runtime
/// worker it would either stall the client streams and upstream readers queued behind it or pay
/// a `block_in_place` hand-off per turn; and its turns do not wait in a worker's queue behind
/// hundreds of stream tasks.
pub(crate) struct Handle {
    stop: oneshot::Sender<()>,
    thread: std::thread::JoinHandle<()>,
}

impl Handle {
    /// Stops the writer where it is (what is not yet published is dropped, as in a crash) and
    /// waits for its thread, which releases its handle on the store.
    pub(crate) async fn stop(self) {
        let _ = self.stop.send(());
        let thread = self.thread;
        let _ = tokio::task::spawn_blocking(move || thread.join()).await;
    }
}

/// Starts the writer thread.
pub(crate) fn spawn(store: Arc<Store>, rx: mpsc::Receiver<Op>) -> Result<Handle> {
    let (stop, stopped) = oneshot::channel();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Error::Store(format!("log writer runtime: {e}")))?;
    let thread = std::thread::Builder::new()
        .name("log-writer".into())
        .spawn(move || rt.block_on(run(store, rx, stopped)))
        .map_err(|e| Error::Store(format!("log writer thread: {e}")))?;
    Ok(Handle { stop, thread })
}

/// Runs until every sender is dropped and every turn is published, or until stopped.
async fn run(store: Arc<Store>, mut rx: mpsc::Receiver<Op>, mut stopped: oneshot::Receiver<()>) {
    let mut ops = Vec::with_capacity(MAX_BATCH);
    let mut queue: VecDeque<Turn> = VecDeque::with_capacity(PIPELINE);
    let mut open = true;
    // A dropped handle (the log dropped without `close`) is not a stop: drain as usual.
    let mut stoppable = true;
    while open || !queue.is_empty() {
        tokio::select! {
            biased;
            r = &mut stopped, if stoppable => match r {
                Ok(()) => return,
                Err(_) => stoppable = false,
            },
            r = wait_front(&mut queue), if !queue.is_empty() => {
                match r {
                    Ok(()) => {
                        let turn = queue.pop_front().expect("front turn");
                        publish_turn(&store, turn);
                    }
                    Err(e) => fail_all(&store, &mut queue, &e),
                }
            }
            n = rx.recv_many(&mut ops, MAX_BATCH), if open && queue.len() < PIPELINE => {
                if n == 0 {
                    open = false;
                } else {
                    queue.push_back(write_turn(&store, &mut ops));
                }
            }
        }
    }
    if let Err(e) = store.db.flush_async().await {
        tracing::error!(error = %e, "final log flush failed");
    }
}

async fn wait_front(queue: &mut VecDeque<Turn>) -> std::result::Result<(), String> {
    match queue.front_mut() {
        Some(t) => t.durable.wait().await,
        None => std::future::pending().await,
    }
}

/// Assigns seqs, packs chunks and applies one turn; starts its flush when it needs one.
fn write_turn(store: &Arc<Store>, ops: &mut Vec<Op>) -> Turn {
    let mut chunks = Chunks::default();
    let mut inflight = TreeBatch::default();
    let mut sessions = TreeBatch::default();
    let mut pending: Vec<Pending> = Vec::new();
    let mut acks: Vec<oneshot::Sender<Result<u64>>> = Vec::new();
    let mut removes = Vec::new();
    // A request's in-flight record is flushed before it is forwarded even in relaxed mode: it is
    // what lets a restart answer the request (I6), and requests are rare next to events.
    let mut must_flush = false;

    for op in ops.drain(..) {
        match op {
            Op::Append { log, ev, done } => {
                add_event(&mut chunks, &mut inflight, &mut pending, &log, ev, done);
            }
            Op::AppendMany { log, evs } => {
                for ev in evs {
                    add_event(&mut chunks, &mut inflight, &mut pending, &log, ev, None);
                }
            }
            Op::Inflight {
                session,
                request_id,
                stream,
                registered_at,
                done,
            } => {
                inflight.insert(
                    key::inflight_key(&session, &request_id),
                    &key::inflight_value(stream, registered_at),
                );
                must_flush = true;
                acks.push(done);
            }
            Op::InflightDone {
                session,
                request_id,
                done,
            } => {
                inflight.remove(key::inflight_key(&session, &request_id));
                acks.push(done);
            }
            Op::Meta { log, done } => {
                let meta = serde_json::to_vec(&log.lock().meta).expect("meta serialises");
                sessions.insert(&log.id.0, meta);
                if let Some(d) = done {
                    acks.push(d);
                }
            }
            Op::Remove { session, done } => {
                removes.push(session);
                acks.push(done);
            }
            Op::Flush { done } => {
                must_flush = true;
                acks.push(done);
            }
        }
    }

    let flush = must_flush || store.durability == Durability::Fsync;
    let (events, keys) = chunks.into_batch();
    // Synchronous sled work, on the writer's own thread: tens of microseconds per key.
    let applied = apply(store, events, inflight, sessions, &removes);
    // Write failures on demand for unit tests: a full disk or an I/O error is not something a
    // test can make sled produce. The turn fails after it was applied — the worst case: its
    // chunks are in the tree but not durable.
    #[cfg(test)]
    let applied = applied.and_then(|()| {
        let fail = store
            .fail_turns
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
        fail.map_or(Ok(()), |_| Err("injected write failure".to_string()))
    });
    let durable = match applied {
        Ok(()) if flush => {
            let store = store.clone();
            Durable::Flushing(tokio::spawn(async move {
                store
                    .db
                    .flush_async()
                    .await
                    .map(|_| ())
                    .map_err(|e| e.to_string())
            }))
        }
        other => Durable::Ready(other),
    };
    Turn {
        pending,
        acks,
        keys,
        durable,
    }
}

/// Assigns the next seq of `log` to `ev` and adds it to the turn.
fn add_event(
    chunks: &mut Chunks,
    inflight: &mut TreeBatch,
    pending: &mut Vec<Pending>,
    log: &Arc<SessionLog>,
    ev: super::NewEvent,
    done: Ack,
) {
    let (seq, epoch) = {
        let mut st = log.lock();
        st.assigned += 1;
        (st.assigned, st.ranges.current_epoch())
    };
    chunks.push(&log.id, seq, epoch, &ev);
    if let Some(req) = &ev.completes {
        inflight.remove(key::inflight_key(&log.id, req));
    }
    pending.push(Pending {
        event: Arc::new(Event {
            seq,
            epoch,
            stream: ev.stream,
            kind: ev.kind,
            payload: ev.payload,
        }),
        log: log.clone(),
        received: ev.received,
        done,
    });
}

/// The front turn failed: it and every later turn (written after it, so not provable either)
/// are rejected, their chunks removed and their sessions' seqs rolled back to the durable head,
/// so the next append reuses them (I2: no holes).
fn fail_all(store: &Store, queue: &mut VecDeque<Turn>, e: &str) {
    tracing::error!(error = %e, turns = queue.len(), "log write failed; appends in these turns are rejected");
    let mut batch = sled::Batch::default();
    for turn in queue.drain(..) {
        if let Durable::Flushing(h) = &turn.durable {
            h.abort();
        }
        for k in &turn.keys {
            batch.remove(&k[..]);
        }
        for p in turn.pending {
            {
                let mut st = p.log.lock();
                st.assigned = st.ranges.head;
            }
            if let Some(d) = p.done {
                let _ = d.send(Err(Error::Store(e.to_string())));
            }
        }
        for a in turn.acks {
            let _ = a.send(Err(Error::Store(e.to_string())));
        }
    }
    if let Err(e) = store.events.apply_batch(batch) {
        tracing::error!(error = %e, "removing the chunks of failed turns failed too");
    }
}

/// Publishes a durable turn: heads move, windows grow, sessions over their bound are trimmed,
/// acks fire, readers wake.
fn publish_turn(store: &Store, turn: Turn) {
    let metrics = &store.metrics;
    let mut touched: HashMap<SessionId, Arc<SessionLog>> = HashMap::new();
    // Appenders hear back after retention is applied, like readers.
    let mut acks = Vec::new();
    for p in turn.pending {
        {
            let mut st = p.log.lock();
            publish(&mut st, &p.event);
        }
        metrics.logged.inc();
        metrics
            .append_seconds
            .observe(p.received.elapsed().as_secs_f64());
        store
            .total_bytes
            .fetch_add(p.event.payload.len() as u64, Ordering::Relaxed);
        if let Some(d) = p.done {
            acks.push((d, p.event.seq));
        }
        touched.entry(p.log.id).or_insert(p.log);
    }
    // Trim before waking readers, so nobody observes a head beyond the retention bound. Most
    // turns trim nothing: `trim` returns at once for a session within its bound.
    for log in touched.values() {
        if let Err(e) = trim(store, log) {
            tracing::error!(session = %log.id, error = %e, "trim failed");
        }
    }
    for log in touched.values() {
        let head = log.lock().ranges.head;
        log.head_tx.send_replace(head);
    }
    metrics
        .log_bytes
        .set(store.total_bytes.load(Ordering::Relaxed) as i64);
    for (d, seq) in acks {
        let _ = d.send(Ok(seq));
    }
    for a in turn.acks {
        let _ = a.send(Ok(0));
    }
}

/// The chunks of one turn: each session's events, in seq order, cut at [`CHUNK_EVENTS`] /
/// [`CHUNK_BYTES`].
#[derive(Default)]
struct Chunks {
    /// Session → (first seq, chunk being filled).
    open: HashMap<SessionId, (u64, key::ChunkBuilder)>,
    full: Vec<([u8; 24], Vec<u8>)>,
}

impl Chunks {
    fn push(&mut self, session: &SessionId, seq: u64, epoch: u32, ev: &super::NewEvent) {
        let (_, chunk) = self
            .open
            .entry(*session)
            .or_insert_with(|| (seq, key::ChunkBuilder::default()));
        chunk.push(epoch, ev.kind, ev.stream, &ev.payload);
        if chunk.count() >= CHUNK_EVENTS || chunk.encoded_len() >= CHUNK_BYTES {
            if let Some((first, chunk)) = self.open.remove(session) {
                self.full
                    .push((key::event_key(session, first), chunk.finish()));
            }
        }
    }

    /// The batch to apply and the keys it inserts.
    fn into_batch(mut self) -> (TreeBatch, Vec<[u8; 24]>) {
        for (session, (first, chunk)) in self.open.drain() {
            self.full
                .push((key::event_key(&session, first), chunk.finish()));
        }
        let mut batch = TreeBatch::default();
        let mut keys = Vec::with_capacity(self.full.len());
        for (k, v) in self.full {
            batch.insert(&k, v);
            keys.push(k);
        }
        (batch, keys)
    }
}

/// A sled batch that knows whether anything was put in it. Applying even an empty batch takes
/// sled's global write lock and logs a batch marker, and most turns touch only the `events` tree.
#[derive(Default)]
struct TreeBatch {
    batch: sled::Batch,
    len: usize,
}

impl TreeBatch {
    fn insert(&mut self, key: impl Into<sled::IVec>, value: impl Into<sled::IVec>) {
        self.batch.insert(key, value);
        self.len += 1;
    }

    fn remove(&mut self, key: impl Into<sled::IVec>) {
        self.batch.remove(key);
        self.len += 1;
    }

    fn apply(self, tree: &sled::Tree) -> sled::Result<()> {
        if self.len == 0 {
            return Ok(());
        }
        tree.apply_batch(self.batch)
    }
}

fn apply(
    store: &Store,
    events: TreeBatch,
    inflight: TreeBatch,
    sessions: TreeBatch,
    removes: &[SessionId],
) -> std::result::Result<(), String> {
    let e = |e: sled::Error| e.to_string();
    events.apply(&store.events).map_err(e)?;
    inflight.apply(&store.inflight).map_err(e)?;
    sessions.apply(&store.sessions).map_err(e)?;
    for id in removes {
        remove_session(store, id).map_err(e)?;
    }
    Ok(())
}

fn publish(st: &mut LogState, ev: &Arc<Event>) {
    st.ranges.head = ev.seq;
    st.bytes += ev.payload.len() as u64;
    st.window_bytes += ev.payload.len();
    st.window.push_back(ev.clone());
    while st.window.len() > WINDOW_EVENTS || (st.window_bytes > WINDOW_BYTES && st.window.len() > 1)
    {
        if let Some(old) = st.window.pop_front() {
            st.window_bytes -= old.payload.len();
        }
    }
}

/// Is `log` over its count or byte bound?
fn over_bound(store: &Store, log: &SessionLog) -> bool {
    let st = log.lock();
    let count = st.ranges.head + 1 - st.ranges.oldest.min(st.ranges.head + 1);
    count > store.max_events || st.bytes > store.max_bytes
}

/// Drops the oldest events of `log` while it is over its count or byte bound. Trims to 90% of the
/// bound so that a busy session trims in batches rather than on every append. Never trims the head.
/// Whole chunks go; the chunk holding the new oldest event is rewritten under its new first seq,
/// in the same sled batch, so retention is exact to the event.
fn trim(store: &Store, log: &SessionLog) -> std::result::Result<(), String> {
    if !over_bound(store, log) {
        return Ok(());
    }
    let (oldest, head, bytes) = {
        let st = log.lock();
        (st.ranges.oldest, st.ranges.head, st.bytes)
    };
    let count = head + 1 - oldest.min(head + 1);
    let target_count = store.max_events - store.max_events / 10;
    let target_bytes = store.max_bytes - store.max_bytes / 10;
    let (mut n, mut b) = (count, bytes);
    let mut batch = sled::Batch::default();
    let mut new_oldest = oldest;
    let mut freed = 0u64;
    let start = key::event_key(&log.id, oldest);
    let end = key::event_key(&log.id, head);
    'chunks: for item in store.events.range(start..=end) {
        let (k, v) = item.map_err(|e| e.to_string())?;
        let Some((_, first)) = key::parse_event_key(&k) else {
            continue;
        };
        let Some(evs) = key::decode_chunk(first, bytes::Bytes::from_owner(v)) else {
            return Err(format!("corrupt chunk {}:{first}", log.id));
        };
        for (i, ev) in evs.iter().enumerate() {
            if (n <= target_count && b <= target_bytes) || ev.seq >= head {
                // This chunk keeps events from `ev` on: store them under their new first key.
                if i > 0 {
                    let mut rest = key::ChunkBuilder::default();
                    for e in &evs[i..] {
                        rest.push(e.epoch, e.kind, e.stream, &e.payload);
                    }
                    batch.remove(k);
                    batch.insert(&key::event_key(&log.id, ev.seq), rest.finish());
                }
                break 'chunks;
            }
            let len = ev.payload.len() as u64;
            n -= 1;
            b -= len;
            freed += len;
            new_oldest = ev.seq + 1;
        }
        batch.remove(k);
    }
    store.events.apply_batch(batch).map_err(|e| e.to_string())?;
    let mut st = log.lock();
    st.ranges.oldest = new_oldest;
    st.bytes -= freed;
    while st.window.front().is_some_and(|e| e.seq < new_oldest) {
        if let Some(old) = st.window.pop_front() {
            st.window_bytes -= old.payload.len();
        }
    }
    drop(st);
    store.total_bytes.fetch_sub(freed, Ordering::Relaxed);
    Ok(())
}

fn remove_session(store: &Store, id: &SessionId) -> std::result::Result<(), sled::Error> {
    let mut batch = sled::Batch::default();
    let mut freed = 0u64;
    for item in store.events.scan_prefix(id.0) {
        let (k, v) = item?;
        freed += key::chunk_info(&v).map_or(0, |(_, b)| b);
        batch.remove(k);
    }
    store.events.apply_batch(batch)?;
    let mut batch = sled::Batch::default();
    for item in store.inflight.scan_prefix(id.0) {
        batch.remove(item?.0);
    }
    store.inflight.apply_batch(batch)?;
    store.sessions.remove(id.0)?;
    store.total_bytes.fetch_sub(freed, Ordering::Relaxed);
    Ok(())
}
