//! What the clients saw, per session, and what the oracle counted: every event a client received
//! (its id and a hash of its exact `data:` bytes), every request it sent and how the POST went,
//! and the answers it found on the stream.

use std::collections::{BTreeMap, BTreeSet};
use std::hash::{Hash, Hasher};

use super::procs::Mode;

/// An event id without its session: `(epoch, seq)`.
pub type Id = (u32, u64);

/// Formats an id of `sid`.
pub fn cursor(sid: &str, id: Id) -> String {
    format!("{sid}:{}:{}", id.0, id.1)
}

/// Parses `{session}:{epoch}:{seq}`.
pub fn parse_cursor(s: &str) -> Option<(String, Id)> {
    let mut it = s.rsplitn(3, ':');
    let seq = it.next()?.parse().ok()?;
    let epoch = it.next()?.parse().ok()?;
    let sid = it.next()?;
    (sid.len() == 32).then(|| (sid.to_string(), (epoch, seq)))
}

/// A 64-bit hash of event bytes, the same for the same bytes within a run (`DefaultHasher::new`
/// uses fixed keys).
pub fn hash(data: &[u8]) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    data.hash(&mut h);
    h.finish()
}

/// The start of `data`, for a violation's detail.
pub fn snip(data: &[u8]) -> String {
    let s = String::from_utf8_lossy(&data[..data.len().min(110)]).into_owned();
    if data.len() > 110 {
        format!("{s}…")
    } else {
        s
    }
}

/// The violations the oracle counts. The run is clean only when every one is 0.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum V {
    /// An id a client received names different bytes in the log, or was served with different
    /// bytes to another client (an id reused for another event).
    ServedDifferentContent,
    /// A stream or the log skipped a seq (or the upstream's emit numbering has a hole in the log).
    SilentGap,
    /// A stream repeated or went back; a request answered twice.
    Duplicate,
    /// An event a client received from an fsync-mode proxy is not in the log (same id, same bytes).
    LostAcknowledged,
    /// An event the log held at an earlier check (after a remount and a sync) is gone or changed.
    LostDurable,
    /// A client lost events, and the resume with its last cursor was served (200) anyway.
    LostTailNotRefused,
    /// A resume was refused although the log holds everything the client had received.
    WrongRefusal,
    /// A request the proxy accepted (202) never got an answer in a session's complete history.
    Unanswered,
    /// The proxy did not come back (ready) on the data dir after an abort, or inspect failed.
    RestartFailure,
    /// Anything else the contract forbids (an event without an id, a stream of an ended session
    /// that stays open, a session still live after recovery, a proxy exit before the abort, …).
    Protocol,
    /// Synced data of a session was damaged, and a resume into or past it was served (200), or the
    /// log kept the damaged bytes under an id (design.md §10b: damage is never a torn tail).
    DamageServedWrong,
    /// The proxy that recovered a damaged log did not count it in `mcp_resume_store_damage_total`.
    DamageUncounted,
}

impl V {
    /// Every kind, in summary order.
    pub const ALL: [V; 12] = [
        V::ServedDifferentContent,
        V::SilentGap,
        V::Duplicate,
        V::LostAcknowledged,
        V::LostDurable,
        V::LostTailNotRefused,
        V::WrongRefusal,
        V::Unanswered,
        V::RestartFailure,
        V::Protocol,
        V::DamageServedWrong,
        V::DamageUncounted,
    ];

    /// The summary's name for it.
    pub fn name(self) -> &'static str {
        match self {
            V::ServedDifferentContent => "served_different_content",
            V::SilentGap => "silent_gaps",
            V::Duplicate => "duplicates",
            V::LostAcknowledged => "lost_acknowledged",
            V::LostDurable => "lost_durable",
            V::LostTailNotRefused => "lost_tails_not_refused",
            V::WrongRefusal => "wrong_refusals",
            V::Unanswered => "unanswered_requests",
            V::RestartFailure => "restart_failures",
            V::Protocol => "protocol_errors",
            V::DamageServedWrong => "damage_served_wrong",
            V::DamageUncounted => "damage_uncounted",
        }
    }
}

