//! [5] The event log: every upstream event is appended here, with a stable id, before any client
//! sees it (I1), and every client stream is a cursor reading it.
//!
//! The log is a directory of append-only **segment files** of checksummed records ([`record`],
//! [`segment`]). One writer ([`writer`], on its own thread) owns every write: appends arrive over a
//! bounded channel; each *turn* writes everything queued as one `pwrite` to the newest segment and,
//! with `durability = "fsync"`, one `fdatasync`; only then is the turn published — heads move,
//! recent events enter a small in-memory window, readers wake. Readers never see an unpublished
//! event, so replay and live delivery are the same read. Older events are read back from the
//! segments with `pread`, through an in-memory index of each session's chunks.
//!
//! Space: per-session retention trims the oldest events; `log.max_total_bytes` bounds the live
//! records of all sessions (ended sessions are evicted first, then the largest live sessions are
//! trimmed); compaction copies the live records of the oldest segment forward and deletes it, so
//! the files on disk stay within a small factor of that bound.
//!
//! On open the directory is scanned ([`image`]), a torn tail is cut, and the sessions are rebuilt.
//! The epoch is sealed after an unclean stop of a run that was not `fsync` (I2). Sessions that were
//! live are handed back to the caller, with their unanswered requests, to be ended (I6) — the log
//! stores; it does not decide what a session's end says.
//!
//! Storage failures are loud: a failed write rejects its turn (its sessions learn it through
//! [`Log::take_failures`]), [`Log::health`] turns degraded or failed, and the writer retries the
//! ends it owes until the storage takes writes again.

pub mod cursor;
pub mod image;
pub mod io;
pub mod record;
pub mod segment;
#[cfg(test)]
mod sim;
mod writer;

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, oneshot, watch};

use crate::config::{Durability, LogConfig};
use crate::domain::{EndReason, Facade};
use crate::error::{Error, Result, StoreError};
use crate::identity::{Identity, Keyring, Tag};
use crate::metrics::Metrics;
use cursor::{EpochRange, LogRanges, SessionId};
use image::Image;
use segment::{DirLock, Segment};

/// Largest event payload the log takes: its record must stay within what a read accepts
/// ([`record::MAX_RECORD`]), with room for the chunk's framing.
pub const MAX_EVENT_BYTES: usize = record::MAX_RECORD - 1024 * 1024;

/// Events kept in memory per session for live readers; older reads go to the segments.
const WINDOW_EVENTS: usize = 128;
/// Payload bytes kept in memory per session window.
const WINDOW_BYTES: usize = 512 * 1024;
/// Payload bytes that may wait in the writer's channel: producers wait beyond it (an event larger
/// than this waits until the channel is empty, then goes alone).
const QUEUE_BYTES: usize = 64 << 20;
/// How long [`Log::open`] waits for another holder of the data directory to let go.
const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// Which client stream an event belongs to (design.md §3).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StreamTag(pub u64);

impl StreamTag {
    /// The single stream of a legacy-face session.
    pub const LEGACY: StreamTag = StreamTag(0);
    /// The standalone `GET` stream of a Streamable HTTP session.
    pub const STANDALONE: StreamTag = StreamTag(1);

    /// The stream of the `n`-th request-carrying POST of a Streamable HTTP session (n from 0).
    pub fn post(n: u64) -> Self {
        StreamTag(n + 2)
    }

    /// A POST stream (ends after its response).
    pub fn is_post(self) -> bool {
        self.0 >= 2
    }
}

/// What a logged event is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    /// A JSON-RPC message, delivered as `event: message`.
    Message = 0,
    /// A Streamable HTTP priming event: delivered with an id and empty data.
    Priming = 1,
    /// A JSON-RPC message that ends its (POST) stream: the response.
    Final = 2,
    /// The session ended: every stream ends here. Not delivered.
    End = 3,
}

impl Kind {
    fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            0 => Kind::Message,
            1 => Kind::Priming,
            2 => Kind::Final,
            3 => Kind::End,
            _ => return None,
        })
    }
}

/// One logged event. Shared by reference count between the window and readers.
#[derive(Clone, Debug)]
pub struct Event {
    /// Seq in the session.
    pub seq: u64,
    /// Epoch it was logged in.
    pub epoch: u32,
    /// Stream it belongs to.
    pub stream: StreamTag,
    /// What it is.
    pub kind: Kind,
    /// Payload bytes (JSON-RPC message; empty for priming; end reason for `End`).
    pub payload: Bytes,
}

/// An event to append.
#[derive(Debug)]
pub struct NewEvent {
    /// Stream it belongs to.
    pub stream: StreamTag,
    /// What it is.
    pub kind: Kind,
    /// Payload bytes.
    pub payload: Bytes,
    /// When the proxy received it (for `mcp_resume_log_append_seconds`).
    pub received: tokio::time::Instant,
    /// The in-flight request (canonical id) this event answers: its in-flight record ends in the
    /// same write.
    pub completes: Option<String>,
}

impl NewEvent {
    /// A new event received now.
    pub fn new(stream: StreamTag, kind: Kind, payload: Bytes) -> Self {
        Self {
            stream,
            kind,
            payload,
            received: tokio::time::Instant::now(),
            completes: None,
        }
    }
}

