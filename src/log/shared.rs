//! The log on Redis (`log.backend = "redis"`, design.md §13): the owner's writer and the reads
//! beyond the in-memory window, over the fenced scripts of [`super::redis`].
//!
//! The writer takes the same ops as the local writer ([`super::store::Op`]), from the same
//! bounded channel, and publishes into the same [`SessionLog`]s (window, head watch, ranges), so
//! the registry, the streams and the resume checks do not know which backend is under them. A
//! turn takes every op queued, groups them by session (order kept within a session) and runs the
//! sessions' scripts concurrently on one multiplexed connection (pipelined); a session's
//! consecutive appends are one `append` script (group commit). An op is acknowledged, and its
//! events published, only once Redis answered the script: with `appendfsync always` that is
//! after Redis's own fsync (the durability gate at open checks it).
//!
//! **Fenced writes.** A script refused by the fence (another owner or epoch, the record lost or
//! rewound) ends the session on this replica: it is counted (`mcp_resume_fenced_total`), its
//! producers learn it as a storage failure, and its log *adopts* what Redis holds — readers
//! then read the record's history (another replica's takeover: every event, the -32091s and the
//! end), or end when the record is gone (resumes get 404).
//!
//! **Unknown outcomes.** A write whose reply is lost (Redis unreachable) may or may not have
//! run. An append is first sent again, same head and batch token, until Redis answers or most of
//! the lease has passed ([`settle`]): a Redis restart stalls the session rather than ending it.
//! If Redis stays away, the session takes no more appends (its producers are told, as for a
//! failed disk write), and its end is retried until Redis answers. The batch token of the last
//! write tells the retry whether the lost write landed: if it did, the end goes after it and
//! readers read the landed events from Redis; never under the same ids again.
//!
//! **Restart.** Sessions live under this replica's name (`cluster.replica_id`) in a per-replica
//! set; the owner's fence carries the replica and a random incarnation. A start ends every live
//! session a previous incarnation of this replica left (a takeover: the epoch sealed at the head,
//! a -32091 for each request in flight, the end marker), so late resumers get the whole history.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::mpsc;

use super::cursor::SessionId;
use super::doorbell::Doorbell;
use super::event::{unix_now, Event, Kind, NewEvent, SessionMeta};
use super::redis::{Fence, Record, Refused, Shared, SharedError};
use super::store::{window_read, Ack, Op, SessionLog, Store};
use crate::domain::EndReason;
use crate::error::{Error, Result, StoreError};

/// Ops one turn takes at most.
const MAX_OPS: usize = 1024;
/// Event bytes one turn takes at most (past it the turn is written and the next takes the rest):
/// a turn is one transaction on Redis, which must come back well within its response timeout.
const MAX_TURN_BYTES: usize = 1 << 20;
/// How often an end that Redis did not take is retried.
const RETRY: Duration = Duration::from_millis(250);

/// What the backend needs besides the store: the server, who this replica is, how long an
/// ended session's keys live.
#[derive(Debug)]
pub(crate) struct SharedLog {
    pub(crate) shared: Shared,
    /// `<replica>/<incarnation>`: the fence's owner.
    pub(crate) owner: String,
    /// `cluster.replica_id`.
    pub(crate) replica: String,
    /// Seconds an ended session's keys are kept (then Redis expires them).
    pub(crate) retain_secs: u64,
    /// `cluster.lease_ms`.
    pub(crate) lease: Duration,
    /// Where other replicas forward writes to this one (`cluster.advertise_addr`).
    pub(crate) advertise: String,
    /// Wakes the followers of mirrored sessions when their owner writes.
    pub(crate) doorbell: Doorbell,
}

fn shared_err(e: SharedError) -> StoreError {
    StoreError::Shared(e.to_string())
}

impl SharedLog {
    fn fence(&self, sl: &SessionLog) -> Fence {
        Fence {
            owner: self.owner.clone(),
            epoch: sl.ranges().current_epoch(),
        }
    }

    /// Renews this replica's lease (`first`: registers it). `Ok(false)`: another replica found
    /// it lapsed and reaped it — its sessions are taken over, it must stop writing.
    pub(crate) async fn renew(&self, first: bool) -> std::result::Result<bool, SharedError> {
        let ms = u64::try_from(self.lease.as_millis()).unwrap_or(u64::MAX);
        Ok(self
            .shared
            .heartbeat(&self.owner, ms, &self.advertise, first)
            .await?
            .is_some())
    }

