//! The oracle, run after every abort once the filesystem is remounted and the proxy has recovered
//! (started, ready, stopped cleanly, filesystem synced):
//!
//! 1. **The log** (`inspect`, while no proxy runs): per session, seqs 1..=head with no hole and no
//!    repeat, epochs never going back, the end marker last; the upstream's `emit` numbering
//!    without holes; every session ended, those live at the crash by recovery (`upstream_lost`);
//!    and every event the log held at an earlier check still there, byte for byte.
//! 2. **What clients received against the log**: every received id must name the same bytes in the
//!    log. A received event that is not there is lost: a violation when an fsync-mode proxy served
//!    it, allowed for relaxed mode only when the resume below is refused.
//! 3. **Resumes** (proxy restarted): each session is resumed with the last cursor its client
//!    received. A session that lost events must be refused (409 `cursor_ahead`/`unknown_epoch`, or
//!    404); one whose cursor is older than the retained window (trimming on) must get 409
//!    `cursor_trimmed`; one whose synced data was damaged must be refused (any of those, or 409
//!    `damaged`); an evicted one 404. Otherwise the answer must be the rest of the log exactly —
//!    seq+1 onwards, same ids, same bytes, up to the end marker, and then the stream ends — or 404
//!    when only the end marker is left. Then every request the proxy accepted must have exactly
//!    one answer in the history.
//!
//! With trimming on, a received event older than the session's retained window is no longer
//! compared (`trimmed_events`); everything from the oldest retained seq on is, as before.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use tokio::time::Instant;

use super::book::{self, Id, Post, Sess, State, Stats, V};
use super::damage;
use super::procs::{self, Mode};
use super::wire::{self, Next, Opened};

/// One event of the log as `inspect` prints it.
#[derive(Debug, Clone)]
pub struct LogEv {
    /// `(epoch, seq)`.
    pub id: Id,
    /// `message`, `priming`, `final` or `end`.
    pub kind: String,
    /// Hash of the payload bytes.
    pub hash: u64,
    /// The start of the payload.
    pub snip: String,
    /// The upstream's `emit` tag, when it is one: `(seq, t_ns)`.
    pub emit: Option<(u64, u128)>,
    /// A -32091 answer.
    pub abort: bool,
}

/// A session's log.
#[derive(Debug, Default)]
pub struct LogView {
    /// The events in log order.
    pub evs: Vec<LogEv>,
    /// Index by id.
    pub by_id: HashMap<Id, usize>,
}

impl LogView {
    /// The oldest seq in the view.
    fn oldest(&self) -> Option<u64> {
        self.evs.first().map(|e| e.id.1)
    }

    /// The events after seq `after`, in order.
    fn after(&self, after: u64) -> &[LogEv] {
        let i = self.evs.partition_point(|e| e.id.1 <= after);
        &self.evs[i..]
    }
}

/// Parses `inspect --data-dir DIR SESSION` output: `<sid>:<epoch>:<seq>  <kind:7>  <stream:10>
/// <payload>` (two spaces between fields; kind and stream padded).
pub fn parse_events(sid: &str, out: &[u8]) -> Result<LogView, String> {
    let mut v = LogView::default();
    for (n, line) in out.split(|&b| b == b'\n').enumerate() {
        if line.is_empty() {
            continue;
        }
        let bad = || {
            format!(
                "inspect line {} of {sid} unparsable: {}",
                n + 1,
                book::snip(line)
            )
        };
        let sp = line.windows(2).position(|w| w == b"  ").ok_or_else(bad)?;
        let cur = std::str::from_utf8(&line[..sp]).map_err(|_| bad())?;
        let (s, id) = book::parse_cursor(cur).ok_or_else(bad)?;
        if s != sid {
            return Err(bad());
        }
        let rest = &line[sp + 2..];
        if rest.len() < 9 || &rest[7..9] != b"  " {
            return Err(bad());
        }
        let kind = String::from_utf8_lossy(&rest[..7]).trim_end().to_string();
        let rest = &rest[9..];
        let name_len = rest.iter().position(|&b| b == b' ').unwrap_or(rest.len());
        let start = name_len.max(10) + 2;
        let payload = rest.get(start..).unwrap_or(&[]);
        v.by_id.insert(id, v.evs.len());
        v.evs.push(LogEv {
            id,
            kind,
            hash: book::hash(payload),
            snip: book::snip(payload),
            emit: book::emit_tag(payload),
            abort: !payload.starts_with(b"{\"jsonrpc\":\"2.0\",\"method\"")
                && book::is_abort(payload),
        });
    }
    Ok(v)
}

