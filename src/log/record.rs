//! Byte layout of the log: segment headers, framed records, and the chunk codec.
//!
//! A segment file is a 16-byte header (`MCPRLOG` ‖ format version ‖ segment id, u64 BE) followed
//! by records, each framed as
//!
//! ```text
//! len (u32 BE) ‖ crc32 (u32 BE) of type ‖ body ‖ type (1) ‖ body (len − 1 bytes)
//! ```
//!
//! so a torn or corrupt record is detected, never read as something else. Bodies (integers big
//! endian, `S` = 16-byte session id):
//!
//! | type | record | body |
//! |---|---|---|
//! | 1 | chunk | S ‖ first seq (u64) ‖ n (u16) ‖ n × (len (u16) ‖ request id) ‖ chunk value |
//! | 2 | meta | S ‖ [`SessionMeta`](super::SessionMeta) as JSON |
//! | 3 | in flight | S ‖ stream (u64) ‖ head at registration (u64) ‖ request id |
//! | 4 | not in flight | S ‖ request id |
//! | 5 | trim | S ‖ oldest retained seq (u64) |
//! | 6 | remove | S |
//! | 7 | open | durability (1: fsync, 2: relaxed) ‖ unix seconds (u64) |
//! | 8 | clean | unix seconds (u64) |
//! | 9 | mark | own offset (u64) ‖ synced offset (u64) |
//!
//! Every writer turn starts with a *mark*: the offset it stands at, and how much of its segment
//! was on stable storage when the turn was written. Recovery takes the largest synced offset of
//! the intact marks as the part of the newest segment that was synced: a bad record there is
//! damage, past it a torn write. Every other segment was synced whole before the next was made.
//!
//! A *chunk* is consecutive events of one session written in one writer turn; the request ids it
//! carries are the in-flight requests its events answer, so an answer and the end of its request's
//! in-flight record are one atomic write. Chunk value = count (u32) ‖ payload bytes (u64) ‖
//! `count` events, each epoch (u32) ‖ kind (1) ‖ stream (u64) ‖ payload length (u32) ‖ payload.
//! The header's count and byte total let recovery size a session without decoding events.

use bytes::Bytes;

use super::cursor::SessionId;
use super::event::{Event, Kind, StreamTag};

/// First bytes of every segment file.
pub const MAGIC: &[u8; 7] = b"MCPRLOG";
/// Format version written after [`MAGIC`].
pub const VERSION: u8 = 1;
/// Bytes of a segment header.
pub const SEGMENT_HEADER: usize = 16;
/// Bytes of a record's frame before its type byte.
pub const FRAME: usize = 8;
/// Largest record accepted when reading (a bound against a corrupt length).
pub const MAX_RECORD: usize = 256 * 1024 * 1024;

/// Bytes before the first event of a chunk value.
const CHUNK_HEADER: usize = 4 + 8;
/// Bytes before the payload of an event in a chunk value.
const EVENT_HEADER: usize = 4 + 1 + 8 + 4;

/// Record types.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Type {
    /// Events of one session.
    Chunk = 1,
    /// A session's metadata (the latest record wins).
    Meta = 2,
    /// A request forwarded upstream and not yet answered.
    Inflight = 3,
    /// A request that will not be answered upstream (its forward failed).
    InflightDone = 4,
    /// The oldest retained seq of a session.
    Trim = 5,
    /// A session deleted.
    Remove = 6,
    /// A run of the proxy started, with its durability.
    Open = 7,
    /// A run of the proxy stopped cleanly.
    Clean = 8,
    /// The start of a writer turn: its offset and the segment's synced offset.
    Mark = 9,
}

impl Type {
    fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            1 => Type::Chunk,
            2 => Type::Meta,
            3 => Type::Inflight,
            4 => Type::InflightDone,
            5 => Type::Trim,
            6 => Type::Remove,
            7 => Type::Open,
            8 => Type::Clean,
            9 => Type::Mark,
            _ => return None,
        })
    }
}

/// The header of segment `id`.
pub fn segment_header(id: u64) -> [u8; SEGMENT_HEADER] {
    let mut h = [0u8; SEGMENT_HEADER];
    h[..7].copy_from_slice(MAGIC);
    h[7] = VERSION;
    h[8..].copy_from_slice(&id.to_be_bytes());
    h
}

