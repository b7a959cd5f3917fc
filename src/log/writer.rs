//! The single writer (on its own thread, see [`spawn`]): group commit, retention, compaction, and
//! what happens when storage fails.
//!
//! Each *turn* takes everything queued (up to [`MAX_BATCH`] ops), assigns seqs, packs each
//! session's events of the turn into chunk records, writes the whole turn with one `pwrite` at the
//! end of the newest segment, and — with `durability = "fsync"`, or when the turn holds an
//! in-flight record, a flush request or the end of a compaction — one `fdatasync`. Only then is it
//! published: heads move, windows grow, acks fire, readers wake. Throughput scales with the batch
//! size, not with the sync's latency.
//!
//! Layout of a turn's write: records copied forward by compaction, then single records (metas,
//! in-flight records, trims, removes), then the chunks, then the metas of the sessions that ended
//! in the turn. An answer travels in the chunk that also ends its request's in-flight record, and
//! anything that ends a record's life is written after every copy of it, so replaying the log in
//! order (recovery) always ends in the state the writer had.
//!
//! A write that fails is cut off again (`ftruncate`), its seqs are rolled back (no holes, I2), and
//! every op in it is answered with the error. Sessions whose events were lost are reported through
//! the failures channel, to be ended. Out of space, the log is *degraded*: ends are retried every
//! second until one turn succeeds and the log is healthy again. Anything else (an I/O error, a
//! read-only file system, a failed `fdatasync`, whose effect on the page cache is unknown) leaves
//! it *failed*: no more writes; the process is expected to exit and recover on restart.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::{mpsc, oneshot};

use super::event::{unix_now, Event, Kind, StreamTag};
use super::image::{resync_from_start as resync, Image, Loc};
use super::pagecache::PageTrim;
use super::record::{self, ChunkBuilder, Type};
use super::segment::{self, Segment};
use super::store::{Ack, Chunk, Health, Interrupted, Op, Recovery, SessionLog, Store};
use crate::config::Durability;
use crate::domain::EndReason;
use crate::error::StoreError;
use crate::log::cursor::{EpochRange, LogRanges, SessionId};

/// Most ops taken in one turn.
pub(crate) const MAX_BATCH: usize = 1024;
/// Most events in one chunk. Bounds what a read of one event decodes.
const CHUNK_EVENTS: u32 = 256;
/// A chunk is closed once its encoding reaches this size (one large event may exceed it).
const CHUNK_BYTES: usize = 64 * 1024;
/// How often a degraded log retries the ends it owes.
const RETRY_EVERY: Duration = Duration::from_secs(1);
/// Creates `name` holding `bytes` zeros, written (not sparse), so the space is really taken.
fn fill(fs: &dyn super::io::Dir, name: &str, bytes: usize) -> std::io::Result<()> {
    let f = fs.create(name)?;
    let block = vec![0u8; 64 * 1024];
    let mut off = 0usize;
    while off < bytes {
        let n = (bytes - off).min(block.len());
        f.write_all_at(&block[..n], off as u64)?;
        off += n;
    }
    Ok(())
}

/// The reserve file (see [`Writer::hold_reserve`]); not a segment name, so recovery ignores it.
const RESERVE: &str = ".reserve";

// === state ===

/// One segment file and how many of its bytes are live records.
struct SegInfo {
    seg: Arc<Segment>,
    len: u64,
    live: u64,
}

/// The writer's bookkeeping of one session's single records (its chunks are in its log).
#[derive(Default)]
struct WSess {
    meta: Option<Loc>,
    trim: Option<Loc>,
    inflight: HashMap<String, Loc>,
}

/// Records the writer owes, written at the start of its next turn (again after a failed one).
#[derive(Clone)]
enum Internal {
    Open,
    Meta(Arc<SessionLog>),
    Trim(Arc<SessionLog>),
    Remove(SessionId),
    /// An in-flight record whose only copy was damaged.
    Inflight(Arc<SessionLog>, String, StreamTag),
}

/// What recovery hands to the writer.
pub(crate) struct State {
    segs: BTreeMap<u64, SegInfo>,
    active: u64,
    ws: HashMap<SessionId, WSess>,
    open_loc: Option<Loc>,
    internal: Vec<Internal>,
}

/// An end still to be written (kept across failed turns).
#[derive(Clone)]
struct PendingEnd {
    log: Arc<SessionLog>,
    evs: Vec<(StreamTag, Kind, Bytes, Option<String>)>,
}

// === recovery ===

/// Rebuilds the sessions of `img` into `store`, cuts a torn tail, decides the seals, and creates
/// this run's first segment.
///
/// # Errors
/// A segment could not be opened, cut or created.
pub(crate) fn recover(
    store: &Arc<Store>,
    mut img: Image,
) -> Result<(Recovery, Vec<Interrupted>, State), StoreError> {
    let dir = store.fs.clone();
    let mut rec = Recovery {
        clean: img.clean,
        damaged: img.damaged as usize,
        ..Default::default()
    };
    if let Some(at) = img.torn_at {
        let last = img
            .segments
            .last_mut()
            .expect("a torn tail is in a segment");
        if at < record::SEGMENT_HEADER as u64 {
            // Its creation was cut short: nothing in it was ever acknowledged.
            segment::remove(&*dir, last.id)?;
            rec.torn_bytes = last.file_len;
            img.segments.pop();
        } else {
            let seg = Segment::open(&*dir, last.id, true)?;
            seg.truncate(at)?;
            rec.torn_bytes = last.file_len - at;
            last.file_len = at;
        }
        tracing::warn!(dir = %dir.path().display(), bytes = rec.torn_bytes, "log ended in a torn write (an unclean stop); cut it off");
    }
    if let Some(last) = img.segments.last() {
        // What survived in the page cache (a process crash, not a power loss) is made durable
        // before this run serves it or starts another segment: every segment but the newest is
        // synced whole. Written again first: after a failed `fdatasync` (the previous run's
        // exit 74) the kernel may hold those pages clean although they never reached the disk,
        // so a sync alone would not write them, and a power loss later would take events this
        // run served (fsyncgate). Only the part past the last mark's synced offset is unproven.
        let seg = Segment::open(&*dir, last.id, true)?;
        let from = last
            .synced
            .clamp(record::SEGMENT_HEADER as u64, last.file_len);
        if last.file_len > from {
            let mut tail = vec![0u8; (last.file_len - from) as usize];
            seg.read_at(&mut tail, from)?;
            seg.write_at(&tail, from)?;
        }
        seg.sync()?;
    }
    let mut segs = BTreeMap::new();
    for s in &img.segments {
        segs.insert(
            s.id,
            SegInfo {
                seg: Arc::new(Segment::open(&*dir, s.id, false)?),
                len: s.file_len,
                live: 0,
            },
        );
    }
    let birth = |segs: &mut BTreeMap<u64, SegInfo>, l: Loc| {
        if let Some(s) = segs.get_mut(&l.seg) {
            s.live += u64::from(l.len);
        }
    };
    // After any unclean stop, in either durability mode, the tail cannot be proven to be what
    // clients saw (a disk may drop what it acknowledged; a relaxed run never synced it), and
    // damage may have taken any session's newest events: seal the live sessions' epochs at
    // what survived, so no id that may have been shown is ever given to another event (§10b).
    let seal = !img.clean || img.damaged > 0;
    let mut ws = HashMap::new();
    let mut internal = vec![Internal::Open];
    let mut interrupted = Vec::new();
    let sessions = std::mem::take(&mut img.sessions);
    for (id, mut s) in sessions {
        let Some((mut meta, meta_loc)) = s.meta.clone() else {
            continue;
        };
        if meta.epochs.is_empty() {
            meta.epochs.push(EpochRange {
                epoch: 1,
                first: 1,
                last: None,
            });
        }
        let trim = s.trim.map_or(0, |(t, _)| t);
        // The highest seq anything on disk knows was reached (no reuse, I2).
        let mut known = trim.saturating_sub(1);
        for c in s.chunks.values() {
            known = known.max(c.first + c.count - 1);
        }
        for e in &meta.epochs {
            known = known
                .max(e.last.unwrap_or(0))
                .max(e.first.saturating_sub(1));
        }
        let max_epoch = s
            .chunks
            .values()
            .map(|c| c.epoch)
            .chain(meta.epochs.iter().map(|e| e.epoch))
            .max()
            .unwrap_or(1);
        let in_epochs = |c: &super::image::ChunkEntry| {
            meta.epochs.iter().any(|e| {
                e.epoch == c.epoch
                    && c.first >= e.first
                    && e.last.is_none_or(|l| c.first + c.count - 1 <= l)
            })
        };
        // What is served: the retained run (from the trim point up to the first chunk missing:
        // damage, a dropped write), less any chunk from the first one that is not in the epochs
        // the metadata names (an older copy of it).
        let mut r = s.retained();
        let mut cut_at = None;
        if let Some(i) = r.chunks.iter().position(|c| !in_epochs(c)) {
            cut_at = Some(r.chunks[i].first);
            r.chunks.truncate(i);
        }
        let run_end = r.chunks.last().map(|c| c.first + c.count);
        if cut_at.is_none() {
            if let Some(end) = run_end.filter(|e| *e <= known) {
                // The newest events are gone.
                cut_at = Some(end);
            }
        }
        let head = match cut_at {
            Some(at) => at.saturating_sub(1),
            None => known,
        };
        let cut = cut_at.is_some();
        if cut {
            // Sealed at the last intact event: an id past it, in any epoch it had, is refused
            // (`cursor_ahead` / `unknown_epoch`); what follows goes into an epoch of its own.
            rec.cut += 1;
            tracing::error!(session = %store.keys.tag(&id.0), last_intact = head, known, "a session's events are not all there (damaged or lost records): sealed at the last intact event");
            meta.epochs.retain(|e| e.first <= head);
            if let Some(last) = meta.epochs.last_mut() {
                last.last = Some(last.last.map_or(head, |l| l.min(head)));
            }
        }
        let oldest = r.chunks.first().map_or(head + 1, |c| c.first.max(trim));
        if cut {
            // Answers in chunks past the cut are not served: their requests are owed again
            // (answered -32091 by the caller), so no client await is left open.
            let past: Vec<u64> = s.answered.range(head + 1..).map(|(f, _)| *f).collect();
            for f in past {
                for (req, e) in s.answered.remove(&f).unwrap_or_default() {
                    s.inflight.entry(req).or_insert(e);
                }
            }
        }
        let mut chunks = VecDeque::with_capacity(r.chunks.len());
        let mut bytes = 0;
        for c in &r.chunks {
            let seg = segs
                .get(&c.loc.seg)
                .expect("chunk in a scanned segment")
                .seg
                .clone();
            birth(&mut segs, c.loc);
            bytes += c.payload;
            chunks.push_back(Chunk {
                first: c.first,
                count: c.count,
                payload: c.payload,
                skipped: 0,
                seg,
                off: c.loc.off,
                len: c.loc.len,
            });
        }
        // Exact bytes of a chunk only partly retained.
        if let Some(f) = chunks.front_mut() {
            if oldest > f.first {
                let sizes = read_sizes(f)?;
                f.skipped = sizes[..(oldest - f.first) as usize].iter().sum();
                bytes -= f.skipped;
            }
        }
        let mut rewrite_meta = false;
        if meta.ended.is_none() {
            // Ended in the log, but the meta saying so was lost with a torn write?
            if let Some(last) = chunks.back() {
                let evs = super::image::read_chunk_at(&last.seg, &last.entry())?;
                if let Some(end) = evs.last().filter(|e| e.kind == Kind::End) {
                    meta.ended = Some(end_reason(&end.payload));
                    meta.ended_unix = Some(unix_now());
                    rewrite_meta = true;
                }
            }
        }
        let live = meta.ended.is_none();
        if (live && seal) || cut {
            if let Some(last) = meta.epochs.last_mut() {
                if last.last.is_none() {
                    last.last = Some(head.max(last.first.saturating_sub(1)));
                }
            }
            // An ended session takes no more events: its new epoch stays empty.
            meta.epochs.push(EpochRange {
                epoch: max_epoch + 1,
                first: head + 1,
                last: (!live).then_some(head),
            });
            rec.sealed += 1;
            rewrite_meta = true;
        }
        let ranges = LogRanges {
            epochs: meta.epochs.clone(),
            oldest,
            head,
        };
        let sl = Arc::new(SessionLog::new(id, store.keys.tag(&id.0), ranges, meta));
        let mut w = WSess {
            meta: Some(meta_loc),
            trim: s.trim.map(|(_, l)| l),
            inflight: HashMap::new(),
        };
        birth(&mut segs, meta_loc);
        if let Some(l) = w.trim {
            birth(&mut segs, l);
        }
        let mut owed = Vec::new();
        for (req, e) in &s.inflight {
            w.inflight.insert(req.clone(), e.loc);
            birth(&mut segs, e.loc);
            owed.push((req.clone(), e.stream));
        }
        sl.restore(bytes, chunks, owed.iter().cloned().collect());
        if rewrite_meta {
            internal.push(Internal::Meta(sl.clone()));
        }

        rec.sessions += 1;
        rec.events += (head + 1).saturating_sub(oldest);
        if live {
            rec.live += 1;
            rec.inflight += owed.len();
            owed.sort();
            interrupted.push(Interrupted {
                log: sl.clone(),
                inflight: owed,
            });
        }
        ws.insert(id, w);
        store.lock_logs().insert(id, sl);
    }
    if let Some(l) = img.open_loc {
        birth(&mut segs, l);
    }
    // This run writes to a segment of its own.
    let active = segs.keys().next_back().map_or(1, |id| id + 1);
    let seg = Segment::create(&*dir, active)?;
    segs.insert(
        active,
        SegInfo {
            seg: Arc::new(seg),
            len: record::SEGMENT_HEADER as u64,
            live: 0,
        },
    );
    store
        .retained
        .store(segs.values().map(|s| s.live).sum(), Ordering::Relaxed);
    store
        .disk
        .store(segs.values().map(|s| s.len).sum(), Ordering::Relaxed);
    Ok((
        rec,
        interrupted,
        State {
            segs,
            active,
            ws,
            open_loc: img.open_loc,
            internal,
        },
    ))
}

