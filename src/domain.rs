//! Domain vocabulary shared by the log (which persists it), the sessions (which decide it) and the
//! metrics (which count it): which face a session uses and why a session ended.

use serde::{Deserialize, Serialize};

/// Which client face a session or stream uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Facade {
    /// Legacy HTTP+SSE.
    Legacy,
    /// Streamable HTTP.
    Streamable,
    /// Not a face: the log of a 2026-07-28 task (see `modern::tasks`).
    Task,
}

impl Facade {
    /// Both faces, for registering metric label sets up front.
    pub const ALL: [Facade; 2] = [Facade::Legacy, Facade::Streamable];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Facade::Legacy => "legacy",
            Facade::Streamable => "streamable",
            Facade::Task => "task",
        }
    }
}

/// Why a session ended (label of `mcp_resume_sessions_ended_total`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EndReason {
    /// The client sent `DELETE`.
    ClientDelete,
    /// No client attached for `idle_ttl_secs`.
    IdleTimeout,
    /// The upstream stream ended, failed, or answered 404.
    UpstreamLost,
    /// The proxy shut down.
    Shutdown,
    /// Evicted to make room (session limit).
    Evicted,
    /// The log could not be written (e.g. disk full).
    StoreError,
    /// A task's log, its outcome written (never a live session's reason, so not in [`EndReason::ALL`]).
    TaskFinished,
}

impl EndReason {
    /// Every reason, for registering label sets up front.
    pub const ALL: [EndReason; 6] = [
        EndReason::ClientDelete,
        EndReason::IdleTimeout,
        EndReason::UpstreamLost,
        EndReason::Shutdown,
        EndReason::Evicted,
        EndReason::StoreError,
    ];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            EndReason::ClientDelete => "client_delete",
            EndReason::IdleTimeout => "idle_timeout",
            EndReason::UpstreamLost => "upstream_lost",
            EndReason::Shutdown => "shutdown",
            EndReason::Evicted => "evicted",
            EndReason::StoreError => "store_error",
            EndReason::TaskFinished => "task_finished",
        }
    }
}
