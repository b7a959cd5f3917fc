//! Byte layout of the sled trees.
//!
//! `events`: one entry per *chunk* — consecutive events of one session written in one writer turn.
//! Key = 16-byte session ‖ big-endian u64 seq of the chunk's first event, so byte order is seq
//! order, a range scan replays in order, and the chunk holding seq `s` is the last key ≤ (session,
//! `s`). sled spends tens of microseconds of CPU per key whatever the value size, so one key per
//! chunk instead of one per event is what lets the log ingest at wire speed.
//!
//! Chunk value (version 2) = 2 ‖ count (u32 BE) ‖ payload bytes (u64 BE) ‖ `count` records, each
//! epoch (u32 BE) ‖ kind (1) ‖ stream (u64 BE) ‖ payload length (u32 BE) ‖ payload. The header's
//! count and byte total let recovery size a session without walking records.
//! A version-1 value (written before chunks) is one event: 1 ‖ epoch ‖ kind ‖ stream ‖ payload; it
//! is read as a chunk of one, so older data directories stay readable.
//!
//! `inflight`: key = session ‖ JSON-RPC id as compact JSON; value = stream (u64 BE) ‖ head seq at
//! registration (u64 BE).

use bytes::Bytes;

use super::{Event, Kind, StreamTag};
use crate::log::cursor::SessionId;

const V1: u8 = 1;
const V2: u8 = 2;
/// Bytes before the payload in a version-1 event value.
const V1_HEADER: usize = 1 + 4 + 1 + 8;
/// Bytes before the first record of a chunk.
const CHUNK_HEADER: usize = 1 + 4 + 8;
/// Bytes before the payload of a record.
const RECORD_HEADER: usize = 4 + 1 + 8 + 4;

/// Key of the chunk whose first event is `seq` of `session`.
pub fn event_key(session: &SessionId, seq: u64) -> [u8; 24] {
    let mut k = [0u8; 24];
    k[..16].copy_from_slice(&session.0);
    k[16..].copy_from_slice(&seq.to_be_bytes());
    k
}

/// Splits a chunk key into its session and first seq.
pub fn parse_event_key(key: &[u8]) -> Option<(SessionId, u64)> {
    if key.len() != 24 {
        return None;
    }
    let mut s = [0u8; 16];
    s.copy_from_slice(&key[..16]);
    Some((SessionId(s), u64::from_be_bytes(key[16..].try_into().ok()?)))
}

/// Builds one chunk value.
#[derive(Debug)]
pub struct ChunkBuilder {
    buf: Vec<u8>,
    count: u32,
    bytes: u64,
}

impl Default for ChunkBuilder {
    fn default() -> Self {
        let mut buf = Vec::with_capacity(4096);
        buf.resize(CHUNK_HEADER, 0);
        Self {
            buf,
            count: 0,
            bytes: 0,
        }
    }
}

impl ChunkBuilder {
    /// Appends the next event.
    pub fn push(&mut self, epoch: u32, kind: Kind, stream: StreamTag, payload: &[u8]) {
        self.buf.extend_from_slice(&epoch.to_be_bytes());
        self.buf.push(kind as u8);
        self.buf.extend_from_slice(&stream.0.to_be_bytes());
        let len = u32::try_from(payload.len()).expect("events are bounded far below 4 GiB");
        self.buf.extend_from_slice(&len.to_be_bytes());
        self.buf.extend_from_slice(payload);
        self.count += 1;
        self.bytes += payload.len() as u64;
    }

    /// Events pushed.
    pub fn count(&self) -> u32 {
        self.count
    }

    /// Encoded size so far.
    pub fn encoded_len(&self) -> usize {
        self.buf.len()
    }

    /// The value to store.
    pub fn finish(mut self) -> Vec<u8> {
        self.buf[0] = V2;
        self.buf[1..5].copy_from_slice(&self.count.to_be_bytes());
        self.buf[5..13].copy_from_slice(&self.bytes.to_be_bytes());
        self.buf
    }
}

/// Number of events and payload bytes of a chunk value, from its header alone.
pub fn chunk_info(value: &[u8]) -> Option<(u64, u64)> {
    match *value.first()? {
        V1 if value.len() >= V1_HEADER => Some((1, (value.len() - V1_HEADER) as u64)),
        V2 if value.len() >= CHUNK_HEADER => Some((
            u64::from(u32::from_be_bytes(value[1..5].try_into().ok()?)),
            u64::from_be_bytes(value[5..13].try_into().ok()?),
        )),
        _ => None,
    }
}

