//! The command line: bad configs fail before any port is bound, with one line naming the key and
//! exit code 64; the example config runs as is.

mod support;

use std::net::TcpListener;
use std::process::Command;

fn proxy() -> Command {
    Command::new(env!("CARGO_BIN_EXE_mcp-resume-proxy"))
}

#[test]
fn bad_config_exits_64_naming_the_key_before_binding() {
    let dir = tempfile::tempdir().unwrap();
    let port = support::port();
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
    ];
    for (text, key) in cases {
        let path = dir.path().join("bad.toml");
        std::fs::write(
            &path,
            format!("[listen]\naddr = \"127.0.0.1:{port}\"\n{text}"),
        )
        .unwrap();
        let out = proxy().arg("--config").arg(&path).output().unwrap();
        assert_eq!(out.status.code(), Some(64), "{text}");
        let err = String::from_utf8_lossy(&out.stderr);
        let lines: Vec<&str> = err.lines().collect();
        assert_eq!(lines.len(), 1, "one line: {err}");
        assert!(lines[0].contains(key), "{key} not named in: {err}");
        // Nothing was bound: the port is still free.
        TcpListener::bind(("127.0.0.1", port)).expect("port left unbound");
    }
    let out = proxy().args(["--listen", "nonsense"]).output().unwrap();
    assert_eq!(out.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&out.stderr).contains("listen.addr"));
    let out = proxy()
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