/// The reason an end marker's payload names.
fn end_reason(payload: &[u8]) -> EndReason {
    #[derive(serde::Deserialize)]
    struct Marker {
        reason: EndReason,
    }
    serde_json::from_slice::<Marker>(payload)
        .map(|m| m.reason)
        .unwrap_or(EndReason::UpstreamLost)
}

/// Payload sizes of the events of a chunk, read from its segment.
fn read_sizes(c: &Chunk) -> Result<Vec<u64>, StoreError> {
    let evs = super::image::read_chunk_at(&c.seg, &c.entry())?;
    Ok(evs.iter().map(|e| e.payload.len() as u64).collect())
}

// === the thread ===

/// The writer's thread. The writer runs on a thread of its own (with a single-threaded runtime)
/// rather than as a task of the proxy's runtime: its file I/O blocks, and on a runtime worker it
/// would stall the client streams and upstream readers queued behind it.
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
///
/// # Errors
/// The thread or its runtime could not be created.
pub(crate) fn spawn(
    store: Arc<Store>,
    state: State,
    rx: mpsc::Receiver<Op>,
) -> Result<Handle, StoreError> {
    let (stop, stopped) = oneshot::channel();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| StoreError::io("start the log writer's runtime", e))?;
    let mut w = Writer::new(store, state);
    let thread = std::thread::Builder::new()
        .name("log-writer".into())
        .spawn(move || rt.block_on(w.run(rx, stopped)))
        .map_err(|e| StoreError::io("start the log writer's thread", e))?;
    Ok(Handle { stop, thread })
}

pub(crate) struct Writer {
    store: Arc<Store>,
    st: State,
    active: Arc<Segment>,
    active_len: u64,
    /// Bytes of the active segment known to be on stable storage (what the next mark says).
    synced_len: u64,
    /// Bytes the last turn wrote.
    last_written: usize,
    /// Of those, the bytes that were not compaction's copies (what compaction must at least keep
    /// pace with; counting the copies too let each turn's copies double the next turn's).
    last_new: usize,
    /// Since when the log is degraded (out of space).
    degraded_since: Option<tokio::time::Instant>,
    /// Degraded, and the last turn changed nothing (no op taken, no byte kept, no segment
    /// gone): the run loop then waits for an op or the space probe instead of turning again at
    /// once, which spun a core for up to `log.store_error_exit_secs` on held appends, a
    /// compaction under way or a record owed that cannot be written.
    stalled: bool,
    /// Written since the last sync.
    dirty: bool,
    /// Compaction in progress: segment and offset of the next record to look at.
    compaction: Option<(u64, u64)>,
    pending_ends: Vec<PendingEnd>,
    closed: bool,
    last_retry: tokio::time::Instant,
    /// Bytes of free space that count as "space again" after running out (0 while not degraded).
    probe: usize,
    /// Segments where records died whose cause (a remove, a trim) may not be written yet: a
    /// degraded log must not delete them before it is, or a crash would bring part of a removed
    /// session back (its later records in other segments). Cleared after a turn that left no
    /// record owed.
    dead_unsure: BTreeSet<u64>,
    /// The reserve file is in place (see [`Writer::hold_reserve`]).
    reserve_held: bool,
    /// This turn writes only the records owed (the reserve was just given up for them).
    owed_only: bool,
    /// Buffers kept from turn to turn, so that a busy writer neither allocates nor faults in
    /// fresh pages for every turn: the turn's bytes, and chunk values (see [`Spare`]).
    out: Vec<u8>,
    spare: Spare,
    /// What of the log the page cache still holds (see [`PageTrim`]).
    trim: PageTrim,
}

/// Chunk value buffers handed back after a turn, for the next turn's chunks: at most
/// [`SPARE_BUFS`] of them, each at most [`SPARE_CAP`] bytes (about 2.5 MiB in all).
#[derive(Default)]
struct Spare(Vec<Vec<u8>>);

const SPARE_BUFS: usize = 32;
const SPARE_CAP: usize = CHUNK_BYTES + 16 * 1024;
/// A turn buffer above this is not kept for the next turn (a flood's turns are larger; keeping
/// one would hold its size for good).
const OUT_CAP: usize = 4 << 20;

impl Spare {
    fn take(&mut self) -> ChunkBuilder {
        self.0
            .pop()
            .map_or_else(ChunkBuilder::default, ChunkBuilder::with_buf)
    }

    fn give(&mut self, buf: Vec<u8>) {
        if self.0.len() < SPARE_BUFS && buf.capacity() <= SPARE_CAP {
            self.0.push(buf);
        }
    }
}

/// Why a turn was not written.
enum WriteError {
    /// The `pwrite` failed.
    Write(StoreError),
    /// The `fdatasync` failed: what it covered is unknown, even out of space (fsyncgate).
    Sync(StoreError),
}

