//! The integration tests' harness: the real peers (installed by `scripts/install-peers`), child
//! processes killed on drop, the proxy binary, an HTTP/SSE client over real loopback sockets, and
//! a TCP relay whose connections a test can sever. What only the Streamable HTTP tests use (the
//! proxy in-process, sessions driven by hand, the SDK client peers) is in [`streamable`].
//!
//! Everything runs on 127.0.0.1, on port 0 or on ports below 32768. A missing peer fails the test
//! with a message naming `scripts/install-peers`; nothing is ever skipped. SSE bodies are read
//! with the harness's own parser ([`sse::Parser`]), never with the proxy's decoder.
#![allow(dead_code)]

pub mod modern;
pub mod redis;
pub mod security;
pub mod slow_disk;
pub mod sse;
pub mod streamable;
pub mod stub_upstream;

use std::collections::VecDeque;
use std::io::BufRead;
use std::net::{SocketAddr, TcpListener as StdListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::HeaderMap;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::{TokioExecutor, TokioIo};
use mcp_resume_proxy::config::{Config, Durability};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Generous bound for anything a test waits for; a hang fails instead of blocking CI.
pub const WAIT: Duration = Duration::from_secs(30);

pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

// ---------------------------------------------------------------------------------------------
// Peers: fail (never skip) when they are not installed

pub fn peers_dir() -> PathBuf {
    repo().join("tests/peers")
}

fn require(path: PathBuf, what: &str) -> PathBuf {
    assert!(
        path.exists(),
        "test peer missing: {what} ({}) — run scripts/install-peers",
        path.display()
    );
    path
}

pub fn python() -> PathBuf {
    require(
        peers_dir().join(".venv/bin/python"),
        "Python venv with mcp==1.30.0",
    )
}

pub fn node_modules() -> PathBuf {
    require(
        peers_dir().join("node/node_modules/@modelcontextprotocol/sdk/package.json"),
        "@modelcontextprotocol/sdk in tests/peers/node/node_modules",
    );
    require(
        peers_dir().join("node/node_modules/.bin/mcp-server-everything"),
        "@modelcontextprotocol/server-everything in tests/peers/node/node_modules",
    )
}

/// Checks both peer installs (Python venv and node_modules); returns the venv's python.
pub fn require_peers() -> PathBuf {
    let _ = node_modules();
    python()
}

// ---------------------------------------------------------------------------------------------
// Ports

/// A free loopback port below 32768 (tests never use the ephemeral range for fixed ports).
/// Successive calls in one process never return the same port (until the range wraps).
pub fn port() -> u16 {
    static NEXT: AtomicU16 = AtomicU16::new(0);
    let _ = NEXT.compare_exchange(
        0,
        20000 + (std::process::id() % 400) as u16 * 30,
        Ordering::SeqCst,
        Ordering::SeqCst,
    );
    loop {
        let p = NEXT.fetch_add(1, Ordering::SeqCst);
        let p = 20000 + (p - 20000) % 12000;
        if StdListener::bind(("127.0.0.1", p)).is_ok() {
            return p;
        }
    }
}

/// Waits until something accepts on `port`.
pub async fn wait_port(port: u16) {
    let deadline = tokio::time::Instant::now() + WAIT;
    while TcpStream::connect(("127.0.0.1", port)).await.is_err() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "nothing listens on {port}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

// ---------------------------------------------------------------------------------------------
// Child processes

/// A child process killed (and reaped) on drop, with its stdout as a channel of lines.
pub struct Proc {
    pub name: String,
    pub child: Child,
    pub lines: mpsc::Receiver<String>,
}

impl Proc {
    /// Spawns `cmd` with stdout piped into [`Proc::line`], stderr inherited and no stdin.
    pub fn spawn(name: &str, cmd: Command) -> Proc {
        Proc::spawn_to(name, cmd, Stdio::inherit())
    }

    /// [`Proc::spawn`] with stderr sent to `stderr` (e.g. a file a test reads back).
    pub fn spawn_to(name: &str, mut cmd: Command, stderr: Stdio) -> Proc {
        cmd.stdout(Stdio::piped())
            .stderr(stderr)
            .stdin(Stdio::null());
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot spawn {name}: {e} — run scripts/install-peers"));
        let out = child.stdout.take().expect("stdout piped");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(out).lines() {
                match line {
                    Ok(l) => {
                        if tx.send(l).is_err() {
                            return;
                        }
                    }
                    Err(_) => return,
                }
            }
        });
        Proc {
            name: name.to_string(),
            child,
            lines: rx,
        }
    }

    /// The next stdout line, or `None` when the process closed stdout (exited).
    pub fn line(&self, timeout: Duration) -> Option<String> {
        match self.lines.recv_timeout(timeout) {
            Ok(l) => Some(l),
            Err(mpsc::RecvTimeoutError::Disconnected) => None,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                panic!("{}: no output within {timeout:?}", self.name)
            }
        }
    }

    /// The next stdout line, without blocking the runtime.
    pub async fn line_async(&self) -> Option<String> {
        // `Receiver` is not Sync; poll it with short sleeps in between.
        loop {
            match self.lines.try_recv() {
                Ok(l) => return Some(l),
                Err(mpsc::TryRecvError::Disconnected) => return None,
                Err(mpsc::TryRecvError::Empty) => {
                    tokio::time::sleep(Duration::from_millis(20)).await
                }
            }
        }
    }

    /// Waits for exit; returns the status code.
    pub fn wait(&mut self) -> Option<i32> {
        self.child.wait().ok().and_then(|s| s.code())
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGKILL, then reap.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Sends signal `sig` (e.g. `"TERM"`).
    pub fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .arg(format!("-{sig}"))
            .arg(self.pid().to_string())
            .status()
            .unwrap();
        assert!(ok.success());
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

// ---------------------------------------------------------------------------------------------
// Upstreams

/// Which unmodified legacy HTTP+SSE server sits upstream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Python FastMCP (`fastmcp_legacy_server.py`): tools tick/echo/burst.
    FastMcp,
    /// `@modelcontextprotocol/server-everything` in `sse` mode.
    Everything,
}

