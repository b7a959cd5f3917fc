//! Byte layout of the sled trees.
//!
//! `events`: key = 16-byte session ‖ big-endian u64 seq, so byte order is seq order and a range
//! scan replays in order. Value = version (1) ‖ epoch (u32 BE) ‖ kind (1) ‖ stream (u64 BE) ‖ payload.
//! `inflight`: key = session ‖ JSON-RPC id as compact JSON; value = stream (u64 BE) ‖ head seq at
//! registration (u64 BE).

use bytes::Bytes;

use super::{Kind, StreamTag};
use crate::log::cursor::SessionId;

const VERSION: u8 = 1;
/// Bytes before the payload in an event value.
pub const HEADER_LEN: usize = 1 + 4 + 1 + 8;

/// Key of event `seq` of `session`.
pub fn event_key(session: &SessionId, seq: u64) -> [u8; 24] {
    let mut k = [0u8; 24];
    k[..16].copy_from_slice(&session.0);
    k[16..].copy_from_slice(&seq.to_be_bytes());
    k
}

/// Splits an event key into its session and seq.
pub fn parse_event_key(key: &[u8]) -> Option<(SessionId, u64)> {
    if key.len() != 24 {
        return None;
    }
    let mut s = [0u8; 16];
    s.copy_from_slice(&key[..16]);
    Some((SessionId(s), u64::from_be_bytes(key[16..].try_into().ok()?)))
}

/// Encodes an event value.
pub fn encode_event(epoch: u32, kind: Kind, stream: StreamTag, payload: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(HEADER_LEN + payload.len());
    v.push(VERSION);
    v.extend_from_slice(&epoch.to_be_bytes());
    v.push(kind as u8);
    v.extend_from_slice(&stream.0.to_be_bytes());
    v.extend_from_slice(payload);
    v
}

/// A decoded event value; the payload is a zero-copy slice of `value`.
pub fn decode_event(value: Bytes) -> Option<(u32, Kind, StreamTag, Bytes)> {
    if value.len() < HEADER_LEN || value[0] != VERSION {
        return None;
    }
    let epoch = u32::from_be_bytes(value[1..5].try_into().ok()?);
    let kind = Kind::from_u8(value[5])?;
    let stream = StreamTag(u64::from_be_bytes(value[6..14].try_into().ok()?));
    Some((epoch, kind, stream, value.slice(HEADER_LEN..)))
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
    fn event_round_trip() {
        let v = encode_event(3, Kind::Final, StreamTag(42), b"{\"a\":1}");
        let (e, k, st, p) = decode_event(Bytes::from(v)).unwrap();
        assert_eq!((e, k, st), (3, Kind::Final, StreamTag(42)));
        assert_eq!(&p[..], b"{\"a\":1}");
        assert!(decode_event(Bytes::from_static(b"\x02short")).is_none());
    }

    #[test]
    fn inflight_round_trip() {
        let v = inflight_value(StreamTag(5), 99);
        assert_eq!(parse_inflight_value(&v), Some((StreamTag(5), 99)));
    }
}
