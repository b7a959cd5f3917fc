//! The crash-consistency harness (design.md §10 "Proof", §10b): the proxy binary with its data dir
//! on a real ext4 filesystem (a loop-mounted image), the filesystem aborted at a random moment
//! while legacy clients flood and read — a simulated power loss, or a journal abort ~1 ms after a
//! delivery — then the proxy SIGKILLed, the filesystem remounted (journal replay, or e2fsck), the
//! proxy restarted on the same data dir (sometimes cut by a second power loss while it
//! recovers, sometimes on data damaged where it was synced), and an oracle that holds the log and
//! the resumes against every event any client received. Some images trim (small retention and
//! 1 MiB segments), so retention, eviction and compaction run under the faults. See
//! `docs/crash.md`.

pub mod book;
pub mod damage;
pub mod flood;
pub mod fs;
pub mod oracle;
pub mod procs;

#[path = "../chaos/rng.rs"]
pub mod rng;

#[allow(dead_code)]
#[path = "../chaos/wire.rs"]
pub mod wire;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::{sleep, Instant};

use book::{Sess, State, Stats, V};
use procs::{Limits, Mode, Proc, Setup};
use rng::Rng;

/// How much crashing.
#[derive(Clone, Debug)]
pub struct Profile {
    /// Name.
    pub name: String,
    /// Image generations (a fresh filesystem each).
    pub generations: u32,
    /// Aborts per generation: the data dir goes through this many crash/recovery cycles.
    pub aborts_per_image: u32,
    /// Concurrent clients per cycle.
    pub clients: u64,
    /// The abort comes this long after the flood started: `lo..=hi` ms.
    pub abort_ms: (u64, u64),
    /// Image size (sparse).
    pub image_mib: u64,
    /// The fault: a power loss (filesystem aborted, then the proxy killed) or, as a control run
    /// of the oracle, only a SIGKILL of the proxy (the filesystem synced before the remount).
    pub fault: Fault,
    /// Share of the aborts that are a journal abort (`trigger_fs_error`, ~1 ms after a client
    /// received an event) rather than the shutdown ioctl. Power faults only.
    pub journal_aborts: f64,
    /// Share of the aborts whose recovering proxy is itself cut by a second power loss.
    pub recovery_aborts: f64,
    /// Share of the aborts (not the first of an image) after which one chunk record is damaged
    /// where it was synced, before the restart. Power faults only.
    pub damage: f64,
    /// Which images trim (small retention, small `log.max_total_bytes`, 1 MiB segments).
    pub trim: Trim,
}

/// Which images run with trimming on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Trim {
    /// Image 1 of every 3 keeps everything (its logs must start at seq 1), the others trim.
    Mixed,
    /// Every image trims.
    On,
    /// No image trims.
    Off,
}

impl Trim {
    /// Does image `g` (from 1) trim?
    pub fn on(self, g: u32) -> bool {
        match self {
            Trim::Mixed => g % 3 != 1,
            Trim::On => true,
            Trim::Off => false,
        }
    }
}

/// What happens at the abort moment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// `EXT4_IOC_SHUTDOWN` (no log flush), then SIGKILL: a simulated power loss.
    Power,
    /// SIGKILL only; the page cache survives (control run: the oracle must find nothing an
    /// `fsync`-mode proxy could excuse).
    Kill,
}

impl Profile {
    /// CI: 12 aborts (6 per mode; 3 of them journal aborts), 3 recoveries cut, 3 damages, 2 of 3
    /// images trimming; under a minute on 2 cores in a debug build.
    pub fn short() -> Self {
        Self {
            name: "short".into(),
            generations: 3,
            aborts_per_image: 4,
            clients: 4,
            abort_ms: (300, 2000),
            image_mib: 512,
            fault: Fault::Power,
            journal_aborts: 0.25,
            recovery_aborts: 0.25,
            damage: 0.25,
            trim: Trim::Mixed,
        }
    }

    /// Hundreds of aborts in both modes (release build).
    pub fn long() -> Self {
        Self {
            name: "long".into(),
            generations: 50,
            aborts_per_image: 6,
            clients: 6,
            abort_ms: (50, 3000),
            image_mib: 1024,
            fault: Fault::Power,
            journal_aborts: 0.2,
            recovery_aborts: 0.2,
            damage: 0.2,
            trim: Trim::Mixed,
        }
    }

