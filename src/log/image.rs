//! A read-only scan of a data directory: every segment read in order, every record checked
//! against its checksum, the result folded into what each session holds. Recovery starts from an
//! [`Image`]; `inspect` prints one.
//!
//! Records are applied in log order, so a later record wins: a later meta replaces an earlier one,
//! a chunk copied forward by compaction replaces its older copy, a remove drops everything of its
//! session before it. A session's retained events are the longest run of contiguous chunks that
//! ends at its newest chunk ([`ImageSession::retained`]): anything older that is separated from it
//! by a hole is not served.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;

use super::cursor::SessionId;
use super::event::{Event, SessionMeta, StreamTag};
use super::io::{Dir, OsDir};
use super::record::{self, Type};
use super::segment::{self, Segment};
use crate::error::StoreError;

/// Highest seq the log takes from disk: far beyond any real head, with room for recovery to count
/// past it without overflow.
pub const MAX_SEQ: u64 = u64::MAX / 4;

/// Where a record is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Loc {
    /// Segment id.
    pub seg: u64,
    /// Offset of the record's frame.
    pub off: u64,
    /// Length of the record on disk (frame included).
    pub len: u32,
}

/// One chunk record of a session.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkEntry {
    /// Seq of its first event.
    pub first: u64,
    /// Epoch its events were logged in.
    pub epoch: u32,
    /// Events in it.
    pub count: u64,
    /// Payload bytes of its events.
    pub payload: u64,
    /// Where it is.
    pub loc: Loc,
}

/// A request recorded as in flight and not answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InflightEntry {
    /// Stream it was sent on.
    pub stream: StreamTag,
    /// The session's head when it was registered.
    pub registered_at: u64,
    /// Where its record is.
    pub loc: Loc,
}

/// What the log holds for one session.
#[derive(Clone, Debug, Default)]
pub struct ImageSession {
    /// Latest metadata and its record.
    pub meta: Option<(SessionMeta, Loc)>,
    /// Chunks by first seq.
    pub chunks: BTreeMap<u64, ChunkEntry>,
    /// Latest trim (oldest retained seq) and its record.
    pub trim: Option<(u64, Loc)>,
    /// Requests in flight, by canonical JSON-RPC id.
    pub inflight: HashMap<String, InflightEntry>,
    /// In-flight records each chunk (by first seq) ended: owed again if recovery does not serve
    /// the chunk (it lies past damage).
    pub answered: BTreeMap<u64, Vec<(String, InflightEntry)>>,
}

/// A session's retained range, as recovery and `inspect` read it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Retained {
    /// Oldest retained seq (`head + 1` when nothing is).
    pub oldest: u64,
    /// Newest seq (0 when the session has no events).
    pub head: u64,
    /// The chunks holding `oldest..=head`, in order.
    pub chunks: Vec<ChunkEntry>,
}

impl ImageSession {
    /// The retained range: the run of contiguous chunks from the trim point on, up to the first
    /// one missing (damage, a lost write: nothing after a hole is served as contiguous with what
    /// came before it). A chunk that overlaps the run is a stale copy of an epoch cut before and
    /// is skipped. A session without chunks is empty after the last seq its meta knows of.
    /// Recovery serves exactly this (less any chunk outside the epochs its metadata names).
    pub fn retained(&self) -> Retained {
        let trim = self.trim.map_or(0, |(t, _)| t);
        let epochs = self.meta.as_ref().map(|(m, _)| &m.epochs);
        // A chunk of an epoch its metadata does not give these seqs (or of an epoch older than
        // the chunk before it) is a stale copy of an epoch cut before: the run ends there.
        let in_epochs = |c: &ChunkEntry| {
            // No epochs yet: the first one, from 1 (as recovery takes it).
            epochs.is_none_or(|es| {
                (es.is_empty() && c.epoch == 1)
                    || es.iter().any(|e| {
                        e.epoch == c.epoch
                            && c.first >= e.first
                            && e.last.is_none_or(|l| c.first + c.count - 1 <= l)
                    })
            })
        };
        let mut run: Vec<ChunkEntry> = Vec::new();
        for c in self.chunks.values() {
            if c.first + c.count <= trim {
                continue;
            }
            if let Some(p) = run.last() {
                let end = p.first + p.count;
                if c.first < end {
                    continue;
                }
                if c.first != end || c.epoch < p.epoch {
                    break;
                }
            }
            if !in_epochs(c) {
                break;
            }
            run.push(*c);
        }
        match (run.first(), run.last()) {
            (Some(f), Some(l)) => Retained {
                oldest: f.first.max(trim),
                head: l.first + l.count - 1,
                chunks: run,
            },
            _ => {
                let head = self
                    .meta
                    .as_ref()
                    .and_then(|(m, _)| m.epochs.last())
                    .map(|e| e.last.unwrap_or(e.first.saturating_sub(1)))
                    .unwrap_or(0);
                Retained {
                    oldest: head.saturating_add(1),
                    head,
                    chunks: Vec::new(),
                }
            }
        }
    }
}

