//! [2] What the three faces share, a leaf under them: the request's caller and its extensions,
//! request bodies (size, time and memory bounds), and responses (plain bodies, JSON-RPC error
//! bodies from their row of the answer table, [`Answer`], the §4 refusal, SSE). It imports no
//! face.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{header, HeaderValue, Response, StatusCode};
use http_body::Body;
use http_body_util::{BodyExt, Either, Full};
use hyper::body::Incoming;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::echo;
use crate::error::Error;
use crate::identity::Identity;
use crate::jsonrpc::{self, Answer};
use crate::log::cursor::{Cursor, Refusal, SessionId};
use crate::log::{Log, SessionLog};
use crate::metrics::Metrics;
use crate::session::Owner;
use crate::stream::SseBody;

/// Protocol versions accepted in `MCP-Protocol-Version` by the sessionful face (the TypeScript
/// SDK's supported list; listed in its `unsupported_protocol_version` answers).
pub const SUPPORTED_VERSIONS: [&str; 5] = [
    "2025-11-25",
    "2025-06-18",
    "2025-03-26",
    "2024-11-05",
    "2024-10-07",
];

/// The body of a POST handed to the sessionful face by the router: untouched, or already read
/// (to choose its era).
pub type LegacyBody = Either<Incoming, Full<Bytes>>;

/// The client's address, attached to every request by the listener.
#[derive(Clone, Copy, Debug)]
pub struct PeerAddr(pub std::net::SocketAddr);

/// The SHA-256 of the client's TLS certificate (mutual TLS), attached by the listener.
#[derive(Clone, Copy, Debug)]
pub struct ClientCert(pub [u8; 32]);

/// Who sent a request.
#[derive(Clone, Copy, Debug)]
pub struct Caller {
    /// Its keyed identity (`None`: anonymous). Sessions are bound to it.
    pub identity: Option<Identity>,
    /// The part of it nobody can make up: a verified JWT principal, or its client certificate.
    /// `None` when the identity is only header values, which any caller can vary at will.
    pub verified: Option<Identity>,
    /// Its address.
    pub peer: Option<std::net::IpAddr>,
}

impl Caller {
    /// Who holds the sessions it opens, for quotas and eviction: the verified identity, else the
    /// peer address — every made-up header value from one address is one owner, so forged
    /// identities cannot outweigh (and evict) a real caller's sessions.
    pub fn owner(&self) -> crate::session::Owner {
        crate::session::Owner::of(
            self.verified
                .or(self.identity.filter(|_| self.peer.is_none())),
            self.peer,
        )
    }
}

/// Is a browser's `Origin` header one of `allowed` (origins normalised by
/// [`crate::config::parse_origin`])? Compared after the same normalisation, so case and a spelled-out
/// default port do not matter; a value that is not an origin (`null`, a path, bad bytes) is not.
pub fn origin_allowed(allowed: &[String], origin: &http::HeaderValue) -> bool {
    origin
        .to_str()
        .ok()
        .and_then(|o| crate::config::parse_origin(o.trim()).ok())
        .is_some_and(|o| allowed.contains(&o))
}

/// Is `host` (a `Host` header or a request's authority, lowercase) one of `allowed` (lowercase
/// entries)? An entry without a port matches the host on any port.
pub fn host_allowed(allowed: &[String], host: &str) -> bool {
    let bare = match host.rsplit_once(':') {
        Some((h, p)) if p.bytes().all(|b| b.is_ascii_digit()) && !h.is_empty() => h,
        _ => host,
    };
    allowed.iter().any(|a| a == host || a == bare)
}

/// Does `Content-Type` say `application/json` (parameters allowed)?
pub fn is_json_content(h: &http::HeaderMap) -> bool {
    h.get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|m| m.trim().eq_ignore_ascii_case("application/json"))
}

/// Largest client message body accepted, in bytes.
pub const MAX_BODY: usize = 4 * 1024 * 1024;