    /// Takes over every live session `node` (`<replica>/<incarnation>`, its lease lapsed) owns:
    /// one fenced takeover each (the epoch sealed at the head, a -32091 for each request in
    /// flight, the end), then forgets the node. Another replica doing the same at once takes
    /// each session at most once between them (the takeover compares owner and epoch).
    async fn take_over(&self, store: &Store, node: &str) -> std::result::Result<(), SharedError> {
        let replica = node.rsplit_once('/').map_or(node, |(r, _)| r);
        for id in self.shared.owned(replica).await? {
            let Some((rec, _)) = self.shared.read(&id, u64::MAX, 1).await? else {
                self.shared.disown(replica, &id).await?;
                continue;
            };
            if rec.fence.owner != node {
                continue;
            }
            if rec.ended.is_none() {
                let reason = EndReason::UpstreamLost.as_str();
                let msg =
                    format!("request aborted: the replica serving the session was lost ({reason})");
                match self
                    .shared
                    .takeover(&id, &rec.fence, &self.owner, reason, &msg, self.retain_secs)
                    .await?
                {
                    Ok(t) => {
                        let m = &store.metrics;
                        m.takeovers.inc();
                        m.session_ended(EndReason::UpstreamLost);
                        m.inflight_aborted.inc_by(t.aborted as u64);
                        tracing::warn!(session = %store.keys.tag(&id.0), aborted = t.aborted, "took over a session of a replica whose lease lapsed");
                    }
                    Err(r) => {
                        tracing::debug!(refused = ?r, "a session of a lapsed replica was taken over elsewhere");
                    }
                }
            }
            self.shared.disown(replica, &id).await?;
        }
        if self.shared.claim(node).await? {
            tracing::warn!(
                replica = replica,
                "a replica's lease lapsed: its sessions were taken over"
            );
        }
        Ok(())
    }

    /// The internal address of the replica that owns `id`, when it is live there, not here.
    pub(crate) async fn owner_addr(&self, id: &SessionId) -> Option<String> {
        let (rec, _) = self.shared.read(id, u64::MAX, 1).await.ok()??;
        if rec.ended.is_some() || rec.fence.owner == self.owner {
            return None;
        }
        self.shared
            .node_addr(&rec.fence.owner)
            .await
            .ok()
            .flatten()
            .filter(|a| !a.is_empty())
    }

    /// Ends the sessions a previous incarnation of this replica left live; returns how many, and
    /// the requests they had in flight (answered -32091 by the takeover).
    pub(crate) async fn end_previous(&self) -> std::result::Result<(usize, usize), SharedError> {
        let lapsed = self.shared.lapsed().await?;
        let (mut ended, mut aborted) = (0, 0);
        for id in self.shared.owned(&self.replica).await? {
            let Some((rec, _)) = self.shared.read(&id, u64::MAX, 1).await? else {
                self.shared.disown(&self.replica, &id).await?;
                continue;
            };
            if rec.ended.is_some() {
                self.shared.disown(&self.replica, &id).await?;
                continue;
            }
            let owner = &rec.fence.owner;
            // A twin running under the same replica_id, or the previous run while its lease
            // has not lapsed yet: the lease decides (once it lapses, the reaper of any replica,
            // this one included, takes the session over).
            if *owner == self.owner || (self.shared.listed(owner).await? && !lapsed.contains(owner))
            {
                continue;
            }
            let reason = EndReason::UpstreamLost.as_str();
            let msg = format!("request aborted: upstream session ended ({reason})");
            match self
                .shared
                .takeover(&id, &rec.fence, &self.owner, reason, &msg, self.retain_secs)
                .await?
            {
                Ok(t) => {
                    ended += 1;
                    aborted += t.aborted;
                }
                Err(r) => {
                    tracing::warn!(refused = ?r, "a session of this replica's previous run was ended elsewhere meanwhile")
                }
            }
            self.shared.disown(&self.replica, &id).await?;
        }
        Ok((ended, aborted))
    }

    /// The log of a session this process does not hold, as Redis has it (a *mirror*, read-only:
    /// its events are read from Redis): an ended session's history (after a restart of its
    /// owner, or its takeover), or a session live on another replica, whose head a follower
    /// task keeps up with the record until it ends or the last reader lets go. `None` when
    /// Redis has no record of it.
    pub(crate) async fn lookup(
        self: &Arc<Self>,
        store: &Store,
        id: &SessionId,
    ) -> Result<Option<Arc<SessionLog>>> {
        let err = |e| Error::Store(shared_err(e));
        // The requests in flight first, the record and its events after: an answer logged in
        // between is then seen as an event (the resume check counts each request once).
        let inflight = self.shared.inflight(id).await.map_err(err)?;
        let Some((rec, _)) = self.shared.read(id, u64::MAX, 1).await.map_err(err)? else {
            return Ok(None);
        };
        let Some(sl) = mirror(store, id, &rec) else {
            return Ok(None);
        };
        if rec.ended.is_none() {
            for (r, t) in inflight {
                sl.set_inflight(r, t);
            }
            tokio::spawn(follow(self.clone(), Arc::downgrade(&sl)));
        }
        Ok(Some(sl))
    }
}

impl SharedLog {
    /// See [`super::Log::refresh`].
    pub(crate) async fn refresh(&self, store: &Store, sl: &Arc<SessionLog>) -> Result<bool> {
        let rec = self
            .shared
            .read(&sl.id, u64::MAX, 1)
            .await
            .map_err(|e| Error::Store(shared_err(e)))?;
        let local = sl.ranges();
        match rec {
            None => {
                if sl.removed() {
                    return Ok(false);
                }
                store.lock_logs().remove(&sl.id);
                lost(store, sl);
                sl.clear_removed();
                sl.wake();
                Ok(true)
            }
            Some((rec, _)) => {
                if rec.fence.owner == self.owner
                    && rec.ranges.current_epoch() == local.current_epoch()
                    && rec.ended.is_none()
                    && rec.ranges.head > local.head
                {
                    // Our own write landed and is not published here yet (its reply is on its
                    // way, or the writer is settling an unknown outcome): a cursor past our head
                    // may be one another replica served from Redis. Not a gap: ask again shortly.
                    return Err(Error::Store(StoreError::Unavailable));
                }
                let moved = rec.ranges.current_epoch() != local.current_epoch()
                    || rec.ranges.head < local.head
                    || (rec.ended.is_some() && !sl.end_published());
                if !moved {
                    return Ok(false);
                }
                if rec.fence.owner != self.owner
                    || rec.ranges.current_epoch() != local.current_epoch()
                {
                    // Not ours any more (taken over, or rewound and sealed): nothing more is
                    // written here, and the session ends on this replica.
                    lost(store, sl);
                }
                sl.adopt(&rec.ranges, rec.ended.is_some());
                Ok(true)
            }
        }
    }
}