/// A running upstream peer.
pub struct Upstream {
    pub kind: Kind,
    pub port: u16,
    pub proc: Proc,
}

impl Upstream {
    pub fn sse_url(&self) -> String {
        format!("http://127.0.0.1:{}/sse", self.port)
    }

    /// Starts `kind` on a free port below 32768 and waits (blocking) for its ready line.
    pub fn start(kind: Kind) -> Upstream {
        Upstream::start_with(kind, &[])
    }

    /// [`Upstream::start`] with extra arguments after the port (e.g. FastMCP's `--modern-tools`).
    pub fn start_with(kind: Kind, extra: &[&str]) -> Upstream {
        let py = require_peers();
        for _ in 0..20 {
            let port = port();
            let mut cmd = match kind {
                Kind::FastMcp => {
                    let mut c = Command::new(&py);
                    c.arg(peers_dir().join("fastmcp_legacy_server.py"))
                        .arg(port.to_string());
                    c
                }
                Kind::Everything => {
                    let mut c = Command::new(peers_dir().join("run_everything.sh"));
                    c.arg(port.to_string());
                    c
                }
            };
            cmd.args(extra);
            let proc = Proc::spawn(&format!("{kind:?} upstream {extra:?}"), cmd);
            match proc.line(WAIT) {
                Some(l) if l.contains("\"ready\"") => return Upstream { kind, port, proc },
                _ => continue, // port taken after all: try another
            }
        }
        panic!("{kind:?} upstream did not start (see stderr) — run scripts/install-peers");
    }

    /// [`Upstream::start`] on a blocking thread, for async tests.
    pub async fn start_async(kind: Kind) -> Upstream {
        tokio::task::spawn_blocking(move || Upstream::start(kind))
            .await
            .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()))
    }
}

/// The Python SDK's FastMCP legacy SSE server (tools tick, echo, burst).
pub async fn fastmcp() -> Upstream {
    Upstream::start_async(Kind::FastMcp).await
}

/// FastMCP with the tools the 2026-07-28 tests need (`ask`, `sample`, `change`, `slow`), started
/// blocking (run it on a blocking thread from async tests).
pub fn fastmcp_modern() -> Upstream {
    Upstream::start_with(Kind::FastMcp, &["--modern-tools"])
}

/// `@modelcontextprotocol/server-everything` in `sse` mode.
pub async fn everything() -> Upstream {
    Upstream::start_async(Kind::Everything).await
}

// ---------------------------------------------------------------------------------------------
// The proxy

