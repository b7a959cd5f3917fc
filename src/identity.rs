//! Who a request comes from (design.md §11): a session belongs to the identity that opened it.
//!
//! A request's identity is the values of the headers named in `auth.identity_headers` (default
//! `authorization`) and, with mutual TLS, the client certificate. The proxy never keeps those
//! values: it keeps an HMAC-SHA-256 of them, keyed with a secret generated once per data
//! directory and kept in it ([`Keyring`]), so that a log or a data dir leaks neither a token nor a
//! way to test guesses against it without the key. The same key makes the short tags that stand in
//! for session ids in log lines above debug level.

use std::fmt;
use std::io::Write;
use std::path::Path;

use http::HeaderMap;
use serde::{Deserialize, Serialize};

pub use crate::config::{AuthConfig, AuthMode};
use crate::error::StoreError;

/// Name of the secret's file in the data directory.
pub const KEY_FILE: &str = "identity.key";
const KEY_LEN: usize = 32;

/// The secret that keys identities and log tags.
#[derive(Clone)]
pub struct Keyring {
    key: ring::hmac::Key,
}

impl fmt::Debug for Keyring {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Keyring(..)")
    }
}

impl Keyring {
    /// Reads the data directory's secret, creating it (durably, readable by the owner only) the
    /// first time.
    ///
    /// # Errors
    /// The file cannot be read or written, or it is not a secret of ours.
    pub fn load_or_create(dir: &Path) -> Result<Keyring, StoreError> {
        let path = dir.join(KEY_FILE);
        match std::fs::read(&path) {
            Ok(bytes) if bytes.len() == KEY_LEN => return Ok(Self::from_secret(&bytes)),
            Ok(_) => {
                return Err(StoreError::Corrupt(format!(
                    "{} is not a {KEY_LEN}-byte secret",
                    path.display()
                )))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(StoreError::io("read the identity secret", e)),
        }
        let mut secret = [0u8; KEY_LEN];
        ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut secret).map_err(
            |_| {
                StoreError::io(
                    "generate the identity secret",
                    std::io::Error::other("no randomness"),
                )
            },
        )?;
        let tmp = dir.join(format!("{KEY_FILE}.tmp"));
        let write = || -> std::io::Result<()> {
            use std::os::unix::fs::OpenOptionsExt;
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .open(&tmp)?;
            f.write_all(&secret)?;
            f.sync_all()?;
            std::fs::rename(&tmp, &path)?;
            std::fs::File::open(dir)?.sync_all()
        };
        write().map_err(|e| StoreError::io("write the identity secret", e))?;
        Ok(Self::from_secret(&secret))
    }

    /// Reads a secret shared by every replica (`auth.key_file`): 32 random bytes as 64
    /// hexadecimal characters on one line, in a file only its owner may read.
    ///
    /// # Errors
    /// The reason, for the config error naming the key.
    pub fn load_file(path: &Path) -> Result<Keyring, String> {
        Ok(Self::from_secret(&crate::keyfile::read(path)?))
    }

    fn from_secret(secret: &[u8]) -> Self {
        Self {
            key: ring::hmac::Key::new(ring::hmac::HMAC_SHA256, secret),
        }
    }

    /// A keyring with a fixed secret (tests, benches).
    #[doc(hidden)]
    pub fn for_tests() -> Self {
        Self::from_secret(&[7u8; KEY_LEN])
    }

    fn mac(&self, domain: &[u8], data: &[u8]) -> [u8; 32] {
        let mut ctx = ring::hmac::Context::with_key(&self.key);
        ctx.update(domain);
        ctx.update(&[0]);
        ctx.update(data);
        ctx.sign().as_ref().try_into().expect("32 bytes")
    }

    /// The short tag that stands for `what` (e.g. a session id) in log lines.
    pub fn tag(&self, what: &[u8]) -> Tag {
        let m = self.mac(b"log-tag", what);
        Tag(u32::from_be_bytes([m[0], m[1], m[2], m[3]]))
    }

    /// The identity of a verified principal (`jwt` mode): its issuer and subject, keyed.
    pub fn principal(&self, p: &crate::jwt::Principal) -> Identity {
        let mut material = b"jwt:".to_vec();
        material.extend_from_slice(p.issuer.as_bytes());
        material.push(0);
        material.extend_from_slice(p.subject.as_bytes());
        Identity(self.mac(b"identity", &material))
    }

    /// What an anonymous caller at `peer` is bound by (its 2026-07-28 tasks): anonymous callers
    /// are their address (design.md §11b), keyed like every other identity.
    pub fn peer(&self, peer: std::net::IpAddr) -> Identity {
        let mut material = b"peer:".to_vec();
        material.extend_from_slice(peer.to_string().as_bytes());
        Identity(self.mac(b"identity", &material))
    }

    /// The identity of a client certificate alone (digest `c`): what the TLS handshake verified,
    /// whatever identity headers ride with it.
    pub fn certificate(&self, c: &[u8; 32]) -> Identity {
        let mut material = b"c:".to_vec();
        material.extend_from_slice(c);
        Identity(self.mac(b"identity", &material))
    }

