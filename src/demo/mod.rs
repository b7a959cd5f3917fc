//! The `demo` subcommand: an embedded legacy SSE MCP upstream ([`upstream`]), the proxy in front of
//! it on a temporary data dir, and a narrated client that starts a long call, disconnects mid-way,
//! resumes and gets every missed event exactly once, then meets a trimmed-cursor refusal. Every
//! claim it prints is checked; a broken step fails the demo.

pub mod upstream;

use std::borrow::Cow;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use serde_json::{json, Value};

use crate::config::{Config, Durability};
use crate::sse::Decoder;

type HttpClient = Client<HttpConnector, Full<Bytes>>;

/// A small SSE reader over a response body.
struct Stream {
    body: Incoming,
    buf: BytesMut,
    dec: Decoder,
}

impl Stream {
    async fn open(
        c: &HttpClient,
        url: &str,
        last_event_id: Option<&str>,
    ) -> Result<Stream, (u16, String)> {
        let mut req = http::Request::get(url).header("accept", "text/event-stream");
        if let Some(id) = last_event_id {
            req = req.header("last-event-id", id);
        }
        let resp = c
            .request(req.body(Full::new(Bytes::new())).expect("request"))
            .await
            .map_err(|e| (0, e.to_string()))?;
        let status = resp.status().as_u16();
        if status != 200 {
            let body = resp
                .into_body()
                .collect()
                .await
                .map(|b| b.to_bytes())
                .unwrap_or_default();
            return Err((status, String::from_utf8_lossy(&body).into_owned()));
        }
        Ok(Stream {
            body: resp.into_body(),
            buf: BytesMut::new(),
            dec: Decoder::new(16 << 20),
        })
    }

    /// Next event as (event type, id, data).
    async fn next(
        &mut self,
    ) -> Result<(Option<Cow<'static, str>>, Option<String>, String), String> {
        let fut = async {
            loop {
                if let Some(ev) = self.dec.decode(&mut self.buf).map_err(|e| e.to_string())? {
                    return Ok((
                        ev.event,
                        ev.id,
                        String::from_utf8_lossy(&ev.data).into_owned(),
                    ));
                }
                match self.body.frame().await {
                    None => return Err("stream ended".to_string()),
                    Some(Err(e)) => return Err(e.to_string()),
                    Some(Ok(f)) => {
                        if let Ok(d) = f.into_data() {
                            self.buf.extend_from_slice(&d);
                        }
                    }
                }
            }
        };
        tokio::time::timeout(Duration::from_secs(20), fut)
            .await
            .map_err(|_| "no event within 20 s".to_string())?
    }

    async fn message(&mut self) -> Result<(String, Value), String> {
        let (ev, id, data) = self.next().await?;
        if ev.as_deref() != Some("message") {
            return Err(format!("expected a message event, got {ev:?}"));
        }
        let id = id.ok_or("a logged event without id")?;
        Ok((id, serde_json::from_str(&data).map_err(|e| e.to_string())?))
    }
}

async fn post(c: &HttpClient, url: &str, msg: Value) -> Result<(), String> {
    let req = http::Request::post(url)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(msg.to_string())))
        .expect("request");
    let resp = c.request(req).await.map_err(|e| e.to_string())?;
    match resp.status().as_u16() {
        202 => Ok(()),
        s => Err(format!("POST answered {s}")),
    }
}

fn describe(m: &Value) -> String {
    if let Some(method) = m["method"].as_str() {
        match method {
            "notifications/progress" => format!(
                "progress {}/{}",
                m["params"]["progress"], m["params"]["total"]
            ),
            "notifications/message" => format!("log {}", m["params"]["data"]),
            other => other.to_string(),
        }
    } else if m.get("result").is_some() {
        format!(
            "result of request {}: {}",
            m["id"],
            m["result"]["content"][0]["text"].as_str().unwrap_or("{..}")
        )
    } else {
        format!("error for request {}: {}", m["id"], m["error"]["message"])
    }
}

fn check(ok: bool, what: &str) -> Result<(), String> {
    if ok {
        println!("   ✓ {what}");
        Ok(())
    } else {
        Err(format!("check failed: {what}"))
    }
}

