//! Multi Round-Trip Requests: the 2026-07-28 form of the upstream's sampling, elicitation and
//! roots requests.
//!
//! When the upstream asks the client something while a `tools/call`, `prompts/get` or
//! `resources/read` holds its session's lease, the client's request is answered with an
//! `InputRequiredResult` (`inputRequests` keyed by the upstream's own request ids, plus a
//! `requestState`) and the upstream
//! call is **parked**, lease and all, waiting. The client's retry carries `inputResponses` and the
//! byte-exact `requestState`; the proxy checks the state, posts each response upstream as the
//! answer to the request still waiting, and the parked call continues on the retry's response.
//!
//! `requestState` = `v1.<hex payload>.<hex HMAC-SHA256>`, keyed by a secret drawn at start (states
//! do not survive a restart — neither do the parked calls they name). The MAC also covers the
//! caller's identity, so a state replayed by another identity fails; the payload binds the
//! method and a digest of the params (without `_meta`, `inputResponses`, `requestState`), so a
//! state replayed with other arguments fails; and it expires after `modern.input_ttl_secs`. A
//! state is single use: its parked call is taken out when the retry arrives.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use bytes::Bytes;
use ring::hmac;
use serde_json::value::RawValue;
use serde_json::{json, Value};
use tokio::time::Instant;

use super::pool::UpCall;
use crate::identity::Identity;

/// An upstream request waiting for the client's answer.
#[derive(Debug, Clone)]
pub struct Pending {
    /// Its key in `inputRequests`.
    pub key: String,
    /// The upstream's id of the request.
    pub upstream_id: Value,
    /// Its method.
    pub method: String,
    /// Its params, as sent to the client.
    pub params: Value,
}

/// The `inputRequests` key of the upstream's request `id`: its own id (a string as it is).
pub fn input_key(id: &Value) -> String {
    match id {
        Value::String(s) => s.clone(),
        v => v.to_string(),
    }
}

/// The client capability an upstream request needs, when the client did not declare it.
pub fn undeclared(caps: &Value, method: &str) -> Option<&'static str> {
    let cap = match method {
        "sampling/createMessage" => "sampling",
        "elicitation/create" => "elicitation",
        _ => "roots",
    };
    caps.get(cap).is_none().then_some(cap)
}

/// A call waiting for a retry.
#[derive(Debug)]
pub struct Parked {
    /// The upstream call (its lease held).
    pub call: UpCall,
    /// What it waits for.
    pub pending: Vec<Pending>,
    expires: Instant,
}

/// The parked calls and the state codec.
pub struct Mrtr {
    key: hmac::Key,
    parked: Mutex<HashMap<u64, (Parked, Binding)>>,
    next: AtomicU64,
    ttl: Duration,
}

impl std::fmt::Debug for Mrtr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mrtr").finish_non_exhaustive()
    }
}

/// What a state is bound to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Binding {
    /// The method.
    pub method: String,
    /// Hex SHA-256 of the salient params.
    pub digest: String,
}

/// A params member up to this size is digested in canonical form (parsed: whitespace and key
/// order do not matter); a larger one as sent, so no tree of a big argument is ever built.
const CANONICAL_BYTES: usize = 64 * 1024;

impl Binding {
    /// The binding of a request: its method and the digest of its params without the envelope
    /// and the MRTR fields.
    ///
    /// The digest does not depend on the order of the params' members: each member is digested on
    /// its own and the digests are added (mod 2²⁵⁶). Nothing is cloned or built but members of at
    /// most [`CANONICAL_BYTES`].
    pub fn of(method: &str, params: &RawValue) -> Self {
        let mut sum = [0u8; 32];
        let _ = crate::jsonrpc::for_each_member(params, |k, v| {
            if matches!(k, "_meta" | "inputResponses" | "requestState") {
                return;
            }
            let mut d = ring::digest::Context::new(&ring::digest::SHA256);
            d.update(k.as_bytes());
            d.update(&[0]);
            let canonical = (v.get().len() <= CANONICAL_BYTES)
                .then(|| serde_json::from_str::<Value>(v.get()).ok())
                .flatten();
            match canonical {
                Some(c) => d.update(c.to_string().as_bytes()),
                None => d.update(v.get().as_bytes()),
            }
            add(&mut sum, d.finish().as_ref());
        });
        Self {
            method: method.to_string(),
            digest: hex(&sum),
        }
    }
}

