//! [4] Proxy → upstream: the link to the unmodified legacy HTTP+SSE server.
//!
//! One upstream `GET {sse_url}` per proxy session, owned by the proxy and independent of any client
//! connection (client disconnects never reach the upstream). [`connect`] opens it (over TLS for
//! `https://`), reads the `endpoint` event, resolves it against the SSE URL and refuses it unless
//! it names the SSE URL's origin or one in `upstream.allowed_endpoint_origins`; [`UpstreamReader`] then yields the
//! upstream's events; [`UpstreamLink::post`] forwards client messages with the upstream's own
//! `Host`, no `Origin`, and a timeout (some servers never answer a POST for a dead session).
//! There is no read timeout on the stream: legacy TypeScript servers send no keepalive, so an idle
//! stream is normal; TCP keepalive and POST failures detect a dead peer.
//!
//! The stream's GET does not go through hyper's client: [`connect`] opens its connection with the
//! same [`Connector`], writes the request and reads the response itself ([`http1`]), so that one
//! socket read yields every event the upstream has written, not one HTTP chunk per poll. The POSTs
//! use hyper's pooled client.

pub mod http1;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::{header, Method, Request, StatusCode, Uri};
use http_body_util::{BodyExt, Full};
use hyper_rustls::{HttpsConnector, MaybeHttpsStream};
use hyper_util::client::legacy::connect::{Connected, Connection, HttpConnector};
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::config::{origin_of, HttpUrl, UpstreamConfig};
use crate::sse;

/// Why the upstream link failed. The messages say what happened, never what the upstream said:
/// an upstream's bodies are not reflected to clients (they are logged at debug level).
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    /// The connection or the request failed.
    #[error("cannot reach the upstream")]
    Connect(#[source] BoxError),
    /// The upstream answered with an unexpected status.
    #[error("the upstream answered {0}")]
    Status(StatusCode),
    /// The upstream's SSE stream broke: reading its connection failed.
    #[error("the upstream's stream failed")]
    Stream(#[source] std::io::Error),
    /// The upstream's answer to the SSE GET is not valid HTTP/1.1 (its head, or its body's
    /// framing; the source says what was wrong).
    #[error("the upstream's stream is malformed")]
    Framing(#[source] http1::Error),
    /// The stream ended before the `endpoint` event.
    #[error("the upstream's stream ended before its `endpoint` event")]
    NoEndpoint,
    /// The `endpoint` event is not a usable URL (the value says why; it is logged, never put in
    /// a client's answer: it may name the upstream's internals).
    #[error("the upstream's `endpoint` event is not a usable URL")]
    BadEndpoint(String),
    /// The `endpoint` event names an origin nobody allowed (logged where it is found; a client's
    /// answer never names it).
    #[error("the upstream's `endpoint` event names an origin that is neither upstream.sse_url's nor in upstream.allowed_endpoint_origins")]
    EndpointRejected {
        /// The origin it named.
        origin: String,
    },
    /// The upstream answered `initialize` with an error (sessions the proxy opens itself for
    /// the 2026-07-28 face).
    #[error("the upstream refused `initialize`")]
    InitializeRefused,
    /// A request could not be built.
    #[error("cannot build the upstream request")]
    Request(#[source] http::Error),
    /// The upstream did not answer in time; the value says what was awaited.
    #[error("{0}")]
    Timeout(String),
    /// The upstream no longer knows the session (its POST endpoint answered 404).
    #[error("upstream session lost")]
    Lost,
}

impl UpstreamError {
    /// The `kind` label of `mcp_resume_upstream_errors_total` for a failed connect.
    pub fn connect_kind(&self) -> &'static str {
        match self {
            UpstreamError::EndpointRejected { .. } => "endpoint_rejected",
            UpstreamError::Status(_) => "status",
            _ => "connect",
        }
    }
}

/// The shared upstream client: hyper's pool for the POSTs, and the connector with which
/// [`connect`] opens each SSE stream's own connection. Cloning is shallow.
#[derive(Clone)]
pub struct HttpClient {
    pool: Client<Connector, Full<Bytes>>,
    connector: Connector,
}

impl std::fmt::Debug for HttpClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpClient").finish_non_exhaustive()
    }
}

