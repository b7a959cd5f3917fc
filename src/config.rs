//! Configuration: the TOML file of design.md §7, CLI overrides, defaults and validation.
//!
//! Loading is three steps — [`Config::load`] reads the file, [`Config::from_toml`] parses it (unknown
//! keys are rejected so a typo in a sidecar config fails at startup), [`Config::validate`] checks
//! values. All of it happens before any port is bound; `main` maps a [`ConfigError`] to exit code 64.

use serde::Deserialize;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Largest value accepted for a timeout in seconds (one day).
pub const MAX_TIMEOUT_SECS: u64 = 86_400;

/// Largest value accepted for `upstream.max_event_bytes` (255 MiB): the log's record bound,
/// [`crate::log::MAX_EVENT_BYTES`] (the two are held equal at compile time in `app.rs`).
pub const MAX_EVENT_BYTES: usize = 255 * 1024 * 1024;

/// A configuration error: one line naming the key at fault.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("config: cannot read {path}: {source}")]
    Read {
        /// The path given.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The TOML did not parse or named an unknown key.
    #[error("config: {0}")]
    Parse(String),
    /// A key has a value that cannot work.
    #[error("config: invalid `{key}`: {reason}")]
    Invalid {
        /// Dotted key, e.g. `upstream.sse_url`.
        key: &'static str,
        /// Why the value is rejected.
        reason: String,
    },
}

/// The whole configuration; each section belongs to one component.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Client-facing listener.
    pub listen: ListenConfig,
    /// Admin listener (`/metrics`, `/healthz`, `/readyz`).
    pub admin: AdminConfig,
    /// The legacy HTTP+SSE MCP server behind the proxy.
    pub upstream: UpstreamConfig,
    /// The legacy HTTP+SSE face.
    pub legacy: LegacyConfig,
    /// The Streamable HTTP face.
    pub streamable: StreamableConfig,
    /// The event log.
    pub log: LogConfig,
    /// Session lifetimes and limits.
    pub sessions: SessionsConfig,
    /// Graceful shutdown.
    pub shutdown: ShutdownConfig,
    /// Who a caller is (identity binding of sessions).
    pub auth: AuthConfig,
    /// TLS on the client listener.
    pub tls: crate::tls::TlsConfig,
    /// The MCP 2026-07-28 face on the Streamable HTTP path.
    pub modern: ModernConfig,
    /// The Tasks extension on the 2026-07-28 face.
    pub tasks: TasksConfig,
    /// This replica among several (`log.backend = "redis"`).
    pub cluster: ClusterConfig,
}

/// `[listen]`: where clients connect.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct ListenConfig {
    /// Address of the client listener.
    pub addr: String,
    /// Most client connections served at once; further accepts wait.
    pub max_connections: usize,
    /// Most requests and streams one caller may have open at once (listens, SSE streams, calls
    /// in flight; the caller as quotas see it: a verified identity, else its address), so one
    /// caller cannot take every connection slot; further ones get 503 `capacity`. `0` (the
    /// default): half of `max_connections`.
    pub max_connections_per_identity: usize,
    /// Seconds a request body may take to arrive completely, from the end of its head; a slower
    /// body is answered 408 and its connection closed, so it cannot hold a connection slot longer.
    pub body_timeout_secs: u64,
    /// Most bytes of client request bodies held in memory at once, all connections together
    /// (from the first byte read until the proxy is done with the body). A body that does not
    /// fit waits for room within `body_timeout_secs`, then gets 503; one body always fits (a
    /// budget below the 4 MiB body limit still admits one at a time). Bounds the proxy's
    /// memory under `max_connections` uploads.
    pub max_body_bytes_in_flight: usize,
    /// Origins (`scheme://host[:port]`) allowed to call either face from a browser; a request
    /// with any other `Origin` gets 403. Requests without `Origin` (non-browser clients) pass.
    pub allowed_origins: Vec<String>,
    /// When not empty, the `Host` header must name one of these (`host` or `host:port`), else
    /// 403: a DNS-rebinding page reaches the proxy under its own host name.
    pub allowed_hosts: Vec<String>,
}

/// `[admin]`: metrics and probes.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct AdminConfig {
    /// Address of the admin listener.
    pub addr: String,
}

/// `[upstream]`: the unmodified legacy server.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct UpstreamConfig {
    /// URL of the upstream's SSE endpoint (`http://host:port/path`).
    pub sse_url: String,
    /// Timeout of one forwarded POST, in seconds.
    pub post_timeout_secs: u64,
    /// Timeout for opening the upstream SSE stream and reading its `endpoint` event, in seconds.
    pub connect_timeout_secs: u64,
    /// Largest upstream SSE event accepted, in bytes; larger ones are dropped, counted and reported.
    pub max_event_bytes: usize,
    /// Seconds a forwarded request may stay unanswered; after it the proxy answers it with a logged
    /// JSON-RPC error (-32093) and drops a late upstream response to it. 0 (the default): no limit.
    pub request_timeout_secs: u64,
    /// PEM CA certificates trusted for an `https://` upstream, instead of the system's roots.
    pub ca_file: Option<PathBuf>,
    /// Origins (`scheme://host[:port]`) the upstream's `endpoint` event may name besides the
    /// origin of `sse_url`; any other makes the session fail (client bodies are never posted to
    /// an origin nobody configured).
    pub allowed_endpoint_origins: Vec<String>,
}

/// `[legacy]`: paths of the legacy face.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct LegacyConfig {
    /// Path of the SSE endpoint (`GET` opens or resumes a session).
    pub sse_path: String,
    /// Path of the message endpoint (`POST ?session_id=`).
    pub message_path: String,
}

/// `[streamable]`: the Streamable HTTP face.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct StreamableConfig {
    /// Path of the MCP endpoint.
    pub path: String,
    /// Deprecated alias of `listen.allowed_origins` (merged into it; both faces use one list).
    pub allowed_origins: Vec<String>,
}

/// How appends become durable.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Durability {
    /// Flush to disk (group commit) before any client sees an event.
    Fsync,
    /// Write to the store and let it flush in the background; an unclean stop seals the epoch.
    Relaxed,
}

