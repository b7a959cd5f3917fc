//! End-to-end load harness (issue 4, part 2): one run measures the same workload straight to a
//! legacy SSE upstream, through nginx as a plain SSE pass-through, and through mcp-resume-proxy in
//! each durability mode, and prints one report.
//!
//! Run it through `scripts/bench-e2e`, which builds the release binaries, installs nginx and keeps
//! the raw output under `benches/results/`. Everything listens on 127.0.0.1 ports below 32768;
//! every wait is bounded; every process it starts is killed when it ends.
//!
//! The upstream is the proxy's embedded demo server (`mcp-resume-proxy demo-upstream`) in its own
//! process. Its `emit` tool sends `notifications/message` events whose data carries a per-session
//! `seq` and `t_ns`, the Unix time in ns at which the upstream built the event; the client takes
//! its receipt time from the same clock, so `receipt - t_ns` is the end-to-end latency and the
//! difference between two paths at the same percentile is the latency a hop adds.
//!
//! Phases (`--phases`, comma-separated, default all):
//! - `throughput`: `--tp-sessions` sessions each receive `--tp-events` unpaced events.
//! - `latency`: `--lat-sessions` sessions paced to `--lat-rate` events/s in aggregate.
//! - `rss`: VmRSS of a fresh proxy before and after opening N sessions (idle: client streams
//!   attached, no traffic), then after every session received `--active-events` events.
//! - `replay`: one session gets `--replay-events` events while its client is away; resume, timed.
//! - `restart`: fill the data dir to `--restart-events` events, SIGKILL the proxy, restart it on
//!   the dir and time until `/readyz` answers 200; then the same after a clean stop.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::{Bytes, BytesMut};
use clap::Parser;
use http::{header, Request};
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::{TokioExecutor, TokioIo};
use mcp_resume_proxy::sse::Decoder;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// Sessions opened (or POSTs sent) at once.
const OPEN_CONCURRENCY: usize = 64;
/// Sessions opened before the RSS baseline is taken (runtime, pools and allocator warmed up).
const RSS_WARM_SESSIONS: usize = 16;
/// Bound of any single phase step.
const STEP_TIMEOUT: Duration = Duration::from_secs(180);

#[derive(Parser, Debug, Clone)]
#[command(about = "End-to-end load harness for mcp-resume-proxy (see docs/benchmarks.md)")]
struct Args {
    /// The release `mcp-resume-proxy` binary (also runs the demo upstream).
    #[arg(long)]
    proxy_bin: PathBuf,
    /// The nginx binary; without it the nginx column is skipped.
    #[arg(long)]
    nginx: Option<PathBuf>,
    /// Scratch directory for data dirs, configs and process logs.
    #[arg(long)]
    work: PathBuf,
    /// Phases to run: throughput,latency,rss,replay,restart (or `all`).
    #[arg(long, default_value = "all")]
    phases: String,
    /// Paths to measure: direct,nginx,fsync,relaxed,redis-fsync,redis-relaxed (throughput and
    /// latency phases). The redis paths run the proxy with `log.backend = "redis"` on a fresh
    /// redis-server (AOF `always` for redis-fsync, `everysec` for redis-relaxed).
    #[arg(
        long,
        default_value = "direct,nginx,fsync,relaxed,redis-fsync,redis-relaxed"
    )]
    targets: String,
    /// The redis-server binary; without it the redis paths are skipped.
    #[arg(long)]
    redis_server: Option<PathBuf>,
    /// Padding bytes per event (the payload is about 130 bytes plus this).
    #[arg(long, default_value_t = 200)]
    pad: usize,
    /// Throughput: concurrent sessions.
    #[arg(long, default_value_t = 16)]
    tp_sessions: usize,
    /// Throughput: events per session.
    #[arg(long, default_value_t = 20_000)]
    tp_events: u64,
    /// Latency: concurrent sessions.
    #[arg(long, default_value_t = 50)]
    lat_sessions: usize,
    /// Latency: aggregate events per second.
    #[arg(long, default_value_t = 5_000)]
    lat_rate: u64,
    /// Latency: seconds of traffic.
    #[arg(long, default_value_t = 8)]
    lat_secs: u64,
    /// RSS: session counts to measure at.
    #[arg(long, default_value = "1000,5000")]
    rss_sessions: String,
    /// RSS: events each session receives for the "active" figure (128 fills the in-memory window).
    #[arg(long, default_value_t = 128)]
    active_events: u64,
    /// Replay: backlog size.
    #[arg(long, default_value_t = 100_000)]
    replay_events: u64,
    /// Restart: events in the data dir.
    #[arg(long, default_value_t = 1_000_000)]
    restart_events: u64,
    /// Restart: sessions the events are spread over.
    #[arg(long, default_value_t = 20)]
    restart_sessions: u64,
    /// Command prefix for the proxy process, e.g. `valgrind --tool=callgrind` (profiling runs).
    #[arg(long)]
    proxy_wrap: Option<String>,
}

fn main() -> std::process::ExitCode {
    let args = Args::parse();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    match rt.block_on(run(args)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("loadgen: {e}");
            std::process::ExitCode::from(1)
        }
    }
}

// === processes ===

/// A child process, killed (SIGKILL) and reaped on drop.
struct Proc {
    child: Child,
    /// The child leads its own process group, killed as a whole (nginx: a SIGKILLed master
    /// leaves its workers running).
    group: bool,
}