/// How the upstream is reached: over the network (TCP; TLS for `https://`), or — in unit tests —
/// through an in-memory pipe to an upstream served in the same process.
#[derive(Clone)]
pub enum Connector {
    /// TCP, with TLS for `https://` URLs.
    Net(HttpsConnector<HttpConnector>),
    /// A new in-memory pipe per connection (tests: paused time, no sockets).
    #[cfg(test)]
    Memory(MemoryConnect),
}

/// Opens an in-memory connection to the upstream for a URI.
#[cfg(test)]
pub type MemoryConnect =
    Arc<dyn Fn(&Uri) -> std::io::Result<tokio::io::DuplexStream> + Send + Sync>;

/// One upstream connection. (The TLS variant is large, but there is one per connection and
/// boxing it would cost an indirection on every read.)
#[derive(Debug)]
#[allow(clippy::large_enum_variant)]
pub enum Io {
    /// TCP or TLS over TCP.
    Net(MaybeHttpsStream<TokioIo<TcpStream>>),
    /// An in-memory pipe (unit tests).
    #[cfg(test)]
    Mem(TokioIo<tokio::io::DuplexStream>),
}

impl hyper::rt::Read for Io {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: hyper::rt::ReadBufCursor<'_>,
    ) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Io::Net(s) => Pin::new(s).poll_read(cx, buf),
            #[cfg(test)]
            Io::Mem(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl hyper::rt::Write for Io {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Io::Net(s) => Pin::new(s).poll_write(cx, buf),
            #[cfg(test)]
            Io::Mem(s) => Pin::new(s).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Io::Net(s) => Pin::new(s).poll_flush(cx),
            #[cfg(test)]
            Io::Mem(s) => Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Io::Net(s) => Pin::new(s).poll_shutdown(cx),
            #[cfg(test)]
            Io::Mem(s) => Pin::new(s).poll_shutdown(cx),
        }
    }
}