/// The segment id of a header, if it is one of ours.
pub fn parse_segment_header(h: &[u8]) -> Option<u64> {
    if h.len() < SEGMENT_HEADER || &h[..7] != MAGIC || h[7] != VERSION {
        return None;
    }
    Some(u64::from_be_bytes(h[8..16].try_into().ok()?))
}

/// Appends one framed record to `out`; returns its length on disk.
fn frame(out: &mut Vec<u8>, ty: Type, parts: &[&[u8]]) -> usize {
    let body: usize = parts.iter().map(|p| p.len()).sum();
    let len = u32::try_from(1 + body).expect("records are bounded far below 4 GiB");
    let mut crc = crc32fast::Hasher::new();
    crc.update(&[ty as u8]);
    for p in parts {
        crc.update(p);
    }
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(&crc.finalize().to_be_bytes());
    out.push(ty as u8);
    for p in parts {
        out.extend_from_slice(p);
    }
    FRAME + 1 + body
}

/// Encodes a chunk record.
pub fn chunk(
    out: &mut Vec<u8>,
    s: &SessionId,
    first: u64,
    completes: &[String],
    value: &[u8],
) -> usize {
    let mut head =
        Vec::with_capacity(16 + 8 + 2 + completes.iter().map(|c| 2 + c.len()).sum::<usize>());
    head.extend_from_slice(&s.0);
    head.extend_from_slice(&first.to_be_bytes());
    head.extend_from_slice(&(completes.len() as u16).to_be_bytes());
    for c in completes {
        let c = &c.as_bytes()[..c.len().min(u16::MAX as usize)];
        head.extend_from_slice(&(c.len() as u16).to_be_bytes());
        head.extend_from_slice(c);
    }
    frame(out, Type::Chunk, &[&head, value])
}

/// Encodes a meta record.
pub fn meta(out: &mut Vec<u8>, s: &SessionId, json: &[u8]) -> usize {
    frame(out, Type::Meta, &[&s.0, json])
}

/// Encodes an in-flight record.
pub fn inflight(
    out: &mut Vec<u8>,
    s: &SessionId,
    stream: StreamTag,
    registered_at: u64,
    id: &str,
) -> usize {
    frame(
        out,
        Type::Inflight,
        &[
            &s.0,
            &stream.0.to_be_bytes(),
            &registered_at.to_be_bytes(),
            id.as_bytes(),
        ],
    )
}

/// Encodes a not-in-flight record.
pub fn inflight_done(out: &mut Vec<u8>, s: &SessionId, id: &str) -> usize {
    frame(out, Type::InflightDone, &[&s.0, id.as_bytes()])
}

/// Encodes a trim record.
pub fn trim(out: &mut Vec<u8>, s: &SessionId, oldest: u64) -> usize {
    frame(out, Type::Trim, &[&s.0, &oldest.to_be_bytes()])
}

/// Encodes a remove record.
pub fn remove(out: &mut Vec<u8>, s: &SessionId) -> usize {
    frame(out, Type::Remove, &[&s.0])
}

/// Encodes an open record.
pub fn open(out: &mut Vec<u8>, fsync: bool, unix: u64) -> usize {
    frame(
        out,
        Type::Open,
        &[&[if fsync { 1 } else { 2 }], &unix.to_be_bytes()],
    )
}

/// Encodes a clean record.
pub fn clean(out: &mut Vec<u8>, unix: u64) -> usize {
    frame(out, Type::Clean, &[&unix.to_be_bytes()])
}

/// Encodes a mark record.
pub fn mark(out: &mut Vec<u8>, at: u64, synced: u64) -> usize {
    frame(out, Type::Mark, &[&at.to_be_bytes(), &synced.to_be_bytes()])
}

/// Bytes of a mark record on disk.
pub const MARK_LEN: usize = FRAME + 1 + 16;

/// A mark record's fields: its own offset and the synced offset.
pub fn parse_mark(body: &[u8]) -> Option<(u64, u64)> {
    Some((u64_at(body, 0)?, u64_at(body, 8)?))
}

/// Why a frame could not be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrameError {
    /// Fewer bytes than the frame says (a torn tail, or a read that must be longer).
    Short {
        /// Bytes the whole record needs.
        need: usize,
    },
    /// Length out of range, checksum mismatch or unknown type: not a record.
    Corrupt,
}