    /// `CRASH_PROFILE` (default short) with `CRASH_GENERATIONS`, `CRASH_ABORTS_PER_IMAGE`,
    /// `CRASH_CLIENTS`, `CRASH_IMAGE_MB`, `CRASH_FAULT` (`power`, `kill`), `CRASH_JOURNAL_ABORTS`,
    /// `CRASH_RECOVERY_ABORTS`, `CRASH_DAMAGE` (shares, 0 to 1) and `CRASH_TRIM` (`mixed`, `on`,
    /// `off`) overrides.
    pub fn from_env() -> Self {
        let name = std::env::var("CRASH_PROFILE").unwrap_or_else(|_| "short".into());
        let mut p = match name.as_str() {
            "short" => Self::short(),
            "long" => Self::long(),
            other => panic!("CRASH_PROFILE={other}: expected short or long"),
        };
        let num = |k: &str| std::env::var(k).ok().and_then(|v| v.parse::<u64>().ok());
        if let Some(v) = num("CRASH_GENERATIONS") {
            p.generations = v as u32;
        }
        if let Some(v) = num("CRASH_ABORTS_PER_IMAGE") {
            p.aborts_per_image = (v as u32).max(1);
        }
        if let Some(v) = num("CRASH_CLIENTS") {
            p.clients = v.max(1);
        }
        if let Some(v) = num("CRASH_IMAGE_MB") {
            p.image_mib = v.max(64);
        }
        match std::env::var("CRASH_FAULT").as_deref() {
            Err(_) | Ok("power") => {}
            Ok("kill") => p.fault = Fault::Kill,
            Ok(other) => panic!("CRASH_FAULT={other}: expected power or kill"),
        }
        let share = |k: &str| {
            std::env::var(k).ok().map(|v| match v.parse::<f64>() {
                Ok(x) if (0.0..=1.0).contains(&x) => x,
                _ => panic!("{k}={v}: expected a share from 0 to 1"),
            })
        };
        if let Some(v) = share("CRASH_JOURNAL_ABORTS") {
            p.journal_aborts = v;
        }
        if let Some(v) = share("CRASH_RECOVERY_ABORTS") {
            p.recovery_aborts = v;
        }
        if let Some(v) = share("CRASH_DAMAGE") {
            p.damage = v;
        }
        match std::env::var("CRASH_TRIM").as_deref() {
            Err(_) => {}
            Ok("mixed") => p.trim = Trim::Mixed,
            Ok("on") => p.trim = Trim::On,
            Ok("off") => p.trim = Trim::Off,
            Ok(other) => panic!("CRASH_TRIM={other}: expected mixed, on or off"),
        }
        if p.fault == Fault::Kill {
            // The control run has nothing but kills: the oracle must find nothing.
            p.journal_aborts = 0.0;
            p.damage = 0.0;
        }
        p
    }
}

/// `CRASH_SEED`, or a fresh one.
pub fn seed_from_env() -> u64 {
    std::env::var("CRASH_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| {
            let mut b = [0u8; 8];
            getrandom::getrandom(&mut b).expect("OS random source");
            u64::from_le_bytes(b) % 1_000_000_000_000
        })
}

/// What a run found.
pub struct Outcome {
    /// The summary line.
    pub summary: String,
    /// The detail line.
    pub detail: String,
    /// The first violations of each kind.
    pub violations: Vec<String>,
    /// No violation.
    pub ok: bool,
    /// The work dir (kept when not ok).
    pub dir: PathBuf,
}

/// The durability mode of every proxy instance, per generation: instance `i` serves the flood of
/// abort `i` and recovers from abort `i - 1`; the last one only recovers and answers resumes.
/// Aborts are half fsync, half relaxed; the order is shuffled until every (crashed mode, restart
/// mode) pair occurs.
pub fn plan_modes(rng: &mut Rng, generations: u32, per: u32) -> Vec<Vec<Mode>> {
    let total = (generations * per) as usize;
    let mut crash: Vec<Mode> = (0..total)
        .map(|i| {
            if i % 2 == 0 {
                Mode::Fsync
            } else {
                Mode::Relaxed
            }
        })
        .collect();
    let mut best = Vec::new();
    for _ in 0..1000 {
        for i in (1..crash.len()).rev() {
            let j = rng.range(0, i as u64) as usize;
            crash.swap(i, j);
        }
        let plan: Vec<Vec<Mode>> = crash
            .chunks(per as usize)
            .map(|c| {
                let mut v = c.to_vec();
                v.push(if rng.chance(0.5) {
                    Mode::Fsync
                } else {
                    Mode::Relaxed
                });
                v
            })
            .collect();
        let mut pairs = std::collections::BTreeSet::new();
        for g in &plan {
            for w in g.windows(2) {
                pairs.insert((w[0], w[1]));
            }
        }
        best = plan;
        if pairs.len() == 4 || total < 4 {
            break;
        }
    }
    best
}

/// When a recovering proxy is cut by the second power loss.
#[derive(Clone, Copy, Debug)]
pub enum RecoveryAbort {
    /// This many ms after it was spawned (it is usually still scanning or ending sessions).
    After(u64),
    /// This many ms after it printed that it is listening (its first turns).
    Listening(u64),
}