impl Connection for Io {
    fn connected(&self) -> Connected {
        match self {
            Io::Net(s) => s.connected(),
            #[cfg(test)]
            Io::Mem(_) => Connected::new(),
        }
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl tower_service::Service<Uri> for Connector {
    type Response = Io;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = std::result::Result<Io, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<std::result::Result<(), BoxError>> {
        match self {
            Connector::Net(c) => c.poll_ready(cx),
            #[cfg(test)]
            Connector::Memory(_) => Poll::Ready(Ok(())),
        }
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        match self {
            Connector::Net(c) => {
                let f = c.call(uri);
                Box::pin(async move { f.await.map(Io::Net) })
            }
            #[cfg(test)]
            Connector::Memory(open) => {
                let io = open(&uri);
                Box::pin(async move { Ok(Io::Mem(TokioIo::new(io?))) })
            }
        }
    }
}

fn build(connector: Connector) -> HttpClient {
    let pool = Client::builder(TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(30))
        .build(connector.clone());
    HttpClient { pool, connector }
}

/// Builds the upstream client: TCP keepalive so a silently dead upstream is noticed, no Nagle,
/// TLS with the roots of `set` for `https://`.
pub fn client(set: &UpstreamSettings) -> HttpClient {
    let mut conn = HttpConnector::new();
    conn.set_keepalive(Some(Duration::from_secs(30)));
    conn.set_nodelay(true);
    conn.set_connect_timeout(Some(Duration::from_secs(5)));
    conn.enforce_http(false);
    let https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config((*set.tls).clone())
        .https_or_http()
        .enable_http1()
        .wrap_connector(conn);
    build(Connector::Net(https))
}

/// A client whose every connection is `open`ed in memory (unit tests).
#[cfg(test)]
pub fn memory_client(open: MemoryConnect) -> HttpClient {
    build(Connector::Memory(open))
}

/// Settings of the upstream link, taken from the config once.
#[derive(Clone, Debug)]
pub struct UpstreamSettings {
    /// The SSE URL.
    pub sse_url: HttpUrl,
    /// Timeout of one POST.
    pub post_timeout: Duration,
    /// Timeout of connect + `endpoint` event.
    pub connect_timeout: Duration,
    /// Largest event accepted.
    pub max_event_bytes: usize,
    /// Origins the `endpoint` event may name besides the SSE URL's (normalised).
    pub allowed_endpoint_origins: Vec<String>,
    /// TLS client config for `https://`.
    pub tls: Arc<rustls::ClientConfig>,
    /// How long a forwarded request may stay unanswered (`None`: no limit).
    pub request_timeout: Option<Duration>,
}

impl UpstreamSettings {
    /// From the validated `[upstream]` section.
    ///
    /// # Errors
    /// [`crate::tls::TlsError`] when an `https://` upstream can be reached and its roots cannot
    /// be loaded (the start checked them, so only a file that changed since).
    pub fn from_config(cfg: &UpstreamConfig) -> Result<Self, crate::tls::TlsError> {
        let sse_url = cfg.url();
        let allowed_endpoint_origins: Vec<String> = cfg
            .allowed_endpoint_origins
            .iter()
            .filter_map(|o| crate::config::parse_origin(o).ok())
            .collect();
        // The system's roots only where an `https://` connection can be made: loading them is
        // most of a start's CPU (about 20M instructions), for nothing on a plain-http sidecar.
        let tls = if cfg.reaches_https() {
            crate::tls::upstream_client(cfg.ca_file.as_deref())?
        } else {
            crate::tls::no_roots_client()
        };
        Ok(Self {
            sse_url,
            post_timeout: Duration::from_secs(cfg.post_timeout_secs),
            connect_timeout: Duration::from_secs(cfg.connect_timeout_secs),
            max_event_bytes: cfg.max_event_bytes,
            request_timeout: cfg.request_timeout(),
            allowed_endpoint_origins,
            tls: Arc::new(tls),
        })
    }

    /// May the `endpoint` event name this origin?
    fn endpoint_allowed(&self, origin: &str) -> bool {
        origin == self.sse_url.origin() || self.allowed_endpoint_origins.iter().any(|o| o == origin)
    }
}

/// Where to POST client messages for one upstream session.
#[derive(Clone, Debug)]
pub struct UpstreamLink {
    post_uri: Uri,
    client: HttpClient,
    timeout: Duration,
}

/// What the upstream stream yields.
#[derive(Debug)]
pub enum UpstreamItem {
    /// A complete SSE event.
    Event(sse::Event),
    /// An event over the size cap, dropped; its data's first and last bytes are kept so the
    /// request it answered can still be told.
    Oversized {
        /// Total bytes of the event.
        len: usize,
        /// First bytes of its data.
        head: Bytes,
        /// Last bytes of its data.
        tail: Bytes,
    },
}

/// Room asked of a read of the upstream connection at first and at least (hyper's first size).
const READ_MIN: usize = 8 * 1024;
/// Room asked at most: enough for every event a busy upstream wrote since the last read. Reads
/// that fill their room double it up to this; small ones halve it back, so an idle session
/// holds about `READ_MIN`, not this, per connection.
const READ_MAX: usize = 64 * 1024;

/// Event data at least this large is copied out of the read buffer (see
/// [`UpstreamReader::next_buffered`]).
const OWN_ALLOCATION_AT: usize = 16 * 1024;

/// Reads events from the upstream SSE body: socket reads, through the body's framing, into the
/// SSE decoder.
pub struct UpstreamReader {
    io: TokioIo<Io>,
    /// Bytes read and not yet de-framed (at most a partial chunk size or trailer line).
    raw: BytesMut,
    /// Room the next read asks for (`READ_MIN..=READ_MAX`).
    read_size: usize,
    body: http1::BodyDecoder,
    /// `None` while the body goes on; then how it ended, said once its events are all out.
    end: Option<Result<(), http1::Error>>,
    /// Body bytes not yet decoded as events.
    buf: BytesMut,
    decoder: sse::Decoder,
}

impl std::fmt::Debug for UpstreamReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UpstreamReader").finish_non_exhaustive()
    }
}

impl UpstreamReader {
    /// The next item already received, if a whole one is buffered (no I/O).
    pub fn next_buffered(&mut self) -> Option<UpstreamItem> {
        match self.decoder.decode(&mut self.buf) {
            Ok(Some(mut ev)) => {
                // A large event sliced out of the read buffer would keep that whole buffer
                // (grown by doubling while the event came in) alive while it waits in the log's
                // queue, whose byte bound would then hold up to twice what it counts
                // (tests/memory.rs, slow disk): it gets an allocation of its own size.
                if ev.data.len() >= OWN_ALLOCATION_AT {
                    ev.data = Bytes::copy_from_slice(&ev.data);
                }
                Some(UpstreamItem::Event(ev))
            }
            Ok(None) => None,
            Err(sse::DecodeError::EventTooLarge { len, head, tail }) => {
                Some(UpstreamItem::Oversized { len, head, tail })
            }
        }
    }

