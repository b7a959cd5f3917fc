//! The legacy HTTP+SSE face (spec 2024-11-05), for old clients.
//!
//! `GET {sse_path}` opens a session and answers the proxy's own `endpoint` event, then `id:`-carrying
//! `message` events from the log. `GET {sse_path}` with `Last-Event-ID` resumes that same session —
//! the cursor carries the session id, so an `EventSource` that reconnects to the same URL keeps its
//! session and loses nothing. `POST {message_path}?session_id=` forwards a message upstream.

use std::sync::Arc;

use bytes::Bytes;
use http::{header, Method, Request};
use hyper::body::Incoming;

use super::{
    error_response, json_error, plain, query_param, read_client_body, refusal, sse_response,
    Caller, Ctx, Resp,
};
use crate::domain::Facade;
use crate::echo;
use crate::error::{Error, StoreError};
use crate::jsonrpc;
use crate::log::cursor::{check_resume, Cursor, Refusal, SessionId};
use crate::log::{Kind, StreamTag};
use crate::stream::{self, Filter, StreamSpec};

/// Serves one request to the SSE path.
pub async fn sse(ctx: &Arc<Ctx>, req: Request<Incoming>) -> Resp {
    if req.method() != Method::GET {
        let mut r = plain(405, "text/plain", "Method Not Allowed");
        r.headers_mut()
            .insert(header::ALLOW, header::HeaderValue::from_static("GET"));
        return r;
    }
    let caller = match ctx.caller(&req) {
        Ok(c) => c,
        Err(r) => return *r,
    };
    match req.headers().get("last-event-id") {
        None => open(ctx, &caller).await,
        Some(v) => resume(ctx, &caller, v.to_str().unwrap_or("\u{fffd}")).await,
    }
}

/// `retry` (ms) carried by the endpoint event: an `EventSource` reconnects this soon (with its
/// `Last-Event-ID`) instead of after its default of a few seconds.
const RECONNECT_MS: u64 = 1000;

fn endpoint_frame(ctx: &Ctx, id: &SessionId) -> Bytes {
    let url = format!("{}?session_id={id}", ctx.cfg.legacy.message_path);
    Bytes::from(format!(
        "event: endpoint\ndata: {url}\nretry: {RECONNECT_MS}\n\n"
    ))
}

async fn open(ctx: &Arc<Ctx>, caller: &Caller) -> Resp {
    // `_hold` keeps the session from counting as idle until the stream below is attached.
    let (session, _hold) = match ctx
        .reg
        .open(Facade::Legacy, None, caller.identity, caller.owner())
        .await
    {
        Ok(s) => s,
        Err(e) => return error_response(&e, None),
    };
    let spec = StreamSpec {
        log: session.log.clone(),
        after: 0,
        filter: Filter::Stream(StreamTag::LEGACY),
        preamble: vec![endpoint_frame(ctx, &session.id)],
        replay_until: 0,
        facade: Facade::Legacy,
        attachment: session.attach(StreamTag::LEGACY, false),
    };
    sse_response(stream::spawn(spec, ctx.env.clone()), None)
}

