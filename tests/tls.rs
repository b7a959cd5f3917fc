//! TLS with rustls (issue 10, design.md §11), with certificates made at test time (rcgen): a real
//! TLS client (the Python SDK over `https://`) end to end with a cut and a resume; clients refuse
//! a wrong CA and an expired certificate; mutual TLS refuses a missing or foreign client
//! certificate in the handshake and binds sessions to the certificate; a rotated certificate
//! serves new connections while a stream opened before keeps flowing; an `https://` upstream
//! behind a TLS front with `upstream.ca_file`; bad TLS files stop the binary with exit 64.
//!
//! Run: `cargo test --test tls` (after `scripts/install-peers`).

mod support;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use mcp_resume_proxy::config::Config;
use serde_json::{json, Value};
use support::security::*;
use support::streamable::Proxy;
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const A: (&str, &str) = ("authorization", "Bearer token-A-2b1c5d");
const A_HEADER: &str = "Authorization: Bearer token-A-2b1c5d";

fn parse(line: &str) -> Value {
    serde_json::from_str(line)
        .unwrap_or_else(|e| panic!("peer printed a non-JSON line ({e}): {line}"))
}

/// A CA, a server certificate for 127.0.0.1 (serial 1), their files in a temp dir.
struct Pki {
    dir: tempfile::TempDir,
    ca: Ca,
    server: Leaf,
    ca_file: PathBuf,
    cert_file: PathBuf,
    key_file: PathBuf,
}

fn pki() -> Pki {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("test ca");
    let server = ca.server(1, false);
    let ca_file = dir.path().join("ca.pem");
    std::fs::write(&ca_file, ca.pem()).unwrap();
    let (cert_file, key_file) = server.write(dir.path(), "server");
    Pki {
        dir,
        ca,
        server,
        ca_file,
        cert_file,
        key_file,
    }
}

fn with_tls(p: &Pki) -> impl FnOnce(&mut Config) + '_ {
    move |c| {
        c.tls.cert_file = Some(p.cert_file.clone());
        c.tls.key_file = Some(p.key_file.clone());
    }
}

fn py_auth_client(url: &str, extra: &[&str]) -> Proc {
    let mut c = std::process::Command::new(python());
    c.arg(peers_dir().join("py_auth_client.py"))
        .arg(url)
        .args(extra)
        .args(["--timeout", "90"]);
    Proc::spawn("py_auth_client", c)
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// (a) The Python SDK over `https://` (trusting the test CA), through a relay that the test
/// severs mid-call: the SDK resumes its POST stream and its standalone stream over new TLS
/// connections, and every progress notification, log and the result arrive exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_sdk_over_https_is_cut_and_resumes() {
    let pki = pki();
    let up = fastmcp().await;
    let proxy = Proxy::start(&up, with_tls(&pki)).await;
    let relay = HalfOpenRelay::start(proxy.addr()).await;
    let mut client = py_auth_client(
        &format!("https://127.0.0.1:{}/mcp", relay.addr.port()),
        &[
            "--cafile",
            s(&pki.ca_file),
            "--header",
            A_HEADER,
            "--tool",
            "tick",
            "--args",
            r#"{"n": 6, "interval_ms": 250}"#,
            "--expect-logs",
            "6",
        ],
    );
    let mut progress = 0;
    let mut severed = 0;
    let out = loop {
        let line = client
            .line_async()
            .await
            .unwrap_or_else(|| panic!("client failed (status {:?})", client.wait()));
        let v = parse(&line);
        if v["event"] == "progress" {
            progress += 1;
            if progress == 2 {
                severed = relay.sever();
            }
        }
        if v.get("result").is_some() {
            break v;
        }
    };
    assert_eq!(client.wait(), Some(0));
    assert!(severed >= 1, "the cut closed the call's connection");
    assert_eq!(out["result"], "done 6", "{out}");
    assert_eq!(out["progress"], json!([1, 2, 3, 4, 5, 6]), "{out}");
    let logs: Vec<String> = (1..=6).map(|i| format!("tick {i}")).collect();
    assert_eq!(out["logs"], json!(logs), "{out}");
    assert!(
        proxy
            .metric("mcp_resume_resumes_total{facade=\"streamable\"}")
            .await
            >= 1.0,
        "the SDK resumed (GET + Last-Event-ID) over TLS"
    );
    assert_eq!(
        proxy
            .metric("mcp_resume_sessions_started_total{facade=\"streamable\"}")
            .await,
        1.0,
        "one session throughout"
    );
    assert_eq!(
        proxy
            .metric("mcp_resume_sessions_ended_total{reason=\"client_delete\"}")
            .await,
        1.0
    );
    proxy.stop().await;
}