/// `[log]`: the event log.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct LogConfig {
    /// Data directory of the log.
    pub dir: PathBuf,
    /// `fsync` or `relaxed`.
    pub durability: Durability,
    /// Events retained per session; older ones are trimmed.
    pub max_events_per_session: u64,
    /// Payload bytes retained per session; older events are trimmed.
    pub max_bytes_per_session: u64,
    /// Payload bytes retained by the whole process; ended sessions are evicted first, then new
    /// sessions are refused with 503.
    pub max_total_bytes: u64,
    /// Seconds the log may stay degraded (out of space, writes refused) before the process exits
    /// with 74 so the orchestrator restarts it; while degraded it reclaims dead segments and
    /// turns ready again, with no restart, once writes fit.
    pub store_error_exit_secs: u64,
    /// Where the log lives: `local` (the segment files in `dir`, the default) or `redis` (one
    /// logical log per session on Redis, `[log.redis]`, so any replica can serve it: §13).
    pub backend: Backend,
    /// `[log.redis]`: the shared log's server (with `backend = "redis"`).
    pub redis: RedisConfig,
}

/// Where the log lives (`log.backend`).
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    /// The segmented log on this pod's disk.
    #[default]
    Local,
    /// The shared log on Redis.
    Redis,
}

/// `[log.redis]`: the shared log's server.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct RedisConfig {
    /// `redis://` or `rediss://` (TLS with rustls) URL of one node: a single server or any node of
    /// a Redis Cluster (detected from the server).
    pub url: String,
    /// Prefix of every key the proxy writes (several proxies' logs may share one Redis).
    pub key_prefix: String,
    /// A file holding the URL instead (a mounted Secret: the URL may carry a password). Read
    /// once at start; exclusive with `url`.
    pub url_file: Option<std::path::PathBuf>,
}

impl Default for RedisConfig {
    fn default() -> Self {
        Self {
            url: String::new(),
            key_prefix: "mcp-resume".into(),
            url_file: None,
        }
    }
}

/// `[cluster]`: this replica among several sharing one log (`log.backend = "redis"`).
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct ClusterConfig {
    /// This replica's name, stable across its restarts (a StatefulSet pod's name): the sessions
    /// a previous run of it left live are ended by its next start. Default: the host name.
    pub replica_id: String,
    /// Milliseconds a replica's lease lasts: it renews it from its log writer's loop every
    /// third of it; once it lapsed (the pod died, or paused), another replica takes the
    /// sessions it owned over (their requests in flight answered -32091, their ends written).
    pub lease_ms: u64,
    /// Address of the internal listener other replicas forward writes to (POST and DELETE of a
    /// session this replica owns). Empty (the default): no forwarding; such requests get 404 on
    /// the replicas that do not own the session.
    pub listen: String,
    /// `host:port` other replicas reach the internal listener at (the pod's IP and port).
    /// Default: `cluster.listen` when it names a host; else (`0.0.0.0:port`) the address in the
    /// `POD_IP` environment variable (Kubernetes' downward API), else the host name, and the port.
    pub advertise_addr: String,
    /// The secret forwards are signed with (HMAC-SHA-256), shared by every replica: 64 hex
    /// characters, mode 0600. Required with `cluster.listen`.
    pub secret_file: Option<std::path::PathBuf>,
    /// Milliseconds a forward waits for the owner's answer (never retried: a timeout is 504).
    pub forward_timeout_ms: u64,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        Self {
            replica_id: host_name(),
            lease_ms: 10_000,
            listen: String::new(),
            advertise_addr: String::new(),
            secret_file: None,
            forward_timeout_ms: 5_000,
        }
    }
}

impl ClusterConfig {
    /// Where other replicas reach this one (`cluster.advertise_addr`, or derived from
    /// `cluster.listen`); empty without an internal listener.
    pub fn advertised(&self) -> String {
        if self.listen.is_empty() {
            return String::new();
        }
        if !self.advertise_addr.is_empty() {
            return self.advertise_addr.clone();
        }
        match self.listen.parse::<SocketAddr>() {
            // In a pod: its IP (the downward API's `status.podIP` as `POD_IP`), else its name.
            Ok(a) if a.ip().is_unspecified() => match std::env::var("POD_IP") {
                Ok(ip) if ip.parse::<std::net::IpAddr>().is_ok() => {
                    SocketAddr::new(ip.parse().expect("checked"), a.port()).to_string()
                }
                _ => format!("{}:{}", host_name(), a.port()),
            },
            _ => self.listen.clone(),
        }
    }
}

/// The host name (`HOSTNAME`, else `/etc/hostname`, else `proxy`).
fn host_name() -> String {
    std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "proxy".into())
}

/// `[sessions]`: lifetimes and limits.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct SessionsConfig {
    /// Seconds the upstream is kept open with no client attached.
    pub idle_ttl_secs: u64,
    /// Seconds the log of an ended session is kept for late resumers.
    pub retain_ended_secs: u64,
    /// Most live sessions at once.
    pub max_sessions: usize,
    /// Seconds between keepalive comments on every client SSE stream.
    pub keepalive_secs: u64,
    /// Most live sessions one owner may hold: a verified identity (JWT principal, client
    /// certificate), else one peer IP address (unverified header identities count under it).
    pub max_per_identity: usize,
    /// Seconds a session that never got a client message (beyond `initialize`) is kept after its
    /// last client left: probing clients do not hold upstream connections for `idle_ttl_secs`.
    pub unused_ttl_secs: u64,
}

/// `[shutdown]`: draining on SIGTERM/SIGINT.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct ShutdownConfig {
    /// Seconds allowed for the drain before the process exits anyway.
    pub grace_secs: u64,
}

impl Default for ListenConfig {
    fn default() -> Self {
        Self {
            addr: "127.0.0.1:8080".into(),
            max_connections: 10_000,
            max_connections_per_identity: 0,
            body_timeout_secs: 30,
            max_body_bytes_in_flight: 64 * 1024 * 1024,
            allowed_origins: Vec::new(),
            allowed_hosts: Vec::new(),
        }
    }
}

impl Default for AdminConfig {
    fn default() -> Self {
        Self {
            addr: "127.0.0.1:9090".into(),
        }
    }
}

impl Default for UpstreamConfig {
    fn default() -> Self {
        Self {
            sse_url: "http://127.0.0.1:8000/sse".into(),
            post_timeout_secs: 30,
            connect_timeout_secs: 10,
            max_event_bytes: 4 * 1024 * 1024,
            request_timeout_secs: 0,
            ca_file: None,
            allowed_endpoint_origins: Vec::new(),
        }
    }
}

