//! The little JSON-RPC the proxy must understand to route messages, and the error bodies it writes.
//!
//! Payloads are never re-serialised on the data path: [`Peek`] reads only the fields routing needs
//! (`id`, `method`, whether it is a response, `progressToken`) and the original bytes travel on.

use std::borrow::Cow;

use serde::de::{DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;

use crate::log::cursor::Refusal;

mod envelope;

#[cfg(test)]
mod adversary18;

/// The deepest nesting of arrays and objects a client message may have ([`too_deep`]).
pub const MAX_DEPTH: usize = 64;

// The JSON-RPC error codes of every face; what each of the proxy's own answers uses, with its HTTP
// status and reason, is the one table below ([`Answer`]).

/// Invalid JSON.
pub const PARSE_ERROR: i64 = -32700;
/// Not a valid JSON-RPC request.
pub const INVALID_REQUEST: i64 = -32600;
/// No such method (or one not available to the request).
pub const METHOD_NOT_FOUND: i64 = -32601;
/// Invalid params.
pub const INVALID_PARAMS: i64 = -32602;
/// Internal error: upstream unavailable, capacity, store errors, cancelled calls.
pub const INTERNAL_ERROR: i64 = -32603;
/// Server error of the sessionful faces' transport (origin, host, a stream already active).
pub const SERVER_ERROR: i64 = -32000;
/// No such session, or not this caller's (unknown, unauthorised, upstream gone).
pub const SESSION_ERROR: i64 = -32001;
/// 2025's "resource not found" (2026-07-28 answers [`INVALID_PARAMS`] with the URI instead).
pub const RESOURCE_NOT_FOUND: i64 = -32002;
/// 2026-07-28 HeaderMismatch: a header disagrees with the body, or is missing.
pub const HEADER_MISMATCH: i64 = -32020;
/// 2026-07-28 MissingRequiredClientCapability (`data.requiredCapabilities`).
pub const MISSING_CAPABILITY: i64 = -32021;
/// 2026-07-28 UnsupportedProtocolVersion (`data.supported`).
pub const UNSUPPORTED_VERSION: i64 = -32022;
/// JSON-RPC error code for a refused resume (design.md §4).
pub const RESUME_GAP: i64 = -32090;
/// JSON-RPC error code for a request aborted because its upstream session ended (I6).
pub const INFLIGHT_ABORTED: i64 = -32091;
/// JSON-RPC error code for an upstream response that was too large or not valid JSON.
pub const UNDELIVERABLE: i64 = -32092;
/// JSON-RPC error code for a request the upstream did not answer within
/// `upstream.request_timeout_secs`.
pub const REQUEST_TIMEOUT: i64 = -32093;
/// JSON-RPC error code for a request its client cancelled (`notifications/cancelled`): the
/// proxy's answer, as the server answers none.
pub const REQUEST_CANCELLED: i64 = -32094;

// === The answer table ===

/// The status of a response nobody reads, its client gone first (nginx's 499): only the access
/// log sees it. Not a row of [`Answer`]: it carries no JSON-RPC message.
pub const CLIENT_GONE: http::StatusCode = match http::StatusCode::from_u16(499) {
    Ok(s) => s,
    Err(_) => panic!("499 is a status"),
};

/// Every error the proxy answers of its own, on any face (legacy HTTP+SSE, sessionful Streamable
/// HTTP, 2026-07-28): the one table of its HTTP status ([`Answer::status`]), JSON-RPC code
/// ([`Answer::code`]) and `error.data.reason` ([`Answer::reason`]).
///
/// The sessionful and legacy faces put the reason in `error.data` ([`crate::error::Error::answer`]
/// picks the row). The 2026-07-28 ladder's refusals (`modern::wire::Refusal`) answer with the
/// reference server's `data` shapes, without a reason; there the reason only names the row. Its
/// errors after the ladder are in-band (HTTP 200) and carry their reason. Answers that are no
/// JSON-RPC message (a plain-text 413, the router's 404) are not rows: they name their
/// [`http::StatusCode`] where they are built.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// A resume refused (design.md §4): 400 for a malformed cursor, 404 for an unknown session,
    /// 409 for the rest; the reason is the refusal's label.
    Resume(Refusal),
    /// No such session, or not this caller's or this face's.
    UnknownSession,
    /// A malformed request (the legacy face's `session_id`).
    BadRequest,
    /// The body is not JSON.
    Parse,
    /// Not a JSON-RPC message the face takes: not one, an empty or too large batch, nested deeper
    /// than [`MAX_DEPTH`].
    InvalidRequest,
    /// `initialize` carrying `Mcp-Session-Id`.
    AlreadyInitialized,
    /// A batch under a protocol version without batches.
    BatchNotSupported,
    /// Params the proxy reads are missing or wrong (refused before the method runs).
    InvalidParams,
    /// `Mcp-Session-Id` is required.
    MissingSessionId,
    /// The sessionful face's `MCP-Protocol-Version` names a version it does not serve.
    UnsupportedVersionHeader,
    /// `Accept` does not list what the answer needs.
    NotAcceptable,
    /// `Content-Type` is not `application/json`.
    UnsupportedMediaType,
    /// A browser's `Origin` is not allowed.
    OriginNotAllowed,
    /// The `Host` is not allowed.
    HostNotAllowed,
    /// `auth.require_identity` and the request carries none.
    IdentityRequired,
    /// The bearer token is missing or not one the proxy accepts.
    InvalidToken,
    /// The standalone stream of a bearer session already has a connection.
    StreamActive,
    /// The method is not served on this path (answered in plain text, with `Allow`).
    MethodNotAllowed,
    /// The upstream could not be reached or answered badly.
    UpstreamError,
    /// The upstream did not answer in time.
    UpstreamTimeout,
    /// The upstream session is gone.
    UpstreamLost,
    /// The log failed.
    StoreError,
    /// No room (limits reached).
    Capacity,
    /// 2026-07-28 HeaderMismatch: a header disagrees with the body, or is missing.
    HeaderMismatch,
    /// 2026-07-28: the `_meta` protocol version is not one served (`data.supported`).
    UnsupportedVersion,
    /// 2026-07-28 `server/discover` with `modern.discover = "resumable"` (the reason is in `data`).
    DiscoverResumable,
    /// 2026-07-28: not one of its methods.
    MethodNotFound,
    /// 2026-07-28: the request needs a client capability it did not declare.
    MissingCapability,
    /// 2026-07-28, in-band: params wrong for the method (`params.name`, `requestState`,
    /// `inputResponses`).
    InBandInvalidParams,
    /// 2026-07-28, in-band: no such task, or not this caller's.
    TaskNotFound,
    /// 2026-07-28, in-band: no upstream session could be had for the request.
    UpstreamUnavailable,
    /// 2026-07-28, in-band: the caller holds all it may (`modern.max_per_identity`), or the pool
    /// is full.
    CallerCapacity,
    /// In-band: the request's upstream session ended before its answer (I6).
    CallLost,
    /// 2026-07-28, in-band: the upstream cancelled the request.
    UpstreamCancelled,
    /// 2026-07-28, in-band: the client cancelled the task.
    TaskCancelled,
    /// In-band: the upstream did not answer within `upstream.request_timeout_secs`.
    RequestTimeout,
    /// 2026-07-28, in-band: the proxy shut down before the answer.
    ShuttingDown,
    /// 2026-07-28, in-band: a listen's reader fell behind its notifications.
    SlowReader,
}

