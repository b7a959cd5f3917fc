//! Replay from the log (events/s) and the cursor check.
//!
//! One session holds a 100,000-event backlog (256-byte payloads), far beyond the 128-event
//! in-memory window, so `read_after` from an old cursor reads chunks back from the segment files:
//! - `replay/read_after_256`: one `read_after(after, 256)` (the client stream's read batch) from a
//!   cursor that walks the whole backlog;
//! - `replay/read_and_frame_256`: the same plus building each event's SSE frame, which is the
//!   whole per-event work of a replaying client stream short of the socket;
//! - `replay/window_tail_128`: a reader inside the in-memory window (live tail), for contrast.
//!
//! `cursor/*`: `Cursor::parse` of a `Last-Event-ID`, `check_resume` against a two-epoch log, and
//! formatting an event id.
//!
//! Run: `cargo bench --bench replay` (about half a minute).

use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use mcp_resume_proxy::config::{Durability, LogConfig};
use mcp_resume_proxy::log::cursor::{check_resume, Cursor, EpochRange, LogRanges, SessionId};
use mcp_resume_proxy::log::{Kind, Log, NewEvent, SessionLog, StreamTag};
use mcp_resume_proxy::metrics::{Facade, Metrics};
use mcp_resume_proxy::stream;

const BACKLOG: u64 = 100_000;
const READ_BATCH: usize = 256;
const PAYLOAD_BYTES: usize = 256;

fn payload() -> Bytes {
    let head = br#"{"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info","logger":"emit","data":{"seq":1,"pad":""#;
    let tail = br#""}}}"#;
    let mut v = Vec::with_capacity(PAYLOAD_BYTES);
    v.extend_from_slice(head);
    v.resize(PAYLOAD_BYTES - tail.len(), b'x');
    v.extend_from_slice(tail);
    Bytes::from(v)
}

struct Fixture {
    _dir: tempfile::TempDir,
    _rt: tokio::runtime::Runtime,
    log: Arc<Log>,
    sl: Arc<SessionLog>,
}

/// A log holding one session with [`BACKLOG`] events.
fn fixture() -> Fixture {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = LogConfig {
        dir: dir.path().to_path_buf(),
        durability: Durability::Relaxed,
        max_events_per_session: 2 * BACKLOG,
        ..LogConfig::default()
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let (log, sl) = rt.block_on(async {
        let (log, _, _) = Log::open(&cfg, Metrics::new()).await.expect("open log");
        let sl = log
            .create(SessionId::random(), Facade::Legacy, None, None)
            .await
            .expect("create");
        let p = payload();
        for _ in 0..BACKLOG {
            let ev = NewEvent::new(StreamTag::LEGACY, Kind::Message, p.clone());
            log.append_nowait(&sl, ev).await.expect("append");
        }
        log.flush().await.expect("flush");
        (log, sl)
    });
    assert_eq!(sl.head(), BACKLOG);
    Fixture {
        _dir: dir,
        _rt: rt,
        log,
        sl,
    }
}

fn replay(c: &mut Criterion) {
    let fx = fixture();
    let mut group = c.benchmark_group("replay");
    group
        .sample_size(20)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3))
        .throughput(Throughput::Elements(READ_BATCH as u64));
    // The cursor walks the backlog batch by batch and wraps, staying out of the window.
    let last_start = BACKLOG - 1_000;
    let mut after = 0u64;
    group.bench_function("read_after_256", |b| {
        b.iter(|| {
            let evs = fx.log.read_held(&fx.sl, after, READ_BATCH).expect("read");
            assert_eq!(evs.len(), READ_BATCH);
            after = if after + 2 * READ_BATCH as u64 > last_start {
                0
            } else {
                after + READ_BATCH as u64
            };
            black_box(evs)
        })
    });
    let mut after = 0u64;
    group.bench_function("read_and_frame_256", |b| {
        b.iter(|| {
            let evs = fx.log.read_held(&fx.sl, after, READ_BATCH).expect("read");
            let mut bytes = 0;
            for ev in &evs {
                bytes += stream::frame_of(&fx.sl, ev).len();
            }
            after = if after + 2 * READ_BATCH as u64 > last_start {
                0
            } else {
                after + READ_BATCH as u64
            };
            black_box(bytes)
        })
    });
    group.throughput(Throughput::Elements(128));
    group.bench_function("window_tail_128", |b| {
        b.iter(|| {
            let evs = fx.log.read_held(&fx.sl, BACKLOG - 128, 128).expect("read");
            assert_eq!(evs.len(), 128);
            black_box(evs)
        })
    });
    group.finish();
}

fn cursor(c: &mut Criterion) {
    let sid = SessionId::parse("9f86d081884c7d659a2feaa0c55ad015").expect("id");
    let id = format!("{sid}:2:1043");
    let ranges = LogRanges {
        epochs: vec![
            EpochRange {
                epoch: 1,
                first: 1,
                last: Some(900),
            },
            EpochRange {
                epoch: 2,
                first: 901,
                last: None,
            },
        ],
        oldest: 500,
        head: 2_000,
    };
    let parsed = Cursor::parse(&id).expect("valid cursor");
    let mut group = c.benchmark_group("cursor");
    group
        .sample_size(20)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1))
        .throughput(Throughput::Elements(1));
    group.bench_function("parse", |b| b.iter(|| Cursor::parse(black_box(&id))));
    group.bench_function("check_resume", |b| {
        b.iter(|| check_resume(black_box(&parsed), black_box(&ranges), false))
    });
    group.bench_function("parse_and_check", |b| {
        b.iter(|| {
            let c = Cursor::parse(black_box(&id))?;
            check_resume(&c, black_box(&ranges), false).ok()
        })
    });
    group.bench_function("format_event_id", |b| {
        b.iter(|| black_box(&parsed).to_string())
    });
    group.finish();
}

criterion_group!(benches, replay, cursor);
criterion_main!(benches);