impl Proc {
    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGTERM, then wait up to `grace` for the exit; SIGKILL after that.
    fn terminate(mut self, grace: Duration) -> Duration {
        let t0 = Instant::now();
        let _ = Command::new("kill")
            .args(["-TERM", &self.pid().to_string()])
            .status();
        while t0.elapsed() < grace {
            if let Ok(Some(_)) = self.child.try_wait() {
                return t0.elapsed();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        t0.elapsed()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if self.group {
            // The group is often gone already (a terminated nginx takes its workers along):
            // `kill`'s "No such process" is the expected case, not news.
            let _ = Command::new("kill")
                .args(["-KILL", "--", &format!("-{}", self.pid())])
                .stderr(Stdio::null())
                .status();
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A free loopback port below 32768.
fn port() -> u16 {
    static NEXT: AtomicU16 = AtomicU16::new(0);
    let _ = NEXT.compare_exchange(
        0,
        21_000 + (std::process::id() % 200) as u16 * 50,
        Ordering::SeqCst,
        Ordering::SeqCst,
    );
    for _ in 0..10_000 {
        let p = NEXT.fetch_add(1, Ordering::SeqCst);
        let p = 21_000 + (p - 21_000) % 11_000;
        if std::net::TcpListener::bind(("127.0.0.1", p)).is_ok() {
            return p;
        }
    }
    panic!("no free port in 21000..32000");
}

fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

async fn wait_port(addr: SocketAddr) -> Res<()> {
    let t0 = Instant::now();
    while TcpStream::connect(addr).await.is_err() {
        if t0.elapsed() > Duration::from_secs(30) {
            return Err(format!("nothing listens on {addr}").into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

/// utime + stime of a process, in seconds.
fn cpu_secs(pid: u32, tck: f64) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0.0;
    };
    // Fields after the parenthesised command name: state is field 3, utime 14, stime 15.
    let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
        return 0.0;
    };
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (ticks(11) + ticks(12)) / tck
}

fn ppid(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = stat.rsplit_once(')')?.1;
    rest.split_whitespace().nth(1)?.parse().ok()
}

/// `pid` and its direct children (nginx: master and workers).
fn family(pid: u32) -> Vec<u32> {
    let mut out = vec![pid];
    if let Ok(rd) = std::fs::read_dir("/proc") {
        for e in rd.flatten() {
            if let Some(p) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) {
                if ppid(p) == Some(pid) {
                    out.push(p);
                }
            }
        }
    }
    out
}

/// VmRSS in KiB.
fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

fn clock_ticks() -> f64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100.0)
}

fn du_mib(dir: &Path) -> f64 {
    fn walk(p: &Path) -> u64 {
        let Ok(rd) = std::fs::read_dir(p) else {
            return 0;
        };
        rd.flatten()
            .map(|e| match e.metadata() {
                Ok(m) if m.is_dir() => walk(&e.path()),
                Ok(m) => m.len(),
                Err(_) => 0,
            })
            .sum()
    }
    walk(dir) as f64 / (1024.0 * 1024.0)
}

// === HTTP ===

type PostClient = Client<HttpConnector, Full<Bytes>>;

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// One client SSE stream on its own connection; dropping it closes the connection.
struct Sse {
    body: Incoming,
    buf: BytesMut,
    dec: Decoder,
    _tx: hyper::client::conn::http1::SendRequest<Empty<Bytes>>,
    _conn: AbortOnDrop,
}

impl Sse {
    async fn open(addr: SocketAddr, path: &str, last_event_id: Option<&str>) -> Res<Sse> {
        let tcp = TcpStream::connect(addr).await?;
        tcp.set_nodelay(true)?;
        let (mut tx, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp)).await?;
        let conn = AbortOnDrop(tokio::spawn(async move {
            let _ = conn.await;
        }));
        let mut req = Request::get(path)
            .header(header::HOST, addr.to_string())
            .header(header::ACCEPT, "text/event-stream");
        if let Some(id) = last_event_id {
            req = req.header("last-event-id", id);
        }
        let resp = tx.send_request(req.body(Empty::new())?).await?;
        if resp.status() != 200 {
            return Err(format!("GET {path} on {addr} answered {}", resp.status()).into());
        }
        Ok(Sse {
            body: resp.into_body(),
            buf: BytesMut::with_capacity(8 * 1024),
            dec: Decoder::new(16 << 20),
            _tx: tx,
            _conn: conn,
        })
    }

    async fn next(&mut self) -> Res<Option<mcp_resume_proxy::sse::Event>> {
        loop {
            if let Some(ev) = self.dec.decode(&mut self.buf).map_err(|e| e.to_string())? {
                return Ok(Some(ev));
            }
            match self.body.frame().await {
                None => return Ok(None),
                Some(Err(e)) => return Err(e.into()),
                Some(Ok(f)) => {
                    if let Ok(d) = f.into_data() {
                        self.buf.extend_from_slice(&d);
                    }
                }
            }
        }
    }

    /// Reads to the `endpoint` event and returns the message path it names.
    async fn endpoint(&mut self) -> Res<String> {
        loop {
            let ev = tokio::time::timeout(Duration::from_secs(30), self.next())
                .await
                .map_err(|_| "no endpoint event in 30 s")??
                .ok_or("stream ended before the endpoint event")?;
            if ev.event.as_deref() == Some("endpoint") {
                let data = String::from_utf8_lossy(&ev.data).trim().to_string();
                // Relative forms only (all three servers here send an absolute path).
                return match data.strip_prefix("http://") {
                    Some(rest) => Ok(rest[rest.find('/').unwrap_or(rest.len())..].to_string()),
                    None => Ok(data),
                };
            }
        }
    }
}

fn post_client() -> PostClient {
    let mut c = HttpConnector::new();
    c.set_nodelay(true);
    Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(OPEN_CONCURRENCY * 2)
        .build(c)
}

async fn post(client: &PostClient, addr: SocketAddr, path: &str, body: String) -> Res<()> {
    let req = Request::post(format!("http://{addr}{path}"))
        .header(header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(body)))?;
    let resp = client.request(req).await?;
    let status = resp.status();
    let _ = resp.into_body().collect().await;
    if !status.is_success() {
        return Err(format!("POST {path} answered {status}").into());
    }
    Ok(())
}

fn emit_call(id: u64, count: u64, rate: u64, pad: usize) -> String {
    format!(
        r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"emit","arguments":{{"count":{count},"rate_per_sec":{rate},"size":{pad}}}}}}}"#
    )
}

/// `GET path` with `Connection: close`: (status, body).
async fn http_get(addr: SocketAddr, path: &str) -> Res<(u16, String)> {
    let mut s = TcpStream::connect(addr).await?;
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await?;
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut out))
        .await
        .map_err(|_| "admin request timed out")??;
    let text = String::from_utf8_lossy(&out).into_owned();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    Ok((status, text))
}

async fn logged_total(admin: SocketAddr) -> Res<u64> {
    let (_, text) = http_get(admin, "/metrics").await?;
    text.lines()
        .find_map(|l| l.strip_prefix("mcp_resume_events_logged_total "))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map(|v| v as u64)
        .ok_or_else(|| "no mcp_resume_events_logged_total in /metrics".into())
}

/// Cumulative buckets `(le, count)` of `mcp_resume_log_append_seconds`.
async fn append_histogram(admin: SocketAddr) -> Res<Vec<(f64, u64)>> {
    let (_, text) = http_get(admin, "/metrics").await?;
    Ok(text
        .lines()
        .filter_map(|l| l.strip_prefix("mcp_resume_log_append_seconds_bucket{le=\""))
        .filter_map(|rest| {
            let (le, count) = rest.split_once("\"} ")?;
            let le = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().ok()?
            };
            Some((le, count.trim().parse::<f64>().ok()? as u64))
        })
        .collect())
}

