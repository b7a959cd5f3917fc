//! The scan of a data directory (`Image::scan`) on arbitrary segment files.
//!
//! The first byte picks a mode:
//! * raw: the rest of the input is written as one or two segment files, with the real segment
//!   header prefixed or not (so the fuzzer gets past it without having to find it);
//! * structured: segments made of records the fuzzer describes — arbitrary types and bodies in
//!   valid frames (checksums right, so the scan reaches the record parsers), chunk, meta,
//!   in-flight, trim, remove, open and clean records with arbitrary fields and chunk values, and
//!   raw bytes between them.
//!
//! Checks: `Image::scan` never panics (damage is reported, not thrown); neither does
//! `ImageSession::retained`, whose chunks are contiguous and match its range; every chunk the
//! image lists reads back with `Image::read_chunk` as that many events with consecutive seqs, or
//! is an error.
#![no_main]

use std::path::Path;
use std::sync::OnceLock;

use arbitrary::{Arbitrary, Unstructured};
use libfuzzer_sys::fuzz_target;
use mcp_resume_proxy::domain::{EndReason, Facade};
use mcp_resume_proxy::log::cursor::{EpochRange, SessionId};
use mcp_resume_proxy::log::image::Image;
use mcp_resume_proxy::log::record::{self, FRAME};
use mcp_resume_proxy::log::segment;
use mcp_resume_proxy::log::{Kind, SessionMeta, StreamTag};

#[derive(Arbitrary, Debug)]
enum Header {
    Real,
    OtherId(u64),
    Bytes(Vec<u8>),
}

#[derive(Arbitrary, Debug)]
enum Rec {
    /// Any type byte and body, framed with the right length and checksum.
    Framed {
        ty: u8,
        body: Vec<u8>,
    },
    /// Bytes as they are.
    Raw(Vec<u8>),
    Chunk {
        s: u8,
        first: u64,
        completes: Vec<String>,
        events: Vec<(u32, u8, u64, Vec<u8>)>,
    },
    /// A chunk record whose value is arbitrary bytes.
    ChunkValue {
        s: u8,
        first: u64,
        completes: Vec<String>,
        value: Vec<u8>,
    },
    Meta {
        s: u8,
        ended: bool,
        epochs: Vec<(u32, u64, Option<u64>)>,
    },
    Inflight {
        s: u8,
        stream: u64,
        at: u64,
        id: String,
    },
    InflightDone {
        s: u8,
        id: String,
    },
    Trim {
        s: u8,
        oldest: u64,
    },
    Remove {
        s: u8,
    },
    Open {
        fsync: bool,
    },
    Clean,
}

#[derive(Arbitrary, Debug)]
struct Seg {
    id: u8,
    header: Header,
    recs: Vec<Rec>,
}

fn sid(s: u8) -> SessionId {
    SessionId([s % 4; 16])
}

fn dir() -> &'static Path {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    DIR.get_or_init(|| tempfile::tempdir().expect("temp dir"))
        .path()
}

fuzz_target!(|input: &[u8]| {
    let dir = dir();
    for e in std::fs::read_dir(dir).expect("list temp dir") {
        std::fs::remove_file(e.expect("entry").path()).expect("clear temp dir");
    }
    let Some((&mode, rest)) = input.split_first() else {
        return;
    };
    if mode & 1 == 0 {
        // Raw: one segment, or two split at the middle; headers per the mode bits.
        let halves: Vec<&[u8]> = if mode & 8 != 0 {
            let (a, b) = rest.split_at(rest.len() / 2);
            vec![a, b]
        } else {
            vec![rest]
        };
        for (i, part) in halves.into_iter().enumerate() {
            let id = i as u64 + 1;
            let mut file = Vec::new();
            if mode & (2 << i) != 0 {
                file.extend_from_slice(&record::segment_header(id));
            }
            file.extend_from_slice(part);
            write(dir, id, &file);
        }
    } else {
        let mut u = Unstructured::new(rest);
        let Ok(segs) = Vec::<Seg>::arbitrary(&mut u) else {
            return;
        };
        for seg in segs.iter().take(4) {
            let id = u64::from(seg.id % 8) + 1;
            let mut file = Vec::new();
            match &seg.header {
                Header::Real => file.extend_from_slice(&record::segment_header(id)),
                Header::OtherId(other) => file.extend_from_slice(&record::segment_header(*other)),
                Header::Bytes(b) => file.extend_from_slice(b),
            }
            for r in &seg.recs {
                encode(&mut file, r);
            }
            write(dir, id, &file);
        }
    }
    check(dir);
});