/// What a record written in a turn does once the turn is durable.
enum Effect {
    /// A live record copied forward by compaction.
    Moved {
        key: MovedKey,
        old: Loc,
    },
    Meta(Arc<SessionLog>),
    Inflight(Arc<SessionLog>, String, StreamTag),
    InflightDone(Arc<SessionLog>, String),
    Trim(Arc<SessionLog>),
    Remove(SessionId),
    Open,
    Clean,
    Chunk(Box<ChunkOut>),
}

/// What identifies a record moved by compaction.
enum MovedKey {
    Chunk(SessionId, u64),
    Session(SessionId),
    Inflight(SessionId, String),
    Open,
}

/// A chunk written in a turn.
struct ChunkOut {
    log: Arc<SessionLog>,
    first: u64,
    count: u64,
    payload: u64,
    events: Vec<Event>,
    received: Vec<tokio::time::Instant>,
    completes: Vec<String>,
}

/// A record (or a copied one) and its effect.
struct Item {
    bytes: Vec<u8>,
    effect: Effect,
}

/// The chunks of one session being built in a turn.
struct Building {
    log: Arc<SessionLog>,
    done: Vec<(ChunkBuilder, ChunkOut)>,
    cur: Option<(ChunkBuilder, ChunkOut)>,
    /// The turn carries appends (not only an end) for it.
    appended: bool,
}

/// One turn being assembled.
#[derive(Default)]
struct Turn {
    copies: Vec<Item>,
    inline: Vec<Item>,
    building: Vec<Building>,
    index: HashMap<SessionId, usize>,
    /// The session `building` was last asked for, and its index there.
    last: Option<(SessionId, usize)>,
    /// Chunk buffers to build in (the writer's, lent for the turn).
    spare: Spare,
    post: Vec<Item>,
    /// Remove records: last in the turn, after every record of their sessions (an end and a
    /// remove in one turn must not resurrect the session).
    removes: Vec<Item>,
    /// Records owed by the writer that this turn carries (owed again if it fails).
    owed: Vec<Internal>,
    sync: bool,
    acks: Vec<Ack>,
    append_acks: Vec<(Ack, u64)>,
    ends: Vec<(PendingEnd, Option<Ack>)>,
    make_room: Vec<(u64, Ack)>,
    /// Segments to delete once this turn is durable.
    delete: Vec<u64>,
    /// Compaction cursor before this turn (restored if it fails).
    compaction_before: Option<(u64, u64)>,
}

impl Turn {
    fn is_empty(&self) -> bool {
        self.copies.is_empty()
            && self.inline.is_empty()
            && self.building.is_empty()
            && self.post.is_empty()
            && self.removes.is_empty()
    }

    fn building(&mut self, log: &Arc<SessionLog>) -> &mut Building {
        let i = self.building_index(log);
        &mut self.building[i]
    }

    /// Where `log`'s chunks of this turn are in `building` (added if new).
    fn building_index(&mut self, log: &Arc<SessionLog>) -> usize {
        // Events come in runs of one session (an op's): one lookup a run.
        if let Some((id, i)) = self.last {
            if id == log.id {
                return i;
            }
        }
        let i = *self.index.entry(log.id).or_insert_with(|| {
            self.building.push(Building {
                log: log.clone(),
                done: Vec::new(),
                cur: None,
                appended: false,
            });
            self.building.len() - 1
        });
        self.last = Some((log.id, i));
        i
    }

    /// Adds an event of `log`, its seq and epoch assigned ([`SessionLog::assign`]), to the
    /// session's open chunk. `ahead` is (events, payload bytes) of this event and those that
    /// follow it in its op: a chunk grows once to hold what will go into it, not step by step.
    #[allow(clippy::too_many_arguments)]
    fn add_event(
        &mut self,
        log: &Arc<SessionLog>,
        (seq, epoch): (u64, u32),
        stream: StreamTag,
        kind: Kind,
        payload: Bytes,
        received: tokio::time::Instant,
        completes: Option<String>,
        ahead: (usize, usize),
    ) -> u64 {
        let i = self.building_index(log);
        let b = &mut self.building[i];
        if b.cur
            .as_ref()
            .is_some_and(|(cb, _)| cb.count() >= CHUNK_EVENTS || cb.encoded_len() >= CHUNK_BYTES)
        {
            let full = b.cur.take().expect("checked");
            b.done.push(full);
        }
        let spare = &mut self.spare;
        let (cb, out) = b.cur.get_or_insert_with(|| {
            (
                spare.take(),
                ChunkOut {
                    log: log.clone(),
                    first: seq,
                    count: 0,
                    payload: 0,
                    events: Vec::new(),
                    received: Vec::new(),
                    completes: Vec::new(),
                },
            )
        });
        if !cb.fits(payload.len()) {
            // What of the op's rest this chunk will take: up to its event and byte bounds.
            let events = ahead.0.min((CHUNK_EVENTS - cb.count()) as usize);
            let bytes = ahead
                .1
                .min(CHUNK_BYTES.saturating_sub(cb.encoded_len()) + payload.len());
            cb.reserve(events, bytes);
            out.events.reserve(events);
            out.received.reserve(events);
        }
        cb.push(epoch, kind, stream, &payload);
        out.count += 1;
        out.payload += payload.len() as u64;
        out.received.push(received);
        let answers = completes.is_some();
        if let Some(c) = completes {
            out.completes.push(c);
        }
        out.events.push(Event {
            seq,
            epoch,
            stream,
            kind,
            payload,
        });
        if answers {
            // An answer is an outcome a client is told: durable before it is seen, in either
            // mode — else a power loss would have the request answered `-32091` after its result
            // (requests are rare next to events; their in-flight records are synced too).
            self.sync = true;
        }
        seq
    }
}

impl Writer {
    /// Runs until the log is closed, every sender is gone, or it is stopped.
    async fn run(&mut self, mut rx: mpsc::Receiver<Op>, mut stopped: oneshot::Receiver<()>) {
        let mut ops = Vec::with_capacity(MAX_BATCH);
        let mut open = true;
        let mut stoppable = true;
        while open || !self.st.internal.is_empty() {
            // Ops left over from a turn that reached its byte cap, records owed, compaction.
            let busy = self.wants_turn(&ops);
            let retrying = !self.pending_ends.is_empty() || self.health() == Health::Degraded;
            tokio::select! {
                biased;
                r = &mut stopped, if stoppable => match r {
                    Ok(()) => return,
                    // A dropped handle (the log dropped without `close`) is not a stop.
                    Err(_) => stoppable = false,
                },
                n = rx.recv_many(&mut ops, MAX_BATCH), if open && ops.len() < MAX_BATCH => {
                    if n == 0 {
                        open = false;
                    }
                }
                // Work of its own (owed records, compaction): go on without waiting.
                _ = std::future::ready(()), if busy => {}
                _ = tokio::time::sleep_until(self.last_retry + RETRY_EVERY), if retrying => {}
            }
            self.turn(&mut ops);
            if self.closed {
                // Nothing is written after the clean-stop record.
                rx.close();
                while let Ok(op) = rx.try_recv() {
                    self.reject(op, &StoreError::Stopped);
                }
                return;
            }
        }
        if self.dirty {
            if let Err(e) = self.active.sync() {
                tracing::error!(error = %e, "final log sync failed");
            }
        }
    }

    fn health(&self) -> Health {
        *self.store.health.borrow()
    }

    /// A writer over recovered `state` (the thread runs it; the simulator drives it directly).
    pub(crate) fn new(store: Arc<Store>, state: State) -> Self {
        let active = state.segs[&state.active].seg.clone();
        let active_len = state.segs[&state.active].len;
        let seg_size = store.seg_size;
        let active_seg = active.clone();
        let mut w = Writer {
            store,
            st: state,
            active,
            active_len,
            // A new segment is created synced (its header and directory entry).
            synced_len: active_len,
            last_written: 0,
            last_new: 0,
            degraded_since: None,
            stalled: false,
            dirty: false,
            compaction: None,
            pending_ends: Vec::new(),
            closed: false,
            last_retry: tokio::time::Instant::now(),
            probe: 0,
            dead_unsure: BTreeSet::new(),
            reserve_held: false,
            owed_only: false,
            out: Vec::new(),
            spare: Spare::default(),
            trim: PageTrim::new(seg_size, &active_seg),
        };
        // A reserve for the records a full disk may owe (see `hold_reserve`).
        w.hold_reserve();
        w
    }

    /// Bytes the last turn wrote.
    #[cfg(test)]
    pub(crate) fn last_written(&self) -> usize {
        self.last_written
    }

    /// Turns again at once, without waiting for an op or a timer: ops are left over from the
    /// last turn, or it has work of its own, and it is not stalled (degraded, the last turn
    /// changed nothing).
    pub(crate) fn wants_turn(&self, ops: &[Op]) -> bool {
        !self.stalled && (!ops.is_empty() || self.busy())
    }

    /// Has work of its own (records owed, compaction) to do without waiting for ops.
    pub(crate) fn busy(&self) -> bool {
        !self.st.internal.is_empty() || self.wants_compaction()
    }

    /// The log is over its disk bound and compaction can bring it back: appends wait
    /// (backpressure reaches the upstream pumps through the channel), nothing is dropped.
    fn throttled(&self) -> bool {
        let over = self.store.disk.load(Ordering::Relaxed) > self.store.throttle_bytes();
        match self.health() {
            Health::Ok => over && self.wants_compaction(),
            // Writes that fit while degraded (space came back before the probe saw it) must
            // not grow the log past its bound: neither rotation nor compaction runs meanwhile.
            Health::Degraded => over,
            Health::Failed => false,
        }
    }

