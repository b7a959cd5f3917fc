//! What the security tests (tests/security.rs, tests/tls.rs) use: requests that carry an
//! identity, over plain TCP or TLS ([`Target`]); both faces driven by hand with those headers; the
//! refusal check; a relay that cuts only the client's side of a connection ([`HalfOpenRelay`]); a
//! stub legacy upstream whose `endpoint` event names any URL, with a "trap" listener that records
//! whether anything ever connected to it ([`StubUpstream`], [`Trap`]); the proxy binary at its
//! default log level with its stderr in a file ([`ProxyBin`]); certificates made with rcgen
//! ([`Pki`]).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};

use super::{metric_value, port, pump_tapped, wait_port, Ev, Proc, Resp, Sse, WAIT};

// ---------------------------------------------------------------------------------------------
// Requests over TCP or TLS

/// Where requests go: the proxy's client listener, in plain HTTP or over TLS with a client config.
#[derive(Clone)]
pub struct Target {
    pub addr: SocketAddr,
    pub tls: Option<Arc<rustls::ClientConfig>>,
    /// The loopback address connections come from (`None`: the kernel's choice, 127.0.0.1).
    pub from: Option<std::net::IpAddr>,
}

impl Target {
    pub fn plain(addr: SocketAddr) -> Target {
        Target {
            addr,
            tls: None,
            from: None,
        }
    }

    pub fn tls(addr: SocketAddr, cfg: rustls::ClientConfig) -> Target {
        Target {
            addr,
            tls: Some(Arc::new(cfg)),
            from: None,
        }
    }

    /// The same target, reached from another loopback address (another peer, for the proxy).
    pub fn via_peer(&self, ip: &str) -> Target {
        let ip: std::net::IpAddr = ip.parse().expect("an address");
        assert!(ip.is_loopback(), "tests stay on loopback");
        Target {
            from: Some(ip),
            ..self.clone()
        }
    }

    async fn connect(&self) -> TcpStream {
        let Some(ip) = self.from else {
            return TcpStream::connect(self.addr).await.expect("connect");
        };
        let sock = tokio::net::TcpSocket::new_v4().expect("socket");
        sock.bind(SocketAddr::new(ip, 0))
            .expect("bind the peer address");
        sock.connect(self.addr).await.expect("connect")
    }

    /// One request on a fresh connection. `Host` is the listener's address unless `headers`
    /// names one.
    pub async fn send(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<&str>,
    ) -> Resp {
        let fut = async {
            let tcp = self.connect().await;
            match &self.tls {
                None => send_on(tcp, &self.addr.to_string(), method, path, headers, body).await,
                Some(cfg) => {
                    let tls = tls_connect(cfg.clone(), tcp)
                        .await
                        .expect("TLS handshake with the proxy");
                    send_on(tls, &self.addr.to_string(), method, path, headers, body).await
                }
            }
        };
        tokio::time::timeout(WAIT, fut)
            .await
            .unwrap_or_else(|_| panic!("{method} {path}: no response head within {WAIT:?}"))
    }
}

/// A TLS handshake with a server at 127.0.0.1.
pub async fn tls_connect<IO>(
    cfg: Arc<rustls::ClientConfig>,
    io: IO,
) -> std::io::Result<tokio_rustls::client::TlsStream<IO>>
where
    IO: AsyncRead + AsyncWrite + Unpin,
{
    let name =
        rustls::pki_types::ServerName::IpAddress(std::net::IpAddr::from([127, 0, 0, 1]).into());
    tokio_rustls::TlsConnector::from(cfg)
        .connect(name, io)
        .await
}

/// Sends one HTTP/1.1 request on `io`.
pub async fn send_on<IO>(
    io: IO,
    host: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&str>,
) -> Resp
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (mut tx, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .expect("handshake");
    let conn = tokio::spawn(async move {
        let _ = conn.await;
    });
    let mut req = http::Request::builder().method(method).uri(path);
    if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("host")) {
        req = req.header("host", host);
    }
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
}