/// The faults of one abort cycle besides the abort itself.
#[derive(Clone, Copy, Debug, Default)]
pub struct CycleFaults {
    /// The abort is a journal abort, not the shutdown ioctl.
    pub journal: bool,
    /// The recovery after it is cut by a second power loss.
    pub recovery_abort: Option<RecoveryAbort>,
    /// Synced data is damaged before the restart.
    pub damage: bool,
}

/// Spreads the profile's shares of journal aborts, cut recoveries and damage over the cycles
/// (`modes[g][a]` is the crashed mode of cycle `a` of image `g`): exact counts, shuffled by the
/// seed; journal aborts split evenly between the two modes; damage never in an image's first
/// cycle (nothing was checked, so nothing is known synced yet).
pub fn plan_faults(rng: &mut Rng, profile: &Profile, modes: &[Vec<Mode>]) -> Vec<Vec<CycleFaults>> {
    let per = profile.aborts_per_image as usize;
    let all: Vec<(usize, usize)> = (0..modes.len())
        .flat_map(|g| (0..per).map(move |a| (g, a)))
        .collect();
    let mut plan = vec![vec![CycleFaults::default(); per]; modes.len()];
    let quota = |share: f64, n: usize| ((share * all.len() as f64).round() as usize).min(n);
    let pick = |rng: &mut Rng, from: Vec<(usize, usize)>, n: usize| -> Vec<(usize, usize)> {
        let mut from = from;
        for i in (1..from.len()).rev() {
            let j = rng.range(0, i as u64) as usize;
            from.swap(i, j);
        }
        from.truncate(n);
        from
    };
    let total = quota(profile.journal_aborts, all.len());
    for (m, n) in [(Mode::Fsync, total - total / 2), (Mode::Relaxed, total / 2)] {
        let of_mode: Vec<_> = all
            .iter()
            .copied()
            .filter(|&(g, a)| modes[g][a] == m)
            .collect();
        for (g, a) in pick(rng, of_mode, n) {
            plan[g][a].journal = true;
        }
    }
    for (g, a) in pick(rng, all.clone(), quota(profile.recovery_aborts, all.len())) {
        plan[g][a].recovery_abort = Some(if rng.chance(0.5) {
            RecoveryAbort::After(rng.range(2, 150))
        } else {
            RecoveryAbort::Listening(rng.range(0, 20))
        });
    }
    let later: Vec<_> = all.iter().copied().filter(|&(_, a)| a > 0).collect();
    let n = quota(profile.damage, later.len());
    for (g, a) in pick(rng, later, n) {
        plan[g][a].damage = true;
    }
    plan
}

struct Run {
    setup: Setup,
    profile: Profile,
    seed: u64,
    stats: Arc<Mutex<Stats>>,
    upstream: Proc,
    /// Proxy instances started (numbers the serving ones).
    inst: u32,
    /// Abort cycles so far.
    cycle: u32,
    /// Copies kept of data dirs with a violation (at most 3).
    kept: u32,
}

impl Run {
    fn stats(&self) -> std::sync::MutexGuard<'_, Stats> {
        self.stats.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Starts a proxy instance in `mode` and waits until it is ready; on failure the violation
    /// names what happened.
    async fn start(&mut self, data: &Path, mode: Mode, limits: Limits, why: &str) -> Option<Proc> {
        self.inst += 1;
        let mut p = Proc::proxy(&self.setup, data, mode, limits);
        if procs::wait_ready(self.setup.admin, &mut p, Duration::from_secs(90)).await {
            return Some(p);
        }
        let status = p.exited();
        p.kill9();
        let tail = procs::tail(&self.setup.proxy_log(), 15);
        self.stats().violation(
            V::RestartFailure,
            format!(
                "{why}: proxy instance {} ({}) did not become ready on the data dir (exit {status:?}); stderr tail:\n{tail}",
                self.inst,
                mode.as_str()
            ),
        );
        None
    }

    async fn upstream_alive(&mut self) {
        if let Some(st) = self.upstream.exited() {
            self.stats().violation(
                V::Protocol,
                format!("the demo upstream exited on its own ({st})"),
            );
            self.upstream = Proc::upstream(&self.setup);
            procs::wait_port(self.setup.upstream, Duration::from_secs(30)).await;
        }
    }

