//! Adversarial review 23 of issue 18's CPU-per-event work (main at 93c775c): the envelope scan
//! and the canonical id text it routes by (`src/jsonrpc.rs`, `src/jsonrpc/envelope.rs`), client
//! frames (`src/stream.rs`, `src/sse/encode.rs`), and the root certificates loaded only when an
//! `https://` connection can be made (`src/upstream.rs` `UpstreamSettings::from_config`, commits
//! ad61f44 and 93c775c; `src/config.rs` `Config::validate`).
//!
//! The scanner agrees with `peek_serde` everywhere the fuzz target and the proptests look (they
//! compare the two on any bytes, and were not beaten here). What they cannot see is where
//! `peek_serde` itself, the definition, reads a message differently from the real peers on the
//! other side: the in-flight table is keyed by `canonical_text` of the client's id, and a real
//! upstream echoes a numerically equal id in another spelling.
//!
//! Probes:
//! - `adv23_escaped_and_big_ids_round_trip_through_python`: string ids with escapes and a
//!   surrogate pair, and an integer beyond `u64`, in front of Python FastMCP (which echoes them
//!   unescaped / as the same digits): each answer ends its own POST stream. HELD.
//! - FIXED `adv23_float_spelled_integer_id_is_answered_on_its_post_stream`: a Streamable HTTP
//!   POST `tools/call` with `"id": 1.0` in front of server-everything (the TypeScript SDK echoes
//!   it as `"id": 1`, JavaScript numbers having one spelling): the proxy keys the request as
//!   `1.0` (`canonical_text`: an f64 written back as `1.0`), files the answer `1` under no
//!   request, routes it to the standalone GET stream, and the POST stream never ends. The same
//!   with `1e0`, `1E0`, `10e-1`, `-0`.
//! - FIXED `adv23_float_spelled_progress_token_reaches_its_post_stream`: the same for
//!   `_meta.progressToken: 2.0` (server-everything sends `progressToken: 2`): the request's
//!   progress notifications go to the standalone stream, not to its POST stream (design.md §6).
//! - FIXED `adv23_negative_zero_id_is_answered_once_on_the_legacy_face`: a legacy client's
//!   `"id": -0` in front of Python FastMCP (pydantic reads `-0` as the int 0 and echoes
//!   `"id": 0`): the answer is delivered, but its in-flight entry (`-0.0`) is never completed, so
//!   when the upstream dies the proxy answers the same request again with -32091 (I6 turned
//!   into a second answer); with `upstream.request_timeout_secs` it is a -32093 after the answer.
//! - FIXED `adv23_result_null_is_a_response`: a legacy upstream (a stub: neither SDK server
//!   answers `"result": null` on demand) answering a request with `{"id":N,"result":null}`, a
//!   valid JSON-RPC 2.0 success response: `peek` reads `"result": null` as "no result" (a
//!   documented corner of `peek_serde`, which the scanner copies), routes the answer to the
//!   standalone stream, and the POST stream never ends.
//! - FIXED `adv23_uppercase_https_endpoint_origin_is_checked_for_roots_at_start`: with no
//!   system roots (`SSL_CERT_FILE` naming a missing file) and `upstream.allowed_endpoint_origins
//!   = ["HTTPS://..."]`, `Config::validate` decides "no https" on the raw text
//!   (`o.starts_with("https://")`, case-sensitive) and starts, while `UpstreamSettings` decides
//!   "https" on the parsed origin, fails to load roots and silently falls back to an empty root
//!   store: the proxy is up and ready, and every POST to that endpoint will fail its handshake.
//!   With `https://` in lower case the same config exits 64 naming `upstream.ca_file`.
//!
//! All fixed in cb2bc31 (the whole numbers are canonical integers, a `null` result without a
//! method is a response, one `reaches_https` for the start and the runtime), and each probe here
//! failed before it. Run: `cargo test --test adversary23` (needs the peers of
//! `scripts/install-peers`).

mod support;