    /// One turn: plan, write, sync, publish (or fail).
    pub(crate) fn turn(&mut self, ops: &mut Vec<Op>) {
        let before = self.footprint(ops);
        self.turn_once(ops);
        self.stalled = self.health() == Health::Degraded && self.footprint(ops) == before;
    }

    /// What a turn that makes progress changes.
    fn footprint(&self, ops: &[Op]) -> (usize, u64, u64, usize, u64, usize, usize) {
        (
            ops.len(),
            self.st.active,
            self.active_len,
            self.st.segs.len(),
            self.store.disk.load(Ordering::Relaxed),
            self.st.internal.len(),
            self.pending_ends.len(),
        )
    }

    fn turn_once(&mut self, ops: &mut Vec<Op>) {
        if self.health() == Health::Failed {
            for op in ops.drain(..) {
                self.reject(op, &StoreError::Unavailable);
            }
            return;
        }
        if self.health() == Health::Degraded {
            let since = *self
                .degraded_since
                .get_or_insert_with(tokio::time::Instant::now);
            if since.elapsed() >= self.store.degraded_limit {
                let e = StoreError::io(
                    "log storage still out of space after log.store_error_exit_secs",
                    std::io::Error::from_raw_os_error(28),
                );
                self.fatal(&e);
                return self.turn(ops);
            }
        } else {
            self.degraded_since = None;
        }
        match self.health() {
            Health::Ok if !self.reserve_held && self.last_retry.elapsed() >= RETRY_EVERY => {
                self.last_retry = tokio::time::Instant::now();
                self.hold_reserve();
            }
            // Records owed (an eviction's remove, a trim), or a remove asked for: their
            // records may have no byte left to go to, and without them nothing can be reclaimed.
            Health::Degraded
                if self.reserve_held
                    && (!self.st.internal.is_empty()
                        || ops.iter().any(|op| matches!(op, Op::Remove { .. }))) =>
            {
                self.release_reserve()
            }
            _ => {}
        }
        self.rotate_if_full();
        let mut t = Turn {
            compaction_before: self.compaction,
            spare: std::mem::take(&mut self.spare),
            ..Default::default()
        };
        match self.health() {
            Health::Ok => self.compact_slice(&mut t),
            Health::Degraded => {
                self.reclaim_dead();
                self.compact_nearly_dead(&mut t);
            }
            Health::Failed => {}
        }
        // A sync that failed above (rotation, reclaiming) is fatal, and nothing may be written
        // after it: the next sync would succeed without writing the pages the failed one lost
        // (fsyncgate), and this turn's mark would then call them synced; recovery would take
        // the hole a power loss leaves there for damage, not for the torn tail it is.
        if self.health() == Health::Failed {
            return self.turn(ops);
        }
        for i in std::mem::take(&mut self.st.internal) {
            self.plan_internal(&mut t, i);
        }
        let due = self.health() == Health::Ok || self.last_retry.elapsed() >= RETRY_EVERY;
        if self.health() == Health::Degraded && due {
            self.last_retry = tokio::time::Instant::now();
            self.probe_space();
        }
        if !self.pending_ends.is_empty() && due {
            self.last_retry = tokio::time::Instant::now();
            for pe in std::mem::take(&mut self.pending_ends) {
                // A session removed meanwhile: its remove is durable, its end must not follow it.
                if pe.log.removed() {
                    continue;
                }
                plan_end(&mut t, pe, None);
            }
        }
        // A turn takes ops up to about `turn_bytes` of events; the rest wait for the next turn, so
        // the bounds applied after each turn are never overshot by more than one turn. Over the
        // disk bound, ops that carry events wait for compaction (or, degraded, for the space
        // probe), and so does every later op of their sessions and every flush; the others go
        // on, so that a remove queued behind a flood still frees its segments.
        let throttled = self.throttled() || std::mem::take(&mut self.owed_only);
        let mut planned = 0usize;
        let mut taken = 0usize;
        let mut held: Vec<Op> = Vec::new();
        let mut blocked: BTreeSet<SessionId> = BTreeSet::new();
        let mut full = false;
        for op in ops.drain(..) {
            let bytes = op_bytes(&op);
            let session = op_session(&op);
            full = full || (taken > 0 && planned >= self.store.turn_bytes);
            let wait = full
                || (throttled && bytes > 0)
                || session.is_some_and(|s| blocked.contains(&s))
                || (matches!(op, Op::Flush { .. } | Op::Close { .. }) && !held.is_empty());
            if wait {
                blocked.extend(session);
                held.push(op);
                continue;
            }
            planned += bytes;
            taken += 1;
            self.plan_op(&mut t, op);
        }
        ops.append(&mut held);
        // With `relaxed`, a turn also syncs once `SYNC_EVERY` bytes are written unsynced, so that
        // the page-cache trim finds the pages it drops clean. Unsynced, they were still dirty or
        // under write-back when advised, the kernel kept them, and every new write took a fresh
        // page: `copy_folio_from_iter_atomic` was 17 % of the proxy with `relaxed` against 2 %
        // with `fsync` (docs/benchmarks.md round 8). A failure is a sync failure like any other.
        let must_sync = t.sync
            || self.store.durability == Durability::Fsync
            || (self.dirty
                && self.active_len.saturating_sub(self.synced_len) >= self.store.sync_every);
        if t.is_empty() && !(t.sync && self.dirty) {
            self.spare = std::mem::take(&mut t.spare);
            self.last_written = 0;
            self.last_new = 0;
            self.publish(t, Vec::new());
            self.settle_dead();
            return;
        }
        // A turn that syncs first syncs what came before it, so that its mark says all of it
        // was synced: damage there is then told from a torn tail (no extra sync with `fsync`,
        // where every turn is synced; a few in relaxed mode, where few turns sync).
        if must_sync && self.dirty {
            if let Err(e) = self.sync_now() {
                self.probe = self.probe.max(1 << 20);
                return self.fail(t, WriteError::Sync(e));
            }
        }
        let copied: usize = t.copies.iter().map(|c| c.bytes.len()).sum();
        let (buf, effects) = self.encode(&mut t);
        self.spare = std::mem::take(&mut t.spare);
        let written = self.write(&buf, must_sync);
        let len = buf.len();
        if buf.capacity() <= OUT_CAP {
            self.out = buf;
        }
        match written {
            Ok(()) => {
                self.last_written = len;
                self.last_new = len.saturating_sub(copied);
                self.publish(t, effects);
                self.settle_dead();
            }
            Err(w) => {
                self.probe = self.probe.max((len * 2).clamp(1 << 20, 64 << 20));
                self.fail(t, w)
            }
        }
    }

    fn write(&mut self, buf: &[u8], sync: bool) -> Result<(), WriteError> {
        #[cfg(test)]
        if let Some(kind) = self.store.fail_writes.lock().unwrap().pop_front() {
            // Part of the turn reaches the file, as a real short write would leave it.
            let _ = self.active.write_at(&buf[..buf.len() / 2], self.active_len);
            let e = match kind {
                std::io::ErrorKind::StorageFull => std::io::Error::from_raw_os_error(28),
                std::io::ErrorKind::ReadOnlyFilesystem => std::io::Error::from_raw_os_error(30),
                _ => std::io::Error::from_raw_os_error(5),
            };
            return Err(WriteError::Write(StoreError::io("write segment", e)));
        }
        // The turn counts as written only once it is also synced (when it must be): a failure
        // anywhere leaves `active_len` at the turn's start, where `fail` cuts the file.
        if !buf.is_empty() {
            self.active
                .write_at(buf, self.active_len)
                .map_err(WriteError::Write)?;
        }
        if sync && (self.dirty || !buf.is_empty()) {
            self.active.sync().map_err(WriteError::Sync)?;
            self.dirty = false;
            self.synced_len = self.active_len + buf.len() as u64;
        } else if !buf.is_empty() {
            self.dirty = true;
        }
        if !buf.is_empty() {
            self.active_len += buf.len() as u64;
            self.store
                .disk
                .fetch_add(buf.len() as u64, Ordering::Relaxed);
            if let Some(s) = self.st.segs.get_mut(&self.st.active) {
                s.len = self.active_len;
            }
            self.trim.written(self.active_len);
        }
        Ok(())
    }

    /// Syncs what was written since the last sync (before segments whose records it supersedes
    /// are deleted).
    fn sync_now(&mut self) -> Result<(), StoreError> {
        if self.dirty {
            self.active.sync()?;
            self.dirty = false;
            self.synced_len = self.active_len;
        }
        Ok(())
    }

    /// Starts a new segment once the active one has reached its target size. The full segment is
    /// synced first (in either durability mode), so every segment but the newest is complete on
    /// disk and a torn write can only be at the very end of the log.
    fn rotate_if_full(&mut self) {
        if self.active_len < self.store.seg_size || self.health() != Health::Ok {
            return;
        }
        if let Err(e) = self.sync_now() {
            self.fatal(&e);
            return;
        }
        let id = self.st.active + 1;
        match Segment::create(&*self.store.fs, id) {
            Ok(seg) => {
                let seg = Arc::new(seg);
                let len = record::SEGMENT_HEADER as u64;
                self.st.segs.insert(
                    id,
                    SegInfo {
                        seg: seg.clone(),
                        len,
                        live: 0,
                    },
                );
                self.store.disk.fetch_add(len, Ordering::Relaxed);
                self.trim.rotated(self.active_len, &seg);
                self.st.active = id;
                self.active = seg;
                self.active_len = len;
                self.synced_len = len;
            }
            Err(e) => {
                // Not fatal: the full segment takes the next turns too. A file the failed
                // creation left behind (its header not synced) would make every later attempt
                // fail: it goes, and the next turn tries again.
                self.store.metrics.store_errors.inc();
                tracing::error!(error = %e, "cannot start a new log segment; appending to the current one");
                let _ = self.store.fs.remove(&segment::file_name(id));
            }
        }
    }