impl Answer {
    /// Its HTTP status.
    pub fn status(self) -> http::StatusCode {
        use http::StatusCode as S;
        match self {
            Answer::Resume(Refusal::MalformedCursor) => S::BAD_REQUEST,
            Answer::Resume(Refusal::UnknownSession) => S::NOT_FOUND,
            Answer::Resume(_) => S::CONFLICT,
            Answer::UnknownSession | Answer::UpstreamLost | Answer::MethodNotFound => S::NOT_FOUND,
            Answer::BadRequest
            | Answer::Parse
            | Answer::InvalidRequest
            | Answer::AlreadyInitialized
            | Answer::BatchNotSupported
            | Answer::InvalidParams
            | Answer::MissingSessionId
            | Answer::UnsupportedVersionHeader
            | Answer::HeaderMismatch
            | Answer::UnsupportedVersion
            | Answer::DiscoverResumable
            | Answer::MissingCapability => S::BAD_REQUEST,
            Answer::NotAcceptable => S::NOT_ACCEPTABLE,
            Answer::UnsupportedMediaType => S::UNSUPPORTED_MEDIA_TYPE,
            Answer::OriginNotAllowed | Answer::HostNotAllowed => S::FORBIDDEN,
            Answer::IdentityRequired | Answer::InvalidToken => S::UNAUTHORIZED,
            Answer::StreamActive => S::CONFLICT,
            Answer::MethodNotAllowed => S::METHOD_NOT_ALLOWED,
            Answer::UpstreamError => S::BAD_GATEWAY,
            Answer::UpstreamTimeout => S::GATEWAY_TIMEOUT,
            Answer::StoreError | Answer::Capacity => S::SERVICE_UNAVAILABLE,
            Answer::InBandInvalidParams
            | Answer::TaskNotFound
            | Answer::UpstreamUnavailable
            | Answer::CallerCapacity
            | Answer::CallLost
            | Answer::UpstreamCancelled
            | Answer::TaskCancelled
            | Answer::RequestTimeout
            | Answer::ShuttingDown
            | Answer::SlowReader => S::OK,
        }
    }

    /// Its JSON-RPC error code.
    pub fn code(self) -> i64 {
        match self {
            Answer::Resume(_) => RESUME_GAP,
            Answer::Parse => PARSE_ERROR,
            Answer::BadRequest
            | Answer::InvalidRequest
            | Answer::AlreadyInitialized
            | Answer::BatchNotSupported
            | Answer::MissingSessionId
            | Answer::UnsupportedVersionHeader
            | Answer::NotAcceptable
            | Answer::UnsupportedMediaType
            | Answer::MethodNotAllowed => INVALID_REQUEST,
            Answer::InvalidParams | Answer::InBandInvalidParams | Answer::TaskNotFound => {
                INVALID_PARAMS
            }
            Answer::MethodNotFound => METHOD_NOT_FOUND,
            Answer::OriginNotAllowed | Answer::HostNotAllowed | Answer::StreamActive => {
                SERVER_ERROR
            }
            Answer::UnknownSession
            | Answer::IdentityRequired
            | Answer::InvalidToken
            | Answer::UpstreamLost => SESSION_ERROR,
            Answer::UpstreamError
            | Answer::UpstreamTimeout
            | Answer::StoreError
            | Answer::Capacity
            | Answer::UpstreamUnavailable
            | Answer::CallerCapacity
            | Answer::UpstreamCancelled
            | Answer::TaskCancelled
            | Answer::SlowReader => INTERNAL_ERROR,
            Answer::HeaderMismatch => HEADER_MISMATCH,
            Answer::UnsupportedVersion | Answer::DiscoverResumable => UNSUPPORTED_VERSION,
            Answer::MissingCapability => MISSING_CAPABILITY,
            Answer::CallLost | Answer::ShuttingDown => INFLIGHT_ABORTED,
            Answer::RequestTimeout => REQUEST_TIMEOUT,
        }
    }

    /// Its `error.data.reason`.
    pub fn reason(self) -> &'static str {
        match self {
            Answer::Resume(r) => r.as_str(),
            Answer::UnknownSession => "unknown_session",
            Answer::BadRequest => "bad_request",
            Answer::Parse => "parse_error",
            Answer::InvalidRequest => "invalid_request",
            Answer::AlreadyInitialized => "already_initialized",
            Answer::BatchNotSupported => "batch_not_supported",
            Answer::InvalidParams | Answer::InBandInvalidParams => "invalid_params",
            Answer::MissingSessionId => "missing_session_id",
            Answer::UnsupportedVersionHeader | Answer::UnsupportedVersion => {
                "unsupported_protocol_version"
            }
            Answer::NotAcceptable => "not_acceptable",
            Answer::UnsupportedMediaType => "unsupported_media_type",
            Answer::OriginNotAllowed => "origin_not_allowed",
            Answer::HostNotAllowed => "host_not_allowed",
            Answer::IdentityRequired => "identity_required",
            Answer::InvalidToken => "invalid_token",
            Answer::StreamActive => "stream_active",
            Answer::MethodNotAllowed => "method_not_allowed",
            Answer::UpstreamError => "upstream_error",
            Answer::UpstreamTimeout => "upstream_timeout",
            Answer::UpstreamLost | Answer::CallLost => "upstream_lost",
            Answer::StoreError => "store_error",
            Answer::Capacity | Answer::CallerCapacity => "capacity",
            Answer::HeaderMismatch => "header_mismatch",
            Answer::DiscoverResumable => "discover_resumable",
            Answer::MethodNotFound => "method_not_found",
            Answer::MissingCapability => "missing_capability",
            Answer::TaskNotFound => "task_not_found",
            Answer::UpstreamUnavailable => "upstream_unavailable",
            Answer::UpstreamCancelled => "upstream_cancelled",
            Answer::TaskCancelled => "task_cancelled",
            Answer::RequestTimeout => "request_timeout",
            Answer::ShuttingDown => "shutdown",
            Answer::SlowReader => "slow_reader",
        }
    }
}

