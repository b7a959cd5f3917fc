//! The 2026-07-28 pool partitioned by caller (design.md §11b; issue 16, point 5), on loopback in
//! front of the embedded demo upstream (it can send a flood of list changes on demand, which no
//! SDK server does): callers come from distinct loopback addresses (127.0.0.2, .3, …), since an
//! owner is a verified identity or else the peer address.
//!
//! - one owner (made-up `Authorization` values from one address) cannot lock others out of the
//!   pool with listens or with abandoned tasks: it gets `modern.max_per_identity` of each;
//! - anonymous callers at two addresses share no upstream session, no notification, and one
//!   cannot end the other's listen with `notifications/cancelled`;
//! - a listen ends gracefully after `modern.listen_max_secs`, and its slot is free again;
//! - a listen whose reader falls behind ends loudly (`slow_reader`), never skips silently.
//! - a request past `upstream.request_timeout_secs` leaves nothing for the next one: its upstream
//!   session, still busy with it, is never reused.
//!
//! Run: `cargo test --test modern_limits`.

mod support;

use std::time::Duration;

use serde_json::{json, Value};
use support::modern::{answer, call, demo, listen, post, V};
use support::security::Target;
use support::*;

/// Opens a listen; its stream, after the acknowledgement was read.
async fn listening(t: &Target, id: &str, auth: Option<&str>) -> Sse {
    let mut sse = post(t, &listen(id), auth).await.sse();
    let ack = sse.next().await.expect("the acknowledgement").json();
    assert_eq!(
        ack["method"], "notifications/subscriptions/acknowledged",
        "{ack}"
    );
    sse
}

/// A notification or answer of a listen stream (keepalives skipped), within `d`.
async fn next_message(sse: &mut Sse, d: Duration) -> Option<Value> {
    let deadline = tokio::time::Instant::now() + d;
    loop {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        match sse.next_within(left).await {
            Ok(Some(e)) if e.data.is_empty() => continue,
            Ok(Some(e)) => return Some(e.json()),
            Ok(None) | Err(()) => return None,
        }
    }
}

fn refused_for_capacity(v: &Value) {
    assert_eq!(v["error"]["code"], -32603, "{v}");
    assert_eq!(v["error"]["data"]["reason"], "capacity", "{v}");
}

/// With a pool of 4, four listens of made-up identities from one address pinned all four upstream
/// sessions and every other caller got `-32603` after the wait. Now that address is one owner:
/// two listens, then `capacity`; its calls wait for its own share only; a real user is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_owner_cannot_lock_others_out_with_listens() {
    let up = demo().await;
    let dir = tempfile::tempdir().unwrap();
    let p = start_in_process(&up.sse_url(), dir.path(), |c| {
        c.modern.pool_max_sessions = 4;
        c.modern.max_per_identity = 2;
        c.modern.pool_wait_secs = 1;
    })
    .await;
    let t = Target::plain(p.addr);
    let (attacker, user) = (t.via_peer("127.0.0.3"), t.via_peer("127.0.0.2"));
    let mut held = Vec::new();
    for i in 0..2 {
        let auth = format!("forged-{i}");
        held.push(listening(&attacker, &format!("l{i}"), Some(&auth)).await);
    }
    for i in 2..4 {
        let auth = format!("forged-{i}");
        let v = answer(&attacker, &listen(&format!("l{i}")), Some(&auth)).await;
        refused_for_capacity(&v);
    }
    // Its two pinned sessions are its share: a call of a third made-up identity waits for one
    // of its own, then is refused — it does not take the pool's two other sessions.
    let v = answer(
        &attacker,
        &call(5, "echo", json!({"text": "mine"}), false),
        Some("forged-5"),
    )
    .await;
    refused_for_capacity(&v);
    // The user is served, and can listen too.
    let v = answer(
        &user,
        &call(1, "echo", json!({"text": "hello"}), false),
        Some("user"),
    )
    .await;
    assert_eq!(v["result"]["content"][0]["text"], "hello", "{v}");
    let _mine = listening(&user, "u1", Some("user")).await;
    let pool = metric_value(&p.metrics.render(), "mcp_resume_upstream_pool_sessions");
    assert!(pool <= 4.0, "pool {pool}");
    // A listen that ends gives its slot back.
    drop(held.pop());
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let v = post(&attacker, &listen("again"), Some("forged-7")).await;
        if v.header("content-type").as_deref() == Some("text/event-stream") {
            break;
        }
        refused_for_capacity(&v.json().await);
        assert!(
            tokio::time::Instant::now() < deadline,
            "the slot never came back"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    p.stop().await;
}

