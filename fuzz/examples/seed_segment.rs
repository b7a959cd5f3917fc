//! Writes a small real segment file with the proxy's own log, for the `log_image` and
//! `log_record` seed corpora: two sessions (legacy and streamable), messages, a response that
//! completes an in-flight request, a request left in flight, a trim, an end and a clean stop.
//!
//! `cargo +nightly run --manifest-path fuzz/Cargo.toml --example seed_segment -- OUT_DIR`
//! leaves the data directory's segment(s) in `OUT_DIR`.

use bytes::Bytes;
use mcp_resume_proxy::config::{Durability, LogConfig};
use mcp_resume_proxy::domain::{EndReason, Facade};
use mcp_resume_proxy::log::cursor::SessionId;
use mcp_resume_proxy::log::{Kind, Log, NewEvent, StreamTag};
use mcp_resume_proxy::metrics::Metrics;

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let out = std::env::args()
        .nth(1)
        .expect("usage: seed_segment OUT_DIR");
    let data = tempfile::tempdir().expect("temp dir");
    let cfg = LogConfig {
        dir: data.path().to_path_buf(),
        durability: Durability::Fsync,
        max_events_per_session: 6,
        max_bytes_per_session: 1 << 20,
        max_total_bytes: 1 << 30,
        store_error_exit_secs: 60,
    };
    let (log, _, _) = Log::open(&cfg, Metrics::new()).await.expect("open log");
    let msg = |s: &str| NewEvent::new(StreamTag::LEGACY, Kind::Message, Bytes::from(s.to_owned()));

    let a = log
        .create(SessionId([0xa1; 16]), Facade::Legacy, None, None)
        .await
        .expect("create");
    log.inflight_add(&a, "1", StreamTag::LEGACY)
        .await
        .expect("in flight");
    log.inflight_add(&a, "2", StreamTag::LEGACY)
        .await
        .expect("in flight");
    let mut answer = msg(r#"{"jsonrpc":"2.0","id":1,"result":{"content":[]}}"#);
    answer.completes = Some("1".into());
    log.append(&a, answer).await.expect("append");
    for i in 0..8 {
        let n = format!(
            r#"{{"jsonrpc":"2.0","method":"notifications/progress","params":{{"progressToken":"t","progress":{i}}}}}"#
        );
        log.append(&a, msg(&n)).await.expect("append");
    }

    let b = log
        .create(
            SessionId([0xb2; 16]),
            Facade::Streamable,
            Some("2025-11-25".into()),
            None,
        )
        .await
        .expect("create");
    log.append(
        &b,
        NewEvent::new(StreamTag::post(0), Kind::Priming, Bytes::new()),
    )
    .await
    .expect("append");
    log.append(
        &b,
        NewEvent::new(
            StreamTag::post(0),
            Kind::Final,
            Bytes::from_static(br#"{"jsonrpc":"2.0","id":"x","result":{}}"#),
        ),
    )
    .await
    .expect("append");
    log.end(&b, EndReason::ClientDelete, Vec::new())
        .await
        .expect("end");
    log.close().await.expect("close");

    for e in std::fs::read_dir(data.path()).expect("list") {
        let p = e.expect("entry").path();
        if p.extension().is_some_and(|x| x == "seg") {
            let to = std::path::Path::new(&out).join(p.file_name().expect("name"));
            std::fs::copy(&p, &to).expect("copy");
            println!("{}", to.display());
        }
    }
}
