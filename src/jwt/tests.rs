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

// --- Adversarial review (branch jwt-adversary): each test below states what the verifier
// must do; the ones that fail today are findings. ---

/// An Ed25519 signer that can sign any header bytes (jsonwebtoken's `Header` cannot carry
/// `crit` or other extension parameters).
fn raw_ed25519() -> (signature::Ed25519KeyPair, serde_json::Value) {
    let rng = SystemRandom::new();
    let pkcs8 = signature::Ed25519KeyPair::generate_pkcs8(&rng).unwrap();
    let pair = signature::Ed25519KeyPair::from_pkcs8(pkcs8.as_ref()).unwrap();
    let jwk = serde_json::json!({
        "kty": "OKP", "crv": "Ed25519", "x": B64.encode(pair.public_key().as_ref()),
    });
    (pair, jwk)
}

fn raw_sign(
    pair: &signature::Ed25519KeyPair,
    header: &serde_json::Value,
    claims: &serde_json::Value,
) -> String {
    let input = format!(
        "{}.{}",
        B64.encode(serde_json::to_vec(header).unwrap()),
        B64.encode(serde_json::to_vec(claims).unwrap())
    );
    let sig = pair.sign(input.as_bytes());
    format!("{input}.{}", B64.encode(sig.as_ref()))
}

/// Finding: withdrawing every key (an emergency revocation: the JWKS rewritten as an empty
/// set) keeps the withdrawn keys in force. `{"keys":[]}` is a well-formed JWKS, not a broken
/// file, yet `refresh` treats "no usable key" like a parse error and keeps the old keys, so a
/// token signed with the compromised key is still accepted.
#[test]
fn adv_an_emptied_jwks_withdraws_the_old_keys() {
    let old = ed25519(Some("old"));
    let f = fixture(&[&old.jwk]);
    let t = sign(&old, Some("old"), &claims());
    assert!(f.v.verify(Some(&auth(&t))).is_ok());
    write_jwks(&f.path, &[]);
    f.v.expire_check();
    let r = f.v.verify(Some(&auth(&t)));
    assert!(
        r.is_err(),
        "a key withdrawn from the JWKS (now empty) still verifies tokens: {r:?}"
    );
}

/// Finding: one key the `jsonwebtoken` JWK model does not know (here an `ES512` key, or an
/// `X25519`/`secp256k1` one, common in real issuers' JWKS) makes the whole file "not a JWKS".
/// On reload that is treated as a broken file: the rotation is ignored, the withdrawn key
/// keeps verifying and the newly published key is refused. The unknown key should be
/// skipped like the other unusable ones.
#[test]
fn adv_one_unknown_key_does_not_stop_a_rotation() {
    let old = ed25519(Some("old"));
    let new = ed25519(Some("new"));
    let f = fixture(&[&old.jwk]);
    let t_old = sign(&old, Some("old"), &claims());
    let t_new = sign(&new, Some("new"), &claims());
    // Another key the issuer also publishes: P-521 / ES512 (a valid JWK, just not one we use).
    let es512 = serde_json::json!({
        "kty": "EC", "crv": "P-521", "alg": "ES512", "kid": "p521",
        "x": B64.encode([1u8; 66]), "y": B64.encode([2u8; 66]),
    });
    write_jwks(&f.path, &[&new.jwk, &es512]);
    f.v.expire_check();
    let r_old = f.v.verify(Some(&auth(&t_old)));
    let r_new = f.v.verify(Some(&auth(&t_new)));
    assert!(
        r_old.is_err() && r_new.is_ok(),
        "rotation with an extra unknown key ignored: old key {r_old:?}, new key {r_new:?}"
    );
}

/// Finding (RFC 7515 §4.1.11): a token whose header lists a critical extension the verifier
/// does not understand MUST be rejected. `jsonwebtoken`'s `Header` drops `crit` silently, so
/// such a token is accepted.
#[test]
fn adv_a_crit_header_we_do_not_understand_is_refused() {
    let (pair, jwk) = raw_ed25519();
    let f = fixture(&[&jwk]);
    let plain = raw_sign(&pair, &serde_json::json!({"alg": "EdDSA"}), &claims());
    assert!(f.v.verify(Some(&auth(&plain))).is_ok());
    let crit = raw_sign(
        &pair,
        &serde_json::json!({"alg": "EdDSA", "crit": ["urn:example:bind"], "urn:example:bind": "x"}),
        &claims(),
    );
    let r = f.v.verify(Some(&auth(&crit)));
    assert!(
        r.is_err(),
        "a token with an unknown crit extension accepted: {r:?}"
    );
    let b64 = raw_sign(
        &pair,
        &serde_json::json!({"alg": "EdDSA", "crit": ["b64"], "b64": false}),
        &claims(),
    );
    let r = f.v.verify(Some(&auth(&b64)));
    assert!(r.is_err(), "a token with crit b64=false accepted: {r:?}");
}

