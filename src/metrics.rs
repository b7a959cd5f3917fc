//! The fixed metric families of design.md §7, registered once on an explicit [`Registry`].
//!
//! Label sets are resolved here, up front, into cheap handles so the data path only increments
//! counters and observes histograms (no label lookups per event).

use prometheus::{
    Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts,
    Registry,
};

pub use crate::domain::{EndReason, Facade};
use crate::log::cursor::Refusal;

/// Kinds of upstream error (label of `mcp_resume_upstream_errors_total`).
pub const UPSTREAM_ERROR_KINDS: [&str; 10] = [
    "connect",
    "status",
    "stream_error",
    "stream_eof",
    "post_failed",
    "post_timeout",
    "oversized_event",
    "bad_event",
    "endpoint_rejected",
    "request_timeout",
];

/// Reasons a message could not be delivered (label of `mcp_resume_dropped_total`).
pub const DROPPED_REASONS: [&str; 6] = [
    "oversized_event",
    "bad_event",
    "late_response",
    "non_message_event",
    "reader_trimmed",
    "slow_reader",
];

/// `mcp_resume_tasks_total` label values.
pub const TASK_STATUSES: [&str; 5] = ["created", "completed", "failed", "cancelled", "expired"];

/// Outcomes of `mcp_resume_forwards_total`: forwarded and answered, the owner unreachable, no
/// answer in time (never retried), a forward this replica refused (its proof did not hold).
pub const FORWARD_OUTCOMES: [&str; 4] = ["ok", "error", "timeout", "refused"];

/// What a round trip to Redis did (`log.backend = "redis"`): a writer turn's appends (one
/// transaction on a single Redis), a read of a record and its events, any other fenced write
/// (create, in-flight, end, takeover), a lease's renewal or claim.
pub const REDIS_OPS: [&str; 4] = ["append", "read", "write", "lease"];

/// Reasons of `mcp_resume_requests_rejected_total`.
pub const REJECT_REASONS: [&str; 6] = [
    "origin_not_allowed",
    "host_not_allowed",
    "identity_required",
    "unsupported_media_type",
    "token_required",
    "invalid_token",
];

/// All metric handles. Cloning is cheap (handles are reference counted).
#[derive(Clone)]
pub struct Metrics {
    /// The registry `/metrics` renders.
    pub registry: Registry,
    refusals: IntCounterVec,
    resumes: IntCounterVec,
    /// `mcp_resume_replayed_events_total`.
    pub replayed: IntCounter,
    /// `mcp_resume_events_logged_total`.
    pub logged: IntCounter,
    /// `mcp_resume_events_delivered_total`.
    pub delivered: IntCounter,
    /// `mcp_resume_log_append_seconds`: upstream receipt → durable.
    pub append_seconds: Histogram,
    /// `mcp_resume_log_bytes`: payload bytes retained in the log.
    pub log_bytes: IntGauge,
    /// `mcp_resume_log_max_bytes`: the configured bound (for "near full" alerts).
    pub log_max_bytes: IntGauge,
    /// `mcp_resume_log_disk_bytes`: bytes of the log's segment files.
    pub log_disk_bytes: IntGauge,
    /// `mcp_resume_store_errors_total`: writes, syncs or file operations of the log that failed.
    pub store_errors: IntCounter,
    /// `mcp_resume_store_damage_total`: records of the log found damaged (a checksum that fails
    /// inside what was synced); the sessions they belong to are sealed before them.
    pub store_damage: IntCounter,
    /// `mcp_resume_fenced_total`: writes to the shared log (Redis) refused because this replica
    /// no longer owns the session at its epoch, or its record was lost or rewound; the session
    /// ends on this replica (§13).
    pub fenced: IntCounter,
    /// `mcp_resume_takeovers_total`: sessions this replica took over from a replica whose lease
    /// lapsed (their requests in flight answered -32091, their ends written).
    pub takeovers: IntCounter,
    /// Round trips to Redis by `op` ([`REDIS_OPS`]).
    pub redis_seconds: HistogramVec,
    /// 1 while the doorbell's pub/sub connection to Redis is up (0 on the local backend).
    pub redis_doorbell_up: IntGauge,
    /// `mcp_resume_sessions_active`.
    pub sessions_active: IntGauge,
    sessions_started: IntCounterVec,
    sessions_ended: IntCounterVec,
    /// `mcp_resume_inflight_aborted_total`.
    pub inflight_aborted: IntCounter,
    upstream_errors: IntCounterVec,
    client_streams: IntGaugeVec,
    /// `mcp_resume_requests_rejected_total{reason}`: requests refused before any session was
    /// looked at (a browser's foreign `Origin`, a foreign `Host`, no identity where one is required,
    /// a legacy message that is not JSON).
    requests_rejected: IntCounterVec,
    /// `mcp_resume_forwards_total{outcome}`: requests for sessions live on another replica,
    /// forwarded to it (or refused as forwards here).
    forwards: IntCounterVec,
    /// `mcp_resume_auth_rejected_total{facade}`: requests refused because they named a session of
    /// another identity or another face (answered like an unknown session).
    auth_rejected: IntCounterVec,
    /// `mcp_resume_dropped_total{reason}`: client input or upstream output that could not be delivered.
    dropped: IntCounterVec,
    /// `mcp_resume_tasks_total{status}`: 2026-07-28 tasks created and how they ended.
    pub tasks: IntCounterVec,
    /// `mcp_resume_upstream_pool_sessions`: upstream sessions the 2026-07-28 face holds open.
    pub pool_sessions: IntGauge,
}