/// A config for tests: loopback port 0 listeners and a fresh data dir.
pub fn config(upstream: &str, dir: &Path) -> Config {
    let mut c = Config::default();
    c.listen.addr = "127.0.0.1:0".into();
    c.admin.addr = "127.0.0.1:0".into();
    c.upstream.sse_url = upstream.into();
    c.upstream.post_timeout_secs = 5;
    c.log.dir = dir.to_path_buf();
    c.log.durability = Durability::Fsync;
    c.shutdown.grace_secs = 5;
    c
}

/// The proxy in-process with [`config`] for `upstream` and `dir`, changed by `f`.
pub async fn start_in_process(
    upstream: &str,
    dir: &Path,
    f: impl FnOnce(&mut Config),
) -> mcp_resume_proxy::app::Running {
    let mut cfg = config(upstream, dir);
    f(&mut cfg);
    mcp_resume_proxy::app::start(cfg)
        .await
        .expect("proxy starts")
}

/// `mcp-resume-proxy inspect --data-dir DIR [SESSION]` (no proxy may hold the dir).
pub fn inspect(dir: &Path, session: Option<&str>) -> String {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_mcp-resume-proxy"));
    cmd.arg("inspect").arg("--data-dir").arg(dir);
    if let Some(s) = session {
        cmd.arg(s);
    }
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "inspect failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The proxy binary, started on fixed ports with a data dir.
pub struct ProxyProc {
    pub proc: Proc,
    pub port: u16,
    pub admin: u16,
}

impl ProxyProc {
    /// Writes a TOML config next to `dir` and starts the binary. Each `extra` pair is a section
    /// header and a line; a pair naming a section the harness already writes (`[listen]`,
    /// `[admin]`, `[upstream]`, `[log]`) adds its line to that section (TOML forbids repeating a
    /// table), any other pair is appended as before.
    pub async fn start(upstream: &str, dir: &Path, extra: &[(&str, &str)]) -> ProxyProc {
        ProxyProc::start_to(upstream, dir, extra, Stdio::inherit()).await
    }

    /// [`ProxyProc::start`] with the proxy's stderr (its log lines) sent to `stderr`.
    pub async fn start_to(
        upstream: &str,
        dir: &Path,
        extra: &[(&str, &str)],
        stderr: Stdio,
    ) -> ProxyProc {
        ProxyProc::start_env(upstream, dir, extra, &[], stderr).await
    }

    /// [`ProxyProc::start_to`] with extra environment variables for the binary (test hooks).
    pub async fn start_env(
        upstream: &str,
        dir: &Path,
        extra: &[(&str, &str)],
        env: &[(&str, &str)],
        stderr: Stdio,
    ) -> ProxyProc {
        let (port, admin) = (port(), port());
        let cfg_path = dir.with_extension("toml");
        let mut sections = [
            ("[listen]", format!("addr = \"127.0.0.1:{port}\"\n")),
            ("[admin]", format!("addr = \"127.0.0.1:{admin}\"\n")),
            (
                "[upstream]",
                format!("sse_url = \"{upstream}\"\npost_timeout_secs = 5\n"),
            ),
            ("[log]", format!("dir = \"{}\"\n", dir.display())),
        ];
        let mut rest = String::new();
        for (k, v) in extra {
            match sections.iter_mut().find(|(name, _)| name == k) {
                Some((_, body)) => body.push_str(&format!("{v}\n")),
                None => rest.push_str(&format!("{k}\n{v}\n")),
            }
        }
        let mut text: String = sections
            .iter()
            .map(|(name, body)| format!("{name}\n{body}"))
            .collect();
        text.push_str(&rest);
        std::fs::write(&cfg_path, text).unwrap();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_mcp-resume-proxy"));
        cmd.args(["run", "--config"]).arg(&cfg_path).env(
            "MCP_RESUME_PROXY_LOG",
            std::env::var("TEST_PROXY_LOG").unwrap_or_else(|_| "warn".into()),
        );
        cmd.envs(env.iter().copied());
        let p = ProxyProc {
            proc: Proc::spawn_to("proxy binary", cmd, stderr),
            port,
            admin,
        };
        wait_port(admin).await;
        let deadline = tokio::time::Instant::now() + WAIT;
        while http_get(&format!("http://127.0.0.1:{admin}/readyz"))
            .await
            .0
            != 200
        {
            assert!(tokio::time::Instant::now() < deadline, "proxy not ready");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        p
    }
    pub fn base(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
    pub fn metrics_url(&self) -> String {
        format!("http://127.0.0.1:{}/metrics", self.admin)
    }
}

// ---------------------------------------------------------------------------------------------
// Metrics

/// The value of `series` (exact, e.g. `x{reason="a"}`) in the Prometheus text `text`; fails the
/// test when the series is absent (every fixed label set is registered up front).
pub fn metric_value(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series).and_then(|r| r.strip_prefix(' ')))
        .map(|v| {
            v.trim()
                .parse()
                .unwrap_or_else(|e| panic!("series {series}: bad value {v:?} ({e})"))
        })
        .unwrap_or_else(|| panic!("series {series} not in metrics"))
}

/// The value of `series` in the Prometheus text at `url`.
pub async fn metric(url: &str, series: &str) -> f64 {
    metric_value(&http_get(url).await.1, series)
}

// ---------------------------------------------------------------------------------------------
// HTTP through a client (absolute URLs; `http_get` never fails, it answers status 0)

fn client() -> Client<HttpConnector, Full<Bytes>> {
    Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(0)
        .build(HttpConnector::new())
}

/// GET → (status, body text); (0, "") when the request fails.
pub async fn http_get(url: &str) -> (u16, String) {
    match client().get(url.parse().unwrap()).await {
        Ok(r) => (r.status().as_u16(), body_text(r.into_body()).await),
        Err(_) => (0, String::new()),
    }
}

/// The raw id of a JSON-RPC answer (result or error, no method) in `data`; `None`: not an answer.
pub fn answer_id(data: &[u8]) -> Option<String> {
    let m = serde_json::from_slice::<
        std::collections::BTreeMap<String, &serde_json::value::RawValue>,
    >(data)
    .ok()?;
    let answer = !m.contains_key("method") && (m.contains_key("result") || m.contains_key("error"));
    answer.then(|| {
        m.get("id")
            .map_or("null".to_string(), |r| r.get().to_string())
    })
}

/// Any request → (status, headers, body).
pub async fn request(
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, HeaderMap, String) {
    let mut b = http::Request::builder().method(method).uri(url);
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    let r = tokio::time::timeout(
        WAIT,
        client().request(b.body(Full::new(Bytes::from(body.to_string()))).unwrap()),
    )
    .await
    .expect("request timed out")
    .expect("request failed");
    let s = r.status().as_u16();
    let h = r.headers().clone();
    (s, h, body_text(r.into_body()).await)
}

/// A body as text (lossy); empty when reading it fails.
async fn body_text(body: impl hyper::body::Body<Data = Bytes>) -> String {
    let b = body
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    String::from_utf8_lossy(&b).into_owned()
}

/// POST JSON to `url`.
pub async fn post(url: &str, msg: &Value) -> (u16, String) {
    let (s, _, b) = request(
        "POST",
        url,
        &[("content-type", "application/json")],
        &msg.to_string(),
    )
    .await;
    (s, b)
}

// ---------------------------------------------------------------------------------------------
// Raw HTTP: one request on its own connection

/// A response whose body has not been read.
pub struct Resp {
    pub status: u16,
    pub headers: HeaderMap,
    body: Incoming,
    conn: tokio::task::JoinHandle<()>,
}

/// Sends one request on a fresh connection.
pub async fn send(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&str>,
) -> Resp {
    let fut = async {
        let tcp = TcpStream::connect(addr).await.expect("connect");
        let (mut tx, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
            .await
            .expect("handshake");
        let conn = tokio::spawn(async move {
            let _ = conn.await;
        });
        let mut req = http::Request::builder()
            .method(method)
            .uri(path)
            .header("host", addr.to_string());
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let req = req
            .body(Full::new(Bytes::from(body.unwrap_or("").to_string())))
            .expect("request");
        let resp = tx.send_request(req).await.expect("response");
        let (parts, body) = resp.into_parts();
        Resp {
            status: parts.status.as_u16(),
            headers: parts.headers,
            body,
            conn,
        }
    };
    tokio::time::timeout(WAIT, fut)
        .await
        .unwrap_or_else(|_| panic!("{method} {path}: no response head within {WAIT:?}"))
}

impl Resp {
    pub fn header(&self, name: &str) -> Option<String> {
        self.headers
            .get(name)
            .map(|v| v.to_str().expect("ascii header").to_string())
    }

    pub async fn bytes(self) -> Bytes {
        let b = tokio::time::timeout(WAIT, self.body.collect())
            .await
            .expect("body within the step timeout")
            .expect("body")
            .to_bytes();
        self.conn.abort();
        b
    }

    pub async fn json(self) -> Value {
        let b = self.bytes().await;
        serde_json::from_slice(&b)
            .unwrap_or_else(|e| panic!("body is not JSON ({e}): {}", String::from_utf8_lossy(&b)))
    }

    /// The body as a Streamable HTTP SSE stream: status 200, `text/event-stream`, UTF-8 data.
    pub fn sse(self) -> Sse {
        assert_eq!(self.status, 200, "expected an SSE stream");
        assert!(
            self.header("content-type")
                .is_some_and(|c| c.starts_with("text/event-stream")),
            "content-type {:?}",
            self.header("content-type")
        );
        self.into_sse(true)
    }

    fn into_sse(self, utf8_data: bool) -> Sse {
        Sse {
            status: self.status,
            headers: self.headers,
            body: self.body,
            parser: sse::Parser::new(),
            queue: VecDeque::new(),
            conn: self.conn,
            raw: Vec::new(),
            done: false,
            utf8_data,
        }
    }
}

/// `http://ADDR/PATH` → (ADDR, `/PATH`); test URLs always name a numeric loopback address.
fn split_url(url: &str) -> (SocketAddr, &str) {
    let rest = url
        .strip_prefix("http://")
        .unwrap_or_else(|| panic!("not an http:// URL: {url}"));
    let (host, path) = rest.find('/').map_or((rest, "/"), |i| rest.split_at(i));
    let addr = host
        .parse()
        .unwrap_or_else(|e| panic!("{url}: host is not an IP:port ({e})"));
    (addr, path)
}

// ---------------------------------------------------------------------------------------------
// SSE

/// One SSE event as received.
#[derive(Clone, Debug, PartialEq)]
pub struct Ev {
    pub id: Option<String>,
    pub event: Option<String>,
    /// The data, byte for byte (the legacy face relays malformed upstream bytes as they are).
    pub data: Bytes,
    pub retry: Option<u64>,
}

impl Ev {
    pub fn is_priming(&self) -> bool {
        self.data.is_empty()
    }

    /// The data as text.
    pub fn text(&self) -> &str {
        std::str::from_utf8(&self.data).expect("utf-8 data")
    }

    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.data).unwrap_or_else(|e| {
            panic!(
                "event data is not JSON ({e}): {}",
                String::from_utf8_lossy(&self.data)
            )
        })
    }

    /// The id's seq.
    pub fn seq(&self) -> u64 {
        self.id
            .as_deref()
            .and_then(|i| i.rsplit(':').next())
            .and_then(|s| s.parse().ok())
            .expect("event id with a seq")
    }
}

