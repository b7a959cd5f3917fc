//! [2] The client faces: legacy HTTP+SSE ([`legacy`]) and Streamable HTTP ([`streamable`]), and the
//! response helpers they share (JSON-RPC error bodies, the §4 refusal body).

pub mod legacy;
pub mod streamable;

use std::sync::Arc;

use bytes::Bytes;
use http::{header, HeaderValue, Response, StatusCode};
use http_body_util::{BodyExt, Either, Full, Limited};
use hyper::body::Incoming;

use crate::config::Config;
use crate::error::{Error, Result};
use crate::jsonrpc;
use crate::log::cursor::{Cursor, Refusal, SessionId};
use crate::log::{Log, SessionLog};
use crate::metrics::Metrics;
use crate::session::Registry;
use crate::stream::{SseBody, StreamEnv};

/// What every handler needs.
pub struct Ctx {
    /// The configuration.
    pub cfg: Arc<Config>,
    /// Sessions.
    pub reg: Arc<Registry>,
    /// Client stream environment.
    pub env: StreamEnv,
}

/// Largest client message body accepted, in bytes.
pub const MAX_BODY: usize = 4 * 1024 * 1024;

/// A response body: a small fixed body or a client SSE stream.
pub type ProxyBody = Either<Full<Bytes>, SseBody>;
/// A response.
pub type Resp = Response<ProxyBody>;

/// A plain response with a fixed body.
pub fn plain(status: u16, content_type: &str, body: impl Into<Bytes>) -> Resp {
    let mut r = Response::new(Either::Left(Full::new(body.into())));
    *r.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    if let Ok(v) = HeaderValue::from_str(content_type) {
        r.headers_mut().insert(header::CONTENT_TYPE, v);
    }
    r
}

/// A JSON-RPC error response body with HTTP `status`.
pub fn json_error(
    status: u16,
    id: Option<&str>,
    code: i64,
    message: &str,
    data: serde_json::Value,
) -> Resp {
    plain(
        status,
        "application/json",
        jsonrpc::error_response(id.unwrap_or("null"), code, message, data),
    )
}

/// The client-facing answer for an [`Error`] (never a refusal; see [`refusal`]).
pub fn error_response(e: &Error, id: Option<&str>) -> Resp {
    let (code, reason) = match e {
        Error::UnknownSession => (-32001, "unknown_session"),
        Error::BadRequest(_) => (-32600, "bad_request"),
        Error::UpstreamTimeout(_) => (-32603, "upstream_timeout"),
        Error::UpstreamLost => (-32001, "upstream_lost"),
        Error::Upstream(_) => (-32603, "upstream_error"),
        Error::Store(_) => (-32603, "store_error"),
        Error::Capacity(_) => (-32603, "capacity"),
        Error::Refused(_) => (jsonrpc::RESUME_GAP, "resume_gap"),
    };
    let status = if matches!(e, Error::UpstreamLost) {
        404
    } else {
        e.status()
    };
    json_error(
        status,
        id,
        code,
        &e.to_string(),
        serde_json::json!({"reason": reason}),
    )
}

/// The §4 refusal: status, JSON-RPC error body, counter and one structured log line.
pub fn refusal(
    metrics: &Metrics,
    reason: Refusal,
    last_event_id: &str,
    session: Option<SessionId>,
    log: Option<(&Log, &SessionLog)>,
) -> Resp {
    metrics.refusal(reason);
    let ranges = log.map(|(_, l)| l.ranges());
    let head_id = ranges.as_ref().map(|r| {
        let id = log.expect("with ranges").1.id;
        Cursor {
            session: id,
            epoch: r.epoch_of(r.head.max(1)),
            seq: r.head,
        }
        .to_string()
    });
    let oldest_id = ranges.as_ref().filter(|r| r.oldest <= r.head).map(|r| {
        let id = log.expect("with ranges").1.id;
        Cursor {
            session: id,
            epoch: r.epoch_of(r.oldest),
            seq: r.oldest,
        }
        .to_string()
    });
    let message = match (reason, &head_id) {
        (Refusal::MalformedCursor, _) => {
            format!("resume_gap: Last-Event-ID {last_event_id:?} is not a cursor of this proxy")
        }
        (Refusal::UnknownSession, _) => {
            format!("resume_gap: session of cursor {last_event_id} is unknown to this proxy")
        }
        (Refusal::ForeignSession, _) => {
            format!("resume_gap: cursor {last_event_id} belongs to another session")
        }
        (_, Some(h)) => {
            format!("resume_gap: cursor {last_event_id} is not contiguous with log head {h}")
        }
        (_, None) => format!("resume_gap: cursor {last_event_id} is not contiguous with the log"),
    };
    tracing::warn!(
        reason = reason.as_str(),
        session = ?session.map(|s| s.to_string()),
        last_event_id,
        log_head = ?head_id,
        oldest_retained = ?oldest_id,
        "resume refused"
    );
    json_error(
        reason.status(),
        None,
        jsonrpc::RESUME_GAP,
        &message,
        serde_json::json!({
            "reason": reason.as_str(),
            "session_id": session.map(|s| s.to_string()),
            "last_event_id": last_event_id,
            "log_head": head_id,
            "oldest_retained": oldest_id,
        }),
    )
}

/// An SSE response around `body`.
pub fn sse_response(body: SseBody, session_header: Option<&SessionId>) -> Resp {
    let mut r = Response::new(Either::Right(body));
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    h.insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("no-cache, no-transform"),
    );
    h.insert("x-accel-buffering", HeaderValue::from_static("no"));
    if let Some(id) = session_header {
        if let Ok(v) = HeaderValue::from_str(&id.to_string()) {
            h.insert("mcp-session-id", v);
        }
    }
    r
}

/// Reads a request body up to [`MAX_BODY`].
///
/// # Errors
/// [`Error::BadRequest`] when it is larger or the connection fails.
pub async fn read_body(body: Incoming) -> Result<Bytes> {
    Limited::new(body, MAX_BODY)
        .collect()
        .await
        .map(|b| b.to_bytes())
        .map_err(|e| Error::BadRequest(format!("request body: {e}")))
}

/// The value of a query parameter.
pub fn query_param<'a>(query: Option<&'a str>, name: &str) -> Option<&'a str> {
    query?
        .split('&')
        .filter_map(|kv| kv.split_once('=').or(Some((kv, ""))))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
}
