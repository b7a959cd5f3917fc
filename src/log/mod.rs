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
//! The events and their metas are in [`event`]; the state this handle shares with the writer
//! (the store, each session's log, the ops queued for the writer) in `store.rs`.
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
mod doorbell;
pub mod event;
pub mod image;
pub mod io;
mod pagecache;
pub mod record;
pub mod redis;
pub mod segment;
mod shared;
#[cfg(test)]
mod sim;
mod store;
mod writer;

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use tokio::sync::{mpsc, oneshot, watch};

use crate::config::LogConfig;
use crate::domain::{EndReason, Facade};
use crate::error::{Error, Result, StoreError};
use crate::identity::{Identity, Keyring};
use crate::metrics::Metrics;
use cursor::SessionId;
#[cfg(test)]
pub(crate) use event::FIXED_UNIX;
pub use event::{unix_now, Event, Kind, NewEvent, SessionMeta, StreamTag};
use image::Image;
use segment::DirLock;
use store::*;
pub(crate) use store::{new_session_log, read_after, Op, Store, READ_BYTES};
pub use store::{Health, Interrupted, Recovery, SessionLog};

/// Largest event payload the log takes: its record must stay within what a read accepts
/// ([`record::MAX_RECORD`]), with room for the chunk's framing.
pub const MAX_EVENT_BYTES: usize = record::MAX_RECORD - 1024 * 1024;

/// How long [`Log::open`] waits for another holder of the data directory to let go.
const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// The log handle. Cheap to share behind an `Arc`.
pub struct Log {
    store: Arc<Store>,
    tx: mpsc::Sender<Op>,
    writer: Mutex<Option<writer::Handle>>,
    /// `log.backend = "redis"`: the shared log and its writer task (the local writer is `None`).
    shared: Option<(Arc<shared::SharedLog>, SharedTask, tokio::task::AbortHandle)>,
    failures: Mutex<Option<mpsc::UnboundedReceiver<SessionId>>>,
}

/// The shared log's writer task, taken when the log closes.
type SharedTask = Mutex<Option<tokio::task::JoinHandle<()>>>;

/// What the shared log (`log.backend = "redis"`) needs besides `[log]`.
#[derive(Clone, Debug)]
pub struct SharedSettings {
    /// `cluster.replica_id`.
    pub replica_id: String,
    /// Seconds an ended session's log is kept (`sessions.retain_ended_secs`, or longer for
    /// tasks): Redis expires its keys then.
    pub retain_secs: u64,
    /// `cluster.lease_ms`.
    pub lease_ms: u64,
    /// Where other replicas forward this one's writes (registered with its lease; empty: none).
    pub advertise: String,
    /// The secret shared by the replicas (`auth.key_file`): every replica must key identities
    /// alike to check a session's binding. `None`: the data directory's own.
    pub keys: Option<Keyring>,
}

