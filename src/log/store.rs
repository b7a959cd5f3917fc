//! The state the log handle ([`super::Log`]) and its writer share: the store, each session's
//! log, the ops the handle queues for the writer, what recovery found.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use tokio::sync::{mpsc, oneshot, watch};

use super::cursor::{self, EpochRange, LogRanges, SessionId};
use super::event::{unix_now, Event, Kind, NewEvent, SessionMeta, StreamTag};
use super::image;
use super::io;
use super::segment::{DirLock, Segment};
use crate::config::{Durability, LogConfig};
use crate::domain::{EndReason, Facade};
use crate::error::{Result, StoreError};
use crate::identity::{Identity, Keyring, Tag};
use crate::metrics::Metrics;

/// Bytes of old records compaction reads per turn at least, so that a turn's latency stays
/// small; under load it reads twice what the previous turn wrote, so it keeps pace (§10b).
pub(super) const COMPACT_SLICE: usize = 1024 * 1024;
/// Events kept in memory per session for live readers; older reads go to the segments.
pub(super) const WINDOW_EVENTS: usize = 128;
/// Payload bytes kept in memory per session window.
pub(super) const WINDOW_BYTES: usize = 512 * 1024;
/// Payload bytes a client stream's read takes from the segments at most, besides its first
/// chunk (which may be one large event): a stream of large events, or one whose client stopped
/// reading, holds about this much, not a batch of events of any size ([`Log::read_batch`]).
pub(crate) const READ_BYTES: u64 = 1 << 20;
/// Payload bytes that may wait in the writer's channel: producers wait beyond it (an event larger
/// than this waits until the channel is empty, then goes alone).
///
/// Four of the writer's turns ([`TURN_BYTES_MAX`]): enough to keep it busy, and no more, because
/// every byte held here is memory a flood touches. At 64 MiB (and 8 MiB turns) a 16-session
/// burst peaked at 105–190 MiB of anonymous memory, and on a VM that hands free memory back to
/// its host each new page costs a host fault: the proxy spent a quarter of its CPU in page faults
/// and in copying into fresh pages (docs/benchmarks.md round 9).
pub(super) const QUEUE_BYTES: usize = 8 << 20;
/// Payload bytes one writer turn takes at most (less with a small `log.max_total_bytes`): the
/// turn's chunks and its encoding are built in memory, and buffers this size are reused from turn
/// to turn rather than allocated afresh.
pub(super) const TURN_BYTES_MAX: usize = 2 << 20;

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
    pub(super) first: u64,
    pub(super) count: u64,
    pub(super) payload: u64,
    /// Payload bytes of its events before the session's oldest retained seq.
    pub(super) skipped: u64,
    pub(super) seg: Arc<Segment>,
    pub(super) off: u64,
    pub(super) len: u32,
}

impl Chunk {
    pub(super) fn end(&self) -> u64 {
        self.first + self.count
    }

    pub(super) fn loc(&self) -> image::Loc {
        image::Loc {
            seg: self.seg.id,
            off: self.off,
            len: self.len,
        }
    }