/// A response body: a small fixed body or a client SSE stream.
pub type ProxyBody = Either<Full<Bytes>, SseBody>;
/// A response.
pub type Resp = Response<ProxyBody>;

/// Requests and streams each owner may have open at once (`listen.max_connections_per_identity`),
/// so one caller's listens, streams and calls cannot take every slot of
/// `listen.max_connections`.
#[derive(Debug)]
pub struct StreamCaps {
    per_owner: usize,
    held: Arc<std::sync::Mutex<HashMap<Owner, usize>>>,
}

/// One owner's slot in [`StreamCaps`], given back on drop (by the request, or by its response's
/// stream when it ends).
#[derive(Debug)]
pub struct StreamSlot {
    owner: Owner,
    held: Arc<std::sync::Mutex<HashMap<Owner, usize>>>,
}

impl Drop for StreamSlot {
    fn drop(&mut self) {
        let mut h = self.held.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = h.get_mut(&self.owner) {
            *n -= 1;
            if *n == 0 {
                h.remove(&self.owner);
            }
        }
    }
}

impl StreamCaps {
    /// At most `per_owner` at once per owner.
    pub fn new(per_owner: usize) -> Self {
        StreamCaps {
            per_owner,
            held: Arc::default(),
        }
    }

    /// A slot for `owner`; `None` when it holds all of its own. Callers the proxy cannot tell
    /// apart ([`Owner::Unknown`]: in-process) are not capped.
    pub fn take(&self, owner: Owner) -> Option<Option<StreamSlot>> {
        if owner == Owner::Unknown {
            return Some(None);
        }
        let mut h = self.held.lock().unwrap_or_else(|e| e.into_inner());
        let n = h.entry(owner).or_default();
        if *n >= self.per_owner {
            return None;
        }
        *n += 1;
        Some(Some(StreamSlot {
            owner,
            held: self.held.clone(),
        }))
    }
}

/// `resp` with `slot` held by its stream until the stream ends; a response that is not a stream
/// gives the slot back now.
pub fn holding(mut resp: Resp, slot: Option<StreamSlot>) -> Resp {
    if let (Either::Right(body), Some(slot)) = (resp.body_mut(), slot) {
        body.hold(Box::new(slot));
    }
    resp
}

/// A plain response with a fixed body.
pub fn plain(status: StatusCode, content_type: &str, body: impl Into<Bytes>) -> Resp {
    let mut r = Response::new(Either::Left(Full::new(body.into())));
    *r.status_mut() = status;
    if let Ok(v) = HeaderValue::from_str(content_type) {
        r.headers_mut().insert(header::CONTENT_TYPE, v);
    }
    r
}

/// A JSON-RPC error response with the HTTP status and code of its row of the answer table. The
/// client's request id is echoed cut to [`echo::MAX_ECHO`] bytes ([`echo::json_id`]).
pub fn json_error(
    answer: Answer,
    id: Option<&str>,
    message: &str,
    data: serde_json::Value,
) -> Resp {
    let id = echo::json_id(id.unwrap_or("null"));
    plain(
        answer.status(),
        "application/json",
        jsonrpc::error_response(&id, answer.code(), message, data),
    )
}

/// The client-facing answer for an [`Error`], from its row of the one table ([`Error::answer`]):
/// a JSON-RPC error body with the status, code and `error.data.reason` (the §4 refusals, which
/// carry the log's positions too, are built by [`refusal`]).
pub fn error_response(e: &Error, id: Option<&str>) -> Resp {
    let a = e.answer();
    let mut data = serde_json::json!({"reason": a.reason()});
    match e {
        Error::MethodNotAllowed(allow) => {
            let mut r = plain(a.status(), "text/plain", "Method Not Allowed");
            r.headers_mut()
                .insert(header::ALLOW, HeaderValue::from_static(allow));
            return r;
        }
        Error::UnsupportedVersion(_) => {
            data["supported"] = serde_json::json!(SUPPORTED_VERSIONS);
        }
        _ => {}
    }
    json_error(a, id, &e.to_string(), data)
}

