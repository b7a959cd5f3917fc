//! Adversarial review 25 (main at 36c250f) of the fixes of review 24: `jsonrpc::error_response`
//! writes a string or integer id as its text, `Peek::refusal` refuses ids and progress tokens that
//! are not Unicode (ebf943d), and a request whose id is already in flight in its session is
//! refused (36c250f: `Session::forward` under the session lock, the Streamable face's pre-check of
//! a POST, a batch member that loses a race answered on the batch's stream).
//!
//! Probes:
//! - `adv25_a_timed_out_id_is_refused_until_its_late_answer_is_dropped` (FOUND, fixed): an id
//!   leaves the in-flight set when its `upstream.request_timeout_secs` answer (-32093) is logged,
//!   though the upstream still has that request in flight; the proxy takes a new request with the
//!   same id (an answered id may go again), and the upstream's late answer to the first is routed
//!   to the second's stream as its answer (`Session::route` looks up the in-flight entry before
//!   the timed-out set), while the second's own answer is dropped as "late". Fixed: an id the
//!   proxy answered itself stays refused until the upstream's late answer is dropped.
//! - `adv25_a_cancelled_request_is_answered_once_and_its_post_stream_ends` (FOUND, fixed): after
//!   the client's `notifications/cancelled`, the TypeScript server (as MCP says it SHOULD) never
//!   answers the request, so it stayed in flight for the life of the session: its POST stream
//!   never ended. Fixed: the proxy answers it, -32094, once, on its stream.
//! - `adv25_the_in_flight_refusal_echoes_the_id` (HELD): the 400 of an id in flight carries an
//!   integer past 64 bits as sent, an escaped string as the same string (single and batch).
//! - `adv25_client_responses_with_an_in_flight_id_are_taken` (HELD): a client's response to a
//!   server request whose id equals one of the client's own requests in flight is not refused
//!   (alone, in a batch of responses and notifications, beside a request; legacy face too).
//! - `adv25_a_batch_member_that_loses_the_race_is_answered_on_the_batch_stream` (HELD): a batch
//!   passes the pre-check, another POST takes one of its ids while the batch is being forwarded:
//!   the batch's stream carries the member's refusal and ends; the other POST keeps its answer.
//!
//! Run: `cargo test --test adversary25` (needs the peers of
//! `scripts/install-peers`).

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};
use support::streamable::*;
use support::stub_upstream::{raw_id, Reply};
use support::*;

/// The answers among `evs`, parsed.
fn answer_msgs(evs: &[Ev]) -> Vec<Value> {
    evs.iter()
        .filter(|e| answer_id(&e.data).is_some())
        .map(|e| e.json())
        .collect()
}

/// The stub upstream (`tests/support/stub_upstream.rs`; a server answering late, never, or after
/// a slow `202` on demand). A `tools/call` is answered from its arguments: `text` comes back as
/// the result's text after `delay_ms` (never, with `"never": true`), and the POST itself is
/// acknowledged only after `post_delay_ms`. Every other POSTed body is recorded in the returned
/// list.
async fn stub_upstream() -> (u16, Arc<Mutex<Vec<Value>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let record = seen.clone();
    let port = support::stub_upstream::stub_upstream(Arc::new(move |body| {
        let msg = serde_json::from_slice::<Value>(body).unwrap_or(Value::Null);
        let args = &msg["params"]["arguments"];
        let ms = |key: &str| Duration::from_millis(args[key].as_u64().unwrap_or(0));
        let ack_after = ms("post_delay_ms");
        if msg["method"] != "tools/call" {
            record.lock().unwrap().push(msg.clone());
            return Reply {
                ack_after,
                ..Reply::default()
            };
        }
        let id = raw_id(body).unwrap_or_else(|| "null".into());
        let result = json!({"content": [{"type": "text", "text": args["text"]}]});
        Reply {
            ack_after,
            send: (args["never"] != true)
                .then(|| format!(r#"{{"jsonrpc":"2.0","id":{id},"result":{result}}}"#)),
            send_after: ms("delay_ms"),
        }
    }))
    .await;
    (port, seen)
}

/// A `tools/call` for the stub with id text `id` and arguments `args`.
fn stub_call(id: &str, args: Value) -> String {
    format!(
        r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"t","arguments":{args}}}}}"#
    )
}