use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::{json, Value};
use support::streamable::*;
use support::stub_upstream::{raw_id, stub_upstream, Reply};
use support::*;

fn jsons(evs: &[Ev]) -> Vec<Value> {
    evs.iter()
        .filter(|e| !e.is_priming())
        .map(Ev::json)
        .collect()
}

/// A response (result or error) among `msgs` whose id is the number `id` (any spelling).
fn answer_to(msgs: &[Value], id: f64) -> Option<&Value> {
    msgs.iter().find(|m| {
        m.get("method").is_none()
            && (m.get("result").is_some() || m.get("error").is_some())
            && m["id"].as_f64() == Some(id)
    })
}

/// A response among `msgs` whose id is the string `id`.
fn answer_to_str<'a>(msgs: &'a [Value], id: &str) -> Option<&'a Value> {
    msgs.iter()
        .find(|m| m.get("method").is_none() && m["id"] == id)
}

/// A POST of `body` on the sessionful face: its stream must carry its answer and end within
/// `d`; `Err` says where the answer went instead.
async fn post_within(
    c: &Client,
    get: &mut Sse,
    body: &str,
    what: &str,
    d: Duration,
) -> Result<Vec<Value>, String> {
    let r = c.post_raw(body, &[]).await;
    assert_eq!(r.status, 200, "{what}: POST answered {}", r.status);
    let mut post = r.sse();
    let (evs, ended) = post.events_within(d).await;
    let msgs = jsons(&evs);
    if ended {
        return Ok(msgs);
    }
    // Where did the answer go? (For the report: the standalone stream.)
    let (elsewhere, _) = get.events_within(Duration::from_secs(2)).await;
    Err(format!(
        "{what}: the POST stream did not end within {d:?}; it carried {msgs:?}; the standalone \
         GET stream carried {:?}",
        jsons(&elsewhere)
    ))
}

/// [`post_within`] 10 s, failing the test when the stream does not end.
async fn post_answered(c: &Client, get: &mut Sse, body: &str, what: &str) -> Vec<Value> {
    post_within(c, get, body, what, Duration::from_secs(10))
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

// ---------------------------------------------------------------------------------------------
// Canonical ids against the real peers' echo

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adv23_float_spelled_integer_id_is_answered_on_its_post_stream() {
    let up = everything().await;
    let p = Proxy::start(&up, |_| {}).await;
    let (c, _) = Client::init(p.addr(), "2025-06-18").await;
    let mut get = c.get(None).await.sse();
    let call = |id: &str, text: &str| {
        format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"echo","arguments":{{"message":"{text}"}}}}}}"#
        )
    };
    // Control: an integer id is answered on its POST stream, which then ends.
    let msgs = post_answered(&c, &mut get, &call("7", "int"), "id 7").await;
    let a = answer_to(&msgs, 7.0).expect("id 7 answered on its stream");
    assert_eq!(a["result"]["content"][0]["text"], "Echo: int", "{a}");
    // The same number in other spellings JSON allows: the TS SDK server echoes `1` (`0`).
    let mut lost = Vec::new();
    for (n, id) in ["1.0", "1e0", "10e-1", "-0"].iter().enumerate() {
        let text = format!("float {n}");
        let what = format!("id {id}");
        match post_within(
            &c,
            &mut get,
            &call(id, &text),
            &what,
            Duration::from_secs(4),
        )
        .await
        {
            Ok(msgs) => {
                let want: f64 = id.parse().unwrap();
                match answer_to(&msgs, want) {
                    Some(a) => {
                        assert_eq!(a["result"]["content"][0]["text"], format!("Echo: {text}"))
                    }
                    None => lost.push(format!("{what}: ended without its answer: {msgs:?}")),
                }
            }
            Err(e) => lost.push(e),
        }
    }
    assert!(lost.is_empty(), "{}", lost.join("\n"));
    p.stop().await;
}