/// A client SSE stream.
pub struct Sse {
    pub status: u16,
    pub headers: HeaderMap,
    body: Incoming,
    parser: sse::Parser,
    /// Events parsed and not yet returned.
    queue: VecDeque<Ev>,
    conn: tokio::task::JoinHandle<()>,
    /// Every byte received.
    pub raw: Vec<u8>,
    done: bool,
    /// Whether every event's data must be UTF-8 (a Streamable HTTP stream, see [`Resp::sse`]).
    utf8_data: bool,
}

impl Sse {
    /// GET `url` (`http://IP:PORT/...`) with extra headers; returns the response whatever its
    /// status, with the body text when it is not 200.
    pub async fn get(url: &str, headers: &[(&str, &str)]) -> (Sse, Option<String>) {
        let (addr, path) = split_url(url);
        let mut h = vec![("accept", "text/event-stream")];
        h.extend_from_slice(headers);
        let r = send(addr, "GET", path, &h, None).await;
        let status = r.status;
        let mut sse = r.into_sse(false);
        if status != 200 {
            let body = body_text(&mut sse.body).await;
            return (sse, Some(body));
        }
        (sse, None)
    }

    /// The next event; `None` once the stream has ended. Fails the test after [`WAIT`] without one.
    pub async fn next(&mut self) -> Option<Ev> {
        tokio::time::timeout(WAIT, self.next_inner())
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "no SSE event within {WAIT:?}; got so far: {}",
                    String::from_utf8_lossy(&self.raw)
                )
            })
    }

    /// The next event within `d`, or Err(()) on timeout.
    pub async fn next_within(&mut self, d: Duration) -> Result<Option<Ev>, ()> {
        tokio::time::timeout(d, self.next_inner())
            .await
            .map_err(|_| ())
    }

    /// The events until the stream ends or `d` passes; whether it ended.
    pub async fn events_within(&mut self, d: Duration) -> (Vec<Ev>, bool) {
        let deadline = tokio::time::Instant::now() + d;
        let mut out = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            match self.next_within(left).await {
                Ok(Some(ev)) => out.push(ev),
                Ok(None) => return (out, true),
                Err(()) => return (out, false),
            }
        }
    }

    async fn next_inner(&mut self) -> Option<Ev> {
        loop {
            if let Some(ev) = self.queue.pop_front() {
                assert!(
                    !self.utf8_data || std::str::from_utf8(&ev.data).is_ok(),
                    "utf-8 data: {ev:?}"
                );
                return Some(ev);
            }
            if self.done {
                return None;
            }
            match self.body.frame().await {
                None | Some(Err(_)) => self.done = true,
                Some(Ok(f)) => {
                    if let Ok(d) = f.into_data() {
                        self.raw.extend_from_slice(&d);
                        let evs = self.parser.feed(&d);
                        self.queue.extend(evs);
                    }
                }
            }
        }
    }

    /// Every remaining event, until the stream ends.
    pub async fn rest(&mut self) -> Vec<Ev> {
        let mut out = Vec::new();
        while let Some(e) = self.next().await {
            out.push(e);
        }
        out
    }

    /// Reads events until `pred` matches one (returned last); panics if the stream ends first.
    pub async fn until(&mut self, mut pred: impl FnMut(&Ev) -> bool) -> Vec<Ev> {
        let mut out = Vec::new();
        loop {
            let e = self
                .next()
                .await
                .unwrap_or_else(|| panic!("stream ended before the awaited event; got {out:?}"));
            let stop = pred(&e);
            out.push(e);
            if stop {
                return out;
            }
        }
    }

    /// Drops the connection (the client goes away mid-stream).
    pub fn cut(self) {
        self.conn.abort();
        drop(self.body);
    }

    /// Reads the legacy `endpoint` event and returns its data.
    pub async fn endpoint(&mut self) -> String {
        let ev = self.next().await.expect("endpoint event");
        assert_eq!(ev.event.as_deref(), Some("endpoint"));
        assert!(ev.id.is_none(), "endpoint event must not carry an id (I5)");
        String::from_utf8(ev.data.to_vec()).unwrap()
    }

    /// The next legacy `message` event as (id, JSON).
    pub async fn message(&mut self) -> (String, Value) {
        let ev = self.next().await.expect("message event");
        assert_eq!(ev.event.as_deref(), Some("message"), "{ev:?}");
        let id = ev.id.clone().expect("logged events carry an id");
        (id, serde_json::from_slice(&ev.data).expect("JSON data"))
    }
}

