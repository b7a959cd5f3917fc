use proptest::prelude::*;

use crate::jsonrpc::{peek, peek_fast, peek_serde, Peek};

/// serde's answer, after checking that the scanner (when it answers) and `peek` give it too.
fn agreed(input: &[u8]) -> Option<Peek> {
    let serde = peek_serde(input);
    if let Some(fast) = peek_fast(input) {
        assert_eq!(
            Some(fast),
            serde,
            "scanner on {:?}",
            String::from_utf8_lossy(input)
        );
    }
    assert_eq!(peek(input), serde);
    serde
}

/// Like [`agreed`], and the scanner answered itself.
fn fast(input: &[u8]) -> Option<Peek> {
    assert!(
        peek_fast(input).is_some(),
        "left to serde: {:?}",
        String::from_utf8_lossy(input)
    );
    agreed(input)
}

/// Like [`agreed`], and the scanner left it to serde.
fn slow(input: &[u8]) -> Option<Peek> {
    assert!(
        peek_fast(input).is_none(),
        "answered: {:?}",
        String::from_utf8_lossy(input)
    );
    agreed(input)
}

fn p(id: Option<&str>, method: Option<&str>, is_response: bool, token: Option<&str>) -> Peek {
    Peek {
        id: id.map(str::to_owned),
        method: method.map(|m| m.to_owned().into()),
        is_response,
        progress_token: token.map(str::to_owned),
    }
}

