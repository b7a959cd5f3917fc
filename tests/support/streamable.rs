//! What only the Streamable HTTP face's tests (tests/streamable_*.rs) use: the proxy in-process, a
//! Streamable HTTP session driven by hand over [`send`], the test vocabulary of each upstream
//! [`Kind`], and the SDK client peers.

use std::net::SocketAddr;
use std::process::Command;

use mcp_resume_proxy::app::Running;
use mcp_resume_proxy::config::Config;
use serde_json::{json, Value};

use super::{
    metric_value, node_modules, peers_dir, python, require, send, Ev, Kind, Proc, Resp, Sse,
    Upstream,
};

// ---------------------------------------------------------------------------------------------
// What each upstream's tools send

impl Kind {
    /// A tool call sending `steps` progress notifications: (tool name, arguments).
    pub fn long_call(self, steps: u32) -> (&'static str, Value) {
        match self {
            Kind::FastMcp => ("tick", json!({"n": steps, "interval_ms": 250})),
            Kind::Everything => (
                "trigger-long-running-operation",
                json!({"duration": f64::from(steps) * 0.25, "steps": steps}),
            ),
        }
    }

    /// The text result of [`Kind::long_call`].
    pub fn long_result(self, steps: u32) -> String {
        match self {
            Kind::FastMcp => format!("done {steps}"),
            Kind::Everything => format!(
                "Long running operation completed. Duration: {} seconds, Steps: {steps}.",
                f64::from(steps) * 0.25
            ),
        }
    }

    /// Arguments of the `echo` tool.
    pub fn echo_args(self, text: &str) -> Value {
        match self {
            Kind::FastMcp => json!({"text": text}),
            Kind::Everything => json!({"message": text}),
        }
    }

    /// The text result of `echo`.
    pub fn echo_result(self, text: &str) -> String {
        match self {
            Kind::FastMcp => text.to_string(),
            Kind::Everything => format!("Echo: {text}"),
        }
    }

