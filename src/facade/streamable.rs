//! The Streamable HTTP face (`[streamable] path`, default `/mcp`): spec 2025-11-25, also serving
//! 2025-06-18 and 2025-03-26 clients, in front of the same legacy upstream.
//!
//! - `POST` carries one client message (or, for 2025-03-26, a batch). `initialize` without a
//!   session opens a proxy session and its upstream link and answers with `Mcp-Session-Id`.
//!   A POST carrying requests answers `text/event-stream`: a logged priming event for clients at
//!   2025-11-25 or later, then the messages of those requests as the session's router assigns them
//!   (progress by `progressToken`, the responses by id), then the stream ends. Notifications and
//!   responses alone get 202.
//! - `GET` without `Last-Event-ID` opens the standalone stream: every other upstream message. Only
//!   one connection at a time (409); it continues where the previous connection stopped.
//! - `GET` with `Last-Event-ID` resumes the cursor's own stream, POST or standalone, per design.md
//!   §4: replay of that stream after the cursor, then live; a POST stream ends after its responses.
//!   A resume takes the stream over from a connection still attached to it.
//! - `DELETE` ends the session.
//!
//! Every stream is a cursor over the session log, so nothing reaches a client before it is
//! logged, and each message belongs to exactly one stream.

use std::collections::HashSet;
use std::sync::Arc;

use bytes::Bytes;
use http::{header, HeaderMap, Request, StatusCode};
use http_body_util::{BodyExt, Either};
use serde_json::json;
use serde_json::value::RawValue;

use super::http::{
    error_response, is_json_content, plain, refusal, sse_response, Caller, LegacyBody, Resp,
};
use super::{read_client_body, Ctx};
use crate::domain::{EndReason, Facade};
use crate::echo;
use crate::error::Error;
use crate::jsonrpc::{self, Answer, Peek};
use crate::log::cursor::{Refusal, SessionId};
use crate::log::{Kind, NewEvent, SessionLog, StreamTag};
use crate::session::Session;
use crate::stream::{self, Filter, StreamSpec};

pub use super::http::SUPPORTED_VERSIONS;
/// The version assumed when a request names none and the session knows none (spec 2025-06-18).
pub const DEFAULT_VERSION: &str = "2025-03-26";
/// The first version whose POST streams start with a priming event (SEP-1699).
pub const PRIMING_SINCE: &str = "2025-11-25";
/// The last version that allows JSON-RPC batches.
pub const LAST_BATCH_VERSION: &str = "2025-03-26";

const SESSION_HEADER: &str = "mcp-session-id";
const VERSION_HEADER: &str = "mcp-protocol-version";

fn header<'a>(h: &'a HeaderMap, name: &str) -> Option<&'a str> {
    h.get(name).map(|v| v.to_str().unwrap_or("\u{fffd}"))
}

/// Does `Accept` admit `want` (`type/subtype`)? Media ranges with wildcards count; `q=0` excludes.
pub fn accepts(h: &HeaderMap, want: &str) -> bool {
    let main = want.split('/').next().unwrap_or(want);
    h.get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|range| {
            let mut parts = range.split(';');
            let mr = parts.next().unwrap_or("").trim().to_ascii_lowercase();
            let refused = parts.any(|p| {
                let p = p.trim().to_ascii_lowercase();
                p.strip_prefix("q=")
                    .and_then(|q| q.trim().parse::<f32>().ok())
                    .is_some_and(|q| q == 0.0)
            });
            !refused && (mr == want || mr == "*/*" || mr == format!("{main}/*"))
        })
}

/// An early answer (an error status) instead of a value; boxed, it is large.
pub type Early = Box<Resp>;

/// Validates `MCP-Protocol-Version`: `Ok(None)` when absent.
pub fn version_header(h: &HeaderMap) -> Result<Option<String>, Early> {
    match header(h, VERSION_HEADER) {
        None => Ok(None),
        Some(v) if SUPPORTED_VERSIONS.contains(&v.trim()) => Ok(Some(v.trim().to_string())),
        Some(v) => Err(Box::new(error_response(
            &Error::UnsupportedVersion(echo::clip(v).to_string()),
            None,
        ))),
    }
}

