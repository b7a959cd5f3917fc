//! The chaos harness with replicas (issue 17 point 10): one `redis-server` (AOF `always`), three
//! proxy binaries ("pods"), each beside its own demo upstream process, all with
//! `log.backend = "redis"`, forwarding on (`cluster.listen`, one shared `cluster.secret_file`),
//! one shared `auth.key_file` and `cluster.lease_ms = 2000`.
//!
//! Legacy HTTP+SSE clients open sessions on a random pod, POST through a random pod (a non-owner
//! forwards to the owner), cut their streams at random seeded points and resume their newest
//! event id on a random pod. Faults: SIGKILL of a pod (restarted after a moment under the same
//! `replica_id`, or left dead for a while), SIGSTOP of a pod past its lease then SIGCONT (it must
//! stop, exit 74, and is restarted), SIGKILL of Redis and its restart on the same AOF.
//!
//! The oracle, per client session, across all its connections and pods: the proxy's ids are
//! contiguous (seq + 1 each, the epoch never goes back), the upstream's `emit` numbers are exactly
//! 1, 2, 3, … and an `emit` answer comes after all its events; no answer twice; every accepted
//! request is answered (its result, or -32091 after a takeover) before the session's resume is
//! refused 404; a resume from the newest cursor is never refused 409. After the run every
//! session's record is read back from Redis through [`mcp_resume_proxy::log::redis::Shared`]:
//! seqs contiguous, each event in the epoch the record says, nothing after an end marker, nothing
//! but -32091 answers and the end in an epoch a takeover opened (a stale owner's write would show
//! there), and every event a client received has the logged bytes; a client refused 404 had
//! received everything deliverable. See `docs/chaos.md`.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::hash::{Hash, Hasher};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use mcp_resume_proxy::log::cursor::SessionId;
use mcp_resume_proxy::log::redis::Shared as RedisLog;
use mcp_resume_proxy::log::Kind;
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio::time::{sleep, Instant};

use super::rng::Rng;
use super::support::redis::{Persist, RedisServer};
use super::wire::{self, Next, Opened, Posted, SseConn, SseEvent};

/// `cluster.lease_ms` of every pod.
pub const LEASE_MS: u64 = 2000;
/// `log.redis.key_prefix` (the default).
const PREFIX: &str = "mcp-resume";
/// An accepted request may stay unanswered this long after it should have finished and after
/// the last fault recovered.
const HUNG_BOUND: Duration = Duration::from_secs(30);
const HEAD_TIMEOUT: Duration = Duration::from_secs(5);
const POST_WAIT: Duration = Duration::from_secs(15);
const PODS: usize = 3;
const NAMES: [&str; PODS] = ["pod-a", "pod-b", "pod-c"];

/// How much chaos.
#[derive(Clone, Debug)]
pub struct Profile {
    /// Name.
    pub name: String,
    /// Concurrent client workers (one legacy session at a time each).
    pub workers: u64,
    /// Length of the fault phase.
    pub duration: Duration,
    /// Pod SIGKILLs.
    pub pod_kills: u32,
    /// Pod SIGSTOP/SIGCONT past the lease.
    pub pod_pauses: u32,
    /// Redis SIGKILLs (each restarted on its AOF).
    pub redis_kills: u32,
}

impl Profile {
    /// CI: under 2 minutes on 2 cores (debug build).
    pub fn short() -> Self {
        Self {
            name: "short".into(),
            workers: 4,
            duration: Duration::from_secs(60),
            pod_kills: 3,
            pod_pauses: 1,
            redis_kills: 2,
        }
    }

    /// About 10 minutes.
    pub fn long() -> Self {
        Self {
            name: "long".into(),
            workers: 10,
            duration: Duration::from_secs(540),
            pod_kills: 16,
            pod_pauses: 6,
            redis_kills: 8,
        }
    }

    /// `CHAOS_PROFILE` (`short`, default, or `long`), with `CHAOS_SECS`, `CHAOS_WORKERS`,
    /// `CHAOS_POD_KILLS`, `CHAOS_POD_PAUSES` and `CHAOS_REDIS_KILLS` overrides.
    pub fn from_env() -> Self {
        let name = std::env::var("CHAOS_PROFILE").unwrap_or_else(|_| "short".into());
        let mut p = match name.as_str() {
            "short" => Self::short(),
            "long" => Self::long(),
            _ => panic!("CHAOS_PROFILE={name}: expected short or long"),
        };
        if let Some(s) = env_u64("CHAOS_SECS") {
            p.duration = Duration::from_secs(s);
        }
        if let Some(w) = env_u64("CHAOS_WORKERS") {
            p.workers = w;
        }
        if let Some(n) = env_u64("CHAOS_POD_KILLS") {
            p.pod_kills = n as u32;
        }
        if let Some(n) = env_u64("CHAOS_POD_PAUSES") {
            p.pod_pauses = n as u32;
        }
        if let Some(n) = env_u64("CHAOS_REDIS_KILLS") {
            p.redis_kills = n as u32;
        }
        p
    }
}

fn env_u64(k: &str) -> Option<u64> {
    std::env::var(k).ok().and_then(|v| v.parse().ok())
}

/// `CHAOS_SEED`, or a fresh one.
pub fn seed_from_env() -> u64 {
    env_u64("CHAOS_SEED").unwrap_or_else(|| {
        let mut b = [0u8; 8];
        getrandom::getrandom(&mut b).expect("OS random source");
        u64::from_le_bytes(b) % 1_000_000_000_000
    })
}

/// Kinds of violations.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Violation {
    /// An event missing between two received ones, or received bytes that are not the log's.
    SilentGap,
    /// An event or an answer received twice, or out of order.
    Duplicate,
    /// An accepted request never answered.
    Hung,
    /// A refusal (409, or a 404 while the log has more for the cursor) no real gap explains.
    WrongRefusal,
    /// After the run: a write in the log that only a stale owner could have made.
    StaleOwnerWrite,
    /// Anything else the contract forbids.
    Protocol,
}

/// Counters of a run.
#[derive(Default, Debug)]
pub struct Stats {
    pub sessions: u64,
    pub events: u64,
    pub emit_events: u64,
    pub cuts: u64,
    pub mid_event_cuts: u64,
    pub resumes: u64,
    pub resumes_on_other_pod: u64,
    pub server_ends: u64,
    pub pod_kills: u64,
    pub pods_left_dead: u64,
    pub pod_pauses: u64,
    pub redis_kills: u64,
    pub self_stops: u64,
    pub kept_running_after_pause: u64,
    pub forwards: u64,
    pub requests: u64,
    pub answered: u64,
    pub aborted_32091: u64,
    pub post_404: u64,
    pub post_other: u64,
    pub post_unknown: u64,
    pub post_not_sent: u64,
    pub resume_5xx: u64,
    pub gone_404: u64,
    pub rotated: u64,
    pub orphaned: u64,
    pub open_failed: u64,
    pub records: u64,
    pub records_unended: u64,
    pub takeovers: u64,
    pub logged_events: u64,
    pub refusals: BTreeMap<String, u64>,
    pub violations: BTreeMap<Violation, u64>,
    pub details: Vec<String>,
}

