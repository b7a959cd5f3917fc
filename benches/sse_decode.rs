//! SSE decode throughput (MB/s) on upstream-shaped streams.
//!
//! Cases: many small LF events, the same with CRLF (Python sse-starlette
//! style), 64 KiB single-line events, and each of those fed in 1500-byte
//! (MTU-sized) chunks the way they arrive from the network.

use bytes::BytesMut;
use criterion::{black_box, criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use mcp_resume_proxy::sse::Decoder;

const MAX_EVENT: usize = 4 << 20;

/// `count` MCP-like events with a JSON payload of roughly `payload` bytes.
fn stream(count: usize, payload: usize, nl: &str) -> Vec<u8> {
    let mut out = Vec::new();
    for i in 0..count {
        let head =
            format!(r#"{{"jsonrpc":"2.0","id":{i},"result":{{"content":[{{"type":"text","text":""#);
        let filler = "lorem ipsum dolor sit amet ".repeat(payload / 27 + 1);
        let json = format!(
            "{head}{}\"}}]}}}}",
            &filler[..payload.saturating_sub(head.len())]
        );
        out.extend_from_slice(format!("event: message{nl}data: {json}{nl}{nl}").as_bytes());
    }
    out
}

/// Decodes everything in one buffer; returns total data bytes (checked below).
fn decode_whole(mut buf: BytesMut) -> usize {
    let mut dec = Decoder::new(MAX_EVENT);
    let mut n = 0;
    while let Some(ev) = dec.decode(&mut buf).expect("valid stream") {
        n += black_box(ev).data.len();
    }
    n
}

/// Feeds `input` in `chunk`-byte pieces, as a network read loop would.
fn decode_chunked(input: &[u8], chunk: usize) -> usize {
    let mut dec = Decoder::new(MAX_EVENT);
    let mut buf = BytesMut::with_capacity(2 * chunk);
    let mut n = 0;
    for piece in input.chunks(chunk) {
        buf.extend_from_slice(piece);
        while let Some(ev) = dec.decode(&mut buf).expect("valid stream") {
            n += black_box(ev).data.len();
        }
    }
    n
}

fn bench(c: &mut Criterion) {
    let cases = [
        ("small_lf", stream(10_000, 200, "\n")),
        ("small_crlf", stream(10_000, 200, "\r\n")),
        ("large_64k", stream(64, 64 * 1024, "\n")),
    ];
    let mut group = c.benchmark_group("sse_decode");
    for (name, input) in &cases {
        let expected = decode_whole(BytesMut::from(&input[..]));
        assert_eq!(decode_chunked(input, 1500), expected);
        group.throughput(Throughput::Bytes(input.len() as u64));
        group.bench_function(format!("{name}/whole"), |b| {
            b.iter_batched(
                || BytesMut::from(&input[..]),
                decode_whole,
                BatchSize::LargeInput,
            )
        });
        group.bench_function(format!("{name}/chunks_1500"), |b| {
            b.iter(|| decode_chunked(black_box(input), 1500))
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