async fn resume(ctx: &Arc<Ctx>, caller: &Caller, last_event_id: &str) -> Resp {
    let m = &ctx.reg.metrics;
    let Some(cursor) = Cursor::parse(last_event_id) else {
        return refusal(m, Refusal::MalformedCursor, last_event_id, None, None);
    };
    let log = &ctx.reg.log;
    let sl = log
        .get(&cursor.session)
        .filter(|sl| ctx.admits(caller, sl.identity.as_ref(), sl.facade, Facade::Legacy));
    let Some(sl) = sl else {
        return refusal(
            m,
            Refusal::UnknownSession,
            last_event_id,
            Some(cursor.session),
            None,
        );
    };
    if sl.failed() {
        // Events of this session were lost to a storage failure and its end is not logged yet:
        // no history can be served as complete until it is.
        return error_response(&Error::Store(StoreError::Unavailable), None);
    }
    let ranges = sl.ranges();
    let after = match check_resume(&cursor, &ranges, false) {
        Ok(a) => a,
        Err(r) => return refusal(m, r, last_event_id, Some(cursor.session), Some((log, &sl))),
    };
    if sl.ended().is_some() && nothing_left(ctx, &sl, after) {
        // The history after this cursor is complete and empty: say the session is over rather
        // than open a stream that ends at once (an EventSource would reconnect forever) or, when
        // the cursor is the end marker itself, one that never ends.
        return error_response(&Error::UnknownSession, None);
    }
    m.resume(Facade::Legacy);
    tracing::info!(session = %sl.tag, after, head = ranges.head, "legacy resume served");
    tracing::debug!(
        last_event_id = echo::clip(last_event_id),
        "legacy resume served"
    );
    let attachment = ctx
        .reg
        .live(&cursor.session)
        .and_then(|s| s.attach(StreamTag::LEGACY, false));
    let spec = StreamSpec {
        log: sl.clone(),
        after,
        filter: Filter::Stream(StreamTag::LEGACY),
        preamble: vec![endpoint_frame(ctx, &sl.id)],
        replay_until: ranges.head,
        facade: Facade::Legacy,
        attachment,
    };
    sse_response(stream::spawn(spec, ctx.env.clone()), None)
}

/// Of an ended session: is nothing but the end marker left after `after` — the next event is the
/// end marker, or `after` is the end marker itself? (While the end is still being logged, neither
/// holds yet: the stream is served and ends at the marker.)
fn nothing_left(ctx: &Ctx, sl: &crate::log::SessionLog, after: u64) -> bool {
    let log = &ctx.reg.log;
    match log.read_after(sl, after, 1) {
        Ok(evs) if !evs.is_empty() => evs[0].kind == Kind::End,
        Ok(_) => matches!(log.event_at(sl, after), Ok(Some(ev)) if ev.kind == Kind::End),
        Err(_) => false,
    }
}

/// Serves one request to the message path.
pub async fn message(ctx: &Arc<Ctx>, req: Request<Incoming>) -> Resp {
    if req.method() != Method::POST {
        let mut r = plain(405, "text/plain", "Method Not Allowed");
        r.headers_mut()
            .insert(header::ALLOW, header::HeaderValue::from_static("POST"));
        return r;
    }
    let Some(raw) = query_param(req.uri().query(), "session_id") else {
        return error_response(&Error::BadRequest("session_id is required".into()), None);
    };
    let Some(id) = SessionId::parse(raw) else {
        return error_response(&Error::BadRequest("invalid session_id".into()), None);
    };
    // A web page can POST `text/plain` cross-origin without a preflight; a JSON-RPC message
    // must say it is JSON.
    if !super::is_json_content(req.headers()) {
        return json_error(
            415,
            None,
            -32600,
            "Unsupported Media Type: Content-Type must be application/json",
            serde_json::json!({"reason": "unsupported_media_type"}),
        );
    }
    let caller = match ctx.caller(&req) {
        Ok(c) => c,
        Err(r) => return *r,
    };
    // Before the body is read: an unknown session costs no more than its request head.
    let session = ctx
        .reg
        .live(&id)
        .filter(|s| ctx.admits(&caller, s.log.identity.as_ref(), s.facade, Facade::Legacy));
    let Some(session) = session else {
        return error_response(&Error::UnknownSession, None);
    };
    let body = match read_client_body(ctx, req.into_body()).await {
        Ok(b) => b,
        Err(r) => return *r,
    };
    let Some(peek) = jsonrpc::peek(&body) else {
        return json_error(
            400,
            None,
            -32700,
            "Parse error: body is not a JSON-RPC message",
            serde_json::json!({"reason": "parse_error"}),
        );
    };
    match session
        .forward(&ctx.reg, body, &peek, StreamTag::LEGACY)
        .await
    {
        Ok(()) => plain(202, "text/plain", "Accepted"),
        Err(e) => error_response(&e, peek.id.as_deref()),
    }
}