/// Keeps a mirror's head, in-flight requests and end in step with Redis, until the session ends,
/// its record is gone, or no reader holds the mirror any more. It re-reads the record when the
/// owner rings the session's doorbell (see [`super::doorbell`]), else at the safety poll (every
/// [`super::doorbell::FAST_POLL`] while the doorbell is not connected).
async fn follow(sh: Arc<SharedLog>, sl: std::sync::Weak<SessionLog>) {
    let Some(id) = sl.upgrade().map(|l| l.id) else {
        return;
    };
    // Subscribed before the first read below: a write after that read rings.
    let ring = sh.doorbell.ring(sh.shared.doorbell(&id)).await;
    loop {
        let Some(log) = sl.upgrade() else { return };
        let inflight = sh.shared.inflight(&log.id).await;
        match sh.shared.read(&log.id, u64::MAX, 1).await {
            Ok(Some((rec, _))) => {
                let ended = rec.ended.is_some();
                if rec.ranges.head != log.head() || ended {
                    log.adopt(&rec.ranges, ended);
                    if let Ok(inf) = inflight {
                        for (r, t) in inf {
                            log.set_inflight(r, t);
                        }
                    }
                }
                if ended {
                    return;
                }
            }
            Ok(None) => {
                log.clear_removed();
                log.wake();
                return;
            }
            Err(e) => {
                tracing::warn!(session = %log.tag, error = %e, "following a session on the shared log failed; retrying");
            }
        }
        drop(log);
        // The doorbell, or the safety poll (fast while the doorbell is down).
        let _ = tokio::time::timeout(ring.poll(), ring.rung()).await;
    }
}

/// A read-only log of a session from its record (its events are read from Redis).
fn mirror(store: &Store, id: &SessionId, rec: &Record) -> Option<Arc<SessionLog>> {
    let mut meta: SessionMeta = serde_json::from_str(&rec.meta).ok()?;
    if let Some(reason) = rec.ended.as_deref() {
        meta.ended = Some(
            serde_json::from_value(serde_json::Value::String(reason.to_string()))
                .unwrap_or(EndReason::UpstreamLost),
        );
        meta.ended_unix.get_or_insert_with(unix_now);
    }
    meta.epochs = rec.ranges.epochs.clone();
    Some(Arc::new(SessionLog::new(
        *id,
        store.keys.tag(&id.0),
        rec.ranges.clone(),
        meta,
    )))
}

/// Up to `max` events after `after`: from the window when it covers them, else from Redis (see
/// [`super::Log::read_after`]).
pub(crate) async fn read_after(
    sh: &SharedLog,
    sl: &SessionLog,
    after: u64,
    max: usize,
    max_bytes: u64,
) -> Result<Vec<Event>> {
    if let Some(evs) = window_read(sl, after, max) {
        return Ok(evs);
    }
    match sh
        .shared
        .read_within(&sl.id, after, max, max_bytes, &sl.shared_read)
        .await
    {
        Ok(Some((_, evs))) => {
            let head = sl.head();
            Ok(evs
                .into_iter()
                .filter(|e| e.seq > after && e.seq <= head)
                .take(max)
                .collect())
        }
        Ok(None) => {
            // Redis lost the record (a restart without persistence, `FLUSHALL`): nothing of this
            // session can be served any more; readers end and resumes get 404.
            tracing::error!(session = %sl.tag, "the shared log has no record of this session any more");
            sl.clear_removed();
            sl.wake();
            Ok(Vec::new())
        }
        Err(e) => Err(Error::Store(shared_err(e))),
    }
}

/// An end Redis has not taken yet.
struct PendingEnd {
    log: Arc<SessionLog>,
    reason: EndReason,
    evs: Vec<NewEvent>,
}

/// Per-session writer state.
#[derive(Default)]
struct Written {
    /// Token of the last write whose outcome is unknown (its reply was lost).
    unknown: Option<String>,
    /// A -32091 for each request that write answered (requests the registry no longer holds
    /// in flight): the end writes them if the write did not land.
    in_unknown: Vec<NewEvent>,
    /// A -32091 for each request answered by appends refused after it (the session takes no
    /// more appends): the end writes them, whatever became of the unknown write.
    refused: Vec<NewEvent>,
}

impl Written {
    fn keep(&self) -> bool {
        self.unknown.is_some() || !self.refused.is_empty()
    }
}

/// A copy of `e` (its payload shared).
fn copy(e: &NewEvent) -> NewEvent {
    let mut c = NewEvent::new(e.stream, e.kind, e.payload.clone());
    c.completes = e.completes.clone();
    c.received = e.received;
    c
}