/// Parses `inspect --data-dir DIR`: session id → (state, the whole row).
pub fn parse_listing(out: &[u8]) -> BTreeMap<String, (String, String)> {
    let text = String::from_utf8_lossy(out);
    let mut m = BTreeMap::new();
    for line in text.lines().skip(1) {
        let mut it = line.split_whitespace();
        let (Some(sid), Some(_facade), Some(state)) = (it.next(), it.next(), it.next()) else {
            continue;
        };
        if sid.len() == 32 {
            m.insert(
                sid.to_string(),
                (
                    state.to_string(),
                    line.split_whitespace().collect::<Vec<_>>().join(" "),
                ),
            );
        }
    }
    m
}

/// The oldest and head columns of a listing row (`-` when nothing is retained).
fn listed_range(row: &str) -> Option<(u64, u64)> {
    let mut it = row.split_whitespace().skip(3);
    Some((it.next()?.parse().ok()?, it.next()?.parse().ok()?))
}

/// What the check needs to know about the run so far.
pub struct CheckCtx<'a> {
    /// The proxy binary (for `inspect`).
    pub bin: &'a Path,
    /// The data dir.
    pub data: &'a Path,
    /// The cycle whose abort this check follows (sessions opened in it were live at the crash).
    pub cycle: u32,
    /// Read every session in full (the last check of an image generation).
    pub full: bool,
    /// The crashed proxy instance, when the fault was a journal abort (not a power loss): what
    /// it served in fsync mode may be lost, and must then be refused (design.md §10b).
    pub journal_inst: Option<u32>,
}

/// Part 1 and 2: reads the log and compares. Returns the logs read (sessions read in full).
pub fn check_log(
    cx: &CheckCtx<'_>,
    book: &mut [Sess],
    st: &mut Stats,
) -> Result<HashMap<String, LogView>, String> {
    st.checks += 1;
    let listing = parse_listing(&procs::inspect(cx.bin, cx.data, None)?);
    for (sid, (state, _)) in &listing {
        if !state.starts_with("ended:") {
            st.violation(
                V::Protocol,
                format!(
                    "after recovery and a clean stop, session {} is {state} (every session must be ended)",
                    &sid[..8]
                ),
            );
        }
    }
    let mut views = HashMap::new();
    let mut scan: Option<damage::Scan> = None;
    for s in book.iter_mut() {
        let row = listing.get(&s.sid);
        s.retained = row.and_then(|r| listed_range(&r.1));
        let changed = row.map(|r| &r.1) != s.listing.as_ref();
        if s.evicted || !(cx.full || s.state == State::Open || changed) {
            continue;
        }
        // A session no client received an event of (created, then the crash: its -32091s and
        // end were written by recovery) is evicted like any other once a check has listed it.
        if row.is_none() && s.trim && (!s.rcv.is_empty() || s.listing.is_some()) {
            // Evicted for space (log.max_total_bytes)? Only on purpose: a remove record, or
            // (for a session a check saw before) nothing of it left at all.
            if scan.is_none() {
                scan = Some(damage::scan(cx.data)?);
            }
            let sc = scan.as_ref().expect("scanned");
            if sc.removed(&s.sid) || (s.listing.is_some() && !sc.holds(&s.sid)) {
                s.evicted = true;
                st.evicted += 1;
                for r in s.rcv.values_mut() {
                    r.checked = true;
                    r.snip = None;
                }
                s.listing = None;
                s.proven = None;
                continue;
            }
            if s.listing.is_some() {
                st.violation(
                V::LostDurable,
                format!(
                    "session {} is no longer in the log, but not evicted (no remove record; records of it left: {}); previous listing {:?}",
                    s.short(),
                    sc.holds(&s.sid),
                    s.listing
                ),
            );
            }
        }
        let view = match row {
            None => LogView::default(),
            Some(_) => {
                st.inspects += 1;
                parse_events(&s.sid, &procs::inspect(cx.bin, cx.data, Some(&s.sid))?)?
            }
        };
        if s.cycle == cx.cycle {
            match row.map(|r| r.0.as_str()) {
                None | Some("ended:upstream_lost") => {}
                // A proxy that met the journal abort may have ended it itself.
                Some("ended:store_error") if cx.journal_inst.is_some() => {}
                Some(other) => st.violation(
                    V::Protocol,
                    format!(
                        "session {} was live at the crash but is {other} after recovery (expected ended:upstream_lost)",
                        s.short()
                    ),
                ),
            }
        }
        consistency(s, &view, st);
        durable(s, &view, st);
        received(s, &view, cx.journal_inst, st);
        s.listing = row.map(|r| r.1.clone());
        s.proven = Some(
            view.evs
                .iter()
                .map(|e| (e.id, (e.kind.clone(), e.hash)))
                .collect(),
        );
        views.insert(s.sid.clone(), view);
    }
    Ok(views)
}

