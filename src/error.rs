//! The crate's error type. Each variant belongs to one boundary (client, upstream, store,
//! capacity), which picks the HTTP status; callers sort errors with predicates, never by text.

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
    Upstream(String),
    /// The upstream did not answer in time.
    #[error("upstream timeout: {0}")]
    UpstreamTimeout(String),
    /// The upstream session is gone (stream ended, or the POST endpoint answered 404).
    #[error("upstream session lost")]
    UpstreamLost,
    /// The log failed.
    #[error("log: {0}")]
    Store(String),
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