/// The text of an answer's result (`None`: an error, or no answer).
fn result_text(m: &Value) -> Option<&str> {
    m["result"]["content"][0]["text"].as_str()
}

// ---------------------------------------------------------------------------------------------
// A timed-out id is still in flight upstream

/// FOUND, fixed: a request answered -32093 by `upstream.request_timeout_secs` is still in flight
/// at the upstream, but its id left the proxy's in-flight set, so a new request with that id was
/// taken; the upstream's late answer to the first then found the second's in-flight entry and
/// was delivered on the second's POST stream as its answer, and the second's own answer was
/// dropped as a "late response". Now the id stays refused (400) until the late answer has come
/// and been dropped; then it is taken again, and answered with its own answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adv25_a_timed_out_id_is_refused_until_its_late_answer_is_dropped() {
    let (port, _) = stub_upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let p = start_in_process(&format!("http://127.0.0.1:{port}/sse"), dir.path(), |c| {
        c.upstream.request_timeout_secs = 2;
    })
    .await;
    let (c, _) = Client::init(p.addr, "2025-06-18").await;
    // The upstream answers the first after 3 s: 1 s after its -32093.
    let r = c
        .post_raw(
            &stub_call("5", json!({"text": "first", "delay_ms": 3000})),
            &[],
        )
        .await;
    assert_eq!(r.status, 200);
    let (evs, ended) = r.sse().events_within(Duration::from_secs(4)).await;
    assert!(ended, "{evs:?}");
    let first = answer_msgs(&evs);
    assert_eq!(first.len(), 1, "{first:?}");
    assert_eq!(first[0]["error"]["code"], -32093, "{first:?}");
    // The upstream still has it: the id is refused, not taken over.
    let second = stub_call("5", json!({"text": "second", "delay_ms": 100}));
    let r = c.post_raw(&second, &[]).await;
    assert_eq!(r.status, 400, "the id is still in flight upstream");
    // Its late answer comes (about 1 s after the -32093) and is dropped; then the id is free.
    let mut taken = None;
    for _ in 0..40 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let r = c.post_raw(&second, &[]).await;
        if r.status == 200 {
            taken = Some(r);
            break;
        }
        assert_eq!(r.status, 400);
    }
    let r = taken.expect("the id is taken again once the late answer is dropped");
    let (evs, ended) = r.sse().events_within(Duration::from_secs(4)).await;
    assert!(ended, "{evs:?}");
    let second = answer_msgs(&evs);
    assert_eq!(second.len(), 1, "{second:?}");
    assert_eq!(result_text(&second[0]), Some("second"), "{}", second[0]);
    p.stop().await;
}

// ---------------------------------------------------------------------------------------------
// A cancelled request

