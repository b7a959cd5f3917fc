//! The crate's error type. Each variant belongs to one boundary (client, upstream, store,
//! capacity), which picks the HTTP status; callers sort errors with predicates, never by text.

use std::sync::Arc;

use crate::log::cursor::Refusal;
pub use crate::upstream::UpstreamError;

/// Result alias.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Every error the proxy reports. Each has one client-facing answer (HTTP status, JSON-RPC
/// code, `error.data.reason`), in one table: [`Error::answer`].
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A resume was refused (design.md §4).
    #[error("resume refused: {}", .0.as_str())]
    Refused(Refusal),
    /// The session is not held by this proxy, has ended, or belongs to another caller or face.
    #[error("unknown session")]
    UnknownSession,
    /// A malformed request from the client.
    #[error("Bad Request: {0}")]
    BadRequest(String),
    /// The body is not JSON.
    #[error("Parse error: body is not a JSON-RPC message")]
    Parse,
    /// Not a request the proxy can take, with the reason's label.
    #[error("Invalid Request: {message}")]
    Invalid {
        /// `error.data.reason`.
        reason: &'static str,
        /// What is wrong.
        message: String,
    },
    /// Parameters the proxy needs are missing or wrong.
    #[error("Invalid params: {message}")]
    InvalidParams {
        /// `error.data.reason`.
        reason: &'static str,
        /// What is wrong.
        message: String,
    },
    /// `Mcp-Session-Id` is required.
    #[error("Bad Request: Mcp-Session-Id header is required")]
    MissingSessionId,
    /// `MCP-Protocol-Version` names a version not served.
    #[error("Bad Request: unsupported MCP-Protocol-Version {0:?}")]
    UnsupportedVersion(String),
    /// `Accept` does not list what the answer needs.
    #[error("Not Acceptable: Accept must list {0}")]
    NotAcceptable(&'static str),
    /// `Content-Type` is not `application/json`.
    #[error("Unsupported Media Type: Content-Type must be application/json")]
    UnsupportedMediaType,
    /// A browser's `Origin` is not allowed.
    #[error("Forbidden: Origin not allowed")]
    OriginNotAllowed,
    /// The `Host` is not allowed.
    #[error("Forbidden: Host not allowed")]
    HostNotAllowed,
    /// `auth.require_identity` and the request carries none.
    #[error("Unauthorized: this proxy requires an identity (auth.identity_headers or a client certificate)")]
    IdentityRequired,
    /// `auth.mode = "jwt"` and the request's bearer token is missing, or not one we accept.
    #[error("Unauthorized: this proxy requires a valid bearer token (OAuth 2.1)")]
    InvalidToken,
    /// The standalone stream of a bearer session already has a connection.
    #[error("Conflict: Only one SSE stream is allowed per session (resume with Last-Event-ID to take it over)")]
    StreamActive,
    /// The method is not served on this path; the value is the `Allow` header.
    #[error("Method Not Allowed")]
    MethodNotAllowed(&'static str),
    /// The upstream could not be reached or answered badly.
    #[error("upstream: {0}")]
    Upstream(#[source] UpstreamError),
    /// The upstream did not answer in time.
    #[error("upstream timeout: {0}")]
    UpstreamTimeout(String),
    /// The upstream session is gone (stream ended, or the POST endpoint answered 404).
    #[error("upstream session lost")]
    UpstreamLost,
    /// The log failed.
    #[error("log: {0}")]
    Store(#[from] StoreError),
    /// No room for another session (limits reached).
    #[error("at capacity: {0}")]
    Capacity(String),
}

impl From<UpstreamError> for Error {
    /// The upstream link's failures, sorted: a timeout and a lost session have answers of
    /// their own.
    fn from(e: UpstreamError) -> Self {
        match e {
            UpstreamError::Timeout(what) => Error::UpstreamTimeout(what),
            UpstreamError::Lost => Error::UpstreamLost,
            e => Error::Upstream(e),
        }
    }
}

/// How an [`Error`] is told to a client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Answer {
    /// HTTP status.
    pub status: u16,
    /// JSON-RPC error code.
    pub code: i64,
    /// `error.data.reason`.
    pub reason: &'static str,
}

impl Error {
    /// Is this a timeout?
    pub fn is_timeout(&self) -> bool {
        matches!(self, Error::UpstreamTimeout(_))
    }

    /// The one table of client-facing answers.
    pub fn answer(&self) -> Answer {
        let (status, code, reason) = match self {
            Error::Refused(r) => (r.status(), crate::jsonrpc::RESUME_GAP, r.as_str()),
            Error::UnknownSession => (404, crate::jsonrpc::SESSION_ERROR, "unknown_session"),
            Error::BadRequest(_) => (400, crate::jsonrpc::INVALID_REQUEST, "bad_request"),
            Error::Parse => (400, crate::jsonrpc::PARSE_ERROR, "parse_error"),
            Error::Invalid { reason, .. } => (400, crate::jsonrpc::INVALID_REQUEST, *reason),
            Error::InvalidParams { reason, .. } => (400, crate::jsonrpc::INVALID_PARAMS, *reason),
            Error::MissingSessionId => (400, crate::jsonrpc::INVALID_REQUEST, "missing_session_id"),
            Error::UnsupportedVersion(_) => (
                400,
                crate::jsonrpc::INVALID_REQUEST,
                "unsupported_protocol_version",
            ),
            Error::NotAcceptable(_) => (406, crate::jsonrpc::INVALID_REQUEST, "not_acceptable"),
            Error::UnsupportedMediaType => (
                415,
                crate::jsonrpc::INVALID_REQUEST,
                "unsupported_media_type",
            ),
            Error::OriginNotAllowed => (403, crate::jsonrpc::SERVER_ERROR, "origin_not_allowed"),
            Error::HostNotAllowed => (403, crate::jsonrpc::SERVER_ERROR, "host_not_allowed"),
            Error::IdentityRequired => (401, crate::jsonrpc::SESSION_ERROR, "identity_required"),
            Error::InvalidToken => (401, crate::jsonrpc::SESSION_ERROR, "invalid_token"),
            Error::StreamActive => (409, crate::jsonrpc::SERVER_ERROR, "stream_active"),
            Error::MethodNotAllowed(_) => {
                (405, crate::jsonrpc::INVALID_REQUEST, "method_not_allowed")
            }
            Error::Upstream(_) => (502, crate::jsonrpc::INTERNAL_ERROR, "upstream_error"),
            Error::UpstreamTimeout(_) => (504, crate::jsonrpc::INTERNAL_ERROR, "upstream_timeout"),
            Error::UpstreamLost => (404, crate::jsonrpc::SESSION_ERROR, "upstream_lost"),
            Error::Store(_) => (503, crate::jsonrpc::INTERNAL_ERROR, "store_error"),
            Error::Capacity(_) => (503, crate::jsonrpc::INTERNAL_ERROR, "capacity"),
        };
        Answer {
            status,
            code,
            reason,
        }
    }

    /// HTTP status for a client-facing answer.
    pub fn status(&self) -> u16 {
        self.answer().status
    }
}

/// An error and its causes, `: `-separated (for log lines; client answers carry only the top).
pub fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut cur = e.source();
    while let Some(s) = cur {
        out.push_str(": ");
        out.push_str(&s.to_string());
        cur = s.source();
    }
    out
}

/// A failure of the log's storage. Cloneable, so one failed write can answer every append it
/// carried.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    /// A file-system call failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The I/O error.
        #[source]
        source: Arc<std::io::Error>,
    },
    /// The data on disk is not what the log wrote.
    #[error("corrupt log: {0}")]
    Corrupt(String),
    /// The data directory holds a log of an earlier, incompatible format.
    #[error("{0} holds a log in the sled format of mcp-resume-proxy 0.1; move it away (or delete it) to start with an empty log")]
    OldFormat(String),
    /// Another process holds the data directory.
    #[error("{0} is locked by another process (is a proxy running on it?)")]
    Locked(String),
    /// The writer has stopped (the log was closed, or storage failed for good).
    #[error("the log writer has stopped")]
    Stopped,
    /// Storage failed and the log takes no writes until it recovers.
    #[error("the log is not taking writes: storage failed")]
    Unavailable,
    /// The session's log already ended; nothing more is appended to it.
    #[error("the session's log has ended")]
    SessionEnded,
    /// The shared log's server (Redis) failed or could not be reached.
    #[error("shared log: {0}")]
    Shared(String),
    /// The shared log's server cannot keep the configured durability (`durability = "fsync"`
    /// needs `appendonly yes` and `appendfsync always`): the setting at fault.
    #[error("log.durability = \"fsync\" is not kept by the shared log's server: {0}")]
    Durability(String),
    /// This replica no longer owns the session on the shared log (another took it over, or the
    /// server lost or rewound its record): it writes nothing more to it.
    #[error("fenced: this replica no longer owns the session on the shared log")]
    Fenced,
}

impl StoreError {
    /// An I/O error while doing `what`.
    pub fn io(what: &'static str, source: std::io::Error) -> Self {
        StoreError::Io {
            what,
            source: Arc::new(source),
        }
    }

    /// The OS error number, for I/O errors.
    pub fn raw_os_error(&self) -> Option<i32> {
        match self {
            StoreError::Io { source, .. } => source.raw_os_error(),
            _ => None,
        }
    }

    /// Out of space (`ENOSPC`, `EDQUOT`): writes may succeed again once space is freed.
    pub fn is_no_space(&self) -> bool {
        const ENOSPC: i32 = 28;
        const EDQUOT: i32 = 122;
        matches!(self.raw_os_error(), Some(ENOSPC | EDQUOT))
    }
}