    /// The next item; `Ok(None)` at a clean end of stream. An event cut short by the end is
    /// dropped, never yielded (WHATWG).
    ///
    /// # Errors
    /// [`UpstreamError::Stream`] when reading the connection fails mid-way;
    /// [`UpstreamError::Framing`] when the body's framing is broken or cut short (after the
    /// events framed correctly before the fault).
    pub async fn next(&mut self) -> Result<Option<UpstreamItem>, UpstreamError> {
        loop {
            if let Some(item) = self.next_buffered() {
                return Ok(Some(item));
            }
            if let Some(end) = self.end {
                // Said once; a caller that asks again hears a plain end.
                self.end = Some(Ok(()));
                return end.map(|()| None).map_err(UpstreamError::Framing);
            }
            self.fill().await?;
        }
    }

    /// Reads the connection once, de-framing what came into `buf`.
    async fn fill(&mut self) -> Result<(), UpstreamError> {
        if self.raw.is_empty() && self.raw.capacity() > 2 * self.read_size {
            // What a burst took is given back once the stream is quiet again.
            self.raw = BytesMut::new();
        }
        self.raw.reserve(self.read_size);
        let room = self.raw.capacity() - self.raw.len();
        let read = self.io.read_buf(&mut self.raw).await;
        if let Ok(n) = read {
            self.read_size = if n >= room {
                (self.read_size * 2).min(READ_MAX)
            } else if n < self.read_size / 4 {
                (self.read_size / 2).max(READ_MIN)
            } else {
                self.read_size
            };
        }
        match read {
            Err(e) => {
                self.end = Some(Ok(()));
                Err(UpstreamError::Stream(e))
            }
            Ok(0) => {
                self.end = Some(self.body.finish());
                Ok(())
            }
            Ok(_) => {
                // Room for all the read's body at once: decoded chunk by chunk, it grew by
                // doubling, copied each time (realloc was 4 % of a flood's instructions,
                // docs/benchmarks.md round 9).
                self.buf.reserve(self.raw.len());
                match self.body.decode(&mut self.raw, &mut self.buf) {
                    Ok(false) => {}
                    Ok(true) => self.end = Some(Ok(())),
                    Err(e) => self.end = Some(Err(e)),
                }
                Ok(())
            }
        }
    }
}

/// The request line and fields of the SSE GET: what hyper's client sent for it (origin-form
/// target, `Host` from the URL without a default port, no body), plus ours.
fn sse_request(uri: &Uri) -> Result<Vec<u8>, UpstreamError> {
    let host = uri
        .host()
        .ok_or_else(|| UpstreamError::Connect("the SSE URL has no host".into()))?;
    let default_port = if uri.scheme_str() == Some("https") {
        443
    } else {
        80
    };
    let host = match uri.port_u16() {
        Some(port) if port != default_port => format!("{host}:{port}"),
        _ => host.to_string(),
    };
    let target = uri.path_and_query().map_or("/", |p| p.as_str());
    // The connection ends with the stream, never back to a pool: a server that ends a session
    // completes the response, and may close the connection right after (the Python SDK's legacy
    // endpoint under uvicorn does, its handler sending a second response).
    Ok(format!(
        "GET {target} HTTP/1.1\r\nhost: {host}\r\naccept: text/event-stream\r\ncache-control: no-cache\r\nconnection: close\r\n\r\n"
    )
    .into_bytes())
}

