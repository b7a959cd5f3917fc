//! The chaos harness (issue 4, part 1): many legacy MCP sessions through the proxy *binary* in
//! front of the demo upstream *process*, with faults injected at random (seeded) points while
//! events flow, and an oracle that checks every client. 2026-07-28 clients run beside them, their
//! long calls made durable tasks polled across the same faults (issue 11, [`modern`]). See
//! `docs/chaos.md`.

pub mod client;
pub mod faults;
pub mod modern;
pub mod oracle;
pub mod procs;
pub mod rng;
pub mod wire;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use oracle::{Shared, Violation, HUNG_BOUND};
use procs::{Mode, Proc, ProxySettings};
use rng::Rng;

/// `sessions.idle_ttl_secs` of the proxy under test: short, so that some long client pauses
/// outlast it and the janitor's end of a session (aborting what was in flight) is exercised too.
pub const IDLE_TTL_SECS: u64 = 5;

/// How much chaos.
#[derive(Clone, Debug)]
pub struct Profile {
    /// Name.
    pub name: String,
    /// Concurrent client workers (each runs one session at a time).
    pub workers: u64,
    /// Concurrent 2026-07-28 client workers (each with its own identity, holding a few tasks).
    pub modern_workers: u64,
    /// Length of the fault phase.
    pub duration: Duration,
    /// Proxy SIGKILLs (half of them hit a relaxed-mode instance).
    pub proxy_kills: u32,
    /// Upstream SIGKILLs.
    pub upstream_kills: u32,
    /// Proxy SIGTERMs under load.
    pub sigterms: u32,
    /// `log.max_events_per_session` (small, so trimming bites).
    pub max_events: u64,
}

impl Profile {
    /// CI: under 3 minutes on 2 cores (debug build).
    pub fn short() -> Self {
        Self {
            name: "short".into(),
            workers: 4,
            modern_workers: 2,
            duration: Duration::from_secs(70),
            proxy_kills: 4,
            upstream_kills: 1,
            sigterms: 1,
            max_events: 300,
        }
    }

    /// In between (about 4 minutes).
    pub fn medium() -> Self {
        Self {
            name: "medium".into(),
            workers: 8,
            modern_workers: 3,
            duration: Duration::from_secs(240),
            proxy_kills: 10,
            upstream_kills: 5,
            sigterms: 2,
            max_events: 300,
        }
    }

    /// The long profile: ≥ 200 sessions, ≥ 2,000 client cuts, ≥ 10 proxy kills, ≥ 5
    /// upstream kills (about 10 minutes).
    pub fn long() -> Self {
        Self {
            name: "long".into(),
            workers: 12,
            modern_workers: 4,
            duration: Duration::from_secs(540),
            proxy_kills: 12,
            upstream_kills: 6,
            sigterms: 3,
            max_events: 300,
        }
    }

    /// By name (`short`, `medium`, `long`).
    pub fn named(name: &str) -> Option<Self> {
        match name {
            "short" => Some(Self::short()),
            "medium" => Some(Self::medium()),
            "long" => Some(Self::long()),
            _ => None,
        }
    }

    /// `CHAOS_PROFILE` (default short), with `CHAOS_SECS` / `CHAOS_WORKERS` /
    /// `CHAOS_MODERN_WORKERS` overrides.
    pub fn from_env() -> Self {
        let name = std::env::var("CHAOS_PROFILE").unwrap_or_else(|_| "short".into());
        let mut p = Self::named(&name)
            .unwrap_or_else(|| panic!("CHAOS_PROFILE={name}: expected short, medium or long"));
        if let Some(s) = std::env::var("CHAOS_SECS")
            .ok()
            .and_then(|v| v.parse().ok())
        {
            p.duration = Duration::from_secs(s);
        }
        if let Some(w) = std::env::var("CHAOS_WORKERS")
            .ok()
            .and_then(|v| v.parse().ok())
        {
            p.workers = w;
        }
        if let Some(w) = std::env::var("CHAOS_MODERN_WORKERS")
            .ok()
            .and_then(|v| v.parse().ok())
        {
            p.modern_workers = w;
        }
        p
    }
}

/// `CHAOS_SEED`, or a fresh one.
pub fn seed_from_env() -> u64 {
    std::env::var("CHAOS_SEED")
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
    /// The one summary line.
    pub summary: String,
    /// More counters, one line.
    pub detail: String,
    /// The first violations, in detail.
    pub violations: Vec<String>,
    /// No violation of any kind.
    pub ok: bool,
    /// Where the data dir and process logs are (kept when not ok).
    pub dir: PathBuf,
}

