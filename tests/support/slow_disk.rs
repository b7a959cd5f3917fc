//! A data dir on a slow device, and the proxy's RSS (`tests/memory.rs`, `tests/adversary19.rs`).

/// A data dir on a slow device: an ext4 image on a loop device whose writes are throttled to
/// `bps` bytes per second by the block layer. Unthrottled, unmounted and detached on drop.
///
/// The throttle is the kernel's blk-throttle, set on the loop device in the root blkio cgroup
/// (`blkio.throttle.write_bps_device`, cgroup v1): it slows every write to that device, whoever
/// issues it, as a slow disk would. (device-mapper's `dm-delay` would be the other way; this
/// kernel has no device-mapper, and needs nothing installed for this one.) Needs root; fails with
/// the reason when the file or the mount cannot be had, never skips.
pub struct SlowDisk {
    pub dir: std::path::PathBuf,
    dev: String,
    dev_num: String,
    _tmp: tempfile::TempDir,
}

const THROTTLE: &str = "/sys/fs/cgroup/blkio/blkio.throttle.write_bps_device";

fn run(cmd: &str, args: &[&str]) -> String {
    let out = std::process::Command::new(cmd)
        .args(args)
        .output()
        .unwrap_or_else(|e| {
            panic!("cannot run {cmd}: {e} (this test needs root, losetup, mkfs.ext4)")
        });
    assert!(
        out.status.success(),
        "{cmd} {args:?} failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

impl SlowDisk {
    pub fn new(size: &str) -> SlowDisk {
        assert!(
            std::path::Path::new(THROTTLE).exists(),
            "{THROTTLE} missing: the slow disk needs the cgroup v1 blkio controller (blk-throttle)"
        );
        let tmp = tempfile::tempdir().unwrap();
        let image = tmp.path().join("fs.img");
        let dir = tmp.path().join("mnt");
        std::fs::create_dir(&dir).unwrap();
        run("truncate", &["-s", size, image.to_str().unwrap()]);
        run("mkfs.ext4", &["-q", "-F", image.to_str().unwrap()]);
        let dev = run("losetup", &["-f", "--show", image.to_str().unwrap()]);
        let dev_num = run("stat", &["-c", "%t:%T", &dev]);
        let (maj, min) = dev_num.split_once(':').unwrap();
        let dev_num = format!(
            "{}:{}",
            u32::from_str_radix(maj, 16).unwrap(),
            u32::from_str_radix(min, 16).unwrap()
        );
        let d = SlowDisk {
            dir,
            dev,
            dev_num,
            _tmp: tmp,
        };
        run("mount", &[&d.dev, d.dir.to_str().unwrap()]);
        d
    }

    /// Limits writes to the device to `bps` bytes per second (0: no limit).
    pub fn throttle(&self, bps: u64) {
        std::fs::write(THROTTLE, format!("{} {bps}", self.dev_num))
            .unwrap_or_else(|e| panic!("cannot throttle {}: {e}", self.dev));
    }
}

impl Drop for SlowDisk {
    fn drop(&mut self) {
        // Unthrottled first: the unmount writes back what is dirty.
        let _ = std::fs::write(THROTTLE, format!("{} 0", self.dev_num));
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.dir)
            .status();
        let _ = std::process::Command::new("losetup")
            .args(["-d", &self.dev])
            .status();
    }
}

/// A `/proc/<pid>/status` field in bytes (`VmHWM`, `VmRSS`).
pub fn status_kib(pid: u32, field: &str) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = s
        .lines()
        .find(|l| l.starts_with(field))
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"));
    let kib: u64 = line
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap();
    kib * 1024
}

/// Resets the peak (`VmHWM`) to the current RSS (Linux ≥ 4.0).
pub fn reset_peak(pid: u32) {
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5").unwrap();
}
