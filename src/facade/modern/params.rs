//! `Mcp-Param-*` headers (SEP-2243): a tool may mark string, integer and boolean arguments with
//! `x-mcp-header: <Name>` in its `inputSchema`; a 2026-07-28 client then mirrors each such argument
//! of a `tools/call` into the header `Mcp-Param-<Name>` (plain ASCII as it is, anything else as
//! `=?base64?<standard Base64>?=`), so that intermediaries can route on it. The server must check
//! the header against the body: missing while the argument is there, undecodable, or different
//! is 400 `-32020` HeaderMismatch.
//!
//! The legacy upstream knows nothing of this, so the proxy checks it. It learns the annotations
//! from the `tools/list` results it relays (the newest listing of each tool wins); a tool it has
//! never seen listed is not checked.

use std::collections::HashMap;
use std::sync::Mutex;

use base64::Engine as _;
use http::HeaderMap;
use serde_json::value::RawValue;
use serde_json::Value;

use super::wire::Refusal;

/// The most annotated tools remembered (a listing beyond it is not learnt, and not checked).
const MAX_TOOLS: usize = 4096;

/// An argument mirrored into a header.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Param {
    /// The argument's name.
    arg: String,
    /// `<Name>` of `Mcp-Param-<Name>`.
    header: String,
}

/// The annotations learnt from `tools/list`, by tool name.
#[derive(Debug, Default)]
pub struct HeaderParams {
    tools: Mutex<HashMap<String, Vec<Param>>>,
}

impl HeaderParams {
    /// Learns the annotated arguments of every tool in a `tools/list` result.
    pub fn learn(&self, result: &Value) {
        let Some(tools) = result.get("tools").and_then(Value::as_array) else {
            return;
        };
        let mut known = self.tools.lock().unwrap_or_else(|e| e.into_inner());
        for t in tools {
            let Some(name) = t.get("name").and_then(Value::as_str) else {
                continue;
            };
            let params: Vec<Param> = t
                .pointer("/inputSchema/properties")
                .and_then(Value::as_object)
                .into_iter()
                .flatten()
                .filter_map(|(arg, schema)| {
                    let header = schema.get("x-mcp-header")?.as_str()?;
                    valid_name(header).then(|| Param {
                        arg: arg.clone(),
                        header: header.to_string(),
                    })
                })
                .collect();
            if params.is_empty() {
                known.remove(name);
            } else if known.len() < MAX_TOOLS || known.contains_key(name) {
                known.insert(name.to_string(), params);
            }
        }
    }

    /// Checks the `Mcp-Param-*` headers of a `tools/call` of `tool` with `arguments`.
    ///
    /// # Errors
    /// 400 `-32020` naming the header at fault.
    pub fn check(
        &self,
        tool: &str,
        arguments: Option<&RawValue>,
        headers: &HeaderMap,
    ) -> Result<(), Refusal> {
        let params = match self
            .tools
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(tool)
        {
            Some(p) => p.clone(),
            None => return Ok(()),
        };
        let args: Value = arguments
            .and_then(|a| serde_json::from_str(a.get()).ok())
            .unwrap_or(Value::Null);
        for p in &params {
            let name = format!("mcp-param-{}", p.header.to_ascii_lowercase());
            let header = headers.get(&name).map(|v| v.as_bytes());
            let body = args.get(&p.arg).filter(|v| !v.is_null());
            match (header, body) {
                (None, None) => {}
                (None, Some(_)) => {
                    return Err(Refusal::header(format!(
                        "Header mismatch: Mcp-Param-{} is required (argument {} is in the body)",
                        p.header, p.arg
                    )))
                }
                (Some(_), None) => {
                    return Err(Refusal::header(format!(
                        "Header mismatch: Mcp-Param-{} is sent but argument {} is not",
                        p.header, p.arg
                    )))
                }
                (Some(h), Some(v)) => {
                    let Some(got) = decode(h) else {
                        return Err(Refusal::header(format!(
                            "Header mismatch: Mcp-Param-{} is not valid (Base64 or characters)",
                            p.header
                        )));
                    };
                    if Some(got) != expected(v) {
                        return Err(Refusal::header(format!(
                            "Header mismatch: Mcp-Param-{} does not match argument {}",
                            p.header, p.arg
                        )));
                    }
                }
            }
        }
        Ok(())
    }
}

