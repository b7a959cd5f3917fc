//! The 2026-07-28 request ladder: what a modern POST must look like before anything runs.
//!
//! In order (the reference server's `INBOUND_VALIDATION_LADDER`, as the conformance suite checks
//! it): JSON (400 `-32700`) → one request or notification (400 `-32600`) → the `_meta` envelope
//! (400 `-32602` naming the missing keys; `clientInfo` is optional) → `MCP-Protocol-Version`
//! present and equal to the claim (400 `-32020`) → a version this face speaks (400 `-32022`,
//! `data.supported` and `data.requested`) → a 2026-07-28 method (404 `-32601`) → `Mcp-Method`
//! and `Mcp-Name` present and equal to the body (400 `-32020`; names are matched after OWS trim
//! and `=?base64?…?=` decoding, method values case-sensitively) → client capabilities the method
//! needs (400 `-32021`). Notification POSTs are exempt from the header checks and answered 202.
//! `Mcp-Param-*` headers are checked later, against the tools that declare `x-mcp-header` ([`super::params`]).

use bytes::Bytes;
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{json, Value};

use super::mrtr::Responses;
use super::pool::PoolKey;
use super::protocol::{level_rank, MODERN_VERSION, SERVED_VERSIONS, TASKS_EXT};
use super::who::Who;
use crate::facade::http::Caller;
use crate::identity::Identity;
use crate::jsonrpc::Answer;
use crate::session::Owner;

/// `_meta` key: the protocol version of a request.
pub const META_VERSION: &str = "io.modelcontextprotocol/protocolVersion";
/// `_meta` key: the client's capabilities.
pub const META_CAPS: &str = "io.modelcontextprotocol/clientCapabilities";
/// `_meta` key: the log level the request opts in to.
pub const META_LOG_LEVEL: &str = "io.modelcontextprotocol/logLevel";

/// The 2026-07-28 client→server requests (with the tasks extension's).
const METHODS: [&str; 13] = [
    "server/discover",
    "completion/complete",
    "prompts/get",
    "prompts/list",
    "resources/list",
    "resources/templates/list",
    "resources/read",
    "subscriptions/listen",
    "tools/call",
    "tools/list",
    "tasks/get",
    "tasks/update",
    "tasks/cancel",
];

/// A protocol-level refusal: its row of the answer table (HTTP status and JSON-RPC code), its
/// message and its `error.data` (the reference server's shapes: no `reason`, but where a row's
/// `data` names one).
#[derive(Debug, Clone, PartialEq)]
pub struct Refusal {
    /// Its row of the answer table.
    pub answer: Answer,
    /// Message.
    pub message: String,
    /// `error.data`.
    pub data: Option<Value>,
}

impl Refusal {
    fn new(answer: Answer, message: impl Into<String>) -> Self {
        Self {
            answer,
            message: message.into(),
            data: None,
        }
    }

    /// Its HTTP status.
    pub fn status(&self) -> http::StatusCode {
        self.answer.status()
    }

    /// Its JSON-RPC code.
    pub fn code(&self) -> i64 {
        self.answer.code()
    }

    /// 400 `-32020` HeaderMismatch.
    pub fn header(message: impl Into<String>) -> Self {
        Self::new(Answer::HeaderMismatch, message)
    }

    /// 400 `-32021`: the request needs the tasks extension, which it did not declare.
    pub fn missing_tasks() -> Self {
        Self {
            data: Some(json!({"requiredCapabilities": {"extensions": {TASKS_EXT: {}}}})),
            ..Self::new(
                Answer::MissingCapability,
                "Missing required client capability: extensions[\"io.modelcontextprotocol/tasks\"]",
            )
        }
    }

    /// 400 `-32021`: the upstream asked for something (`cap`: sampling, elicitation, roots) the
    /// client did not declare.
    pub fn missing_capability(cap: &str) -> Self {
        Self {
            data: Some(json!({"requiredCapabilities": {cap: {}}})),
            ..Self::new(
                Answer::MissingCapability,
                format!("Missing required client capability: {cap}"),
            )
        }
    }