/// The log of one session is a gap-free, repeat-free sequence ending with its end marker, and the
/// upstream's `emit` numbering in it has no hole. It starts at seq 1 unless retention may have
/// trimmed it. A session with damaged data may have lost any part of it, end marker included;
/// what is left must still be in order.
fn consistency(s: &Sess, v: &LogView, st: &mut Stats) {
    let mut prev: Option<Id> = None;
    // The first emit tag retained may be any when the log does not start at seq 1.
    let mut emit_prev: Option<u64> = (v.oldest() == Some(1) && s.damage.is_none()).then_some(0);
    let damaged = s.damage.is_some();
    for (i, e) in v.evs.iter().enumerate() {
        match prev {
            None if e.id.1 != 1 && !s.trim && !damaged => st.violation(
                V::SilentGap,
                format!(
                    "log of session {} starts at {} (nothing is trimmed in this harness)",
                    s.short(),
                    book::cursor(&s.sid, e.id)
                ),
            ),
            Some(p)
                if (e.id.1 != p.1 + 1 || e.id.0 < p.0)
                    && !(damaged && e.id.1 > p.1 && e.id.0 >= p.0) =>
            {
                st.violation(
                    if e.id.1 > p.1 + 1 && e.id.0 >= p.0 {
                        V::SilentGap
                    } else {
                        V::Duplicate
                    },
                    format!(
                        "log of session {}: {} follows {}",
                        s.short(),
                        book::cursor(&s.sid, e.id),
                        book::cursor(&s.sid, p)
                    ),
                )
            }
            _ => {}
        }
        prev = Some(e.id);
        let last = i + 1 == v.evs.len();
        if (e.kind == "end") != last && !(damaged && last) {
            st.violation(
                V::Protocol,
                format!(
                    "log of session {}: {} is `{}` at position {} of {} (the end marker must be last, and present)",
                    s.short(),
                    book::cursor(&s.sid, e.id),
                    e.kind,
                    i + 1,
                    v.evs.len()
                ),
            );
        }
        if let Some((tag, _)) = e.emit {
            let want = emit_prev.map_or(tag, |p| p + 1);
            if tag != want && !(damaged && tag > want) {
                st.violation(
                    if tag > want {
                        V::SilentGap
                    } else {
                        V::Duplicate
                    },
                    format!(
                        "log of session {}: upstream emit #{tag} at {} follows emit #{}",
                        s.short(),
                        book::cursor(&s.sid, e.id),
                        want - 1
                    ),
                );
            }
            emit_prev = Some(tag);
        }
    }
}

/// Everything the log held at the previous full read is still there, byte for byte. (Nothing
/// trims an ended session; eviction is handled before.) A session with damaged data may lose
/// events, but never show other bytes under an id.
fn durable(s: &Sess, v: &LogView, st: &mut Stats) {
    let Some(proven) = &s.proven else { return };
    let mut lost = 0u64;
    let mut first = None;
    for (id, (kind, h)) in proven {
        let got = v.by_id.get(id).map(|&i| &v.evs[i]);
        if got.is_some_and(|e| e.hash == *h) {
            continue;
        }
        if s.damage.is_some() {
            match got {
                None => st.damage_lost_events += 1,
                Some(e) => st.violation(
                    V::DamageServedWrong,
                    format!(
                        "session {} (damaged at seqs {:?}): {} is {:?} in the log, other bytes than at the previous check",
                        s.short(),
                        s.damage,
                        book::cursor(&s.sid, *id),
                        e.snip
                    ),
                ),
            }
            continue;
        }
        lost += 1;
        first.get_or_insert((*id, kind.clone()));
    }
    if let Some((id, kind)) = first {
        st.violation_n(
            V::LostDurable,
            lost,
            format!(
                "session {}: {lost} event(s) the log held at the previous check (synced) are gone or changed, first {} ({kind})",
                s.short(),
                book::cursor(&s.sid, id)
            ),
        );
    }
}

