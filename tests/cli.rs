//! The command line: bad configs fail before any port is bound, with one line naming the key and
//! exit code 64; the example config runs as is.

mod support;

use std::net::TcpListener;
use std::process::Command;

fn proxy() -> Command {
    Command::new(env!("CARGO_BIN_EXE_mcp-resume-proxy"))
}

/// Holds a free loopback port (below 32768) for as long as the listener lives. While it is held,
/// nothing else can bind it: a proxy that bound (or tried to bind) it before validating its
/// config fails with "cannot bind", exit 1, instead of exiting 64 naming the key. (Checking the
/// port once the proxy has exited proves nothing: an exited process holds no port.)
fn hold_port() -> (TcpListener, u16) {
    loop {
        let port = support::port();
        if let Ok(l) = TcpListener::bind(("127.0.0.1", port)) {
            return (l, port);
        }
    }
}

#[test]
fn bad_config_exits_64_naming_the_key_before_binding() {
    let dir = tempfile::tempdir().unwrap();
    // Both listeners' ports are held by the test throughout.
    let (_listen, port) = hold_port();
    let (_admin, admin) = hold_port();
    let addrs =
        format!("[listen]\naddr = \"127.0.0.1:{port}\"\n[admin]\naddr = \"127.0.0.1:{admin}\"\n");
    let data = dir.path().join("data");

    // The check can fail: a valid config on the held ports cannot start (it would bind them).
    let path = dir.path().join("good.toml");
    let good_data = dir.path().join("good-data");
    let log = format!("[log]\ndir = \"{}\"\n", good_data.display());
    std::fs::write(&path, format!("{addrs}{log}")).unwrap();
    let out = proxy().arg("--config").arg(&path).output().unwrap();
    assert_eq!(out.status.code(), Some(1), "a proxy that binds is caught");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cannot bind"), "{err}");

    let cases = [
        ("[log]\ndurabilty = \"fsync\"\n", "durabilty"),
        ("[log]\ndurability = \"maybe\"\n", "maybe"),
        (
            "[sessions]\nkeepalive_secs = 0\n",
            "sessions.keepalive_secs",
        ),
        (
            "[upstream]\nsse_url = \"ftp://x/sse\"\n",
            "upstream.sse_url",
        ),
        ("[bogus]\n", "bogus"),
        (
            "[upstream]\nrequest_timeout_secs = 100000\n",
            "upstream.request_timeout_secs",
        ),
    ];
    for (text, key) in cases {
        let path = dir.path().join("bad.toml");
        std::fs::write(&path, format!("{addrs}{text}")).unwrap();
        let out = proxy().arg("--config").arg(&path).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        // Exit 64 (not 1, "cannot bind"): nothing was bound, or tried, before the config failed.
        assert_eq!(out.status.code(), Some(64), "{text}: {err}");
        let lines: Vec<&str> = err.lines().collect();
        assert_eq!(lines.len(), 1, "one line: {err}");
        assert!(lines[0].contains(key), "{key} not named in: {err}");
        assert!(!data.exists(), "no data dir created for a bad config");
    }
    // The same for values given on the command line, the held ports named there too.
    let held = [
        "--listen".to_string(),
        format!("127.0.0.1:{port}"),
        "--admin-listen".into(),
        format!("127.0.0.1:{admin}"),
    ];
    let out = proxy()
        .args(["--listen", "nonsense", "--admin-listen"])
        .arg(format!("127.0.0.1:{admin}"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&out.stderr).contains("listen.addr"));
    let out = proxy()
        .args(&held)
        .args(["--config", "/nonexistent/proxy.toml"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
}

#[test]
fn example_config_is_complete_and_valid() {
    let text = std::fs::read_to_string(support::repo().join("proxy.toml.example")).unwrap();
    let cfg = mcp_resume_proxy::config::Config::from_toml(&text)
        .unwrap()
        .validate()
        .unwrap();
    assert_eq!(cfg, mcp_resume_proxy::config::Config::default());
    for section in [
        "[listen]",
        "[admin]",
        "[upstream]",
        "[legacy]",
        "[streamable]",
        "[log]",
        "[sessions]",
        "[shutdown]",
    ] {
        assert!(text.contains(section), "{section}");
    }
}

#[test]
fn inspect_rejects_a_directory_that_is_not_a_log() {
    let dir = tempfile::tempdir().unwrap();
    let out = proxy()
        .args(["inspect", "--data-dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a mcp-resume-proxy data directory"));
}