/// One segment as scanned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageSegment {
    /// Segment id.
    pub id: u64,
    /// Bytes of valid records (header included): where the next record would go.
    pub valid_len: u64,
    /// Length of the file.
    pub file_len: u64,
    /// Bytes known to have been on stable storage (the whole file, but for the newest segment).
    pub synced: u64,
}

/// Everything a scan of a data directory found.
#[derive(Debug)]
pub struct Image {
    /// The directory.
    pub dir: Arc<dyn Dir>,
    /// Segments, ascending.
    pub segments: Vec<ImageSegment>,
    /// Sessions with their records.
    pub sessions: BTreeMap<SessionId, ImageSession>,
    /// The last record is a clean-stop record.
    pub clean: bool,
    /// Durability of the last run that started (`Some(true)` = fsync), from its open record.
    pub last_open_fsync: Option<bool>,
    /// That open record.
    pub open_loc: Option<Loc>,
    /// Damage found (each a sentence; logged by recovery): bad records inside synced data,
    /// records that pass their checksum but do not parse, segments without a header.
    pub damage: Vec<String>,
    /// The newest segment ends in a torn write at this offset, past what was synced (a crash
    /// mid-write): recovery cuts it off.
    pub torn_at: Option<u64>,
    /// Pieces of damage in [`Image::damage`] that are bad data (not orphans): each seals every
    /// live session on recovery and moves `mcp_resume_store_damage_total`.
    pub damaged: u64,
    /// Records read.
    pub records: u64,
}

/// A frame found in a segment: a record, or a bad span up to the next record found after it.
enum Found {
    Record { pos: usize, len: usize },
    Bad { pos: usize, next: usize },
}

/// The next offset after `from` where a whole, checksummed record starts (or `buf.len()`): the
/// way past a damaged record whose length cannot be trusted.
fn resync(buf: &[u8], from: usize) -> usize {
    let mut p = from + 1;
    while p + record::FRAME < buf.len() {
        let len = u32::from_be_bytes(buf[p..p + 4].try_into().expect("4 bytes")) as usize;
        if len != 0
            && len <= record::MAX_RECORD
            && p + record::FRAME + len <= buf.len()
            && record::read_frame(&buf[p..]).is_ok()
        {
            return p;
        }
        p += 1;
    }
    buf.len()
}

/// Bytes from the start of `buf` (a damaged record) to the next intact record, or all of it.
pub fn resync_from_start(buf: &[u8]) -> usize {
    resync(buf, 0)
}

impl Image {
    /// Scans the directory at `dir` without changing anything.
    ///
    /// # Errors
    /// A segment could not be listed, opened or read.
    pub fn scan(dir: &Path) -> Result<Image, StoreError> {
        Self::scan_in(Arc::new(OsDir::new(dir)))
    }