// ---------------------------------------------------------------------------------------------
// A legacy HTTP+SSE session driven by hand

/// Seq of an event id `{session}:{epoch}:{seq}`.
pub fn seq_of(id: &str) -> u64 {
    id.rsplit(':').next().unwrap().parse().unwrap()
}

pub fn initialize(id: u64) -> Value {
    serde_json::json!({"jsonrpc":"2.0","id":id,"method":"initialize","params":{"protocolVersion":"2024-11-05","capabilities":{},"clientInfo":{"name":"test","version":"0"}}})
}

pub fn initialized() -> Value {
    serde_json::json!({"jsonrpc":"2.0","method":"notifications/initialized"})
}

pub fn call(id: u64, tool: &str, args: Value, progress_token: Option<&str>) -> Value {
    let mut params = serde_json::json!({"name": tool, "arguments": args});
    if let Some(t) = progress_token {
        params["_meta"] = serde_json::json!({"progressToken": t});
    }
    serde_json::json!({"jsonrpc":"2.0","id":id,"method":"tools/call","params":params})
}

pub fn is_progress(m: &Value) -> bool {
    m["method"] == "notifications/progress"
}

/// Every remaining `message` event of a stream, as (id, JSON), until the stream ends.
pub async fn rest_of_stream(sse: &mut Sse) -> Vec<(String, Value)> {
    let mut out = Vec::new();
    while let Some(ev) = sse.next().await {
        assert_eq!(ev.event.as_deref(), Some("message"), "{ev:?}");
        let id = ev.id.clone().expect("logged events carry an id");
        out.push((id, serde_json::from_slice(&ev.data).expect("JSON data")));
    }
    out
}