/// What routing needs to know about one JSON-RPC message.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Peek {
    /// The `id`, as compact canonical JSON (`1`, `"abc"`), if any.
    pub id: Option<String>,
    /// The `method`, if any (requests and notifications). Borrowed for the methods of
    /// [`KNOWN_METHODS`], so peeking the common message allocates nothing for it; any other
    /// method is owned.
    pub method: Option<Cow<'static, str>>,
    /// Has `result` or `error`: a response.
    pub is_response: bool,
    /// `params.progressToken` (progress notifications) or `params._meta.progressToken` (requests),
    /// as canonical JSON. Not read for other messages (always `None` there).
    pub progress_token: Option<String>,
}

impl Peek {
    /// A request: has both `id` and `method`.
    pub fn is_request(&self) -> bool {
        self.id.is_some() && self.method.is_some()
    }

    /// Why a client's message cannot be taken as MCP: a request whose id is neither a string nor
    /// an integer ("Requests MUST include a string or integer ID"; a whole number spelled as a
    /// float is an integer here, see [`canonical`]). A server drops such a request (the
    /// TypeScript SDK's schema refuses it), so nothing would ever answer it; the 2026-07-28 face
    /// refuses the same ids.
    ///
    /// Also a request whose id or progress token is a string that is not Unicode (a lone
    /// surrogate escape): it is kept as sent ([`canonical`]), and a server writes it back in its
    /// own spelling (`"\uDC00"` comes back `"\udc00"`), so its answer or progress would match
    /// nothing (found by the adversary review of 2026-12-06, `tests/adversary24.rs`).
    pub fn refusal(&self) -> Option<&'static str> {
        let id = self.id.as_deref().filter(|_| self.is_request())?;
        if !string_or_integer(id) {
            return Some("a request id must be a string or an integer");
        }
        let not_unicode = |s: &str| {
            s.starts_with('"') && s.contains("\\u") && serde_json::from_str::<String>(s).is_err()
        };
        if not_unicode(id) || self.progress_token.as_deref().is_some_and(not_unicode) {
            return Some("a request id or progress token must be a string of Unicode characters");
        }
        None
    }
}

/// The MCP methods [`Peek::method`] holds as `&'static str` instead of an owned copy: every
/// upstream event is peeked, and nearly all of them are `notifications/message`. Matched by exact
/// equality; what the upstream sends comes first (a miss costs about a length compare per entry).
pub const KNOWN_METHODS: [&str; 31] = [
    // Server to client.
    "notifications/message",
    "notifications/progress",
    "notifications/cancelled",
    "notifications/resources/updated",
    "notifications/resources/list_changed",
    "notifications/tools/list_changed",
    "notifications/prompts/list_changed",
    "notifications/tasks/status",
    "notifications/elicitation/complete",
    "ping",
    "sampling/createMessage",
    "elicitation/create",
    "roots/list",
    // Client to server.
    "initialize",
    "notifications/initialized",
    "notifications/roots/list_changed",
    "tools/call",
    "tools/list",
    "resources/list",
    "resources/read",
    "resources/templates/list",
    "resources/subscribe",
    "resources/unsubscribe",
    "prompts/list",
    "prompts/get",
    "completion/complete",
    "logging/setLevel",
    "tasks/get",
    "tasks/list",
    "tasks/cancel",
    "tasks/result",
];

/// The static of [`KNOWN_METHODS`] whose bytes equal `method` exactly.
fn known_method(method: &[u8]) -> Option<&'static str> {
    KNOWN_METHODS
        .iter()
        .copied()
        .find(|k| k.as_bytes() == method)
}

#[derive(Deserialize)]
struct RawMsg<'a> {
    #[serde(borrow, default)]
    id: Option<&'a RawValue>,
    #[serde(default)]
    method: Option<String>,
    /// `null` is kept (`Some`): `{"id":3,"result":null}` is a success response.
    #[serde(borrow, default, deserialize_with = "present")]
    result: Option<&'a RawValue>,
    #[serde(borrow, default)]
    error: Option<&'a RawValue>,
    #[serde(borrow, default)]
    params: Option<&'a RawValue>,
}

/// The canonical `params.requestId` of a `notifications/cancelled`, if it names one.
pub fn cancelled_request(bytes: &[u8]) -> Option<String> {
    #[derive(Deserialize)]
    struct Note<'a> {
        #[serde(borrow)]
        params: Option<CancelParams<'a>>,
    }
    #[derive(Deserialize)]
    struct CancelParams<'a> {
        #[serde(borrow, rename = "requestId")]
        request_id: Option<&'a RawValue>,
    }
    let note: Note<'_> = serde_json::from_slice(bytes).ok()?;
    note.params?
        .request_id
        .filter(|r| r.get() != "null")
        .map(canonical)
}

/// A member that is there, `null` included (serde reads `null` into an `Option` as absent).
fn present<'de: 'a, 'a, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<&'a RawValue>, D::Error> {
    <&'a RawValue>::deserialize(d).map(Some)
}

#[derive(Deserialize)]
struct RawParams<'a> {
    #[serde(borrow, default, rename = "progressToken")]
    progress_token: Option<&'a RawValue>,
    #[serde(borrow, default, rename = "_meta")]
    meta: Option<RawMeta<'a>>,
}

#[derive(Deserialize)]
struct RawMeta<'a> {
    #[serde(borrow, default, rename = "progressToken")]
    progress_token: Option<&'a RawValue>,
}

