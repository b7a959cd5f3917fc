//! Verified identities (design.md §11b): with `[auth] mode = "jwt"` the proxy is an OAuth 2.1
//! resource server. A request's identity is the (issuer, subject) of a bearer JWT whose signature
//! checks against a key of the JWKS file, whose `iss` and `aud` are the configured ones and whose
//! `exp`/`nbf` hold (with `auth.leeway_secs`). Only asymmetric algorithms are accepted (RS256,
//! ES256, EdDSA by default): never `none`, never an HMAC (a public key used as an HMAC secret is
//! the classic forgery), and a key's own `alg`, when it names one, must be the token's.
//!
//! The cryptography is `jsonwebtoken`'s (on `ring`); this module only chooses keys and rules. The
//! JWKS file is read again when its modification time or length changes (checked at most once a
//! second, on the request path: a `stat`); a file that no longer parses keeps the keys that did,
//! loudly.

use std::collections::HashSet;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use base64::Engine;
use jsonwebtoken::jwk::{AlgorithmParameters, Jwk, KeyAlgorithm, KeyOperations, PublicKeyUse};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde::Deserialize;

/// How often the JWKS file's metadata is looked at.
const RELOAD_CHECK: Duration = Duration::from_secs(1);
/// A JWKS file larger than this is refused (it holds public keys, a few KiB).
const MAX_JWKS_BYTES: u64 = 1 << 20;
/// A bearer token longer than this is invalid without further work.
const MAX_TOKEN_BYTES: usize = 16 << 10;

/// The algorithms a JWT may use: asymmetric only.
pub const ALLOWED: &[&str] = &[
    "RS256", "RS384", "RS512", "PS256", "ES256", "ES384", "EdDSA",
];

/// What `[auth]` says about tokens (`auth.mode = "jwt"`).
#[derive(Debug, Clone)]
pub struct JwtRules {
    /// `auth.jwks_file`.
    pub jwks_file: PathBuf,
    /// `auth.issuer`: the one accepted `iss`.
    pub issuer: String,
    /// `auth.audience`: accepted `aud` values (one of them must be in the token).
    pub audience: Vec<String>,
    /// `auth.leeway_secs`, for `exp` and `nbf`.
    pub leeway_secs: u64,
    /// `auth.algorithms`.
    pub algorithms: Vec<Algorithm>,
}

/// Why a token was not accepted (logged at debug; the client only learns `invalid_token`).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TokenError {
    /// No `Authorization: Bearer …` header.
    #[error("no bearer token")]
    Missing,
    /// The token is not one we accept (why, for the log).
    #[error("invalid token: {0}")]
    Invalid(String),
}

/// A verified principal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    /// `iss`.
    pub issuer: String,
    /// `sub`.
    pub subject: String,
}

#[derive(Deserialize)]
struct Claims {
    iss: String,
    sub: String,
    /// Checked here too: `jsonwebtoken` skips an `nbf` it cannot read as a number.
    nbf: Option<serde_json::Value>,
}

#[derive(Deserialize)]
struct RawSet {
    keys: Vec<serde_json::Value>,
}