/// Reads the record framed at the start of `buf`: its type, its body and its length on disk.
///
/// # Errors
/// [`FrameError::Short`] when `buf` holds only part of it; [`FrameError::Corrupt`] otherwise.
pub fn read_frame(buf: &[u8]) -> Result<(Type, &[u8], usize), FrameError> {
    if buf.len() < FRAME {
        return Err(FrameError::Short { need: FRAME + 1 });
    }
    let len = u32::from_be_bytes(buf[..4].try_into().expect("4 bytes")) as usize;
    if len == 0 || len > MAX_RECORD {
        return Err(FrameError::Corrupt);
    }
    let total = FRAME + len;
    if buf.len() < total {
        return Err(FrameError::Short { need: total });
    }
    let crc = u32::from_be_bytes(buf[4..8].try_into().expect("4 bytes"));
    let rec = &buf[FRAME..total];
    if crc32fast::hash(rec) != crc {
        return Err(FrameError::Corrupt);
    }
    let ty = Type::from_u8(rec[0]).ok_or(FrameError::Corrupt)?;
    Ok((ty, &rec[1..], total))
}

/// The session a record body starts with.
pub fn session_of(body: &[u8]) -> Option<SessionId> {
    Some(SessionId(body.get(..16)?.try_into().ok()?))
}

fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_be_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

/// A decoded chunk record, without its events.
#[derive(Debug)]
pub struct ChunkHead<'a> {
    /// Session.
    pub session: SessionId,
    /// Seq of the first event.
    pub first: u64,
    /// Requests its events answer.
    pub completes: Vec<String>,
    /// The chunk value (events).
    pub value: &'a [u8],
}

/// Splits a chunk body.
pub fn parse_chunk(body: &[u8]) -> Option<ChunkHead<'_>> {
    let session = session_of(body)?;
    let first = u64_at(body, 16)?;
    let n = u16::from_be_bytes(body.get(24..26)?.try_into().ok()?);
    let mut pos = 26;
    let mut completes = Vec::with_capacity(n as usize);
    for _ in 0..n {
        let len = u16::from_be_bytes(body.get(pos..pos + 2)?.try_into().ok()?) as usize;
        let id = body.get(pos + 2..pos + 2 + len)?;
        completes.push(String::from_utf8_lossy(id).into_owned());
        pos += 2 + len;
    }
    Some(ChunkHead {
        session,
        first,
        completes,
        value: body.get(pos..)?,
    })
}

/// Offset of the chunk value inside a chunk body (to slice it without copying).
pub fn chunk_value_offset(body: &[u8]) -> Option<usize> {
    let n = u16::from_be_bytes(body.get(24..26)?.try_into().ok()?);
    let mut pos = 26;
    for _ in 0..n {
        let len = u16::from_be_bytes(body.get(pos..pos + 2)?.try_into().ok()?) as usize;
        pos += 2 + len;
    }
    (pos <= body.len()).then_some(pos)
}

/// An in-flight record's fields.
pub fn parse_inflight(body: &[u8]) -> Option<(SessionId, StreamTag, u64, String)> {
    Some((
        session_of(body)?,
        StreamTag(u64_at(body, 16)?),
        u64_at(body, 24)?,
        String::from_utf8_lossy(body.get(32..)?).into_owned(),
    ))
}

/// A not-in-flight record's fields.
pub fn parse_inflight_done(body: &[u8]) -> Option<(SessionId, String)> {
    Some((
        session_of(body)?,
        String::from_utf8_lossy(body.get(16..)?).into_owned(),
    ))
}

/// A trim record's fields.
pub fn parse_trim(body: &[u8]) -> Option<(SessionId, u64)> {
    Some((session_of(body)?, u64_at(body, 16)?))
}

/// An open record's durability (`true` = fsync).
pub fn parse_open(body: &[u8]) -> Option<bool> {
    match *body.first()? {
        1 => Some(true),
        2 => Some(false),
        _ => None,
    }
}