/// Canonical compact JSON of a raw value (so `1` from a client and `1` from a server compare equal).
///
/// A value that `serde_json::Value` cannot hold — a string with a lone surrogate escape
/// (`"\ud800"`), a number beyond `f64` (`1e400`), nesting deeper than 128 — is kept as sent, so
/// it still matches its own echo byte for byte (found by fuzzing; such ids are not valid
/// Unicode or not representable by most peers anyway).
///
/// Arrays and objects (not valid ids) are kept as sent too: they are never parsed into a tree.
///
/// A number is rewritten only when `Value` holds it exactly enough that distinct numbers keep
/// distinct forms: an integer within `i64`/`u64`, or at most 15 significant digits (what an
/// `f64` tells apart) outside the subnormal range. Any other number is kept as sent: read as an
/// `f64`, `100000000000000000001` and `100000000000000000002` were both `1e20`, and two requests
/// with those ids shared one in-flight entry, the first one's answer going to the second's stream
/// (found by the adversary review of 2026-12-04; `session/adversary18.rs`).
pub fn canonical(raw: &RawValue) -> String {
    canonical_text(raw.get())
}

/// [`canonical`] of the text of one JSON value. Idempotent: the canonical form of a canonical
/// form is itself.
pub fn canonical_text(text: &str) -> String {
    if text.starts_with(['[', '{']) {
        return text.to_string();
    }
    match serde_json::from_str::<serde_json::Value>(text) {
        Ok(serde_json::Value::Number(n)) if !exact_number(&n, text) => text.to_string(),
        Ok(serde_json::Value::Number(n)) => match n.as_f64().filter(|_| n.is_f64()) {
            Some(f) if is_whole(f) => format!("{}", f as i64),
            _ => n.to_string(),
        },
        Ok(v) => v.to_string(),
        Err(_) => text.to_string(),
    }
}

/// Whether a number read as an `f64` is a whole number that an integer id can stand for: `1.0`,
/// `1e0`, `10e-1` and `-0` are `1`, `1` and `0` to the peers (JavaScript numbers; pydantic's
/// `int`), which echo them in that form. Kept as an `f64` above 2^53, where an `f64` no longer
/// tells neighbouring integers apart. Found by the adversary review of 2026-12-06: a request
/// with id `1.0` to the TypeScript server-everything was answered with id `1`, which matched no
/// request in flight, so its POST stream never ended.
fn is_whole(f: f64) -> bool {
    const EXACT: f64 = 9_007_199_254_740_992.0; // 2^53
    f.fract() == 0.0 && f.abs() <= EXACT
}

/// Whether `n`, read from `text`, is held exactly enough to stand for it (see [`canonical`]).
fn exact_number(n: &serde_json::Number, text: &str) -> bool {
    if n.is_i64() || n.is_u64() {
        return true;
    }
    let Some(f) = n.as_f64() else {
        return false;
    };
    (f == 0.0 || f.abs() >= 1e-300) && significant_digits(text) <= 15
}

/// Significant digits of a JSON number's text: its mantissa without sign, point, leading or
/// trailing zeros.
fn significant_digits(text: &str) -> usize {
    let mantissa = text.split(['e', 'E']).next().unwrap_or(text);
    let digits = mantissa.bytes().filter(u8::is_ascii_digit);
    // Count from the first non-zero digit to the last one.
    let (mut seen, mut upto) = (0, 0);
    for d in digits.skip_while(|&d| d == b'0') {
        seen += 1;
        if d != b'0' {
            upto = seen;
        }
    }
    upto
}

/// Reads the routing fields of one message. `None` when the bytes are not a JSON object (nor an
/// array: see [`peek_serde`]).
///
/// Every upstream event passes here, so the common message is read by a byte scanner
/// (`jsonrpc/envelope.rs`) that allocates nothing but the answer; whatever it is not sure of
/// (escaped keys, a duplicate routing key, deep nesting, anything that is not JSON) it leaves to
/// [`peek_serde`], whose answer is the definition: the scanner agrees with it on every input.
pub fn peek(bytes: &[u8]) -> Option<Peek> {
    peek_fast(bytes).or_else(|| peek_serde(bytes))
}

/// [`peek`] by the scanner, the same steps as [`peek_serde`]; `None` when it leaves the message
/// to serde.
fn peek_fast(bytes: &[u8]) -> Option<Peek> {
    let msg = envelope::scan(bytes)?;
    let id = msg.id.map(canonical_scanned);
    // A known method is matched on its bytes (no UTF-8 check of it); the scan has checked the
    // whole message is UTF-8, so another one converts.
    let method = match msg.method {
        Some(m) => Some(match known_method(m) {
            Some(k) => Cow::Borrowed(k),
            None => Cow::Owned(std::str::from_utf8(m).ok()?.to_owned()),
        }),
        None => None,
    };
    let wants_token = match &method {
        Some(m) => id.is_some() || m == "notifications/progress",
        None => false,
    };
    let progress_token = if wants_token {
        msg.progress_token()?.map(canonical_scanned)
    } else {
        None
    };
    Some(Peek {
        id,
        method,
        is_response: msg.is_response,
        progress_token,
    })
}

/// [`canonical`] of a raw value the scanner has checked.
///
/// The common ids are their own canonical form and are copied without a parse: a string with
/// no escape (serde_json writes back escaped only `"`, `\` and control characters, none of which
/// it can hold unescaped) and an integer of at most 18 digits without a leading zero (a `u64` or
/// `i64` holds it; `-0` is a float to serde_json, whose canonical form is `0`).
fn canonical_scanned(raw: &str) -> String {
    let digits = raw.strip_prefix('-').unwrap_or(raw).as_bytes();
    let plain_string = raw.starts_with('"') && !raw.contains('\\');
    let plain_integer = digits.len() <= 18
        && digits.iter().all(u8::is_ascii_digit)
        && (digits.first().is_some_and(|&d| d != b'0') || raw == "0");
    if plain_string || plain_integer {
        raw.to_owned()
    } else {
        canonical_text(raw)
    }
}