    /// The journal abort: armed now, it lands ~1 ms after the next event a client records (or
    /// after 5 s without one). The proxy goes on running on the aborted, read-only filesystem
    /// for 100–300 ms, to meet the failure, and is then stopped and killed.
    async fn journal_abort(&mut self, ctx: &Arc<flood::Ctx>, image: &fs::Image, rng: &mut Rng) {
        let (tx, rx) = std::sync::mpsc::channel::<std::time::Instant>();
        let (done_tx, done_rx) = tokio::sync::oneshot::channel();
        let path = image.fs_error_path();
        let flag = ctx.clone();
        ctx.delivery.arm(tx);
        std::thread::spawn(move || {
            let delivered = rx.recv_timeout(Duration::from_secs(5)).ok();
            if delivered.is_some() {
                std::thread::sleep(Duration::from_millis(1));
            }
            flag.aborted.store(true, Ordering::SeqCst);
            let delay = delivered.map(|t| t.elapsed());
            let r = fs::Image::trigger_fs_error(&path);
            let _ = done_tx.send((r, delay));
        });
        let (r, delay) = done_rx.await.expect("the journal abort thread answers");
        r.unwrap_or_else(|e| panic!("crash harness: the journal abort failed: {e}"));
        {
            let mut st = self.stats();
            st.journal_aborts += 1;
            if let Some(d) = delay {
                let us = d.as_micros() as u64;
                st.journal_delay_us = if st.journal_after_delivery == 0 {
                    (us, us)
                } else {
                    (st.journal_delay_us.0.min(us), st.journal_delay_us.1.max(us))
                };
                st.journal_after_delivery += 1;
            }
        }
        sleep(Duration::from_millis(rng.range(100, 300))).await;
    }

    /// The second power loss: a proxy starts recovering `data` in `mode` and is cut `at` its
    /// chosen moment; the image is power-cycled again.
    async fn recovery_abort(
        &mut self,
        image: &mut fs::Image,
        data: &Path,
        mode: Mode,
        limits: Limits,
        at: RecoveryAbort,
        label: &str,
    ) {
        self.inst += 1;
        let t0 = Instant::now();
        let mut p = Proc::proxy_watched(&self.setup, data, mode, limits);
        match at {
            RecoveryAbort::After(ms) => sleep(Duration::from_millis(ms)).await,
            RecoveryAbort::Listening(ms) => {
                p.wait_listening(Duration::from_secs(90)).await;
                sleep(Duration::from_millis(ms)).await;
            }
        }
        let listening = p.listening();
        let planned = match at {
            RecoveryAbort::After(ms) => format!("{ms} ms after its start"),
            RecoveryAbort::Listening(ms) => format!("{ms} ms after it listened"),
        };
        if let Some(st) = p.exited() {
            self.stats().violation(
                V::RestartFailure,
                format!(
                    "{label}: recovering proxy instance {} ({}) exited on its own ({st}) before the second abort; stderr tail:\n{}",
                    self.inst,
                    mode.as_str(),
                    procs::tail(&self.setup.proxy_log(), 15)
                ),
            );
        }
        if self.profile.fault == Fault::Power {
            assert!(
                p.freeze(),
                "crash harness: the proxy's threads did not all stop within 5 s of SIGSTOP"
            );
            image
                .abort()
                .unwrap_or_else(|e| panic!("crash harness: abort failed: {e}"));
        }
        p.kill9();
        if self.profile.fault == Fault::Kill {
            image
                .sync()
                .unwrap_or_else(|e| panic!("crash harness: syncfs failed: {e}"));
        }
        let took = t0.elapsed().as_millis();
        image
            .power_cycle()
            .unwrap_or_else(|e| panic!("crash harness: remount after the abort failed: {e}"));
        {
            let mut st = self.stats();
            st.recovery_aborts += 1;
            st.recovery_aborts_listening += listening as u64;
        }
        eprintln!(
            "crash-abort: {label}: recovering instance {} ({}) cut {planned}, {took} ms in all ({}), recovery again in {} mode",
            self.inst,
            mode.as_str(),
            if listening {
                "listening"
            } else {
                "still recovering"
            },
            mode.as_str()
        );
    }

