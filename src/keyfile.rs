//! Key files the replicas share (`auth.key_file`, `cluster.secret_file`): 32 random bytes as 64
//! hexadecimal characters on one line, readable by their owner (and at most its group: a
//! Kubernetes Secret volume with `fsGroup` is mode 0440), by nobody else. A leaf: config
//! validation and the components that use the keys both read them here.

use std::path::Path;

/// Bytes of a key.
pub const KEY_LEN: usize = 32;

/// Reads a key file: 32 bytes as 64 hexadecimal characters on one line (a trailing newline
/// allowed), readable by its owner and at most its group, writable by its owner only (0600,
/// 0640, 0440 or stricter: a Secret volume mounted with `fsGroup` is 0440).
///
/// # Errors
/// Why the file is not such a key, in words for the config error.
pub fn read(path: &Path) -> Result<[u8; KEY_LEN], String> {
    use std::os::unix::fs::PermissionsExt;
    let meta =
        std::fs::metadata(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    if meta.permissions().mode() & 0o027 != 0 {
        return Err(format!(
            "{} is open to others (mode {:o}); it must be 0600 (or 0640/0440 for a group)",
            path.display(),
            meta.permissions().mode() & 0o777
        ));
    }
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let line = text.strip_suffix('\n').unwrap_or(&text);
    let mut key = [0u8; KEY_LEN];
    hex::decode_to_slice(line, &mut key).map_err(|_| {
        format!(
            "{} must hold {KEY_LEN} bytes as {} hexadecimal characters on one line",
            path.display(),
            KEY_LEN * 2
        )
    })?;
    Ok(key)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    fn file(text: &str, mode: u32) -> (tempfile::TempDir, std::path::PathBuf) {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("key");
        std::fs::write(&p, text).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
        (d, p)
    }

    #[test]
    fn a_key_file_is_64_hex_characters_readable_by_its_owner_only() {
        let good = "ab".repeat(32);
        let (_d, p) = file(&format!("{good}\n"), 0o600);
        assert_eq!(super::read(&p).unwrap(), [0xab; 32]);
        let (_d, p) = file(&good, 0o400);
        assert!(super::read(&p).is_ok());
        let (_d, p) = file(&good, 0o440);
        assert!(super::read(&p).is_ok(), "a Secret volume with fsGroup");
        for mode in [0o644, 0o604, 0o660, 0o602] {
            let (_d, p) = file(&good, mode);
            assert!(super::read(&p).unwrap_err().contains("0600"), "{mode:o}");
        }
        for bad in [
            "ab".repeat(31),
            format!("{good}00"),
            "zz".repeat(32),
            format!("{good}\n\n"),
        ] {
            let (_d, p) = file(&bad, 0o600);
            assert!(
                super::read(&p).unwrap_err().contains("64 hexadecimal"),
                "{bad:?}"
            );
        }
        assert!(super::read(std::path::Path::new("/nonexistent/key")).is_err());
    }
}
