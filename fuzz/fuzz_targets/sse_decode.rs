//! The incremental SSE decoder on arbitrary bytes in arbitrary chunkings.
//!
//! Input: `cap selector (1) ‖ k (1) ‖ k × split point (u16 BE) ‖ stream bytes`. Checks:
//! * no panic;
//! * the stream decoded at once, in the chunks the split points give, and byte by byte yields the
//!   same events, errors and comment count;
//! * both equal a plain reference model of the WHATWG algorithm with the decoder's cap (an event
//!   whose non-comment lines exceed the cap is reported with its length and data snippets, never
//!   silently dropped);
//! * every event's data fits in the cap, and the bytes left buffered between chunks never exceed
//!   `max(cap, 4)`.
#![no_main]

use bytes::{Bytes, BytesMut};
use libfuzzer_sys::fuzz_target;
use mcp_resume_proxy::sse::decode::{DecodeError, Decoder, Event};

type Item = Result<Event, DecodeError>;

const SNIPPET: usize = 512;

fuzz_target!(|input: &[u8]| {
    let Some((&sel, rest)) = input.split_first() else {
        return;
    };
    let cap = match sel & 3 {
        0 => usize::from(sel >> 2),
        1 => 16 * usize::from(sel >> 2),
        _ => 1 << 20,
    };
    let Some((&k, rest)) = rest.split_first() else {
        return;
    };
    let k = usize::from(k % 16).min(rest.len() / 2);
    let (points, data) = rest.split_at(2 * k);
    let mut cuts: Vec<usize> = points
        .chunks_exact(2)
        .map(|p| usize::from(u16::from_be_bytes([p[0], p[1]])) % (data.len() + 1))
        .collect();
    cuts.sort_unstable();
    let mut chunks = Vec::with_capacity(k + 1);
    let mut start = 0;
    for c in cuts {
        chunks.push(&data[start..c]);
        start = c;
    }
    chunks.push(&data[start..]);

    let whole = run(&[data], cap);
    let pieces = run(&chunks, cap);
    assert_eq!(whole, pieces, "whole vs chunks {:?}", chunks);
    if data.len() <= 2048 {
        let bytes: Vec<&[u8]> = data.chunks(1).collect();
        assert_eq!(whole, run(&bytes, cap), "whole vs byte by byte");
    }
    let expected = reference(data, cap);
    assert_eq!(whole.0, expected.0, "decoder vs reference");
    assert_eq!(whole.1, expected.1, "comment count vs reference");
    for item in &whole.0 {
        match item {
            Ok(e) => assert!(
                e.data.len() <= cap,
                "event data {} > cap {cap}",
                e.data.len()
            ),
            Err(DecodeError::EventTooLarge { len, head, tail }) => {
                assert!(*len > cap);
                assert!(head.len() <= SNIPPET && tail.len() <= SNIPPET);
            }
        }
    }
});

/// Decodes `chunks` in order, draining after each; checks the buffering bound.
fn run(chunks: &[&[u8]], cap: usize) -> (Vec<Item>, u64) {
    let mut dec = Decoder::new(cap);
    let mut buf = BytesMut::new();
    let mut out = Vec::new();
    for c in chunks {
        buf.extend_from_slice(c);
        loop {
            match dec.decode(&mut buf) {
                Ok(Some(e)) => out.push(Ok(e)),
                Ok(None) => break,
                Err(e) => out.push(Err(e)),
            }
        }
        assert!(
            buf.len() <= cap.max(4),
            "{} bytes buffered, cap {cap}",
            buf.len()
        );
    }
    (out, dec.comments_seen())
}

/// The WHATWG event stream interpretation, written the obvious way over the whole input: split
/// into complete lines (CRLF, LF or CR), fold fields into an event, dispatch on a blank line.
fn reference(input: &[u8], cap: usize) -> (Vec<Item>, u64) {
    let input = input.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(input);
    let mut lines = Vec::new();
    let mut start = 0;
    let mut i = 0;
    while i < input.len() {
        match input[i] {
            b'\n' => {
                lines.push(&input[start..i]);
                i += 1;
                start = i;
            }
            b'\r' => {
                lines.push(&input[start..i]);
                i += if input.get(i + 1) == Some(&b'\n') {
                    2
                } else {
                    1
                };
                start = i;
            }
            _ => i += 1,
        }
    }
    // Bytes after the last line end are an incomplete line: never interpreted. Except in the
    // comment count: a comment line the decoder streams instead of buffering (longer than the
    // cap, or inside an event already over it) is counted when it starts, not when it ends.
    let partial = &input[start..];
    let mut out = Vec::new();
    let mut comments = 0;
    let mut len = 0usize;
    let mut data: Option<Vec<u8>> = None;
    let mut event: Option<String> = None;
    let mut id: Option<String> = None;
    let mut retry: Option<u64> = None;
    for line in lines {
        if line.is_empty() {
            let d = data.take();
            let (e, i, r) = (event.take(), id.take(), retry.take());
            let event_len = std::mem::take(&mut len);
            if event_len > cap {
                let d = d.unwrap_or_default();
                let n = d.len();
                out.push(Err(DecodeError::EventTooLarge {
                    len: event_len,
                    head: Bytes::copy_from_slice(&d[..n.min(SNIPPET)]),
                    tail: Bytes::copy_from_slice(&d[n - n.min(SNIPPET)..]),
                }));
                continue;
            }
            if let Some(d) = d {
                out.push(Ok(Event {
                    event: e.filter(|t| !t.is_empty()).map(Into::into),
                    data: Bytes::from(d),
                    id: i,
                    retry: r,
                }));
            }
            continue;
        }
        if line[0] == b':' {
            comments += 1;
            continue;
        }
        len += line.len();
        let (name, value) = match line.iter().position(|&b| b == b':') {
            Some(c) => {
                let v = &line[c + 1..];
                (&line[..c], v.strip_prefix(b" ").unwrap_or(v))
            }
            None => (line, &b""[..]),
        };
        match name {
            b"data" => match &mut data {
                Some(d) => {
                    d.push(b'\n');
                    d.extend_from_slice(value);
                }
                None => data = Some(value.to_vec()),
            },
            b"event" => event = Some(String::from_utf8_lossy(value).into_owned()),
            b"id" if !value.contains(&0) => id = Some(String::from_utf8_lossy(value).into_owned()),
            b"retry" if !value.is_empty() && value.iter().all(u8::is_ascii_digit) => {
                if let Ok(v) = std::str::from_utf8(value).unwrap().parse() {
                    retry = Some(v);
                }
            }
            _ => {}
        }
    }
    if partial.first() == Some(&b':') && (partial.len() > cap || len > cap) {
        comments += 1;
    }
    (out, comments)
}
