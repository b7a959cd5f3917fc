//! The legacy HTTP+SSE face (spec 2024-11-05), for old clients.
//!
//! `GET {sse_path}` opens a session and answers the proxy's own `endpoint` event, then `id:`-carrying
//! `message` events from the log. `GET {sse_path}` with `Last-Event-ID` resumes that same session —
//! the cursor carries the session id, so an `EventSource` that reconnects to the same URL keeps its
//! session and loses nothing. `POST {message_path}?session_id=` forwards a message upstream.

use std::sync::Arc;

use bytes::Bytes;
use http::{Method, Request, StatusCode};
use hyper::body::Incoming;

use super::http::{error_response, plain, query_param, sse_response, Caller, Resp};
use super::{read_client_body, Ctx};
use crate::domain::Facade;
use crate::echo;
use crate::error::Error;
use crate::jsonrpc;
use crate::log::cursor::SessionId;
use crate::log::StreamTag;
use crate::stream::{self, Filter, StreamSpec};

/// Serves one request to the SSE path.
pub async fn sse(ctx: &Arc<Ctx>, req: Request<Incoming>) -> Resp {
    if req.method() != Method::GET {
        return error_response(&Error::MethodNotAllowed("GET"), None);
    }
    let (caller, slot) = match ctx.admit(&req) {
        Ok(c) => c,
        Err(r) => return *r,
    };
    let resp = match req.headers().get("last-event-id") {
        None => open(ctx, &caller).await,
        Some(v) => resume(ctx, &caller, v.to_str().unwrap_or("\u{fffd}")).await,
    };
    super::http::holding(resp, slot)
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
    let r =
        match super::resume::check(ctx, caller, Facade::Legacy, last_event_id, None, false).await {
            Ok(r) => r,
            Err(answer) => return *answer,
        };
    ctx.reg.metrics.resume(Facade::Legacy);
    tracing::info!(session = %r.sl.tag, after = r.after, head = r.ranges.head, "legacy resume served");
    tracing::debug!(
        last_event_id = echo::clip(last_event_id),
        "legacy resume served"
    );
    let attachment = ctx
        .reg
        .live(&r.cursor.session)
        .and_then(|s| s.attach(StreamTag::LEGACY, false));
    let spec = StreamSpec {
        log: r.sl.clone(),
        after: r.after,
        filter: Filter::Stream(StreamTag::LEGACY),
        preamble: vec![endpoint_frame(ctx, &r.sl.id)],
        replay_until: r.ranges.head,
        facade: Facade::Legacy,
        attachment,
    };
    sse_response(stream::spawn(spec, ctx.env.clone()), None)
}

/// Serves one request to the message path.
pub async fn message(ctx: &Arc<Ctx>, req: Request<Incoming>) -> Resp {
    message_as(ctx, req, None).await
}

/// [`message`], for a request whose caller is already known (`Some`: a forward from another
/// replica, [`super::forward`]).
pub async fn message_as<B>(ctx: &Arc<Ctx>, req: Request<B>, known: Option<Caller>) -> Resp
where
    B: hyper::body::Body<Data = bytes::Bytes>,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    if req.method() != Method::POST {
        return error_response(&Error::MethodNotAllowed("POST"), None);
    }
    let Some(raw) = query_param(req.uri().query(), "session_id") else {
        return error_response(&Error::BadRequest("session_id is required".into()), None);
    };
    let Some(id) = SessionId::parse(raw) else {
        return error_response(&Error::BadRequest("invalid session_id".into()), None);
    };
    // A web page can POST `text/plain` cross-origin without a preflight; a JSON-RPC message
    // must say it is JSON.
    if !super::http::is_json_content(req.headers()) {
        ctx.reg.metrics.request_rejected("unsupported_media_type");
        return error_response(&Error::UnsupportedMediaType, None);
    }
    let caller = match known {
        Some(c) => c,
        None => match ctx.caller(&req) {
            Ok(c) => c,
            Err(r) => return *r,
        },
    };
    // Before the body is read: an unknown session costs no more than its request head.
    let session = ctx
        .reg
        .live(&id)
        .filter(|s| ctx.admits(&caller, s.log.identity.as_ref(), s.facade, Facade::Legacy));
    let Some(session) = session else {
        if let Some(addr) = ctx.owner_elsewhere(&req, raw).await {
            // Live on another replica: its message goes there.
            let (parts, body) = req.into_parts();
            let body = match read_client_body(ctx, &caller, body).await {
                Ok(b) => b,
                Err(r) => return *r,
            };
            return ctx
                .forward_to(&addr, &caller, Request::from_parts(parts, ()), body)
                .await;
        }
        return error_response(&Error::UnknownSession, None);
    };
    let body = match read_client_body(ctx, &caller, req.into_body()).await {
        Ok(b) => b,
        Err(r) => return *r,
    };
    // Nesting is bounded before any parse, as on the other faces: the parse below recurses once
    // per level, and the upstream gets only what the proxy would take itself.
    if jsonrpc::too_deep(&body, jsonrpc::MAX_DEPTH) {
        return error_response(&Error::TooDeep, None);
    }
    let Some(peek) = jsonrpc::peek(&body) else {
        return error_response(&Error::Parse, None);
    };
    if let Some(why) = peek.refusal() {
        let e = Error::Invalid {
            answer: jsonrpc::Answer::InvalidRequest,
            message: why.into(),
        };
        return error_response(&e, peek.id.as_deref());
    }
    match session
        .forward(&ctx.reg, body, &peek, StreamTag::LEGACY)
        .await
    {
        Ok(()) => plain(StatusCode::ACCEPTED, "text/plain", "Accepted"),
        Err(e) => error_response(&e, peek.id.as_deref()),
    }
}
