//! [5] The event log: every upstream event is appended here, with a stable id, before any client
//! sees it (I1), and every client stream is a cursor reading it.
//!
//! One writer ([`writer`], on its own thread) owns all writes: appends arrive over a bounded channel, are written
//! as one sled batch, flushed once (`durability = "fsync"`), and only then published — the per-session
//! head moves (a `watch`), recent events enter a small in-memory window, and readers wake. Readers
//! never see an unpublished event, so replay and live delivery are the same read.
//!
//! On open, [`Log::open`] recovers: it finds every session's retained range, seals the epoch after an
//! unclean stop of a relaxed-mode run (I2; whatever mode this run has), and ends every session that
//! was live — its upstream session died with the old process — answering its in-flight requests
//! with -32091 (I6).

pub mod cursor;
pub mod key;
mod writer;

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, oneshot, watch};

use crate::config::{Durability, LogConfig};
use crate::error::{Error, Result};
use crate::jsonrpc;
use crate::metrics::{EndReason, Facade, Metrics};
use cursor::{EpochRange, LogRanges, SessionId};

/// Events kept in memory per session for live readers; older reads go to sled.
const WINDOW_EVENTS: usize = 128;
/// Payload bytes kept in memory per session window.
const WINDOW_BYTES: usize = 512 * 1024;

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
    /// The in-flight request (canonical id) this event answers, removed in the same write.
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

/// Session state as persisted in the `sessions` tree.
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
}

/// Seconds since the Unix epoch (persisted timestamps).
pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

struct LogState {
    ranges: LogRanges,
    /// Highest seq handed out by the writer (≥ head; > head while a batch is being written).
    assigned: u64,
    bytes: u64,
    window: VecDeque<Arc<Event>>,
    window_bytes: usize,
    meta: SessionMeta,
}

/// One session's log: its ranges, its in-memory window and the head readers wait on.
pub struct SessionLog {
    /// The session.
    pub id: SessionId,
    state: Mutex<LogState>,
    head_tx: watch::Sender<u64>,
}

impl std::fmt::Debug for SessionLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionLog").field("id", &self.id).finish()
    }
}

