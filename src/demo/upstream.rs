//! Embedded legacy HTTP+SSE MCP server (spec 2024-11-05): the demo/test upstream.
//!
//! The proxy fronts unmodified legacy servers, but running a Node or Python server is
//! heavy, slow to start and cannot misbehave on demand. This module is a small, fast
//! stand-in that mirrors the wire format of the TypeScript SDK's `SSEServerTransport`
//! as used by server-everything (`GET /sse`, `POST /message?sessionId=…`, `202 Accepted`,
//! no SSE `id:` fields, session gone when the stream closes). It is used by the `demo`
//! subcommand, by tests that need failure injection (`misbehave`, [`Upstream::drop_all_sessions`])
//! and by the load harness (`emit`, a paced high-rate notification source).
//!
//! Every session owns one SSE body fed by a bounded channel of ready-made frames, so a
//! slow reader applies backpressure to that session's tools only.

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::io::{self, Write as _};
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use http_body::{Body, Frame, SizeHint};
use http_body_util::{BodyExt, LengthLimitError, Limited};
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::{Instant, MissedTickBehavior};

/// Frames buffered per session before tools block (backpressure).
const SSE_CHANNEL_CAPACITY: usize = 256;
/// POST body limit, as in the TypeScript SDK.
const MAX_POST_BODY: usize = 4 * 1024 * 1024;
/// Size of the `data:` payload written by `misbehave {kind:"oversized"}`.
const OVERSIZED_BYTES: usize = 2 * 1024 * 1024;
/// Upper bound of `emit`'s `size` (padding per event).
const MAX_EMIT_PAD: usize = 16 * 1024 * 1024;
/// Protocol versions echoed back by `initialize`; anything else gets the first one.
const SUPPORTED_VERSIONS: [&str; 4] = ["2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25"];

/// Options of the embedded upstream.
#[derive(Clone, Debug, Default)]
pub struct UpstreamOptions {
    /// Line ending used on the SSE stream: false = LF (like the TypeScript SDK), true = CRLF (like Python sse-starlette).
    pub crlf: bool,
    /// If Some(secs), send a `: ping` comment every secs (Python style); None = no keepalive (TS style).
    /// `Some(0)` is treated as 1 s.
    pub ping_secs: Option<u64>,
}

/// Handle for a running upstream started with [`Upstream::spawn`].
///
/// Dropping the handle (or calling [`Upstream::stop`]) shuts the server down.
pub struct Upstream {
    /// Address the server listens on (always 127.0.0.1 with an ephemeral port).
    pub addr: SocketAddr,
    inner: Arc<Inner>,
    /// Dropping this sender completes the shutdown future of the server task.
    _shutdown: oneshot::Sender<()>,
}

impl Upstream {
    /// Serve on `listener` until `shutdown` completes. Every open SSE stream ends when shutdown fires.
    pub async fn serve(
        listener: TcpListener,
        opts: UpstreamOptions,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> io::Result<()> {
        run(listener, Arc::new(Inner::new(opts)), shutdown).await
    }

    /// Convenience: bind 127.0.0.1:0, spawn serve() on the current tokio runtime, return a handle whose drop (or `.stop()`) shuts it down.
    pub async fn spawn(opts: UpstreamOptions) -> io::Result<Upstream> {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
        let addr = listener.local_addr()?;
        let inner = Arc::new(Inner::new(opts));
        let (tx, rx) = oneshot::channel::<()>();
        let shutdown = async move {
            let _ = rx.await;
        };
        tokio::spawn(run(listener, inner.clone(), shutdown));
        Ok(Upstream {
            addr,
            inner,
            _shutdown: tx,
        })
    }

    /// URL of the SSE endpoint, e.g. `http://127.0.0.1:PORT/sse`.
    pub fn sse_url(&self) -> String {
        format!("http://{}/sse", self.addr)
    }

    /// Number of currently open SSE sessions (for tests: proves the proxy kept/closed its upstream link).
    pub fn open_sessions(&self) -> usize {
        self.inner.lock().map.len()
    }

    /// Abruptly close every SSE stream and forget all sessions (simulates the upstream process losing its sessions while still listening, like a restart).
    pub fn drop_all_sessions(&self) {
        // Dropping the kill senders makes every body fail, which aborts its connection.
        drop(self.inner.take_all(false));
    }

    /// Shut the server down (same as dropping the handle).
    pub fn stop(self) {}
}

/// The embedded upstream without a socket: every [`MemoryUpstream::connect`] is a new in-memory
/// connection served by it (unit tests of the session registry run with paused time, where real
/// sockets would not do).
#[doc(hidden)]
#[derive(Clone)]
pub struct MemoryUpstream {
    inner: Arc<Inner>,
    stop: watch::Receiver<bool>,
    _stop: Arc<watch::Sender<bool>>,
}

impl MemoryUpstream {
    /// A new in-memory upstream.
    pub fn new(opts: UpstreamOptions) -> Self {
        let (tx, rx) = watch::channel(false);
        Self {
            inner: Arc::new(Inner::new(opts)),
            stop: rx,
            _stop: Arc::new(tx),
        }
    }

    /// A new connection to it (the client's end).
    pub fn connect(&self) -> tokio::io::DuplexStream {
        let (client, server) = tokio::io::duplex(64 * 1024);
        // No header-read timeout in memory: a pipe has no slow client to guard against, and
        // under a paused clock the guard's timer on an idle pooled POST connection is the one the
        // clock jumps to whenever a test awaits the log writer's thread.
        tokio::spawn(serve_conn(
            server,
            self.inner.clone(),
            self.stop.clone(),
            None,
        ));
        client
    }