/// Session state as persisted in meta records.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct SessionMeta {
    /// Face that created the session.
    pub facade: Facade,
    /// `None` while live.
    pub ended: Option<EndReason>,
    /// Unix seconds of creation.
    pub created_unix: u64,
    /// Unix seconds of the end.
    pub ended_unix: Option<u64>,
    /// Epochs with their seq ranges.
    pub epochs: Vec<EpochRange>,
    /// Negotiated protocol version (Streamable face), if known.
    #[serde(default)]
    pub protocol_version: Option<String>,
    /// The keyed identity of the caller that opened it; `None` for a bearer session (opened
    /// without identity: whoever knows its id may use it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identity: Option<Identity>,
}

#[cfg(test)]
thread_local! {
    /// The simulator's clock: persisted timestamps are part of what a seed must reproduce.
    pub(crate) static FIXED_UNIX: std::cell::Cell<Option<u64>> = const { std::cell::Cell::new(None) };
}

/// Seconds since the Unix epoch (persisted timestamps).
pub fn unix_now() -> u64 {
    #[cfg(test)]
    if let Some(t) = FIXED_UNIX.with(|c| c.get()) {
        return t;
    }
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Whether the log takes writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Health {
    /// Writes succeed.
    Ok,
    /// The last write failed for lack of space; the writer retries and the log recovers in
    /// process once a write succeeds.
    Degraded,
    /// A write or sync failed in a way the process cannot recover from (an I/O error, a read-only
    /// file system, a failed `fdatasync`): the process must exit and recover on restart.
    Failed,
}

/// A chunk of a session's events on disk: where it is and what it holds.
#[derive(Clone, Debug)]
pub(crate) struct Chunk {
    first: u64,
    count: u64,
    payload: u64,
    /// Payload bytes of its events before the session's oldest retained seq.
    skipped: u64,
    seg: Arc<Segment>,
    off: u64,
    len: u32,
}

impl Chunk {
    fn end(&self) -> u64 {
        self.first + self.count
    }

    fn loc(&self) -> image::Loc {
        image::Loc {
            seg: self.seg.id,
            off: self.off,
            len: self.len,
        }
    }

    fn entry(&self) -> image::ChunkEntry {
        image::ChunkEntry {
            first: self.first,
            epoch: 0,
            count: self.count,
            payload: self.payload,
            loc: image::Loc {
                seg: self.seg.id,
                off: self.off,
                len: self.len,
            },
        }
    }
}

/// Where a session stands in the writer's eyes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Taking appends.
    Open,
    /// Its end was accepted: no more appends; the end is being written (or retried).
    Ending,
    /// Its end marker is published.
    Ended,
    /// Deleted.
    Removed,
}

struct LogState {
    ranges: LogRanges,
    /// Highest seq handed out by the writer (≥ head; > head while a turn is being written).
    assigned: u64,
    /// Payload bytes retained.
    bytes: u64,
    window: VecDeque<Arc<Event>>,
    window_bytes: usize,
    meta: SessionMeta,
    chunks: VecDeque<Chunk>,
    /// Requests durably in flight (published), by canonical id.
    inflight: HashMap<String, StreamTag>,
    phase: Phase,
    /// An append of this session was lost to a storage failure.
    failed: bool,
}

impl LogState {
    /// Makes a durable event visible: head, byte count, window.
    fn publish(&mut self, ev: &Arc<Event>) {
        self.ranges.head = ev.seq;
        self.bytes += ev.payload.len() as u64;
        self.window_bytes += ev.payload.len();
        self.window.push_back(ev.clone());
        while self.window.len() > WINDOW_EVENTS
            || (self.window_bytes > WINDOW_BYTES && self.window.len() > 1)
        {
            if let Some(old) = self.window.pop_front() {
                self.window_bytes -= old.payload.len();
            }
        }
    }

    /// Drops window entries below the oldest retained seq.
    fn drop_window_before(&mut self, oldest: u64) {
        while self.window.front().is_some_and(|e| e.seq < oldest) {
            if let Some(old) = self.window.pop_front() {
                self.window_bytes -= old.payload.len();
            }
        }
    }

    /// Index of the chunk holding `seq`, if retained.
    fn chunk_index(&self, seq: u64) -> Option<usize> {
        let i = self.chunks.partition_point(|c| c.end() <= seq);
        self.chunks.get(i).filter(|c| c.first <= seq).map(|_| i)
    }
}

/// One session's log: its ranges, its chunks, its in-memory window and the head readers wait on.
pub struct SessionLog {
    /// The session.
    pub id: SessionId,
    /// The keyed tag that stands for the id in log lines above debug level.
    pub tag: Tag,
    /// The identity it is bound to (`None`: a bearer session).
    pub identity: Option<Identity>,
    /// The face that opened it.
    pub facade: Facade,
    state: Mutex<LogState>,
    head_tx: watch::Sender<u64>,
}

impl std::fmt::Debug for SessionLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionLog")
            .field("tag", &self.tag)
            .finish()
    }
}

impl SessionLog {
    fn new(id: SessionId, tag: Tag, ranges: LogRanges, meta: SessionMeta) -> Self {
        let (head_tx, _) = watch::channel(ranges.head);
        let phase = if meta.ended.is_some() {
            Phase::Ended
        } else {
            Phase::Open
        };
        Self {
            id,
            tag,
            identity: meta.identity,
            facade: meta.facade,
            state: Mutex::new(LogState {
                assigned: ranges.head,
                ranges,
                bytes: 0,
                window: VecDeque::new(),
                window_bytes: 0,
                meta,
                chunks: VecDeque::new(),
                inflight: HashMap::new(),
                phase,
                failed: false,
            }),
            head_tx,
        }
    }

