//! The crate's error type. Each variant belongs to one boundary ([`Source`]), which picks the HTTP
//! status and the log level; callers sort errors with predicates, never by message text.

use crate::log::cursor::Refusal;

/// Result alias.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Who is at fault.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// The client sent something we cannot serve (4xx).
    Client,
    /// The upstream server failed (502/504).
    Upstream,
    /// The log could not be read or written (503).
    Store,
    /// A bug or resource exhaustion in the proxy (500/503).
    Internal,
}

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
    /// The boundary at fault.
    pub fn source_kind(&self) -> Source {
        match self {
            Error::Refused(_) | Error::UnknownSession | Error::BadRequest(_) => Source::Client,
            Error::Upstream(_) | Error::UpstreamTimeout(_) | Error::UpstreamLost => {
                Source::Upstream
            }
            Error::Store(_) => Source::Store,
            Error::Capacity(_) => Source::Internal,
        }
    }

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