/// A date-shaped version at or after `since`.
fn at_least(version: &str, since: &str) -> bool {
    let b = version.as_bytes();
    let date_shaped = b.len() == 10
        && b.iter().enumerate().all(|(i, c)| {
            if i == 4 || i == 7 {
                *c == b'-'
            } else {
                c.is_ascii_digit()
            }
        });
    date_shaped && version >= since
}

/// The version a request speaks: its header, else the one the session was initialized with,
/// else 2025-03-26 (spec 2025-06-18, "Protocol Version Header").
fn effective_version(header: Option<&str>, session: &Session) -> String {
    header
        .or(session.protocol_version.as_deref())
        .unwrap_or(DEFAULT_VERSION)
        .to_string()
}

fn missing_session() -> Resp {
    error_response(&Error::MissingSessionId, None)
}

/// 400 `Invalid Request` with its row of the answer table.
fn invalid(id: Option<&str>, answer: Answer, message: impl Into<String>) -> Resp {
    error_response(
        &Error::Invalid {
            answer,
            message: message.into(),
        },
        id,
    )
}

/// The live Streamable HTTP session named by the header, or the 400/404 answer.
fn live_session(ctx: &Ctx, caller: &Caller, h: &HeaderMap) -> Result<Arc<Session>, Early> {
    let Some(raw) = header(h, SESSION_HEADER) else {
        return Err(Box::new(missing_session()));
    };
    SessionId::parse(raw.trim())
        .and_then(|id| ctx.reg.live(&id))
        .filter(|s| {
            ctx.admits(
                caller,
                s.log.identity.as_ref(),
                s.facade,
                Facade::Streamable,
            )
        })
        .ok_or_else(|| Box::new(error_response(&Error::UnknownSession, None)))
}

// ---------------------------------------------------------------------------------------------
// POST

/// One client message: its bytes (forwarded verbatim) and its routing fields.
struct Msg {
    bytes: Bytes,
    peek: Peek,
}

/// The most members a batch may have (each becomes its own upstream POST).
pub const MAX_BATCH: usize = 256;

/// Parses a POST body: one message, or a batch. `Err` is the 400 answer.
///
/// Nothing is built but the routing fields: members are borrowed, then kept as slices of the
/// body; nesting deeper than [`jsonrpc::MAX_DEPTH`] is refused before any parse.
fn parse_body(body: &Bytes) -> Result<(Vec<Msg>, bool), Early> {
    let parse_error = || Box::new(error_response(&Error::Parse, None));
    if jsonrpc::too_deep(body, jsonrpc::MAX_DEPTH) {
        return Err(Box::new(error_response(&Error::TooDeep, None)));
    }
    let raw = serde_json::from_slice::<&RawValue>(body).map_err(|_| parse_error())?;
    let not_rpc = || {
        Box::new(invalid(
            None,
            Answer::InvalidRequest,
            "not a JSON-RPC request, notification or response",
        ))
    };
    let one = |r: &RawValue| {
        let bytes = body.slice_ref(r.get().as_bytes());
        let peek = jsonrpc::peek(&bytes).filter(|p| p.method.is_some() || p.is_response)?;
        Some(Msg { bytes, peek })
    };
    if !raw.get().starts_with('[') {
        return Ok((vec![one(raw).ok_or_else(not_rpc)?], false));
    }
    // Member by member: the first that is not a message, or one past the limit, stops the
    // collection (the rest is only scanned).
    let (mut msgs, mut members, mut bad) = (Vec::new(), 0usize, false);
    let _ = jsonrpc::for_each_item(raw, |r| {
        members += 1;
        if bad || members > MAX_BATCH {
            return;
        }
        match one(r) {
            Some(m) => msgs.push(m),
            None => bad = true,
        }
    });
    if members == 0 {
        return Err(Box::new(invalid(
            None,
            Answer::InvalidRequest,
            "empty batch",
        )));
    }
    if members > MAX_BATCH {
        return Err(Box::new(invalid(
            None,
            Answer::InvalidRequest,
            format!("a batch may hold at most {MAX_BATCH} messages"),
        )));
    }
    if bad {
        return Err(not_rpc());
    }
    Ok((msgs, true))
}

