//! The crash-consistency harness (design.md §10 "Proof"): the proxy binary with its data dir on a
//! real ext4 filesystem (a loop-mounted image), the filesystem aborted at a random moment while
//! legacy clients flood and read — a simulated power loss — then the proxy SIGKILLed, the
//! filesystem remounted (journal replay), the proxy restarted on the same data dir, and an oracle
//! that holds the log and the resumes against every event any client received. See
//! `docs/crash.md`.

pub mod book;
pub mod flood;
pub mod fs;
pub mod oracle;
pub mod procs;

#[path = "../chaos/rng.rs"]
pub mod rng;

#[allow(dead_code)]
#[path = "../chaos/wire.rs"]
pub mod wire;

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::{sleep, Instant};

use book::{Sess, Stats, V};
use procs::{Mode, Proc, Setup};
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
    /// CI: 12 aborts (6 per mode), about 2 minutes on 2 cores in a debug build.
    pub fn short() -> Self {
        Self {
            name: "short".into(),
            generations: 3,
            aborts_per_image: 4,
            clients: 4,
            abort_ms: (300, 2000),
            image_mib: 512,
            fault: Fault::Power,
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
        }
    }

    /// `CRASH_PROFILE` (default short) with `CRASH_GENERATIONS`, `CRASH_ABORTS_PER_IMAGE`,
    /// `CRASH_CLIENTS`, `CRASH_IMAGE_MB` and `CRASH_FAULT` (`power`, `kill`) overrides.
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
    /// A copy of the first data dir with a violation was kept.
    kept: bool,
}

impl Run {
    fn stats(&self) -> std::sync::MutexGuard<'_, Stats> {
        self.stats.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Starts a proxy instance in `mode` and waits until it is ready; on failure the violation
    /// names what happened.
    async fn start(&mut self, data: &std::path::Path, mode: Mode, why: &str) -> Option<Proc> {
        self.inst += 1;
        let mut p = Proc::proxy(&self.setup, data, mode);
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

    /// One image generation: probe, then `modes.len() - 1` aborts with a check after each.
    async fn generation(&mut self, g: u32, modes: &[Mode]) {
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
        let data = image.mnt.join("data");
        let mut book: Vec<Sess> = Vec::new();
        let Some(mut proxy) = self.start(&data, modes[0], "first start").await else {
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
        for a in 0..modes.len() - 1 {
            let mode = modes[a];
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
            sleep(Duration::from_millis(wait)).await;
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
            // The power cut: the process stops first (with the power, it dies with the disk),
            // then nothing more reaches the disk, then the process is killed. Stopping it first
            // matters: the shutdown ioctl takes ~100 ms to abort the journal, and an fdatasync
            // in flight meanwhile can return success for data that does not survive (measured:
            // 16 of 60 runs of a bare fdatasync loop; none for syncs that returned before the
            // ioctl; docs/crash.md). A real power loss leaves no process to act on such a sync.
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
                "crash-abort: gen={g} abort={} ({}) {} instance {} after {took} ms, clients received {} events, recovery in {} mode",
                a + 1,
                if a == 0 && !settled { "fresh data dir" } else { "settled data dir" },
                mode.as_str(),
                self.inst,
                self.stats().events_received - received_before,
                modes[a + 1].as_str()
            );
            image
                .power_cycle()
                .unwrap_or_else(|e| panic!("crash harness: remount after the abort failed: {e}"));
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

            // Recovery in the next mode, a clean stop, then the log is read and made the baseline.
            let next = modes[a + 1];
            let full = a + 2 == modes.len() || {
                let (used, size) = image.usage().unwrap_or((0, 1));
                used * 2 > size
            };
            let Some(mut rec) = self.start(&data, next, "restart after the abort").await else {
                done(self);
                break;
            };
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
            let cx = oracle::CheckCtx {
                bin: &self.setup.bin,
                data: &data,
                cycle: self.cycle,
                full,
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
            let Some(p) = self.start(&data, next, "restart after the check").await else {
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
        if !self.kept && !self.stats().clean() {
            self.kept = true;
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
        kept: false,
    };
    let plan = plan_modes(
        &mut Rng::fork(seed, 1),
        profile.generations,
        profile.aborts_per_image,
    );
    for (g, modes) in plan.iter().enumerate() {
        run.generation(g as u32 + 1, modes).await;
    }
    run.upstream.kill9();
    let st = run.stats();
    finish(profile, seed, &st, started.elapsed(), work)
}

fn finish(profile: &Profile, seed: u64, st: &Stats, took: Duration, dir: PathBuf) -> Outcome {
    let mut summary = format!(
        "crash: profile={} aborts={} fsync_aborts={} relaxed_aborts={} generations={} sessions={} events_received={}",
        profile.name,
        st.aborts,
        st.fsync_aborts,
        st.relaxed_aborts,
        st.generations,
        st.sessions,
        st.events_received
    );
    for v in V::ALL {
        summary.push_str(&format!(" {}={}", v.name(), st.count(v)));
        if v == V::LostAcknowledged {
            summary.push_str(&format!(" lost_tails_refused={}", st.lost_tails_refused));
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
        "crash-detail: elapsed={:.0}s transitions={{{transitions}}} fresh_data_dir_aborts={} requests={} events_read_after_abort={} lost_relaxed_events={} relaxed_unanswered={} resumes_served={} refusals={{{}}} complete_histories={} aborted_32091={} orphaned={} self_exits={{{}}} checks={} inspects={} abort_after_ms={}..{} probe={{runs:{},synced_survived:{},frozen:{},write_after_abort_failed:{},unsynced_file_survived:{},unsynced_append_survived:{}}}",
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
