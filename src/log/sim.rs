//! The log's deterministic fault simulator (design.md §10b "Proof by simulation"), in the spirit of
//! TigerBeetle's and FoundationDB's: the writer and recovery run over [`SimFs`], a seeded in-memory
//! file system behind the log's file interface ([`super::io`]), which
//!
//! - keeps what was written apart from what was synced, and on a power loss keeps none, a prefix
//!   (the last write torn at a 512-byte sector), or any subset of the sectors written since the
//!   last sync — and a prefix of the directory operations since the last directory sync;
//! - fails any call (write, sync, truncate, create, remove, directory sync) with EIO or ENOSPC,
//!   writes only part of a failed write, and fills up (a capacity in bytes);
//! - flips bits in synced data at rest.
//!
//! A workload of sessions, appends, in-flight requests and their answers, ends (a task's final
//! answer is one), removes, room-making, flushes, clean stops, kills and power losses — crashes
//! during recovery and its first turns too — drives the writer turn by turn on one thread, so a
//! seed reproduces its run exactly. Clients read every event the log publishes. The oracle checks
//! after every turn and every recovery:
//!
//! - **no id reused**: an event id, once read, never names other bytes (all runs, all crashes);
//! - **nothing acknowledged lost** (`fsync`, no damage injected): a client's cursor still resumes,
//!   every event it read is still there, byte for byte, or legitimately trimmed;
//! - **every loss refused**: a cursor whose event is gone gets a refusal, never a 200 from a
//!   different place; every in-flight request is answered or handed back to be answered; a
//!   published end (and the answers in it) survives in both modes;
//! - **the disk bound**: the segment files stay within [`Store::disk_bound`] while healthy;
//! - **no spin**: a writer with work of its own always makes progress.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::{mpsc, oneshot};

use super::cursor::{check_resume, Cursor, Refusal, SessionId};
use super::image::Image;
use super::io::{Dir, SegFile};
use super::writer::{self, Writer};
use super::{
    read_after, Health, Interrupted, Kind, NewEvent, Op, SessionLog, Store, StreamTag, FIXED_UNIX,
};
use crate::config::{Durability, LogConfig};
use crate::domain::{EndReason, Facade};
use crate::identity::Keyring;
use crate::metrics::Metrics;

// === rng ===