    /// 400 `-32022` to `server/discover` with `modern.discover = "resumable"`: the sessionful
    /// versions are listed, so a dual-era client falls back to `initialize`; the message tells a
    /// pinned client why.
    pub fn discover_resumable() -> Self {
        let sessionful = &SERVED_VERSIONS[1..];
        let answer = Answer::DiscoverResumable;
        Self {
            data: Some(json!({"supported": sessionful, "requested": MODERN_VERSION,
                "reason": answer.reason()})),
            ..Self::new(
                answer,
                "Unsupported protocol version for discovery: this proxy steers clients to \
                 2025-11-25, whose streams resume exactly after a cut (modern.discover = \
                 \"resumable\"); 2026-07-28 requests sent without discovery are still served",
            )
        }
    }
}

/// The most bytes `_meta`'s client capabilities may take (they are parsed and kept in the pool
/// key; real ones are well under a kilobyte).
pub const MAX_CAPS_BYTES: usize = 64 * 1024;

/// A modern POST's body, its members borrowed (nothing else is read).
#[derive(Deserialize)]
struct RawMsg<'a> {
    #[serde(borrow, default)]
    jsonrpc: Option<&'a RawValue>,
    #[serde(borrow, default)]
    id: Option<&'a RawValue>,
    #[serde(borrow, default)]
    method: Option<&'a RawValue>,
    #[serde(borrow, default)]
    params: Option<&'a RawValue>,
}

/// The params members the face reads, borrowed; the others are only forwarded.
#[derive(Debug, Default, Deserialize)]
pub struct Fields<'a> {
    /// `_meta`.
    #[serde(borrow, default, rename = "_meta")]
    pub meta: Option<&'a RawValue>,
    /// `name` (`tools/call`, `prompts/get`).
    #[serde(borrow, default)]
    pub name: Option<&'a RawValue>,
    /// `uri` (`resources/read`).
    #[serde(borrow, default)]
    pub uri: Option<&'a RawValue>,
    /// `taskId` (`tasks/*`).
    #[serde(borrow, default, rename = "taskId")]
    pub task_id: Option<&'a RawValue>,
    /// `requestState` (an MRTR retry).
    #[serde(borrow, default, rename = "requestState")]
    pub request_state: Option<&'a RawValue>,
    /// `inputResponses` (an MRTR retry, `tasks/update`).
    #[serde(borrow, default, rename = "inputResponses")]
    pub input_responses: Option<&'a RawValue>,
    /// `notifications` (`subscriptions/listen`).
    #[serde(borrow, default)]
    pub notifications: Option<&'a RawValue>,
    /// `requestId` (`notifications/cancelled`).
    #[serde(borrow, default, rename = "requestId")]
    pub request_id: Option<&'a RawValue>,
    /// `arguments` (`tools/call`).
    #[serde(borrow, default)]
    pub arguments: Option<&'a RawValue>,
}

/// `subscriptions/listen`'s `params.notifications`, borrowed.
#[derive(Default, Deserialize)]
pub struct Wanted<'a> {
    /// `toolsListChanged`.
    #[serde(borrow, default, rename = "toolsListChanged")]
    pub tools: Option<&'a RawValue>,
    /// `promptsListChanged`.
    #[serde(borrow, default, rename = "promptsListChanged")]
    pub prompts: Option<&'a RawValue>,
    /// `resourcesListChanged`.
    #[serde(borrow, default, rename = "resourcesListChanged")]
    pub resources: Option<&'a RawValue>,
    /// `taskIds`.
    #[serde(borrow, default, rename = "taskIds")]
    pub task_ids: Option<&'a RawValue>,
    /// `resourceSubscriptions`.
    #[serde(borrow, default, rename = "resourceSubscriptions")]
    pub resource_subscriptions: Option<&'a RawValue>,
}

/// The `_meta` members the face reads.
#[derive(Default, Deserialize)]
struct Envelope<'a> {
    #[serde(borrow, default, rename = "io.modelcontextprotocol/protocolVersion")]
    version: Option<&'a RawValue>,
    #[serde(borrow, default, rename = "io.modelcontextprotocol/clientCapabilities")]
    caps: Option<&'a RawValue>,
    #[serde(borrow, default, rename = "io.modelcontextprotocol/logLevel")]
    log_level: Option<&'a RawValue>,
    #[serde(borrow, default, rename = "progressToken")]
    progress: Option<&'a RawValue>,
}

/// Just enough of a body to choose its era: `id` and whether `params._meta` claims a version.
#[derive(Deserialize)]
struct Probe<'a> {
    #[serde(borrow, default)]
    id: Option<&'a RawValue>,
    #[serde(borrow, default)]
    params: Option<&'a RawValue>,
}