/// A legacy session through the proxy at `base`: opens `/sse`, initializes. Returns the stream,
/// the absolute message URL and the id of the last event read.
pub async fn legacy_session(base: &str) -> (Sse, String, String) {
    let (mut sse, err) = Sse::get(&format!("{base}/sse"), &[]).await;
    assert!(err.is_none(), "GET /sse failed: {} {err:?}", sse.status);
    let ep = sse.endpoint().await;
    assert!(ep.starts_with("/messages?session_id="), "{ep}");
    let url = format!("{base}{ep}");
    assert_eq!(post(&url, &initialize(1)).await.0, 202);
    let (id, msg) = sse.message().await;
    assert_eq!(msg["id"], 1, "{msg}");
    assert!(msg["result"]["protocolVersion"].is_string(), "{msg}");
    assert_eq!(post(&url, &initialized()).await.0, 202);
    (sse, url, id)
}

// ---------------------------------------------------------------------------------------------
// A TCP relay whose connections the test can sever: a network fault between a real client and
// the proxy, which neither side produces on demand

/// One relayed connection: its task and the bytes its client sent.
type RelayConn = (tokio::task::AbortHandle, Arc<Mutex<Vec<u8>>>);

/// Copies client → server (recording those bytes in `tap`) and server → client until both
/// directions end, shutting each write side down when its read side ends.
pub async fn pump_tapped<CR, CW, SR, SW>(
    mut cr: CR,
    mut cw: CW,
    mut sr: SR,
    mut sw: SW,
    tap: &Mutex<Vec<u8>>,
) where
    CR: tokio::io::AsyncRead + Unpin,
    CW: tokio::io::AsyncWrite + Unpin,
    SR: tokio::io::AsyncRead + Unpin,
    SW: tokio::io::AsyncWrite + Unpin,
{
    let up = async {
        let mut buf = vec![0u8; 16384];
        loop {
            let n = match cr.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            tap.lock().unwrap().extend_from_slice(&buf[..n]);
            if sw.write_all(&buf[..n]).await.is_err() {
                break;
            }
        }
        let _ = sw.shutdown().await;
    };
    let down = async {
        let _ = tokio::io::copy(&mut sr, &mut cw).await;
        let _ = cw.shutdown().await;
    };
    tokio::join!(up, down);
}

