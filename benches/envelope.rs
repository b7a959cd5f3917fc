//! The routing peek run on every upstream event: the byte scanner (`peek`) against serde_json
//! (`peek_serde`, its definition and slow path).
//!
//! Cases: a ~330-byte `notifications/message` event, the end-to-end benchmark's event of the same
//! size (a long number and a 200-byte string), a progress notification with its token,
//! and `tools/call` responses of 4 KiB and 64 KiB (text content with the escapes real text has),
//! plus a 4 KiB structured result (many small values: the scanner's slowest shape per byte).

use criterion::{black_box, criterion_group, criterion_main, Criterion, Throughput};
use mcp_resume_proxy::jsonrpc::{peek, peek_serde};

/// A `notifications/message` log event of about 330 bytes.
fn log_message() -> Vec<u8> {
    let json = r#"{"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info","logger":"tools.search","data":{"message":"indexed 1280 documents in 2.4 s","query":"rust async runtime","shards":[1,2,3,4],"cached":false,"elapsed_ms":2431,"trace_id":"4bf92f3577b34da6a3ce929d0e0e4736","user":"alice@example.com","region":"eu-west-1"}}}"#;
    json.as_bytes().to_vec()
}

/// The end-to-end benchmark's event (`scripts/bench-e2e`: the demo upstream's `emit`, pad 200).
fn emit() -> Vec<u8> {
    format!(
        r#"{{"jsonrpc":"2.0","method":"notifications/message","params":{{"level":"info","logger":"emit","data":{{"seq":12345,"t_ns":1733462400123456789,"pad":"{}"}}}}}}"#,
        "x".repeat(200)
    )
    .into_bytes()
}

fn progress() -> Vec<u8> {
    br#"{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":"call-7f3a-0042","progress":640,"total":1280,"message":"indexing shard 3 of 4"}}"#.to_vec()
}

/// A `tools/call` response of about `size` bytes: one text content block whose lines end in
/// `\n` and quote now and then.
fn text_response(size: usize) -> Vec<u8> {
    let head = r#"{"jsonrpc":"2.0","id":42,"result":{"content":[{"type":"text","text":""#;
    let tail = r#""}],"isError":false}}"#;
    let line = r#"fn main() { println!(\"lorem ipsum dolor sit amet\"); } // consectetur\n"#;
    let room = size - head.len() - tail.len();
    let text = line.repeat(room / line.len() + 1);
    // Not cut inside an escape.
    let text = text[..room].trim_end_matches('\\');
    format!("{head}{text}{tail}").into_bytes()
}

/// A response of about `size` bytes whose result is rows of small values.
fn structured_response(size: usize) -> Vec<u8> {
    let mut json =
        r#"{"jsonrpc":"2.0","id":43,"result":{"structuredContent":{"rows":["#.to_string();
    let mut n = 0;
    while json.len() < size - 8 {
        if n > 0 {
            json.push(',');
        }
        json.push_str(&format!(
            r#"{{"id":{n},"name":"row {n}","score":0.{n},"ok":true,"tags":["a","b"]}}"#
        ));
        n += 1;
    }
    json.push_str("]}}}");
    json.into_bytes()
}

fn bench(c: &mut Criterion) {
    let cases = [
        ("message_330b", log_message()),
        ("emit_330b", emit()),
        ("progress", progress()),
        ("response_4k", text_response(4 << 10)),
        ("response_64k", text_response(64 << 10)),
        ("structured_4k", structured_response(4 << 10)),
    ];
    let mut group = c.benchmark_group("envelope");
    for (name, input) in &cases {
        let expected = peek_serde(input);
        assert!(expected.is_some(), "{name} is a message");
        assert_eq!(peek(input), expected, "{name}");
        group.throughput(Throughput::Bytes(input.len() as u64));
        group.bench_function(format!("{name}/peek"), |b| {
            b.iter(|| peek(black_box(input)))
        });
        group.bench_function(format!("{name}/peek_serde"), |b| {
            b.iter(|| peek_serde(black_box(input)))
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