/// Opens a connection for the SSE GET, sends it, and reads the response head.
async fn open_stream(
    set: &UpstreamSettings,
    client: &HttpClient,
) -> Result<UpstreamReader, UpstreamError> {
    let uri: Uri = set
        .sse_url
        .to_url()
        .parse()
        .map_err(|e: http::uri::InvalidUri| UpstreamError::Request(e.into()))?;
    let request = sse_request(&uri)?;
    let mut connector = client.connector.clone();
    std::future::poll_fn(|cx| tower_service::Service::poll_ready(&mut connector, cx))
        .await
        .map_err(UpstreamError::Connect)?;
    let io = tower_service::Service::call(&mut connector, uri)
        .await
        .map_err(UpstreamError::Connect)?;
    let mut io = TokioIo::new(io);
    let sent = async {
        io.write_all(&request).await?;
        io.flush().await
    };
    sent.await.map_err(|e| UpstreamError::Connect(e.into()))?;
    let mut raw = BytesMut::with_capacity(READ_MIN);
    let head = loop {
        if let Some(head) = http1::parse_head(&mut raw).map_err(UpstreamError::Framing)? {
            break head;
        }
        raw.reserve(READ_MIN);
        let n = io
            .read_buf(&mut raw)
            .await
            .map_err(|e| UpstreamError::Connect(e.into()))?;
        if n == 0 {
            return Err(UpstreamError::Connect(
                "the upstream closed the connection before its response head".into(),
            ));
        }
    };
    if head.status != StatusCode::OK {
        return Err(UpstreamError::Status(head.status));
    }
    let mut reader = UpstreamReader {
        io,
        raw,
        read_size: READ_MIN,
        body: http1::BodyDecoder::new(head.framing),
        end: None,
        buf: BytesMut::with_capacity(8 * 1024),
        decoder: sse::Decoder::new(set.max_event_bytes),
    };
    // The body's first bytes may have come with the head.
    match reader.body.decode(&mut reader.raw, &mut reader.buf) {
        Ok(false) => {}
        Ok(true) => reader.end = Some(Ok(())),
        Err(e) => reader.end = Some(Err(e)),
    }
    Ok(reader)
}

/// Opens the upstream SSE stream and waits for its `endpoint` event.
///
/// # Errors
/// An [`UpstreamError`] when the upstream is unreachable, answers non-200, or ends before the
/// endpoint; [`UpstreamError::Timeout`] when that takes longer than the connect timeout.
pub async fn connect(
    set: &UpstreamSettings,
    client: &HttpClient,
) -> Result<(UpstreamLink, UpstreamReader), UpstreamError> {
    let fut = async {
        let mut reader = open_stream(set, client).await?;
        loop {
            match reader.next().await? {
                None => return Err(UpstreamError::NoEndpoint),
                Some(UpstreamItem::Event(ev)) if ev.event.as_deref() == Some("endpoint") => {
                    let data = String::from_utf8_lossy(&ev.data);
                    let uri = resolve(&set.sse_url, data.trim()).map_err(|why| {
                        tracing::error!(%why, "the upstream's `endpoint` event is not a usable URL");
                        UpstreamError::BadEndpoint(why)
                    })?;
                    let origin = origin_of(
                        uri.scheme_str() == Some("https"),
                        uri.authority().map_or("", |a| a.as_str()),
                    );
                    if !set.endpoint_allowed(&origin) {
                        // Client bodies (with their secrets) go only where the operator said.
                        tracing::error!(%origin, "the upstream's `endpoint` event names an origin that is neither upstream.sse_url's nor in upstream.allowed_endpoint_origins");
                        return Err(UpstreamError::EndpointRejected { origin });
                    }
                    let link = UpstreamLink {
                        post_uri: uri,
                        client: client.clone(),
                        timeout: set.post_timeout,
                    };
                    return Ok((link, reader));
                }
                Some(other) => {
                    tracing::warn!(?other, "upstream event before `endpoint` ignored");
                }
            }
        }
    };
    tokio::time::timeout(set.connect_timeout, fut)
        .await
        .map_err(|_| UpstreamError::Timeout("no `endpoint` event in time".into()))?
}