/// SplitMix64: small, seedable, good enough to pick faults.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed ^ 0x9e37_79b9_7f4a_7c15)
    }

    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n` > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    /// True with probability `ppm` per million.
    pub fn ppm(&mut self, ppm: u64) -> bool {
        self.below(1_000_000) < ppm
    }

    pub fn chance(&mut self, num: u64, den: u64) -> bool {
        self.below(den) < num
    }
}

// === the file system ===

const SECTOR: usize = 512;

/// A write or cut not yet synced.
#[derive(Clone, Debug)]
enum Pend {
    Write(u64, Vec<u8>),
    Truncate(u64),
}

#[derive(Debug, Default)]
struct FileState {
    /// What reads see (the page cache).
    data: Vec<u8>,
    /// What a power loss keeps for sure.
    durable: Vec<u8>,
    /// Applied to `data`, not yet to `durable`.
    pending: Vec<Pend>,
}

fn apply(buf: &mut Vec<u8>, p: &Pend) {
    match p {
        Pend::Write(off, bytes) => {
            let end = *off as usize + bytes.len();
            if buf.len() < end {
                buf.resize(end, 0);
            }
            buf[*off as usize..end].copy_from_slice(bytes);
        }
        Pend::Truncate(len) => buf.resize(*len as usize, 0),
    }
}

/// A directory operation not yet synced.
#[derive(Clone, Debug)]
enum DirOp {
    Create(String, Arc<Mutex<FileState>>),
    Remove(String),
}

/// The knobs of the faults.
#[derive(Clone, Debug, Default)]
pub struct Faults {
    /// Chance per million that a call fails.
    pub fail_ppm: u64,
    /// Bytes the files may take (`None`: no bound).
    pub capacity: Option<u64>,
    /// Chance per million that a sync says it synced and did not (a disk that lies about its
    /// cache, as consumer disks without power-loss protection do).
    pub lie_ppm: u64,
}

#[derive(Debug)]
struct FsState {
    files: BTreeMap<String, Arc<Mutex<FileState>>>,
    durable_names: BTreeMap<String, Arc<Mutex<FileState>>>,
    dir_pending: Vec<DirOp>,
    rng: Rng,
    faults: Faults,
    /// Calls failed, by the simulator's choice.
    injected: u64,
    /// Syncs that lied.
    lies: u64,
    /// Failures a test asks for, in order: the call of that kind after skipping that many
    /// fails with that errno.
    forced: std::collections::VecDeque<(Call, u32, i32)>,
}

/// A kind of file-system call (to fail one on purpose).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Call {
    Write,
    Sync,
    Truncate,
    Create,
    Remove,
    DirSync,
    /// A sync that fails and leaves what it held clean in the page cache, never written (what
    /// Linux does to the pages of a failed `fdatasync`).
    SyncForgets,
}

/// What a power loss keeps of the writes not synced.
#[derive(Clone, Copy, Debug)]
pub enum Loss {
    /// The dice decide (none, a torn prefix, or any sectors).
    Random,
    /// Nothing.
    All,
    /// The first this many bytes written since the last sync, in order.
    KeepBytes(usize),
}

impl FsState {
    fn used(&self) -> u64 {
        self.files
            .values()
            .map(|f| f.lock().unwrap().data.len() as u64)
            .sum()
    }

    /// Fails the call now? (EIO, or ENOSPC where `space` is true and the dice say so.)
    fn fail(&mut self, call: Call, space: bool) -> Option<io::Error> {
        if let Some(e) = self.forced_failure(call) {
            return Some(e);
        }
        self.fail_by_chance(space)
    }

    fn fail_by_chance(&mut self, space: bool) -> Option<io::Error> {
        if !self.rng.ppm(self.faults.fail_ppm) {
            return None;
        }
        self.injected += 1;
        Some(if space && self.rng.chance(1, 2) {
            io::Error::from_raw_os_error(28)
        } else {
            io::Error::from_raw_os_error(5)
        })
    }

    fn forced_failure(&mut self, call: Call) -> Option<io::Error> {
        if let Some((c, skip, errno)) = self.forced.front_mut() {
            if std::env::var("SIM_TRACE").is_ok() {
                eprintln!("TRACE call {call:?}, next forced {c:?} after {skip}");
                if std::env::var("SIM_TRACE").as_deref() == Ok("bt") {
                    let bt = std::backtrace::Backtrace::force_capture().to_string();
                    let ours: Vec<&str> = bt
                        .lines()
                        .filter(|l| l.contains("mcp_resume_proxy::log"))
                        .take(4)
                        .collect();
                    eprintln!("TRACE   {ours:?}");
                }
            }
            if *c == call {
                if *skip == 0 {
                    let e = io::Error::from_raw_os_error(*errno);
                    self.forced.pop_front();
                    return Some(e);
                }
                *skip -= 1;
            }
        }
        None
    }
}

/// The simulated data directory. Cloning shares it.
#[derive(Clone, Debug)]
pub struct SimFs {
    st: Arc<Mutex<FsState>>,
    path: PathBuf,
}

#[derive(Debug)]
struct SimFile {
    fs: Arc<Mutex<FsState>>,
    file: Arc<Mutex<FileState>>,
}

impl SimFs {
    pub fn new(seed: u64) -> Self {
        SimFs {
            st: Arc::new(Mutex::new(FsState {
                files: BTreeMap::new(),
                durable_names: BTreeMap::new(),
                dir_pending: Vec::new(),
                rng: Rng::new(seed ^ 0x5eed_f11e),
                faults: Faults::default(),
                injected: 0,
                lies: 0,
                forced: Default::default(),
            })),
            path: PathBuf::from("/sim"),
        }
    }

    pub fn set_faults(&self, f: Faults) {
        self.st.lock().unwrap().faults = f;
    }

    pub fn faults(&self) -> Faults {
        self.st.lock().unwrap().faults.clone()
    }

    pub fn injected(&self) -> u64 {
        self.st.lock().unwrap().injected
    }

    pub fn lies(&self) -> u64 {
        self.st.lock().unwrap().lies
    }

    /// Bytes of the segment files (what `du` would see of them).
    pub fn segment_bytes(&self) -> u64 {
        let st = self.st.lock().unwrap();
        st.files
            .iter()
            .filter(|(n, _)| n.ends_with(".seg"))
            .map(|(_, f)| f.lock().unwrap().data.len() as u64)
            .sum()
    }

    pub fn used(&self) -> u64 {
        self.st.lock().unwrap().used()
    }

    /// A power loss: the directory keeps a prefix of its unsynced operations; each file keeps
    /// what was synced and, by the dice, none, a torn prefix, or any sectors of what was not.
    /// The next `call` fails with `errno`.
    pub fn fail_next(&self, call: Call, errno: i32) {
        self.fail_after(call, 0, errno);
    }

    /// The `call` after the next `skip` ones fails with `errno`.
    pub fn fail_after(&self, call: Call, skip: u32, errno: i32) {
        self.st
            .lock()
            .unwrap()
            .forced
            .push_back((call, skip, errno));
    }

    /// Writes and cuts of `name` not yet synced.
    pub fn pending(&self, name: &str) -> usize {
        let st = self.st.lock().unwrap();
        st.files
            .get(name)
            .map_or(0, |f| f.lock().unwrap().pending.len())
    }

    /// The segment file and offset where `needle` first occurs (in what reads see).
    pub fn find(&self, needle: &[u8]) -> Option<(String, usize)> {
        let st = self.st.lock().unwrap();
        st.files.iter().find_map(|(n, f)| {
            let f = f.lock().unwrap();
            f.data
                .windows(needle.len())
                .position(|w| w == needle)
                .map(|at| (n.clone(), at))
        })
    }

    /// Flips the low bit of byte `at` of `name`, synced or not.
    pub fn flip_at(&self, name: &str, at: usize) {
        let st = self.st.lock().unwrap();
        let mut f = st.files[name].lock().unwrap();
        f.data[at] ^= 1;
        if at < f.durable.len() {
            f.durable[at] ^= 1;
        }
    }

    pub fn power_loss(&self) {
        self.power_loss_with(Loss::Random);
    }

    /// A copy of what a power loss now would keep for sure: synced names, synced bytes.
    pub fn durable_view(&self) -> SimFs {
        let st = self.st.lock().unwrap();
        let files: BTreeMap<String, Arc<Mutex<FileState>>> = st
            .durable_names
            .iter()
            .map(|(n, f)| {
                let d = f.lock().unwrap().durable.clone();
                let f = FileState {
                    data: d.clone(),
                    durable: d,
                    pending: Vec::new(),
                };
                (n.clone(), Arc::new(Mutex::new(f)))
            })
            .collect();
        let view = SimFs::new(0);
        {
            let mut v = view.st.lock().unwrap();
            v.durable_names = files.clone();
            v.files = files;
        }
        view
    }

    pub fn power_loss_with(&self, loss: Loss) {
        let mut st = self.st.lock().unwrap();
        let n_dir = st.dir_pending.len() as u64;
        let keep_dir = match loss {
            Loss::Random => st.rng.below(n_dir + 1) as usize,
            Loss::All => 0,
            Loss::KeepBytes(_) => n_dir as usize,
        };
        let ops: Vec<DirOp> = st.dir_pending.drain(..).collect();
        for op in &ops[..keep_dir] {
            match op {
                DirOp::Create(n, f) => {
                    st.durable_names.insert(n.clone(), f.clone());
                }
                DirOp::Remove(n) => {
                    st.durable_names.remove(n);
                }
            }
        }
        let names = st.durable_names.clone();
        for f in names.values() {
            let mut f = f.lock().unwrap();
            let mut out = f.durable.clone();
            let pending = std::mem::take(&mut f.pending);
            let mode = match loss {
                Loss::Random => st.rng.below(3),
                Loss::All => 0,
                Loss::KeepBytes(mut left) => {
                    for p in &pending {
                        match p {
                            Pend::Write(off, bytes) => {
                                let n = bytes.len().min(left);
                                apply(&mut out, &Pend::Write(*off, bytes[..n].to_vec()));
                                left -= n;
                            }
                            t => apply(&mut out, t),
                        }
                    }
                    3
                }
            };
            match mode {
                0 | 3 => {}
                1 => {
                    let n = st.rng.below(pending.len() as u64 + 1) as usize;
                    for (i, p) in pending.iter().take(n).enumerate() {
                        match p {
                            Pend::Write(off, bytes) if i + 1 == n && !bytes.is_empty() => {
                                // The last write kept is torn at a sector boundary.
                                let sectors = bytes.len().div_ceil(SECTOR) as u64;
                                let keep = st.rng.below(sectors + 1) as usize * SECTOR;
                                let keep = keep.min(bytes.len());
                                apply(&mut out, &Pend::Write(*off, bytes[..keep].to_vec()));
                            }
                            p => apply(&mut out, p),
                        }
                    }
                }
                _ => {
                    for p in &pending {
                        match p {
                            Pend::Write(off, bytes) => {
                                for (k, sector) in bytes.chunks(SECTOR).enumerate() {
                                    if st.rng.chance(1, 2) {
                                        let at = *off + (k * SECTOR) as u64;
                                        apply(&mut out, &Pend::Write(at, sector.to_vec()));
                                    }
                                }
                            }
                            t => {
                                if st.rng.chance(1, 2) {
                                    apply(&mut out, t);
                                }
                            }
                        }
                    }
                }
            }
            f.data = out.clone();
            f.durable = out;
        }
        st.files = names;
    }

    /// Flips one bit in the synced part of a segment file; returns which sessions it may cost
    /// (`None`: any of them), or nothing when there was nothing to flip.
    pub fn flip_synced_bit(&self) -> Option<Option<SessionId>> {
        let mut st = self.st.lock().unwrap();
        let segs: Vec<(String, Arc<Mutex<FileState>>)> = st
            .files
            .iter()
            .filter(|(n, f)| n.ends_with(".seg") && f.lock().unwrap().durable.len() > 16)
            .map(|(n, f)| (n.clone(), f.clone()))
            .collect();
        let newest = st
            .files
            .keys()
            .filter(|n| n.ends_with(".seg"))
            .max()
            .cloned();
        if segs.is_empty() {
            return None;
        }
        let (name, f) = &segs[st.rng.below(segs.len() as u64) as usize];
        let mut f = f.lock().unwrap();
        // Past the header: a header flip is damage of another kind (tested on its own).
        let at = 16 + st.rng.below((f.durable.len() - 16) as u64) as usize;
        let hit = hit_by(&f.durable, at, newest.as_deref() == Some(name.as_str()));
        let bit = 1u8 << st.rng.below(8);
        f.durable[at] ^= bit;
        if at < f.data.len() {
            f.data[at] ^= bit;
        }
        Some(hit)
    }
}

/// Whose record byte `at` of a segment is in: its session, or `None` when a flip there may cost
/// any session (a mark, an open record, bytes no record covers, or the newest segment's tail
/// past what its marks say was synced — damage there cannot be told from a torn write).
fn hit_by(seg: &[u8], at: usize, newest: bool) -> Option<SessionId> {
    use super::record::{self, Type};
    let mut pos = record::SEGMENT_HEADER;
    let mut claim = record::SEGMENT_HEADER;
    let mut found = None;
    while pos < seg.len() {
        let Ok((ty, body, len)) = record::read_frame(&seg[pos..]) else {
            break;
        };
        if ty == Type::Mark {
            if let Some((_, c)) = record::parse_mark(body) {
                claim = claim.max((c as usize).min(pos));
            }
        }
        if (pos..pos + len).contains(&at) {
            found = Some((pos, ty, record::session_of(body)));
        }
        pos += len;
    }
    let (pos, ty, session) = found?;
    if newest && pos >= claim {
        return None;
    }
    match ty {
        Type::Mark | Type::Open | Type::Clean => None,
        _ => session,
    }
}

impl SegFile for SimFile {
    fn size(&self) -> io::Result<u64> {
        Ok(self.file.lock().unwrap().data.len() as u64)
    }

    fn read_at(&self, buf: &mut [u8], off: u64) -> io::Result<usize> {
        let f = self.file.lock().unwrap();
        let off = off as usize;
        if off >= f.data.len() {
            return Ok(0);
        }
        let n = buf.len().min(f.data.len() - off);
        buf[..n].copy_from_slice(&f.data[off..off + n]);
        Ok(n)
    }

    fn write_all_at(&self, buf: &[u8], off: u64) -> io::Result<()> {
        let mut st = self.fs.lock().unwrap();
        let used = st.used();
        let mut f = self.file.lock().unwrap();
        let grows = (off as usize + buf.len()).saturating_sub(f.data.len()) as u64;
        let room = st.faults.capacity.map(|c| c.saturating_sub(used));
        let (n, err) = if room.is_some_and(|r| grows > r) {
            let fit = (f.data.len().saturating_sub(off as usize)) as u64 + room.unwrap_or(0);
            (
                (fit as usize).min(buf.len()),
                Some(io::Error::from_raw_os_error(28)),
            )
        } else if let Some(e) = st.fail(Call::Write, true) {
            (st.rng.below(buf.len() as u64 + 1) as usize, Some(e))
        } else {
            (buf.len(), None)
        };
        let p = Pend::Write(off, buf[..n].to_vec());
        apply(&mut f.data, &p);
        f.pending.push(p);
        match err {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    fn sync_data(&self) -> io::Result<()> {
        let mut st = self.fs.lock().unwrap();
        let mut f = self.file.lock().unwrap();
        if let Some(e) = st.forced_failure(Call::Sync) {
            // A failure a test asked for: the sync did nothing.
            return Err(e);
        }
        if let Some(e) = st.forced_failure(Call::SyncForgets) {
            f.pending.clear();
            return Err(e);
        }
        if let Some(e) = st.fail_by_chance(true) {
            // fsyncgate: what was pending may or may not be on disk; a later sync will not
            // write it again. Model: some of it went, the rest is lost at the next power loss
            // unless it happens to be written again.
            let pending = std::mem::take(&mut f.pending);
            let n = st.rng.below(pending.len() as u64 + 1) as usize;
            let mut durable = std::mem::take(&mut f.durable);
            for p in &pending[..n] {
                apply(&mut durable, p);
            }
            f.durable = durable;
            return Err(e);
        }
        let lie = st.faults.lie_ppm;
        if st.rng.ppm(lie) {
            st.lies += 1;
            return Ok(());
        }
        let pending = std::mem::take(&mut f.pending);
        let mut durable = std::mem::take(&mut f.durable);
        for p in &pending {
            apply(&mut durable, p);
        }
        f.durable = durable;
        Ok(())
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        let mut st = self.fs.lock().unwrap();
        if let Some(e) = st.fail(Call::Truncate, false) {
            return Err(e);
        }
        let mut f = self.file.lock().unwrap();
        let p = Pend::Truncate(len);
        apply(&mut f.data, &p);
        f.pending.push(p);
        Ok(())
    }
}

impl Dir for SimFs {
    fn path(&self) -> &Path {
        &self.path
    }

    fn list(&self) -> io::Result<Vec<String>> {
        Ok(self.st.lock().unwrap().files.keys().cloned().collect())
    }

    fn open(&self, name: &str, _write: bool) -> io::Result<Arc<dyn SegFile>> {
        let st = self.st.lock().unwrap();
        let file = st
            .files
            .get(name)
            .cloned()
            .ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))?;
        Ok(Arc::new(SimFile {
            fs: self.st.clone(),
            file,
        }))
    }

    fn create(&self, name: &str) -> io::Result<Arc<dyn SegFile>> {
        let mut st = self.st.lock().unwrap();
        if st.files.contains_key(name) {
            return Err(io::Error::from(io::ErrorKind::AlreadyExists));
        }
        if let Some(e) = st.fail(Call::Create, true) {
            return Err(e);
        }
        let file = Arc::new(Mutex::new(FileState::default()));
        st.files.insert(name.to_string(), file.clone());
        st.dir_pending
            .push(DirOp::Create(name.to_string(), file.clone()));
        Ok(Arc::new(SimFile {
            fs: self.st.clone(),
            file,
        }))
    }

    fn remove(&self, name: &str) -> io::Result<()> {
        let mut st = self.st.lock().unwrap();
        if !st.files.contains_key(name) {
            return Err(io::Error::from(io::ErrorKind::NotFound));
        }
        if let Some(e) = st.fail(Call::Remove, false) {
            return Err(e);
        }
        st.files.remove(name);
        st.dir_pending.push(DirOp::Remove(name.to_string()));
        Ok(())
    }

    fn sync(&self) -> io::Result<()> {
        let mut st = self.st.lock().unwrap();
        if let Some(e) = st.fail(Call::DirSync, false) {
            return Err(e);
        }
        for op in std::mem::take(&mut st.dir_pending) {
            match op {
                DirOp::Create(n, f) => {
                    st.durable_names.insert(n, f);
                }
                DirOp::Remove(n) => {
                    st.durable_names.remove(&n);
                }
            }
        }
        Ok(())
    }
}

// === the workload and the oracle ===

/// How much to simulate.
#[derive(Clone, Debug)]
pub struct Profile {
    /// Seeds to run (from `first_seed`).
    pub seeds: u64,
    pub first_seed: u64,
    /// Workload steps per seed.
    pub steps: u64,
}

/// What one run (or many) did and found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Report {
    pub seeds: u64,
    pub steps: u64,
    pub turns: u64,
    pub events_read: u64,
    pub power_losses: u64,
    pub kills: u64,
    pub clean_stops: u64,
    pub recovery_crashes: u64,
    pub bit_flips: u64,
    pub damage_found: u64,
    pub injected_faults: u64,
    pub degraded: u64,
    pub healed: u64,
    pub failed: u64,
    pub refused_cursors: u64,
    pub trimmed_cursors: u64,
    pub sessions: u64,
    /// Violations (each a sentence with its seed and step).
    pub violations: Vec<String>,
}

impl Report {
    fn add(&mut self, o: &Report) {
        self.seeds += o.seeds;
        self.steps += o.steps;
        self.turns += o.turns;
        self.events_read += o.events_read;
        self.power_losses += o.power_losses;
        self.kills += o.kills;
        self.clean_stops += o.clean_stops;
        self.recovery_crashes += o.recovery_crashes;
        self.bit_flips += o.bit_flips;
        self.damage_found += o.damage_found;
        self.injected_faults += o.injected_faults;
        self.degraded += o.degraded;
        self.healed += o.healed;
        self.failed += o.failed;
        self.refused_cursors += o.refused_cursors;
        self.trimmed_cursors += o.trimmed_cursors;
        self.sessions += o.sessions;
        self.violations.extend(o.violations.iter().cloned());
    }

    /// The one-line summary (README, docs/crash.md).
    pub fn line(&self, profile: &str, first_seed: u64) -> String {
        format!(
            "sim: profile={profile} seeds={} steps={} turns={} events_read={} power_losses={} kills={} clean_stops={} recovery_crashes={} bit_flips={} damage_found={} injected_faults={} degraded={} healed={} failed={} refused_cursors={} trimmed_cursors={} sessions={} violations={} first_seed={first_seed}",
            self.seeds,
            self.steps,
            self.turns,
            self.events_read,
            self.power_losses,
            self.kills,
            self.clean_stops,
            self.recovery_crashes,
            self.bit_flips,
            self.damage_found,
            self.injected_faults,
            self.degraded,
            self.healed,
            self.failed,
            self.refused_cursors,
            self.trimmed_cursors,
            self.sessions,
            self.violations.len()
        )
    }
}

/// A request the workload sent.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Req {
    /// In-flight record queued, not acknowledged.
    Registering,
    /// Durably in flight (acknowledged): it must be answered, now or after a restart.
    InFlight,
    /// Its answer is queued.
    Answering,
}

/// The workload's and the client's view of one session.
#[derive(Debug, Default)]
struct SimSession {
    log: Option<Arc<SessionLog>>,
    /// The create was acknowledged (durable).
    created: bool,
    /// An end was queued (no more appends from the workload).
    ending: bool,
    /// Its end marker was read.
    ended: bool,
    /// A remove was queued (or it was evicted): it may be gone after a restart.
    may_be_gone: bool,
    /// A remove was acknowledged: it is gone, and stays gone (with fsync).
    removed: bool,
    /// Requests by id.
    reqs: BTreeMap<String, Req>,
    /// Requests whose answer a client read (never to be owed again).
    answered: BTreeSet<String>,
    /// Last event the client read: (epoch, seq).
    cursor: Option<(u32, u64)>,
    /// Events read since the last check, by seq: (epoch, payload).
    read: BTreeMap<u64, (u32, Bytes)>,
    /// Oldest retained seq seen while running (what recovery may not exceed, with fsync).
    oldest_seen: u64,
    /// Once its end was read: the oldest seq the data dir retained for it (`disk_check`).
    disk_oldest: Option<u64>,
    /// A flipped bit hit it: what the data dir retains of it may shrink.
    flipped: bool,
    next_payload: u64,
}

/// The pending acknowledgement of an op.
enum Waiting {
    Create(
        SessionId,
        oneshot::Receiver<Result<u64, crate::error::StoreError>>,
    ),
    Inflight(
        SessionId,
        String,
        oneshot::Receiver<Result<u64, crate::error::StoreError>>,
    ),
    Remove(
        SessionId,
        oneshot::Receiver<Result<u64, crate::error::StoreError>>,
    ),
    Other(oneshot::Receiver<Result<u64, crate::error::StoreError>>),
}

/// One simulated proxy process and its world.
struct Sim {
    seed: u64,
    rng: Rng,
    fs: SimFs,
    cfg: LogConfig,
    seg_size: u64,
    /// With `relaxed`, unsynced bytes after which a turn syncs (the store's `sync_every`): half a
    /// segment here, so that the workload's small segments reach it between rotations and every
    /// fault meets it; the real 8 MiB in the hand-written tests (`manual`).
    sync_every: u64,
    store: Option<Arc<Store>>,
    writer: Option<Writer>,
    failures: Option<mpsc::UnboundedReceiver<SessionId>>,
    ops: Vec<Op>,
    waiting: Vec<Waiting>,
    sessions: BTreeMap<SessionId, SimSession>,
    /// Every id ever read, and its payload.
    ids: HashMap<(SessionId, u32, u64), Bytes>,
    /// Sessions a flipped bit may have cost since the last recovery check: their losses are
    /// excused, if refused.
    excused: BTreeSet<SessionId>,
    /// A fault since the last check may have cost any session (a lying sync, a flip that no
    /// single session owns).
    excuse_all: bool,
    /// Lies the file system had told at the last check.
    lies_seen: u64,
    /// Checks a lie still excuses.
    lie_checks: u32,
    /// Oldest retained seq of each session as recovery found it.
    recovered: HashMap<SessionId, u64>,
    /// A flipped bit hit no session the simulator could name.
    flipped_unknown: bool,
    /// Steps left of a flood (large appends to a few sessions, about a turn's worth a step).
    flood: u32,
    step: u64,
    unix: u64,
    idle_busy_turns: u32,
    rep: Report,
}

fn payload(id: &SessionId, n: u64, rng: &mut Rng) -> Bytes {
    let pad = match rng.below(20) {
        0 => 3000 + rng.below(9000),
        1..=3 => rng.below(600),
        _ => rng.below(80),
    } as usize;
    payload_padded(id, n, pad)
}

/// adversary15: a number from the environment (parameters the simulator does not pick).
fn adv_env(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

fn payload_padded(id: &SessionId, n: u64, pad: usize) -> Bytes {
    let mut s = format!("{{\"s\":\"{id}\",\"n\":{n},\"pad\":\"");
    s.extend(std::iter::repeat_n('x', pad));
    s.push_str("\"}");
    Bytes::from(s)
}

impl Sim {
    fn new(seed: u64) -> Self {
        let mut rng = Rng::new(seed);
        let durability = if rng.chance(1, 2) {
            Durability::Fsync
        } else {
            Durability::Relaxed
        };
        let cfg = LogConfig {
            dir: PathBuf::from("/sim"),
            durability,
            max_events_per_session: [20, 60, 400][rng.below(3) as usize],
            max_bytes_per_session: [16 << 10, 64 << 10, 1 << 20][rng.below(3) as usize],
            max_total_bytes: [192 << 10, 512 << 10][rng.below(2) as usize],
            store_error_exit_secs: 5,
            ..LogConfig::default()
        };
        let mut seg_size = [16 << 10, 32 << 10][rng.below(2) as usize];
        let mut cfg = cfg;
        // adversary15: parameters the simulator does not pick, from the environment.
        if let Some(v) = adv_env("SIM_SEG") {
            seg_size = v;
        }
        if let Some(v) = adv_env("SIM_MAX_TOTAL") {
            cfg.max_total_bytes = v;
        }
        if let Some(v) = adv_env("SIM_MAX_SESSION_BYTES") {
            cfg.max_bytes_per_session = v;
        }
        let fs = SimFs::new(seed);
        Sim {
            seed,
            rng,
            fs,
            cfg,
            seg_size,
            sync_every: seg_size / 2,
            store: None,
            writer: None,
            failures: None,
            ops: Vec::new(),
            waiting: Vec::new(),
            sessions: BTreeMap::new(),
            ids: HashMap::new(),
            excused: BTreeSet::new(),
            excuse_all: false,
            lies_seen: 0,
            lie_checks: 0,
            recovered: HashMap::new(),
            flipped_unknown: false,
            flood: 0,
            step: 0,
            unix: 1_700_000_000,
            idle_busy_turns: 0,
            rep: Report::default(),
        }
    }

    fn violation(&mut self, what: String) {
        let durability = format!("{:?}", self.cfg.durability);
        self.rep.violations.push(format!(
            "seed {} step {} ({durability}): {what}",
            self.seed, self.step
        ));
    }

    fn store(&self) -> &Arc<Store> {
        self.store.as_ref().expect("running")
    }

    // --- process life ---

    /// Starts the "process": scan, recover, the first flush, the interrupted sessions ended.
    /// A fault on the way is a crash during recovery: power is lost there and it starts again.
    async fn start(&mut self) {
        for attempt in 0.. {
            if attempt > 20 {
                // A disk that stays full: the orchestrator's operator frees space.
                let mut f = self.fs.faults();
                f.capacity = None;
                self.fs.set_faults(f);
            }
            match self.try_start() {
                Ok(interrupted) => {
                    self.check_recovered(&interrupted);
                    self.end_interrupted(interrupted);
                    // Sometimes power goes in the first turns after recovery.
                    if self.rng.chance(1, 8) {
                        let n = self.rng.below(3);
                        for _ in 0..n {
                            self.turn().await;
                        }
                        self.rep.recovery_crashes += 1;
                        self.stop_process();
                        self.fs.power_loss();
                        self.rep.power_losses += 1;
                        continue;
                    }
                    return;
                }
                Err(()) => {
                    self.rep.recovery_crashes += 1;
                    self.stop_process();
                    self.fs.power_loss();
                    self.rep.power_losses += 1;
                }
            }
        }
    }

    fn try_start(&mut self) -> Result<Vec<Interrupted>, ()> {
        let fs: Arc<dyn Dir> = Arc::new(self.fs.clone());
        let img = Image::scan_in(fs.clone()).map_err(|_| ())?;
        if let Ok(t) = std::env::var("SIM_TRACE") {
            for (id, s) in &img.sessions {
                if id.to_string().starts_with(&t) {
                    eprintln!(
                        "TRACE step {} scan {id}: chunks {:?} trim {:?} meta {:?} damage {:?}",
                        self.step,
                        s.chunks
                            .values()
                            .map(|c| (c.first, c.count, c.epoch, c.loc.seg))
                            .collect::<Vec<_>>(),
                        s.trim,
                        s.meta.as_ref().map(|m| (&m.0.epochs, m.0.ended)),
                        img.damage
                    );
                }
            }
        }
        self.rep.damage_found += img.damaged;
        let (tx, rx) = mpsc::unbounded_channel();
        let mut store = Store::new(
            &self.cfg,
            Metrics::new(),
            fs,
            Keyring::for_tests(),
            None,
            tx,
        );
        store.seg_size = self.seg_size;
        store.sync_every = self.sync_every;
        store.compact_slice = 4 << 10;
        store.turn_bytes = (self.cfg.max_total_bytes / 8) as usize;
        if let Some(v) = adv_env("SIM_TURN") {
            store.turn_bytes = v as usize;
        }
        if let Some(v) = adv_env("SIM_COMPACT") {
            store.compact_slice = v as usize;
        }
        let store = Arc::new(store);
        let (_rec, interrupted, state) = writer::recover(&store, img).map_err(|_| ())?;
        // What recovery found, before any turn applies retention to it.
        self.recovered = store
            .lock_logs()
            .values()
            .map(|l| (l.id, l.ranges().oldest))
            .collect();
        let mut w = Writer::new(store.clone(), state);
        let (done, mut ack) = oneshot::channel();
        let mut ops = vec![Op::Flush { done }];
        w.turn(&mut ops);
        if !matches!(ack.try_recv(), Ok(Ok(_))) {
            return Err(());
        }
        self.store = Some(store);
        self.writer = Some(w);
        self.failures = Some(rx);
        Ok(interrupted)
    }

    /// The process is gone: what was queued is lost, as are the acks (their callers are gone).
    fn stop_process(&mut self) {
        self.ops.clear();
        self.waiting.clear();
        self.writer = None;
        self.store = None;
        self.failures = None;
        for s in self.sessions.values_mut() {
            s.log = None;
            for r in s.reqs.values_mut() {
                // Queued work died with the process; what was durable stays owed.
                if *r == Req::Answering {
                    *r = Req::InFlight;
                }
            }
            s.reqs.retain(|_, r| *r != Req::Registering);
        }
    }

    /// What a new process found, checked against what clients saw.
    fn check_recovered(&mut self, interrupted: &[Interrupted]) {
        let lies = self.fs.lies();
        if std::env::var("SIM_TRACE").is_ok() {
            eprintln!(
                "TRACE step {} check: lies {lies} (seen {}), excuse_all {}, excused {:?}",
                self.step, self.lies_seen, self.excuse_all, self.excused
            );
        }
        if lies != self.lies_seen {
            self.lies_seen = lies;
            // A lie shows at the power loss after it: this check or, if it came after the last
            // one (in this start's first turn), the next.
            self.lie_checks = 2;
        }
        if self.lie_checks > 0 {
            self.lie_checks -= 1;
            self.excuse_all = true;
        }
        let fsync = self.cfg.durability == Durability::Fsync;
        let store = self.store().clone();
        let owed: BTreeMap<SessionId, BTreeSet<String>> = interrupted
            .iter()
            .map(|i| {
                (
                    i.log.id,
                    i.inflight.iter().map(|(r, _)| r.clone()).collect(),
                )
            })
            .collect();
        let ids: Vec<SessionId> = self.sessions.keys().copied().collect();
        for id in ids {
            let excused = self.excuse_all || self.excused.contains(&id);
            // With fsync everything read was durable. An ended session may be evicted for space
            // at any turn, and come back in part after a crash (its remove record not yet
            // durable): only refusals are asked of it — and that its end, once read, stays.
            let s = &self.sessions[&id];
            let strict = !excused && fsync && !(s.ending || s.ended);
            let log = store.lock_logs().get(&id).cloned();
            if log.is_some() && self.sessions[&id].removed && fsync && !excused {
                self.violation(format!(
                    "session {id} removed (acknowledged) came back after a restart"
                ));
            }
            if let Some(s) = self.sessions.get_mut(&id) {
                s.removed = false;
            }
            let Some(log) = log else {
                let s = &self.sessions[&id];
                // An ended session may be evicted for space at any turn (the first after
                // recovery too): its cursors get 404, a refusal.
                let gone_ok = s.may_be_gone || s.ending || s.ended;
                let (lost, cursor) = (strict && s.created && !gone_ok, s.cursor.is_some());
                let s = SimSession {
                    ended: s.ended,
                    ..Default::default()
                };
                if lost {
                    let img = Image::scan_in(Arc::new(self.fs.clone())).ok();
                    let seen = img.as_ref().map(|i| i.sessions.contains_key(&id));
                    self.violation(format!(
                        "session {id} lost after a restart (ended {}, in a scan now: {seen:?}, damage {:?})",
                        s.ended,
                        img.map(|i| i.damage)
                    ));
                }
                // Its cursors get 404: a refusal.
                self.rep.refused_cursors += u64::from(cursor);
                self.sessions.remove(&id);
                continue;
            };
            self.check_session(&id, &log, strict);
            // Requests durably in flight are answered: by a published answer (then not owed)
            // or by this start (owed).
            let s = self.sessions.get(&id).expect("present");
            let ended_in_log = log.ended().is_some();
            // Answers in the log that no client read yet (a failed turn whose cut did not
            // reach the disk may have left one) answer their requests too.
            let answered: BTreeSet<String> = read_after(&log, 0, usize::MAX)
                .unwrap_or_default()
                .iter()
                .filter(|e| e.kind == Kind::Final)
                .filter_map(|e| answer_of(&e.payload))
                .collect();
            let missing: Vec<String> = s
                .reqs
                .iter()
                .filter(|(_, r)| **r == Req::InFlight)
                .filter(|(r, _)| !answered.contains(*r))
                .filter(|(r, _)| !owed.get(&id).is_some_and(|o| o.contains(*r)))
                .map(|(r, _)| r.clone())
                .collect();
            if !missing.is_empty()
                && !ended_in_log
                && !excused
                && std::env::var("SIM_TRACE").is_ok()
            {
                let img = Image::scan_in(Arc::new(self.fs.clone())).unwrap();
                eprintln!(
                    "TRACE img inflight {:?} meta {:?} chunks {:?} owed {:?} damage {:?}",
                    img.sessions.get(&id).map(|s| &s.inflight),
                    img.sessions.get(&id).map(|s| &s.meta),
                    img.sessions.get(&id).map(|s| s.chunks.len()),
                    owed.get(&id),
                    img.damage
                );
            }
            let twice: Vec<&String> = owed
                .get(&id)
                .map(|o| o.intersection(&s.answered).collect())
                .unwrap_or_default();
            if !twice.is_empty() && !excused {
                let msg = format!("session {id}: requests {twice:?} were answered, yet owed again after a restart");
                self.violation(msg);
            }
            if !missing.is_empty() && !ended_in_log && !excused {
                self.violation(format!(
                    "session {id}: requests {missing:?} were durably in flight but are neither answered nor owed after a restart"
                ));
            }
            let s = self.sessions.get_mut(&id).expect("present");
            if s.ended && log.ended().is_none() && !excused {
                let msg = format!("session {id}: its end was read, but it is live after a restart");
                self.violation(msg);
            }
            let s = self.sessions.get_mut(&id).expect("present");
            s.reqs.clear();
            if let Some(o) = owed.get(&id) {
                for r in o {
                    s.reqs.insert(r.clone(), Req::InFlight);
                    // Only an excused loss (damage took the answer) gets here: it is owed again,
                    // from now on, for good.
                    s.answered.remove(r);
                }
            }
            s.log = Some(log.clone());
            s.ending = log.ended().is_some();
            s.ended = log.end_published();
        }
        // Sessions the log has that the workload never saw created (their create ack was lost
        // with the process): adopt them, so their ends are checked too.
        let known: Vec<Arc<SessionLog>> = store.lock_logs().values().cloned().collect();
        for log in known {
            self.sessions.entry(log.id).or_insert_with(|| SimSession {
                ending: log.ended().is_some(),
                ended: log.end_published(),
                created: true,
                log: Some(log.clone()),
                oldest_seen: log.oldest(),
                ..Default::default()
            });
        }
        self.excused.clear();
        self.excuse_all = false;
    }

    /// One session after a restart: its client's cursor resumes or is refused, and every event
    /// it read is there or refused.
    fn check_session(&mut self, id: &SessionId, log: &Arc<SessionLog>, strict: bool) {
        let ranges = log.ranges();
        let s = self.sessions.get(id).expect("present");
        let (cursor, oldest_seen) = (s.cursor, s.oldest_seen);
        let read: Vec<(u64, u32, Bytes)> = s
            .read
            .iter()
            .map(|(q, (e, p))| (*q, *e, p.clone()))
            .collect();
        let found_oldest = self.recovered.get(id).copied().unwrap_or(ranges.oldest);
        if strict && found_oldest > oldest_seen.max(1) && std::env::var("SIM_TRACE").is_ok() {
            let img = Image::scan_in(Arc::new(self.fs.clone())).unwrap();
            let is = img.sessions.get(id);
            eprintln!(
                "TRACE ranges {ranges:?} trim {:?} chunks {:?} meta {:?} segs {:?}",
                is.map(|s| s.trim),
                is.map(|s| s
                    .chunks
                    .values()
                    .map(|c| (c.first, c.count, c.epoch, c.loc.seg))
                    .collect::<Vec<_>>()),
                is.map(|s| &s.meta),
                img.segments
            );
        }
        if strict && found_oldest > oldest_seen.max(1) {
            self.violation(format!(
                "session {id}: recovery dropped events it had retained (oldest {found_oldest} > {oldest_seen})"
            ));
        }
        // The events read are all still there (or refused).
        let from = read
            .first()
            .map(|(q, _, _)| q.saturating_sub(1))
            .unwrap_or(0);
        let have: BTreeMap<u64, (u32, Bytes)> = match read_after(log, from, usize::MAX) {
            Ok(evs) => evs
                .iter()
                .map(|e| (e.seq, (e.epoch, e.payload.clone())))
                .collect(),
            Err(e) => {
                if strict {
                    self.violation(format!("session {id}: read failed after recovery: {e}"));
                }
                BTreeMap::new()
            }
        };
        for (seq, epoch, bytes) in &read {
            let there = have.get(seq).is_some_and(|(e, p)| e == epoch && p == bytes);
            if there || *seq < ranges.oldest {
                continue;
            }
            let c = Cursor {
                session: *id,
                epoch: *epoch,
                seq: *seq,
            };
            match check_resume(&c, &ranges, false) {
                Ok(_) => self.violation(format!(
                    "session {id}: event {epoch}:{seq} is gone (or other bytes) but its cursor still resumes"
                )),
                Err(_) if strict => self.violation(format!(
                    "session {id}: acknowledged event {epoch}:{seq} lost (fsync, no damage)"
                )),
                Err(_) => {}
            }
        }
        // The client's own cursor.
        if let Some((epoch, seq)) = cursor {
            let c = Cursor {
                session: *id,
                epoch,
                seq,
            };
            match check_resume(&c, &ranges, false) {
                Ok(after) => match read_after(log, after, 1) {
                    Ok(next) if next.first().is_some_and(|e| e.seq != after + 1) => {
                        self.violation(format!(
                            "session {id}: resume from {epoch}:{seq} accepted but the next event is {}",
                            next[0].seq
                        ))
                    }
                    _ => {}
                },
                Err(Refusal::CursorTrimmed) => {
                    self.rep.trimmed_cursors += 1;
                    self.reconcile(id, log);
                }
                Err(r) => {
                    if strict {
                        self.violation(format!(
                            "session {id}: cursor {epoch}:{seq} refused ({r:?}) after a restart (fsync, no damage)"
                        ));
                    }
                    self.rep.refused_cursors += 1;
                    self.reconcile(id, log);
                }
            }
        }
        let s = self.sessions.get_mut(id).expect("present");
        s.read.clear();
        s.oldest_seen = ranges.oldest;
    }

    /// A refused client opens a fresh stream: it goes on from the head.
    fn reconcile(&mut self, id: &SessionId, log: &Arc<SessionLog>) {
        let r = log.ranges();
        let s = self.sessions.get_mut(id).expect("present");
        s.cursor = (r.head > 0).then(|| (r.epoch_of(r.head), r.head));
        s.reqs.retain(|_, r| *r == Req::Registering);
    }

    /// The app ends what was live: every owed request answered (-32091), then the end.
    fn end_interrupted(&mut self, interrupted: Vec<Interrupted>) {
        for i in interrupted {
            let evs = i
                .inflight
                .iter()
                .map(|(req, stream)| {
                    let mut ev = NewEvent::new(
                        *stream,
                        Kind::Final,
                        Bytes::from(format!("{{\"id\":{req},\"error\":{{\"code\":-32091}}}}")),
                    );
                    ev.completes = Some(req.clone());
                    ev
                })
                .collect();
            if let Some(s) = self.sessions.get_mut(&i.log.id) {
                s.ending = true;
                for r in s.reqs.values_mut() {
                    *r = Req::Answering;
                }
            }
            self.push_end(&i.log, EndReason::UpstreamLost, evs);
        }
    }

    fn push_end(&mut self, log: &Arc<SessionLog>, reason: EndReason, evs: Vec<NewEvent>) {
        let (done, rx) = oneshot::channel();
        self.ops.push(Op::End {
            log: log.clone(),
            reason,
            evs,
            done,
            _permit: None,
        });
        self.waiting.push(Waiting::Other(rx));
    }

    // --- turns ---

    async fn turn(&mut self) {
        let Some(w) = self.writer.as_mut() else {
            return;
        };
        let before_ops = self.ops.len();
        let before_disk = self.fs.segment_bytes();
        let was = *self.store.as_ref().expect("running").health.borrow();
        w.turn(&mut self.ops);
        self.rep.turns += 1;
        let store = self.store().clone();
        let now = *store.health.borrow();
        if was == Health::Ok && now == Health::Degraded {
            self.rep.degraded += 1;
        }
        if was == Health::Degraded && now == Health::Ok {
            self.rep.healed += 1;
        }
        if now != Health::Ok {
            // Retries and the exit deadline run on the writer's clock.
            tokio::time::advance(Duration::from_millis(1100)).await;
        }
        // No spin: a busy writer makes progress.
        let w = self.writer.as_ref().expect("running");
        let progressed = self.ops.len() != before_ops
            || self.fs.segment_bytes() != before_disk
            || w.last_written() > 0;
        if w.busy() && !progressed && now == Health::Ok {
            self.idle_busy_turns += 1;
            if self.idle_busy_turns == 200 {
                self.violation("the writer spins: busy for 200 turns without progress".into());
            }
        } else {
            self.idle_busy_turns = 0;
        }
        if std::env::var("SIM_TRACE").as_deref() == Ok("disk") {
            eprintln!(
                "TRACE turn disk {} retained {} segs {:?} busy {} ops {} wrote {}",
                self.fs.segment_bytes(),
                store.retained.load(std::sync::atomic::Ordering::Relaxed),
                self.fs.list().unwrap_or_default().len(),
                self.writer.as_ref().is_some_and(|w| w.busy()),
                self.ops.len(),
                self.writer.as_ref().map_or(0, |w| w.last_written())
            );
        }
        if now == Health::Ok {
            let disk = self.fs.segment_bytes();
            if disk > store.disk_bound() {
                self.violation(format!(
                    "disk bound broken: {disk} bytes of segments > {}",
                    store.disk_bound()
                ));
            }
        }
        self.collect_acks();
        self.collect_failures();
        self.read_all();
    }

    fn collect_acks(&mut self) {
        let mut still = Vec::new();
        for w in std::mem::take(&mut self.waiting) {
            match w {
                Waiting::Create(id, mut rx) => match rx.try_recv() {
                    Ok(Ok(_)) => {
                        if let Some(s) = self.sessions.get_mut(&id) {
                            s.created = true;
                        }
                    }
                    Ok(Err(_)) | Err(oneshot::error::TryRecvError::Closed) => {
                        if let Some(s) = self.sessions.get_mut(&id) {
                            s.ending = true;
                            s.may_be_gone = true;
                        }
                    }
                    Err(oneshot::error::TryRecvError::Empty) => still.push(Waiting::Create(id, rx)),
                },
                Waiting::Inflight(id, req, mut rx) => match rx.try_recv() {
                    Ok(Ok(_)) => {
                        if let Some(r) = self
                            .sessions
                            .get_mut(&id)
                            .and_then(|s| s.reqs.get_mut(&req))
                        {
                            if *r == Req::Registering {
                                *r = Req::InFlight;
                            }
                        }
                    }
                    Ok(Err(_)) | Err(oneshot::error::TryRecvError::Closed) => {
                        if let Some(s) = self.sessions.get_mut(&id) {
                            s.reqs.remove(&req);
                        }
                    }
                    Err(oneshot::error::TryRecvError::Empty) => {
                        still.push(Waiting::Inflight(id, req, rx))
                    }
                },
                Waiting::Remove(id, mut rx) => match rx.try_recv() {
                    Ok(Ok(_)) => {
                        if let Some(s) = self.sessions.get_mut(&id) {
                            s.removed = true;
                        }
                    }
                    Err(oneshot::error::TryRecvError::Empty) => still.push(Waiting::Remove(id, rx)),
                    _ => {}
                },
                Waiting::Other(mut rx) => {
                    if let Err(oneshot::error::TryRecvError::Empty) = rx.try_recv() {
                        still.push(Waiting::Other(rx));
                    }
                }
            }
        }
        self.waiting = still;
    }

    /// Sessions whose appends were lost end with store_error (as the registry does).
    fn collect_failures(&mut self) {
        let mut failed = Vec::new();
        if let Some(rx) = self.failures.as_mut() {
            while let Ok(id) = rx.try_recv() {
                failed.push(id);
            }
        }
        for id in failed {
            let Some(log) = self.store().lock_logs().get(&id).cloned() else {
                continue;
            };
            let evs = self.answers_owed(&id);
            self.push_end(&log, EndReason::StoreError, evs);
        }
    }

    /// -32091 answers for the session's requests in flight (they are being answered now).
    fn answers_owed(&mut self, id: &SessionId) -> Vec<NewEvent> {
        let Some(s) = self.sessions.get_mut(id) else {
            return Vec::new();
        };
        s.ending = true;
        let mut evs = Vec::new();
        for (req, r) in s.reqs.iter_mut() {
            if *r == Req::InFlight {
                *r = Req::Answering;
                let mut ev = NewEvent::new(
                    StreamTag::LEGACY,
                    Kind::Final,
                    Bytes::from(format!("{{\"id\":{req},\"error\":{{\"code\":-32091}}}}")),
                );
                ev.completes = Some(req.clone());
                evs.push(ev);
            }
        }
        evs
    }

    /// Every client reads what was published; ids are checked against all ever read.
    fn read_all(&mut self) {
        let logs: Vec<Arc<SessionLog>> = {
            let mut v: Vec<_> = self.store().lock_logs().values().cloned().collect();
            v.sort_by_key(|l| l.id);
            v
        };
        let present: BTreeSet<SessionId> = logs.iter().map(|l| l.id).collect();
        let mut back = Vec::new();
        for (id, s) in self.sessions.iter_mut() {
            if !present.contains(id) {
                // Removed or evicted while running.
                s.may_be_gone = true;
            } else if s.removed {
                back.push(*id);
            }
        }
        for id in back {
            self.violation(format!(
                "session {id} removed (acknowledged) but still held"
            ));
            if let Some(s) = self.sessions.get_mut(&id) {
                s.removed = false;
            }
        }
        for log in logs {
            let id = log.id;
            let Some(s) = self.sessions.get(&id) else {
                continue;
            };
            let after = s.cursor.map_or(0, |(_, q)| q);
            let evs = match read_after(&log, after, usize::MAX) {
                Ok(e) => e,
                Err(e) => {
                    // A chunk damaged under a reader: it must be refused from now on.
                    tracing::debug!(error = %e, "sim read failed");
                    continue;
                }
            };
            let ranges = log.ranges();
            let mut violations = Vec::new();
            let s = self.sessions.get_mut(&id).expect("present");
            s.oldest_seen = s.oldest_seen.max(ranges.oldest);
            let mut expect = after + 1;
            for ev in evs {
                if ev.seq != expect {
                    if expect >= ranges.oldest {
                        violations.push(format!(
                            "session {id}: read after {after} jumped from {expect} to {}",
                            ev.seq
                        ));
                    } else {
                        // Trimmed under a slow client: a live client gets cursor_trimmed and
                        // re-queries its work; answers it skipped are not the oracle's to know.
                        self.rep.trimmed_cursors += 1;
                        s.reqs.retain(|_, r| *r == Req::Registering);
                    }
                }
                expect = ev.seq + 1;
                let key = (id, ev.epoch, ev.seq);
                match self.ids.get(&key) {
                    Some(p) if *p != ev.payload => violations.push(format!(
                        "id {id}:{}:{} reused with other bytes",
                        ev.epoch, ev.seq
                    )),
                    Some(_) => {}
                    None => {
                        self.ids.insert(key, ev.payload.clone());
                    }
                }
                self.rep.events_read += 1;
                s.cursor = Some((ev.epoch, ev.seq));
                s.read.insert(ev.seq, (ev.epoch, ev.payload.clone()));
                match ev.kind {
                    Kind::End => {
                        s.ended = true;
                        s.ending = true;
                    }
                    Kind::Final => {
                        if let Some(req) = answer_of(&ev.payload) {
                            s.reqs.remove(&req);
                            s.answered.insert(req);
                        }
                    }
                    _ => {}
                }
            }
            // Memory stays bounded: what is trimmed is no longer checked.
            let oldest = ranges.oldest;
            s.read.retain(|q, _| *q >= oldest);
            for v in violations {
                self.violation(v);
            }
        }
    }

    /// What the data dir holds for sure (what `inspect` sees after a `syncfs`, the ext4
    /// harness's look): an ended session is retained whole or not at all — nothing trims it, and an
    /// eviction never leaves part of it — so once its end was read, its oldest retained seq in
    /// the data dir never grows. Not asked after a flipped bit that may have hit it, or of a file
    /// system that lied about a sync.
    fn check_disk(&mut self) {
        if self.flipped_unknown || self.fs.lies() > 0 {
            return;
        }
        let Ok(img) = Image::scan_in(Arc::new(self.fs.durable_view())) else {
            return;
        };
        let mut violations = Vec::new();
        for (id, s) in self.sessions.iter_mut() {
            if !s.ended || s.flipped {
                continue;
            }
            let Some(oldest) = img.sessions.get(id).map(|i| i.retained().oldest) else {
                continue;
            };
            if std::env::var("SIM_TRACE").is_ok() {
                let i = &img.sessions[id];
                let chunks: Vec<_> = i
                    .chunks
                    .values()
                    .map(|c| (c.first, c.count, c.epoch))
                    .collect();
                eprintln!(
                    "TRACE step {} disk {id}: oldest {oldest} trim {:?} epochs {:?} chunks {:?}",
                    self.step,
                    i.trim,
                    i.meta.as_ref().map(|(m, _)| m.epochs.clone()),
                    chunks
                );
            }
            match s.disk_oldest {
                None => s.disk_oldest = Some(oldest),
                Some(o) if oldest > o => violations.push(format!(
                    "ended session {id}: the data dir retained it from seq {o}, now from {oldest}"
                )),
                Some(_) => {}
            }
        }
        for v in violations {
            self.violation(v);
        }
    }

    // --- the workload ---

    fn live_sessions(&self) -> Vec<SessionId> {
        self.sessions
            .iter()
            .filter(|(_, s)| s.log.is_some() && !s.ending && s.created)
            .map(|(id, _)| *id)
            .collect()
    }

    fn pick(&mut self, v: &[SessionId]) -> Option<SessionId> {
        (!v.is_empty()).then(|| v[self.rng.below(v.len() as u64) as usize])
    }

    async fn step(&mut self) {
        self.step += 1;
        if self.step.is_multiple_of(50) {
            self.unix += 1;
            FIXED_UNIX.with(|c| c.set(Some(self.unix)));
        }
        let live = self.live_sessions();
        let roll = if self.flood > 0 {
            // A sustained flood: nothing but large appends, so compaction must keep pace with
            // what each turn writes (the disk bound) or the writer must throttle.
            self.flood -= 1;
            for id in live.iter().take(3) {
                self.append_large(*id);
            }
            1000
        } else {
            self.rng.below(1000)
        };
        match roll {
            0..=59 if live.len() < 12 => {
                self.create();
            }
            0..=519 => {
                if let Some(id) = self.pick(&live) {
                    self.append(id);
                } else {
                    self.create();
                }
            }
            520..=579 => {
                if let Some(id) = self.pick(&live) {
                    self.register(id);
                }
            }
            580..=659 => {
                if let Some(id) = self.pick(&live) {
                    self.answer(id);
                }
            }
            660..=689 => {
                if let Some(id) = self.pick(&live) {
                    let log = self.sessions[&id].log.clone().expect("live");
                    let evs = self.answers_owed(&id);
                    let reason = if self.rng.chance(1, 2) {
                        EndReason::TaskFinished
                    } else {
                        EndReason::ClientDelete
                    };
                    self.push_end(&log, reason, evs);
                }
            }
            690..=709 => {
                // Ended or ending (its end may be in the same turn as the remove).
                let ended: Vec<SessionId> = self
                    .sessions
                    .iter()
                    .filter(|(_, s)| s.ending && s.log.is_some())
                    .map(|(id, _)| *id)
                    .collect();
                if let Some(id) = self.pick(&ended) {
                    let (done, rx) = oneshot::channel();
                    self.ops.push(Op::Remove { session: id, done });
                    self.waiting.push(Waiting::Remove(id, rx));
                    if let Some(s) = self.sessions.get_mut(&id) {
                        s.may_be_gone = true;
                    }
                }
            }
            710..=719 => {
                let (done, rx) = oneshot::channel();
                let target = self.cfg.max_total_bytes / 2;
                self.ops.push(Op::MakeRoom { target, done });
                self.waiting.push(Waiting::Other(rx));
            }
            720..=739 => {
                let (done, rx) = oneshot::channel();
                self.ops.push(Op::Flush { done });
                self.waiting.push(Waiting::Other(rx));
            }
            740..=744 => self.crash(true).await,
            745..=747 => self.crash(false).await,
            748..=749 => self.clean_restart().await,
            750..=753 => {
                // The disk fills up: little room beyond what is used now.
                let mut f = self.fs.faults();
                f.capacity = Some(self.fs.used() + self.rng.below(64 << 10));
                self.fs.set_faults(f);
            }
            754..=763 => {
                let mut f = self.fs.faults();
                f.capacity = None;
                self.fs.set_faults(f);
            }
            764..=766 => self.flood = 30 + self.rng.below(31) as u32,
            _ => {}
        }
        // Turns: usually one, sometimes ops pile up (group commit), sometimes several.
        let turns = match self.rng.below(10) {
            0 => 0,
            1 => 3,
            _ => 1,
        };
        if self.step.is_multiple_of(16) {
            self.check_disk();
        }
        for _ in 0..turns {
            self.turn().await;
            if self.failed() {
                self.rep.failed += 1;
                if self.rng.chance(1, 2) {
                    // The operator frees space before the restart.
                    let mut f = self.fs.faults();
                    f.capacity = None;
                    self.fs.set_faults(f);
                }
                // Exit 74; the orchestrator restarts it (after a kill or a power loss).
                let power = self.rng.chance(1, 2);
                self.crash(power).await;
                break;
            }
        }
    }

    fn failed(&self) -> bool {
        self.store
            .as_ref()
            .is_some_and(|s| *s.health.borrow() == Health::Failed)
    }

    fn create(&mut self) -> Option<SessionId> {
        let store = self.store.as_ref()?;
        let mut b = [0u8; 16];
        b[..8].copy_from_slice(&self.rng.next().to_be_bytes());
        b[8..].copy_from_slice(&self.rng.next().to_be_bytes());
        let id = SessionId(b);
        let log = super::new_session_log(store, id, Facade::Legacy, None, None);
        let (done, rx) = oneshot::channel();
        self.ops.push(Op::Create {
            log: log.clone(),
            done,
        });
        self.waiting.push(Waiting::Create(id, rx));
        self.sessions.insert(
            id,
            SimSession {
                log: Some(log),
                oldest_seen: 1,
                ..Default::default()
            },
        );
        self.rep.sessions += 1;
        Some(id)
    }

    fn append(&mut self, id: SessionId) {
        let most = if self.rng.chance(1, 10) { 60 } else { 6 };
        let n = 1 + self.rng.below(most);
        let s = self.sessions.get_mut(&id).expect("live");
        let log = s.log.clone().expect("live");
        let mut evs = Vec::new();
        for _ in 0..n {
            s.next_payload += 1;
            let p = payload(&id, s.next_payload, &mut self.rng);
            evs.push(NewEvent::new(StreamTag::LEGACY, Kind::Message, p));
        }
        let done = if self.rng.chance(1, 2) {
            let (d, rx) = oneshot::channel();
            self.waiting.push(Waiting::Other(rx));
            Some(d)
        } else {
            None
        };
        self.ops.push(Op::Append {
            log,
            evs,
            done,
            _permit: None,
        });
    }

    /// Three events of 2 to 6 KiB.
    fn append_large(&mut self, id: SessionId) {
        let s = self.sessions.get_mut(&id).expect("live");
        let log = s.log.clone().expect("live");
        let mut evs = Vec::new();
        for _ in 0..3 {
            s.next_payload += 1;
            let pad = 2048 + self.rng.below(adv_env("SIM_PAD").unwrap_or(4096)) as usize;
            let p = payload_padded(&id, s.next_payload, pad);
            evs.push(NewEvent::new(StreamTag::LEGACY, Kind::Message, p));
        }
        self.ops.push(Op::Append {
            log,
            evs,
            done: None,
            _permit: None,
        });
    }

    fn register(&mut self, id: SessionId) {
        let s = self.sessions.get_mut(&id).expect("live");
        s.next_payload += 1;
        let req = format!("{}", s.next_payload);
        s.reqs.insert(req.clone(), Req::Registering);
        let log = s.log.clone().expect("live");
        let (done, rx) = oneshot::channel();
        self.ops.push(Op::Inflight {
            log,
            request_id: req.clone(),
            stream: StreamTag::LEGACY,
            done,
        });
        self.waiting.push(Waiting::Inflight(id, req, rx));
    }

    fn answer(&mut self, id: SessionId) {
        let s = self.sessions.get_mut(&id).expect("live");
        let Some(req) = s
            .reqs
            .iter()
            .find(|(_, r)| **r == Req::InFlight)
            .map(|(q, _)| q.clone())
        else {
            return;
        };
        s.reqs.insert(req.clone(), Req::Answering);
        let log = s.log.clone().expect("live");
        let mut ev = NewEvent::new(
            StreamTag::LEGACY,
            Kind::Final,
            Bytes::from(format!("{{\"id\":{req},\"result\":{{}}}}")),
        );
        ev.completes = Some(req);
        self.ops.push(Op::Append {
            log,
            evs: vec![ev],
            done: None,
            _permit: None,
        });
    }

    /// A power loss (or a kill: the page cache survives), maybe a flipped bit at rest, then a
    /// new process.
    async fn crash(&mut self, power: bool) {
        self.stop_process();
        if power {
            self.fs.power_loss();
            self.rep.power_losses += 1;
        } else {
            self.rep.kills += 1;
        }
        self.maybe_flip();
        self.start().await;
    }

    /// Sometimes a bit flips at rest.
    fn maybe_flip(&mut self) {
        if self.rng.chance(1, 6) {
            if let Some(hit) = self.fs.flip_synced_bit() {
                self.rep.bit_flips += 1;
                match hit {
                    Some(id) => {
                        self.excused.insert(id);
                        if let Some(s) = self.sessions.get_mut(&id) {
                            s.flipped = true;
                        }
                    }
                    None => {
                        self.excuse_all = true;
                        self.flipped_unknown = true;
                    }
                }
            }
        }
    }

    /// A clean stop (the close op), then a new process.
    async fn clean_restart(&mut self) {
        let (done, mut rx) = oneshot::channel();
        self.ops.push(Op::Close { done });
        for _ in 0..4 {
            self.turn().await;
            if self.writer.is_none()
                || !matches!(rx.try_recv(), Err(oneshot::error::TryRecvError::Empty))
            {
                break;
            }
        }
        self.rep.clean_stops += 1;
        self.stop_process();
        self.maybe_flip();
        self.start().await;
    }

    async fn run(mut self, steps: u64) -> Report {
        let fail_ppm = [0, 1000, 5000][self.rng.below(3) as usize];
        let lie_ppm = [0, 0, 3000][self.rng.below(3) as usize];
        self.fs.set_faults(Faults {
            fail_ppm,
            capacity: None,
            lie_ppm,
        });
        FIXED_UNIX.with(|c| c.set(Some(self.unix)));
        self.start().await;
        for _ in 0..steps {
            self.step().await;
        }
        // The end: power goes once more, and every check runs on what is left.
        self.crash(true).await;
        self.rep.seeds = 1;
        self.rep.steps = steps;
        self.rep.injected_faults = self.fs.injected();
        FIXED_UNIX.with(|c| c.set(None));
        self.rep
    }
}

/// The request id an answer payload carries (the workload's own format).
fn answer_of(payload: &[u8]) -> Option<String> {
    let v: serde_json::Value = serde_json::from_slice(payload).ok()?;
    Some(v.get("id")?.to_string())
}

/// Runs one seed.
pub fn run_seed(seed: u64, steps: u64) -> Report {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("runtime");
    rt.block_on(Sim::new(seed).run(steps))
}

/// Runs a profile.
pub fn run(p: &Profile) -> Report {
    let mut total = Report::default();
    for seed in p.first_seed..p.first_seed + p.seeds {
        total.add(&run_seed(seed, p.steps));
    }
    total
}

#[cfg(test)]
mod tests {
    use super::super::record;
    use super::*;

    fn env_u64(name: &str, default: u64) -> u64 {
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    }

    /// The CI profile: thousands of seeds in a few minutes. `SIM_SEEDS`, `SIM_STEPS` and
    /// `SIM_FIRST_SEED` choose another (`scripts/sim-long` runs the long one).
    #[test]
    fn simulated_faults_break_no_invariant() {
        let p = Profile {
            seeds: env_u64("SIM_SEEDS", 2000),
            first_seed: env_u64("SIM_FIRST_SEED", 1),
            steps: env_u64("SIM_STEPS", 300),
        };
        let rep = run(&p);
        let name = std::env::var("SIM_PROFILE").unwrap_or_else(|_| "short".into());
        println!("{}", rep.line(&name, p.first_seed));
        for v in rep.violations.iter().take(20) {
            println!("violation: {v}");
        }
        assert!(
            rep.violations.is_empty(),
            "{} violations",
            rep.violations.len()
        );
        // The run explored what it claims to.
        assert!(rep.power_losses > 0 && rep.bit_flips > 0 && rep.injected_faults > 0);
        assert!(rep.damage_found > 0 && rep.degraded > 0 && rep.events_read > 0);
    }

    #[test]
    fn a_seed_reproduces_its_run() {
        let a = run_seed(42, 400);
        let b = run_seed(42, 400);
        assert_eq!(a, b);
        assert!(a.turns > 400 && a.events_read > 0);
    }

    // === one test per finding of issue 15, each over the simulated file system ===

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap()
    }

    /// A simulator without random faults, generous limits, small segments.
    fn manual(durability: Durability) -> Sim {
        let mut sim = Sim::new(1);
        sim.cfg.durability = durability;
        sim.cfg.max_events_per_session = 10_000;
        sim.cfg.max_bytes_per_session = 1 << 30;
        sim.cfg.max_total_bytes = 1 << 30;
        sim.seg_size = 1 << 30;
        sim.sync_every = super::super::pagecache::SYNC_EVERY;
        sim.fs.set_faults(Faults::default());
        sim
    }

    fn send(sim: &mut Sim, id: SessionId, payload: &str) {
        let log = sim.sessions[&id].log.clone().unwrap();
        let ev = NewEvent::new(
            StreamTag::LEGACY,
            Kind::Message,
            Bytes::from(payload.to_owned()),
        );
        sim.ops.push(Op::Append {
            log,
            evs: vec![ev],
            done: None,
            _permit: None,
        });
    }

    /// Bounds the bytes the simulated files may take (`None`: no bound).
    fn set_capacity(sim: &Sim, bytes: Option<u64>) {
        let mut f = sim.fs.faults();
        f.capacity = bytes;
        sim.fs.set_faults(f);
    }

    fn log_of(sim: &Sim, id: SessionId) -> Option<Arc<SessionLog>> {
        sim.store().lock_logs().get(&id).cloned()
    }

    fn payloads(log: &SessionLog) -> Vec<(u32, u64, String)> {
        read_after(log, 0, usize::MAX)
            .unwrap()
            .iter()
            .map(|e| {
                let p = String::from_utf8_lossy(&e.payload).into_owned();
                (e.epoch, e.seq, p)
            })
            .collect()
    }

    /// The client deletes session `id`: its end, then its remove, each in a turn of its own.
    async fn delete(sim: &mut Sim, id: SessionId) {
        let log = log_of(sim, id).unwrap();
        sim.push_end(&log, EndReason::ClientDelete, Vec::new());
        sim.turn().await;
        let (done, _rx) = oneshot::channel();
        sim.ops.push(Op::Remove { session: id, done });
        sim.turn().await;
    }

    async fn restart(sim: &mut Sim, loss: Loss) {
        sim.stop_process();
        sim.fs.power_loss_with(loss);
        sim.start().await;
    }

    fn cursor(id: SessionId, epoch: u32, seq: u64) -> Cursor {
        Cursor {
            session: id,
            epoch,
            seq,
        }
    }

    /// Finding: "a flipped bit cuts acknowledged events silently" — a bad record in the newest
    /// segment's synced part was a torn tail: the fsync-acknowledged records after it (of every
    /// session) were cut, nothing was counted or sealed, and ids were reused.
    #[test]
    fn a_flipped_bit_in_synced_data_is_damage_not_a_torn_tail() {
        rt().block_on(async {
            let mut sim = manual(Durability::Fsync);
            sim.start().await;
            let (a, b) = (sim.create().unwrap(), sim.create().unwrap());
            sim.turn().await;
            for i in 0..30 {
                send(&mut sim, a, &format!("a-{i:02}"));
                send(&mut sim, b, &format!("b-{i:02}"));
                sim.turn().await;
            }
            let (name, at) = sim.fs.find(b"a-09").unwrap();
            sim.fs.flip_at(&name, at + 2);
            sim.excused.insert(a);
            restart(&mut sim, Loss::All).await;
            sim.turn().await;
            assert_eq!(sim.rep.violations, Vec::<String>::new());
            assert_eq!(sim.rep.damage_found, 1, "counted");
            let lb = log_of(&sim, b).unwrap();
            let got: Vec<String> = payloads(&lb)
                .into_iter()
                .map(|(_, _, p)| p)
                .take(30)
                .collect();
            let want: Vec<String> = (0..30).map(|i| format!("b-{i:02}")).collect();
            assert_eq!(got, want, "the other session lost nothing");
            let la = log_of(&sim, a).unwrap();
            let r = la.ranges();
            assert_eq!(
                r.epochs[0].last,
                Some(9),
                "sealed at the last intact event: {r:?}"
            );
            assert_eq!((r.epochs[1].epoch, r.epochs[1].first), (2, 10));
            assert_eq!(check_resume(&cursor(a, 1, 5), &r, false), Ok(5));
            for past in [10, 11, 29] {
                assert_eq!(
                    check_resume(&cursor(a, 1, past), &r, false),
                    Err(Refusal::CursorAhead),
                    "into or past the damage"
                );
            }
            let served = payloads(&la);
            let before: Vec<String> = served.iter().take(9).map(|(_, _, p)| p.clone()).collect();
            let want: Vec<String> = (0..9).map(|i| format!("a-{i:02}")).collect();
            assert_eq!(before, want);
            assert_eq!((served[9].0, served[9].1), (2, 10), "then the new epoch");
        });
    }

    /// Finding: "one corrupt record in the oldest segment stops compaction forever and spins the
    /// writer": compaction skips the damage (its session loses what is up to it), deletes the
    /// segment and goes on; the writer never spins.
    #[test]
    fn damage_in_the_oldest_segment_neither_stops_compaction_nor_spins() {
        rt().block_on(async {
            let mut sim = manual(Durability::Fsync);
            sim.cfg.max_total_bytes = 192 << 10;
            sim.cfg.max_events_per_session = 50;
            sim.seg_size = 16 << 10;
            sim.start().await;
            let (a, b) = (sim.create().unwrap(), sim.create().unwrap());
            sim.turn().await;
            send(&mut sim, a, "a-kept-early");
            send(&mut sim, a, "a-kept-late");
            sim.turn().await;
            send(&mut sim, a, "a-after");
            sim.turn().await;
            let (name, at) = sim.fs.find(b"a-kept-early").unwrap();
            sim.fs.flip_at(&name, at);
            let mut deleted = false;
            for i in 0..3000 {
                send(&mut sim, b, &format!("b-{i}-{}", "x".repeat(200)));
                sim.turn().await;
                if sim.fs.list().unwrap().iter().all(|n| *n != name) {
                    deleted = true;
                    break;
                }
            }
            assert!(deleted, "compaction went past the damaged record");
            assert_eq!(sim.store().metrics.store_damage.get(), 1);
            assert_eq!(sim.rep.violations, Vec::<String>::new());
            let la = log_of(&sim, a).unwrap();
            assert_eq!(
                la.ranges().oldest,
                3,
                "the damaged chunk and what was before it go"
            );
            assert_eq!(payloads(&la), vec![(1, 3, "a-after".to_string())]);
            assert_eq!(*sim.store().health.borrow(), Health::Ok);
        });
    }

    /// Finding: "segment-delete errors are only logged" — a compacted segment that cannot be
    /// deleted keeps its bytes on disk while the log believed them gone (the bound breaks), and a
    /// segment that comes back later can bring back records newer ones no longer supersede. A
    /// failed delete is fatal now, the segment kept and still counted.
    #[test]
    fn a_failed_segment_delete_is_fatal() {
        rt().block_on(async {
            let mut sim = manual(Durability::Fsync);
            sim.cfg.max_total_bytes = 192 << 10;
            sim.cfg.max_events_per_session = 50;
            sim.seg_size = 16 << 10;
            sim.start().await;
            let b = sim.create().unwrap();
            sim.turn().await;
            // The next remove of a file is a compacted segment's (nothing else deletes files
            // while the log is healthy).
            sim.fs.fail_next(Call::Remove, 5);
            let first = sim.fs.list().unwrap()[0].clone();
            let mut failed = false;
            for i in 0..3000 {
                send(&mut sim, b, &format!("b-{i}-{}", "x".repeat(200)));
                sim.turn().await;
                if sim.failed() {
                    failed = true;
                    break;
                }
            }
            assert!(
                failed,
                "a segment that could not be deleted left the log healthy"
            );
            assert!(
                sim.fs.list().unwrap().contains(&first),
                "the segment is still there"
            );
        });
    }

    /// Finding: "an end and a remove of one session in the same turn resurrect it".
    #[test]
    fn an_end_and_a_remove_in_one_turn_stay_removed() {
        rt().block_on(async {
            let mut sim = manual(Durability::Fsync);
            sim.start().await;
            let a = sim.create().unwrap();
            sim.turn().await;
            send(&mut sim, a, "a-1");
            sim.turn().await;
            let log = log_of(&sim, a).unwrap();
            sim.push_end(&log, EndReason::TaskFinished, Vec::new());
            let (done, _rx) = oneshot::channel();
            sim.ops.push(Op::Remove { session: a, done });
            sim.turn().await;
            assert!(log_of(&sim, a).is_none(), "gone in memory");
            restart(&mut sim, Loss::All).await;
            assert!(log_of(&sim, a).is_none(), "gone after a restart");
        });
    }

    /// With `relaxed`, the writer syncs once `SYNC_EVERY` bytes are unsynced, so that the
    /// page-cache trim finds clean pages to drop (docs/benchmarks.md round 8); between those syncs
    /// it still does not sync. Fails if the periodic sync goes (pending grows to the whole log)
    /// or if relaxed turns sync each time (pending never reaches the bound).
    #[test]
    fn relaxed_syncs_once_a_trim_step_is_unsynced_and_not_before() {
        rt().block_on(async {
            let mut sim = manual(Durability::Relaxed);
            sim.start().await;
            let a = sim.create().unwrap();
            sim.turn().await;
            sim.register(a);
            sim.turn().await;
            let active = sim
                .fs
                .list()
                .unwrap()
                .into_iter()
                .filter(|n| n.ends_with(".seg"))
                .max()
                .unwrap();
            let every = super::super::pagecache::SYNC_EVERY as usize;
            let event = 64 << 10;
            let (mut most, mut syncs, mut before) = (0, 0, 0);
            for i in 0..(3 * every / event) {
                send(&mut sim, a, &format!("a-{i}-{}", "x".repeat(event)));
                sim.turn().await;
                let pending = sim.fs.pending(&active);
                if pending < before {
                    syncs += 1;
                }
                (most, before) = (most.max(pending), pending);
            }
            // `pending` counts writes not yet synced: one per turn here, each a little over
            // `event` bytes.
            let step = every / event;
            assert!(syncs >= 2, "{syncs} periodic syncs over three steps");
            assert!(
                most + 1 >= step,
                "relaxed turns sync only at the step: at most {most} writes pending"
            );
            assert!(
                most <= step + 1,
                "{most} writes of {event} bytes left unsynced, the step is {every} bytes"
            );
            assert_eq!(sim.rep.violations, Vec::<String>::new());
        });
    }

    /// Finding: "relaxed mode: a task's outcome flips" — its final record was never synced:
    /// `completed`, then `failed -32091` after a power loss. Ends are durable in both modes.
    #[test]
    fn relaxed_a_final_answer_survives_a_power_loss() {
        rt().block_on(async {
            let mut sim = manual(Durability::Relaxed);
            sim.start().await;
            let a = sim.create().unwrap();
            sim.turn().await;
            send(&mut sim, a, "a-progress");
            let log = log_of(&sim, a).unwrap();
            let ev = NewEvent::new(
                StreamTag::LEGACY,
                Kind::Final,
                Bytes::from_static(b"{\"id\":\"task\",\"result\":\"completed\"}"),
            );
            sim.push_end(&log, EndReason::TaskFinished, vec![ev]);
            sim.turn().await;
            restart(&mut sim, Loss::All).await;
            let log = log_of(&sim, a).expect("kept");
            assert_eq!(log.ended(), Some(EndReason::TaskFinished));
            let p: Vec<String> = payloads(&log).into_iter().map(|(_, _, p)| p).collect();
            assert_eq!(p[0], "a-progress");
            assert!(p[1].contains("completed"), "{p:?}");
        });
    }

    /// Found by the simulator's oracle (answered, then owed again): in relaxed mode an answer
    /// was not synced, so after a power loss its request was answered `-32091` a second time.
    #[test]
    fn relaxed_an_answer_survives_a_power_loss() {
        rt().block_on(async {
            let mut sim = manual(Durability::Relaxed);
            sim.start().await;
            let a = sim.create().unwrap();
            sim.turn().await;
            sim.register(a);
            sim.turn().await;
            sim.answer(a);
            sim.turn().await;
            assert!(sim.sessions[&a].answered.contains("1"));
            restart(&mut sim, Loss::All).await;
            assert_eq!(sim.rep.violations, Vec::<String>::new());
            let evs = payloads(&log_of(&sim, a).unwrap());
            assert!(evs[0].2.contains("\"result\""), "{evs:?}");
        });
    }

    /// Finding: "ENOSPC from fdatasync is treated as recoverable" — what it covered is unknown
    /// (fsyncgate): the log fails for good.
    #[test]
    fn out_of_space_from_fdatasync_is_fatal() {
        rt().block_on(async {
            let mut sim = manual(Durability::Fsync);
            sim.start().await;
            let a = sim.create().unwrap();
            sim.turn().await;
            sim.fs.fail_next(Call::Sync, 28);
            send(&mut sim, a, "a-1");
            sim.turn().await;
            assert_eq!(*sim.store().health.borrow(), Health::Failed);
        });
    }

    /// Seed 18365 of the long profile: in relaxed mode the sync before a rotation failed and
    /// lost what it held (fsyncgate: the pages stay readable, clean, never written); the turn
    /// went on after the fatal error, its sync succeeded without writing them and its mark
    /// called them synced. After a power loss the hole was taken for damage in synced data,
    /// not for the torn tail it is: an answer a client had read was owed again.
    #[test]
    fn nothing_is_written_after_a_failed_sync_of_a_rotation() {
        rt().block_on(async {
            let mut sim = manual(Durability::Relaxed);
            sim.seg_size = 8 << 10;
            sim.start().await;
            let a = sim.create().unwrap();
            sim.turn().await;
            sim.register(a);
            sim.turn().await;
            // Unsynced (relaxed), and past the segment size: the next turn rotates.
            for i in 0..4 {
                send(&mut sim, a, &format!("a-{i}-{}", "x".repeat(2100)));
                sim.turn().await;
            }
            let segs = sim.fs.list().unwrap();
            assert_eq!(segs.iter().filter(|n| n.ends_with(".seg")).count(), 1);
            sim.fs.fail_next(Call::SyncForgets, 5);
            // An answer: a turn that syncs (in relaxed mode too).
            sim.answer(a);
            sim.writer.as_mut().unwrap().turn(&mut sim.ops);
            assert_eq!(*sim.store().health.borrow(), Health::Failed);
            assert_eq!(
                sim.fs.list().unwrap(),
                segs,
                "no rotation after the failed sync"
            );
            restart(&mut sim, Loss::All).await;
            assert_eq!(sim.rep.damage_found, 0, "a torn tail, not damage");
            assert_eq!(sim.rep.violations, Vec::<String>::new());
        });
    }

    /// Finding: "the cut of a failed write is not synced before its seqs are reused".
    #[test]
    fn the_cut_of_a_failed_write_is_synced() {
        rt().block_on(async {
            let mut sim = manual(Durability::Relaxed);
            sim.start().await;
            let a = sim.create().unwrap();
            sim.turn().await;
            send(&mut sim, a, "a-1");
            sim.turn().await;
            sim.fs.fail_next(Call::Write, 28);
            send(&mut sim, a, "a-2");
            sim.turn().await;
            assert_eq!(*sim.store().health.borrow(), Health::Degraded);
            let active = sim
                .fs
                .list()
                .unwrap()
                .into_iter()
                .filter(|n| n.ends_with(".seg"))
                .max()
                .unwrap();
            assert_eq!(sim.fs.pending(&active), 0, "cut and synced");
        });
    }

    /// Finding: "ids reused after two crashes" — recovery after a relaxed crash wrote this run's
    /// open record before the metas that carry the seal; a power cut that kept the open record
    /// and lost the seal made the next start skip sealing and reuse ids clients held.
    #[test]
    fn ids_are_not_reused_after_a_crash_during_recovery() {
        rt().block_on(async {
            let mut sim = manual(Durability::Relaxed);
            sim.start().await;
            let a = sim.create().unwrap();
            let (done, _rx) = oneshot::channel();
            sim.ops.push(Op::Flush { done });
            sim.turn().await;
            for i in 1..=10 {
                send(&mut sim, a, &format!("shown-{i}"));
            }
            sim.turn().await;
            assert_eq!(sim.rep.events_read, 10, "clients read them");
            // Power goes: the ten events (never synced) are lost.
            sim.stop_process();
            sim.fs.power_loss_with(Loss::All);
            // The next start (fsync) crashes in its first sync, keeping the first bytes of
            // that turn: its mark and the record after it.
            // (What the oracle may ask of them is what relaxed mode promised: refusals.)
            sim.excuse_all = true;
            sim.cfg.durability = Durability::Fsync;
            // Recovery syncs the newest segment, then the new one it creates; the third sync
            // is the first turn's (and its cut fails too, so the process dies with the turn's
            // bytes written).
            sim.fs.fail_after(Call::Sync, 2, 5);
            sim.fs.fail_next(Call::Truncate, 5);
            assert!(sim.try_start().is_err());
            let newest = super::super::segment::file_name(2);
            assert!(
                sim.fs.pending(&newest) > 0,
                "the first turn was written, not synced"
            );
            sim.stop_process();
            let keep = record::MARK_LEN + record::FRAME + 1 + 9;
            sim.fs.power_loss_with(Loss::KeepBytes(keep));
            sim.start().await;
            for _ in 0..3 {
                sim.turn().await;
            }
            assert_eq!(sim.rep.violations, Vec::<String>::new());
            let r = log_of(&sim, a).unwrap().ranges();
            assert_eq!(
                check_resume(&cursor(a, 1, 5), &r, false),
                Err(Refusal::CursorAhead),
                "{r:?}"
            );
        });
    }

    /// Finding (low): "owed records on a failed turn" were lost with it.
    #[test]
    fn records_owed_survive_a_failed_turn() {
        rt().block_on(async {
            let mut sim = manual(Durability::Fsync);
            sim.cfg.max_events_per_session = 10;
            sim.start().await;
            let a = sim.create().unwrap();
            sim.turn().await;
            for i in 0..30 {
                send(&mut sim, a, &format!("a-{i}"));
            }
            // This turn trims the session and owes the trim record; the next write fails.
            sim.turn().await;
            let oldest = log_of(&sim, a).unwrap().ranges().oldest;
            assert!(oldest > 1);
            sim.fs.fail_next(Call::Write, 28);
            sim.turn().await;
            assert_eq!(*sim.store().health.borrow(), Health::Degraded);
            for _ in 0..5 {
                sim.turn().await;
            }
            assert_eq!(*sim.store().health.borrow(), Health::Ok, "healed");
            let img = Image::scan_in(Arc::new(sim.fs.clone())).unwrap();
            assert_eq!(img.sessions[&a].trim.map(|(t, _)| t), Some(oldest));
        });
    }

    // === adversarial review (branch `adversary`): each test fails on the code it was written on ===

    /// Relaxed mode: a turn's mark claims what was synced *before* the turn, so what the last
    /// synced turn (here a task's end) made durable lies past every mark's claim. One flipped
    /// bit in an earlier turn's chunk of another session is then read as a torn tail: the cut
    /// takes every session's events after it, and the end a client read (synced) is gone —
    /// the session is live again after the restart, and no damage is counted.
    #[test]
    fn relaxed_a_flipped_bit_before_a_synced_end_does_not_cut_the_end() {
        rt().block_on(async {
            let mut sim = manual(Durability::Relaxed);
            sim.start().await;
            let (a, b) = (sim.create().unwrap(), sim.create().unwrap());
            sim.turn().await;
            for i in 0..10 {
                send(&mut sim, a, &format!("a-{i:02}"));
                send(&mut sim, b, &format!("b-{i:02}"));
                sim.turn().await;
            }
            // B's end (with its final answer) is synced, as relaxed mode promises: the sync
            // covers every turn before it.
            let lb = log_of(&sim, b).unwrap();
            let fin = NewEvent::new(
                StreamTag::LEGACY,
                Kind::Final,
                Bytes::from_static(b"{\"id\":\"task\",\"result\":\"completed\"}"),
            );
            sim.push_end(&lb, EndReason::TaskFinished, vec![fin]);
            sim.turn().await;
            assert!(sim.sessions[&b].ended, "the client read B's end");
            let active = super::super::segment::file_name(1);
            assert_eq!(sim.fs.pending(&active), 0, "everything is synced");
            sim.stop_process();
            sim.fs.power_loss_with(Loss::All);
            // A bit flips at rest in A's event of the fourth turn (synced data).
            let (name, at) = sim.fs.find(b"a-03").unwrap();
            sim.fs.flip_at(&name, at + 2);
            assert!(sim.try_start().is_ok());
            let lb = log_of(&sim, b).unwrap();
            assert_eq!(
                lb.ended(),
                Some(EndReason::TaskFinished),
                "B's synced end survives damage to A's record"
            );
            let got: Vec<String> = payloads(&lb).into_iter().map(|(_, _, p)| p).collect();
            assert_eq!(got.len(), 12, "B lost nothing: {got:?}");
            assert_eq!(
                sim.rep.damage_found, 1,
                "a bad record in synced data is damage"
            );
        });
    }

    /// `reclaim_dead` (degraded) deletes any dead segment, not only the oldest: a newer dead
    /// segment can hold the record that supersedes records of an older live one (a remove,
    /// an in-flight record's end). Here the remove of session A goes with segment 2 while A's
    /// records stay in segment 1 (kept alive by session K): A, removed and acknowledged,
    /// comes back after a restart.
    #[test]
    fn reclaiming_a_newer_dead_segment_does_not_bring_a_removed_session_back() {
        rt().block_on(async {
            let mut sim = manual(Durability::Fsync);
            sim.seg_size = 16 << 10;
            sim.start().await;
            let (k, a) = (sim.create().unwrap(), sim.create().unwrap());
            sim.turn().await;
            send(&mut sim, a, "a-1");
            sim.turn().await;
            let la = log_of(&sim, a).unwrap();
            sim.push_end(&la, EndReason::ClientDelete, Vec::new());
            sim.turn().await;
            // K's live events fill segment 1.
            for i in 0..20 {
                send(&mut sim, k, &format!("k-{i}-{}", "x".repeat(1000)));
            }
            sim.turn().await;
            // Segment 2: the remove of A (acknowledged), then B's events, all dead once B goes.
            let (done, rx) = oneshot::channel();
            sim.ops.push(Op::Remove { session: a, done });
            sim.waiting.push(Waiting::Remove(a, rx));
            sim.turn().await;
            assert!(sim.sessions[&a].removed, "the remove is acknowledged");
            let b = sim.create().unwrap();
            sim.turn().await;
            for i in 0..20 {
                send(&mut sim, b, &format!("b-{i}-{}", "x".repeat(1000)));
            }
            sim.turn().await;
            let lb = log_of(&sim, b).unwrap();
            sim.push_end(&lb, EndReason::ClientDelete, Vec::new());
            let (done, _rx) = oneshot::channel();
            sim.ops.push(Op::Remove { session: b, done });
            sim.turn().await;
            let seg2 = super::super::segment::file_name(2);
            assert!(sim.fs.list().unwrap().contains(&seg2));
            // The disk fills up for one write; the degraded writer reclaims dead segments.
            sim.fs.fail_next(Call::Write, 28);
            let (done, _rx) = oneshot::channel();
            sim.ops.push(Op::Flush { done });
            sim.turn().await;
            sim.turn().await;
            // Segment 2 is dead but holds A's remove: it is kept (before the fix it was
            // reclaimed, and A came back after the restart).
            assert!(
                sim.fs.list().unwrap().contains(&seg2),
                "segment 2 holds a remove: kept"
            );
            restart(&mut sim, Loss::All).await;
            assert!(
                log_of(&sim, a).is_none(),
                "A was removed (acknowledged) and must stay removed"
            );
            assert_eq!(sim.rep.violations, Vec::<String>::new());
        });
    }

    /// A disk with no byte left: the only way out is to reclaim the segments of an ended session
    /// the app removes — but a segment whose records died by a remove may go only once that
    /// remove record is durable (`an_evicted_session_does_not_come_back_in_part`), and the record
    /// itself found no room: the log stayed degraded until `log.store_error_exit_secs` (seen
    /// under load in `tests/storage.rs a_full_disk_heals_in_process_by_reclaiming_dead_segments`).
    /// The log's reserve file is given up for the records it owes; then the segments go, the log
    /// is ready again with nothing freed from outside, and the reserve comes back.
    #[test]
    fn a_disk_with_no_byte_left_heals_by_the_reserve() {
        rt().block_on(async {
            let mut sim = manual(Durability::Fsync);
            sim.seg_size = 256 << 10;
            sim.start().await;
            let (k, b) = (sim.create().unwrap(), sim.create().unwrap());
            sim.turn().await;
            for i in 0..40 {
                send(&mut sim, b, &format!("b-{i}-{}", "x".repeat(60_000)));
                sim.turn().await;
            }
            let lb = log_of(&sim, b).unwrap();
            sim.push_end(&lb, EndReason::ClientDelete, Vec::new());
            sim.turn().await;
            send(&mut sim, k, "k-1");
            sim.turn().await;
            assert!(sim.fs.list().unwrap().contains(&".reserve".to_string()));
            // Not one byte more.
            set_capacity(&sim, Some(sim.fs.used()));
            send(&mut sim, k, &format!("k-2-{}", "y".repeat(4000)));
            sim.writer.as_mut().unwrap().turn(&mut sim.ops);
            assert_eq!(*sim.store().health.borrow(), Health::Degraded);
            // The app removes the ended session (its retention is over).
            let (done, _rx) = oneshot::channel();
            sim.ops.push(Op::Remove { session: b, done });
            for _ in 0..4 {
                tokio::time::advance(Duration::from_millis(1100)).await;
                sim.writer.as_mut().unwrap().turn(&mut sim.ops);
            }
            assert_eq!(
                *sim.store().health.borrow(),
                Health::Ok,
                "healed with nothing freed from outside"
            );
            assert!(log_of(&sim, b).is_none());
            tokio::time::advance(Duration::from_millis(1100)).await;
            sim.writer.as_mut().unwrap().turn(&mut sim.ops);
            assert!(
                sim.fs.list().unwrap().contains(&".reserve".to_string()),
                "the reserve is back once there is room"
            );
            restart(&mut sim, Loss::All).await;
            assert!(log_of(&sim, b).is_none(), "removed, and stays removed");
            let got: Vec<String> = payloads(&log_of(&sim, k).unwrap())
                .into_iter()
                .map(|(_, _, p)| p)
                .collect();
            assert_eq!(got[0], "k-1", "{got:?}");
            assert_eq!(sim.rep.violations, Vec::<String>::new());
        });
    }

    /// A full disk whose dead segments each hold an answer (found flaky under load in
    /// `tests/storage.rs a_full_disk_heals_in_process_by_reclaiming_dead_segments`): sessions
    /// B1..B3 each fill a segment with a request and its answer, end and are removed. Only the
    /// run's open record is still live in the oldest segment, so it is not dead; the dead ones
    /// after it hold answers (which keep in-flight records of older segments dead after a
    /// restart), so none may go out of order. The degraded log moves the few live bytes of the
    /// oldest segment, then reclaims them all and is ready again.
    #[test]
    fn a_full_disk_heals_when_only_the_open_record_keeps_the_oldest_segment() {
        rt().block_on(async {
            let mut sim = manual(Durability::Fsync);
            sim.seg_size = 256 << 10;
            // A reserve of 256 KiB: the probe then wants 1.25 MiB, less than the three free.
            sim.cfg.max_total_bytes = 16 << 20;
            sim.start().await;
            let mut ended = Vec::new();
            for round in 0..3 {
                let b = sim.create().unwrap();
                sim.turn().await;
                sim.register(b);
                sim.turn().await;
                for i in 0..8 {
                    send(&mut sim, b, &format!("b{round}-{i}-{}", "x".repeat(60_000)));
                    sim.turn().await;
                }
                sim.answer(b);
                sim.turn().await;
                let lb = log_of(&sim, b).unwrap();
                sim.push_end(&lb, EndReason::ClientDelete, Vec::new());
                sim.turn().await;
                ended.push(b);
            }
            // A live session, created after them: nothing of it is in the old segments.
            let k = sim.create().unwrap();
            sim.turn().await;
            send(&mut sim, k, "k-1");
            sim.turn().await;
            set_capacity(&sim, Some(sim.fs.used()));
            send(&mut sim, k, &format!("k-2-{}", "y".repeat(4000)));
            sim.writer.as_mut().unwrap().turn(&mut sim.ops);
            assert_eq!(*sim.store().health.borrow(), Health::Degraded);
            for b in &ended {
                let (done, _rx) = oneshot::channel();
                sim.ops.push(Op::Remove { session: *b, done });
            }
            for _ in 0..6 {
                tokio::time::advance(Duration::from_millis(1100)).await;
                sim.writer.as_mut().unwrap().turn(&mut sim.ops);
            }
            assert_eq!(
                *sim.store().health.borrow(),
                Health::Ok,
                "healed with nothing freed from outside (segments: {:?})",
                sim.fs.list().unwrap()
            );
            restart(&mut sim, Loss::All).await;
            for b in &ended {
                assert!(log_of(&sim, *b).is_none(), "removed, and stays removed");
            }
            let got: Vec<String> = payloads(&log_of(&sim, k).unwrap())
                .into_iter()
                .map(|(_, _, p)| p)
                .collect();
            assert_eq!(got[0], "k-1", "{got:?}");
            assert_eq!(sim.rep.violations, Vec::<String>::new());
        });
    }

    /// An end that failed (out of space) is retried a second later; a remove of the session
    /// that fits meanwhile is written first. The retried end's chunk and meta then follow the
    /// remove record in the log, and recovery brings the removed session back.
    #[test]
    fn an_end_retried_after_the_remove_does_not_bring_the_session_back() {
        rt().block_on(async {
            let mut sim = manual(Durability::Fsync);
            sim.start().await;
            let a = sim.create().unwrap();
            sim.turn().await;
            send(&mut sim, a, "a-1");
            sim.turn().await;
            let la = log_of(&sim, a).unwrap();
            sim.fs.fail_next(Call::Write, 28);
            sim.push_end(&la, EndReason::TaskFinished, Vec::new());
            sim.writer.as_mut().unwrap().turn(&mut sim.ops);
            assert_eq!(*sim.store().health.borrow(), Health::Degraded);
            // The app deletes the session (an expired task): the remove fits.
            let (done, mut rx) = oneshot::channel();
            sim.ops.push(Op::Remove { session: a, done });
            sim.writer.as_mut().unwrap().turn(&mut sim.ops);
            assert!(matches!(rx.try_recv(), Ok(Ok(_))), "remove acknowledged");
            assert!(log_of(&sim, a).is_none());
            // A second later the owed end is retried.
            tokio::time::advance(Duration::from_millis(1100)).await;
            sim.writer.as_mut().unwrap().turn(&mut sim.ops);
            sim.writer.as_mut().unwrap().turn(&mut sim.ops);
            assert_eq!(*sim.store().health.borrow(), Health::Ok);
            restart(&mut sim, Loss::All).await;
            assert!(
                log_of(&sim, a).is_none(),
                "removed (acknowledged), back after a restart"
            );
        });
    }

    /// Writes `bytes` as segment `id`, synced with its directory entry.
    /// Found by the ext4 harness (`lost_durable`, once in ~70 aborts): the turn of a session's end
    /// trimmed it in memory (the end's chunk took it over `log.max_events_per_session`) while the
    /// trim record followed a turn later. A reader of the data dir between the two turns saw
    /// events the ended session no longer had, and lost them at its next look. An end turn no
    /// longer trims: nothing trims an ended session (the total bound evicts it whole).
    #[test]
    fn the_turn_of_an_end_does_not_trim_its_session() {
        rt().block_on(async {
            let mut sim = manual(Durability::Relaxed);
            sim.cfg.max_events_per_session = 10;
            sim.start().await;
            let a = sim.create().unwrap();
            sim.turn().await;
            for i in 1..=10 {
                send(&mut sim, a, &format!("a-{i}"));
            }
            sim.turn().await;
            let log = log_of(&sim, a).unwrap();
            assert_eq!(log.oldest(), 1);
            sim.push_end(&log, EndReason::ClientDelete, Vec::new());
            sim.turn().await;
            let on_disk = |sim: &Sim| {
                let img = Image::scan_in(Arc::new(sim.fs.clone())).unwrap();
                img.sessions[&a].retained().oldest
            };
            assert_eq!((log.oldest(), on_disk(&sim)), (1, 1));
            for _ in 0..3 {
                sim.turn().await;
            }
            assert_eq!((log.oldest(), on_disk(&sim)), (1, 1));
            assert_eq!(payloads(&log).len(), 11);
        });
    }

    /// Found by the simulator (an ended session's events gone from the data dir): after a failed
    /// `fdatasync` the pages it held stay in the page cache, clean, never written. The next run
    /// (after exit 74, no power loss) read them, served them and only synced — which writes
    /// nothing — so the power loss after took events it had served (and a compaction copy
    /// whose original it had deleted). Recovery now writes the newest segment's unproven part
    /// again before it syncs it.
    #[test]
    fn recovery_after_a_failed_sync_makes_what_it_serves_durable() {
        rt().block_on(async {
            let mut sim = manual(Durability::Relaxed);
            sim.start().await;
            let a = sim.create().unwrap();
            sim.turn().await;
            send(&mut sim, a, "a-1");
            sim.turn().await;
            send(&mut sim, a, "a-2");
            sim.turn().await;
            // The next sync (a flush) fails, and the pages of a-2 are clean but not on disk.
            sim.fs.fail_next(Call::SyncForgets, 5);
            let (done, _rx) = oneshot::channel();
            sim.ops.push(Op::Flush { done });
            sim.turn().await;
            assert!(sim.failed(), "a failed fdatasync is fatal");
            // Exit 74 and a restart, no power loss: the page cache still shows a-2.
            sim.stop_process();
            sim.start().await;
            let log = log_of(&sim, a).unwrap();
            let served = payloads(&log);
            assert_eq!(
                served.iter().map(|e| e.2.as_str()).collect::<Vec<_>>(),
                ["a-1", "a-2"]
            );
            restart(&mut sim, Loss::All).await;
            let log = log_of(&sim, a).unwrap();
            let after = payloads(&log);
            assert_eq!(
                after[..2],
                served[..],
                "what the run served survived the power loss"
            );
        });
    }

    /// Found by the simulator's long profile (6 of 20,000 seeds, relaxed mode, e.g. 11920): an
    /// ended session evicted for space had its chunks killed at once, its remove record owed to the
    /// next turn; a degraded log's `reclaim_dead`, at the start of that turn, deleted the segment
    /// holding its oldest chunk before the remove was written; a power loss then brought the
    /// session back without its oldest events. Segments whose records died for a cause not yet
    /// written are no longer reclaimed until it is.
    #[test]
    fn an_evicted_session_does_not_come_back_in_part() {
        for seed in [11920, 3978, 5845, 5895, 8523, 9722] {
            let rep = run_seed(seed, 300);
            assert_eq!(rep.violations, Vec::<String>::new(), "seed {seed}");
        }
    }

    fn put_segment(fs: &SimFs, id: u64, bytes: &[u8]) {
        let f = fs.create(&super::super::segment::file_name(id)).unwrap();
        f.write_all_at(bytes, 0).unwrap();
        f.sync_data().unwrap();
        fs.sync().unwrap();
    }

    fn meta_json(epochs: Vec<crate::log::cursor::EpochRange>) -> Vec<u8> {
        serde_json::to_vec(&crate::log::SessionMeta {
            facade: Facade::Legacy,
            ended: None,
            created_unix: 1,
            ended_unix: None,
            epochs,
            protocol_version: None,
            identity: None,
        })
        .unwrap()
    }

    /// Crafted bytes: a meta whose epoch ends at seq u64::MAX (the image scan accepts it, see
    /// image.rs `seqs_near_u64_max_are_damage_not_a_panic`) makes recovery overflow
    /// (`head + 1`): a panic in debug builds, a wrapped head in release.
    #[test]
    fn recovery_does_not_overflow_on_an_epoch_ending_at_u64_max() {
        rt().block_on(async {
            let mut sim = manual(Durability::Fsync);
            let s = SessionId([3; 16]);
            let mut seg = record::segment_header(1).to_vec();
            let last = crate::log::cursor::EpochRange {
                epoch: 1,
                first: 1,
                last: Some(u64::MAX),
            };
            record::meta(&mut seg, &s, &meta_json(vec![last]));
            put_segment(&sim.fs, 1, &seg);
            assert!(sim.try_start().is_ok());
        });
    }

    /// Crafted bytes: a well-framed chunk at seq 0 outside the session's epochs makes recovery
    /// cut at 0 and compute `head = 0 - 1` (a panic in debug builds, u64::MAX in release).
    #[test]
    fn recovery_does_not_overflow_on_a_chunk_at_seq_zero() {
        rt().block_on(async {
            let mut sim = manual(Durability::Fsync);
            let s = SessionId([4; 16]);
            let mut seg = record::segment_header(1).to_vec();
            record::meta(&mut seg, &s, &meta_json(Vec::new()));
            let mut b = record::ChunkBuilder::default();
            b.push(1, Kind::Message, StreamTag::LEGACY, b"{}");
            record::chunk(&mut seg, &s, 0, &[], &b.finish());
            put_segment(&sim.fs, 1, &seg);
            assert!(sim.try_start().is_ok());
        });
    }

    /// A chunk record whose checksum is right but whose events do not decode (its count says
    /// two, it holds one) passes the scan (only the chunk header is checked) and, as the last
    /// chunk of a live session, fails recovery with `Corrupt`: the proxy cannot start, on
    /// every restart (and `Sim::start` retries forever). It is damage: seal and go on.
    #[test]
    fn recovery_treats_an_undecodable_chunk_as_damage_not_a_fatal_error() {
        rt().block_on(async {
            let mut sim = manual(Durability::Fsync);
            let s = SessionId([5; 16]);
            let mut seg = record::segment_header(1).to_vec();
            record::meta(&mut seg, &s, &meta_json(Vec::new()));
            let mut b = record::ChunkBuilder::default();
            b.push(1, Kind::Message, StreamTag::LEGACY, b"{\"n\":1}");
            record::chunk(&mut seg, &s, 1, &[], &b.finish());
            let mut b = record::ChunkBuilder::default();
            b.push(1, Kind::Message, StreamTag::LEGACY, b"{\"n\":2}");
            let mut v = b.finish();
            v[0..4].copy_from_slice(&2u32.to_be_bytes()); // count 2, one event
            record::chunk(&mut seg, &s, 2, &[], &v);
            put_segment(&sim.fs, 1, &seg);
            assert!(
                sim.try_start().is_ok(),
                "recovery must not fail on one bad record"
            );
            let log = log_of(&sim, s).unwrap();
            assert_eq!(log.ranges().epochs[0].last, Some(1), "sealed before it");
        });
    }

    /// The disk bound while healthy: live sessions whose only chunk is one large event cannot
    /// be trimmed (`enforce_total` trims only sessions with more than one chunk, and never the
    /// head) and nothing is dead, so neither compaction nor the throttle starts: the segment
    /// files grow past `Store::disk_bound` with the log `Ok`. Config allows it
    /// (`max_total_bytes >= max_bytes_per_session` is the only check; with the defaults,
    /// ~420 sessions whose last event is 4 MiB pass 1.6 GiB).
    #[test]
    fn the_disk_bound_holds_with_many_sessions_of_one_large_event() {
        rt().block_on(async {
            let mut sim = manual(Durability::Fsync);
            sim.cfg.max_total_bytes = 192 << 10;
            sim.cfg.max_bytes_per_session = 64 << 10;
            sim.cfg.max_events_per_session = 400;
            sim.seg_size = 16 << 10;
            sim.start().await;
            for i in 0..8 {
                let s = sim.create().unwrap();
                sim.turn().await;
                send(&mut sim, s, &format!("{i}-{}", "x".repeat(50_000)));
                sim.turn().await;
            }
            assert_eq!(*sim.store().health.borrow(), Health::Ok);
            assert_eq!(sim.rep.violations, Vec::<String>::new());
        });
    }

    /// Seeds 14436 and 14676 of the long profile: degraded by a full disk, space came back
    /// before the next probe; every append fit and was written, but a degraded log neither
    /// rotates nor compacts, so the active segment grew past the disk bound, seen as soon as
    /// the probe made the log ready again. Degraded, appends over the bound wait.
    #[test]
    fn a_degraded_log_that_writes_again_keeps_the_disk_bound() {
        rt().block_on(async {
            let mut sim = manual(Durability::Fsync);
            sim.cfg.max_total_bytes = 64 << 10;
            sim.seg_size = 8 << 10;
            sim.start().await;
            let a = sim.create().unwrap();
            sim.turn().await;
            send(&mut sim, a, "a-1");
            sim.turn().await;
            set_capacity(&sim, Some(sim.fs.used()));
            let b = sim.create().unwrap();
            sim.writer.as_mut().unwrap().turn(&mut sim.ops);
            send(&mut sim, a, &"y".repeat(4000));
            sim.writer.as_mut().unwrap().turn(&mut sim.ops);
            assert_eq!(*sim.store().health.borrow(), Health::Degraded);
            // Space is back; the probe is not due for a second. A flood of appends meanwhile.
            set_capacity(&sim, None);
            let bound = sim.store().disk_bound();
            // (`a` ended with its failed write; `b` was created before.)
            for i in 0..100 {
                send(&mut sim, b, &format!("b-{i}-{}", "z".repeat(3000)));
                sim.writer.as_mut().unwrap().turn(&mut sim.ops);
                let disk = sim.fs.segment_bytes();
                assert!(
                    disk <= bound,
                    "turn {i}: {disk} bytes of segments > {bound}"
                );
            }
            assert!(!sim.ops.is_empty(), "the appends over the bound wait");
            // Ready again, they go on. (These ops bypass the handle, which keeps the live
            // records under `log.max_total_bytes`: the bound is not checked from here on.)
            for _ in 0..200 {
                tokio::time::advance(Duration::from_millis(1100)).await;
                sim.writer.as_mut().unwrap().turn(&mut sim.ops);
                if sim.ops.is_empty() {
                    break;
                }
            }
            assert_eq!(*sim.store().health.borrow(), Health::Ok);
            assert!(
                sim.ops.is_empty(),
                "every append written once the log is ready"
            );
        });
    }

    /// Sim-long seed 11036: compaction read at least twice what the last turn wrote, copies
    /// included, so each turn of copies doubled the next one's; a large oldest segment with much
    /// live data was copied in turns far larger than `turn_bytes`, and the disk bound broke. A
    /// turn's copies now stay within `turn_bytes`.
    #[test]
    fn compaction_copies_do_not_grow_a_turn_past_turn_bytes() {
        rt().block_on(async {
            let mut sim = manual(Durability::Fsync);
            sim.cfg.max_total_bytes = 1 << 20;
            // Segment 1 takes everything below: 600 KB of A (live), 300 KB of B (dead soon).
            sim.seg_size = 1 << 20;
            sim.start().await;
            let (a, b) = (sim.create().unwrap(), sim.create().unwrap());
            sim.turn().await;
            for i in 0..600 {
                send(&mut sim, a, &format!("a-{i}-{}", "x".repeat(1000)));
                if i % 2 == 0 {
                    send(&mut sim, b, &format!("b-{i}-{}", "y".repeat(1000)));
                }
                sim.turn().await;
            }
            delete(&mut sim, b).await;
            // Small segments from here on: the next start rotates, and segment 1 is the oldest.
            sim.stop_process();
            sim.seg_size = 16 << 10;
            sim.start().await;
            let turn_bytes = sim.store().turn_bytes;
            let seg1 = super::super::segment::file_name(1);
            let mut copy_turns = 0;
            for _ in 0..200 {
                sim.turn().await;
                let wrote = sim.writer.as_ref().unwrap().last_written();
                assert!(
                    wrote <= turn_bytes + (4 << 10),
                    "a turn of copies wrote {wrote} bytes, turns take {turn_bytes}"
                );
                copy_turns += usize::from(wrote > 0);
                if !sim.fs.list().unwrap().contains(&seg1) {
                    break;
                }
            }
            assert!(
                !sim.fs.list().unwrap().contains(&seg1),
                "segment 1 was compacted"
            );
            assert!(copy_turns > 1, "the copies took several turns");
            assert_eq!(sim.rep.violations, Vec::<String>::new());
            assert_eq!(payloads(&log_of(&sim, a).unwrap()).len(), 600 + 1);
        });
    }

    /// The long profile's seeds that found a violation, replayed: each broke an invariant on
    /// the code before its fix. 4641: the files sat above the throttle with under a quarter of
    /// them dead, so compaction was not wanted and appends not held; a turn of events trimmed,
    /// its compaction copied a record larger than the turn, and the disk bound broke (now: over
    /// the throttle, a segment's worth of dead bytes starts compaction, and a record that would
    /// take a turn's copies past its budget waits for the next turn). 11036: copies doubled
    /// turn after turn. 18365, 14436, 14676: see their directed tests above.
    #[test]
    fn the_long_profiles_failing_seeds_stay_fixed() {
        for seed in [4641, 11036, 14436, 14676, 18365] {
            let rep = run_seed(seed, 300);
            assert_eq!(rep.violations, Vec::<String>::new(), "seed {seed}");
            assert!(rep.turns > 300, "seed {seed} ran");
        }
    }

    /// While appends wait over the disk bound, a remove queued behind them is not held up: it
    /// belongs to another session, and it is what frees the disk.
    #[test]
    fn a_remove_behind_a_throttled_append_goes_ahead() {
        rt().block_on(async {
            let mut sim = manual(Durability::Fsync);
            sim.cfg.max_total_bytes = 64 << 10;
            sim.seg_size = 8 << 10;
            sim.start().await;
            let (a, b) = (sim.create().unwrap(), sim.create().unwrap());
            sim.turn().await;
            let lb = log_of(&sim, b).unwrap();
            sim.push_end(&lb, EndReason::ClientDelete, Vec::new());
            sim.turn().await;
            set_capacity(&sim, Some(sim.fs.used()));
            send(&mut sim, a, &"y".repeat(4000));
            sim.writer.as_mut().unwrap().turn(&mut sim.ops);
            assert_eq!(*sim.store().health.borrow(), Health::Degraded);
            // Over the bound (as a degraded log sees it): the store counts more than is there.
            sim.store()
                .disk
                .fetch_add(1 << 20, std::sync::atomic::Ordering::Relaxed);
            send(&mut sim, a, "a-waits");
            let (done, mut rx) = oneshot::channel();
            sim.ops.push(Op::Remove { session: b, done });
            sim.writer.as_mut().unwrap().turn(&mut sim.ops);
            assert_eq!(sim.ops.len(), 1, "the append waits");
            assert!(
                rx.try_recv().is_ok_and(|r| r.is_ok()),
                "the remove was written"
            );
            assert!(log_of(&sim, b).is_none());
        });
    }

    /// A rotation whose segment creation fails after the file exists (its header write
    /// fails) and whose clean-up `remove` fails too leaves the file behind; every later
    /// rotation then fails with `AlreadyExists` and the log appends to the same segment for
    /// ever. The active segment is never compacted: with the log `Ok`, trimmed (dead) bytes
    /// pile up past `Store::disk_bound`.
    #[test]
    fn a_failed_rotation_does_not_stop_rotation_for_good() {
        rt().block_on(async {
            let mut sim = manual(Durability::Fsync);
            sim.cfg.max_total_bytes = 192 << 10;
            sim.cfg.max_events_per_session = 50;
            sim.seg_size = 16 << 10;
            sim.start().await;
            let a = sim.create().unwrap();
            sim.turn().await;
            for i in 0..20 {
                send(&mut sim, a, &format!("a-{i}-{}", "x".repeat(1000)));
            }
            sim.turn().await;
            // The next turn rotates: its header write fails, and so does the clean-up.
            sim.fs.fail_next(Call::Write, 5);
            sim.fs.fail_next(Call::Remove, 5);
            for i in 0..600 {
                send(&mut sim, a, &format!("a-{i}-{}", "x".repeat(1000)));
                sim.turn().await;
            }
            assert_eq!(*sim.store().health.borrow(), Health::Ok);
            assert_eq!(sim.rep.violations.first(), None);
            let segs = super::super::segment::list(&sim.fs).unwrap();
            assert!(segs.len() > 2, "rotation goes on: {segs:?}");
        });
    }

    #[test]
    fn the_file_system_loses_only_what_was_not_synced() {
        let fs = SimFs::new(7);
        let f = fs.create("a.seg").unwrap();
        fs.sync().unwrap();
        f.write_all_at(b"synced", 0).unwrap();
        f.sync_data().unwrap();
        f.write_all_at(b"-not-synced", 6).unwrap();
        for _ in 0..20 {
            fs.power_loss();
            let g = fs.open("a.seg", false).unwrap();
            let mut buf = vec![0u8; 64];
            let n = g.read_at(&mut buf, 0).unwrap();
            assert!(n >= 6 && &buf[..6] == b"synced");
        }
        // A file whose creation was never synced may vanish.
        let mut gone = false;
        for i in 0..20 {
            let name = format!("{i}.seg");
            fs.create(&name).unwrap().write_all_at(b"x", 0).unwrap();
            fs.power_loss();
            gone |= fs.open(&name, false).is_err();
        }
        assert!(gone);
    }

    // === adversary15: a degraded writer spins (fixed: it stalls, `Writer::stalled`) ===

    /// The turns the run loop takes without waiting for an op or a timer (`wants_turn`), the
    /// clock stopped, up to 200.
    fn turns_at_one_instant(sim: &mut Sim) -> usize {
        let mut turns = 0;
        while turns < 200 && sim.writer.as_ref().unwrap().wants_turn(&sim.ops) {
            sim.writer.as_mut().unwrap().turn(&mut sim.ops);
            turns += 1;
        }
        turns
    }

    /// adversary15 finding: a compaction under way when the disk fills spins the writer.
    /// `Writer::busy` is `wants_compaction()`, which is true whenever `self.compaction` is
    /// `Some`, whatever the health. The turn whose write fails out of space restores the
    /// compaction cursor (`compaction_before`), so the degraded log stays "busy", and the run
    /// loop (`busy = !ops.is_empty() || self.busy()`, then `std::future::ready(())`) turns again
    /// at once, for ever: nothing is written or deleted (or a copy is tried and fails again, with
    /// an error line and `store_errors` each time), until the probe sees space or
    /// `log.store_error_exit_secs` (60 s) exits. The simulator's own spin check only looks at
    /// `Health::Ok` turns, so it never sees this. Here: 200 turns at one instant.
    #[test]
    fn adv15_a_compaction_under_way_when_the_disk_fills_spins_the_writer() {
        rt().block_on(async {
            let mut sim = manual(Durability::Fsync);
            sim.cfg.max_total_bytes = 1 << 20;
            // Segments of 64 KiB, half of each live: more than a quarter of the reserve, so the
            // degraded log's `compact_nearly_dead` leaves the compaction alone.
            sim.seg_size = 64 << 10;
            sim.start().await;
            let (a, b) = (sim.create().unwrap(), sim.create().unwrap());
            sim.turn().await;
            for i in 0..100 {
                send(&mut sim, a, &format!("a-{i}-{}", "x".repeat(1000)));
                send(&mut sim, b, &format!("b-{i}-{}", "y".repeat(1000)));
                sim.turn().await;
            }
            delete(&mut sim, b).await;
            // Half of every segment is dead: compaction starts, one 4 KiB slice a turn.
            sim.turn().await;
            let seg1 = super::super::segment::file_name(1);
            assert!(sim.writer.as_ref().unwrap().busy(), "compaction under way");
            assert!(
                sim.fs.list().unwrap().contains(&seg1),
                "segment 1 not done yet"
            );
            // The disk fills; the next turn (a slice of copies and an append) fails.
            set_capacity(&sim, Some(sim.fs.used()));
            send(&mut sim, a, "a-fails");
            sim.writer.as_mut().unwrap().turn(&mut sim.ops);
            assert_eq!(*sim.store().health.borrow(), Health::Degraded);
            let errors_before = sim.store().metrics.store_errors.get();
            let idle = turns_at_one_instant(&mut sim);
            let errors = sim.store().metrics.store_errors.get() - errors_before;
            assert!(
                idle <= 2,
                "the writer spins: {idle} turns at one instant busy (the run loop does not \
                 wait) with nothing written or deleted; {errors} more store errors counted"
            );
        });
    }

    /// adversary15 finding: a degraded log over the throttle spins on the appends it holds.
    /// Since 3fd6d05 a degraded log over `throttle_bytes` holds every append (and the later ops
    /// of its session, and every flush) in `ops`. The run loop's `busy` is `!ops.is_empty() ||
    /// ...`: with held ops it never waits, so each turn plans nothing, writes nothing, and
    /// starts again at once — 100 % of a core — until the probe (every second) sees space, or
    /// for the 60 s of `log.store_error_exit_secs` when the disk stays full. (The maintainers'
    /// own `a_degraded_log_that_writes_again_keeps_the_disk_bound` runs 100 such turns at one
    /// instant.) Here the store counts the log over the bound, as that remove test does.
    #[test]
    fn adv15_a_degraded_log_over_the_throttle_spins_on_its_held_appends() {
        rt().block_on(async {
            let mut sim = manual(Durability::Fsync);
            sim.cfg.max_total_bytes = 64 << 10;
            sim.seg_size = 8 << 10;
            sim.start().await;
            let (a, b) = (sim.create().unwrap(), sim.create().unwrap());
            sim.turn().await;
            send(&mut sim, b, "b-1");
            sim.turn().await;
            set_capacity(&sim, Some(sim.fs.used()));
            send(&mut sim, a, &"y".repeat(4000));
            sim.writer.as_mut().unwrap().turn(&mut sim.ops);
            assert_eq!(*sim.store().health.borrow(), Health::Degraded);
            // Over the bound (as a degraded log sees it), the way the maintainers'
            // `a_remove_behind_a_throttled_append_goes_ahead` puts it there.
            sim.store()
                .disk
                .fetch_add(1 << 20, std::sync::atomic::Ordering::Relaxed);
            send(&mut sim, b, "b-waits");
            let (done, _flush) = oneshot::channel();
            sim.ops.push(Op::Flush { done });
            let idle = turns_at_one_instant(&mut sim);
            assert!(
                idle <= 2,
                "the writer spins: {idle} turns at one instant with {} ops held (the run \
                 loop does not wait) and nothing written or deleted",
                sim.ops.len()
            );
        });
    }

    /// adversary15 finding: a degraded log that owes a record it cannot write spins on it,
    /// one failed write, cut, sync and error line per turn. `Writer::busy` is true while
    /// `st.internal` is not empty, whatever the health; a turn whose write fails out of space
    /// owes its records again, so the run loop turns again at once. The reserve helps once:
    /// given up, and the space taken by someone else (the disk filled further), every turn
    /// tries the owed trim again, at full speed, for `log.store_error_exit_secs`, and
    /// `mcp_resume_store_errors_total` moves by one per turn (§10: "one error line").
    #[test]
    fn adv15_a_degraded_log_spins_on_a_record_it_owes() {
        rt().block_on(async {
            let mut sim = manual(Durability::Fsync);
            sim.cfg.max_total_bytes = 1 << 20;
            sim.cfg.max_events_per_session = 5;
            sim.seg_size = 64 << 10;
            sim.start().await;
            let a = sim.create().unwrap();
            sim.turn().await;
            for i in 0..6 {
                send(&mut sim, a, &format!("a-{i}"));
                sim.writer.as_mut().unwrap().turn(&mut sim.ops);
            }
            // The sixth event trimmed the first: its trim record is owed. No room for it, and
            // none either once the reserve is given up.
            let reserve = sim.store().reserve_bytes as u64;
            set_capacity(&sim, Some(sim.fs.used() - reserve));
            sim.writer.as_mut().unwrap().turn(&mut sim.ops);
            assert_eq!(*sim.store().health.borrow(), Health::Degraded);
            sim.writer.as_mut().unwrap().turn(&mut sim.ops);
            assert!(
                !sim.fs.list().unwrap().contains(&".reserve".to_string()),
                "the reserve was given up"
            );
            let errors_before = sim.store().metrics.store_errors.get();
            let idle = turns_at_one_instant(&mut sim);
            let errors = sim.store().metrics.store_errors.get() - errors_before;
            assert!(
                idle <= 2 && errors <= 2,
                "the writer spins: {idle} turns at one instant busy with nothing written or \
                 deleted, {errors} failed writes counted (and logged) meanwhile"
            );
        });
    }

    // === adversary18-sync: probes against 527cd23 (relaxed: a turn also syncs once
    // `SYNC_EVERY` bytes are unsynced). Each asserts an invariant; a failing one is a finding.

    const ADV_EVENT: usize = 64 << 10;

    fn adv_active(sim: &Sim) -> String {
        sim.fs
            .list()
            .unwrap()
            .into_iter()
            .filter(|n| n.ends_with(".seg"))
            .max()
            .unwrap()
    }

    /// A relaxed sim with one session and a request durably in flight.
    async fn adv_relaxed() -> (Sim, SessionId) {
        let mut sim = manual(Durability::Relaxed);
        sim.start().await;
        let a = sim.create().unwrap();
        sim.turn().await;
        sim.register(a);
        sim.turn().await;
        (sim, a)
    }

    fn adv_payload(i: usize) -> String {
        format!("a-{i:05}-{}", "x".repeat(ADV_EVENT))
    }

    /// Sends events `from..to` one turn each; returns how many events were sent when the last
    /// turn that left nothing pending (a periodic sync) ended, if any.
    async fn adv_flood(sim: &mut Sim, a: SessionId, from: usize, to: usize) -> Option<usize> {
        let mut synced_through = None;
        for i in from..to {
            send(sim, a, &adv_payload(i));
            sim.turn().await;
            if sim.fs.pending(&adv_active(sim)) == 0 {
                synced_through = Some(i + 1);
            }
        }
        synced_through
    }

    /// Sends events until the next turn is the periodic sync (the unsynced bytes are at the
    /// step), without running it. Returns the next event index.
    async fn adv_up_to_the_step(sim: &mut Sim, a: SessionId) -> usize {
        let every = super::super::pagecache::SYNC_EVERY as usize;
        let n = every / ADV_EVENT;
        let got = adv_flood(sim, a, 0, n).await;
        assert_eq!(got, None, "no sync before the step");
        assert!(sim.fs.pending(&adv_active(sim)) >= every / ADV_EVENT);
        n
    }

    fn adv_events(sim: &Sim, a: SessionId) -> Vec<String> {
        payloads(&log_of(sim, a).unwrap())
            .into_iter()
            .map(|(_, _, p)| p)
            .filter(|p| p.starts_with("a-"))
            .collect()
    }

    /// fsyncgate in the periodic path: the sync before the periodic turn's write fails and
    /// forgets what it held (pages clean, never written). The log must fail for good, write
    /// nothing after it, and after a power loss the lost suffix must be a torn tail (not damage:
    /// no mark may claim it synced) with no id reused and no violation.
    #[test]
    fn adv18s_periodic_sync_that_forgets_is_fatal_and_torn_not_damage() {
        rt().block_on(async {
            let (mut sim, a) = adv_relaxed().await;
            let next = adv_up_to_the_step(&mut sim, a).await;
            sim.fs.fail_next(Call::SyncForgets, 5);
            send(&mut sim, a, &adv_payload(next));
            sim.turn().await;
            assert_eq!(*sim.store().health.borrow(), Health::Failed);
            // Nothing after the failed sync: the turn's events are not in the file.
            assert!(
                sim.fs.find(format!("a-{next:05}-").as_bytes()).is_none(),
                "the periodic turn was written after its sync failed"
            );
            restart(&mut sim, Loss::All).await;
            sim.turn().await;
            assert_eq!(sim.rep.damage_found, 0, "a torn tail, not damage");
            assert_eq!(sim.rep.violations, Vec::<String>::new());
            assert_eq!(adv_events(&sim, a).len(), 0, "nothing was ever synced");
        });
    }

    /// Same, with a process crash only (the page cache survives): recovery writes the unproven
    /// tail again (the last mark's claim is honest), so after a later power loss everything the
    /// previous run published is there.
    #[test]
    fn adv18s_periodic_sync_that_forgets_then_kill_then_power_loss_keeps_what_was_served() {
        rt().block_on(async {
            let (mut sim, a) = adv_relaxed().await;
            let next = adv_up_to_the_step(&mut sim, a).await;
            sim.fs.fail_next(Call::SyncForgets, 5);
            send(&mut sim, a, &adv_payload(next));
            sim.turn().await;
            assert_eq!(*sim.store().health.borrow(), Health::Failed);
            // Kill (no power loss): the page cache still has the forgotten pages.
            sim.stop_process();
            sim.start().await;
            sim.turn().await;
            let served = adv_events(&sim, a).len();
            assert_eq!(served, next, "what the failed run published is served");
            restart(&mut sim, Loss::All).await;
            sim.turn().await;
            assert_eq!(adv_events(&sim, a).len(), served, "and durable");
            assert_eq!(sim.rep.damage_found, 0);
            assert_eq!(sim.rep.violations, Vec::<String>::new());
        });
    }

    /// The periodic turn's own sync (after its write) fails and forgets: the turn is cut, the log
    /// fails, nothing the turn carried is acknowledged; after a power loss the turns before it
    /// (synced by the sync before its write) are all there and the rest is a torn tail.
    #[test]
    fn adv18s_periodic_turns_own_sync_fails_keeps_what_came_before() {
        for loss in [Loss::All, Loss::Random, Loss::KeepBytes(100_000)] {
            rt().block_on(async {
                let (mut sim, a) = adv_relaxed().await;
                let next = adv_up_to_the_step(&mut sim, a).await;
                sim.fs.fail_after(Call::SyncForgets, 1, 5);
                let log = log_of(&sim, a).unwrap();
                let (d, mut rx) = oneshot::channel();
                sim.ops.push(Op::Append {
                    log,
                    evs: vec![NewEvent::new(
                        StreamTag::LEGACY,
                        Kind::Message,
                        Bytes::from(adv_payload(next)),
                    )],
                    done: Some(d),
                    _permit: None,
                });
                sim.writer.as_mut().unwrap().turn(&mut sim.ops);
                assert_eq!(*sim.store().health.borrow(), Health::Failed);
                assert!(
                    matches!(rx.try_recv(), Ok(Err(_))),
                    "the periodic turn's append must be answered with the sync error"
                );
                restart(&mut sim, loss).await;
                sim.turn().await;
                let got = adv_events(&sim, a);
                assert_eq!(
                    got.len(),
                    next,
                    "{loss:?}: what the sync before the write covered"
                );
                assert_eq!(sim.rep.damage_found, 0, "{loss:?}: torn, not damage");
                assert_eq!(sim.rep.violations, Vec::<String>::new(), "{loss:?}");
            });
        }
    }

    /// ENOSPC from the periodic `fdatasync` is fatal (fsyncgate), like any other sync's, and the
    /// turn's append is refused, not acknowledged.
    #[test]
    fn adv18s_enospc_from_the_periodic_sync_is_fatal() {
        rt().block_on(async {
            let (mut sim, a) = adv_relaxed().await;
            let next = adv_up_to_the_step(&mut sim, a).await;
            sim.fs.fail_next(Call::Sync, 28);
            let log = log_of(&sim, a).unwrap();
            let (d, mut rx) = oneshot::channel();
            sim.ops.push(Op::Append {
                log,
                evs: vec![NewEvent::new(
                    StreamTag::LEGACY,
                    Kind::Message,
                    Bytes::from(adv_payload(next)),
                )],
                done: Some(d),
                _permit: None,
            });
            sim.writer.as_mut().unwrap().turn(&mut sim.ops);
            assert_eq!(*sim.store().health.borrow(), Health::Failed);
            assert!(matches!(rx.try_recv(), Ok(Err(_))));
        });
    }

    /// The marks are honest: after every turn of a long relaxed flood (several periodic syncs),
    /// a power loss that keeps nothing unsynced keeps at least every event a periodic sync
    /// covered, finds no damage (no mark claimed bytes that were not synced) and reuses no id.
    #[test]
    fn adv18s_a_power_loss_keeps_what_the_periodic_syncs_covered() {
        rt().block_on(async {
            let every = super::super::pagecache::SYNC_EVERY as usize;
            let per_step = every / ADV_EVENT;
            // Power loss at several points: just before, at, and after the first and second
            // periodic syncs.
            for stop in [
                per_step,
                per_step + 1,
                per_step + 2,
                2 * per_step + 3,
                3 * per_step,
            ] {
                for loss in [Loss::All, Loss::Random, Loss::KeepBytes(3 * 4096 + 17)] {
                    let (mut sim, a) = adv_relaxed().await;
                    let synced = adv_flood(&mut sim, a, 0, stop).await.unwrap_or(0);
                    restart(&mut sim, loss).await;
                    sim.turn().await;
                    let got = adv_events(&sim, a);
                    assert!(
                        got.len() >= synced,
                        "stop {stop} {loss:?}: {} events kept, {synced} were synced",
                        got.len()
                    );
                    let want: Vec<String> = (0..got.len()).map(adv_payload).collect();
                    assert!(
                        got == want,
                        "stop {stop} {loss:?}: events reordered or damaged"
                    );
                    assert_eq!(sim.rep.damage_found, 0, "stop {stop} {loss:?}");
                    assert_eq!(
                        sim.rep.violations,
                        Vec::<String>::new(),
                        "stop {stop} {loss:?}"
                    );
                }
            }
        });
    }

    /// Rotation with the periodic sync: segments a little over a step, so that rotations and
    /// periodic syncs interleave (a sync just before a rotation, a rotation with a step almost
    /// unsynced). `synced_len` resets with the segment; no mark of the new segment may claim
    /// bytes of the old one. Power loss after each turn of a window keeps what was synced.
    #[test]
    fn adv18s_rotation_and_periodic_syncs_interleave_honestly() {
        rt().block_on(async {
            let every = super::super::pagecache::SYNC_EVERY as usize;
            let per_step = every / ADV_EVENT;
            for seg in [every as u64 + (100 << 10), (every as u64) * 3 / 2] {
                for stop in [
                    per_step + 1,
                    per_step + 3,
                    2 * per_step,
                    2 * per_step + 2,
                    3 * per_step + 1,
                ] {
                    let (mut sim, _) = adv_relaxed().await;
                    sim.seg_size = seg;
                    // The store took the size at start: restart cleanly to apply it.
                    sim.clean_restart().await;
                    let a2 = sim.create().unwrap();
                    sim.turn().await;
                    let synced = adv_flood(&mut sim, a2, 0, stop).await.unwrap_or(0);
                    let segs = sim
                        .fs
                        .list()
                        .unwrap()
                        .iter()
                        .filter(|n| n.ends_with(".seg"))
                        .count();
                    restart(&mut sim, Loss::All).await;
                    sim.turn().await;
                    let got = adv_events(&sim, a2);
                    assert!(
                        got.len() >= synced,
                        "seg {seg} stop {stop} ({segs} segments): {} kept, {synced} synced",
                        got.len()
                    );
                    assert_eq!(sim.rep.damage_found, 0, "seg {seg} stop {stop}");
                    assert_eq!(
                        sim.rep.violations,
                        Vec::<String>::new(),
                        "seg {seg} stop {stop}"
                    );
                }
            }
        });
    }

    /// Damage told from a torn tail: with `relaxed` and no answers, the periodic sync is what
    /// makes the older bytes synced, and the next mark says so. A flipped bit there is damage
    /// (counted, the session sealed at the last intact event), not a torn tail that silently cuts
    /// the synced events after it.
    #[test]
    fn adv18s_a_flip_in_periodically_synced_data_is_damage_not_torn() {
        rt().block_on(async {
            let every = super::super::pagecache::SYNC_EVERY as usize;
            let per_step = every / ADV_EVENT;
            let (mut sim, a) = adv_relaxed().await;
            let b = sim.create().unwrap();
            sim.turn().await;
            // Past the first periodic sync and two turns after it (whose marks claim it).
            let synced = adv_flood(&mut sim, a, 0, per_step + 3).await.unwrap();
            send(&mut sim, b, "b-after");
            sim.turn().await;
            send(&mut sim, b, "b-after-2");
            sim.turn().await;
            let (name, at) = sim.fs.find(b"a-00010-").unwrap();
            sim.fs.flip_at(&name, at + 3);
            sim.excused.insert(a);
            restart(&mut sim, Loss::All).await;
            sim.turn().await;
            assert_eq!(sim.rep.damage_found, 1, "damage in synced data is counted");
            let got = adv_events(&sim, a);
            assert_eq!(
                got.len(),
                10,
                "sealed at the last intact event before the flip"
            );
            assert_eq!(synced, per_step + 1, "the periodic sync covered event 10");
            assert_eq!(sim.rep.violations, Vec::<String>::new());
        });
    }

    /// A full disk during a relaxed flood past the step: the failed write degrades (not fatal),
    /// the cut is synced, and once space returns the log heals and the periodic sync goes on.
    #[test]
    fn adv18s_a_full_disk_in_a_relaxed_flood_heals_and_keeps_syncing() {
        rt().block_on(async {
            let every = super::super::pagecache::SYNC_EVERY as usize;
            let per_step = every / ADV_EVENT;
            let (mut sim, a) = adv_relaxed().await;
            let _ = adv_flood(&mut sim, a, 0, per_step - 2).await;
            // Room for one more event, not two: the second write fails with ENOSPC.
            set_capacity(&sim, Some(sim.fs.used() + ADV_EVENT as u64 + 2048));
            send(&mut sim, a, &adv_payload(per_step - 2));
            sim.turn().await;
            assert_eq!(*sim.store().health.borrow(), Health::Ok);
            send(&mut sim, a, &adv_payload(per_step - 1));
            sim.turn().await;
            assert_eq!(
                *sim.store().health.borrow(),
                Health::Degraded,
                "ENOSPC on a write degrades"
            );
            set_capacity(&sim, None);
            for _ in 0..6 {
                sim.turn().await;
            }
            assert_eq!(
                *sim.store().health.borrow(),
                Health::Ok,
                "heals with no restart"
            );
            // The session that lost events ended (StoreError); a new one floods past a step.
            let c = sim.create().unwrap();
            sim.turn().await;
            let synced = adv_flood(&mut sim, c, 0, per_step + 4).await;
            assert!(
                synced.is_some(),
                "the periodic sync still runs after healing"
            );
            restart(&mut sim, Loss::All).await;
            sim.turn().await;
            assert_eq!(sim.rep.damage_found, 0);
            assert_eq!(sim.rep.violations, Vec::<String>::new());
        });
    }

    /// Like `append_large`, with events of `pad` bytes.
    fn adv_append_big(sim: &mut Sim, id: SessionId, pad: usize) {
        let s = sim.sessions.get_mut(&id).expect("live");
        let Some(log) = s.log.clone() else {
            return;
        };
        s.next_payload += 1;
        let p = payload_padded(&id, s.next_payload, pad);
        let done = if sim.rng.chance(1, 2) {
            let (d, rx) = oneshot::channel();
            sim.waiting.push(Waiting::Other(rx));
            Some(d)
        } else {
            None
        };
        sim.ops.push(Op::Append {
            log,
            evs: vec![NewEvent::new(StreamTag::LEGACY, Kind::Message, p)],
            done,
            _permit: None,
        });
    }

    /// A randomized relaxed flood that crosses `SYNC_EVERY` often (large events, segments of
    /// 9 to 20 MiB, few answers), under the simulator's faults (failed and forgetting syncs,
    /// ENOSPC, torn writes), kills, power losses and bit flips: the oracle's invariants hold
    /// (no id reused, every loss refused, answers not owed twice, the disk bound, no spin).
    /// The random profiles never reach the periodic sync (segments of 16-32 KiB rotate, and
    /// so sync, long before 8 MiB are unsynced); this one does.
    #[test]
    fn adv18s_random_relaxed_floods_past_the_step_break_no_invariant() {
        let seeds = env_u64("ADV18S_SEEDS", 8);
        let steps = env_u64("ADV18S_STEPS", 500);
        let mut all = Vec::new();
        let mut crashes = 0;
        for seed in 0..seeds {
            rt().block_on(async {
                let mut sim = Sim::new(0xad18_0000 + seed);
                sim.cfg.durability = Durability::Relaxed;
                sim.cfg.max_events_per_session = 10_000;
                sim.cfg.max_bytes_per_session = 24 << 20;
                sim.cfg.max_total_bytes = 96 << 20;
                sim.seg_size = [9 << 20, 12 << 20, 20 << 20][sim.rng.below(3) as usize];
                sim.sync_every = super::super::pagecache::SYNC_EVERY;
                let fail_ppm = [0, 300, 2000][sim.rng.below(3) as usize];
                sim.fs.set_faults(Faults {
                    fail_ppm,
                    capacity: None,
                    lie_ppm: 0,
                });
                sim.start().await;
                for _ in 0..steps {
                    sim.step += 1;
                    let live = sim.live_sessions();
                    let roll = sim.rng.below(1000);
                    match roll {
                        _ if live.is_empty() => {
                            sim.create();
                        }
                        0..=9 if live.len() < 4 => {
                            sim.create();
                        }
                        0..=969 => {
                            let id = sim.pick(&live).unwrap();
                            let pad = (64 << 10) + sim.rng.below(448 << 10) as usize;
                            adv_append_big(&mut sim, id, pad);
                        }
                        970..=979 => {
                            let id = sim.pick(&live).unwrap();
                            sim.register(id);
                        }
                        980..=989 => {
                            let id = sim.pick(&live).unwrap();
                            sim.answer(id);
                        }
                        990..=994 => {
                            crashes += 1;
                            sim.crash(true).await;
                            continue;
                        }
                        995..=997 => {
                            crashes += 1;
                            sim.crash(false).await;
                            continue;
                        }
                        _ => {}
                    }
                    sim.turn().await;
                    if sim.failed() {
                        crashes += 1;
                        let power = sim.rng.chance(1, 2);
                        sim.crash(power).await;
                    }
                }
                sim.crash(true).await;
                all.extend(sim.rep.violations.clone());
            });
        }
        assert!(crashes > 0);
        assert_eq!(all, Vec::<String>::new());
    }

    /// A write failure in the turn just after a periodic sync (so `dirty` is false at its start,
    /// and the failed write's bytes are the only unsynced ones), then the cut's sync fails too:
    /// the log fails, and after a kill and then a power loss the refused events are not served
    /// under ids that clients hold, and nothing is damage.
    #[test]
    fn adv18s_periodic_sync_then_own_sync_and_cut_fail() {
        for loss in [Loss::All, Loss::Random, Loss::KeepBytes(70_000)] {
            for kill_first in [false, true] {
                rt().block_on(async {
                    let (mut sim, a) = adv_relaxed().await;
                    let next = adv_up_to_the_step(&mut sim, a).await;
                    sim.fs.fail_after(Call::SyncForgets, 1, 5);
                    sim.fs.fail_next(Call::Truncate, 5);
                    send(&mut sim, a, &adv_payload(next));
                    sim.turn().await;
                    assert_eq!(*sim.store().health.borrow(), Health::Failed);
                    if kill_first {
                        sim.stop_process();
                        sim.start().await;
                        sim.turn().await;
                    }
                    restart(&mut sim, loss).await;
                    sim.turn().await;
                    let got = adv_events(&sim, a);
                    assert!(
                        got.len() >= next,
                        "{loss:?} kill {kill_first}: {} < {next}",
                        got.len()
                    );
                    assert_eq!(sim.rep.damage_found, 0, "{loss:?} kill {kill_first}");
                    assert_eq!(
                        sim.rep.violations,
                        Vec::<String>::new(),
                        "{loss:?} kill {kill_first}"
                    );
                });
            }
        }
    }
}