    // The lock guards plain data for a few instructions and is never held across an await, so a
    // std mutex is cheaper than an async one here.
    fn lock(&self) -> std::sync::MutexGuard<'_, LogState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The ranges the contiguity check needs (a snapshot).
    pub fn ranges(&self) -> LogRanges {
        self.lock().ranges.clone()
    }

    /// The persisted metadata (a snapshot).
    pub fn meta(&self) -> SessionMeta {
        self.lock().meta.clone()
    }

    /// Payload bytes retained.
    pub fn bytes(&self) -> u64 {
        self.lock().bytes
    }

    /// Durable head seq.
    pub fn head(&self) -> u64 {
        *self.head_tx.borrow()
    }

    /// A receiver that changes whenever the head moves (and when the log fails or is removed).
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.head_tx.subscribe()
    }

    /// Why the session ended (set when its end is accepted; the end marker follows in the log).
    pub fn ended(&self) -> Option<EndReason> {
        self.lock().meta.ended
    }

    /// Unix seconds of the end, once ended.
    pub fn ended_unix(&self) -> Option<u64> {
        self.lock().meta.ended_unix
    }

    /// The session's end marker is published: its history is complete.
    pub fn end_published(&self) -> bool {
        matches!(self.lock().phase, Phase::Ended)
    }

    /// An append of this session was lost to a storage failure, and its end is not published
    /// yet: its history is incomplete until the log takes writes again (or a restart recovers it).
    pub fn failed(&self) -> bool {
        let st = self.lock();
        st.failed && st.phase != Phase::Ended
    }

    /// The log was deleted (retention, eviction): nothing more will be read from it.
    pub fn removed(&self) -> bool {
        self.lock().phase == Phase::Removed
    }

    /// The id of event `seq` as clients see it.
    pub fn event_id(&self, epoch: u32, seq: u64) -> String {
        cursor::Cursor {
            session: self.id,
            epoch,
            seq,
        }
        .to_string()
    }

    /// Wakes every reader (they re-read and look at the state).
    fn wake(&self) {
        let head = self.lock().ranges.head;
        self.head_tx.send_replace(head);
    }

    // --- state changes, by the writer (and recovery) only ---

    /// Drops everything held (the log was deleted); returns its chunks, now dead.
    fn clear_removed(&self) -> VecDeque<Chunk> {
        let mut st = self.lock();
        st.phase = Phase::Removed;
        st.window.clear();
        st.window_bytes = 0;
        st.bytes = 0;
        std::mem::take(&mut st.chunks)
    }

    /// Trims the oldest events while the log is over `max_events` or `max_bytes`, to 90% of them
    /// (so a busy session trims in batches, not on every append). Never trims the head. Chunks
    /// wholly before the new oldest seq are dropped and their places returned (they are dead); the
    /// boundary chunk is kept, the bytes of its trimmed events counted out. `None` when nothing
    /// was trimmed.
    fn trim(&self, max_events: u64, max_bytes: u64) -> Option<Vec<image::Loc>> {
        let mut dead = Vec::new();
        let mut st = self.lock();
        let count = (st.ranges.head + 1).saturating_sub(st.ranges.oldest);
        if st.phase == Phase::Removed || (count <= max_events && st.bytes <= max_bytes) {
            return None;
        }
        let target_n = max_events - max_events / 10;
        let target_b = max_bytes - max_bytes / 10;
        let head = st.ranges.head;
        let mut oldest = st.ranges.oldest;
        let mut n = count;
        let mut b = st.bytes;
        while (n > target_n || b > target_b) && oldest < head {
            let Some(c) = st.chunks.front() else { break };
            let in_n = c.end() - oldest;
            let in_b = c.payload - c.skipped;
            if c.end() <= head && (n - in_n > target_n || b - in_b > target_b) {
                // Still over without this whole chunk: it goes.
                n -= in_n;
                b -= in_b;
                oldest = c.end();
                dead.push(st.chunks.pop_front().expect("front").loc());
                continue;
            }
            // The boundary: event by event, with sizes from the window or the chunk itself.
            let sizes: Vec<u64> = if st.window.front().is_some_and(|w| w.seq <= c.first) {
                st.window
                    .iter()
                    .filter(|e| e.seq >= c.first && e.seq < c.end())
                    .map(|e| e.payload.len() as u64)
                    .collect()
            } else {
                match image::read_chunk_at(&c.seg, &c.entry()) {
                    Ok(evs) => evs.iter().map(|e| e.payload.len() as u64).collect(),
                    Err(e) => {
                        tracing::error!(session = %self.tag, error = %e, "cannot read a chunk to trim it");
                        break;
                    }
                }
            };
            let (first, end) = (c.first, c.end());
            let mut skipped = c.skipped;
            while (n > target_n || b > target_b) && oldest < head && oldest < end {
                let sz = sizes.get((oldest - first) as usize).copied().unwrap_or(0);
                n -= 1;
                b -= sz.min(b);
                skipped += sz;
                oldest += 1;
            }
            if oldest >= end {
                dead.push(st.chunks.pop_front().expect("front").loc());
            } else if let Some(c) = st.chunks.front_mut() {
                c.skipped = skipped;
            }
            break;
        }
        if oldest == st.ranges.oldest {
            return None;
        }
        st.ranges.oldest = oldest;
        st.bytes = b;
        st.drop_window_before(oldest);
        Some(dead)
    }

    /// The next seq and the epoch it is logged in.
    fn assign(&self) -> (u64, u32) {
        let mut st = self.lock();
        st.assigned += 1;
        (st.assigned, st.ranges.current_epoch())
    }

    /// The highest seq handed out.
    fn assigned(&self) -> u64 {
        self.lock().assigned
    }

    /// Takes back the seqs handed out to a write that failed (no holes, I2).
    fn roll_back(&self) {
        let mut st = self.lock();
        st.assigned = st.ranges.head;
    }

    /// Does the log take appends (not ending, not ended, no append lost)?
    fn takes_appends(&self) -> bool {
        let st = self.lock();
        st.phase == Phase::Open && !st.failed
    }

    /// Marks an append of this session as lost; `true` the first time, while the session is open.
    fn mark_failed(&self) -> bool {
        let mut st = self.lock();
        let first = st.phase == Phase::Open && !st.failed;
        st.failed = true;
        first
    }

    /// Starts the end: no more appends; the meta says why and when. `false` if it already began.
    fn begin_end(&self, reason: EndReason) -> bool {
        let mut st = self.lock();
        if st.phase != Phase::Open {
            return false;
        }
        st.phase = Phase::Ending;
        st.meta.ended = Some(reason);
        st.meta.ended_unix = Some(unix_now());
        true
    }

    /// The meta as JSON, for its record.
    fn meta_json(&self) -> Vec<u8> {
        serde_json::to_vec(&self.lock().meta).expect("meta serialises")
    }

    /// A request is durably in flight.
    fn set_inflight(&self, id: String, stream: StreamTag) {
        self.lock().inflight.insert(id, stream);
    }

    /// A request is no longer in flight.
    fn clear_inflight(&self, id: &str) {
        self.lock().inflight.remove(id);
    }

    /// A durable chunk: appended to the index, its events published.
    fn publish_chunk(&self, chunk: Chunk, events: &[Arc<Event>]) {
        let mut st = self.lock();
        st.chunks.push_back(chunk);
        for ev in events {
            st.publish(ev);
            if ev.kind == Kind::End {
                st.phase = Phase::Ended;
            }
        }
    }

    /// Where the chunk starting at `first` is, if retained.
    fn chunk_place(&self, first: u64) -> Option<image::Loc> {
        let st = self.lock();
        let c = &st.chunks[st.chunk_index(first)?];
        (c.first == first).then(|| c.loc())
    }

    /// The chunk starting at `first` was copied from `old` to `off` in `seg`: points it there.
    /// `false` when it is no longer at `old` (trimmed or removed meanwhile).
    fn relocate_chunk(&self, first: u64, old: image::Loc, seg: Arc<Segment>, off: u64) -> bool {
        let mut st = self.lock();
        let Some(i) = st.chunk_index(first) else {
            return false;
        };
        let c = &mut st.chunks[i];
        if c.first != first || c.loc() != old {
            return false;
        }
        c.seg = seg;
        c.off = off;
        true
    }

    /// Events and payload bytes retained, and the number of chunks.
    fn size(&self) -> (u64, u64, usize) {
        let st = self.lock();
        (
            (st.ranges.head + 1).saturating_sub(st.ranges.oldest),
            st.bytes,
            st.chunks.len(),
        )
    }

    /// The oldest retained seq.
    fn oldest(&self) -> u64 {
        self.lock().ranges.oldest
    }

    /// The end seq of the first chunk whose place `hit` matches (a damaged record), if any.
    fn damaged_chunk_end(&self, hit: &dyn Fn(&image::Loc) -> bool) -> Option<u64> {
        let st = self.lock();
        st.chunks.iter().find(|c| hit(&c.loc())).map(Chunk::end)
    }

    /// Drops every chunk that ends at or before `oldest` (a damaged one among them): nothing
    /// before `oldest` is served any more. Returns their places (dead).
    fn drop_before(&self, oldest: u64) -> Vec<image::Loc> {
        let mut st = self.lock();
        let mut dead = Vec::new();
        while st.chunks.front().is_some_and(|c| c.end() <= oldest) {
            let c = st.chunks.pop_front().expect("front");
            st.bytes = st.bytes.saturating_sub(c.payload - c.skipped);
            dead.push(c.loc());
        }
        if oldest > st.ranges.oldest {
            st.ranges.oldest = oldest.min(st.ranges.head + 1);
            st.drop_window_before(oldest);
        }
        dead
    }

    /// The stream of a request durably in flight.
    fn inflight_stream(&self, id: &str) -> Option<StreamTag> {
        self.lock().inflight.get(id).copied()
    }

    /// Recovery: what the log holds of the session.
    fn restore(&self, bytes: u64, chunks: VecDeque<Chunk>, inflight: HashMap<String, StreamTag>) {
        let mut st = self.lock();
        st.bytes = bytes;
        st.chunks = chunks;
        st.inflight = inflight;
    }
}