/// For each answer among `evs` (an event that completes a request) whose write was lost with
/// the events before it: a -32091 for its request, on its stream. The answer itself is not
/// written again — the client would take it as complete while events the upstream sent before
/// it were lost — the loss is told instead (I6).
fn answers(evs: &[NewEvent]) -> Vec<NewEvent> {
    evs.iter()
        .filter_map(|e| {
            let req = e.completes.as_ref()?;
            let reason = EndReason::StoreError.as_str();
            let body = crate::jsonrpc::error_response(
                req,
                crate::jsonrpc::INFLIGHT_ABORTED,
                &format!("request aborted: events of the session were lost ({reason})"),
                serde_json::json!({"reason": reason}),
            );
            let kind = if e.stream.is_post() {
                Kind::Final
            } else {
                Kind::Message
            };
            let mut a = NewEvent::new(e.stream, kind, Bytes::from(body));
            a.completes = Some(req.clone());
            Some(a)
        })
        .collect()
}

/// Every `lease / 2`, takes over the sessions of the replicas whose lease lapsed.
pub(crate) async fn reap(store: Arc<Store>, sh: Arc<SharedLog>) {
    let mut tick = tokio::time::interval(sh.lease / 2);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let nodes = match sh.shared.lapsed().await {
            Ok(n) => n,
            Err(e) => {
                tracing::warn!(error = %e, "listing lapsed replicas failed");
                continue;
            }
        };
        for node in nodes.iter().filter(|n| **n != sh.owner) {
            if let Err(e) = sh.take_over(&store, node).await {
                tracing::warn!(error = %e, "taking over a lapsed replica's sessions failed; retrying");
            }
        }
    }
}

/// Runs the writer until every sender is gone or the log is closed. It renews this replica's
/// lease between its turns (the loop that does the work: a writer stuck or paused past the
/// lease loses it); a lease found lost or reaped fails the log for good (the process exits and
/// restarts as a new incarnation), and nothing more is written.
pub(crate) async fn run(store: Arc<Store>, sh: Arc<SharedLog>, mut rx: mpsc::Receiver<Op>) {
    let mut pending: Vec<PendingEnd> = Vec::new();
    let mut written: BTreeMap<SessionId, Written> = BTreeMap::new();
    let mut tokens = 0u64;
    let mut closed = false;
    let mut beat = tokio::time::interval(sh.lease / 3);
    beat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut renewed = tokio::time::Instant::now();
    let mut lease_lost = false;
    loop {
        let mut ops = Vec::new();
        tokio::select! {
            op = rx.recv() => match op {
                Some(op) => ops.push(op),
                None => return,
            },
            _ = beat.tick(), if !lease_lost => {
                let sent = tokio::time::Instant::now();
                match sh.renew(false).await {
                    Ok(true) => renewed = sent,
                    Ok(false) => {
                        tracing::error!("this replica's lease was reaped by another replica (paused or cut off past cluster.lease_ms): its sessions were taken over; stopping");
                        lease_lost = true;
                    }
                    Err(e) => tracing::warn!(error = %e, "renewing this replica's lease failed"),
                }
                if !lease_lost && renewed.elapsed() >= sh.lease {
                    tracing::error!("this replica's lease lapsed (cluster.lease_ms without a renewal): another replica may take its sessions over; stopping");
                    lease_lost = true;
                }
                if lease_lost {
                    store.set_health(super::store::Health::Failed);
                }
                if pending.is_empty() {
                    continue;
                }
            },
            _ = tokio::time::sleep(RETRY), if !pending.is_empty() => {}
        }
        let mut bytes: usize = ops.iter().map(op_bytes).sum();
        while ops.len() < MAX_OPS && bytes < MAX_TURN_BYTES {
            match rx.try_recv() {
                Ok(op) => {
                    bytes += op_bytes(&op);
                    ops.push(op);
                }
                Err(_) => break,
            }
        }
        if lease_lost || renewed.elapsed() >= sh.lease {
            // Not the owner any more, or not sure of it: nothing is written. The sessions end
            // here (their producers are told); whoever takes them over writes their ends.
            for pe in pending.drain(..) {
                lost(&store, &pe.log);
            }
            let mut close = false;
            for op in ops {
                if let Some(log) = op.log() {
                    lost(&store, log);
                }
                close |= matches!(op, Op::Close { .. });
                reject(op, StoreError::Fenced);
            }
            if !lease_lost {
                lease_lost = true;
                tracing::error!("this replica's lease lapsed before a write: stopping");
                store.set_health(super::store::Health::Failed);
            }
            if close {
                return;
            }
            continue;
        }
        let mut turn = Turn::default();
        for pe in std::mem::take(&mut pending) {
            turn.session(pe.log.id).push(Step::End(pe, None));
        }
        for op in ops {
            if closed {
                reject(op, StoreError::Stopped);
                continue;
            }
            turn.plan(op, &mut closed);
        }
        let mut work = Vec::with_capacity(turn.sessions.len());
        for (id, steps) in std::mem::take(&mut turn.sessions) {
            let base = tokens;
            tokens += steps.len() as u64 + 1;
            work.push((id, steps, base));
        }
        // An append whose outcome is unknown (Redis restarting, a connection cut) is settled
        // by sending it again until this instant: well before the lease lapses.
        let settle_by = renewed + sh.lease * 3 / 4;
        let mut firsts = first_appends(&store, &sh, &work).await.into_iter();
        let mut jobs = tokio::task::JoinSet::new();
        for (id, steps, base) in work {
            let w = written.remove(&id).unwrap_or_default();
            let first = firsts.next().flatten();
            let (store, sh) = (store.clone(), sh.clone());
            jobs.spawn(async move {
                run_session(&store, &sh, id, steps, w, base, first, settle_by).await
            });
        }
        while let Some(r) = jobs.join_next().await {
            if let Ok((id, w, ends)) = r {
                if w.keep() {
                    written.insert(id, w);
                }
                pending.extend(ends);
            }
        }
        if pending.is_empty() {
            store.set_health(super::store::Health::Ok);
        } else {
            store.set_health(super::store::Health::Degraded);
        }
        for a in turn.acks {
            let _ = a.send(Ok(0));
        }
        if closed {
            if !pending.is_empty() {
                // Redis did not take them: this replica's lease lapses once it is gone, and the
                // replica that takes its sessions over (or its own next start) writes their ends.
                tracing::error!(
                    sessions = pending.len(),
                    "stopping with session ends the shared log did not take"
                );
            }
            return;
        }
    }
}

