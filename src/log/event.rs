//! The vocabulary of the log that its records, its image and its writer share: events, their
//! streams and kinds, a session's meta, the persisted clock. A leaf of `log`.

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use super::cursor::EpochRange;
use crate::domain::{EndReason, Facade};
use crate::identity::Identity;

/// Which client stream an event belongs to (design.md §3).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StreamTag(pub u64);

impl StreamTag {
    /// The single stream of a legacy-face session.
    pub const LEGACY: StreamTag = StreamTag(0);
    /// The standalone `GET` stream of a Streamable HTTP session.
    pub const STANDALONE: StreamTag = StreamTag(1);

    /// The stream of the `n`-th request-carrying POST of a Streamable HTTP session (n from 0).
    pub fn post(n: u64) -> Self {
        StreamTag(n + 2)
    }

    /// A POST stream (ends after its response).
    pub fn is_post(self) -> bool {
        self.0 >= 2
    }
}

/// What a logged event is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    /// A JSON-RPC message, delivered as `event: message`.
    Message = 0,
    /// A Streamable HTTP priming event: delivered with an id and empty data.
    Priming = 1,
    /// A JSON-RPC message that ends its (POST) stream: the response.
    Final = 2,
    /// The session ended: every stream ends here. Not delivered.
    End = 3,
}

impl Kind {
    pub(super) fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            0 => Kind::Message,
            1 => Kind::Priming,
            2 => Kind::Final,
            3 => Kind::End,
            _ => return None,
        })
    }
}

/// One logged event. The window and every reader hold their own copy of it: the payload is one
/// buffer shared by reference count, the rest a few words (no allocation per event; an `Arc`
/// around each was one, docs/benchmarks.md round 9).
#[derive(Clone, Debug)]
pub struct Event {
    /// Seq in the session.
    pub seq: u64,
    /// Epoch it was logged in.
    pub epoch: u32,
    /// Stream it belongs to.
    pub stream: StreamTag,
    /// What it is.
    pub kind: Kind,
    /// Payload bytes (JSON-RPC message; empty for priming; end reason for `End`).
    pub payload: Bytes,
}

/// An event to append.
#[derive(Debug)]
pub struct NewEvent {
    /// Stream it belongs to.
    pub stream: StreamTag,
    /// What it is.
    pub kind: Kind,
    /// Payload bytes.
    pub payload: Bytes,
    /// When the proxy received it (for `mcp_resume_log_append_seconds`).
    pub received: tokio::time::Instant,
    /// The in-flight request (canonical id) this event answers: its in-flight record ends in the
    /// same write.
    pub completes: Option<String>,
}

impl NewEvent {
    /// A new event received now.
    pub fn new(stream: StreamTag, kind: Kind, payload: Bytes) -> Self {
        Self {
            stream,
            kind,
            payload,
            received: tokio::time::Instant::now(),
            completes: None,
        }
    }
}

/// Session state as persisted in meta records.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct SessionMeta {
    /// Face that created the session.
    pub facade: Facade,
    /// `None` while live.
    pub ended: Option<EndReason>,
    /// Unix seconds of creation.
    pub created_unix: u64,
    /// Unix seconds of the end.
    pub ended_unix: Option<u64>,
    /// Epochs with their seq ranges.
    pub epochs: Vec<EpochRange>,
    /// Negotiated protocol version (Streamable face), if known.
    #[serde(default)]
    pub protocol_version: Option<String>,
    /// The keyed identity of the caller that opened it; `None` for a bearer session (opened
    /// without identity: whoever knows its id may use it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identity: Option<Identity>,
}

#[cfg(test)]
thread_local! {
    /// The simulator's clock: persisted timestamps are part of what a seed must reproduce.
    pub(crate) static FIXED_UNIX: std::cell::Cell<Option<u64>> = const { std::cell::Cell::new(None) };
}

/// Seconds since the Unix epoch (persisted timestamps).
pub fn unix_now() -> u64 {
    #[cfg(test)]
    if let Some(t) = FIXED_UNIX.with(|c| c.get()) {
        return t;
    }
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}