/// The §4 refusal: status, JSON-RPC error body, counter and one structured log line.
pub fn refusal(
    metrics: &Metrics,
    reason: Refusal,
    last_event_id: &str,
    session: Option<SessionId>,
    log: Option<(&Log, &SessionLog)>,
) -> Resp {
    // Echoed three times below (message, data, log line): cut once.
    let last_event_id = echo::clip(last_event_id);
    metrics.refusal(reason);
    let ranges = log.map(|(_, l)| l.ranges());
    let head_id = ranges.as_ref().map(|r| {
        let id = log.expect("with ranges").1.id;
        Cursor {
            session: id,
            epoch: r.epoch_of(r.head.max(1)),
            seq: r.head,
        }
        .to_string()
    });
    let oldest_id = ranges.as_ref().filter(|r| r.oldest <= r.head).map(|r| {
        let id = log.expect("with ranges").1.id;
        Cursor {
            session: id,
            epoch: r.epoch_of(r.oldest),
            seq: r.oldest,
        }
        .to_string()
    });
    let message = match (reason, &head_id) {
        (Refusal::MalformedCursor, _) => {
            format!("resume_gap: Last-Event-ID {last_event_id:?} is not a cursor of this proxy")
        }
        (Refusal::UnknownSession, _) => {
            format!("resume_gap: session of cursor {last_event_id} is unknown to this proxy")
        }
        (Refusal::ForeignSession, _) => {
            format!("resume_gap: cursor {last_event_id} belongs to another session")
        }
        (_, Some(h)) => {
            format!("resume_gap: cursor {last_event_id} is not contiguous with log head {h}")
        }
        (_, None) => format!("resume_gap: cursor {last_event_id} is not contiguous with the log"),
    };
    // Ids and cursors are bearer material: the warn line names the session by its keyed tag
    // (when this proxy holds it) and positions only; the ids go to debug.
    tracing::warn!(
        reason = reason.as_str(),
        session = ?log.map(|(_, l)| l.tag),
        cursor_seq = Cursor::parse(last_event_id).map(|c| c.seq),
        log_head = ?ranges.as_ref().map(|r| r.head),
        oldest_retained = ?ranges.as_ref().map(|r| r.oldest),
        "resume refused"
    );
    tracing::debug!(
        reason = reason.as_str(),
        session = ?session.map(|s| s.to_string()),
        last_event_id,
        "resume refused"
    );
    json_error(
        Answer::Resume(reason),
        None,
        &message,
        serde_json::json!({
            "reason": reason.as_str(),
            "session_id": session.map(|s| s.to_string()),
            "last_event_id": last_event_id,
            "log_head": head_id,
            "oldest_retained": oldest_id,
        }),
    )
}

/// An SSE response around `body`.
pub fn sse_response(body: SseBody, session_header: Option<&SessionId>) -> Resp {
    let mut r = Response::new(Either::Right(body));
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    h.insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("no-cache, no-transform"),
    );
    h.insert("x-accel-buffering", HeaderValue::from_static("no"));
    if let Some(id) = session_header {
        if let Ok(v) = HeaderValue::from_str(&id.to_string()) {
            h.insert("mcp-session-id", v);
        }
    }
    r
}

/// Why a request body could not be read ([`read_body`]).
#[derive(Debug, PartialEq, Eq)]
pub enum BodyError {
    /// Over the limit (declared by `Content-Length` or found while reading): 413.
    TooLarge,
    /// Not complete within `listen.body_timeout_secs`: 408, and the connection closes.
    Timeout,
    /// The client went away mid-body (or sent a broken chunked body): nobody to answer.
    Aborted(String),
    /// No room in `listen.max_body_bytes_in_flight` within `listen.body_timeout_secs`: 503,
    /// and the connection closes (the body was not read).
    Busy,
}