struct Keys {
    /// Keys with their `kid` (if any) and the algorithm the JWK pins (if any); shared, so that
    /// signatures are checked outside the lock.
    keys: Arc<KeyList>,
    /// The file's (mtime, len) when read.
    stamp: Option<(SystemTime, u64)>,
    checked: Instant,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Family {
    Rsa,
    Ec,
    Ed,
}

fn family(alg: Algorithm) -> Option<Family> {
    match alg {
        Algorithm::RS256
        | Algorithm::RS384
        | Algorithm::RS512
        | Algorithm::PS256
        | Algorithm::PS384
        | Algorithm::PS512 => Some(Family::Rsa),
        Algorithm::ES256 | Algorithm::ES384 => Some(Family::Ec),
        Algorithm::EdDSA => Some(Family::Ed),
        Algorithm::HS256 | Algorithm::HS384 | Algorithm::HS512 => None,
    }
}

/// Parses an `auth.algorithms` entry: one of [`ALLOWED`].
pub fn parse_algorithm(name: &str) -> Option<Algorithm> {
    if !ALLOWED.contains(&name) {
        return None;
    }
    name.parse().ok()
}

/// Reads and checks a JWKS file: at least one usable public key. `Err` says why, for the
/// configuration error or the log line.
pub fn load_jwks(path: &Path) -> Result<usize, String> {
    let keys = read_keys(path)?;
    if keys.is_empty() {
        return Err(format!(
            "{}: no usable public key (RSA, EC P-256/P-384 or Ed25519 for signatures)",
            path.display()
        ));
    }
    Ok(keys.len())
}

fn stamp(path: &Path) -> Option<(SystemTime, u64)> {
    let m = std::fs::metadata(path).ok()?;
    Some((m.modified().ok()?, m.len()))
}

type KeyList = Vec<(Option<String>, Option<Algorithm>, Family, DecodingKey)>;

/// The usable keys of a JWKS file. `Err` only when the file cannot be read or is not a JWKS (a
/// JWKS with no usable key is `Ok` and empty: every token is then refused — a revocation).
fn read_keys(path: &Path) -> Result<KeyList, String> {
    let file = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut bytes = Vec::new();
    file.take(MAX_JWKS_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    if bytes.len() as u64 > MAX_JWKS_BYTES {
        return Err(format!(
            "{}: more than {MAX_JWKS_BYTES} bytes, more than a JWKS of public keys needs",
            path.display()
        ));
    }
    let set: RawSet = serde_json::from_slice(&bytes)
        .map_err(|e| format!("{}: not a JWKS: {e}", path.display()))?;
    let mut keys = Vec::new();
    for (i, raw) in set.keys.into_iter().enumerate() {
        // One key this verifier has no model for (another curve, an encryption algorithm)
        // is skipped like any other unusable key, not a reason to ignore the whole file.
        let r = serde_json::from_value::<Jwk>(raw)
            .map_err(|e| format!("not a key we read: {e}"))
            .and_then(|jwk| usable(&jwk));
        match r {
            Ok(k) => keys.push(k),
            Err(why) => tracing::warn!(file = %path.display(), "JWKS key {i}: {why}; skipped"),
        }
    }
    Ok(keys)
}

fn usable(jwk: &Jwk) -> Result<(Option<String>, Option<Algorithm>, Family, DecodingKey), String> {
    if jwk
        .common
        .public_key_use
        .as_ref()
        .is_some_and(|u| *u != PublicKeyUse::Signature)
    {
        return Err("not a signature key (use)".into());
    }
    if jwk
        .common
        .key_operations
        .as_ref()
        .is_some_and(|ops| !ops.contains(&KeyOperations::Verify))
    {
        return Err("not a verification key (key_ops)".into());
    }
    let fam = match &jwk.algorithm {
        AlgorithmParameters::RSA(_) => Family::Rsa,
        AlgorithmParameters::EllipticCurve(_) => Family::Ec,
        AlgorithmParameters::OctetKeyPair(_) => Family::Ed,
        // A shared secret is not a public key: a JWKS that publishes one is a mistake, and
        // accepting it would let whoever reads the file mint tokens.
        AlgorithmParameters::OctetKey(_) => return Err("a symmetric (oct) key".into()),
    };
    let alg = match jwk.common.key_algorithm {
        None => None,
        Some(ka) => {
            let a = key_alg(ka).ok_or_else(|| format!("its alg {ka:?} is not allowed"))?;
            if family(a) != Some(fam) {
                return Err(format!("its alg {ka:?} does not fit its key type"));
            }
            Some(a)
        }
    };
    let key = DecodingKey::from_jwk(jwk).map_err(|e| format!("unreadable: {e}"))?;
    Ok((jwk.common.key_id.clone(), alg, fam, key))
}

fn key_alg(ka: KeyAlgorithm) -> Option<Algorithm> {
    Some(match ka {
        KeyAlgorithm::RS256 => Algorithm::RS256,
        KeyAlgorithm::RS384 => Algorithm::RS384,
        KeyAlgorithm::RS512 => Algorithm::RS512,
        KeyAlgorithm::PS256 => Algorithm::PS256,
        KeyAlgorithm::PS384 => Algorithm::PS384,
        KeyAlgorithm::PS512 => Algorithm::PS512,
        KeyAlgorithm::ES256 => Algorithm::ES256,
        KeyAlgorithm::ES384 => Algorithm::ES384,
        KeyAlgorithm::EdDSA => Algorithm::EdDSA,
        _ => return None,
    })
}

/// Checks bearer tokens against the rules and the JWKS file's current keys.
pub struct Verifier {
    rules: JwtRules,
    keys: Mutex<Keys>,
}

impl std::fmt::Debug for Verifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Verifier")
            .field("jwks_file", &self.rules.jwks_file)
            .field("issuer", &self.rules.issuer)
            .finish_non_exhaustive()
    }
}