/// The demo's proxy configuration: in front of `upstream`, logging to `dir`.
fn demo_config(upstream: String, dir: &std::path::Path) -> Config {
    let mut cfg = Config::default();
    cfg.listen.addr = "127.0.0.1:0".into();
    cfg.admin.addr = "127.0.0.1:0".into();
    cfg.upstream.sse_url = upstream;
    cfg.log.dir = dir.to_path_buf();
    cfg.log.durability = Durability::Fsync;
    cfg.log.max_events_per_session = 30;
    cfg.tasks.mode = crate::facade::modern::tasks::TaskMode::Always;
    cfg
}

/// Runs the narrated demo.
///
/// # Errors
/// A message when a step does not behave as narrated.
pub async fn run() -> Result<(), String> {
    let up = upstream::Upstream::spawn(upstream::UpstreamOptions::default())
        .await
        .map_err(|e| e.to_string())?;
    let dir = std::env::temp_dir().join(format!("mcp-resume-proxy-demo-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let proxy = crate::app::start(demo_config(up.sse_url(), &dir))
        .await
        .map_err(|e| e.to_string())?;
    let base = format!("http://{}", proxy.addr);
    let c: HttpClient = Client::builder(TokioExecutor::new()).build(HttpConnector::new());
    let mut result = narrate(&c, &base, &proxy).await;
    let proxy = match result {
        Ok(()) => match tasks_demo(&c, proxy, &up.sse_url(), &dir).await {
            Ok(p) => Some(p),
            Err(e) => {
                result = Err(e);
                None
            }
        },
        Err(_) => Some(proxy),
    };
    if let Some(p) = proxy {
        p.stop().await;
    }
    up.stop();
    let _ = std::fs::remove_dir_all(&dir);
    result
}

/// POSTs one 2026-07-28 request (declaring the tasks extension) and returns its JSON answer.
async fn modern(
    c: &HttpClient,
    base: &str,
    id: u64,
    method: &str,
    params: Value,
) -> Result<Value, String> {
    let mut params = params;
    params["_meta"] = json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {"extensions": {"io.modelcontextprotocol/tasks": {}}},
        "io.modelcontextprotocol/clientInfo": {"name": "demo-2026", "version": "1"},
    });
    let name = params["name"]
        .as_str()
        .or(params["taskId"].as_str())
        .map(str::to_string);
    let mut req = http::Request::post(format!("{base}/mcp"))
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", method);
    if let Some(n) = name {
        req = req.header("mcp-name", n);
    }
    let msg = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
    let resp = c
        .request(
            req.body(Full::new(Bytes::from(msg.to_string())))
                .expect("request"),
        )
        .await
        .map_err(|e| e.to_string())?;
    let body = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    serde_json::from_slice(&body).map_err(|e| format!("{e}: {}", String::from_utf8_lossy(&body)))
}

fn task_line(t: &Value) -> String {
    let mut s = t["status"].as_str().unwrap_or("?").to_string();
    if let Some(m) = t["statusMessage"].as_str() {
        s.push_str(&format!(" — {m}"));
    }
    if let Some(text) = t["result"]["content"][0]["text"].as_str() {
        s.push_str(&format!(" — result: {text}"));
    }
    if t.get("error").is_some() {
        s.push_str(&format!(
            " — error {}: {}",
            t["error"]["code"], t["error"]["message"]
        ));
    }
    s
}