/// `POST`: the era is the router's choice ([`super::mcp::endpoint`]); this is the sessionful one.
pub async fn post(ctx: &Arc<Ctx>, caller: &Caller, req: Request<LegacyBody>) -> Resp {
    let h = req.headers();
    if !accepts(h, "application/json") || !accepts(h, "text/event-stream") {
        return error_response(
            &Error::NotAcceptable("both application/json and text/event-stream"),
            None,
        );
    }
    if !is_json_content(h) {
        return error_response(&Error::UnsupportedMediaType, None);
    }
    let version = match version_header(h) {
        Ok(v) => v,
        Err(r) => return *r,
    };
    let has_session = h.contains_key(SESSION_HEADER);
    // Before the body is read: an unknown session costs no more than its request head.
    let session = if has_session {
        match live_session(ctx, caller, h) {
            Ok(s) => Some(s),
            Err(r) => {
                let sid = header(h, SESSION_HEADER).unwrap_or_default().to_string();
                if let Some(addr) = ctx.owner_elsewhere(&req, &sid).await {
                    return forward_with_body(ctx, caller, &addr, req).await;
                }
                return *r;
            }
        }
    } else {
        None
    };
    let body = match req.into_body() {
        Either::Left(unread) => match read_client_body(ctx, caller, unread).await {
            Ok(b) => b,
            Err(r) => return *r,
        },
        // Read by the era selection (and already in the body budget).
        Either::Right(read) => read
            .collect()
            .await
            .map(|c| c.to_bytes())
            .unwrap_or_default(),
    };
    let (msgs, batch) = match parse_body(&body) {
        Ok(x) => x,
        Err(r) => return *r,
    };
    // Before anything of the body is forwarded (a batch is refused whole).
    if let Some((m, why)) = msgs.iter().find_map(|m| Some((m, m.peek.refusal()?))) {
        return invalid(m.peek.id.as_deref(), Answer::InvalidRequest, why);
    }
    let init = msgs
        .iter()
        .any(|m| m.peek.method.as_deref() == Some("initialize") && m.peek.is_request());
    if init {
        if batch {
            return invalid(
                None,
                Answer::InvalidRequest,
                "initialize must not be part of a batch",
            );
        }
        if has_session {
            return invalid(
                msgs[0].peek.id.as_deref(),
                Answer::AlreadyInitialized,
                "initialize opens a new session and must not carry Mcp-Session-Id",
            );
        }
        let msg = msgs.into_iter().next().expect("one message");
        return initialize(ctx, caller, msg, version).await;
    }
    let Some(session) = session else {
        return missing_session();
    };
    let version = effective_version(version.as_deref(), &session);
    if batch && !at_least(LAST_BATCH_VERSION, &version) {
        return invalid(
            None,
            Answer::BatchNotSupported,
            format!("JSON-RPC batches are not part of protocol version {version}"),
        );
    }
    if !msgs.iter().any(|m| m.peek.is_request()) {
        for m in msgs {
            if let Err(e) = session
                .forward(&ctx.reg, m.bytes, &m.peek, StreamTag::STANDALONE)
                .await
            {
                return error_response(&e, m.peek.id.as_deref());
            }
        }
        return plain(StatusCode::ACCEPTED, "text/plain", Bytes::new());
    }
    answer(ctx, &session, msgs, &version, false).await
}

/// `initialize` without a session: open one (and its upstream link), answer on a POST stream
/// that carries `Mcp-Session-Id`.
async fn initialize(
    ctx: &Arc<Ctx>,
    caller: &Caller,
    msg: Msg,
    header_version: Option<String>,
) -> Resp {
    #[derive(serde::Deserialize)]
    struct Init<'a> {
        #[serde(borrow, default)]
        params: Option<&'a RawValue>,
    }
    #[derive(serde::Deserialize)]
    struct InitParams<'a> {
        #[serde(borrow, default, rename = "protocolVersion")]
        protocol_version: Option<&'a RawValue>,
    }
    // Borrowed members, not a tree: only the version is read.
    let requested = serde_json::from_slice::<Init<'_>>(&msg.bytes)
        .ok()
        .and_then(|m| m.params)
        .filter(|p| jsonrpc::is_object(p))
        .and_then(|p| serde_json::from_str::<InitParams<'_>>(p.get()).ok())
        .and_then(|p| p.protocol_version)
        .and_then(jsonrpc::string);
    let Some(requested) = requested else {
        return error_response(
            &Error::InvalidParams {
                answer: Answer::InvalidParams,
                message: "initialize without params.protocolVersion".into(),
            },
            msg.peek.id.as_deref(),
        );
    };
    // `_hold` keeps the session from counting as idle (evictable) while `initialize` is
    // forwarded, until its POST stream is attached.
    let (session, _hold) = match ctx
        .reg
        .open(
            Facade::Streamable,
            Some(requested.clone()),
            caller.identity,
            caller.owner(),
        )
        .await
    {
        Ok(s) => s,
        Err(e) => return error_response(&e, msg.peek.id.as_deref()),
    };
    tracing::info!(session = %session.log.tag, protocol_version = echo::clip(&requested), "streamable session initialized");
    let version = header_version.unwrap_or(requested);
    let resp = answer(ctx, &session, vec![msg], &version, true).await;
    if !resp.status().is_success() {
        // The session never got going; do not leave it (and its upstream link) behind.
        ctx.reg.end(&session, EndReason::UpstreamLost).await;
    }
    resp
}