/// Adversarial review 19: the writer's 8 MiB byte-bounded queue and 2 MiB turns (`be31b9e`), and
/// events held by value instead of one `Arc` each (`45f5b0f`). These drive a real [`super::Log`]
/// (its `reserve`, the semaphore an event larger than `QUEUE_BYTES` empties, the writer task) over
/// a real directory, not the simulator's writer: the queue bound is not in the simulator.
#[cfg(test)]
mod adv19 {
    use super::super::store::{QUEUE_BYTES, TURN_BYTES_MAX, WINDOW_BYTES, WINDOW_EVENTS};
    use super::super::{Event, Health, Kind, Log, NewEvent, SessionId, SessionLog, StreamTag};
    use crate::config::{Durability, LogConfig};
    use crate::domain::Facade;
    use crate::metrics::Metrics;
    use bytes::Bytes;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    const MIB: usize = 1 << 20;

    fn cfg(dir: &std::path::Path, durability: Durability, total: u64) -> LogConfig {
        LogConfig {
            dir: dir.to_path_buf(),
            durability,
            max_events_per_session: 10_000_000,
            max_bytes_per_session: total,
            max_total_bytes: total,
            store_error_exit_secs: 60,
            ..LogConfig::default()
        }
    }

    /// Event `i` of session `s`: a header naming both, then a filler that differs between
    /// neighbours, `size` bytes in all (at least the header).
    fn payload(s: usize, i: u64, size: usize) -> Bytes {
        let fill = b'a' + ((s as u64 * 7 + i) % 26) as u8;
        let mut v = format!("<{s}:{i}>").into_bytes();
        v.resize(v.len().max(size), fill);
        Bytes::from(v)
    }