impl Default for LegacyConfig {
    fn default() -> Self {
        Self {
            sse_path: "/sse".into(),
            message_path: "/messages".into(),
        }
    }
}

impl Default for StreamableConfig {
    fn default() -> Self {
        Self {
            path: "/mcp".into(),
            allowed_origins: Vec::new(),
        }
    }
}

impl Default for LogConfig {
    fn default() -> Self {
        Self {
            dir: PathBuf::from("./data"),
            durability: Durability::Fsync,
            max_events_per_session: 10_000,
            max_bytes_per_session: 64 * 1024 * 1024,
            max_total_bytes: 1024 * 1024 * 1024,
            store_error_exit_secs: 60,
            backend: Backend::Local,
            redis: RedisConfig::default(),
        }
    }
}

impl Default for SessionsConfig {
    fn default() -> Self {
        Self {
            idle_ttl_secs: 300,
            retain_ended_secs: 600,
            max_sessions: 10_000,
            keepalive_secs: 15,
            max_per_identity: 1000,
            unused_ttl_secs: 15,
        }
    }
}

impl Default for ShutdownConfig {
    fn default() -> Self {
        Self { grace_secs: 10 }
    }
}

/// Values given on the command line; each one, when set, overrides the file.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    /// `--upstream URL` → `upstream.sse_url`.
    pub upstream: Option<String>,
    /// `--listen ADDR` → `listen.addr`.
    pub listen: Option<String>,
    /// `--admin-listen ADDR` → `admin.addr`.
    pub admin_listen: Option<String>,
    /// `--data-dir DIR` → `log.dir`.
    pub data_dir: Option<PathBuf>,
}

/// An `http://` or `https://` URL split into the parts the upstream link needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpUrl {
    /// `true` for `https://`.
    pub tls: bool,
    /// `host:port` authority as written (also the `Host` header sent upstream).
    pub authority: String,
    /// Path and query, starting with `/`.
    pub path_and_query: String,
}

impl HttpUrl {
    /// Parses an absolute `http://` or `https://` URL.
    ///
    /// # Errors
    /// A reason string when the URL is not an absolute HTTP(S) URL with a host.
    pub fn parse(url: &str) -> Result<Self, String> {
        let uri: http::Uri = url.parse().map_err(|e| format!("not a URL: {e}"))?;
        let tls = match uri.scheme_str() {
            Some("http") => false,
            Some("https") => true,
            Some(other) => {
                return Err(format!(
                    "scheme `{other}` is not supported (use http:// or https://)"
                ))
            }
            None => return Err("must be an absolute http:// or https:// URL".into()),
        };
        let authority = uri.authority().ok_or("missing host")?.as_str().to_string();
        if authority.contains('@') {
            return Err("userinfo is not supported".into());
        }
        // Nor does `http::Uri` refuse bytes beyond ASCII in the host, which no `Host` or `Origin`
        // header can carry as text (found by fuzzing).
        if !authority.is_ascii() {
            return Err(
                "the host must be ASCII (an internationalised name in its xn-- form)".into(),
            );
        }
        // `http::Uri` accepts any text after the host's last colon and reports no port for it;
        // a port must be decimal digits that fit in 16 bits (`+80` and `ffff` are not ports:
        // found by fuzzing, where `https://+:FFFF` normalised to `https://+:ffff:443`).
        if let Some(i) = authority
            .rfind(':')
            .filter(|&i| !authority[i..].contains(']'))
        {
            let port = &authority[i + 1..];
            if port.is_empty()
                || !port.bytes().all(|b| b.is_ascii_digit())
                || port.parse::<u16>().is_err()
            {
                return Err(format!("`{port}` is not a port number"));
            }
        }
        let path_and_query = uri
            .path_and_query()
            .map(|p| p.as_str().to_string())
            .unwrap_or_else(|| "/".into());
        Ok(Self {
            tls,
            authority,
            path_and_query,
        })
    }

    /// `http` or `https`.
    pub fn scheme(&self) -> &'static str {
        if self.tls {
            "https"
        } else {
            "http"
        }
    }

    /// The URL as text.
    pub fn to_url(&self) -> String {
        format!(
            "{}://{}{}",
            self.scheme(),
            self.authority,
            self.path_and_query
        )
    }

    /// Its origin, normalised: `scheme://host:port` in lowercase, with the default port spelled out.
    pub fn origin(&self) -> String {
        origin_of(self.tls, &self.authority)
    }
}

/// `scheme://host:port` in lowercase with the default port spelled out (RFC 6454 serialisation,
/// but always with the port, so that equal origins compare equal as strings).
pub fn origin_of(tls: bool, authority: &str) -> String {
    let a = authority.to_ascii_lowercase();
    let has_port = match a.rfind(':') {
        Some(i) => !a[i..].contains(']') && a[i + 1..].bytes().all(|b| b.is_ascii_digit()),
        None => false,
    };
    let scheme = if tls { "https" } else { "http" };
    if has_port {
        format!("{scheme}://{a}")
    } else {
        format!("{scheme}://{a}:{}", if tls { 443 } else { 80 })
    }
}

/// An origin as written in the config (`https://host[:port]`), normalised like [`origin_of`].
///
/// # Errors
/// A reason when it is not `scheme://host[:port]`.
pub fn parse_origin(o: &str) -> Result<String, String> {
    let bad = || format!("`{o}` is not an origin like https://host:port");
    let u = HttpUrl::parse(o).map_err(|_| bad())?;
    // `http::Uri` drops a fragment without a word (found by fuzzing: `https://h#x`).
    if u.path_and_query != "/" || o.ends_with('/') || o.contains('#') || !o.is_ascii() {
        return Err(bad());
    }
    Ok(u.origin())
}