impl BodyError {
    /// The answer: 413 for [`BodyError::TooLarge`] only; 408 with `Connection: close` for
    /// [`BodyError::Timeout`]. An aborted body is logged at debug and gets a `400` with
    /// `Connection: close` that, usually, no client is left to read.
    pub fn response(&self) -> Resp {
        match self {
            BodyError::TooLarge => plain(
                StatusCode::PAYLOAD_TOO_LARGE,
                "text/plain",
                format!("Payload Too Large: a request body may hold at most {MAX_BODY} bytes"),
            ),
            BodyError::Timeout => close(plain(
                StatusCode::REQUEST_TIMEOUT,
                "text/plain",
                "Request Timeout: the request body did not arrive within listen.body_timeout_secs",
            )),
            BodyError::Busy => {
                let mut r = close(plain(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "text/plain",
                    "Service Unavailable: too many request bodies in flight (listen.max_body_bytes_in_flight)",
                ));
                r.headers_mut()
                    .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
                r
            }
            BodyError::Aborted(why) => {
                tracing::debug!(error = %why, "request body ended early; client gone");
                close(plain(
                    StatusCode::BAD_REQUEST,
                    "text/plain",
                    "Bad Request: incomplete request body",
                ))
            }
        }
    }
}

/// `resp` with `Connection: close`: hyper closes the connection once it is written, so what is
/// left of an unread body can neither be parsed as a next request nor keep the connection.
pub fn close(mut resp: Resp) -> Resp {
    resp.headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    resp
}

/// Room for client bodies held in memory at once, in KiB (`listen.max_body_bytes_in_flight`),
/// and each owner's share of it: a quarter, or one body at the limit if that is more — so one
/// caller sending bodies slowly cannot hold the room every other caller's POST waits for.
#[derive(Debug, Clone)]
pub struct BodyBudget {
    room: Arc<Semaphore>,
    kib: usize,
    share_kib: usize,
    held: Arc<std::sync::Mutex<HashMap<Owner, usize>>>,
}

impl BodyBudget {
    /// A budget of `bytes` (at least 1 KiB).
    pub fn new(bytes: usize) -> Self {
        let kib = kib(bytes).max(1);
        Self {
            room: Arc::new(Semaphore::new(kib)),
            kib,
            share_kib: (kib / 4).max(self::kib(MAX_BODY)),
            held: Arc::default(),
        }
    }

    /// Counts `more` KiB to `owner`'s share (in `share`); `false` when that would pass it.
    fn claim(&self, owner: Owner, more: usize, share: &mut Option<Share>) -> bool {
        if owner == Owner::Unknown {
            return true;
        }
        let mut h = self.held.lock().unwrap_or_else(|e| e.into_inner());
        let n = h.entry(owner).or_default();
        if *n + more > self.share_kib {
            if *n == 0 {
                h.remove(&owner);
            }
            return false;
        }
        *n += more;
        share
            .get_or_insert_with(|| Share {
                owner,
                kib: 0,
                held: self.held.clone(),
            })
            .kib += more;
        true
    }
}

/// What one body counts to its owner's share of the budget; given back on drop.
struct Share {
    owner: Owner,
    kib: usize,
    held: Arc<std::sync::Mutex<HashMap<Owner, usize>>>,
}

impl Drop for Share {
    fn drop(&mut self) {
        let mut h = self.held.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = h.get_mut(&self.owner) {
            *n = n.saturating_sub(self.kib);
            if *n == 0 {
                h.remove(&self.owner);
            }
        }
    }
}