    fn ev(p: &Bytes) -> NewEvent {
        NewEvent::new(StreamTag::LEGACY, Kind::Message, p.clone())
    }

    fn messages(log: &Log, sl: &SessionLog) -> Vec<Event> {
        log.read_held(sl, 0, 100_000_000)
            .unwrap()
            .into_iter()
            .filter(|e| e.kind == Kind::Message)
            .collect()
    }

    /// `got` is exactly `want` (or, `trimmed`, a suffix of it: a prefix legitimately trimmed),
    /// each event once, in order, seq `k + 1` holding `want[k]`.
    fn check(name: &str, got: &[Event], want: &[Bytes], trimmed: bool) {
        if !trimmed {
            assert_eq!(got.len(), want.len(), "{name}: events read back");
        }
        let mut last = 0;
        for e in got {
            assert!(e.seq > last, "{name}: seq {} after {last}", e.seq);
            if last != 0 {
                assert_eq!(e.seq, last + 1, "{name}: a gap after seq {last}");
            }
            last = e.seq;
            let w = want
                .get(e.seq as usize - 1)
                .unwrap_or_else(|| panic!("{name}: seq {} was never appended", e.seq));
            assert!(
                e.payload == *w,
                "{name}: seq {} holds {} bytes starting {:?}, {} expected",
                e.seq,
                e.payload.len(),
                String::from_utf8_lossy(&e.payload[..e.payload.len().min(24)]),
                w.len()
            );
        }
        if !want.is_empty() {
            assert_eq!(last, want.len() as u64, "{name}: the last event read back");
        }
    }