type Ack = oneshot::Sender<std::result::Result<u64, StoreError>>;
/// The queued bytes an op holds until the writer takes it (see [`QUEUE_BYTES`]).
type Permit = Option<tokio::sync::OwnedSemaphorePermit>;

pub(crate) enum Op {
    /// A new session: its meta record.
    Create { log: Arc<SessionLog>, done: Ack },
    /// Events of one session, in order. `done` hears the seq of the last one.
    Append {
        log: Arc<SessionLog>,
        evs: Vec<NewEvent>,
        done: Option<Ack>,
        _permit: Permit,
    },
    /// A request recorded as in flight before it is forwarded.
    Inflight {
        log: Arc<SessionLog>,
        request_id: String,
        stream: StreamTag,
        done: Ack,
    },
    /// A request that will not be answered upstream after all.
    InflightDone {
        log: Arc<SessionLog>,
        request_id: String,
        done: Ack,
    },
    /// The end of a session: `evs` (the answers it owes), then the end marker, then its ended
    /// meta. Written eventually even across storage failures (retried).
    End {
        log: Arc<SessionLog>,
        reason: EndReason,
        evs: Vec<NewEvent>,
        done: Ack,
        _permit: Permit,
    },
    /// Deletes a session's log.
    Remove { session: SessionId, done: Ack },
    /// Evicts ended sessions until the live records are at most `target` bytes.
    MakeRoom { target: u64, done: Ack },
    /// Waits until everything queued before it is durable.
    Flush { done: Ack },
    /// Marks the log clean (the last op).
    Close { done: Ack },
}