// === chunk values ===

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
    /// A builder that writes into `buf` (cleared; its capacity is reused).
    pub fn with_buf(mut buf: Vec<u8>) -> Self {
        buf.clear();
        buf.resize(CHUNK_HEADER, 0);
        Self {
            buf,
            count: 0,
            bytes: 0,
        }
    }

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

    /// Makes room for `events` more events of `payload` bytes in all, so that pushing them does
    /// not grow the buffer step by step (each growth a copy of what is there).
    pub fn reserve(&mut self, events: usize, payload: usize) {
        self.buf.reserve(events * EVENT_HEADER + payload);
    }

    /// Whether an event of `payload` bytes fits without growing the buffer.
    pub fn fits(&self, payload: usize) -> bool {
        self.buf.capacity() - self.buf.len() >= EVENT_HEADER + payload
    }

    /// Events pushed.
    pub fn count(&self) -> u32 {
        self.count
    }

    /// Payload bytes pushed.
    pub fn payload_bytes(&self) -> u64 {
        self.bytes
    }

    /// Encoded size so far.
    pub fn encoded_len(&self) -> usize {
        self.buf.len()
    }

    /// The encoded value.
    pub fn finish(mut self) -> Vec<u8> {
        self.buf[0..4].copy_from_slice(&self.count.to_be_bytes());
        self.buf[4..12].copy_from_slice(&self.bytes.to_be_bytes());
        self.buf
    }
}

/// Number of events and payload bytes of a chunk value, from its header alone.
pub fn chunk_info(value: &[u8]) -> Option<(u64, u64)> {
    Some((
        u64::from(u32::from_be_bytes(value.get(0..4)?.try_into().ok()?)),
        u64_at(value, 4)?,
    ))
}

/// Epoch of the first event of a chunk value (all events of a chunk share it: epochs change only
/// between runs).
pub fn chunk_epoch(value: &[u8]) -> Option<u32> {
    Some(u32::from_be_bytes(
        value.get(CHUNK_HEADER..CHUNK_HEADER + 4)?.try_into().ok()?,
    ))
}

/// How many events to allocate for: the header's count, but never more than the value has room
/// for, so a corrupt count cannot make a reader allocate gigabytes (found by fuzzing).
fn max_events(count: u64, value: &[u8]) -> usize {
    let room = value.len().saturating_sub(CHUNK_HEADER) / EVENT_HEADER;
    usize::try_from(count).map_or(room, |c| c.min(room))
}

/// Decodes a chunk value whose first event is `first`; payloads are zero-copy slices of `value`.
/// `None` when the value is corrupt.
pub fn decode_chunk(first: u64, value: Bytes) -> Option<Vec<Event>> {
    let (count, _) = chunk_info(&value)?;
    let mut out = Vec::with_capacity(max_events(count, &value));
    let mut pos = CHUNK_HEADER;
    for i in 0..count {
        let h = value.get(pos..pos + EVENT_HEADER)?;
        let epoch = u32::from_be_bytes(h[0..4].try_into().ok()?);
        let kind = Kind::from_u8(h[4])?;
        let stream = StreamTag(u64::from_be_bytes(h[5..13].try_into().ok()?));
        let len = u32::from_be_bytes(h[13..17].try_into().ok()?) as usize;
        let start = pos + EVENT_HEADER;
        if value.len() < start + len {
            return None;
        }
        out.push(Event {
            // A seq past u64::MAX: corrupt, not an overflow (found by fuzzing).
            seq: first.checked_add(i)?,
            epoch,
            stream,
            kind,
            payload: value.slice(start..start + len),
        });
        pos = start + len;
    }
    (pos == value.len()).then_some(out)
}