impl SessionLog {
    fn new(id: SessionId, ranges: LogRanges, bytes: u64, meta: SessionMeta) -> Self {
        let (head_tx, _) = watch::channel(ranges.head);
        Self {
            id,
            state: Mutex::new(LogState {
                assigned: ranges.head,
                ranges,
                bytes,
                window: VecDeque::new(),
                window_bytes: 0,
                meta,
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

    /// A receiver that changes whenever the head moves.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.head_tx.subscribe()
    }

    /// Why the session ended (set when the end begins; the end marker follows in the log).
    pub fn ended(&self) -> Option<EndReason> {
        self.lock().meta.ended
    }

    /// Unix seconds of the end, once ended.
    pub fn ended_unix(&self) -> Option<u64> {
        self.lock().meta.ended_unix
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
}

pub(crate) enum Op {
    Append {
        log: Arc<SessionLog>,
        ev: NewEvent,
        done: Option<oneshot::Sender<Result<u64>>>,
    },
    AppendMany {
        log: Arc<SessionLog>,
        evs: Vec<NewEvent>,
    },
    Inflight {
        session: SessionId,
        request_id: String,
        stream: StreamTag,
        registered_at: u64,
        done: oneshot::Sender<Result<u64>>,
    },
    InflightDone {
        session: SessionId,
        request_id: String,
        done: oneshot::Sender<Result<u64>>,
    },
    Meta {
        log: Arc<SessionLog>,
        done: Option<oneshot::Sender<Result<u64>>>,
    },
    Remove {
        session: SessionId,
        done: oneshot::Sender<Result<u64>>,
    },
    Flush {
        done: oneshot::Sender<Result<u64>>,
    },
}

/// The sled trees and settings shared by the handle and the writer task.
pub(crate) struct Store {
    db: sled::Db,
    events: sled::Tree,
    sessions: sled::Tree,
    inflight: sled::Tree,
    meta: sled::Tree,
    durability: Durability,
    max_events: u64,
    max_bytes: u64,
    total_bytes: AtomicU64,
    metrics: Metrics,
    /// Unit tests: turns still to fail (see the writer).
    #[cfg(test)]
    fail_turns: std::sync::atomic::AtomicU32,
}

/// What recovery found and did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Recovery {
    /// The previous stop was clean.
    pub clean: bool,
    /// Sessions found in the log.
    pub sessions: usize,
    /// Sessions that were live and were ended now.
    pub ended_live: usize,
    /// In-flight requests answered with -32091.
    pub aborted: usize,
    /// Sessions whose epoch was sealed.
    pub sealed: usize,
    /// Events found.
    pub events: u64,
}

/// The log handle. Cheap to share behind an `Arc`.
pub struct Log {
    store: Arc<Store>,
    tx: mpsc::Sender<Op>,
    logs: Mutex<HashMap<SessionId, Arc<SessionLog>>>,
    writer: Mutex<Option<writer::Handle>>,
}

impl std::fmt::Debug for Log {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Log").finish_non_exhaustive()
    }
}

fn store_err(e: sled::Error) -> Error {
    Error::Store(e.to_string())
}

/// How long [`open_db`] waits for another holder of the data directory to let go.
const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// Opens sled on `cfg.dir`. The directory's lock file is released only when the last thread of the
/// previous holder in this process lets go of it — sled's own pool can outlive a handle by a few
/// milliseconds after a flush — and a replacement process may start while the old one is still
/// exiting; so a held lock is retried for up to [`LOCK_WAIT`] before it is an error.
async fn open_db(cfg: &LogConfig) -> Result<sled::Db> {
    let deadline = tokio::time::Instant::now() + LOCK_WAIT;
    loop {
        let opened = sled::Config::new()
            .path(&cfg.dir)
            .cache_capacity(64 * 1024 * 1024)
            .flush_every_ms(Some(200))
            .open();
        match opened {
            Err(sled::Error::Io(e))
                if e.to_string().contains("could not acquire lock")
                    && tokio::time::Instant::now() < deadline =>
            {
                tracing::debug!(dir = %cfg.dir.display(), "log directory is locked; retrying");
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
            other => return other.map_err(store_err),
        }
    }
}

impl Log {
    /// Opens (or creates) the log in `cfg.dir`, spawns the writer and recovers.
    ///
    /// # Errors
    /// [`Error::Store`] when the directory cannot be opened or read.
    pub async fn open(cfg: &LogConfig, metrics: Metrics) -> Result<(Arc<Log>, Recovery)> {
        let db = open_db(cfg).await?;
        let store = Arc::new(Store {
            events: db.open_tree("events").map_err(store_err)?,
            sessions: db.open_tree("sessions").map_err(store_err)?,
            inflight: db.open_tree("inflight").map_err(store_err)?,
            meta: db.open_tree("meta").map_err(store_err)?,
            db,
            durability: cfg.durability,
            max_events: cfg.max_events_per_session,
            max_bytes: cfg.max_bytes_per_session,
            total_bytes: AtomicU64::new(0),
            metrics,
            #[cfg(test)]
            fail_turns: std::sync::atomic::AtomicU32::new(0),
        });
        store.metrics.log_max_bytes.set(cfg.max_total_bytes as i64);
        let clean = store
            .meta
            .get("clean")
            .map_err(store_err)?
            .is_some_and(|v| &v[..] == b"1");
        // Whether the tail of the log can be proven is decided by the durability of the runs that
        // wrote it, not of this one: a relaxed run that stopped uncleanly may have shown clients
        // events that never reached the disk, even when this run is `fsync`. The key says
        // `relaxed` from before a relaxed run's first write until an fsync run has finished its
        // recovery (seals included, all flushed), so a crash during that recovery still seals
        // next time. A data dir without the key counts as relaxed: sealing costs one epoch number.
        let prev_relaxed = store
            .meta
            .get("durability")
            .map_err(store_err)?
            .map_or(true, |v| &v[..] != b"fsync");
        store.meta.insert("clean", b"0").map_err(store_err)?;
        if cfg.durability == Durability::Relaxed {
            store
                .meta
                .insert("durability", b"relaxed")
                .map_err(store_err)?;
        }
        store.db.flush_async().await.map_err(store_err)?;

        let (tx, rx) = mpsc::channel(4096);
        let writer = writer::spawn(store.clone(), rx)?;
        let log = Arc::new(Log {
            store,
            tx,
            logs: Mutex::new(HashMap::new()),
            writer: Mutex::new(Some(writer)),
        });
        let rec = log.recover(clean, prev_relaxed).await?;
        if cfg.durability == Durability::Fsync {
            // Recovery's writes went through the fsync writer: the tail is provable from now on.
            log.store
                .meta
                .insert("durability", b"fsync")
                .map_err(store_err)?;
            log.store.db.flush_async().await.map_err(store_err)?;
        }
        Ok((log, rec))
    }

    async fn recover(&self, clean: bool, prev_relaxed: bool) -> Result<Recovery> {
        let st = &self.store;
        let mut rec = Recovery {
            clean,
            ..Default::default()
        };
        let mut live = Vec::new();
        for item in st.sessions.iter() {
            let (k, v) = item.map_err(store_err)?;
            let Ok(bytes16) = <[u8; 16]>::try_from(&k[..]) else {
                continue;
            };
            let id = SessionId(bytes16);
            let Ok(mut meta) = serde_json::from_slice::<SessionMeta>(&v) else {
                tracing::warn!(session = %id, "unreadable session metadata; skipping");
                continue;
            };
            // Chunk headers carry their event count and payload bytes: no record is decoded.
            let (mut oldest, mut head, mut bytes, mut count) = (0u64, 0u64, 0u64, 0u64);
            for item in st.events.scan_prefix(id.0) {
                let (k, v) = item.map_err(store_err)?;
                let (Some((_, first)), Some((n, b))) =
                    (key::parse_event_key(&k), key::chunk_info(&v))
                else {
                    return Err(Error::Store(format!("corrupt chunk in session {id}")));
                };
                if oldest == 0 {
                    oldest = first;
                }
                head = first + n - 1;
                bytes += b;
                count += n;
            }
            if oldest == 0 {
                // Nothing retained: the next event is seq 1 of the first epoch, or after the meta's last.
                head = meta
                    .epochs
                    .last()
                    .map(|e| e.last.unwrap_or(e.first.saturating_sub(1)))
                    .unwrap_or(0);
                oldest = head + 1;
            }
            rec.events += count;
            if meta.epochs.is_empty() {
                meta.epochs.push(EpochRange {
                    epoch: 1,
                    first: 1,
                    last: None,
                });
            }
            let mut sealed = false;
            if !clean && (prev_relaxed || st.durability == Durability::Relaxed) {
                // We cannot prove the tail clients saw is on disk: seal the epoch at the durable head.
                let last = meta.epochs.last_mut().expect("one epoch");
                if last.last.is_none() {
                    last.last = Some(head);
                    let next = last.epoch + 1;
                    meta.epochs.push(EpochRange {
                        epoch: next,
                        first: head + 1,
                        last: None,
                    });
                    sealed = true;
                    rec.sealed += 1;
                }
            }
            let ranges = LogRanges {
                epochs: meta.epochs.clone(),
                oldest,
                head,
            };
            let was_live = meta.ended.is_none();
            let sl = Arc::new(SessionLog::new(id, ranges, bytes, meta));
            st.total_bytes.fetch_add(bytes, Ordering::Relaxed);
            self.lock_logs().insert(id, sl.clone());
            rec.sessions += 1;
            if sealed {
                self.write_meta(&sl).await?;
            }
            if was_live {
                live.push(sl);
            }
        }
        st.metrics
            .log_bytes
            .set(st.total_bytes.load(Ordering::Relaxed) as i64);
        for sl in live {
            // The upstream session died with the previous process: answer what was in flight,
            // then end the session so late resumers get a complete, explicit history.
            let mut aborts = Vec::new();
            for item in st.inflight.scan_prefix(sl.id.0) {
                let (k, v) = item.map_err(store_err)?;
                let Some((stream, registered_at)) = key::parse_inflight_value(&v) else {
                    continue;
                };
                let req_id = String::from_utf8_lossy(&k[16..]).into_owned();
                if self.answered_after(&sl, &req_id, registered_at)? {
                    st.inflight.remove(&k).map_err(store_err)?;
                } else {
                    aborts.push((req_id, stream));
                }
            }
            rec.aborted += aborts.len();
            rec.ended_live += 1;
            self.end_session(&sl, EndReason::UpstreamLost, aborts)
                .await?;
        }
        Ok(rec)
    }

    /// Was a response to `req_id` logged after seq `after`? (Recovery only.)
    fn answered_after(&self, sl: &SessionLog, req_id: &str, after: u64) -> Result<bool> {
        let head = sl.head();
        let mut cur = after;
        while cur < head {
            let evs = self.read_store(sl, cur, 1024)?;
            let Some(last) = evs.last() else { break };
            cur = last.seq;
            for ev in evs {
                if let Some(p) = jsonrpc::peek(&ev.payload) {
                    if p.is_response && p.id.as_deref() == Some(req_id) {
                        return Ok(true);
                    }
                }
            }
        }
        Ok(false)
    }

    fn lock_logs(&self) -> std::sync::MutexGuard<'_, HashMap<SessionId, Arc<SessionLog>>> {
        // Short map operations only, never held across an await.
        self.logs.lock().unwrap_or_else(|e| e.into_inner())
    }

    async fn send(&self, op: Op) -> Result<()> {
        self.tx
            .send(op)
            .await
            .map_err(|_| Error::Store("log writer stopped".into()))
    }

    async fn wait(rx: oneshot::Receiver<Result<u64>>) -> Result<u64> {
        rx.await
            .unwrap_or_else(|_| Err(Error::Store("log writer stopped".into())))
    }

    /// Creates the log of a new session (metadata written before it returns).
    ///
    /// # Errors
    /// [`Error::Store`] when the metadata cannot be written.
    pub async fn create(
        &self,
        id: SessionId,
        facade: Facade,
        protocol_version: Option<String>,
    ) -> Result<Arc<SessionLog>> {
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
        };
        let ranges = LogRanges {
            epochs: meta.epochs.clone(),
            oldest: 1,
            head: 0,
        };
        let sl = Arc::new(SessionLog::new(id, ranges, 0, meta));
        self.write_meta(&sl).await?;
        self.lock_logs().insert(id, sl.clone());
        Ok(sl)
    }

    async fn write_meta(&self, sl: &Arc<SessionLog>) -> Result<u64> {
        let (done, rx) = oneshot::channel();
        self.send(Op::Meta {
            log: sl.clone(),
            done: Some(done),
        })
        .await?;
        Self::wait(rx).await
    }

    /// The log of session `id`, live or ended, if this proxy holds it.
    pub fn get(&self, id: &SessionId) -> Option<Arc<SessionLog>> {
        self.lock_logs().get(id).cloned()
    }

    /// Every session log held.
    pub fn all(&self) -> Vec<Arc<SessionLog>> {
        self.lock_logs().values().cloned().collect()
    }

    /// Queues an append without waiting for it: events of one session keep their order because one
    /// writer serves one channel. Waits only when the channel is full (back-pressure).
    ///
    /// # Errors
    /// [`Error::Store`] when the writer has stopped.
    pub async fn append_nowait(&self, sl: &Arc<SessionLog>, ev: NewEvent) -> Result<()> {
        self.send(Op::Append {
            log: sl.clone(),
            ev,
            done: None,
        })
        .await
    }

    /// Queues consecutive events of one session as one op (see [`Log::append_nowait`]).
    ///
    /// # Errors
    /// [`Error::Store`] when the writer has stopped.
    pub async fn append_many_nowait(&self, sl: &Arc<SessionLog>, evs: Vec<NewEvent>) -> Result<()> {
        self.send(Op::AppendMany {
            log: sl.clone(),
            evs,
        })
        .await
    }

    /// Appends and waits until the event is durable and published; returns its seq.
    ///
    /// # Errors
    /// [`Error::Store`] when the write failed.
    pub async fn append(&self, sl: &Arc<SessionLog>, ev: NewEvent) -> Result<u64> {
        let (done, rx) = oneshot::channel();
        self.send(Op::Append {
            log: sl.clone(),
            ev,
            done: Some(done),
        })
        .await?;
        Self::wait(rx).await
    }

    /// Records a request as in flight (durably, before it is forwarded), so that a restart can
    /// still answer it.
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
        let registered_at = sl.lock().assigned;
        self.send(Op::Inflight {
            session: sl.id,
            request_id: request_id.to_string(),
            stream,
            registered_at,
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
            session: sl.id,
            request_id: request_id.to_string(),
            done,
        })
        .await?;
        Self::wait(rx).await.map(|_| ())
    }