/// The bucket bound under which fraction `q` of the observations between two snapshots fall.
fn histogram_quantile(before: &[(f64, u64)], after: &[(f64, u64)], q: f64) -> Option<f64> {
    let diff: Vec<(f64, u64)> = after
        .iter()
        .map(|&(le, c)| {
            let b = before.iter().find(|x| x.0 == le).map_or(0, |x| x.1);
            (le, c.saturating_sub(b))
        })
        .collect();
    let total = diff.last()?.1;
    if total == 0 {
        return None;
    }
    diff.iter()
        .find(|&&(_, c)| c as f64 >= q * total as f64)
        .map(|&(le, _)| le)
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

async fn wait_logged(admin: SocketAddr, target: u64, limit: Duration) -> Res<Duration> {
    let t0 = Instant::now();
    loop {
        if logged_total(admin).await? >= target {
            return Ok(t0.elapsed());
        }
        if t0.elapsed() > limit {
            return Err(format!("the proxy did not log {target} events in {limit:?}").into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

// === receiving ===

fn unix_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// `(seq, t_ns)` of an `emit` event's data, read without a JSON parse (the client must stay
/// cheap: it shares the cores with what it measures).
fn emit_fields(data: &[u8]) -> Option<(u64, u64)> {
    fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
        let mut from = 0;
        while let Some(i) = hay[from..].iter().position(|&b| b == needle[0]) {
            let at = from + i;
            if hay[at..].starts_with(needle) {
                return Some(at);
            }
            from = at + 1;
        }
        None
    }
    fn number_at(data: &[u8], at: usize) -> Option<(u64, usize)> {
        let mut v = 0u64;
        let mut n = 0;
        for &b in data.get(at..)?.iter().take_while(|b| b.is_ascii_digit()) {
            v = v.checked_mul(10)?.checked_add(u64::from(b - b'0'))?;
            n += 1;
        }
        (n > 0).then_some((v, at + n))
    }
    const SEQ: &[u8] = b"{\"seq\":";
    const T_NS: &[u8] = b",\"t_ns\":";
    let head = &data[..data.len().min(256)];
    let (seq, end) = number_at(head, find(head, SEQ)? + SEQ.len())?;
    if !head[end..].starts_with(T_NS) {
        return None;
    }
    let (t_ns, _) = number_at(head, end + T_NS.len())?;
    Some((seq, t_ns))
}

/// What one client stream received.
#[derive(Default)]
struct Recv {
    events: u64,
    gaps: u64,
    dups: u64,
    last_seq: u64,
    last_id: Option<String>,
    lat_ns: Vec<u64>,
    done_at: Option<Instant>,
}

/// Reads `want` emit events (other events are skipped), checking that seqs follow `after_seq`.
async fn consume(sse: &mut Sse, want: u64, after_seq: Option<u64>, latency: bool) -> Res<Recv> {
    let mut r = Recv {
        last_seq: after_seq.unwrap_or(0),
        ..Recv::default()
    };
    if latency {
        r.lat_ns.reserve(want as usize);
    }
    let deadline = tokio::time::Instant::now() + STEP_TIMEOUT;
    let mut first = after_seq.is_none();
    while r.events < want {
        let ev = tokio::time::timeout_at(deadline, sse.next())
            .await
            .map_err(|_| format!("stream stalled after {} of {want} events", r.events))??
            .ok_or_else(|| format!("stream ended after {} of {want} events", r.events))?;
        let Some((seq, t_ns)) = emit_fields(&ev.data) else {
            continue;
        };
        let now = unix_ns();
        if first {
            first = false;
        } else if seq <= r.last_seq {
            r.dups += 1;
        } else if seq != r.last_seq + 1 {
            r.gaps += 1;
        }
        r.last_seq = seq;
        r.last_id = ev.id;
        r.events += 1;
        if latency {
            r.lat_ns.push(now.saturating_sub(t_ns));
        }
    }
    r.done_at = Some(Instant::now());
    Ok(r)
}

fn percentile(sorted: &[u64], q: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let i = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i]
}

fn ms(ns: u64) -> f64 {
    ns as f64 / 1e6
}

// === targets ===

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Direct,
    Nginx,
    Fsync,
    Relaxed,
    RedisFsync,
    RedisRelaxed,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Direct => "direct",
            Mode::Nginx => "nginx",
            Mode::Fsync => "proxy-fsync",
            Mode::Relaxed => "proxy-relaxed",
            Mode::RedisFsync => "redis-fsync",
            Mode::RedisRelaxed => "redis-relaxed",
        }
    }
}

/// A running path to the upstream.
struct Target {
    mode: Mode,
    addr: SocketAddr,
    /// Processes whose CPU counts as the hop's (none for direct).
    pids: Vec<u32>,
    proc: Option<Proc>,
    admin: Option<SocketAddr>,
    /// The redis-server behind a redis path (stopped after the proxy).
    redis: Option<Proc>,
    /// Its address (for `INFO commandstats`).
    redis_addr: Option<SocketAddr>,
}

struct Ctx {
    args: Args,
    upstream: SocketAddr,
    upstream_pid: u32,
    tck: f64,
    posts: PostClient,
    report: String,
}

impl Ctx {
    fn line(&mut self, s: impl AsRef<str>) {
        println!("{}", s.as_ref());
        self.report.push_str(s.as_ref());
        self.report.push('\n');
    }

    fn cpu(&self, pids: &[u32]) -> f64 {
        pids.iter().map(|&p| cpu_secs(p, self.tck)).sum()
    }
}

/// A proxy on fresh ports with its config in `dir`.
struct ProxyProc {
    proc: Proc,
    addr: SocketAddr,
    admin: SocketAddr,
    config: PathBuf,
    log: PathBuf,
}

fn write_proxy_config(
    ctx: &Ctx,
    dir: &Path,
    durability: &str,
    redis: Option<SocketAddr>,
) -> Res<(PathBuf, SocketAddr, SocketAddr)> {
    std::fs::create_dir_all(dir)?;
    let (addr, admin) = (loopback(port()), loopback(port()));
    let backend = match redis {
        Some(r) => format!(
            "backend = \"redis\"\n[log.redis]\nurl = \"redis://{r}\"\n[cluster]\nreplica_id = \"bench\"\n"
        ),
        None => String::new(),
    };
    let cfg = format!(
        r#"[listen]
addr = "{addr}"
max_connections = 20000
# Every client of the load generator is one anonymous peer (127.0.0.1).
max_connections_per_identity = 20000
[admin]
addr = "{admin}"
[upstream]
sse_url = "http://{up}/sse"
[log]
dir = "{data}"
durability = "{durability}"
max_events_per_session = 2000000
max_bytes_per_session = 1073741824
max_total_bytes = 8589934592
{backend}[sessions]
idle_ttl_secs = 3600
retain_ended_secs = 3600
max_sessions = 10000
max_per_identity = 10000
[shutdown]
grace_secs = 20
"#,
        up = ctx.upstream,
        data = dir.join("data").display(),
    );
    let path = dir.join("proxy.toml");
    std::fs::write(&path, cfg)?;
    Ok((path, addr, admin))
}

fn spawn_proxy(ctx: &Ctx, config: &Path, log: &Path) -> Res<Proc> {
    let mut words: Vec<String> = ctx
        .args
        .proxy_wrap
        .as_deref()
        .map(|w| w.split_whitespace().map(String::from).collect())
        .unwrap_or_default();
    words.push(ctx.args.proxy_bin.display().to_string());
    let stderr = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)?;
    let child = Command::new(&words[0])
        .args(&words[1..])
        .arg("--config")
        .arg(config)
        .env("MCP_RESUME_PROXY_LOG", "warn,mcp_resume_proxy::app=info")
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()?;
    Ok(Proc {
        child,
        group: false,
    })
}