    /// Number of open SSE sessions.
    pub fn open_sessions(&self) -> usize {
        self.inner.lock().map.len()
    }

    /// Closes every SSE stream abruptly (the upstream loses its sessions).
    pub fn drop_all_sessions(&self) {
        drop(self.inner.take_all(false));
    }

    /// Forgets every session while its SSE stream stays open until the returned handles are
    /// dropped: meanwhile its POSTs are answered 404, as by a server that lost the session
    /// before its stream noticed.
    pub fn forget_sessions(&self) -> Vec<oneshot::Sender<()>> {
        self.inner.take_all(false)
    }
}

impl std::fmt::Debug for Upstream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Upstream")
            .field("addr", &self.addr)
            .field("open_sessions", &self.open_sessions())
            .finish()
    }
}

/// State shared by the accept loop, connections, SSE bodies and tool tasks.
struct Inner {
    opts: UpstreamOptions,
    sessions: Mutex<Sessions>,
}

struct Sessions {
    map: HashMap<String, Arc<Session>>,
    /// Set at shutdown: no new sessions are opened afterwards.
    closed: bool,
}

/// One SSE session. Frames go through `tx`; an empty frame is an in-band "abort the
/// stream" marker (so it is ordered after everything queued before it).
struct Session {
    tx: mpsc::Sender<Bytes>,
    /// `send(())` ends the stream cleanly, dropping the sender aborts it.
    kill: Mutex<Option<oneshot::Sender<()>>>,
    /// Per-session `emit` sequence number, locked per event so seqs hit the wire in order.
    emit_seq: tokio::sync::Mutex<u64>,
    eol: &'static [u8],
}

/// The session ended (client gone, session dropped, or `misbehave close`).
struct Gone;

enum Fail {
    Rpc(i64, String),
    Gone,
    /// The tool wrote its own (deliberately broken) response: send none.
    Answered,
}

impl From<Gone> for Fail {
    fn from(_: Gone) -> Self {
        Fail::Gone
    }
}