    /// Sizes of the big session's events: on both sides of `QUEUE_BYTES` and far past it.
    fn big_sizes() -> Vec<usize> {
        vec![
            9 * MIB,
            64,
            QUEUE_BYTES,
            QUEUE_BYTES + 1,
            20 * MIB,
            1000,
            64 * MIB,
            QUEUE_BYTES - 1,
            3 * TURN_BYTES_MAX + 7,
            9 * MIB,
        ]
    }

    struct Flood {
        log: Arc<Log>,
        sls: Vec<Arc<SessionLog>>,
        ids: Vec<SessionId>,
        want: Vec<Vec<Bytes>>,
    }

    /// Sessions `0..bigs` append the events of [`big_sizes`] (one op each, session 0 also one op
    /// of two 9 MiB events, session 1 with `append`, waiting for each); the others flood small
    /// batches meanwhile. All of it must be queued within `limit`.
    async fn flood(log: Arc<Log>, sessions: usize, bigs: usize, small_batches: usize) -> Flood {
        flood_of(log, sessions, bigs, small_batches, big_sizes()).await
    }

    async fn flood_of(
        log: Arc<Log>,
        sessions: usize,
        bigs: usize,
        small_batches: usize,
        sizes: Vec<usize>,
    ) -> Flood {
        let mut sls = Vec::new();
        let mut ids = Vec::new();
        for _ in 0..sessions {
            let id = SessionId::random();
            ids.push(id);
            sls.push(log.create(id, Facade::Legacy, None, None).await.unwrap());
        }
        let want = run_flood(&log, &sls, bigs, small_batches, sizes).await;
        Flood {
            log,
            sls,
            ids,
            want,
        }
    }