/// The event bytes an op carries.
fn op_bytes(op: &Op) -> usize {
    match op {
        Op::Append { evs, .. } | Op::End { evs, .. } => evs.iter().map(|e| e.payload.len()).sum(),
        _ => 0,
    }
}

/// A session's work in one turn, in order.
enum Step {
    Create(Arc<SessionLog>, Ack),
    Append(Arc<SessionLog>, Vec<NewEvent>, Vec<(Ack, usize)>),
    Inflight(Arc<SessionLog>, String, super::event::StreamTag, Ack),
    InflightDone(Arc<SessionLog>, String, Ack),
    End(PendingEnd, Option<Ack>),
    Remove(SessionId, Ack),
}

#[derive(Default)]
struct Turn {
    sessions: BTreeMap<SessionId, Vec<Step>>,
    /// Flushes, make-rooms and the close: acknowledged once every session's work of the turn is
    /// answered.
    acks: Vec<Ack>,
}

impl Turn {
    fn session(&mut self, id: SessionId) -> &mut Vec<Step> {
        self.sessions.entry(id).or_default()
    }

    fn plan(&mut self, op: Op, closed: &mut bool) {
        match op {
            Op::Create { log, done } => self.session(log.id).push(Step::Create(log, done)),
            Op::Append { log, evs, done, .. } => {
                // Decided here, in queue order: an append queued before its session's end is
                // written before it; one queued after is refused.
                // (A session whose earlier write was lost is refused later, in its turn, where
                // the answers among the refused events are kept for its end.)
                if !log.takes_appends() && !log.append_lost() {
                    tracing::debug!(session = %log.tag, events = evs.len(), "append after the session's end refused");
                    if let Some(d) = done {
                        let _ = d.send(Err(StoreError::SessionEnded));
                    }
                    return;
                }
                let steps = self.session(log.id);
                // Consecutive appends of one session are one script (group commit).
                if let Some(Step::Append(_, all, acks)) = steps.last_mut() {
                    let at = all.len() + evs.len();
                    all.extend(evs);
                    if let Some(d) = done {
                        acks.push((d, at));
                    }
                } else {
                    let n = evs.len();
                    steps.push(Step::Append(
                        log,
                        evs,
                        done.map(|d| vec![(d, n)]).unwrap_or_default(),
                    ));
                }
            }
            Op::Inflight {
                log,
                request_id,
                stream,
                done,
            } => self
                .session(log.id)
                .push(Step::Inflight(log, request_id, stream, done)),
            Op::InflightDone {
                log,
                request_id,
                done,
            } => self
                .session(log.id)
                .push(Step::InflightDone(log, request_id, done)),
            Op::End {
                log,
                reason,
                evs,
                done,
                ..
            } => {
                if !log.begin_end(reason) {
                    // Idempotent: already ended or on its way.
                    let _ = done.send(Ok(0));
                    return;
                }
                self.session(log.id)
                    .push(Step::End(PendingEnd { log, reason, evs }, Some(done)));
            }
            Op::Remove { session, done } => self.session(session).push(Step::Remove(session, done)),
            // Redis's memory is bounded by the session retention and the keys' expiry; there is
            // nothing to evict here.
            Op::MakeRoom { done, .. } | Op::Flush { done } => self.acks.push(done),
            Op::Close { done } => {
                *closed = true;
                self.acks.push(done);
            }
        }
    }
}

fn reject(op: Op, e: StoreError) {
    if let Some(d) = op.into_ack() {
        let _ = d.send(Err(e));
    }
}

/// The events of a write, with their seqs and epoch, as readers will see them.
fn events(evs: &[NewEvent], first: u64, epoch: u32) -> Vec<Event> {
    evs.iter()
        .enumerate()
        .map(|(i, e)| Event {
            seq: first + i as u64,
            epoch,
            stream: e.stream,
            kind: e.kind,
            payload: e.payload.clone(),
        })
        .collect()
}

/// The end marker's payload, byte for byte what the `end` script writes.
fn marker(reason: EndReason) -> Bytes {
    Bytes::from(serde_json::json!({"reason": reason.as_str()}).to_string())
}