/// Reads a whole request body of at most `limit` bytes within `timeout`, in `budget`.
///
/// A body that declares more than `limit` (`Content-Length`) is refused before anything is read.
/// Room in the budget is taken as the bytes arrive (a head, or a body sent slowly, holds only
/// what it has sent), and the returned `Bytes` owns it: it is given back when the last slice of
/// the body is dropped. So the bodies held at once, read or being read, never exceed the budget,
/// whatever `listen.max_connections` admits. A body's first bytes wait for room; a body that
/// already holds some and finds no more is refused at once ([`BodyError::Busy`]), so that
/// half-read bodies never wait on each other. A budget smaller than `limit` still admits one
/// body at a time. What one `owner` holds at once stays within its share ([`BodyBudget`]):
/// past it, [`BodyError::Busy`] at once.
///
/// # Errors
/// [`BodyError::TooLarge`] over the limit; [`BodyError::Timeout`] when it did not arrive in time;
/// [`BodyError::Busy`] when it found no room in time; [`BodyError::Aborted`] when the body failed
/// (the connection dropped mid-body).
pub async fn read_body<B>(
    body: B,
    limit: usize,
    timeout: Duration,
    budget: &BodyBudget,
    owner: Owner,
) -> Result<Bytes, BodyError>
where
    B: Body<Data = Bytes>,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    if body.size_hint().lower() > limit as u64 {
        return Err(BodyError::TooLarge);
    }
    let read = async {
        let mut body = std::pin::pin!(body);
        let (mut parts, mut len) = (Vec::new(), 0usize);
        let mut room: Option<OwnedSemaphorePermit> = None;
        let mut share: Option<Share> = None;
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| BodyError::Aborted(e.into().to_string()))?;
            let Ok(data) = frame.into_data() else {
                continue;
            };
            len += data.len();
            if len > limit {
                return Err(BodyError::TooLarge);
            }
            let held = room.as_ref().map_or(0, |r| r.num_permits());
            let need = kib(len).min(budget.kib).saturating_sub(held);
            let more = u32::try_from(need).unwrap_or(u32::MAX);
            if need > 0 && !budget.claim(owner, need, &mut share) {
                return Err(BodyError::Busy);
            }
            match &mut room {
                _ if need == 0 => {}
                // The first bytes wait for room (holding none).
                None => {
                    let got = budget.room.clone().acquire_many_owned(more).await;
                    room = Some(got.map_err(|_| BodyError::Busy)?);
                }
                // A body that holds room never waits for more: partial bodies waiting on each
                // other would all wait out the timeout. No room now: 503, and its room is freed.
                Some(r) => match budget.room.clone().try_acquire_many_owned(more) {
                    Ok(got) => r.merge(got),
                    Err(_) => return Err(BodyError::Busy),
                },
            }
            parts.push(data);
        }
        let bytes = match parts.len() {
            0 => Bytes::new(),
            1 => parts.pop().expect("one"),
            _ => Bytes::from(parts.concat()),
        };
        Ok((bytes, room, share))
    };
    match tokio::time::timeout(timeout, read).await {
        // Out of time while the budget is full: no room, rather than a slow client.
        Err(_) if budget.room.available_permits() == 0 => Err(BodyError::Busy),
        Err(_) => Err(BodyError::Timeout),
        Ok(Err(e)) => Err(e),
        Ok(Ok((bytes, None, _))) => Ok(bytes),
        Ok(Ok((bytes, Some(room), share))) => Ok(Bytes::from_owner(Held {
            bytes,
            _room: room,
            _share: share,
        })),
    }
}

/// `n` bytes in KiB, rounded up.
fn kib(n: usize) -> usize {
    n.div_ceil(1024)
}

/// A client body and its room in the body budget.
struct Held {
    bytes: Bytes,
    _room: OwnedSemaphorePermit,
    _share: Option<Share>,
}

impl AsRef<[u8]> for Held {
    fn as_ref(&self) -> &[u8] {
        &self.bytes
    }
}