/// Every event a client received is in the log with the same bytes — from the oldest retained
/// seq on, when retention may have trimmed the session.
fn received(s: &mut Sess, v: &LogView, journal_inst: Option<u32>, st: &mut Stats) {
    let sid = s.sid.clone();
    let mut lost_fsync = Vec::new();
    let oldest = if s.trim {
        v.oldest().or(s.retained.map(|r| r.0)).unwrap_or(0)
    } else {
        0
    };
    let damaged = s.damage.is_some();
    for (id, r) in s.rcv.iter_mut() {
        if r.checked {
            continue;
        }
        r.checked = true;
        let got = v.by_id.get(id).map(|&i| &v.evs[i]);
        let same = got.is_some_and(|e| e.hash == r.hash);
        if same {
            r.snip = None;
            continue;
        }
        if got.is_none() && id.1 < oldest {
            st.trimmed_events += 1;
            r.snip = None;
            continue;
        }
        s.loss = true;
        if let Some(e) = got {
            st.violation(
                if damaged {
                    V::DamageServedWrong
                } else {
                    V::ServedDifferentContent
                },
                format!(
                    "{} was received from instance {} ({}) as {:?}; the log now has {:?} under that id",
                    book::cursor(&sid, *id),
                    r.inst,
                    r.mode.as_str(),
                    r.snip.as_deref().unwrap_or(""),
                    e.snip
                ),
            );
        }
        if damaged {
            st.damage_lost_events += 1;
        } else if r.mode == Mode::Relaxed {
            st.lost_relaxed_events += 1;
        } else if journal_inst == Some(r.inst) {
            st.journal_lost_events += 1;
        } else {
            lost_fsync.push((*id, r.inst, got.is_some()));
        }
        r.snip = None;
    }
    if let (Some(&(first, inst, _)), Some(&(last, _, _))) = (lost_fsync.first(), lost_fsync.last())
    {
        let head = v.evs.last().map(|e| book::cursor(&sid, e.id));
        st.violation_n(
            V::LostAcknowledged,
            lost_fsync.len() as u64,
            format!(
                "session {}: {} event(s) received from fsync-mode instance {inst} are not in the log ({} with other bytes under the same id), {}..{}; log now ends at {head:?}",
                &sid[..8],
                lost_fsync.len(),
                lost_fsync.iter().filter(|x| x.2).count(),
                book::cursor(&sid, first),
                book::cursor(&sid, last),
            ),
        );
    }
}

/// The state of a session whose resume was served although it had lost events (counted once).
const SERVED_AFTER_LOSS: &str = "served-after-loss";

/// What a resume got.
enum Resumed {
    Served,
    NotFound,
    Refused(String),
}

/// What a resume must get.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Want {
    /// The rest of the log exactly (or 404 when only the end marker is left).
    Serve,
    /// The client lost events: 409 `cursor_ahead`/`unknown_epoch`, or 404.
    Loss,
    /// The cursor is older than the retained window: 409 `cursor_trimmed`.
    Trimmed,
    /// Evicted for space: 404.
    Gone,
    /// Synced data of the session was damaged: any refusal (404, or 409 `cursor_ahead`,
    /// `cursor_trimmed`, `unknown_epoch`, `damaged`), for a cursor into or past the damage.
    Damaged,
}