/// Finding: an `nbf` that is not a NumericDate (a string, a bool, a number beyond u64) is
/// silently not checked (jsonwebtoken's `TryParse::FailedToParse` skips the nbf test; only a
/// *required* claim fails closed), so a token not valid before 2100 is accepted today. A
/// malformed time claim must fail closed, as a malformed `exp` does.
#[test]
fn adv_an_nbf_that_is_not_a_number_is_refused() {
    let s = ed25519(None);
    let f = fixture(&[&s.jwk]);
    // For contrast: a string `exp` fails closed (exp is required).
    let mut c = claims();
    c["exp"] = serde_json::Value::String((now() + 300).to_string());
    invalid(f.v.verify(Some(&auth(&sign(&s, None, &c)))));
    let future = now() + 100 * 365 * 86400;
    for nbf in [
        serde_json::Value::String(future.to_string()),
        serde_json::json!(true),
        serde_json::json!(1e300),
    ] {
        let mut c = claims();
        c["nbf"] = nbf.clone();
        let r = f.v.verify(Some(&auth(&sign(&s, None, &c))));
        assert!(r.is_err(), "nbf {nbf} not checked: accepted as {r:?}");
    }
}

/// Finding (low): a JWK published for encryption (`"use": "enc"`, or `key_ops` without
/// `verify`) verifies signatures. RFC 7517 §4.2/§4.3: keys are for one purpose; an issuer's
/// encryption key must not also authenticate tokens (key separation).
#[test]
fn adv_an_encryption_key_does_not_verify_signatures() {
    let mut s = ed25519(Some("enc"));
    s.jwk["use"] = "enc".into();
    let f = fixture(&[&s.jwk]);
    let r = f.v.verify(Some(&auth(&sign(&s, Some("enc"), &claims()))));
    assert!(r.is_err(), "a use=enc key verified a token: {r:?}");
    let mut s = ed25519(Some("wrap"));
    s.jwk["key_ops"] = serde_json::json!(["encrypt", "wrapKey"]);
    let f = fixture(&[&s.jwk]);
    let r = f.v.verify(Some(&auth(&sign(&s, Some("wrap"), &claims()))));
    assert!(
        r.is_err(),
        "a key_ops=[encrypt] key verified a token: {r:?}"
    );
}

