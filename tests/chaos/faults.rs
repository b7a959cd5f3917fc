//! The fault plan and the controller that carries it out: proxy SIGKILLs (alternating the
//! durability mode of the instance that is killed, so every relaxed→fsync and fsync→relaxed
//! restart happens too), upstream SIGKILLs, and proxy SIGTERMs under load — each followed by a
//! restart on the same ports and data dir.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::{sleep, sleep_until, Instant};

use super::oracle::{FaultKind, Shared, Violation};
use super::procs::{self, Mode, Proc, ProxySettings};
use super::rng::Rng;

/// One planned fault: when (from the start), what, and the mode of the proxy instance it hits.
#[derive(Clone, Copy, Debug)]
pub struct Planned {
    /// Offset from the start.
    pub at: Duration,
    /// What.
    pub kind: FaultKind,
    /// Mode of the proxy instance running when it happens.
    pub mode: Mode,
}

/// Spreads the faults over the middle 80% of `duration`, one per slot, in random order. Proxy
/// kills alternate fsync/relaxed; SIGTERMs alternate relaxed/fsync.
pub fn plan(
    rng: &mut Rng,
    duration: Duration,
    proxy_kills: u32,
    upstream_kills: u32,
    sigterms: u32,
) -> Vec<Planned> {
    let mut kinds = Vec::new();
    for (kind, n) in [
        (FaultKind::ProxyKill, proxy_kills),
        (FaultKind::UpstreamKill, upstream_kills),
        (FaultKind::Sigterm, sigterms),
    ] {
        for _ in 0..n {
            kinds.push(kind);
        }
    }
    for i in (1..kinds.len()).rev() {
        let j = rng.range(0, i as u64) as usize;
        kinds.swap(i, j);
    }
    let n = kinds.len().max(1) as f64;
    let (start, span) = (duration.as_secs_f64() * 0.08, duration.as_secs_f64() * 0.8);
    let (mut kills, mut terms) = (0u32, 0u32);
    let mut out: Vec<Planned> = Vec::new();
    for (i, kind) in kinds.into_iter().enumerate() {
        let slot = (i as f64 + 0.15 + 0.7 * rng.unit()) / n;
        let mode = match kind {
            FaultKind::ProxyKill => {
                kills += 1;
                if kills % 2 == 1 {
                    Mode::Fsync
                } else {
                    Mode::Relaxed
                }
            }
            FaultKind::Sigterm => {
                terms += 1;
                if terms % 2 == 1 {
                    Mode::Relaxed
                } else {
                    Mode::Fsync
                }
            }
            FaultKind::UpstreamKill => Mode::Fsync,
        };
        out.push(Planned {
            at: Duration::from_secs_f64(start + span * slot),
            kind,
            mode,
        });
    }
    // The instance an upstream kill meets is whatever the next proxy fault will hit.
    let mut next = Mode::Fsync;
    for p in out.iter_mut().rev() {
        match p.kind {
            FaultKind::UpstreamKill => p.mode = next,
            _ => next = p.mode,
        }
    }
    out
}

/// The processes and how to restart them.
pub struct Procs {
    /// The binary.
    pub bin: PathBuf,
    /// Proxy settings.
    pub settings: ProxySettings,
    /// The proxy.
    pub proxy: Proc,
    /// Mode of the running proxy.
    pub mode: Mode,
    /// The upstream.
    pub upstream: Proc,
    /// stderr of the proxy instances.
    pub proxy_log: PathBuf,
    /// stderr of the upstream instances.
    pub upstream_log: PathBuf,
}

impl Procs {
    /// Starts the upstream, then the proxy in `mode`; false when either does not come up.
    pub async fn start(&mut self, mode: Mode) -> bool {
        self.upstream = Proc::upstream(&self.bin, self.settings.upstream, &self.upstream_log);
        if !procs::wait_port(self.settings.upstream, Duration::from_secs(30)).await {
            return false;
        }
        self.start_proxy(mode).await
    }

    /// (Re)starts the proxy in `mode` and waits until it is ready.
    pub async fn start_proxy(&mut self, mode: Mode) -> bool {
        self.spawn_proxy(mode);
        procs::wait_ready(self.settings.admin, Duration::from_secs(60)).await
    }

    /// (Re)starts the proxy in `mode` without waiting.
    pub fn spawn_proxy(&mut self, mode: Mode) {
        self.proxy = Proc::proxy(&self.bin, &self.settings, mode, &self.proxy_log);
        self.mode = mode;
    }
}