/// Forwards `msgs` (at least one request) and answers with the POST stream of their requests.
async fn answer(
    ctx: &Arc<Ctx>,
    session: &Arc<Session>,
    msgs: Vec<Msg>,
    version: &str,
    with_session_header: bool,
) -> Resp {
    let reg = &ctx.reg;
    // An id twice in the batch, or that of a request still in flight: refused before anything
    // is forwarded (the session refuses it too, for one that wins a race with another POST).
    let mut ids = std::collections::HashSet::new();
    for id in msgs
        .iter()
        .filter_map(|m| m.peek.id.as_deref().filter(|_| m.peek.is_request()))
    {
        if !ids.insert(id) || session.in_flight(id) {
            return error_response(&crate::session::id_in_flight(), Some(id));
        }
    }
    let tag = session.new_post_stream();
    let requests = msgs.iter().filter(|m| m.peek.is_request()).count();
    let after = session.log.head();
    if at_least(version, PRIMING_SINCE) {
        // Logged first, so the id the client may resume from exists before anything can happen.
        let priming = NewEvent::new(tag, Kind::Priming, Bytes::new());
        if let Err(e) = reg.log.append(&session.log, priming).await {
            return error_response(&e, None);
        }
    }
    let single = msgs.len() == 1;
    for (i, m) in msgs.into_iter().enumerate() {
        let Err(e) = session.forward(reg, m.bytes, &m.peek, tag).await else {
            continue;
        };
        if single || i == 0 {
            // Nothing reached the upstream: say so with a status.
            return error_response(&e, m.peek.id.as_deref());
        }
        if matches!(e, Error::UpstreamLost) {
            // The session ended: what was forwarded got its -32091 answer on this stream.
            break;
        }
        if let (Some(id), false) = (
            m.peek.id.as_deref().filter(|_| m.peek.is_request()),
            e.is_timeout(),
        ) {
            // The upstream refused this batch member, or the session did (its id went in flight
            // meanwhile, from another POST): answer it on the stream, so the batch's stream still
            // carries one response per request. A refusal completes nothing: the id's entry in
            // flight is the other request's.
            let refused = matches!(e, Error::Invalid { .. });
            let body = if refused {
                let a = e.answer();
                jsonrpc::error_response(id, a.code(), &e.to_string(), json!({"reason": a.reason()}))
            } else {
                let a = Answer::UpstreamError;
                jsonrpc::error_response(
                    id,
                    a.code(),
                    &format!("forwarding to the upstream failed: {e}"),
                    json!({"reason": a.reason(), "status": e.status()}),
                )
            };
            let mut ev = NewEvent::new(tag, Kind::Final, Bytes::from(body));
            ev.completes = (!refused).then(|| id.to_string());
            if let Err(e) = reg.log.append(&session.log, ev).await {
                tracing::error!(session = %session.log.tag, error = %e, "cannot log a batch member's error");
            }
        }
    }
    let spec = StreamSpec {
        log: session.log.clone(),
        after,
        filter: Filter::Post {
            stream: tag,
            responses: requests,
        },
        preamble: Vec::new(),
        replay_until: 0,
        facade: Facade::Streamable,
        attachment: session.attach(tag, false),
    };
    let id = with_session_header.then_some(&session.id);
    sse_response(stream::spawn(spec, ctx.env.clone()), id)
}