/// Keeps an error message on one line, as [`ConfigError`] promises: control characters from the
/// file (a bare CR in a quoted source line, a newline inside a value) are escaped (found by
/// fuzzing).
fn one_line(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

impl Config {
    /// Reads, parses and validates the file at `path` (or the defaults when `None`), with `over`
    /// applied on top.
    ///
    /// # Errors
    /// [`ConfigError`] naming the key (or the file) at fault.
    pub fn load(path: Option<&Path>, over: &Overrides) -> Result<Self, ConfigError> {
        let mut cfg = match path {
            Some(p) => {
                let text = std::fs::read_to_string(p).map_err(|source| ConfigError::Read {
                    path: p.to_path_buf(),
                    source,
                })?;
                Self::from_toml(&text)?
            }
            None => Self::default(),
        };
        cfg.apply(over);
        cfg.validate()
    }

    /// Parses TOML text; unknown keys are errors.
    ///
    /// # Errors
    /// [`ConfigError::Parse`] with the parser's message, which names the key and line.
    pub fn from_toml(text: &str) -> Result<Self, ConfigError> {
        toml::from_str(text)
            .map_err(|e| ConfigError::Parse(one_line(&e.to_string().replace('\n', " "))))
    }

    /// Applies command-line overrides.
    pub fn apply(&mut self, over: &Overrides) {
        if let Some(u) = &over.upstream {
            self.upstream.sse_url = u.clone();
        }
        if let Some(a) = &over.listen {
            self.listen.addr = a.clone();
        }
        if let Some(a) = &over.admin_listen {
            self.admin.addr = a.clone();
        }
        if let Some(d) = &over.data_dir {
            self.log.dir = d.clone();
        }
    }

    /// Checks every value that could only fail later, at run time.
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] naming the first bad key.
    pub fn validate(mut self) -> Result<Self, ConfigError> {
        fn bad(key: &'static str, reason: impl Into<String>) -> ConfigError {
            ConfigError::Invalid {
                key,
                reason: one_line(&reason.into()),
            }
        }
        fn addr(key: &'static str, v: &str) -> Result<(), ConfigError> {
            v.parse::<SocketAddr>()
                .map(|_| ())
                .map_err(|_| bad(key, format!("`{v}` is not an IP:port address")))
        }
        fn path(key: &'static str, v: &str) -> Result<(), ConfigError> {
            if !v.starts_with('/') || v.contains(['?', '#', ' ']) {
                return Err(bad(
                    key,
                    format!("`{v}` must be an absolute path without query"),
                ));
            }
            Ok(())
        }
        fn positive(key: &'static str, v: u64) -> Result<(), ConfigError> {
            if v == 0 {
                return Err(bad(key, "must be greater than 0"));
            }
            Ok(())
        }
        addr("listen.addr", &self.listen.addr)?;
        addr("admin.addr", &self.admin.addr)?;
        positive("listen.max_connections", self.listen.max_connections as u64)?;
        positive("listen.body_timeout_secs", self.listen.body_timeout_secs)?;
        positive(
            "listen.max_body_bytes_in_flight",
            self.listen.max_body_bytes_in_flight as u64,
        )?;
        // Seconds become `Duration`s and deadlines; absurd values would overflow `Instant` math.
        if self.listen.body_timeout_secs > MAX_TIMEOUT_SECS {
            return Err(bad(
                "listen.body_timeout_secs",
                format!("must be at most {MAX_TIMEOUT_SECS}"),
            ));
        }
        HttpUrl::parse(&self.upstream.sse_url).map_err(|r| bad("upstream.sse_url", r))?;
        for o in &self.upstream.allowed_endpoint_origins {
            parse_origin(o).map_err(|r| bad("upstream.allowed_endpoint_origins", r))?;
        }
        if self.upstream.reaches_https() || self.upstream.ca_file.is_some() {
            crate::tls::upstream_client(self.upstream.ca_file.as_deref())
                .map_err(|e| bad(e.key, e.reason))?;
        }
        positive(
            "upstream.post_timeout_secs",
            self.upstream.post_timeout_secs,
        )?;
        positive(
            "upstream.connect_timeout_secs",
            self.upstream.connect_timeout_secs,
        )?;
        if self.upstream.request_timeout_secs > MAX_TIMEOUT_SECS {
            return Err(bad(
                "upstream.request_timeout_secs",
                format!("must be at most {MAX_TIMEOUT_SECS} (0 = no limit)"),
            ));
        }
        if self.upstream.max_event_bytes < 1024 {
            return Err(bad("upstream.max_event_bytes", "must be at least 1024"));
        }
        // A record is read back only up to the log's record bound: a larger event could be
        // written but never read (found by review).
        if self.upstream.max_event_bytes > MAX_EVENT_BYTES {
            return Err(bad(
                "upstream.max_event_bytes",
                "must be at most 255 MiB (the log's record bound)",
            ));
        }
        path("legacy.sse_path", &self.legacy.sse_path)?;
        path("legacy.message_path", &self.legacy.message_path)?;
        path("streamable.path", &self.streamable.path)?;
        let paths = [
            &self.legacy.sse_path,
            &self.legacy.message_path,
            &self.streamable.path,
        ];
        if paths[0] == paths[1] || paths[0] == paths[2] || paths[1] == paths[2] {
            return Err(bad("streamable.path", "the three client paths must differ"));
        }
        for o in &self.streamable.allowed_origins {
            parse_origin(o).map_err(|r| bad("streamable.allowed_origins", r))?;
        }
        for o in &self.listen.allowed_origins {
            parse_origin(o).map_err(|r| bad("listen.allowed_origins", r))?;
        }
        for h in &self.listen.allowed_hosts {
            if h.is_empty()
                || h.contains(['/', ' ', '@'])
                || h.parse::<http::uri::Authority>().is_err()
            {
                return Err(bad(
                    "listen.allowed_hosts",
                    format!("`{h}` is not a host or host:port"),
                ));
            }
        }
        crate::tls::check(&self.tls).map_err(|e| bad(e.key, e.reason))?;
        self.auth.check().map_err(|(k, r)| bad(k, r))?;
        for (i, h) in self.auth.identity_headers.iter().enumerate() {
            if http::HeaderName::from_bytes(h.as_bytes()).is_err() {
                return Err(bad(
                    "auth.identity_headers",
                    format!("entry {i} (`{h}`) is not a header name"),
                ));
            }
        }
        if self.log.dir.as_os_str().is_empty() {
            return Err(bad("log.dir", "must not be empty"));
        }
        positive(
            "log.max_events_per_session",
            self.log.max_events_per_session,
        )?;
        positive("log.max_bytes_per_session", self.log.max_bytes_per_session)?;
        positive("log.store_error_exit_secs", self.log.store_error_exit_secs)?;
        if self.log.store_error_exit_secs > MAX_TIMEOUT_SECS {
            return Err(bad(
                "log.store_error_exit_secs",
                format!("must be at most {MAX_TIMEOUT_SECS}"),
            ));
        }
        if self.log.max_total_bytes < self.log.max_bytes_per_session {
            return Err(bad(
                "log.max_total_bytes",
                "must be at least log.max_bytes_per_session",
            ));
        }
        if let Some(f) = &self.log.redis.url_file {
            if !self.log.redis.url.is_empty() {
                return Err(bad(
                    "log.redis.url_file",
                    "set log.redis.url or log.redis.url_file, not both",
                ));
            }
            let text = std::fs::read_to_string(f).map_err(|e| {
                bad(
                    "log.redis.url_file",
                    format!("cannot read {}: {e}", f.display()),
                )
            })?;
            self.log.redis.url = text.trim().to_string();
        }
        if self.log.backend == Backend::Redis {
            let u = &self.log.redis.url;
            if u.is_empty() {
                return Err(bad(
                    "log.redis.url",
                    "is required with log.backend = \"redis\"",
                ));
            }
            if !(u.starts_with("redis://") || u.starts_with("rediss://")) {
                return Err(bad("log.redis.url", "must be a redis:// or rediss:// URL"));
            }
            redis::Client::open(u.as_str())
                .map_err(|e| bad("log.redis.url", format!("is not a Redis URL: {e}")))?;
        }
        let p = &self.log.redis.key_prefix;
        if p.is_empty() || p.len() > 64 || p.contains(['{', '}', ' ']) {
            return Err(bad(
                "log.redis.key_prefix",
                "must be 1 to 64 characters without braces or spaces",
            ));
        }
        let r = &self.cluster.replica_id;
        if r.is_empty()
            || r.len() > 128
            || !r
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        {
            return Err(bad(
                "cluster.replica_id",
                "must be 1 to 128 characters of letters, digits, '-', '_' and '.'",
            ));
        }
        if let Some(f) = &self.auth.key_file {
            crate::keyfile::read(f).map_err(|r| bad("auth.key_file", r))?;
        }
        if !self.cluster.listen.is_empty() {
            addr("cluster.listen", &self.cluster.listen)?;
            if self.cluster.listen.ends_with(":0") {
                return Err(bad(
                    "cluster.listen",
                    "must name a port (other replicas are told where it is)",
                ));
            }
            if self.log.backend != Backend::Redis {
                return Err(bad(
                    "cluster.listen",
                    "forwarding needs log.backend = \"redis\"",
                ));
            }
            let Some(f) = &self.cluster.secret_file else {
                return Err(bad(
                    "cluster.secret_file",
                    "is required with cluster.listen",
                ));
            };
            crate::keyfile::read(f).map_err(|r| bad("cluster.secret_file", r))?;
        }
        let a = &self.cluster.advertise_addr;
        if !a.is_empty()
            && a.rsplit_once(':').is_none_or(|(h, p)| {
                h.is_empty() || p.parse::<u16>().is_err() || h.contains(['/', ' ', '@'])
            })
        {
            return Err(bad(
                "cluster.advertise_addr",
                format!("`{a}` is not host:port"),
            ));
        }
        if !(100..=120_000).contains(&self.cluster.forward_timeout_ms) {
            return Err(bad(
                "cluster.forward_timeout_ms",
                "must be between 100 and 120000",
            ));
        }
        if !(1000..=600_000).contains(&self.cluster.lease_ms) {
            return Err(bad("cluster.lease_ms", "must be between 1000 and 600000"));
        }
        positive("sessions.idle_ttl_secs", self.sessions.idle_ttl_secs)?;
        positive("sessions.max_sessions", self.sessions.max_sessions as u64)?;
        positive("sessions.keepalive_secs", self.sessions.keepalive_secs)?;
        positive(
            "sessions.max_per_identity",
            self.sessions.max_per_identity as u64,
        )?;
        positive("sessions.unused_ttl_secs", self.sessions.unused_ttl_secs)?;
        positive("shutdown.grace_secs", self.shutdown.grace_secs)?;
        positive(
            "modern.pool_max_sessions",
            self.modern.pool_max_sessions as u64,
        )?;
        positive("modern.pool_idle_secs", self.modern.pool_idle_secs)?;
        positive("modern.input_ttl_secs", self.modern.input_ttl_secs)?;
        positive(
            "modern.max_per_identity",
            self.modern.max_per_identity as u64,
        )?;
        positive("modern.listen_max_secs", self.modern.listen_max_secs)?;
        positive("tasks.ttl_secs", self.tasks.ttl_secs)?;
        positive("tasks.poll_interval_ms", self.tasks.poll_interval_ms)?;
        Ok(self)
    }
}

