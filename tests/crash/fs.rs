//! The filesystem under test: an ext4 image on a loop device, mounted with `errors=remount-ro`,
//! and its two faults — the simulated power loss (the ext4 shutdown ioctl without a log flush,
//! what xfstests' `godown` does) and the journal abort (`/sys/fs/ext4/<dev>/trigger_fs_error`,
//! which aborts the journal and remounts read-only). After either, the image is copied as it is
//! and the copy is mounted (journal replay; after a journal abort `e2fsck -fy` first), so nothing
//! the old mount writes while it is torn down can reach the state the proxy recovers from.
//!
//! Every step fails loudly: this harness needs root, `losetup`, `mkfs.ext4` and `mount`, and a
//! missing one is a failed test, never a skipped one. [`Image`] undoes everything on drop (also
//! when a test panics).

use std::ffi::c_ulong;
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// `EXT4_IOC_SHUTDOWN` = `_IOR('X', 125, __u32)` (the same number as XFS's `GOINGDOWN`).
const EXT4_IOC_SHUTDOWN: c_ulong = 0x8004_587d;
/// `EXT4_GOING_FLAGS_NOLOGFLUSH`: stop the filesystem without flushing the journal — whatever is
/// not yet committed is lost, as in a power cut.
const EXT4_GOING_FLAGS_NOLOGFLUSH: u32 = 2;

extern "C" {
    fn ioctl(fd: i32, request: c_ulong, ...) -> i32;
    fn syncfs(fd: i32) -> i32;
}