/// Ports for the run: proxy client, proxy admin, upstream.
pub struct Ports {
    /// Proxy client port.
    pub proxy: u16,
    /// Proxy admin port.
    pub admin: u16,
    /// Upstream port.
    pub upstream: u16,
}

/// Runs `profile` with `seed` against the proxy binary `bin`.
pub fn run(profile: &Profile, seed: u64, bin: PathBuf, ports: Ports) -> Outcome {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(run_async(profile, seed, bin, ports))
}

async fn run_async(profile: &Profile, seed: u64, bin: PathBuf, ports: Ports) -> Outcome {
    let dir = std::env::temp_dir().join(format!("mcp-resume-chaos-{}-{seed}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("work dir");
    let grace = Duration::from_secs(5);
    let settings = ProxySettings {
        port: ports.proxy,
        admin: ports.admin,
        upstream: ports.upstream,
        dir: dir.join("data"),
        max_events: profile.max_events,
        idle_ttl_secs: IDLE_TTL_SECS,
        grace_secs: grace.as_secs(),
        task_ttl_secs: modern::TASK_TTL_SECS,
    };
    let mut rng = Rng::fork(seed, 1);
    let plan = faults::plan(
        &mut rng,
        profile.duration,
        profile.proxy_kills,
        profile.upstream_kills,
        profile.sigterms,
    );
    let first_mode = plan
        .iter()
        .find(|p| p.kind != oracle::FaultKind::UpstreamKill)
        .map_or(Mode::Fsync, |p| p.mode);
    let mut procs = faults::Procs {
        bin,
        settings,
        proxy: Proc::none(),
        mode: first_mode,
        upstream: Proc::none(),
        proxy_log: dir.join("proxy.stderr.log"),
        upstream_log: dir.join("upstream.stderr.log"),
    };
    let addr: SocketAddr = ([127, 0, 0, 1], ports.proxy).into();
    let sh = Arc::new(Shared::new(
        seed,
        addr,
        profile.max_events,
        Duration::from_secs(IDLE_TTL_SECS),
        Duration::from_secs(modern::TASK_TTL_SECS),
    ));
    if !procs.start(first_mode).await {
        sh.violation(
            Violation::Protocol,
            format!(
                "the proxy or the upstream did not start; proxy stderr:\n{}",
                procs::tail(&procs.proxy_log, 30)
            ),
        );
        return finish(profile, &sh, dir);
    }

    let end = sh.t0 + profile.duration;
    let workers: Vec<_> = (0..profile.workers)
        .map(|w| tokio::spawn(client::worker(sh.clone(), w)))
        .chain(
            (0..profile.modern_workers).map(|w| tokio::spawn(modern::worker(sh.clone(), w, end))),
        )
        .collect();
    let ok = faults::controller(sh.clone(), &mut procs, &plan, Rng::fork(seed, 2), grace).await;
    if ok {
        while Instant::now() < end {
            if !faults::watch(&sh, &mut procs).await {
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    // Wind down: no new sessions or requests; what is in flight must still be answered.
    let hard = Instant::now() + HUNG_BOUND + Duration::from_secs(10);
    sh.begin_stop(hard);
    for w in workers {
        let left = hard.saturating_duration_since(Instant::now()) + Duration::from_secs(30);
        if tokio::time::timeout(left, w).await.is_err() {
            sh.violation(
                Violation::Hung,
                "a client worker did not finish within the wind-down bound".into(),
            );
        }
    }
    match procs.proxy.sigterm(grace + Duration::from_secs(10)).await {
        Some(s) if s.success() => {}
        other => sh.violation(
            Violation::Protocol,
            format!("final SIGTERM: proxy exit {other:?}"),
        ),
    }
    procs.upstream.kill9();
    finish(profile, &sh, dir)
}

fn finish(profile: &Profile, sh: &Shared, dir: PathBuf) -> Outcome {
    check_exercised(profile, sh);
    let st = sh.stats();
    let refusals: Vec<String> = st
        .refusals
        .iter()
        .map(|(k, v)| format!("{k}:{v}"))
        .collect();
    let summary = format!(
        "chaos: sessions={} events={} disconnects={} proxy_kills={} upstream_kills={} sigterms={} resumes_served={} refusals={{{}}} silent_gaps={} duplicates={} hung_requests={} wrong_refusals={} protocol_errors={} tasks={} tasks_completed={} tasks_failed_32091={} tasks_cancelled={} tasks_expired={} tasks_across_restart={} tasks_lost={} tasks_stuck={} foreign_visible={} tasks_wrong={} seed={}",
        st.sessions,
        st.events,
        st.disconnects,
        st.proxy_kills,
        st.upstream_kills,
        st.sigterms,
        st.resumes_served,
        refusals.join(","),
        st.count(Violation::SilentGap),
        st.count(Violation::Duplicate),
        st.count(Violation::Hung),
        st.count(Violation::WrongRefusal),
        st.count(Violation::Protocol),
        st.tasks,
        st.tasks_completed,
        st.tasks_failed_32091,
        st.tasks_cancelled,
        st.tasks_expired,
        st.tasks_across_restart,
        st.count(Violation::TaskLost),
        st.count(Violation::TaskStuck),
        st.count(Violation::TaskForeignVisible),
        st.count(Violation::TaskWrong),
        sh.seed,
    );
    let faults: Vec<String> = sh
        .fault_log()
        .iter()
        .map(|f| format!("{:?}({})@{:.1}s", f.kind, f.mode.as_str(), sh.at(f.begin)))
        .collect();
    let detail = format!(
        "chaos-detail: profile={} elapsed={:.0}s emit_events={} mid_event_cuts={} replay_cuts={} stale_resumes={} takeovers={} long_pauses={} server_ends={} redelivered={} keepalives={} requests={} answered={} aborted_32091={} post_404={} post_errors={} post_unknown={} unanswered_after_relaxed_crash={} unanswered_at_refusal={} complete_ends={} forks={} idle_ends={} rotated={} orphaned={} open_failed={} proxy_kills_relaxed={} double_kills={} modern_calls={} modern_streams={} modern_immediate={} modern_call_cuts={} modern_call_failed={} modern_aborted={} modern_unavailable={} task_polls={} task_poll_cuts={} task_poll_failed={} task_cancels={} tasks_rechecked={} tasks_failed_by_restart={} tasks_unresolved={} foreign_polls={} unexercised={} faults=[{}]",
        profile.name,
        sh.at(Instant::now()),
        st.emit_events,
        st.mid_event_cuts,
        st.replay_cuts,
        st.stale_resumes,
        st.takeovers,
        st.long_pauses,
        st.server_ends,
        st.redelivered,
        st.keepalives,
        st.requests,
        st.answered,
        st.aborted,
        st.post_gone,
        st.post_errors,
        st.post_unknown,
        st.relaxed_unanswered,
        st.refused_unanswered,
        st.complete_ends,
        st.forks,
        st.idle_ends,
        st.rotated,
        st.orphaned,
        st.open_failed,
        st.proxy_kills_relaxed,
        st.double_kills,
        st.modern_calls,
        st.modern_streams,
        st.modern_immediate,
        st.modern_call_cuts,
        st.modern_call_failed,
        st.modern_aborted,
        st.modern_unavailable,
        st.task_polls,
        st.task_poll_cuts,
        st.task_poll_failed,
        st.task_cancels,
        st.tasks_rechecked,
        st.tasks_failed_by_restart,
        st.tasks_unresolved,
        st.foreign_polls,
        st.count(Violation::Unexercised),
        faults.join(" "),
    );
    let ok = st.violations.values().all(|&n| n == 0);
    if ok && std::env::var_os("CHAOS_KEEP").is_none() {
        let _ = std::fs::remove_dir_all(&dir);
    }
    Outcome {
        summary,
        detail,
        violations: st.details.clone(),
        ok,
        dir,
    }
}

/// A run whose 2026-07-28 workload did essentially nothing proves nothing about tasks: it fails.
fn check_exercised(profile: &Profile, sh: &Shared) {
    if profile.modern_workers == 0 {
        return;
    }
    let why = {
        let st = sh.stats();
        let restarts = st.proxy_kills + st.sigterms;
        let mut why = Vec::new();
        if st.tasks < 5 {
            why.push(format!("only {} tasks were created", st.tasks));
        }
        if st.tasks_completed == 0 {
            why.push("no task completed".to_string());
        }
        if restarts > 0 && st.tasks_across_restart == 0 {
            why.push(format!(
                "{restarts} proxy restarts, but no task was read from a proxy process other than the one that created it"
            ));
        }
        if st.foreign_polls == 0 {
            why.push("no task was asked for with another identity".to_string());
        }
        why
    };
    for w in why {
        sh.violation(
            Violation::Unexercised,
            format!("the 2026-07-28 workload was not exercised: {w}"),
        );
    }
}