    /// Scans `dir` without changing anything.
    ///
    /// # Errors
    /// A segment could not be listed, opened or read.
    pub fn scan_in(dir: Arc<dyn Dir>) -> Result<Image, StoreError> {
        let ids = segment::list(&*dir)?;
        let mut img = Image {
            dir: dir.clone(),
            segments: Vec::with_capacity(ids.len()),
            sessions: BTreeMap::new(),
            clean: false,
            last_open_fsync: None,
            open_loc: None,
            damage: Vec::new(),
            torn_at: None,
            damaged: 0,
            records: 0,
        };
        let mut last_type = None;
        for (i, &id) in ids.iter().enumerate() {
            let newest = i + 1 == ids.len();
            let seg = Segment::open(&*dir, id, false)?;
            let file_len = seg.file_len()?;
            let mut buf = vec![0u8; file_len as usize];
            let n = seg.read_some_at(&mut buf, 0)?;
            buf.truncate(n);
            if record::parse_segment_header(&buf) != Some(id) {
                // A segment whose creation was cut short has no (durable) header: nothing in it
                // was ever acknowledged. Anywhere else it is damage.
                if newest {
                    img.torn_at = Some(0);
                } else {
                    img.damaged += 1;
                    img.damage.push(format!(
                        "segment {} has no valid header; skipped",
                        seg.path().display()
                    ));
                }
                img.segments.push(ImageSegment {
                    id,
                    valid_len: 0,
                    file_len,
                    synced: 0,
                });
                continue;
            }
            // Every frame first, then what was synced: a mark later in the file may show that a
            // bad record before it was synced (damage), not torn.
            let mut found = Vec::new();
            let mut synced = if newest {
                record::SEGMENT_HEADER
            } else {
                buf.len()
            };
            let mut pos = record::SEGMENT_HEADER;
            while pos < buf.len() {
                match record::read_frame(&buf[pos..]) {
                    Ok((ty, body, len)) => {
                        if ty == Type::Mark {
                            if let Some((_, s)) = record::parse_mark(body) {
                                synced = synced.max((s as usize).min(pos));
                            }
                        }
                        found.push(Found::Record { pos, len });
                        pos += len;
                    }
                    Err(_) => {
                        let next = resync(&buf, pos);
                        found.push(Found::Bad { pos, next });
                        pos = next;
                    }
                }
            }
            let mut valid_len = buf.len();
            for f in found {
                match f {
                    Found::Record { pos, len } => {
                        let (ty, body, _) = record::read_frame(&buf[pos..]).expect("read before");
                        let loc = Loc {
                            seg: id,
                            off: pos as u64,
                            len: len as u32,
                        };
                        if let Err(why) = img.apply(ty, body, loc) {
                            img.damaged += 1;
                            img.damage.push(format!(
                                "segment {} offset {pos}: {why}; record skipped",
                                seg.path().display()
                            ));
                        }
                        img.records += 1;
                        last_type = Some(ty);
                    }
                    Found::Bad { pos, .. } if pos >= synced => {
                        // Past what was synced: a torn write; it and everything after it go.
                        img.torn_at = Some(pos as u64);
                        valid_len = pos;
                        break;
                    }
                    Found::Bad { pos, next } => {
                        img.damaged += 1;
                        img.damage.push(format!(
                            "segment {} has a damaged record at offset {pos} (synced data; {} \
                             bytes up to the next intact record skipped)",
                            seg.path().display(),
                            next - pos
                        ));
                    }
                }
            }
            img.segments.push(ImageSegment {
                id,
                valid_len: valid_len as u64,
                file_len,
                synced: synced as u64,
            });
        }
        img.clean = last_type == Some(Type::Clean);
        // A session whose metadata is gone (it can only be partly resurrected: its remove
        // record was compacted away before an older copy of its data) is not a session.
        let orphans: Vec<SessionId> = img
            .sessions
            .iter()
            .filter(|(_, s)| s.meta.is_none())
            .map(|(id, _)| *id)
            .collect();
        for id in orphans {
            img.sessions.remove(&id);
            img.damage
                .push(format!("records of session {id} without metadata; ignored"));
        }
        Ok(img)
    }