    /// After a written turn: when no record is owed any more, every death so far has its cause
    /// written (and [`Writer::reclaim_dead`] syncs before it deletes).
    fn settle_dead(&mut self) {
        if self.st.internal.is_empty() {
            self.dead_unsure.clear();
        }
    }

    /// Degraded (out of space): deletes the segments whose records are all dead, so a full disk
    /// can heal by itself. What superseded their records is synced first. A dead segment after a
    /// live one goes only if it holds nothing that keeps records of older segments dead after a
    /// restart (a remove, a not-in-flight record, an answer that ends an in-flight record);
    /// compaction, which always takes the oldest segment, needs no such care.
    fn reclaim_dead(&mut self) {
        let mut dead = Vec::new();
        let mut prefix = true;
        let candidates: Vec<(u64, Arc<Segment>, u64, u64)> = self
            .st
            .segs
            .iter()
            .filter(|(id, _)| **id != self.st.active)
            .map(|(id, s)| (*id, s.seg.clone(), s.len, s.live))
            .collect();
        for (id, seg, len, live) in candidates {
            if live != 0 || self.dead_unsure.contains(&id) {
                prefix = false;
                continue;
            }
            if prefix || only_superseded(&seg, len) {
                dead.push(id);
            }
        }
        if dead.is_empty() {
            return;
        }
        if let Err(e) = self.sync_now() {
            self.fatal(&e);
            return;
        }
        if self.compaction.is_some_and(|(id, _)| dead.contains(&id)) {
            self.compaction = None;
        }
        for id in dead {
            tracing::info!(
                segment = id,
                "out of space: deleting a segment whose records are all dead"
            );
            self.delete_segment(id);
        }
    }

    /// Degraded (out of space): compacts the oldest segment when what is still live in it is a
    /// few records (the run's open record, a live session's meta) that fit in a quarter of the
    /// reserve. Such a segment is not dead, so [`Writer::reclaim_dead`] keeps it, and keeps
    /// every dead segment after it that holds an answer or a remove; moving those few records
    /// frees them all. Only with no record owed, so that nothing it drops as dead can come back
    /// after a crash.
    fn compact_nearly_dead(&mut self, t: &mut Turn) {
        let Some((&oldest, info)) = self.st.segs.iter().next() else {
            return;
        };
        let small = info.live <= (self.store.reserve_bytes / 4) as u64;
        if oldest == self.st.active
            || !small
            || !self.st.internal.is_empty()
            || self.dead_unsure.contains(&oldest)
        {
            return;
        }
        if self.compaction.is_none_or(|(id, _)| id != oldest) {
            self.compaction = Some((oldest, record::SEGMENT_HEADER as u64));
        }
        self.compact_slice(t);
    }

    /// Keeps a reserve file of `reserve_bytes` in the data dir while the log is healthy. Out of
    /// space, the log still owes records (a remove, a trim: the causes of deaths) that must be
    /// durable before the segments they empty can be reclaimed; on a disk with no byte left they
    /// could never be written, and the log could never heal. Giving up the reserve makes room
    /// for exactly them ([`Writer::release_reserve`]).
    pub(crate) fn hold_reserve(&mut self) {
        let want = self.store.reserve_bytes;
        let fs = self.store.fs.clone();
        let made = fill(&*fs, RESERVE, want);
        match made {
            Ok(()) => self.reserve_held = true,
            Err(e) => {
                let _ = fs.remove(RESERVE);
                tracing::debug!(error = %e, "no room for the log's reserve file yet");
            }
        }
    }

    /// Degraded with records owed (or removes asked for): deletes the reserve file, and this turn
    /// writes only those records (no client events), so that the segments they make dead can be
    /// reclaimed.
    fn release_reserve(&mut self) {
        match self.store.fs.remove(RESERVE) {
            Ok(()) => {
                tracing::info!(
                    bytes = self.store.reserve_bytes,
                    "out of space: the log's reserve is given up to write the records it owes"
                );
                self.reserve_held = false;
                self.owed_only = true;
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot delete the log's reserve file");
                self.reserve_held = false;
            }
        }
    }

    /// Degraded (out of space): has enough space returned? Writes and deletes a probe file of
    /// twice the size of the write that failed (at least 1 MiB), so that a few freed bytes — the
    /// failed write's own, cut off again — do not make readiness flap.
    fn probe_space(&mut self) {
        const PROBE: &str = ".space-probe";
        let fs = self.store.fs.clone();
        // Room for a new reserve too: the reserve given up is not space that came back.
        let want = self.probe
            + if self.reserve_held {
                0
            } else {
                self.store.reserve_bytes
            };
        let _ = fs.remove(PROBE);
        let probe = fill(&*fs, PROBE, want);
        let _ = fs.remove(PROBE);
        match probe {
            Ok(()) => {
                tracing::info!(probe_bytes = want, "log storage has space again; ready");
                self.probe = 0;
                self.store.set_health(Health::Ok);
            }
            Err(e) => tracing::debug!(error = %e, probe_bytes = want, "log storage still full"),
        }
    }

    fn fatal(&mut self, e: &StoreError) {
        self.store.metrics.store_errors.inc();
        tracing::error!(error = %e, "log storage failed; the log takes no more writes");
        self.store.set_health(Health::Failed);
    }

    // --- planning ---

    fn plan_internal(&mut self, t: &mut Turn, i: Internal) {
        t.owed.push(i.clone());
        match i {
            Internal::Open => {
                let mut b = Vec::new();
                record::open(
                    &mut b,
                    self.store.durability == Durability::Fsync,
                    unix_now(),
                );
                // After the metas it may follow (recovery's seals), though a lost seal is redone
                // anyway: every unclean stop seals.
                t.post.push(Item {
                    bytes: b,
                    effect: Effect::Open,
                });
                t.sync = true;
            }
            Internal::Meta(log) => {
                if !log.removed() {
                    t.inline.push(meta_item(&log));
                }
            }
            Internal::Trim(log) => {
                if log.removed() {
                    return;
                }
                let oldest = log.oldest();
                let mut b = Vec::new();
                record::trim(&mut b, &log.id, oldest);
                t.inline.push(Item {
                    bytes: b,
                    effect: Effect::Trim(log),
                });
            }
            Internal::Remove(id) => {
                let mut b = Vec::new();
                record::remove(&mut b, &id);
                t.removes.push(Item {
                    bytes: b,
                    effect: Effect::Remove(id),
                });
            }
            Internal::Inflight(log, id, stream) => {
                if log.removed() {
                    return;
                }
                let mut b = Vec::new();
                record::inflight(&mut b, &log.id, stream, log.assigned(), &id);
                t.inline.push(Item {
                    bytes: b,
                    effect: Effect::Inflight(log, id, stream),
                });
                t.sync = true;
            }
        }
    }

    fn plan_op(&mut self, t: &mut Turn, op: Op) {
        if self.closed {
            self.reject(op, &StoreError::Stopped);
            return;
        }
        match op {
            Op::Create { log, done } => {
                t.inline.push(meta_item(&log));
                t.acks.push(done);
            }
            Op::Append {
                log, mut evs, done, ..
            } => {
                // After a lost append nothing more is logged for the session: later events under
                // contiguous ids would hide the lost ones.
                if !log.takes_appends() {
                    tracing::debug!(session = %log.tag, events = evs.len(), "append after the session's end or a lost append refused");
                    if let Some(d) = done {
                        let _ = d.send(Err(StoreError::SessionEnded));
                    }
                    return;
                }
                let mut last = 0;
                let mut ahead = (
                    evs.len(),
                    evs.iter().map(|e| e.payload.len()).sum::<usize>(),
                );
                let (first, epoch) = log.assign(evs.len() as u64);
                for (i, ev) in evs.drain(..).enumerate() {
                    let len = ev.payload.len();
                    last = t.add_event(
                        &log,
                        (first + i as u64, epoch),
                        ev.stream,
                        ev.kind,
                        ev.payload,
                        ev.received,
                        ev.completes,
                        ahead,
                    );
                    ahead = (ahead.0 - 1, ahead.1 - len);
                }
                self.store.recycle(evs);
                t.building(&log).appended = true;
                if let Some(d) = done {
                    t.append_acks.push((d, last));
                }
            }
            Op::Inflight {
                log,
                request_id,
                stream,
                done,
            } => {
                let registered_at = log.assigned();
                let mut b = Vec::new();
                record::inflight(&mut b, &log.id, stream, registered_at, &request_id);
                t.inline.push(Item {
                    bytes: b,
                    effect: Effect::Inflight(log, request_id, stream),
                });
                // Durable before the request is forwarded, in either mode: it is what lets a
                // restart answer the request (I6), and requests are rare next to events.
                t.sync = true;
                t.acks.push(done);
            }
            Op::InflightDone {
                log,
                request_id,
                done,
            } => {
                let mut b = Vec::new();
                record::inflight_done(&mut b, &log.id, &request_id);
                t.inline.push(Item {
                    bytes: b,
                    effect: Effect::InflightDone(log, request_id),
                });
                t.acks.push(done);
            }
            Op::End {
                log,
                reason,
                evs,
                done,
                ..
            } => {
                if !log.begin_end(reason) {
                    // Idempotent: the end is already written or on its way.
                    let _ = done.send(Ok(0));
                    return;
                }
                let mut evs: Vec<_> = evs
                    .into_iter()
                    .map(|e| (e.stream, e.kind, e.payload, e.completes))
                    .collect();
                let marker = serde_json::json!({"reason": reason.as_str()}).to_string();
                evs.push((StreamTag::LEGACY, Kind::End, Bytes::from(marker), None));
                plan_end(t, PendingEnd { log, evs }, Some(done));
            }
            Op::Remove { session, done } => {
                let mut b = Vec::new();
                record::remove(&mut b, &session);
                t.removes.push(Item {
                    bytes: b,
                    effect: Effect::Remove(session),
                });
                t.acks.push(done);
            }
            Op::MakeRoom { target, done } => t.make_room.push((target, done)),
            Op::Flush { done } => {
                t.sync = true;
                t.acks.push(done);
            }
            Op::Close { done } => {
                let mut b = Vec::new();
                record::clean(&mut b, unix_now());
                t.post.push(Item {
                    bytes: b,
                    effect: Effect::Clean,
                });
                t.sync = true;
                t.acks.push(done);
                self.closed = true;
            }
        }
    }