/// Part 3: resumes every session through the proxy (instance `inst`, `mode`) with its last cursor.
pub async fn resumes(
    addr: SocketAddr,
    inst: u32,
    mode: Mode,
    book: &mut [Sess],
    views: &HashMap<String, LogView>,
    st: &std::sync::Mutex<Stats>,
) {
    let lock = || st.lock().unwrap_or_else(|e| e.into_inner());
    for s in book.iter_mut() {
        let Some(last) = s.last else {
            if s.state == State::Open {
                s.state = State::Orphan;
                lock().orphaned += 1;
            }
            continue;
        };
        if s.state == State::Orphan || s.state == State::Refused(SERVED_AFTER_LOSS.into()) {
            continue;
        }
        let behind = s.trim
            && s.retained
                .is_some_and(|(oldest, head)| last.1 + 1 < oldest && last.1 < head);
        let want = if s.evicted {
            // (A damaged session evicted before its next resume: 404 is all that is left.)
            s.damage_pending = false;
            Want::Gone
        } else if s.damage.is_some_and(|(first, _)| last.1 + 1 >= first) {
            // Into or past the damage: refused (the session is sealed at its last intact
            // event). A cursor before it resumes up to the seal, then goes on in the new epoch,
            // as after a lost relaxed tail: served, and checked like any other resume.
            Want::Damaged
        } else if s.loss {
            Want::Loss
        } else if behind {
            Want::Trimmed
        } else {
            Want::Serve
        };
        let cur = book::cursor(&s.sid, last);
        let view = views.get(&s.sid);
        let got = resume_one(addr, inst, mode, s, last, view, want, st).await;
        let mut g = lock();
        let st = &mut *g;
        let reason = match &got {
            Resumed::Served => None,
            Resumed::NotFound => Some("404:unknown_session".to_string()),
            Resumed::Refused(r) => Some(r.clone()),
        };
        match &reason {
            None => st.resumes_served += 1,
            Some(r) => *st.refusals.entry(r.clone()).or_default() += 1,
        }
        match (want, reason) {
            (Want::Serve, Some(reason)) if matches!(got, Resumed::Refused(_)) => st.violation(
                V::WrongRefusal,
                format!(
                    "session {}: resume from {cur} refused ({reason}) although the log holds every event its client received",
                    s.short()
                ),
            ),
            (Want::Serve, _) => {
                match &s.state {
                    State::Open => {
                        s.state = State::Complete;
                        answers(s, view, st);
                    }
                    State::Complete => {
                        if let Resumed::Served = got {
                            st.violation(
                                V::Protocol,
                                format!("session {}: resume from {cur} served again after its history was complete (expected 404)", s.short()),
                            );
                        }
                    }
                    State::Refused(r) => st.violation(
                        V::Protocol,
                        format!(
                            "session {}: resume from {cur} was refused ({r}) before, now answered",
                            s.short()
                        ),
                    ),
                    State::Orphan => {}
                }
            }
            (Want::Loss, None) => {
                st.violation(
                    V::LostTailNotRefused,
                    format!(
                        "session {}: its client lost events, yet the resume from {cur} was served (200) by instance {inst} ({})",
                        s.short(),
                        mode.as_str()
                    ),
                );
                s.state = State::Refused(SERVED_AFTER_LOSS.into());
            }
            (Want::Loss, Some(reason)) => {
                st.lost_tails_refused += stays_refused(s, st, &cur, reason) as u64;
            }
            (Want::Trimmed, None) => {
                st.violation(
                    V::SilentGap,
                    format!(
                        "session {}: resume from {cur} was served (200) by instance {inst} ({}), but the retained window {:?} starts after seq {}",
                        s.short(),
                        mode.as_str(),
                        s.retained,
                        last.1 + 1
                    ),
                );
                s.state = State::Refused(SERVED_AFTER_LOSS.into());
            }
            (Want::Trimmed, Some(reason)) if reason == "409:cursor_trimmed" => {
                st.trimmed_refused += stays_refused(s, st, &cur, reason) as u64;
            }
            (Want::Trimmed, Some(reason)) => st.violation(
                V::WrongRefusal,
                format!(
                    "session {}: resume from {cur} refused ({reason}); its cursor is older than the retained window {:?}, so 409 cursor_trimmed is the answer",
                    s.short(),
                    s.retained
                ),
            ),
            (Want::Gone, Some(reason)) if reason.starts_with("404:") => {}
            (Want::Gone, other) => st.violation(
                V::Protocol,
                format!(
                    "session {}: evicted for space, yet the resume from {cur} got {}",
                    s.short(),
                    other.as_deref().unwrap_or("200")
                ),
            ),
            (Want::Damaged, None) => {
                let (first, end) = s.damage.unwrap_or((0, 0));
                st.violation(
                    V::DamageServedWrong,
                    format!(
                        "session {}: its chunk of seqs {first}..{end} was damaged in synced data, yet the resume from {cur} ({}) was served (200) by instance {inst} ({})",
                        s.short(),
                        if last.1 >= end {
                            "past the damage; §10b: resumes into or past it are refused"
                        } else {
                            "into the damage"
                        },
                        mode.as_str()
                    ),
                );
                s.state = State::Refused(SERVED_AFTER_LOSS.into());
            }
            (Want::Damaged, Some(reason)) => {
                if s.damage_pending {
                    // The first answer after the damage replaces whatever was right before it.
                    s.damage_pending = false;
                    s.state = State::Open;
                }
                st.damage_refused += stays_refused(s, st, &cur, reason) as u64;
            }
        }
    }
}

