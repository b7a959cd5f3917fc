//! The upstream SSE response's HTTP/1.1 reader on arbitrary bytes in arbitrary chunkings.
//!
//! Input: `mode (1) ‖ k (1) ‖ k × split point (u16 BE) ‖ bytes`. The mode picks what the bytes
//! are: a response head then its body (`parse_head`, then the framing it gives), or a body
//! framed as chunked, by a Content-Length (taken from the mode byte), or by the connection's close.
//! Checks:
//! * no panic;
//! * the bytes decoded at once, in the chunks the split points give, and byte by byte give the
//!   same head, payload, end (complete, awaiting more, or the error, after an EOF) and bytes left
//!   after the body;
//! * the payload is never longer than the input, a Content-Length body's never longer than its
//!   length (and exactly it when complete), a close-delimited body's is the input itself.
#![no_main]

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use mcp_resume_proxy::http1::{parse_head, BodyDecoder, Error, Framing, Head};

/// What one decoding gave: the head (head mode), the payload, how it ended, the bytes after it.
#[derive(Debug, PartialEq)]
struct Outcome {
    head: Option<Result<Option<Head>, Error>>,
    payload: Vec<u8>,
    end: Result<bool, Error>,
    rest: Vec<u8>,
}

fuzz_target!(|input: &[u8]| {
    let Some((&mode, rest)) = input.split_first() else {
        return;
    };
    let framing = match mode % 4 {
        0 => None,
        1 => Some(Framing::Chunked),
        2 => Some(Framing::Length(u64::from(mode >> 2) * 7)),
        _ => Some(Framing::Close),
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

    let whole = run(framing, &[data]);
    assert_eq!(whole, run(framing, &chunks), "whole vs chunks {chunks:?}");
    if data.len() <= 4096 {
        let bytes: Vec<&[u8]> = data.chunks(1).collect();
        assert_eq!(whole, run(framing, &bytes), "whole vs byte by byte");
    }

    assert!(whole.payload.len() <= data.len());
    let body_framing = match &whole.head {
        None => framing,
        Some(Ok(Some(head))) => Some(head.framing),
        Some(_) => None,
    };
    match body_framing {
        Some(Framing::Length(n)) => {
            assert!(whole.payload.len() as u64 <= n);
            if whole.end == Ok(true) {
                assert_eq!(whole.payload.len() as u64, n);
            }
        }
        Some(Framing::Close) if framing.is_some() => {
            assert_eq!(whole.payload, data);
            assert_eq!(whole.end, Ok(true));
        }
        _ => {}
    }
});

/// Feeds `pieces` in order (a head first in head mode), then an EOF.
fn run(framing: Option<Framing>, pieces: &[&[u8]]) -> Outcome {
    let mut input = BytesMut::new();
    let mut payload = BytesMut::new();
    let mut head = framing.is_none().then_some(Ok(None));
    let mut body = framing.map(BodyDecoder::new);
    let mut pieces = pieces.iter();
    let end = loop {
        let Some(piece) = pieces.next() else {
            // EOF.
            break match &body {
                Some(b) => b.finish().map(|()| true),
                None => Ok(false),
            };
        };
        input.extend_from_slice(piece);
        let dec = match &mut body {
            Some(dec) => dec,
            None => match parse_head(&mut input) {
                Ok(Some(h)) => {
                    head = Some(Ok(Some(h)));
                    body.insert(BodyDecoder::new(h.framing))
                }
                Ok(None) => continue,
                Err(e) => {
                    head = Some(Err(e));
                    break Ok(false);
                }
            },
        };
        match dec.decode(&mut input, &mut payload) {
            Ok(false) => {}
            Ok(true) => break Ok(true),
            Err(e) => break Err(e),
        }
    };
    if matches!(end, Ok(true)) {
        // What follows the body stays unread, however it arrived.
        pieces.for_each(|p| input.extend_from_slice(p));
    } else {
        input.clear();
    }
    Outcome {
        head,
        payload: payload.to_vec(),
        end,
        rest: input.to_vec(),
    }
}