    /// Lays the turn out (copies, single records, chunks, end metas) and lists each record's
    /// effect with its place.
    fn encode(&mut self, t: &mut Turn) -> (Vec<u8>, Vec<(Effect, Loc)>) {
        // One allocation for the turn: its records' sizes are known (headers are small).
        let items: usize = t
            .copies
            .iter()
            .chain(&t.inline)
            .chain(&t.post)
            .chain(&t.removes)
            .map(|i| i.bytes.len())
            .sum();
        let chunks: usize = t
            .building
            .iter()
            .flat_map(|b| b.done.iter().chain(&b.cur))
            .map(|(cb, out)| {
                cb.encoded_len() + 64 + out.completes.iter().map(|c| 2 + c.len()).sum::<usize>()
            })
            .sum();
        let mut buf = std::mem::take(&mut self.out);
        buf.clear();
        buf.reserve(64 + items + chunks);
        let mut effects = Vec::new();
        let seg = self.st.active;
        let base = self.active_len;
        let place = |buf: &mut Vec<u8>, start: usize| Loc {
            seg,
            off: base + start as u64,
            len: (buf.len() - start) as u32,
        };
        // The turn's mark: where it starts and how much of the segment was synced before it.
        record::mark(&mut buf, base, self.synced_len);
        for item in t.copies.drain(..).chain(t.inline.drain(..)) {
            let start = buf.len();
            buf.extend_from_slice(&item.bytes);
            effects.push((item.effect, place(&mut buf, start)));
        }
        for b in &mut t.building {
            if let Some(cur) = b.cur.take() {
                b.done.push(cur);
            }
            for (cb, out) in b.done.drain(..) {
                let start = buf.len();
                let value = cb.finish();
                record::chunk(&mut buf, &out.log.id, out.first, &out.completes, &value);
                t.spare.give(value);
                effects.push((Effect::Chunk(Box::new(out)), place(&mut buf, start)));
            }
        }
        for item in t.post.drain(..).chain(t.removes.drain(..)) {
            let start = buf.len();
            buf.extend_from_slice(&item.bytes);
            effects.push((item.effect, place(&mut buf, start)));
        }
        (buf, effects)
    }

    // --- failure ---

    /// Answers an op that will not be carried out; a session whose events are refused learns it.
    fn reject(&self, op: Op, e: &StoreError) {
        if let Op::Append { log, .. } = &op {
            if log.mark_failed() {
                let _ = self.store.failures.send(log.id);
                log.wake();
            }
        }
        if let Some(d) = op.into_ack() {
            let _ = d.send(Err(e.clone()));
        }
    }

    /// The turn's write or sync failed: cut it off, roll its seqs back, answer its ops with the
    /// error, report the sessions whose events are lost, and keep the ends it carried.
    fn fail(&mut self, t: Turn, w: WriteError) {
        self.store.metrics.store_errors.inc();
        let (e, in_sync) = match w {
            WriteError::Write(e) => (e, false),
            WriteError::Sync(e) => (e, true),
        };
        // The cut is made durable before the seqs it held are handed out again.
        let cut = self
            .active
            .truncate(self.active_len)
            .and_then(|()| self.active.sync());
        if cut.is_ok() {
            self.dirty = false;
            self.synced_len = self.active_len;
        }
        let recoverable = e.is_no_space() && !in_sync && cut.is_ok();
        if recoverable {
            tracing::error!(error = %e, "log write failed: out of space; the sessions it carried end, readiness is lost until writes succeed again");
            self.store.set_health(Health::Degraded);
        } else {
            if let Err(c) = &cut {
                tracing::error!(error = %c, "cannot cut off a failed log write");
            }
            self.fatal(&e);
        }
        // What the turn owed is owed again.
        self.st.internal.extend(t.owed);
        self.compaction = t.compaction_before;
        for b in &t.building {
            b.log.roll_back();
            if b.appended && b.log.mark_failed() {
                let _ = self.store.failures.send(b.log.id);
                b.log.wake();
            }
        }
        for (pe, ack) in t.ends {
            pe.log.mark_failed();
            pe.log.wake();
            if let Some(a) = ack {
                let _ = a.send(Err(e.clone()));
            }
            self.pending_ends.push(pe);
        }
        for a in t.acks {
            let _ = a.send(Err(e.clone()));
        }
        for (a, _) in t.append_acks {
            let _ = a.send(Err(e.clone()));
        }
        for (_, a) in t.make_room {
            let _ = a.send(Err(e.clone()));
        }
    }

    // --- publishing ---

    fn birth(&mut self, l: Loc) {
        if let Some(s) = self.st.segs.get_mut(&l.seg) {
            s.live += u64::from(l.len);
        }
        self.store
            .retained
            .fetch_add(u64::from(l.len), Ordering::Relaxed);
    }