impl UpstreamConfig {
    /// The upstream SSE URL, parsed (validated by [`Config::validate`]).
    pub fn url(&self) -> HttpUrl {
        HttpUrl::parse(&self.sse_url).expect("validated upstream.sse_url")
    }

    /// Whether an `https://` connection to the upstream can be made: its SSE URL or an allowed
    /// endpoint origin is `https`, as parsed (so `HTTPS://` is too: found by the adversary review
    /// of 2026-12-06, when the start checked the text and the runtime the parsed origin). Root
    /// certificates are loaded, and checked at start, only then.
    pub fn reaches_https(&self) -> bool {
        HttpUrl::parse(&self.sse_url).is_ok_and(|u| u.tls)
            || self
                .allowed_endpoint_origins
                .iter()
                .filter_map(|o| parse_origin(o).ok())
                .any(|o| o.starts_with("https://"))
    }

    /// How long a forwarded request may stay unanswered (`upstream.request_timeout_secs`); `None`
    /// when there is no limit.
    pub fn request_timeout(&self) -> Option<Duration> {
        (self.request_timeout_secs > 0).then(|| Duration::from_secs(self.request_timeout_secs))
    }
}

impl ListenConfig {
    /// `listen.max_connections_per_identity`, its default (`0`) resolved: half of
    /// `max_connections`.
    pub fn per_identity_connections(&self) -> usize {
        match self.max_connections_per_identity {
            0 => (self.max_connections / 2).max(1),
            n => n,
        }
    }

    /// How long a request body may take to arrive (`listen.body_timeout_secs`).
    pub fn body_timeout(&self) -> Duration {
        Duration::from_secs(self.body_timeout_secs)
    }
}