/// A refused session must get the same refusal at every later check. Returns whether this is its
/// first refusal.
fn stays_refused(s: &mut Sess, st: &mut Stats, cur: &str, reason: String) -> bool {
    match &s.state {
        State::Refused(before) => {
            if *before != reason {
                st.violation(
                    V::Protocol,
                    format!(
                        "session {}: resume from {cur} refused as {before} before, now as {reason}",
                        s.short()
                    ),
                );
            }
            false
        }
        _ => {
            s.state = State::Refused(reason);
            true
        }
    }
}

/// One resume; checks a served stream against the log as it goes.
#[allow(clippy::too_many_arguments)]
async fn resume_one(
    addr: SocketAddr,
    inst: u32,
    mode: Mode,
    s: &mut Sess,
    last: Id,
    view: Option<&LogView>,
    want_answer: Want,
    st: &std::sync::Mutex<Stats>,
) -> Resumed {
    let lock = || st.lock().unwrap_or_else(|e| e.into_inner());
    let cur = book::cursor(&s.sid, last);
    let mut sse = match wire::open_sse(addr, "/sse", Some(&cur), Duration::from_secs(15)).await {
        Opened::Stream(c) => c,
        Opened::Status(code, body) => {
            let v: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
            let reason = v["error"]["data"]["reason"]
                .as_str()
                .unwrap_or("?")
                .to_string();
            let ok = matches!(
                (code, reason.as_str()),
                (404, "unknown_session")
                    | (409, "cursor_ahead")
                    | (409, "unknown_epoch")
                    | (409, "cursor_trimmed")
                    | (409, "damaged")
            );
            if !ok || v["error"]["code"].as_i64().is_none() {
                lock().violation(
                    V::Protocol,
                    format!(
                        "session {}: resume from {cur} answered {code} {reason}: {body}",
                        s.short()
                    ),
                );
            }
            if code == 404 {
                // 404 is right when the session's history is complete: only its end marker is
                // left after the cursor.
                if want_answer == Want::Serve {
                    if let Some(v) = view {
                        let rest = v.after(last.1);
                        if rest.first().map(|e| e.kind.as_str()) != Some("end") {
                            lock().violation(
                                V::WrongRefusal,
                                format!(
                                    "session {}: resume from {cur} answered 404 but the log has {} event(s) after it, first {:?}",
                                    s.short(),
                                    rest.len(),
                                    rest.first().map(|e| book::cursor(&s.sid, e.id))
                                ),
                            );
                        }
                    }
                }
                return Resumed::NotFound;
            }
            return Resumed::Refused(format!("{code}:{reason}"));
        }
        Opened::Failed => {
            lock().violation(
                V::Protocol,
                format!("session {}: resume from {cur}: no HTTP answer", s.short()),
            );
            return Resumed::Refused("no-answer".into());
        }
    };
    match sse.next(Instant::now() + Duration::from_secs(15)).await {
        Next::Event(ev) if ev.event.as_deref() == Some("endpoint") && ev.id.is_none() => {}
        other => {
            let what = match other {
                Next::Event(ev) => format!("{ev:?}"),
                _ => "nothing".into(),
            };
            lock().violation(
                V::Protocol,
                format!(
                    "session {}: resume from {cur} did not start with the endpoint event: {what}",
                    s.short()
                ),
            );
            return Resumed::Served;
        }
    }
    let (mut expect, mut epoch) = (last.1 + 1, last.0);
    let mut served = 0usize;
    let want: Vec<&LogEv> = view
        .map(|v| {
            v.after(last.1)
                .iter()
                .take_while(|e| e.kind != "end")
                .collect()
        })
        .unwrap_or_default();
    let ended = loop {
        match sse.next(Instant::now() + Duration::from_secs(10)).await {
            Next::Event(ev) => {
                let Some((sid, id)) = ev.id.as_deref().and_then(book::parse_cursor) else {
                    lock().violation(
                        V::Protocol,
                        format!("session {}: resumed event without an id: {ev:?}", s.short()),
                    );
                    continue;
                };
                let mut g = lock();
                if sid != s.sid {
                    g.violation(
                        V::Protocol,
                        format!(
                            "session {}: resume served an event of session {sid}",
                            s.short()
                        ),
                    );
                    continue;
                }
                // (A cursor older than the retained window that is served at all is counted once
                // by the caller, not here.)
                let skipped_trim = served == 0 && want_answer == Want::Trimmed;
                if (id.1 != expect || id.0 < epoch) && !skipped_trim {
                    let v = if id.1 > expect && id.0 >= epoch {
                        V::SilentGap
                    } else {
                        V::Duplicate
                    };
                    g.violation(
                        v,
                        format!(
                            "session {}: resume from {cur} by instance {inst} ({}): expected seq {expect}, got {}",
                            s.short(),
                            mode.as_str(),
                            book::cursor(&s.sid, id)
                        ),
                    );
                }
                expect = id.1 + 1;
                epoch = epoch.max(id.0);
                let h = book::hash(&ev.data);
                match view.and_then(|v| v.by_id.get(&id).map(|&i| &v.evs[i])) {
                    Some(e) if e.hash == h => {}
                    other if view.is_some() => g.violation(
                        V::ServedDifferentContent,
                        format!(
                            "session {}: resume served {} as {:?}; the log has {:?}",
                            s.short(),
                            book::cursor(&s.sid, id),
                            book::snip(&ev.data),
                            other.map(|e| e.snip.clone())
                        ),
                    ),
                    _ => {}
                }
                served += 1;
                s.record(&mut g, id, &ev.data, inst, mode);
            }
            Next::Comment => {}
            Next::End | Next::Cut { .. } => break true,
            Next::Timeout => break false,
        }
    };
    let mut g = lock();
    if !ended {
        g.violation(
            V::Protocol,
            format!(
                "session {}: the resumed stream of an ended session stayed open (10 s idle after {served} events)",
                s.short()
            ),
        );
    } else if view.is_some() && want_answer == Want::Serve && served != want.len() {
        g.violation(
            V::Protocol,
            format!(
                "session {}: resume from {cur} delivered {served} event(s) and ended; the log has {} before its end marker",
                s.short(),
                want.len()
            ),
        );
    }
    Resumed::Served
}