/// Details kept per violation kind.
const DETAILS_PER_KIND: usize = 6;

/// Counters of the whole run.
#[derive(Default, Debug)]
pub struct Stats {
    /// Filesystem aborts.
    pub aborts: u64,
    /// Of those, of an fsync-mode proxy.
    pub fsync_aborts: u64,
    /// Of those, of a relaxed-mode proxy.
    pub relaxed_aborts: u64,
    /// Aborts of a data dir created moments before (first abort of an image that was not synced
    /// after the proxy's first start).
    pub fresh_aborts: u64,
    /// (crash mode, restart mode) pairs.
    pub transitions: BTreeMap<(Mode, Mode), u64>,
    /// Image generations.
    pub generations: u64,
    /// Sessions opened by clients.
    pub sessions: u64,
    /// Events received by clients (flood and resume streams).
    pub events_received: u64,
    /// Of those, received after the abort (before the SIGKILL landed).
    pub events_read_after_abort: u64,
    /// Requests sent.
    pub requests: u64,
    /// Resumes served 200.
    pub resumes_served: u64,
    /// Resumes refused, by status and reason.
    pub refusals: BTreeMap<String, u64>,
    /// Sessions that lost events and whose resume was refused (as it must be).
    pub lost_tails_refused: u64,
    /// Sessions whose client's cursor is older than the retained window and whose resume was
    /// refused `409 cursor_trimmed` (as it must be).
    pub trimmed_refused: u64,
    /// Sessions with damaged synced data whose resume was refused (as it must be).
    pub damage_refused: u64,
    /// Journal aborts (`trigger_fs_error`) instead of the shutdown ioctl.
    pub journal_aborts: u64,
    /// Of those, how many came within a few ms of a client receiving an event.
    pub journal_after_delivery: u64,
    /// Microseconds from that event to the trigger, min/max.
    pub journal_delay_us: (u64, u64),
    /// Events received from an fsync-mode proxy and lost to a journal abort (allowed when the
    /// resume is refused: design.md §10b, the disk may not keep what it acknowledged).
    pub journal_lost_events: u64,
    /// `e2fsck -fy` runs after journal aborts: found nothing, fixed something.
    pub fsck: (u64, u64),
    /// Recovering proxies cut by a second power loss.
    pub recovery_aborts: u64,
    /// Of those, cut after the proxy said it was listening.
    pub recovery_aborts_listening: u64,
    /// Chunk records damaged (bit flips in synced data).
    pub damage_injected: u64,
    /// Of those, below a segment length seen after a syncfs of the harness / in the newest
    /// segment before a record a client received from an fsync-mode proxy.
    pub damage_where: (u64, u64),
    /// Damage cycles with no chunk record to damage.
    pub damage_skipped: u64,
    /// Events of damaged sessions gone from the log (allowed: their resumes must be refused).
    pub damage_lost_events: u64,
    /// Images with trimming on and small segments.
    pub trim_images: u64,
    /// Received events older than the retained window (trimmed, so no longer comparable).
    pub trimmed_events: u64,
    /// Sessions evicted for space (`log.max_total_bytes`): their resumes must get 404.
    pub evicted: u64,
    /// Live streams that fell behind retention and whose resume mid-flood was refused
    /// `cursor_trimmed` (the client then left that session).
    pub flood_trimmed: u64,
    /// Events received from a relaxed-mode proxy and lost (allowed when the resume is refused).
    pub lost_relaxed_events: u64,
    /// Accepted requests with no answer whose in-flight record a relaxed-mode crash could lose.
    pub relaxed_unanswered: u64,
    /// Sessions whose history was read to its end and checked request by request.
    pub complete_histories: u64,
    /// Requests answered by -32091 in those histories.
    pub aborted_32091: u64,
    /// Sessions with no event received (no cursor to resume with).
    pub orphaned: u64,
    /// Proxy instances that had exited on their own when the SIGKILL came (e.g. 74 after a store
    /// failure), by exit code.
    pub self_exits: BTreeMap<String, u64>,
    /// Oracle checks run (one per abort).
    pub checks: u64,
    /// `inspect SESSION` runs.
    pub inspects: u64,
    /// Milliseconds from flood start to abort, min/max.
    pub abort_ms: (u64, u64),
    /// Probe results: runs, synced survived, frozen, write after abort failed, unsynced file
    /// survived, unsynced append survived.
    pub probes: [u64; 6],
    /// Violation counts.
    pub violations: BTreeMap<V, u64>,
    /// The first violations of each kind, in detail.
    pub details: BTreeMap<V, Vec<String>>,
}