/// FOUND, fixed: MCP's cancellation — the client sends `notifications/cancelled` for its
/// request, and the server "SHOULD NOT send a response for the cancelled request" (the
/// TypeScript SDK's servers never do; its clients cancel every request still unanswered after
/// 60 s by default). Nothing took the request out of the proxy's in-flight set, so its POST
/// stream never ended (its connection and stream task held for the session's life) and the
/// session's end answered it -32091. Now the proxy answers a cancelled request itself, -32094 on
/// its stream (the POST stream ends; on the legacy face, the session's stream), exactly once,
/// and the id stays refused while the upstream may still answer it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adv25_a_cancelled_request_is_answered_once_and_its_post_stream_ends() {
    let up = everything().await;
    let p = Proxy::start(&up, |_| {}).await;
    let (c, _) = Client::init(p.addr(), "2025-06-18").await;
    let slow = |id: &str| {
        format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"trigger-long-running-operation","arguments":{{"duration":1,"steps":1}}}}}}"#
        )
    };
    let cancel = |id: u64| {
        json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
            "params": {"requestId": id, "reason": "the user gave up"}})
    };
    let first = c.post_raw(&slow("5"), &[]).await;
    assert_eq!(first.status, 200);
    let mut first = first.sse();
    // The legacy face: no POST stream, but the same in-flight entry.
    let base = format!("http://{}", p.addr());
    let (mut sse, url, _) = legacy_session(&base).await;
    let ct = [("content-type", "application/json")];
    let (status, _, b) = request("POST", &url, &ct, &slow("9")).await;
    assert_eq!(status, 202, "{b}");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(c.post(&cancel(5)).await.status, 202);
    assert_eq!(post(&url, &cancel(9)).await.0, 202);
    // The POST stream ends with the proxy's answer; the operation ends after 1 s and the server
    // drops its result, and nothing more comes on either face.
    let (evs, ended) = first.events_within(Duration::from_secs(3)).await;
    assert!(ended, "the cancelled request's POST stream ends: {evs:?}");
    let answers = answer_msgs(&evs);
    assert_eq!(answers.len(), 1, "{answers:?}");
    assert_eq!(answers[0]["id"], 5, "{answers:?}");
    assert_eq!(answers[0]["error"]["code"], -32094, "{answers:?}");
    let (legacy_evs, _) = sse.events_within(Duration::from_millis(1500)).await;
    let legacy = answer_msgs(&legacy_evs);
    assert_eq!(
        legacy.len(),
        1,
        "one answer on the legacy stream: {legacy:?}"
    );
    assert_eq!(legacy[0]["id"], 9, "{legacy:?}");
    assert_eq!(legacy[0]["error"]["code"], -32094, "{legacy:?}");
    // A cancel naming nothing in flight (answered, unknown, or not a request id) changes nothing.
    assert_eq!(c.post(&cancel(5)).await.status, 202);
    assert_eq!(c.post(&cancel(77)).await.status, 202);
    let r = c.post_raw(&slow("6"), &[]).await;
    assert_eq!(r.status, 200);
    let (evs, ended) = r.sse().events_within(Duration::from_secs(5)).await;
    assert!(ended, "{evs:?}");
    let answers = answer_msgs(&evs);
    assert_eq!(answers.len(), 1, "{answers:?}");
    assert!(answers[0].get("result").is_some(), "{answers:?}");
    p.stop().await;
}

// ---------------------------------------------------------------------------------------------
// The refusal's id

/// HELD: the 400 refusing an id in flight carries the id as sent when serde_json's `Value` cannot
/// hold it (an integer past 64 bits), and an escaped string id as the same string.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adv25_the_in_flight_refusal_echoes_the_id() {
    let (port, _) = stub_upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let p = start_in_process(&format!("http://127.0.0.1:{port}/sse"), dir.path(), |_| {}).await;
    let (c, _) = Client::init(p.addr, "2025-03-26").await;
    for (id, again) in [
        (
            "123456789012345678901234567890",
            "123456789012345678901234567890",
        ),
        ("-98765432109876543210", "-98765432109876543210"),
        (r#""\u00e9x""#, r#""éx""#),
    ] {
        let r = c
            .post_raw(&stub_call(id, json!({"never": true})), &[])
            .await;
        assert_eq!(r.status, 200, "{id}");
        for body in [
            stub_call(again, json!({"never": true})),
            format!("[{}]", stub_call(again, json!({"never": true}))),
        ] {
            let r = c.post_raw(&body, &[]).await;
            assert_eq!(r.status, 400, "{body}");
            let b = r.bytes().await;
            let got = answer_id(&b).expect("a JSON-RPC error");
            assert_eq!(
                serde_json::from_str::<Value>(&got).ok(),
                serde_json::from_str::<Value>(id).ok(),
                "{body}: {}",
                String::from_utf8_lossy(&b)
            );
            if !id.starts_with('"') {
                assert_eq!(got, id, "the integer's text");
            }
        }
    }
    p.stop().await;
}

// ---------------------------------------------------------------------------------------------
// A client's responses carry the server's ids