/// Payload sizes of the events of a chunk value, in order (`None` when corrupt).
pub fn event_sizes(value: &[u8]) -> Option<Vec<u64>> {
    let (count, _) = chunk_info(value)?;
    let mut out = Vec::with_capacity(max_events(count, value));
    let mut pos = CHUNK_HEADER;
    for _ in 0..count {
        let h = value.get(pos..pos + EVENT_HEADER)?;
        let len = u32::from_be_bytes(h[13..17].try_into().ok()?) as usize;
        out.push(len as u64);
        pos += EVENT_HEADER + len;
    }
    (pos == value.len()).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunk_round_trip() {
        let mut b = ChunkBuilder::default();
        b.push(3, Kind::Final, StreamTag(42), b"{\"a\":1}");
        b.push(3, Kind::Priming, StreamTag(1), b"");
        b.push(4, Kind::End, StreamTag(0), b"{\"reason\":\"x\"}");
        assert_eq!(b.count(), 3);
        let v = b.finish();
        assert_eq!(chunk_info(&v), Some((3, 21)));
        assert_eq!(event_sizes(&v), Some(vec![7, 0, 14]));
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
    fn corrupt_event_count_does_not_allocate_it() {
        // Found by fuzzing (fuzz/corpus/log_record/regression-huge-count): a count of 2^32 - 1
        // in a 12-byte value made decode_chunk reserve ~200 GiB and abort the process.
        let mut v = vec![0xff; 4];
        v.extend_from_slice(&[0; 8]);
        assert_eq!(chunk_info(&v), Some((u64::from(u32::MAX), 0)));
        assert!(decode_chunk(1, Bytes::from(v.clone())).is_none());
        assert!(event_sizes(&v).is_none());
        assert_eq!(max_events(u64::from(u32::MAX), &v), 0);
    }

    #[test]
    fn seqs_past_u64_max_are_corrupt() {
        // Found by fuzzing (fuzz/corpus/log_record/regression-seq-overflow): `first + i`
        // overflowed for a chunk record whose first seq is near u64::MAX.
        let mut b = ChunkBuilder::default();
        b.push(1, Kind::Message, StreamTag(0), b"a");
        b.push(1, Kind::Message, StreamTag(0), b"b");
        let v = Bytes::from(b.finish());
        assert!(decode_chunk(u64::MAX, v.clone()).is_none());
        let evs = decode_chunk(u64::MAX - 1, v).unwrap();
        assert_eq!(evs[1].seq, u64::MAX);
    }

    #[test]
    fn frames_round_trip_and_detect_damage() {
        let s = SessionId([7; 16]);
        let mut b = ChunkBuilder::default();
        b.push(1, Kind::Message, StreamTag(0), b"{}");
        let value = b.finish();
        let mut buf = Vec::new();
        let n1 = chunk(&mut buf, &s, 5, &["1".into(), "\"x\"".into()], &value);
        let n2 = meta(&mut buf, &s, b"{\"m\":1}");
        let n3 = inflight(&mut buf, &s, StreamTag(3), 9, "7");
        let n4 = trim(&mut buf, &s, 4);
        let n5 = open(&mut buf, true, 11);
        assert_eq!(buf.len(), n1 + n2 + n3 + n4 + n5);

        let (ty, body, len) = read_frame(&buf).unwrap();
        assert_eq!((ty, len), (Type::Chunk, n1));
        let c = parse_chunk(body).unwrap();
        assert_eq!((c.session, c.first), (s, 5));
        assert_eq!(c.completes, vec!["1".to_string(), "\"x\"".to_string()]);
        assert_eq!(c.value, &value[..]);
        assert_eq!(&body[chunk_value_offset(body).unwrap()..], &value[..]);
        let (ty, body, _) = read_frame(&buf[n1..]).unwrap();
        assert_eq!(
            (ty, session_of(body), &body[16..]),
            (Type::Meta, Some(s), &b"{\"m\":1}"[..])
        );
        let (_, body, _) = read_frame(&buf[n1 + n2..]).unwrap();
        assert_eq!(parse_inflight(body), Some((s, StreamTag(3), 9, "7".into())));
        let (_, body, _) = read_frame(&buf[n1 + n2 + n3..]).unwrap();
        assert_eq!(parse_trim(body), Some((s, 4)));
        let (_, body, _) = read_frame(&buf[n1 + n2 + n3 + n4..]).unwrap();
        assert_eq!(parse_open(body), Some(true));

        // A torn record asks for more; a flipped bit or a zeroed frame is corrupt.
        assert_eq!(
            read_frame(&buf[..n1 - 1]),
            Err(FrameError::Short { need: n1 })
        );
        let mut bad = buf.clone();
        bad[FRAME + 3] ^= 1;
        assert_eq!(read_frame(&bad), Err(FrameError::Corrupt));
        assert_eq!(read_frame(&[0u8; 32]), Err(FrameError::Corrupt));
    }

    #[test]
    fn segment_headers() {
        let h = segment_header(42);
        assert_eq!(parse_segment_header(&h), Some(42));
        let mut bad = h;
        bad[0] = b'X';
        assert_eq!(parse_segment_header(&bad), None);
    }
}