// ---------------------------------------------------------------------------------------------
// GET

/// `GET`: the standalone stream, or a resume.
/// A request for a session live on another replica: its body read (within this replica's body
/// budget), then forwarded to that replica and its answer relayed ([`super::forward`]).
async fn forward_with_body(
    ctx: &Arc<Ctx>,
    caller: &Caller,
    addr: &str,
    req: Request<LegacyBody>,
) -> Resp {
    let (parts, body) = req.into_parts();
    let body = match body {
        Either::Left(unread) => match read_client_body(ctx, caller, unread).await {
            Ok(b) => b,
            Err(r) => return *r,
        },
        Either::Right(read) => read
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default(),
    };
    ctx.forward_to(addr, caller, Request::from_parts(parts, ()), body)
        .await
}

pub async fn get<B>(ctx: &Arc<Ctx>, caller: &Caller, req: Request<B>) -> Resp {
    let h = req.headers();
    if !accepts(h, "text/event-stream") {
        return error_response(&Error::NotAcceptable("text/event-stream"), None);
    }
    let version = match version_header(h) {
        Ok(v) => v,
        Err(r) => return *r,
    };
    let Some(sid) = header(h, SESSION_HEADER) else {
        return missing_session();
    };
    match header(h, "last-event-id") {
        Some(lei) => resume(ctx, caller, sid.trim(), lei, version.as_deref()).await,
        None => {
            // The standalone stream is the owner's to serve (it takes over connections and
            // primes): forwarded when the session is live on another replica.
            if let Some(addr) = ctx.owner_elsewhere(&req, sid).await {
                let (parts, _) = req.into_parts();
                return ctx
                    .forward_to(&addr, caller, Request::from_parts(parts, ()), Bytes::new())
                    .await;
            }
            standalone(ctx, caller, h, version.as_deref()).await
        }
    }
}

/// A plain `GET`: the standalone stream, continuing after what earlier connections delivered.
async fn standalone(
    ctx: &Arc<Ctx>,
    caller: &Caller,
    h: &HeaderMap,
    header_version: Option<&str>,
) -> Resp {
    let session = match live_session(ctx, caller, h) {
        Ok(s) => s,
        Err(r) => return *r,
    };
    // A session bound to an identity is taken over by a plain GET of that identity (the old
    // connection is usually half-open after a network cut, and its owner must not be locked
    // out). A bearer session keeps one connection (409): whoever knows its id is no proof of
    // being the same client.
    let takeover = session.log.identity.is_some();
    let Some(attachment) = session.attach(StreamTag::STANDALONE, !takeover) else {
        tracing::debug!(session = %session.log.tag, reason = "stream_active", "409: the standalone stream of a bearer session already has a connection");
        return error_response(&Error::StreamActive, None);
    };
    let after = session.position(StreamTag::STANDALONE);
    let version = effective_version(header_version, &session);
    if at_least(&version, PRIMING_SINCE) {
        // A logged priming event: the client holds a cursor from the start, so a cut of this
        // connection is resumed (Last-Event-ID) rather than followed by a plain GET.
        let priming = NewEvent::new(StreamTag::STANDALONE, Kind::Priming, Bytes::new());
        if let Err(e) = ctx.reg.log.append(&session.log, priming).await {
            return error_response(&e, None);
        }
    }
    let spec = StreamSpec {
        log: session.log.clone(),
        after,
        filter: Filter::Stream(StreamTag::STANDALONE),
        preamble: Vec::new(),
        replay_until: 0,
        facade: Facade::Streamable,
        attachment: Some(attachment),
    };
    sse_response(stream::spawn(spec, ctx.env.clone()), None)
}

/// What a resumed stream still owes its client.
struct Owed {
    /// Messages (not priming events) of the stream after the cursor, up to the head when counted.
    messages: usize,
    /// Final events the stream will still deliver (POST streams).
    responses: usize,
    /// Of those, the ones not logged yet: requests still in flight.
    pending: usize,
}