impl Resp {
    /// The body as an SSE stream whatever its data (legacy streams relay any bytes).
    pub fn legacy_sse(self) -> Sse {
        assert_eq!(self.status, 200, "expected an SSE stream");
        self.into_sse(false)
    }
}

/// Checks a refusal: `status`, `Content-Type: application/json`, a JSON-RPC 2.0 error body with
/// `error.data.reason == reason`. Returns the body.
pub async fn refused(r: Resp, status: u16, reason: &str) -> Value {
    let got = r.status;
    let ct = r.header("content-type");
    let body = r.bytes().await;
    let text = String::from_utf8_lossy(&body).into_owned();
    assert_eq!(got, status, "status (body {text})");
    assert_eq!(ct.as_deref(), Some("application/json"), "{text}");
    let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"));
    assert_eq!(v["jsonrpc"], "2.0", "{v}");
    assert!(v["error"]["code"].is_i64(), "{v}");
    assert_eq!(v["error"]["data"]["reason"], reason, "{v}");
    v
}

/// A fresh random session id (32 lowercase hex), like the proxy's but known to nobody.
pub fn random_session() -> String {
    let mut b = [0u8; 16];
    getrandom::getrandom(&mut b).unwrap();
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// `text` with every occurrence of each of `ids` replaced by `<ID>`.
pub fn masked(text: &str, ids: &[&str]) -> String {
    ids.iter()
        .fold(text.to_string(), |t, id| t.replace(id, "<ID>"))
}

// ---------------------------------------------------------------------------------------------
// Metrics from the admin listener

pub async fn metrics_text(admin: SocketAddr) -> String {
    let r = Target::plain(admin)
        .send("GET", "/metrics", &[], None)
        .await;
    assert_eq!(r.status, 200);
    String::from_utf8(r.bytes().await.to_vec()).expect("utf-8")
}

pub async fn metric_at(admin: SocketAddr, series: &str) -> f64 {
    metric_value(&metrics_text(admin).await, series)
}

/// Waits until `series` satisfies `ok`; returns its value.
pub async fn wait_metric(admin: SocketAddr, series: &str, ok: impl Fn(f64) -> bool) -> f64 {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let v = metric_at(admin, series).await;
        if ok(v) {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{series} stuck at {v}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

pub const AUTH_REJECTED_LEGACY: &str = "mcp_resume_auth_rejected_total{facade=\"legacy\"}";
pub const AUTH_REJECTED_STREAMABLE: &str = "mcp_resume_auth_rejected_total{facade=\"streamable\"}";

// ---------------------------------------------------------------------------------------------
// The Streamable HTTP face, with identity headers (`who`)

pub const V_NEW: &str = "2025-11-25";

pub fn init_body(version: &str, name: &str) -> String {
    json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{
        "protocolVersion": version, "capabilities": {}, "clientInfo": {"name": name, "version":"0"}}})
    .to_string()
}

/// POST `initialize` (client name `name`) to `/mcp` carrying `who`; the answer as it comes.
pub async fn mcp_initialize(t: &Target, version: &str, name: &str, who: &[(&str, &str)]) -> Resp {
    let mut h = vec![
        ("accept", "application/json, text/event-stream"),
        ("content-type", "application/json"),
    ];
    h.extend_from_slice(who);
    t.send("POST", "/mcp", &h, Some(&init_body(version, name)))
        .await
}

/// POST `initialize` (then `notifications/initialized`) carrying `who`; returns the session id.
pub async fn mcp_init(t: &Target, version: &str, who: &[(&str, &str)]) -> String {
    let r = mcp_initialize(t, version, "raw", who).await;
    assert_eq!(r.status, 200, "initialize answered {}", r.status);
    let session = r.header("mcp-session-id").expect("Mcp-Session-Id");
    let evs = r.sse().rest().await;
    let last = evs.last().expect("initialize response").json();
    assert!(last["result"]["protocolVersion"].is_string(), "{last}");
    let r = mcp_post(
        t,
        &session,
        who,
        &json!({"jsonrpc":"2.0","method":"notifications/initialized"}).to_string(),
    )
    .await;
    assert_eq!(r.status, 202);
    session
}

pub async fn mcp_post(t: &Target, session: &str, who: &[(&str, &str)], body: &str) -> Resp {
    let mut h = vec![
        ("accept", "application/json, text/event-stream"),
        ("content-type", "application/json"),
        ("mcp-session-id", session),
        ("mcp-protocol-version", V_NEW),
    ];
    h.extend_from_slice(who);
    t.send("POST", "/mcp", &h, Some(body)).await
}

pub async fn mcp_get(
    t: &Target,
    session: &str,
    who: &[(&str, &str)],
    last_event_id: Option<&str>,
) -> Resp {
    let mut h = vec![
        ("accept", "text/event-stream"),
        ("mcp-session-id", session),
        ("mcp-protocol-version", V_NEW),
    ];
    if let Some(l) = last_event_id {
        h.push(("last-event-id", l));
    }
    h.extend_from_slice(who);
    t.send("GET", "/mcp", &h, None).await
}

pub async fn mcp_delete(t: &Target, session: &str, who: &[(&str, &str)]) -> Resp {
    let mut h = vec![("mcp-session-id", session), ("mcp-protocol-version", V_NEW)];
    h.extend_from_slice(who);
    t.send("DELETE", "/mcp", &h, None).await
}

/// A `tools/call` body.
pub fn tool_call(id: u64, tool: &str, args: Value) -> String {
    json!({"jsonrpc":"2.0","id":id,"method":"tools/call","params":{"name":tool,"arguments":args}})
        .to_string()
}

/// POST a request and read its whole POST stream; returns the final message.
pub async fn mcp_call(t: &Target, session: &str, who: &[(&str, &str)], body: &str) -> Value {
    let r = mcp_post(t, session, who, body).await;
    assert_eq!(r.status, 200, "request answered {}", r.status);
    let evs: Vec<Ev> = r.sse().rest().await;
    evs.iter()
        .rev()
        .find(|e| !e.is_priming())
        .expect("a response")
        .json()
}

// ---------------------------------------------------------------------------------------------
// The legacy face, with identity headers

/// `GET /sse` carrying `who`; returns the stream and the session id from its `endpoint` event.
pub async fn legacy_open(t: &Target, who: &[(&str, &str)]) -> (Sse, String) {
    let mut h = vec![("accept", "text/event-stream")];
    h.extend_from_slice(who);
    let r = t.send("GET", "/sse", &h, None).await;
    assert_eq!(r.status, 200, "GET /sse answered {}", r.status);
    let mut sse = r.legacy_sse();
    let ep = sse.endpoint().await;
    let session = ep
        .strip_prefix("/messages?session_id=")
        .unwrap_or_else(|| panic!("endpoint {ep}"))
        .to_string();
    (sse, session)
}

pub async fn legacy_post(t: &Target, session: &str, who: &[(&str, &str)], body: &str) -> Resp {
    let mut h = vec![("content-type", "application/json")];
    h.extend_from_slice(who);
    t.send(
        "POST",
        &format!("/messages?session_id={session}"),
        &h,
        Some(body),
    )
    .await
}

pub async fn legacy_resume(t: &Target, who: &[(&str, &str)], last_event_id: &str) -> Resp {
    let mut h = vec![
        ("accept", "text/event-stream"),
        ("last-event-id", last_event_id),
    ];
    h.extend_from_slice(who);
    t.send("GET", "/sse", &h, None).await
}

/// Opens a legacy session carrying `who` and initializes it; returns the stream, the session id
/// and the id of the `initialize` response.
pub async fn legacy_session_as(t: &Target, who: &[(&str, &str)]) -> (Sse, String, String) {
    let (mut sse, session) = legacy_open(t, who).await;
    let init = super::initialize(1).to_string();
    assert_eq!(legacy_post(t, &session, who, &init).await.status, 202);
    let (id, msg) = sse.message().await;
    assert_eq!(msg["id"], 1, "{msg}");
    let done = super::initialized().to_string();
    assert_eq!(legacy_post(t, &session, who, &done).await.status, 202);
    (sse, session, id)
}

// ---------------------------------------------------------------------------------------------
// A relay that can cut only the client's side of a connection

/// What the relay does with one connection.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Cmd {
    Run,
    /// Close both sides.
    Sever,
    /// Close the client's side; keep the proxy's side open and unread (a half-open connection,
    /// as after a NAT or load-balancer eviction: the proxy sees nothing).
    HalfOpen,
}

