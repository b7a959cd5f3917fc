//! Shared integration-test helpers: real peers (installed by `scripts/install-peers`), the proxy
//! (in-process or as its binary), and a small SSE client over real loopback sockets.
#![allow(dead_code)]

use std::net::TcpListener as StdListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use mcp_resume_proxy::config::{Config, Durability};
use mcp_resume_proxy::sse::{Decoder, Event};
use serde_json::Value;

/// Generous bound for anything a test waits for; a hang fails instead of blocking CI.
pub const WAIT: Duration = Duration::from_secs(30);

pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Fails (never skips) when the peers are not installed.
pub fn require_peers() -> (PathBuf, PathBuf) {
    let py = repo().join("tests/peers/.venv/bin/python");
    let node = repo().join("tests/peers/node/node_modules/@modelcontextprotocol/server-everything");
    assert!(
        py.exists() && node.exists(),
        "real MCP peers are missing: run scripts/install-peers (expected {} and {})",
        py.display(),
        node.display()
    );
    (py, node)
}

/// A free loopback port below 32768 (tests never use the ephemeral range for fixed ports).
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
    while tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .is_err()
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "nothing listens on {port}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A child process killed on drop.
pub struct Proc {
    pub child: Child,
    pub port: u16,
}

impl Proc {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
    pub fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .arg(format!("-{sig}"))
            .arg(self.pid().to_string())
            .status()
            .unwrap();
        assert!(ok.success());
    }
    pub fn sse_url(&self) -> String {
        format!("http://127.0.0.1:{}/sse", self.port)
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The Python SDK's FastMCP legacy SSE server (tools tick, echo, burst).
pub async fn fastmcp() -> Proc {
    let (py, _) = require_peers();
    let port = port();
    let child = Command::new(py)
        .arg(repo().join("tests/peers/fastmcp_legacy_server.py"))
        .arg(port.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start FastMCP peer");
    wait_port(port).await;
    Proc { child, port }
}

/// `@modelcontextprotocol/server-everything` in `sse` mode.
pub async fn everything() -> Proc {
    require_peers();
    let port = port();
    let child = Command::new("bash")
        .arg(repo().join("tests/peers/run_everything.sh"))
        .arg(port.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start server-everything");
    wait_port(port).await;
    Proc { child, port }
}

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

/// The proxy binary, started on fixed ports with a data dir.
pub struct ProxyProc {
    pub proc: Proc,
    pub admin: u16,
}

impl ProxyProc {
    /// Writes a TOML config next to `dir` and starts the binary. Each `extra` pair is a section
    /// header and a line; a pair naming a section the harness already writes (`[listen]`,
    /// `[admin]`, `[upstream]`, `[log]`) adds its line to that section (TOML forbids repeating a
    /// table), any other pair is appended as before.
    pub async fn start(upstream: &str, dir: &Path, extra: &[(&str, &str)]) -> ProxyProc {
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
        let child = Command::new(env!("CARGO_BIN_EXE_mcp-resume-proxy"))
            .args(["run", "--config"])
            .arg(&cfg_path)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .env("MCP_RESUME_PROXY_LOG", "warn")
            .spawn()
            .expect("start proxy binary");
        let p = ProxyProc {
            proc: Proc { child, port },
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
        format!("http://127.0.0.1:{}", self.proc.port)
    }
    pub fn metrics_url(&self) -> String {
        format!("http://127.0.0.1:{}/metrics", self.admin)
    }
}

fn client() -> Client<HttpConnector, Full<Bytes>> {
    Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(0)
        .build(HttpConnector::new())
}

/// GET → (status, body text).
pub async fn http_get(url: &str) -> (u16, String) {
    match client().get(url.parse().unwrap()).await {
        Ok(r) => {
            let s = r.status().as_u16();
            let b = r
                .into_body()
                .collect()
                .await
                .map(|b| b.to_bytes())
                .unwrap_or_default();
            (s, String::from_utf8_lossy(&b).into_owned())
        }
        Err(_) => (0, String::new()),
    }
}

/// Any request → (status, headers, body).
pub async fn request(
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, http::HeaderMap, String) {
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
    let body = r
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    (s, h, String::from_utf8_lossy(&body).into_owned())
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

/// Value of `name` in the Prometheus text at `url` (exact series, e.g. `x{reason="a"}`).
pub async fn metric(url: &str, series: &str) -> f64 {
    let (_, text) = http_get(url).await;
    text.lines()
        .find_map(|l| {
            l.strip_prefix(series)
                .and_then(|r| r.strip_prefix(' '))
                .map(|v| v.trim().parse().unwrap())
        })
        .unwrap_or_else(|| panic!("series {series} not in metrics"))
}

/// An open SSE response.
pub struct Sse {
    pub status: u16,
    pub headers: http::HeaderMap,
    body: Incoming,
    buf: BytesMut,
    dec: Decoder,
}

impl Sse {
    /// GET `url` with extra headers; returns the response whatever its status.
    pub async fn get(url: &str, headers: &[(&str, &str)]) -> (Sse, Option<String>) {
        let mut b = http::Request::builder()
            .method("GET")
            .uri(url)
            .header("accept", "text/event-stream");
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        let r = tokio::time::timeout(
            WAIT,
            client().request(b.body(Full::new(Bytes::new())).unwrap()),
        )
        .await
        .expect("GET timed out")
        .expect("GET failed");
        let status = r.status().as_u16();
        let headers = r.headers().clone();
        let mut sse = Sse {
            status,
            headers,
            body: r.into_body(),
            buf: BytesMut::new(),
            dec: Decoder::new(64 << 20),
        };
        if status != 200 {
            let body = (&mut sse.body)
                .collect()
                .await
                .map(|b| b.to_bytes())
                .unwrap_or_default();
            return (sse, Some(String::from_utf8_lossy(&body).into_owned()));
        }
        (sse, None)
    }

    /// The next event, or None at end of stream. Panics after [`WAIT`].
    pub async fn next(&mut self) -> Option<Event> {
        tokio::time::timeout(WAIT, self.next_inner())
            .await
            .expect("no SSE event in time")
    }

    /// The next event within `d`, or Err(()) on timeout.
    pub async fn next_within(&mut self, d: Duration) -> Result<Option<Event>, ()> {
        tokio::time::timeout(d, self.next_inner())
            .await
            .map_err(|_| ())
    }

    async fn next_inner(&mut self) -> Option<Event> {
        loop {
            if let Some(ev) = self.dec.decode(&mut self.buf).expect("event within cap") {
                return Some(ev);
            }
            match self.body.frame().await {
                None | Some(Err(_)) => return None,
                Some(Ok(f)) => {
                    if let Ok(d) = f.into_data() {
                        self.buf.extend_from_slice(&d);
                    }
                }
            }
        }
    }

    /// Reads the `endpoint` event and returns its data.
    pub async fn endpoint(&mut self) -> String {
        let ev = self.next().await.expect("endpoint event");
        assert_eq!(ev.event.as_deref(), Some("endpoint"));
        assert!(ev.id.is_none(), "endpoint event must not carry an id (I5)");
        String::from_utf8(ev.data.to_vec()).unwrap()
    }

    /// The next `message` event as (id, JSON).
    pub async fn message(&mut self) -> (String, Value) {
        let ev = self.next().await.expect("message event");
        assert_eq!(ev.event.as_deref(), Some("message"), "{ev:?}");
        let id = ev.id.clone().expect("logged events carry an id");
        (id, serde_json::from_slice(&ev.data).expect("JSON data"))
    }
}

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

/// A TCP relay on a loopback port whose connections the test can cut: a network fault between a
/// real client and the proxy, which neither side produces on demand.
pub struct Relay {
    pub port: u16,
    cut: tokio::sync::watch::Sender<u64>,
    task: tokio::task::JoinHandle<()>,
}

impl Relay {
    pub async fn start(target: std::net::SocketAddr) -> Relay {
        let port = port();
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
            .await
            .unwrap();
        let (cut, _) = tokio::sync::watch::channel(0u64);
        let cut2 = cut.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((mut client, _)) = listener.accept().await else {
                    return;
                };
                let mut rx = cut2.subscribe();
                tokio::spawn(async move {
                    let Ok(mut server) = tokio::net::TcpStream::connect(target).await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
                        _ = rx.changed() => {}
                    }
                });
            }
        });
        Relay { port, cut, task }
    }

    /// Severs every connection currently open through the relay.
    pub fn cut_all(&self) {
        self.cut.send_modify(|n| *n += 1);
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.task.abort();
    }
}