/// [`peek`] by serde_json: the definition of its answer, and its slow path.
///
/// Its odd corners are kept (the scanner matches them): a top-level array is read as the fields
/// in order (`[1, "x"]` is a request with id `1` and method `x`); `"result": null` is a response
/// only without a method (`error: null` never is); a repeated `id`, `method`, `result`, `error` or `params` makes the whole message
/// unreadable (`None`), and a repeated `progressToken` or `_meta` only the token; a request's
/// `params.progressToken` is read too (before `_meta.progressToken`), and so is a progress
/// notification's `_meta.progressToken`; params that are an array are read as `progressToken`
/// and `_meta` in order; invalid UTF-8 inside a value of another key (`"jsonrpc"`) is not
/// noticed.
#[doc(hidden)]
pub fn peek_serde(bytes: &[u8]) -> Option<Peek> {
    let msg: RawMsg<'_> = serde_json::from_slice(bytes).ok()?;
    let id = msg.id.filter(|r| r.get() != "null").map(canonical);
    // Only a request's `_meta.progressToken` and a progress notification's `progressToken` mean
    // anything, so other messages' params (the bulk of most upstream events) are not parsed a
    // second time.
    let wants_token = match &msg.method {
        Some(m) => id.is_some() || m == "notifications/progress",
        None => false,
    };
    let progress_token = msg
        .params
        .filter(|_| wants_token)
        .and_then(|p| serde_json::from_str::<RawParams<'_>>(p.get()).ok())
        .and_then(|p| {
            p.progress_token
                .or(p.meta.and_then(|m| m.progress_token))
                .map(canonical)
        });
    let is_response = is_response(msg.result, msg.error, msg.method.is_some());
    Some(Peek {
        id,
        // Unescaped by serde, so `"notifications\/message"` is the known method too.
        method: msg
            .method
            .map(|m| known_method(m.as_bytes()).map_or(Cow::Owned(m), Cow::Borrowed)),
        is_response,
        progress_token,
    })
}

/// Whether a message with these members is a response: a `result` or an `error` that is not
/// `null`, or a `"result": null` without a method (a success with nothing to say; a message that
/// has a method too is a request or notification from a sloppy serializer).
fn is_response(result: Option<&RawValue>, error: Option<&RawValue>, has_method: bool) -> bool {
    let value = |r: Option<&RawValue>| r.is_some_and(|r| r.get() != "null");
    value(result) || value(error) || (result.is_some() && !has_method)
}

/// Whether canonical id text is a string or an integer (of any length): the ids MCP allows.
fn string_or_integer(id: &str) -> bool {
    let digits = id.strip_prefix('-').unwrap_or(id);
    id.starts_with('"') || (!digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()))
}

/// A JSON-RPC error response with the given id (compact JSON text, or `null`).
///
/// A string or integer id is written as its text, not through `serde_json::Value`: one that
/// `Value` cannot hold (an integer past 64 bits, a string with a lone surrogate) came back as an
/// `f64` or `null`, so the proxy's own answers (-32091, -32093) matched no request the client had
/// sent; found by the adversary review of 2026-12-06 (`tests/adversary24.rs`). Any other id (only
/// a refusal answers one) goes through `Value`, so the body stays one a JSON parser reads
/// (`1e400` becomes `null`, as before).
pub fn error_response(id: &str, code: i64, message: &str, data: serde_json::Value) -> String {
    #[derive(serde::Serialize)]
    struct Body<'a> {
        jsonrpc: &'static str,
        id: &'a RawValue,
        error: ErrorBody<'a>,
    }
    #[derive(serde::Serialize)]
    struct ErrorBody<'a> {
        code: i64,
        message: &'a str,
        data: serde_json::Value,
    }
    let id = id.trim();
    let text: Cow<'_, str> = if string_or_integer(id) {
        Cow::Borrowed(id)
    } else {
        Cow::Owned(
            serde_json::from_str::<serde_json::Value>(id).map_or("null".into(), |v| v.to_string()),
        )
    };
    let body = Body {
        jsonrpc: "2.0",
        id: serde_json::from_str::<&RawValue>(&text).unwrap_or(RawValue::NULL),
        error: ErrorBody {
            code,
            message,
            data,
        },
    };
    serde_json::to_string(&body).expect("a JSON-RPC error serializes")
}

/// Best-effort recovery of a JSON-RPC `id` from the start and end of a message too large to keep.
/// Used only to answer the request an oversized upstream response belonged to.
pub fn scan_id(head: &[u8], tail: &[u8]) -> Option<String> {
    for part in [tail, head] {
        let text = String::from_utf8_lossy(part);
        // The last top-level "id" in TypeScript output, the first in Python output: try both ends.
        for (pos, _) in text.match_indices("\"id\"") {
            let rest = text[pos + 4..].trim_start();
            let Some(rest) = rest.strip_prefix(':') else {
                continue;
            };
            let rest = rest.trim_start();
            let end = if let Some(s) = rest.strip_prefix('"') {
                s.find('"').map(|i| i + 2)
            } else {
                rest.find(|c: char| !(c.is_ascii_digit() || c == '-'))
                    .or(Some(rest.len()))
            };
            if let Some(end) = end.filter(|&e| e > 0) {
                if let Ok(v) = serde_json::from_str::<serde_json::Value>(&rest[..end]) {
                    if v.is_string() || v.is_number() {
                        // The same form as the in-flight entry's key (`canonical`).
                        return Some(canonical_text(&rest[..end]));
                    }
                }
            }
        }
    }
    None
}

/// Bytes of each end of a message that [`scan_response_id`] looks at.
const SCAN_BYTES: usize = 512;

/// Best-effort recovery of the `id` of a message that is not valid JSON, when it looks like a
/// response: of the keys `"method"`, `"result"` and `"error"`, the first to appear is `"result"`
/// or `"error"` (both SDKs write `method` before `params`, and a response's payload after its
/// `result`/`error` key). A request or notification — whose params may well hold an `"id"` — is
/// never taken for a response. The id is then read with [`scan_id`] from the first and last
/// 512 bytes, as for an oversized event.
pub fn scan_response_id(bytes: &[u8]) -> Option<String> {
    let head = &bytes[..bytes.len().min(SCAN_BYTES)];
    let tail = &bytes[bytes.len().saturating_sub(SCAN_BYTES)..];
    looks_like_response(head).then(|| scan_id(head, tail))?
}