/// Decodes a chunk whose first event is `first`; payloads are zero-copy slices of `value`.
/// `None` when the value is corrupt.
pub fn decode_chunk(first: u64, value: Bytes) -> Option<Vec<Event>> {
    match *value.first()? {
        V1 => {
            if value.len() < V1_HEADER {
                return None;
            }
            let (epoch, kind, stream) = record_header(&value[1..])?;
            Some(vec![Event {
                seq: first,
                epoch,
                stream,
                kind,
                payload: value.slice(V1_HEADER..),
            }])
        }
        V2 => {
            let (count, _) = chunk_info(&value)?;
            let mut out = Vec::with_capacity(count as usize);
            let mut pos = CHUNK_HEADER;
            for i in 0..count {
                let h = value.get(pos..pos + RECORD_HEADER)?;
                let (epoch, kind, stream) = record_header(h)?;
                let len = u32::from_be_bytes(h[13..17].try_into().ok()?) as usize;
                let start = pos + RECORD_HEADER;
                if value.len() < start + len {
                    return None;
                }
                out.push(Event {
                    seq: first + i,
                    epoch,
                    stream,
                    kind,
                    payload: value.slice(start..start + len),
                });
                pos = start + len;
            }
            (pos == value.len()).then_some(out)
        }
        _ => None,
    }
}

fn record_header(h: &[u8]) -> Option<(u32, Kind, StreamTag)> {
    let epoch = u32::from_be_bytes(h.get(0..4)?.try_into().ok()?);
    let kind = Kind::from_u8(*h.get(4)?)?;
    let stream = StreamTag(u64::from_be_bytes(h.get(5..13)?.try_into().ok()?));
    Some((epoch, kind, stream))
}

/// Key of an in-flight request.
pub fn inflight_key(session: &SessionId, request_id: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(16 + request_id.len());
    k.extend_from_slice(&session.0);
    k.extend_from_slice(request_id.as_bytes());
    k
}

/// Value of an in-flight request.
pub fn inflight_value(stream: StreamTag, registered_at: u64) -> [u8; 16] {
    let mut v = [0u8; 16];
    v[..8].copy_from_slice(&stream.0.to_be_bytes());
    v[8..].copy_from_slice(&registered_at.to_be_bytes());
    v
}

/// Decodes an in-flight value.
pub fn parse_inflight_value(v: &[u8]) -> Option<(StreamTag, u64)> {
    if v.len() != 16 {
        return None;
    }
    Some((
        StreamTag(u64::from_be_bytes(v[..8].try_into().ok()?)),
        u64::from_be_bytes(v[8..].try_into().ok()?),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_order_is_seq_order() {
        let s = SessionId([7; 16]);
        let mut keys: Vec<_> = [1u64, 256, 2, 65536, 255, u64::MAX]
            .iter()
            .map(|&q| event_key(&s, q))
            .collect();
        keys.sort();
        let seqs: Vec<u64> = keys.iter().map(|k| parse_event_key(k).unwrap().1).collect();
        assert_eq!(seqs, vec![1, 2, 255, 256, 65536, u64::MAX]);
    }

    #[test]
    fn chunk_round_trip() {
        let mut b = ChunkBuilder::default();
        b.push(3, Kind::Final, StreamTag(42), b"{\"a\":1}");
        b.push(3, Kind::Priming, StreamTag(1), b"");
        b.push(4, Kind::End, StreamTag(0), b"{\"reason\":\"x\"}");
        assert_eq!(b.count(), 3);
        let v = b.finish();
        assert_eq!(chunk_info(&v), Some((3, 21)));
        let evs = decode_chunk(10, Bytes::from(v.clone())).unwrap();
        let got: Vec<_> = evs
            .iter()
            .map(|e| (e.seq, e.epoch, e.kind, e.stream, &e.payload[..]))
            .collect();
        assert_eq!(
            got,
            vec![
                (10, 3, Kind::Final, StreamTag(42), &b"{\"a\":1}"[..]),
                (11, 3, Kind::Priming, StreamTag(1), &b""[..]),
                (12, 4, Kind::End, StreamTag(0), &b"{\"reason\":\"x\"}"[..]),
            ]
        );
        // Truncated or padded values are corrupt, not silently short.
        assert!(decode_chunk(10, Bytes::from(v[..v.len() - 1].to_vec())).is_none());
        let mut padded = v;
        padded.push(0);
        assert!(decode_chunk(10, Bytes::from(padded)).is_none());
        assert!(decode_chunk(1, Bytes::from_static(b"\x09junk")).is_none());
    }

    #[test]
    fn version_one_values_read_as_chunks_of_one() {
        let mut v = vec![1u8];
        v.extend_from_slice(&7u32.to_be_bytes());
        v.push(Kind::Message as u8);
        v.extend_from_slice(&5u64.to_be_bytes());
        v.extend_from_slice(b"{}");
        assert_eq!(chunk_info(&v), Some((1, 2)));
        let evs = decode_chunk(9, Bytes::from(v)).unwrap();
        assert_eq!(evs.len(), 1);
        let e = &evs[0];
        assert_eq!(
            (e.seq, e.epoch, e.kind, e.stream, &e.payload[..]),
            (9, 7, Kind::Message, StreamTag(5), &b"{}"[..])
        );
    }

    #[test]
    fn inflight_round_trip() {
        let v = inflight_value(StreamTag(5), 99);
        assert_eq!(parse_inflight_value(&v), Some((StreamTag(5), 99)));
    }
}