/// Ids that are neither strings nor integers (`1.5`, a whole number past 2^53 spelled as a float,
/// `true`, an array, an object) are refused with 400 `invalid_request` before anything is
/// forwarded, as the 2026-07-28 face refuses them: server-everything's schema drops such a
/// request, so nothing would ever answer it and its POST stream would never end (the follow-up
/// of this review's float-id finding). A batch holding one is refused whole; an integer past
/// 64 bits and a string are still taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adv23_ids_neither_string_nor_integer_are_refused_on_the_sessionful_face() {
    let up = everything().await;
    let p = Proxy::start(&up, |_| {}).await;
    let (c, _) = Client::init(p.addr(), "2025-06-18").await;
    let mut get = c.get(None).await.sse();
    let call = |id: &str, text: &str| {
        format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"echo","arguments":{{"message":"{text}"}}}}}}"#
        )
    };
    for id in [
        "1.5",
        "9007199254740993.0",
        "1e400",
        "true",
        "[1]",
        r#"{"a":1}"#,
    ] {
        let r = c.post_raw(&call(id, "refused"), &[]).await;
        assert_eq!(r.status, 400, "id {id}");
        let body = r.json().await;
        assert_eq!(body["error"]["code"], -32600, "id {id}: {body}");
        assert_eq!(
            body["error"]["data"]["reason"], "invalid_request",
            "id {id}: {body}"
        );
    }
    let batch = format!("[{},{}]", call("8", "in a batch"), call("2.5", "refused"));
    let r = c.post_raw(&batch, &[]).await;
    assert_eq!(r.status, 400, "a batch with one bad id");
    // Nothing of the refused bodies reached the upstream: no answer anywhere (the server's own
    // notifications may come and go on this stream).
    let (stray, _) = get.events_within(Duration::from_secs(1)).await;
    let answers: Vec<Value> = jsons(&stray)
        .into_iter()
        .filter(|m| m.get("id").is_some())
        .collect();
    assert!(answers.is_empty(), "{answers:?}");
    // Still taken: a string (integers past 64 bits are taken too, but server-everything's
    // schema refuses ids past 2^53 with a 400 of its own: the Python probe above has them).
    let msgs = post_answered(&c, &mut get, &call(r#""s-1""#, "ok"), "id \"s-1\"").await;
    let a = answer_to_str(&msgs, "s-1").expect("answered on its stream");
    assert_eq!(a["result"]["content"][0]["text"], "Echo: ok", "{a}");
    p.stop().await;
}

/// The same refusal on the legacy face: 400 with the id, and the session goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adv23_ids_neither_string_nor_integer_are_refused_on_the_legacy_face() {
    let up = fastmcp().await;
    let dir = tempfile::tempdir().unwrap();
    let p = start_in_process(&up.sse_url(), dir.path(), |_| {}).await;
    let base = format!("http://{}", p.addr);
    let (mut sse, url, _) = legacy_session(&base).await;
    let ct = [("content-type", "application/json")];
    let call = |id: &str, text: &str| {
        format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"echo","arguments":{{"text":"{text}"}}}}}}"#
        )
    };
    for id in ["1.5", "null", "[2]"] {
        let (status, _, body) = request("POST", &url, &ct, &call(id, "refused")).await;
        if id == "null" {
            // A null id is a notification, not a request: taken (nothing answers it).
            assert_eq!(status, 202, "{body}");
            continue;
        }
        assert_eq!(status, 400, "id {id}: {body}");
        let v: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["error"]["code"], -32600, "{v}");
        assert_eq!(
            v["id"].to_string(),
            serde_json::from_str::<Value>(id).unwrap().to_string(),
            "{v}"
        );
    }
    let (status, _, body) = request("POST", &url, &ct, &call("3", "after")).await;
    assert_eq!(status, 202, "{body}");
    let (_, m) = sse.message().await;
    assert_eq!(
        m["id"], 3,
        "the next message on the stream is the answer to 3: {m}"
    );
    assert_eq!(m["result"]["content"][0]["text"], "after", "{m}");
    p.stop().await;
}