/// Does the start of a message read like a response (see [`scan_response_id`])?
pub fn looks_like_response(head: &[u8]) -> bool {
    let text = String::from_utf8_lossy(head);
    let first = |key: &str| text.find(key).unwrap_or(usize::MAX);
    let method = first("\"method\"");
    let answer = first("\"result\"").min(first("\"error\""));
    answer < method
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn depth_is_counted_outside_strings() {
        assert!(!too_deep(b"[[[1]]]", 3));
        assert!(too_deep(b"[[[[1]]]]", 3));
        assert!(too_deep(br#"{"a":{"b":[{}]}}"#, 3));
        // Brackets in strings, escaped quotes included, do not count.
        assert!(!too_deep(br#"["[[[[", "\"[[[[", "{{{{"]"#, 1));
        // Depth is the deepest point, not the number of brackets.
        assert!(!too_deep(&b"[],".repeat(10_000), 1));
    }

    #[test]
    fn members_and_items_are_walked_in_place() {
        let raw: &RawValue =
            serde_json::from_str(r#"{"a": [1, {"x": 2}], "b\u0041": "s", "c": {}}"#).unwrap();
        let mut seen = Vec::new();
        for_each_member(raw, |k, v| seen.push((k.to_string(), v.get()))).unwrap();
        assert_eq!(
            seen,
            [
                ("a".to_string(), r#"[1, {"x": 2}]"#),
                ("bA".to_string(), r#""s""#),
                ("c".to_string(), "{}")
            ]
        );
        let arr: &RawValue = serde_json::from_str(r#"[1, "x", {"k": []}]"#).unwrap();
        let mut items = Vec::new();
        for_each_item(arr, |v| items.push(v.get())).unwrap();
        assert_eq!(items, ["1", r#""x""#, r#"{"k": []}"#]);
        assert!(for_each_member(arr, |_, _| {}).is_err());
        assert!(for_each_item(raw, |_| {}).is_err());
        assert_eq!(string(items_of(r#""h\u00e9""#)).as_deref(), Some("hé"));
        assert_eq!(string(items_of("1")), None);
        assert_eq!(scalar(items_of("[1]")), None);
        assert_eq!(scalar(items_of("-1")), Some(serde_json::json!(-1)));
        // Ids that are arrays or objects are kept as sent, never built.
        assert_eq!(canonical(items_of("[1, 2]")), "[1, 2]");
    }

    fn items_of(s: &'static str) -> &'static RawValue {
        serde_json::from_str(s).unwrap()
    }

    #[test]
    fn peek_request_response_notification() {
        let p = peek(br#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"x","_meta":{"progressToken":"t1"}}}"#).unwrap();
        assert!(p.is_request());
        assert_eq!(p.id.as_deref(), Some("7"));
        assert_eq!(p.progress_token.as_deref(), Some("\"t1\""));
        let p = peek(br#"{"result":{},"jsonrpc":"2.0","id":"a b"}"#).unwrap();
        assert!(p.is_response && !p.is_request());
        assert_eq!(p.id.as_deref(), Some("\"a b\""));
        let p = peek(br#"{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":3,"progress":1}}"#).unwrap();
        assert_eq!(p.id, None);
        assert_eq!(p.progress_token.as_deref(), Some("3"));
        // Other notifications' params are not read for a token.
        let p = peek(br#"{"jsonrpc":"2.0","method":"notifications/message","params":{"progressToken":3,"data":{}}}"#).unwrap();
        assert_eq!(p.progress_token, None);
        assert!(peek(b"{not json").is_none());
        assert!(peek(b"[1,2]").is_none());
    }

    #[test]
    fn known_methods_are_borrowed_others_exact() {
        let method = |bytes: &[u8]| {
            let (fast, serde) = (peek_fast(bytes), peek_serde(bytes));
            assert!(fast.is_none() || fast == serde, "{fast:?} vs {serde:?}");
            (fast.and_then(|p| p.method), serde.and_then(|p| p.method))
        };
        for k in KNOWN_METHODS {
            for (i, body) in [
                format!(r#"{{"jsonrpc":"2.0","method":"{k}","params":{{}}}}"#),
                format!(r#"{{"jsonrpc":"2.0","id":1,"method":"{k}"}}"#),
                // Escaped (when it has a '/'): the scanner leaves it to serde, which unescapes it.
                format!(r#"{{"method":"{}"}}"#, k.replace('/', "\\/")),
            ]
            .iter()
            .enumerate()
            {
                let (fast, serde) = method(body.as_bytes());
                assert!(
                    matches!(serde, Some(Cow::Borrowed(m)) if m == k),
                    "{serde:?}"
                );
                match fast {
                    None if i == 2 => {}
                    Some(Cow::Borrowed(m)) if m == k => {}
                    fast => panic!("{body}: {fast:?}"),
                }
            }
        }
        assert_eq!(KNOWN_METHODS[0], "notifications/message");
        // Anything else comes through exactly as sent, owned: near misses of a known method too.
        for m in [
            "x",
            "",
            "notifications/messages",
            "notifications/messag",
            "Notifications/message",
            "notifications/message ",
            " ping",
            "tools/call\u{e9}",
        ] {
            let body = format!(r#"{{"id":"a","method":{}}}"#, serde_json::json!(m));
            for got in <[_; 2]>::from(method(body.as_bytes())) {
                assert!(
                    matches!(&got, Some(Cow::Owned(s)) if s == m),
                    "{m:?}: {got:?}"
                );
            }
        }
        // Escaped into an unknown method: serde's owned text, kept.
        let (_, serde) = method(br#"{"method":"notifications\/message\/x"}"#);
        assert!(matches!(serde, Some(Cow::Owned(s)) if s == "notifications/message/x"));
        // No method, and a null method: None either way.
        assert_eq!(method(br#"{"id":1,"result":{}}"#), (None, None));
        assert_eq!(method(br#"{"method":null}"#), (None, None));
    }

    #[test]
    fn canonical_ids_compare() {
        let a = peek(br#"{"id": 1 ,"result":{}}"#).unwrap();
        let b = peek(br#"{"id":1,"method":"x"}"#).unwrap();
        assert_eq!(a.id, b.id);
    }

    #[test]
    fn requests_whose_id_is_neither_string_nor_integer_are_refused() {
        let refused = |m: &str| peek(m.as_bytes()).unwrap().refusal().is_some();
        for id in [
            "1.5",
            "1e400",
            "9007199254740993.0",
            "true",
            "[1]",
            r#"{"a":1}"#,
        ] {
            assert!(refused(&format!(r#"{{"id":{id},"method":"m"}}"#)), "{id}");
        }
        for id in [
            "1",
            "-3",
            "1.0",
            "-0",
            "18446744073709551616",
            r#""x""#,
            r#""1.5""#,
            "null",
        ] {
            assert!(!refused(&format!(r#"{{"id":{id},"method":"m"}}"#)), "{id}");
        }
        // Not a request: an answer to the server carries the server's id, as it sent it.
        assert!(!refused(r#"{"id":1.5,"result":{}}"#));
        // Strings that are not Unicode, as an id or a progress token; escaped Unicode is fine.
        assert!(refused(r#"{"id":"\uDC00","method":"m"}"#));
        assert!(refused(r#"{"id":"a\ud800b","method":"m"}"#));
        assert!(refused(
            r#"{"id":1,"method":"m","params":{"_meta":{"progressToken":"\udc00"}}}"#
        ));
        assert!(!refused(r#"{"id":"\ud83d\ude00\u0041","method":"m"}"#));
        assert!(!refused(
            r#"{"id":1,"method":"m","params":{"_meta":{"progressToken":"\u00e9"}}}"#
        ));
    }

    #[test]
    fn float_ids_are_canonical() {
        // Found by fuzzing (fuzz/corpus/jsonrpc/regression-float-id): without serde_json's
        // `float_roundtrip`, 118446744073709551616 parsed to a double that printed as
        // 1.1844674407370957e+20, which parses back to a different double: the "canonical" form
        // of an id was not stable, so the same id re-serialised by a server could fail to match.
        // Since 2026-12-04 a number beyond what an f64 tells apart is kept as sent (see
        // `canonical`): the form is still stable.
        let id = scan_id(b"", br#","id":118446744073709551616}"#).unwrap();
        assert_eq!(id, "118446744073709551616");
        assert_eq!(canonical_text(&id), id);
        // What an f64 holds exactly enough is still rewritten, so `1e2` and `100.0` match.
        assert_eq!(canonical_text("1.5e3"), "1500");
        assert_eq!(canonical_text("1.25e1"), "12.5");
        assert_eq!(canonical_text("1e2"), canonical_text("100.0"));
        // Distinct beyond an f64's precision: distinct forms (each as sent).
        assert_ne!(
            canonical_text("0.1000000000000000000001"),
            canonical_text("0.1000000000000000000002")
        );
        assert_eq!(canonical_text("123456789012345.6"), "123456789012345.6");
        let p = peek(br#"{"id":0.30000000000000004,"result":{}}"#).unwrap();
        let id = p.id.unwrap();
        let again: serde_json::Value = serde_json::from_str(&id).unwrap();
        assert_eq!(again.to_string(), id);
    }

    #[test]
    fn ids_serde_cannot_hold_are_kept_as_sent() {
        let p = peek(br#"{"id":"a\ud800","result":{}}"#).unwrap();
        assert_eq!(p.id.as_deref(), Some(r#""a\ud800""#));
        let p = peek(br#"{"id":1e400,"method":"x"}"#).unwrap();
        assert_eq!(p.id.as_deref(), Some("1e400"));
    }

    #[test]
    fn scan_id_from_fragments() {
        assert_eq!(
            scan_id(br#"{"jsonrpc":"2.0","id":12,"result":{"x":"#, b"").as_deref(),
            Some("12")
        );
        assert_eq!(
            scan_id(
                b"{\"result\":{\"x\":\"aaaa",
                br#"aaa"}},"jsonrpc":"2.0","id":"r-9"}"#
            )
            .as_deref(),
            Some("\"r-9\"")
        );
        assert_eq!(scan_id(b"garbage", b"more"), None);
    }

    #[test]
    fn scan_response_id_only_for_response_shapes() {
        // Python and TypeScript SDK key orders, cut short.
        assert_eq!(
            scan_response_id(br#"{"jsonrpc":"2.0","id":5,"result":{"content":[{"type":"te"#)
                .as_deref(),
            Some("5")
        );
        assert_eq!(
            scan_response_id(br#"{"result":{"x":1},"jsonrpc":"2.0","id":"q-1"#).as_deref(),
            None,
            "an unterminated string id is not guessed"
        );
        assert_eq!(
            scan_response_id(br#"{"result":{"x":1,,},"jsonrpc":"2.0","id":"q-1"}"#).as_deref(),
            Some("\"q-1\"")
        );
        assert_eq!(
            scan_response_id(br#"{"jsonrpc":"2.0","id":9,"error":{"code":-1,"message":"#)
                .as_deref(),
            Some("9")
        );
        // A notification or request whose params carry an "id" is not a response.
        assert_eq!(
            scan_response_id(
                br#"{"jsonrpc":"2.0","method":"notifications/message","params":{"data":{"id":5,"result":1"#
            ),
            None
        );
        assert_eq!(
            scan_response_id(br#"{"method":"sampling/createMessage","params":{},"id":3,"#),
            None
        );
        assert_eq!(scan_response_id(b"{not json"), None);
        assert_eq!(scan_response_id(b""), None);
        // A long broken response: the id is read from its ends.
        let mut long = br#"{"jsonrpc":"2.0","id":77,"result":{"text":""#.to_vec();
        long.extend(std::iter::repeat_n(b'x', 100_000));
        assert_eq!(scan_response_id(&long).as_deref(), Some("77"));
    }

    #[test]
    fn the_answer_table() {
        // The wire of every row, pinned: a change here changes what clients see.
        let rows = [
            (
                Answer::Resume(Refusal::MalformedCursor),
                400,
                -32090,
                "malformed_cursor",
            ),
            (
                Answer::Resume(Refusal::UnknownSession),
                404,
                -32090,
                "unknown_session",
            ),
            (
                Answer::Resume(Refusal::ForeignSession),
                409,
                -32090,
                "foreign_session",
            ),
            (
                Answer::Resume(Refusal::CursorTrimmed),
                409,
                -32090,
                "cursor_trimmed",
            ),
            (
                Answer::Resume(Refusal::CursorAhead),
                409,
                -32090,
                "cursor_ahead",
            ),
            (
                Answer::Resume(Refusal::UnknownEpoch),
                409,
                -32090,
                "unknown_epoch",
            ),
            (Answer::UnknownSession, 404, -32001, "unknown_session"),
            (Answer::BadRequest, 400, -32600, "bad_request"),
            (Answer::Parse, 400, -32700, "parse_error"),
            (Answer::InvalidRequest, 400, -32600, "invalid_request"),
            (
                Answer::AlreadyInitialized,
                400,
                -32600,
                "already_initialized",
            ),
            (
                Answer::BatchNotSupported,
                400,
                -32600,
                "batch_not_supported",
            ),
            (Answer::InvalidParams, 400, -32602, "invalid_params"),
            (Answer::MissingSessionId, 400, -32600, "missing_session_id"),
            (
                Answer::UnsupportedVersionHeader,
                400,
                -32600,
                "unsupported_protocol_version",
            ),
            (Answer::NotAcceptable, 406, -32600, "not_acceptable"),
            (
                Answer::UnsupportedMediaType,
                415,
                -32600,
                "unsupported_media_type",
            ),
            (Answer::OriginNotAllowed, 403, -32000, "origin_not_allowed"),
            (Answer::HostNotAllowed, 403, -32000, "host_not_allowed"),
            (Answer::IdentityRequired, 401, -32001, "identity_required"),
            (Answer::InvalidToken, 401, -32001, "invalid_token"),
            (Answer::StreamActive, 409, -32000, "stream_active"),
            (Answer::MethodNotAllowed, 405, -32600, "method_not_allowed"),
            (Answer::UpstreamError, 502, -32603, "upstream_error"),
            (Answer::UpstreamTimeout, 504, -32603, "upstream_timeout"),
            (Answer::UpstreamLost, 404, -32001, "upstream_lost"),
            (Answer::StoreError, 503, -32603, "store_error"),
            (Answer::Capacity, 503, -32603, "capacity"),
            (Answer::HeaderMismatch, 400, -32020, "header_mismatch"),
            (
                Answer::UnsupportedVersion,
                400,
                -32022,
                "unsupported_protocol_version",
            ),
            (Answer::DiscoverResumable, 400, -32022, "discover_resumable"),
            (Answer::MethodNotFound, 404, -32601, "method_not_found"),
            (Answer::MissingCapability, 400, -32021, "missing_capability"),
            (Answer::InBandInvalidParams, 200, -32602, "invalid_params"),
            (Answer::TaskNotFound, 200, -32602, "task_not_found"),
            (
                Answer::UpstreamUnavailable,
                200,
                -32603,
                "upstream_unavailable",
            ),
            (Answer::CallerCapacity, 200, -32603, "capacity"),
            (Answer::CallLost, 200, -32091, "upstream_lost"),
            (Answer::UpstreamCancelled, 200, -32603, "upstream_cancelled"),
            (Answer::TaskCancelled, 200, -32603, "task_cancelled"),
            (Answer::RequestTimeout, 200, -32093, "request_timeout"),
            (Answer::ShuttingDown, 200, -32091, "shutdown"),
            (Answer::SlowReader, 200, -32603, "slow_reader"),
        ];
        for (a, status, code, reason) in rows {
            assert_eq!(
                (a.status().as_u16(), a.code(), a.reason()),
                (status, code, reason),
                "{a:?}"
            );
        }
    }

    #[test]
    fn error_response_shape() {
        let s = error_response(
            "5",
            INFLIGHT_ABORTED,
            "aborted",
            serde_json::json!({"reason":"upstream_lost"}),
        );
        let v: serde_json::Value = serde_json::from_str(&s).unwrap();
        assert_eq!(v["id"], 5);
        assert_eq!(v["error"]["code"], -32091);
        assert_eq!(v["jsonrpc"], "2.0");
    }
}

/// Whether `bytes` nest arrays and objects deeper than `max`.
///
/// A linear scan that allocates nothing (brackets inside strings do not count), run before any
/// parse: the parsers below recurse once per level, and a tree of a deep value costs far more
/// than its bytes. It does not check that the bytes are JSON.
pub fn too_deep(bytes: &[u8], max: usize) -> bool {
    let (mut depth, mut in_str, mut escaped) = (0usize, false, false);
    for &b in bytes {
        if in_str {
            match b {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_str = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_str = true,
            b'[' | b'{' => {
                depth += 1;
                if depth > max {
                    return true;
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    false
}

/// Whether a raw value is a JSON object.
pub fn is_object(raw: &RawValue) -> bool {
    raw.get().starts_with('{')
}

/// Whether a raw value is a JSON string.
pub fn is_string(raw: &RawValue) -> bool {
    raw.get().starts_with('"')
}

/// The text of a raw JSON string (`None` for any other value).
pub fn string(raw: &RawValue) -> Option<String> {
    is_string(raw)
        .then(|| serde_json::from_str(raw.get()).ok())
        .flatten()
}

/// A raw string or number as a `Value` (`None` for anything else: no tree is built).
pub fn scalar(raw: &RawValue) -> Option<serde_json::Value> {
    let first = raw.get().bytes().next()?;
    (first == b'"' || first == b'-' || first.is_ascii_digit())
        .then(|| serde_json::from_str(raw.get()).ok())
        .flatten()
}

/// Calls `f` with each member of the JSON object `raw`, in the order sent: its key (borrowed
/// unless it has escapes) and its value, borrowed. Walks an object without building it.
///
/// # Errors
/// `raw` is not an object.
pub fn for_each_member<'a>(
    raw: &'a RawValue,
    f: impl FnMut(&str, &'a RawValue),
) -> Result<(), serde_json::Error> {
    let mut de = serde_json::Deserializer::from_str(raw.get());
    Members(f).deserialize(&mut de)?;
    de.end()
}

/// Calls `f` with each item of the JSON array `raw`, borrowed. Walks an array without building it.
///
/// # Errors
/// `raw` is not an array.
pub fn for_each_item<'a>(
    raw: &'a RawValue,
    f: impl FnMut(&'a RawValue),
) -> Result<(), serde_json::Error> {
    let mut de = serde_json::Deserializer::from_str(raw.get());
    Items(f).deserialize(&mut de)?;
    de.end()
}

struct Items<F>(F);

impl<'de, F: FnMut(&'de RawValue)> DeserializeSeed<'de> for Items<F> {
    type Value = ();

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de, F: FnMut(&'de RawValue)> Visitor<'de> for Items<F> {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON array")
    }

    fn visit_seq<A: SeqAccess<'de>>(mut self, mut s: A) -> Result<(), A::Error> {
        while let Some(v) = s.next_element::<&'de RawValue>()? {
            (self.0)(v);
        }
        Ok(())
    }
}

/// A key, borrowed from the input when it can be.
#[derive(Deserialize)]
struct Key<'a>(#[serde(borrow)] Cow<'a, str>);

struct Members<F>(F);

impl<'de, F: FnMut(&str, &'de RawValue)> DeserializeSeed<'de> for Members<F> {
    type Value = ();

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de, F: FnMut(&str, &'de RawValue)> Visitor<'de> for Members<F> {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(mut self, mut m: A) -> Result<(), A::Error> {
        while let Some(Key(k)) = m.next_key()? {
            let v: &'de RawValue = m.next_value()?;
            (self.0)(&k, v);
        }
        Ok(())
    }
}
