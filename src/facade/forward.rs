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

use std::collections::{HashSet, VecDeque};
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
/// The body's SHA-256 (hex): the MAC covers it, so the head is checked before the body is read.
const DIGEST: &str = "x-mcp-resume-digest";
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

/// Is header `name` passed on to the owner (and covered by the MAC)?
fn passed_on(name: &str) -> bool {
    PASSED.contains(&name) || name.starts_with(PASSED_PREFIX)
}
/// Bytes of a relayed non-stream answer at most.
const MAX_ANSWER: usize = MAX_BODY + 64 * 1024;

/// Marks a request that arrived forwarded: it is served here or refused, never forwarded again.
#[derive(Clone, Copy, Debug)]
pub struct Forwarded;

/// Did `req` arrive forwarded (it is then never forwarded again)?
pub fn arrived_forwarded<B>(req: &Request<B>) -> bool {
    req.extensions().get::<Forwarded>().is_some()
}

/// Nonces seen, and in the order seen with their time (the oldest are forgotten first).
type Nonces = (HashSet<String>, VecDeque<(u64, String)>);

/// Signs, sends and checks forwards.
pub struct Forwarder {
    key: ring::hmac::Key,
    client: Client<HttpConnector, Full<Bytes>>,
    timeout: Duration,
    /// Nonces seen (and in the order seen, with their time): forwards are accepted once.
    seen: Mutex<Nonces>,
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
            seen: Mutex::new((HashSet::new(), VecDeque::new())),
            metrics,
        }
    }

    /// What the MAC covers: the method, the path and query, every header passed on (names and
    /// the bytes of their values, in order), the caller's three fields, the body's digest, the
    /// time and the nonce — the whole request as the owner will act on it.
    #[allow(clippy::too_many_arguments)]
    fn message(
        method: &Method,
        pq: &str,
        headers: &HeaderMap,
        identity: &str,
        verified: &str,
        peer: &str,
        digest: &str,
        time: u64,
        nonce: &str,
    ) -> String {
        let mut passed: Vec<(&str, String)> = headers
            .iter()
            .filter(|(n, _)| passed_on(n.as_str()))
            .map(|(n, v)| (n.as_str(), hex::encode(v.as_bytes())))
            .collect();
        passed.sort();
        let mut m = format!("mcp-resume-forward v2\n{method}\n{pq}\n");
        for (n, v) in passed {
            m.push_str(&format!("{n}:{v}\n"));
        }
        m.push_str(&format!(
            "{identity}\n{verified}\n{peer}\n{digest}\n{time}\n{nonce}"
        ));
        m
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
        let digest = hex::encode(ring::digest::digest(&ring::digest::SHA256, &body));
        let mut passed = HeaderMap::new();
        for (name, v) in headers {
            if passed_on(name.as_str()) {
                passed.append(name.clone(), v.clone());
            }
        }
        let msg = Self::message(
            &method, pq, &passed, &identity, &verified, &peer, &digest, time, &nonce,
        );
        let mac = hex::encode(ring::hmac::sign(&self.key, msg.as_bytes()));
        let mut req = Request::builder()
            .method(method)
            .uri(format!("http://{addr}{pq}"));
        if let Some(h) = req.headers_mut() {
            h.extend(passed);
        }
        let req = req
            .header(IDENTITY, identity)
            .header(VERIFIED, verified)
            .header(PEER, peer)
            .header(DIGEST, digest)
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

    /// Checks a forward's head, before a byte of its body is read: the MAC over everything but
    /// the body (whose digest it covers), the time, a nonce not seen (each is accepted once).
    /// The caller it speaks for and the body's digest, if it holds.
    pub fn verify_head(&self, parts: &http::request::Parts) -> Option<(Caller, String)> {
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
        let (identity, verified, peer, digest) =
            (get(IDENTITY), get(VERIFIED), get(PEER), get(DIGEST));
        if digest.len() != 64 {
            return None;
        }
        let msg = Self::message(
            &parts.method,
            pq,
            h,
            identity,
            verified,
            peer,
            digest,
            time,
            &nonce,
        );
        ring::hmac::verify(&self.key, msg.as_bytes(), &mac).ok()?;
        {
            let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
            // Oldest first: what is past the window goes, the rest is not looked at.
            while seen
                .1
                .front()
                .is_some_and(|(t, _)| now.saturating_sub(*t) > 2 * SKEW_SECS)
            {
                if let Some((_, n)) = seen.1.pop_front() {
                    seen.0.remove(&n);
                }
            }
            if !seen.0.insert(nonce.clone()) {
                return None;
            }
            seen.1.push_back((now, nonce));
        }
        let id = |s: &str| (!s.is_empty()).then(|| Identity::from_hex(s)).flatten();
        Some((
            Caller {
                identity: id(identity),
                verified: id(verified),
                peer: (!peer.is_empty())
                    .then(|| peer.parse::<IpAddr>().ok())
                    .flatten(),
            },
            digest.to_string(),
        ))
    }

    /// Counts a forward this replica refused.
    pub fn refused(&self) {
        self.metrics.forward("refused");
    }
}

/// Frames of a relayed SSE stream held between the owner's connection and the client's, and the
/// bytes they hold at most (one frame always fits).
const RELAY_FRAMES: usize = 16;
const RELAY_BYTES: usize = 256 << 10;