    fn apply(&mut self, ty: Type, body: &[u8], loc: Loc) -> Result<(), &'static str> {
        match ty {
            Type::Chunk => {
                let c = record::parse_chunk(body).ok_or("unreadable chunk")?;
                let (count, payload) = record::chunk_info(c.value).ok_or("unreadable chunk")?;
                if count == 0 {
                    return Err("empty chunk");
                }
                // Seqs start at 1 and must fit in a u64 with room to spare, or `retained` and
                // recovery would overflow on them (found by fuzzing and by review).
                if c.first == 0 || c.first.checked_add(count).is_none_or(|e| e > MAX_SEQ) {
                    return Err("chunk seqs out of range");
                }
                // Its events must decode: a checksum that holds over a bad encoding is damage
                // too, not an error that stops every restart (found by review).
                if record::event_sizes(c.value).is_none_or(|sz| sz.len() as u64 != count) {
                    return Err("undecodable chunk");
                }
                let epoch = record::chunk_epoch(c.value).ok_or("unreadable chunk")?;
                let s = self.sessions.entry(c.session).or_default();
                // The answers end their requests' in-flight records — those registered before
                // them: a copy of the chunk (compaction) may come after a later request that
                // reused the id, registered at a head at or past the chunk's end.
                let last = c.first + count - 1;
                for id in &c.completes {
                    if s.inflight.get(id).is_some_and(|e| e.registered_at < last) {
                        if let Some(e) = s.inflight.remove(id) {
                            s.answered.entry(c.first).or_default().push((id.clone(), e));
                        }
                    }
                }
                s.chunks.insert(
                    c.first,
                    ChunkEntry {
                        first: c.first,
                        epoch,
                        count,
                        payload,
                        loc,
                    },
                );
            }
            Type::Meta => {
                let id = record::session_of(body).ok_or("unreadable meta")?;
                let meta: SessionMeta =
                    serde_json::from_slice(&body[16..]).map_err(|_| "unreadable meta")?;
                let bad_seq = |q: u64| q == 0 || q > MAX_SEQ;
                if meta
                    .epochs
                    .iter()
                    .any(|e| bad_seq(e.first) || e.last.is_some_and(|l| l > MAX_SEQ))
                {
                    return Err("meta seqs out of range");
                }
                self.sessions.entry(id).or_default().meta = Some((meta, loc));
            }
            Type::Inflight => {
                let (id, stream, registered_at, req) =
                    record::parse_inflight(body).ok_or("unreadable in-flight record")?;
                self.sessions.entry(id).or_default().inflight.insert(
                    req,
                    InflightEntry {
                        stream,
                        registered_at,
                        loc,
                    },
                );
            }
            Type::InflightDone => {
                let (id, req) =
                    record::parse_inflight_done(body).ok_or("unreadable in-flight record")?;
                if let Some(s) = self.sessions.get_mut(&id) {
                    s.inflight.remove(&req);
                }
            }
            Type::Trim => {
                let (id, oldest) = record::parse_trim(body).ok_or("unreadable trim")?;
                let s = self.sessions.entry(id).or_default();
                if s.trim.is_none_or(|(t, _)| oldest >= t) {
                    s.trim = Some((oldest, loc));
                }
            }
            Type::Remove => {
                let id = record::session_of(body).ok_or("unreadable remove")?;
                self.sessions.remove(&id);
            }
            Type::Open => {
                self.last_open_fsync = Some(record::parse_open(body).ok_or("unreadable open")?);
                self.open_loc = Some(loc);
            }
            Type::Clean | Type::Mark => {}
        }
        Ok(())
    }

    /// Reads the events of one chunk (for `inspect`; the proxy reads through its log handle).
    ///
    /// # Errors
    /// The read failed or the record is not the chunk the image says.
    pub fn read_chunk(&self, c: &ChunkEntry) -> Result<Vec<Event>, StoreError> {
        let seg = Segment::open(&*self.dir, c.loc.seg, false)?;
        read_chunk_at(&seg, c)
    }
}