    /// Damages one chunk record where it was certainly synced (see `damage`): below the segment
    /// lengths seen after a `syncfs` of the harness (`synced`: at the previous check, and during
    /// this flood), or — after a power loss of an fsync-mode proxy — in the newest segment before
    /// a record holding an event a client received from it.
    /// `fsync_crashed` names that proxy instance. The session is marked in the book.
    fn damage(
        &mut self,
        data: &Path,
        book: &mut [Sess],
        synced: &BTreeMap<u64, u64>,
        fsync_crashed: Option<u32>,
        rng: &mut Rng,
        label: &str,
    ) {
        // Seqs received from the crashed fsync-mode instance, per session of this cycle.
        let mut got: std::collections::HashMap<&str, Vec<u64>> = Default::default();
        if let Some(inst) = fsync_crashed {
            for s in book.iter().filter(|s| s.cycle == self.cycle) {
                let mut v: Vec<u64> = s
                    .rcv
                    .iter()
                    .filter(|(_, r)| r.inst == inst && r.mode == Mode::Fsync)
                    .map(|(id, _)| id.1)
                    .collect();
                v.sort_unstable();
                got.insert(s.sid.as_str(), v);
            }
        }
        let witness = |sid: &str, first: u64, count: u64| {
            got.get(sid).is_some_and(|v| {
                let i = v.partition_point(|&x| x < first);
                v.get(i).is_some_and(|&x| x < first + count)
            })
        };
        let eligible = |sid: &str| {
            book.iter().any(|s| {
                s.sid == sid
                    && s.last.is_some()
                    && s.damage.is_none()
                    && !s.evicted
                    && s.state != State::Orphan
            })
        };
        let w: damage::Witness<'_> = &witness;
        let hit = damage::inject(data, rng, synced, fsync_crashed.map(|_| w), &eligible)
            .unwrap_or_else(|e| panic!("crash harness: damaging the data dir failed: {e}"));
        let d = match hit {
            Ok(d) => d,
            Err(why) => {
                self.stats().damage_skipped += 1;
                eprintln!("crash-damage: {label}: {why}");
                return;
            }
        };
        let s = book
            .iter_mut()
            .find(|s| s.sid == d.sid)
            .expect("eligible sessions are in the book");
        s.damage = Some((d.first, d.first + d.count));
        s.damage_pending = true;
        {
            let mut st = self.stats();
            st.damage_injected += 1;
            match d.region {
                damage::Region::Old => st.damage_where.0 += 1,
                damage::Region::Newest => st.damage_where.1 += 1,
            }
        }
        eprintln!(
            "crash-damage: {label}: session {} seqs {}..={} (segment {:016x} offset {}, {}): {}",
            &d.sid[..8],
            d.first,
            d.first + d.count - 1,
            d.seg,
            d.off,
            match d.region {
                damage::Region::Old => "synced by a syncfs of the harness",
                damage::Region::Newest =>
                    "newest segment, before a record a client received from the fsync-mode proxy",
            },
            d.how
        );
    }

