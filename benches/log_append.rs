//! Log append throughput (events/s) through [`Log`], per durability mode.
//!
//! Two ways to append, at 1, 16 and 256 concurrent appenders (one session each):
//! - `await`: each appender waits for its event to be durable and published before the next one,
//!   the way a session's end and tests append. The group-commit batch is at most the number of
//!   appenders, so this shows what batching buys when producers wait.
//! - `nowait`: each appender queues its share with `append_nowait` (as the upstream pump of every
//!   session does) and the run ends with one `flush`. Batches fill up to the writer's limit.
//!
//! Events carry a 256-byte JSON-ish payload, about what the demo upstream's `emit` sends. Retention
//! is the default (10,000 events per session), so steady-state trimming is included.
//!
//! `file_floor/*` is the segment file alone, without the proxy's writer: the same 256-byte events
//! in writes of 1,024, with and without an `fdatasync` per write. It shows what the writer adds
//! on top of the system calls a turn cannot avoid.
//!
//! Run: `cargo bench --bench log_append` (about a minute and a half).

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use mcp_resume_proxy::config::{Durability, LogConfig};
use mcp_resume_proxy::log::cursor::SessionId;
use mcp_resume_proxy::log::{Kind, Log, NewEvent, SessionLog, StreamTag};
use mcp_resume_proxy::metrics::{Facade, Metrics};
use tokio::runtime::Runtime;

const PAYLOAD_BYTES: usize = 256;
const APPENDERS: [usize; 3] = [1, 16, 256];

fn payload() -> Bytes {
    let head = br#"{"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info","logger":"emit","data":{"seq":1,"pad":""#;
    let tail = br#""}}}"#;
    let mut v = Vec::with_capacity(PAYLOAD_BYTES);
    v.extend_from_slice(head);
    v.resize(PAYLOAD_BYTES - tail.len(), b'x');
    v.extend_from_slice(tail);
    Bytes::from(v)
}

fn runtime() -> Runtime {
    // Two workers: the machine the results were taken on has two cores, like the proxy's default
    // runtime there.
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

struct Fixture {
    _dir: tempfile::TempDir,
    log: Arc<Log>,
    sessions: Vec<Arc<SessionLog>>,
}

fn fixture(rt: &Runtime, durability: Durability) -> Fixture {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = LogConfig {
        dir: dir.path().to_path_buf(),
        durability,
        ..LogConfig::default()
    };
    let max = *APPENDERS.iter().max().expect("levels");
    let (log, sessions) = rt.block_on(async {
        let (log, _, _) = Log::open(&cfg, Metrics::new()).await.expect("open log");
        let mut sessions = Vec::with_capacity(max);
        for _ in 0..max {
            let sl = log
                .create(SessionId::random(), Facade::Legacy, None, None)
                .await
                .expect("create session");
            sessions.push(sl);
        }
        (log, sessions)
    });
    Fixture {
        _dir: dir,
        log,
        sessions,
    }
}

/// Appends `total` events spread over `appenders` sessions; returns the wall time.
fn run(rt: &Runtime, fx: &Fixture, appenders: usize, total: u64, wait: bool) -> Duration {
    let payload = payload();
    rt.block_on(async {
        let start = Instant::now();
        let mut tasks = Vec::with_capacity(appenders);
        for (i, sl) in fx.sessions.iter().take(appenders).enumerate() {
            // Share `total` as evenly as possible; the first `total % appenders` get one more.
            let n = total / appenders as u64 + u64::from((i as u64) < total % appenders as u64);
            let (log, sl, payload) = (fx.log.clone(), sl.clone(), payload.clone());
            tasks.push(tokio::spawn(async move {
                for _ in 0..n {
                    let ev = NewEvent::new(StreamTag::LEGACY, Kind::Message, payload.clone());
                    if wait {
                        log.append(&sl, ev).await.expect("append");
                    } else {
                        log.append_nowait(&sl, ev).await.expect("append");
                    }
                }
            }));
        }
        for t in tasks {
            t.await.expect("appender");
        }
        if !wait {
            fx.log.flush().await.expect("flush");
        }
        start.elapsed()
    })
}

fn bench(c: &mut Criterion) {
    let rt = runtime();
    for (mode, durability) in [
        ("fsync", Durability::Fsync),
        ("relaxed", Durability::Relaxed),
    ] {
        let fx = fixture(&rt, durability);
        let mut group = c.benchmark_group(format!("log_append/{mode}"));
        group
            .sample_size(10)
            .warm_up_time(Duration::from_millis(500))
            .measurement_time(Duration::from_secs(3));
        for (how, wait) in [("await", true), ("nowait", false)] {
            for &n in &APPENDERS {
                // One iteration appends `chunk` events, at least one per appender.
                let chunk = (n as u64).max(64);
                group.throughput(Throughput::Elements(chunk));
                group.bench_with_input(BenchmarkId::new(how, n), &n, |b, &n| {
                    b.iter_custom(|iters| run(&rt, &fx, n, iters * chunk, wait))
                });
            }
        }
        group.finish();
        rt.block_on(fx.log.close()).expect("close");
    }
}

/// The file alone, without the proxy's writer: 1,024 256-byte events per write (one turn's
/// worth), appended with `pwrite`, with and without an `fdatasync` per write.
fn file_floor(c: &mut Criterion) {
    use std::os::unix::fs::FileExt;
    const BATCH: u64 = 1024;
    let payload = payload();
    let mut group = c.benchmark_group("file_floor");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3))
        .throughput(Throughput::Elements(BATCH));
    for sync in [false, true] {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = std::fs::File::create(dir.path().join("floor")).expect("file");
        let buf = payload.repeat(BATCH as usize);
        let mut off = 0u64;
        let name = if sync { "pwrite_fdatasync" } else { "pwrite" };
        group.bench_function(name, |b| {
            b.iter(|| {
                file.write_all_at(&buf, off).expect("write");
                off += buf.len() as u64;
                if off > 256 << 20 {
                    off = 0;
                }
                if sync {
                    file.sync_data().expect("sync");
                }
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench, file_floor);
criterion_main!(benches);