/// (b) A client refuses a server certificate from another CA, and an expired one; plain HTTP on
/// the TLS port gets no HTTP answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_refuse_a_wrong_ca_and_an_expired_certificate() {
    let pki = pki();
    let up = fastmcp().await;
    let proxy = Proxy::start(&up, with_tls(&pki)).await;
    let leaf = handshake(proxy.addr(), client_config(&pki.ca, None))
        .await
        .expect("the right CA is accepted");
    assert_eq!(leaf, pki.server.der);
    let other = Ca::new("other ca");
    let e = handshake(proxy.addr(), client_config(&other, None))
        .await
        .expect_err("a certificate of another CA");
    assert!(e.to_string().contains("UnknownIssuer"), "{e}");
    // The Python SDK (OpenSSL) refuses it too.
    let other_file = pki.dir.path().join("other-ca.pem");
    std::fs::write(&other_file, other.pem()).unwrap();
    let mut client = py_auth_client(
        &format!("https://127.0.0.1:{}/mcp", proxy.addr().port()),
        &["--cafile", s(&other_file)],
    );
    assert_eq!(
        client.line_async().await,
        None,
        "no output: it never connected"
    );
    assert_eq!(client.wait(), Some(1));
    // Plain HTTP on the TLS port.
    let mut tcp = TcpStream::connect(proxy.addr()).await.unwrap();
    tcp.write_all(b"GET /mcp HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n")
        .await
        .unwrap();
    let mut buf = Vec::new();
    let _ = tokio::time::timeout(WAIT, tcp.read_to_end(&mut buf)).await;
    assert!(!buf.starts_with(b"HTTP/1.1 2"), "{buf:?}");
    assert_eq!(
        proxy
            .metric("mcp_resume_sessions_started_total{facade=\"streamable\"}")
            .await,
        0.0
    );
    proxy.stop().await;

    let expired = pki.ca.server(2, true);
    let (c, k) = expired.write(pki.dir.path(), "expired");
    let proxy = Proxy::start(&up, |cfg| {
        cfg.tls.cert_file = Some(c);
        cfg.tls.key_file = Some(k);
    })
    .await;
    let e = handshake(proxy.addr(), client_config(&pki.ca, None))
        .await
        .expect_err("an expired certificate");
    assert!(e.to_string().contains("certificate expired"), "{e}");
    proxy.stop().await;
}

/// (c) Mutual TLS: no client certificate, or one from another CA, is refused in the handshake; a
/// valid one works and is the caller's identity — a session opened with certificate X cannot be
/// used with certificate Y (same headers): 404, counted, on both faces. The Python SDK with a
/// client certificate works end to end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_binds_sessions_to_the_client_certificate() {
    let pki = pki();
    let clients = Ca::new("client ca");
    let client_ca = pki.dir.path().join("client-ca.pem");
    std::fs::write(&client_ca, clients.pem()).unwrap();
    let up = fastmcp().await;
    let proxy = Proxy::start(&up, |c| {
        with_tls(&pki)(c);
        c.tls.client_ca_file = Some(client_ca.clone());
    })
    .await;
    let admin = proxy.running.admin_addr;
    let (x, y) = (clients.client("x"), clients.client("y"));
    let foreign = Ca::new("foreign").client("x");

    handshake(proxy.addr(), client_config(&pki.ca, None))
        .await
        .expect_err("no client certificate");
    handshake(proxy.addr(), client_config(&pki.ca, Some(&foreign)))
        .await
        .expect_err("a client certificate of another CA");
    handshake(proxy.addr(), client_config(&pki.ca, Some(&x)))
        .await
        .expect("a valid client certificate");

    let tx = Target::tls(proxy.addr(), client_config(&pki.ca, Some(&x)));
    let ty = Target::tls(proxy.addr(), client_config(&pki.ca, Some(&y)));
    // Streamable, same Authorization on both.
    let sid = mcp_init(&tx, V_NEW, &[A]).await;
    let echo = |id: u64, t: &str| tool_call(id, "echo", json!({ "text": t }));
    refused(
        mcp_post(&ty, &sid, &[A], &echo(2, "by y")).await,
        404,
        "unknown_session",
    )
    .await;
    refused(mcp_get(&ty, &sid, &[A], None).await, 404, "unknown_session").await;
    refused(mcp_delete(&ty, &sid, &[A]).await, 404, "unknown_session").await;
    assert_eq!(metric_at(admin, AUTH_REJECTED_STREAMABLE).await, 3.0);
    let done = mcp_call(&tx, &sid, &[A], &echo(3, "by x")).await;
    assert_eq!(done["result"]["content"][0]["text"], "by x");
    // Legacy, the certificate alone as identity.
    let (mut sse, l, c1) = legacy_session_as(&tx, &[]).await;
    refused(
        legacy_post(&ty, &l, &[], &echo(4, "by y")).await,
        404,
        "unknown_session",
    )
    .await;
    refused(legacy_resume(&ty, &[], &c1).await, 404, "unknown_session").await;
    assert_eq!(metric_at(admin, AUTH_REJECTED_LEGACY).await, 2.0);
    assert_eq!(
        legacy_post(&tx, &l, &[], &echo(5, "x again")).await.status,
        202
    );
    let (_, m) = sse.message().await;
    assert_eq!(m["result"]["content"][0]["text"], "x again");

    // The Python SDK with a client certificate; and without one it cannot connect.
    let (xc, xk) = x.write(pki.dir.path(), "x");
    let url = format!("https://127.0.0.1:{}/mcp", proxy.addr().port());
    let mut client = py_auth_client(
        &url,
        &[
            "--cafile",
            s(&pki.ca_file),
            "--cert",
            s(&xc),
            "--key",
            s(&xk),
            "--tool",
            "echo",
            "--args",
            r#"{"text": "over mutual TLS"}"#,
        ],
    );
    let mut out = Value::Null;
    while let Some(line) = client.line_async().await {
        out = parse(&line);
    }
    assert_eq!(client.wait(), Some(0));
    assert_eq!(out["result"], "over mutual TLS", "{out}");
    let mut client = py_auth_client(&url, &["--cafile", s(&pki.ca_file)]);
    assert_eq!(client.line_async().await, None);
    assert_eq!(client.wait(), Some(1));
    proxy.stop().await;
}