    /// One image generation: probe, then `modes.len() - 1` aborts with a check after each.
    async fn generation(&mut self, g: u32, modes: &[Mode], faults: &[CycleFaults]) {
        let pid = std::process::id();
        let img = fs::image_dir(&self.setup.work)
            .join(format!("mcp-resume-crash-{pid}-{}-g{g}.img", self.seed));
        let mut image = fs::Image::create(img, self.setup.work.join("mnt"), self.profile.image_mib);
        let probe = fs::probe(&mut image)
            .unwrap_or_else(|e| panic!("crash harness: the abort probe failed to run: {e}"));
        {
            let mut st = self.stats();
            st.generations += 1;
            for (i, b) in [
                true,
                probe.synced_survived,
                probe.frozen,
                probe.write_after_abort_failed,
                probe.unsynced_file_survived,
                probe.unsynced_append_survived,
            ]
            .into_iter()
            .enumerate()
            {
                st.probes[i] += b as u64;
            }
        }
        assert!(
            probe.ok(),
            "crash harness: the ext4 shutdown ioctl does not freeze the on-disk state as required on {} ({probe:?}); no result of this harness could be trusted",
            image.device()
        );
        // The new faults draw from a stream of their own, so a seed's abort moments and client
        // choices stay what they were.
        let mut frng = Rng::fork(self.seed, 200 + g as u64);
        let limits = if self.profile.trim.on(g) {
            self.stats().trim_images += 1;
            Limits {
                max_events: frng.range(300, 3000),
                max_bytes: frng.range(64, 256) << 10,
                // 2 to 32 MiB: 1 MiB segments (max_total / 32, clamped); the smaller ones evict
                // ended sessions within a few cycles.
                max_total: [2u64, 4, 8, 32][frng.range(0, 3) as usize] << 20,
            }
        } else {
            Limits::KEEP_ALL
        };
        if limits.trims() {
            eprintln!(
                "crash-image: gen={g}: trimming, max_events_per_session={} max_bytes_per_session={} max_total_bytes={}",
                limits.max_events, limits.max_bytes, limits.max_total
            );
        }
        let data = image.mnt.join("data");
        let mut book: Vec<Sess> = Vec::new();
        let at_start: u64 = self.stats().violations.values().sum();
        let Some(mut proxy) = self.start(&data, modes[0], limits, "first start").await else {
            return;
        };
        let mut rng = Rng::fork(self.seed, 100 + g as u64);
        // Half the images abort a data dir created moments before (what a new engine must
        // survive too: new files and their directory entries synced); the other half start from
        // a settled one, as after a while in service. Later cycles always start settled (the
        // check syncs the filesystem).
        let settled = rng.chance(0.5);
        if settled {
            image
                .sync()
                .unwrap_or_else(|e| panic!("crash harness: syncfs failed: {e}"));
        }
        // Segment lengths after the harness's last syncfs (at the last check, or in a damage
        // cycle's flood): where damage is known synced.
        let mut synced: BTreeMap<u64, u64> = BTreeMap::new();
        for a in 0..modes.len() - 1 {
            let mode = modes[a];
            let f = faults[a];
            let journal = f.journal && self.profile.fault == Fault::Power;
            let label = format!("gen={g} abort={}", a + 1);
            self.cycle += 1;
            self.upstream_alive().await;
            let ctx = Arc::new(flood::Ctx {
                addr: self.setup.addr(),
                inst: self.inst,
                mode,
                cycle: self.cycle,
                aborted: Default::default(),
                stop: Default::default(),
                stats: self.stats.clone(),
                trim: limits.trims(),
                delivery: Default::default(),
            });
            let clients: Vec<_> = (0..self.profile.clients)
                .map(|c| {
                    let r = Rng::fork(self.seed, 10_000 + self.cycle as u64 * 100 + c);
                    tokio::spawn(flood::client(ctx.clone(), r))
                })
                .collect();
            let before = self.stats().violations.clone();
            let received_before = self.stats().events_received;
            let t0 = Instant::now();
            let wait = rng.range(self.profile.abort_ms.0, self.profile.abort_ms.1);
            if f.damage {
                // A damage cycle also makes the flood's writes so far certainly durable: a syncfs
                // by the harness shortly before the abort (under retention, chunks synced earlier
                // are dead by the abort; the previous check's segments may be compacted away).
                // The lengths are read first: what is appended while syncfs runs is not covered.
                let before = frng.range(0, 30).min(wait);
                sleep(Duration::from_millis(wait - before)).await;
                let lengths = fs::Image::segment_lengths(&data);
                image
                    .sync()
                    .unwrap_or_else(|e| panic!("crash harness: syncfs failed: {e}"));
                for (id, len) in lengths {
                    let l = synced.entry(id).or_default();
                    *l = (*l).max(len);
                }
                sleep(Duration::from_millis(before)).await;
            } else {
                sleep(Duration::from_millis(wait)).await;
            }
            if let Some(st) = proxy.exited() {
                self.stats().violation(
                    V::Protocol,
                    format!(
                        "proxy instance {} ({}) exited on its own before the abort ({st}); stderr tail:\n{}",
                        self.inst,
                        mode.as_str(),
                        procs::tail(&self.setup.proxy_log(), 15)
                    ),
                );
            }
            let crashed = self.inst;
            if journal {
                // The journal abort lands while the proxy runs (that is the fault); it is
                // stopped only afterwards, to be killed where it is.
                self.journal_abort(&ctx, &image, &mut frng).await;
                let _ = proxy.freeze();
            } else {
                // The power cut: the process stops first (with the power, it dies with the
                // disk), then nothing more reaches the disk, then the process is killed.
                // Stopping it first matters: the shutdown ioctl takes ~100 ms to abort the
                // journal, and an fdatasync in flight meanwhile can return success for data that
                // does not survive (measured: 16 of 60 runs of a bare fdatasync loop; none for
                // syncs that returned before the ioctl; docs/crash.md). A real power loss leaves
                // no process to act on such a sync.
                ctx.aborted.store(true, Ordering::SeqCst);
                if self.profile.fault == Fault::Power {
                    assert!(
                        proxy.freeze(),
                        "crash harness: the proxy's threads did not all stop within 5 s of SIGSTOP"
                    );
                    image
                        .abort()
                        .unwrap_or_else(|e| panic!("crash harness: abort failed: {e}"));
                }
            }
            let self_exit = proxy.kill9();
            if self.profile.fault == Fault::Kill {
                image
                    .sync()
                    .unwrap_or_else(|e| panic!("crash harness: syncfs failed: {e}"));
            }
            ctx.stop.store(true, Ordering::SeqCst);
            let took = t0.elapsed().as_millis() as u64;
            for c in clients {
                match tokio::time::timeout(Duration::from_secs(60), c).await {
                    Ok(Ok(sessions)) => book.extend(sessions),
                    _ => self.stats().violation(
                        V::Protocol,
                        "a flood client did not finish within 60 s of the proxy's death".into(),
                    ),
                }
            }
            {
                let mut st = self.stats();
                st.aborts += 1;
                match mode {
                    Mode::Fsync => st.fsync_aborts += 1,
                    Mode::Relaxed => st.relaxed_aborts += 1,
                }
                *st.transitions.entry((mode, modes[a + 1])).or_default() += 1;
                st.fresh_aborts += (a == 0 && !settled) as u64;
                if let Some(s) = self_exit {
                    *st.self_exits.entry(format!("{s}")).or_default() += 1;
                }
                st.abort_ms = if st.aborts == 1 {
                    (took, took)
                } else {
                    (st.abort_ms.0.min(took), st.abort_ms.1.max(took))
                };
            }
            eprintln!(
                "crash-abort: {label} ({}) {} instance {} {} after {took} ms, clients received {} events, recovery in {} mode",
                if a == 0 && !settled { "fresh data dir" } else { "settled data dir" },
                mode.as_str(),
                self.inst,
                if journal { "journal abort" } else { "power loss" },
                self.stats().events_received - received_before,
                modes[a + 1].as_str()
            );
            if journal {
                let fixed = image.fsck_cycle().unwrap_or_else(|e| {
                    panic!("crash harness: fsck and remount after the journal abort failed: {e}")
                });
                let mut st = self.stats();
                if fixed {
                    st.fsck.1 += 1;
                } else {
                    st.fsck.0 += 1;
                }
            } else {
                image.power_cycle().unwrap_or_else(|e| {
                    panic!("crash harness: remount after the abort failed: {e}")
                });
            }
            let done = |run: &Self| {
                let st = run.stats();
                let new: Vec<String> = st
                    .violations
                    .iter()
                    .filter_map(|(v, n)| {
                        let d = n - before.get(v).copied().unwrap_or(0);
                        (d > 0).then(|| format!("{}+{d}", v.name()))
                    })
                    .collect();
                eprintln!(
                    "crash-check: gen={g} abort={}: {}",
                    a + 1,
                    if new.is_empty() {
                        "no violation".to_string()
                    } else {
                        new.join(" ")
                    }
                );
            };

            let next = modes[a + 1];
            let damaged = f.damage && self.profile.fault == Fault::Power && {
                // Newest-segment damage needs a power loss of an fsync-mode proxy: only then
                // was every event a client received synced before it was sent.
                let witnessed = mode == Mode::Fsync && !journal;
                let before = self.stats().damage_injected;
                let proof = witnessed.then_some(crashed);
                self.damage(&data, &mut book, &synced, proof, &mut frng, &label);
                self.stats().damage_injected > before
            };
            if let Some(at) = f.recovery_abort {
                self.recovery_abort(&mut image, &data, next, limits, at, &label)
                    .await;
            }

            // Recovery in the next mode, a clean stop, then the log is read and made the baseline.
            let full = a + 2 == modes.len() || {
                let (used, size) = image.usage().unwrap_or((0, 1));
                used * 2 > size
            };
            let Some(mut rec) = self
                .start(&data, next, limits, "restart after the abort")
                .await
            else {
                done(self);
                break;
            };
            if damaged && f.recovery_abort.is_none() {
                // (After a cut recovery the first one may already have dealt with it for good.)
                let n = procs::metric(self.setup.admin, "mcp_resume_store_damage_total").await;
                if n.unwrap_or(0.0) < 1.0 {
                    self.stats().violation(
                        V::DamageUncounted,
                        format!(
                            "{label}: proxy instance {} recovered a log with a damaged chunk record; mcp_resume_store_damage_total is {n:?}",
                            self.inst
                        ),
                    );
                }
            }
            match rec.sigterm(Duration::from_secs(20)).await {
                Some(s) if s.success() => {}
                other => self.stats().violation(
                    V::Protocol,
                    format!(
                        "proxy instance {} ({}) after recovery: SIGTERM gave {other:?}, not a clean exit",
                        self.inst,
                        next.as_str()
                    ),
                ),
            }
            if let Err(e) = image.sync() {
                panic!("crash harness: syncfs failed: {e}");
            }
            synced = fs::Image::segment_lengths(&data);
            let cx = oracle::CheckCtx {
                bin: &self.setup.bin,
                data: &data,
                cycle: self.cycle,
                full,
                journal_inst: journal.then_some(crashed),
            };
            let views = {
                let mut st = self.stats();
                match oracle::check_log(&cx, &mut book, &mut st) {
                    Ok(v) => v,
                    Err(e) => {
                        st.violation(
                            V::RestartFailure,
                            format!("inspect of the recovered data dir failed: {e}"),
                        );
                        drop(st);
                        done(self);
                        break;
                    }
                }
            };
            let Some(p) = self
                .start(&data, next, limits, "restart after the check")
                .await
            else {
                done(self);
                break;
            };
            proxy = p;
            oracle::resumes(
                self.setup.addr(),
                self.inst,
                next,
                &mut book,
                &views,
                &self.stats,
            )
            .await;
            done(self);
            if full {
                break;
            }
        }
        let _ = proxy.sigterm(Duration::from_secs(20)).await;
        let found = self.stats().violations.values().sum::<u64>() > at_start;
        if found && self.kept < 3 {
            self.kept += 1;
            image.keep_copy(&data, &self.setup.work.join(format!("data-g{g}")));
        }
    }
}