/// A session's first append of a turn, written with the other sessions' (one transaction on a
/// single Redis, see [`super::redis::Shared::append_turn`]): the head and epoch it was written
/// at, and its outcome.
struct Written1 {
    head: u64,
    epoch: u32,
    r: super::redis::Written<u64>,
}

/// The batch token of a session's `n`th step in a turn whose tokens start after `base`.
fn batch_token(sh: &SharedLog, base: u64, n: u64) -> String {
    format!("{}:{}", sh.owner, base + n)
}

/// Writes the turn's first steps that are appends (of sessions still taking them) together, one
/// entry per session of `work` (`None`: its first step is not such an append, or this is a Redis
/// Cluster, where [`run_session`] writes it as before).
async fn first_appends(
    store: &Store,
    sh: &SharedLog,
    work: &[(SessionId, Vec<Step>, u64)],
) -> Vec<Option<Written1>> {
    if sh.shared.is_cluster() {
        return Vec::new();
    }
    // (index in work, head, epoch, fence, batch) of each append written here.
    let mut picked = Vec::new();
    for (i, (_, steps, base)) in work.iter().enumerate() {
        if let Some(Step::Append(log, _, _)) = steps.first() {
            if !log.append_lost() {
                let epoch = log.ranges().current_epoch();
                picked.push((
                    i,
                    log.head(),
                    epoch,
                    sh.fence(log),
                    batch_token(sh, *base, 1),
                ));
            }
        }
    }
    let mut out: Vec<Option<Written1>> = work.iter().map(|_| None).collect();
    if picked.is_empty() {
        return out;
    }
    let reqs: Vec<super::redis::Append<'_>> = picked
        .iter()
        .map(|(i, head, _, fence, batch)| {
            let (id, steps, _) = &work[*i];
            let Some(Step::Append(_, evs, _)) = steps.first() else {
                unreachable!("picked above")
            };
            super::redis::Append {
                id,
                fence,
                expected_head: *head,
                batch,
                evs,
                maxlen: Some(store.max_events),
            }
        })
        .collect();
    let results = sh.shared.append_turn(&reqs).await;
    for ((i, head, epoch, _, _), r) in picked.into_iter().zip(results) {
        out[i] = Some(Written1 { head, epoch, r });
    }
    out
}

/// Runs one session's steps of a turn, in order; returns its state and the ends still owed.
/// `first`: the outcome of its first step, an append already written with the turn's others.
/// `settle_by`: until when an append whose outcome is unknown is sent again (see [`settle`]).
#[allow(clippy::too_many_arguments)]
async fn run_session(
    store: &Store,
    sh: &SharedLog,
    id: SessionId,
    steps: Vec<Step>,
    mut w: Written,
    base: u64,
    mut first: Option<Written1>,
    settle_by: tokio::time::Instant,
) -> (SessionId, Written, Vec<PendingEnd>) {
    let mut owed = Vec::new();
    for (n, step) in steps.into_iter().enumerate() {
        let batch = batch_token(sh, base, n as u64 + 1);
        match step {
            Step::Create(log, done) => {
                let r = async {
                    sh.shared.own(&sh.replica, &log.id).await?;
                    let meta = String::from_utf8(log.meta_json()).expect("JSON is UTF-8");
                    sh.shared.create(&log.id, &sh.owner, &meta).await
                }
                .await;
                let _ = done.send(match r {
                    Ok(true) => {
                        store.lock_logs().entry(log.id).or_insert(log);
                        Ok(0)
                    }
                    Ok(false) => Err(StoreError::Shared("session id already taken".into())),
                    Err(e) => Err(shared_err(e)),
                });
            }
            Step::Append(log, evs, acks) => {
                let fail = |e: StoreError, acks: Vec<(Ack, usize)>| {
                    for (d, _) in acks {
                        let _ = d.send(Err(e.clone()));
                    }
                };
                let (head, epoch, r) = match first.take() {
                    Some(Written1 { head, epoch, r }) => (head, epoch, r),
                    None if log.append_lost() => {
                        // An earlier write was lost or fenced: nothing more is appended. Answers
                        // among these events go with the session's end (their requests left the
                        // registry's in-flight table when they were answered).
                        w.refused.extend(answers(&evs));
                        fail(StoreError::SessionEnded, acks);
                        continue;
                    }
                    None => {
                        let head = log.head();
                        let epoch = log.ranges().current_epoch();
                        let r = sh
                            .shared
                            .append(
                                &log.id,
                                &sh.fence(&log),
                                head,
                                &batch,
                                &evs,
                                Some(store.max_events),
                            )
                            .await;
                        (head, epoch, r)
                    }
                };
                let r = match r {
                    Err(e) => settle(store, sh, &log, head, &batch, &evs, e, settle_by).await,
                    done => done,
                };
                match r {
                    Ok(Ok(new_head)) if new_head == head + evs.len() as u64 => {
                        let published = events(&evs, head + 1, epoch);
                        publish(store, &log, &published, &evs);
                        for (d, at) in acks {
                            let _ = d.send(Ok(head + at as u64));
                        }
                    }
                    Ok(Ok(other)) => {
                        // Cannot happen (the script appends exactly what it is given): stop.
                        tracing::error!(session = %log.tag, head, other, "the shared log's head moved unexpectedly");
                        lost(store, &log);
                        fail(StoreError::Fenced, acks);
                    }
                    Ok(Err(refused)) => {
                        fenced(store, sh, &log, &refused).await;
                        fail(StoreError::Fenced, acks);
                    }
                    Err(e) => {
                        tracing::error!(session = %log.tag, error = %e, "an append to the shared log has an unknown outcome that Redis did not settle in time; the session takes no more appends");
                        w.unknown = Some(batch);
                        w.in_unknown = answers(&evs);
                        lost(store, &log);
                        fail(shared_err(e), acks);
                    }
                }
            }
            Step::Inflight(log, request_id, stream, done) => {
                let r = sh
                    .shared
                    .inflight_add(&log.id, &sh.fence(&log), &request_id, stream)
                    .await;
                let _ = done.send(match r {
                    Ok(Ok(_)) => {
                        log.set_inflight(request_id, stream);
                        Ok(0)
                    }
                    Ok(Err(refused)) => {
                        fenced(store, sh, &log, &refused).await;
                        Err(StoreError::Fenced)
                    }
                    Err(e) => {
                        store.metrics.store_errors.inc();
                        Err(shared_err(e))
                    }
                });
            }
            Step::InflightDone(log, request_id, done) => {
                let r = sh
                    .shared
                    .inflight_done(&log.id, &sh.fence(&log), &request_id)
                    .await;
                let _ = done.send(match r {
                    Ok(Ok(())) => {
                        log.clear_inflight(&request_id);
                        Ok(0)
                    }
                    Ok(Err(refused)) => {
                        fenced(store, sh, &log, &refused).await;
                        Err(StoreError::Fenced)
                    }
                    Err(e) => {
                        store.metrics.store_errors.inc();
                        Err(shared_err(e))
                    }
                });
            }
            Step::End(pe, done) => match end(store, sh, &pe, &mut w).await {
                Ok(()) => {
                    if let Some(d) = done {
                        let _ = d.send(Ok(0));
                    }
                }
                Err(e) => {
                    if let Some(d) = done {
                        let _ = d.send(Err(e));
                    }
                    owed.push(pe);
                }
            },
            Step::Remove(id, done) => {
                let log = store.lock_logs().remove(&id);
                if let Some(l) = log {
                    l.clear_removed();
                    l.wake();
                }
                let _ = done.send(Ok(0));
            }
        }
    }
    (id, w, owed)
}