/// ⑧–⑩: a 2026-07-28 client's tasks across a proxy restart. Returns the restarted proxy.
async fn tasks_demo(
    c: &HttpClient,
    proxy: crate::app::Running,
    upstream: &str,
    dir: &std::path::Path,
) -> Result<crate::app::Running, String> {
    let base = format!("http://{}", proxy.addr);
    println!("\n⑧ A 2026-07-28 client (stateless: no session, no Last-Event-ID) declares the tasks extension.");
    let d = modern(c, &base, 1, "server/discover", json!({})).await?;
    check(
        d["result"]["capabilities"]["extensions"]["io.modelcontextprotocol/tasks"] == json!({}),
        "server/discover advertises io.modelcontextprotocol/tasks",
    )?;
    let r = modern(
        c,
        &base,
        2,
        "tools/call",
        json!({"name": "count", "arguments": {"n": 3, "interval_ms": 100}}),
    )
    .await?;
    check(
        r["result"]["resultType"] == "task",
        "a tools/call returns a task handle (CreateTaskResult), logged and synced first",
    )?;
    let quick = r["result"]["taskId"].as_str().ok_or("taskId")?.to_string();
    println!("   task {quick}: {}", task_line(&r["result"]));
    let mut done = Value::Null;
    for i in 0..50 {
        let g = modern(c, &base, 10 + i, "tasks/get", json!({"taskId": quick})).await?;
        done = g["result"].clone();
        if done["status"] != "working" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    println!("   tasks/get: {}", task_line(&done));
    check(done["status"] == "completed", "the short task completed")?;
    let r = modern(
        c,
        &base,
        3,
        "tools/call",
        json!({"name": "count", "arguments": {"n": 100, "interval_ms": 200}}),
    )
    .await?;
    let long = r["result"]["taskId"].as_str().ok_or("taskId")?.to_string();
    tokio::time::sleep(Duration::from_millis(700)).await;
    let g = modern(c, &base, 4, "tasks/get", json!({"taskId": long})).await?;
    println!("   task {long}: {}", task_line(&g["result"]));
    check(
        g["result"]["status"] == "working",
        "a long task is working; its statusMessage follows upstream progress",
    )?;

    println!("\n⑨ The client goes away, and the proxy stops and starts again on the same log (here a stop;");
    println!("   tests/modern_tasks.rs does the same with SIGKILL). The long call's upstream session dies with it.");
    proxy.stop().await;
    let proxy = crate::app::start(demo_config(upstream.to_string(), dir))
        .await
        .map_err(|e| e.to_string())?;
    let base = format!("http://{}", proxy.addr);

    println!("\n⑩ The client comes back (new proxy address, same log) and polls its tasks:");
    let g = modern(c, &base, 5, "tasks/get", json!({"taskId": quick})).await?;
    println!("   task {quick}: {}", task_line(&g["result"]));
    check(
        g["result"]["status"] == "completed" && g["result"]["result"]["resultType"] == "complete",
        "the finished task still returns its result",
    )?;
    let g = modern(c, &base, 6, "tasks/get", json!({"taskId": long})).await?;
    println!("   task {long}: {}", task_line(&g["result"]));
    check(
        g["result"]["status"] == "failed"
            && g["result"]["error"]["code"] == crate::jsonrpc::INFLIGHT_ABORTED,
        "the unfinished one failed loudly with -32091 — never `working` forever",
    )?;
    println!("\nDemo complete.");
    Ok(proxy)
}

async fn narrate(c: &HttpClient, base: &str, proxy: &crate::app::Running) -> Result<(), String> {
    println!("mcp-resume-proxy demo");
    println!("① A legacy HTTP+SSE MCP server runs in this process; the proxy sits in front of it");
    println!("   at {base} (admin http://{}), logging to a temporary event log (fsync, 30 events retained per session).", proxy.admin_addr);

    println!("\n② A client opens GET /sse, initializes, lists tools.");
    let mut s = Stream::open(c, &format!("{base}/sse"), None)
        .await
        .map_err(|e| format!("{e:?}"))?;
    let (ev, id, endpoint) = s.next().await?;
    check(
        ev.as_deref() == Some("endpoint") && id.is_none(),
        &format!("endpoint event (no id): {endpoint}"),
    )?;
    let msg_url = format!("{base}{endpoint}");
    post(c, &msg_url, json!({"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2024-11-05","capabilities":{},"clientInfo":{"name":"demo","version":"1"}}})).await?;
    let (id1, m) = s.message().await?;
    println!("   id {id1}  {}", m["result"]["serverInfo"]);
    post(
        c,
        &msg_url,
        json!({"jsonrpc":"2.0","method":"notifications/initialized"}),
    )
    .await?;
    post(
        c,
        &msg_url,
        json!({"jsonrpc":"2.0","id":2,"method":"tools/list"}),
    )
    .await?;
    let (_, m) = s.message().await?;
    let tools: Vec<&str> = m["result"]["tools"]
        .as_array()
        .map(|t| t.iter().filter_map(|x| x["name"].as_str()).collect())
        .unwrap_or_default();
    println!("   tools: {}", tools.join(", "));

    println!("\n③ It starts a long call: count to 10 with progress notifications.");
    post(c, &msg_url, json!({"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"count","arguments":{"n":10,"interval_ms":120},"_meta":{"progressToken":"demo"}}})).await?;
    let mut seen: Vec<(String, Value)> = Vec::new();
    while seen
        .iter()
        .filter(|(_, m)| m["method"] == "notifications/progress")
        .count()
        < 3
    {
        let (id, m) = s.message().await?;
        println!("   id {id}  {}", describe(&m));
        seen.push((id, m));
    }
    let cursor = seen.last().map(|(id, _)| id.clone()).unwrap_or(id1);
    drop(s);
    println!("\n④ ✂ The client's connection drops mid-call (pod evicted, LB timeout, …). Its cursor: {cursor}");
    println!("   The upstream keeps running; the proxy keeps logging. (Without the proxy, the legacy server would");
    println!("   have dropped the whole session with the connection.)");
    tokio::time::sleep(Duration::from_millis(700)).await;

    println!("\n⑤ It reconnects to the same URL with Last-Event-ID: {cursor}");
    let mut s = Stream::open(c, &format!("{base}/sse"), Some(&cursor))
        .await
        .map_err(|e| format!("{e:?}"))?;
    let (_, _, ep) = s.next().await?;
    check(ep == endpoint, "same session: the endpoint is unchanged")?;
    let mut after: Vec<(String, Value)> = Vec::new();
    loop {
        let (id, m) = s.message().await?;
        println!("   id {id}  {}", describe(&m));
        let done = m["id"] == 3;
        after.push((id, m));
        if done {
            break;
        }
    }
    let all: Vec<&(String, Value)> = seen.iter().chain(after.iter()).collect();
    let seqs: Vec<u64> = all
        .iter()
        .filter_map(|(id, _)| id.rsplit(':').next()?.parse().ok())
        .collect();
    check(
        seqs.windows(2).all(|w| w[1] == w[0] + 1),
        "ids are contiguous across the cut: nothing missing, nothing repeated",
    )?;
    let progress: Vec<i64> = all
        .iter()
        .filter(|(_, m)| m["method"] == "notifications/progress")
        .filter_map(|(_, m)| m["params"]["progress"].as_i64())
        .collect();
    check(
        progress == (1..=10).collect::<Vec<_>>(),
        "progress 1..10, each exactly once, in order, then the result",
    )?;

    drop(s);
    println!("\n⑥ The client goes away again. While it is gone the server emits 60 events; the log retains");
    println!("   only the last 30 per session.");
    let sid = endpoint
        .rsplit('=')
        .next()
        .and_then(crate::log::cursor::SessionId::parse)
        .ok_or("session id")?;
    let sl = proxy.registry.log.get(&sid).ok_or("session log")?;
    let target = sl.head() + 61;
    post(c, &msg_url, json!({"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"emit","arguments":{"count":60,"rate_per_sec":0}}})).await?;
    let mut head = sl.subscribe();
    tokio::time::timeout(Duration::from_secs(20), head.wait_for(|h| *h >= target))
        .await
        .map_err(|_| "the emit was not logged in time")?
        .map_err(|e| e.to_string())?;
    let r = sl.ranges();
    println!(
        "   log now holds seq {}..={} of this session",
        r.oldest, r.head
    );
    println!("   A client that went away back at {cursor} tries to resume:");
    match Stream::open(c, &format!("{base}/sse"), Some(&cursor)).await {
        Ok(_) => return Err("a trimmed cursor was served: that would be a silent gap".into()),
        Err((status, body)) => {
            let v: Value = serde_json::from_str(&body).map_err(|e| e.to_string())?;
            println!("   HTTP {status}  {body}");
            check(
                status == 409 && v["error"]["data"]["reason"] == "cursor_trimmed",
                "refused loudly: 409 resume_gap, reason cursor_trimmed",
            )?;
        }
    }
    let metrics = proxy.metrics.render();
    println!(
        "\n⑦ The refusal is counted for dashboards and alerts (GET /metrics on the admin port):"
    );
    for line in metrics.lines().filter(|l| {
        l.starts_with("mcp_resume_refusals_total{reason=\"cursor_trimmed\"}")
            || l.starts_with("mcp_resume_resumes_total{facade=\"legacy\"}")
            || l.starts_with("mcp_resume_replayed_events_total")
            || l.starts_with("mcp_resume_events_logged_total")
    }) {
        println!("   {line}");
    }
    check(
        metrics.contains("mcp_resume_refusals_total{reason=\"cursor_trimmed\"} 1"),
        "one cursor_trimmed refusal counted",
    )?;
    println!(
        "\nThe client's remedy on 409: open a fresh stream and re-query what it had in flight."
    );
    Ok(())
}