impl Verifier {
    /// A verifier with the keys the file holds now (none, loudly, if it cannot be read: every
    /// token is then refused until it can).
    pub fn new(rules: JwtRules) -> Self {
        let stamp_now = stamp(&rules.jwks_file);
        let keys = match read_keys(&rules.jwks_file) {
            Ok(k) => {
                if k.is_empty() {
                    tracing::error!(file = %rules.jwks_file.display(), "auth.jwks_file holds no usable key; every bearer token is refused until it has some");
                }
                k
            }
            Err(e) => {
                tracing::error!(error = %e, "auth.jwks_file: no keys; every bearer token is refused until it has some");
                Vec::new()
            }
        };
        Verifier {
            rules,
            keys: Mutex::new(Keys {
                keys: Arc::new(keys),
                stamp: stamp_now,
                checked: Instant::now(),
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Keys> {
        self.keys.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Reads the JWKS file again if it changed (at most one look a second).
    fn refresh(&self) {
        let mut k = self.lock();
        if k.checked.elapsed() < RELOAD_CHECK {
            return;
        }
        k.checked = Instant::now();
        let now = stamp(&self.rules.jwks_file);
        if now == k.stamp {
            return;
        }
        k.stamp = now;
        match read_keys(&self.rules.jwks_file) {
            Ok(keys) => {
                if keys.is_empty() {
                    tracing::error!(file = %self.rules.jwks_file.display(), "JWKS reloaded with no usable key: every bearer token is refused");
                } else {
                    tracing::info!(keys = keys.len(), file = %self.rules.jwks_file.display(), "JWKS reloaded");
                }
                k.keys = Arc::new(keys);
            }
            Err(e) => {
                tracing::error!(error = %e, "auth.jwks_file changed but cannot be used; keeping the keys read before");
            }
        }
    }

    /// Forces the next request to look at the JWKS file (tests).
    #[doc(hidden)]
    pub fn expire_check(&self) {
        self.lock().checked = Instant::now() - RELOAD_CHECK;
    }

    /// The principal of an `Authorization` header value, if its bearer token is valid.
    ///
    /// # Errors
    /// [`TokenError::Missing`] without a bearer token; [`TokenError::Invalid`] with the reason.
    pub fn verify(&self, authorization: Option<&[u8]>) -> Result<Principal, TokenError> {
        let token = bearer(authorization)?;
        if token.len() > MAX_TOKEN_BYTES {
            return Err(TokenError::Invalid("longer than 16 KiB".into()));
        }
        let header = jsonwebtoken::decode_header(token)
            .map_err(|e| TokenError::Invalid(format!("header: {e}")))?;
        no_extensions(token)?;
        if !self.rules.algorithms.contains(&header.alg) {
            return Err(TokenError::Invalid(format!(
                "algorithm {:?} not allowed",
                header.alg
            )));
        }
        let fam = family(header.alg)
            .ok_or_else(|| TokenError::Invalid("a symmetric algorithm".into()))?;
        self.refresh();
        let mut validation = Validation::new(header.alg);
        validation.leeway = self.rules.leeway_secs;
        validation.validate_exp = true;
        validation.validate_nbf = true;
        validation.set_required_spec_claims(&["exp", "iss", "aud", "sub"]);
        validation.iss = Some(HashSet::from([self.rules.issuer.clone()]));
        validation.aud = Some(self.rules.audience.iter().cloned().collect());
        let keys = self.lock().keys.clone();
        let candidates = keys.iter().filter(|(kid, alg, f, _)| {
            *f == fam
                && alg.is_none_or(|a| a == header.alg)
                && match (&header.kid, kid) {
                    (Some(want), Some(have)) => want == have,
                    // A token without `kid` may use any key of its type; one with a `kid`
                    // only the key of that id.
                    (Some(_), None) => false,
                    (None, _) => true,
                }
        });
        let mut last = TokenError::Invalid(match &header.kid {
            Some(k) => format!(
                "no key with kid {:?} for {:?}",
                crate::echo::clip(k),
                header.alg
            ),
            None => format!("no key for {:?}", header.alg),
        });
        for (_, _, _, key) in candidates {
            match jsonwebtoken::decode::<Claims>(token, key, &validation) {
                Ok(data) => {
                    if data.claims.sub.is_empty() {
                        return Err(TokenError::Invalid("empty sub".into()));
                    }
                    if let Some(nbf) = &data.claims.nbf {
                        let Some(nbf) = nbf.as_u64() else {
                            return Err(TokenError::Invalid("nbf is not a NumericDate".into()));
                        };
                        let now = jsonwebtoken::get_current_timestamp();
                        if nbf > now.saturating_add(self.rules.leeway_secs) {
                            return Err(TokenError::Invalid("not valid yet (nbf)".into()));
                        }
                    }
                    return Ok(Principal {
                        issuer: data.claims.iss,
                        subject: data.claims.sub,
                    });
                }
                Err(e) => {
                    use jsonwebtoken::errors::ErrorKind as K;
                    let claims = matches!(
                        e.kind(),
                        K::ExpiredSignature
                            | K::ImmatureSignature
                            | K::InvalidIssuer
                            | K::InvalidAudience
                            | K::InvalidSubject
                            | K::MissingRequiredClaim(_)
                            | K::Json(_)
                    );
                    last = TokenError::Invalid(e.to_string());
                    if claims {
                        // The signature held (claims are checked after it): another key
                        // would not change the verdict.
                        break;
                    }
                }
            }
        }
        Err(last)
    }
}

/// Refuses a token whose header asks for an extension (RFC 7515 §4.1.11: `crit` names ones the
/// verifier must understand; this one understands none, and `b64` changes what is signed).
fn no_extensions(token: &str) -> Result<(), TokenError> {
    let head = token.split('.').next().unwrap_or("");
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(head)
        .map_err(|_| TokenError::Invalid("header is not base64url".into()))?;
    let h: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(&bytes)
        .map_err(|_| TokenError::Invalid("header is not a JSON object".into()))?;
    if h.contains_key("crit") || h.contains_key("b64") {
        return Err(TokenError::Invalid(
            "header asks for an extension (crit, b64)".into(),
        ));
    }
    Ok(())
}

/// The token of `Authorization: Bearer <token>` (scheme case-insensitive, RFC 6750).
fn bearer(v: Option<&[u8]>) -> Result<&str, TokenError> {
    let v = v.ok_or(TokenError::Missing)?;
    let v = std::str::from_utf8(v).map_err(|_| TokenError::Invalid("not ASCII".into()))?;
    let v = v.trim();
    let (scheme, rest) = v.split_once(' ').ok_or(TokenError::Missing)?;
    if !scheme.eq_ignore_ascii_case("bearer") {
        return Err(TokenError::Missing);
    }
    let t = rest.trim();
    if t.is_empty() {
        return Err(TokenError::Missing);
    }
    Ok(t)
}

#[cfg(test)]
mod tests;
