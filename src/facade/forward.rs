//! [2] Writes reach the owner (design.md §13, `log.backend = "redis"`): the upstream session of a
//! session lives in one replica's upstream, so a request that needs it — a POST, a DELETE, a
//! plain GET of the standalone stream, a legacy message POST — for a session live on another
//! replica is forwarded to that replica's internal listener (`cluster.listen`), and its answer
//! (a JSON body or an SSE stream) relayed back. Resumes never need this: any replica serves them
//! from the shared log.
//!
//! A forward carries the caller as the forwarding replica saw it (its keyed identity, its
//! verified part, its address) and an HMAC-SHA-256 (`cluster.secret_file`, shared by the
//! replicas) over the method, the path and query, those three, a digest of the body, the time
//! and a nonce. The owner refuses one whose MAC does not verify, whose time is more than 30 s
//! off, or whose nonce it has seen (a replayed forward would be a second tool call), answering
//! it 404 like an unknown session and counting it (`mcp_resume_forwards_total{outcome}`). A
//! forward is never retried: a timeout is answered 504 and the client decides (a retry is a
//! second tool call). A forwarded request is never forwarded again.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Either, Full, Limited};
use hyper::body::Incoming;
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;

use super::http::{error_response, Caller, Resp, MAX_BODY};
use crate::error::{Error, StoreError};
use crate::identity::Identity;
use crate::metrics::Metrics;

/// The forward's proof: `<unix secs> <nonce> <mac>`.
const PROOF: &str = "x-mcp-resume-forward";
const IDENTITY: &str = "x-mcp-resume-identity";
const VERIFIED: &str = "x-mcp-resume-verified";
const PEER: &str = "x-mcp-resume-peer";
/// How far a forward's time may be from the owner's clock.
const SKEW_SECS: u64 = 30;
/// The client request's headers the owner needs (the gate — `Origin`, `Host` — and the
/// caller's identity were checked by the forwarding replica).
const PASSED: [&str; 7] = [
    "content-type",
    "accept",
    "mcp-session-id",
    "mcp-protocol-version",
    "last-event-id",
    "mcp-method",
    "mcp-name",
];
/// And every `Mcp-Param-*` header (2026-07-28: the owner checks them against the body).
const PASSED_PREFIX: &str = "mcp-param-";
/// Bytes of a relayed non-stream answer at most.
const MAX_ANSWER: usize = MAX_BODY + 64 * 1024;

/// Marks a request that arrived forwarded: it is served here or refused, never forwarded again.
#[derive(Clone, Copy, Debug)]
pub struct Forwarded;

/// Did `req` arrive forwarded (it is then never forwarded again)?
pub fn arrived_forwarded<B>(req: &Request<B>) -> bool {
    req.extensions().get::<Forwarded>().is_some()
}

/// Signs, sends and checks forwards.
pub struct Forwarder {
    key: ring::hmac::Key,
    client: Client<HttpConnector, Full<Bytes>>,
    timeout: Duration,
    /// Nonces seen, with their time: forwards are accepted once.
    seen: Mutex<HashMap<String, u64>>,
    metrics: Metrics,
}

impl std::fmt::Debug for Forwarder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Forwarder").finish_non_exhaustive()
    }
}

fn hexid(i: &Option<Identity>) -> String {
    i.map(|i| i.to_hex()).unwrap_or_default()
}