impl std::fmt::Debug for Log {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Log").finish_non_exhaustive()
    }
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
        Self::open_keyed(cfg, None, metrics).await
    }

    /// [`Log::open`] with the secret that keys identities and log tags given (`auth.key_file`,
    /// shared by the replicas) instead of the data directory's own.
    ///
    /// # Errors
    /// As [`Log::open`].
    pub async fn open_keyed(
        cfg: &LogConfig,
        keys: Option<Keyring>,
        metrics: Metrics,
    ) -> Result<(Arc<Log>, Recovery, Vec<Interrupted>)> {
        let dir = cfg.dir.clone();
        io::OsDir::create_private(&dir).map_err(|e| StoreError::io("create data directory", e))?;
        if segment::has_sled_files(&dir) {
            return Err(StoreError::OldFormat(dir.display().to_string()).into());
        }
        let lock = take_lock(&dir).await?;
        let keys = match keys {
            Some(k) => k,
            None => Keyring::load_or_create(&dir)?,
        };
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
            shared: None,
            failures: Mutex::new(Some(failures_rx)),
        });
        // The open record (with this run's durability) and the sealed epochs are durable before
        // any event of this run is written: a later recovery knows which run wrote the tail.
        log.flush().await?;
        Ok((log, rec, interrupted))
    }

    /// Opens the log on Redis (`log.backend = "redis"`): connects (a single server or a
    /// Cluster), checks that the server keeps `durability = "fsync"` when asked for it, and ends
    /// the sessions a previous run of this replica left live (a -32091 for each request they had
    /// in flight, then their end markers, written by one fenced takeover each).
    ///
    /// # Errors
    /// [`Error::Store`]: [`StoreError::Durability`] naming the server setting that breaks the
    /// durability asked for; [`StoreError::Shared`] when Redis cannot be reached.
    pub async fn open_shared(
        cfg: &LogConfig,
        settings: &SharedSettings,
        metrics: Metrics,
    ) -> Result<(Arc<Log>, Recovery, Vec<Interrupted>)> {
        let dir = cfg.dir.clone();
        io::OsDir::create_private(&dir).map_err(|e| StoreError::io("create data directory", e))?;
        let keys = match &settings.keys {
            Some(k) => k.clone(),
            None => Keyring::load_or_create(&dir)?,
        };
        let mut sh = redis::Shared::connect(&cfg.redis.url, &cfg.redis.key_prefix)
            .await
            .map_err(|e| StoreError::Shared(e.to_string()))?;
        sh.time_with(metrics.redis_seconds.clone());
        if cfg.durability == crate::config::Durability::Fsync {
            let refusal = sh
                .fsync_refusal()
                .await
                .map_err(|e| StoreError::Shared(e.to_string()))?;
            if let Some(why) = refusal {
                return Err(StoreError::Durability(why).into());
            }
        }
        let mut inc = [0u8; 8];
        getrandom::getrandom(&mut inc).expect("OS random source");
        // One pub/sub connection per process wakes the mirrors' followers.
        let doorbell = doorbell::Doorbell::start(
            &cfg.redis.url,
            sh.is_cluster(),
            metrics.redis_doorbell_up.clone(),
        )
        .map_err(|e| StoreError::Shared(e.to_string()))?;
        let sh = Arc::new(shared::SharedLog {
            shared: sh,
            owner: format!("{}/{:016x}", settings.replica_id, u64::from_le_bytes(inc)),
            replica: settings.replica_id.clone(),
            retain_secs: settings.retain_secs,
            lease: std::time::Duration::from_millis(settings.lease_ms),
            advertise: settings.advertise.clone(),
            doorbell,
        });
        sh.renew(true)
            .await
            .map_err(|e| StoreError::Shared(e.to_string()))?;
        let (ended, aborted) = sh
            .end_previous()
            .await
            .map_err(|e| StoreError::Shared(e.to_string()))?;
        for _ in 0..ended {
            metrics.session_ended(EndReason::UpstreamLost);
        }
        metrics.inflight_aborted.inc_by(aborted as u64);
        let (failures_tx, failures_rx) = mpsc::unbounded_channel();
        let fs: Arc<dyn io::Dir> = Arc::new(io::OsDir::new(&dir));
        let store = Arc::new(Store::new(cfg, metrics, fs, keys, None, failures_tx));
        let (tx, rx) = mpsc::channel(4096);
        let task = tokio::spawn(shared::run(store.clone(), sh.clone(), rx));
        let reaper = tokio::spawn(shared::reap(store.clone(), sh.clone()));
        let rec = Recovery {
            clean: ended == 0,
            sessions: ended,
            live: ended,
            inflight: aborted,
            ..Recovery::default()
        };
        let log = Arc::new(Log {
            store,
            tx,
            writer: Mutex::new(None),
            shared: Some((sh, Mutex::new(Some(task)), reaper.abort_handle())),
            failures: Mutex::new(Some(failures_rx)),
        });
        Ok((log, rec, Vec::new()))
    }

    /// Which backend holds the log.
    pub fn is_shared(&self) -> bool {
        self.shared.is_some()
    }

    /// The log of session `id`, live or ended, if this proxy holds it or (shared log) the shared
    /// log has it.
    ///
    /// # Errors
    /// [`Error::Store`] when the shared log cannot be read (then nobody can tell whether the
    /// session exists: the caller answers 503, never 404).
    pub async fn lookup(&self, id: &SessionId) -> Result<Option<Arc<SessionLog>>> {
        if let Some(sl) = self.get(id) {
            return Ok(Some(sl));
        }
        let Some((sh, _, _)) = self.shared.as_ref() else {
            return Ok(None);
        };
        sh.lookup(&self.store, id).await
    }

    /// Shared log: brings a log this replica holds up to date with the shared record when the
    /// record has moved past it (another replica took the session over, or Redis lost it): the
    /// log adopts the record, and the session ends here if it was live. `false` when nothing
    /// changed (the local log, or a record that agrees).
    ///
    /// # Errors
    /// [`Error::Store`] when the shared log cannot be read.
    pub async fn refresh(&self, sl: &Arc<SessionLog>) -> Result<bool> {
        let Some((sh, _, _)) = self.shared.as_ref() else {
            return Ok(false);
        };
        sh.refresh(&self.store, sl).await
    }

    /// Shared log: where to forward a request for session `id` — the internal address of the
    /// replica that owns it, when it is live there and not here. `None` otherwise (the local
    /// log, an unknown or ended session, one this replica owns, an owner without an address).
    pub async fn owner_addr(&self, id: &SessionId) -> Option<String> {
        let (sh, _, _) = self.shared.as_ref()?;
        sh.owner_addr(id).await
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

    /// An empty batch to fill for [`Log::append_many_nowait`]: one the writer handed back when
    /// it can, so that a busy upstream does not allocate one per read.
    pub fn batch(&self) -> Vec<NewEvent> {
        self.store.batch()
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
    pub async fn read_after(&self, sl: &SessionLog, after: u64, max: usize) -> Result<Vec<Event>> {
        match &self.shared {
            Some((sh, _, _)) => shared::read_after(sh, sl, after, max, u64::MAX).await,
            None => read_after(sl, after, max),
        }
    }

    /// [`Log::read_after`] for a client stream: from the segments or the shared log, no more
    /// chunks or entries once [`store::READ_BYTES`] of payload are read (a stream of large
    /// events, or one whose client stopped reading, holds about that much, not `max` events of
    /// any size); fewer events than `max` are then no sign of the head. The in-memory window is
    /// read as asked (its events are shared, not copied).
    ///
    /// # Errors
    /// As [`Log::read_after`].
    pub async fn read_batch(&self, sl: &SessionLog, after: u64, max: usize) -> Result<Vec<Event>> {
        match &self.shared {
            Some((sh, _, _)) => shared::read_after(sh, sl, after, max, store::READ_BYTES).await,
            None => store::read_after_within(sl, after, max, store::READ_BYTES),
        }
    }

    /// Like [`Log::read_after`], without waiting: the local log reads its segments; the shared
    /// log serves only what its in-memory window holds (the tasks' few events; tasks are read by
    /// the replica that runs them).
    ///
    /// # Errors
    /// [`Error::Store`] when a segment cannot be read.
    pub fn read_held(&self, sl: &SessionLog, after: u64, max: usize) -> Result<Vec<Event>> {
        match &self.shared {
            Some(_) => Ok(store::window_read(sl, after, max).unwrap_or_default()),
            None => read_after(sl, after, max),
        }
    }

    /// The event at `seq`, if retained.
    ///
    /// # Errors
    /// [`Error::Store`] when a segment cannot be read.
    pub async fn event_at(&self, sl: &SessionLog, seq: u64) -> Result<Option<Event>> {
        if seq == 0 {
            return Ok(None);
        }
        Ok(self
            .read_after(sl, seq - 1, 1)
            .await?
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

    /// `log.max_total_bytes`.
    pub fn max_total_bytes(&self) -> u64 {
        self.store.max_total
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
        if let Some((_, task, reaper)) = &self.shared {
            reaper.abort();
            let t = task.lock().unwrap_or_else(|e| e.into_inner()).take();
            if let Some(t) = t {
                let _ = t.await;
            }
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

#[cfg(test)]
mod adversary18;