/// An append whose outcome is unknown because Redis was out of reach or loading (its reply was
/// lost, or it was never run: [`SharedError::transient`]; a script's own error is not retried),
/// sent again with the same expected head and batch token every [`RETRY`]
/// until Redis answers or `settle_by` passes. The fence makes the resend a compare-and-append:
/// it runs only if the first did not land; if the first did, the refusal names this batch's
/// token at exactly the head it set, which is read as that write's success. Anything else
/// (fenced, ended, another head) is the answer as it stands. So a Redis restart shorter than
/// most of the lease stalls the session's appends and loses nothing, rather than ending it;
/// past `settle_by` the last error stands (the session ends as an unknown outcome).
#[allow(clippy::too_many_arguments)]
async fn settle(
    store: &Store,
    sh: &SharedLog,
    log: &SessionLog,
    head: u64,
    batch: &str,
    evs: &[NewEvent],
    first: SharedError,
    settle_by: tokio::time::Instant,
) -> super::redis::Written<u64> {
    store.metrics.store_errors.inc();
    if !first.transient() {
        return Err(first);
    }
    tracing::warn!(session = %log.tag, error = %first, "an append to the shared log has an unknown outcome; sending it again");
    let mut last = first;
    let want = head + evs.len() as u64;
    while last.transient() && tokio::time::Instant::now() + RETRY < settle_by {
        tokio::time::sleep(RETRY).await;
        // Bounded by `settle_by` too: a connection that keeps failing may hold one call for its
        // own reconnect backoff, and the writer's lease must not lapse under it.
        let fence = sh.fence(log);
        let send = sh
            .shared
            .append(&log.id, &fence, head, batch, evs, Some(store.max_events));
        let Ok(r) = tokio::time::timeout_at(settle_by, send).await else {
            break;
        };
        match r {
            Err(e) => last = e,
            Ok(Err(Refused::Head {
                head: theirs,
                batch: b,
            })) if theirs == want && b == batch => {
                tracing::warn!(session = %log.tag, "an append whose reply was lost had landed");
                return Ok(Ok(want));
            }
            answered => {
                tracing::info!(session = %log.tag, "an append with an unknown outcome was settled");
                return answered;
            }
        }
    }
    Err(last)
}