impl SessionsConfig {
    /// Keepalive period (`sessions.keepalive_secs`).
    pub fn keepalive(&self) -> Duration {
        Duration::from_secs(self.keepalive_secs)
    }
}

/// `auth.mode`: how a caller's identity is established.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum AuthMode {
    /// The keyed hash of the identity headers' values (and client certificate), unverified.
    #[default]
    Opaque,
    /// A verified bearer JWT (OAuth 2.1 resource server): identity = (iss, sub).
    Jwt,
}

/// `[auth]`: what identifies a caller.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct AuthConfig {
    /// `opaque` (default) or `jwt`.
    pub mode: AuthMode,
    /// Request headers whose values make up the caller's identity (case-insensitive names;
    /// `opaque` mode).
    pub identity_headers: Vec<String>,
    /// Requests without any identity (no such header, no client certificate) get 401 (`opaque`
    /// mode; with `jwt` every request needs a valid token).
    pub require_identity: bool,
    /// `jwt`: the JWKS file with the issuer's public keys (read again when it changes).
    pub jwks_file: Option<std::path::PathBuf>,
    /// `jwt`: the accepted `iss`.
    pub issuer: String,
    /// `jwt`: accepted `aud` values (the token must name one): this resource's identifiers.
    pub audience: Vec<String>,
    /// `jwt`: seconds of clock skew allowed on `exp` and `nbf`.
    pub leeway_secs: u64,
    /// `jwt`: accepted signature algorithms (asymmetric only: [`crate::jwt::ALLOWED`]).
    pub algorithms: Vec<String>,
    /// `jwt`: the protected resource metadata URL (RFC 9728) named in `WWW-Authenticate`
    /// (empty: none).
    pub resource_metadata_url: String,
    /// The secret that keys identities and log tags, shared by every replica (32 bytes as 64
    /// hex characters, mode 0600). Unset: generated once in the data directory.
    pub key_file: Option<std::path::PathBuf>,
}

impl Default for AuthConfig {
    fn default() -> Self {
        Self {
            mode: AuthMode::Opaque,
            identity_headers: vec!["authorization".into()],
            require_identity: false,
            jwks_file: None,
            issuer: "".into(),
            audience: Vec::new(),
            leeway_secs: 60,
            algorithms: vec!["RS256".into(), "ES256".into(), "EdDSA".into()],
            resource_metadata_url: "".into(),
            key_file: None,
        }
    }
}

impl AuthConfig {
    /// The token rules of `jwt` mode (`None` in `opaque` mode). Call on a validated config.
    pub fn jwt_rules(&self) -> Option<crate::jwt::JwtRules> {
        (self.mode == AuthMode::Jwt).then(|| crate::jwt::JwtRules {
            jwks_file: self.jwks_file.clone().unwrap_or_default(),
            issuer: self.issuer.clone(),
            audience: self.audience.clone(),
            leeway_secs: self.leeway_secs,
            algorithms: self
                .algorithms
                .iter()
                .filter_map(|a| crate::jwt::parse_algorithm(a))
                .collect(),
        })
    }

    /// Checks the `[auth]` keys: `(key, reason)` of the first bad one.
    pub fn check(&self) -> Result<(), (&'static str, String)> {
        if self.mode != AuthMode::Jwt {
            return Ok(());
        }
        let Some(f) = &self.jwks_file else {
            return Err(("auth.jwks_file", "required with auth.mode = \"jwt\"".into()));
        };
        crate::jwt::load_jwks(f).map_err(|e| ("auth.jwks_file", e))?;
        if self.issuer.trim().is_empty() || self.issuer.trim() != self.issuer {
            return Err(("auth.issuer", "required with auth.mode = \"jwt\"".into()));
        }
        if self.audience.is_empty()
            || self
                .audience
                .iter()
                .any(|a| a.trim().is_empty() || a.trim() != a)
        {
            return Err((
                "auth.audience",
                "one or more non-empty values, without surrounding spaces, required with auth.mode = \"jwt\"".into(),
            ));
        }
        if self.leeway_secs > 600 {
            return Err(("auth.leeway_secs", "at most 600".into()));
        }
        if self.algorithms.is_empty() {
            return Err(("auth.algorithms", "at least one".into()));
        }
        for a in &self.algorithms {
            if crate::jwt::parse_algorithm(a).is_none() {
                return Err((
                    "auth.algorithms",
                    format!(
                        "`{a}` is not one of {} (asymmetric only: never none or HMAC)",
                        crate::jwt::ALLOWED.join(", ")
                    ),
                ));
            }
        }
        if !self.resource_metadata_url.is_empty() {
            let u = &self.resource_metadata_url;
            let ok = u.parse::<http::Uri>().ok().is_some_and(|u| {
                matches!(u.scheme_str(), Some("https" | "http")) && u.host().is_some()
            }) && !u.contains(['"', '\\']);
            if !ok {
                return Err((
                    "auth.resource_metadata_url",
                    format!("`{u}` is not an absolute http(s) URL"),
                ));
            }
        }
        Ok(())
    }
}

/// `[modern]`: the 2026-07-28 face.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct ModernConfig {
    /// Most upstream sessions the pool keeps open at once (all identities together).
    pub pool_max_sessions: usize,
    /// Seconds an upstream session of the pool with nothing in flight stays open.
    pub pool_idle_secs: u64,
    /// Seconds a request waits for an upstream session when the pool is full of busy ones; then
    /// it is answered with an error.
    pub pool_wait_secs: u64,
    /// `ttlMs` put on cacheable results (`tools/list`, … , `server/discover`); `cacheScope` is
    /// always `"private"` (pools are per identity).
    pub cache_ttl_ms: u64,
    /// Seconds a parked MRTR call waits for the client's retry (the `requestState` lifetime).
    pub input_ttl_secs: u64,
    /// Most upstream sessions of the pool, most live listens and most running tasks one owner
    /// may hold (each counted on its own): a verified identity, else one peer address.
    pub max_per_identity: usize,
    /// Seconds a `subscriptions/listen` stream lasts; then it ends gracefully (the client listens
    /// again).
    pub listen_max_secs: u64,
    /// What `server/discover` offers (see [`Discover`]).
    pub discover: Discover,
}