/// What [`probe`] learns of a body.
#[derive(Debug, Default)]
pub struct Probed {
    /// `params._meta` claims a protocol version.
    pub claims: bool,
    /// The `id` (a string or number), for an early refusal.
    pub id: Option<Value>,
}

/// Reads the era claim and id of a body without building it: a scan of borrowed members, which
/// allocates nothing for the bulk of the body.
pub fn probe(body: &[u8]) -> Probed {
    if crate::jsonrpc::too_deep(body, crate::jsonrpc::MAX_DEPTH) {
        return Probed::default();
    }
    let Some(p) = object::<Probe<'_>>(body) else {
        return Probed::default();
    };
    let claims = p
        .params
        .and_then(|raw| object::<Fields<'_>>(raw.get().as_bytes()))
        .and_then(|f| f.meta)
        .and_then(|raw| object::<Envelope<'_>>(raw.get().as_bytes()))
        .is_some_and(|e| e.version.is_some());
    Probed {
        claims,
        id: p.id.and_then(crate::jsonrpc::scalar),
    }
}

/// `bytes` as `T` when they are a JSON object (serde would also read a struct from an array).
fn object<'a, T: Deserialize<'a>>(bytes: &'a [u8]) -> Option<T> {
    let first = bytes.iter().find(|b| !b.is_ascii_whitespace())?;
    (*first == b'{')
        .then(|| serde_json::from_slice(bytes).ok())
        .flatten()
}

/// A validated modern request.
#[derive(Debug, Clone)]
pub struct Inbound {
    /// Its JSON-RPC id.
    pub id: Value,
    /// Its method.
    pub method: String,
    /// Its params (envelope included) as sent: a slice of the body (`{}` when it had none).
    params: Bytes,
    /// The declared client capabilities.
    pub caps: Value,
    /// `logLevel` as a rank (debug = 0), when the request opted in to log messages.
    pub log_level: Option<u8>,
    /// `_meta.progressToken`.
    pub progress: Option<Value>,
    /// Declares the tasks extension.
    pub tasks: bool,
    /// The caller's identity.
    pub identity: Option<Identity>,
    /// The caller, for upstream state (anonymous callers by address).
    pub who: Who,
    /// Who its upstream sessions, listens and tasks count against (`modern.max_per_identity`).
    pub owner: Owner,
    /// Its pool key.
    pub key: PoolKey,
}

impl Inbound {
    /// From `caller` (and with the pool key that goes with it).
    pub fn with_caller(mut self, caller: &Caller) -> Self {
        self.identity = caller.identity;
        self.who = Who::of(caller.identity, caller.peer);
        self.owner = caller.owner();
        self.key = PoolKey::new(self.who, &self.caps);
        self
    }

    /// The params, borrowed (validated: always a JSON object).
    pub fn params(&self) -> &RawValue {
        serde_json::from_slice(&self.params).unwrap_or_else(|_| empty_object())
    }

    /// The params members the face reads, borrowed.
    pub fn fields(&self) -> Fields<'_> {
        serde_json::from_slice(&self.params).unwrap_or_default()
    }

    /// `inputResponses`: `None` when absent, `Some(None)` when not an object.
    pub fn responses(&self) -> Option<Option<Responses>> {
        let raw = self.fields().input_responses?;
        Some(
            crate::jsonrpc::is_object(raw)
                .then(|| Responses::new(self.params.slice_ref(raw.get().as_bytes()))),
        )
    }

    /// `subscriptions/listen`'s `notifications` (all absent when it is not an object).
    pub fn wanted(&self) -> Wanted<'_> {
        self.fields()
            .notifications
            .and_then(|raw| object(raw.get().as_bytes()))
            .unwrap_or_default()
    }

    /// A params member that is a string (`name`, `uri`, `taskId`, …).
    pub fn string<'a>(
        &'a self,
        pick: impl FnOnce(&Fields<'a>) -> Option<&'a RawValue>,
    ) -> Option<String> {
        pick(&self.fields()).and_then(crate::jsonrpc::string)
    }
}

fn empty_object() -> &'static RawValue {
    serde_json::from_str("{}").expect("JSON")
}

/// What a valid modern POST carries.
#[derive(Debug)]
pub enum Checked {
    /// A request.
    Request(Box<Inbound>),
    /// A notification.
    Notification {
        /// Its method.
        method: String,
        /// `params.requestId`, when a string or number.
        request_id: Option<Value>,
    },
}