/// Counts what stream `tag` owes after `after`. For a POST stream, the responses still to come are
/// the requests durably in flight on it plus those answered after the cursor — read in that order,
/// with a flush between, so that no answer is missed or counted twice.
async fn owed(
    ctx: &Ctx,
    sl: &Arc<SessionLog>,
    after: u64,
    tag: StreamTag,
) -> crate::error::Result<Owed> {
    let log = &ctx.reg.log;
    let mut answers: HashSet<String> = HashSet::new();
    if tag.is_post() {
        answers.extend(log.inflight_on(sl, tag));
        log.flush().await?;
    }
    let pending = answers.len();
    let head = sl.head();
    let mut cur = after;
    let mut messages = 0;
    while cur < head {
        // Within a byte budget: a resume of large events holds about 1 MiB here, not 256 of them.
        let batch = log.read_batch(sl, cur, 256).await?;
        let Some(last) = batch.last() else { break };
        cur = last.seq;
        for ev in batch.iter().filter(|e| e.seq <= head && e.stream == tag) {
            match ev.kind {
                Kind::End | Kind::Priming => {}
                Kind::Message => messages += 1,
                Kind::Final => {
                    messages += 1;
                    let id = jsonrpc::peek(&ev.payload)
                        .and_then(|p| p.id)
                        .unwrap_or_else(|| format!("seq {}", ev.seq));
                    answers.insert(id);
                }
            }
        }
    }
    Ok(Owed {
        messages,
        responses: answers.len(),
        pending,
    })
}

/// `GET` + `Last-Event-ID`: the §4 contract, for POST and standalone streams alike.
async fn resume(
    ctx: &Arc<Ctx>,
    caller: &Caller,
    sid: &str,
    last_event_id: &str,
    header_version: Option<&str>,
) -> Resp {
    let m = &ctx.reg.metrics;
    let log = &ctx.reg.log;
    let r = match super::resume::check(
        ctx,
        caller,
        Facade::Streamable,
        last_event_id,
        Some(sid),
        true,
    )
    .await
    {
        Ok(r) => r,
        Err(answer) => return *answer,
    };
    let (cursor, sl, ranges, after) = (r.cursor, r.sl, r.ranges, r.after);
    let refuse = |r: Refusal| refusal(m, r, last_event_id, Some(cursor.session), Some((log, &sl)));
    let ev = match log.event_at(&sl, cursor.seq).await {
        Ok(Some(ev)) => ev,
        // Trimmed between the check and the read.
        Ok(None) => return refuse(Refusal::CursorTrimmed),
        Err(e) => return error_response(&e, None),
    };
    let tag = ev.stream;
    if ev.kind == Kind::End {
        // The session's last event: it is over and nothing is left after it (design.md §10,
        // "Every stream ends"), as for any ended session with nothing left for the stream.
        return error_response(&Error::UnknownSession, None);
    }
    if !(tag == StreamTag::STANDALONE || tag.is_post()) {
        // Never handed to a client as an id: not a cursor this face issued.
        return refuse(Refusal::UnknownEpoch);
    }
    let owed = match owed(ctx, &sl, after, tag).await {
        Ok(o) => o,
        Err(e) => return error_response(&e, None),
    };
    let live = ctx.reg.live(&cursor.session);
    if live.is_none() && owed.messages == 0 && owed.pending == 0 {
        // The session is over and this stream has nothing more: say so rather than serve an
        // empty stream the client would reconnect to forever. (A request still pending here is
        // an end in progress: its -32091 answer and the end marker are about to be logged, and
        // the stream served ends at the marker.)
        return error_response(&Error::UnknownSession, None);
    }
    let attachment = live.as_ref().and_then(|s| s.attach(tag, false));
    if let Some(s) = &live {
        let version = effective_version(header_version, s);
        if owed.pending > 0 && at_least(&version, PRIMING_SINCE) {
            // A fresh id at the head, before the response still to come: a resumed stream that
            // drops again before anything new arrives still leaves the client a cursor.
            let priming = NewEvent::new(tag, Kind::Priming, Bytes::new());
            if let Err(e) = log.append(&sl, priming).await {
                return error_response(&e, None);
            }
        }
    }
    m.resume(Facade::Streamable);
    tracing::info!(
        session = %sl.tag,
        after,
        stream = tag.0,
        head = ranges.head,
        responses = owed.responses,
        "streamable resume served"
    );
    let filter = if tag.is_post() {
        Filter::Post {
            stream: tag,
            responses: owed.responses,
        }
    } else {
        Filter::Stream(tag)
    };
    let spec = StreamSpec {
        log: sl.clone(),
        after,
        filter,
        preamble: Vec::new(),
        replay_until: ranges.head,
        facade: Facade::Streamable,
        attachment,
    };
    sse_response(stream::spawn(spec, ctx.env.clone()), None)
}