/// Runs `profile` with `seed` against the proxy binary `bin`.
pub fn run(profile: &Profile, seed: u64, bin: PathBuf) -> Outcome {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(run_async(profile, seed, bin))
}

async fn run_async(profile: &Profile, seed: u64, bin: PathBuf) -> Outcome {
    let work = std::env::temp_dir().join(format!("mcp-resume-crash-{}-{seed}", std::process::id()));
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).expect("work dir");
    let setup = Setup {
        bin,
        port: procs::port(),
        admin: procs::port(),
        upstream: procs::port(),
        work: work.clone(),
    };
    let started = Instant::now();
    let upstream = Proc::upstream(&setup);
    assert!(
        procs::wait_port(setup.upstream, Duration::from_secs(30)).await,
        "the demo upstream did not start; see {}",
        work.join("upstream.stderr.log").display()
    );
    let mut run = Run {
        setup,
        profile: profile.clone(),
        seed,
        stats: Arc::new(Mutex::new(Stats::default())),
        upstream,
        inst: 0,
        cycle: 0,
        kept: 0,
    };
    let plan = plan_modes(
        &mut Rng::fork(seed, 1),
        profile.generations,
        profile.aborts_per_image,
    );
    let faults = plan_faults(&mut Rng::fork(seed, 2), profile, &plan);
    for (g, modes) in plan.iter().enumerate() {
        run.generation(g as u32 + 1, modes, &faults[g]).await;
    }
    run.upstream.kill9();
    let st = run.stats();
    finish(profile, seed, &st, started.elapsed(), work)
}

