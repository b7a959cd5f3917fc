//! Shared helpers of the Streamable HTTP face's integration tests (tests/streamable_*.rs): the
//! real upstream peers, the proxy in-process, a raw HTTP/SSE client, a TCP relay whose
//! connections a test can sever, and the SDK client peers.
//!
//! Everything runs on 127.0.0.1; peers get ports below 32768. A missing peer fails the test with
//! a message naming `scripts/install-peers`; nothing is ever skipped.

#![allow(dead_code)]

use std::io::BufRead;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::HeaderMap;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use mcp_resume_proxy::app::Running;
use mcp_resume_proxy::config::Config;
use mcp_resume_proxy::sse::Decoder;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// How long any single step may take before the test fails (hang protection, not an assertion).
pub const STEP: Duration = Duration::from_secs(30);

pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

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

// ---------------------------------------------------------------------------------------------
// Child processes

/// A child process killed (and reaped) on drop, with its stdout as a channel of lines.
pub struct Proc {
    pub name: String,
    child: Child,
    pub lines: mpsc::Receiver<String>,
}

impl Proc {
    pub fn spawn(name: &str, mut cmd: Command) -> Proc {
        cmd.stdout(Stdio::piped())
            .stderr(Stdio::inherit())
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

    /// The next stdout line, waiting on a blocking thread.
    pub async fn line_async(&self) -> Option<String> {
        // `Receiver` is not Sync; poll it with short blocking waits off the runtime's workers.
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

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
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

impl Kind {
    /// A tool call sending `steps` progress notifications: (tool name, arguments).
    pub fn long_call(self, steps: u32) -> (&'static str, Value) {
        match self {
            Kind::FastMcp => ("tick", json!({"n": steps, "interval_ms": 250})),
            Kind::Everything => (
                "trigger-long-running-operation",
                json!({"duration": f64::from(steps) * 0.25, "steps": steps}),
            ),
        }
    }

    /// The text result of [`Kind::long_call`].
    pub fn long_result(self, steps: u32) -> String {
        match self {
            Kind::FastMcp => format!("done {steps}"),
            Kind::Everything => format!(
                "Long running operation completed. Duration: {} seconds, Steps: {steps}.",
                f64::from(steps) * 0.25
            ),
        }
    }

    /// Arguments of the `echo` tool.
    pub fn echo_args(self, text: &str) -> Value {
        match self {
            Kind::FastMcp => json!({"text": text}),
            Kind::Everything => json!({"message": text}),
        }
    }

    /// The text result of `echo`.
    pub fn echo_result(self, text: &str) -> String {
        match self {
            Kind::FastMcp => text.to_string(),
            Kind::Everything => format!("Echo: {text}"),
        }
    }

    /// Log notifications (standalone stream) the long call sends: FastMCP's `tick` logs once per
    /// step; server-everything's operation logs nothing.
    pub fn long_logs(self, steps: u32) -> Vec<String> {
        match self {
            Kind::FastMcp => (1..=steps).map(|i| format!("tick {i}")).collect(),
            Kind::Everything => Vec::new(),
        }
    }
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

    /// Starts `kind` on a free port below 32768 and waits for its ready line.
    pub fn start(kind: Kind) -> Upstream {
        let py = python();
        let _ = node_modules();
        for _ in 0..20 {
            let port = free_low_port();
            let cmd = match kind {
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
            let proc = Proc::spawn(&format!("{kind:?} upstream"), cmd);
            match proc.line(STEP) {
                Some(l) if l.contains("\"ready\"") => return Upstream { kind, port, proc },
                _ => continue, // port taken after all: try another
            }
        }
        panic!("{kind:?} upstream did not start (see stderr) — run scripts/install-peers");
    }
}

/// A port below 32768 (outside the ephemeral range) that is free right now.
pub fn free_low_port() -> u16 {
    loop {
        let mut b = [0u8; 2];
        getrandom::getrandom(&mut b).expect("random");
        let port = 20000 + (u16::from_le_bytes(b) % 12000);
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The proxy

pub struct Proxy {
    pub running: Running,
    pub dir: tempfile::TempDir,
}

impl Proxy {
    pub async fn start(upstream: &Upstream, tweak: impl FnOnce(&mut Config)) -> Proxy {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut cfg = Config::default();
        cfg.listen.addr = "127.0.0.1:0".into();
        cfg.admin.addr = "127.0.0.1:0".into();
        cfg.upstream.sse_url = upstream.sse_url();
        cfg.log.dir = dir.path().join("data");
        cfg.sessions.keepalive_secs = 1;
        tweak(&mut cfg);
        let running = mcp_resume_proxy::app::start(cfg)
            .await
            .expect("proxy starts");
        Proxy { running, dir }
    }

    pub fn addr(&self) -> SocketAddr {
        self.running.addr
    }

    pub fn url(&self) -> String {
        format!("http://{}/mcp", self.running.addr)
    }

    /// `/metrics` from the admin listener, over HTTP.
    pub async fn metrics(&self) -> String {
        let r = send(self.running.admin_addr, "GET", "/metrics", &[], None).await;
        assert_eq!(r.status, 200);
        String::from_utf8(r.bytes().await.to_vec()).expect("utf-8")
    }

    /// The value of one sample of the admin `/metrics` (0 when absent).
    pub async fn metric(&self, sample: &str) -> f64 {
        metric_value(&self.metrics().await, sample)
    }

    pub async fn stop(self) {
        self.running.stop().await;
    }
}

pub fn metric_value(text: &str, sample: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(sample).and_then(|r| r.strip_prefix(' ')))
        .map(|v| v.trim().parse().expect("metric value"))
        .unwrap_or(0.0)
}

// ---------------------------------------------------------------------------------------------
// Raw HTTP

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
    tokio::time::timeout(STEP, fut)
        .await
        .unwrap_or_else(|_| panic!("{method} {path}: no response head within {STEP:?}"))
}

impl Resp {
    pub fn header(&self, name: &str) -> Option<String> {
        self.headers
            .get(name)
            .map(|v| v.to_str().expect("ascii header").to_string())
    }

    pub async fn bytes(self) -> Bytes {
        let b = tokio::time::timeout(STEP, self.body.collect())
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

    pub fn sse(self) -> Sse {
        assert_eq!(self.status, 200, "expected an SSE stream");
        assert!(
            self.header("content-type")
                .is_some_and(|c| c.starts_with("text/event-stream")),
            "content-type {:?}",
            self.header("content-type")
        );
        Sse {
            body: self.body,
            buf: BytesMut::new(),
            dec: Decoder::new(16 << 20),
            conn: self.conn,
            raw: Vec::new(),
            done: false,
        }
    }
}

/// One SSE event as received.
#[derive(Clone, Debug, PartialEq)]
pub struct Ev {
    pub id: Option<String>,
    pub event: Option<String>,
    pub data: String,
    pub retry: Option<u64>,
}

impl Ev {
    pub fn is_priming(&self) -> bool {
        self.data.is_empty()
    }

    pub fn json(&self) -> Value {
        serde_json::from_str(&self.data)
            .unwrap_or_else(|e| panic!("event data is not JSON ({e}): {}", self.data))
    }

    /// The id's seq.
    pub fn seq(&self) -> u64 {
        self.id
            .as_deref()
            .and_then(|i| i.rsplit(':').next())
            .and_then(|s| s.parse().ok())
            .expect("event id with a seq")
    }

    /// Short description: `progress P`, `log X`, `response ID`, `priming`, or the method.
    pub fn describe(&self) -> String {
        if self.is_priming() {
            return "priming".into();
        }
        describe(&self.json())
    }
}

pub fn describe(m: &Value) -> String {
    match m["method"].as_str() {
        Some("notifications/progress") => format!(
            "progress {}",
            m["params"]["progress"].as_f64().expect("numeric progress")
        ),
        Some("notifications/message") => {
            format!("log {}", m["params"]["data"].as_str().unwrap_or("?"))
        }
        Some(other) => other.to_string(),
        None if m.get("error").is_some() => format!("error {} {}", m["id"], m["error"]["code"]),
        None => format!("response {}", m["id"]),
    }
}

/// A client SSE stream.
pub struct Sse {
    body: Incoming,
    buf: BytesMut,
    dec: Decoder,
    conn: tokio::task::JoinHandle<()>,
    /// Every byte received.
    pub raw: Vec<u8>,
    done: bool,
}

impl Sse {
    /// The next event; `None` once the stream has ended. Fails the test after [`STEP`] without one.
    pub async fn next(&mut self) -> Option<Ev> {
        tokio::time::timeout(STEP, self.next_inner())
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "no SSE event within {STEP:?}; got so far: {}",
                    String::from_utf8_lossy(&self.raw)
                )
            })
    }

    async fn next_inner(&mut self) -> Option<Ev> {
        loop {
            if let Some(ev) = self.dec.decode(&mut self.buf).expect("SSE decodes") {
                return Some(Ev {
                    id: ev.id,
                    event: ev.event,
                    data: String::from_utf8(ev.data.to_vec()).expect("utf-8 data"),
                    retry: ev.retry,
                });
            }
            if self.done {
                return None;
            }
            match self.body.frame().await {
                None => self.done = true,
                Some(Err(_)) => self.done = true,
                Some(Ok(f)) => {
                    if let Ok(d) = f.into_data() {
                        self.raw.extend_from_slice(&d);
                        self.buf.extend_from_slice(&d);
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
}

// ---------------------------------------------------------------------------------------------
// A Streamable HTTP session driven by hand

pub const ACCEPT_BOTH: (&str, &str) = ("accept", "application/json, text/event-stream");
pub const ACCEPT_SSE: (&str, &str) = ("accept", "text/event-stream");
pub const JSON_CT: (&str, &str) = ("content-type", "application/json");

pub struct Client {
    pub addr: SocketAddr,
    pub session: String,
    pub version: String,
    next_id: u64,
}

impl Client {
    /// POST initialize at `version`, then `notifications/initialized`. Returns the client and the
    /// events of the initialize POST stream.
    pub async fn init(addr: SocketAddr, version: &str) -> (Client, Vec<Ev>) {
        let (c, evs, _) = Client::init_raw(addr, version).await;
        (c, evs)
    }

    /// [`Client::init`], also returning the raw bytes of the initialize POST stream.
    pub async fn init_raw(addr: SocketAddr, version: &str) -> (Client, Vec<Ev>, String) {
        let body = json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{
            "protocolVersion": version, "capabilities": {}, "clientInfo": {"name":"raw","version":"0"}}});
        let r = send(
            addr,
            "POST",
            "/mcp",
            &[ACCEPT_BOTH, JSON_CT],
            Some(&body.to_string()),
        )
        .await;
        assert_eq!(r.status, 200, "initialize answered {}", r.status);
        let session = r
            .header("mcp-session-id")
            .expect("Mcp-Session-Id on the initialize answer");
        assert_eq!(session.len(), 32);
        let mut sse = r.sse();
        let evs = sse.rest().await;
        let raw = String::from_utf8(sse.raw.clone()).expect("utf-8");
        let last = evs.last().expect("initialize response").json();
        assert_eq!(last["id"], 0, "{last}");
        assert!(last["result"]["protocolVersion"].is_string(), "{last}");
        let negotiated = last["result"]["protocolVersion"]
            .as_str()
            .unwrap()
            .to_string();
        let c = Client {
            addr,
            session,
            version: negotiated,
            next_id: 1,
        };
        let r = c
            .post(&json!({"jsonrpc":"2.0","method":"notifications/initialized"}))
            .await;
        assert_eq!(r.status, 202);
        (c, evs, raw)
    }

    pub fn headers(&self) -> Vec<(&str, &str)> {
        vec![
            ("mcp-session-id", self.session.as_str()),
            ("mcp-protocol-version", self.version.as_str()),
        ]
    }

    pub fn id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    pub async fn post(&self, msg: &Value) -> Resp {
        self.post_raw(&msg.to_string(), &[]).await
    }

    pub async fn post_raw(&self, body: &str, extra: &[(&str, &str)]) -> Resp {
        let mut h = self.headers();
        h.push(ACCEPT_BOTH);
        h.push(JSON_CT);
        h.extend_from_slice(extra);
        send(self.addr, "POST", "/mcp", &h, Some(body)).await
    }

    /// A `tools/call` with a progress token; returns its SSE stream.
    pub async fn call(&mut self, tool: &str, args: Value, token: &str) -> (u64, Sse) {
        let id = self.id();
        let r = self
            .post(&json!({"jsonrpc":"2.0","id":id,"method":"tools/call",
                "params":{"name":tool,"arguments":args,"_meta":{"progressToken":token}}}))
            .await;
        assert_eq!(r.status, 200);
        (id, r.sse())
    }

    pub async fn get(&self, last_event_id: Option<&str>) -> Resp {
        let mut h = self.headers();
        h.push(ACCEPT_SSE);
        if let Some(l) = last_event_id {
            h.push(("last-event-id", l));
        }
        send(self.addr, "GET", "/mcp", &h, None).await
    }

    pub async fn delete(&self) -> Resp {
        send(self.addr, "DELETE", "/mcp", &self.headers(), None).await
    }
}

// ---------------------------------------------------------------------------------------------
// A TCP relay whose connections the test can sever

/// One relayed connection: its task and the bytes its client sent.
type RelayConn = (tokio::task::AbortHandle, Arc<Mutex<Vec<u8>>>);

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
                    let (mut cr, mut cw) = client.into_split();
                    let (mut sr, mut sw) = server.into_split();
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

    /// Closes every open connection, both ways.
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

// ---------------------------------------------------------------------------------------------
// SDK client peers

pub fn ts_client(url: &str, tool: &str, args: &Value, extra: &[&str]) -> Proc {
    let _ = node_modules();
    let script = require(
        peers_dir().join("ts_streamable_client.mjs"),
        "ts_streamable_client.mjs",
    );
    let mut c = Command::new("node");
    c.arg(script)
        .arg(url)
        .arg("--tool")
        .arg(tool)
        .arg("--args")
        .arg(args.to_string())
        .args(extra)
        .args(["--timeout", "90"]);
    Proc::spawn("ts_streamable_client", c)
}

pub fn py_client(url: &str, tool: &str, args: &Value, extra: &[&str]) -> Proc {
    let mut c = Command::new(python());
    c.arg(peers_dir().join("streamable_client.py"))
        .arg(url)
        .arg("--tool")
        .arg(tool)
        .arg("--args")
        .arg(args.to_string())
        .args(extra)
        .args(["--timeout", "90"]);
    Proc::spawn("streamable_client.py", c)
}

/// Numbers as the tests compare them (FastMCP sends 1.0, server-everything 1).
pub fn progress_values(list: &Value) -> Vec<f64> {
    list.as_array()
        .expect("progress list")
        .iter()
        .map(|p| p[0].as_f64().expect("numeric progress"))
        .collect()
}