/// (d) Rotation: new files (cert-manager style) with `tls.reload_secs = 1`: new connections get
/// the new certificate, while an SSE stream opened before keeps flowing across the rotation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_certificate_serves_new_connections_and_keeps_old_streams() {
    let pki = pki();
    let up = fastmcp().await;
    let proxy = Proxy::start(&up, |c| {
        with_tls(&pki)(c);
        c.tls.reload_secs = Some(1);
    })
    .await;
    let served = |cfg| handshake(proxy.addr(), cfg);
    assert_eq!(
        served(client_config(&pki.ca, None)).await.unwrap(),
        pki.server.der
    );
    let t = Target::tls(proxy.addr(), client_config(&pki.ca, None));
    let (mut sse, l, _) = legacy_session_as(&t, &[A]).await;

    let next = pki.ca.server(2, false);
    assert_ne!(next.der, pki.server.der);
    // Key first, then certificate: the half-written pair in between is not taken.
    std::fs::write(&pki.key_file, &next.key_pem).unwrap();
    std::fs::write(&pki.cert_file, &next.cert_pem).unwrap();
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let leaf = served(client_config(&pki.ca, None))
            .await
            .expect("handshakes keep working during the rotation");
        if leaf == next.der {
            break;
        }
        assert_eq!(leaf, pki.server.der, "only the old or the new certificate");
        assert!(tokio::time::Instant::now() < deadline, "never rotated");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The stream opened under the old certificate still flows.
    let call = tool_call(7, "echo", json!({"text": "after rotation"}));
    assert_eq!(legacy_post(&t, &l, &[A], &call).await.status, 202);
    let (_, m) = sse.message().await;
    assert_eq!(m["id"], 7);
    assert_eq!(m["result"]["content"][0]["text"], "after rotation");
    proxy.stop().await;
}

/// A TLS front (rustls) at 127.0.0.1 serving `leaf`, relaying each connection to `target`.
async fn tls_front(leaf: &Leaf, target: SocketAddr) -> (u16, tokio::task::JoinHandle<()>) {
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(server_config(leaf)));
    let l = TcpListener::bind(("127.0.0.1", port())).await.unwrap();
    let p = l.local_addr().unwrap().port();
    let task = tokio::spawn(async move {
        while let Ok((tcp, _)) = l.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let Ok(mut up) = TcpStream::connect(target).await else {
                    return;
                };
                let _ = tokio::io::copy_bidirectional(&mut tls, &mut up).await;
            });
        }
    });
    (p, task)
}