#[test]
fn common_messages_take_the_fast_path() {
    assert_eq!(
        fast(br#"{"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info","data":{"a":[1,2.5e-3,true,false,null,"x\"y\u00e9\n"]}}}"#),
        Some(p(None, Some("notifications/message"), false, None))
    );
    assert_eq!(
        fast(br#"{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":"t-1","progress":5,"total":10}}"#),
        Some(p(None, Some("notifications/progress"), false, Some("\"t-1\"")))
    );
    assert_eq!(
        fast(br#"{"jsonrpc":"2.0","id":7,"method":"sampling/createMessage","params":{"_meta":{"progressToken":42},"messages":[]}}"#),
        Some(p(Some("7"), Some("sampling/createMessage"), false, Some("42")))
    );
    assert_eq!(
        fast(br#"{"result":{"content":[{"type":"text","text":"h\u00e9llo \ud83d\ude00"}]},"jsonrpc":"2.0","id":"r-1"}"#),
        Some(p(Some("\"r-1\""), None, true, None))
    );
    assert_eq!(
        fast(br#"{"jsonrpc":"2.0","id":3,"error":{"code":-32601,"message":"nope"}}"#),
        Some(p(Some("3"), None, true, None))
    );
    assert_eq!(fast(b"{}"), Some(Peek::default()));
    assert_eq!(
        fast("{\"x\":\"h\u{e9} \u{1F600}\"}".as_bytes()),
        Some(Peek::default())
    );
}

#[test]
fn whitespace_anywhere() {
    let spaced = b" \t\r\n{ \"id\" \n: \t1 ,\r\"method\"  :  \"x\" , \"params\" : { \"_meta\" : { \"progressToken\" : \"t\" } } } \n";
    assert_eq!(
        fast(spaced),
        Some(p(Some("1"), Some("x"), false, Some("\"t\"")))
    );
    // Only serde_json's four bytes are whitespace.
    assert_eq!(slow(b"{\"id\":1}\x0c"), None);
    assert_eq!(slow(b"\xef\xbb\xbf{\"id\":1}"), None, "a BOM");
    assert_eq!(slow(b"{\"id\":\x0b1}"), None);
}

#[test]
fn duplicate_keys() {
    // serde_json refuses a struct field twice, even when the first was null: the whole message.
    assert_eq!(slow(br#"{"id":1,"id":2}"#), None);
    assert_eq!(slow(br#"{"id":null,"id":2,"result":{}}"#), None);
    assert_eq!(slow(br#"{"method":"a","x":0,"method":"a"}"#), None);
    assert_eq!(slow(br#"{"method":null,"method":"a"}"#), None);
    assert_eq!(slow(br#"{"result":{},"result":{}}"#), None);
    assert_eq!(slow(br#"{"method":"m","params":{},"params":{}}"#), None);
    // Other keys may repeat.
    assert_eq!(
        fast(br#"{"jsonrpc":"2.0","jsonrpc":"1","id":1,"result":{}}"#),
        Some(p(Some("1"), None, true, None))
    );
    // A repeated token loses the token, not the message.
    assert_eq!(
        slow(br#"{"id":1,"method":"m","params":{"_meta":{"progressToken":1,"progressToken":2}}}"#),
        Some(p(Some("1"), Some("m"), false, None))
    );
    assert_eq!(
        slow(br#"{"id":1,"method":"m","params":{"progressToken":1,"progressToken":1}}"#),
        Some(p(Some("1"), Some("m"), false, None))
    );
    // Only keys of the object itself count: nested ones may repeat.
    assert_eq!(
        fast(br#"{"id":1,"result":{"id":2,"id":3}}"#),
        Some(p(Some("1"), None, true, None))
    );
}

#[test]
fn escaped_keys_and_methods_are_serdes() {
    assert_eq!(
        slow(br#"{"m\u0065thod":"x","\u0069d":1}"#),
        Some(p(Some("1"), Some("x"), false, None))
    );
    assert_eq!(
        slow(br#"{"method":"notifications\/progress","params":{"progressToken":1}}"#),
        Some(p(None, Some("notifications/progress"), false, Some("1")))
    );
    assert_eq!(
        slow(br#"{"method":"notifications/progress","params":{"progress\u0054oken":1}}"#),
        Some(p(None, Some("notifications/progress"), false, Some("1")))
    );
    assert_eq!(
        slow(br#"{"method":"a\"b\\c\u00e9"}"#),
        Some(p(None, Some("a\"b\\c\u{e9}"), false, None))
    );
    // An escaped key that is no routing key is still serde's to read.
    assert_eq!(
        slow(br#"{"j\u0073onrpc":"2.0","id":1,"result":1}"#),
        Some(p(Some("1"), None, true, None))
    );
    // Escaped keys in nested values are only skipped.
    assert_eq!(
        fast(br#"{"id":1,"result":{"m\u0065thod":"x"}}"#),
        Some(p(Some("1"), None, true, None))
    );
    // Strings that look like a key are not keys.
    assert_eq!(
        fast(br#"{"x":"\"method\":\"y\"","id":2,"result":["\"id\":3"]}"#),
        Some(p(Some("2"), None, true, None))
    );
}

#[test]
fn method_must_be_a_string_or_null() {
    assert_eq!(slow(br#"{"method":1}"#), None);
    assert_eq!(slow(br#"{"method":["x"]}"#), None);
    assert_eq!(slow(br#"{"method":{"a":1},"id":1}"#), None);
    assert_eq!(slow(br#"{"method":true}"#), None);
    assert_eq!(
        fast(br#"{"method":null,"id":1}"#),
        Some(p(Some("1"), None, false, None))
    );
    // The string "null" is a method.
    assert_eq!(
        fast(br#"{"method":"null","id":1}"#),
        Some(p(Some("1"), Some("null"), false, None))
    );
    assert_eq!(
        fast(br#"{"method":""}"#),
        Some(p(None, Some(""), false, None))
    );
}

#[test]
fn null_is_absent() {
    assert_eq!(
        fast(br#"{"id":null,"result":{}}"#),
        Some(p(None, None, true, None))
    );
    // A `null` result is a success response (found by the adversary review of 2026-12-06: it
    // went to the standalone stream, and the POST stream waiting for it never ended)...
    assert_eq!(
        fast(br#"{"id":1,"result":null}"#),
        Some(p(Some("1"), None, true, None))
    );
    assert_eq!(
        fast(br#"{"id":1,"error":null,"result":null}"#),
        Some(p(Some("1"), None, true, None))
    );
    assert_eq!(
        fast(br#"{"method":null,"id":1,"result":null}"#),
        Some(p(Some("1"), None, true, None))
    );
    // ...but not beside a method (a request serialized with every member), and a `null` error
    // alone is no response.
    assert_eq!(
        fast(br#"{"id":1,"method":"m","result":null}"#),
        Some(p(Some("1"), Some("m"), false, None))
    );
    assert_eq!(
        fast(br#"{"id":1,"error":null}"#),
        Some(p(Some("1"), None, false, None))
    );
    // With a null id a request is a notification: its params are not read.
    assert_eq!(
        fast(br#"{"id":null,"method":"m","params":{"_meta":{"progressToken":1}}}"#),
        Some(p(None, Some("m"), false, None))
    );
    assert_eq!(
        fast(
            br#"{"id":1,"method":"m","params":{"progressToken":null,"_meta":{"progressToken":2}}}"#
        ),
        Some(p(Some("1"), Some("m"), false, Some("2")))
    );
    assert_eq!(
        fast(br#"{"id":1,"method":"m","params":{"_meta":null}}"#),
        Some(p(Some("1"), Some("m"), false, None))
    );
    assert_eq!(slow(br#"{"id":nul}"#), None);
    assert_eq!(slow(br#"{"id":nulll}"#), None);
}

#[test]
fn where_the_token_is_read() {
    // A request reads `params.progressToken` too, first, and a progress notification
    // `_meta.progressToken` too: serde's `RawParams` takes either for both.
    assert_eq!(
        fast(br#"{"id":1,"method":"m","params":{"progressToken":"a","_meta":{"progressToken":"b"}}}"#),
        Some(p(Some("1"), Some("m"), false, Some("\"a\"")))
    );
    assert_eq!(
        fast(br#"{"method":"notifications/progress","params":{"_meta":{"progressToken":"b"}}}"#),
        Some(p(
            None,
            Some("notifications/progress"),
            false,
            Some("\"b\"")
        ))
    );
    // Not for other notifications, nor responses.
    assert_eq!(
        fast(br#"{"method":"notifications/message","params":{"progressToken":1}}"#),
        Some(p(None, Some("notifications/message"), false, None))
    );
    assert_eq!(
        fast(br#"{"id":1,"result":{},"params":{"progressToken":1}}"#),
        Some(p(Some("1"), None, true, None))
    );
    // A `_meta` that is no object fails the token (serde: invalid type), even beside one.
    assert_eq!(
        slow(br#"{"id":1,"method":"m","params":{"progressToken":1,"_meta":5}}"#),
        Some(p(Some("1"), Some("m"), false, None))
    );
    // Params that are no object: an array is read as the fields in order.
    assert_eq!(
        slow(br#"{"id":1,"method":"m","params":[7]}"#),
        Some(p(Some("1"), Some("m"), false, Some("7")))
    );
    assert_eq!(
        slow(br#"{"id":1,"method":"m","params":[null,{"progressToken":8}]}"#),
        Some(p(Some("1"), Some("m"), false, Some("8")))
    );
    assert_eq!(
        slow(br#"{"id":1,"method":"m","params":"x"}"#),
        Some(p(Some("1"), Some("m"), false, None))
    );
    // Tokens are canonical like ids.
    assert_eq!(
        fast(br#"{"id":1,"method":"m","params":{"progressToken":1.0}}"#),
        Some(p(Some("1"), Some("m"), false, Some("1")))
    );
    assert_eq!(
        fast(br#"{"id":1,"method":"m","params":{"progressToken":1.50}}"#),
        Some(p(Some("1"), Some("m"), false, Some("1.5")))
    );
}

#[test]
fn ids_are_canonical() {
    let id =
        |raw: &str| agreed(format!(r#"{{"id":{raw},"result":0}}"#).as_bytes()).and_then(|p| p.id);
    assert_eq!(id("1").as_deref(), Some("1"));
    assert_eq!(id("0").as_deref(), Some("0"));
    assert_eq!(id("-7").as_deref(), Some("-7"));
    // A whole number is the integer the peers echo (JavaScript's numbers, pydantic's `int`)
    // up to 2^53, where an f64 still tells integers apart.
    assert_eq!(id("1.0").as_deref(), Some("1"));
    assert_eq!(id("-0").as_deref(), Some("0"));
    assert_eq!(id("-0.0").as_deref(), Some("0"));
    assert_eq!(id("0e7").as_deref(), Some("0"));
    assert_eq!(id("1e2").as_deref(), Some("100"));
    assert_eq!(id("1E+2").as_deref(), Some("100"));
    assert_eq!(id("10e-1").as_deref(), Some("1"));
    assert_eq!(id("-25.0e-1").as_deref(), Some("-2.5"));
    assert_eq!(id("123456789012345.0").as_deref(), Some("123456789012345"));
    assert_eq!(
        id("-1.23456789012345e14").as_deref(),
        Some("-123456789012345")
    );
    assert_eq!(id("4e15").as_deref(), Some("4000000000000000"));
    // Past 2^53, or past the 15 digits an f64 keeps: as before (the f64's form, or as sent).
    assert_eq!(id("1e16").as_deref(), Some("1e+16"));
    assert_eq!(
        id("9007199254740992.0").as_deref(),
        Some("9007199254740992.0")
    );
    assert_eq!(id("1e400").as_deref(), Some("1e400"));
    assert_eq!(id("-1e400").as_deref(), Some("-1e400"));
    assert_eq!(
        id("123456789012345678").as_deref(),
        Some("123456789012345678")
    );
    assert_eq!(
        id("-123456789012345678").as_deref(),
        Some("-123456789012345678")
    );
    assert_eq!(
        id("18446744073709551615").as_deref(),
        Some("18446744073709551615")
    );
    // Beyond u64 and with more digits than an f64 tells apart: kept as sent (`canonical`).
    assert_eq!(
        id("18446744073709551616").as_deref(),
        Some("18446744073709551616")
    );
    assert_eq!(
        id("-9223372036854775808").as_deref(),
        Some("-9223372036854775808")
    );
    assert_eq!(
        id("-9223372036854775809").as_deref(),
        Some("-9223372036854775809")
    );
    assert_eq!(id(r#""a\u0062""#).as_deref(), Some(r#""ab""#));
    assert_eq!(id(r#""\/""#).as_deref(), Some(r#""/""#));
    assert_eq!(id(r#""\u001f""#).as_deref(), Some(r#""\u001f""#));
    assert_eq!(id(r#""\ud800""#).as_deref(), Some(r#""\ud800""#));
    assert_eq!(
        id(r#""\udc00\ud800x""#).as_deref(),
        Some(r#""\udc00\ud800x""#)
    );
    assert_eq!(id(r#""\ud83d\ude00""#).as_deref(), Some("\"\u{1F600}\""));
    assert_eq!(id("\"\u{7f}\u{e9}\"").as_deref(), Some("\"\u{7f}\u{e9}\""));
    assert_eq!(id("[1, 2]").as_deref(), Some("[1, 2]"));
    assert_eq!(id("{ }").as_deref(), Some("{ }"));
    assert_eq!(id("true").as_deref(), Some("true"));
    for bad in [
        "01", "-01", "1.", ".5", "-", "1e", "1e+", "+1", "0x1", "1.e2", "--1", "NaN",
    ] {
        assert_eq!(id(bad), None, "{bad}");
        assert_eq!(
            agreed(format!(r#"{{"id":{bad},"result":0}}"#).as_bytes()),
            None,
            "{bad}"
        );
    }
}

#[test]
fn strings_are_checked_as_serde_does() {
    // Control characters are refused in every string, skipped or not.
    assert_eq!(slow(b"{\"x\":\"a\tb\",\"id\":1}"), None);
    assert_eq!(slow(b"{\"id\":1,\"result\":{\"k\\n\":\"\x01\"}}"), None);
    assert_eq!(slow(b"{\"id\":1,\"result\":{\"\x1f\":0}}"), None);
    // Escapes must be well formed; `\u` takes any four hex digits.
    assert_eq!(slow(br#"{"x":"\q"}"#), None);
    assert_eq!(slow(br#"{"x":"\u12"}"#), None);
    assert_eq!(slow(br#"{"x":"\u00zz"}"#), None);
    assert_eq!(slow(br#"{"x":"\"#), None);
    assert_eq!(slow(br#"{"x":"abc"#), None);
    assert_eq!(
        fast(br#"{"x":"\uD800\uFFFF\u0000"}"#),
        Some(Peek::default())
    );
    // A lone surrogate: fine in a value serde skips or keeps raw, not in a key or a method
    // (both decoded to a Rust string).
    assert_eq!(
        fast(br#"{"id":1,"result":"\ud800","x":"\udfff"}"#),
        Some(p(Some("1"), None, true, None))
    );
    assert_eq!(slow(br#"{"\ud800":1,"id":1}"#), None);
    assert_eq!(slow(br#"{"method":"\ud800"}"#), None);
}

#[test]
fn string_ends_at_every_offset() {
    // The string search looks at words of eight bytes, then runs memchr2 past 64 (or words to
    // the end when the message holds a control byte, as pretty-printed JSON does): every offset
    // of a stop.
    for n in 0..80 {
        let run = "a".repeat(n);
        for lead in ["", "\n"] {
            let at = |text: &str| format!("{lead}{{\"x\":\"{text}\",\"id\":1,\"result\":0}}");
            let ok = Some(p(Some("1"), None, true, None));
            assert_eq!(fast(at(&run).as_bytes()), ok, "{n}");
            assert_eq!(fast(at(&format!("{run}\\\"{run}")).as_bytes()), ok, "{n}");
            assert_eq!(
                fast(at(&format!("{run}\\u00e9{run}\\n")).as_bytes()),
                ok,
                "{n}"
            );
            assert_eq!(fast(at(&format!("{run}\u{e9}{run}")).as_bytes()), ok, "{n}");
            assert_eq!(slow(at(&format!("{run}\t{run}")).as_bytes()), None, "{n}");
            assert_eq!(slow(at(&format!("{run}\u{1f}")).as_bytes()), None, "{n}");
            assert_eq!(slow(at(&format!("{run}\\q")).as_bytes()), None, "{n}");
            assert_eq!(slow(at(&format!("{run}\\u00g0")).as_bytes()), None, "{n}");
        }
        // Keys and the method too.
        let key = format!("{{\"{run}\":1,\"method\":\"{run}\"}}");
        assert_eq!(fast(key.as_bytes()), Some(p(None, Some(&run), false, None)));
        let escaped = format!("{{\"method\":\"{run}\\/\"}}");
        assert_eq!(
            slow(escaped.as_bytes()),
            Some(p(None, Some(&format!("{run}/")), false, None))
        );
    }
}

#[test]
fn invalid_utf8() {
    // serde_json checks UTF-8 in the strings it decodes (keys, the method) and in the raw values
    // it keeps (id, result, error, params)...
    assert_eq!(slow(b"{\"id\":1,\"result\":\"\xff\"}"), None);
    assert_eq!(slow(b"{\"id\":\"\xc3\",\"result\":0}"), None);
    assert_eq!(
        slow(b"{\"method\":\"\xed\xa0\x80\"}"),
        None,
        "an encoded surrogate"
    );
    assert_eq!(slow(b"{\"\xff\":1}"), None);
    assert_eq!(slow(b"{\"id\":1,\"error\":{\"\xe9\":1}}"), None);
    // ... but not in values it skips: those the scanner leaves to serde.
    assert_eq!(
        slow(b"{\"jsonrpc\":\"2.0\xff\",\"id\":1,\"result\":{}}"),
        Some(p(Some("1"), None, true, None))
    );
    assert_eq!(
        slow(b"{\"x\":{\"\xc0\":[\"\xf8\"]},\"method\":\"m\"}"),
        Some(p(None, Some("m"), false, None))
    );
    // Outside strings a byte that is not ASCII is no JSON.
    assert_eq!(slow(b"{\"id\":1\xc2\xa0}"), None);
}

#[test]
fn structure() {
    for bad in [
        &b""[..],
        b"{",
        b"}",
        b"{\"id\":1,}",
        b"{\"id\":1 \"x\":2}",
        b"{\"id\" 1}",
        b"{\"id\":}",
        b"{,}",
        b"{1:2}",
        b"{'id':1}",
        b"{\"id\":1}x",
        b"{\"id\":1}{}",
        b"{\"id\":1}]",
        b"{\"x\":[1,]}",
        b"{\"x\":[,1]}",
        b"{\"x\":[1 2]}",
        b"{\"x\":{\"a\":1,}}",
        b"{\"x\":{\"a\"}}",
        b"{\"x\":{\"a\":1]}",
        b"{\"x\":[1}}",
        b"{\"x\":[[]}",
        b"{\"x\":tru}",
        b"{\"x\":True}",
        b"{\"x\":nan}",
        b"\"str\"",
        b"1",
        b"null",
    ] {
        assert_eq!(agreed(bad), None, "{:?}", String::from_utf8_lossy(bad));
    }
    assert_eq!(
        fast(b"{\"x\":[[],{},[{}],{\"a\":[]}],\"y\":-0.5E-7,\"id\":1}"),
        Some(p(Some("1"), None, false, None))
    );
}

#[test]
fn top_level_arrays_are_serdes() {
    // serde reads a struct from an array as its fields in order: id, method, result, error,
    // params. Odd, kept: the scanner leaves every array to serde.
    assert_eq!(
        slow(br#"[1,"x"]"#),
        Some(p(Some("1"), Some("x"), false, None))
    );
    assert_eq!(slow(b"[]"), Some(Peek::default()));
    assert_eq!(
        slow(br#"[{"id":1,"result":{}}]"#),
        Some(p(Some(r#"{"id":1,"result":{}}"#), None, false, None)),
        "a batch of one response"
    );
    assert_eq!(slow(b"[1,2]"), None);
    assert_eq!(slow(br#"[1,"x",null,null,null,6]"#), None);
}

#[test]
fn nesting_depth() {
    let nested = |depth: usize, key: &str| {
        format!(
            r#"{{"id":1,"{key}":{}0{},"method":"m"}}"#,
            "[".repeat(depth),
            "]".repeat(depth)
        )
    };
    // serde_json's recursion limit does not reach into values it skips or keeps raw: it reads
    // them all, however deep. The scanner follows 128 levels and leaves deeper ones to serde.
    for key in ["x", "result", "error"] {
        for depth in [1, 127, 128] {
            assert!(
                fast(nested(depth, key).as_bytes()).is_some(),
                "{key} {depth}"
            );
        }
        for depth in [129, 5000] {
            assert!(
                slow(nested(depth, key).as_bytes()).is_some(),
                "{key} {depth}"
            );
        }
    }
    let objects = format!(r#"{{"x":{}1{}}}"#, r#"{"a":"#.repeat(200), "}".repeat(200));
    assert_eq!(slow(objects.as_bytes()), Some(Peek::default()));
    // Deep and broken is still broken.
    let broken = format!(r#"{{"x":{}0{}}}"#, "[".repeat(300), "]".repeat(299));
    assert_eq!(slow(broken.as_bytes()), None);
}

// === Property: agreement on JSON-RPC-shaped messages ===

/// A JSON value to render; strings hold raw (already escaped) text.
#[derive(Debug, Clone)]
enum J {
    Lit(&'static str),
    Str(String),
    Arr(Vec<J>),
    Obj(Vec<(String, J)>),
    /// `n` nested arrays (or objects under key "d") around `0`.
    Deep(usize, bool),
}

/// Pieces of string text: plain, non-ASCII, escapes good and bad, raw control bytes.
fn piece() -> impl Strategy<Value = String> {
    prop_oneof![
        48 => "[a-z/_ ]{0,6}",
        8 => Just("\u{e9}\u{1F600}".to_string()),
        8 => prop::sample::select(vec![
            "\\n", "\\\"", "\\\\", "\\/", "\\u0065", "\\u00E9", "\\ud800", "\\uDC00",
            "\\ud83d\\ude00", "\\u0000", "\\b\\f\\r\\t",
        ])
        .prop_map(str::to_owned),
        1 => prop::sample::select(vec!["\\x", "\\u12", "\t", "\u{1}", "\u{7f}", "null"])
            .prop_map(str::to_owned),
    ]
}

fn text() -> impl Strategy<Value = String> {
    prop::collection::vec(piece(), 0..4).prop_map(|p| p.concat())
}

fn number() -> impl Strategy<Value = &'static str> {
    let good = prop::sample::select(vec![
        "0",
        "1",
        "-7",
        "42",
        "1.0",
        "-0",
        "1.5e3",
        "1E-2",
        "1e400",
        "123456789012345678",
        "18446744073709551616",
        "-9223372036854775809",
        "0.30000000000000004",
    ]);
    prop_oneof![40 => good, 1 => prop::sample::select(vec!["01", "1.", "-", "1e"])]
}

fn leaf() -> impl Strategy<Value = J> {
    prop_oneof![
        number().prop_map(J::Lit),
        prop_oneof![
            30 => prop::sample::select(vec!["null", "true", "false"]),
            1 => prop::sample::select(vec!["nul", "True"]),
        ]
        .prop_map(J::Lit),
        text().prop_map(J::Str),
    ]
}

/// A key: the routing ones (some escaped), the token's, and others.
fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        8 => prop::sample::select(vec![
            "id", "method", "result", "error", "params", "jsonrpc", "progressToken", "_meta",
        ])
        .prop_map(str::to_owned),
        1 => prop::sample::select(vec![
            "m\\u0065thod",
            "\\u0069d",
            "progress\\u0054oken",
            "\\ud800",
        ])
        .prop_map(str::to_owned),
        2 => text(),
    ]
}

fn value() -> impl Strategy<Value = J> {
    leaf().prop_recursive(4, 24, 5, |inner| {
        prop_oneof![
            8 => prop::collection::vec(inner.clone(), 0..5).prop_map(J::Arr),
            8 => prop::collection::vec((key(), inner), 0..5).prop_map(J::Obj),
            1 => (120usize..140, any::<bool>()).prop_map(|(n, o)| J::Deep(n, o)),
        ]
    })
}

fn method() -> impl Strategy<Value = J> {
    prop_oneof![
        8 => prop::sample::select(vec![
            "notifications/progress",
            "notifications/progress",
            "notifications/message",
            "tools/call",
            "notifications\\/progress",
            "null",
        ])
        .prop_map(|m| J::Str(m.to_owned())),
        1 => value(),
    ]
}

fn id() -> impl Strategy<Value = J> {
    prop_oneof![
        3 => number().prop_map(J::Lit),
        3 => text().prop_map(J::Str),
        1 => value(),
    ]
}

fn params() -> impl Strategy<Value = J> {
    let meta = prop::collection::vec(
        prop_oneof![
            3 => id().prop_map(|t| ("progressToken".to_owned(), t)),
            1 => (key(), value()),
        ],
        0..3,
    )
    .prop_map(J::Obj);
    let member = prop_oneof![
        2 => id().prop_map(|t| ("progressToken".to_owned(), t)),
        2 => prop_oneof![3 => meta, 1 => value()].prop_map(|m| ("_meta".to_owned(), m)),
        3 => (text(), value()),
        1 => (key(), value()),
    ];
    prop_oneof![
        6 => prop::collection::vec(member, 0..4).prop_map(J::Obj),
        1 => value(),
    ]
}

fn member() -> impl Strategy<Value = (String, J)> {
    prop_oneof![
        3 => id().prop_map(|v| ("id".to_owned(), v)),
        3 => method().prop_map(|v| ("method".to_owned(), v)),
        3 => params().prop_map(|v| ("params".to_owned(), v)),
        2 => value().prop_map(|v| ("result".to_owned(), v)),
        1 => value().prop_map(|v| ("error".to_owned(), v)),
        1 => Just(("jsonrpc".to_owned(), J::Str("2.0".to_owned()))),
        2 => (key(), value()),
    ]
}

/// A request, notification or response shape: its routing members and a few others, in any order.
fn rpc() -> impl Strategy<Value = J> {
    (
        id(),
        method(),
        params(),
        prop::collection::vec(prop_oneof![6 => (text(), value()), 1 => member()], 0..3),
        0u8..4,
    )
        .prop_flat_map(|(id, method, params, extra, shape)| {
            let mut members = extra;
            members.push(("jsonrpc".to_owned(), J::Str("2.0".to_owned())));
            if shape != 0 {
                members.push(("id".to_owned(), id));
            }
            if shape == 3 {
                members.push(("result".to_owned(), params));
            } else {
                members.push(("method".to_owned(), method));
                members.push(("params".to_owned(), params));
            }
            Just(members).prop_shuffle()
        })
        .prop_map(J::Obj)
}

fn message() -> impl Strategy<Value = J> {
    prop_oneof![
        12 => rpc(),
        6 => prop::collection::vec(member(), 0..6).prop_map(J::Obj),
        1 => prop::collection::vec(id(), 0..4).prop_map(J::Arr),
        1 => value(),
    ]
}

fn pad(ws: &mut impl Iterator<Item = &'static str>, out: &mut String) {
    out.push_str(ws.next().unwrap_or(""));
}

fn render(j: &J, ws: &mut impl Iterator<Item = &'static str>, out: &mut String) {
    match j {
        J::Lit(l) => out.push_str(l),
        J::Str(s) => {
            out.push('"');
            out.push_str(s);
            out.push('"');
        }
        J::Arr(items) => {
            out.push('[');
            for (n, item) in items.iter().enumerate() {
                pad(ws, out);
                if n > 0 {
                    out.push(',');
                    pad(ws, out);
                }
                render(item, ws, out);
            }
            pad(ws, out);
            out.push(']');
        }
        J::Obj(members) => {
            out.push('{');
            for (n, (k, v)) in members.iter().enumerate() {
                pad(ws, out);
                if n > 0 {
                    out.push(',');
                    pad(ws, out);
                }
                out.push('"');
                out.push_str(k);
                out.push('"');
                pad(ws, out);
                out.push(':');
                pad(ws, out);
                render(v, ws, out);
            }
            pad(ws, out);
            out.push('}');
        }
        J::Deep(n, objects) => {
            let (open, close) = if *objects {
                ("{\"d\":", "}")
            } else {
                ("[", "]")
            };
            out.push_str(&open.repeat(*n));
            out.push('0');
            out.push_str(&close.repeat(*n));
        }
    }
}

/// Whitespace between tokens: mostly none, sometimes JSON's, rarely bytes that are not.
fn spacing() -> impl Strategy<Value = Vec<&'static str>> {
    prop::collection::vec(
        prop_oneof![
            300 => Just(""),
            100 => prop::sample::select(vec![" ", "\n", "\t", "\r", " \r\n\t "]),
            1 => prop::sample::select(vec!["\u{c}", "\u{b}", "\u{a0}", "x", ","]),
        ],
        0..64,
    )
}

/// Byte edits after rendering: delete, insert, replace (with structural and hostile bytes), cut.
fn mutations() -> impl Strategy<Value = Vec<(prop::sample::Index, u8, u8)>> {
    let byte = prop::sample::select(vec![
        b'"', b'\\', b'{', b'}', b'[', b']', b',', b':', b' ', b'0', b'e', b'.', b'-', 0x01, 0x80,
        0xc3, 0xff,
    ]);
    prop_oneof![
        5 => Just(vec![]),
        1 => prop::collection::vec((any::<prop::sample::Index>(), 0u8..4, byte), 1..4),
    ]
}

fn mutate(mut bytes: Vec<u8>, edits: &[(prop::sample::Index, u8, u8)]) -> Vec<u8> {
    for (at, op, b) in edits {
        if bytes.is_empty() {
            bytes.push(*b);
            continue;
        }
        let i = at.index(bytes.len());
        match op {
            0 => {
                bytes.remove(i);
            }
            1 => bytes.insert(i, *b),
            2 => bytes[i] = *b,
            _ => bytes.truncate(i),
        }
    }
    bytes
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(3000))]

    #[test]
    fn prop_scanner_agrees_with_serde(
        msg in message(),
        ws in spacing(),
        edits in mutations(),
        lead in prop::sample::select(vec!["", " ", "\n\t"]),
    ) {
        let mut text = lead.to_string();
        render(&msg, &mut ws.into_iter().cycle(), &mut text);
        let bytes = mutate(text.into_bytes(), &edits);
        let serde = peek_serde(&bytes);
        if let Some(fast) = peek_fast(&bytes) {
            prop_assert_eq!(Some(fast), serde.clone(), "{:?}", String::from_utf8_lossy(&bytes));
        }
        prop_assert_eq!(peek(&bytes), serde);
    }
}

/// The lane-wise lowest and highest byte agree with a plain fold for every length around the
/// lanes' width and a control byte or a high byte at every position.
#[test]
fn lowest_and_highest_bytes_as_a_fold_finds_them() {
    let fold = |b: &[u8]| {
        b.iter()
            .fold((u8::MAX, 0u8), |(lo, hi), &x| (lo.min(x), hi.max(x)))
    };
    for len in 0..100 {
        for at in 0..len {
            for special in [0x00, 0x1f, 0x20, 0x7f, 0x80, 0xff] {
                let mut b = vec![b'a'; len];
                b[at] = special;
                assert_eq!(
                    super::lowest_and_highest(&b),
                    fold(&b),
                    "{len} {at} {special}"
                );
            }
        }
        assert_eq!(
            super::lowest_and_highest(&vec![b'q'; len]),
            fold(&vec![b'q'; len])
        );
    }
}

/// The first byte that is not an ASCII digit, eight at a time, is found exactly whatever the
/// bytes around it (every byte value at every position, and runs of random words).
#[test]
fn bytes_not_digit_finds_the_first_non_digit() {
    use super::bytes_not_digit;
    let first = |w: [u8; 8]| {
        let hit = bytes_not_digit(u64::from_le_bytes(w));
        (hit != 0).then(|| hit.trailing_zeros() as usize / 8)
    };
    for b in 0..=255u8 {
        for pos in 0..8 {
            for filler in [b'0', b'9', b'5'] {
                let mut w = [filler; 8];
                w[pos] = b;
                let want = (!b.is_ascii_digit()).then_some(pos);
                assert_eq!(first(w), want, "byte {b:#x} at {pos} among {filler:#x}");
                // Whatever follows the first non-digit.
                for after in [0u8, b'/', b':', 0x80, 0xba, 0xff] {
                    let mut w2 = w;
                    for x in w2.iter_mut().skip(pos + 1) {
                        *x = after;
                    }
                    let want = w2.iter().position(|x| !x.is_ascii_digit());
                    assert_eq!(first(w2), want, "{w2:?}");
                }
            }
        }
    }
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    for _ in 0..200_000 {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        // Mostly digits, so that the first non-digit falls anywhere.
        let mut w = rng.to_le_bytes();
        for (i, x) in w.iter_mut().enumerate() {
            if (rng >> (i * 3)) & 7 != 0 {
                *x = b'0' + *x % 10;
            }
        }
        assert_eq!(
            first(w),
            w.iter().position(|x| !x.is_ascii_digit()),
            "{w:?}"
        );
    }
}

/// Numbers of every length up to 40 digits, at every alignment, end where serde says: valid ones
/// the scanner answers itself, and one that runs into a letter, a second dot or a missing
/// exponent it leaves to serde (which refuses it).
#[test]
fn numbers_of_every_length_end_where_serde_says() {
    for len in 1..=40 {
        let digits: String = (0..len).map(|i| char::from(b'1' + (i % 9) as u8)).collect();
        for pad in 0..8 {
            let key = "k".repeat(pad);
            for lead in ["", "-"] {
                for frac in ["", ".5", "e7", ".25E-3", ".0123456789012345"] {
                    let n = format!("{lead}{digits}{frac}");
                    let msg = format!(
                        r#"{{"jsonrpc":"2.0","method":"m","params":{{"{key}":{n},"x":[{n},{n}]}}}}"#
                    );
                    assert_eq!(fast(msg.as_bytes()), Some(p(None, Some("m"), false, None)));
                }
                for bad in ["a", ".", "..5", "e", "e+", "x1"] {
                    let msg = format!(
                        r#"{{"jsonrpc":"2.0","method":"m","params":{{"{key}":{lead}{digits}{bad}}}}}"#
                    );
                    assert_eq!(slow(msg.as_bytes()), None, "{msg}");
                }
            }
        }
    }
}