impl Metrics {
    /// Creates and registers every family on a fresh registry.
    pub fn new() -> Self {
        let registry = Registry::new();
        let m = Self {
            refusals: IntCounterVec::new(
                Opts::new(
                    "mcp_resume_refusals_total",
                    "Resumes refused because contiguity could not be proven, by reason.",
                ),
                &["reason"],
            )
            .unwrap(),
            resumes: IntCounterVec::new(
                Opts::new(
                    "mcp_resume_resumes_total",
                    "Resumes served (cursor valid and contiguous), by face.",
                ),
                &["facade"],
            )
            .unwrap(),
            replayed: IntCounter::new(
                "mcp_resume_replayed_events_total",
                "Events delivered from the log to resuming clients.",
            )
            .unwrap(),
            logged: IntCounter::new(
                "mcp_resume_events_logged_total",
                "Events appended to the log.",
            )
            .unwrap(),
            delivered: IntCounter::new(
                "mcp_resume_events_delivered_total",
                "Logged events written to client streams (live and replayed).",
            )
            .unwrap(),
            append_seconds: Histogram::with_opts(
                HistogramOpts::new(
                    "mcp_resume_log_append_seconds",
                    "Time from upstream receipt of an event to it being durable in the log.",
                )
                .buckets(vec![
                    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                    0.5, 1.0,
                ]),
            )
            .unwrap(),
            log_bytes: IntGauge::new(
                "mcp_resume_log_bytes",
                "Bytes of live log records (events with their framing, metadata), all sessions; bounded by log.max_total_bytes.",
            )
            .unwrap(),
            log_max_bytes: IntGauge::new(
                "mcp_resume_log_max_bytes",
                "Configured bound on live log records (log.max_total_bytes).",
            )
            .unwrap(),
            log_disk_bytes: IntGauge::new(
                "mcp_resume_log_disk_bytes",
                "Bytes of the log's segment files on disk (live records, dead ones not yet compacted, headers).",
            )
            .unwrap(),
            store_errors: IntCounter::new(
                "mcp_resume_store_errors_total",
                "Failed writes, syncs or file operations of the log (each also logged at error level).",
            )
            .unwrap(),
            store_damage: IntCounter::new(
                "mcp_resume_store_damage_total",
                "Damaged log records (checksum failures inside synced data); their sessions are sealed before them (each also logged at error level).",
            )
            .unwrap(),
            fenced: IntCounter::new(
                "mcp_resume_fenced_total",
                "Writes to the shared log refused by its fence (another owner or epoch, or the record lost or rewound); each ends its session on this replica.",
            )
            .unwrap(),
            takeovers: IntCounter::new(
                "mcp_resume_takeovers_total",
                "Sessions taken over from a replica whose lease lapsed (their in-flight requests answered -32091, their ends written).",
            )
            .unwrap(),
            redis_seconds: HistogramVec::new(
                HistogramOpts::new(
                    "mcp_resume_redis_seconds",
                    "Round trips to Redis (log.backend = \"redis\"), by op: a writer turn's appends, reads, other fenced writes, leases.",
                )
                .buckets(vec![
                    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                    0.5, 1.0, 2.5,
                ]),
                &["op"],
            )
            .unwrap(),
            redis_doorbell_up: IntGauge::new(
                "mcp_resume_redis_doorbell_up",
                "1 while the doorbell's pub/sub connection to Redis is up (mirrors follow their owners by it; while it is down they poll every 100 ms); 0 on the local backend.",
            )
            .unwrap(),
            sessions_active: IntGauge::new(
                "mcp_resume_sessions_active",
                "Live sessions (upstream link open).",
            )
            .unwrap(),
            sessions_started: IntCounterVec::new(
                Opts::new(
                    "mcp_resume_sessions_started_total",
                    "Sessions started, by face.",
                ),
                &["facade"],
            )
            .unwrap(),
            sessions_ended: IntCounterVec::new(
                Opts::new(
                    "mcp_resume_sessions_ended_total",
                    "Sessions ended, by reason.",
                ),
                &["reason"],
            )
            .unwrap(),
            inflight_aborted: IntCounter::new(
                "mcp_resume_inflight_aborted_total",
                "In-flight requests answered with a -32091 error because their session ended.",
            )
            .unwrap(),
            upstream_errors: IntCounterVec::new(
                Opts::new(
                    "mcp_resume_upstream_errors_total",
                    "Upstream errors, by kind.",
                ),
                &["kind"],
            )
            .unwrap(),
            client_streams: IntGaugeVec::new(
                Opts::new(
                    "mcp_resume_client_streams_active",
                    "Client SSE streams currently open, by face.",
                ),
                &["facade"],
            )
            .unwrap(),
            requests_rejected: IntCounterVec::new(
                Opts::new(
                    "mcp_resume_requests_rejected_total",
                    "Requests refused before any session was looked at, by reason (origin_not_allowed, host_not_allowed, identity_required, unsupported_media_type).",
                ),
                &["reason"],
            )
            .unwrap(),
            forwards: IntCounterVec::new(
                Opts::new(
                    "mcp_resume_forwards_total",
                    "Requests forwarded to the replica that owns their session, by outcome (ok, error, timeout), and forwards refused here (refused).",
                ),
                &["outcome"],
            )
            .unwrap(),
            auth_rejected: IntCounterVec::new(
                Opts::new(
                    "mcp_resume_auth_rejected_total",
                    "Requests that named a session bound to another identity or opened on the other face; answered like an unknown session, by face.",
                ),
                &["facade"],
            )
            .unwrap(),
            dropped: IntCounterVec::new(
                Opts::new(
                    "mcp_resume_dropped_total",
                    "Messages that could not be delivered (each also logged), by reason.",
                ),
                &["reason"],
            )
            .unwrap(),
            registry,
            tasks: IntCounterVec::new(
                Opts::new(
                    "mcp_resume_tasks_total",
                    "2026-07-28 tasks, by status: created, then completed, failed, cancelled or expired.",
                ),
                &["status"],
            )
            .unwrap(),
            pool_sessions: IntGauge::new(
                "mcp_resume_upstream_pool_sessions",
                "Upstream sessions the 2026-07-28 face holds open in its pool.",
            )
            .unwrap(),
        };
        let r = &m.registry;
        r.register(Box::new(m.refusals.clone())).unwrap();
        r.register(Box::new(m.resumes.clone())).unwrap();
        r.register(Box::new(m.replayed.clone())).unwrap();
        r.register(Box::new(m.logged.clone())).unwrap();
        r.register(Box::new(m.delivered.clone())).unwrap();
        r.register(Box::new(m.append_seconds.clone())).unwrap();
        r.register(Box::new(m.log_bytes.clone())).unwrap();
        r.register(Box::new(m.log_max_bytes.clone())).unwrap();
        r.register(Box::new(m.log_disk_bytes.clone())).unwrap();
        r.register(Box::new(m.store_errors.clone())).unwrap();
        r.register(Box::new(m.store_damage.clone())).unwrap();
        r.register(Box::new(m.fenced.clone())).unwrap();
        r.register(Box::new(m.takeovers.clone())).unwrap();
        r.register(Box::new(m.redis_seconds.clone())).unwrap();
        for op in REDIS_OPS {
            m.redis_seconds.with_label_values(&[op]);
        }
        r.register(Box::new(m.redis_doorbell_up.clone())).unwrap();
        r.register(Box::new(m.sessions_active.clone())).unwrap();
        r.register(Box::new(m.sessions_started.clone())).unwrap();
        r.register(Box::new(m.sessions_ended.clone())).unwrap();
        r.register(Box::new(m.inflight_aborted.clone())).unwrap();
        r.register(Box::new(m.upstream_errors.clone())).unwrap();
        r.register(Box::new(m.client_streams.clone())).unwrap();
        r.register(Box::new(m.dropped.clone())).unwrap();
        r.register(Box::new(m.auth_rejected.clone())).unwrap();
        r.register(Box::new(m.requests_rejected.clone())).unwrap();
        for reason in REJECT_REASONS {
            m.requests_rejected.with_label_values(&[reason]);
        }
        r.register(Box::new(m.forwards.clone())).unwrap();
        for outcome in FORWARD_OUTCOMES {
            m.forwards.with_label_values(&[outcome]);
        }
        r.register(Box::new(m.tasks.clone())).unwrap();
        r.register(Box::new(m.pool_sessions.clone())).unwrap();
        for s in TASK_STATUSES {
            m.tasks.with_label_values(&[s]);
        }
        // Materialise every label set so dashboards see zeros rather than gaps.
        for reason in Refusal::ALL {
            m.refusals.with_label_values(&[reason.as_str()]);
        }
        for f in Facade::ALL {
            m.resumes.with_label_values(&[f.as_str()]);
            m.sessions_started.with_label_values(&[f.as_str()]);
            m.client_streams.with_label_values(&[f.as_str()]);
            m.auth_rejected.with_label_values(&[f.as_str()]);
        }
        for reason in EndReason::ALL {
            m.sessions_ended.with_label_values(&[reason.as_str()]);
        }
        for kind in UPSTREAM_ERROR_KINDS {
            m.upstream_errors.with_label_values(&[kind]);
        }
        for reason in DROPPED_REASONS {
            m.dropped.with_label_values(&[reason]);
        }
        m
    }