/// HELD: the spellings a Python upstream echoes differently but `canonical_text` folds alike
/// (escapes in a string id, a surrogate pair, an integer beyond `u64` kept as sent) are answered
/// on their own POST streams.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adv23_escaped_and_big_ids_round_trip_through_python() {
    let up = fastmcp().await;
    let p = Proxy::start(&up, |_| {}).await;
    let (c, _) = Client::init(p.addr(), "2025-06-18").await;
    let mut get = c.get(None).await.sse();
    for (n, (id, want)) in [
        (r#""\u0041b\/c""#, json!("Ab/c")),
        (r#""\ud83d\ude00""#, json!("\u{1f600}")),
        ("123456789012345678901234567890", Value::Null),
    ]
    .into_iter()
    .enumerate()
    {
        let text = format!("t{n}");
        let body = format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"echo","arguments":{{"text":"{text}"}}}}}}"#
        );
        let msgs = post_answered(&c, &mut get, &body, &format!("id {id}")).await;
        let a = msgs
            .iter()
            .find(|m| m.get("result").is_some())
            .unwrap_or_else(|| panic!("id {id}: {msgs:?}"));
        assert_eq!(a["result"]["content"][0]["text"], text, "{a}");
        if want.is_null() {
            // Beyond u64 (this test's `Value` reads it as an f64): that it came back on its own
            // POST stream, which ended, is the check.
            assert!(a["id"].is_number(), "{a}");
        } else {
            assert_eq!(a["id"], want, "{a}");
        }
    }
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adv23_float_spelled_progress_token_reaches_its_post_stream() {
    let up = everything().await;
    let p = Proxy::start(&up, |_| {}).await;
    let (c, _) = Client::init(p.addr(), "2025-06-18").await;
    let mut get = c.get(None).await.sse();
    let call = |id: u64, token: &str| {
        format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"trigger-long-running-operation","arguments":{{"duration":0.5,"steps":2}},"_meta":{{"progressToken":{token}}}}}}}"#
        )
    };
    let progress = |msgs: &[Value]| {
        msgs.iter()
            .filter(|m| m["method"] == "notifications/progress")
            .count()
    };
    // Control: an integer token's progress comes on the POST stream.
    let msgs = post_answered(&c, &mut get, &call(20, "5"), "token 5").await;
    assert!(answer_to(&msgs, 20.0).is_some(), "{msgs:?}");
    assert_eq!(progress(&msgs), 2, "token 5: {msgs:?}");
    // The token spelled as a float: server-everything sends `progressToken: 2`.
    let msgs = post_answered(&c, &mut get, &call(21, "2.0"), "token 2.0").await;
    assert!(answer_to(&msgs, 21.0).is_some(), "{msgs:?}");
    let (stray, _) = get.events_within(Duration::from_secs(1)).await;
    assert_eq!(
        progress(&msgs),
        2,
        "token 2.0: the POST stream carried {msgs:?}; the standalone stream {:?}",
        jsons(&stray)
    );
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adv23_negative_zero_id_is_answered_once_on_the_legacy_face() {
    let mut up = fastmcp().await;
    let dir = tempfile::tempdir().unwrap();
    let p = start_in_process(&up.sse_url(), dir.path(), |_| {}).await;
    let base = format!("http://{}", p.addr);
    let (mut sse, url, _) = legacy_session(&base).await;
    let ct = [("content-type", "application/json")];
    let call = |id: &str, text: &str| {
        format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"echo","arguments":{{"text":"{text}"}}}}}}"#
        )
    };
    for (id, text) in [("5", "five"), ("-0", "zero")] {
        let (status, _, body) = request("POST", &url, &ct, &call(id, text)).await;
        assert_eq!(status, 202, "{body}");
        let (_, m) = sse.message().await;
        assert_eq!(m["result"]["content"][0]["text"], text, "{m}");
        assert_eq!(m["id"].as_f64(), Some(id.parse::<f64>().unwrap()), "{m}");
    }
    // Both requests are answered. The upstream dies: nothing is in flight, so nothing more may
    // answer them (I6 answers only requests still in flight).
    up.proc.kill();
    let rest = rest_of_stream(&mut sse).await;
    let again: Vec<&Value> = rest
        .iter()
        .map(|(_, m)| m)
        .filter(|m| m.get("error").is_some() && m["id"].is_number())
        .collect();
    assert!(
        again.is_empty(),
        "answered requests answered again after the upstream's loss: {again:?}"
    );
    p.stop().await;
}