/// The state shared by the handle and the writer.
pub(crate) struct Store {
    /// The data directory's files.
    fs: Arc<dyn io::Dir>,
    durability: Durability,
    max_events: u64,
    max_bytes: u64,
    max_total: u64,
    /// Target size of a segment file.
    seg_size: u64,
    /// Payload bytes one writer turn takes at most (but at least one op).
    turn_bytes: usize,
    /// Bytes of the reserve file a degraded log gives up to write the records it owes.
    reserve_bytes: usize,
    /// Bytes compaction reads per turn at least.
    compact_slice: usize,
    metrics: Metrics,
    logs: Mutex<HashMap<SessionId, Arc<SessionLog>>>,
    /// Bytes of live records, all sessions (what `log.max_total_bytes` bounds).
    retained: AtomicU64,
    /// Bytes of segment files.
    disk: AtomicU64,
    health: watch::Sender<Health>,
    failures: mpsc::UnboundedSender<SessionId>,
    /// The data directory's secret: identities and log tags.
    keys: Keyring,
    /// Seconds the log may stay degraded before it fails for good (`log.store_error_exit_secs`).
    degraded_limit: std::time::Duration,
    /// Bytes of events queued for the writer and not yet taken (what bounds its channel).
    queued: Arc<tokio::sync::Semaphore>,
    /// Unit tests: writes still to fail, and how.
    #[cfg(test)]
    fail_writes: Mutex<VecDeque<std::io::ErrorKind>>,
    _lock: Option<DirLock>,
}

impl Store {
    /// The shared state of a log over `fs` (recovery and the writer come next).
    pub(crate) fn new(
        cfg: &LogConfig,
        metrics: Metrics,
        fs: Arc<dyn io::Dir>,
        keys: Keyring,
        lock: Option<DirLock>,
        failures: mpsc::UnboundedSender<SessionId>,
    ) -> Self {
        let (health, _) = watch::channel(Health::Ok);
        let turn_bytes = (cfg.max_total_bytes / 8).clamp(256 << 10, 8 << 20) as usize;
        metrics.log_max_bytes.set(cfg.max_total_bytes as i64);
        Store {
            fs,
            durability: cfg.durability,
            max_events: cfg.max_events_per_session,
            max_bytes: cfg.max_bytes_per_session,
            max_total: cfg.max_total_bytes,
            seg_size: segment_size(cfg.max_total_bytes),
            turn_bytes,
            reserve_bytes: (cfg.max_total_bytes / 64).clamp(64 << 10, 1 << 20) as usize,
            compact_slice: writer::COMPACT_SLICE,
            metrics,
            logs: Mutex::new(HashMap::new()),
            retained: AtomicU64::new(0),
            disk: AtomicU64::new(0),
            health,
            failures,
            keys,
            degraded_limit: std::time::Duration::from_secs(cfg.store_error_exit_secs),
            queued: Arc::new(tokio::sync::Semaphore::new(QUEUE_BYTES)),
            #[cfg(test)]
            fail_writes: Mutex::new(VecDeque::new()),
            _lock: lock,
        }
    }

    /// What `du` of the data directory stays within (README "Durability and storage"): 1.5 ×
    /// `log.max_total_bytes` plus four segments.
    #[cfg(test)]
    pub(crate) fn disk_bound(&self) -> u64 {
        self.max_total + self.max_total / 2 + 4 * self.seg_size
    }

    /// Above this many bytes of segment files, appends wait for compaction (backpressure), so a
    /// turn's writes on top of it stay within [`Store::disk_bound`].
    fn throttle_bytes(&self) -> u64 {
        self.max_total + self.max_total / 4
    }

    fn lock_logs(&self) -> std::sync::MutexGuard<'_, HashMap<SessionId, Arc<SessionLog>>> {
        // Short map operations only, never held across an await.
        self.logs.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn set_health(&self, h: Health) {
        self.health.send_if_modified(|cur| {
            let changed = *cur != h && *cur != Health::Failed;
            if changed {
                *cur = h;
            }
            changed
        });
    }
}

/// What recovery found.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Recovery {
    /// The previous stop was clean.
    pub clean: bool,
    /// Sessions found in the log.
    pub sessions: usize,
    /// Sessions that were live (their ends are the caller's to write).
    pub live: usize,
    /// Requests those sessions had in flight.
    pub inflight: usize,
    /// Sessions whose epoch was sealed.
    pub sealed: usize,
    /// Sessions sealed before their newest events, which were missing or damaged.
    pub cut: usize,
    /// Events retained.
    pub events: u64,
    /// Bytes cut from a torn tail.
    pub torn_bytes: u64,
    /// Pieces of damage found (logged).
    pub damaged: usize,
}

