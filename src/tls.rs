//! TLS with rustls, both ways.
//!
//! - **Client listener** (`[tls]`): the certificate and key are read from PEM files and re-read
//!   when the files change (cert-manager rotates them in place); a new certificate serves new
//!   connections while established ones — live SSE streams — keep theirs. With
//!   `client_ca_file`, every client must present a certificate signed by that CA (mutual TLS), and
//!   the certificate becomes part of the caller's identity (see [`crate::identity`]).
//! - **Upstream** (`https://` in `upstream.sse_url`): the system's roots, or only the roots in
//!   `upstream.ca_file`.
//!
//! Everything uses rustls with the `ring` provider; ALPN offers HTTP/1.1 only (the proxy speaks
//! HTTP/1.1 on both sides).

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use serde::Deserialize;
use tokio::sync::watch;

/// `[tls]`: TLS on the client listener. Off unless both files are set.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct TlsConfig {
    /// PEM certificate chain of the client listener (leaf first).
    pub cert_file: Option<PathBuf>,
    /// PEM private key of that certificate (PKCS#8, PKCS#1 or SEC1).
    pub key_file: Option<PathBuf>,
    /// PEM CA certificates; when set, clients must present a certificate signed by one of them.
    pub client_ca_file: Option<PathBuf>,
    /// Seconds between checks of the files for a rotation (0 = never reload).
    pub reload_secs: Option<u64>,
}

/// Default of `tls.reload_secs`.
pub const DEFAULT_RELOAD_SECS: u64 = 10;

impl TlsConfig {
    /// TLS is on.
    pub fn enabled(&self) -> bool {
        self.cert_file.is_some() || self.key_file.is_some()
    }
}

/// A TLS file or setting that cannot work, naming its config key.
#[derive(Debug, thiserror::Error)]
#[error("invalid `{key}`: {reason}")]
pub struct TlsError {
    /// The config key.
    pub key: &'static str,
    /// Why.
    pub reason: String,
}

fn bad(key: &'static str, reason: impl Into<String>) -> TlsError {
    TlsError {
        key,
        reason: reason.into(),
    }
}

fn read(key: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|e| bad(key, format!("cannot read {}: {e}", path.display())))
}

fn certs(key: &'static str, pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad(key, format!("not PEM certificates: {e}")))?;
    if certs.is_empty() {
        return Err(bad(key, "no certificate in the file"));
    }
    Ok(certs)
}

fn roots(key: &'static str, pem: &[u8]) -> Result<RootCertStore, TlsError> {
    let mut store = RootCertStore::empty();
    for c in certs(key, pem)? {
        store
            .add(c)
            .map_err(|e| bad(key, format!("not a usable CA certificate: {e}")))?;
    }
    Ok(store)
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The contents of the listener's TLS files.
#[derive(Clone, PartialEq, Eq)]
struct Material {
    cert: Vec<u8>,
    key: Vec<u8>,
    ca: Option<Vec<u8>>,
}

impl Material {
    fn read(cfg: &TlsConfig) -> Result<Self, TlsError> {
        let (Some(cert), Some(key)) = (&cfg.cert_file, &cfg.key_file) else {
            return Err(bad(
                if cfg.cert_file.is_none() {
                    "tls.cert_file"
                } else {
                    "tls.key_file"
                },
                "tls.cert_file and tls.key_file go together",
            ));
        };
        Ok(Self {
            cert: read("tls.cert_file", cert)?,
            key: read("tls.key_file", key)?,
            ca: cfg
                .client_ca_file
                .as_deref()
                .map(|p| read("tls.client_ca_file", p))
                .transpose()?,
        })
    }

    fn server_config(&self) -> Result<ServerConfig, TlsError> {
        let chain = certs("tls.cert_file", &self.cert)?;
        let key = PrivateKeyDer::from_pem_slice(&self.key)
            .map_err(|e| bad("tls.key_file", format!("no usable private key: {e}")))?;
        let builder = ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| bad("tls.cert_file", e.to_string()))?;
        let builder = match &self.ca {
            Some(ca) => {
                let verifier = WebPkiClientVerifier::builder_with_provider(
                    Arc::new(roots("tls.client_ca_file", ca)?),
                    provider(),
                )
                .build()
                .map_err(|e| bad("tls.client_ca_file", e.to_string()))?;
                builder.with_client_cert_verifier(verifier)
            }
            None => builder.with_no_client_auth(),
        };
        let mut cfg = builder
            .with_single_cert(chain, key)
            .map_err(|e| bad("tls.key_file", format!("does not match tls.cert_file: {e}")))?;
        cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(cfg)
    }
}

