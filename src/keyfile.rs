//! Key files the replicas share (`auth.key_file`, `cluster.secret_file`): 32 random bytes as 64
//! hexadecimal characters on one line, readable by their owner only. A leaf: config validation
//! and the components that use the keys both read them here.

use std::path::Path;

/// Bytes of a key.
pub const KEY_LEN: usize = 32;

/// Reads a key file: 32 bytes as 64 hexadecimal characters on one line (a trailing newline
/// allowed), readable by its owner only (mode 0600 or stricter).
///
/// # Errors
/// Why the file is not such a key, in words for the config error.
pub fn read(path: &Path) -> Result<[u8; KEY_LEN], String> {
    use std::os::unix::fs::PermissionsExt;
    let meta =
        std::fs::metadata(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    if meta.permissions().mode() & 0o077 != 0 {
        return Err(format!(
            "{} is readable by others (mode {:o}); it must be 0600",
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
        let (_d, p) = file(&good, 0o644);
        assert!(super::read(&p).unwrap_err().contains("0600"));
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
