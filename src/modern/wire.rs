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
//! `Mcp-Param-*` headers are not checked: a legacy upstream's tools declare no `x-mcp-header`.

use serde_json::{json, Map, Value};

use super::pool::PoolKey;
use super::{level_rank, MODERN_VERSION, SERVED_VERSIONS, TASKS_EXT};
use crate::identity::Identity;

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

/// A protocol-level refusal: HTTP status and JSON-RPC error.
#[derive(Debug, Clone, PartialEq)]
pub struct Refusal {
    /// HTTP status.
    pub status: u16,
    /// JSON-RPC code.
    pub code: i64,
    /// Message.
    pub message: String,
    /// `error.data`.
    pub data: Option<Value>,
}

impl Refusal {
    fn new(status: u16, code: i64, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into(),
            data: None,
        }
    }

    fn header(message: impl Into<String>) -> Self {
        Self::new(400, -32020, message)
    }

    /// 400 `-32021`: the request needs the tasks extension, which it did not declare.
    pub fn missing_tasks() -> Self {
        Self {
            data: Some(json!({"requiredCapabilities": {"extensions": {TASKS_EXT: {}}}})),
            ..Self::new(
                400,
                -32021,
                "Missing required client capability: extensions[\"io.modelcontextprotocol/tasks\"]",
            )
        }
    }
}

/// A validated modern request.
#[derive(Debug, Clone)]
pub struct Inbound {
    /// Its JSON-RPC id.
    pub id: Value,
    /// Its method.
    pub method: String,
    /// Its params (envelope included).
    pub params: Map<String, Value>,
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
    /// Its pool key.
    pub key: PoolKey,
}

impl Inbound {
    /// With the caller's identity (and the pool key that goes with it).
    pub fn with_identity(mut self, identity: Option<Identity>) -> Self {
        self.identity = identity;
        self.key = PoolKey::new(identity, &self.caps);
        self
    }
}

/// What a valid modern POST carries.
#[derive(Debug)]
pub enum Checked {
    /// A request.
    Request(Inbound),
    /// A notification.
    Notification {
        /// Its method.
        method: String,
        /// Its params.
        params: Value,
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
            415,
            -32600,
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
            406,
            -32600,
            "Not Acceptable: Accept must list application/json and text/event-stream",
        )
    })
}

/// Runs the ladder over a modern POST. `Err` carries the id to answer with and the refusal.
pub fn validate(
    h: &http::HeaderMap,
    header_version: Option<&str>,
    body: Result<Value, serde_json::Error>,
) -> Result<Checked, (Value, Refusal)> {
    let null = Value::Null;
    let Ok(msg) = body else {
        return Err((
            null,
            Refusal::new(400, -32700, "Parse error: body is not JSON"),
        ));
    };
    let Some(m) = msg.as_object() else {
        return Err((
            null,
            Refusal::new(400, -32600, "Invalid Request: the body must be one JSON-RPC request or notification (no batches)"),
        ));
    };
    let id = m.get("id").cloned();
    let id_ok = id
        .as_ref()
        .is_none_or(|i| i.is_string() || i.is_i64() || i.is_u64());
    let method = m.get("method").and_then(Value::as_str);
    let (Some(method), true, Some("2.0")) =
        (method, id_ok, m.get("jsonrpc").and_then(Value::as_str))
    else {
        return Err((
            id.filter(|_| id_ok).unwrap_or(Value::Null),
            Refusal::new(
                400,
                -32600,
                "Invalid Request: not a JSON-RPC request or notification",
            ),
        ));
    };
    let params = match m.get("params") {
        None => Map::new(),
        Some(Value::Object(p)) => p.clone(),
        Some(_) => {
            return Err((
                id.unwrap_or(Value::Null),
                Refusal::new(400, -32602, "Invalid params: params must be an object"),
            ))
        }
    };
    let Some(id) = id else {
        // Notifications: no header or envelope requirements are defined for them.
        return Ok(Checked::Notification {
            method: method.to_string(),
            params: Value::Object(params),
        });
    };
    let meta = params.get("_meta").and_then(Value::as_object);
    let claim = meta
        .and_then(|m| m.get(META_VERSION))
        .and_then(Value::as_str);
    let caps = meta
        .and_then(|m| m.get(META_CAPS))
        .filter(|c| c.is_object())
        .cloned();
    if claim.is_none() && header_version.is_none_or(|v| v != MODERN_VERSION) {
        // Modern only by a header that names no version this endpoint speaks.
        return Err((id, unsupported(header_version.unwrap_or(""))));
    }
    let missing: Vec<&str> = [(claim.is_none(), META_VERSION), (caps.is_none(), META_CAPS)]
        .iter()
        .filter(|(m, _)| *m)
        .map(|(_, k)| *k)
        .collect();
    if !missing.is_empty() {
        let mut r = Refusal::new(
            400,
            -32602,
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
                404,
                -32601,
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
        let Some(want) = params.get(p).and_then(Value::as_str) else {
            return Err((
                id,
                Refusal::new(
                    200,
                    -32602,
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
            Some(v) if v.as_deref() != Some(want) => {
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
        .get(META_LOG_LEVEL)
        .and_then(Value::as_str)
        .and_then(level_rank);
    let progress = meta
        .get("progressToken")
        .filter(|t| t.is_string() || t.is_number())
        .cloned();
    Ok(Checked::Request(Inbound {
        id,
        method: method.to_string(),
        key: PoolKey::new(None, &caps),
        caps,
        params,
        log_level,
        progress,
        tasks,
        identity: None,
    }))
}

fn unsupported(requested: &str) -> Refusal {
    Refusal {
        data: Some(json!({"supported": SERVED_VERSIONS, "requested": requested})),
        ..Refusal::new(
            400,
            -32022,
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
        validate(&h, hv.as_deref(), Ok(body))
    }

    fn code(r: Result<Checked, (Value, Refusal)>) -> (u16, i64) {
        let (_, r) = r.expect_err("refused");
        (r.status, r.code)
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
        assert_eq!((r.status, r.code), (400, -32022));
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
        assert_eq!((r.status, r.code), (400, -32021));
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