/// Resolves the `endpoint` event's data against the SSE URL (RFC 3986 §5.2, for the forms servers
/// send: absolute `http://` URLs, network-path `//host/..`, absolute paths, and relative paths).
///
/// # Errors
/// A reason when the reference is not usable (another scheme, unparsable).
pub fn resolve(base: &HttpUrl, reference: &str) -> std::result::Result<Uri, String> {
    let split = |rest: &str| {
        let (auth, path) = rest.split_at(rest.find(['/', '?', '#']).unwrap_or(rest.len()));
        (path.to_string(), auth.to_string())
    };
    let (scheme, (scheme_less, authority)) = if let Some(rest) = reference.strip_prefix("http://") {
        ("http", split(rest))
    } else if let Some(rest) = reference.strip_prefix("https://") {
        ("https", split(rest))
    } else if reference.contains("://") {
        return Err("only http:// and https:// endpoints are supported".into());
    } else if let Some(rest) = reference.strip_prefix("//") {
        (base.scheme(), split(rest))
    } else {
        let base_path = base
            .path_and_query
            .split(['?', '#'])
            .next()
            .unwrap_or("/")
            .to_string();
        let merged = if reference.starts_with('/') {
            reference.to_string()
        } else if reference.starts_with('?') {
            format!("{base_path}{reference}")
        } else {
            let dir = &base_path[..base_path.rfind('/').map(|i| i + 1).unwrap_or(0)];
            format!("{dir}{reference}")
        };
        (base.scheme(), (merged, base.authority.clone()))
    };
    if authority.is_empty() || authority.contains('@') {
        return Err("no usable host".into());
    }
    let path = remove_dot_segments(if scheme_less.is_empty() {
        "/"
    } else {
        &scheme_less
    });
    format!("{scheme}://{authority}{path}")
        .parse::<Uri>()
        .map_err(|e| e.to_string())
}

/// RFC 3986 §5.2.4 on the path part (the query is left alone).
fn remove_dot_segments(path_and_query: &str) -> String {
    let (path, query) = match path_and_query.find(['?', '#']) {
        Some(i) => path_and_query.split_at(i),
        None => (path_and_query, ""),
    };
    let mut out: Vec<&str> = Vec::new();
    let segs: Vec<&str> = path.split('/').collect();
    for (i, seg) in segs.iter().enumerate() {
        let last = i + 1 == segs.len();
        match *seg {
            "." => {
                if last {
                    out.push("");
                }
            }
            ".." => {
                if out.len() > 1 {
                    out.pop();
                }
                if last {
                    out.push("");
                }
            }
            s => out.push(s),
        }
    }
    let mut p = out.join("/");
    if !p.starts_with('/') {
        p.insert(0, '/');
    }
    p + query
}

/// How a forwarded POST ended, when it did not succeed.
impl UpstreamLink {
    /// The resolved message URL.
    pub fn post_uri(&self) -> &Uri {
        &self.post_uri
    }