/// The session's history is complete: every request the proxy accepted has exactly one answer,
/// and no answer is for a request never sent.
fn answers(s: &Sess, view: Option<&LogView>, st: &mut Stats) {
    st.complete_histories += 1;
    for (id, ev) in &s.stray {
        st.violation(
            V::Protocol,
            format!(
                "session {}: {} answers a request id never sent: {ev:?}",
                s.short(),
                book::cursor(&s.sid, *id)
            ),
        );
    }
    // The newest upstream emission that survived in the log (for the relaxed-mode exception).
    let newest_emit = view
        .map(|v| {
            v.evs
                .iter()
                .filter_map(|e| e.emit.map(|t| t.1))
                .max()
                .unwrap_or(0)
        })
        .unwrap_or(0);
    for (rid, r) in &s.reqs {
        let got = s.answers.get(rid).map_or(0, |a| a.len());
        if got > 1 {
            st.violation(
                V::Duplicate,
                format!(
                    "session {}: request {rid} ({}) answered {got} times: {:?}",
                    s.short(),
                    r.method,
                    s.answers[rid]
                        .iter()
                        .map(|i| book::cursor(&s.sid, *i))
                        .collect::<Vec<_>>()
                ),
            );
        }
        if got == 1 {
            if let (Some(v), Some(aid)) = (view, s.answers[rid].iter().next()) {
                if v.by_id.get(aid).is_some_and(|&i| v.evs[i].abort) {
                    st.aborted_32091 += 1;
                }
            }
            continue;
        }
        let Post::Accepted { wall_ns } = r.post else {
            continue;
        };
        if r.mode == Mode::Relaxed && newest_emit <= wall_ns {
            // A relaxed-mode crash may lose the in-flight record of a request — but not one
            // written before an event that survived (one the upstream emitted after the 202).
            st.relaxed_unanswered += 1;
            continue;
        }
        st.violation(
            V::Unanswered,
            format!(
                "session {}: request {rid} ({}) accepted (202) by a {} proxy has no answer in the session's complete history (last {:?})",
                s.short(),
                r.method,
                r.mode.as_str(),
                s.last.map(|l| book::cursor(&s.sid, l))
            ),
        );
    }
}