    pub(super) fn entry(&self) -> image::ChunkEntry {
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
pub(super) enum Phase {
    /// Taking appends.
    Open,
    /// Its end was accepted: no more appends; the end is being written (or retried).
    Ending,
    /// Its end marker is published.
    Ended,
    /// Deleted.
    Removed,
}

pub(super) struct LogState {
    pub(super) ranges: LogRanges,
    /// Highest seq handed out by the writer (≥ head; > head while a turn is being written).
    pub(super) assigned: u64,
    /// Payload bytes retained.
    pub(super) bytes: u64,
    pub(super) window: VecDeque<Event>,
    pub(super) window_bytes: usize,
    pub(super) meta: SessionMeta,
    pub(super) chunks: VecDeque<Chunk>,
    /// Requests durably in flight (published), by canonical id.
    pub(super) inflight: HashMap<String, StreamTag>,
    pub(super) phase: Phase,
    /// An append of this session was lost to a storage failure.
    pub(super) failed: bool,
}

impl LogState {
    /// Makes a durable event visible: head, byte count, window.
    pub(super) fn publish(&mut self, ev: Event) {
        self.ranges.head = ev.seq;
        self.bytes += ev.payload.len() as u64;
        self.window_bytes += ev.payload.len();
        self.window.push_back(ev);
        while self.window.len() > WINDOW_EVENTS
            || (self.window_bytes > WINDOW_BYTES && self.window.len() > 1)
        {
            if let Some(old) = self.window.pop_front() {
                self.window_bytes -= old.payload.len();
            }
        }
    }

    /// Drops window entries below the oldest retained seq.
    pub(super) fn drop_window_before(&mut self, oldest: u64) {
        while self.window.front().is_some_and(|e| e.seq < oldest) {
            if let Some(old) = self.window.pop_front() {
                self.window_bytes -= old.payload.len();
            }
        }
    }

    /// Index of the chunk holding `seq`, if retained.
    pub(super) fn chunk_index(&self, seq: u64) -> Option<usize> {
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
    pub(super) state: Mutex<LogState>,
    pub(super) head_tx: watch::Sender<u64>,
    /// What its last read of the shared log saw (how the next one pages; unused on the local
    /// log).
    pub(super) shared_read: super::redis::ReadHint,
}

impl std::fmt::Debug for SessionLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionLog")
            .field("tag", &self.tag)
            .finish()
    }
}

impl SessionLog {
    pub(super) fn new(id: SessionId, tag: Tag, ranges: LogRanges, meta: SessionMeta) -> Self {
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
            shared_read: Default::default(),
        }
    }