    fn kill(&mut self, l: Loc) {
        self.dead_unsure.insert(l.seg);
        if let Some(s) = self.st.segs.get_mut(&l.seg) {
            s.live = s.live.saturating_sub(u64::from(l.len));
        }
        let _ = self
            .store
            .retained
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |r| {
                Some(r.saturating_sub(u64::from(l.len)))
            });
    }

    /// Applies a durable turn: records take effect, events are published, retention is applied,
    /// acks fire, readers wake.
    fn publish(&mut self, t: Turn, effects: Vec<(Effect, Loc)>) {
        let metrics = self.store.metrics.clone();
        // One clock read for the turn's append latencies: its events became durable together;
        // observed locally and added to the shared histogram once, at the end of the turn.
        let now = tokio::time::Instant::now();
        let append = metrics.append_seconds.local();
        // Ordered, so that what follows from a turn (trims, their records) is the same in every
        // run of the same ops (the simulator replays seeds exactly).
        let mut touched: BTreeMap<SessionId, Arc<SessionLog>> = BTreeMap::new();
        for (effect, loc) in effects {
            match effect {
                Effect::Moved { key, old } => self.moved(key, old, loc),
                // A record of a session deleted meanwhile is dead on arrival.
                Effect::Meta(log) | Effect::Inflight(log, ..) | Effect::Trim(log)
                    if log.removed() => {}
                Effect::Chunk(c) if c.log.removed() => {}
                Effect::Meta(log) => {
                    let w = self.st.ws.entry(log.id).or_default();
                    let old = w.meta.replace(loc);
                    if let Some(o) = old {
                        self.kill(o);
                    }
                    self.birth(loc);
                    self.store.lock_logs().entry(log.id).or_insert(log);
                }
                Effect::Inflight(log, id, stream) => {
                    let w = self.st.ws.entry(log.id).or_default();
                    let old = w.inflight.insert(id.clone(), loc);
                    if let Some(o) = old {
                        self.kill(o);
                    }
                    self.birth(loc);
                    log.set_inflight(id, stream);
                }
                Effect::InflightDone(log, id) => self.end_inflight(&log, &id),
                Effect::Trim(log) => {
                    let old = self.st.ws.entry(log.id).or_default().trim.replace(loc);
                    if let Some(o) = old {
                        self.kill(o);
                    }
                    self.birth(loc);
                }
                Effect::Remove(id) => self.remove_now(&id),
                Effect::Open => {
                    if let Some(o) = self.st.open_loc.replace(loc) {
                        self.kill(o);
                    }
                    self.birth(loc);
                }
                Effect::Clean => {}
                Effect::Chunk(c) => {
                    let mut c = *c;
                    self.birth(loc);
                    let log = c.log.clone();
                    for id in &c.completes {
                        self.end_inflight(&log, id);
                    }
                    let chunk = Chunk {
                        first: c.first,
                        count: c.count,
                        payload: c.payload,
                        skipped: 0,
                        seg: self.st.segs[&loc.seg].seg.clone(),
                        off: loc.off,
                        len: loc.len,
                    };
                    let events = std::mem::take(&mut c.events);
                    let n = events.len() as u64;
                    log.publish_chunk(chunk, events);
                    metrics.logged.inc_by(n);
                    for r in &c.received {
                        let d = now.saturating_duration_since(*r);
                        append.observe(d.as_secs_f64());
                    }
                    touched.entry(log.id).or_insert(log);
                }
            }
        }
        append.flush();
        // Trim before waking readers, so nobody observes a head beyond the retention bound.
        // Never an ended session, not even in the turn of its end (whose chunk may take it over
        // the bound): its trim record would follow a turn later, so the data dir would show, for
        // a turn, events it no longer has; an ended session is kept whole or evicted whole.
        for log in touched.values() {
            if log.ended().is_none() {
                self.trim_session(log, self.store.max_events, self.store.max_bytes);
            }
        }
        self.enforce_total();
        let mut room = Vec::new();
        for (target, done) in t.make_room {
            self.evict_ended(target);
            room.push((done, self.store.retained.load(Ordering::Relaxed)));
        }
        for log in touched.values() {
            log.wake();
        }
        for (pe, _) in &t.ends {
            pe.log.wake();
        }
        metrics
            .log_bytes
            .set(self.store.retained.load(Ordering::Relaxed) as i64);
        metrics
            .log_disk_bytes
            .set(self.store.disk.load(Ordering::Relaxed) as i64);
        // Segments whose live records were all copied forward by a durable turn go.
        if !t.delete.is_empty() && !self.dirty {
            for id in t.delete {
                self.delete_segment(id);
            }
        } else {
            // Not synced (cannot happen: a turn that completes a compaction syncs): keep them.
            debug_assert!(t.delete.is_empty());
        }
        for (d, seq) in t.append_acks {
            let _ = d.send(Ok(seq));
        }
        for (_, ack) in t.ends {
            if let Some(a) = ack {
                let _ = a.send(Ok(0));
            }
        }
        for a in t.acks {
            let _ = a.send(Ok(0));
        }
        for (d, r) in room {
            let _ = d.send(Ok(r));
        }
    }

    fn end_inflight(&mut self, log: &Arc<SessionLog>, id: &str) {
        let old = self
            .st
            .ws
            .get_mut(&log.id)
            .and_then(|w| w.inflight.remove(id));
        if let Some(o) = old {
            self.kill(o);
        }
        log.clear_inflight(id);
    }

    /// A record copied by compaction is durable at `new`: what pointed at `old` points there.
    fn moved(&mut self, key: MovedKey, old: Loc, new: Loc) {
        let still = match &key {
            MovedKey::Chunk(id, first) => {
                let log = self.store.lock_logs().get(id).cloned();
                let seg = self.st.segs[&new.seg].seg.clone();
                log.is_some_and(|log| log.relocate_chunk(*first, old, seg, new.off))
            }
            MovedKey::Session(id) => {
                let w = self.st.ws.get_mut(id);
                match w {
                    Some(w) if w.meta == Some(old) => {
                        w.meta = Some(new);
                        true
                    }
                    Some(w) if w.trim == Some(old) => {
                        w.trim = Some(new);
                        true
                    }
                    _ => false,
                }
            }
            MovedKey::Inflight(id, req) => {
                match self.st.ws.get_mut(id).and_then(|w| w.inflight.get_mut(req)) {
                    Some(l) if *l == old => {
                        *l = new;
                        true
                    }
                    _ => false,
                }
            }
            MovedKey::Open => {
                if self.st.open_loc == Some(old) {
                    self.st.open_loc = Some(new);
                    true
                } else {
                    false
                }
            }
        };
        if still {
            self.kill(old);
            self.birth(new);
        }
    }

    /// Deletes a session from memory; its records become dead (the remove record that makes it
    /// durable is written by the caller, or in the next turn).
    fn remove_now(&mut self, id: &SessionId) {
        let log = self.store.lock_logs().remove(id);
        if let Some(w) = self.st.ws.remove(id) {
            for l in w
                .meta
                .into_iter()
                .chain(w.trim)
                .chain(w.inflight.into_values())
            {
                self.kill(l);
            }
        }
        if let Some(log) = log {
            for c in log.clear_removed() {
                self.kill(c.loc());
            }
            log.wake();
        }
    }

    // --- retention ---

    /// Trims `log` to its bounds (see [`SessionLog::trim`]); its chunks that became dead are
    /// counted out and the trim record is owed. Returns whether anything was trimmed.
    fn trim_session(&mut self, log: &Arc<SessionLog>, max_events: u64, max_bytes: u64) -> bool {
        let Some(dead) = log.trim(max_events, max_bytes) else {
            return false;
        };
        for l in dead {
            self.kill(l);
        }
        self.st.internal.push(Internal::Trim(log.clone()));
        true
    }

    /// Keeps the live records within `log.max_total_bytes`: ended sessions go first (oldest end
    /// first), then the largest live sessions are trimmed.
    fn enforce_total(&mut self) {
        let max = self.store.max_total;
        if self.store.retained.load(Ordering::Relaxed) <= max {
            return;
        }
        self.evict_ended(max);
        let mut guard = 0;
        while self.store.retained.load(Ordering::Relaxed) > max && guard < 10_000 {
            guard += 1;
            let over = self.store.retained.load(Ordering::Relaxed) - max;
            let largest = self
                .store
                .lock_logs()
                .values()
                // Live sessions only (ended ones are evicted whole, first), with an event to
                // spare: trimming never takes the head.
                .filter(|l| l.ended().is_none() && l.size().0 > 1)
                .max_by_key(|l| (l.bytes(), l.id))
                .cloned();
            let Some(log) = largest else {
                // Only live sessions of one event are left (each a large one): the largest
                // gives up what it retains. A resume at its head then needs nothing retained;
                // one that needs the head's own event meets `cursor_trimmed`.
                let single = self
                    .store
                    .lock_logs()
                    .values()
                    .filter(|l| l.ended().is_none() && l.size().0 == 1 && l.size().1 > 0)
                    .max_by_key(|l| (l.bytes(), l.id))
                    .cloned();
                let Some(log) = single else { break };
                tracing::warn!(session = %log.tag, bytes = log.bytes(), "log over log.max_total_bytes: a session of one large event gives up what it retains");
                let dead = log.drop_before(log.head() + 1);
                if dead.is_empty() {
                    break;
                }
                for l in dead {
                    self.kill(l);
                }
                self.st.internal.push(Internal::Trim(log.clone()));
                continue;
            };
            let (n, b, _) = log.size();
            // Aim a little below: whole chunks free record bytes in steps.
            let want_b = b.saturating_sub(over + max / 20).max(1);
            tracing::warn!(session = %log.tag, bytes = b, over, "log over log.max_total_bytes: trimming the largest live session");
            if !self.trim_session(&log, n.max(2) - 1, want_b) {
                break;
            }
        }
    }

    /// Deletes ended sessions, the longest-ended first, until the live records take at most
    /// `target` bytes.
    fn evict_ended(&mut self, target: u64) {
        if self.store.retained.load(Ordering::Relaxed) <= target {
            return;
        }
        let mut ended: Vec<_> = self
            .store
            .lock_logs()
            .values()
            .filter(|l| l.end_published())
            .filter_map(|l| l.ended_unix().map(|t| (t, l.clone())))
            .collect();
        ended.sort_by_key(|(t, l)| (*t, l.id));
        for (_, log) in ended {
            if self.store.retained.load(Ordering::Relaxed) <= target {
                break;
            }
            tracing::info!(session = %log.tag, bytes = log.bytes(), "evicting an ended session's log for space");
            self.remove_now(&log.id);
            self.st.internal.push(Internal::Remove(log.id));
        }
    }

    // --- compaction ---

    /// Dead bytes are more than a quarter of the files (and there is an old segment to compact).
    fn wants_compaction(&self) -> bool {
        if self.compaction.is_some() {
            return true;
        }
        if self.st.segs.len() < 2 || self.health() != Health::Ok || self.closed {
            return false;
        }
        // Only dead bytes outside the active segment can be reclaimed by compacting.
        let disk: u64 = self.st.segs.values().map(|s| s.len).sum();
        let dead_old: u64 = self
            .st
            .segs
            .iter()
            .filter(|(id, _)| **id != self.st.active)
            .map(|(_, s)| s.len.saturating_sub(s.live))
            .sum();
        // Over the throttle, a segment's worth of dead bytes is enough: otherwise the files may
        // sit above it (dead under a quarter), appends are not held, and one turn of events
        // plus the copies its trims start break `Store::disk_bound` (sim-long seed 4641).
        let over = disk > self.store.throttle_bytes() && dead_old >= self.store.seg_size;
        disk > 2 * self.store.seg_size && (dead_old * 4 > disk || over)
    }

    /// Copies the live records of the next slice of the oldest segment into the turn. Once the
    /// whole segment is copied, the turn syncs and the segment is deleted after it.
    fn compact_slice(&mut self, t: &mut Turn) {
        if self.compaction.is_none() {
            if !self.wants_compaction() {
                return;
            }
            let oldest = *self.st.segs.keys().next().expect("two segments");
            self.compaction = Some((oldest, record::SEGMENT_HEADER as u64));
        }
        let Some((id, mut off)) = self.compaction else {
            return;
        };
        let Some(info) = self.st.segs.get(&id) else {
            self.compaction = None;
            return;
        };
        let (seg, len) = (info.seg.clone(), info.len);
        // Read at least twice what the last turn wrote besides copies, so a flood cannot outrun
        // compaction, but at most a turn's worth: a turn's copies then add at most `turn_bytes`
        // to its events, which keeps `Store::disk_bound` (sim-long seed 11036, where copies fed
        // the budget and one turn copied 46 KB with 24 KB turns).
        let budget = self
            .store
            .compact_slice
            .max(2 * self.last_new)
            .min(self.store.turn_bytes.max(self.store.compact_slice));
        let mut read = 0usize;
        'slice: while off < len && read < budget {
            let want = ((len - off) as usize).min(budget);
            let mut block = vec![0u8; want];
            if let Err(e) = seg.read_at(&mut block, off) {
                self.compaction = None;
                self.fatal(&e);
                return;
            }
            let mut pos = 0;
            while pos < block.len() {
                match record::read_frame(&block[pos..]) {
                    Ok((ty, body, n)) => {
                        let old = Loc {
                            seg: id,
                            off: off + pos as u64,
                            len: n as u32,
                        };
                        if let Some(key) = self.live_key(ty, body, old) {
                            t.copies.push(Item {
                                bytes: block[pos..pos + n].to_vec(),
                                effect: Effect::Moved { key, old },
                            });
                        }
                        pos += n;
                    }
                    Err(record::FrameError::Short { need })
                        if pos == 0 && read > 0 && read + need > budget =>
                    {
                        // A record that would take this turn past its budget waits for the
                        // next turn, which copies it first (alone, if it is over the budget).
                        break 'slice;
                    }
                    Err(record::FrameError::Short { need })
                        if pos == 0 && off + (need as u64) <= len =>
                    {
                        // One record longer than the slice: read it whole.
                        let mut big = vec![0u8; need];
                        if let Err(e) = seg.read_at(&mut big, off) {
                            self.compaction = None;
                            self.fatal(&e);
                            return;
                        }
                        block = big;
                    }
                    Err(record::FrameError::Short { need })
                        if off + ((pos + need) as u64) <= len =>
                    {
                        // The rest of this record is in the next block.
                        break;
                    }
                    Err(_) => {
                        // Damage (every segment compaction reads was synced whole): skip to the
                        // next intact record; whatever live record was in between is repaired.
                        let from = off + pos as u64;
                        let mut rest = vec![0u8; (len - from) as usize];
                        if let Err(e) = seg.read_at(&mut rest, from) {
                            self.compaction = None;
                            self.fatal(&e);
                            return;
                        }
                        let skip = resync(&rest);
                        self.damaged(id, from, from + skip as u64);
                        off = from + skip as u64;
                        read += pos + skip;
                        pos = 0;
                        block.clear();
                        break;
                    }
                }
            }
            off += pos as u64;
            read += pos;
        }
        if off >= len {
            self.compaction = None;
            t.delete.push(id);
            t.sync = true;
        } else {
            self.compaction = Some((id, off));
        }
    }

    /// Records in `start..end` of segment `seg` are damaged (found by compaction): counted and
    /// logged once; the live ones among them are repaired. A chunk cannot be: its session drops
    /// every event up to its end, so a resume into or before it is refused (`cursor_trimmed`)
    /// and nothing after it is served as contiguous with what came before. Metadata, trims,
    /// in-flight and open records are written again from memory.
    fn damaged(&mut self, seg: u64, start: u64, end: u64) {
        self.store.metrics.store_damage.inc();
        tracing::error!(
            segment = seg,
            offset = start,
            bytes = end - start,
            "damaged log records (checksum failure in synced data); their sessions lose the events up to them"
        );
        let hit = |l: &Loc| l.seg == seg && l.off >= start && l.off < end;
        let logs: Vec<Arc<SessionLog>> = {
            let mut v: Vec<_> = self.store.lock_logs().values().cloned().collect();
            v.sort_by_key(|l| l.id);
            v
        };
        for log in logs {
            if let Some(through) = log.damaged_chunk_end(&hit) {
                for l in log.drop_before(through) {
                    self.kill(l);
                }
                self.st.internal.push(Internal::Trim(log.clone()));
                tracing::error!(session = %log.tag, oldest = through, "a session's events up to a damaged chunk are no longer served");
            }
            let Some(w) = self.st.ws.get_mut(&log.id) else {
                continue;
            };
            let mut dead = Vec::new();
            if let Some(l) = w.meta.filter(hit) {
                w.meta = None;
                dead.push(l);
                self.st.internal.push(Internal::Meta(log.clone()));
            }
            if let Some(l) = w.trim.filter(hit) {
                w.trim = None;
                dead.push(l);
                self.st.internal.push(Internal::Trim(log.clone()));
            }
            let reqs: Vec<String> = w
                .inflight
                .iter()
                .filter(|(_, l)| hit(l))
                .map(|(r, _)| r.clone())
                .collect();
            for r in reqs {
                if let Some(l) = w.inflight.remove(&r) {
                    dead.push(l);
                }
                if let Some(stream) = log.inflight_stream(&r) {
                    self.st
                        .internal
                        .push(Internal::Inflight(log.clone(), r, stream));
                }
            }
            for l in dead {
                self.kill(l);
            }
        }
        if let Some(l) = self.st.open_loc.filter(hit) {
            self.st.open_loc = None;
            self.kill(l);
            self.st.internal.push(Internal::Open);
        }
    }

    /// If the record at `old` is live, what identifies it.
    fn live_key(&self, ty: Type, body: &[u8], old: Loc) -> Option<MovedKey> {
        match ty {
            Type::Chunk => {
                let c = record::parse_chunk(body)?;
                let log = self.store.lock_logs().get(&c.session).cloned()?;
                (log.chunk_place(c.first)? == old).then_some(MovedKey::Chunk(c.session, c.first))
            }
            Type::Meta | Type::Trim => {
                let id = record::session_of(body)?;
                let w = self.st.ws.get(&id)?;
                (w.meta == Some(old) || w.trim == Some(old)).then_some(MovedKey::Session(id))
            }
            Type::Inflight => {
                let (id, _, _, req) = record::parse_inflight(body)?;
                let w = self.st.ws.get(&id)?;
                (w.inflight.get(&req) == Some(&old)).then_some(MovedKey::Inflight(id, req))
            }
            Type::Open => (self.st.open_loc == Some(old)).then_some(MovedKey::Open),
            // Their effect is in the state already; nothing older than the oldest segment
            // remains for them to act on.
            Type::InflightDone | Type::Remove | Type::Clean | Type::Mark => None,
        }
    }

    fn delete_segment(&mut self, id: u64) {
        let Some(info) = self.st.segs.get(&id) else {
            return;
        };
        if info.live != 0 || id == self.st.active {
            tracing::error!(
                segment = id,
                live = info.live,
                "a segment to delete still holds live records; kept"
            );
            return;
        }
        let info = self.st.segs.remove(&id).expect("present");
        match self.store.fs.remove(&segment::file_name(id)) {
            Ok(()) => {
                let _ = self
                    .store
                    .disk
                    .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |d| {
                        Some(d.saturating_sub(info.len))
                    });
                tracing::debug!(segment = id, bytes = info.len, "compacted segment deleted");
            }
            Err(e) => {
                // Kept (its bytes still count); a log that cannot delete cannot keep its bound.
                self.st.segs.insert(id, info);
                self.fatal(&StoreError::io("delete segment", e));
                return;
            }
        }
        // The removal is durable before anything relies on it: a deleted segment that came back
        // after a crash could bring back records that later segments no longer supersede.
        if let Err(e) = segment::sync_dir(&*self.store.fs) {
            self.fatal(&e);
        }
    }
}