/// The value of a query parameter.
pub fn query_param<'a>(query: Option<&'a str>, name: &str) -> Option<&'a str> {
    query?
        .split('&')
        .filter_map(|kv| kv.split_once('=').or(Some((kv, ""))))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::VecDeque;
    use std::pin::Pin;
    use std::task::{Context, Poll};

    use http_body::{Frame, SizeHint};

    use crate::session::Owner;
    use http::HeaderMap;

    #[test]
    fn quotas_count_verified_identities_and_otherwise_the_peer() {
        let keys = crate::identity::Keyring::for_tests();
        let cert = keys.certificate(&[7; 32]);
        let mut headers = HeaderMap::new();
        headers.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Bearer made-up"),
        );
        let cfg = crate::identity::AuthConfig::default();
        let forged = keys.identity(&cfg, &headers, None);
        let ip = std::net::IpAddr::from([127, 0, 0, 9]);
        let peer = Some(ip);
        let c = |identity, verified, peer| Caller {
            identity,
            verified,
            peer,
        };
        // Header values count under the address they came from; a certificate (or a JWT
        // principal) counts as itself wherever it comes from.
        assert_eq!(c(forged, None, peer).owner(), Owner::Peer(ip));
        assert_eq!(c(None, None, peer).owner(), Owner::Peer(ip));
        assert_eq!(c(forged, Some(cert), peer).owner(), Owner::Identity(cert));
        // In-process callers have no address: the identity is all there is.
        assert_eq!(
            c(forged, None, None).owner(),
            Owner::Identity(forged.unwrap())
        );
        assert_eq!(c(None, None, None).owner(), Owner::Unknown);
        // The identity of a certificate alone is the identity of a caller with only it.
        assert_eq!(
            keys.identity(&cfg, &HeaderMap::new(), Some(&[7; 32])),
            Some(cert)
        );
    }

    /// A request body played from a script: chunks, then an error, the end, or nothing ever again.
    struct Scripted {
        chunks: VecDeque<Bytes>,
        then: Then,
        declared: Option<u64>,
    }

    enum Then {
        End,
        Fail,
        Stall,
    }

    impl Body for Scripted {
        type Data = Bytes;
        type Error = std::io::Error;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
            if let Some(c) = self.chunks.pop_front() {
                return Poll::Ready(Some(Ok(Frame::data(c))));
            }
            match self.then {
                Then::End => Poll::Ready(None),
                Then::Fail => Poll::Ready(Some(Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "connection closed before message completed",
                )))),
                Then::Stall => Poll::Pending,
            }
        }

        fn size_hint(&self) -> SizeHint {
            self.declared.map(SizeHint::with_exact).unwrap_or_default()
        }
    }

    fn body(chunks: &[&'static [u8]], then: Then, declared: Option<u64>) -> Scripted {
        Scripted {
            chunks: chunks.iter().map(|c| Bytes::from_static(c)).collect(),
            then,
            declared,
        }
    }

    const T: Duration = Duration::from_secs(30);

    fn room() -> BodyBudget {
        BodyBudget::new(1 << 20)
    }

    #[tokio::test(start_paused = true)]
    async fn bodies_hold_their_room_until_dropped() {
        let budget = BodyBudget::new(2048);
        static BIG: [u8; 1500] = [0; 1500];
        let a = read_body(
            body(&[&BIG], Then::End, None),
            4096,
            T,
            &budget,
            Owner::Unknown,
        )
        .await
        .unwrap();
        assert_eq!(budget.room.available_permits(), 0, "1500 bytes hold 2 KiB");
        // No room: a second body waits, then is refused (503), though it arrived whole.
        let b = read_body(
            body(&[b"x"], Then::End, None),
            4096,
            T,
            &budget,
            Owner::Unknown,
        )
        .await;
        assert_eq!(b.unwrap_err(), BodyError::Busy);
        let r = BodyError::Busy.response();
        assert_eq!(r.status(), 503);
        assert_eq!(r.headers()[header::CONNECTION], "close");
        // A slice keeps the room; dropping the last one gives it back.
        let slice = a.slice(0..10);
        drop(a);
        assert_eq!(budget.room.available_permits(), 0);
        drop(slice);
        assert_eq!(budget.room.available_permits(), 2);
        // A body larger than the whole budget is still read, alone.
        let c = read_body(
            body(&[&BIG, &BIG], Then::End, None),
            4096,
            T,
            &budget,
            Owner::Unknown,
        )
        .await;
        assert_eq!(c.unwrap().len(), 3000);
    }

    /// One owner holds at most its share (a quarter, at least one body at the limit): its next
    /// body is refused at once, while another owner's is read, and the share comes back with the
    /// bodies.
    #[tokio::test(start_paused = true)]
    async fn one_owner_holds_at_most_its_share_of_the_budget() {
        let budget = BodyBudget::new(64 * MAX_BODY);
        assert_eq!(budget.share_kib, 16 * kib(MAX_BODY));
        let big = Box::leak(vec![b'x'; MAX_BODY].into_boxed_slice());
        let a = Owner::Peer("127.0.0.3".parse().unwrap());
        let b = Owner::Peer("127.0.0.2".parse().unwrap());
        let mut held = Vec::new();
        for _ in 0..16 {
            let got = read_body(body(&[big], Then::End, None), MAX_BODY, T, &budget, a).await;
            held.push(got.unwrap());
        }
        let more = read_body(body(&[b"x"], Then::End, None), MAX_BODY, T, &budget, a).await;
        assert_eq!(more.unwrap_err(), BodyError::Busy, "past its share");
        let other = read_body(body(&[big], Then::End, None), MAX_BODY, T, &budget, b).await;
        assert_eq!(other.unwrap().len(), MAX_BODY, "another owner has room");
        held.pop();
        let again = read_body(body(&[b"x"], Then::End, None), MAX_BODY, T, &budget, a).await;
        assert_eq!(
            again.unwrap().len(),
            1,
            "a dropped body gives its share back"
        );
    }

    #[tokio::test]
    async fn whole_body_within_limit() {
        let b = read_body(
            body(&[b"{\"a\":", b"1}"], Then::End, None),
            16,
            T,
            &room(),
            Owner::Unknown,
        )
        .await;
        assert_eq!(b.unwrap(), Bytes::from_static(b"{\"a\":1}"));
    }

    #[tokio::test]
    async fn only_an_over_limit_body_is_too_large() {
        // Found while reading.
        let b = read_body(
            body(&[b"0123456789", b"0123456789"], Then::End, None),
            16,
            T,
            &room(),
            Owner::Unknown,
        )
        .await;
        assert_eq!(b.unwrap_err(), BodyError::TooLarge);
        // Declared up front: refused before reading (the body would stall).
        let b = read_body(
            body(&[], Then::Stall, Some(17)),
            16,
            T,
            &room(),
            Owner::Unknown,
        )
        .await;
        assert_eq!(b.unwrap_err(), BodyError::TooLarge);
        assert_eq!(BodyError::TooLarge.response().status(), 413);
        // A client gone mid-body is not "too large".
        let b = read_body(
            body(&[b"0123"], Then::Fail, Some(10)),
            16,
            T,
            &room(),
            Owner::Unknown,
        )
        .await;
        let e = b.unwrap_err();
        assert!(matches!(e, BodyError::Aborted(_)), "{e:?}");
        assert_ne!(e.response().status(), 413);
    }

    #[tokio::test]
    async fn a_slow_body_times_out_and_closes() {
        let slow = body(&[b"01"], Then::Stall, Some(10));
        let b = read_body(
            slow,
            16,
            Duration::from_millis(200),
            &room(),
            Owner::Unknown,
        )
        .await;
        assert_eq!(b.unwrap_err(), BodyError::Timeout);
        let r = BodyError::Timeout.response();
        assert_eq!(r.status(), 408);
        assert_eq!(r.headers()[header::CONNECTION], "close");
    }

    #[test]
    fn long_ids_are_cut_in_error_bodies() {
        let id = serde_json::Value::String("i".repeat(300 * 1024)).to_string();
        let r = json_error(
            Answer::InvalidRequest,
            Some(&id),
            "x",
            serde_json::json!({}),
        );
        let Either::Left(full) = r.into_body() else {
            panic!("a fixed body")
        };
        let size = full.size_hint().exact().unwrap();
        assert!(size < 1024, "{size} bytes");
    }
}