/// Forwards connections to `target`; records the bytes each client sent; `sever` closes every
/// connection open at that moment, both ways (the client sees its connection drop mid-response).
pub struct Relay {
    pub addr: SocketAddr,
    conns: Arc<Mutex<Vec<RelayConn>>>,
    accept: tokio::task::JoinHandle<()>,
}

impl Relay {
    pub async fn start(target: SocketAddr) -> Relay {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind relay");
        let addr = listener.local_addr().expect("addr");
        let conns: Arc<Mutex<Vec<_>>> = Arc::default();
        let list = conns.clone();
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = TcpStream::connect(target).await else {
                    continue;
                };
                let seen: Arc<Mutex<Vec<u8>>> = Arc::default();
                let tap = seen.clone();
                let task = tokio::spawn(async move {
                    let (cr, cw) = client.into_split();
                    let (sr, sw) = server.into_split();
                    pump_tapped(cr, cw, sr, sw, &tap).await;
                });
                list.lock().unwrap().push((task.abort_handle(), seen));
            }
        });
        Relay {
            addr,
            conns,
            accept,
        }
    }

    /// Closes every open connection, both ways; returns how many.
    pub fn sever(&self) -> usize {
        let list = self.conns.lock().unwrap();
        let mut n = 0;
        for (task, _) in list.iter() {
            if !task.is_finished() {
                task.abort();
                n += 1;
            }
        }
        n
    }

    /// Everything clients sent, per connection, in connection order.
    pub fn client_bytes(&self) -> Vec<String> {
        self.conns
            .lock()
            .unwrap()
            .iter()
            .map(|(_, b)| String::from_utf8_lossy(&b.lock().unwrap()).into_owned())
            .collect()
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.accept.abort();
        self.sever();
    }
}