/// An `x-mcp-header` name usable in a header name: non-empty visible ASCII token characters.
fn valid_name(n: &str) -> bool {
    !n.is_empty()
        && n.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

/// A header value's meaning: `=?base64?…?=` decoded (standard alphabet, padded, UTF-8), anything
/// else as it is with surrounding spaces and tabs removed. `None`: undecodable.
fn decode(raw: &[u8]) -> Option<String> {
    let v = std::str::from_utf8(raw).ok()?.trim_matches([' ', '\t']);
    match v
        .strip_prefix("=?base64?")
        .and_then(|r| r.strip_suffix("?="))
    {
        Some(b64) => {
            let bytes = base64::engine::general_purpose::STANDARD.decode(b64).ok()?;
            String::from_utf8(bytes).ok()
        }
        None => Some(v.to_string()),
    }
}

/// The header text an argument value is mirrored as.
fn expected(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;
    use serde_json::json;

    fn params() -> HeaderParams {
        let p = HeaderParams::default();
        p.learn(
            &json!({"tools": [{"name": "t", "inputSchema": {"type": "object", "properties": {
            "region": {"type": "string", "x-mcp-header": "Region"},
            "priority": {"type": "integer", "x-mcp-header": "Priority"},
            "query": {"type": "string"}}}}]}),
        );
        p
    }

    fn check(p: &HeaderParams, args: &str, h: &[(&str, &str)]) -> Result<(), Refusal> {
        let mut m = HeaderMap::new();
        for (k, v) in h {
            m.insert(
                http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        let a: Box<RawValue> = serde_json::from_str(args).unwrap();
        p.check("t", Some(&a), &m)
    }

    #[test]
    fn mirrored_arguments_must_match() {
        let p = params();
        let ok = r#"{"region": "Hello", "priority": 3, "query": "q"}"#;
        assert!(check(
            &p,
            ok,
            &[("mcp-param-region", "Hello"), ("Mcp-Param-Priority", "3")]
        )
        .is_ok());
        // Base64, and spaces around a literal.
        assert!(check(
            &p,
            ok,
            &[
                ("mcp-param-region", "=?base64?SGVsbG8=?="),
                ("mcp-param-priority", " 3 ")
            ]
        )
        .is_ok());
        let e = check(&p, ok, &[("mcp-param-priority", "3")]).unwrap_err();
        assert_eq!((e.status, e.code), (400, -32020), "missing header");
        for bad in ["=?base64?SGVsbG8?=", "=?base64?SGVs!!!bG8=?=", "Bye"] {
            let e = check(
                &p,
                ok,
                &[("mcp-param-region", bad), ("mcp-param-priority", "3")],
            );
            assert!(e.is_err(), "{bad}");
        }
        // Without the suffix it is a literal.
        let lit = r#"{"region": "=?base64?SGVsbG8=", "priority": 3}"#;
        assert!(check(
            &p,
            lit,
            &[
                ("mcp-param-region", "=?base64?SGVsbG8="),
                ("mcp-param-priority", "3")
            ]
        )
        .is_ok());
        // An absent argument needs no header; a header without the argument is refused.
        assert!(check(&p, r#"{"region": "x"}"#, &[("mcp-param-region", "x")]).is_ok());
        assert!(check(&p, r#"{}"#, &[("mcp-param-region", "x")]).is_err());
        // Unannotated arguments and unknown tools are not checked.
        let m = HeaderMap::new();
        assert!(p.check("other", None, &m).is_ok());
        // A relisting without annotations forgets them.
        p.learn(&json!({"tools": [{"name": "t", "inputSchema": {"type": "object"}}]}));
        assert!(check(&p, ok, &[]).is_ok());
    }
}