/// `modern.discover`: what `server/discover` tells dual-era clients.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Discover {
    /// 2026-07-28 offered: dual-era and pinned clients get this stateless face, where a cut
    /// response stream loses its call (the spec's rule: re-issue it, or use a task).
    Advertise,
    /// 2026-07-28 not offered: discover is answered `-32022` listing the sessionful versions, so
    /// dual-era clients fall back to `initialize` at 2025-11-25, whose streams resume exactly.
    /// Requests sent straight away at 2026-07-28 (clients pinned without discovery) are still
    /// served; a pinned client that discovers first fails at connect, told why.
    Resumable,
}

impl Default for ModernConfig {
    fn default() -> Self {
        Self {
            pool_max_sessions: 64,
            pool_idle_secs: 60,
            pool_wait_secs: 10,
            cache_ttl_ms: 0,
            input_ttl_secs: 300,
            max_per_identity: 8,
            listen_max_secs: 3600,
            discover: Discover::Resumable,
        }
    }
}

/// When a `tools/call` of a client that declared the extension becomes a task.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum TaskMode {
    /// Every such call.
    Always,
    /// A call still unanswered after `tasks.after_ms` (quick calls stay plain results).
    After,
}

/// `[tasks]`: the Tasks extension on the 2026-07-28 face.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct TasksConfig {
    /// `"always"` or `"after"`.
    pub mode: TaskMode,
    /// With `mode = "after"`: milliseconds a call may take before it becomes a task.
    pub after_ms: u64,
    /// Seconds a task (and its result) is kept from its creation (`ttlMs`).
    pub ttl_secs: u64,
    /// Milliseconds between polls suggested to clients (`pollIntervalMs`).
    pub poll_interval_ms: u64,
}