impl Stats {
    fn count(&self, v: Violation) -> u64 {
        self.violations.get(&v).copied().unwrap_or(0)
    }
}

/// What one client session received, for the check against Redis after the run.
struct Delivered {
    sid: String,
    /// `(seq, epoch, hash of the data)` of every event received.
    events: Vec<(u64, u32, u64)>,
    /// Its newest cursor was refused 404: it must have received everything deliverable.
    gone_404: bool,
}

/// State shared by the clients and the fault controller.
pub struct Shared {
    seed: u64,
    t0: Instant,
    pods: Vec<SocketAddr>,
    stop: AtomicBool,
    hard: Mutex<Option<Instant>>,
    stats: Mutex<Stats>,
    recovered: Mutex<Instant>,
    delivered: Mutex<Vec<Delivered>>,
}

impl Shared {
    fn stats(&self) -> MutexGuard<'_, Stats> {
        self.stats.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn at(&self, t: Instant) -> f64 {
        t.saturating_duration_since(self.t0).as_secs_f64()
    }

    fn violation(&self, kind: Violation, msg: String) {
        let mut st = self.stats();
        let n = {
            let c = st.violations.entry(kind).or_default();
            *c += 1;
            *c
        };
        // The first 12 of each kind, so that one kind cannot hide another.
        if n <= 12 {
            let at = self.at(Instant::now());
            st.details.push(format!("[{kind:?} t={at:.1}s] {msg}"));
        }
    }