/// Checks the listener's TLS files without starting anything (config validation).
///
/// # Errors
/// [`TlsError`] naming the key whose file is missing or unusable.
pub fn check(cfg: &TlsConfig) -> Result<(), TlsError> {
    if cfg.enabled() {
        Material::read(cfg)?.server_config()?;
    } else if cfg.client_ca_file.is_some() {
        return Err(bad(
            "tls.client_ca_file",
            "needs tls.cert_file and tls.key_file (mutual TLS is TLS)",
        ));
    }
    Ok(())
}

/// The client listener's TLS: the current server config, swapped when the files change.
pub struct ServerTls {
    cfg: TlsConfig,
    current: RwLock<(Material, Arc<ServerConfig>)>,
    /// Client certificates are required.
    pub mutual: bool,
}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerTls")
            .field("mutual", &self.mutual)
            .finish_non_exhaustive()
    }
}

impl ServerTls {
    /// Loads the listener's TLS, or `None` when it is off.
    ///
    /// # Errors
    /// [`TlsError`] naming the key whose file is missing or unusable.
    pub fn load(cfg: &TlsConfig) -> Result<Option<Arc<ServerTls>>, TlsError> {
        if !cfg.enabled() {
            return Ok(None);
        }
        let m = Material::read(cfg)?;
        let sc = Arc::new(m.server_config()?);
        Ok(Some(Arc::new(ServerTls {
            mutual: m.ca.is_some(),
            cfg: cfg.clone(),
            current: RwLock::new((m, sc)),
        })))
    }

    /// An acceptor with the current certificate (one per connection).
    pub fn acceptor(&self) -> tokio_rustls::TlsAcceptor {
        let cur = self.current.read().unwrap_or_else(|e| e.into_inner());
        tokio_rustls::TlsAcceptor::from(cur.1.clone())
    }

    /// Re-reads the files; swaps the config when they changed and still make a valid one.
    /// Returns whether it swapped.
    pub fn reload(&self) -> bool {
        let m = match Material::read(&self.cfg) {
            Ok(m) => m,
            Err(e) => {
                tracing::error!(error = %e, "TLS files unreadable; keeping the current certificate");
                return false;
            }
        };
        if self.current.read().unwrap_or_else(|e| e.into_inner()).0 == m {
            return false;
        }
        match m.server_config() {
            Ok(sc) => {
                *self.current.write().unwrap_or_else(|e| e.into_inner()) = (m, Arc::new(sc));
                tracing::info!("TLS certificate reloaded; new connections use it");
                true
            }
            Err(e) => {
                tracing::error!(error = %e, "changed TLS files are not usable; keeping the current certificate");
                false
            }
        }
    }

    /// Checks the files every `tls.reload_secs` until `stop` turns true.
    pub async fn watch(self: Arc<Self>, mut stop: watch::Receiver<bool>) {
        let secs = self.cfg.reload_secs.unwrap_or(DEFAULT_RELOAD_SECS);
        if secs == 0 {
            return;
        }
        let mut tick = tokio::time::interval(Duration::from_secs(secs));
        tick.tick().await;
        loop {
            tokio::select! {
                _ = tick.tick() => { self.reload(); }
                _ = stop.wait_for(|s| *s) => return,
            }
        }
    }
}

/// A TLS client config that trusts nothing (for a plain-HTTP upstream: no `https://` origin is
/// allowed, so it is never used to verify anything).
pub fn no_roots_client() -> ClientConfig {
    ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .expect("ring supports the default versions")
        .with_root_certificates(RootCertStore::empty())
        .with_no_client_auth()
}

/// The TLS client config for `https://` upstreams: the roots in `ca_file` alone, or the system's.
///
/// # Errors
/// [`TlsError`] naming `upstream.ca_file` when it is unusable, or when no system roots exist.
pub fn upstream_client(ca_file: Option<&Path>) -> Result<ClientConfig, TlsError> {
    let store = match ca_file {
        Some(p) => roots("upstream.ca_file", &read("upstream.ca_file", p)?)?,
        None => {
            let found = rustls_native_certs::load_native_certs();
            let mut store = RootCertStore::empty();
            let (added, _) = store.add_parsable_certificates(found.certs);
            if added == 0 {
                return Err(bad(
                    "upstream.ca_file",
                    "no system root certificates found for an https:// upstream; set upstream.ca_file",
                ));
            }
            store
        }
    };
    // No ALPN here: the connector (hyper-rustls) sets it to what the client speaks.
    Ok(ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| bad("upstream.ca_file", e.to_string()))?
        .with_root_certificates(store)
        .with_no_client_auth())
}