/// Reads and decodes the chunk record `c` from `seg`, checking its frame.
///
/// # Errors
/// The read failed, or the bytes there are not that chunk.
pub fn read_chunk_at(seg: &Segment, c: &ChunkEntry) -> Result<Vec<Event>, StoreError> {
    let buf = seg.read_vec_at(c.loc.len as usize, c.loc.off)?;
    let corrupt = || {
        StoreError::Corrupt(format!(
            "chunk at segment {} offset {} (first seq {})",
            c.loc.seg, c.loc.off, c.first
        ))
    };
    let (ty, body, _) = record::read_frame(&buf).map_err(|_| corrupt())?;
    if ty != Type::Chunk {
        return Err(corrupt());
    }
    let start = record::FRAME + 1 + record::chunk_value_offset(body).ok_or_else(corrupt)?;
    let value = Bytes::from(buf).slice(start..);
    record::decode_chunk(c.first, value)
        .filter(|evs| evs.len() as u64 == c.count)
        .ok_or_else(corrupt)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::Facade;
    use crate::log::cursor::EpochRange;
    use crate::log::event::{Kind, StreamTag};

    fn meta_json(epochs: Vec<EpochRange>) -> Vec<u8> {
        serde_json::to_vec(&SessionMeta {
            facade: Facade::Legacy,
            ended: None,
            created_unix: 1,
            ended_unix: None,
            epochs,
            protocol_version: None,
            identity: None,
        })
        .unwrap()
    }

    fn chunk_of(out: &mut Vec<u8>, s: &SessionId, first: u64, n: usize) {
        let mut b = record::ChunkBuilder::default();
        for _ in 0..n {
            b.push(1, Kind::Message, StreamTag::LEGACY, b"{}");
        }
        record::chunk(out, s, first, &[], &b.finish());
    }

    /// Review finding: a chunk copied forward by compaction (its `completes` replayed again)
    /// ended the in-flight record of a later request that reused the id.
    #[test]
    fn a_copied_answer_does_not_end_a_later_request_with_its_id() {
        let dir = tempfile::tempdir().unwrap();
        let a = SessionId([1; 16]);
        let answer = |out: &mut Vec<u8>| {
            let mut b = record::ChunkBuilder::default();
            b.push(1, Kind::Final, StreamTag::LEGACY, b"{\"id\":7}");
            record::chunk(out, &a, 1, &["7".to_string()], &b.finish());
        };
        let mut s1 = record::segment_header(1).to_vec();
        record::meta(&mut s1, &a, &meta_json(vec![]));
        record::inflight(&mut s1, &a, StreamTag::LEGACY, 0, "7");
        answer(&mut s1);
        let mut s2 = record::segment_header(2).to_vec();
        // The client reuses id 7 after its answer (head 1 at registration).
        record::inflight(&mut s2, &a, StreamTag::LEGACY, 1, "7");
        let mut s3 = record::segment_header(3).to_vec();
        answer(&mut s3); // compaction's copy of the answer
        for (id, seg) in [(1, &s1), (2, &s2), (3, &s3)] {
            std::fs::write(dir.path().join(segment::file_name(id)), seg).unwrap();
        }
        let img = Image::scan(dir.path()).unwrap();
        let inflight = &img.sessions[&a].inflight;
        assert_eq!(
            inflight.len(),
            1,
            "the second request 7 is still owed an answer"
        );
        assert_eq!(inflight["7"].registered_at, 1);
    }

    #[test]
    fn seqs_near_u64_max_are_damage_not_a_panic() {
        // Found by fuzzing (fuzz/corpus/log_image/regression-seq-overflow): a well-framed chunk
        // whose seqs run past u64::MAX made `retained` (and `read_chunk`) overflow.
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (SessionId([1; 16]), SessionId([2; 16]));
        let mut seg = record::segment_header(1).to_vec();
        record::meta(&mut seg, &a, &meta_json(vec![]));
        chunk_of(&mut seg, &a, 1, 1);
        chunk_of(&mut seg, &a, u64::MAX, 2);
        chunk_of(&mut seg, &a, u64::MAX - 1, 1);
        // No chunks, and a meta whose epoch ends at the last seq there is.
        let last = EpochRange {
            epoch: 1,
            first: 1,
            last: Some(u64::MAX),
        };
        record::meta(&mut seg, &b, &meta_json(vec![last]));
        std::fs::write(dir.path().join(segment::file_name(1)), &seg).unwrap();

        // Since review: seqs beyond MAX_SEQ (far past any real head) are damage too, so that
        // recovery can count past them without overflow; a meta naming them is damage as well.
        let img = Image::scan(dir.path()).unwrap();
        assert_eq!(img.damaged, 3, "{:?}", img.damage);
        assert!(img.damage[0].contains("chunk seqs out of range"));
        assert!(img.damage[1].contains("chunk seqs out of range"));
        assert!(img.damage[2].contains("meta seqs out of range"));
        let s = &img.sessions[&a];
        let r = s.retained();
        assert_eq!((r.oldest, r.head), (1, 1));
        for c in s.chunks.values() {
            let evs = img.read_chunk(c).unwrap();
            assert_eq!(evs[0].seq, c.first);
        }
        // B's only meta is damage: B is not a session.
        assert!(!img.sessions.contains_key(&b));
        let r = ImageSession::default().retained();
        assert!(r.chunks.is_empty());
    }
}