    /// The identity of a request: its identity headers and client certificate digest, keyed.
    /// `None` when it carries none of them (an anonymous caller).
    pub fn identity(
        &self,
        cfg: &AuthConfig,
        headers: &HeaderMap,
        client_cert: Option<&[u8; 32]>,
    ) -> Option<Identity> {
        let mut material = Vec::new();
        for name in &cfg.identity_headers {
            let values: Vec<_> = headers.get_all(name.as_str()).iter().collect();
            if values.is_empty() {
                continue;
            }
            material.extend_from_slice(b"h:");
            material.extend_from_slice(name.to_ascii_lowercase().as_bytes());
            for v in values {
                material.push(0);
                material.extend_from_slice(v.as_bytes());
            }
            material.push(b'\n');
        }
        if let Some(c) = client_cert {
            material.extend_from_slice(b"c:");
            material.extend_from_slice(c);
        }
        (!material.is_empty()).then(|| Identity(self.mac(b"identity", &material)))
    }
}

/// A caller's keyed fingerprint. Stored with its sessions; compared in constant time.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Identity([u8; 32]);

impl Identity {
    /// Same identity, compared without an early exit.
    pub fn matches(&self, other: &Identity) -> bool {
        self.0
            .iter()
            .zip(other.0.iter())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
    }

    /// Its 64 hex characters (what a forward between replicas carries).
    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }

    /// From [`Identity::to_hex`].
    pub fn from_hex(s: &str) -> Option<Identity> {
        let mut out = [0u8; 32];
        hex::decode_to_slice(s, &mut out).ok()?;
        Some(Identity(out))
    }

    /// Its log tag (first 8 hex chars of the fingerprint, which is already keyed).
    pub fn tag(&self) -> Tag {
        Tag(u32::from_be_bytes([
            self.0[0], self.0[1], self.0[2], self.0[3],
        ]))
    }
}

impl fmt::Debug for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Identity({})", self.tag())
    }
}

impl Serialize for Identity {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let hex: String = self.0.iter().map(|b| format!("{b:02x}")).collect();
        s.serialize_str(&hex)
    }
}

impl<'de> Deserialize<'de> for Identity {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        let bad = || serde::de::Error::custom("an identity is 64 hex characters");
        if s.len() != 64 {
            return Err(bad());
        }
        let mut out = [0u8; 32];
        for (i, o) in out.iter_mut().enumerate() {
            *o = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).map_err(|_| bad())?;
        }
        Ok(Identity(out))
    }
}

/// A short keyed tag (8 hex chars) that stands for an id in logs above debug level.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Tag(u32);

impl fmt::Display for Tag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:08x}", self.0)
    }
}

impl fmt::Debug for Tag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn h(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut m = HeaderMap::new();
        for (k, v) in pairs {
            m.append(
                http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        m
    }

    #[test]
    fn identities_bind_headers_and_certificates() {
        let k = Keyring::for_tests();
        let cfg = AuthConfig::default();
        let a = k
            .identity(&cfg, &h(&[("authorization", "Bearer a")]), None)
            .unwrap();
        let a2 = k
            .identity(&cfg, &h(&[("Authorization", "Bearer a")]), None)
            .unwrap();
        let b = k
            .identity(&cfg, &h(&[("authorization", "Bearer b")]), None)
            .unwrap();
        assert!(a.matches(&a2) && !a.matches(&b));
        assert!(k.identity(&cfg, &h(&[("x-other", "1")]), None).is_none());
        let cert = [9u8; 32];
        let c = k.identity(&cfg, &HeaderMap::new(), Some(&cert)).unwrap();
        let ac = k
            .identity(&cfg, &h(&[("authorization", "Bearer a")]), Some(&cert))
            .unwrap();
        assert!(!c.matches(&ac) && !a.matches(&ac));
        // Another key, another fingerprint: a data dir's identities mean nothing elsewhere.
        let other = Keyring::from_secret(&[8u8; KEY_LEN]);
        let a_other = other
            .identity(&cfg, &h(&[("authorization", "Bearer a")]), None)
            .unwrap();
        assert!(!a.matches(&a_other));
        // Several identity headers; order of the config, all values.
        let cfg2 = AuthConfig {
            identity_headers: vec!["authorization".into(), "x-api-key".into()],
            ..AuthConfig::default()
        };
        let both = k
            .identity(
                &cfg2,
                &h(&[("authorization", "A"), ("x-api-key", "K")]),
                None,
            )
            .unwrap();
        let key_only = k.identity(&cfg2, &h(&[("x-api-key", "K")]), None).unwrap();
        assert!(!both.matches(&key_only));
    }

    #[test]
    fn identity_serialises_as_hex_and_back() {
        let k = Keyring::for_tests();
        let a = k
            .identity(&AuthConfig::default(), &h(&[("authorization", "x")]), None)
            .unwrap();
        let json = serde_json::to_string(&a).unwrap();
        assert_eq!(json.len(), 66);
        let back: Identity = serde_json::from_str(&json).unwrap();
        assert!(a.matches(&back));
        assert!(serde_json::from_str::<Identity>("\"zz\"").is_err());
        assert_eq!(format!("{}", a.tag()).len(), 8);
    }

    #[test]
    fn the_secret_is_created_once_and_kept() {
        let dir = tempfile::tempdir().unwrap();
        let k1 = Keyring::load_or_create(dir.path()).unwrap();
        let k2 = Keyring::load_or_create(dir.path()).unwrap();
        assert_eq!(k1.tag(b"s"), k2.tag(b"s"));
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir.path().join(KEY_FILE))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o077, 0, "owner only: {mode:o}");
        std::fs::write(dir.path().join(KEY_FILE), b"short").unwrap();
        assert!(Keyring::load_or_create(dir.path()).is_err());
    }
}
