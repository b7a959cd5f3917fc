//! How much of the log the page cache holds: the newest `window` bytes, not the whole log.
//!
//! Every byte the writer appends lands in a page-cache page first. Left alone, those pages stay
//! until the kernel needs the memory, so the cache grows with everything ever written, and each
//! new page is one the kernel has to find: on a VM whose free memory goes back to the host (free
//! page reporting, as on the machines the benchmarks run on) that is a host fault per page, and
//! the `fsync` path spent 50–85 % of its CPU copying into such pages in the slow runs
//! (docs/benchmarks.md round 6). In a pod the page cache also counts against the container's
//! memory. So once written bytes are `window` behind the head, the writer asks the kernel to drop
//! them (`posix_fadvise` `DONTNEED`, see [`super::io::SegFile::drop_cache`]): the pages go back
//! and the next appends reuse them. Readers far behind the head read those bytes from the disk.
//!
//! The advice never changes a byte of the file. A page still dirty is not dropped but has its
//! write-back started, so every range is advised twice: half a window behind the head, and a
//! window behind. That second advice was not enough with `relaxed`, where the kernel writes back
//! in its own time: under a flood most pages were still dirty or under write-back, stayed, and
//! every new write took a fresh page (docs/benchmarks.md round 8). So a `relaxed` writer also
//! syncs once [`SYNC_EVERY`] bytes are unsynced, and with either mode the pages are clean by the
//! first advice.

use std::sync::{Arc, Weak};

use super::segment::Segment;

/// The newest bytes of the log left cached, at most (a segment smaller than this bounds it).
/// Bytes half a window behind the head are advised a first time (clean pages go, dirty ones have
/// their write-back started), a window behind a second time (what was dirty is clean by then).
pub(super) const WINDOW: u64 = 32 << 20;
/// Unsynced bytes after which a `relaxed` writer syncs (in `Writer::turn`): a quarter of the
/// window, so that what is half a window behind the head, where it is first advised, is clean.
pub(super) const SYNC_EVERY: u64 = WINDOW / 4;
/// Page size the ranges are aligned to (a partial page stays).
const PAGE: u64 = 4096;

/// A segment of the log that may still have cached pages.
#[derive(Debug)]
struct Seg {
    /// Held weakly: a deleted segment's file must close (a full disk heals by deleting them).
    seg: Weak<Segment>,
    /// The log position (bytes written before it, in all segments) of its byte 0.
    base: u64,
    /// Its length, once it is not the active one any more.
    len: Option<u64>,
}

/// The writer's page-cache trim (see the module docs).
#[derive(Debug)]
pub(super) struct PageTrim {
    window: u64,
    /// Advise once this many bytes more can go (one call per step, not per turn).
    step: u64,
    /// The segments from the one holding `dropped` to the active one.
    segs: Vec<Seg>,
    /// Log positions below which pages were advised once, and twice.
    kicked: u64,
    dropped: u64,
}

impl PageTrim {
    /// A trim for a log whose segments are `seg_size` bytes, starting in the active segment `seg`.
    pub(super) fn new(seg_size: u64, seg: &Arc<Segment>) -> Self {
        let window = WINDOW.min(seg_size).max(2 * PAGE);
        Self {
            window,
            step: (window / 8).max(PAGE),
            segs: vec![Seg {
                seg: Arc::downgrade(seg),
                base: 0,
                len: None,
            }],
            kicked: 0,
            dropped: 0,
        }
    }

    /// The active segment now holds `len` bytes: advises what is half a window and a window
    /// behind, once a step of it has gathered.
    pub(super) fn written(&mut self, len: u64) {
        let Some(active) = self.segs.last() else {
            return;
        };
        let head = active.base + len;
        let kick_to = head.saturating_sub(self.window / 2);
        if kick_to >= self.kicked + self.step {
            self.advise(self.kicked, kick_to);
            self.kicked = kick_to;
        }
        let drop_to = head.saturating_sub(self.window);
        if drop_to >= self.dropped + self.step {
            self.advise(self.dropped, drop_to);
            self.dropped = drop_to;
            // Segments wholly behind go from the list.
            let keep = self
                .segs
                .iter()
                .position(|s| s.len.is_none_or(|l| s.base + l > drop_to))
                .unwrap_or(self.segs.len() - 1);
            self.segs.drain(..keep);
        }
    }

    /// The active segment, now `len` bytes, was followed by `next`.
    pub(super) fn rotated(&mut self, len: u64, next: &Arc<Segment>) {
        let Some(active) = self.segs.last_mut() else {
            return;
        };
        active.len = Some(len);
        let base = active.base + len;
        self.segs.push(Seg {
            seg: Arc::downgrade(next),
            base,
            len: None,
        });
    }