// ---------------------------------------------------------------------------------------------
// `"result": null`: a stub upstream (no SDK server answers a request with a null result on
// demand; JSON-RPC 2.0 allows any JSON value as a result)

/// Every request but `initialize` answered with `"result": null`, on the stub's SSE stream.
async fn null_result_upstream() -> u16 {
    stub_upstream(std::sync::Arc::new(|body| {
        Reply::now(raw_id(body).map(|id| format!(r#"{{"jsonrpc":"2.0","id":{id},"result":null}}"#)))
    }))
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adv23_result_null_is_a_response() {
    let port = null_result_upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let p = start_in_process(&format!("http://127.0.0.1:{port}/sse"), dir.path(), |_| {}).await;
    let (c, _) = Client::init(p.addr, "2025-06-18").await;
    let mut get = c.get(None).await.sse();
    let msgs = post_answered(
        &c,
        &mut get,
        r#"{"jsonrpc":"2.0","id":3,"method":"ping"}"#,
        "ping answered with a null result",
    )
    .await;
    let a = answer_to(&msgs, 3.0);
    assert!(
        a.is_some_and(|a| a["result"].is_null()),
        "the POST stream carried {msgs:?}"
    );
    p.stop().await;
}

// ---------------------------------------------------------------------------------------------
// Root certificates: the start check and the runtime decide "https" alike

/// Runs the proxy binary with `origin` allowed, on a config named `name`, with no system roots; its exit code (None: still running
/// after 5 s, then killed) and stderr.
fn run_without_roots(dir: &std::path::Path, name: &str, origin: &str) -> (Option<i32>, String) {
    let cfg = dir.join(format!("{name}.toml"));
    std::fs::write(
        &cfg,
        format!(
            "[listen]\naddr = \"127.0.0.1:0\"\n[admin]\naddr = \"127.0.0.1:0\"\n\
             [upstream]\nsse_url = \"http://127.0.0.1:9/sse\"\nallowed_endpoint_origins = [\"{origin}\"]\n\
             [log]\ndir = \"{}\"\ndurability = \"relaxed\"\n",
            dir.join(format!("{name}-data")).display()
        ),
    )
    .unwrap();
    let err = dir.join(format!("{name}.stderr"));
    let mut child = Command::new(env!("CARGO_BIN_EXE_mcp-resume-proxy"))
        .args(["run", "--config"])
        .arg(&cfg)
        .env("SSL_CERT_FILE", dir.join("no-such-roots.pem"))
        .env_remove("SSL_CERT_DIR")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&err).unwrap())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    let code = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s.code();
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    (code, std::fs::read_to_string(&err).unwrap_or_default())
}

#[test]
fn adv23_uppercase_https_endpoint_origin_is_checked_for_roots_at_start() {
    let dir = tempfile::tempdir().unwrap();
    // Control: lower case, no roots: one line naming the key, exit 64, before serving.
    let (code, err) = run_without_roots(dir.path(), "lower", "https://api.example.com");
    assert_eq!(code, Some(64), "{err}");
    assert!(err.contains("upstream.ca_file"), "{err}");
    // The same origin (parse_origin normalises it to https://api.example.com:443, and the
    // upstream settings treat it as https).
    let (code, err) = run_without_roots(dir.path(), "upper", "HTTPS://api.example.com");
    assert_eq!(
        code,
        Some(64),
        "started without roots for an https:// endpoint origin; stderr: {err}"
    );
    assert!(err.contains("upstream.ca_file"), "{err}");
}