    // The lock guards plain data for a few instructions and is never held across an await, so a
    // std mutex is cheaper than an async one here.
    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, LogState> {
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
    pub(super) fn wake(&self) {
        let head = self.lock().ranges.head;
        self.head_tx.send_replace(head);
    }

    // --- state changes, by the writer (and recovery) only ---

    /// Drops everything held (the log was deleted); returns its chunks, now dead.
    pub(super) fn clear_removed(&self) -> VecDeque<Chunk> {
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
    pub(super) fn trim(&self, max_events: u64, max_bytes: u64) -> Option<Vec<image::Loc>> {
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

    /// The next `n` seqs (one op's events: one lock for them all, not one each): the first, and
    /// the epoch they are logged in.
    pub(super) fn assign(&self, n: u64) -> (u64, u32) {
        let mut st = self.lock();
        let first = st.assigned + 1;
        st.assigned += n;
        (first, st.ranges.current_epoch())
    }

    /// The highest seq handed out.
    pub(super) fn assigned(&self) -> u64 {
        self.lock().assigned
    }

    /// Takes back the seqs handed out to a write that failed (no holes, I2).
    pub(super) fn roll_back(&self) {
        let mut st = self.lock();
        st.assigned = st.ranges.head;
    }

    /// An append of this session was lost (or fenced): nothing more is appended.
    pub(super) fn append_lost(&self) -> bool {
        self.lock().failed
    }

    /// Does the log take appends (not ending, not ended, no append lost)?
    pub(super) fn takes_appends(&self) -> bool {
        let st = self.lock();
        st.phase == Phase::Open && !st.failed
    }

    /// Marks an append of this session as lost; `true` the first time, while the session is open.
    pub(super) fn mark_failed(&self) -> bool {
        let mut st = self.lock();
        let first = st.phase == Phase::Open && !st.failed;
        st.failed = true;
        first
    }

    /// Starts the end: no more appends; the meta says why and when. `false` if it already began.
    pub(super) fn begin_end(&self, reason: EndReason) -> bool {
        let mut st = self.lock();
        if st.phase != Phase::Open {
            return false;
        }
        st.phase = Phase::Ending;
        st.meta.ended = Some(reason);
        st.meta.ended_unix = Some(unix_now());
        true
    }

    /// Shared log: a durable write's events become visible (window, head, phase); at most
    /// `max_events` are retained (the stream's `MAXLEN`).
    pub(super) fn publish_events(&self, events: &[Event], max_events: u64) {
        let mut st = self.lock();
        for ev in events {
            if ev.kind == Kind::End {
                st.phase = Phase::Ended;
            }
            st.publish(ev.clone());
        }
        st.assigned = st.assigned.max(st.ranges.head);
        let count = (st.ranges.head + 1).saturating_sub(st.ranges.oldest);
        if count > max_events && st.phase != Phase::Ended {
            let oldest = st.ranges.head + 1 - max_events;
            st.ranges.oldest = oldest;
            st.drop_window_before(oldest);
        }
    }

    /// Shared log: a write whose reply was lost had landed, up to `head`: the window no longer
    /// holds everything up to the head, so reads go to the shared log.
    /// The oldest retained seq moves as the write trimmed it on the shared record (at most
    /// `max_events` retained), so this replica refuses the cursors every other one refuses.
    pub(super) fn forget_window(&self, head: u64, max_events: u64) {
        {
            let mut st = self.lock();
            st.window.clear();
            st.window_bytes = 0;
            st.ranges.head = head;
            st.assigned = head;
            if (head + 1).saturating_sub(st.ranges.oldest) > max_events {
                st.ranges.oldest = head + 1 - max_events;
            }
        }
        self.wake();
    }

    /// Shared log: this replica was fenced; the log now stands for what the shared record holds
    /// (read from it from now on).
    pub(super) fn adopt(&self, ranges: &LogRanges, ended: bool) {
        {
            let mut st = self.lock();
            st.window.clear();
            st.window_bytes = 0;
            st.ranges = ranges.clone();
            st.assigned = ranges.head;
            st.meta.epochs = ranges.epochs.clone();
            st.inflight.clear();
            if ended {
                st.phase = Phase::Ended;
                st.meta.ended.get_or_insert(EndReason::UpstreamLost);
                st.meta.ended_unix.get_or_insert_with(unix_now);
            }
        }
        self.wake();
    }

    /// The meta as JSON, for its record.
    pub(super) fn meta_json(&self) -> Vec<u8> {
        serde_json::to_vec(&self.lock().meta).expect("meta serialises")
    }

    /// A request is durably in flight.
    pub(super) fn set_inflight(&self, id: String, stream: StreamTag) {
        self.lock().inflight.insert(id, stream);
    }

    /// A request is no longer in flight.
    pub(super) fn clear_inflight(&self, id: &str) {
        self.lock().inflight.remove(id);
    }

    /// A durable chunk: appended to the index, its events published (moved into the window, not
    /// copied: no reference count taken and given back per event).
    pub(super) fn publish_chunk(&self, chunk: Chunk, events: Vec<Event>) {
        let mut st = self.lock();
        st.chunks.push_back(chunk);
        for ev in events {
            if ev.kind == Kind::End {
                st.phase = Phase::Ended;
            }
            st.publish(ev);
        }
    }

    /// Where the chunk starting at `first` is, if retained.
    pub(super) fn chunk_place(&self, first: u64) -> Option<image::Loc> {
        let st = self.lock();
        let c = &st.chunks[st.chunk_index(first)?];
        (c.first == first).then(|| c.loc())
    }

    /// The chunk starting at `first` was copied from `old` to `off` in `seg`: points it there.
    /// `false` when it is no longer at `old` (trimmed or removed meanwhile).
    pub(super) fn relocate_chunk(
        &self,
        first: u64,
        old: image::Loc,
        seg: Arc<Segment>,
        off: u64,
    ) -> bool {
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
    pub(super) fn size(&self) -> (u64, u64, usize) {
        let st = self.lock();
        (
            (st.ranges.head + 1).saturating_sub(st.ranges.oldest),
            st.bytes,
            st.chunks.len(),
        )
    }

    /// The oldest retained seq.
    pub(super) fn oldest(&self) -> u64 {
        self.lock().ranges.oldest
    }

    /// The end seq of the first chunk whose place `hit` matches (a damaged record), if any.
    pub(super) fn damaged_chunk_end(&self, hit: &dyn Fn(&image::Loc) -> bool) -> Option<u64> {
        let st = self.lock();
        st.chunks.iter().find(|c| hit(&c.loc())).map(Chunk::end)
    }

    /// Drops every chunk that ends at or before `oldest` (a damaged one among them): nothing
    /// before `oldest` is served any more. Returns their places (dead).
    pub(super) fn drop_before(&self, oldest: u64) -> Vec<image::Loc> {
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
    pub(super) fn inflight_stream(&self, id: &str) -> Option<StreamTag> {
        self.lock().inflight.get(id).copied()
    }

    /// Recovery: what the log holds of the session.
    pub(super) fn restore(
        &self,
        bytes: u64,
        chunks: VecDeque<Chunk>,
        inflight: HashMap<String, StreamTag>,
    ) {
        let mut st = self.lock();
        st.bytes = bytes;
        st.chunks = chunks;
        st.inflight = inflight;
    }
}

pub(super) type Ack = oneshot::Sender<std::result::Result<u64, StoreError>>;
/// The queued bytes an op holds until the writer takes it (see [`QUEUE_BYTES`]).
pub(super) type Permit = Option<tokio::sync::OwnedSemaphorePermit>;

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

impl Op {
    /// The log of the session the op writes to, if any.
    pub(super) fn log(&self) -> Option<&Arc<SessionLog>> {
        match self {
            Op::Create { log, .. }
            | Op::Append { log, .. }
            | Op::Inflight { log, .. }
            | Op::InflightDone { log, .. }
            | Op::End { log, .. } => Some(log),
            Op::Remove { .. } | Op::MakeRoom { .. } | Op::Flush { .. } | Op::Close { .. } => None,
        }
    }

    /// Its acknowledgement (an append queued without waiting has none).
    pub(super) fn into_ack(self) -> Option<Ack> {
        match self {
            Op::Create { done, .. }
            | Op::Inflight { done, .. }
            | Op::InflightDone { done, .. }
            | Op::End { done, .. }
            | Op::Remove { done, .. }
            | Op::MakeRoom { done, .. }
            | Op::Flush { done }
            | Op::Close { done } => Some(done),
            Op::Append { done, .. } => done,
        }
    }
}

/// The state shared by the handle and the writer.
pub(crate) struct Store {
    /// The data directory's files.
    pub(super) fs: Arc<dyn io::Dir>,
    pub(super) durability: Durability,
    pub(super) max_events: u64,
    pub(super) max_bytes: u64,
    pub(super) max_total: u64,
    /// Target size of a segment file.
    pub(super) seg_size: u64,
    /// Payload bytes one writer turn takes at most (but at least one op).
    pub(super) turn_bytes: usize,
    /// With `relaxed`, unsynced bytes after which a turn syncs ([`super::pagecache::SYNC_EVERY`];
    /// the simulator scales it down to its small segments).
    pub(super) sync_every: u64,
    /// Bytes of the reserve file a degraded log gives up to write the records it owes.
    pub(super) reserve_bytes: usize,
    /// Bytes compaction reads per turn at least.
    pub(super) compact_slice: usize,
    pub(super) metrics: Metrics,
    pub(super) logs: Mutex<HashMap<SessionId, Arc<SessionLog>>>,
    /// Bytes of live records, all sessions (what `log.max_total_bytes` bounds).
    pub(super) retained: AtomicU64,
    /// Bytes of segment files.
    pub(super) disk: AtomicU64,
    pub(super) health: watch::Sender<Health>,
    pub(super) failures: mpsc::UnboundedSender<SessionId>,
    /// The data directory's secret: identities and log tags.
    pub(super) keys: Keyring,
    /// Seconds the log may stay degraded before it fails for good (`log.store_error_exit_secs`).
    pub(super) degraded_limit: std::time::Duration,
    /// Bytes of events queued for the writer and not yet taken (what bounds its channel).
    pub(super) queued: Arc<tokio::sync::Semaphore>,
    /// Emptied event batches handed back by the writer for the upstream pumps to fill again: a
    /// batch is allocated by a pump's thread and freed by the writer's, which defeats the
    /// allocator's per-thread caches on every upstream read.
    pub(super) batches: Mutex<Vec<Vec<NewEvent>>>,
    /// Unit tests: writes still to fail, and how.
    #[cfg(test)]
    pub(super) fail_writes: Mutex<VecDeque<std::io::ErrorKind>>,
    pub(super) _lock: Option<DirLock>,
}

/// Emptied batches kept at most (each room for [`BATCH_MIN`] to [`BATCH_CAP`] events, at most
/// about 22 KiB).
const BATCHES: usize = 64;
const BATCH_MIN: usize = 16;
const BATCH_CAP: usize = 256;

impl Store {
    /// An empty batch for the next upstream read's events (one handed back, or a new one).
    pub(super) fn batch(&self) -> Vec<NewEvent> {
        let kept = self.batches.lock().unwrap_or_else(|e| e.into_inner()).pop();
        kept.unwrap_or_else(|| Vec::with_capacity(BATCH_MIN))
    }

    /// Keeps `evs` (emptied) for [`Store::batch`]; not a one-event append's (the pumps would
    /// only grow it again) nor a flood's largest.
    pub(super) fn recycle(&self, mut evs: Vec<NewEvent>) {
        evs.clear();
        if !(BATCH_MIN..=BATCH_CAP).contains(&evs.capacity()) {
            return;
        }
        let mut kept = self.batches.lock().unwrap_or_else(|e| e.into_inner());
        if kept.len() < BATCHES {
            kept.push(evs);
        }
    }

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
        let turn_bytes = (cfg.max_total_bytes / 8).clamp(256 << 10, TURN_BYTES_MAX as u64) as usize;
        metrics.log_max_bytes.set(cfg.max_total_bytes as i64);
        Store {
            fs,
            durability: cfg.durability,
            max_events: cfg.max_events_per_session,
            max_bytes: cfg.max_bytes_per_session,
            max_total: cfg.max_total_bytes,
            seg_size: segment_size(cfg.max_total_bytes),
            turn_bytes,
            sync_every: super::pagecache::SYNC_EVERY,
            reserve_bytes: (cfg.max_total_bytes / 64).clamp(64 << 10, 1 << 20) as usize,
            compact_slice: COMPACT_SLICE,
            metrics,
            logs: Mutex::new(HashMap::new()),
            retained: AtomicU64::new(0),
            disk: AtomicU64::new(0),
            health,
            failures,
            keys,
            degraded_limit: std::time::Duration::from_secs(cfg.store_error_exit_secs),
            queued: Arc::new(tokio::sync::Semaphore::new(QUEUE_BYTES)),
            batches: Mutex::new(Vec::new()),
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
    pub(super) fn throttle_bytes(&self) -> u64 {
        self.max_total + self.max_total / 4
    }

    pub(super) fn lock_logs(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<SessionId, Arc<SessionLog>>> {
        // Short map operations only, never held across an await.
        self.logs.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn set_health(&self, h: Health) {
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

/// The events after `after` when the in-memory window holds them (or there are none to read):
/// `None` when they must be read from storage.
pub(crate) fn window_read(sl: &SessionLog, after: u64, max: usize) -> Option<Vec<Event>> {
    let st = sl.lock();
    if after >= st.ranges.head || max == 0 {
        return Some(Vec::new());
    }
    let front = st.window.front()?;
    if front.seq > after + 1 {
        return None;
    }
    let skip = (after + 1 - front.seq) as usize;
    Some(st.window.iter().skip(skip).take(max).cloned().collect())
}

/// See [`Log::read_after`] (the simulator reads without a handle).
pub(crate) fn read_after(sl: &SessionLog, after: u64, max: usize) -> Result<Vec<Event>> {
    read_after_within(sl, after, max, u64::MAX)
}

/// [`read_after`], reading no more chunks from the segments once `max_bytes` of payload are
/// read (at least one chunk, which may be one large event); see [`Log::read_batch`].
pub(crate) fn read_after_within(
    sl: &SessionLog,
    after: u64,
    max: usize,
    max_bytes: u64,
) -> Result<Vec<Event>> {
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
        // Enough chunks to cover `max` events, and no more once `max_bytes` of payload are
        // taken (the chunks share nothing with the writer once cloned: a segment stays readable
        // while a reader holds it).
        let (mut n, mut bytes) = (0u64, 0u64);
        let chunks = st
            .chunks
            .iter()
            .skip(i)
            .take_while(|c| {
                let take = n < max as u64 && (n == 0 || bytes < max_bytes);
                n += c.end() - want.max(c.first);
                bytes += c.payload;
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
            out.push(ev);
        }
    }
    Ok(out)
}

/// Target segment size for a total bound: small enough that compaction's unit is a small part
/// of the bound, large enough that rotations are rare.
pub(super) fn segment_size(max_total: u64) -> u64 {
    (max_total / 32).clamp(1 << 20, 64 << 20)
}