/// Carries out `plan`; watches for a proxy or upstream that exits on its own meanwhile.
/// Returns false when a restart failed (the run cannot go on).
pub async fn controller(
    sh: Arc<Shared>,
    p: &mut Procs,
    plan: &[Planned],
    mut rng: Rng,
    grace: Duration,
) -> bool {
    for (i, f) in plan.iter().enumerate() {
        let due = sh.t0 + f.at;
        while Instant::now() < due {
            if !watch(&sh, p).await {
                return false;
            }
            sleep_until(due.min(Instant::now() + Duration::from_millis(200))).await;
        }
        // The mode the next proxy instance runs in: that of the next proxy fault.
        let next_mode = plan[i + 1..]
            .iter()
            .find(|q| q.kind != FaultKind::UpstreamKill)
            .map_or(Mode::Fsync, |q| q.mode);
        match f.kind {
            FaultKind::ProxyKill => {
                let idx = sh.fault_begin(f.kind, p.mode);
                p.proxy.kill9();
                sh.fault_dead(idx);
                {
                    let mut st = sh.stats();
                    st.proxy_kills += 1;
                    st.proxy_kills_relaxed += (p.mode == Mode::Relaxed) as u64;
                }
                sleep(rng.ms(0, 1000)).await;
                let mut second = None;
                if rng.chance(0.35) {
                    // Kill the replacement too, while it starts (recovery ends the sessions the
                    // first kill left live: aborts, end markers, epoch seal).
                    p.spawn_proxy(next_mode);
                    sleep(rng.ms(0, 400)).await;
                    let j = sh.fault_begin(f.kind, next_mode);
                    p.proxy.kill9();
                    sh.fault_dead(j);
                    let mut st = sh.stats();
                    st.proxy_kills += 1;
                    st.double_kills += 1;
                    st.proxy_kills_relaxed += (next_mode == Mode::Relaxed) as u64;
                    second = Some(j);
                }
                if !p.start_proxy(next_mode).await {
                    return fail(&sh, p, "proxy did not become ready after SIGKILL restart");
                }
                sh.fault_ready(idx);
                if let Some(j) = second {
                    sh.fault_ready(j);
                }
            }
            FaultKind::UpstreamKill => {
                let idx = sh.fault_begin(f.kind, p.mode);
                p.upstream.kill9();
                sh.fault_dead(idx);
                sh.stats().upstream_kills += 1;
                sleep(rng.ms(300, 2000)).await;
                p.upstream = Proc::upstream(&p.bin, p.settings.upstream, &p.upstream_log);
                if !procs::wait_port(p.settings.upstream, Duration::from_secs(30)).await {
                    return fail(&sh, p, "upstream did not come back");
                }
                sh.fault_ready(idx);
            }
            FaultKind::Sigterm => {
                let idx = sh.fault_begin(f.kind, p.mode);
                let t = Instant::now();
                let status = p.proxy.sigterm(grace + Duration::from_secs(10)).await;
                sh.fault_dead(idx);
                sh.stats().sigterms += 1;
                match status {
                    Some(s) if s.success() => {}
                    Some(s) => sh.violation(
                        Violation::Protocol,
                        format!("proxy exited with {s} after SIGTERM"),
                    ),
                    None => sh.violation(
                        Violation::Protocol,
                        format!(
                            "proxy did not exit within {:.1}s of SIGTERM (grace {}s)",
                            t.elapsed().as_secs_f64(),
                            grace.as_secs()
                        ),
                    ),
                }
                sleep(rng.ms(0, 500)).await;
                if !p.start_proxy(next_mode).await {
                    return fail(&sh, p, "proxy did not become ready after SIGTERM restart");
                }
                sh.fault_ready(idx);
            }
        }
    }
    true
}

fn fail(sh: &Shared, p: &Procs, what: &str) -> bool {
    sh.violation(
        Violation::Protocol,
        format!(
            "{what}; proxy stderr tail:\n{}",
            procs::tail(&p.proxy_log, 30)
        ),
    );
    false
}

/// Restarts a process that exited by itself (a crash is a finding, not a planned fault).
pub async fn watch(sh: &Shared, p: &mut Procs) -> bool {
    if let Some(st) = p.proxy.exited() {
        sh.violation(
            Violation::Protocol,
            format!(
                "proxy exited on its own ({st}); stderr tail:\n{}",
                procs::tail(&p.proxy_log, 30)
            ),
        );
        // Recorded as a fault too, so that what it ends is not reported a second time.
        let mode = p.mode;
        let idx = sh.fault_begin(FaultKind::ProxyKill, mode);
        sh.fault_dead(idx);
        if !p.start_proxy(mode).await {
            return false;
        }
        sh.fault_ready(idx);
    }
    if let Some(st) = p.upstream.exited() {
        sh.violation(
            Violation::Protocol,
            format!("upstream exited on its own ({st})"),
        );
        let idx = sh.fault_begin(FaultKind::UpstreamKill, p.mode);
        sh.fault_dead(idx);
        p.upstream = Proc::upstream(&p.bin, p.settings.upstream, &p.upstream_log);
        if !procs::wait_port(p.settings.upstream, Duration::from_secs(30)).await {
            return false;
        }
        sh.fault_ready(idx);
    }
    true
}
