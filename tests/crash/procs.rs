//! The processes: the demo upstream (`demo-upstream`, one for the whole run) and the proxy binary
//! (`run --config FILE`) with its data dir on the filesystem under test; and `inspect`, which
//! reads the data dir while no proxy holds it.

use std::fs::OpenOptions;
use std::io::BufRead;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::wire;

/// The proxy's durability mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Mode {
    /// `durability = "fsync"`.
    Fsync,
    /// `durability = "relaxed"`.
    Relaxed,
}

impl Mode {
    /// The config value.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Fsync => "fsync",
            Mode::Relaxed => "relaxed",
        }
    }
}

/// The `[log]` bounds of an image's proxies: retention per session, and the total bound, which
/// also sizes the segments (`max_total_bytes / 32`, at least 1 MiB and at most 64 MiB).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// `log.max_events_per_session`.
    pub max_events: u64,
    /// `log.max_bytes_per_session`.
    pub max_bytes: u64,
    /// `log.max_total_bytes`.
    pub max_total: u64,
}

impl Limits {
    /// Nothing is trimmed, expired or evicted during a run (64 MiB segments): every event ever
    /// logged must still be there.
    pub const KEEP_ALL: Limits = Limits {
        max_events: 100_000_000,
        max_bytes: 1 << 30,
        max_total: 16 << 30,
    };

    /// Retention and eviction can drop events.
    pub fn trims(&self) -> bool {
        *self != Self::KEEP_ALL
    }
}

/// Ports and paths of the run.
#[derive(Clone, Debug)]
pub struct Setup {
    /// The proxy binary.
    pub bin: PathBuf,
    /// Proxy client port.
    pub port: u16,
    /// Proxy admin port.
    pub admin: u16,
    /// Upstream port.
    pub upstream: u16,
    /// The work dir (configs, process logs).
    pub work: PathBuf,
}

impl Setup {
    /// The proxy's client address.
    pub fn addr(&self) -> SocketAddr {
        ([127, 0, 0, 1], self.port).into()
    }

    /// stderr of every proxy instance, appended.
    pub fn proxy_log(&self) -> PathBuf {
        self.work.join("proxy.stderr.log")
    }
}

/// A child process, SIGKILLed on drop.
pub struct Proc {
    child: Option<Child>,
    /// Set once the proxy printed its `listening` line (only for [`Proc::proxy_watched`]).
    listening: Option<Arc<AtomicBool>>,
}

fn stderr_to(path: &Path) -> Stdio {
    OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map(Stdio::from)
        .unwrap_or_else(|_| Stdio::null())
}