// ---------------------------------------------------------------------------------------------
// DELETE

/// `DELETE`: ends the session.
pub async fn delete<B>(ctx: &Arc<Ctx>, caller: &Caller, req: Request<B>) -> Resp {
    let h = req.headers();
    if let Err(r) = version_header(h) {
        return *r;
    }
    let session = match live_session(ctx, caller, h) {
        Ok(s) => s,
        Err(r) => {
            let sid = header(h, SESSION_HEADER).unwrap_or_default().to_string();
            if let Some(addr) = ctx.owner_elsewhere(&req, &sid).await {
                let (parts, _) = req.into_parts();
                return ctx
                    .forward_to(&addr, caller, Request::from_parts(parts, ()), Bytes::new())
                    .await;
            }
            return *r;
        }
    };
    tracing::info!(session = %session.log.tag, "streamable session deleted by its client");
    ctx.reg.end(&session, EndReason::ClientDelete).await;
    plain(StatusCode::OK, "text/plain", Bytes::new())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                http::HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    #[test]
    fn accept_ranges() {
        let h = headers(&[("accept", "application/json, text/event-stream")]);
        assert!(accepts(&h, "application/json") && accepts(&h, "text/event-stream"));
        let h = headers(&[("accept", "application/json")]);
        assert!(!accepts(&h, "text/event-stream"));
        let h = headers(&[("accept", "*/*")]);
        assert!(accepts(&h, "text/event-stream"));
        let h = headers(&[("accept", "text/*;q=0.5, application/json;q=0")]);
        assert!(accepts(&h, "text/event-stream") && !accepts(&h, "application/json"));
        assert!(!accepts(&HeaderMap::new(), "text/event-stream"));
        let h = headers(&[("accept", "Text/Event-Stream")]);
        assert!(accepts(&h, "text/event-stream"));
    }

    #[test]
    fn content_type() {
        assert!(is_json_content(&headers(&[(
            "content-type",
            "application/json; charset=utf-8"
        )])));
        assert!(!is_json_content(&headers(&[(
            "content-type",
            "text/plain"
        )])));
        assert!(!is_json_content(&HeaderMap::new()));
    }

    #[test]
    fn versions() {
        assert!(at_least("2025-11-25", PRIMING_SINCE));
        assert!(at_least("2026-07-28", PRIMING_SINCE));
        assert!(!at_least("2025-06-18", PRIMING_SINCE));
        assert!(!at_least("zzzz", PRIMING_SINCE));
        assert!(at_least(LAST_BATCH_VERSION, "2025-03-26"));
        assert!(at_least(LAST_BATCH_VERSION, "2024-11-05"));
        assert!(!at_least(LAST_BATCH_VERSION, "2025-06-18"));
        assert!(version_header(&headers(&[("mcp-protocol-version", "2025-06-18")])).is_ok());
        assert!(version_header(&headers(&[("mcp-protocol-version", "1999-01-01")])).is_err());
    }

    #[test]
    fn bodies() {
        let (m, batch) = parse_body(&Bytes::from_static(
            br#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#,
        ))
        .unwrap();
        assert!(!batch && m.len() == 1 && m[0].peek.is_request());
        let (m, batch) = parse_body(&Bytes::from_static(
            br#" [{"jsonrpc":"2.0","id":1,"method":"ping"},{"jsonrpc":"2.0","method":"notifications/x"}]"#,
        ))
        .unwrap();
        assert!(batch && m.len() == 2 && !m[1].peek.is_request());
        assert_eq!(
            &m[1].bytes[..],
            br#"{"jsonrpc":"2.0","method":"notifications/x"}"#
        );
        assert!(parse_body(&Bytes::from_static(b"[]")).is_err());
        assert!(parse_body(&Bytes::from_static(b"{nope")).is_err());
        assert!(parse_body(&Bytes::from_static(br#"{"jsonrpc":"2.0"}"#)).is_err());
        assert!(parse_body(&Bytes::from_static(b"[1]")).is_err());
    }
}