/// Four abandoned tasks filled a pool of 4 for up to an hour. Now one owner's running tasks hold
/// at most its share of the pool: its third long call is refused, other callers are served (and
/// get tasks of their own).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abandoned_tasks_hold_only_their_owners_share() {
    let up = demo().await;
    let dir = tempfile::tempdir().unwrap();
    let p = start_in_process(&up.sse_url(), dir.path(), |c| {
        c.modern.pool_max_sessions = 4;
        c.modern.max_per_identity = 2;
        c.modern.pool_wait_secs = 1;
        c.tasks.mode = mcp_resume_proxy::modern::tasks::TaskMode::Always;
    })
    .await;
    let t = Target::plain(p.addr);
    let (attacker, user) = (t.via_peer("127.0.0.3"), t.via_peer("127.0.0.2"));
    // A minute of work each; the client never polls.
    let long = |id| call(id, "count", json!({"n": 600, "interval_ms": 100}), true);
    for i in 0..2 {
        let v = answer(&attacker, &long(i), Some(&format!("forged-{i}"))).await;
        assert_eq!(v["result"]["resultType"], "task", "{v}");
    }
    let v = answer(&attacker, &long(2), Some("forged-2")).await;
    refused_for_capacity(&v);
    let v = answer(&user, &call(7, "echo", json!({"text": "hi"}), false), None).await;
    assert_eq!(v["result"]["content"][0]["text"], "hi", "{v}");
    let v = answer(&user, &long(8), None).await;
    assert_eq!(v["result"]["resultType"], "task", "{v}");
    p.stop().await;
}

/// Anonymous callers were one principal: they shared upstream sessions, received each other's
/// list changes, and one could end the other's listen. Now each address is its own caller.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anonymous_callers_at_two_addresses_share_nothing() {
    let up = demo().await;
    let dir = tempfile::tempdir().unwrap();
    let p = start_in_process(&up.sse_url(), dir.path(), |_| {}).await;
    let t = Target::plain(p.addr);
    let (a, b) = (t.via_peer("127.0.0.2"), t.via_peer("127.0.0.3"));
    let mut la = listening(&a, "a-listen", None).await;
    let mut lb = listening(&b, "b-listen", None).await;
    let pool = || metric_value(&p.metrics.render(), "mcp_resume_upstream_pool_sessions");
    assert_eq!(pool(), 2.0, "one upstream session per address");

    let changed = call(1, "list_changed", json!({"count": 1}), false);
    let v = answer(&a, &changed, None).await;
    assert_eq!(v["result"]["content"][0]["text"], "sent 1", "{v}");
    let n = next_message(&mut la, WAIT).await.expect("A's list change");
    assert_eq!(n["method"], "notifications/tools/list_changed", "{n}");
    assert_eq!(
        n["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"],
        "a-listen"
    );

    // B posts a cancellation naming A's listen: it is not B's, nothing ends.
    let cancel = |rid: &str| {
        json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
            "params": {"requestId": rid, "_meta": {"io.modelcontextprotocol/protocolVersion": V}}})
    };
    let r = post(&b, &cancel("a-listen"), None).await;
    assert_eq!(r.status, 202);
    let v = answer(&a, &changed, None).await;
    assert_eq!(v["result"]["content"][0]["text"], "sent 1", "{v}");
    let n = next_message(&mut la, WAIT)
        .await
        .expect("A's listen outlived B's cancellation");
    assert_eq!(n["method"], "notifications/tools/list_changed", "{n}");

    // B saw none of A's changes: its own cancellation ends its stream with its result next.
    let r = post(&b, &cancel("b-listen"), None).await;
    assert_eq!(r.status, 202);
    let end = next_message(&mut lb, WAIT).await.expect("B's end");
    assert_eq!(
        end["id"], "b-listen",
        "B received another caller's notification: {end}"
    );
    assert_eq!(end["result"]["resultType"], "complete", "{end}");
    assert!(next_message(&mut lb, Duration::from_secs(1))
        .await
        .is_none());
    // A's own cancellation ends A's.
    let r = post(&a, &cancel("a-listen"), None).await;
    assert_eq!(r.status, 202);
    let end = next_message(&mut la, WAIT).await.expect("A's end");
    assert_eq!(end["id"], "a-listen", "{end}");
    p.stop().await;
}

/// `modern.listen_max_secs`: a listen ends gracefully (its result) once it has lasted that long,
/// and the owner's listen slot is free again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listens_end_after_listen_max_secs() {
    let up = demo().await;
    let dir = tempfile::tempdir().unwrap();
    let p = start_in_process(&up.sse_url(), dir.path(), |c| {
        c.modern.listen_max_secs = 1;
        c.modern.max_per_identity = 1;
    })
    .await;
    let t = Target::plain(p.addr).via_peer("127.0.0.2");
    let started = std::time::Instant::now();
    let mut l = listening(&t, "l", Some("alice")).await;
    let end = next_message(&mut l, WAIT).await.expect("the listen's end");
    assert_eq!(end["id"], "l", "{end}");
    assert_eq!(end["result"]["resultType"], "complete", "{end}");
    assert!(started.elapsed() >= Duration::from_secs(1));
    assert!(next_message(&mut l, Duration::from_secs(1)).await.is_none());
    // The slot is free: the client listens again.
    let _again = listening(&t, "l2", Some("alice")).await;
    p.stop().await;
}