/// (e) An `https://` upstream: FastMCP behind a rustls front, trusted through `upstream.ca_file`:
/// both faces work; with another CA in `upstream.ca_file` the session fails with 502
/// `upstream_error` (`upstream_errors_total{kind="connect"}`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_https_upstream_is_verified_with_upstream_ca_file() {
    let pki = pki();
    let up = fastmcp().await;
    let (front, _task) = tls_front(&pki.server, ([127, 0, 0, 1], up.port).into()).await;
    let https = format!("https://127.0.0.1:{front}/sse");
    let proxy = Proxy::start(&up, |c| {
        c.upstream.sse_url = https.clone();
        c.upstream.ca_file = Some(pki.ca_file.clone());
    })
    .await;
    let t = Target::plain(proxy.addr());
    let sid = mcp_init(&t, V_NEW, &[A]).await;
    let done = mcp_call(
        &t,
        &sid,
        &[A],
        &tool_call(2, "echo", json!({"text": "via https"})),
    )
    .await;
    assert_eq!(done["result"]["content"][0]["text"], "via https");
    let (mut sse, l, _) = legacy_session_as(&t, &[]).await;
    let call = tool_call(3, "echo", json!({"text": "legacy via https"}));
    assert_eq!(legacy_post(&t, &l, &[], &call).await.status, 202);
    let (_, m) = sse.message().await;
    assert_eq!(m["result"]["content"][0]["text"], "legacy via https");
    proxy.stop().await;

    let other = Ca::new("other ca");
    let other_file = pki.dir.path().join("other-ca.pem");
    std::fs::write(&other_file, other.pem()).unwrap();
    let proxy = Proxy::start(&up, |c| {
        c.upstream.sse_url = https.clone();
        c.upstream.ca_file = Some(other_file);
    })
    .await;
    let t = Target::plain(proxy.addr());
    let r = mcp_initialize(&t, V_NEW, "x", &[]).await;
    refused(r, 502, "upstream_error").await;
    let r = t
        .send("GET", "/sse", &[("accept", "text/event-stream")], None)
        .await;
    refused(r, 502, "upstream_error").await;
    assert_eq!(
        proxy
            .metric("mcp_resume_upstream_errors_total{kind=\"connect\"}")
            .await,
        2.0
    );
    assert_eq!(proxy.metric("mcp_resume_sessions_active").await, 0.0);
    proxy.stop().await;
}

/// Holds a free loopback port for as long as the listener lives (a proxy that bound it before
/// validating its config would fail with "cannot bind", exit 1, not 64).
fn hold_port() -> (std::net::TcpListener, u16) {
    loop {
        let p = port();
        if let Ok(l) = std::net::TcpListener::bind(("127.0.0.1", p)) {
            return (l, p);
        }
    }
}

/// (f) Unusable TLS files stop the binary before it binds anything: exit 64, one line naming the
/// key at fault.
#[test]
fn bad_tls_files_exit_64_naming_the_key() {
    let pki = pki();
    let d = pki.dir.path();
    let (_l, lp) = hold_port();
    let (_a, ap) = hold_port();
    let other_key = pki.ca.server(3, false).key_pem;
    std::fs::write(d.join("other.key"), other_key).unwrap();
    std::fs::write(d.join("garbage.pem"), "not a certificate\n").unwrap();
    let p = |f: &str| d.join(f).display().to_string();
    let (cert, key) = (s(&pki.cert_file).to_string(), s(&pki.key_file).to_string());
    let cases = [
        (
            format!(
                "[tls]\ncert_file = \"{}\"\nkey_file = \"{key}\"\n",
                p("missing.crt")
            ),
            "tls.cert_file",
        ),
        (
            format!(
                "[tls]\ncert_file = \"{}\"\nkey_file = \"{key}\"\n",
                p("garbage.pem")
            ),
            "tls.cert_file",
        ),
        (
            format!(
                "[tls]\ncert_file = \"{cert}\"\nkey_file = \"{}\"\n",
                p("missing.key")
            ),
            "tls.key_file",
        ),
        (
            format!(
                "[tls]\ncert_file = \"{cert}\"\nkey_file = \"{}\"\n",
                p("other.key")
            ),
            "tls.key_file",
        ),
        (format!("[tls]\ncert_file = \"{cert}\"\n"), "tls.key_file"),
        (
            format!(
                "[tls]\ncert_file = \"{cert}\"\nkey_file = \"{key}\"\nclient_ca_file = \"{}\"\n",
                p("garbage.pem")
            ),
            "tls.client_ca_file",
        ),
        (
            format!("[tls]\nclient_ca_file = \"{}\"\n", s(&pki.ca_file)),
            "tls.client_ca_file",
        ),
        (
            format!(
                "[upstream]\nsse_url = \"https://127.0.0.1:1/sse\"\nca_file = \"{}\"\n",
                p("garbage.pem")
            ),
            "upstream.ca_file",
        ),
    ];
    for (i, (extra, key)) in cases.iter().enumerate() {
        let cfg = d.join(format!("bad{i}.toml"));
        std::fs::write(
            &cfg,
            format!(
                "[listen]\naddr = \"127.0.0.1:{lp}\"\n[admin]\naddr = \"127.0.0.1:{ap}\"\n\
                 [log]\ndir = \"{}\"\n{extra}",
                p(&format!("data{i}"))
            ),
        )
        .unwrap();
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_mcp-resume-proxy"))
            .args(["run", "--config"])
            .arg(&cfg)
            .env("MCP_RESUME_PROXY_LOG", "info")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{extra} -> {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
        assert!(err.contains(key), "{extra} -> {err}");
        assert!(out.stdout.is_empty(), "it never said it listens");
    }
}