struct HalfConn {
    cmd: watch::Sender<Cmd>,
    /// Bytes the client sent.
    seen: Arc<Mutex<Vec<u8>>>,
    done: Arc<std::sync::atomic::AtomicBool>,
}

/// A TCP relay to `target` whose connections can be severed or half-opened one by one.
pub struct HalfOpenRelay {
    pub addr: SocketAddr,
    conns: Arc<Mutex<Vec<HalfConn>>>,
    /// Proxy-side sockets of half-open connections, kept open until the relay is dropped.
    parked: Arc<Mutex<Vec<TcpStream>>>,
    accept: tokio::task::JoinHandle<()>,
}

impl HalfOpenRelay {
    pub async fn start(target: SocketAddr) -> HalfOpenRelay {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind relay");
        let addr = listener.local_addr().expect("addr");
        let conns: Arc<Mutex<Vec<HalfConn>>> = Arc::default();
        let parked: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
        let (list, park) = (conns.clone(), parked.clone());
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = TcpStream::connect(target).await else {
                    continue;
                };
                let (cmd, mut rx) = watch::channel(Cmd::Run);
                let seen: Arc<Mutex<Vec<u8>>> = Arc::default();
                let done: Arc<std::sync::atomic::AtomicBool> = Arc::default();
                let (tap, fin, park) = (seen.clone(), done.clone(), park.clone());
                tokio::spawn(async move {
                    let mut client = client;
                    let mut server = server;
                    let how = {
                        let (cr, cw) = client.split();
                        let (sr, sw) = server.split();
                        tokio::select! {
                            _ = pump_tapped(cr, cw, sr, sw, &tap) => Cmd::Run,
                            c = async { let _ = rx.wait_for(|c| *c != Cmd::Run).await; *rx.borrow() } => c,
                        }
                    };
                    fin.store(true, Ordering::SeqCst);
                    drop(client);
                    if how == Cmd::HalfOpen {
                        park.lock().unwrap().push(server);
                    }
                });
                list.lock().unwrap().push(HalfConn { cmd, seen, done });
            }
        });
        HalfOpenRelay {
            addr,
            conns,
            parked,
            accept,
        }
    }

    fn apply(&self, pick: impl Fn(&str) -> bool, cmd: Cmd) -> usize {
        let list = self.conns.lock().unwrap();
        let mut n = 0;
        for c in list.iter() {
            let text = String::from_utf8_lossy(&c.seen.lock().unwrap()).into_owned();
            if !c.done.load(Ordering::SeqCst) && pick(&text) {
                let _ = c.cmd.send(cmd);
                n += 1;
            }
        }
        n
    }

    /// Half-opens every open connection whose client bytes so far satisfy `pick`; returns how many.
    pub fn half_open(&self, pick: impl Fn(&str) -> bool) -> usize {
        self.apply(pick, Cmd::HalfOpen)
    }

    /// Severs every open connection (both sides); returns how many.
    pub fn sever(&self) -> usize {
        self.apply(|_| true, Cmd::Sever)
    }

    /// Everything clients sent, per connection.
    pub fn client_bytes(&self) -> Vec<String> {
        self.conns
            .lock()
            .unwrap()
            .iter()
            .map(|c| String::from_utf8_lossy(&c.seen.lock().unwrap()).into_owned())
            .collect()
    }

    /// Open connections whose client bytes satisfy `pick`.
    pub fn open_matching(&self, pick: impl Fn(&str) -> bool) -> usize {
        let list = self.conns.lock().unwrap();
        list.iter()
            .filter(|c| {
                !c.done.load(Ordering::SeqCst)
                    && pick(&String::from_utf8_lossy(&c.seen.lock().unwrap()))
            })
            .count()
    }
}