    /// Counts one refusal.
    pub fn refusal(&self, reason: Refusal) {
        self.refusals.with_label_values(&[reason.as_str()]).inc();
    }

    /// Counts one served resume.
    pub fn resume(&self, facade: Facade) {
        self.resumes.with_label_values(&[facade.as_str()]).inc();
    }

    /// Counts one started session.
    pub fn session_started(&self, facade: Facade) {
        self.sessions_started
            .with_label_values(&[facade.as_str()])
            .inc();
    }

    /// Counts one ended session.
    pub fn session_ended(&self, reason: EndReason) {
        self.sessions_ended
            .with_label_values(&[reason.as_str()])
            .inc();
    }

    /// Counts one upstream error of `kind` (one of [`UPSTREAM_ERROR_KINDS`]).
    pub fn upstream_error(&self, kind: &'static str) {
        self.upstream_errors.with_label_values(&[kind]).inc();
    }

    /// Counts one request refused before any session was looked at (`reason`: one of
    /// [`REJECT_REASONS`]).
    pub fn request_rejected(&self, reason: &'static str) {
        self.requests_rejected.with_label_values(&[reason]).inc();
    }

    /// Counts one forward (`outcome`: one of [`FORWARD_OUTCOMES`]).
    pub fn forward(&self, outcome: &'static str) {
        self.forwards.with_label_values(&[outcome]).inc();
    }

