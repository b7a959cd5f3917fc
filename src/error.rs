//! The crate's error type. Each variant belongs to one boundary (client, upstream, store,
//! capacity), which picks the HTTP status; callers sort errors with predicates, never by text.

use std::sync::Arc;

use crate::log::cursor::Refusal;

/// Result alias.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Every error the proxy reports.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A resume was refused (design.md §4).
    #[error("resume refused: {0:?}")]
    Refused(Refusal),
    /// The session is not held by this proxy, or has ended.
    #[error("unknown session")]
    UnknownSession,
    /// A malformed request from the client.
    #[error("bad request: {0}")]
    BadRequest(String),
    /// The upstream could not be reached or answered badly.
    #[error("upstream: {0}")]
    Upstream(#[from] crate::upstream::UpstreamError),
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

impl Error {
    /// Is this a timeout?
    pub fn is_timeout(&self) -> bool {
        matches!(self, Error::UpstreamTimeout(_))
    }

    /// HTTP status for a client-facing answer.
    pub fn status(&self) -> u16 {
        match self {
            Error::Refused(r) => r.status(),
            Error::UnknownSession => 404,
            Error::BadRequest(_) => 400,
            Error::UpstreamTimeout(_) => 504,
            Error::Upstream(_) | Error::UpstreamLost => 502,
            Error::Store(_) | Error::Capacity(_) => 503,
        }
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
