//! The JSON-RPC envelope peek and the id recovery of oversized messages.
//!
//! Input: `split (1) ‖ bytes`. Checks:
//! * `peek` (a byte scanner, serde_json where the scanner is not sure) gives exactly the answer
//!   of `peek_serde` (serde_json alone, the definition) on any bytes;
//! * `peek` never panics; when it sees a request or a response with an id, that id (and any
//!   progress token) is canonical JSON: one JSON value that is its own canonical form
//!   (`jsonrpc::canonical_text`: `Value`'s text, or as sent for what `Value` cannot hold exactly),
//!   so the same id from a client and from a server compares equal as a string;
//! * `scan_id(head, tail)` (the bytes split at the first byte's position) never panics, and what
//!   it returns is the canonical form of a string or number that follows an `"id"` key in `head`
//!   or `tail` — never an id that is not in the input.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mcp_resume_proxy::jsonrpc::{canonical_text, peek, peek_serde, scan_id};
use serde_json::value::RawValue;
use serde_json::Value;

fuzz_target!(|input: &[u8]| {
    let peeked = peek(input);
    assert_eq!(peeked, peek_serde(input), "the scanner disagrees with serde");
    if let Some(p) = peeked {
        if p.is_request() || (p.is_response && p.id.is_some()) {
            assert_canonical(p.id.as_deref().expect("an id"));
        }
        if let Some(t) = &p.progress_token {
            assert_canonical(t);
        }
    }
    let Some((&split, rest)) = input.split_first() else {
        return;
    };
    let at = usize::from(split) * rest.len() / 256;
    let (head, tail) = rest.split_at(at);
    if let Some(id) = scan_id(head, tail) {
        let v: Value = serde_json::from_str(&id).expect("scan_id returns JSON");
        assert!(v.is_string() || v.is_number(), "{id}");
        assert_eq!(canonical_text(&id), id, "canonical");
        assert!(
            follows_id_key(head, &id) || follows_id_key(tail, &id),
            "{id} is not an id in the input"
        );
    }
});

fn assert_canonical(text: &str) {
    // Its own canonical form (`Value`'s text where `Value` holds it exactly; arrays, objects and
    // what `Value` cannot hold exactly as sent), and exactly one JSON value.
    assert_eq!(canonical_text(text), text, "not canonical");
    assert!(
        serde_json::from_str::<&RawValue>(text).is_ok(),
        "{text:?} is not JSON"
    );
}

/// Whether some `"id"` key in `part` (read as lossy UTF-8, as `scan_id` does) is followed by a
/// `:` and a JSON value whose canonical form is `id`.
fn follows_id_key(part: &[u8], id: &str) -> bool {
    let text = String::from_utf8_lossy(part);
    text.match_indices("\"id\"").any(|(pos, _)| {
        let Some(rest) = text[pos + 4..].trim_start().strip_prefix(':') else {
            return false;
        };
        let rest = rest.trim_start();
        // Escapes make a string's raw text at most 6 times longer than its canonical text; a
        // number's raw text can be any run of digits (canonical: 4.44444e+88).
        let number = rest
            .bytes()
            .take_while(|b| b.is_ascii_digit() || b"+-.eE".contains(b))
            .count();
        let bound = (6 * id.len() + 16).max(number);
        rest.char_indices()
            .map(|(i, c)| i + c.len_utf8())
            .take_while(|&end| end <= bound)
            .any(|end| {
                serde_json::from_str::<&RawValue>(&rest[..end])
                    .is_ok_and(|raw| canonical_text(raw.get()) == id)
            })
    })
}