/// A listen whose client stops reading while the upstream floods list changes: its queue fills,
/// and the listen is ended with a `slow_reader` error after what was queued — the reader learns
/// it missed notifications, the proxy's memory does not grow, the flooding call completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listen_whose_reader_falls_behind_ends_loudly() {
    let up = demo().await;
    let dir = tempfile::tempdir().unwrap();
    let p = start_in_process(&up.sse_url(), dir.path(), |_| {}).await;
    let t = Target::plain(p.addr).via_peer("127.0.0.2");
    let mut l = listening(&t, "slow", None).await;
    let flood = 100_000;
    let v = answer(
        &t,
        &call(1, "list_changed", json!({"count": flood}), false),
        None,
    )
    .await;
    assert_eq!(
        v["result"]["content"][0]["text"],
        format!("sent {flood}"),
        "{v}"
    );
    let mut changes = 0;
    let last = loop {
        let m = next_message(&mut l, WAIT).await.expect("the stream's end");
        if m["method"] == "notifications/tools/list_changed" {
            changes += 1;
            continue;
        }
        break m;
    };
    assert_eq!(last["id"], "slow", "{last}");
    assert_eq!(last["error"]["data"]["reason"], "slow_reader", "{last}");
    assert!(
        changes < flood,
        "{changes} notifications delivered of {flood}"
    );
    assert!(next_message(&mut l, Duration::from_secs(1)).await.is_none());
    assert_eq!(
        metric_value(
            &p.metrics.render(),
            "mcp_resume_dropped_total{reason=\"slow_reader\"}"
        ),
        1.0
    );
    p.stop().await;
}

/// A request past `upstream.request_timeout_secs` is answered `-32093`, but the upstream is
/// still working on it: the demo upstream (like any legacy server may) ignores the
/// `notifications/cancelled` the proxy sends and goes on logging one line per step. Its session
/// went back to the pool, and the caller's next call ran on it: being the one request in flight,
/// it received the abandoned call's log lines as its own (`data.request` another upstream id,
/// steps past its own three). Now a session whose request was abandoned takes no new request
/// and closes once the cancel is posted: the next call gets exactly its own three log lines and
/// its answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timed_out_request_leaves_nothing_for_the_next_one() {
    let up = demo().await;
    let dir = tempfile::tempdir().unwrap();
    let p = start_in_process(&up.sse_url(), dir.path(), |c| {
        c.upstream.request_timeout_secs = 1;
        c.modern.pool_wait_secs = 5;
    })
    .await;
    let t = Target::plain(p.addr).via_peer("127.0.0.2");
    let logged = |id: i64, n: u64, interval_ms: u64| {
        let mut m = call(
            id,
            "count",
            json!({"n": n, "interval_ms": interval_ms}),
            false,
        );
        m["params"]["_meta"]["io.modelcontextprotocol/logLevel"] = json!("info");
        m
    };
    // 100 steps 50 ms apart: 5 s of log lines, timed out after 1 s.
    let mut first = post(&t, &logged(1, 100, 50), Some("alice")).await.sse();
    let end = loop {
        let m = next_message(&mut first, WAIT)
            .await
            .expect("the first call's end");
        if m["method"] != "notifications/message" {
            break m;
        }
    };
    assert_eq!(end["id"], 1, "{end}");
    assert_eq!(end["error"]["code"], -32093, "{end}");
    assert_eq!(end["error"]["data"]["reason"], "request_timeout", "{end}");
    // The same caller's next call, while the upstream still logs for the first.
    let mut second = post(&t, &logged(2, 3, 100), Some("alice")).await.sse();
    let mut got = Vec::new();
    while let Some(m) = next_message(&mut second, WAIT).await {
        got.push(m);
    }
    let steps: Vec<Value> = got
        .iter()
        .filter(|m| m["method"] == "notifications/message")
        .map(|m| m["params"]["data"]["i"].clone())
        .collect();
    let requests: Vec<&Value> = got
        .iter()
        .filter(|m| m["method"] == "notifications/message")
        .map(|m| &m["params"]["data"]["request"])
        .collect();
    assert_eq!(steps, vec![json!(1), json!(2), json!(3)], "{got:#?}");
    assert!(
        requests.iter().all(|r| *r == requests[0]),
        "log lines of two upstream requests: {got:#?}"
    );
    assert_eq!(got.len(), 4, "{got:#?}");
    assert_eq!(got[3]["id"], 2, "{got:#?}");
    assert_eq!(
        got[3]["result"]["content"][0]["text"], "counted 3",
        "{got:#?}"
    );
    p.stop().await;
}