impl Proc {
    /// Starts the demo upstream.
    pub fn upstream(s: &Setup) -> Proc {
        let child = Command::new(&s.bin)
            .args([
                "demo-upstream",
                "--at",
                &format!("127.0.0.1:{}", s.upstream),
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr_to(&s.work.join("upstream.stderr.log")))
            .env("MCP_RESUME_PROXY_LOG", "warn")
            .spawn()
            .expect("start the demo upstream");
        Proc {
            child: Some(child),
            listening: None,
        }
    }

    /// Writes the config for `mode` and `limits` with the log in `data` and starts the proxy. The
    /// janitor is out of the way (nothing idles out or expires during a run); with
    /// [`Limits::KEEP_ALL`] nothing is trimmed or evicted either.
    pub fn proxy(s: &Setup, data: &Path, mode: Mode, limits: Limits) -> Proc {
        Self::start_proxy(s, data, mode, limits, false)
    }

    /// [`Proc::proxy`], with its stdout read so that [`Proc::listening`] tells when it printed
    /// `mcp-resume-proxy listening on …` (recovery is over, it accepts clients).
    pub fn proxy_watched(s: &Setup, data: &Path, mode: Mode, limits: Limits) -> Proc {
        Self::start_proxy(s, data, mode, limits, true)
    }

    fn start_proxy(s: &Setup, data: &Path, mode: Mode, limits: Limits, watch: bool) -> Proc {
        let cfg = s.work.join(format!("proxy-{}.toml", mode.as_str()));
        let text = format!(
            "[listen]\naddr = \"127.0.0.1:{}\"\n\
             [admin]\naddr = \"127.0.0.1:{}\"\n\
             [upstream]\nsse_url = \"http://127.0.0.1:{}/sse\"\npost_timeout_secs = 10\nconnect_timeout_secs = 5\n\
             [log]\ndir = \"{}\"\ndurability = \"{}\"\nmax_events_per_session = {}\n\
             max_bytes_per_session = {}\nmax_total_bytes = {}\n\
             [sessions]\nidle_ttl_secs = 86400\nretain_ended_secs = 864000\nkeepalive_secs = 1\n\
             [shutdown]\ngrace_secs = 5\n",
            s.port,
            s.admin,
            s.upstream,
            data.display(),
            mode.as_str(),
            limits.max_events,
            limits.max_bytes,
            limits.max_total,
        );
        std::fs::write(&cfg, text).expect("write the proxy config");
        let mut child = Command::new(&s.bin)
            .args(["run", "--config"])
            .arg(&cfg)
            .stdin(Stdio::null())
            .stdout(if watch { Stdio::piped() } else { Stdio::null() })
            .stderr(stderr_to(&s.proxy_log()))
            .env("MCP_RESUME_PROXY_LOG", "warn")
            .spawn()
            .expect("start the proxy");
        let listening = child.stdout.take().map(|out| {
            let flag = Arc::new(AtomicBool::new(false));
            let set = flag.clone();
            std::thread::spawn(move || {
                for line in std::io::BufReader::new(out).lines() {
                    let Ok(line) = line else { break };
                    if line.contains(" listening on ") {
                        set.store(true, Ordering::SeqCst);
                    }
                }
            });
            flag
        });
        Proc {
            child: Some(child),
            listening,
        }
    }

    /// Has a watched proxy printed its `listening` line?
    pub fn listening(&self) -> bool {
        self.listening
            .as_ref()
            .is_some_and(|l| l.load(Ordering::SeqCst))
    }

    /// Waits (bounded) until a watched proxy prints its `listening` line or exits. Returns
    /// whether it is listening.
    pub async fn wait_listening(&mut self, bound: Duration) -> bool {
        let deadline = Instant::now() + bound;
        while Instant::now() < deadline {
            if self.listening() {
                return true;
            }
            if self.exited().is_some() {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        false
    }

    /// SIGSTOP, and waits until every thread has stopped: the process stops where it is, and
    /// nothing it has not sent yet reaches a client. (`kill` returns before the threads stop: a
    /// thread running on the other core, or finishing a system call, goes on for a moment — long
    /// enough, measured, to see the abort's EIO, or to publish a sync that completed after it.)
    /// Returns whether all threads were seen stopped within 5 s.
    pub fn freeze(&self) -> bool {
        let Some(c) = &self.child else { return true };
        let pid = c.id();
        let _ = Command::new("kill")
            .arg("-STOP")
            .arg(pid.to_string())
            .status();
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while std::time::Instant::now() < deadline {
            if all_threads_stopped(pid) {
                return true;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        false
    }

    /// SIGKILL and reap. Returns the exit status when the process had already exited on its own
    /// (the new storage engine may exit 74 after a store failure; that is tolerated).
    pub fn kill9(&mut self) -> Option<ExitStatus> {
        let mut c = self.child.take()?;
        let before = c.try_wait().ok().flatten();
        let _ = c.kill();
        let _ = c.wait();
        before
    }

    /// SIGTERM, then wait up to `bound` for the exit (SIGKILL after that). `None` when it had to
    /// be killed.
    pub async fn sigterm(&mut self, bound: Duration) -> Option<ExitStatus> {
        let mut c = self.child.take()?;
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(c.id().to_string())
            .status();
        let deadline = Instant::now() + bound;
        loop {
            if let Ok(Some(st)) = c.try_wait() {
                return Some(st);
            }
            if Instant::now() >= deadline {
                let _ = c.kill();
                let _ = c.wait();
                return None;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Has it exited on its own?
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// Waits until something accepts on `port` (bounded).
pub async fn wait_port(port: u16, bound: Duration) -> bool {
    let deadline = Instant::now() + bound;
    while Instant::now() < deadline {
        if tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_ok()
        {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

/// Waits until the proxy's `/readyz` answers 200, or the proxy exits (bounded).
pub async fn wait_ready(admin: u16, proxy: &mut Proc, bound: Duration) -> bool {
    let addr: SocketAddr = ([127, 0, 0, 1], admin).into();
    let deadline = Instant::now() + bound;
    while Instant::now() < deadline {
        if wire::get_status(addr, "/readyz").await == 200 {
            return true;
        }
        if proxy.exited().is_some() {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

/// The value of the metric line `series` (name and labels, as exported) on the admin listener
/// at `admin`; `None` when it cannot be read or the series is not there.
pub async fn metric(admin: u16, series: &str) -> Option<f64> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let read = async {
        let mut sock = tokio::net::TcpStream::connect(("127.0.0.1", admin))
            .await
            .ok()?;
        sock.write_all(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            .await
            .ok()?;
        let mut body = Vec::new();
        sock.read_to_end(&mut body).await.ok()?;
        Some(String::from_utf8_lossy(&body).into_owned())
    };
    let text = tokio::time::timeout(Duration::from_secs(5), read)
        .await
        .ok()??;
    text.lines().find_map(|l| {
        let (name, v) = l.rsplit_once(' ')?;
        (name == series).then(|| v.parse().ok()).flatten()
    })
}

/// The last `n` lines of a log file.
pub fn tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// `inspect --data-dir DIR [SESSION]`: its stdout, or an error with its stderr.
pub fn inspect(bin: &Path, data: &Path, session: Option<&str>) -> Result<Vec<u8>, String> {
    let mut cmd = Command::new(bin);
    cmd.arg("inspect").arg("--data-dir").arg(data);
    if let Some(s) = session {
        cmd.arg(s);
    }
    let out = cmd
        .stdin(Stdio::null())
        .env("MCP_RESUME_PROXY_LOG", "warn")
        .output()
        .map_err(|e| format!("inspect could not run: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "inspect {} {}: {} ({})",
            data.display(),
            session.unwrap_or(""),
            String::from_utf8_lossy(&out.stderr).trim(),
            out.status
        ));
    }
    Ok(out.stdout)
}

/// A loopback port below 32768 that is free now (the proxy binds it itself).
pub fn port() -> u16 {
    use std::sync::atomic::{AtomicU16, Ordering};
    static NEXT: AtomicU16 = AtomicU16::new(0);
    let _ = NEXT.compare_exchange(
        0,
        21000 + (std::process::id() % 300) as u16 * 30,
        Ordering::SeqCst,
        Ordering::SeqCst,
    );
    loop {
        let p = NEXT.fetch_add(1, Ordering::SeqCst);
        let p = 21000 + (p - 21000) % 11000;
        if std::net::TcpListener::bind(("127.0.0.1", p)).is_ok() {
            return p;
        }
    }
}

/// Are all threads of `pid` stopped (state `T` or `t` in `/proc/PID/task/*/stat`)? An exited
/// process counts as stopped.
fn all_threads_stopped(pid: u32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return true;
    };
    tasks.flatten().all(|t| {
        std::fs::read_to_string(t.path().join("stat")).map_or(true, |stat| {
            // `pid (comm) S ...`: the state follows the last ')'.
            stat.rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().next())
                .is_some_and(|st| st == "T" || st == "t" || st == "Z" || st == "X")
        })
    })
}
