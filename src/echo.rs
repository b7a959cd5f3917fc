//! Client-supplied values the proxy echoes back — in a response body or a log line — are cut to
//! [`MAX_ECHO`] bytes first (design.md §10 "Limits hold under concurrency and abuse"): a 300 KiB
//! `Last-Event-ID` must not come back twice in a 600 KB refusal or fill a 300 KB warn line.
//!
//! [`clip`] is the one helper for text (`Last-Event-ID`, `Origin`, header values, session ids as
//! sent); [`json_id`] applies it to a JSON-RPC id written into an error body, keeping the JSON valid.

use std::borrow::Cow;

/// Most bytes of one client-supplied value echoed in a response or a log line.
pub const MAX_ECHO: usize = 256;

/// `s` cut to at most [`MAX_ECHO`] bytes, at a character boundary (no allocation).
pub fn clip(s: &str) -> &str {
    if s.len() <= MAX_ECHO {
        return s;
    }
    let mut end = MAX_ECHO;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// A JSON-RPC id (compact JSON text, as [`crate::jsonrpc::Peek`] holds it) fit to echo in an
/// error body: unchanged when short; a long string id is cut to [`MAX_ECHO`] bytes of its text
/// (still a string, so the body stays valid JSON); any other long id becomes `null`, JSON-RPC's
/// id for "could not be determined".
pub fn json_id(id: &str) -> Cow<'_, str> {
    if id.len() <= MAX_ECHO {
        return Cow::Borrowed(id);
    }
    match serde_json::from_str::<serde_json::Value>(id) {
        Ok(serde_json::Value::String(s)) => {
            Cow::Owned(serde_json::Value::String(clip(&s).to_string()).to_string())
        }
        _ => Cow::Borrowed("null"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_values_pass_unchanged() {
        assert_eq!(clip(""), "");
        assert_eq!(clip("abc"), "abc");
        let exact = "x".repeat(MAX_ECHO);
        assert_eq!(clip(&exact), exact);
        assert_eq!(json_id("7"), "7");
        assert_eq!(json_id("\"a b\""), "\"a b\"");
    }

    #[test]
    fn long_values_are_cut_at_a_char_boundary() {
        let long = "y".repeat(300 * 1024);
        assert_eq!(clip(&long).len(), MAX_ECHO);
        // A 2-byte character straddling the limit is left out whole.
        let s = format!("{}é{}", "a".repeat(MAX_ECHO - 1), "b".repeat(10));
        assert_eq!(clip(&s), "a".repeat(MAX_ECHO - 1));
    }

    #[test]
    fn long_ids_stay_json() {
        let id = serde_json::Value::String("z".repeat(10_000)).to_string();
        let cut = json_id(&id);
        let v: serde_json::Value = serde_json::from_str(&cut).unwrap();
        assert_eq!(v.as_str().unwrap().len(), MAX_ECHO);
        let big_number = "9".repeat(1000);
        assert_eq!(json_id(&big_number), "null");
    }
}