    /// Forwards one client message. `Ok(())` on any 2xx.
    ///
    /// # Errors
    /// [`UpstreamError::Lost`] on 404 (the upstream no longer knows the session);
    /// [`UpstreamError::Timeout`] after the POST timeout; another [`UpstreamError`] otherwise.
    pub async fn post(&self, body: Bytes) -> Result<(), UpstreamError> {
        let req = Request::builder()
            .method(Method::POST)
            .uri(self.post_uri.clone())
            .header(header::CONTENT_TYPE, "application/json")
            .header(header::ACCEPT, "application/json, text/event-stream")
            .body(Full::new(body))
            .map_err(UpstreamError::Request)?;
        let fut = async {
            let resp = self
                .client
                .pool
                .request(req)
                .await
                .map_err(|e| UpstreamError::Connect(e.into()))?;
            let status = resp.status();
            // Read (a bounded amount of) the body so the connection can be reused; it is only
            // ever logged, never sent to the client.
            let body = http_body_util::Limited::new(resp.into_body(), 64 * 1024)
                .collect()
                .await
                .map(|b| b.to_bytes())
                .unwrap_or_default();
            if status.is_success() {
                Ok(())
            } else if status == StatusCode::NOT_FOUND {
                Err(UpstreamError::Lost)
            } else {
                tracing::debug!(%status, body = %String::from_utf8_lossy(&body[..body.len().min(256)]), "upstream refused a POST");
                Err(UpstreamError::Status(status))
            }
        };
        tokio::time::timeout(self.timeout, fut)
            .await
            .map_err(|_| UpstreamError::Timeout("POST not answered in time".into()))?
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncBufReadExt;

    /// Settings for an upstream at `url` (served in memory).
    fn settings(url: &str) -> UpstreamSettings {
        let mut cfg = crate::config::Config::default();
        cfg.upstream.sse_url = url.into();
        UpstreamSettings::from_config(&cfg.upstream).expect("plain http: no roots to load")
    }

    /// A client whose every connection is answered with `response` (written in `pieces`-byte
    /// writes, then closed), after the request head, which goes to `requests`.
    fn canned(
        response: &'static [u8],
        pieces: usize,
    ) -> (HttpClient, tokio::sync::mpsc::UnboundedReceiver<String>) {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let client = memory_client(Arc::new(move |_| {
            let (ours, theirs) = tokio::io::duplex(1024);
            let tx = tx.clone();
            tokio::spawn(async move {
                let mut theirs = tokio::io::BufReader::new(theirs);
                let mut head = String::new();
                while !head.ends_with("\r\n\r\n") {
                    if theirs.read_line(&mut head).await.unwrap() == 0 {
                        return;
                    }
                }
                let _ = tx.send(head);
                for piece in response.chunks(pieces) {
                    if theirs.write_all(piece).await.is_err() {
                        return;
                    }
                }
            });
            Ok(ours)
        }));
        (client, rx)
    }

    /// Every item of the stream, then how it ended.
    async fn drain(mut r: UpstreamReader) -> (Vec<Bytes>, Result<(), UpstreamError>) {
        let mut data = Vec::new();
        loop {
            match r.next().await {
                Ok(Some(UpstreamItem::Event(ev))) => data.push(ev.data),
                Ok(Some(other)) => panic!("{other:?}"),
                Ok(None) => return (data, Ok(())),
                Err(e) => return (data, Err(e)),
            }
        }
    }

    const ENDPOINT: &str = "event: endpoint\ndata: /messages?s=1\n\n";

    #[tokio::test]
    async fn sends_what_hyper_sent_and_reads_a_chunked_stream_in_any_pieces() {
        static RESPONSE: &[u8] = b"HTTP/1.1 100 Continue\r\n\r\n\
            HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n\
            25\r\nevent: endpoint\ndata: /messages?s=1\n\n\r\n\
            1e;x=y\r\ndata: one\n\ndata: two\n\ndata: th\r\n\
            7\r\nree\n\n:\n\r\n0\r\nT: 1\r\n\r\n";
        assert!(RESPONSE
            .windows(ENDPOINT.len())
            .any(|w| w == ENDPOINT.as_bytes()));
        for pieces in [1, 2, 3, 7, 64, 4096] {
            let (client, mut requests) = canned(RESPONSE, pieces);
            let set = settings("http://up.test:8080/a/sse?x=1");
            let (link, reader) = connect(&set, &client).await.unwrap();
            assert_eq!(
                requests.recv().await.unwrap(),
                "GET /a/sse?x=1 HTTP/1.1\r\nhost: up.test:8080\r\naccept: text/event-stream\r\n\
                 cache-control: no-cache\r\nconnection: close\r\n\r\n"
            );
            assert_eq!(
                link.post_uri().to_string(),
                "http://up.test:8080/messages?s=1"
            );
            let (data, end) = drain(reader).await;
            assert_eq!(data, ["one", "two", "three"], "{pieces}-byte writes");
            assert!(end.is_ok(), "{end:?}");
        }
    }

    #[tokio::test]
    async fn host_has_no_default_port() {
        static RESPONSE: &[u8] = b"HTTP/1.1 200 OK\r\n\r\nevent: endpoint\ndata: /m\n\n";
        let (client, mut requests) = canned(RESPONSE, 4096);
        connect(&settings("http://up.test:80/sse"), &client)
            .await
            .unwrap();
        let head = requests.recv().await.unwrap();
        assert!(
            head.starts_with("GET /sse HTTP/1.1\r\nhost: up.test\r\n"),
            "{head}"
        );
    }

    #[tokio::test]
    async fn broken_framing_ends_the_stream_with_an_error_after_the_good_events() {
        static RESPONSE: &[u8] = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n\
            25\r\nevent: endpoint\ndata: /messages?s=1\n\n\r\n\
            b\r\ndata: one\n\nXX\r\ndata: lost\n\n";
        let (client, _requests) = canned(RESPONSE, 4096);
        let (_, reader) = connect(&settings("http://up.test/sse"), &client)
            .await
            .unwrap();
        let (data, end) = drain(reader).await;
        assert_eq!(data, ["one"]);
        let err = end.unwrap_err();
        assert!(
            matches!(
                err,
                UpstreamError::Framing(http1::Error::Chunked("chunk data not followed by CRLF"))
            ),
            "{err:?}"
        );
        let source = std::error::Error::source(&err).expect("the framing error");
        assert_eq!(
            format!("{err}: {source}"),
            "the upstream's stream is malformed: malformed chunked body: chunk data not followed by CRLF"
        );
    }

    #[tokio::test]
    async fn a_cut_chunked_body_is_an_error_and_its_partial_event_is_dropped() {
        static RESPONSE: &[u8] = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n\
            25\r\nevent: endpoint\ndata: /messages?s=1\n\n\r\n\
            20\r\ndata: one\n\ndata: cut";
        let (client, _requests) = canned(RESPONSE, 4096);
        let (_, reader) = connect(&settings("http://up.test/sse"), &client)
            .await
            .unwrap();
        let (data, end) = drain(reader).await;
        assert_eq!(data, ["one"]);
        assert!(
            matches!(end, Err(UpstreamError::Framing(http1::Error::Truncated(_)))),
            "{end:?}"
        );
    }

    #[tokio::test]
    async fn a_close_delimited_body_ends_cleanly_at_eof() {
        static RESPONSE: &[u8] =
            b"HTTP/1.1 200 OK\r\n\r\nevent: endpoint\ndata: /m\n\ndata: one\n\ndata: partial";
        let (client, _requests) = canned(RESPONSE, 5);
        let (_, reader) = connect(&settings("http://up.test/sse"), &client)
            .await
            .unwrap();
        let (data, end) = drain(reader).await;
        assert_eq!(data, ["one"]);
        assert!(end.is_ok(), "{end:?}");
    }

    #[tokio::test]
    async fn refusals_before_the_stream() {
        static NOT_FOUND: &[u8] = b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n";
        let (client, _r) = canned(NOT_FOUND, 4096);
        let err = connect(&settings("http://up.test/sse"), &client)
            .await
            .unwrap_err();
        assert!(
            matches!(err, UpstreamError::Status(StatusCode::NOT_FOUND)),
            "{err:?}"
        );
        assert_eq!(err.connect_kind(), "status");
        static GZIP: &[u8] = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n";
        let (client, _r) = canned(GZIP, 4096);
        let err = connect(&settings("http://up.test/sse"), &client)
            .await
            .unwrap_err();
        assert!(
            matches!(err, UpstreamError::Framing(http1::Error::TransferCoding)),
            "{err:?}"
        );
        static SILENT: &[u8] = b"";
        let (client, _r) = canned(SILENT, 4096);
        let err = connect(&settings("http://up.test/sse"), &client)
            .await
            .unwrap_err();
        assert!(matches!(err, UpstreamError::Connect(_)), "{err:?}");
        static NO_ENDPOINT: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\ndata: x\n\n";
        let (client, _r) = canned(NO_ENDPOINT, 4096);
        let err = connect(&settings("http://up.test/sse"), &client)
            .await
            .unwrap_err();
        assert!(matches!(err, UpstreamError::NoEndpoint), "{err:?}");
    }

    fn base() -> HttpUrl {
        HttpUrl::parse("http://127.0.0.1:8000/a/sse?x=1").unwrap()
    }

    #[test]
    fn resolves_endpoint_forms() {
        let b = base();
        let r = |s: &str| resolve(&b, s).unwrap().to_string();
        assert_eq!(
            r("/message?sessionId=abc"),
            "http://127.0.0.1:8000/message?sessionId=abc"
        );
        assert_eq!(
            r("/messages/?session_id=ff"),
            "http://127.0.0.1:8000/messages/?session_id=ff"
        );
        assert_eq!(r("messages?s=1"), "http://127.0.0.1:8000/a/messages?s=1");
        assert_eq!(r("../m?s=1"), "http://127.0.0.1:8000/m?s=1");
        assert_eq!(r("?s=1"), "http://127.0.0.1:8000/a/sse?s=1");
        assert_eq!(
            r("http://127.0.0.1:9000/p?q=1"),
            "http://127.0.0.1:9000/p?q=1"
        );
        assert_eq!(r("//127.0.0.1:9001/p"), "http://127.0.0.1:9001/p");
        assert_eq!(r("https://x/p"), "https://x/p");
        assert!(resolve(&b, "ftp://x/p").is_err());
        assert!(resolve(&b, "http://u@x/p").is_err());
        let tls = HttpUrl::parse("https://up.example/sse").unwrap();
        assert_eq!(
            resolve(&tls, "/m?s=1").unwrap().to_string(),
            "https://up.example/m?s=1"
        );
        assert_eq!(
            resolve(&tls, "//other:8443/m").unwrap().to_string(),
            "https://other:8443/m"
        );
    }
}
