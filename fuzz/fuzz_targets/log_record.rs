//! The record codec of the log.
//!
//! Input: the first byte picks a mode.
//! * Raw bytes (a segment header is skipped if there is one): `read_frame` over a buffer of records never panics, never claims more bytes than
//!   the buffer holds, and returns the body that sits at the frame; every body parser and the
//!   chunk-value decoders accept any bytes without panicking, and agree with each other.
//! * Structured: arbitrary events and chunk records are encoded with `ChunkBuilder` and the
//!   record writers, then read back with `read_frame`, `parse_chunk` and `decode_chunk`: what comes
//!   back is identical to what went in.
#![no_main]

use arbitrary::{Arbitrary, Unstructured};
use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use mcp_resume_proxy::log::cursor::SessionId;
use mcp_resume_proxy::log::record::{self, FrameError, Type};
use mcp_resume_proxy::log::{Kind, StreamTag};

#[derive(Arbitrary, Debug)]
struct Ev {
    epoch: u32,
    kind: u8,
    stream: u64,
    payload: Vec<u8>,
}

#[derive(Arbitrary, Debug)]
struct ChunkRec {
    session: [u8; 16],
    first: u64,
    completes: Vec<String>,
    events: Vec<Ev>,
}

fn kind(k: u8) -> Kind {
    [Kind::Message, Kind::Priming, Kind::Final, Kind::End][usize::from(k % 4)]
}

fuzz_target!(|input: &[u8]| {
    let Some((&mode, rest)) = input.split_first() else {
        return;
    };
    if mode & 1 == 0 {
        raw(rest);
    } else if let Ok(recs) = Vec::<ChunkRec>::arbitrary_take_rest(Unstructured::new(rest)) {
        round_trip(&recs);
    }
});

fn raw(buf: &[u8]) {
    // Every parser on the bytes as they are, then each framed record in turn.
    bodies(buf);
    let mut pos = match record::parse_segment_header(buf) {
        Some(_) => record::SEGMENT_HEADER,
        None => 0,
    };
    while pos < buf.len() {
        match record::read_frame(&buf[pos..]) {
            Ok((ty, body, len)) => {
                assert!(len > record::FRAME && pos + len <= buf.len());
                assert_eq!(body, &buf[pos + record::FRAME + 1..pos + len]);
                assert_eq!(buf[pos + record::FRAME], ty as u8);
                bodies(body);
                pos += len;
            }
            Err(FrameError::Short { need }) => {
                assert!(need > buf.len() - pos);
                break;
            }
            Err(FrameError::Corrupt) => break,
        }
    }
}

/// Runs every body parser on `body`; checks the chunk parsers against each other.
fn bodies(body: &[u8]) {
    let _ = record::parse_segment_header(body);
    let _ = record::session_of(body);
    let _ = record::parse_inflight(body);
    let _ = record::parse_inflight_done(body);
    let _ = record::parse_trim(body);
    let _ = record::parse_open(body);
    let head = record::parse_chunk(body);
    let off = record::chunk_value_offset(body);
    assert_eq!(head.as_ref().map(|h| h.value), off.map(|o| &body[o..]));
    // The seq of the first event as a chunk record gives it (any u64, as on a damaged disk).
    let first = head.as_ref().map_or(1, |h| h.first);
    for value in [Some(body), head.map(|h| h.value)].into_iter().flatten() {
        let info = record::chunk_info(value);
        let sizes = record::event_sizes(value);
        if sizes.is_some() {
            assert_eq!(
                sizes.as_ref().map(Vec::len) as Option<usize>,
                info.map(|i| i.0 as usize)
            );
        }
        let events = record::decode_chunk(first, Bytes::copy_from_slice(value));
        if let Some(evs) = &events {
            // decode_chunk checks more (the kind byte), never less, than event_sizes.
            let got: Vec<u64> = evs.iter().map(|e| e.payload.len() as u64).collect();
            assert_eq!(
                sizes.as_ref(),
                Some(&got),
                "event_sizes agrees with decode_chunk"
            );
            for (i, e) in evs.iter().enumerate() {
                assert_eq!(e.seq, first + i as u64);
            }
        }
    }
}

fn round_trip(recs: &[ChunkRec]) {
    let mut out = Vec::new();
    let mut values = Vec::new();
    for r in recs {
        let mut b = record::ChunkBuilder::default();
        for e in &r.events {
            b.push(e.epoch, kind(e.kind), StreamTag(e.stream), &e.payload);
        }
        assert_eq!(b.count() as usize, r.events.len());
        let payload: u64 = r.events.iter().map(|e| e.payload.len() as u64).sum();
        assert_eq!(b.payload_bytes(), payload);
        let encoded_len = b.encoded_len();
        let value = b.finish();
        assert_eq!(value.len(), encoded_len);
        assert_eq!(
            record::chunk_info(&value),
            Some((r.events.len() as u64, payload))
        );
        let n = record::chunk(
            &mut out,
            &SessionId(r.session),
            r.first,
            &r.completes,
            &value,
        );
        assert_eq!(n, out.len() - values.iter().map(|(_, n)| n).sum::<usize>());
        values.push((value, n));
    }
    let mut pos = 0;
    for (r, (value, n)) in recs.iter().zip(&values) {
        let (ty, body, len) = record::read_frame(&out[pos..]).expect("a written record reads");
        assert_eq!((ty, len), (Type::Chunk, *n));
        let head = record::parse_chunk(body).expect("a written chunk parses");
        assert_eq!(head.session, SessionId(r.session));
        assert_eq!(head.first, r.first);
        assert_eq!(head.completes, r.completes);
        assert_eq!(head.value, &value[..]);
        let sizes = record::event_sizes(value).expect("sizes");
        let want: Vec<u64> = r.events.iter().map(|e| e.payload.len() as u64).collect();
        assert_eq!(sizes, want);
        let decoded = record::decode_chunk(r.first, Bytes::from(value.clone()));
        // Seqs past u64::MAX do not exist: such a chunk is corrupt, not a panic.
        let last = (r.events.len() as u64)
            .checked_sub(1)
            .map(|n| r.first.checked_add(n));
        if last == Some(None) {
            assert!(decoded.is_none());
        } else {
            let evs = decoded.expect("a built chunk decodes");
            assert_eq!(evs.len(), r.events.len());
            for (i, (got, e)) in evs.iter().zip(&r.events).enumerate() {
                assert_eq!(got.seq, r.first + i as u64);
                assert_eq!(got.epoch, e.epoch);
                assert_eq!(got.kind, kind(e.kind));
                assert_eq!(got.stream, StreamTag(e.stream));
                assert_eq!(&got.payload[..], &e.payload[..]);
            }
        }
        pos += len;
    }
    assert_eq!(pos, out.len());
}
