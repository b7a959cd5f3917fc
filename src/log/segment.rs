//! Segment files and the data directory: naming, creation (made durable with its directory
//! entry), positional reads and writes, `fdatasync`, and the directory lock.
//!
//! Everything here is a thin layer over `std::fs` so that what the log promises rests on calls we
//! can name: `pwrite`, `fdatasync` on the segment, `fsync` on the directory after a segment is
//! created or deleted, `ftruncate` to drop a failed write.

use std::fs::{File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::io::{Dir, SegFile};
use super::record;
use crate::error::StoreError;

/// One segment file, shared by the writer and by readers (a reader holding it can still read a
/// segment the writer has deleted).
#[derive(Debug)]
pub struct Segment {
    /// Segment id (files are named after it and ordered by it).
    pub id: u64,
    file: Arc<dyn SegFile>,
    path: PathBuf,
}

/// File name of segment `id`.
pub fn file_name(id: u64) -> String {
    format!("{id:016x}.seg")
}

/// The segment id a file name stands for.
pub fn parse_file_name(name: &str) -> Option<u64> {
    let hex = name.strip_suffix(".seg")?;
    (hex.len() == 16
        && hex
            .bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()))
    .then(|| u64::from_str_radix(hex, 16).ok())
    .flatten()
}

fn io_err(what: &'static str) -> impl FnOnce(io::Error) -> StoreError {
    move |e| StoreError::io(what, e)
}

impl Segment {
    /// Opens an existing segment for reading (and, with `write`, for truncation and appends).
    ///
    /// # Errors
    /// The open failed.
    pub fn open(dir: &dyn Dir, id: u64, write: bool) -> Result<Self, StoreError> {
        let name = file_name(id);
        let file = dir.open(&name, write).map_err(io_err("open segment"))?;
        Ok(Self {
            id,
            file,
            path: dir.path().join(name),
        })
    }

    /// Creates segment `id` with its header, and makes the file and its directory entry durable
    /// before it returns, so a record later synced in it cannot be lost with the file.
    ///
    /// # Errors
    /// Creating, writing or syncing failed (a partial file is removed).
    pub fn create(dir: &dyn Dir, id: u64) -> Result<Self, StoreError> {
        let name = file_name(id);
        let file = dir.create(&name).map_err(io_err("create segment"))?;
        let seg = Self {
            id,
            file,
            path: dir.path().join(&name),
        };
        let made = seg
            .write_at(&record::segment_header(id), 0)
            .and_then(|()| seg.sync())
            .and_then(|()| sync_dir(dir));
        if let Err(e) = made {
            // Best effort: a file left behind has no synced header and recovery drops it.
            let _ = dir.remove(&name);
            return Err(e);
        }
        Ok(seg)
    }

    /// Path of the file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Length of the file.
    ///
    /// # Errors
    /// `fstat` failed.
    pub fn file_len(&self) -> Result<u64, StoreError> {
        self.file.size().map_err(io_err("stat segment"))
    }

    /// Reads exactly `buf.len()` bytes at `offset`.
    ///
    /// # Errors
    /// The read failed or the file is shorter.
    pub fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<(), StoreError> {
        match self.file.read_at(buf, offset) {
            Ok(n) if n == buf.len() => Ok(()),
            Ok(_) => Err(StoreError::io(
                "read segment",
                io::Error::from(io::ErrorKind::UnexpectedEof),
            )),
            Err(e) => Err(StoreError::io("read segment", e)),
        }
    }

    /// Reads exactly `len` bytes at `offset` into a new buffer.
    ///
    /// # Errors
    /// The read failed or the file is shorter.
    pub fn read_vec_at(&self, len: usize, offset: u64) -> Result<Vec<u8>, StoreError> {
        match self.file.read_vec_at(len, offset) {
            Ok(buf) if buf.len() == len => Ok(buf),
            Ok(_) => Err(StoreError::io(
                "read segment",
                io::Error::from(io::ErrorKind::UnexpectedEof),
            )),
            Err(e) => Err(StoreError::io("read segment", e)),
        }
    }

    /// Reads up to `buf.len()` bytes at `offset`; returns how many (0 at the end).
    ///
    /// # Errors
    /// The read failed.
    pub fn read_some_at(&self, buf: &mut [u8], offset: u64) -> Result<usize, StoreError> {
        self.file
            .read_at(buf, offset)
            .map_err(io_err("read segment"))
    }

    /// Writes all of `buf` at `offset`.
    ///
    /// # Errors
    /// The write failed (perhaps partly: the caller truncates).
    pub fn write_at(&self, buf: &[u8], offset: u64) -> Result<(), StoreError> {
        self.file
            .write_all_at(buf, offset)
            .map_err(io_err("write segment"))
    }

    /// `fdatasync`: the data written so far, and the size needed to read it back, are on stable
    /// storage when this returns.
    ///
    /// # Errors
    /// The sync failed; what it covered is then unknown.
    pub fn sync(&self) -> Result<(), StoreError> {
        self.file.sync_data().map_err(io_err("fdatasync segment"))
    }

    /// Drops the cached pages of `len` bytes at `offset` (see [`SegFile::drop_cache`]).
    pub fn drop_cache(&self, offset: u64, len: u64) {
        self.file.drop_cache(offset, len);
    }

