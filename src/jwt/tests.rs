//! The verifier against tokens signed here with fresh keys (`ring` generates Ed25519 and P-256
//! keys; RSA keys it cannot generate, so RS256 is covered by `jsonwebtoken`'s own tests only).

use super::*;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use base64::Engine;
use jsonwebtoken::{EncodingKey, Header};
use ring::rand::SystemRandom;
use ring::signature::{self, KeyPair};

struct Signer {
    alg: Algorithm,
    key: EncodingKey,
    jwk: serde_json::Value,
}

fn ed25519(kid: Option<&str>) -> Signer {
    let rng = SystemRandom::new();
    let pkcs8 = signature::Ed25519KeyPair::generate_pkcs8(&rng).unwrap();
    let pair = signature::Ed25519KeyPair::from_pkcs8(pkcs8.as_ref()).unwrap();
    let mut jwk = serde_json::json!({
        "kty": "OKP", "crv": "Ed25519", "x": B64.encode(pair.public_key().as_ref()),
    });
    if let Some(k) = kid {
        jwk["kid"] = k.into();
    }
    Signer {
        alg: Algorithm::EdDSA,
        key: EncodingKey::from_ed_der(pkcs8.as_ref()),
        jwk,
    }
}

fn p256(kid: Option<&str>) -> Signer {
    let rng = SystemRandom::new();
    let alg = &signature::ECDSA_P256_SHA256_FIXED_SIGNING;
    let pkcs8 = signature::EcdsaKeyPair::generate_pkcs8(alg, &rng).unwrap();
    let pair = signature::EcdsaKeyPair::from_pkcs8(alg, pkcs8.as_ref(), &rng).unwrap();
    let point = pair.public_key().as_ref();
    let mut jwk = serde_json::json!({
        "kty": "EC", "crv": "P-256",
        "x": B64.encode(&point[1..33]), "y": B64.encode(&point[33..65]),
    });
    if let Some(k) = kid {
        jwk["kid"] = k.into();
    }
    Signer {
        alg: Algorithm::ES256,
        key: EncodingKey::from_ec_der(pkcs8.as_ref()),
        jwk,
    }
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

fn claims() -> serde_json::Value {
    serde_json::json!({
        "iss": "https://issuer.example", "aud": "mcp-proxy", "sub": "alice",
        "exp": now() + 300, "iat": now(),
    })
}

fn sign(s: &Signer, kid: Option<&str>, claims: &serde_json::Value) -> String {
    let mut h = Header::new(s.alg);
    h.kid = kid.map(str::to_owned);
    jsonwebtoken::encode(&h, claims, &s.key).unwrap()
}

struct Fixture {
    _dir: tempdir::Dir,
    path: PathBuf,
    v: Verifier,
}

mod tempdir {
    /// A scratch directory removed on drop.
    pub struct Dir(pub std::path::PathBuf);
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
    pub fn new() -> Dir {
        let mut b = [0u8; 8];
        getrandom::getrandom(&mut b).unwrap();
        let p = std::env::temp_dir().join(format!("mcp-jwt-{}", u64::from_be_bytes(b)));
        std::fs::create_dir_all(&p).unwrap();
        Dir(p)
    }
}

fn write_jwks(path: &Path, keys: &[&serde_json::Value]) {
    let set = serde_json::json!({ "keys": keys });
    std::fs::write(path, serde_json::to_vec(&set).unwrap()).unwrap();
}

fn fixture(keys: &[&serde_json::Value]) -> Fixture {
    let dir = tempdir::new();
    let path = dir.0.join("jwks.json");
    write_jwks(&path, keys);
    let v = Verifier::new(JwtRules {
        jwks_file: path.clone(),
        issuer: "https://issuer.example".into(),
        audience: vec!["mcp-proxy".into()],
        leeway_secs: 30,
        algorithms: vec![Algorithm::RS256, Algorithm::ES256, Algorithm::EdDSA],
    });
    Fixture { _dir: dir, path, v }
}

fn auth(t: &str) -> Vec<u8> {
    format!("Bearer {t}").into_bytes()
}

fn invalid(r: Result<Principal, TokenError>) -> String {
    match r {
        Err(TokenError::Invalid(why)) => why,
        other => panic!("expected an invalid token, got {other:?}"),
    }
}

#[test]
fn a_valid_token_names_its_issuer_and_subject() {
    for s in [ed25519(Some("k1")), p256(Some("k1"))] {
        let f = fixture(&[&s.jwk]);
        let t = sign(&s, Some("k1"), &claims());
        let p = f.v.verify(Some(&auth(&t))).unwrap();
        assert_eq!(
            p,
            Principal {
                issuer: "https://issuer.example".into(),
                subject: "alice".into()
            }
        );
        // The scheme is case-insensitive.
        let lower = format!("bearer {t}");
        assert!(f.v.verify(Some(lower.as_bytes())).is_ok());
    }
}

#[test]
fn no_bearer_token_is_missing_not_invalid() {
    let s = ed25519(None);
    let f = fixture(&[&s.jwk]);
    assert_eq!(f.v.verify(None), Err(TokenError::Missing));
    assert_eq!(
        f.v.verify(Some(b"Basic YWxpY2U6eA==")),
        Err(TokenError::Missing)
    );
    assert_eq!(f.v.verify(Some(b"Bearer   ")), Err(TokenError::Missing));
}

#[test]
fn claims_are_checked() {
    let s = ed25519(None);
    let f = fixture(&[&s.jwk]);
    let cases: Vec<(&str, serde_json::Value)> = vec![
        ("expired", {
            let mut c = claims();
            c["exp"] = (now() - 120).into();
            c
        }),
        ("not yet valid", {
            let mut c = claims();
            c["nbf"] = (now() + 120).into();
            c
        }),
        ("other issuer", {
            let mut c = claims();
            c["iss"] = "https://evil.example".into();
            c
        }),
        ("other audience", {
            let mut c = claims();
            c["aud"] = "another-api".into();
            c
        }),
        ("no audience", {
            let mut c = claims();
            c.as_object_mut().unwrap().remove("aud");
            c
        }),
        ("no exp", {
            let mut c = claims();
            c.as_object_mut().unwrap().remove("exp");
            c
        }),
        ("no sub", {
            let mut c = claims();
            c.as_object_mut().unwrap().remove("sub");
            c
        }),
        ("empty sub", {
            let mut c = claims();
            c["sub"] = "".into();
            c
        }),
    ];
    for (what, c) in cases {
        let why = invalid(f.v.verify(Some(&auth(&sign(&s, None, &c)))));
        assert!(!why.is_empty(), "{what}");
    }
    // Within the leeway: accepted.
    let mut c = claims();
    c["exp"] = (now() - 10).into();
    assert!(f.v.verify(Some(&auth(&sign(&s, None, &c)))).is_ok());
    // An audience list that holds ours: accepted.
    let mut c = claims();
    c["aud"] = serde_json::json!(["other", "mcp-proxy"]);
    assert!(f.v.verify(Some(&auth(&sign(&s, None, &c)))).is_ok());
}

#[test]
fn a_token_signed_by_another_key_is_refused() {
    let ours = p256(Some("k1"));
    let theirs = p256(Some("k1"));
    let f = fixture(&[&ours.jwk]);
    invalid(f.v.verify(Some(&auth(&sign(&theirs, Some("k1"), &claims())))));
    // An unknown kid names no key.
    let why = invalid(f.v.verify(Some(&auth(&sign(&ours, Some("k2"), &claims())))));
    assert!(why.contains("no key"), "{why}");
}

/// The forgeries a resource server must never fall for: `alg: none`, and an HMAC "signed" with
/// the public key (whoever reads the JWKS could mint tokens), and a tampered payload.
#[test]
fn none_hmac_and_tampering_are_refused() {
    let s = ed25519(None);
    let f = fixture(&[&s.jwk]);
    let body = B64.encode(serde_json::to_vec(&claims()).unwrap());
    let none = format!("{}.{body}.", B64.encode(br#"{"alg":"none","typ":"JWT"}"#));
    invalid(f.v.verify(Some(&auth(&none))));
    let public = serde_json::to_vec(&s.jwk).unwrap();
    for key in [public.as_slice(), s.jwk["x"].as_str().unwrap().as_bytes()] {
        let hs = jsonwebtoken::encode(
            &Header::new(Algorithm::HS256),
            &claims(),
            &EncodingKey::from_secret(key),
        )
        .unwrap();
        let why = invalid(f.v.verify(Some(&auth(&hs))));
        assert!(why.contains("not allowed"), "{why}");
    }
    // A good token with its payload changed (sub: mallory) fails its signature.
    let t = sign(&s, None, &claims());
    let parts: Vec<&str> = t.split('.').collect();
    let mut c = claims();
    c["sub"] = "mallory".into();
    let forged = format!(
        "{}.{}.{}",
        parts[0],
        B64.encode(serde_json::to_vec(&c).unwrap()),
        parts[2]
    );
    invalid(f.v.verify(Some(&auth(&forged))));
    // An EdDSA key cannot check an ES256 token (the family must match).
    let ec = p256(None);
    invalid(f.v.verify(Some(&auth(&sign(&ec, None, &claims())))));
    // Garbage and huge tokens.
    invalid(f.v.verify(Some(b"Bearer not.a.jwt")));
    let huge = format!("Bearer {}", "a".repeat(MAX_TOKEN_BYTES + 1));
    invalid(f.v.verify(Some(huge.as_bytes())));
}

#[test]
fn symmetric_keys_and_mismatched_algs_in_the_jwks_are_not_used() {
    let oct = serde_json::json!({"kty": "oct", "k": B64.encode(b"secret"), "kid": "s"});
    let dir = tempdir::new();
    let path = dir.0.join("jwks.json");
    write_jwks(&path, &[&oct]);
    let err = load_jwks(&path).unwrap_err();
    assert!(err.contains("no usable public key"), "{err}");
    let mut ed = ed25519(None).jwk;
    ed["alg"] = "ES256".into();
    write_jwks(&path, &[&ed]);
    assert!(load_jwks(&path).is_err());
    std::fs::write(&path, b"{not json").unwrap();
    assert!(load_jwks(&path).unwrap_err().contains("not a JWKS"));
}

#[test]
fn the_jwks_file_is_read_again_when_it_changes() {
    let old = ed25519(Some("old"));
    let new = ed25519(Some("new"));
    let f = fixture(&[&old.jwk]);
    let t_new = sign(&new, Some("new"), &claims());
    invalid(f.v.verify(Some(&auth(&t_new))));
    // Rotation: the new key published, the old one withdrawn.
    write_jwks(&f.path, &[&new.jwk]);
    f.v.expire_check();
    assert!(f.v.verify(Some(&auth(&t_new))).is_ok());
    invalid(f.v.verify(Some(&auth(&sign(&old, Some("old"), &claims())))));
    // A broken file keeps the keys read before.
    std::fs::write(&f.path, b"{broken").unwrap();
    f.v.expire_check();
    assert!(f.v.verify(Some(&auth(&t_new))).is_ok());
}