/// `sum += x` as 256-bit big-endian numbers, wrapping.
fn add(sum: &mut [u8; 32], x: &[u8]) {
    let mut carry = 0u16;
    for (s, b) in sum.iter_mut().zip(x).rev() {
        let t = u16::from(*s) + u16::from(*b) + carry;
        *s = t as u8;
        carry = t >> 8;
    }
}

/// A request's `inputResponses`: the object's bytes as sent, read member by member (never built).
#[derive(Debug, Clone)]
pub struct Responses(Bytes);

impl Responses {
    /// Over the bytes of a JSON object.
    pub fn new(raw: Bytes) -> Self {
        Self(raw)
    }

    /// The response for `key`, when it is a result object (the last one, if repeated).
    pub fn get(&self, key: &str) -> Option<&RawValue> {
        let raw: &RawValue = serde_json::from_slice(&self.0).ok()?;
        let mut hit = None;
        let _ = crate::jsonrpc::for_each_member(raw, |k, v| {
            if k == key {
                hit = Some(v);
            }
        });
        hit.filter(|v| crate::jsonrpc::is_object(v))
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

/// Why a retry's `requestState` was not accepted.
#[derive(Debug, PartialEq, Eq)]
pub enum StateError {
    /// Not a state of this proxy, altered, or of another identity.
    Invalid,
    /// Issued for another request (method or arguments differ).
    Mismatch,
    /// Past its lifetime, already used, or from before a restart.
    Expired,
}

impl StateError {
    /// The message of the in-band error.
    pub fn message(&self) -> &'static str {
        match self {
            StateError::Invalid => "Invalid params: requestState is not valid",
            StateError::Mismatch => "Invalid params: requestState was issued for another request",
            StateError::Expired => "Invalid params: requestState has expired or was already used",
        }
    }
}

fn mac_input(payload: &[u8], identity: Option<&Identity>) -> Vec<u8> {
    let mut v = payload.to_vec();
    v.push(0);
    if let Some(i) = identity {
        v.extend_from_slice(serde_json::to_string(i).unwrap_or_default().as_bytes());
    }
    v
}

impl Mrtr {
    /// A codec with a fresh secret.
    pub fn new(ttl: Duration) -> Self {
        let mut secret = [0u8; 32];
        getrandom::getrandom(&mut secret).expect("OS random source");
        Self {
            key: hmac::Key::new(hmac::HMAC_SHA256, &secret),
            parked: Mutex::new(HashMap::new()),
            next: AtomicU64::new(1),
            ttl,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, (Parked, Binding)>> {
        self.parked.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Parks `call` waiting for `pending`; returns the `requestState` naming it.
    pub fn park(
        &self,
        call: UpCall,
        pending: Vec<Pending>,
        binding: Binding,
        identity: Option<&Identity>,
    ) -> String {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let exp = crate::log::unix_now() + self.ttl.as_secs();
        let payload =
            json!({"p": n, "exp": exp, "m": binding.method, "d": binding.digest}).to_string();
        let tag = hmac::sign(&self.key, &mac_input(payload.as_bytes(), identity));
        self.lock().insert(
            n,
            (
                Parked {
                    call,
                    pending,
                    expires: Instant::now() + self.ttl,
                },
                binding,
            ),
        );
        format!("v1.{}.{}", hex(payload.as_bytes()), hex(tag.as_ref()))
    }

    /// Takes the parked call a retry's `state` names.
    ///
    /// # Errors
    /// [`StateError`] when the state is not valid for this caller and request, or its call is gone.
    pub fn take(
        &self,
        state: &str,
        identity: Option<&Identity>,
        binding: &Binding,
    ) -> Result<Parked, StateError> {
        let mut parts = state.split('.');
        let (Some("v1"), Some(p), Some(t), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(StateError::Invalid);
        };
        let (Some(payload), Some(tag)) = (unhex(p), unhex(t)) else {
            return Err(StateError::Invalid);
        };
        hmac::verify(&self.key, &mac_input(&payload, identity), &tag)
            .map_err(|_| StateError::Invalid)?;
        let v: Value = serde_json::from_slice(&payload).map_err(|_| StateError::Invalid)?;
        if v["m"].as_str() != Some(&binding.method) || v["d"].as_str() != Some(&binding.digest) {
            return Err(StateError::Mismatch);
        }
        if v["exp"].as_u64().unwrap_or(0) < crate::log::unix_now() {
            return Err(StateError::Expired);
        }
        let n = v["p"].as_u64().ok_or(StateError::Invalid)?;
        self.lock()
            .remove(&n)
            .map(|(p, _)| p)
            .ok_or(StateError::Expired)
    }

    /// Parked calls whose retry did not come in time: taken out, for the caller to answer their
    /// upstream requests and let them go (which cancels them upstream).
    pub fn expired(&self) -> Vec<Parked> {
        let now = Instant::now();
        let mut l = self.lock();
        let gone: Vec<u64> = l
            .iter()
            .filter(|(_, (p, _))| p.expires <= now || p.call.session().is_dead())
            .map(|(n, _)| *n)
            .collect();
        gone.into_iter()
            .filter_map(|n| l.remove(&n).map(|(p, _)| p))
            .collect()
    }

    /// Everything parked (shutdown).
    pub fn drain(&self) -> Vec<Parked> {
        self.lock().drain().map(|(_, (p, _))| p).collect()
    }

    /// Number of parked calls.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Nothing parked?
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The refusal sent upstream for an input request nobody will answer.
pub fn refusal(method: &str) -> Result<Value, Value> {
    if method == "elicitation/create" {
        Ok(json!({"action": "cancel"}))
    } else {
        Err(
            json!({"code": crate::jsonrpc::INTERNAL_ERROR, "message": "the client did not answer in time"}),
        )
    }
}

/// The params of an upstream input request as a 2026-07-28 client expects them: no `_meta`, no
/// 2025-only fields.
pub fn client_params(method: &str, params: &Value) -> Value {
    let mut p = params.as_object().cloned().unwrap_or_default();
    p.remove("_meta");
    p.remove("task");
    if method == "elicitation/create" {
        if p.get("mode").and_then(Value::as_str) != Some("url") {
            p.remove("elicitationId");
        }
        if !p.contains_key("mode") {
            p.insert("mode".into(), json!("form"));
        }
    }
    Value::Object(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bindings_ignore_mrtr_fields() {
        let raw = |s: &'static str| -> &'static RawValue { serde_json::from_str(s).unwrap() };
        let a = raw(r#"{"name": "x", "arguments": {"a": 1, "b": 2}, "_meta": {"k": 1}}"#);
        let b =
            raw(r#"{"arguments":{"b":2,"a":1},"name":"x","requestState":"s","inputResponses":{}}"#);
        assert_eq!(Binding::of("tools/call", a), Binding::of("tools/call", b));
        let c = raw(r#"{"name": "x", "arguments": {"a": 2, "b": 2}}"#);
        assert_ne!(Binding::of("tools/call", a), Binding::of("tools/call", c));
        // Members are not interchangeable.
        let d = raw(r#"{"name": {"a": 1, "b": 2}, "arguments": "x"}"#);
        assert_ne!(Binding::of("tools/call", a), Binding::of("tools/call", d));
        assert_ne!(Binding::of("tools/call", a), Binding::of("prompts/get", a));
    }

    #[test]
    fn responses_are_read_in_place() {
        let r = Responses::new(Bytes::from_static(
            br#"{"input-1": {"a": 1}, "input-2": 3}"#,
        ));
        assert_eq!(r.get("input-1").unwrap().get(), r#"{"a": 1}"#);
        assert!(r.get("input-2").is_none());
        assert!(r.get("input-3").is_none());
    }

    #[test]
    fn hex_round_trips() {
        assert_eq!(unhex(&hex(b"\x00\xffab")).unwrap(), b"\x00\xffab");
        assert!(unhex("abc").is_none());
        assert!(unhex("zz").is_none());
    }
}