impl Inner {
    fn new(opts: UpstreamOptions) -> Self {
        let sessions = Sessions {
            map: HashMap::new(),
            closed: false,
        };
        Inner {
            opts,
            sessions: Mutex::new(sessions),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Sessions> {
        self.sessions.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn get(&self, id: &str) -> Option<Arc<Session>> {
        self.lock().map.get(id).cloned()
    }

    /// Forget `session` if it is still registered (bodies call this on drop).
    fn remove(&self, id: &str, session: &Arc<Session>) {
        let mut s = self.lock();
        if s.map.get(id).is_some_and(|cur| Arc::ptr_eq(cur, session)) {
            s.map.remove(id);
            tracing::debug!(session = id, "demo upstream: session closed");
        }
    }

    /// Remove every session and return their kill senders (dropped outside the lock).
    fn take_all(&self, close: bool) -> Vec<oneshot::Sender<()>> {
        let mut s = self.lock();
        s.closed |= close;
        let kills = s.map.drain().filter_map(|(_, session)| {
            let kill = session
                .kill
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .take();
            kill
        });
        kills.collect()
    }

    fn open_session(self: &Arc<Self>) -> Option<SseBody> {
        let mut raw = [0u8; 16];
        getrandom::getrandom(&mut raw).ok()?;
        let id: String = raw.iter().map(|b| format!("{b:02x}")).collect();
        let eol: &'static [u8] = if self.opts.crlf { b"\r\n" } else { b"\n" };
        let (tx, rx) = mpsc::channel(SSE_CHANNEL_CAPACITY);
        let (kill_tx, kill_rx) = oneshot::channel();
        let session = Arc::new(Session {
            tx,
            kill: Mutex::new(Some(kill_tx)),
            emit_seq: tokio::sync::Mutex::new(0),
            eol,
        });
        let endpoint = format!("/message?sessionId={id}");
        let first = session.frame("endpoint", endpoint.as_bytes());
        session.tx.try_send(first).ok()?;
        {
            let mut s = self.lock();
            if s.closed {
                return None;
            }
            s.map.insert(id.clone(), session.clone());
        }
        tracing::debug!(session = %id, "demo upstream: session opened");
        let ping = self.opts.ping_secs.map(|secs| {
            let period = Duration::from_secs(secs.max(1));
            let mut iv = tokio::time::interval_at(Instant::now() + period, period);
            iv.set_missed_tick_behavior(MissedTickBehavior::Delay);
            iv
        });
        let ping_frame = Bytes::from([b": ping", eol, eol].concat());
        Some(SseBody {
            inner: self.clone(),
            id,
            session,
            rx,
            kill: Some(kill_rx),
            ping,
            ping_frame,
        })
    }
}

impl Session {
    /// One SSE event frame with a single `data:` line (`data` must not contain newlines).
    fn frame(&self, event: &str, data: &[u8]) -> Bytes {
        let mut v = Vec::with_capacity(16 + event.len() + data.len());
        for part in [
            b"event: ",
            event.as_bytes(),
            self.eol,
            b"data: ",
            data,
            self.eol,
            self.eol,
        ] {
            v.extend_from_slice(part);
        }
        Bytes::from(v)
    }

    async fn send_frame(&self, frame: Bytes) -> Result<(), Gone> {
        self.tx.send(frame).await.map_err(|_| Gone)
    }

    async fn send_json(&self, msg: &Value) -> Result<(), Gone> {
        let data = serde_json::to_vec(msg).map_err(|_| Gone)?;
        self.send_frame(self.frame("message", &data)).await
    }

    async fn notify(&self, method: &str, params: Value) -> Result<(), Gone> {
        let msg = json!({"jsonrpc": "2.0", "method": method, "params": params});
        self.send_json(&msg).await
    }

    /// The `emit` notification frame, built with one allocation and no JSON tree.
    fn emit_frame(&self, seq: u64, t_ns: u128, pad: usize) -> Bytes {
        let mut v = Vec::with_capacity(192 + pad);
        v.extend_from_slice(b"event: message");
        v.extend_from_slice(self.eol);
        v.extend_from_slice(b"data: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/message\",\"params\":{\"level\":\"info\",\"logger\":\"emit\",\"data\":{\"seq\":");
        let _ = write!(v, "{seq},\"t_ns\":{t_ns},\"pad\":\"");
        v.resize(v.len() + pad, b'x');
        v.extend_from_slice(b"\"}}}");
        v.extend_from_slice(self.eol);
        v.extend_from_slice(self.eol);
        Bytes::from(v)
    }
}

/// Streaming body of one SSE session.
struct SseBody {
    inner: Arc<Inner>,
    id: String,
    session: Arc<Session>,
    rx: mpsc::Receiver<Bytes>,
    kill: Option<oneshot::Receiver<()>>,
    ping: Option<tokio::time::Interval>,
    ping_frame: Bytes,
}

impl Drop for SseBody {
    fn drop(&mut self) {
        self.inner.remove(&self.id, &self.session);
    }
}

fn aborted() -> io::Error {
    io::Error::new(io::ErrorKind::ConnectionAborted, "SSE session dropped")
}

impl SseBody {
    fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, io::Error>>> {
        if let Some(kill) = self.kill.as_mut() {
            if let Poll::Ready(r) = Pin::new(kill).poll(cx) {
                self.kill = None;
                self.rx.close();
                return Poll::Ready(r.err().map(|_| Err(aborted())));
            }
        } else {
            return Poll::Ready(None);
        }
        match self.rx.poll_recv(cx) {
            Poll::Ready(Some(b)) if b.is_empty() => {
                self.kill = None;
                return Poll::Ready(Some(Err(aborted())));
            }
            Poll::Ready(Some(b)) => return Poll::Ready(Some(Ok(Frame::data(b)))),
            Poll::Ready(None) => return Poll::Ready(None),
            Poll::Pending => {}
        }
        if let Some(ping) = self.ping.as_mut() {
            if ping.poll_tick(cx).is_ready() {
                return Poll::Ready(Some(Ok(Frame::data(self.ping_frame.clone()))));
            }
        }
        Poll::Pending
    }
}

/// Response body: either a small fixed text or an SSE stream.
enum OutBody {
    Full(Option<Bytes>),
    Sse(Box<SseBody>),
}

impl Body for OutBody {
    type Data = Bytes;
    type Error = io::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, io::Error>>> {
        match self.get_mut() {
            OutBody::Full(b) => Poll::Ready(b.take().map(|b| Ok(Frame::data(b)))),
            OutBody::Sse(s) => s.poll_next(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        matches!(self, OutBody::Full(None))
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            OutBody::Full(b) => SizeHint::with_exact(b.as_ref().map_or(0, |b| b.len() as u64)),
            OutBody::Sse(_) => SizeHint::default(),
        }
    }
}

fn text(status: StatusCode, body: impl Into<Bytes>) -> Response<OutBody> {
    let mut resp = Response::new(OutBody::Full(Some(body.into())));
    *resp.status_mut() = status;
    let ct = HeaderValue::from_static("text/plain; charset=utf-8");
    resp.headers_mut().insert(header::CONTENT_TYPE, ct);
    resp
}

fn not_allowed(allow: &'static str) -> Response<OutBody> {
    let mut resp = text(StatusCode::METHOD_NOT_ALLOWED, "Method Not Allowed");
    resp.headers_mut()
        .insert(header::ALLOW, HeaderValue::from_static(allow));
    resp
}

async fn run(
    listener: TcpListener,
    inner: Arc<Inner>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> io::Result<()> {
    let (stop_tx, stop_rx) = watch::channel(false);
    tokio::pin!(shutdown);
    loop {
        let stream = tokio::select! {
            biased;
            _ = &mut shutdown => break,
            r = listener.accept() => match r {
                Ok((stream, _)) => stream,
                Err(e) => {
                    tracing::warn!(error = %e, "demo upstream: accept failed");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            },
        };
        let _ = stream.set_nodelay(true);
        tokio::spawn(serve_conn(
            stream,
            inner.clone(),
            stop_rx.clone(),
            Some(Duration::from_secs(30)),
        ));
    }
    drop(listener);
    for kill in inner.take_all(true) {
        let _ = kill.send(()); // clean end of each SSE body
    }
    let _ = stop_tx.send(true);
    drop(stop_rx);
    // Give connections a moment to finish; the tasks keep going on their own after that.
    let _ = tokio::time::timeout(Duration::from_secs(5), stop_tx.closed()).await;
    Ok(())
}

/// Serves one connection; `header_read_timeout` bounds the wait for each request head (hyper's
/// default is 30 s).
async fn serve_conn<S>(
    stream: S,
    inner: Arc<Inner>,
    mut stop: watch::Receiver<bool>,
    header_read_timeout: Option<Duration>,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let svc = hyper::service::service_fn(move |req| {
        let inner = inner.clone();
        async move { Ok::<_, Infallible>(route(inner, req).await) }
    });
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(header_read_timeout)
        .serve_connection(TokioIo::new(stream), svc);
    tokio::pin!(conn);
    let res = tokio::select! {
        r = conn.as_mut() => r,
        _ = async { let _ = stop.wait_for(|s| *s).await; } => {
            conn.as_mut().graceful_shutdown();
            conn.await
        }
    };
    if let Err(e) = res {
        tracing::debug!(error = %e, "demo upstream: connection ended");
    }
}

async fn route(inner: Arc<Inner>, req: Request<Incoming>) -> Response<OutBody> {
    match (req.uri().path(), req.method()) {
        ("/sse", &Method::GET) => match inner.open_session() {
            Some(body) => {
                let mut resp = Response::new(OutBody::Sse(Box::new(body)));
                let h = resp.headers_mut();
                h.insert(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("text/event-stream"),
                );
                h.insert(
                    header::CACHE_CONTROL,
                    HeaderValue::from_static("no-cache, no-transform"),
                );
                resp
            }
            None => text(StatusCode::SERVICE_UNAVAILABLE, "Shutting down"),
        },
        ("/sse", _) => not_allowed("GET"),
        ("/message", &Method::POST) => post_message(inner, req).await,
        ("/message", _) => not_allowed("POST"),
        _ => text(StatusCode::NOT_FOUND, "Not Found"),
    }
}

fn session_param(query: Option<&str>) -> Option<&str> {
    query?
        .split('&')
        .find_map(|kv| kv.strip_prefix("sessionId="))
}

async fn post_message(inner: Arc<Inner>, req: Request<Incoming>) -> Response<OutBody> {
    let Some(session) = session_param(req.uri().query()).and_then(|id| inner.get(id)) else {
        return text(StatusCode::NOT_FOUND, "Session not found");
    };
    let body = match Limited::new(req.into_body(), MAX_POST_BODY).collect().await {
        Ok(c) => c.to_bytes(),
        Err(e) if e.is::<LengthLimitError>() => {
            return text(StatusCode::PAYLOAD_TOO_LARGE, "Payload Too Large")
        }
        Err(_) => return text(StatusCode::BAD_REQUEST, "Invalid message: unreadable body"),
    };
    let msg: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => return text(StatusCode::BAD_REQUEST, format!("Invalid message: {e}")),
    };
    // Single messages only: legacy servers reject batches (arrays) and non-objects.
    let Some(obj) = msg.as_object() else {
        return text(
            StatusCode::BAD_REQUEST,
            "Invalid message: expected a JSON-RPC object",
        );
    };
    match (obj.get("method"), obj.get("id")) {
        (Some(Value::String(method)), Some(id)) => {
            let (method, id) = (method.clone(), id.clone());
            let params = obj.get("params").cloned().unwrap_or(Value::Null);
            tokio::spawn(handle_request(inner, session, id, method, params));
        }
        (Some(Value::String(_)), None) => {} // notifications (incl. notifications/initialized)
        (None, Some(_)) if obj.contains_key("result") || obj.contains_key("error") => {} // responses
        _ => {
            return text(
                StatusCode::BAD_REQUEST,
                "Invalid message: not a JSON-RPC message",
            )
        }
    }
    text(StatusCode::ACCEPTED, "Accepted")
}

async fn handle_request(
    inner: Arc<Inner>,
    session: Arc<Session>,
    id: Value,
    method: String,
    params: Value,
) {
    let outcome = match method.as_str() {
        "initialize" => Ok(initialize_result(&params)),
        "ping" => Ok(json!({})),
        "tools/list" => Ok(tools_list()),
        "tools/call" => call_tool(&inner, &session, &id, &params).await,
        _ => Err(Fail::Rpc(
            crate::jsonrpc::METHOD_NOT_FOUND,
            format!("Method not found: {method}"),
        )),
    };
    let msg = match outcome {
        Ok(result) => json!({"jsonrpc": "2.0", "id": id, "result": result}),
        Err(Fail::Rpc(code, message)) => {
            json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}})
        }
        Err(Fail::Gone | Fail::Answered) => return,
    };
    let _ = session.send_json(&msg).await;
}

fn initialize_result(params: &Value) -> Value {
    let asked = params.get("protocolVersion").and_then(Value::as_str);
    let version = asked
        .filter(|v| SUPPORTED_VERSIONS.contains(v))
        .unwrap_or(SUPPORTED_VERSIONS[0]);
    json!({
        "protocolVersion": version,
        "capabilities": {"tools": {}, "logging": {}},
        "serverInfo": {"name": "demo-upstream", "version": env!("CARGO_PKG_VERSION")},
    })
}

fn tools_list() -> Value {
    let int = |desc: &str| json!({"type": "integer", "minimum": 0, "description": desc});
    json!({"tools": [
        {"name": "count", "description": "Send n progress (if a progressToken is given) and log notifications, interval_ms apart, then respond.",
         "inputSchema": {"type": "object", "required": ["n"], "properties": {
             "n": int("number of steps"), "interval_ms": int("delay after each step (default 100)")}}},
        {"name": "echo", "description": "Return the given text.",
         "inputSchema": {"type": "object", "required": ["text"], "properties": {"text": {"type": "string"}}}},
        {"name": "emit", "description": "Send count log notifications with a per-session seq, paced at rate_per_sec (0 = unpaced).",
         "inputSchema": {"type": "object", "required": ["count"], "properties": {
             "count": int("number of notifications"), "rate_per_sec": int("events per second, 0 = as fast as possible"),
             "size": int("padding bytes per event (default 0)")}}},
        {"name": "list_changed", "description": "Send count notifications/tools/list_changed (unpaced), then respond.",
         "inputSchema": {"type": "object", "required": ["count"], "properties": {
             "count": int("number of notifications")}}},
        {"name": "misbehave", "description": "Failure injection on this session's SSE stream.",
         "inputSchema": {"type": "object", "required": ["kind"], "properties": {"kind": {
             "type": "string", "enum": ["oversized", "malformed_json", "malformed_response", "bad_utf8", "close"]}}}},
    ]})
}

fn text_result(text: String) -> Value {
    json!({"content": [{"type": "text", "text": text}]})
}

fn arg_u64(args: &Value, name: &str, default: Option<u64>) -> Result<u64, Fail> {
    match (args.get(name), default) {
        (Some(v), _) => v.as_u64(),
        (None, d) => d,
    }
    .ok_or_else(|| {
        Fail::Rpc(
            crate::jsonrpc::INVALID_PARAMS,
            format!("argument `{name}` must be a non-negative integer"),
        )
    })
}

fn unix_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}

async fn call_tool(
    inner: &Inner,
    session: &Arc<Session>,
    id: &Value,
    params: &Value,
) -> Result<Value, Fail> {
    let name = params
        .get("name")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let args = params.get("arguments").unwrap_or(&Value::Null);
    match name {
        "echo" => match args.get("text").and_then(Value::as_str) {
            Some(t) => Ok(text_result(t.to_owned())),
            None => Err(Fail::Rpc(
                crate::jsonrpc::INVALID_PARAMS,
                "argument `text` must be a string".into(),
            )),
        },
        "count" => {
            let n = arg_u64(args, "n", None)?;
            let interval = Duration::from_millis(arg_u64(args, "interval_ms", Some(100))?);
            let token = params.pointer("/_meta/progressToken");
            for i in 1..=n {
                if let Some(token) = token {
                    let p = json!({"progressToken": token, "progress": i, "total": n, "message": format!("step {i}")});
                    session.notify("notifications/progress", p).await?;
                }
                let log =
                    json!({"level": "info", "logger": "count", "data": {"request": id, "i": i}});
                session.notify("notifications/message", log).await?;
                if !interval.is_zero() {
                    // (A zero sleep still waits for the timer's next millisecond tick.)
                    tokio::time::sleep(interval).await;
                }
            }
            Ok(text_result(format!("counted {n}")))
        }
        "emit" => {
            let count = arg_u64(args, "count", None)?;
            let rate = arg_u64(args, "rate_per_sec", Some(0))?;
            let pad = usize::try_from(arg_u64(args, "size", Some(0))?)
                .unwrap_or(usize::MAX)
                .min(MAX_EMIT_PAD);
            let start = Instant::now();
            for k in 0..count {
                if rate > 0 {
                    // Due time of event k measured from the start: no drift, bursts catch up.
                    let due = start
                        + Duration::from_nanos(
                            (u128::from(k) * 1_000_000_000 / u128::from(rate)) as u64,
                        );
                    if due > Instant::now() {
                        tokio::time::sleep_until(due).await;
                    }
                }
                let mut seq = session.emit_seq.lock().await;
                *seq += 1;
                let frame = session.emit_frame(*seq, unix_ns(), pad);
                session.send_frame(frame).await?;
            }
            Ok(text_result(format!("emitted {count}")))
        }
        "list_changed" => {
            let count = arg_u64(args, "count", None)?;
            for _ in 0..count {
                session
                    .notify("notifications/tools/list_changed", json!({}))
                    .await?;
            }
            Ok(text_result(format!("sent {count}")))
        }
        "misbehave" => {
            let kind = args.get("kind").and_then(Value::as_str).unwrap_or_default();
            let data: Vec<u8> = match kind {
                "oversized" => {
                    let head = br#"{"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info","logger":"misbehave","data":{"pad":""#;
                    let tail = br#""}}}"#;
                    let mut v = Vec::with_capacity(OVERSIZED_BYTES);
                    v.extend_from_slice(head);
                    v.resize(OVERSIZED_BYTES - tail.len(), b'x');
                    v.extend_from_slice(tail);
                    v
                }
                "malformed_json" => b"{not json".to_vec(),
                "malformed_response" => {
                    // The call's own response, cut short: its request is answered only by
                    // bytes that are not JSON (an id is still readable at their start).
                    let broken = format!(
                        r#"{{"jsonrpc":"2.0","id":{id},"result":{{"content":[{{"type":"text","text":"misbehaved malformed_response"#
                    );
                    session
                        .send_frame(session.frame("message", broken.as_bytes()))
                        .await?;
                    return Err(Fail::Answered);
                }
                "bad_utf8" => {
                    let head = br#"{"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info","logger":"misbehave","data":"bad "#;
                    [&head[..], b"\xff\xfe", br#" utf8"}}"#].concat()
                }
                "close" => {
                    // Forget the session first so POSTs racing the close already get 404.
                    inner.lock().map.retain(|_, s| !Arc::ptr_eq(s, session));
                    let _ = session.send_frame(Bytes::new()).await; // in-band abort marker
                    return Err(Fail::Gone);
                }
                other => {
                    return Err(Fail::Rpc(
                        crate::jsonrpc::INVALID_PARAMS,
                        format!("unknown misbehave kind `{other}`"),
                    ))
                }
            };
            session.send_frame(session.frame("message", &data)).await?;
            Ok(text_result(format!("misbehaved {kind}")))
        }
        other => Err(Fail::Rpc(
            crate::jsonrpc::INVALID_PARAMS,
            format!("Unknown tool: {other}"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
    use tokio::net::TcpStream;

    const WAIT: Duration = Duration::from_secs(20);

    /// One SSE event as seen by the raw test client.
    #[derive(Debug, Default)]
    struct Event {
        event: Option<String>,
        data: Vec<u8>,
        comments: Vec<String>,
    }

    impl Event {
        fn json(&self) -> Value {
            serde_json::from_slice(&self.data).expect("event data is JSON")
        }
    }

    /// Minimal HTTP/1.1 + chunked + SSE client.
    struct SseClient {
        rd: BufReader<TcpStream>,
        head: String,
        buf: Vec<u8>,
        saw_crlf: bool,
        endpoint: String,
    }

    impl SseClient {
        async fn connect(addr: SocketAddr) -> SseClient {
            let mut s = TcpStream::connect(addr).await.unwrap();
            let req =
                format!("GET /sse HTTP/1.1\r\nHost: {addr}\r\nAccept: text/event-stream\r\n\r\n");
            s.write_all(req.as_bytes()).await.unwrap();
            let mut rd = BufReader::new(s);
            let mut head = String::new();
            loop {
                let mut line = String::new();
                rd.read_line(&mut line).await.unwrap();
                if line == "\r\n" || line.is_empty() {
                    break;
                }
                head.push_str(&line.to_ascii_lowercase());
            }
            assert!(head.starts_with("http/1.1 200"), "{head}");
            assert!(head.contains("transfer-encoding: chunked"), "{head}");
            let mut c = SseClient {
                rd,
                head,
                buf: Vec::new(),
                saw_crlf: false,
                endpoint: String::new(),
            };
            let ev = c.next().await.expect("endpoint event");
            assert_eq!(ev.event.as_deref(), Some("endpoint"));
            c.endpoint = String::from_utf8(ev.data).unwrap();
            c
        }

        /// Read one chunk of the chunked body into `buf`; false at end of stream.
        async fn fill(&mut self) -> bool {
            let mut line = String::new();
            match self.rd.read_line(&mut line).await {
                Ok(0) | Err(_) => return false,
                Ok(_) => {}
            }
            let size = usize::from_str_radix(line.trim().split(';').next().unwrap(), 16).unwrap();
            if size == 0 {
                return false;
            }
            let start = self.buf.len();
            self.buf.resize(start + size + 2, 0);
            if self.rd.read_exact(&mut self.buf[start..]).await.is_err() {
                return false;
            }
            self.buf.truncate(start + size);
            true
        }

        async fn next_raw(&mut self) -> Option<Event> {
            let mut ev = Event::default();
            let mut any = false;
            loop {
                let Some(pos) = self.buf.iter().position(|&b| b == b'\n') else {
                    if !self.fill().await {
                        return None;
                    }
                    continue;
                };
                let mut line: Vec<u8> = self.buf.drain(..=pos).collect();
                line.pop();
                if line.last() == Some(&b'\r') {
                    line.pop();
                    self.saw_crlf = true;
                }
                if line.is_empty() {
                    if any {
                        return Some(ev);
                    }
                } else if let Some(c) = line.strip_prefix(b":") {
                    ev.comments
                        .push(String::from_utf8_lossy(c).trim().to_owned());
                    any = true;
                } else if let Some(e) = line.strip_prefix(b"event: ") {
                    ev.event = Some(String::from_utf8(e.to_vec()).unwrap());
                    any = true;
                } else if let Some(d) = line.strip_prefix(b"data: ") {
                    ev.data = d.to_vec();
                    any = true;
                } else {
                    panic!("unexpected SSE line {:?}", String::from_utf8_lossy(&line));
                }
            }
        }

        async fn next(&mut self) -> Option<Event> {
            tokio::time::timeout(WAIT, self.next_raw())
                .await
                .expect("SSE read timed out")
        }

        async fn next_json(&mut self) -> Value {
            let ev = self.next().await.expect("stream ended");
            assert_eq!(ev.event.as_deref(), Some("message"));
            ev.json()
        }

        async fn post(&self, addr: SocketAddr, msg: &Value) -> (u16, String) {
            post_raw(
                addr,
                "POST",
                &self.endpoint,
                &serde_json::to_vec(msg).unwrap(),
            )
            .await
        }
    }

    async fn post_raw(addr: SocketAddr, method: &str, path: &str, body: &[u8]) -> (u16, String) {
        let mut s = TcpStream::connect(addr).await.unwrap();
        let head = format!(
            "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        );
        s.write_all(head.as_bytes()).await.unwrap();
        s.write_all(body).await.unwrap();
        let mut out = Vec::new();
        tokio::time::timeout(WAIT, s.read_to_end(&mut out))
            .await
            .unwrap()
            .unwrap();
        let out = String::from_utf8(out).unwrap();
        let status = out[9..12].parse().unwrap();
        let body = out.split_once("\r\n\r\n").unwrap().1.to_owned();
        (status, body)
    }

    fn call(id: u64, name: &str, args: Value) -> Value {
        json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {"name": name, "arguments": args}})
    }

    async fn wait_sessions(up: &Upstream, n: usize) {
        let t0 = Instant::now();
        while up.open_sessions() != n {
            assert!(
                t0.elapsed() < WAIT,
                "open_sessions stuck at {}",
                up.open_sessions()
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    #[tokio::test]
    async fn endpoint_event_and_initialize() {
        let up = Upstream::spawn(UpstreamOptions::default()).await.unwrap();
        assert_eq!(up.sse_url(), format!("http://{}/sse", up.addr));
        let mut c = SseClient::connect(up.addr).await;
        assert!(
            c.head.contains("content-type: text/event-stream"),
            "{}",
            c.head
        );
        assert!(
            c.head.contains("cache-control: no-cache, no-transform"),
            "{}",
            c.head
        );
        let sid = c
            .endpoint
            .strip_prefix("/message?sessionId=")
            .expect("endpoint path");
        assert!(
            sid.len() == 32 && sid.bytes().all(|b| b.is_ascii_hexdigit()),
            "{sid}"
        );
        assert_eq!(up.open_sessions(), 1);

        let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {"protocolVersion": "2025-03-26", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}});
        assert_eq!(c.post(up.addr, &init).await, (202, "Accepted".to_owned()));
        let r = c.next_json().await;
        assert_eq!(r["id"], 1);
        assert_eq!(r["result"]["protocolVersion"], "2025-03-26");
        assert_eq!(r["result"]["serverInfo"]["name"], "demo-upstream");
        assert!(r["result"]["capabilities"]["tools"].is_object());
        assert!(!c.saw_crlf);

        let note = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
        assert_eq!(c.post(up.addr, &note).await.0, 202);
        let init2 = json!({"jsonrpc": "2.0", "id": "a", "method": "initialize", "params": {"protocolVersion": "1999-01-01"}});
        assert_eq!(c.post(up.addr, &init2).await.0, 202);
        let r = c.next_json().await;
        assert_eq!(
            (r["id"].clone(), r["result"]["protocolVersion"].clone()),
            (json!("a"), json!("2024-11-05"))
        );
        c.post(
            up.addr,
            &json!({"jsonrpc": "2.0", "id": 2, "method": "nope"}),
        )
        .await;
        assert_eq!(c.next_json().await["error"]["code"], -32601);
        c.post(
            up.addr,
            &json!({"jsonrpc": "2.0", "id": 3, "method": "tools/list"}),
        )
        .await;
        let tools = c.next_json().await;
        let names: Vec<_> = tools["result"]["tools"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["name"].clone())
            .collect();
        assert_eq!(
            names,
            [
                json!("count"),
                json!("echo"),
                json!("emit"),
                json!("list_changed"),
                json!("misbehave")
            ]
        );
        c.post(up.addr, &call(4, "echo", json!({"text": "hi"})))
            .await;
        assert_eq!(c.next_json().await["result"]["content"][0]["text"], "hi");

        drop(c);
        wait_sessions(&up, 0).await;
    }

    #[tokio::test]
    async fn http_errors() {
        let up = Upstream::spawn(UpstreamOptions::default()).await.unwrap();
        let c = SseClient::connect(up.addr).await;
        let ping = br#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#;
        let unknown = "/message?sessionId=00000000000000000000000000000000";
        assert_eq!(
            post_raw(up.addr, "POST", unknown, ping).await,
            (404, "Session not found".into())
        );
        assert_eq!(post_raw(up.addr, "POST", "/message", ping).await.0, 404);
        assert_eq!(post_raw(up.addr, "POST", "/sse", ping).await.0, 405);
        assert_eq!(post_raw(up.addr, "GET", "/message", b"").await.0, 405);
        assert_eq!(post_raw(up.addr, "POST", "/elsewhere", ping).await.0, 404);
        assert_eq!(
            post_raw(up.addr, "POST", &c.endpoint, b"{nope").await.0,
            400
        );
        assert_eq!(
            post_raw(
                up.addr,
                "POST",
                &c.endpoint,
                b"[{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"}]"
            )
            .await
            .0,
            400
        );
        assert_eq!(post_raw(up.addr, "POST", &c.endpoint, ping).await.0, 202);
    }

    #[tokio::test]
    async fn count_with_progress_is_ordered() {
        let up = Upstream::spawn(UpstreamOptions::default()).await.unwrap();
        let mut c = SseClient::connect(up.addr).await;
        let mut req = call(7, "count", json!({"n": 3, "interval_ms": 5}));
        req["params"]["_meta"] = json!({"progressToken": "tok"});
        assert_eq!(c.post(up.addr, &req).await.0, 202);
        for i in 1..=3 {
            let p = c.next_json().await;
            assert_eq!(p["method"], "notifications/progress");
            assert_eq!(
                p["params"],
                json!({"progressToken": "tok", "progress": i, "total": 3, "message": format!("step {i}")})
            );
            let l = c.next_json().await;
            assert_eq!(l["method"], "notifications/message");
            assert_eq!(
                l["params"],
                json!({"level": "info", "logger": "count", "data": {"request": 7, "i": i}})
            );
        }
        let r = c.next_json().await;
        assert_eq!(
            (r["id"].clone(), r["result"]["content"][0]["text"].clone()),
            (json!(7), json!("counted 3"))
        );
        // Without a progress token only the log notifications are sent.
        c.post(
            up.addr,
            &call(8, "count", json!({"n": 2, "interval_ms": 0})),
        )
        .await;
        for i in 1..=2 {
            assert_eq!(
                c.next_json().await["params"]["data"],
                json!({"request": 8, "i": i})
            );
        }
        assert_eq!(c.next_json().await["id"], 8);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn emit_fast_and_in_order() {
        let up = Upstream::spawn(UpstreamOptions::default()).await.unwrap();
        let mut c = SseClient::connect(up.addr).await;
        const N: u64 = 10_000;
        let t0 = std::time::Instant::now();
        c.post(
            up.addr,
            &call(1, "emit", json!({"count": N, "rate_per_sec": 0})),
        )
        .await;
        for seq in 1..=N {
            let m = c.next_json().await;
            assert_eq!(m["params"]["logger"], "emit");
            assert_eq!(m["params"]["data"]["seq"], seq);
            assert!(m["params"]["data"]["t_ns"].as_u64().unwrap() > 0);
        }
        let r = c.next_json().await;
        let dt = t0.elapsed();
        assert_eq!(r["result"]["content"][0]["text"], format!("emitted {N}"));
        println!("emit: {N} events in {dt:?} = {:.0} events/s (one session, incl. test-client JSON parsing)", N as f64 / dt.as_secs_f64());

        // The counter continues across calls; pacing and padding.
        let t0 = std::time::Instant::now();
        c.post(
            up.addr,
            &call(
                2,
                "emit",
                json!({"count": 20, "rate_per_sec": 200, "size": 5}),
            ),
        )
        .await;
        for seq in N + 1..=N + 20 {
            let m = c.next_json().await;
            assert_eq!(m["params"]["data"]["seq"], seq);
            assert_eq!(m["params"]["data"]["pad"], "xxxxx");
        }
        assert_eq!(c.next_json().await["id"], 2);
        println!(
            "emit: 20 events at 200/s took {:?} (expect ~95 ms)",
            t0.elapsed()
        );
    }

    #[tokio::test]
    async fn slow_reader_only_stalls_its_own_session() {
        let up = Upstream::spawn(UpstreamOptions::default()).await.unwrap();
        let slow = SseClient::connect(up.addr).await;
        let big = json!({"count": 1_000_000, "size": 1024});
        assert_eq!(slow.post(up.addr, &call(1, "emit", big)).await.0, 202);
        tokio::time::sleep(Duration::from_millis(100)).await; // socket + channel fill up
        let mut fast = SseClient::connect(up.addr).await;
        fast.post(
            up.addr,
            &json!({"jsonrpc": "2.0", "id": 2, "method": "ping"}),
        )
        .await;
        assert_eq!(fast.next_json().await["id"], 2);
        drop(slow); // the stalled emit task notices and stops
        wait_sessions(&up, 1).await;
    }

    #[tokio::test]
    async fn misbehave_kinds() {
        let up = Upstream::spawn(UpstreamOptions::default()).await.unwrap();
        let mut c = SseClient::connect(up.addr).await;
        c.post(up.addr, &call(1, "misbehave", json!({"kind": "oversized"})))
            .await;
        let big = c.next().await.unwrap();
        assert_eq!(big.data.len(), OVERSIZED_BYTES);
        assert_eq!(big.json()["method"], "notifications/message");
        assert_eq!(c.next_json().await["id"], 1);
        c.post(
            up.addr,
            &call(2, "misbehave", json!({"kind": "malformed_json"})),
        )
        .await;
        assert_eq!(c.next().await.unwrap().data, b"{not json");
        assert_eq!(c.next_json().await["id"], 2);
        c.post(up.addr, &call(3, "misbehave", json!({"kind": "bad_utf8"})))
            .await;
        assert!(std::str::from_utf8(&c.next().await.unwrap().data).is_err());
        assert_eq!(c.next_json().await["id"], 3);
        c.post(
            up.addr,
            &call(6, "misbehave", json!({"kind": "malformed_response"})),
        )
        .await;
        let broken = c.next().await.unwrap().data;
        assert!(serde_json::from_slice::<Value>(&broken).is_err());
        assert!(broken.starts_with(br#"{"jsonrpc":"2.0","id":6,"result":"#));
        c.post(up.addr, &call(4, "misbehave", json!({"kind": "close"})))
            .await;
        assert!(
            c.next().await.is_none(),
            "stream must end without a response"
        );
        wait_sessions(&up, 0).await;
        assert_eq!(
            c.post(
                up.addr,
                &json!({"jsonrpc": "2.0", "id": 5, "method": "ping"})
            )
            .await
            .0,
            404
        );
    }

    #[tokio::test]
    async fn drop_all_sessions_ends_streams() {
        let up = Upstream::spawn(UpstreamOptions::default()).await.unwrap();
        let mut a = SseClient::connect(up.addr).await;
        let mut b = SseClient::connect(up.addr).await;
        assert_eq!(up.open_sessions(), 2);
        // A long-running tool on `a` must not keep the stream alive.
        a.post(
            up.addr,
            &call(1, "count", json!({"n": 1000, "interval_ms": 10})),
        )
        .await;
        a.next().await.unwrap();
        up.drop_all_sessions();
        assert_eq!(up.open_sessions(), 0);
        while a.next().await.is_some() {}
        assert!(b.next().await.is_none());
        assert_eq!(
            a.post(
                up.addr,
                &json!({"jsonrpc": "2.0", "id": 2, "method": "ping"})
            )
            .await
            .0,
            404
        );
        // Still listening: a new session works.
        let mut c = SseClient::connect(up.addr).await;
        c.post(
            up.addr,
            &json!({"jsonrpc": "2.0", "id": 3, "method": "ping"}),
        )
        .await;
        assert_eq!(c.next_json().await["result"], json!({}));
    }

    #[tokio::test]
    async fn crlf_ping_and_stop() {
        let opts = UpstreamOptions {
            crlf: true,
            ping_secs: Some(1),
        };
        let up = Upstream::spawn(opts).await.unwrap();
        let addr = up.addr;
        let mut c = SseClient::connect(addr).await;
        assert!(c.saw_crlf);
        let ev = c.next().await.unwrap();
        assert_eq!(ev.comments, ["ping"]);
        up.stop();
        assert!(c.next().await.is_none(), "stop must end the stream");
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(TcpStream::connect(addr).await.is_err(), "listener closed");
    }
}