    /// Ends a session in the log: answers each `(request id, stream)` in `aborts` with a -32091
    /// error event on its stream, appends the end marker and persists the ended state. Idempotent.
    ///
    /// # Errors
    /// [`Error::Store`] when the writes failed.
    pub async fn end_session(
        &self,
        sl: &Arc<SessionLog>,
        reason: EndReason,
        aborts: Vec<(String, StreamTag)>,
    ) -> Result<()> {
        {
            let mut st = sl.lock();
            if st.meta.ended.is_some() {
                return Ok(());
            }
            st.meta.ended = Some(reason);
            st.meta.ended_unix = Some(unix_now());
        }
        let metrics = &self.store.metrics;
        for (req_id, stream) in aborts {
            let body = jsonrpc::error_response(
                &req_id,
                jsonrpc::INFLIGHT_ABORTED,
                &format!(
                    "request aborted: upstream session ended ({})",
                    reason.as_str()
                ),
                serde_json::json!({"reason": reason.as_str(), "session_id": sl.id.to_string()}),
            );
            let kind = if stream.is_post() {
                Kind::Final
            } else {
                Kind::Message
            };
            let mut ev = NewEvent::new(stream, kind, Bytes::from(body));
            ev.completes = Some(req_id.clone());
            self.append_nowait(sl, ev).await?;
            metrics.inflight_aborted.inc();
            tracing::warn!(session = %sl.id, request_id = %req_id, reason = reason.as_str(), "in-flight request aborted");
        }
        let marker = serde_json::json!({"reason": reason.as_str()}).to_string();
        self.append(
            sl,
            NewEvent::new(StreamTag::LEGACY, Kind::End, Bytes::from(marker)),
        )
        .await?;
        self.write_meta(sl).await?;
        metrics.session_ended(reason);
        tracing::info!(session = %sl.id, reason = reason.as_str(), "session ended");
        Ok(())
    }