    /// The producers of [`flood_of`] over sessions already created; what each appended.
    async fn run_flood(
        log: &Arc<Log>,
        sls: &[Arc<SessionLog>],
        bigs: usize,
        small_batches: usize,
        sizes: Vec<usize>,
    ) -> Vec<Vec<Bytes>> {
        let mut tasks = Vec::new();
        for (s, sl) in sls.iter().enumerate() {
            let (log, sl) = (log.clone(), sl.clone());
            let sizes = sizes.clone();
            tasks.push(tokio::spawn(async move {
                let mut want = Vec::new();
                let mut i = 1u64;
                if s < bigs {
                    for size in sizes {
                        let p = payload(s, i, size);
                        want.push(p.clone());
                        i += 1;
                        if s == 1 {
                            match log.append(&sl, ev(&p)).await {
                                Ok(seq) => assert_eq!(seq, i - 1, "s{s}: seq of a waited append"),
                                // A full disk: the session ends (`store_error`).
                                Err(e) => {
                                    assert!(sl.failed(), "s{s}: {e} and not failed");
                                    break;
                                }
                            }
                        } else {
                            log.append_many_nowait(&sl, vec![ev(&p)]).await.unwrap();
                        }
                    }
                    if s == 0 {
                        let a = payload(s, i, 9 * MIB);
                        let b = payload(s, i + 1, 9 * MIB);
                        want.push(a.clone());
                        want.push(b.clone());
                        i += 2;
                        log.append_many_nowait(&sl, vec![ev(&a), ev(&b)])
                            .await
                            .unwrap();
                    }
                    let _ = i;
                } else {
                    for r in 0..small_batches {
                        let n = 1 + (r * 7 + s * 3) % 40;
                        let mut b = log.batch();
                        for _ in 0..n {
                            let size = match (i as usize * 13 + s) % 7 {
                                0 => 64 << 10,
                                1 => 40_000,
                                2 => 1,
                                _ => 100 + (i as usize * 31) % 4000,
                            };
                            let p = payload(s, i, size);
                            want.push(p.clone());
                            b.push(ev(&p));
                            i += 1;
                        }
                        log.append_many_nowait(&sl, b).await.unwrap();
                    }
                }
                want
            }));
        }
        let mut want = Vec::new();
        for t in tasks {
            want.push(t.await.expect("producer"));
        }
        want
    }