/// Runs a command; `Err` names it and carries its stderr.
fn run(cmd: &str, args: &[&str]) -> Result<String, String> {
    let out = Command::new(cmd)
        .args(args)
        .output()
        .map_err(|e| format!("`{cmd} {}` could not run: {e}", args.join(" ")))?;
    if !out.status.success() {
        return Err(format!(
            "`{cmd} {}` failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// Where images go: `/dev/shm` when it is a writable directory (tmpfs: fast, and a sparse image
/// costs only what is written), else the work dir.
pub fn image_dir(work: &Path) -> PathBuf {
    let shm = Path::new("/dev/shm");
    let probe = shm.join(format!(".mcp-resume-crash-{}", std::process::id()));
    if std::fs::write(&probe, b"x").is_ok() {
        let _ = std::fs::remove_file(&probe);
        shm.to_path_buf()
    } else {
        work.to_path_buf()
    }
}

/// A mounted ext4 image on a loop device. Dropping it unmounts, detaches and deletes.
pub struct Image {
    /// The image file currently attached.
    img: PathBuf,
    /// Its loop device (`/dev/loopN`), while attached.
    dev: Option<String>,
    /// The mount point.
    pub mnt: PathBuf,
    mounted: bool,
    /// Snapshots taken so far (names the next one).
    snapshots: u32,
}

impl Image {
    /// Creates a sparse image of `mib` MiB at `img`, makes an ext4 filesystem on it, attaches it
    /// to a free loop device and mounts it on `mnt`.
    ///
    /// # Panics
    /// When any step fails: the harness cannot run without a real filesystem.
    pub fn create(img: PathBuf, mnt: PathBuf, mib: u64) -> Image {
        let mut me = Image {
            img,
            dev: None,
            mnt,
            mounted: false,
            snapshots: 0,
        };
        let f = File::create(&me.img).unwrap_or_else(|e| {
            panic!(
                "crash harness: cannot create image {}: {e}",
                me.img.display()
            )
        });
        f.set_len(mib << 20)
            .unwrap_or_else(|e| panic!("crash harness: cannot size image: {e}"));
        drop(f);
        let img = me.img.display().to_string();
        if let Err(e) = run("mkfs.ext4", &["-q", "-F", &img]) {
            panic!("crash harness needs mkfs.ext4 (e2fsprogs): {e}");
        }
        std::fs::create_dir_all(&me.mnt).unwrap_or_else(|e| {
            panic!(
                "crash harness: cannot create mount point {}: {e}",
                me.mnt.display()
            )
        });
        me.attach_and_mount()
            .unwrap_or_else(|e| panic!("crash harness needs root, losetup and mount: {e}"));
        me
    }

    fn attach_and_mount(&mut self) -> Result<(), String> {
        let img = self.img.display().to_string();
        let dev = run("losetup", &["-f", "--show", &img])?;
        if !dev.starts_with("/dev/loop") {
            return Err(format!("losetup printed {dev:?}, not a loop device"));
        }
        self.dev = Some(dev.clone());
        // errors=remount-ro: an ext4 error (trigger_fs_error) aborts the journal and stops all
        // writes, rather than being logged and ignored (errors=continue).
        run(
            "mount",
            &[
                "-t",
                "ext4",
                "-o",
                "errors=remount-ro",
                &dev,
                &self.mnt.display().to_string(),
            ],
        )?;
        self.mounted = true;
        Ok(())
    }

    /// The loop device, e.g. `/dev/loop3`.
    pub fn device(&self) -> &str {
        self.dev.as_deref().unwrap_or("-")
    }

    /// The simulated power loss: shuts the filesystem down without flushing its journal. From
    /// here on nothing reaches the image: writes fail with EIO, dirty pages and the uncommitted
    /// journal transaction are dropped.
    ///
    /// # Errors
    /// When the ioctl fails (then the filesystem was not aborted).
    pub fn abort(&self) -> Result<(), String> {
        let dir = File::open(&self.mnt)
            .map_err(|e| format!("open {} for the shutdown ioctl: {e}", self.mnt.display()))?;
        let flags: u32 = EXT4_GOING_FLAGS_NOLOGFLUSH;
        // SAFETY: EXT4_IOC_SHUTDOWN reads one u32 through the pointer, which outlives the call;
        // the fd is a valid open directory on the filesystem.
        let rc = unsafe { ioctl(dir.as_raw_fd(), EXT4_IOC_SHUTDOWN, &flags as *const u32) };
        if rc != 0 {
            return Err(format!(
                "EXT4_IOC_SHUTDOWN on {}: {}",
                self.mnt.display(),
                std::io::Error::last_os_error()
            ));
        }
        Ok(())
    }

    /// The journal abort: an ext4 error raised through `/sys/fs/ext4/<dev>/trigger_fs_error`.
    /// With `errors=remount-ro` the kernel aborts the journal at once (nothing not yet committed
    /// is committed any more) and remounts the filesystem read-only; the processes using it go
    /// on running and see their writes and syncs fail.
    ///
    /// # Errors
    /// When the sysfs file cannot be written.
    pub fn trigger_fs_error(path: &Path) -> Result<(), String> {
        std::fs::write(path, b"crash harness: journal abort\n")
            .map_err(|e| format!("write {}: {e}", path.display()))
    }

    /// The sysfs file that raises an ext4 error on this filesystem.
    pub fn fs_error_path(&self) -> PathBuf {
        let dev = self.device().trim_start_matches("/dev/");
        PathBuf::from(format!("/sys/fs/ext4/{dev}/trigger_fs_error"))
    }

    /// After [`Image::abort`] (and after every process using the filesystem has exited): copies
    /// the image as the abort left it, tears the aborted mount down (its unmount may still write
    /// a superblock or checkpoint into the *old* file, which is then deleted) and mounts the copy,
    /// which replays the journal like a reboot after a power cut.
    ///
    /// # Errors
    /// When a step fails; the image is then left unmounted (drop still cleans up).
    pub fn power_cycle(&mut self) -> Result<(), String> {
        self.cycle(false).map(|_| ())
    }

    /// [`Image::power_cycle`] after a journal abort: the copy is checked and repaired with
    /// `e2fsck -fy` (which replays the journal) before it is mounted, as a boot would after an
    /// error recorded in the superblock. Returns whether e2fsck changed anything.
    ///
    /// # Errors
    /// When a step fails, or e2fsck leaves errors uncorrected (exit status 4 or more).
    pub fn fsck_cycle(&mut self) -> Result<bool, String> {
        self.cycle(true)
    }

    fn cycle(&mut self, fsck: bool) -> Result<bool, String> {
        self.snapshots += 1;
        let snap = self
            .img
            .with_file_name(format!("{}.{}", stem(&self.img), self.snapshots));
        copy_sparse(&self.img, &snap)?;
        self.teardown()?;
        let _ = std::fs::remove_file(&self.img);
        self.img = snap;
        let mut fixed = false;
        if fsck {
            let img = self.img.display().to_string();
            let out = Command::new("e2fsck")
                .args(["-fy", &img])
                .output()
                .map_err(|e| format!("`e2fsck -fy {img}` could not run: {e}"))?;
            // 0: clean; 1: errors corrected; 2: corrected, reboot (a root filesystem); 4 and
            // up: errors left, or e2fsck failed.
            match out.status.code() {
                Some(0) => {}
                Some(1) | Some(2) => fixed = true,
                other => {
                    return Err(format!(
                        "`e2fsck -fy {img}` exited {other:?}: {}",
                        String::from_utf8_lossy(&out.stdout).trim()
                    ))
                }
            }
        }
        self.attach_and_mount()?;
        Ok(fixed)
    }

    /// The segment files of the data dir `data` with their lengths, by segment id (the proxy
    /// must not run): what a check saw after `syncfs`, so later damage can be put where the
    /// data was certainly synced.
    pub fn segment_lengths(data: &Path) -> std::collections::BTreeMap<u64, u64> {
        let mut out = std::collections::BTreeMap::new();
        let Ok(dir) = std::fs::read_dir(data) else {
            return out;
        };
        for e in dir.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let Some(id) = super::damage::segment_id(&name) else {
                continue;
            };
            if let Ok(m) = e.metadata() {
                out.insert(id, m.len());
            }
        }
        out
    }

    /// `syncfs` on the mounted filesystem: what the harness has read back becomes the baseline
    /// that later aborts must not lose.
    ///
    /// # Errors
    /// When syncfs fails.
    pub fn sync(&self) -> Result<(), String> {
        let dir = File::open(&self.mnt).map_err(|e| format!("open mount point: {e}"))?;
        // SAFETY: plain syscall on a valid fd.
        if unsafe { syncfs(dir.as_raw_fd()) } != 0 {
            return Err(format!("syncfs: {}", std::io::Error::last_os_error()));
        }
        Ok(())
    }

    /// Used and total bytes of the mounted filesystem (from `df`).
    pub fn usage(&self) -> Option<(u64, u64)> {
        let out = run(
            "df",
            &["-B1", "--output=used,size", &self.mnt.display().to_string()],
        )
        .ok()?;
        let line = out.lines().nth(1)?;
        let mut it = line.split_whitespace().map(|v| v.parse::<u64>().ok());
        Some((it.next()??, it.next()??))
    }

    /// Copies the mounted filesystem's `dir` (e.g. the data dir) to `to`, for a post-mortem.
    pub fn keep_copy(&self, dir: &Path, to: &Path) {
        let _ = run(
            "cp",
            &["-a", &dir.display().to_string(), &to.display().to_string()],
        );
    }

    /// Unmounts (retrying briefly while the last process lets go) and detaches the loop device.
    fn teardown(&mut self) -> Result<(), String> {
        if self.mounted {
            let mnt = self.mnt.display().to_string();
            let mut last = Ok(String::new());
            for _ in 0..50 {
                last = run("umount", &[&mnt]);
                if last.is_ok() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            if let Err(e) = last {
                // Lazy unmount so the loop device can still go; the failure is reported.
                let _ = run("umount", &["-l", &mnt]);
                self.mounted = false;
                if let Some(dev) = self.dev.take() {
                    let _ = run("losetup", &["-d", &dev]);
                }
                return Err(e);
            }
            self.mounted = false;
        }
        if let Some(dev) = self.dev.take() {
            run("losetup", &["-d", &dev])?;
        }
        Ok(())
    }
}

impl Drop for Image {
    fn drop(&mut self) {
        if let Err(e) = self.teardown() {
            eprintln!("crash harness: cleanup of {}: {e}", self.mnt.display());
        }
        let _ = std::fs::remove_file(&self.img);
        let _ = std::fs::remove_dir(&self.mnt);
    }
}

fn stem(p: &Path) -> String {
    let name = p
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    // `gen3.img.2` -> `gen3.img`
    match name.find(".img") {
        Some(i) => name[..i + 4].to_string(),
        None => name,
    }
}

/// `cp --sparse=always`: a copy of an image in tmpfs costs what the filesystem has written.
fn copy_sparse(from: &Path, to: &Path) -> Result<(), String> {
    run(
        "cp",
        &[
            "--sparse=always",
            &from.display().to_string(),
            &to.display().to_string(),
        ],
    )
    .map(|_| ())
}

/// What the probe of the abort mechanism found (see [`probe`]).
#[derive(Debug, Default, Clone)]
pub struct Probe {
    /// The fdatasync'ed file came back whole and exact (must be true).
    pub synced_survived: bool,
    /// A write after the abort failed (must be true).
    pub write_after_abort_failed: bool,
    /// The image did not change between the abort and the copy 300 ms later (must be true).
    pub frozen: bool,
    /// A file written (no sync) just before the abort came back (expected: no).
    pub unsynced_file_survived: bool,
    /// An append (no sync) to the synced file just before the abort came back (expected: no).
    pub unsynced_append_survived: bool,
}

impl Probe {
    /// All the properties the harness relies on hold.
    pub fn ok(&self) -> bool {
        self.synced_survived && self.write_after_abort_failed && self.frozen
    }
}

fn pattern(n: usize, salt: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(salt))
        .collect()
}

/// Checks the abort mechanism on `image` (before the proxy uses it): a file written and
/// fdatasync'ed (directory fsync'ed too) before the abort must come back exact; a write after the
/// abort must fail; the image must not change after the abort; and whether unsynced writes came
/// back is reported. Leaves the image power-cycled and mounted, with the probe files removed.
///
/// # Errors
/// When a step of the probe itself fails.
pub fn probe(image: &mut Image) -> Result<Probe, String> {
    let mut p = Probe::default();
    let dir = image.mnt.join("probe");
    std::fs::create_dir_all(&dir).map_err(|e| format!("probe mkdir: {e}"))?;
    let synced = pattern(256 * 1024, 7);
    {
        let mut f = File::create(dir.join("synced")).map_err(|e| format!("probe create: {e}"))?;
        f.write_all(&synced)
            .map_err(|e| format!("probe write: {e}"))?;
        f.sync_data().map_err(|e| format!("probe fdatasync: {e}"))?;
        for d in [&dir, &image.mnt] {
            File::open(d)
                .and_then(|d| d.sync_all())
                .map_err(|e| format!("probe dir fsync: {e}"))?;
        }
    }
    {
        let mut f = File::create(dir.join("unsynced")).map_err(|e| format!("probe create: {e}"))?;
        f.write_all(&pattern(256 * 1024, 11))
            .map_err(|e| format!("probe write: {e}"))?;
        let mut a = OpenOptions::new()
            .append(true)
            .open(dir.join("synced"))
            .map_err(|e| format!("probe append open: {e}"))?;
        a.write_all(&pattern(16 * 1024, 13))
            .map_err(|e| format!("probe append: {e}"))?;
    }
    image.abort()?;
    let first = image.img.with_extension("probe-a");
    copy_sparse(&image.img, &first)?;
    p.write_after_abort_failed = File::create(dir.join("after"))
        .and_then(|mut f| f.write_all(b"after").and_then(|_| f.sync_all()))
        .is_err();
    std::thread::sleep(Duration::from_millis(300));
    let second = image.img.with_extension("probe-b");
    copy_sparse(&image.img, &second)?;
    p.frozen = same_file(&first, &second)?;
    let _ = std::fs::remove_file(&first);
    let _ = std::fs::remove_file(&second);
    image.power_cycle()?;
    let mut got = Vec::new();
    if let Ok(mut f) = File::open(dir.join("synced")) {
        let _ = f.read_to_end(&mut got);
    }
    p.synced_survived = got.len() >= synced.len() && got[..synced.len()] == synced[..];
    p.unsynced_append_survived = got.len() > synced.len();
    p.unsynced_file_survived = std::fs::metadata(dir.join("unsynced")).is_ok_and(|m| m.len() > 0);
    std::fs::remove_dir_all(&dir).map_err(|e| format!("probe cleanup: {e}"))?;
    image.sync()?;
    Ok(p)
}

fn same_file(a: &Path, b: &Path) -> Result<bool, String> {
    let (mut fa, mut fb) = (
        File::open(a).map_err(|e| e.to_string())?,
        File::open(b).map_err(|e| e.to_string())?,
    );
    let (mut ba, mut bb) = (vec![0u8; 1 << 20], vec![0u8; 1 << 20]);
    loop {
        let na = read_full(&mut fa, &mut ba)?;
        let nb = read_full(&mut fb, &mut bb)?;
        if na != nb || ba[..na] != bb[..nb] {
            return Ok(false);
        }
        if na == 0 {
            return Ok(true);
        }
    }
}

fn read_full(f: &mut File, buf: &mut [u8]) -> Result<usize, String> {
    let mut n = 0;
    while n < buf.len() {
        match f.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) => return Err(e.to_string()),
        }
    }
    Ok(n)
}