    /// Deletes a session's log entirely (retention expired or evicted for space).
    ///
    /// # Errors
    /// [`Error::Store`] when the delete failed.
    pub async fn remove(&self, id: &SessionId) -> Result<()> {
        let (done, rx) = oneshot::channel();
        self.send(Op::Remove { session: *id, done }).await?;
        Self::wait(rx).await?;
        self.lock_logs().remove(id);
        Ok(())
    }

    /// Up to `max` consecutive events after seq `after`, in order: from the in-memory window when
    /// it covers them, else from sled. The first event returned may be later than `after + 1` only
    /// when the events in between were trimmed — the caller must treat that as a gap.
    ///
    /// # Errors
    /// [`Error::Store`] when sled fails to read.
    pub fn read_after(&self, sl: &SessionLog, after: u64, max: usize) -> Result<Vec<Arc<Event>>> {
        {
            let st = sl.lock();
            let head = st.ranges.head;
            if after >= head {
                return Ok(Vec::new());
            }
            if let Some(front) = st.window.front() {
                if front.seq <= after + 1 {
                    let skip = (after + 1 - front.seq) as usize;
                    return Ok(st.window.iter().skip(skip).take(max).cloned().collect());
                }
            }
        }
        self.read_store(sl, after, max)
    }

    fn read_store(&self, sl: &SessionLog, after: u64, max: usize) -> Result<Vec<Arc<Event>>> {
        // A sled scan is not a snapshot: a trim applied meanwhile deletes chunks ahead of it (and
        // rewrites the one holding the new oldest event under a new key), and the scan may jump
        // over them. Such a hole is retried while the wanted events are still retained; once they
        // are trimmed, the read stops at the hole and the caller sees the gap (a stream closes,
        // its resume is refused as trimmed).
        for _ in 0..3 {
            let (out, hole) = self.scan(sl, after, max)?;
            let trimmed = after + 1 < sl.lock().ranges.oldest;
            if !hole || trimmed {
                return Ok(out);
            }
        }
        Ok(self.scan(sl, after, max)?.0)
    }