    /// Counts one request refused for naming a session it may not use.
    pub fn auth_rejected(&self, facade: Facade) {
        self.auth_rejected
            .with_label_values(&[facade.as_str()])
            .inc();
    }

    /// Counts one undeliverable message (`reason`: one of [`DROPPED_REASONS`]).
    pub fn dropped(&self, reason: &'static str) {
        self.dropped.with_label_values(&[reason]).inc();
    }

    /// The counter of undeliverable messages for `reason` (resolve once, count often).
    pub fn dropped_counter(&self, reason: &'static str) -> prometheus::IntCounter {
        self.dropped.with_label_values(&[reason])
    }

    /// The gauge of open client streams for `facade` (resolve once per stream).
    pub fn client_streams(&self, facade: Facade) -> IntGauge {
        self.client_streams.with_label_values(&[facade.as_str()])
    }

    /// Renders the classic text exposition format.
    pub fn render(&self) -> String {
        use prometheus::Encoder;
        let mut buf = Vec::new();
        prometheus::TextEncoder::new()
            .encode(&self.registry.gather(), &mut buf)
            .expect("text encoding cannot fail");
        String::from_utf8(buf).expect("utf-8")
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_every_fixed_family() {
        let m = Metrics::new();
        m.refusal(Refusal::CursorTrimmed);
        let text = m.render();
        for name in [
            "mcp_resume_refusals_total",
            "mcp_resume_resumes_total",
            "mcp_resume_replayed_events_total",
            "mcp_resume_events_logged_total",
            "mcp_resume_events_delivered_total",
            "mcp_resume_log_append_seconds",
            "mcp_resume_log_bytes",
            "mcp_resume_sessions_active",
            "mcp_resume_sessions_started_total",
            "mcp_resume_sessions_ended_total",
            "mcp_resume_inflight_aborted_total",
            "mcp_resume_upstream_errors_total",
            "mcp_resume_client_streams_active",
            "mcp_resume_store_errors_total",
            "mcp_resume_store_damage_total",
            "mcp_resume_fenced_total",
            "mcp_resume_takeovers_total",
            "mcp_resume_forwards_total",
            "mcp_resume_log_disk_bytes",
            "mcp_resume_auth_rejected_total",
            "mcp_resume_requests_rejected_total",
        ] {
            assert!(text.contains(&format!("# TYPE {name} ")), "{name} missing");
        }
        assert!(text.contains("mcp_resume_refusals_total{reason=\"cursor_trimmed\"} 1"));
        assert!(text.contains("mcp_resume_refusals_total{reason=\"cursor_ahead\"} 0"));
        for kind in UPSTREAM_ERROR_KINDS {
            let series = format!("mcp_resume_upstream_errors_total{{kind=\"{kind}\"}} 0");
            assert!(text.contains(&series), "{series}");
        }
        for reason in DROPPED_REASONS {
            let series = format!("mcp_resume_dropped_total{{reason=\"{reason}\"}} 0");
            assert!(text.contains(&series), "{series}");
        }
    }
}
