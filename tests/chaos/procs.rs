//! The processes under test: the proxy binary and the demo upstream (the same binary's
//! `demo-upstream` subcommand), each on a fixed loopback port so restarts keep the address.

use std::fs::OpenOptions;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Duration;

use tokio::time::Instant;

use super::wire;

/// The proxy's durability mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
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

/// Settings of the proxy under test.
#[derive(Clone, Debug)]
pub struct ProxySettings {
    /// Client port.
    pub port: u16,
    /// Admin port.
    pub admin: u16,
    /// Upstream port.
    pub upstream: u16,
    /// Data dir.
    pub dir: PathBuf,
    /// `log.max_events_per_session`.
    pub max_events: u64,
    /// `sessions.idle_ttl_secs`.
    pub idle_ttl_secs: u64,
    /// `shutdown.grace_secs`.
    pub grace_secs: u64,
    /// `tasks.ttl_secs`.
    pub task_ttl_secs: u64,
}

/// A child process with its stderr appended to a file.
pub struct Proc {
    child: Option<Child>,
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
    /// No process (yet).
    pub fn none() -> Proc {
        Proc { child: None }
    }

    /// Starts the demo upstream on `port`.
    pub fn upstream(bin: &Path, port: u16, log: &Path) -> Proc {
        let child = Command::new(bin)
            .args(["demo-upstream", "--at", &format!("127.0.0.1:{port}")])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr_to(log))
            .env("MCP_RESUME_PROXY_LOG", "warn")
            .spawn()
            .expect("start demo upstream");
        Proc { child: Some(child) }
    }

    /// Writes the proxy config for `mode` and starts the proxy binary.
    pub fn proxy(bin: &Path, s: &ProxySettings, mode: Mode, log: &Path) -> Proc {
        let cfg = s.dir.with_extension("toml");
        let text = format!(
            "[listen]\naddr = \"127.0.0.1:{}\"\n\
             [admin]\naddr = \"127.0.0.1:{}\"\n\
             [upstream]\nsse_url = \"http://127.0.0.1:{}/sse\"\npost_timeout_secs = 10\nconnect_timeout_secs = 5\n\
             [log]\ndir = \"{}\"\ndurability = \"{}\"\nmax_events_per_session = {}\n\
             [sessions]\nidle_ttl_secs = {}\nretain_ended_secs = 7200\nkeepalive_secs = 1\n\
             [shutdown]\ngrace_secs = {}\n\
             [tasks]\nmode = \"after\"\nafter_ms = {}\nttl_secs = {}\npoll_interval_ms = {}\n",
            s.port,
            s.admin,
            s.upstream,
            s.dir.display(),
            mode.as_str(),
            s.max_events,
            s.idle_ttl_secs,
            s.grace_secs,
            super::modern::TASK_AFTER_MS,
            s.task_ttl_secs,
            super::modern::TASK_POLL_MS,
        );
        std::fs::write(&cfg, text).expect("write proxy config");
        let child = Command::new(bin)
            .args(["run", "--config"])
            .arg(&cfg)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr_to(log))
            .env("MCP_RESUME_PROXY_LOG", "warn")
            .spawn()
            .expect("start proxy");
        Proc { child: Some(child) }
    }

    /// SIGKILL and reap.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Sends SIGTERM and waits up to `bound` for the exit; SIGKILLs after that. Returns the exit
    /// status, or `None` when it had to be killed.
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

/// Waits until the proxy's `/readyz` answers 200 (bounded).
pub async fn wait_ready(admin: u16, bound: Duration) -> bool {
    let addr: SocketAddr = ([127, 0, 0, 1], admin).into();
    let deadline = Instant::now() + bound;
    while Instant::now() < deadline {
        if wire::get_status(addr, "/readyz").await == 200 {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

/// The last `n` lines of a log file.
pub fn tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}