    /// One scan of up to `max` consecutive events after `after`, stopping at the first hole
    /// after the first event. Returns whether it saw a hole, including a first event later than
    /// `after + 1` (which is then the first event returned).
    fn scan(&self, sl: &SessionLog, after: u64, max: usize) -> Result<(Vec<Arc<Event>>, bool)> {
        let head = sl.head();
        let want = after + 1;
        // The chunk holding `want` is the last key at or before it, if that key is this session's.
        let start = match self
            .store
            .events
            .range(..=key::event_key(&sl.id, want))
            .next_back()
        {
            Some(item) => match key::parse_event_key(&item.map_err(store_err)?.0) {
                Some((s, first)) if s == sl.id => first,
                _ => want,
            },
            None => want,
        };
        let mut out: Vec<Arc<Event>> = Vec::new();
        let mut hole = false;
        let range = key::event_key(&sl.id, start)..=key::event_key(&sl.id, head);
        for item in self.store.events.range(range) {
            let (k, v) = item.map_err(store_err)?;
            let Some((_, first)) = key::parse_event_key(&k) else {
                continue;
            };
            let Some(evs) = key::decode_chunk(first, Bytes::from_owner(v)) else {
                return Err(Error::Store(format!("corrupt chunk {}:{first}", sl.id)));
            };
            for ev in evs {
                if ev.seq < want {
                    continue;
                }
                if ev.seq > head || out.len() >= max {
                    return Ok((out, hole));
                }
                match out.last() {
                    Some(p) if ev.seq != p.seq + 1 => return Ok((out, true)),
                    None if ev.seq != want => hole = true,
                    _ => {}
                }
                out.push(Arc::new(ev));
            }
        }
        Ok((out, hole))
    }

