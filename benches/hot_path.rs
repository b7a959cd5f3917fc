//! The per-event pieces of the proxy's hot path that issue 18 changed, each on its own:
//!
//! - `record_build/chunk_256`: one writer turn's chunk of 256 events of one session (330-byte
//!   payloads, the end-to-end benchmark's size): each event pushed into the chunk value (sized
//!   once for the run of events, as the writer does), then the chunk framed as a record with
//!   its CRC into the turn's buffer;
//! - `frame_build/pack_256`: a client stream's pack of the same 256 events: the session's hex
//!   once per pack, each event's id written on the stack (`Cursor::write_id`) and its SSE frame
//!   (`id:`, `event: message`, one `data:` line; `encode::message_into`) appended to one buffer
//!   reserved for the pack;
//! - `frame_build/pack_256_multiline`: the same with payloads holding line breaks (split into one
//!   `data:` line each), the slow path;
//! - `frame_build/pack_256_general`: the same pack by the general path it replaced (the id as a
//!   checked `&str` with its hex per event, `encode::event_into` searching the id and the event
//!   type for line breaks).
//!
//! Run: `cargo bench --bench hot_path` (about 20 seconds).

use std::hint::black_box;

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use mcp_resume_proxy::log::cursor::{Cursor, SessionId, MAX_EVENT_ID_LEN};
use mcp_resume_proxy::log::record::{self, ChunkBuilder};
use mcp_resume_proxy::log::{Kind, StreamTag};
use mcp_resume_proxy::sse::encode;

const EVENTS: usize = 256;
const PAYLOAD_BYTES: usize = 330;

fn payload(multiline: bool) -> Bytes {
    let head = br#"{"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info","logger":"emit","data":{"seq":1,"t_ns":1733350000000000000,"pad":""#;
    let tail = br#""}}}"#;
    let mut v = Vec::with_capacity(PAYLOAD_BYTES);
    v.extend_from_slice(head);
    v.resize(PAYLOAD_BYTES - tail.len(), b'x');
    v.extend_from_slice(tail);
    if multiline {
        for i in (40..v.len() - 10).step_by(80) {
            v[i] = b'\n';
        }
    }
    Bytes::from(v)
}

fn record_build(c: &mut Criterion) {
    let events: Vec<Bytes> = (0..EVENTS).map(|_| payload(false)).collect();
    let total: usize = events.iter().map(|e| e.len()).sum();
    let session = SessionId([7; 16]);
    let mut group = c.benchmark_group("record_build");
    group.throughput(Throughput::Elements(EVENTS as u64));
    group.bench_function("chunk_256", |b| {
        let mut turn = Vec::with_capacity(total + 4096);
        b.iter(|| {
            turn.clear();
            let mut cb = ChunkBuilder::default();
            cb.reserve(EVENTS, total);
            for p in &events {
                cb.push(1, Kind::Message, StreamTag(0), p);
            }
            let n = record::chunk(&mut turn, &session, 1, &[], &cb.finish());
            black_box(n)
        })
    });
    group.finish();
}

fn frame_build(c: &mut Criterion) {
    let mut group = c.benchmark_group("frame_build");
    group.throughput(Throughput::Elements(EVENTS as u64));
    for (name, multiline, general) in [
        ("pack_256", false, false),
        ("pack_256_multiline", true, false),
        ("pack_256_general", false, true),
    ] {
        let events: Vec<Bytes> = (0..EVENTS).map(|_| payload(multiline)).collect();
        let total: usize = events.iter().map(|e| e.len() + 100).sum();
        let session = SessionId([7; 16]);
        group.bench_function(name, |b| {
            b.iter(|| {
                let mut pack = Vec::with_capacity(total);
                let hex = session.hex();
                for (i, p) in events.iter().enumerate() {
                    let seq = 1_000 + i as u64;
                    let mut id = [0u8; MAX_EVENT_ID_LEN];
                    if general {
                        let cursor = Cursor {
                            session,
                            epoch: 1,
                            seq,
                        };
                        let id = cursor.write_to(&mut id);
                        encode::event_into(&mut pack, Some(id), Some("message"), p);
                    } else {
                        let id = Cursor::write_id(&hex, 1, seq, &mut id);
                        encode::message_into(&mut pack, id, p);
                    }
                }
                black_box(pack.len())
            })
        });
    }
    group.finish();
}

criterion_group!(benches, record_build, frame_build);
criterion_main!(benches);