/// HELD: a client's response to a server request carries the server's id, which may equal one of
/// the client's own request ids in flight: it is no request, and is taken — alone, in a batch of
/// responses and notifications, beside a request (whose answer comes on the batch's stream) — and
/// forwarded; on the legacy face too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adv25_client_responses_with_an_in_flight_id_are_taken() {
    let (port, seen) = stub_upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let p = start_in_process(&format!("http://127.0.0.1:{port}/sse"), dir.path(), |_| {}).await;
    let (c, _) = Client::init(p.addr, "2025-03-26").await;
    let held = c
        .post_raw(&stub_call("5", json!({"never": true})), &[])
        .await;
    assert_eq!(held.status, 200);
    let response = r#"{"jsonrpc":"2.0","id":5,"result":{}}"#;
    let error = r#"{"jsonrpc":"2.0","id":"5","error":{"code":-1,"message":"no"}}"#;
    let note = r#"{"jsonrpc":"2.0","method":"notifications/roots/list_changed"}"#;
    for body in [response.to_string(), format!("[{response},{note},{error}]")] {
        let r = c.post_raw(&body, &[]).await;
        let status = r.status;
        assert_eq!(status, 202, "{body}: {:?}", r.bytes().await);
    }
    let r = c
        .post_raw(
            &format!("[{response},{}]", stub_call("6", json!({"text": "six"}))),
            &[],
        )
        .await;
    assert_eq!(r.status, 200);
    let (evs, ended) = r.sse().events_within(Duration::from_secs(3)).await;
    assert!(ended, "{evs:?}");
    let got = answer_msgs(&evs);
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(result_text(&got[0]), Some("six"), "{got:?}");
    // Legacy: a response with the id of the client's request in flight.
    let base = format!("http://{}", p.addr);
    let (_sse, url, _) = legacy_session(&base).await;
    let ct = [("content-type", "application/json")];
    let (status, _, b) = request("POST", &url, &ct, &stub_call("7", json!({"never": true}))).await;
    assert_eq!(status, 202, "{b}");
    let (status, _, b) =
        request("POST", &url, &ct, r#"{"jsonrpc":"2.0","id":7,"result":{}}"#).await;
    assert_eq!(status, 202, "{b}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let seen = seen.lock().unwrap().clone();
    let responses = seen.iter().filter(|m| m.get("method").is_none()).count();
    // 1 + 2 + 1 (streamable) + 1 (legacy)
    assert_eq!(responses, 5, "{seen:?}");
    p.stop().await;
}

// ---------------------------------------------------------------------------------------------
// A batch member that loses the race

/// HELD: a batch passes the pre-check; while its first member is being forwarded (the upstream
/// acknowledges it only after 1.5 s), another POST takes the id of its second member. The
/// session refuses that member: the batch's stream carries its refusal (-32600, with its id) and
/// the first member's answer, then ends; the other POST's stream ends with its own answer, once;
/// nothing else is answered with that id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adv25_a_batch_member_that_loses_the_race_is_answered_on_the_batch_stream() {
    let (port, _) = stub_upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let p = start_in_process(&format!("http://127.0.0.1:{port}/sse"), dir.path(), |_| {}).await;
    let (c, _) = Client::init(p.addr, "2025-03-26").await;
    let mut get = c.get(None).await.sse();
    let batch = format!(
        "[{},{}]",
        stub_call("10", json!({"text": "ten", "post_delay_ms": 1500})),
        stub_call("11", json!({"text": "batch eleven"}))
    );
    let c2 = c.at(c.addr);
    let b = tokio::spawn(async move { c2.post_raw(&batch, &[]).await });
    tokio::time::sleep(Duration::from_millis(500)).await;
    let other = c
        .post_raw(
            &stub_call("11", json!({"text": "other eleven", "delay_ms": 2000})),
            &[],
        )
        .await;
    assert_eq!(other.status, 200);
    let b = b.await.unwrap();
    assert_eq!(b.status, 200);
    let (evs, ended) = b.sse().events_within(Duration::from_secs(3)).await;
    assert!(ended, "{evs:?}");
    let got = answer_msgs(&evs);
    assert_eq!(got.len(), 2, "{got:?}");
    let ten = got.iter().find(|m| m["id"] == 10).expect("10's answer");
    assert_eq!(result_text(ten), Some("ten"), "{got:?}");
    let eleven = got.iter().find(|m| m["id"] == 11).expect("11's refusal");
    assert_eq!(eleven["error"]["code"], -32600, "{eleven}");
    let (evs, ended) = other.sse().events_within(Duration::from_secs(3)).await;
    assert!(ended, "{evs:?}");
    let got = answer_msgs(&evs);
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(result_text(&got[0]), Some("other eleven"), "{got:?}");
    let (stray, _) = get.events_within(Duration::from_millis(300)).await;
    assert!(answer_msgs(&stray).is_empty(), "{stray:?}");
    p.stop().await;
}