/// The owner's answer, relayed: its status and the headers a client needs, its body whole (a
/// JSON answer) or streamed (an SSE stream, frame by frame, as long as it lasts).
async fn relay(resp: Response<Incoming>, metrics: &Metrics) -> Resp {
    let (parts, body) = resp.into_parts();
    let sse = parts
        .headers
        .get(http::header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
    let mut out = if sse {
        // Bounded in bytes as a local stream's frames are (a frame of one large event counts for
        // its size, not for one of 16).
        let (tx, rx) = crate::queue::bounded::<Bytes>(RELAY_FRAMES, RELAY_BYTES);
        tokio::spawn(async move {
            let mut body = body;
            while let Some(frame) = body.frame().await {
                let Ok(frame) = frame else { break };
                if let Ok(data) = frame.into_data() {
                    let len = data.len();
                    if tx.send(data, len).await.is_err() {
                        break;
                    }
                }
            }
        });
        Response::new(Either::Right(crate::stream::SseBody::from_queue(
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

/// Checks a forwarded request's proof, then reads its body (bounded in size and time, as a
/// client's) and checks it against the digest the proof covers: the request, marked
/// [`Forwarded`], with its body read, and the caller it speaks for; `Err` is the answer. A
/// request whose head does not hold is refused before a byte of its body is read.
pub async fn accept(
    fw: &Forwarder,
    req: Request<Incoming>,
    body_timeout: Duration,
) -> Result<(Request<super::http::LegacyBody>, Caller), Box<Resp>> {
    let (mut parts, body) = req.into_parts();
    let refuse = |why: &str, path: &str| {
        fw.refused();
        tracing::warn!(path, why, "a forward was refused");
        Err(Box::new(error_response(&Error::UnknownSession, None)))
    };
    let Some((caller, digest)) = fw.verify_head(&parts) else {
        return refuse("its proof does not hold", parts.uri.path());
    };
    let read = tokio::time::timeout(body_timeout, Limited::new(body, MAX_BODY).collect()).await;
    let Ok(Ok(body)) = read else {
        return refuse("its body did not arrive whole in time", parts.uri.path());
    };
    let body = body.to_bytes();
    if hex::encode(ring::digest::digest(&ring::digest::SHA256, &body)) != digest {
        return refuse("its body is not the one signed", parts.uri.path());
    }
    parts.extensions.insert(Forwarded);
    Ok((
        Request::from_parts(parts, Either::Right(Full::new(body))),
        caller,
    ))
}

/// Does `req` carry a forward's proof? Such a request — arrived forwarded, or a forward that
/// landed on the public listener (an advertised address that is not the internal listener) — is
/// never forwarded again.
pub fn carries_proof<B>(req: &Request<B>) -> bool {
    arrived_forwarded(req) || req.headers().contains_key(PROOF)
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

    /// A forward's head as the owner receives it (session `s1`, body `body`).
    fn signed(f: &Forwarder, body: &[u8], time: u64, nonce: &str) -> http::request::Parts {
        let caller_id = "ab".repeat(32);
        let digest = hex::encode(ring::digest::digest(&ring::digest::SHA256, body));
        let (mut parts, ()) = Request::builder()
            .method(Method::POST)
            .uri("/mcp")
            .header("mcp-session-id", "s1")
            .header("content-type", "application/json")
            .body(())
            .unwrap()
            .into_parts();
        let msg = Forwarder::message(
            &Method::POST,
            "/mcp",
            &parts.headers,
            &caller_id,
            "",
            "10.0.0.7",
            &digest,
            time,
            nonce,
        );
        let mac = hex::encode(ring::hmac::sign(&f.key, msg.as_bytes()));
        let h = &mut parts.headers;
        for (n, v) in [
            (IDENTITY, caller_id),
            (VERIFIED, String::new()),
            (PEER, "10.0.0.7".into()),
            (DIGEST, digest),
            (PROOF, format!("{time} {nonce} {mac}")),
        ] {
            h.insert(n, HeaderValue::from_str(&v).unwrap());
        }
        parts
    }

    #[test]
    fn a_forward_is_accepted_once_and_only_as_signed() {
        let f = fw(1);
        let now = crate::log::unix_now();
        let p = signed(&f, b"{}", now, &"0f".repeat(16));
        let (c, digest) = f.verify_head(&p).expect("a signed forward");
        assert_eq!(c.identity.unwrap().to_hex(), "ab".repeat(32));
        assert!(c.verified.is_none());
        assert_eq!(c.peer, Some("10.0.0.7".parse().unwrap()));
        assert_eq!(
            digest,
            hex::encode(ring::digest::digest(&ring::digest::SHA256, b"{}"))
        );
        // Replayed: refused.
        assert!(f.verify_head(&p).is_none());
        // Another key, a stale or future time: refused.
        let p = signed(&fw(2), b"{}", now, &"2f".repeat(16));
        assert!(f.verify_head(&p).is_none());
        for t in [now - SKEW_SECS - 5, now + SKEW_SECS + 5] {
            let p = signed(&f, b"{}", t, &"3f".repeat(16));
            assert!(f.verify_head(&p).is_none());
        }
        // Anything signed changed on the way: another identity, another session, another
        // body digest, a header added that is passed on.
        let changes: [(&str, &str); 4] = [
            (IDENTITY, "cd"),
            ("mcp-session-id", "s2"),
            (DIGEST, "00"),
            ("last-event-id", "s1:1:1"),
        ];
        for (i, (name, value)) in changes.into_iter().enumerate() {
            let mut p = signed(&f, b"{}", now, &format!("{i:032}"));
            let v = if name == IDENTITY || name == DIGEST {
                value.repeat(32)
            } else {
                value.to_string()
            };
            p.headers.insert(name, HeaderValue::from_str(&v).unwrap());
            assert!(f.verify_head(&p).is_none(), "{name} changed");
        }
        // No proof at all.
        let (p, ()) = Request::builder()
            .uri("/mcp")
            .body(())
            .unwrap()
            .into_parts();
        assert!(f.verify_head(&p).is_none());
    }
}