/// A session that was live when the previous run stopped: its upstream session died with that
/// run, so it must be ended, answering `inflight`.
#[derive(Debug)]
pub struct Interrupted {
    /// Its log.
    pub log: Arc<SessionLog>,
    /// Requests it had in flight, unanswered: (canonical id, stream).
    pub inflight: Vec<(String, StreamTag)>,
}

/// The log handle. Cheap to share behind an `Arc`.
pub struct Log {
    store: Arc<Store>,
    tx: mpsc::Sender<Op>,
    writer: Mutex<Option<writer::Handle>>,
    failures: Mutex<Option<mpsc::UnboundedReceiver<SessionId>>>,
}

impl std::fmt::Debug for Log {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Log").finish_non_exhaustive()
    }
}

/// The log of a new session, not yet written (its create op writes its meta record).
pub(crate) fn new_session_log(
    store: &Store,
    id: SessionId,
    facade: Facade,
    protocol_version: Option<String>,
    identity: Option<Identity>,
) -> Arc<SessionLog> {
    let meta = SessionMeta {
        facade,
        ended: None,
        created_unix: unix_now(),
        ended_unix: None,
        epochs: vec![EpochRange {
            epoch: 1,
            first: 1,
            last: None,
        }],
        protocol_version,
        identity,
    };
    let ranges = LogRanges {
        epochs: meta.epochs.clone(),
        oldest: 1,
        head: 0,
    };
    Arc::new(SessionLog::new(id, store.keys.tag(&id.0), ranges, meta))
}

/// See [`Log::read_after`] (the simulator reads without a handle).
pub(crate) fn read_after(sl: &SessionLog, after: u64, max: usize) -> Result<Vec<Arc<Event>>> {
    let (chunks, oldest): (Vec<Chunk>, u64) = {
        let st = sl.lock();
        let head = st.ranges.head;
        if after >= head || max == 0 {
            return Ok(Vec::new());
        }
        if let Some(front) = st.window.front() {
            if front.seq <= after + 1 {
                let skip = (after + 1 - front.seq) as usize;
                return Ok(st.window.iter().skip(skip).take(max).cloned().collect());
            }
        }
        let want = (after + 1).max(st.ranges.oldest);
        let Some(i) = st.chunk_index(want) else {
            return Ok(Vec::new());
        };
        // Enough chunks to cover `max` events (the chunks share nothing with the writer once
        // cloned: a segment stays readable while a reader holds it).
        let mut n = 0u64;
        let chunks = st
            .chunks
            .iter()
            .skip(i)
            .take_while(|c| {
                let take = n < max as u64;
                n += c.end() - want.max(c.first);
                take
            })
            .cloned()
            .collect();
        (chunks, st.ranges.oldest)
    };
    let head = sl.head();
    let mut out = Vec::with_capacity(max.min(1024));
    for c in chunks {
        let evs = image::read_chunk_at(&c.seg, &c.entry())?;
        for ev in evs {
            // Retention is exact: events of a chunk before the oldest retained seq are not
            // served, though they are still on disk.
            if ev.seq <= after || ev.seq < oldest || ev.seq > head {
                continue;
            }
            if out.len() >= max {
                return Ok(out);
            }
            out.push(Arc::new(ev));
        }
    }
    Ok(out)
}