impl Stats {
    /// Counts `n` violations of kind `v`, keeping `detail` among the first of its kind.
    pub fn violation_n(&mut self, v: V, n: u64, detail: String) {
        *self.violations.entry(v).or_default() += n;
        let d = self.details.entry(v).or_default();
        if d.len() < DETAILS_PER_KIND {
            d.push(format!("{}: {detail}", v.name()));
        }
    }

    /// Counts one violation.
    pub fn violation(&mut self, v: V, detail: String) {
        self.violation_n(v, 1, detail);
    }

    /// Count of one kind.
    pub fn count(&self, v: V) -> u64 {
        self.violations.get(&v).copied().unwrap_or(0)
    }

    /// No violation at all.
    pub fn clean(&self) -> bool {
        self.violations.values().all(|&n| n == 0)
    }
}

/// One event as a client received it.
#[derive(Debug, Clone)]
pub struct Rcv {
    /// Hash of the exact `data:` bytes.
    pub hash: u64,
    /// The start of the bytes (dropped once the event is checked).
    pub snip: Option<String>,
    /// The proxy instance that served it.
    pub inst: u32,
    /// That instance's durability mode.
    pub mode: Mode,
    /// Compared with the log already.
    pub checked: bool,
}

/// How the POST of a request went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Post {
    /// No answer yet.
    Pending,
    /// 202: the proxy took it (in fsync mode its in-flight record is durable).
    Accepted {
        /// Wall clock (ns since the epoch) when the 202 arrived.
        wall_ns: u128,
    },
    /// Another status.
    Status(u16),
    /// Certainly not delivered.
    NotSent,
    /// May have been delivered; no answer.
    Unknown,
}

/// One request.
#[derive(Debug, Clone)]
pub struct Req {
    /// `initialize`, `emit`, `echo`.
    pub method: &'static str,
    /// The POST's outcome.
    pub post: Post,
    /// Mode of the instance it was sent to.
    pub mode: Mode,
}

/// Where the oracle is with a session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum State {
    /// Not checked after a crash yet.
    Open,
    /// Its whole history was read (resume served to the end marker, or 404 with only the end
    /// marker left): a later resume with its last cursor must get 404.
    Complete,
    /// It lost events and its resume was refused with this reason: later resumes must be too.
    Refused(String),
    /// No event was received (nothing to resume from).
    Orphan,
}

/// Everything the oracle knows about one session.
#[derive(Debug)]
pub struct Sess {
    /// The proxy's session id.
    pub sid: String,
    /// The abort cycle (in the run) it was opened in.
    pub cycle: u32,
    /// Events received, by id.
    pub rcv: BTreeMap<Id, Rcv>,
    /// The last event received (the cursor a client resumes with).
    pub last: Option<Id>,
    /// Requests by JSON-RPC id.
    pub reqs: BTreeMap<u64, Req>,
    /// Next request id.
    pub next_id: u64,
    /// For each request id, the ids of the events that answered it.
    pub answers: BTreeMap<u64, BTreeSet<Id>>,
    /// Answers to request ids this session never sent.
    pub stray: Vec<(Id, String)>,
    /// Some received event is not in the log (lost or changed).
    pub loss: bool,
    /// Oracle state.
    pub state: State,
    /// The session's events at the last full inspect: id → (kind, hash).
    pub proven: Option<BTreeMap<Id, (String, u64)>>,
    /// Its `inspect` listing row at the last check.
    pub listing: Option<String>,
    /// It lives in an image with trimming on: retention may have dropped its oldest events.
    pub trim: bool,
    /// Oldest retained seq and head at the last check (from the listing).
    pub retained: Option<(u64, u64)>,
    /// Seqs `first..end` of a chunk record of it whose synced bytes were damaged: from then on
    /// every resume must be refused.
    pub damage: Option<(u64, u64)>,
    /// The damage has not yet met a resume.
    pub damage_pending: bool,
    /// Evicted for space: its resumes must get 404.
    pub evicted: bool,
}

