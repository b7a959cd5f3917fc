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
        // Only the annotated members are looked at, borrowed: the rest of `arguments` (any size,
        // any shape) is skipped unparsed, so a call costs no tree of its arguments.
        let wanted: Vec<&str> = params.iter().map(|p| p.arg.as_str()).collect();
        let found = arguments
            .and_then(|a| members(a, &wanted))
            .unwrap_or_else(|| vec![None; wanted.len()]);
        for (p, body) in params.iter().zip(found) {
            let name = format!("mcp-param-{}", p.header.to_ascii_lowercase());
            let header = headers.get(&name).map(|v| v.as_bytes());
            let body = body.filter(|v| v.get() != "null");
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
fn expected(v: &RawValue) -> Option<String> {
    // Scalars only: an object or array (of any size) is never parsed, it just does not match.
    let raw = v.get();
    if !raw.starts_with(['"', '-', 't', 'f']) && !raw.starts_with(|c: char| c.is_ascii_digit()) {
        return None;
    }
    match serde_json::from_str::<Value>(raw).ok()? {
        Value::String(s) => Some(s),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

/// The values of the top-level members named `wanted` of the JSON object `raw`, borrowed, in
/// `wanted`'s order; every other member is skipped without being built. `None` when `raw` is not
/// an object.
fn members<'a>(raw: &'a RawValue, wanted: &[&str]) -> Option<Vec<Option<&'a RawValue>>> {
    use serde::de::{Deserializer as _, IgnoredAny, MapAccess, Visitor};

    struct Pick<'w>(&'w [&'w str]);

    impl<'de> Visitor<'de> for Pick<'_> {
        type Value = Vec<Option<&'de RawValue>>;

        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("an object")
        }

        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut out = vec![None; self.0.len()];
            // One key at a time (a key with escapes is unescaped into this one buffer's worth).
            while let Some(key) = map.next_key::<String>()? {
                match self.0.iter().position(|w| *w == key) {
                    Some(i) => out[i] = Some(map.next_value::<&'de RawValue>()?),
                    None => {
                        map.next_value::<IgnoredAny>()?;
                    }
                }
            }
            Ok(out)
        }
    }

    let mut de = serde_json::Deserializer::from_str(raw.get());
    de.deserialize_map(Pick(wanted)).ok()
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
        assert_eq!(
            (e.status().as_u16(), e.code()),
            (400, -32020),
            "missing header"
        );
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