    fn stopping(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    fn hard_deadline(&self) -> Option<Instant> {
        *self.hard.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn recovered(&self) -> Instant {
        *self.recovered.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A fault began or recovered now: hung-request bounds count from here.
    fn mark_fault(&self) {
        *self.recovered.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
    }
}

fn hash(b: &[u8]) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    b.hash(&mut h);
    h.finish()
}

// ---------------------------------------------------------------------------------------------
// Processes

/// One pod: the proxy binary on fixed ports beside its demo upstream.
struct Pod {
    name: &'static str,
    port: u16,
    admin: u16,
    internal: u16,
    upstream: u16,
    dir: PathBuf,
    proxy: Option<Child>,
    up: Option<Child>,
    state: PodState,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum PodState {
    Running,
    /// Killed (or stopped on its own); restarted at this time.
    Down(Instant),
    /// SIGSTOPped; SIGCONT at this time.
    Paused(Instant),
    /// SIGCONTed after a pause past its lease: it must stop (exit 74) by this time.
    Waking(Instant),
}

fn log_to(path: &Path) -> Stdio {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map(Stdio::from)
        .unwrap_or_else(|_| Stdio::null())
}

fn key_file(dir: &Path, name: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let mut b = [0u8; 32];
    getrandom::getrandom(&mut b).expect("OS random source");
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    let p = dir.join(name);
    std::fs::write(&p, format!("{hex}\n")).expect("key file");
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).expect("key mode");
    p
}

fn signal(child: &Child, sig: &str) {
    let _ = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(child.id().to_string())
        .status();
}

struct Cluster {
    bin: PathBuf,
    dir: PathBuf,
    redis_url: String,
    ident: PathBuf,
    secret: PathBuf,
    pods: Vec<Pod>,
}

impl Cluster {
    fn config(&self, p: &Pod) -> PathBuf {
        let cfg = p.dir.with_extension("toml");
        let text = format!(
            "[listen]\naddr = \"127.0.0.1:{}\"\n\
             [admin]\naddr = \"127.0.0.1:{}\"\n\
             [upstream]\nsse_url = \"http://127.0.0.1:{}/sse\"\npost_timeout_secs = 10\nconnect_timeout_secs = 5\n\
             [log]\ndir = \"{}\"\nbackend = \"redis\"\ndurability = \"fsync\"\nmax_events_per_session = 1000000\n\
             [log.redis]\nurl = \"{}\"\n\
             [cluster]\nreplica_id = \"{}\"\nlease_ms = {LEASE_MS}\nlisten = \"127.0.0.1:{}\"\nsecret_file = \"{}\"\n\
             [auth]\nkey_file = \"{}\"\n\
             [sessions]\nidle_ttl_secs = 30\nretain_ended_secs = 7200\nkeepalive_secs = 1\n\
             [shutdown]\ngrace_secs = 3\n",
            p.port,
            p.admin,
            p.upstream,
            p.dir.display(),
            self.redis_url,
            p.name,
            p.internal,
            self.secret.display(),
            self.ident.display(),
        );
        std::fs::write(&cfg, text).expect("pod config");
        cfg
    }

    fn spawn_upstream(&mut self, i: usize) {
        let p = &self.pods[i];
        let child = Command::new(&self.bin)
            .args([
                "demo-upstream",
                "--at",
                &format!("127.0.0.1:{}", p.upstream),
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log_to(&self.dir.join(format!("{}.upstream.log", p.name))))
            .env("MCP_RESUME_PROXY_LOG", "warn")
            .spawn()
            .expect("start demo upstream");
        self.pods[i].up = Some(child);
    }

    /// Starts pod `i`'s proxy and waits until it is ready; false (and the process killed) when
    /// it is not ready within 20 s.
    async fn start_proxy(&mut self, i: usize) -> bool {
        let cfg = self.config(&self.pods[i]);
        let p = &self.pods[i];
        let child = Command::new(&self.bin)
            .args(["run", "--config"])
            .arg(&cfg)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log_to(&self.dir.join(format!("{}.proxy.log", p.name))))
            .env("MCP_RESUME_PROXY_LOG", "warn")
            .spawn()
            .expect("start proxy");
        let admin: SocketAddr = ([127, 0, 0, 1], p.admin).into();
        self.pods[i].proxy = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if wire::get_status(admin, "/readyz").await == 200 {
                self.pods[i].state = PodState::Running;
                return true;
            }
            if let Some(c) = self.pods[i].proxy.as_mut() {
                if let Ok(Some(_)) = c.try_wait() {
                    break;
                }
            }
            sleep(Duration::from_millis(50)).await;
        }
        self.kill(i);
        false
    }

    fn kill(&mut self, i: usize) {
        if let Some(mut c) = self.pods[i].proxy.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    fn running(&self) -> Vec<usize> {
        (0..PODS)
            .filter(|&i| self.pods[i].state == PodState::Running)
            .collect()
    }

    /// Restarts what is due, wakes what is paused, and notices pods that stopped on their own.
    async fn tend(&mut self, sh: &Shared) {
        let now = Instant::now();
        for i in 0..PODS {
            match self.pods[i].state {
                PodState::Down(at) if now >= at => {
                    if self.start_proxy(i).await {
                        sh.mark_fault();
                    } else {
                        self.pods[i].state =
                            PodState::Down(Instant::now() + Duration::from_secs(1));
                    }
                }
                PodState::Paused(at) if now >= at => {
                    if let Some(c) = self.pods[i].proxy.as_ref() {
                        signal(c, "CONT");
                    }
                    sh.mark_fault();
                    self.pods[i].state = PodState::Waking(now + Duration::from_secs(30));
                }
                PodState::Waking(by) => {
                    let st = self.pods[i].proxy.as_mut().and_then(|c| c.try_wait().ok()?);
                    match st {
                        Some(st) => {
                            if st.code() != Some(74) {
                                sh.violation(
                                    Violation::Protocol,
                                    format!(
                                        "{} woke after a pause past its lease and exited {st:?}, not 74",
                                        self.pods[i].name
                                    ),
                                );
                            }
                            self.pods[i].proxy = None;
                            self.pods[i].state = PodState::Down(now + Duration::from_millis(200));
                        }
                        None if now >= by => {
                            // Still running 30 s after waking: its writes (if any) are checked
                            // against Redis after the run; it is simply let be from here.
                            sh.stats().kept_running_after_pause += 1;
                            self.pods[i].state = PodState::Running;
                        }
                        None => {}
                    }
                }
                PodState::Running => {
                    let st = self.pods[i].proxy.as_mut().and_then(|c| c.try_wait().ok()?);
                    if let Some(st) = st {
                        self.exited_on_its_own(sh, i, st);
                    }
                }
                _ => {}
            }
        }
    }

    fn exited_on_its_own(&mut self, sh: &Shared, i: usize, st: ExitStatus) {
        self.pods[i].proxy = None;
        if st.code() == Some(74) {
            // Its lease lapsed (Redis away, or its writer starved past lease_ms): it stops by
            // design; a new incarnation starts.
            sh.stats().self_stops += 1;
        } else {
            sh.violation(
                Violation::Protocol,
                format!(
                    "{} exited on its own: {st:?}; its log:\n{}",
                    self.pods[i].name,
                    tail(
                        &self.dir.join(format!("{}.proxy.log", self.pods[i].name)),
                        15
                    )
                ),
            );
        }
        sh.mark_fault();
        self.pods[i].state = PodState::Down(Instant::now() + Duration::from_millis(300));
    }
}

fn tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

// ---------------------------------------------------------------------------------------------
// Faults

#[derive(Clone, Copy, Debug, PartialEq)]
enum FaultKind {
    PodKill,
    PodPause,
    RedisKill,
}

fn plan(rng: &mut Rng, p: &Profile) -> Vec<(Duration, FaultKind)> {
    let mut kinds = Vec::new();
    kinds.extend((0..p.pod_kills).map(|_| FaultKind::PodKill));
    kinds.extend((0..p.pod_pauses).map(|_| FaultKind::PodPause));
    kinds.extend((0..p.redis_kills).map(|_| FaultKind::RedisKill));
    for i in (1..kinds.len()).rev() {
        let j = rng.range(0, i as u64) as usize;
        kinds.swap(i, j);
    }
    // One per slot over the middle 80% of the run.
    let n = kinds.len().max(1) as f64;
    let span = p.duration.as_secs_f64() * 0.8;
    let slot = span / n;
    kinds
        .into_iter()
        .enumerate()
        .map(|(i, k)| {
            let at = p.duration.as_secs_f64() * 0.1 + slot * (i as f64 + 0.2 + 0.6 * rng.unit());
            (Duration::from_secs_f64(at), k)
        })
        .collect()
}

async fn controller(
    sh: &Shared,
    cl: &mut Cluster,
    redis: &mut RedisServer,
    plan: &[(Duration, FaultKind)],
    mut rng: Rng,
    end: Instant,
    log: &mut Vec<String>,
) {
    let mut faults = plan.iter();
    let mut next = faults.next();
    while Instant::now() < end {
        cl.tend(sh).await;
        let Some(&(at, kind)) = next else {
            sleep(Duration::from_millis(200)).await;
            continue;
        };
        if Instant::now() < sh.t0 + at {
            sleep(Duration::from_millis(100)).await;
            continue;
        }
        next = faults.next();
        let running = cl.running();
        match kind {
            FaultKind::PodKill | FaultKind::PodPause if running.len() < 2 => {
                log.push(format!(
                    "skipped {kind:?}@{:.1}s (one pod up)",
                    sh.at(Instant::now())
                ));
            }
            FaultKind::PodKill => {
                let i = running[rng.range(0, running.len() as u64 - 1) as usize];
                sh.mark_fault();
                cl.kill(i);
                let dead = rng.chance(0.35);
                let wait = if dead {
                    rng.ms(5000, 9000)
                } else {
                    rng.ms(200, 1500)
                };
                cl.pods[i].state = PodState::Down(Instant::now() + wait);
                let mut st = sh.stats();
                st.pod_kills += 1;
                st.pods_left_dead += dead as u64;
                log.push(format!(
                    "PodKill({},{}ms)@{:.1}s",
                    cl.pods[i].name,
                    wait.as_millis(),
                    sh.at(Instant::now())
                ));
            }
            FaultKind::PodPause => {
                let i = running[rng.range(0, running.len() as u64 - 1) as usize];
                sh.mark_fault();
                if let Some(c) = cl.pods[i].proxy.as_ref() {
                    signal(c, "STOP");
                }
                let wait = Duration::from_millis(LEASE_MS) + rng.ms(1000, 3000);
                cl.pods[i].state = PodState::Paused(Instant::now() + wait);
                sh.stats().pod_pauses += 1;
                log.push(format!(
                    "PodPause({},{}ms)@{:.1}s",
                    cl.pods[i].name,
                    wait.as_millis(),
                    sh.at(Instant::now())
                ));
            }
            FaultKind::RedisKill => {
                sh.mark_fault();
                redis.kill9();
                let down = rng.ms(200, 2500);
                log.push(format!(
                    "RedisKill({}ms)@{:.1}s",
                    down.as_millis(),
                    sh.at(Instant::now())
                ));
                sh.stats().redis_kills += 1;
                let back = Instant::now() + down;
                while Instant::now() < back {
                    cl.tend(sh).await;
                    sleep(Duration::from_millis(50)).await;
                }
                redis.restart().await;
                sh.mark_fault();
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Clients

#[derive(Clone, Copy, Debug, PartialEq)]
enum ReqState {
    Posting,
    Accepted,
    /// The POST got no answer, a 5xx or a 504: the client cannot know whether it ran.
    Uncertain,
}

struct Req {
    method: &'static str,
    count: u64,
    state: ReqState,
    since: Instant,
    expect: Duration,
}

struct Sess {
    sid: String,
    owner: usize,
    last: Option<(u32, u64)>,
    emit_seq: u64,
    emit_done: u64,
    emits_done: u64,
    uncertain: bool,
    reqs: HashMap<u64, Req>,
    answered: HashSet<u64>,
    next_id: u64,
    initialized: bool,
    emit_inflight: Option<u64>,
    aborted: bool,
    soft_done: bool,
    gone: bool,
    log: Vec<(u64, u32, u64)>,
}

impl Sess {
    fn accepted_unanswered(&self) -> Vec<u64> {
        let mut v: Vec<u64> = self
            .reqs
            .iter()
            .filter(|(_, r)| r.state == ReqState::Accepted)
            .map(|(id, _)| *id)
            .collect();
        v.sort_unstable();
        v
    }

    fn outstanding(&self) -> usize {
        self.reqs
            .values()
            .filter(|r| r.state != ReqState::Uncertain)
            .count()
    }

    fn cursor(&self) -> Option<String> {
        self.last.map(|(e, s)| format!("{}:{e}:{s}", self.sid))
    }
}

type PostDone = (u64, usize, Posted);

/// Runs sessions until the run winds down.
pub async fn worker(sh: Arc<Shared>, w: u64) {
    let mut rng = Rng::fork(sh.seed, 1000 + w);
    sleep(rng.ms(0, 500)).await;
    while !sh.stopping() {
        match open(&sh, &mut rng).await {
            Some((s, c)) => session(&sh, &mut rng, s, c).await,
            None => sleep(rng.ms(100, 300)).await,
        }
    }
}

async fn open(sh: &Shared, rng: &mut Rng) -> Option<(Sess, Box<SseConn>)> {
    let pod = rng.range(0, PODS as u64 - 1) as usize;
    let mut c = match wire::open_sse(sh.pods[pod], "/sse", None, HEAD_TIMEOUT).await {
        Opened::Stream(c) => c,
        Opened::Status(st, body) => {
            sh.stats().open_failed += 1;
            if st < 500 {
                sh.violation(
                    Violation::Protocol,
                    format!("GET /sse on pod {pod} answered {st}: {body}"),
                );
            }
            return None;
        }
        Opened::Failed => {
            sh.stats().open_failed += 1;
            return None;
        }
    };
    let ev = match c.next(Instant::now() + HEAD_TIMEOUT).await {
        Next::Event(ev) => ev,
        _ => {
            sh.stats().open_failed += 1;
            return None;
        }
    };
    let ep = String::from_utf8_lossy(&ev.data).into_owned();
    match ep.strip_prefix("/messages?session_id=") {
        Some(sid) if ev.event.as_deref() == Some("endpoint") && ev.id.is_none() => {
            sh.stats().sessions += 1;
            Some((
                Sess {
                    sid: sid.to_string(),
                    owner: pod,
                    last: None,
                    emit_seq: 0,
                    emit_done: 0,
                    emits_done: 0,
                    uncertain: false,
                    reqs: HashMap::new(),
                    answered: HashSet::new(),
                    next_id: 1,
                    initialized: false,
                    emit_inflight: None,
                    aborted: false,
                    soft_done: false,
                    gone: false,
                    log: Vec::new(),
                },
                c,
            ))
        }
        _ => {
            sh.violation(
                Violation::Protocol,
                format!("first event of GET /sse is not an id-less endpoint: {ev:?}"),
            );
            None
        }
    }
}

/// Sends a request through a random pod (a non-owner forwards it); a POST that certainly did not
/// reach a pod (no connection) is sent through another, a few times.
#[allow(clippy::too_many_arguments)]
fn request(
    sh: &Arc<Shared>,
    rng: &mut Rng,
    s: &mut Sess,
    done: &mpsc::UnboundedSender<PostDone>,
    method: &'static str,
    args: Value,
    count: u64,
    expect: Duration,
) {
    let id = s.next_id;
    s.next_id += 1;
    let body = if method == "initialize" {
        json!({"jsonrpc":"2.0","id":id,"method":"initialize","params":{"protocolVersion":"2024-11-05","capabilities":{},"clientInfo":{"name":"chaos-replicas","version":"0"}}})
    } else {
        json!({"jsonrpc":"2.0","id":id,"method":"tools/call","params":{"name":method,"arguments":args}})
    };
    if method == "emit" {
        s.emit_inflight = Some(id);
    }
    sh.stats().requests += 1;
    s.reqs.insert(
        id,
        Req {
            method,
            count,
            state: ReqState::Posting,
            since: Instant::now(),
            expect,
        },
    );
    let first = rng.range(0, PODS as u64 - 1) as usize;
    let (sh, sid, done) = (sh.clone(), s.sid.clone(), done.clone());
    tokio::spawn(async move {
        let path = format!("/messages?session_id={sid}");
        let bytes = body.to_string();
        let mut pod = first;
        let mut r = Posted::NotSent;
        for _ in 0..4 {
            r = wire::post(sh.pods[pod], &path, bytes.as_bytes(), POST_WAIT).await;
            if !matches!(r, Posted::NotSent) {
                break;
            }
            pod = (pod + 1) % PODS;
            sleep(Duration::from_millis(100)).await;
        }
        let _ = done.send((id, pod, r));
    });
}

fn posted(sh: &Shared, s: &mut Sess, id: u64, pod: usize, r: Posted) {
    let next = match r {
        Posted::Status(202, _) => {
            if pod != s.owner {
                sh.stats().forwards += 1;
            }
            Some(ReqState::Accepted)
        }
        Posted::Status(404, _) => {
            sh.stats().post_404 += 1;
            s.gone = true;
            None
        }
        Posted::Status(st, text) => {
            sh.stats().post_other += 1;
            if st < 500 {
                sh.violation(
                    Violation::Protocol,
                    format!(
                        "session {}: POST of request {id} answered {st}: {text}",
                        s.sid
                    ),
                );
            }
            s.soft_done = true;
            Some(ReqState::Uncertain)
        }
        Posted::NotSent => {
            sh.stats().post_not_sent += 1;
            s.soft_done = true;
            None
        }
        Posted::Unknown => {
            sh.stats().post_unknown += 1;
            s.soft_done = true;
            Some(ReqState::Uncertain)
        }
    };
    let Some(req) = s.reqs.get_mut(&id) else {
        return; // already answered on the stream
    };
    match next {
        Some(state) => {
            req.state = state;
            req.since = Instant::now();
            if state == ReqState::Uncertain && req.method == "emit" {
                s.uncertain = true;
            }
        }
        None => {
            s.reqs.remove(&id);
            if s.emit_inflight == Some(id) {
                s.emit_inflight = None;
            }
        }
    }
}

/// One logged event on the stream: the oracle.
fn on_event(sh: &Shared, s: &mut Sess, ev: &SseEvent) {
    let Some(id) = ev.id.as_deref() else {
        sh.violation(
            Violation::Protocol,
            format!(
                "session {}: an event without an id mid-stream: {ev:?}",
                s.sid
            ),
        );
        return;
    };
    let mut parts = id.rsplitn(3, ':');
    let seq: Option<u64> = parts.next().and_then(|v| v.parse().ok());
    let epoch: Option<u32> = parts.next().and_then(|v| v.parse().ok());
    let (Some(seq), Some(epoch), Some(sid)) = (seq, epoch, parts.next()) else {
        sh.violation(Violation::Protocol, format!("malformed event id {id}"));
        return;
    };
    if sid != s.sid {
        sh.violation(
            Violation::Protocol,
            format!("session {}: an event of session {sid}", s.sid),
        );
        return;
    }
    match s.last {
        Some((le, ls)) if seq <= ls => {
            sh.violation(
                Violation::Duplicate,
                format!("session {}: {id} after {le}:{ls}", s.sid),
            );
            return;
        }
        Some((le, ls)) => {
            if seq != ls + 1 {
                sh.violation(
                    Violation::SilentGap,
                    format!("session {}: {id} right after {le}:{ls}", s.sid),
                );
            }
            if epoch < le {
                sh.violation(
                    Violation::Protocol,
                    format!("session {}: epoch went back: {id} after {le}:{ls}", s.sid),
                );
            }
        }
        None if seq != 1 => sh.violation(
            Violation::SilentGap,
            format!("session {}: first event is {id}", s.sid),
        ),
        None => {}
    }
    s.last = Some((epoch, seq));
    s.log.push((seq, epoch, hash(&ev.data)));
    sh.stats().events += 1;
    let m: Value = match serde_json::from_slice(&ev.data) {
        Ok(m) => m,
        Err(_) => {
            sh.violation(
                Violation::Protocol,
                format!("session {}: {id} is not JSON", s.sid),
            );
            return;
        }
    };
    if m["method"] == "notifications/message" && m["params"]["logger"] == "emit" {
        let n = m["params"]["data"]["seq"].as_u64().unwrap_or(0);
        if n <= s.emit_seq {
            sh.violation(
                Violation::Duplicate,
                format!("session {}: emit #{n} after #{} ({id})", s.sid, s.emit_seq),
            );
        } else if n != s.emit_seq + 1 {
            sh.violation(
                Violation::SilentGap,
                format!("session {}: emit #{n} after #{} ({id})", s.sid, s.emit_seq),
            );
        }
        s.emit_seq = s.emit_seq.max(n);
        sh.stats().emit_events += 1;
        return;
    }
    let Some(rid) = m["id"].as_u64() else {
        return; // another notification
    };
    if !s.answered.insert(rid) {
        sh.violation(
            Violation::Duplicate,
            format!("session {}: request {rid} answered twice ({id})", s.sid),
        );
        return;
    }
    let Some(req) = s.reqs.remove(&rid) else {
        sh.violation(
            Violation::Protocol,
            format!(
                "session {}: an answer to request {rid}, never sent ({id})",
                s.sid
            ),
        );
        return;
    };
    sh.stats().answered += 1;
    if m["error"]["code"] == -32091 {
        sh.stats().aborted_32091 += 1;
        s.aborted = true;
        if s.emit_inflight == Some(rid) {
            s.emit_inflight = None;
        }
        return;
    }
    if m.get("error").is_some() {
        sh.violation(
            Violation::Protocol,
            format!("session {}: request {rid} answered {m}", s.sid),
        );
        return;
    }
    match req.method {
        "initialize" => s.initialized = true,
        "emit" => {
            let want = s.emit_done + req.count;
            let ok = if s.uncertain {
                s.emit_seq >= want
            } else {
                s.emit_seq == want
            };
            if !ok {
                sh.violation(
                    Violation::SilentGap,
                    format!(
                        "session {}: emit {rid} of {} answered ({id}) with emit #{} received, {want} expected",
                        s.sid, req.count, s.emit_seq
                    ),
                );
            }
            s.emit_done = s.emit_seq.max(want);
            s.emits_done += 1;
            s.emit_inflight = None;
        }
        _ => {}
    }
}

fn check_hung(sh: &Shared, s: &Sess, now: Instant) -> bool {
    let rec = sh.recovered();
    for (id, r) in &s.reqs {
        if r.state != ReqState::Accepted {
            continue;
        }
        let due = (r.since + r.expect).max(rec) + HUNG_BOUND;
        if now > due {
            sh.violation(
                Violation::Hung,
                format!(
                    "session {}: request {id} ({}) accepted at t={:.1}s unanswered",
                    s.sid,
                    r.method,
                    sh.at(r.since)
                ),
            );
            return true;
        }
    }
    false
}

fn finish_session(sh: &Shared, s: Sess, gone_404: bool) {
    sh.delivered
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(Delivered {
            sid: s.sid,
            events: s.log,
            gone_404,
        });
}

async fn session(sh: &Arc<Shared>, rng: &mut Rng, mut s: Sess, first: Box<SseConn>) {
    let (done_tx, mut done_rx) = mpsc::unbounded_channel::<PostDone>();
    let rotate_after = rng.range(2, 8);
    let mut conn = Some(first);
    let mut conn_pod = s.owner;
    let mut cut_at = Instant::now() + rng.ms(1000, 4000);
    let mut next_echo = Instant::now() + rng.ms(300, 3000);
    let mut no_event_since = Instant::now();
    request(
        sh,
        rng,
        &mut s,
        &done_tx,
        "initialize",
        json!({}),
        0,
        Duration::ZERO,
    );
    loop {
        while let Ok((id, pod, r)) = done_rx.try_recv() {
            posted(sh, &mut s, id, pod, r);
        }
        let now = Instant::now();
        if check_hung(sh, &s, now) {
            return finish_session(sh, s, false);
        }
        if let Some(hard) = sh.hard_deadline() {
            if now > hard {
                for id in s.accepted_unanswered() {
                    sh.violation(
                        Violation::Hung,
                        format!(
                            "session {}: request {id} still unanswered at the end of the run",
                            s.sid
                        ),
                    );
                }
                return finish_session(sh, s, false);
            }
        }
        let stopping = sh.stopping();
        let winding = stopping || s.soft_done || s.gone || s.emits_completed_enough(rotate_after);
        if winding && s.outstanding() == 0 && !s.aborted {
            sh.stats().rotated += 1;
            return finish_session(sh, s, false);
        }

        let Some(c) = conn.as_mut() else {
            // Resume the newest cursor on a random pod.
            let Some(cursor) = s.cursor() else {
                sh.stats().orphaned += 1;
                return finish_session(sh, s, false);
            };
            let pod = rng.range(0, PODS as u64 - 1) as usize;
            match wire::open_sse(sh.pods[pod], "/sse", Some(&cursor), HEAD_TIMEOUT).await {
                Opened::Stream(mut sse) => {
                    match sse.next(Instant::now() + HEAD_TIMEOUT).await {
                        Next::Event(ev) => {
                            let want = format!("/messages?session_id={}", s.sid);
                            if ev.event.as_deref() != Some("endpoint")
                                || ev.id.is_some()
                                || ev.data != want.as_bytes()
                            {
                                sh.violation(
                                    Violation::Protocol,
                                    format!("resume of {cursor} on pod {pod} did not start with this session's endpoint: {ev:?}"),
                                );
                                return finish_session(sh, s, false);
                            }
                        }
                        _ => {
                            sh.stats().server_ends += 1;
                            sleep(rng.ms(50, 200)).await;
                            continue;
                        }
                    }
                    {
                        let mut st = sh.stats();
                        st.resumes += 1;
                        st.resumes_on_other_pod += (pod != conn_pod) as u64;
                    }
                    conn_pod = pod;
                    if rng.chance(0.5) {
                        sse.set_budget(rng.range(1, 20_000) as usize);
                    }
                    cut_at = Instant::now() + rng.ms(300, 3000);
                    no_event_since = Instant::now();
                    conn = Some(sse);
                }
                Opened::Status(404, body) => {
                    *sh.stats()
                        .refusals
                        .entry("unknown_session".into())
                        .or_default() += 1;
                    let v: Value = serde_json::from_str(&body).unwrap_or_default();
                    if v["error"]["data"]["reason"] != "unknown_session" {
                        sh.violation(
                            Violation::Protocol,
                            format!("404 on resume without reason unknown_session: {body}"),
                        );
                    }
                    // POSTs still on their way settle first (bounded by their own timeout).
                    while s.reqs.values().any(|r| r.state == ReqState::Posting) {
                        match tokio::time::timeout(
                            POST_WAIT + Duration::from_secs(2),
                            done_rx.recv(),
                        )
                        .await
                        {
                            Ok(Some((id, pod, r))) => posted(sh, &mut s, id, pod, r),
                            _ => break,
                        }
                    }
                    // The client read the session's whole history: every accepted request must
                    // have been answered there (I6).
                    for id in s.accepted_unanswered() {
                        sh.violation(
                            Violation::Hung,
                            format!(
                                "session {}: resume of the newest cursor {cursor} answered 404 on pod {pod}, request {id} ({}) accepted but never answered",
                                s.sid, s.reqs[&id].method
                            ),
                        );
                    }
                    sh.stats().gone_404 += 1;
                    return finish_session(sh, s, true);
                }
                Opened::Status(st @ (400 | 409), body) => {
                    let v: Value = serde_json::from_str(&body).unwrap_or_default();
                    let reason = v["error"]["data"]["reason"]
                        .as_str()
                        .unwrap_or("?")
                        .to_string();
                    *sh.stats().refusals.entry(reason).or_default() += 1;
                    sh.violation(
                        Violation::WrongRefusal,
                        format!(
                            "session {}: resume of the newest cursor {cursor} on pod {pod} refused {st}: {body}",
                            s.sid
                        ),
                    );
                    return finish_session(sh, s, false);
                }
                Opened::Status(st, body) => {
                    sh.stats().resume_5xx += 1;
                    if st < 500 {
                        sh.violation(
                            Violation::Protocol,
                            format!("resume of {cursor} on pod {pod} answered {st}: {body}"),
                        );
                    }
                    sleep(rng.ms(100, 400)).await;
                }
                Opened::Failed => sleep(rng.ms(50, 250)).await,
            }
            continue;
        };

        // Work: one emit at a time, echoes now and then.
        if s.initialized && !stopping && !s.gone && !s.soft_done && !s.aborted {
            if s.emit_inflight.is_none() && s.emits_done < rotate_after {
                let count = rng.range(20, 300);
                let rate = if rng.chance(0.1) {
                    0
                } else {
                    rng.range(100, 500)
                };
                let paced = if rate == 0 { 1000 } else { rate };
                let expect = Duration::from_millis(count * 1000 / paced);
                let args = json!({"count": count, "rate_per_sec": rate, "size": rng.range(0, 200)});
                request(sh, rng, &mut s, &done_tx, "emit", args, count, expect);
            }
            if now >= next_echo {
                for _ in 0..rng.range(1, 3) {
                    let args = json!({"text": format!("e{}", rng.next_u64())});
                    request(sh, rng, &mut s, &done_tx, "echo", args, 0, Duration::ZERO);
                }
                next_echo = now + rng.ms(500, 3000);
            }
        }

        let deadline = (now + Duration::from_millis(200)).min(cut_at.max(now));
        let cut = match c.next(deadline).await {
            Next::Event(ev) => {
                no_event_since = Instant::now();
                on_event(sh, &mut s, &ev);
                None
            }
            Next::Comment => None,
            Next::End => {
                conn = None;
                sh.stats().server_ends += 1;
                sleep(rng.ms(10, 100)).await;
                None
            }
            Next::Cut { mid_event } => Some(mid_event),
            Next::Timeout => {
                let t = Instant::now();
                if s.last.is_some() && t >= cut_at {
                    Some(c.mid_event())
                } else if s.last.is_none() && t > no_event_since + Duration::from_secs(20) {
                    // Opened on a pod that died or paused before its first logged event: a
                    // legacy client without a cursor can only start over.
                    sh.stats().orphaned += 1;
                    return finish_session(sh, s, false);
                } else {
                    None
                }
            }
        };
        if let Some(mid_event) = cut {
            conn = None;
            {
                let mut st = sh.stats();
                st.cuts += 1;
                st.mid_event_cuts += mid_event as u64;
            }
            let pause = if rng.chance(0.85) {
                rng.ms(0, 300)
            } else {
                rng.ms(500, 2500)
            };
            sleep(pause).await;
        }
    }
}

impl Sess {
    fn emits_completed_enough(&self, n: u64) -> bool {
        self.emits_done >= n
    }
}

// ---------------------------------------------------------------------------------------------
// After the run: the log on Redis

async fn check_redis(sh: &Shared, url: &str) {
    let log = match RedisLog::connect(url, PREFIX).await {
        Ok(l) => l,
        Err(e) => {
            sh.violation(Violation::Protocol, format!("after the run: Redis: {e}"));
            return;
        }
    };
    let mut admin = match ::redis::Client::open(url) {
        Ok(c) => match c.get_multiplexed_async_connection().await {
            Ok(c) => c,
            Err(e) => {
                sh.violation(Violation::Protocol, format!("after the run: Redis: {e}"));
                return;
            }
        },
        Err(e) => {
            sh.violation(Violation::Protocol, format!("after the run: Redis: {e}"));
            return;
        }
    };
    let mut sids = Vec::new();
    let mut cur: u64 = 0;
    loop {
        let (next, keys): (u64, Vec<String>) = ::redis::cmd("SCAN")
            .arg(cur)
            .arg("MATCH")
            .arg(format!("{PREFIX}:{{*}}:m"))
            .arg("COUNT")
            .arg(1000)
            .query_async(&mut admin)
            .await
            .unwrap_or_default();
        for k in keys {
            if let Some(s) = k
                .strip_prefix(&format!("{PREFIX}:{{"))
                .and_then(|r| r.strip_suffix("}:m"))
            {
                sids.push(s.to_string());
            }
        }
        if next == 0 {
            break;
        }
        cur = next;
    }
    // seq → (epoch, hash) of what Redis holds, and the last deliverable seq, per session.
    type Logged = (HashMap<u64, (u32, u64)>, u64);
    let mut logged: HashMap<String, Logged> = HashMap::new();
    for sid in sids {
        let Some(id) = SessionId::parse(&sid) else {
            continue;
        };
        let mut events = Vec::new();
        let mut rec = None;
        let mut after = 0;
        loop {
            match log.read(&id, after, 5000).await {
                Ok(Some((r, evs))) => {
                    let done = evs.is_empty() || evs.last().is_some_and(|e| e.seq >= r.ranges.head);
                    after = evs.last().map_or(after, |e| e.seq);
                    events.extend(evs);
                    rec = Some(r);
                    if done {
                        break;
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    sh.violation(
                        Violation::Protocol,
                        format!("after the run: read {sid}: {e}"),
                    );
                    break;
                }
            }
        }
        let Some(rec) = rec else { continue };
        {
            let mut st = sh.stats();
            st.records += 1;
            st.logged_events += events.len() as u64;
            st.records_unended += rec.ended.is_none() as u64;
            st.takeovers += (rec.ranges.current_epoch() > 1) as u64;
        }
        let mut map = HashMap::new();
        let mut prev: Option<(u32, u64)> = None;
        let mut end_at: Option<u64> = None;
        let mut last_deliverable = 0;
        for e in &events {
            if let Some((pe, ps)) = prev {
                if e.seq != ps + 1 || e.epoch < pe {
                    sh.violation(
                        Violation::StaleOwnerWrite,
                        format!(
                            "session {sid}: logged {}:{} right after {pe}:{ps}",
                            e.epoch, e.seq
                        ),
                    );
                }
            } else if e.seq != rec.ranges.oldest {
                sh.violation(
                    Violation::SilentGap,
                    format!(
                        "session {sid}: the log starts at {} but its record says {}",
                        e.seq, rec.ranges.oldest
                    ),
                );
            }
            if e.epoch != rec.ranges.epoch_of(e.seq) {
                sh.violation(
                    Violation::StaleOwnerWrite,
                    format!(
                        "session {sid}: {}:{} is in epoch {} by the record",
                        e.epoch,
                        e.seq,
                        rec.ranges.epoch_of(e.seq)
                    ),
                );
            }
            if let Some(end) = end_at {
                sh.violation(
                    Violation::StaleOwnerWrite,
                    format!(
                        "session {sid}: {}:{} logged after the end marker at {end}",
                        e.epoch, e.seq
                    ),
                );
            }
            if e.kind == Kind::End {
                end_at = Some(e.seq);
            } else {
                last_deliverable = e.seq;
                if e.epoch > 1 {
                    // An epoch opened by a takeover holds the taker's -32091s (`Message` on the
                    // legacy stream, `Final` on a POST stream) and the end only.
                    let v: Value = serde_json::from_slice(&e.payload).unwrap_or_default();
                    if e.kind == Kind::Priming || v["error"]["code"] != -32091 {
                        sh.violation(
                            Violation::StaleOwnerWrite,
                            format!(
                                "session {sid}: {}:{} ({:?}) in a taken-over epoch: {}",
                                e.epoch,
                                e.seq,
                                e.kind,
                                String::from_utf8_lossy(&e.payload)
                            ),
                        );
                    }
                }
            }
            map.insert(e.seq, (e.epoch, hash(&e.payload)));
            prev = Some((e.epoch, e.seq));
        }
        if let Some((_, ps)) = prev {
            if ps != rec.ranges.head {
                sh.violation(
                    Violation::SilentGap,
                    format!(
                        "session {sid}: the log ends at {ps}, its head is {}",
                        rec.ranges.head
                    ),
                );
            }
        }
        if rec.ended.is_some() {
            // An ended session has answered everything it took (I6): nothing is left in flight.
            match log.inflight(&id).await {
                Ok(left) if !left.is_empty() => sh.violation(
                    Violation::Hung,
                    format!(
                        "session {sid}: ended ({:?}) with requests still in flight on Redis, never answered: {:?}",
                        rec.ended,
                        left.iter().map(|(r, _)| r.as_str()).collect::<Vec<_>>()
                    ),
                ),
                Ok(_) => {}
                Err(e) => sh.violation(
                    Violation::Protocol,
                    format!("after the run: in-flight of {sid}: {e}"),
                ),
            }
        }
        if rec.ended.is_some() != end_at.is_some() {
            sh.violation(
                Violation::Protocol,
                format!(
                    "session {sid}: record ended={:?} but end marker at {end_at:?}",
                    rec.ended
                ),
            );
        }
        logged.insert(sid, (map, last_deliverable));
    }
    // What each client received is what was logged; a client refused 404 had it all.
    let delivered = std::mem::take(&mut *sh.delivered.lock().unwrap_or_else(|e| e.into_inner()));
    for d in delivered {
        let Some((map, last)) = logged.get(&d.sid) else {
            if !d.events.is_empty() {
                sh.violation(
                    Violation::SilentGap,
                    format!(
                        "session {}: received {} events, no record on Redis",
                        d.sid,
                        d.events.len()
                    ),
                );
            }
            continue;
        };
        for &(seq, epoch, h) in &d.events {
            if map.get(&seq) != Some(&(epoch, h)) {
                sh.violation(
                    Violation::SilentGap,
                    format!(
                        "session {}: received {epoch}:{seq}, the log holds {:?} there",
                        d.sid,
                        map.get(&seq).map(|x| x.0)
                    ),
                );
                break;
            }
        }
        let got = d.events.last().map_or(0, |e| e.0);
        if d.gone_404 && got != *last {
            sh.violation(
                Violation::WrongRefusal,
                format!(
                    "session {}: its newest cursor (seq {got}) was refused 404, the log has deliverable events up to {last}",
                    d.sid
                ),
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The run

/// What a run found.
pub struct Outcome {
    pub summary: String,
    pub detail: String,
    pub violations: Vec<String>,
    pub ok: bool,
    pub dir: PathBuf,
}

/// Runs `profile` with `seed`, the proxy binary being `bin`.
pub fn run(profile: &Profile, seed: u64, bin: PathBuf) -> Outcome {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(run_async(profile, seed, bin))
}

async fn run_async(profile: &Profile, seed: u64, bin: PathBuf) -> Outcome {
    let dir = std::env::temp_dir().join(format!(
        "mcp-resume-chaos-replicas-{}-{seed}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("work dir");
    let mut redis = RedisServer::start(Persist::AofAlways).await;
    let ident = key_file(&dir, "identity.key");
    let secret = key_file(&dir, "cluster.key");
    let pods: Vec<Pod> = NAMES
        .iter()
        .map(|name| Pod {
            name,
            port: super::support::port(),
            admin: super::support::port(),
            internal: super::support::port(),
            upstream: super::support::port(),
            dir: dir.join(name),
            proxy: None,
            up: None,
            state: PodState::Down(Instant::now()),
        })
        .collect();
    let addrs = pods
        .iter()
        .map(|p| SocketAddr::from(([127, 0, 0, 1], p.port)))
        .collect();
    let mut cl = Cluster {
        bin,
        dir: dir.clone(),
        redis_url: redis.url(),
        ident,
        secret,
        pods,
    };
    let sh = Arc::new(Shared {
        seed,
        t0: Instant::now(),
        pods: addrs,
        stop: AtomicBool::new(false),
        hard: Mutex::new(None),
        stats: Mutex::new(Stats::default()),
        recovered: Mutex::new(Instant::now()),
        delivered: Mutex::new(Vec::new()),
    });
    for i in 0..PODS {
        cl.spawn_upstream(i);
    }
    for (i, name) in NAMES.iter().enumerate() {
        let port = cl.pods[i].upstream;
        super::support::wait_port(port).await;
        if !cl.start_proxy(i).await {
            sh.violation(
                Violation::Protocol,
                format!(
                    "{} did not start; its log:\n{}",
                    name,
                    tail(&dir.join(format!("{name}.proxy.log")), 20)
                ),
            );
            return finish(profile, &sh, dir, Vec::new());
        }
    }
    let t0 = Instant::now();
    let end = t0 + profile.duration;
    let plan = plan(&mut Rng::fork(seed, 1), profile);
    let workers: Vec<_> = (0..profile.workers)
        .map(|w| tokio::spawn(worker(sh.clone(), w)))
        .collect();
    let mut fault_log = Vec::new();
    controller(
        &sh,
        &mut cl,
        &mut redis,
        &plan,
        Rng::fork(seed, 2),
        end,
        &mut fault_log,
    )
    .await;
    // Wind down: no new sessions or requests; what is in flight must still be answered. Pods
    // that are down or paused come back meanwhile.
    let hard = Instant::now() + HUNG_BOUND + Duration::from_secs(10);
    *sh.hard.lock().unwrap_or_else(|e| e.into_inner()) = Some(hard);
    sh.stop.store(true, Ordering::SeqCst);
    let mut workers = workers.into_iter();
    let mut cur = workers.next();
    while let Some(w) = cur.as_mut() {
        cl.tend(&sh).await;
        if w.is_finished() {
            cur = workers.next();
            continue;
        }
        if Instant::now() > hard + Duration::from_secs(30) {
            sh.violation(
                Violation::Hung,
                "a client worker did not finish within the wind-down bound".into(),
            );
            w.abort();
            cur = workers.next();
            continue;
        }
        sleep(Duration::from_millis(100)).await;
    }
    // Make sure nothing is still paused, then stop every pod cleanly.
    for i in 0..PODS {
        if let PodState::Paused(_) = cl.pods[i].state {
            if let Some(c) = cl.pods[i].proxy.as_ref() {
                signal(c, "CONT");
            }
        }
    }
    for (i, name) in NAMES.iter().enumerate() {
        let Some(mut c) = cl.pods[i].proxy.take() else {
            continue;
        };
        signal(&c, "TERM");
        let deadline = Instant::now() + Duration::from_secs(15);
        let st = loop {
            if let Ok(Some(st)) = c.try_wait() {
                break Some(st);
            }
            if Instant::now() > deadline {
                let _ = c.kill();
                let _ = c.wait();
                break None;
            }
            sleep(Duration::from_millis(20)).await;
        };
        let woken = matches!(cl.pods[i].state, PodState::Waking(_) | PodState::Paused(_));
        match st {
            Some(s) if s.success() => {}
            Some(s) if woken && s.code() == Some(74) => {}
            other => sh.violation(
                Violation::Protocol,
                format!("final SIGTERM of {name}: exit {other:?}"),
            ),
        }
    }
    for p in &mut cl.pods {
        if let Some(mut u) = p.up.take() {
            let _ = u.kill();
            let _ = u.wait();
        }
    }
    check_redis(&sh, &redis.url()).await;
    redis.kill9();
    finish(profile, &sh, dir, fault_log)
}

fn finish(profile: &Profile, sh: &Shared, dir: PathBuf, faults: Vec<String>) -> Outcome {
    let st = sh.stats();
    let refusals: Vec<String> = st
        .refusals
        .iter()
        .map(|(k, v)| format!("{k}:{v}"))
        .collect();
    let summary = format!(
        "chaos-replicas: sessions={} events={} cuts={} pod_kills={} pod_pauses={} redis_kills={} takeovers={} forwards={} resumes={} refusals={{{}}} silent_gaps={} duplicates={} hung_requests={} stale_owner_writes={} wrong_refusals={} protocol_errors={} seed={}",
        st.sessions,
        st.events,
        st.cuts,
        st.pod_kills,
        st.pod_pauses,
        st.redis_kills,
        st.takeovers,
        st.forwards,
        st.resumes,
        refusals.join(","),
        st.count(Violation::SilentGap),
        st.count(Violation::Duplicate),
        st.count(Violation::Hung),
        st.count(Violation::StaleOwnerWrite),
        st.count(Violation::WrongRefusal),
        st.count(Violation::Protocol),
        sh.seed,
    );
    let detail = format!(
        "chaos-replicas-detail: profile={} elapsed={:.0}s emit_events={} mid_event_cuts={} resumes_on_other_pod={} server_ends={} pods_left_dead={} self_stops={} kept_running_after_pause={} requests={} answered={} aborted_32091={} post_404={} post_other={} post_unknown={} post_not_sent={} resume_5xx={} gone_404={} rotated={} orphaned={} open_failed={} records={} records_unended={} logged_events={} faults=[{}]",
        profile.name,
        sh.at(Instant::now()),
        st.emit_events,
        st.mid_event_cuts,
        st.resumes_on_other_pod,
        st.server_ends,
        st.pods_left_dead,
        st.self_stops,
        st.kept_running_after_pause,
        st.requests,
        st.answered,
        st.aborted_32091,
        st.post_404,
        st.post_other,
        st.post_unknown,
        st.post_not_sent,
        st.resume_5xx,
        st.gone_404,
        st.rotated,
        st.orphaned,
        st.open_failed,
        st.records,
        st.records_unended,
        st.logged_events,
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