    /// The event at `seq`, if retained.
    ///
    /// # Errors
    /// [`Error::Store`] when sled fails to read.
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
    /// flight: registered and not yet answered by a written event. An answer removes its entry in
    /// the same write that stores it, so after a [`Log::flush`] every request missing here has its
    /// answer published.
    ///
    /// # Errors
    /// [`Error::Store`] when sled fails to read.
    pub fn inflight_on(&self, session: &SessionId, stream: StreamTag) -> Result<Vec<String>> {
        let mut out = Vec::new();
        for item in self.store.inflight.scan_prefix(session.0) {
            let (k, v) = item.map_err(store_err)?;
            if key::parse_inflight_value(&v).is_some_and(|(s, _)| s == stream) {
                out.push(String::from_utf8_lossy(&k[16..]).into_owned());
            }
        }
        Ok(out)
    }

    /// Payload bytes retained, all sessions.
    pub fn total_bytes(&self) -> u64 {
        self.store.total_bytes.load(Ordering::Relaxed)
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

    /// Drains the writer, flushes, and marks the log clean so the next start keeps the epoch.
    /// Call once, after every producer has stopped.
    ///
    /// # Errors
    /// [`Error::Store`] when the final flush failed.
    pub async fn close(&self) -> Result<()> {
        self.flush().await?;
        self.store.meta.insert("clean", b"1").map_err(store_err)?;
        self.store.db.flush_async().await.map_err(store_err)?;
        let writer = self.writer.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(w) = writer {
            // Everything is flushed; stop the writer and wait, so the store is released when
            // the last handle goes (a restart in the same process can reopen it).
            w.stop().await;
        }
        Ok(())
    }
}

#[cfg(test)]
impl Log {
    /// Makes the writer's next `n` turns fail after applying their writes.
    pub(crate) fn fail_next_turns(&self, n: u32) {
        self.store.fail_turns.store(n, Ordering::SeqCst);
    }

    /// Simulates a crash: the writer stops without marking the log clean.
    pub(crate) async fn crash(self: Arc<Self>) {
        let writer = self.writer.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(w) = writer {
            w.stop().await;
        }
    }
}

#[cfg(test)]
mod tests;