fn write(dir: &Path, id: u64, bytes: &[u8]) {
    std::fs::write(dir.join(segment::file_name(id)), bytes).expect("write segment");
}

fn encode(out: &mut Vec<u8>, r: &Rec) {
    match r {
        Rec::Framed { ty, body } => {
            let len = u32::try_from(1 + body.len()).expect("small");
            let mut crc = crc32fast::Hasher::new();
            crc.update(&[*ty]);
            crc.update(body);
            out.extend_from_slice(&len.to_be_bytes());
            out.extend_from_slice(&crc.finalize().to_be_bytes());
            out.push(*ty);
            out.extend_from_slice(body);
        }
        Rec::Raw(b) => out.extend_from_slice(b),
        Rec::Chunk {
            s,
            first,
            completes,
            events,
        } => {
            let mut b = record::ChunkBuilder::default();
            for (epoch, kind, stream, payload) in events {
                let kind =
                    [Kind::Message, Kind::Priming, Kind::Final, Kind::End][usize::from(kind % 4)];
                b.push(*epoch, kind, StreamTag(*stream), payload);
            }
            record::chunk(out, &sid(*s), *first, completes, &b.finish());
        }
        Rec::ChunkValue {
            s,
            first,
            completes,
            value,
        } => {
            record::chunk(out, &sid(*s), *first, completes, value);
        }
        Rec::Meta { s, ended, epochs } => {
            let meta = SessionMeta {
                facade: Facade::Legacy,
                ended: ended.then_some(EndReason::Shutdown),
                created_unix: 1,
                ended_unix: None,
                epochs: epochs
                    .iter()
                    .map(|&(epoch, first, last)| EpochRange { epoch, first, last })
                    .collect(),
                protocol_version: None,
                identity: None,
            };
            let json = serde_json::to_vec(&meta).expect("meta serialises");
            record::meta(out, &sid(*s), &json);
        }
        Rec::Inflight { s, stream, at, id } => {
            record::inflight(out, &sid(*s), StreamTag(*stream), *at, id);
        }
        Rec::InflightDone { s, id } => {
            record::inflight_done(out, &sid(*s), id);
        }
        Rec::Trim { s, oldest } => {
            record::trim(out, &sid(*s), *oldest);
        }
        Rec::Remove { s } => {
            record::remove(out, &sid(*s));
        }
        Rec::Open { fsync } => {
            record::open(out, *fsync, 1);
        }
        Rec::Clean => {
            record::clean(out, 2);
        }
    }
}

fn check(dir: &Path) {
    let Ok(img) = Image::scan(dir) else {
        return;
    };
    for seg in &img.segments {
        assert!(seg.valid_len <= seg.file_len);
    }
    for s in img.sessions.values() {
        assert!(s.meta.is_some(), "sessions without metadata are dropped");
        let r = s.retained();
        if let (Some(f), Some(l)) = (r.chunks.first(), r.chunks.last()) {
            assert!(r.oldest >= f.first && r.oldest <= r.head);
            assert_eq!(r.head, l.first + (l.count - 1));
            for w in r.chunks.windows(2) {
                assert_eq!(w[0].first + w[0].count, w[1].first, "contiguous");
            }
        } else {
            assert!(r.chunks.is_empty());
        }
        for c in s.chunks.values() {
            assert!(c.loc.len as usize > FRAME);
            if let Ok(evs) = img.read_chunk(c) {
                assert_eq!(evs.len() as u64, c.count);
                for (i, e) in evs.iter().enumerate() {
                    assert_eq!(e.seq, c.first + i as u64);
                }
            }
        }
    }
}