fn header<'a>(h: &'a http::HeaderMap, name: &str) -> Option<&'a str> {
    h.get(name)
        .map(|v| v.to_str().unwrap_or("\u{fffd}"))
        .map(|v| v.trim_matches(|c| c == ' ' || c == '\t'))
}

/// A header value as the client meant it: `=?base64?…?=` decoded.
pub fn decode_value(v: &str) -> Option<String> {
    match v
        .strip_prefix("=?base64?")
        .and_then(|r| r.strip_suffix("?="))
    {
        Some(b64) => String::from_utf8(base64_decode(b64)?).ok(),
        None => Some(v.to_string()),
    }
}

/// Standard or URL-safe base64, padding optional.
fn base64_decode(s: &str) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(s.len() * 3 / 4);
    let (mut acc, mut bits) = (0u32, 0u32);
    for c in s.bytes().filter(|c| *c != b'=') {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' | b'-' => 62,
            b'/' | b'_' => 63,
            _ => return None,
        };
        acc = (acc << 6) | u32::from(v);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
        }
    }
    Some(out)
}

/// The media checks the sessionful face also makes: `Content-Type: application/json` (else 415),
/// and an `Accept`, when present, that admits JSON or SSE (else 406).
pub fn media_refusal(h: &http::HeaderMap) -> Option<Refusal> {
    let json_body = header(h, "content-type")
        .and_then(|v| v.split(';').next())
        .is_some_and(|m| m.trim().eq_ignore_ascii_case("application/json"));
    if !json_body {
        return Some(Refusal::new(
            Answer::UnsupportedMediaType,
            "Unsupported Media Type: Content-Type must be application/json",
        ));
    }
    let accept: Vec<String> = h
        .get_all(http::header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|r| {
            r.split(';')
                .next()
                .unwrap_or("")
                .trim()
                .to_ascii_lowercase()
        })
        .collect();
    let ok = accept.is_empty()
        || accept.iter().any(|m| {
            matches!(
                m.as_str(),
                "application/json" | "text/event-stream" | "*/*" | "application/*" | "text/*"
            )
        });
    (!ok).then(|| {
        Refusal::new(
            Answer::NotAcceptable,
            "Not Acceptable: Accept must list application/json and text/event-stream",
        )
    })
}