impl Drop for HalfOpenRelay {
    fn drop(&mut self) {
        self.accept.abort();
        self.sever();
        self.parked.lock().unwrap().clear();
    }
}

// ---------------------------------------------------------------------------------------------
// A stub legacy upstream and a trap

/// One HTTP/1.1 request read off a raw connection.
pub struct RawReq {
    pub method: String,
    pub path: String,
    pub body: Vec<u8>,
}

/// Reads one request (head, then a `Content-Length` body); `None` when the connection closed.
pub async fn read_request(s: &mut TcpStream) -> Option<RawReq> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let n = s.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let mut lines = head.lines();
    let mut first = lines.next()?.split(' ');
    let method = first.next()?.to_string();
    let path = first.next()?.to_string();
    let len = lines
        .filter_map(|l| l.split_once(':'))
        .find(|(k, _)| k.trim().eq_ignore_ascii_case("content-length"))
        .and_then(|(_, v)| v.trim().parse::<usize>().ok())
        .unwrap_or(0);
    let mut body = buf[head_end..].to_vec();
    while body.len() < len {
        let n = s.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        body.extend_from_slice(&chunk[..n]);
    }
    Some(RawReq { method, path, body })
}

/// A listener that must never be reached: counts connections; answers any request 500 with a
/// distinctive body (so a proxy reflecting upstream bodies would show it).
pub struct Trap {
    pub port: u16,
    pub hits: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

pub const TRAP_BODY: &str = "TRAP-7f3a-upstream-secret-body";

impl Trap {
    pub async fn start() -> Trap {
        let l = TcpListener::bind(("127.0.0.1", port())).await.unwrap();
        let port = l.local_addr().unwrap().port();
        let hits = Arc::new(AtomicUsize::new(0));
        let h = hits.clone();
        let task = tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                h.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    while read_request(&mut s).await.is_some() {
                        let resp = format!("HTTP/1.1 500 Internal Server Error\r\ncontent-type: text/plain\r\ncontent-length: {}\r\n\r\n{TRAP_BODY}", TRAP_BODY.len());
                        if s.write_all(resp.as_bytes()).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        Trap { port, hits, task }
    }

    pub fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }
}

impl Drop for Trap {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Marks a message the stub writes to its SSE stream verbatim.
const RAW: &str = "\u{1}RAW";

/// A stub legacy HTTP+SSE upstream: `GET /sse` answers an `endpoint` event naming
/// `endpoint` (set before or after start), then stays open. Any `POST` (to the stub itself, or to
/// its [`StubUpstream::sink_port`], a second listener on another port = another origin) is recorded,
/// and a request is answered on the SSE stream that announced it with `{"result":{"ok":true}}`;
/// a `tools/call` of tool `fail` is instead answered `500` with [`TRAP_BODY`]; one of tool
/// `reendpoint` first sends a second `endpoint` event naming `arguments.url`. Other POSTs get 202.
pub struct StubUpstream {
    pub port: u16,
    pub sink_port: u16,
    pub endpoint: Arc<Mutex<String>>,
    pub posts: Arc<Mutex<Vec<String>>>,
    pub sse_opens: Arc<AtomicUsize>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl StubUpstream {
    pub fn sse_url(&self) -> String {
        format!("http://127.0.0.1:{}/sse", self.port)
    }

    /// Starts it; `endpoint` gets the stub's and the sink's ports and returns the endpoint
    /// event's data (`{sid}` in it is replaced by a per-stream id).
    pub async fn start(endpoint: impl Fn(u16, u16) -> String) -> StubUpstream {
        let l = TcpListener::bind(("127.0.0.1", port())).await.unwrap();
        let sink = TcpListener::bind(("127.0.0.1", port())).await.unwrap();
        let (p, sp) = (
            l.local_addr().unwrap().port(),
            sink.local_addr().unwrap().port(),
        );
        let endpoint = Arc::new(Mutex::new(endpoint(p, sp)));
        let posts: Arc<Mutex<Vec<String>>> = Arc::default();
        let sse_opens = Arc::new(AtomicUsize::new(0));
        // Stream id -> its SSE sender.
        let streams: Arc<Mutex<Vec<mpsc::UnboundedSender<String>>>> = Arc::default();
        let mut tasks = Vec::new();
        for listener in [l, sink] {
            let (endpoint, posts, streams, opens) = (
                endpoint.clone(),
                posts.clone(),
                streams.clone(),
                sse_opens.clone(),
            );
            tasks.push(tokio::spawn(async move {
                while let Ok((s, _)) = listener.accept().await {
                    let (endpoint, posts, streams, opens) = (
                        endpoint.clone(),
                        posts.clone(),
                        streams.clone(),
                        opens.clone(),
                    );
                    tokio::spawn(stub_conn(s, endpoint, posts, streams, opens));
                }
            }));
        }
        StubUpstream {
            port: p,
            sink_port: sp,
            endpoint,
            posts,
            sse_opens,
            tasks,
        }
    }

    pub fn posts(&self) -> Vec<String> {
        self.posts.lock().unwrap().clone()
    }
}

impl Drop for StubUpstream {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

async fn stub_conn(
    mut s: TcpStream,
    endpoint: Arc<Mutex<String>>,
    posts: Arc<Mutex<Vec<String>>>,
    streams: Arc<Mutex<Vec<mpsc::UnboundedSender<String>>>>,
    opens: Arc<AtomicUsize>,
) {
    while let Some(req) = read_request(&mut s).await {
        if req.method == "GET" {
            opens.fetch_add(1, Ordering::SeqCst);
            let (tx, mut rx) = mpsc::unbounded_channel();
            let sid = {
                let mut st = streams.lock().unwrap();
                st.push(tx);
                st.len() - 1
            };
            let ep = endpoint.lock().unwrap().replace("{sid}", &sid.to_string());
            let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n\r\n";
            if s.write_all(format!("{head}event: endpoint\ndata: {ep}\n\n").as_bytes())
                .await
                .is_err()
            {
                return;
            }
            while let Some(msg) = rx.recv().await {
                let frame = match msg.strip_prefix(RAW) {
                    Some(raw) => raw.to_string(),
                    None => format!("event: message\ndata: {msg}\n\n"),
                };
                if s.write_all(frame.as_bytes()).await.is_err() {
                    return;
                }
            }
            return;
        }
        let text = String::from_utf8_lossy(&req.body).into_owned();
        posts.lock().unwrap().push(text.clone());
        let msg: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
        if msg["method"] == "tools/call" && msg["params"]["name"] == "fail" {
            let resp = format!("HTTP/1.1 500 Internal Server Error\r\ncontent-type: text/plain\r\ncontent-length: {}\r\n\r\n{TRAP_BODY}", TRAP_BODY.len());
            let _ = s.write_all(resp.as_bytes()).await;
            continue;
        }
        let _ = s
            .write_all(b"HTTP/1.1 202 Accepted\r\ncontent-length: 8\r\n\r\nAccepted")
            .await;
        if msg.get("id").is_some() && msg.get("method").is_some() {
            // Which stream: the query's `sid=N`, else the latest.
            let sid = req
                .path
                .split("sid=")
                .nth(1)
                .and_then(|v| v.split('&').next())
                .and_then(|v| v.parse::<usize>().ok());
            let result = if msg["method"] == "initialize" {
                json!({"protocolVersion": msg["params"]["protocolVersion"], "capabilities": {},
                       "serverInfo": {"name": "stub", "version": "0"}})
            } else {
                json!({"ok": true})
            };
            let answer = json!({"jsonrpc":"2.0","id":msg["id"],"result":result}).to_string();
            let st = streams.lock().unwrap();
            let tx = match sid {
                Some(i) => st.get(i),
                None => st.last(),
            };
            if let Some(tx) = tx {
                if msg["params"]["name"] == "reendpoint" {
                    // A second `endpoint` event, mid-session, naming another URL.
                    let url = msg["params"]["arguments"]["url"].as_str().unwrap_or("");
                    let _ = tx.send(format!("{RAW}event: endpoint\ndata: {url}\n\n"));
                }
                let _ = tx.send(answer);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The proxy binary at the default log level

/// The proxy binary with a TOML config, its stderr (the log) in a file, `MCP_RESUME_PROXY_LOG`
/// unset (the default level, info).
pub struct ProxyBin {
    pub proc: Proc,
    pub addr: SocketAddr,
    pub admin: SocketAddr,
    pub stderr: PathBuf,
}

impl ProxyBin {
    /// `extra` is appended to the config after the harness's `[listen]`, `[admin]`, `[upstream]`
    /// and `[log]` sections (so it may not repeat them).
    pub async fn start(upstream: &str, dir: &Path, extra: &str) -> ProxyBin {
        let (p, a) = (port(), port());
        let cfg = dir.join("proxy.toml");
        let data = dir.join("data");
        std::fs::write(
            &cfg,
            format!(
                "[listen]\naddr = \"127.0.0.1:{p}\"\n[admin]\naddr = \"127.0.0.1:{a}\"\n\
                 [upstream]\nsse_url = \"{upstream}\"\npost_timeout_secs = 5\n\
                 [log]\ndir = \"{}\"\n{extra}",
                data.display()
            ),
        )
        .unwrap();
        let stderr = dir.join("proxy.stderr");
        let file = std::fs::File::create(&stderr).unwrap();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_mcp-resume-proxy"));
        cmd.args(["run", "--config"])
            .arg(&cfg)
            .env_remove("MCP_RESUME_PROXY_LOG")
            .env_remove("RUST_LOG");
        let proc = Proc::spawn_to("proxy binary", cmd, Stdio::from(file));
        wait_port(a).await;
        wait_port(p).await;
        ProxyBin {
            proc,
            addr: ([127, 0, 0, 1], p).into(),
            admin: ([127, 0, 0, 1], a).into(),
            stderr,
        }
    }

    /// SIGTERM, wait for the exit; returns the captured log.
    pub fn stop(mut self) -> String {
        self.proc.signal("TERM");
        let code = self.proc.wait();
        assert_eq!(code, Some(0), "clean exit after SIGTERM");
        std::fs::read_to_string(&self.stderr).unwrap()
    }
}

// ---------------------------------------------------------------------------------------------
// Certificates

/// A certificate authority made at test time.
pub struct Ca {
    pub cert: rcgen::Certificate,
    pub key: rcgen::KeyPair,
}

/// A leaf certificate and its key, in PEM.
#[derive(Clone)]
pub struct Leaf {
    pub cert_pem: String,
    pub key_pem: String,
    pub der: Vec<u8>,
}

impl Ca {
    pub fn new(name: &str) -> Ca {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        p.distinguished_name.push(rcgen::DnType::CommonName, name);
        p.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::CrlSign,
            rcgen::KeyUsagePurpose::DigitalSignature,
        ];
        Ca {
            cert: p.self_signed(&key).unwrap(),
            key,
        }
    }

    pub fn pem(&self) -> String {
        self.cert.pem()
    }

    fn sign(&self, p: rcgen::CertificateParams) -> Leaf {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = p.signed_by(&key, &self.cert, &self.key).unwrap();
        Leaf {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            der: cert.der().to_vec(),
        }
    }

    /// A server certificate for 127.0.0.1 with serial `serial`; `expired` makes it valid only
    /// in the past.
    pub fn server(&self, serial: u64, expired: bool) -> Leaf {
        let mut p = rcgen::CertificateParams::new(vec!["127.0.0.1".into()]).unwrap();
        p.distinguished_name
            .push(rcgen::DnType::CommonName, format!("server {serial}"));
        p.serial_number = Some(rcgen::SerialNumber::from(serial));
        p.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
        if expired {
            p.not_before = rcgen::date_time_ymd(2020, 1, 1);
            p.not_after = rcgen::date_time_ymd(2021, 1, 1);
        }
        self.sign(p)
    }

    /// A client certificate named `name`.
    pub fn client(&self, name: &str) -> Leaf {
        let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        p.distinguished_name.push(rcgen::DnType::CommonName, name);
        p.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
        self.sign(p)
    }
}

impl Leaf {
    /// Writes `{stem}.crt` and `{stem}.key` into `dir`; returns their paths.
    pub fn write(&self, dir: &Path, stem: &str) -> (PathBuf, PathBuf) {
        let (c, k) = (
            dir.join(format!("{stem}.crt")),
            dir.join(format!("{stem}.key")),
        );
        std::fs::write(&c, &self.cert_pem).unwrap();
        std::fs::write(&k, &self.key_pem).unwrap();
        (c, k)
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A rustls client config trusting `ca`, presenting `client` when given.
pub fn client_config(ca: &Ca, client: Option<&Leaf>) -> rustls::ClientConfig {
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca.cert.der().clone()).unwrap();
    let b = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
    let mut cfg = match client {
        None => b.with_no_client_auth(),
        Some(l) => {
            let chain = vec![rustls::pki_types::CertificateDer::from(l.der.clone())];
            let key =
                rustls::pki_types::PrivateKeyDer::from_pem_slice(l.key_pem.as_bytes()).unwrap();
            b.with_client_auth_cert(chain, key).unwrap()
        }
    };
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    cfg
}

/// A rustls server config serving `leaf`.
pub fn server_config(leaf: &Leaf) -> rustls::ServerConfig {
    use rustls::pki_types::pem::PemObject;
    let chain = vec![rustls::pki_types::CertificateDer::from(leaf.der.clone())];
    let key = rustls::pki_types::PrivateKeyDer::from_pem_slice(leaf.key_pem.as_bytes()).unwrap();
    rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .unwrap()
}

/// The TLS handshake's outcome against `addr`: the served leaf certificate (DER), or the error.
pub async fn handshake(
    addr: SocketAddr,
    cfg: rustls::ClientConfig,
) -> Result<Vec<u8>, std::io::Error> {
    let tcp = TcpStream::connect(addr).await?;
    let tls = tokio::time::timeout(WAIT, tls_connect(Arc::new(cfg), tcp))
        .await
        .map_err(|_| std::io::Error::other("handshake timed out"))??;
    // TLS 1.3: a client certificate the server refuses is only reported after the client's
    // handshake completes; one round trip with the server tells.
    let (_, conn) = tls.get_ref();
    let leaf = conn
        .peer_certificates()
        .and_then(|c| c.first())
        .map(|c| c.as_ref().to_vec())
        .unwrap_or_default();
    let mut tls = tls;
    tls.write_all(b"GET /nope HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n\r\n")
        .await?;
    let mut buf = Vec::new();
    tokio::time::timeout(WAIT, tls.read_to_end(&mut buf))
        .await
        .map_err(|_| std::io::Error::other("no answer"))??;
    if !buf.starts_with(b"HTTP/1.1 ") {
        return Err(std::io::Error::other(format!(
            "no HTTP answer after the handshake: {:?}",
            String::from_utf8_lossy(&buf)
        )));
    }
    Ok(leaf)
}