/// The SHA-256 of a client's leaf certificate, from an established server connection.
pub fn client_cert_digest(conn: &rustls::ServerConnection) -> Option<[u8; 32]> {
    let leaf = conn.peer_certificates()?.first()?;
    let d = ring::digest::digest(&ring::digest::SHA256, leaf.as_ref());
    d.as_ref().try_into().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ca() -> (rcgen::Certificate, rcgen::KeyPair) {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        p.distinguished_name
            .push(rcgen::DnType::CommonName, "test ca");
        (p.self_signed(&key).unwrap(), key)
    }

    fn leaf(ca: &(rcgen::Certificate, rcgen::KeyPair)) -> (String, String) {
        let key = rcgen::KeyPair::generate().unwrap();
        let p = rcgen::CertificateParams::new(vec!["127.0.0.1".into()]).unwrap();
        let cert = p.signed_by(&key, &ca.0, &ca.1).unwrap();
        (cert.pem(), key.serialize_pem())
    }

    fn files(dir: &Path, cert: &str, key: &str, ca: Option<&str>) -> TlsConfig {
        std::fs::write(dir.join("c.pem"), cert).unwrap();
        std::fs::write(dir.join("k.pem"), key).unwrap();
        if let Some(ca) = ca {
            std::fs::write(dir.join("ca.pem"), ca).unwrap();
        }
        TlsConfig {
            cert_file: Some(dir.join("c.pem")),
            key_file: Some(dir.join("k.pem")),
            client_ca_file: ca.map(|_| dir.join("ca.pem")),
            reload_secs: None,
        }
    }

    #[test]
    fn loads_checks_and_names_the_key_at_fault() {
        let dir = tempfile::tempdir().unwrap();
        let ca = ca();
        let (cert, key) = leaf(&ca);
        let cfg = files(dir.path(), &cert, &key, Some(&ca.0.pem()));
        check(&cfg).unwrap();
        let tls = ServerTls::load(&cfg).unwrap().unwrap();
        assert!(tls.mutual);
        assert!(ServerTls::load(&TlsConfig::default()).unwrap().is_none());

        let mut missing = cfg.clone();
        missing.key_file = Some(dir.path().join("nope.pem"));
        assert_eq!(check(&missing).unwrap_err().key, "tls.key_file");
        let (_, other_key) = leaf(&ca);
        let mismatched = files(dir.path(), &cert, &other_key, None);
        assert_eq!(check(&mismatched).unwrap_err().key, "tls.key_file");
        let garbage = files(dir.path(), "not pem", &key, None);
        assert_eq!(check(&garbage).unwrap_err().key, "tls.cert_file");
        let only_ca = TlsConfig {
            client_ca_file: Some(dir.path().join("ca.pem")),
            ..Default::default()
        };
        assert_eq!(check(&only_ca).unwrap_err().key, "tls.client_ca_file");
        let half = TlsConfig {
            cert_file: Some(dir.path().join("c.pem")),
            ..Default::default()
        };
        assert_eq!(check(&half).unwrap_err().key, "tls.key_file");
    }

    #[test]
    fn reload_swaps_only_for_a_changed_valid_pair() {
        let dir = tempfile::tempdir().unwrap();
        let ca = ca();
        let (cert, key) = leaf(&ca);
        let cfg = files(dir.path(), &cert, &key, None);
        let tls = ServerTls::load(&cfg).unwrap().unwrap();
        assert!(!tls.reload(), "unchanged files: nothing to do");
        // A half-written rotation (new cert, old key) is not taken.
        let (cert2, key2) = leaf(&ca);
        std::fs::write(dir.path().join("c.pem"), &cert2).unwrap();
        assert!(!tls.reload());
        std::fs::write(dir.path().join("k.pem"), &key2).unwrap();
        assert!(tls.reload());
        assert!(!tls.reload());
    }

    #[test]
    fn upstream_roots_from_a_ca_file() {
        let dir = tempfile::tempdir().unwrap();
        let ca = ca();
        std::fs::write(dir.path().join("ca.pem"), ca.0.pem()).unwrap();
        upstream_client(Some(&dir.path().join("ca.pem"))).unwrap();
        std::fs::write(dir.path().join("bad.pem"), "x").unwrap();
        assert_eq!(
            upstream_client(Some(&dir.path().join("bad.pem")))
                .unwrap_err()
                .key,
            "upstream.ca_file"
        );
    }
}