/// What held (kept as regression tests): type tricks on iss/aud/sub/exp, duplicate claims,
/// alg/kid games, embedded-key headers.
#[test]
fn adv_type_tricks_and_header_games_are_refused() {
    let (pair, jwk) = raw_ed25519();
    let mut jwk_k = jwk.clone();
    jwk_k["kid"] = "k".into();
    let f = fixture(&[&jwk_k]);
    let h = serde_json::json!({"alg": "EdDSA"});
    let ok = |c: &serde_json::Value| f.v.verify(Some(&auth(&raw_sign(&pair, &h, c))));
    assert!(ok(&claims()).is_ok());
    let mut bad = Vec::new();
    for (k, v) in [
        (
            "iss",
            serde_json::json!(["https://issuer.example", "https://evil"]),
        ),
        ("iss", serde_json::json!(null)),
        ("aud", serde_json::json!(null)),
        ("aud", serde_json::json!([])),
        ("aud", serde_json::json!({"0": "mcp-proxy"})),
        ("aud", serde_json::json!(["mcp-proxy", 1])),
        ("sub", serde_json::json!(null)),
        ("sub", serde_json::json!(7)),
        ("sub", serde_json::json!(["alice"])),
        ("exp", serde_json::json!(null)),
        ("exp", serde_json::json!(-1)),
        ("exp", serde_json::json!(1e300)),
        ("exp", serde_json::json!("9999999999")),
    ] {
        let mut c = claims();
        c[k] = v.clone();
        if ok(&c).is_ok() {
            bad.push(format!("{k}={v}"));
        }
    }
    // Duplicate members: the validator and the claims must not read different values.
    let input = format!(
        "{}.{}",
        B64.encode(br#"{"alg":"EdDSA"}"#),
        B64.encode(format!(
            r#"{{"iss":"https://evil","iss":"https://issuer.example","aud":"mcp-proxy","sub":"a","sub":"b","exp":{}}}"#,
            now() + 300
        ))
    );
    let t = format!(
        "{input}.{}",
        B64.encode(pair.sign(input.as_bytes()).as_ref())
    );
    if f.v.verify(Some(&auth(&t))).is_ok() {
        bad.push("duplicate members".into());
    }
    // Header games: an embedded jwk/jku/x5u naming the attacker's key, a kid that is not ours,
    // an alg the key does not take, a header with alg twice.
    let (evil, evil_jwk) = raw_ed25519();
    for h in [
        serde_json::json!({"alg": "EdDSA", "jwk": evil_jwk}),
        serde_json::json!({"alg": "EdDSA", "jku": "http://127.0.0.1:1/jwks"}),
        serde_json::json!({"alg": "EdDSA", "x5u": "http://127.0.0.1:1/x"}),
        serde_json::json!({"alg": "EdDSA", "kid": "k", "jwk": evil_jwk}),
    ] {
        if f.v
            .verify(Some(&auth(&raw_sign(&evil, &h, &claims()))))
            .is_ok()
        {
            bad.push(format!("header {h}"));
        }
    }
    let dup_alg = {
        let input = format!(
            "{}.{}",
            B64.encode(br#"{"alg":"HS256","alg":"EdDSA"}"#),
            B64.encode(serde_json::to_vec(&claims()).unwrap())
        );
        format!(
            "{input}.{}",
            B64.encode(pair.sign(input.as_bytes()).as_ref())
        )
    };
    if f.v.verify(Some(&auth(&dup_alg))).is_ok() {
        bad.push("alg twice".into());
    }
    assert!(bad.is_empty(), "accepted: {bad:?}");
}

// RS256 fixtures made once with Python's `cryptography` (ring cannot generate RSA keys): a
// 1024-bit and a 2048-bit key, each with a token (sub alice, exp 2100-01-01) signed by it.
const RSA1024_JWK: &str = r#"{"kty": "RSA", "n": "v7lZB3WYFpkXLkJ7XoXl0HSXaIhNbHyZAdteX5SKg_GtwbTih_dYlJV3LbPMnXzReu8VmhGgDQnkWtOYtqvoHkxnZnvUm0yA3Aqh_lkDcGAZaZ43oR6XOWZCmv84FsplhqcDYsnW5zqaUF0UuTL3TIY4Q9ssAcNRmnVy0QeC_98", "e": "AQAB", "kid": "rsa1024"}"#;
const RSA1024_TOKEN: &str = "eyJhbGciOiAiUlMyNTYiLCAia2lkIjogInJzYTEwMjQifQ.eyJpc3MiOiAiaHR0cHM6Ly9pc3N1ZXIuZXhhbXBsZSIsICJhdWQiOiAibWNwLXByb3h5IiwgInN1YiI6ICJhbGljZSIsICJleHAiOiA0MTAyNDQ0ODAwfQ.HxCrwNop-WwFOritwTK8A9QPfEWF1EHoNM_LmzgIBvZ4KF53splH_19-nlyDV6vn60KrQaLf6SIORSSMPnHwzIU84ZRkqpegEgfpzdtixUIlUBOIzkdY5NvAvtT-rcTAf5ycRvyz32MiOBlKEHfTb78WnPL0vO8znW-5WFGvigI";
const RSA2048_JWK: &str = r#"{"kty": "RSA", "n": "1_N3w6-S9a0hAbjL2yvSkIFMNC4idCMPoNL5eljKgUxZEcZP9ALKmpwR6LAOnPlgti42i_D1jVqEigsXhREMh7Gk6dKwIJ5LbrH0f6-3ClmJLF3p2J9szh3iBBDJIg9ya-l9RfuqHZRNZoVwBVrkrkqEKjk-_3HHyxBDWxTdYBH2s9KlZbawyPpGYb_rvZ83SumcLKJOFSHRsAuLO96t90Gab9rNWISAKtEiYzZWYTub-wwreb9W7vzcg9gsud8lWc5O2QKGBlp2kNE-FS3wbbGl5_kZfYQtUQ_zKpMk99mH_Eo3bsxN1y3Lk5tbuTLQxKD_fNHEIX5w6ypps66VTw", "e": "AQAB", "kid": "rsa2048"}"#;
const RSA2048_TOKEN: &str = "eyJhbGciOiAiUlMyNTYiLCAia2lkIjogInJzYTIwNDgifQ.eyJpc3MiOiAiaHR0cHM6Ly9pc3N1ZXIuZXhhbXBsZSIsICJhdWQiOiAibWNwLXByb3h5IiwgInN1YiI6ICJhbGljZSIsICJleHAiOiA0MTAyNDQ0ODAwfQ.nxrmpWVTPbumrjoT63BQbxl7CvgthzSrt9lq3hzXIdj9RbVXsls49UAVuvH3g2FEs4rrZjnCdDA2RD4MUoPE6VChBH1HrscM21klBuBjUXSs9t5q2hCWQK8dBg1v3NoJ0ZONH4NfMvJck-NeW4rA2KphMZu9tI84u64zeFPjfQvvGYfjKdrsY-UPUVdKZc7A9jwtPhgknON9GrtSiJTIRWK8ehlt4NaBfrgeK4AiFPNPNUvxjebILY6RFph_47EMjCrpaM0pm3F4BLWH1jjkBwp8I-y8IX9haEgLAtw5M8sJeGFbDGJ8K__ofmsb1N0PZ4Zn2QOgPsNY8GOSH9wZzw";

/// What held: RS256 works with a 2048-bit key, and a 1024-bit RSA key (too small to trust)
/// verifies nothing even when its signature is right (ring's floor is 2048 bits).
#[test]
fn adv_rsa_keys_below_2048_bits_verify_nothing() {
    let k2048: serde_json::Value = serde_json::from_str(RSA2048_JWK).unwrap();
    let k1024: serde_json::Value = serde_json::from_str(RSA1024_JWK).unwrap();
    let f = fixture(&[&k2048, &k1024]);
    assert!(f.v.verify(Some(&auth(RSA2048_TOKEN))).is_ok());
    invalid(f.v.verify(Some(&auth(RSA1024_TOKEN))));
    // The RSA key is no HMAC secret either: HS256 over its `n` is refused.
    let hs = jsonwebtoken::encode(
        &Header::new(Algorithm::HS256),
        &claims(),
        &EncodingKey::from_secret(k2048["n"].as_str().unwrap().as_bytes()),
    )
    .unwrap();
    invalid(f.v.verify(Some(&auth(&hs))));
    // A PS256 token is refused when only RS256/ES256/EdDSA are configured.
    let mut t = RSA2048_TOKEN.splitn(2, '.');
    let (_h, rest) = (t.next().unwrap(), t.next().unwrap());
    let ps = format!(
        "{}.{rest}",
        B64.encode(br#"{"alg":"PS256","kid":"rsa2048"}"#)
    );
    invalid(f.v.verify(Some(&auth(&ps))));
}

/// What held: a token at the size limit made of nesting (in an unknown claim, in an unknown
/// header member, in the embedded `jwk`) is refused or accepted without exhausting the stack.
#[test]
fn adv_deeply_nested_tokens_do_not_overflow() {
    let (pair, jwk) = raw_ed25519();
    let f = fixture(&[&jwk]);
    let depth = 5900;
    let nest = format!("{}{}", "[".repeat(depth), "]".repeat(depth));
    let sign_raw = |h: &str, c: &str| {
        let input = format!("{}.{}", B64.encode(h), B64.encode(c));
        format!(
            "{input}.{}",
            B64.encode(pair.sign(input.as_bytes()).as_ref())
        )
    };
    let c = claims();
    let body = format!(
        r#"{{"iss":{},"aud":"mcp-proxy","sub":"alice","exp":{},"x":{nest}}}"#,
        c["iss"], c["exp"]
    );
    let t = sign_raw(r#"{"alg":"EdDSA"}"#, &body);
    assert!(t.len() <= MAX_TOKEN_BYTES, "{}", t.len());
    let _ = f.v.verify(Some(&auth(&t)));
    let t = sign_raw(
        &format!(r#"{{"alg":"EdDSA","x":{nest}}}"#),
        &serde_json::to_string(&c).unwrap(),
    );
    let _ = f.v.verify(Some(&auth(&t)));
    let t = sign_raw(
        &format!(r#"{{"alg":"EdDSA","jwk":{{"kty":"OKP","crv":"Ed25519","x":"a","k":{nest}}}}}"#),
        &serde_json::to_string(&c).unwrap(),
    );
    let _ = f.v.verify(Some(&auth(&t)));
}
