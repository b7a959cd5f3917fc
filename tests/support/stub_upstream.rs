//! A legacy HTTP+SSE upstream stub, for the failures and answers no SDK server gives on demand
//! (a request never answered, `"result": null`, a server writing every member): each test that
//! uses it says why. `initialize` is answered by the stub; every other POSTed message is handed
//! to the test's [`Answerer`].

use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, value::RawValue, Value};

/// What a stub upstream does with one POSTed message: when it acknowledges the POST (`202`,
/// connection closed), and what it then sends on its SSE stream (each line one event), after how
/// long.
#[derive(Default)]
pub struct Reply {
    pub ack_after: Duration,
    pub send: Option<String>,
    pub send_after: Duration,
}

impl Reply {
    /// `send` (if any) at once.
    pub fn now(send: Option<String>) -> Self {
        Self {
            send,
            ..Self::default()
        }
    }
}

/// The stub's [`Reply`] to one POSTed message (its raw bytes). `initialize` is answered by the
/// stub itself.
pub type Answerer = Arc<dyn Fn(&[u8]) -> Reply + Send + Sync>;

/// The raw text of a message's `id` (as sent, `null` included), if any.
pub fn raw_id(body: &[u8]) -> Option<String> {
    serde_json::from_slice::<std::collections::BTreeMap<String, &RawValue>>(body)
        .ok()?
        .get("id")
        .map(|r| r.get().to_string())
}

/// A legacy HTTP+SSE upstream stub: `initialize` is answered (its id echoed byte for byte), every
/// other message is handed to `answer` (whose lines are sent as one event each).
pub async fn stub_upstream(answer: Answerer) -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let l = tokio::net::TcpListener::bind(("127.0.0.1", 0))
        .await
        .unwrap();
    let port = l.local_addr().unwrap().port();
    let (tx, rx) = tokio::sync::broadcast::channel::<String>(64);
    drop(rx);
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            let tx = tx.clone();
            let answer = answer.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut b = [0u8; 8192];
                let head_end = loop {
                    if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        break i + 4;
                    }
                    match s.read(&mut b).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&b[..n]),
                    }
                };
                let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
                if head.starts_with("get") {
                    let mut rx = tx.subscribe();
                    let _ = s
                        .write_all(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n\r\nevent: endpoint\ndata: /messages?session_id=stub\n\n")
                        .await;
                    while let Ok(m) = rx.recv().await {
                        // One event per line of `m`.
                        for line in m.lines() {
                            let ev = format!("event: message\ndata: {line}\n\n");
                            if s.write_all(ev.as_bytes()).await.is_err() {
                                return;
                            }
                        }
                    }
                    return;
                }
                let len: usize = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .and_then(|v| v.trim().parse().ok())
                    .unwrap_or(0);
                while buf.len() < head_end + len {
                    match s.read(&mut b).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&b[..n]),
                    }
                }
                let body = &buf[head_end..head_end + len];
                let Ok(msg) = serde_json::from_slice::<Value>(body) else {
                    return;
                };
                let reply = if msg["method"] == "initialize" {
                    let id = raw_id(body).unwrap_or_else(|| "null".into());
                    let result = json!({
                        "protocolVersion": msg["params"]["protocolVersion"],
                        "capabilities": {"tools": {}},
                        "serverInfo": {"name": "stub", "version": "0"}});
                    Reply::now(Some(format!(
                        r#"{{"jsonrpc":"2.0","id":{id},"result":{result}}}"#
                    )))
                } else {
                    answer(body)
                };
                tokio::time::sleep(reply.ack_after).await;
                let _ = s
                    .write_all(b"HTTP/1.1 202 Accepted\r\nconnection: close\r\ncontent-length: 8\r\n\r\nAccepted")
                    .await;
                drop(s);
                tokio::time::sleep(reply.send_after).await;
                if let Some(out) = reply.send {
                    let _ = tx.send(out);
                }
            });
        }
    });
    port
}
