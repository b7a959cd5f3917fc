//! The crate's error type. Each variant belongs to one boundary (client, upstream, store,
//! capacity), which picks its row of the answer table ([`crate::jsonrpc::Answer`]: HTTP status,
//! JSON-RPC code, reason); callers sort errors with predicates, never by text.

use std::sync::Arc;

pub use crate::jsonrpc::Answer;
use crate::log::cursor::Refusal;
pub use crate::upstream::UpstreamError;

/// Result alias.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Every error the proxy reports. Each has one client-facing answer (HTTP status, JSON-RPC
/// code, `error.data.reason`): its row of the one table of all faces, [`Error::answer`].
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
    /// Not a request the proxy can take, with its row of the answer table (a `-32600` one).
    #[error("Invalid Request: {message}")]
    Invalid {
        /// Its answer.
        answer: Answer,
        /// What is wrong.
        message: String,
    },
    /// A body nested deeper than [`crate::jsonrpc::MAX_DEPTH`], refused before any parse (every
    /// face).
    #[error(
        "Invalid Request: JSON nested deeper than {} levels",
        crate::jsonrpc::MAX_DEPTH
    )]
    TooDeep,
    /// Parameters the proxy needs are missing or wrong, with its row of the answer table (a
    /// `-32602` one).
    #[error("Invalid params: {message}")]
    InvalidParams {
        /// Its answer.
        answer: Answer,
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

impl Error {
    /// Is this a timeout?
    pub fn is_timeout(&self) -> bool {
        matches!(self, Error::UpstreamTimeout(_))
    }

    /// How it is told to a client: its row of the one answer table ([`Answer`]).
    pub fn answer(&self) -> Answer {
        match self {
            Error::Refused(r) => Answer::Resume(*r),
            Error::UnknownSession => Answer::UnknownSession,
            Error::BadRequest(_) => Answer::BadRequest,
            Error::Parse => Answer::Parse,
            Error::TooDeep => Answer::InvalidRequest,
            Error::Invalid { answer, .. } | Error::InvalidParams { answer, .. } => *answer,
            Error::MissingSessionId => Answer::MissingSessionId,
            Error::UnsupportedVersion(_) => Answer::UnsupportedVersionHeader,
            Error::NotAcceptable(_) => Answer::NotAcceptable,
            Error::UnsupportedMediaType => Answer::UnsupportedMediaType,
            Error::OriginNotAllowed => Answer::OriginNotAllowed,
            Error::HostNotAllowed => Answer::HostNotAllowed,
            Error::IdentityRequired => Answer::IdentityRequired,
            Error::InvalidToken => Answer::InvalidToken,
            Error::StreamActive => Answer::StreamActive,
            Error::MethodNotAllowed(_) => Answer::MethodNotAllowed,
            Error::Upstream(_) => Answer::UpstreamError,
            Error::UpstreamTimeout(_) => Answer::UpstreamTimeout,
            Error::UpstreamLost => Answer::UpstreamLost,
            Error::Store(_) => Answer::StoreError,
            Error::Capacity(_) => Answer::Capacity,
        }
    }

    /// HTTP status for a client-facing answer.
    pub fn status(&self) -> u16 {
        self.answer().status().as_u16()
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