/// Whether segment `seg` (of `len` bytes) holds only records whose deletion cannot bring back a
/// record of an older segment: no remove, no not-in-flight record, no chunk that answers an
/// in-flight request. Unreadable or damaged: `false` (kept).
fn only_superseded(seg: &Segment, len: u64) -> bool {
    let mut buf = vec![0u8; len as usize];
    if seg.read_at(&mut buf, 0).is_err() {
        return false;
    }
    let mut pos = record::SEGMENT_HEADER;
    while pos < buf.len() {
        let Ok((ty, body, n)) = record::read_frame(&buf[pos..]) else {
            return false;
        };
        let keeps_dead = match ty {
            Type::Remove | Type::InflightDone => true,
            Type::Chunk => record::parse_chunk(body).is_none_or(|c| !c.completes.is_empty()),
            _ => false,
        };
        if keeps_dead {
            return false;
        }
        pos += n;
    }
    true
}

/// The session an op belongs to (`None`: the log's own).
fn op_session(op: &Op) -> Option<SessionId> {
    match op {
        Op::Remove { session, .. } => Some(*session),
        _ => op.log().map(|l| l.id),
    }
}

/// Payload bytes an op carries.
fn op_bytes(op: &Op) -> usize {
    match op {
        Op::Append { evs, .. } | Op::End { evs, .. } => evs.iter().map(|e| e.payload.len()).sum(),
        _ => 0,
    }
}

/// The meta record of `log`, as it is now.
fn meta_item(log: &Arc<SessionLog>) -> Item {
    let json = log.meta_json();
    let mut b = Vec::new();
    record::meta(&mut b, &log.id, &json);
    Item {
        bytes: b,
        effect: Effect::Meta(log.clone()),
    }
}

/// Adds an end (its events, the marker among them, then its meta) to the turn.
fn plan_end(t: &mut Turn, pe: PendingEnd, ack: Option<Ack>) {
    // A client may be told of the end (and of the answers in it, e.g. a task's final result):
    // durable in either durability mode (§10b).
    t.sync = true;
    let now = tokio::time::Instant::now();
    let (first, epoch) = pe.log.assign(pe.evs.len() as u64);
    for (i, (stream, kind, payload, completes)) in pe.evs.clone().into_iter().enumerate() {
        let ahead = (1, payload.len());
        let seq = (first + i as u64, epoch);
        t.add_event(&pe.log, seq, stream, kind, payload, now, completes, ahead);
    }
    t.post.push(meta_item(&pe.log));
    t.ends.push((pe, ack));
}
