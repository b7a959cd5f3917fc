//! The HTTP faces' header parsers: `Origin`, `Host`, `Accept`, `Content-Type`,
//! `MCP-Protocol-Version`, `Mcp-Method` / `Mcp-Name` (with their `=?base64?…?=` form), the query
//! string, the identity headers, and the 2026-07-28 validation ladder over headers and body.
//! (`Last-Event-ID` and `Mcp-Session-Id` are the `cursor` target's grammar.)
//!
//! Input: arbitrary headers (names from the set the proxy reads, plus one it ignores), origin and
//! host allowlists, a query string, a body and a text to encode. Checks:
//! * nothing panics on any header value, valid UTF-8 or not;
//! * `parse_origin` is idempotent (a normalised origin parses to itself) and yields
//!   `http[s]://host:port`; a configured origin admits its own text as an `Origin` header;
//! * `host_allowed` admits a listed host on any port and admits nothing that is not a listed
//!   host, optionally followed by `:digits`; an empty list admits nothing;
//! * `decode_value` undoes base64 in all four spellings (standard or URL-safe, padded or not) and
//!   leaves other values as they are;
//! * the two faces agree on what a JSON body is: the legacy `is_json_content` is true exactly when
//!   the modern `media_refusal` does not answer 415;
//! * `version_header` answers `None` only without the header and `Some` only with a served
//!   version; `accepts` is false without `Accept`;
//! * `query_param` only returns a value that stands after `name=` in one of the query's pairs;
//! * the identity depends on the identity headers only: deterministic, absent without them,
//!   unchanged by other headers;
//! * a request the modern ladder accepts agrees with its headers: `MCP-Protocol-Version` is
//!   2026-07-28, `Mcp-Method` is the body's method, and `Mcp-Name` (decoded) names the body's
//!   tool, prompt, resource or task.
#![no_main]

use arbitrary::Arbitrary;
use http::{HeaderMap, HeaderName, HeaderValue};
use libfuzzer_sys::fuzz_target;
use mcp_resume_proxy::headers::{
    accepts, decode_value, host_allowed, is_json_content, media_refusal, origin_allowed,
    parse_origin, query_param, validate, version_header, Checked, SUPPORTED_VERSIONS,
};
use mcp_resume_proxy::identity::{AuthConfig, Keyring};

const NAMES: [&str; 10] = [
    "origin",
    "host",
    "accept",
    "content-type",
    "mcp-protocol-version",
    "mcp-method",
    "mcp-name",
    "authorization",
    "x-api-key",
    "x-unrelated",
];
#[derive(Arbitrary, Debug)]
struct Input<'a> {
    headers: Vec<(u8, &'a [u8])>,
    origins: Vec<&'a str>,
    hosts: Vec<&'a str>,
    host: &'a str,
    query: &'a str,
    name: &'a str,
    plain: &'a str,
    spelling: u8,
    body: &'a [u8],
}

fuzz_target!(|input: Input<'_>| {
    let mut h = HeaderMap::new();
    for (sel, value) in &input.headers {
        let name = HeaderName::from_static(NAMES[usize::from(*sel) % NAMES.len()]);
        if let Ok(v) = HeaderValue::from_bytes(value) {
            h.append(name, v);
        }
    }

    origins(&input.origins);
    hosts(&input.hosts, input.host);
    base64(input.plain, input.spelling);
    media(&h);
    query(input.query, input.name);
    identity(&h);
    modern(&h, input.body);
});

fn origins(list: &[&str]) {
    let mut allowed = Vec::new();
    for o in list {
        let Ok(n) = parse_origin(o) else { continue };
        assert_eq!(
            parse_origin(&n).as_ref(),
            Ok(&n),
            "normalising is idempotent"
        );
        let (scheme, rest) = n.split_once("://").expect("a scheme");
        assert!(scheme == "http" || scheme == "https", "{n}");
        let (_, port) = rest.rsplit_once(':').expect("a port is always spelled out");
        assert!(port.parse::<u16>().is_ok(), "{n}");
        allowed.push(n);
    }
    for o in list {
        if let (Ok(_), Ok(v)) = (parse_origin(o), HeaderValue::from_str(o)) {
            assert!(
                origin_allowed(&allowed, &v),
                "a configured origin admits itself: {o:?}"
            );
        }
        if let Ok(v) = HeaderValue::from_str(o) {
            assert!(!origin_allowed(&[], &v));
        }
    }
}

fn hosts(list: &[&str], host: &str) {
    let list: Vec<String> = list.iter().map(|h| h.to_ascii_lowercase()).collect();
    let host = host.to_ascii_lowercase();
    assert!(!host_allowed(&[], &host));
    if host_allowed(&list, &host) {
        let listed = list.iter().any(|a| {
            host.strip_prefix(a.as_str()).is_some_and(|rest| {
                rest.is_empty()
                    || rest
                        .strip_prefix(':')
                        .is_some_and(|p| p.bytes().all(|b| b.is_ascii_digit()))
            })
        });
        assert!(listed, "{host:?} admitted by {list:?}");
    }
    for a in &list {
        assert!(host_allowed(&list, a));
        if !a.is_empty() {
            assert!(
                host_allowed(&list, &format!("{a}:8080")),
                "{a:?} on any port"
            );
        }
    }
}