    async fn within<T>(what: &str, secs: u64, f: impl std::future::Future<Output = T>) -> T {
        match tokio::time::timeout(Duration::from_secs(secs), f).await {
            Ok(v) => v,
            Err(_) => panic!("{what}: not done within {secs} s (hang?)"),
        }
    }

    /// Events larger than the 8 MiB queue (8 MiB - 1, 8 MiB, 8 MiB + 1, 9, 20, 64 MiB, one op of
    /// 2 × 9 MiB), from three sessions that each want every permit, while 13 sessions flood small
    /// batches: every event is logged and read back once, in order, byte for byte, live and after
    /// a restart, in both durability modes; nothing waits forever.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn adv19_events_past_the_queue_bound_amid_a_flood_are_logged_once_in_order() {
        for durability in [Durability::Fsync, Durability::Relaxed] {
            let dir = tempfile::tempdir().unwrap();
            let c = cfg(dir.path(), durability, 1 << 34);
            let (log, _, _) = Log::open(&c, Metrics::new()).await.expect("open");
            let _failures = log.take_failures().unwrap();
            let t0 = Instant::now();
            let f = within(
                &format!("{durability:?} producers"),
                240,
                flood(log.clone(), 16, 3, 150),
            )
            .await;
            within(&format!("{durability:?} flush"), 120, f.log.flush())
                .await
                .unwrap();
            eprintln!("{durability:?}: queued and flushed in {:?}", t0.elapsed());
            for (s, sl) in f.sls.iter().enumerate() {
                assert!(!sl.failed(), "{durability:?} s{s} failed");
                check(
                    &format!("{durability:?} live s{s}"),
                    &messages(&f.log, sl),
                    &f.want[s],
                    false,
                );
            }
            f.log.close().await.unwrap();
            drop(f.sls);
            drop(f.log);
            drop(log);
            let (log, _, _) = Log::open(&c, Metrics::new()).await.expect("reopen");
            for (s, id) in f.ids.iter().enumerate() {
                let sl = log.get(id).expect("session recovered");
                check(
                    &format!("{durability:?} recovered s{s}"),
                    &messages(&log, &sl),
                    &f.want[s],
                    false,
                );
            }
            log.close().await.unwrap();
        }
    }

    fn seg_size(total: u64) -> u64 {
        (total / 32).clamp(1 << 20, 64 << 20)
    }

    /// Samples the segment files' bytes (the log's own count and the directory's) until `stop`.
    fn sample_disk(
        log: Arc<Log>,
        dir: std::path::PathBuf,
        stop: Arc<AtomicBool>,
    ) -> tokio::task::JoinHandle<(u64, u64)> {
        tokio::spawn(async move {
            let (mut own, mut files) = (0u64, 0u64);
            while !stop.load(Ordering::Relaxed) {
                own = own.max(log.disk_bytes());
                let mut sum = 0;
                if let Ok(rd) = std::fs::read_dir(&dir) {
                    for e in rd.flatten() {
                        let name = e.file_name().to_string_lossy().to_string();
                        if name.ends_with(".seg") || name.chars().all(|c| c.is_ascii_hexdigit()) {
                            sum += e.metadata().map(|m| m.len()).unwrap_or(0);
                        }
                    }
                }
                files = files.max(sum);
                tokio::time::sleep(Duration::from_millis(3)).await;
            }
            (own, files)
        })
    }

    /// A 64 MiB bound (2 MiB turns, 2 MiB segments): two sessions of 8–20 MiB events (past the
    /// queue bound) and 14 of small batches flood about five times the bound, so the log trims,
    /// compacts and throttles all along. Nothing hangs, every session reads back a contiguous,
    /// in-order tail of what it appended ending at its last event, and the files stay within
    /// README's bound (1.5 × bound + 4 segments, plus about twice the largest event).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn adv19_big_events_under_the_disk_throttle_keep_order_and_the_bound() {
        let twenty = vec![
            9 * MIB,
            20 * MIB,
            QUEUE_BYTES + 1,
            20 * MIB,
            100,
            9 * MIB,
            20 * MIB,
        ];
        for (durability, sizes) in [
            (Durability::Relaxed, big_sizes()),
            (Durability::Fsync, big_sizes()),
            (Durability::Relaxed, twenty.clone()),
            (Durability::Fsync, twenty),
        ] {
            let largest = *sizes.iter().max().unwrap() as u64;
            let total: u64 = 64 << 20;
            let dir = tempfile::tempdir().unwrap();
            let c = cfg(dir.path(), durability, total);
            let (log, _, _) = Log::open(&c, Metrics::new()).await.expect("open");
            let _failures = log.take_failures().unwrap();
            let stop = Arc::new(AtomicBool::new(false));
            let sampler = sample_disk(log.clone(), dir.path().to_path_buf(), stop.clone());
            let t0 = Instant::now();
            // big_sizes has a 64 MiB event: the bound itself. Two big sessions, 14 small.
            let f = within(
                &format!("{durability:?} producers"),
                300,
                flood_of(log.clone(), 16, 2, 120, sizes),
            )
            .await;
            within(&format!("{durability:?} flush"), 120, f.log.flush())
                .await
                .unwrap();
            stop.store(true, Ordering::Relaxed);
            let (own, files) = sampler.await.unwrap();
            let bound = total + total / 2 + 4 * seg_size(total);
            let allowance = bound + 2 * largest;
            let appended: usize = f.want.iter().flatten().map(|b| b.len()).sum();
            eprintln!(
                "{durability:?}: {} MiB appended in {:?}; peak files {} MiB (own count {} MiB), \
                 bound {} MiB, with two {} MiB events {} MiB; now {} MiB live, {} MiB files",
                appended >> 20,
                t0.elapsed(),
                files >> 20,
                own >> 20,
                bound >> 20,
                largest >> 20,
                allowance >> 20,
                f.log.total_bytes() >> 20,
                f.log.disk_bytes() >> 20
            );
            for (s, sl) in f.sls.iter().enumerate() {
                assert!(!sl.failed(), "{durability:?} s{s} failed");
                let got = messages(&f.log, sl);
                check(&format!("{durability:?} s{s}"), &got, &f.want[s], true);
            }
            assert!(
                own.max(files) <= allowance,
                "{durability:?}: files peaked at {} bytes, past {allowance}",
                own.max(files)
            );
            f.log.close().await.unwrap();
        }
    }

    /// An event larger than the whole log bound (20 MiB in a 16 MiB log, which the configuration
    /// allows: `upstream.max_event_bytes` is not checked against `log.max_total_bytes`), from one
    /// session, while another keeps appending small events: the small session is not held back
    /// for good (its appends keep completing), and the big session's events come out whole and in
    /// order (or trimmed, never cut or duplicated).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn adv19_an_event_larger_than_the_whole_bound_does_not_wedge_the_log() {
        for durability in [Durability::Fsync, Durability::Relaxed] {
            let total: u64 = 16 << 20;
            let dir = tempfile::tempdir().unwrap();
            let c = cfg(dir.path(), durability, total);
            let (log, _, _) = Log::open(&c, Metrics::new()).await.expect("open");
            let _failures = log.take_failures().unwrap();
            let big = log
                .create(SessionId::random(), Facade::Legacy, None, None)
                .await
                .unwrap();
            let small = log
                .create(SessionId::random(), Facade::Legacy, None, None)
                .await
                .unwrap();
            let mut want_big = Vec::new();
            for i in 1..=4u64 {
                let size = if i % 2 == 1 { 20 * MIB } else { 9 * MIB };
                let p = payload(0, i, size);
                want_big.push(p.clone());
                let l = log.clone();
                let b = big.clone();
                within(&format!("{durability:?} big {i}"), 60, async move {
                    l.append_many_nowait(&b, vec![ev(&p)]).await.unwrap()
                })
                .await;
                // The small session's waited appends go through after it.
                for k in 0..20u64 {
                    let q = payload(1, i * 100 + k, 30_000);
                    within(
                        &format!("{durability:?} small append after big {i}"),
                        60,
                        log.append(&small, ev(&q)),
                    )
                    .await
                    .expect("small append");
                }
            }
            within(&format!("{durability:?} flush"), 60, log.flush())
                .await
                .unwrap();
            let got = messages(&log, &big);
            eprintln!(
                "{durability:?}: big session reads back seqs {:?}; {} MiB live, {} MiB files",
                got.iter().map(|e| e.seq).collect::<Vec<_>>(),
                log.total_bytes() >> 20,
                log.disk_bytes() >> 20
            );
            assert!(!big.failed() && !small.failed());
            check(&format!("{durability:?} big"), &got, &want_big, true);
            log.close().await.unwrap();
        }
    }

    /// The window of a session that logged many small events then events past the queue bound:
    /// at most `WINDOW_EVENTS` events, and past `WINDOW_BYTES` only one (the newest). Events by
    /// value: a reader that changes its copy changes nobody else's.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn adv19_window_stays_bounded_and_copies_are_private() {
        let dir = tempfile::tempdir().unwrap();
        let c = cfg(dir.path(), Durability::Relaxed, 1 << 34);
        let (log, _, _) = Log::open(&c, Metrics::new()).await.expect("open");
        let sl = log
            .create(SessionId::random(), Facade::Legacy, None, None)
            .await
            .unwrap();
        let window = |sl: &SessionLog| {
            let st = sl.lock();
            let sum: usize = st.window.iter().map(|e| e.payload.len()).sum();
            assert_eq!(sum, st.window_bytes, "window_bytes is the window's bytes");
            (st.window.len(), st.window_bytes)
        };
        let mut i = 1;
        for _ in 0..50 {
            let mut b = log.batch();
            for _ in 0..20 {
                b.push(ev(&payload(0, i, 300)));
                i += 1;
            }
            log.append_many_nowait(&sl, b).await.unwrap();
        }
        log.flush().await.unwrap();
        let (n, bytes) = window(&sl);
        assert!(
            n <= WINDOW_EVENTS && bytes <= WINDOW_BYTES,
            "{n} events, {bytes} bytes"
        );
        for size in [9 * MIB, 20 * MIB, 100, 100] {
            log.append(&sl, ev(&payload(0, i, size))).await.unwrap();
            i += 1;
            let (n, bytes) = window(&sl);
            assert!(
                n <= WINDOW_EVENTS && (bytes <= WINDOW_BYTES || n == 1),
                "after a {size}-byte event: {n} events, {bytes} bytes"
            );
        }
        let head = i - 1;
        let mut a = log.read_after(&sl, head - 2, 10).await.unwrap();
        let b = log.read_after(&sl, head - 2, 10).await.unwrap();
        assert_eq!(a.len(), 2);
        let orig = a[0].payload.clone();
        a[0].payload = Bytes::from_static(b"changed");
        a[0].seq = 999;
        let c2 = log.read_after(&sl, head - 2, 10).await.unwrap();
        assert_eq!(b[0].payload, orig);
        assert_eq!(c2[0].payload, orig);
        assert_eq!(c2[0].seq, head - 1);
        log.close().await.unwrap();
    }

    /// 2 MiB turns where they were 8 MiB (a 256 MiB bound: 8 MiB segments, turns of 2 MiB, not
    /// 32 MiB / 8): 16 sessions flood small events past three times the bound; the files stay
    /// within 1.5 × the bound + 4 segments (compaction keeps pace with turns a sixteenth of a
    /// segment), and every session reads back an in-order tail ending at its last event.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn adv19_a_small_event_flood_keeps_the_disk_bound_with_2_mib_turns() {
        for durability in [Durability::Relaxed, Durability::Fsync] {
            let total: u64 = 256 << 20;
            let dir = tempfile::tempdir().unwrap();
            let c = cfg(dir.path(), durability, total);
            let (log, _, _) = Log::open(&c, Metrics::new()).await.expect("open");
            let _failures = log.take_failures().unwrap();
            let stop = Arc::new(AtomicBool::new(false));
            let sampler = sample_disk(log.clone(), dir.path().to_path_buf(), stop.clone());
            let t0 = Instant::now();
            let f = within(
                &format!("{durability:?} producers"),
                400,
                flood_of(log.clone(), 16, 0, 280, Vec::new()),
            )
            .await;
            within(&format!("{durability:?} flush"), 120, f.log.flush())
                .await
                .unwrap();
            stop.store(true, Ordering::Relaxed);
            let (own, files) = sampler.await.unwrap();
            let bound = total + total / 2 + 4 * seg_size(total);
            let appended: usize = f.want.iter().flatten().map(|b| b.len()).sum();
            eprintln!(
                "{durability:?}: {} MiB appended in {:?}; peak files {} MiB (own count {} MiB), \
                 bound {} MiB; now {} MiB live, {} MiB files",
                appended >> 20,
                t0.elapsed(),
                files >> 20,
                own >> 20,
                bound >> 20,
                f.log.total_bytes() >> 20,
                f.log.disk_bytes() >> 20
            );
            assert!(appended as u64 > 2 * total, "the flood passes the bound");
            for (s, sl) in f.sls.iter().enumerate() {
                assert!(!sl.failed(), "{durability:?} s{s} failed");
                check(
                    &format!("{durability:?} s{s}"),
                    &messages(&f.log, sl),
                    &f.want[s],
                    true,
                );
            }
            assert!(
                own.max(files) <= bound,
                "{durability:?}: files peaked at {} bytes, past {bound}",
                own.max(files)
            );
            f.log.close().await.unwrap();
        }
    }

    /// The events of `got` are the first ones of `want`, each once, in order.
    fn check_prefix(name: &str, got: &[Event], want: &[Bytes]) {
        assert!(got.len() <= want.len(), "{name}: more read than appended");
        check(name, got, &want[..got.len()], false);
    }

    /// A full disk (a 64 MiB tmpfs, all but 10 MiB taken by a ballast file) under a flood of small
    /// events and events past the queue bound (9, 20 MiB): the log degrades; a second wave of
    /// sessions floods big and small events while it is degraded; the ballast goes 1.5 s later,
    /// the log heals, and then every producer finishes, the flush returns, sessions whose write
    /// failed read back a prefix of theirs, the others all of theirs, and a new session logs a
    /// 20 MiB event. Root only (a tmpfs mount).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn adv19_big_events_on_a_full_disk_heal_without_a_hang() {
        let root = std::fs::read_to_string("/proc/self/status")
            .map(|s| s.lines().any(|l| l.starts_with("Uid:\t0\t")))
            .unwrap_or(false);
        if !root {
            eprintln!("skipped: needs root for a tmpfs");
            return;
        }
        for durability in [Durability::Fsync, Durability::Relaxed] {
            let outer = tempfile::tempdir().unwrap();
            let mnt = outer.path().join("mnt");
            std::fs::create_dir(&mnt).unwrap();
            let st = std::process::Command::new("mount")
                .args(["-t", "tmpfs", "-o", "size=64m", "tmpfs"])
                .arg(&mnt)
                .status()
                .unwrap();
            assert!(st.success(), "mount");
            struct Unmount(std::path::PathBuf);
            impl Drop for Unmount {
                fn drop(&mut self) {
                    let _ = std::process::Command::new("umount")
                        .arg("-l")
                        .arg(&self.0)
                        .status();
                }
            }
            let _unmount = Unmount(mnt.clone());
            let data = mnt.join("data");
            let c = cfg(&data, durability, 256 << 20);
            let (log, _, _) = Log::open(&c, Metrics::new()).await.expect("open");
            let _failures = log.take_failures().unwrap();
            // Ballast: everything but 10 MiB.
            let ballast = mnt.join("ballast");
            {
                use std::io::Write;
                let mut f = std::fs::File::create(&ballast).unwrap();
                let block = vec![7u8; 1 << 20];
                while f.write_all(&block).is_ok() {}
                let len = f.metadata().unwrap().len();
                f.set_len(len.saturating_sub(10 << 20)).unwrap();
            }
            // A second wave, created now, appends only once the log is degraded: its appends
            // are held (not failed), its big events wait for every permit.
            let mut wave2 = Vec::new();
            for _ in 0..6 {
                wave2.push(
                    log.create(SessionId::random(), Facade::Legacy, None, None)
                        .await
                        .unwrap(),
                );
            }
            let mut health = log.health();
            let log2 = log.clone();
            let healer = tokio::spawn(async move {
                let t = Instant::now();
                let degraded = tokio::time::timeout(
                    Duration::from_secs(60),
                    health.wait_for(|h| *h != Health::Ok),
                )
                .await
                .map(|r| r.map(|h| *h));
                let w = wave2.clone();
                let sizes = vec![QUEUE_BYTES + 1, 9 * MIB, 100, 20 * MIB];
                let l = log2.clone();
                let second = tokio::spawn(async move { run_flood(&l, &w, 2, 40, sizes).await });
                tokio::time::sleep(Duration::from_millis(1500)).await;
                let held = log2.store.queued.available_permits();
                std::fs::remove_file(&ballast).unwrap();
                let want2 = within("second wave", 120, second).await.unwrap();
                (degraded, t.elapsed(), held, wave2, want2)
            });
            let sizes = vec![9 * MIB, 100, 20 * MIB, 9 * MIB, QUEUE_BYTES + 1];
            let f = within(
                &format!("{durability:?} producers"),
                120,
                flood_of(log.clone(), 12, 2, 60, sizes),
            )
            .await;
            let (degraded, after, free_permits, wave2, want2) = healer.await.unwrap();
            eprintln!(
                "{durability:?}: health left Ok after {after:?}: {degraded:?}; \
                 {free_permits} of {QUEUE_BYTES} queue permits free before healing"
            );
            let _ = within(&format!("{durability:?} flush"), 60, f.log.flush()).await;
            let mut health = f.log.health();
            within(
                &format!("{durability:?} healthy again"),
                30,
                health.wait_for(|h| *h == Health::Ok),
            )
            .await
            .unwrap();
            let mut failed = 0;
            for (s, sl) in f.sls.iter().enumerate() {
                let got = messages(&f.log, sl);
                if sl.failed() {
                    failed += 1;
                    check_prefix(&format!("{durability:?} failed s{s}"), &got, &f.want[s]);
                } else {
                    check(&format!("{durability:?} s{s}"), &got, &f.want[s], false);
                }
            }
            eprintln!("{durability:?}: {failed} of 12 sessions failed by the full disk");
            // A degraded log still tries each write (`throttled` holds appends only over the
            // throttle): wave 2's sessions fail while the disk is full, like wave 1's.
            let mut failed2 = 0;
            for (s, sl) in wave2.iter().enumerate() {
                let got = messages(&f.log, sl);
                if sl.failed() {
                    failed2 += 1;
                    check_prefix(
                        &format!("{durability:?} failed wave 2 s{s}"),
                        &got,
                        &want2[s],
                    );
                } else {
                    check(
                        &format!("{durability:?} wave 2 s{s}"),
                        &got,
                        &want2[s],
                        false,
                    );
                }
            }
            eprintln!("{durability:?}: {failed2} of 6 wave 2 sessions failed");
            let sl = f
                .log
                .create(SessionId::random(), Facade::Legacy, None, None)
                .await
                .unwrap();
            let p = payload(99, 1, 20 * MIB);
            within(
                &format!("{durability:?} big append after healing"),
                60,
                f.log.append(&sl, ev(&p)),
            )
            .await
            .unwrap();
            check(
                &format!("{durability:?} after healing"),
                &messages(&f.log, &sl),
                &[p],
                false,
            );
            within("close", 60, f.log.close()).await.unwrap();
        }
    }
}