    /// Advises the log positions `[from, to)`, segment by segment, each range page-aligned.
    fn advise(&self, from: u64, to: u64) {
        for s in &self.segs {
            let end = s.len.map_or(u64::MAX, |l| s.base + l);
            if end <= from || s.base >= to {
                continue;
            }
            let a = from.max(s.base) - s.base;
            // A closed segment's last partial page goes with it; the active one's stays.
            let b = if s.len.is_some() && to >= end {
                end - s.base
            } else {
                (to.min(end) - s.base) & !(PAGE - 1)
            };
            let a = a & !(PAGE - 1);
            if b > a {
                // A segment deleted since (compaction, retention) closed with its pages.
                if let Some(seg) = s.seg.upgrade() {
                    seg.drop_cache(a, b - a);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io;
    use std::path::Path;
    use std::sync::Mutex;

    use super::*;
    use crate::log::io::{Dir, SegFile};

    /// A file that records what it was advised to drop (tests only: the kernel's page cache
    /// cannot be asked which pages it holds without `mincore`, and that is what is checked).
    #[derive(Debug, Default)]
    struct Recorded(Mutex<Vec<(u64, u64)>>);

    impl SegFile for Recorded {
        fn size(&self) -> io::Result<u64> {
            Ok(0)
        }
        fn read_at(&self, _: &mut [u8], _: u64) -> io::Result<usize> {
            Ok(0)
        }
        fn write_all_at(&self, _: &[u8], _: u64) -> io::Result<()> {
            Ok(())
        }
        fn sync_data(&self) -> io::Result<()> {
            Ok(())
        }
        fn set_len(&self, _: u64) -> io::Result<()> {
            Ok(())
        }
        fn drop_cache(&self, off: u64, len: u64) {
            self.0.lock().unwrap().push((off, off + len));
        }
    }

    #[derive(Debug, Default)]
    struct Files(Mutex<Vec<Arc<Recorded>>>);

    impl Dir for Files {
        fn path(&self) -> &Path {
            Path::new("/nowhere")
        }
        fn list(&self) -> io::Result<Vec<String>> {
            Ok(Vec::new())
        }
        fn open(&self, _: &str, _: bool) -> io::Result<Arc<dyn SegFile>> {
            Err(io::ErrorKind::NotFound.into())
        }
        fn create(&self, _: &str) -> io::Result<Arc<dyn SegFile>> {
            let f = Arc::new(Recorded::default());
            self.0.lock().unwrap().push(f.clone());
            Ok(f)
        }
        fn remove(&self, _: &str) -> io::Result<()> {
            Ok(())
        }
        fn sync(&self) -> io::Result<()> {
            Ok(())
        }
    }

    /// Appends of uneven sizes over several segments: nothing within half a window of the head
    /// is ever advised, every range is page-aligned (but a closed segment's end), and every page
    /// a window and a step behind the head has been advised twice — in earlier segments too.
    #[test]
    fn advises_every_page_twice_and_nothing_near_the_head() {
        const HEADER: u64 = 64;
        for seg_size in [1u64 << 20, 8 << 20, 64 << 20] {
            let dir = Files::default();
            let mut segs = vec![Arc::new(Segment::create(&dir, 1).unwrap())];
            let mut trim = PageTrim::new(seg_size, &segs[0]);
            let window = WINDOW.min(seg_size);
            let mut len = HEADER;
            // The log position of each segment's byte 0, and each closed segment's length.
            let mut bases = vec![0u64];
            let mut lens: Vec<u64> = Vec::new();
            let mut turn = 0u64;
            while bases.last().unwrap() + len < 5 * WINDOW.max(seg_size) {
                turn += 1;
                len += (turn * 7919) % 200_000 + 1;
                trim.written(len);
                let head = bases.last().unwrap() + len;
                let files = dir.0.lock().unwrap();
                for (i, f) in files.iter().enumerate() {
                    for &(a, b) in f.0.lock().unwrap().iter() {
                        let end = lens.get(i).copied();
                        assert!(a % PAGE == 0, "{a}..{b}: start not page-aligned");
                        assert!(b % PAGE == 0 || Some(b) == end, "{a}..{b}: end not aligned");
                        assert!(a < b && end.is_none_or(|e| b <= e));
                        assert!(
                            bases[i] + b + window / 2 <= head,
                            "segment {i}: {a}..{b} advised within {} of the head {head}",
                            window / 2
                        );
                    }
                }
                if turn.is_multiple_of(40) {
                    let behind = head.saturating_sub(window + trim.step + PAGE);
                    for (i, f) in files.iter().enumerate() {
                        let seg_end = lens.get(i).map_or(u64::MAX, |l| bases[i] + l);
                        let upto = behind.min(seg_end) - behind.min(bases[i]);
                        let calls = f.0.lock().unwrap().clone();
                        let mut page = 0;
                        while page + PAGE <= upto {
                            let n = calls
                                .iter()
                                .filter(|&&(a, b)| a <= page && page < b)
                                .count();
                            assert!(
                                n >= 2,
                                "segment {i}: page at {page} advised {n} times (head {head})"
                            );
                            page += PAGE;
                        }
                    }
                }
                drop(files);
                if len >= seg_size {
                    let next = Arc::new(Segment::create(&dir, segs.len() as u64 + 1).unwrap());
                    trim.rotated(len, &next);
                    lens.push(len);
                    bases.push(bases.last().unwrap() + len);
                    segs.push(next);
                    len = HEADER;
                }
            }
            assert!(segs.len() >= 3, "the test never rotated enough");
            // The list of segments it watches stays short: the ones a window reaches back into.
            assert!(trim.segs.len() <= (window / seg_size.min(window)) as usize + 2);
        }
    }

    /// A segment deleted (its last handle gone) is not kept open by the trim, and advising its
    /// range later is a no-op.
    #[test]
    fn does_not_keep_a_deleted_segment_open() {
        let dir = Files::default();
        let old = Arc::new(Segment::create(&dir, 1).unwrap());
        let mut trim = PageTrim::new(1 << 20, &old);
        trim.written(1 << 20);
        let new = Arc::new(Segment::create(&dir, 2).unwrap());
        trim.rotated(1 << 20, &new);
        let weak = Arc::downgrade(&old);
        drop(old);
        assert!(weak.upgrade().is_none(), "the trim held the segment open");
        trim.written(1 << 20);
        let calls = dir.0.lock().unwrap()[1].0.lock().unwrap().clone();
        assert!(
            !calls.is_empty(),
            "the new segment was not advised: {calls:?}"
        );
    }
}
