//! Adversarial review 18: the envelope scanner (`peek_fast`) against `peek_serde`, the
//! definition, on every combination of a hostile key, a hostile value and a place in the message
//! (top level, `params`, `params._meta`), with whitespace variants.

use super::*;

const KEYS: &[&str] = &[
    "id",
    "method",
    "result",
    "error",
    "params",
    "jsonrpc",
    "progressToken",
    "_meta",
    "x",
    r"i\u0064",
    r"\u0069d",
    r"metho\u0064",
    r"progress\u0054oken",
    r"_m\u0065ta",
    r"res\/ult",
    "id ",
    "",
    "ID",
    "\u{e9}",
];

const VALUES: &[&str] = &[
    "null",
    "true",
    "false",
    "nul",
    "0",
    "-0",
    "1",
    "-1",
    "1.0",
    "1.00",
    "1e2",
    "1E+2",
    "1e-2",
    "01",
    "1.",
    ".1",
    "-",
    "+1",
    "123456789012345678",
    "1234567890123456789",
    "-123456789012345678",
    "-1234567890123456789",
    "18446744073709551615",
    "18446744073709551616",
    "-9223372036854775808",
    "-9223372036854775809",
    "1e400",
    "-1e400",
    "0.30000000000000004",
    "4.44444e+88",
    "0e0",
    "-0.0",
    "1e",
    "1e+",
    "00",
    "-01",
    "NaN",
    r#""""#,
    r#""1""#,
    r#""a b""#,
    r#""a\"b""#,
    r#""\n""#,
    r#""\u0041""#,
    r#""\ud800""#,
    r#""\uD834\uDD1E""#,
    r#""\x""#,
    r#""\u12""#,
    r#""\u12g4""#,
    "\"\u{1}\"",
    "\"\t\"",
    "\"\u{7f}\"",
    "\"\u{e9}\"",
    "\"\u{1d11e}\"",
    "\"\u{2028}\"",
    r#""\/""#,
    r#""\\""#,
    r#""notifications/progress""#,
    r#""notifications\/progress""#,
    r#""\u0000""#,
    "[]",
    "[1]",
    "[1,]",
    "[,1]",
    "[\"x\",2]",
    "{}",
    "{,}",
    r#"{"a":1,}"#,
    r#"{"a"}"#,
    r#"{"a":1 "b":2}"#,
    r#"{"progressToken":7}"#,
    r#"{"progressToken":null}"#,
    r#"{"progressToken":7,"progressToken":8}"#,
    r#"{"_meta":{"progressToken":"t"}}"#,
    r#"{"result":1}"#,
    r#"{"id":2}"#,
    "[[[[[[[[[[1]]]]]]]]]]",
    r#"{"a":[{"b":{"c":[]}}]}"#,
    "\"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\\\"aaaaaaa\"",
    "\"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\"",
    "\"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\u{1}\"",
];

const TEMPLATES: &[&str] = &[
    r#"{"jsonrpc":"2.0","id":1,"method":"x",K:V}"#,
    r#"{K:V,"result":{}}"#,
    r#"{"id":"r",K:V,"error":{"code":1}}"#,
    r#"{"method":"notifications/progress","params":{K:V}}"#,
    r#"{"method":"notifications/progress","params":{"progressToken":1,K:V}}"#,
    r#"{"id":1,"method":"m","params":{"_meta":{K:V}}}"#,
    r#"{"id":1,"method":"m","params":{K:V,"_meta":{"progressToken":2}}}"#,
    r#"{"method":"notifications/message","params":{K:V}}"#,
    r#"{"id":7,"method":"m","params":{"_meta":{"progressToken":2,K:V}}}"#,
    r#"{"id":1,K:V}"#,
    r#"{K:V}"#,
];

const SPACES: &[&str] = &["", " ", "\n\t\r ", "\u{c}"];

fn agree(input: &[u8]) {
    let want = peek_serde(input);
    let got = peek(input);
    let fast = peek_fast(input);
    assert!(
        got == want && (fast.is_none() || fast == want),
        "scanner disagrees with serde on {:?}:\n  serde {want:?}\n  peek  {got:?}\n  fast  {fast:?}",
        String::from_utf8_lossy(input)
    );
}

#[test]
fn adv18_scanner_agrees_with_serde_on_hostile_members() {
    let mut n = 0;
    for t in TEMPLATES {
        for k in KEYS {
            for v in VALUES {
                let key = format!("\"{k}\"");
                let msg = t.replace('K', &key).replace('V', v);
                agree(msg.as_bytes());
                for sp in SPACES {
                    // Whitespace around every separator of the message (outside strings the
                    // templates have none that would change meaning).
                    let spaced = t
                        .replace(':', &format!("{sp}:{sp}"))
                        .replace(',', &format!("{sp},{sp}"))
                        .replace('K', &key)
                        .replace('V', v);
                    agree(spaced.as_bytes());
                    agree(format!("{sp}{msg}{sp}").as_bytes());
                }
                n += 1;
            }
        }
    }
    assert!(n > 10_000);
}

/// Raw bytes the templates cannot hold: invalid UTF-8 in every place, NUL, truncations of a
/// common event at every length.
#[test]
fn adv18_scanner_agrees_with_serde_on_raw_bytes() {
    let base = br#"{"jsonrpc":"2.0","id":12,"method":"notifications/progress","params":{"progressToken":"tok","_meta":{"progressToken":3},"text":"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\"b\\c"},"result":null}"#;
    for cut in 0..=base.len() {
        agree(&base[..cut]);
    }
    for at in 0..base.len() {
        for b in [
            0x00u8, 0x01, 0x1f, b'"', b'\\', b'{', b'}', b',', 0x80, 0xc3, 0xff, b' ',
        ] {
            let mut m = base.to_vec();
            m[at] = b;
            agree(&m);
            let mut m = base.to_vec();
            m.insert(at, b);
            agree(&m);
        }
        let mut m = base.to_vec();
        m.remove(at);
        agree(&m);
    }
}
