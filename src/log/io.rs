//! The narrow file interface the log's promises rest on: a directory of segment files, each read
//! and written at positions, synced with `fdatasync`, cut with `ftruncate`; entries created and
//! removed, made durable with an `fsync` of the directory.
//!
//! [`OsDir`] is the real one (`std::fs`). The fault simulator (`sim`, tests only) is the other: a
//! seeded in-memory file system that loses unsynced writes, tears them at sector granularity,
//! flips bits in synced data and fails any call — so every path of the writer and of recovery
//! can be crashed and checked (design.md §10b "Proof by simulation").

use std::fmt::Debug;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, FileExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Mode of every file the log creates: the log is a copy of all traffic (owner only).
pub const FILE_MODE: u32 = 0o600;
/// Mode of the data directory.
pub const DIR_MODE: u32 = 0o700;

/// One segment file.
pub trait SegFile: Send + Sync + Debug {
    /// Length of the file.
    fn size(&self) -> io::Result<u64>;
    /// Reads up to `buf.len()` bytes at `off`; returns how many (fewer only at the end).
    fn read_at(&self, buf: &mut [u8], off: u64) -> io::Result<usize>;
    /// Reads up to `len` bytes at `off` into a new buffer (fewer only at the end), as
    /// [`Self::read_at`] into zeros would. The real file leaves out the zeros: the kernel
    /// fills the new buffer's spare capacity.
    fn read_vec_at(&self, len: usize, off: u64) -> io::Result<Vec<u8>> {
        let mut buf = vec![0u8; len];
        let n = self.read_at(&mut buf, off)?;
        buf.truncate(n);
        Ok(buf)
    }
    /// Writes all of `buf` at `off` (on an error, perhaps a part of it).
    fn write_all_at(&self, buf: &[u8], off: u64) -> io::Result<()>;
    /// `fdatasync`.
    fn sync_data(&self) -> io::Result<()>;
    /// `ftruncate`.
    fn set_len(&self, len: u64) -> io::Result<()>;
    /// Asks the kernel to drop the cached pages of `len` bytes at `off` (`posix_fadvise`
    /// `DONTNEED`): clean pages go, dirty ones get their write-back started. It changes no byte
    /// of the file, only what memory holds, so the simulator ignores it.
    fn drop_cache(&self, _off: u64, _len: u64) {}
}

/// The data directory, as far as segments go.
pub trait Dir: Send + Sync + Debug {
    /// Where it is (for messages).
    fn path(&self) -> &Path;
    /// Names of its entries.
    fn list(&self) -> io::Result<Vec<String>>;
    /// Opens an existing file.
    fn open(&self, name: &str, write: bool) -> io::Result<Arc<dyn SegFile>>;
    /// Creates a new file (never an existing one), mode [`FILE_MODE`].
    fn create(&self, name: &str) -> io::Result<Arc<dyn SegFile>>;
    /// Removes a file (open handles still read it).
    fn remove(&self, name: &str) -> io::Result<()>;
    /// `fsync` on the directory: creations and removals so far are durable.
    fn sync(&self) -> io::Result<()>;
}

// === impl OsDir ===

/// The real data directory.
#[derive(Debug, Clone)]
pub struct OsDir {
    path: PathBuf,
}

impl OsDir {
    /// The directory at `path` (it must exist).
    pub fn new(path: &Path) -> Self {
        Self {
            path: path.to_path_buf(),
        }
    }

    /// Creates the directory (and its parents) if needed and makes it private ([`DIR_MODE`]).
    ///
    /// # Errors
    /// It could not be created or its mode set.
    pub fn create_private(path: &Path) -> io::Result<Self> {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(DIR_MODE)
            .create(path)?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(DIR_MODE))?;
        Ok(Self::new(path))
    }
}

#[derive(Debug)]
struct OsFile(File);

impl SegFile for OsFile {
    fn size(&self) -> io::Result<u64> {
        Ok(self.0.metadata()?.len())
    }

    fn read_at(&self, buf: &mut [u8], off: u64) -> io::Result<usize> {
        let mut n = 0;
        while n < buf.len() {
            match self.0.read_at(&mut buf[n..], off + n as u64) {
                Ok(0) => break,
                Ok(k) => n += k,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(n)
    }

    fn read_vec_at(&self, len: usize, off: u64) -> io::Result<Vec<u8>> {
        // A chunk read back from the log is up to 64 KiB: zeroing it first was 4-5 % of a
        // flood's instructions when clients trail (docs/benchmarks.md round 9).
        let mut buf = Vec::with_capacity(len);
        while buf.len() < len {
            let at = off + buf.len() as u64;
            match rustix::io::pread(&self.0, rustix::buffer::spare_capacity(&mut buf), at) {
                Ok(0) => break,
                Ok(_) => {}
                Err(rustix::io::Errno::INTR) => {}
                Err(e) => return Err(e.into()),
            }
        }
        // The capacity may be more than was asked for.
        buf.truncate(len);
        Ok(buf)
    }

    fn write_all_at(&self, buf: &[u8], off: u64) -> io::Result<()> {
        self.0.write_all_at(buf, off)
    }

    fn sync_data(&self) -> io::Result<()> {
        self.0.sync_data()
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.0.set_len(len)
    }

    // `posix_fadvise` exists on these only (rustix has no `fadvise` for macOS, the BSDs but
    // FreeBSD, or Solaris); elsewhere the pages stay cached, as before the trim.
    #[cfg(any(target_os = "linux", target_os = "android", target_os = "freebsd"))]
    fn drop_cache(&self, off: u64, len: u64) {
        // Advice only: a failure (a file system without it) leaves the pages cached, as before.
        if let Some(len) = std::num::NonZeroU64::new(len) {
            let _ = rustix::fs::fadvise(&self.0, off, Some(len), rustix::fs::Advice::DontNeed);
        }
    }
}

impl Dir for OsDir {
    fn path(&self) -> &Path {
        &self.path
    }

    fn list(&self) -> io::Result<Vec<String>> {
        let mut out = Vec::new();
        for entry in std::fs::read_dir(&self.path)? {
            if let Ok(name) = entry?.file_name().into_string() {
                out.push(name);
            }
        }
        Ok(out)
    }

    fn open(&self, name: &str, write: bool) -> io::Result<Arc<dyn SegFile>> {
        let f = OpenOptions::new()
            .read(true)
            .write(write)
            .open(self.path.join(name))?;
        Ok(Arc::new(OsFile(f)))
    }

    fn create(&self, name: &str) -> io::Result<Arc<dyn SegFile>> {
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(FILE_MODE)
            .open(self.path.join(name))?;
        Ok(Arc::new(OsFile(f)))
    }

    fn remove(&self, name: &str) -> io::Result<()> {
        std::fs::remove_file(self.path.join(name))
    }

    fn sync(&self) -> io::Result<()> {
        File::open(&self.path)?.sync_all()
    }
}