impl Default for TasksConfig {
    fn default() -> Self {
        Self {
            mode: TaskMode::After,
            after_ms: 1000,
            ttl_secs: 3600,
            poll_interval_ms: 1000,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_match_design() {
        let c = Config::default().validate().unwrap();
        assert_eq!(c.listen.addr, "127.0.0.1:8080");
        assert_eq!(c.admin.addr, "127.0.0.1:9090");
        assert_eq!(c.upstream.post_timeout_secs, 30);
        assert_eq!(c.legacy.sse_path, "/sse");
        assert_eq!(c.legacy.message_path, "/messages");
        assert_eq!(c.streamable.path, "/mcp");
        assert_eq!(c.log.durability, Durability::Fsync);
        assert_eq!(c.log.max_events_per_session, 10_000);
        assert_eq!(c.log.max_bytes_per_session, 67_108_864);
        assert_eq!(c.sessions.idle_ttl_secs, 300);
        assert_eq!(c.sessions.retain_ended_secs, 600);
        assert_eq!(c.sessions.max_sessions, 10_000);
        assert_eq!(c.sessions.keepalive_secs, 15);
        assert_eq!(c.listen.body_timeout_secs, 30);
        assert_eq!(c.upstream.request_timeout_secs, 0);
        assert_eq!(c.upstream.request_timeout(), None);
    }

    #[test]
    fn example_file_parses_to_defaults() {
        let text = include_str!("../proxy.toml.example");
        let c = Config::from_toml(text).unwrap().validate().unwrap();
        assert_eq!(c, Config::default());
    }

    #[test]
    fn unknown_key_is_named() {
        let err = Config::from_toml("[log]\ndurabilty = \"fsync\"\n").unwrap_err();
        assert!(err.to_string().contains("durabilty"), "{err}");
        let err = Config::from_toml("[nope]\n").unwrap_err();
        assert!(err.to_string().contains("nope"), "{err}");
    }

    #[test]
    fn errors_stay_on_one_line() {
        // Found by fuzzing (fuzz/corpus/config/regression-bare-cr): the parser quotes the source
        // line, and a bare CR in it reached the message.
        let err = Config::from_toml("[listen]\n\r[sessions]\n").unwrap_err();
        let msg = err.to_string();
        assert!(!msg.chars().any(char::is_control), "{msg:?}");
        assert!(msg.contains("\\r"), "{msg:?}");
        // A value with a newline is shown escaped, not split.
        let err = Config::from_toml("[listen]\naddr = \"a\\nb\"\n")
            .unwrap()
            .validate()
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "config: invalid `listen.addr`: `a\\nb` is not an IP:port address"
        );
    }

    #[test]
    fn bad_values_name_their_key() {
        let cases = [
            ("[log]\ndurability = \"sometimes\"\n", "sometimes"),
            ("[listen]\naddr = \"localhost\"\n", "listen.addr"),
            (
                "[upstream]\nsse_url = \"ftp://x/sse\"\n",
                "upstream.sse_url",
            ),
            ("[upstream]\nsse_url = \"/sse\"\n", "upstream.sse_url"),
            ("[legacy]\nsse_path = \"sse\"\n", "legacy.sse_path"),
            (
                "[sessions]\nkeepalive_secs = 0\n",
                "sessions.keepalive_secs",
            ),
            ("[log]\nmax_total_bytes = 10\n", "log.max_total_bytes"),
            (
                "[log]\nstore_error_exit_secs = 0\n",
                "log.store_error_exit_secs",
            ),
            ("[log]\nbackend = \"redis\"\n", "log.redis.url"),
            (
                "[log]\nbackend = \"redis\"\n[log.redis]\nurl = \"http://x\"\n",
                "log.redis.url",
            ),
            (
                "[log.redis]\nkey_prefix = \"a{b}\"\n",
                "log.redis.key_prefix",
            ),
            ("[cluster]\nreplica_id = \"a/b\"\n", "cluster.replica_id"),
            ("[cluster]\nlease_ms = 999\n", "cluster.lease_ms"),
            ("[cluster]\nlisten = \"127.0.0.1:0\"\n", "cluster.listen"),
            (
                "[cluster]\nadvertise_addr = \"nope\"\n",
                "cluster.advertise_addr",
            ),
            (
                "[upstream]\nmax_event_bytes = 300000000\n",
                "upstream.max_event_bytes",
            ),
            ("[streamable]\npath = \"/sse\"\n", "streamable.path"),
            (
                "[listen]\nbody_timeout_secs = 0\n",
                "listen.body_timeout_secs",
            ),
            (
                "[listen]\nbody_timeout_secs = 86401\n",
                "listen.body_timeout_secs",
            ),
            (
                "[upstream]\nrequest_timeout_secs = 999999999\n",
                "upstream.request_timeout_secs",
            ),
            (
                "[upstream]\nallowed_endpoint_origins = [\"http://x/p\"]\n",
                "upstream.allowed_endpoint_origins",
            ),
            (
                "[upstream]\nsse_url = \"https://x/sse\"\nca_file = \"/nonexistent.pem\"\n",
                "upstream.ca_file",
            ),
        ];
        for (text, key) in cases {
            let err = Config::from_toml(text)
                .and_then(Config::validate)
                .unwrap_err()
                .to_string();
            assert!(err.contains(key), "{text:?} -> {err}");
            assert!(!err.contains('\n'), "one line: {err}");
        }
    }

    #[test]
    fn request_timeout_is_off_unless_set() {
        let c = Config::from_toml("[upstream]\nrequest_timeout_secs = 0\n")
            .and_then(Config::validate)
            .unwrap();
        assert_eq!(c.upstream.request_timeout(), None);
        let c = Config::from_toml("[upstream]\nrequest_timeout_secs = 20\n")
            .and_then(Config::validate)
            .unwrap();
        assert_eq!(c.upstream.request_timeout(), Some(Duration::from_secs(20)));
        let c = Config::from_toml("[listen]\nbody_timeout_secs = 5\n")
            .and_then(Config::validate)
            .unwrap();
        assert_eq!(c.listen.body_timeout(), Duration::from_secs(5));
    }

    #[test]
    fn https_is_read_from_parsed_urls_and_origins() {
        let up = |toml: &str| Config::from_toml(toml).unwrap().upstream.reaches_https();
        assert!(!up("[upstream]\nsse_url = \"http://u:1/sse\"\n"));
        assert!(!up(
            "[upstream]\nsse_url = \"http://u:1/sse\"\nallowed_endpoint_origins = [\"http://a:2\"]\n"
        ));
        assert!(up("[upstream]\nsse_url = \"HTTPS://u/sse\"\n"));
        for origin in ["https://a", "HTTPS://a", "Https://a:8443"] {
            assert!(
                up(&format!(
                    "[upstream]\nsse_url = \"http://u:1/sse\"\nallowed_endpoint_origins = [\"{origin}\"]\n"
                )),
                "{origin}"
            );
        }
    }

    #[test]
    fn overrides_win_over_file() {
        let mut c = Config::from_toml("[listen]\naddr = \"127.0.0.1:1\"\n").unwrap();
        c.apply(&Overrides {
            listen: Some("127.0.0.1:2".into()),
            data_dir: Some("/tmp/x".into()),
            ..Default::default()
        });
        assert_eq!(c.listen.addr, "127.0.0.1:2");
        assert_eq!(c.log.dir, PathBuf::from("/tmp/x"));
    }

    #[test]
    fn http_url_parts() {
        let u = HttpUrl::parse("http://127.0.0.1:8000/sse?x=1").unwrap();
        assert_eq!(u.authority, "127.0.0.1:8000");
        assert_eq!(u.path_and_query, "/sse?x=1");
        assert_eq!(u.to_url(), "http://127.0.0.1:8000/sse?x=1");
    }

    /// Regressions (fuzz target `headers`): a port that is not decimal digits fitting in 16 bits
    /// is refused instead of being kept in the host and followed by the default port; a host
    /// beyond ASCII, which no `Origin` header could match, is refused.
    #[test]
    fn ports_are_numbers_and_hosts_ascii() {
        for bad in [
            "https://+:FFFFFFFF",
            "http://h:+80",
            "http://h:65536",
            "http://h:/",
            "http://[::1]:x",
            "https://b\u{fc}cher.example",
        ] {
            assert!(HttpUrl::parse(bad).is_err(), "{bad}");
            assert!(parse_origin(bad).is_err(), "{bad}");
        }
        assert!(
            parse_origin("https://h#x").is_err(),
            "a fragment is not part of an origin"
        );
        assert_eq!(parse_origin("https://H:443").unwrap(), "https://h:443");
        assert_eq!(parse_origin("http://[::1]").unwrap(), "http://[::1]:80");
        assert_eq!(
            parse_origin("http://[::1]:8080").unwrap(),
            "http://[::1]:8080"
        );
        let n = parse_origin("https://example.com").unwrap();
        assert_eq!(parse_origin(&n).unwrap(), n);
    }

    /// `auth.mode = "jwt"` refuses a config it cannot verify tokens with, naming the key.
    #[test]
    fn jwt_mode_checks_its_keys() {
        let dir = std::env::temp_dir().join(format!("mcp-auth-check-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let jwks = dir.join("jwks.json");
        std::fs::write(
            &jwks,
            br#"{"keys":[{"kty":"OKP","crv":"Ed25519","x":"11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo"}]}"#,
        )
        .unwrap();
        let ok = AuthConfig {
            mode: AuthMode::Jwt,
            jwks_file: Some(jwks.clone()),
            issuer: "https://issuer".into(),
            audience: vec!["api".into()],
            ..AuthConfig::default()
        };
        assert_eq!(ok.check(), Ok(()));
        let key = |c: AuthConfig| c.check().unwrap_err().0;
        assert_eq!(
            key(AuthConfig {
                jwks_file: None,
                ..ok.clone()
            }),
            "auth.jwks_file"
        );
        assert_eq!(
            key(AuthConfig {
                jwks_file: Some(dir.join("missing")),
                ..ok.clone()
            }),
            "auth.jwks_file"
        );
        assert_eq!(
            key(AuthConfig {
                issuer: " ".into(),
                ..ok.clone()
            }),
            "auth.issuer"
        );
        assert_eq!(
            key(AuthConfig {
                audience: vec![],
                ..ok.clone()
            }),
            "auth.audience"
        );
        for bad in ["HS256", "none", "rs256"] {
            let c = AuthConfig {
                algorithms: vec![bad.into()],
                ..ok.clone()
            };
            assert_eq!(key(c), "auth.algorithms", "{bad}");
        }
        let c = AuthConfig {
            resource_metadata_url: "/relative".into(),
            ..ok.clone()
        };
        assert_eq!(key(c), "auth.resource_metadata_url");
        // Opaque mode asks nothing of the jwt keys.
        assert_eq!(AuthConfig::default().check(), Ok(()));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