/// Takes the directory lock, waiting a little for a previous holder that is still exiting (a
/// replacement process may start while the old one lets go).
async fn take_lock(dir: &std::path::Path) -> std::result::Result<DirLock, StoreError> {
    let deadline = tokio::time::Instant::now() + LOCK_WAIT;
    loop {
        if let Some(l) = segment::lock(dir, true)? {
            return Ok(l);
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(StoreError::Locked(dir.display().to_string()));
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// Target segment size for a total bound: small enough that compaction's unit is a small part
/// of the bound, large enough that rotations are rare.
fn segment_size(max_total: u64) -> u64 {
    (max_total / 32).clamp(1 << 20, 64 << 20)
}

impl Log {
    /// Opens (or creates) the log in `cfg.dir` and recovers it: returns the handle, what recovery
    /// found, and the sessions that were live, for the caller to end.
    ///
    /// # Errors
    /// [`Error::Store`] when the directory cannot be locked, read or written.
    pub async fn open(
        cfg: &LogConfig,
        metrics: Metrics,
    ) -> Result<(Arc<Log>, Recovery, Vec<Interrupted>)> {
        let dir = cfg.dir.clone();
        io::OsDir::create_private(&dir).map_err(|e| StoreError::io("create data directory", e))?;
        if segment::has_sled_files(&dir) {
            return Err(StoreError::OldFormat(dir.display().to_string()).into());
        }
        let lock = take_lock(&dir).await?;
        let keys = Keyring::load_or_create(&dir)?;
        let img = Image::scan(&dir)?;
        for d in &img.damage {
            tracing::error!(dir = %dir.display(), damage = %d, "log damage found during recovery");
        }
        let (failures_tx, failures_rx) = mpsc::unbounded_channel();
        let fs: Arc<dyn io::Dir> = Arc::new(io::OsDir::new(&dir));
        let store = Arc::new(Store::new(cfg, metrics, fs, keys, Some(lock), failures_tx));
        store.metrics.store_damage.inc_by(img.damaged);
        let (rec, interrupted, state) = writer::recover(&store, img)?;
        let (tx, rx) = mpsc::channel(4096);
        let handle = writer::spawn(store.clone(), state, rx)?;
        let log = Arc::new(Log {
            store,
            tx,
            writer: Mutex::new(Some(handle)),
            failures: Mutex::new(Some(failures_rx)),
        });
        // The open record (with this run's durability) and the sealed epochs are durable before
        // any event of this run is written: a later recovery knows which run wrote the tail.
        log.flush().await?;
        Ok((log, rec, interrupted))
    }

    /// Waits until `evs` fit in the writer's queue (bounded in bytes, not only in ops).
    async fn reserve(&self, evs: &[NewEvent]) -> Result<Permit> {
        let bytes: usize = evs.iter().map(|e| e.payload.len()).sum();
        if bytes == 0 {
            return Ok(None);
        }
        let n = u32::try_from(bytes.min(QUEUE_BYTES)).expect("QUEUE_BYTES fits in u32");
        self.store
            .queued
            .clone()
            .acquire_many_owned(n)
            .await
            .map(Some)
            .map_err(|_| Error::Store(StoreError::Stopped))
    }

    async fn send(&self, op: Op) -> Result<()> {
        self.tx
            .send(op)
            .await
            .map_err(|_| Error::Store(StoreError::Stopped))
    }

    async fn wait(rx: oneshot::Receiver<std::result::Result<u64, StoreError>>) -> Result<u64> {
        match rx.await {
            Ok(r) => r.map_err(Error::Store),
            Err(_) => Err(Error::Store(StoreError::Stopped)),
        }
    }

    /// The data directory's secret, which keys identities and log tags.
    pub fn keys(&self) -> &Keyring {
        &self.store.keys
    }

    /// Whether the log takes writes; changes are pushed.
    pub fn health(&self) -> watch::Receiver<Health> {
        self.store.health.subscribe()
    }

    /// The sessions whose appends were lost to a storage failure, as they happen (taken once).
    pub fn take_failures(&self) -> Option<mpsc::UnboundedReceiver<SessionId>> {
        self.failures
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
    }

    /// Creates the log of a new session (its meta record durable before it returns).
    ///
    /// # Errors
    /// [`Error::Store`] when the record cannot be written.
    pub async fn create(
        &self,
        id: SessionId,
        facade: Facade,
        protocol_version: Option<String>,
        identity: Option<Identity>,
    ) -> Result<Arc<SessionLog>> {
        let sl = new_session_log(&self.store, id, facade, protocol_version, identity);
        let (done, rx) = oneshot::channel();
        self.send(Op::Create {
            log: sl.clone(),
            done,
        })
        .await?;
        Self::wait(rx).await?;
        Ok(sl)
    }

    /// The log of session `id`, live or ended, if this proxy holds it.
    pub fn get(&self, id: &SessionId) -> Option<Arc<SessionLog>> {
        self.store.lock_logs().get(id).cloned()
    }

    /// Every session log held.
    pub fn all(&self) -> Vec<Arc<SessionLog>> {
        self.store.lock_logs().values().cloned().collect()
    }

    /// Queues an append without waiting for it: events of one session keep their order because one
    /// writer serves one channel. Waits only when the channel is full (back-pressure). A write
    /// that fails reaches the session through [`Log::take_failures`].
    ///
    /// # Errors
    /// [`Error::Store`] when the writer has stopped.
    pub async fn append_nowait(&self, sl: &Arc<SessionLog>, ev: NewEvent) -> Result<()> {
        self.append_many_nowait(sl, vec![ev]).await
    }

    /// Queues consecutive events of one session as one op (see [`Log::append_nowait`]).
    ///
    /// # Errors
    /// [`Error::Store`] when the writer has stopped.
    pub async fn append_many_nowait(&self, sl: &Arc<SessionLog>, evs: Vec<NewEvent>) -> Result<()> {
        let permit = self.reserve(&evs).await?;
        self.send(Op::Append {
            log: sl.clone(),
            evs,
            done: None,
            _permit: permit,
        })
        .await
    }

    /// Appends and waits until the event is durable and published; returns its seq.
    ///
    /// # Errors
    /// [`Error::Store`] when the write failed or the session's log has ended.
    pub async fn append(&self, sl: &Arc<SessionLog>, ev: NewEvent) -> Result<u64> {
        let (done, rx) = oneshot::channel();
        let evs = vec![ev];
        let permit = self.reserve(&evs).await?;
        self.send(Op::Append {
            log: sl.clone(),
            evs,
            done: Some(done),
            _permit: permit,
        })
        .await?;
        Self::wait(rx).await
    }

    /// Records a request as in flight (durably, in either durability mode, before it is
    /// forwarded), so that a restart can still answer it.
    ///
    /// # Errors
    /// [`Error::Store`] when the write failed.
    pub async fn inflight_add(
        &self,
        sl: &Arc<SessionLog>,
        request_id: &str,
        stream: StreamTag,
    ) -> Result<()> {
        let (done, rx) = oneshot::channel();
        self.send(Op::Inflight {
            log: sl.clone(),
            request_id: request_id.to_string(),
            stream,
            done,
        })
        .await?;
        Self::wait(rx).await.map(|_| ())
    }

    /// Forgets an in-flight request that the upstream refused (it will never be answered there).
    ///
    /// # Errors
    /// [`Error::Store`] when the write failed.
    pub async fn inflight_done(&self, sl: &Arc<SessionLog>, request_id: &str) -> Result<()> {
        let (done, rx) = oneshot::channel();
        self.send(Op::InflightDone {
            log: sl.clone(),
            request_id: request_id.to_string(),
            done,
        })
        .await?;
        Self::wait(rx).await.map(|_| ())
    }

    /// Ends a session's log: appends `evs` (the answers its end owes), then the end marker
    /// (payload `{"reason": …}`), and persists the ended state. Idempotent. After it, appends to
    /// the session are refused. If storage fails, the writer keeps the end and retries it until
    /// it is written; the error returned then says only that it is not written *yet*.
    ///
    /// # Errors
    /// [`Error::Store`] when it could not be written now.
    pub async fn end(
        &self,
        sl: &Arc<SessionLog>,
        reason: EndReason,
        evs: Vec<NewEvent>,
    ) -> Result<()> {
        let (done, rx) = oneshot::channel();
        let permit = self.reserve(&evs).await?;
        self.send(Op::End {
            log: sl.clone(),
            reason,
            evs,
            done,
            _permit: permit,
        })
        .await?;
        Self::wait(rx).await.map(|_| ())
    }

    /// Deletes a session's log entirely (retention expired).
    ///
    /// # Errors
    /// [`Error::Store`] when the delete could not be written.
    pub async fn remove(&self, id: &SessionId) -> Result<()> {
        let (done, rx) = oneshot::channel();
        self.send(Op::Remove { session: *id, done }).await?;
        Self::wait(rx).await.map(|_| ())
    }

    /// Evicts ended sessions (oldest end first) until the live records take at most `target`
    /// bytes; returns the bytes they take then.
    ///
    /// # Errors
    /// [`Error::Store`] when the writer has stopped.
    pub async fn make_room(&self, target: u64) -> Result<u64> {
        let (done, rx) = oneshot::channel();
        self.send(Op::MakeRoom { target, done }).await?;
        Self::wait(rx).await
    }

    /// Up to `max` consecutive events after seq `after`, in order: from the in-memory window when
    /// it covers them, else from the segments. The first event returned may be later than
    /// `after + 1` only when the events in between were trimmed — the caller must treat that as a
    /// gap.
    ///
    /// # Errors
    /// [`Error::Store`] when a segment cannot be read or holds something else than expected.
    pub fn read_after(&self, sl: &SessionLog, after: u64, max: usize) -> Result<Vec<Arc<Event>>> {
        read_after(sl, after, max)
    }

    /// The event at `seq`, if retained.
    ///
    /// # Errors
    /// [`Error::Store`] when a segment cannot be read.
    pub fn event_at(&self, sl: &SessionLog, seq: u64) -> Result<Option<Arc<Event>>> {
        if seq == 0 {
            return Ok(None);
        }
        Ok(self
            .read_after(sl, seq - 1, 1)?
            .into_iter()
            .find(|e| e.seq == seq))
    }

    /// The ids (canonical JSON) of the requests of `session` on `stream` that are durably in
    /// flight: registered and not yet answered by a published event. An answer ends its
    /// request's entry in the same write, so after a [`Log::flush`] every request missing here
    /// has its answer published.
    pub fn inflight_on(&self, sl: &SessionLog, stream: StreamTag) -> Vec<String> {
        sl.lock()
            .inflight
            .iter()
            .filter(|(_, s)| **s == stream)
            .map(|(id, _)| id.clone())
            .collect()
    }

    /// Bytes of live records, all sessions (what `log.max_total_bytes` bounds).
    pub fn total_bytes(&self) -> u64 {
        self.store.retained.load(Ordering::Relaxed)
    }

    /// Bytes of the segment files.
    pub fn disk_bytes(&self) -> u64 {
        self.store.disk.load(Ordering::Relaxed)
    }

    /// Waits until everything queued so far is durable.
    ///
    /// # Errors
    /// [`Error::Store`] when the flush failed.
    pub async fn flush(&self) -> Result<()> {
        let (done, rx) = oneshot::channel();
        self.send(Op::Flush { done }).await?;
        Self::wait(rx).await.map(|_| ())
    }

    /// Drains the writer, writes the clean-stop record, syncs, and stops the writer so the next
    /// start keeps the epoch. Call once, after every producer has stopped.
    ///
    /// # Errors
    /// [`Error::Store`] when the final write failed.
    pub async fn close(&self) -> Result<()> {
        let (done, rx) = oneshot::channel();
        self.send(Op::Close { done }).await?;
        let r = Self::wait(rx).await.map(|_| ());
        let writer = self.writer.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(w) = writer {
            // Stop the writer and wait, so the directory lock is released when the last handle
            // goes (a restart in the same process can reopen it).
            w.stop().await;
        }
        r
    }
}

#[cfg(test)]
impl Log {
    /// Makes the next writes fail with `kind` (one per failed write), as a full or failing disk
    /// would; the integration tests do it for real on a small tmpfs.
    pub(crate) fn fail_next_writes(&self, kinds: &[std::io::ErrorKind]) {
        self.store
            .fail_writes
            .lock()
            .unwrap()
            .extend(kinds.iter().copied());
    }

    /// Simulates a crash: the writer stops where it is, without the clean-stop record.
    pub(crate) async fn crash(self: Arc<Self>) {
        let writer = self.writer.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(w) = writer {
            w.stop().await;
        }
    }

    /// Sizes of the segment files, ascending by id.
    pub(crate) fn segment_ids(&self) -> Vec<u64> {
        segment::list(&*self.store.fs).unwrap()
    }
}

#[cfg(test)]
mod tests;