fn base64(plain: &str, spelling: u8) {
    const STD: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let url_safe = spelling & 1 == 1;
    let padded = spelling & 2 == 2;
    let mut enc = String::new();
    for chunk in plain.as_bytes().chunks(3) {
        let n = chunk.len();
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let v = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..=n {
            let c = STD[((v >> (18 - 6 * i)) & 63) as usize];
            enc.push(match (url_safe, c) {
                (true, b'+') => '-',
                (true, b'/') => '_',
                _ => char::from(c),
            });
        }
        if padded {
            enc.push_str(&"=".repeat(3 - n));
        }
    }
    assert_eq!(
        decode_value(&format!("=?base64?{enc}?=")).as_deref(),
        Some(plain),
        "{enc:?}"
    );
    if !(plain.starts_with("=?base64?") && plain.ends_with("?=")) {
        assert_eq!(decode_value(plain).as_deref(), Some(plain));
    }
}

fn media(h: &HeaderMap) {
    let refusal = media_refusal(h);
    let is_415 = refusal.as_ref().is_some_and(|r| r.status() == 415);
    assert_eq!(
        is_json_content(h),
        !is_415,
        "the faces agree on JSON bodies"
    );
    if let Some(r) = &refusal {
        assert!(r.status() == 415 || r.status() == 406, "{}", r.status());
    }
    if h.get("accept").is_none() {
        assert!(!accepts(h, "application/json"));
        assert!(!accepts(h, "text/event-stream"));
    }
    match version_header(h) {
        Ok(None) => assert!(h.get("mcp-protocol-version").is_none()),
        Ok(Some(v)) => {
            assert!(h.get("mcp-protocol-version").is_some());
            assert!(SUPPORTED_VERSIONS.contains(&v.as_str()), "{v:?}");
        }
        Err(_) => assert!(h.get("mcp-protocol-version").is_some()),
    }
}

fn query(q: &str, name: &str) {
    if let Some(v) = query_param(Some(q), name) {
        let pair = format!("{name}={v}");
        assert!(
            q.split('&')
                .any(|kv| kv == pair || (v.is_empty() && kv == name)),
            "{v:?} for {name:?} in {q:?}"
        );
    }
    assert_eq!(query_param(None, name), None);
}

fn identity(h: &HeaderMap) {
    let keys = Keyring::for_tests();
    let cfg = AuthConfig {
        identity_headers: vec!["authorization".into(), "X-Api-Key".into()],
        ..AuthConfig::default()
    };
    let id = keys.identity(&cfg, h, None);
    let has = h.contains_key("authorization") || h.contains_key("x-api-key");
    assert_eq!(
        id.is_some(),
        has,
        "an identity exactly when an identity header is there"
    );
    let again = keys.identity(&cfg, h, None);
    assert_eq!(id.is_some(), again.is_some());
    if let (Some(a), Some(b)) = (&id, &again) {
        assert!(a.matches(b), "deterministic");
    }
    let mut other = h.clone();
    other.remove("x-unrelated");
    other.append("x-unrelated", HeaderValue::from_static("noise"));
    other.remove("host");
    let unrelated = keys.identity(&cfg, &other, None);
    match (&id, &unrelated) {
        (Some(a), Some(b)) => assert!(a.matches(b), "other headers do not change it"),
        (None, None) => {}
        _ => panic!("other headers changed whether there is an identity"),
    }
    // A certificate alone is an identity too, and a different one from the headers alone.
    let cert = [9u8; 32];
    let with_cert = keys
        .identity(&cfg, h, Some(&cert))
        .expect("a certificate identifies");
    if let Some(a) = &id {
        assert!(!a.matches(&with_cert));
    }
}

fn modern(h: &HeaderMap, body: &[u8]) {
    let trimmed = |name: &str| {
        h.get(name)
            .map(|v| v.to_str().unwrap_or("\u{fffd}"))
            .map(|v| v.trim_matches(|c| c == ' ' || c == '\t').to_string())
    };
    let version = trimmed("mcp-protocol-version");
    let body = bytes::Bytes::copy_from_slice(body);
    let Ok(Checked::Request(inb)) = validate(h, version.as_deref(), &body) else {
        return;
    };
    assert_eq!(version.as_deref(), Some("2026-07-28"));
    assert_eq!(trimmed("mcp-method").as_deref(), Some(inb.method.as_str()));
    let name_param = match inb.method.as_str() {
        "tools/call" | "prompts/get" => Some("name"),
        "resources/read" => Some("uri"),
        "tasks/get" | "tasks/update" | "tasks/cancel" => Some("taskId"),
        _ => None,
    };
    if let Some(p) = name_param {
        let params: serde_json::Value = serde_json::from_str(inb.params().get()).expect("JSON");
        let want = params.get(p).and_then(|v| v.as_str()).expect("named");
        let got = trimmed("mcp-name").and_then(|v| decode_value(&v));
        assert_eq!(got.as_deref(), Some(want));
    }
    if inb.method.starts_with("tasks/") {
        assert!(inb.tasks, "tasks/* needs the extension");
    }
}