fn finish(profile: &Profile, seed: u64, st: &Stats, took: Duration, dir: PathBuf) -> Outcome {
    let mut summary = format!(
        "crash: profile={} aborts={} fsync_aborts={} relaxed_aborts={} journal_aborts={} recovery_aborts={} damage_injected={} generations={} sessions={} events_received={}",
        profile.name,
        st.aborts,
        st.fsync_aborts,
        st.relaxed_aborts,
        st.journal_aborts,
        st.recovery_aborts,
        st.damage_injected,
        st.generations,
        st.sessions,
        st.events_received
    );
    for v in V::ALL {
        summary.push_str(&format!(" {}={}", v.name(), st.count(v)));
        if v == V::LostAcknowledged {
            summary.push_str(&format!(
                " lost_tails_refused={} trimmed_refused={} damage_refused={}",
                st.lost_tails_refused, st.trimmed_refused, st.damage_refused
            ));
        }
    }
    summary.push_str(&format!(" seed={seed}"));
    let map = |m: &std::collections::BTreeMap<String, u64>| {
        m.iter()
            .map(|(k, v)| format!("{k}:{v}"))
            .collect::<Vec<_>>()
            .join(",")
    };
    let transitions = st
        .transitions
        .iter()
        .map(|((a, b), n)| format!("{}->{}:{n}", a.as_str(), b.as_str()))
        .collect::<Vec<_>>()
        .join(",");
    let p = st.probes;
    let detail = format!(
        "crash-detail: elapsed={:.0}s transitions={{{transitions}}} fresh_data_dir_aborts={} requests={} events_read_after_abort={} lost_relaxed_events={} relaxed_unanswered={} resumes_served={} refusals={{{}}} complete_histories={} aborted_32091={} orphaned={} self_exits={{{}}} checks={} inspects={} abort_after_ms={}..{} probe={{runs:{},synced_survived:{},frozen:{},write_after_abort_failed:{},unsynced_file_survived:{},unsynced_append_survived:{}}} trim_images={} trimmed_events={} flood_trimmed={} evicted={} journal={{after_delivery:{},delay_us:{}..{},lost_fsync_events:{},fsck_clean:{},fsck_fixed:{}}} recovery_aborts_listening={} damage={{harness_synced:{},before_delivered:{},skipped:{},lost_events:{}}}",
        took.as_secs_f64(),
        st.fresh_aborts,
        st.requests,
        st.events_read_after_abort,
        st.lost_relaxed_events,
        st.relaxed_unanswered,
        st.resumes_served,
        map(&st.refusals),
        st.complete_histories,
        st.aborted_32091,
        st.orphaned,
        map(&st.self_exits),
        st.checks,
        st.inspects,
        st.abort_ms.0,
        st.abort_ms.1,
        p[0],
        p[1],
        p[2],
        p[3],
        p[4],
        p[5],
        st.trim_images,
        st.trimmed_events,
        st.flood_trimmed,
        st.evicted,
        st.journal_after_delivery,
        st.journal_delay_us.0,
        st.journal_delay_us.1,
        st.journal_lost_events,
        st.fsck.0,
        st.fsck.1,
        st.recovery_aborts_listening,
        st.damage_where.0,
        st.damage_where.1,
        st.damage_skipped,
        st.damage_lost_events,
    );
    let violations: Vec<String> = st.details.values().flatten().cloned().collect();
    let ok = st.clean() && st.aborts > 0;
    if ok && std::env::var_os("CRASH_KEEP").is_none() {
        let _ = std::fs::remove_dir_all(&dir);
    }
    Outcome {
        summary,
        detail,
        violations,
        ok,
        dir,
    }
}
