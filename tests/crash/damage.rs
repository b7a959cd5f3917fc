//! Damage to synced data (design.md §10b, "damage is never a torn tail"): a reader of the segment
//! files written for the harness (it shares no code with `src/log/`), the choice of a chunk record
//! whose bytes were certainly synced, and the bit flip put into it between a crash and the
//! restart.
//!
//! What the reader knows of the format (src/log/record.rs): a segment `<id:016x>.seg` is a 16-byte
//! header, then records framed as `len (u32 BE) ‖ crc32 (u32 BE) of the rest ‖ type (1) ‖ body`.
//! The body of a chunk (type 1) is `session (16) ‖ first seq (u64) ‖ n (u16) ‖ n × (len (u16) ‖
//! request id) ‖ count (u32) ‖ payload bytes (u64) ‖ count × (epoch (u32) ‖ kind (1) ‖ stream
//! (u64) ‖ len (u32) ‖ payload)`. Meta (2), in-flight (3, 4), trim (5: `session ‖ oldest (u64)`)
//! and remove (6) records start with the session. The walk goes by the length field even past a
//! record whose checksum fails (the harness only damages bodies, never a length).
//!
//! Where a record was certainly synced:
//! - **old**: below the length a segment had right after a `syncfs` of the harness — at the
//!   previous check, or at a random moment of the flood (segments are append-only; a torn write
//!   is cut only past what the crashed proxy itself wrote after that);
//! - **newest**: in the newest segment after an `fsync`-mode crash, before the end of a chunk
//!   record that holds an event a client received and that exists nowhere else (its turn was
//!   `fdatasync`ed before the event was published — or, for a copy made by compaction, before
//!   the segment it came from was deleted — so everything before it in that file was synced).
//!
//! Only a chunk record that is the one copy of its events in the data dir is damaged (no other
//! copy to fall back on), and only inside an event's payload: the checksum fails, the frame, the
//! session and the seqs stay readable, and an engine that ignored the checksum would serve the
//! flipped bytes.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use super::rng::Rng;

const HEADER: usize = 16;
const FRAME: usize = 8;
const MAGIC: &[u8; 7] = b"MCPRLOG";

/// The segment id a file name stands for (`<16 lowercase hex>.seg`).
pub fn segment_id(name: &str) -> Option<u64> {
    let hex = name.strip_suffix(".seg")?;
    (hex.len() == 16
        && hex
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)))
    .then(|| u64::from_str_radix(hex, 16).ok())
    .flatten()
}

/// One record as the walk found it.
#[derive(Debug, Clone)]
pub struct Rec {
    /// Segment id.
    pub seg: u64,
    /// Offset of the frame in the file.
    pub off: u64,
    /// Bytes on disk, frame included.
    pub len: u64,
    /// Its checksum holds.
    pub ok: bool,
    /// Record type.
    pub ty: u8,
    /// The session it belongs to (every type but open and clean).
    pub session: Option<String>,
    /// A chunk's first seq and event count.
    pub seqs: Option<(u64, u64)>,
    /// A chunk's event payloads: file offset and length.
    pub payloads: Payloads<u64>,
    /// A trim record's oldest retained seq.
    pub trim: Option<u64>,
    /// A mark record's synced offset of its segment (what the engine knows was synced).
    pub mark_synced: Option<u64>,
}