impl Sess {
    /// A session just opened.
    pub fn new(sid: String, cycle: u32, trim: bool) -> Self {
        Sess {
            sid,
            cycle,
            rcv: BTreeMap::new(),
            last: None,
            reqs: BTreeMap::new(),
            next_id: 1,
            answers: BTreeMap::new(),
            stray: Vec::new(),
            loss: false,
            state: State::Open,
            proven: None,
            listing: None,
            trim,
            retained: None,
            damage: None,
            damage_pending: false,
            evicted: false,
        }
    }

    /// Short name for details.
    pub fn short(&self) -> &str {
        &self.sid[..8]
    }

    /// Records a received event. A second receipt of the same id must carry the same bytes.
    pub fn record(&mut self, st: &mut Stats, id: Id, data: &[u8], inst: u32, mode: Mode) {
        st.events_received += 1;
        let h = hash(data);
        if let Some(prev) = self.rcv.get(&id) {
            if prev.hash != h {
                st.violation(
                    V::ServedDifferentContent,
                    format!(
                        "session {}: id {} received twice with different bytes: first from instance {} ({}) {:?}, now from instance {inst} ({}) {:?}",
                        self.short(),
                        cursor(&self.sid, id),
                        prev.inst,
                        prev.mode.as_str(),
                        prev.snip.as_deref().unwrap_or("(checked)"),
                        mode.as_str(),
                        snip(data)
                    ),
                );
            }
        } else {
            self.rcv.insert(
                id,
                Rcv {
                    hash: h,
                    snip: Some(snip(data)),
                    inst,
                    mode,
                    checked: false,
                },
            );
        }
        self.last = Some(id);
        if let Some(rid) = response_id(data) {
            if self.reqs.contains_key(&rid) {
                self.answers.entry(rid).or_default().insert(id);
            } else {
                self.stray.push((id, snip(data)));
            }
        }
    }
}

/// The prefix of every upstream notification the demo upstream sends (`emit`): not a response.
const NOTIFICATION: &[u8] = b"{\"jsonrpc\":\"2.0\",\"method\":";

/// The request id a JSON-RPC response answers (`None` for anything else).
pub fn response_id(data: &[u8]) -> Option<u64> {
    if data.starts_with(NOTIFICATION) {
        return None;
    }
    let v: serde_json::Value = serde_json::from_slice(data).ok()?;
    if v.get("method").is_some() || (v.get("result").is_none() && v.get("error").is_none()) {
        return None;
    }
    v.get("id")?.as_u64()
}

/// Is `data` a JSON-RPC error with code -32091 (in-flight request aborted)?
pub fn is_abort(data: &[u8]) -> bool {
    serde_json::from_slice::<serde_json::Value>(data)
        .ok()
        .and_then(|v| v["error"]["code"].as_i64())
        == Some(-32091)
}

/// The demo upstream's `emit` tag of a notification: `(seq, t_ns)`.
pub fn emit_tag(data: &[u8]) -> Option<(u64, u128)> {
    const KEY: &[u8] = b"\"logger\":\"emit\",\"data\":{\"seq\":";
    if !data.starts_with(NOTIFICATION) {
        return None;
    }
    let at = data.windows(KEY.len()).position(|w| w == KEY)? + KEY.len();
    let rest = &data[at..];
    let end = rest.iter().position(|b| !b.is_ascii_digit())?;
    let seq = std::str::from_utf8(&rest[..end]).ok()?.parse().ok()?;
    const T: &[u8] = b",\"t_ns\":";
    let rest = rest[end..].strip_prefix(T)?;
    let end = rest.iter().position(|b| !b.is_ascii_digit())?;
    let t = std::str::from_utf8(&rest[..end]).ok()?.parse().ok()?;
    Some((seq, t))
}

/// Wall clock in ns since the Unix epoch (the demo upstream stamps `emit` events with the same).
pub fn wall_ns() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0)
}