impl Forwarder {
    /// A forwarder keyed with the replicas' shared secret; `timeout` bounds the wait for the
    /// owner's answer (its head: a stream then flows as long as it lasts).
    pub fn new(secret: &[u8], timeout: Duration, metrics: Metrics) -> Self {
        let mut http = HttpConnector::new();
        http.set_nodelay(true);
        http.set_connect_timeout(Some(timeout));
        Self {
            key: ring::hmac::Key::new(ring::hmac::HMAC_SHA256, secret),
            client: Client::builder(TokioExecutor::new()).build(http),
            timeout,
            seen: Mutex::new(HashMap::new()),
            metrics,
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn message(
        method: &Method,
        pq: &str,
        identity: &str,
        verified: &str,
        peer: &str,
        body: &[u8],
        time: u64,
        nonce: &str,
    ) -> String {
        let digest = ring::digest::digest(&ring::digest::SHA256, body);
        format!(
            "mcp-resume-forward v1\n{method}\n{pq}\n{identity}\n{verified}\n{peer}\n{}\n{time}\n{nonce}",
            hex::encode(digest)
        )
    }

    /// Forwards a request to the owner at `addr` (`host:port` of its internal listener) and
    /// relays its answer.
    pub async fn send(
        &self,
        addr: &str,
        method: Method,
        pq: &str,
        headers: &HeaderMap,
        body: Bytes,
        caller: &Caller,
    ) -> Resp {
        let time = crate::log::unix_now();
        let mut n = [0u8; 16];
        getrandom::getrandom(&mut n).expect("OS random source");
        let nonce = hex::encode(n);
        let (identity, verified) = (hexid(&caller.identity), hexid(&caller.verified));
        let peer = caller.peer.map(|p| p.to_string()).unwrap_or_default();
        let msg = Self::message(
            &method, pq, &identity, &verified, &peer, &body, time, &nonce,
        );
        let mac = hex::encode(ring::hmac::sign(&self.key, msg.as_bytes()));
        let mut req = Request::builder()
            .method(method)
            .uri(format!("http://{addr}{pq}"));
        for (name, v) in headers {
            let n = name.as_str();
            if PASSED.contains(&n) || n.starts_with(PASSED_PREFIX) {
                req = req.header(name, v);
            }
        }
        let req = req
            .header(IDENTITY, identity)
            .header(VERIFIED, verified)
            .header(PEER, peer)
            .header(PROOF, format!("{time} {nonce} {mac}"))
            .body(Full::new(body));
        let req = match req {
            Ok(r) => r,
            Err(e) => {
                self.metrics.forward("error");
                tracing::error!(error = %e, "cannot build a forward");
                return error_response(&Error::Store(StoreError::Shared("forward".into())), None);
            }
        };
        match tokio::time::timeout(self.timeout, self.client.request(req)).await {
            Ok(Ok(resp)) => {
                self.metrics.forward("ok");
                relay(resp, &self.metrics).await
            }
            Ok(Err(e)) => {
                self.metrics.forward("error");
                tracing::warn!(error = %e, "the replica that owns the session cannot be reached");
                error_response(
                    &Error::Store(StoreError::Shared(
                        "the replica that owns the session cannot be reached".into(),
                    )),
                    None,
                )
            }
            Err(_) => {
                // Never retried: the owner may have taken it (a retry would be a second call).
                self.metrics.forward("timeout");
                error_response(
                    &Error::UpstreamTimeout(
                        "the replica that owns the session did not answer in time".into(),
                    ),
                    None,
                )
            }
        }
    }

    /// The caller a forward speaks for, if its proof holds (MAC, time, a nonce not seen).
    pub fn verify(&self, parts: &http::request::Parts, body: &[u8]) -> Option<Caller> {
        let h = &parts.headers;
        let get = |n: &str| h.get(n).and_then(|v| v.to_str().ok()).unwrap_or("");
        let mut proof = get(PROOF).splitn(3, ' ');
        let time: u64 = proof.next()?.parse().ok()?;
        let nonce = proof.next()?.to_string();
        let mac = hex::decode(proof.next()?).ok()?;
        let now = crate::log::unix_now();
        if now.abs_diff(time) > SKEW_SECS || nonce.len() != 32 {
            return None;
        }
        let pq = parts.uri.path_and_query().map_or("/", |p| p.as_str());
        let (identity, verified, peer) = (get(IDENTITY), get(VERIFIED), get(PEER));
        let msg = Self::message(
            &parts.method,
            pq,
            identity,
            verified,
            peer,
            body,
            time,
            &nonce,
        );
        ring::hmac::verify(&self.key, msg.as_bytes(), &mac).ok()?;
        {
            let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
            seen.retain(|_, t| now.abs_diff(*t) <= 2 * SKEW_SECS);
            if seen.insert(nonce, time).is_some() {
                return None;
            }
        }
        let id = |s: &str| (!s.is_empty()).then(|| Identity::from_hex(s)).flatten();
        Some(Caller {
            identity: id(identity),
            verified: id(verified),
            peer: (!peer.is_empty())
                .then(|| peer.parse::<IpAddr>().ok())
                .flatten(),
        })
    }

    /// Counts a forward this replica refused.
    pub fn refused(&self) {
        self.metrics.forward("refused");
    }
}

/// The owner's answer, relayed: its status and the headers a client needs, its body whole (a
/// JSON answer) or streamed (an SSE stream, frame by frame, as long as it lasts).
async fn relay(resp: Response<Incoming>, metrics: &Metrics) -> Resp {
    let (parts, body) = resp.into_parts();
    let sse = parts
        .headers
        .get(http::header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
    let mut out = if sse {
        let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(16);
        tokio::spawn(async move {
            let mut body = body;
            while let Some(frame) = body.frame().await {
                let Ok(frame) = frame else { break };
                if let Ok(data) = frame.into_data() {
                    if tx.send(data).await.is_err() {
                        break;
                    }
                }
            }
        });
        Response::new(Either::Right(crate::stream::SseBody::relay(
            rx,
            metrics.client_streams(crate::domain::Facade::Streamable),
        )))
    } else {
        let bytes = match Limited::new(body, MAX_ANSWER).collect().await {
            Ok(b) => b.to_bytes(),
            Err(_) => Bytes::new(),
        };
        Response::new(Either::Left(Full::new(bytes)))
    };
    *out.status_mut() = parts.status;
    for name in [
        http::header::CONTENT_TYPE.as_str(),
        "cache-control",
        "mcp-session-id",
        "x-accel-buffering",
    ] {
        if let Some(v) = parts.headers.get(name) {
            out.headers_mut()
                .insert(http::HeaderName::from_static(name), HeaderValue::clone(v));
        }
    }
    out
}

/// Reads a forwarded request's body (bounded) and checks its proof: the request, marked
/// [`Forwarded`], with its body read, and the caller it speaks for; `Err` is the answer.
pub async fn accept(
    fw: &Forwarder,
    req: Request<Incoming>,
) -> Result<(Request<super::http::LegacyBody>, Caller), Resp> {
    let (mut parts, body) = req.into_parts();
    let Ok(body) = Limited::new(body, MAX_BODY).collect().await else {
        fw.refused();
        return Err(error_response(&Error::UnknownSession, None));
    };
    let body = body.to_bytes();
    let Some(caller) = fw.verify(&parts, &body) else {
        fw.refused();
        tracing::warn!(
            path = parts.uri.path(),
            "a forward whose proof does not hold was refused"
        );
        return Err(error_response(&Error::UnknownSession, None));
    };
    parts.extensions.insert(Forwarded);
    Ok((
        Request::from_parts(parts, Either::Right(Full::new(body))),
        caller,
    ))
}

/// The plain 404 of the internal listener for anything but a forward.
pub fn not_found() -> Resp {
    super::http::plain(StatusCode::NOT_FOUND, "text/plain", "Not Found")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fw(secret: u8) -> Forwarder {
        Forwarder::new(&[secret; 32], Duration::from_secs(1), Metrics::new())
    }

    /// A forward's parts as the owner receives them.
    fn signed(f: &Forwarder, body: &[u8], time: u64, nonce: &str) -> http::request::Parts {
        let caller_id = "ab".repeat(32);
        let msg = Forwarder::message(
            &Method::POST,
            "/mcp",
            &caller_id,
            "",
            "10.0.0.7",
            body,
            time,
            nonce,
        );
        let mac = hex::encode(ring::hmac::sign(&f.key, msg.as_bytes()));
        let (parts, ()) = Request::builder()
            .method(Method::POST)
            .uri("/mcp")
            .header(IDENTITY, caller_id)
            .header(VERIFIED, "")
            .header(PEER, "10.0.0.7")
            .header(PROOF, format!("{time} {nonce} {mac}"))
            .body(())
            .unwrap()
            .into_parts();
        parts
    }

    #[test]
    fn a_forward_is_accepted_once_and_only_as_signed() {
        let f = fw(1);
        let now = crate::log::unix_now();
        let nonce = "0f".repeat(16);
        let p = signed(&f, b"{}", now, &nonce);
        let c = f.verify(&p, b"{}").expect("a signed forward");
        assert_eq!(c.identity.unwrap().to_hex(), "ab".repeat(32));
        assert!(c.verified.is_none());
        assert_eq!(c.peer, Some("10.0.0.7".parse().unwrap()));
        // Replayed: refused.
        assert!(f.verify(&p, b"{}").is_none());
        // Another body, another key, a stale or future time: refused.
        let p = signed(&f, b"{}", now, &"1f".repeat(16));
        assert!(f.verify(&p, b"{\"x\":1}").is_none());
        let p = signed(&fw(2), b"{}", now, &"2f".repeat(16));
        assert!(f.verify(&p, b"{}").is_none());
        for t in [now - SKEW_SECS - 5, now + SKEW_SECS + 5] {
            let p = signed(&f, b"{}", t, &"3f".repeat(16));
            assert!(f.verify(&p, b"{}").is_none());
        }
        // A header changed after signing (another identity): refused.
        let mut p = signed(&f, b"{}", now, &"4f".repeat(16));
        p.headers
            .insert(IDENTITY, HeaderValue::from_str(&"cd".repeat(32)).unwrap());
        assert!(f.verify(&p, b"{}").is_none());
        // No proof at all.
        let (p, ()) = Request::builder()
            .uri("/mcp")
            .body(())
            .unwrap()
            .into_parts();
        assert!(f.verify(&p, b"").is_none());
    }
}