/// Every record of a data dir, in log order (segments ascending, then by offset).
#[derive(Debug, Default)]
pub struct Scan {
    /// Segment ids and paths, ascending.
    pub segs: Vec<(u64, PathBuf)>,
    /// The records.
    pub recs: Vec<Rec>,
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn be_u64(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_be_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

fn be_u32(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_be_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn be_u16(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

/// Event payloads of a chunk: offset (in the body, or in the file) and length.
type Payloads<T> = Vec<(T, u32)>;

/// Whether a client received an event of `session` among `first..first + count` from the
/// crashed fsync-mode proxy.
pub type Witness<'a> = &'a dyn Fn(&str, u64, u64) -> bool;

/// A chunk body: `(first, count, payloads as (offset in body, len))`.
fn parse_chunk(body: &[u8]) -> Option<(u64, u64, Payloads<usize>)> {
    let first = be_u64(body, 16)?;
    let n = be_u16(body, 24)?;
    let mut pos = 26;
    for _ in 0..n {
        pos += 2 + be_u16(body, pos)? as usize;
    }
    let count = be_u32(body, pos)?;
    pos += 4 + 8;
    let mut payloads = Vec::with_capacity(count as usize);
    for _ in 0..count {
        let len = be_u32(body, pos + 4 + 1 + 8)?;
        pos += 4 + 1 + 8 + 4;
        body.get(pos..pos + len as usize)?;
        payloads.push((pos, len));
        pos += len as usize;
    }
    Some((first, u64::from(count), payloads))
}

/// Reads every segment of `data` (no proxy may be running on it).
///
/// # Errors
/// A file could not be listed or read.
pub fn scan(data: &Path) -> Result<Scan, String> {
    let mut segs: Vec<(u64, PathBuf)> = std::fs::read_dir(data)
        .map_err(|e| format!("list {}: {e}", data.display()))?
        .flatten()
        .filter_map(|e| {
            let id = segment_id(&e.file_name().to_string_lossy())?;
            Some((id, e.path()))
        })
        .collect();
    segs.sort();
    let mut recs = Vec::new();
    for (id, path) in &segs {
        let mut buf = Vec::new();
        std::fs::File::open(path)
            .and_then(|mut f| f.read_to_end(&mut buf))
            .map_err(|e| format!("read {}: {e}", path.display()))?;
        if buf.len() < HEADER || &buf[..7] != MAGIC {
            continue;
        }
        let mut pos = HEADER;
        while pos + FRAME < buf.len() {
            let len = be_u32(&buf, pos).unwrap_or(0) as usize;
            if len == 0 || pos + FRAME + len > buf.len() {
                break;
            }
            let crc = be_u32(&buf, pos + 4).unwrap_or(0);
            let rec = &buf[pos + FRAME..pos + FRAME + len];
            let ty = rec[0];
            let body = &rec[1..];
            let body_at = (pos + FRAME + 1) as u64;
            let mut r = Rec {
                seg: *id,
                off: pos as u64,
                len: (FRAME + len) as u64,
                ok: crc32fast::hash(rec) == crc,
                ty,
                session: (matches!(ty, 1..=6) && body.len() >= 16).then(|| hex(&body[..16])),
                seqs: None,
                payloads: Vec::new(),
                trim: None,
                mark_synced: None,
            };
            if ty == 1 {
                if let Some((first, count, payloads)) = parse_chunk(body) {
                    r.seqs = Some((first, count));
                    r.payloads = payloads
                        .into_iter()
                        .map(|(at, n)| (body_at + at as u64, n))
                        .collect();
                }
            } else if ty == 5 {
                r.trim = be_u64(body, 16);
            } else if ty == 9 {
                // `at`, then the synced offset (src/log/record.rs `mark`).
                r.mark_synced = be_u64(body, 8);
            }
            recs.push(r);
            pos += FRAME + len;
        }
    }
    Ok(Scan { segs, recs })
}

impl Scan {
    /// A remove record of session `sid` is in the data dir (it was evicted, or deleted).
    pub fn removed(&self, sid: &str) -> bool {
        self.recs
            .iter()
            .any(|r| r.ok && r.ty == 6 && r.session.as_deref() == Some(sid))
    }

    /// Some record of session `sid` is still in the data dir. (Once compaction has dropped a
    /// remove record, nothing older of that session is left.)
    pub fn holds(&self, sid: &str) -> bool {
        self.recs.iter().any(|r| r.session.as_deref() == Some(sid))
    }

    /// Indexes of the chunk records that hold live events and are the only copy of them: the
    /// session has a meta and no remove, the chunk is not wholly before the session's newest trim,
    /// its checksum holds, and no other record has the same session and first seq.
    fn sole_live_chunks(&self) -> Vec<usize> {
        let mut copies: HashMap<(&str, u64), usize> = HashMap::new();
        let mut trim: HashMap<&str, u64> = HashMap::new();
        let mut removed: HashSet<&str> = HashSet::new();
        let mut meta: HashSet<&str> = HashSet::new();
        for r in self.recs.iter().filter(|r| r.ok) {
            let Some(s) = r.session.as_deref() else {
                continue;
            };
            match r.ty {
                1 => {
                    if let Some((first, _)) = r.seqs {
                        *copies.entry((s, first)).or_default() += 1;
                    }
                }
                2 => {
                    meta.insert(s);
                }
                5 => {
                    let t = trim.entry(s).or_default();
                    *t = (*t).max(r.trim.unwrap_or(0));
                }
                6 => {
                    removed.insert(s);
                }
                _ => {}
            }
        }
        (0..self.recs.len())
            .filter(|&i| {
                let r = &self.recs[i];
                let (Some(s), Some((first, count))) = (r.session.as_deref(), r.seqs) else {
                    return false;
                };
                r.ok && r.ty == 1
                    && meta.contains(s)
                    && !removed.contains(s)
                    && first + count > trim.get(s).copied().unwrap_or(0)
                    && copies.get(&(s, first)) == Some(&1)
                    && r.payloads.iter().any(|p| p.1 > 0)
            })
            .collect()
    }
}

/// Which region a damaged record was in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Region {
    /// Below a segment's length at a `syncfs` of the harness.
    Old,
    /// The newest segment, before a record a client received from an fsync-mode proxy.
    Newest,
}

/// One damaged record.
#[derive(Debug, Clone)]
pub struct Damage {
    /// Session of the chunk.
    pub sid: String,
    /// Its seqs: `first..first + count`.
    pub first: u64,
    /// Events in it.
    pub count: u64,
    /// Where.
    pub region: Region,
    /// Segment file and offset of the record.
    pub seg: u64,
    /// Offset of the record.
    pub off: u64,
    /// What was done, for the log line.
    pub how: String,
}

/// Picks a chunk record of a session `eligible` accepts, in a region known to be synced, and
/// damages it. `synced` holds segment lengths seen right after a `syncfs` of the harness (empty
/// when there was none); `witness(sid, first, count)` says whether a client received an event
/// of those seqs from an fsync-mode proxy of the crashed cycle — `None` when the crash was not
/// of an fsync-mode proxy losing power (then nothing in the newest segment is known synced).
///
/// # Errors
/// The data dir could not be read or the segment written (`Ok(Err(why))`: nothing to damage).
pub fn inject(
    data: &Path,
    rng: &mut Rng,
    synced: &BTreeMap<u64, u64>,
    witness: Option<Witness<'_>>,
    eligible: &dyn Fn(&str) -> bool,
) -> Result<Result<Damage, String>, String> {
    let scan = scan(data)?;
    let sole = scan.sole_live_chunks();
    let mut cands: Vec<(usize, Region)> = Vec::new();
    for &i in &sole {
        let r = &scan.recs[i];
        if synced.get(&r.seg).is_some_and(|&len| r.off + r.len <= len) {
            cands.push((i, Region::Old));
        }
    }
    if let (Some(witness), Some(&(newest, _))) = (witness, scan.segs.last()) {
        // The end of the last record of the newest segment that proves a sync.
        let hwm = sole
            .iter()
            .map(|&i| &scan.recs[i])
            .filter(|r| r.seg == newest)
            .filter(|r| {
                let (s, (first, count)) = (r.session.as_deref().unwrap_or(""), r.seqs.unwrap());
                witness(s, first, count)
            })
            .map(|r| r.off + r.len)
            .max();
        // Only what an intact mark says was synced: a record of the last turn before the crash
        // cannot be told from a torn write by the log (README "Durability and storage": a flip
        // there is cut and sealed like a torn tail), so it is no test of damage handling.
        let marked = scan
            .recs
            .iter()
            .filter(|r| r.ok && r.seg == newest)
            .filter_map(|r| r.mark_synced)
            .max()
            .unwrap_or(0);
        if let Some(hwm) = hwm.map(|h| h.min(marked)) {
            for &i in &sole {
                let r = &scan.recs[i];
                if r.seg == newest && r.off + r.len <= hwm {
                    cands.push((i, Region::Newest));
                }
            }
        }
    }
    let found = cands.len();
    cands.retain(|(i, _)| eligible(scan.recs[*i].session.as_deref().unwrap_or("")));
    if cands.is_empty() {
        return Ok(Err(format!(
            "no chunk record to damage: {} chunk records, {} of them sole live copies, {found} of those known synced, none of a session with a cursor",
            scan.recs.iter().filter(|r| r.ty == 1).count(),
            sole.len()
        )));
    }
    // Both regions equally likely when both have candidates.
    let want_newest = rng.chance(0.5);
    let pool: Vec<&(usize, Region)> =
        if cands.iter().any(|c| (c.1 == Region::Newest) == want_newest) {
            cands
                .iter()
                .filter(|c| (c.1 == Region::Newest) == want_newest)
                .collect()
        } else {
            cands.iter().collect()
        };
    let &(i, region) = pool[rng.range(0, pool.len() as u64 - 1) as usize];
    let r = &scan.recs[i];
    let payloads: Vec<&(u64, u32)> = r.payloads.iter().filter(|p| p.1 > 0).collect();
    let &&(at, plen) = &payloads[rng.range(0, payloads.len() as u64 - 1) as usize];
    let byte = at + rng.range(0, u64::from(plen) - 1);
    let path = &scan.segs.iter().find(|s| s.0 == r.seg).expect("scanned").1;
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .map_err(|e| format!("open {}: {e}", path.display()))?;
    // One bit, or up to four bytes each changed, inside the payload.
    let n = if rng.chance(0.7) {
        1
    } else {
        (rng.range(2, 4)).min(at + u64::from(plen) - byte)
    };
    let mut old = vec![0u8; n as usize];
    f.seek(SeekFrom::Start(byte))
        .and_then(|_| f.read_exact(&mut old))
        .map_err(|e| format!("read {}: {e}", path.display()))?;
    let new: Vec<u8> = if n == 1 {
        vec![old[0] ^ (1u8 << rng.range(0, 7))]
    } else {
        old.iter().map(|b| b ^ (rng.range(1, 255) as u8)).collect()
    };
    f.seek(SeekFrom::Start(byte))
        .and_then(|_| f.write_all(&new))
        .and_then(|_| f.sync_all())
        .map_err(|e| format!("write {}: {e}", path.display()))?;
    let (first, count) = r.seqs.expect("a chunk");
    Ok(Ok(Damage {
        sid: r.session.clone().expect("a chunk has a session"),
        first,
        count,
        region,
        seg: r.seg,
        off: r.off,
        how: if n == 1 {
            format!("one bit flipped at file offset {byte}")
        } else {
            format!("{n} bytes changed at file offset {byte}")
        },
    }))
}