/// Runs the ladder over a modern POST. `Err` carries the id to answer with and the refusal.
///
/// The body is never built as a tree: its members are read borrowed ([`RawMsg`], [`Fields`]),
/// nesting deeper than [`crate::jsonrpc::MAX_DEPTH`] is refused before any parse, and the params
/// stay the body's bytes.
pub fn validate(
    h: &http::HeaderMap,
    header_version: Option<&str>,
    body: &Bytes,
) -> Result<Checked, (Value, Refusal)> {
    let null = Value::Null;
    if crate::jsonrpc::too_deep(body, crate::jsonrpc::MAX_DEPTH) {
        let too_deep = crate::error::Error::TooDeep;
        return Err((null, Refusal::new(too_deep.answer(), too_deep.to_string())));
    }
    if serde_json::from_slice::<serde::de::IgnoredAny>(body).is_err() {
        return Err((
            null,
            Refusal::new(Answer::Parse, "Parse error: body is not JSON"),
        ));
    }
    let Some(m) = object::<RawMsg<'_>>(body) else {
        return Err((
            null,
            Refusal::new(Answer::InvalidRequest, "Invalid Request: the body must be one JSON-RPC request or notification (no batches, no repeated members)"),
        ));
    };
    let id =
        m.id.map(|i| crate::jsonrpc::scalar(i).filter(|v| !v.is_f64()));
    let id_ok = id.as_ref().is_none_or(Option::is_some);
    let id = id.map(|i| i.unwrap_or(Value::Null));
    let method = m.method.and_then(crate::jsonrpc::string);
    let jsonrpc = m.jsonrpc.and_then(crate::jsonrpc::string);
    let (Some(method), true, Some("2.0")) = (method, id_ok, jsonrpc.as_deref()) else {
        return Err((
            id.filter(|_| id_ok).unwrap_or(Value::Null),
            Refusal::new(
                Answer::InvalidRequest,
                "Invalid Request: not a JSON-RPC request or notification",
            ),
        ));
    };
    let method = method.as_str();
    let (params, fields) = match m.params {
        None => (Bytes::from_static(b"{}"), Fields::default()),
        Some(raw) => match object::<Fields<'_>>(raw.get().as_bytes()) {
            Some(f) => (body.slice_ref(raw.get().as_bytes()), f),
            None => {
                return Err((
                    id.unwrap_or(Value::Null),
                    Refusal::new(
                        Answer::InvalidParams,
                        "Invalid params: params must be an object (without repeated members)",
                    ),
                ))
            }
        },
    };
    let Some(id) = id else {
        // Notifications: no header or envelope requirements are defined for them.
        return Ok(Checked::Notification {
            method: method.to_string(),
            request_id: fields.request_id.and_then(crate::jsonrpc::scalar),
        });
    };
    let meta = fields
        .meta
        .filter(|raw| crate::jsonrpc::is_object(raw))
        .map(|raw| object::<Envelope<'_>>(raw.get().as_bytes()).unwrap_or_default());
    let claim = meta
        .as_ref()
        .and_then(|m| m.version)
        .and_then(crate::jsonrpc::string);
    let claim = claim.as_deref();
    let caps_raw = meta
        .as_ref()
        .and_then(|m| m.caps)
        .filter(|c| crate::jsonrpc::is_object(c));
    if caps_raw.is_some_and(|c| c.get().len() > MAX_CAPS_BYTES) {
        return Err((
            id,
            Refusal::new(
                Answer::InvalidParams,
                format!(
                    "Invalid params: _meta clientCapabilities larger than {MAX_CAPS_BYTES} bytes"
                ),
            ),
        ));
    }
    let caps = caps_raw.and_then(|c| serde_json::from_str::<Value>(c.get()).ok());
    let missing: Vec<&str> = [(claim.is_none(), META_VERSION), (caps.is_none(), META_CAPS)]
        .iter()
        .filter(|(m, _)| *m)
        .map(|(_, k)| *k)
        .collect();
    if !missing.is_empty() {
        let mut r = Refusal::new(
            Answer::InvalidParams,
            format!("Invalid params: _meta is missing {}", missing.join(", ")),
        );
        r.data = Some(json!({"missing": missing}));
        return Err((id, r));
    }
    let (claim, caps) = (claim.expect("checked"), caps.expect("checked"));
    match header_version {
        None => {
            return Err((
                id,
                Refusal::header("Header mismatch: the MCP-Protocol-Version header is required"),
            ))
        }
        Some(v) if v != claim => {
            return Err((
                id,
                Refusal::header(format!(
                    "Header mismatch: MCP-Protocol-Version {:?} does not match _meta protocolVersion {:?}",
                    crate::echo::clip(v),
                    crate::echo::clip(claim)
                )),
            ))
        }
        Some(_) => {}
    }
    if claim != MODERN_VERSION {
        return Err((id, unsupported(claim)));
    }
    if !METHODS.contains(&method) {
        return Err((
            id,
            Refusal::new(
                Answer::MethodNotFound,
                format!("Method not found: {}", crate::echo::clip(method)),
            ),
        ));
    }
    match header(h, "mcp-method") {
        None => {
            return Err((
                id,
                Refusal::header("Header mismatch: the Mcp-Method header is required"),
            ))
        }
        Some(v) if v != method => {
            return Err((
                id,
                Refusal::header(format!(
                    "Header mismatch: Mcp-Method {:?} does not match the body's method",
                    crate::echo::clip(v)
                )),
            ))
        }
        Some(_) => {}
    }
    let name_param = match method {
        "tools/call" | "prompts/get" => Some("name"),
        "resources/read" => Some("uri"),
        "tasks/get" | "tasks/update" | "tasks/cancel" => Some("taskId"),
        _ => None,
    };
    if let Some(p) = name_param {
        let raw = match p {
            "name" => fields.name,
            "uri" => fields.uri,
            _ => fields.task_id,
        };
        let Some(want) = raw.and_then(crate::jsonrpc::string) else {
            return Err((
                id,
                Refusal::new(
                    Answer::InBandInvalidParams,
                    format!("Invalid params: params.{p} is required"),
                ),
            ));
        };
        match header(h, "mcp-name").map(decode_value) {
            None => {
                return Err((
                    id,
                    Refusal::header("Header mismatch: the Mcp-Name header is required"),
                ))
            }
            Some(v) if v.as_deref() != Some(want.as_str()) => {
                return Err((
                    id,
                    Refusal::header(format!(
                        "Header mismatch: Mcp-Name does not match params.{p}"
                    )),
                ))
            }
            Some(_) => {}
        }
    }
    let tasks = caps
        .pointer("/extensions")
        .and_then(|e| e.get(TASKS_EXT))
        .is_some();
    if method.starts_with("tasks/") && !tasks {
        return Err((id, Refusal::missing_tasks()));
    }
    let meta = meta.expect("checked");
    let log_level = meta
        .log_level
        .and_then(crate::jsonrpc::string)
        .as_deref()
        .and_then(level_rank);
    let progress = meta.progress.and_then(crate::jsonrpc::scalar);
    Ok(Checked::Request(Box::new(Inbound {
        id,
        method: method.to_string(),
        key: PoolKey::new(Who::Anonymous(None), &caps),
        caps,
        params,
        log_level,
        progress,
        tasks,
        identity: None,
        who: Who::Anonymous(None),
        owner: Owner::Unknown,
    })))
}