    /// Log notifications (standalone stream) the long call sends: FastMCP's `tick` logs once per
    /// step; server-everything's operation logs nothing.
    pub fn long_logs(self, steps: u32) -> Vec<String> {
        match self {
            Kind::FastMcp => (1..=steps).map(|i| format!("tick {i}")).collect(),
            Kind::Everything => Vec::new(),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The proxy in-process

pub struct Proxy {
    pub running: Running,
    pub dir: tempfile::TempDir,
}

impl Proxy {
    pub async fn start(upstream: &Upstream, tweak: impl FnOnce(&mut Config)) -> Proxy {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut cfg = Config::default();
        cfg.listen.addr = "127.0.0.1:0".into();
        cfg.admin.addr = "127.0.0.1:0".into();
        cfg.upstream.sse_url = upstream.sse_url();
        cfg.log.dir = dir.path().join("data");
        cfg.sessions.keepalive_secs = 1;
        tweak(&mut cfg);
        let running = mcp_resume_proxy::app::start(cfg)
            .await
            .expect("proxy starts");
        Proxy { running, dir }
    }

    pub fn addr(&self) -> SocketAddr {
        self.running.addr
    }

    pub fn url(&self) -> String {
        format!("http://{}/mcp", self.running.addr)
    }

    /// `/metrics` from the admin listener, over HTTP.
    pub async fn metrics(&self) -> String {
        let r = send(self.running.admin_addr, "GET", "/metrics", &[], None).await;
        assert_eq!(r.status, 200);
        String::from_utf8(r.bytes().await.to_vec()).expect("utf-8")
    }

    /// The value of one series of the admin `/metrics`.
    pub async fn metric(&self, series: &str) -> f64 {
        metric_value(&self.metrics().await, series)
    }

    pub async fn stop(self) {
        self.running.stop().await;
    }
}

// ---------------------------------------------------------------------------------------------
// Events described

impl Ev {
    /// Short description: `progress P`, `log X`, `response ID`, `priming`, or the method.
    pub fn describe(&self) -> String {
        if self.is_priming() {
            return "priming".into();
        }
        describe(&self.json())
    }
}

pub fn describe(m: &Value) -> String {
    match m["method"].as_str() {
        Some("notifications/progress") => format!(
            "progress {}",
            m["params"]["progress"].as_f64().expect("numeric progress")
        ),
        Some("notifications/message") => {
            format!("log {}", m["params"]["data"].as_str().unwrap_or("?"))
        }
        Some(other) => other.to_string(),
        None if m.get("error").is_some() => format!("error {} {}", m["id"], m["error"]["code"]),
        None => format!("response {}", m["id"]),
    }
}

// ---------------------------------------------------------------------------------------------
// A Streamable HTTP session driven by hand

pub const ACCEPT_BOTH: (&str, &str) = ("accept", "application/json, text/event-stream");
pub const ACCEPT_SSE: (&str, &str) = ("accept", "text/event-stream");
pub const JSON_CT: (&str, &str) = ("content-type", "application/json");

pub struct Client {
    pub addr: SocketAddr,
    pub session: String,
    pub version: String,
    next_id: u64,
}

impl Client {
    /// POST initialize at `version`, then `notifications/initialized`. Returns the client and the
    /// events of the initialize POST stream.
    pub async fn init(addr: SocketAddr, version: &str) -> (Client, Vec<Ev>) {
        let (c, evs, _) = Client::init_raw(addr, version).await;
        (c, evs)
    }

    /// [`Client::init`], also returning the raw bytes of the initialize POST stream.
    pub async fn init_raw(addr: SocketAddr, version: &str) -> (Client, Vec<Ev>, String) {
        let body = json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{
            "protocolVersion": version, "capabilities": {}, "clientInfo": {"name":"raw","version":"0"}}});
        let r = send(
            addr,
            "POST",
            "/mcp",
            &[ACCEPT_BOTH, JSON_CT],
            Some(&body.to_string()),
        )
        .await;
        assert_eq!(r.status, 200, "initialize answered {}", r.status);
        let session = r
            .header("mcp-session-id")
            .expect("Mcp-Session-Id on the initialize answer");
        assert_eq!(session.len(), 32);
        let mut sse = r.sse();
        let evs = sse.rest().await;
        let raw = String::from_utf8(sse.raw.clone()).expect("utf-8");
        let last = evs.last().expect("initialize response").json();
        assert_eq!(last["id"], 0, "{last}");
        assert!(last["result"]["protocolVersion"].is_string(), "{last}");
        let negotiated = last["result"]["protocolVersion"]
            .as_str()
            .unwrap()
            .to_string();
        let c = Client {
            addr,
            session,
            version: negotiated,
            next_id: 1,
        };
        let r = c
            .post(&json!({"jsonrpc":"2.0","method":"notifications/initialized"}))
            .await;
        assert_eq!(r.status, 202);
        (c, evs, raw)
    }

    /// The same session, sent to another proxy (another replica).
    pub fn at(&self, addr: SocketAddr) -> Client {
        Client {
            addr,
            session: self.session.clone(),
            version: self.version.clone(),
            next_id: self.next_id + 100,
        }
    }

    pub fn headers(&self) -> Vec<(&str, &str)> {
        vec![
            ("mcp-session-id", self.session.as_str()),
            ("mcp-protocol-version", self.version.as_str()),
        ]
    }

    pub fn id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    pub async fn post(&self, msg: &Value) -> Resp {
        self.post_raw(&msg.to_string(), &[]).await
    }

    pub async fn post_raw(&self, body: &str, extra: &[(&str, &str)]) -> Resp {
        let mut h = self.headers();
        h.push(ACCEPT_BOTH);
        h.push(JSON_CT);
        h.extend_from_slice(extra);
        send(self.addr, "POST", "/mcp", &h, Some(body)).await
    }

    /// A `tools/call` with a progress token; returns its SSE stream.
    pub async fn call(&mut self, tool: &str, args: Value, token: &str) -> (u64, Sse) {
        let id = self.id();
        let r = self
            .post(&json!({"jsonrpc":"2.0","id":id,"method":"tools/call",
                "params":{"name":tool,"arguments":args,"_meta":{"progressToken":token}}}))
            .await;
        assert_eq!(r.status, 200);
        (id, r.sse())
    }

    pub async fn get(&self, last_event_id: Option<&str>) -> Resp {
        let mut h = self.headers();
        h.push(ACCEPT_SSE);
        if let Some(l) = last_event_id {
            h.push(("last-event-id", l));
        }
        send(self.addr, "GET", "/mcp", &h, None).await
    }

    pub async fn delete(&self) -> Resp {
        send(self.addr, "DELETE", "/mcp", &self.headers(), None).await
    }
}

// ---------------------------------------------------------------------------------------------
// SDK client peers

/// `prog SCRIPT URL --tool TOOL --args ARGS EXTRA.. --timeout 90`, spawned as `name`.
fn sdk_client(
    name: &str,
    mut cmd: Command,
    url: &str,
    tool: &str,
    args: &Value,
    extra: &[&str],
) -> Proc {
    cmd.arg(url)
        .arg("--tool")
        .arg(tool)
        .arg("--args")
        .arg(args.to_string())
        .args(extra)
        .args(["--timeout", "90"]);
    Proc::spawn(name, cmd)
}

pub fn ts_client(url: &str, tool: &str, args: &Value, extra: &[&str]) -> Proc {
    let _ = node_modules();
    let script = require(
        peers_dir().join("ts_streamable_client.mjs"),
        "ts_streamable_client.mjs",
    );
    let mut c = Command::new("node");
    c.arg(script);
    sdk_client("ts_streamable_client", c, url, tool, args, extra)
}

pub fn py_client(url: &str, tool: &str, args: &Value, extra: &[&str]) -> Proc {
    let mut c = Command::new(python());
    c.arg(peers_dir().join("streamable_client.py"));
    sdk_client("streamable_client.py", c, url, tool, args, extra)
}

/// Numbers as the tests compare them (FastMCP sends 1.0, server-everything 1).
pub fn progress_values(list: &Value) -> Vec<f64> {
    list.as_array()
        .expect("progress list")
        .iter()
        .map(|p| p[0].as_f64().expect("numeric progress"))
        .collect()
}