/// Polls `/readyz` every 5 ms until it answers 200.
async fn wait_ready(admin: SocketAddr, limit: Duration) -> Res<()> {
    let t0 = Instant::now();
    loop {
        if let Ok((200, _)) = http_get(admin, "/readyz").await {
            return Ok(());
        }
        if t0.elapsed() > limit {
            return Err(format!("proxy not ready on {admin} after {limit:?}").into());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

async fn start_proxy(
    ctx: &Ctx,
    name: &str,
    durability: &str,
    redis: Option<SocketAddr>,
) -> Res<ProxyProc> {
    let dir = ctx.args.work.join(name);
    let _ = std::fs::remove_dir_all(&dir);
    let (config, addr, admin) = write_proxy_config(ctx, &dir, durability, redis)?;
    let log = dir.join("proxy.log");
    let proc = spawn_proxy(ctx, &config, &log)?;
    wait_ready(admin, Duration::from_secs(120)).await?;
    Ok(ProxyProc {
        proc,
        addr,
        admin,
        config,
        log,
    })
}

fn write_nginx_config(dir: &Path, listen: SocketAddr, upstream: SocketAddr) -> Res<PathBuf> {
    std::fs::create_dir_all(dir.join("tmp"))?;
    let d = dir.display();
    let conf = format!(
        r#"# Plain SSE pass-through, generated by examples/loadgen.rs.
worker_processes auto;
worker_rlimit_nofile 20000;
daemon off;
pid {d}/nginx.pid;
error_log {d}/error.log warn;
events {{ worker_connections 8192; }}
http {{
    access_log off;
    client_body_temp_path {d}/tmp/body;
    proxy_temp_path {d}/tmp/proxy;
    fastcgi_temp_path {d}/tmp/fastcgi;
    uwsgi_temp_path {d}/tmp/uwsgi;
    scgi_temp_path {d}/tmp/scgi;
    upstream mcp {{
        server {upstream};
        keepalive 64;
    }}
    server {{
        listen {listen};
        location / {{
            proxy_pass http://mcp;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_cache off;
            proxy_request_buffering off;
            proxy_read_timeout 1h;
            proxy_send_timeout 1h;
        }}
    }}
}}
"#
    );
    let path = dir.join("nginx.conf");
    std::fs::write(&path, conf)?;
    Ok(path)
}

async fn start_target(ctx: &Ctx, mode: Mode) -> Res<Option<Target>> {
    Ok(Some(match mode {
        Mode::Direct => Target {
            mode,
            addr: ctx.upstream,
            pids: Vec::new(),
            proc: None,
            admin: None,
            redis: None,
            redis_addr: None,
        },
        Mode::Nginx => {
            let Some(nginx) = &ctx.args.nginx else {
                return Ok(None);
            };
            let dir = ctx.args.work.join("nginx");
            let addr = loopback(port());
            let conf = write_nginx_config(&dir, addr, ctx.upstream)?;
            let child = Command::new(nginx)
                .arg("-p")
                .arg(&dir)
                .arg("-c")
                .arg(&conf)
                .arg("-e")
                .arg(dir.join("error.log"))
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .process_group(0)
                .spawn()?;
            let proc = Proc { child, group: true };
            wait_port(addr).await?;
            tokio::time::sleep(Duration::from_millis(200)).await;
            let pids = family(proc.pid());
            Target {
                mode,
                addr,
                pids,
                proc: Some(proc),
                admin: None,
                redis: None,
                redis_addr: None,
            }
        }
        Mode::Fsync | Mode::Relaxed => {
            let d = if mode == Mode::Fsync {
                "fsync"
            } else {
                "relaxed"
            };
            let p = start_proxy(ctx, &format!("tp-{d}"), d, None).await?;
            Target {
                mode,
                addr: p.addr,
                pids: vec![p.proc.pid()],
                admin: Some(p.admin),
                proc: Some(p.proc),
                redis: None,
                redis_addr: None,
            }
        }
        Mode::RedisFsync | Mode::RedisRelaxed => {
            let Some(bin) = &ctx.args.redis_server else {
                return Ok(None);
            };
            let (d, aof) = if mode == Mode::RedisFsync {
                ("fsync", "always")
            } else {
                ("relaxed", "everysec")
            };
            let name = format!("tp-redis-{d}");
            let dir = ctx.args.work.join(&name).join("redis");
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir)?;
            let raddr = loopback(port());
            let child = Command::new(bin)
                .args(["--bind", "127.0.0.1", "--port", &raddr.port().to_string()])
                .arg("--dir")
                .arg(&dir)
                .args(["--save", "", "--appendonly", "yes", "--appendfsync", aof])
                .args(["--daemonize", "no", "--loglevel", "warning"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()?;
            let redis = Proc {
                child,
                group: false,
            };
            wait_port(raddr).await?;
            let p = start_proxy(ctx, &name, d, Some(raddr)).await?;
            Target {
                mode,
                addr: p.addr,
                // The hop's cost is the proxy's and its Redis's.
                pids: vec![p.proc.pid(), redis.pid()],
                admin: Some(p.admin),
                proc: Some(p.proc),
                redis: Some(redis),
                redis_addr: Some(raddr),
            }
        }
    }))
}

/// `INFO commandstats` of the redis-server at `addr`: (command, calls), since it started.
async fn redis_commandstats(addr: SocketAddr) -> Res<Vec<(String, u64)>> {
    let client = redis::Client::open(format!("redis://{addr}"))?;
    let mut c = client.get_multiplexed_async_connection().await?;
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut c)
        .await?;
    // `cmdstat_xadd:calls=12,usec=...`
    Ok(info
        .lines()
        .filter_map(|l| {
            let (name, rest) = l.strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = rest
                .strip_prefix("calls=")?
                .split(',')
                .next()?
                .parse()
                .ok()?;
            Some((name.to_string(), calls))
        })
        .collect())
}

/// Opens `n` sessions on `addr`: (stream, message path).
async fn open_sessions(addr: SocketAddr, n: usize) -> Res<Vec<(Sse, String)>> {
    let sem = Arc::new(Semaphore::new(OPEN_CONCURRENCY));
    let mut set = JoinSet::new();
    for _ in 0..n {
        let sem = sem.clone();
        set.spawn(async move {
            let _permit = sem.acquire_owned().await.expect("open semaphore");
            let mut sse = Sse::open(addr, "/sse", None).await?;
            let path = sse.endpoint().await?;
            Res::Ok((sse, path))
        });
    }
    let mut out = Vec::with_capacity(n);
    while let Some(r) = set.join_next().await {
        out.push(r??);
    }
    Ok(out)
}

// === phases ===

struct TpRow {
    mode: Mode,
    events: u64,
    secs: f64,
    cpu_hop: Option<f64>,
    /// Of `cpu_hop`, the redis-server's share (redis paths).
    cpu_redis: Option<f64>,
    cpu_up: f64,
    gaps: u64,
    dups: u64,
}

struct LatRow {
    mode: Mode,
    /// Proxy only: bucket bounds (s) of the log append time (upstream receipt -> durable), p50/p99.
    append: Option<(f64, f64)>,
    p50: u64,
    p99: u64,
    p999: u64,
    max: u64,
    n: usize,
    gaps: u64,
    dups: u64,
}

async fn throughput(ctx: &Ctx, t: &Target) -> Res<TpRow> {
    let a = &ctx.args;
    let sessions = open_sessions(t.addr, a.tp_sessions).await?;
    let (cpu0, up0) = (ctx.cpu(&t.pids), cpu_secs(ctx.upstream_pid, ctx.tck));
    let redis0 = t.redis.as_ref().map(|r| cpu_secs(r.pid(), ctx.tck));
    let t0 = Instant::now();
    let mut set = JoinSet::new();
    for (i, (mut sse, path)) in sessions.into_iter().enumerate() {
        let (posts, addr, want, pad) = (ctx.posts.clone(), t.addr, a.tp_events, a.pad);
        set.spawn(async move {
            post(&posts, addr, &path, emit_call(i as u64 + 1, want, 0, pad)).await?;
            consume(&mut sse, want, None, false).await
        });
    }
    let mut row = TpRow {
        mode: t.mode,
        events: 0,
        secs: 0.0,
        cpu_hop: None,
        cpu_redis: None,
        cpu_up: 0.0,
        gaps: 0,
        dups: 0,
    };
    let mut last = t0;
    while let Some(r) = set.join_next().await {
        let r = r??;
        row.events += r.events;
        row.gaps += r.gaps;
        row.dups += r.dups;
        last = last.max(r.done_at.unwrap_or(last));
    }
    row.secs = (last - t0).as_secs_f64();
    if !t.pids.is_empty() {
        row.cpu_hop = Some(ctx.cpu(&t.pids) - cpu0);
    }
    if let (Some(r), Some(c0)) = (&t.redis, redis0) {
        row.cpu_redis = Some(cpu_secs(r.pid(), ctx.tck) - c0);
    }
    row.cpu_up = cpu_secs(ctx.upstream_pid, ctx.tck) - up0;
    Ok(row)
}

async fn latency(ctx: &Ctx, t: &Target) -> Res<LatRow> {
    let a = &ctx.args;
    let n = a.lat_sessions.max(1);
    let per_session_rate = (a.lat_rate / n as u64).max(1);
    let count = per_session_rate * a.lat_secs;
    let sessions = open_sessions(t.addr, n).await?;
    let hist_before = match t.admin {
        Some(a) => Some(append_histogram(a).await?),
        None => None,
    };
    let mut set = JoinSet::new();
    // Stagger the starts across one inter-event gap so the aggregate is smooth, not 50-event bursts.
    let gap_ns = 1_000_000_000 / per_session_rate;
    for (i, (mut sse, path)) in sessions.into_iter().enumerate() {
        let (posts, addr, pad) = (ctx.posts.clone(), t.addr, a.pad);
        let delay = Duration::from_nanos(gap_ns * i as u64 / n as u64);
        set.spawn(async move {
            tokio::time::sleep(delay).await;
            post(
                &posts,
                addr,
                &path,
                emit_call(i as u64 + 1, count, per_session_rate, pad),
            )
            .await?;
            consume(&mut sse, count, None, true).await
        });
    }
    let mut all = Vec::with_capacity((count * n as u64) as usize);
    let (mut gaps, mut dups) = (0, 0);
    while let Some(r) = set.join_next().await {
        let r = r??;
        all.extend_from_slice(&r.lat_ns);
        gaps += r.gaps;
        dups += r.dups;
    }
    all.sort_unstable();
    let append = match (t.admin, hist_before) {
        (Some(a), Some(before)) => {
            let after = append_histogram(a).await?;
            histogram_quantile(&before, &after, 0.5).zip(histogram_quantile(&before, &after, 0.99))
        }
        _ => None,
    };
    Ok(LatRow {
        mode: t.mode,
        append,
        p50: percentile(&all, 0.50),
        p99: percentile(&all, 0.99),
        p999: percentile(&all, 0.999),
        max: all.last().copied().unwrap_or(0),
        n: all.len(),
        gaps,
        dups,
    })
}

struct RssRow {
    sessions: usize,
    base_kib: u64,
    idle_kib: u64,
    active_kib: u64,
    open_secs: f64,
    active_secs: f64,
}

async fn rss(ctx: &Ctx, n: usize) -> Res<RssRow> {
    let p = start_proxy(ctx, &format!("rss-{n}"), "fsync", None).await?;
    let pid = p.proc.pid();
    let mut held = open_sessions(p.addr, RSS_WARM_SESSIONS).await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let base_kib = rss_kib(pid);
    let t0 = Instant::now();
    held.extend(open_sessions(p.addr, n.saturating_sub(RSS_WARM_SESSIONS)).await?);
    let open_secs = t0.elapsed().as_secs_f64();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let idle_kib = rss_kib(pid);

    // Active: every session receives `active_events` events (at most OPEN_CONCURRENCY sessions
    // emitting at once) and keeps its client stream attached.
    let t1 = Instant::now();
    let sem = Arc::new(Semaphore::new(OPEN_CONCURRENCY));
    let mut set = JoinSet::new();
    for (i, (mut sse, path)) in held.into_iter().enumerate() {
        let (posts, addr, want, pad, sem) = (
            ctx.posts.clone(),
            p.addr,
            ctx.args.active_events,
            ctx.args.pad,
            sem.clone(),
        );
        set.spawn(async move {
            let permit = sem.acquire_owned().await.expect("semaphore");
            post(&posts, addr, &path, emit_call(i as u64 + 1, want, 0, pad)).await?;
            consume(&mut sse, want, None, false).await?;
            drop(permit);
            Res::Ok(sse)
        });
    }
    let mut still_held = Vec::with_capacity(n);
    while let Some(r) = set.join_next().await {
        still_held.push(r??);
    }
    let active_secs = t1.elapsed().as_secs_f64();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let active_kib = rss_kib(pid);
    drop(p); // SIGKILL: an orderly end of thousands of sessions is not what this measures
    drop(still_held);
    Ok(RssRow {
        sessions: n,
        base_kib,
        idle_kib,
        active_kib,
        open_secs,
        active_secs,
    })
}

struct ReplayRow {
    /// CPU seconds the proxy spent while serving the replay.
    proxy_cpu_secs: f64,
    events: u64,
    ingest_secs: f64,
    replay_secs: f64,
    first_byte_ms: f64,
    gaps: u64,
    dups: u64,
}

struct RestartRow {
    events: u64,
    fill_secs: f64,
    data_mib: f64,
    kill_restart_secs: f64,
    /// After SIGKILL with the page cache dropped (`None`: not permitted).
    kill_cold_restart_secs: Option<f64>,
    clean_stop_secs: f64,
    clean_restart_secs: f64,
}

/// One session gets `replay_events` events while its client is away, then resumes.
async fn replay(ctx: &Ctx, p: &ProxyProc) -> Res<ReplayRow> {
    let r = ctx.args.replay_events;
    let mut sse = Sse::open(p.addr, "/sse", None).await?;
    let path = sse.endpoint().await?;
    post(&ctx.posts, p.addr, &path, emit_call(1, 1, 0, ctx.args.pad)).await?;
    let first = consume(&mut sse, 1, None, false).await?;
    let cursor = first.last_id.clone().ok_or("the proxy sent no event id")?;
    drop(sse); // the client goes away
    let before = logged_total(p.admin).await?;
    let t0 = Instant::now();
    post(&ctx.posts, p.addr, &path, emit_call(2, r, 0, ctx.args.pad)).await?;
    // r events and the tool's response.
    wait_logged(p.admin, before + r + 1, STEP_TIMEOUT).await?;
    let ingest_secs = t0.elapsed().as_secs_f64();

    let cpu0 = cpu_secs(p.proc.pid(), ctx.tck);
    let t1 = Instant::now();
    let mut sse = Sse::open(p.addr, "/sse", Some(&cursor)).await?;
    sse.endpoint().await?;
    let first_byte_ms = t1.elapsed().as_secs_f64() * 1e3;
    let got = consume(&mut sse, r, Some(first.last_seq), false).await?;
    let replay_secs = t1.elapsed().as_secs_f64();
    let proxy_cpu_secs = cpu_secs(p.proc.pid(), ctx.tck) - cpu0;
    Ok(ReplayRow {
        proxy_cpu_secs,
        events: got.events,
        ingest_secs,
        replay_secs,
        first_byte_ms,
        gaps: got.gaps,
        dups: got.dups,
    })
}

/// Fills the proxy's data dir to `restart_events` events, then times restarts.
async fn restart(ctx: &Ctx, p: ProxyProc) -> Res<RestartRow> {
    let a = &ctx.args;
    let have = logged_total(p.admin).await?;
    let need = a.restart_events.saturating_sub(have);
    let n = a.restart_sessions.max(1);
    let per = need.div_ceil(n);
    let t0 = Instant::now();
    let sessions = open_sessions(p.addr, n as usize).await?;
    for (i, (sse, path)) in sessions.into_iter().enumerate() {
        drop(sse); // no client attached: the proxy keeps the session and logs everything
        post(
            &ctx.posts,
            p.addr,
            &path,
            emit_call(i as u64 + 10, per, 0, a.pad),
        )
        .await?;
    }
    // per * n events plus one response per session.
    wait_logged(p.admin, have + per * n + n, Duration::from_secs(300)).await?;
    let fill_secs = t0.elapsed().as_secs_f64();
    let events = logged_total(p.admin).await?;
    let data_dir = p.config.parent().expect("dir").join("data");
    let ProxyProc {
        proc,
        admin,
        config,
        log,
        ..
    } = p;
    drop(proc); // SIGKILL
    let data_mib = du_mib(&data_dir);

    let t1 = Instant::now();
    let proc = spawn_proxy(ctx, &config, &log)?;
    wait_ready(admin, Duration::from_secs(120)).await?;
    let kill_restart_secs = t1.elapsed().as_secs_f64();

    // Once more after SIGKILL, with the page cache dropped: a pod restarted on another node, or
    // after the kernel evicted the log (and the writer's own trim of the page cache, which keeps
    // only the newest pages: the warm figure above is not all warm). Needs root.
    drop(proc);
    let kill_cold_restart_secs = if drop_page_cache() {
        let t = Instant::now();
        let proc = spawn_proxy(ctx, &config, &log)?;
        wait_ready(admin, Duration::from_secs(120)).await?;
        let secs = t.elapsed().as_secs_f64();
        drop(proc);
        Some(secs)
    } else {
        None
    };
    let proc = spawn_proxy(ctx, &config, &log)?;
    wait_ready(admin, Duration::from_secs(120)).await?;

    // Recovery ended the live sessions; a clean stop now marks the log clean.
    let clean_stop_secs = proc.terminate(Duration::from_secs(60)).as_secs_f64();
    let t2 = Instant::now();
    let proc = spawn_proxy(ctx, &config, &log)?;
    wait_ready(admin, Duration::from_secs(120)).await?;
    let clean_restart_secs = t2.elapsed().as_secs_f64();
    drop(proc);
    Ok(RestartRow {
        events,
        fill_secs,
        data_mib,
        kill_restart_secs,
        kill_cold_restart_secs,
        clean_stop_secs,
        clean_restart_secs,
    })
}

/// Writes dirty pages back and drops the page cache (`/proc/sys/vm/drop_caches`); false when
/// that is not permitted (not root).
fn drop_page_cache() -> bool {
    let synced = std::process::Command::new("sync")
        .status()
        .is_ok_and(|s| s.success());
    synced && std::fs::write("/proc/sys/vm/drop_caches", "3\n").is_ok()
}

// === the run ===

fn verdict(ok: bool) -> &'static str {
    if ok {
        "met"
    } else {
        "MISSED"
    }
}

async fn run(args: Args) -> Res<()> {
    let phases = args.phases.clone();
    let want = |p: &str| phases == "all" || phases.split(',').any(|x| x.trim() == p);
    let modes: Vec<Mode> = args
        .targets
        .split(',')
        .filter_map(|t| match t.trim() {
            "direct" => Some(Mode::Direct),
            "nginx" => Some(Mode::Nginx),
            "fsync" => Some(Mode::Fsync),
            "relaxed" => Some(Mode::Relaxed),
            "redis-fsync" => Some(Mode::RedisFsync),
            "redis-relaxed" => Some(Mode::RedisRelaxed),
            _ => None,
        })
        .collect();
    std::fs::create_dir_all(&args.work)?;

    let up_addr = loopback(port());
    let up_log = std::fs::File::create(args.work.join("upstream.log"))?;
    let upstream = Proc {
        group: false,
        child: Command::new(&args.proxy_bin)
            .args(["demo-upstream", "--at", &up_addr.to_string()])
            .env("MCP_RESUME_PROXY_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(up_log)
            .spawn()?,
    };
    wait_port(up_addr).await?;
    let mut ctx = Ctx {
        upstream: up_addr,
        upstream_pid: upstream.pid(),
        tck: clock_ticks(),
        posts: post_client(),
        report: String::new(),
        args,
    };
    let a = ctx.args.clone();
    ctx.line(format!(
        "upstream: demo-upstream (separate process) on {up_addr}; payload ≈ {} bytes per event (pad {})",
        130 + a.pad,
        a.pad
    ));

    let mut tp: Vec<TpRow> = Vec::new();
    let mut lat: Vec<LatRow> = Vec::new();
    if want("throughput") || want("latency") {
        for &mode in &modes {
            // Start each path with no dirty pages left by the previous one.
            let _ = Command::new("sync").status();
            ctx.line(format!(
                "load average before {}: {}",
                mode.name(),
                loadavg()
            ));
            let Some(t) = start_target(&ctx, mode).await? else {
                ctx.line(format!("{}: skipped (no binary for it)", mode.name()));
                continue;
            };
            // Latency first, on a fresh proxy: a throughput run before it would leave the disk
            // with dirty pages that every later fsync has to wait for.
            if want("latency") {
                let r = latency(&ctx, &t).await?;
                ctx.line(format!(
                    "latency    {:<14} p50 {:.3} ms  p99 {:.3} ms  p999 {:.3} ms  max {:.3} ms ({} events; gaps {} dups {})",
                    mode.name(), ms(r.p50), ms(r.p99), ms(r.p999), ms(r.max), r.n, r.gaps, r.dups
                ));
                if let Some((p50, p99)) = r.append {
                    ctx.line(format!(
                        "           {:<14} of which log append (receipt -> durable): p50 <= {} ms, p99 <= {} ms (histogram buckets)",
                        mode.name(), p50 * 1e3, p99 * 1e3
                    ));
                }
                lat.push(r);
            }
            if want("throughput") {
                let stats0 = match t.redis_addr {
                    Some(addr) => redis_commandstats(addr).await.ok(),
                    None => None,
                };
                let r = throughput(&ctx, &t).await?;
                ctx.line(format!(
                    "throughput {:<14} {:>9.0} events/s ({} events in {:.2} s; gaps {} dups {})",
                    mode.name(),
                    r.events as f64 / r.secs,
                    r.events,
                    r.secs,
                    r.gaps,
                    r.dups
                ));
                if let (Some(addr), Some(stats0)) = (t.redis_addr, stats0) {
                    if let Ok(stats) = redis_commandstats(addr).await {
                        // Calls during the throughput phase only.
                        let calls = |c: &str| {
                            let of = |s: &[(String, u64)]| {
                                s.iter().find(|(n, _)| n == c).map_or(0, |x| x.1)
                            };
                            of(&stats).saturating_sub(of(&stats0))
                        };
                        let scripts = calls("evalsha") + calls("eval");
                        ctx.line(format!(
                            "           {:<14} redis commands: {} scripts, {} XADD ({:.1} events per script)",
                            mode.name(),
                            scripts,
                            calls("xadd"),
                            r.events as f64 / scripts.max(1) as f64
                        ));
                        let mut all: Vec<(String, u64)> = stats
                            .iter()
                            .map(|(n, _)| (n.clone(), calls(n)))
                            .filter(|(_, c)| *c > 0)
                            .collect();
                        all.sort_by_key(|c| std::cmp::Reverse(c.1));
                        let all: Vec<String> =
                            all.iter().map(|(n, c)| format!("{n} {c}")).collect();
                        ctx.line(format!(
                            "           {:<14} all redis calls: {}",
                            mode.name(),
                            all.join(", ")
                        ));
                    }
                }
                if let (Some(hop), Some(redis)) = (r.cpu_hop, r.cpu_redis) {
                    let mev = r.events as f64 / 1e6;
                    ctx.line(format!(
                        "           {:<14} cpu per million events: proxy {:.2} s, redis-server {:.2} s",
                        mode.name(),
                        (hop - redis) / mev,
                        redis / mev
                    ));
                }
                tp.push(r);
            }
            if let Some(admin) = t.admin {
                if let Ok(n) = logged_total(admin).await {
                    ctx.line(format!("           {:<14} events logged: {n}", mode.name()));
                }
            }
            if let Some(p) = t.proc {
                // SIGTERM: the proxy ends its sessions (and a profiler wrapping it writes its
                // output); nginx just stops.
                p.terminate(Duration::from_secs(30));
            }
            if let Some(r) = t.redis {
                r.terminate(Duration::from_secs(10));
            }
            // Let the upstream forget the sessions of this target before the next one.
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    let mut rss_rows = Vec::new();
    if want("rss") {
        ctx.line(format!("load average before rss: {}", loadavg()));
        for n in a
            .rss_sessions
            .split(',')
            .filter_map(|s| s.trim().parse().ok())
        {
            let r = rss(&ctx, n).await?;
            ctx.line(format!(
                "rss {:>5} sessions: base {} KiB, idle {} KiB, active {} KiB (opened in {:.1} s, {} events each in {:.1} s)",
                r.sessions, r.base_kib, r.idle_kib, r.active_kib, r.open_secs, a.active_events, r.active_secs
            ));
            rss_rows.push(r);
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }

    let mut replay_row = None;
    let mut restart_row = None;
    if want("replay") || want("restart") {
        ctx.line(format!("load average before replay/restart: {}", loadavg()));
        let p = start_proxy(&ctx, "replay-restart", "fsync", None).await?;
        if want("replay") {
            let r = replay(&ctx, &p).await?;
            ctx.line(format!(
                "replay {} events: ingest (no client) {:.2} s = {:.0} events/s; resume first byte {:.1} ms; replay {:.3} s = {:.0} events/s, proxy CPU {:.2} s = {:.1} us/event (gaps {} dups {})",
                r.events, r.ingest_secs, r.events as f64 / r.ingest_secs, r.first_byte_ms,
                r.replay_secs, r.events as f64 / r.replay_secs, r.proxy_cpu_secs,
                r.proxy_cpu_secs * 1e6 / r.events as f64, r.gaps, r.dups
            ));
            replay_row = Some(r);
        }
        if want("restart") {
            let r = restart(&ctx, p).await?;
            ctx.line(format!(
                "restart on {} events ({:.0} MiB data dir, filled in {:.1} s): after SIGKILL {:.2} s to /readyz 200; clean stop {:.2} s; after clean stop {:.2} s",
                r.events, r.data_mib, r.fill_secs, r.kill_restart_secs, r.clean_stop_secs, r.clean_restart_secs
            ));
            ctx.line(match r.kill_cold_restart_secs {
                Some(s) => format!("restart after SIGKILL with the page cache dropped: {s:.2} s to /readyz 200"),
                None => "restart after SIGKILL with the page cache dropped: not measured (dropping the page cache needs root)".to_string(),
            });
            restart_row = Some(r);
        }
    }
    drop(upstream);
    ctx.line(format!("load average at the end: {}", loadavg()));

    summary(
        &mut ctx,
        &tp,
        &lat,
        &rss_rows,
        replay_row.as_ref(),
        restart_row.as_ref(),
    );
    Ok(())
}

fn summary(
    ctx: &mut Ctx,
    tp: &[TpRow],
    lat: &[LatRow],
    rss: &[RssRow],
    replay: Option<&ReplayRow>,
    restart: Option<&RestartRow>,
) {
    let a = ctx.args.clone();
    let mut out = String::new();
    let _ = writeln!(out, "\n== results");
    if !tp.is_empty() {
        let _ = writeln!(
            out,
            "\nthroughput: {} sessions x {} events, unpaced, pad {} B",
            a.tp_sessions, a.tp_events, a.pad
        );
        let _ = writeln!(
            out,
            "{:<14} {:>10} {:>9} {:>16} {:>16} {:>5} {:>5}",
            "path", "events/s", "x nginx", "hop cpu s/Mev", "upstr cpu s/Mev", "gaps", "dups"
        );
        let nginx = tp
            .iter()
            .find(|r| r.mode == Mode::Nginx)
            .map(|r| r.events as f64 / r.secs);
        for r in tp {
            let rate = r.events as f64 / r.secs;
            let mev = r.events as f64 / 1e6;
            let _ = writeln!(
                out,
                "{:<14} {:>10.0} {:>9} {:>16} {:>16.2} {:>5} {:>5}",
                r.mode.name(),
                rate,
                nginx.map_or("-".into(), |n| format!("{:.2}", rate / n)),
                r.cpu_hop.map_or("-".into(), |c| format!("{:.2}", c / mev)),
                r.cpu_up / mev,
                r.gaps,
                r.dups
            );
        }
    }
    if !lat.is_empty() {
        let _ = writeln!(
            out,
            "\nlatency (upstream emit -> client receipt): {} sessions, {} events/s aggregate, {} s",
            a.lat_sessions, a.lat_rate, a.lat_secs
        );
        let _ = writeln!(
            out,
            "{:<14} {:>9} {:>9} {:>9} {:>9} | {:>11} {:>11} {:>11}",
            "path", "p50 ms", "p99 ms", "p999 ms", "max ms", "added p50", "added p99", "added p999"
        );
        let direct = lat.iter().find(|r| r.mode == Mode::Direct);
        for r in lat {
            let added = |f: fn(&LatRow) -> u64| {
                direct.map_or("-".into(), |d| {
                    format!("{:.3}", (f(r) as f64 - f(d) as f64) / 1e6)
                })
            };
            let _ = writeln!(
                out,
                "{:<14} {:>9.3} {:>9.3} {:>9.3} {:>9.3} | {:>11} {:>11} {:>11}",
                r.mode.name(),
                ms(r.p50),
                ms(r.p99),
                ms(r.p999),
                ms(r.max),
                added(|r| r.p50),
                added(|r| r.p99),
                added(|r| r.p999)
            );
        }
    }
    if !rss.is_empty() {
        let _ = writeln!(
            out,
            "\nRSS of the proxy (fsync), per session over a {}-session baseline; active = each session received {} events (full in-memory window), clients attached",
            RSS_WARM_SESSIONS, a.active_events
        );
        let _ = writeln!(
            out,
            "{:>8} {:>10} {:>10} {:>12} {:>14} {:>16}",
            "sessions", "base MiB", "idle MiB", "active MiB", "KiB/idle sess", "KiB/active sess"
        );
        for r in rss {
            let n = (r.sessions - RSS_WARM_SESSIONS.min(r.sessions)).max(1) as f64;
            let _ = writeln!(
                out,
                "{:>8} {:>10.1} {:>10.1} {:>12.1} {:>14.1} {:>16.1}",
                r.sessions,
                r.base_kib as f64 / 1024.0,
                r.idle_kib as f64 / 1024.0,
                r.active_kib as f64 / 1024.0,
                (r.idle_kib as f64 - r.base_kib as f64) / n,
                (r.active_kib as f64 - r.base_kib as f64) / n
            );
        }
    }
    let _ = writeln!(out, "\ntargets (ratios from this run)");
    let rate_of = |m: Mode| {
        tp.iter()
            .find(|r| r.mode == m)
            .map(|r| r.events as f64 / r.secs)
    };
    if let (Some(n), Some(f), Some(r)) = (
        rate_of(Mode::Nginx),
        rate_of(Mode::Fsync),
        rate_of(Mode::Relaxed),
    ) {
        let _ = writeln!(
            out,
            "  throughput fsync   >= 0.5 x nginx : {:.2} x  {}",
            f / n,
            verdict(f / n >= 0.5)
        );
        let _ = writeln!(
            out,
            "  throughput relaxed >= 0.8 x nginx : {:.2} x  {}",
            r / n,
            verdict(r / n >= 0.8)
        );
    }
    if let (Some(d), Some(f)) = (
        lat.iter().find(|r| r.mode == Mode::Direct),
        lat.iter().find(|r| r.mode == Mode::Fsync),
    ) {
        let added = (f.p99 as f64 - d.p99 as f64) / 1e6;
        let _ = writeln!(
            out,
            "  added p99 (fsync, {} ev/s) <= 5 ms : {:.3} ms  {}",
            a.lat_rate,
            added,
            verdict(added <= 5.0)
        );
    }
    for (redis, local, name) in [
        (Mode::RedisFsync, Mode::Fsync, "fsync  "),
        (Mode::RedisRelaxed, Mode::Relaxed, "relaxed"),
    ] {
        if let (Some(r), Some(l)) = (rate_of(redis), rate_of(local)) {
            let _ = writeln!(
                out,
                "  redis {name} >= 0.5 x local {name}: {:.2} x  {}",
                r / l,
                verdict(r / l >= 0.5)
            );
        }
    }
    if let (Some(d), Some(f)) = (
        lat.iter().find(|r| r.mode == Mode::Direct),
        lat.iter().find(|r| r.mode == Mode::RedisFsync),
    ) {
        let added = (f.p99 as f64 - d.p99 as f64) / 1e6;
        let _ = writeln!(
            out,
            "  added p99 (redis-fsync, AOF always, {} ev/s) <= 10 ms : {:.3} ms  {}",
            a.lat_rate,
            added,
            verdict(added <= 10.0)
        );
    }
    if let Some(r) = replay {
        let rate = r.events as f64 / r.replay_secs;
        let _ = writeln!(
            out,
            "  replay of {} >= 200k events/s   : {:.0} events/s  {}",
            r.events,
            rate,
            verdict(rate >= 200_000.0)
        );
    }
    for r in rss {
        let n = (r.sessions - RSS_WARM_SESSIONS.min(r.sessions)).max(1) as f64;
        let per = (r.idle_kib as f64 - r.base_kib as f64) / n;
        let _ = writeln!(
            out,
            "  RSS per idle session @{:<5} <= 64 KiB: {:.1} KiB  {}",
            r.sessions,
            per,
            verdict(per <= 64.0)
        );
    }
    if let Some(r) = restart {
        let _ = writeln!(
            out,
            "  restart on {} events <= 3 s  : {:.2} s after SIGKILL  {}",
            r.events,
            r.kill_restart_secs,
            verdict(r.kill_restart_secs <= 3.0)
        );
    }
    ctx.line(out);
}