fn unsupported(requested: &str) -> Refusal {
    Refusal {
        data: Some(json!({"supported": SERVED_VERSIONS, "requested": requested})),
        ..Refusal::new(
            Answer::UnsupportedVersion,
            format!(
                "Unsupported protocol version {:?} (supported: {})",
                crate::echo::clip(requested),
                SERVED_VERSIONS.join(", ")
            ),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::{HeaderMap, HeaderValue};

    fn hdrs(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(
                http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    fn env() -> Value {
        json!({META_VERSION: "2026-07-28", META_CAPS: {}})
    }

    fn check(h: &[(&str, &str)], body: Value) -> Result<Checked, (Value, Refusal)> {
        let h = hdrs(h);
        let hv = h
            .get("mcp-protocol-version")
            .map(|v| v.to_str().unwrap().to_string());
        validate(&h, hv.as_deref(), &Bytes::from(body.to_string()))
    }

    fn code(r: Result<Checked, (Value, Refusal)>) -> (u16, i64) {
        let (_, r) = r.expect_err("refused");
        (r.status().as_u16(), r.code())
    }

    #[test]
    fn the_ladder() {
        let v = ("mcp-protocol-version", "2026-07-28");
        let list =
            json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {"_meta": env()}});
        assert!(check(&[v, ("mcp-method", "tools/list")], list.clone()).is_ok());
        assert_eq!(code(check(&[v], list.clone())), (400, -32020));
        assert_eq!(
            code(check(&[v, ("mcp-method", "TOOLS/LIST")], list.clone())),
            (400, -32020)
        );
        assert_eq!(
            code(check(&[("mcp-method", "tools/list")], list.clone())),
            (400, -32020)
        );
        let other = [
            ("mcp-protocol-version", "2025-11-25"),
            ("mcp-method", "tools/list"),
        ];
        assert_eq!(code(check(&other, list)), (400, -32020));
        // No envelope under a modern header; an envelope without the capabilities.
        let bare = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"});
        assert_eq!(
            code(check(&[v, ("mcp-method", "tools/list")], bare)),
            (400, -32602)
        );
        let half = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list",
            "params": {"_meta": {META_VERSION: "2026-07-28"}}});
        assert_eq!(
            code(check(&[v, ("mcp-method", "tools/list")], half)),
            (400, -32602)
        );
        // Unknown versions.
        let v9 = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list",
            "params": {"_meta": {META_VERSION: "v999.0.0", META_CAPS: {}}}});
        let (_, r) = check(&[("mcp-protocol-version", "v999.0.0")], v9.clone()).unwrap_err();
        assert_eq!((r.status().as_u16(), r.code()), (400, -32022));
        assert_eq!(r.data.unwrap()["requested"], "v999.0.0");
        assert_eq!(code(check(&[v], v9)), (400, -32020));
        // Removed and unknown methods.
        for m in [
            "initialize",
            "ping",
            "logging/setLevel",
            "tasks/list",
            "foo/bar",
        ] {
            let b = json!({"jsonrpc": "2.0", "id": 1, "method": m, "params": {"_meta": env()}});
            assert_eq!(
                code(check(&[v, ("mcp-method", m)], b)),
                (404, -32601),
                "{m}"
            );
        }
        // Notifications need nothing.
        let n = json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": "listen:0"}});
        assert!(matches!(check(&[v], n), Ok(Checked::Notification { .. })));
        // Batches and responses.
        assert_eq!(code(check(&[v], json!([1]))), (400, -32600));
        assert_eq!(
            code(check(
                &[v],
                json!({"jsonrpc": "2.0", "id": 1, "result": {}})
            )),
            (400, -32600)
        );
    }

    #[test]
    fn bodies_are_read_without_a_tree() {
        let v = ("mcp-protocol-version", "2026-07-28");
        let m = ("mcp-method", "tools/list");
        let raw = |b: &str| {
            let h = hdrs(&[v, m]);
            validate(&h, Some("2026-07-28"), &Bytes::from(b.to_string()))
        };
        let deep = format!(
            r#"{{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{{"_meta":{{}},"x":{}{}}}}}"#,
            "[".repeat(70),
            "]".repeat(70)
        );
        let (_, r) = raw(&deep).unwrap_err();
        assert_eq!((r.status().as_u16(), r.code()), (400, -32600));
        assert!(r.message.contains("nested deeper than 64"), "{}", r.message);
        assert_eq!(code(raw("{\"jsonrpc\": ")), (400, -32700));
        // A repeated member the face reads is ambiguous: refused.
        let twice = r#"{"jsonrpc":"2.0","id":1,"id":2,"method":"tools/list"}"#;
        assert_eq!(code(raw(twice)), (400, -32600));
        // The params travel as sent: a slice of the body.
        let body = r#"{"jsonrpc":"2.0","id":"a","method":"tools/list","params":{"cursor":"c1",
            "_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28",
            "io.modelcontextprotocol/clientCapabilities":{"sampling":{}},"progressToken":5}}}"#;
        let Ok(Checked::Request(inb)) = raw(body) else {
            panic!("valid")
        };
        assert_eq!(inb.id, json!("a"));
        assert_eq!(inb.progress, Some(json!(5)));
        assert_eq!(inb.caps, json!({"sampling": {}}));
        assert!(inb.params().get().starts_with(r#"{"cursor":"c1""#));
        // Capabilities are bounded: they are parsed and kept in the pool key.
        let big = format!(
            r#"{{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{{"_meta":{{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{{"x":"{}"}}}}}}}}"#,
            "y".repeat(MAX_CAPS_BYTES)
        );
        assert_eq!(code(raw(&big)), (400, -32602));
    }

    #[test]
    fn probes_see_the_claim_only() {
        let p = probe(
            br#"{"id":7,"params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"x"}}}"#,
        );
        assert!(p.claims);
        assert_eq!(p.id, Some(json!(7)));
        assert!(!probe(br#"{"id":7,"params":{"_meta":{}}}"#).claims);
        assert!(
            !probe(br#"[{"params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"x"}}}]"#)
                .claims
        );
        assert!(!probe(b"not json").claims);
    }

    #[test]
    fn names() {
        let v = ("mcp-protocol-version", "2026-07-28");
        let call = |name: &str| {
            json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                "params": {"name": name, "arguments": {}, "_meta": env()}})
        };
        let m = ("mcp-method", "tools/call");
        assert!(check(&[v, m, ("mcp-name", "echo  ")], call("echo")).is_ok());
        assert_eq!(
            code(check(&[v, m, ("mcp-name", "wrong")], call("echo"))),
            (400, -32020)
        );
        assert_eq!(code(check(&[v, m], call("echo"))), (400, -32020));
        assert!(check(&[v, m, ("mcp-name", "=?base64?aMOpbGxv?=")], call("héllo")).is_ok());
        // Tasks methods need the extension declared.
        let get = json!({"jsonrpc": "2.0", "id": 1, "method": "tasks/get",
            "params": {"taskId": "t", "_meta": env()}});
        let (_, r) = check(&[v, ("mcp-method", "tasks/get"), ("mcp-name", "t")], get).unwrap_err();
        assert_eq!((r.status().as_u16(), r.code()), (400, -32021));
        assert_eq!(
            r.data.unwrap()["requiredCapabilities"]["extensions"][TASKS_EXT],
            json!({})
        );
    }

    #[test]
    fn base64_values() {
        assert_eq!(
            decode_value("=?base64?SGVsbG8sIOS4lueVjA==?=").unwrap(),
            "Hello, 世界"
        );
        assert_eq!(decode_value("plain").unwrap(), "plain");
        assert!(decode_value("=?base64?*?=").is_none());
    }
}