/// Writes an end (its answers, then the marker); `Err` when Redis must be asked again.
async fn end(
    store: &Store,
    sh: &SharedLog,
    pe: &PendingEnd,
    w: &mut Written,
) -> std::result::Result<(), StoreError> {
    let log = &pe.log;
    let mut head = log.head();
    let epoch = log.ranges().current_epoch();
    // The answers the session owes besides the registry's -32091s: those of a write whose
    // reply was lost (unless it landed) and those of appends refused after it.
    let mut landed = false;
    for _ in 0..2 {
        let mut evs = Vec::new();
        if !landed {
            evs.extend(w.in_unknown.iter().map(copy));
        }
        evs.extend(w.refused.iter().map(copy));
        evs.extend(pe.evs.iter().map(copy));
        let r = sh
            .shared
            .end(
                &log.id,
                &sh.fence(log),
                head,
                pe.reason.as_str(),
                &evs,
                sh.retain_secs,
            )
            .await;
        match r {
            Ok(Ok(new_head)) => {
                let pe_evs = &evs;
                w.unknown = None;
                w.in_unknown.clear();
                w.refused.clear();
                if let Err(e) = sh.shared.disown(&sh.replica, &log.id).await {
                    tracing::warn!(session = %log.tag, error = %e, "forgetting an ended session in this replica's set failed");
                }
                if new_head != head + pe_evs.len() as u64 + 1 {
                    tracing::error!(session = %log.tag, head, new_head, "the shared log's head moved unexpectedly at the end");
                }
                let mut published = events(pe_evs, head + 1, epoch);
                published.push(Event {
                    seq: head + pe_evs.len() as u64 + 1,
                    epoch,
                    stream: super::event::StreamTag::LEGACY,
                    kind: Kind::End,
                    payload: marker(pe.reason),
                });
                publish(store, log, &published, pe_evs);
                return Ok(());
            }
            Ok(Err(Refused::Head {
                head: theirs,
                batch: b,
            })) if w.unknown.as_deref() == Some(b.as_str()) => {
                // Our write whose reply was lost did land: its events are in Redis, not in the
                // window. Readers read them from Redis from now on; the end goes after them.
                tracing::warn!(session = %log.tag, "a write whose reply was lost had landed; its events are served from the shared log");
                log.forget_window(theirs, store.max_events);
                head = theirs;
                w.unknown = None;
                w.in_unknown.clear();
                landed = true;
            }
            Ok(Err(refused)) => {
                fenced(store, sh, log, &refused).await;
                return Ok(());
            }
            Err(e) => {
                store.metrics.store_errors.inc();
                tracing::error!(session = %log.tag, error = %e, "the shared log did not take a session's end; retrying");
                return Err(shared_err(e));
            }
        }
    }
    Err(StoreError::Shared("the end could not be placed".into()))
}

/// Makes a written batch visible: window, head, in-flight, metrics; wakes readers.
fn publish(store: &Store, log: &SessionLog, published: &[Event], evs: &[NewEvent]) {
    for e in evs {
        if let Some(c) = &e.completes {
            log.clear_inflight(c);
        }
    }
    log.publish_events(published, store.max_events);
    store.metrics.logged.inc_by(published.len() as u64);
    // One clock read and one flush into the shared histogram per write, not per event.
    let now = tokio::time::Instant::now();
    let append = store.metrics.append_seconds.local();
    for e in evs {
        append.observe(now.saturating_duration_since(e.received).as_secs_f64());
    }
    append.flush();
    log.wake();
}

/// The session's events could not be logged: it takes no more appends and the registry ends it.
fn lost(store: &Store, log: &SessionLog) {
    log.roll_back();
    if log.mark_failed() {
        let _ = store.failures.send(log.id);
    }
}

/// A fenced write: counted, logged, the session ended here, its log adopting what Redis holds.
async fn fenced(store: &Store, sh: &SharedLog, log: &SessionLog, refused: &Refused) {
    store.metrics.fenced.inc();
    tracing::error!(session = %log.tag, refused = ?refused, "a write to the shared log was fenced: this replica no longer owns the session; ending it here");
    lost(store, log);
    if let Refused::Head { .. } = refused {
        // Redis lost or rewound what this owner wrote (the head is neither ours nor our lost
        // write's): the ids past what survived were delivered with other bytes than any new
        // write would carry, so they must never be issued again. Seal the epoch at what
        // survived and end the session in the next one (a -32091 for each request Redis still
        // holds in flight): cursors past the survivors get `cursor_ahead`.
        let reason = EndReason::StoreError.as_str();
        let msg = format!("request aborted: the shared log lost events of this session ({reason})");
        match sh
            .shared
            .takeover(
                &log.id,
                &sh.fence(log),
                &sh.owner,
                reason,
                &msg,
                sh.retain_secs,
            )
            .await
        {
            Ok(Ok(t)) => {
                store.metrics.inflight_aborted.inc_by(t.aborted as u64);
                tracing::error!(session = %log.tag, epoch = t.epoch, "the shared log was rewound under this session: its epoch is sealed at what survived and the session ended");
            }
            Ok(Err(r)) => {
                tracing::warn!(session = %log.tag, refused = ?r, "sealing a rewound session was refused")
            }
            Err(e) => {
                tracing::error!(session = %log.tag, error = %e, "sealing a rewound session failed")
            }
        }
    }
    let _ = sh.shared.disown(&sh.replica, &log.id).await;
    match sh.shared.read(&log.id, u64::MAX, 1).await {
        Ok(Some((rec, _))) => log.adopt(&rec.ranges, rec.ended.is_some()),
        Ok(None) => {
            // Redis lost the record: nothing of the session can be served as complete.
            store.lock_logs().remove(&log.id);
            log.clear_removed();
            log.wake();
        }
        Err(e) => {
            tracing::error!(session = %log.tag, error = %e, "reading the fenced session's record failed");
        }
    }
}