    /// Cuts the file to `len` bytes (drops a failed or torn write).
    ///
    /// # Errors
    /// The truncation failed.
    pub fn truncate(&self, len: u64) -> Result<(), StoreError> {
        self.file.set_len(len).map_err(io_err("truncate segment"))
    }
}

/// `fsync` on a directory: entries created or removed in it are durable when this returns.
///
/// # Errors
/// Opening or syncing the directory failed.
pub fn sync_dir(dir: &dyn Dir) -> Result<(), StoreError> {
    dir.sync().map_err(io_err("fsync data directory"))
}

/// Ids of the segment files in `dir`, ascending. Files that are not segments are ignored.
///
/// # Errors
/// The directory could not be listed.
pub fn list(dir: &dyn Dir) -> Result<Vec<u64>, StoreError> {
    let mut ids: Vec<u64> = dir
        .list()
        .map_err(io_err("list data directory"))?
        .iter()
        .filter_map(|n| parse_file_name(n))
        .collect();
    ids.sort_unstable();
    Ok(ids)
}

/// Removes segment `id` and makes the removal durable.
///
/// # Errors
/// The removal or the directory sync failed.
pub fn remove(dir: &dyn Dir, id: u64) -> Result<(), StoreError> {
    dir.remove(&file_name(id))
        .map_err(io_err("delete segment"))
        .and_then(|()| sync_dir(dir))
}

/// Name of the lock file in a data directory.
pub const LOCK_FILE: &str = "LOCK";

/// Holds the data directory's lock for as long as it lives.
#[derive(Debug)]
pub struct DirLock {
    _file: File,
}

/// Takes the data directory's lock: exclusive for a proxy, shared for a reader (`inspect`).
/// Returns `Ok(None)` when someone else holds it in a conflicting way.
///
/// # Errors
/// The lock file could not be opened or locked for another reason.
pub fn lock(dir: &Path, exclusive: bool) -> Result<Option<DirLock>, StoreError> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(super::io::FILE_MODE)
        .open(dir.join(LOCK_FILE))
        .map_err(io_err("open lock file"))?;
    let got = if exclusive {
        file.try_lock()
    } else {
        file.try_lock_shared()
    };
    match got {
        Ok(()) => Ok(Some(DirLock { _file: file })),
        Err(std::fs::TryLockError::WouldBlock) => Ok(None),
        Err(std::fs::TryLockError::Error(e)) => Err(StoreError::io("lock data directory", e)),
    }
}

/// Does `dir` hold a sled log of an earlier version of the proxy?
pub fn has_sled_files(dir: &Path) -> bool {
    dir.join("conf").is_file() && dir.join("db").is_file()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_sort() {
        assert_eq!(file_name(1), "0000000000000001.seg");
        assert_eq!(parse_file_name(&file_name(0xabc)), Some(0xabc));
        for bad in [
            "1.seg",
            "000000000000000G.seg",
            "0000000000000001.log",
            "000000000000000A.seg",
        ] {
            assert_eq!(parse_file_name(bad), None, "{bad}");
        }
        assert!(file_name(9) < file_name(10) && file_name(0xff) < file_name(0x100));
    }

    /// A read into a new buffer gets what a read into zeros gets, at any offset and length,
    /// and a read past the end is refused as such.
    #[test]
    fn a_read_into_a_new_buffer_is_a_read_into_zeros() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = super::super::io::OsDir::new(tmp.path());
        let s = Segment::create(&dir, 5).unwrap();
        let data: Vec<u8> = (0..200_000u32).map(|i| (i * 7 % 251) as u8).collect();
        s.write_at(&data, 16).unwrap();
        for (off, len) in [(16u64, 0usize), (16, 1), (17, 65_536), (100_000, 100_016)] {
            let mut zeros = vec![0u8; len];
            s.read_at(&mut zeros, off).unwrap();
            assert_eq!(s.read_vec_at(len, off).unwrap(), zeros, "{off} {len}");
        }
        assert!(s.read_vec_at(10, 200_010).is_err());
    }

    #[test]
    fn create_write_read_truncate() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = super::super::io::OsDir::new(tmp.path());
        let s = Segment::create(&dir, 3).unwrap();
        assert_eq!(s.file_len().unwrap(), record::SEGMENT_HEADER as u64);
        s.write_at(b"hello", 16).unwrap();
        s.sync().unwrap();
        let mut buf = [0u8; 5];
        s.read_at(&mut buf, 16).unwrap();
        assert_eq!(&buf, b"hello");
        s.truncate(18).unwrap();
        let mut big = [0u8; 8];
        assert_eq!(s.read_some_at(&mut big, 16).unwrap(), 2);
        assert!(
            Segment::create(&dir, 3).is_err(),
            "never overwrites a segment"
        );
        assert_eq!(list(&dir).unwrap(), vec![3]);
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(s.path()).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "segments are private");
    }

    #[test]
    fn lock_is_exclusive() {
        let dir = tempfile::tempdir().unwrap();
        let a = lock(dir.path(), true).unwrap();
        assert!(a.is_some());
        assert!(lock(dir.path(), true).unwrap().is_none());
        assert!(lock(dir.path(), false).unwrap().is_none());
        drop(a);
        let r = lock(dir.path(), false).unwrap();
        assert!(r.is_some());
        assert!(lock(dir.path(), false).unwrap().is_some());
        assert!(lock(dir.path(), true).unwrap().is_none());
    }
}
