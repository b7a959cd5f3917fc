//! [2] The router (of the MCP endpoint and the legacy paths): picks the face of each client request — by path the legacy HTTP+SSE face
//! ([`legacy`]) or the MCP endpoint, and there, per request, the era: the stateless 2026-07-28
//! face ([`modern`]) or the sessionful Streamable HTTP face ([`streamable`]).

use std::sync::Arc;

use http::{header, HeaderMap, HeaderValue, Method, Request, StatusCode};
use http_body_util::{BodyExt, Either, Full};
use hyper::body::Incoming;
use serde_json::Value;

use super::http::{error_response, holding, plain, Caller, LegacyBody, Resp, SUPPORTED_VERSIONS};
use super::{legacy, modern, read_client_body, streamable, Ctx};
use crate::error::Error;
use crate::jsonrpc::Answer;

/// Routes one client request to its face.
pub async fn route(ctx: Arc<Ctx>, req: Request<Incoming>) -> Resp {
    if let Err(r) = ctx.gate(&req) {
        return *r;
    }
    let path = req.uri().path();
    let cfg = &ctx.cfg;
    if path == cfg.legacy.sse_path {
        legacy::sse(&ctx, req).await
    } else if path == cfg.legacy.message_path {
        legacy::message(&ctx, req).await
    } else if path == cfg.streamable.path {
        endpoint(&ctx, req).await
    } else {
        plain(StatusCode::NOT_FOUND, "text/plain", "Not Found")
    }
}

/// Serves one request to the internal listener (`cluster.listen`): a forward from another
/// replica, for a session this one owns ([`super::forward`]); anything else is 404.
pub async fn internal(ctx: Arc<Ctx>, req: Request<Incoming>) -> Resp {
    let Some(fw) = ctx.forward.clone() else {
        return super::forward::not_found();
    };
    let timeout = ctx.cfg.listen.body_timeout();
    let (req, caller) = match super::forward::accept(&fw, req, timeout).await {
        Ok(x) => x,
        Err(r) => return *r,
    };
    let path = req.uri().path();
    if path == ctx.cfg.streamable.path {
        let modern = req
            .headers()
            .get("mcp-protocol-version")
            .is_some_and(|v| v.as_bytes() == modern::MODERN_VERSION.as_bytes());
        match *req.method() {
            // A 2026-07-28 task method for a task this replica runs.
            Method::POST if modern => {
                let (parts, body) = req.into_parts();
                let body = match body {
                    Either::Right(full) => full
                        .collect()
                        .await
                        .map(|b| b.to_bytes())
                        .unwrap_or_default(),
                    Either::Left(_) => bytes::Bytes::new(),
                };
                ctx.modern
                    .post(&caller, &parts.headers, Some(modern::MODERN_VERSION), &body)
                    .await
            }
            Method::POST => streamable::post(&ctx, &caller, req).await,
            Method::GET => streamable::get(&ctx, &caller, req).await,
            Method::DELETE => streamable::delete(&ctx, &caller, req).await,
            _ => error_response(&Error::MethodNotAllowed("GET, POST, DELETE"), None),
        }
    } else if path == ctx.cfg.legacy.message_path {
        legacy::message_as(&ctx, req, Some(caller)).await
    } else {
        super::forward::not_found()
    }
}

/// Serves one request to the MCP endpoint (`streamable.path`): picks the era of each request.
pub async fn endpoint(ctx: &Arc<Ctx>, req: Request<Incoming>) -> Resp {
    // The request, and the stream it may become, count against the caller's share of the
    // connection slots.
    let (caller, slot) = match ctx.admit(&req) {
        Ok(c) => c,
        Err(r) => return *r,
    };
    holding(by_method(ctx, caller, req).await, slot)
}

/// [`endpoint`] after its caller is known.
async fn by_method(ctx: &Arc<Ctx>, caller: Caller, req: Request<Incoming>) -> Resp {
    // The 2026-07-28 era is POST-only: its GET/DELETE is 405.
    if matches!(*req.method(), Method::GET | Method::DELETE) {
        if let Some(r) = refuse_get_delete(req.headers()) {
            return r;
        }
    }
    let method = req.method().clone();
    match method {
        Method::POST => {
            // 2026-07-28 requests are served by that face; the rest come back with their body
            // (read or not) for the sessionful one.
            let req = match select(ctx, &caller, req).await {
                Era::Modern(r) => return r,
                Era::Legacy(req) => req,
            };
            streamable::post(ctx, &caller, req).await
        }
        Method::GET => streamable::get(ctx, &caller, req).await,
        Method::DELETE => streamable::delete(ctx, &caller, req).await,
        _ => error_response(&Error::MethodNotAllowed("GET, POST, DELETE"), None),
    }
}

/// Which era serves a POST.
pub enum Era {
    /// Served by the 2026-07-28 face.
    Modern(Resp),
    /// For the sessionful face, with its body.
    Legacy(Request<LegacyBody>),
}

// ---------------------------------------------------------------------------------------------
// The 2026-07-28 era

/// `GET`/`DELETE` of a 2026-07-28 client: 405 (the modern face is POST-only). Without a modern
/// `MCP-Protocol-Version` they stay the sessionful face's.
pub fn refuse_get_delete(h: &HeaderMap) -> Option<Resp> {
    let v = h.get("mcp-protocol-version")?.to_str().ok()?.trim();
    if v != modern::MODERN_VERSION {
        return None;
    }
    let mut r = plain(
        Answer::MethodNotAllowed.status(),
        "text/plain",
        "Method Not Allowed: protocol version 2026-07-28 is served by POST only",
    );
    r.headers_mut()
        .insert(header::ALLOW, HeaderValue::from_static("POST"));
    Some(r)
}

/// Chooses the era of a POST to `/mcp` and serves it when it is modern.
///
/// A POST with `Mcp-Session-Id` and a 2025 `MCP-Protocol-Version` (or none) goes to the sessionful
/// face without its body being read here. Any other body is read (same limits as there) and
/// classified: a `params._meta` protocol-version claim, or `MCP-Protocol-Version: 2026-07-28`,
/// makes it modern.
pub async fn select(ctx: &Arc<Ctx>, caller: &Caller, req: Request<Incoming>) -> Era {
    let h = req.headers();
    let hv = h
        .get("mcp-protocol-version")
        .map(|v| v.to_str().unwrap_or("\u{fffd}").trim().to_string());
    let legacy_header = hv
        .as_deref()
        .is_none_or(|v| SUPPORTED_VERSIONS.contains(&v));
    if legacy_header && h.contains_key("mcp-session-id") {
        return Era::Legacy(req.map(Either::Left));
    }
    let (parts, body) = req.into_parts();
    let body = match read_client_body(ctx, caller, body).await {
        Ok(b) => b,
        Err(r) => return Era::Modern(*r),
    };
    // A scan of borrowed members, not a tree: the era is chosen before anything is built.
    let probed = modern::wire::probe(&body);
    // Without a claim only the modern version's header makes a request modern; an unknown
    // version without one gets the sessionful face's own 400 (which lists what it serves).
    if !probed.claims && hv.as_deref() != Some(modern::MODERN_VERSION) {
        return Era::Legacy(Request::from_parts(parts, Either::Right(Full::new(body))));
    }
    if let Some(r) = modern::wire::media_refusal(&parts.headers) {
        return Era::Modern(modern::refusal_resp(&probed.id.unwrap_or(Value::Null), r));
    }
    // A task runs on the replica that created it (its upstream call is there): `tasks/get`,
    // `tasks/update` and `tasks/cancel` of a task live on another replica go there.
    if ctx.forward.is_some() {
        let text = |n: &str| {
            parts
                .headers
                .get(n)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        };
        let (method, task) = (text("mcp-method"), text("mcp-name"));
        if let (Some("tasks/get" | "tasks/update" | "tasks/cancel"), Some(task)) =
            (method.as_deref(), task)
        {
            let probe = Request::from_parts(parts, ());
            if let Some(addr) = ctx.owner_elsewhere(&probe, &task).await {
                return Era::Modern(ctx.forward_to(&addr, caller, probe, body).await);
            }
            let (p, ()) = probe.into_parts();
            return Era::Modern(
                ctx.modern
                    .post(caller, &p.headers, hv.as_deref(), &body)
                    .await,
            );
        }
    }
    Era::Modern(
        ctx.modern
            .post(caller, &parts.headers, hv.as_deref(), &body)
            .await,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modern_get_and_delete_are_405() {
        let mut h = HeaderMap::new();
        assert!(refuse_get_delete(&h).is_none());
        h.insert(
            "mcp-protocol-version",
            HeaderValue::from_static("2025-11-25"),
        );
        assert!(refuse_get_delete(&h).is_none());
        h.insert(
            "mcp-protocol-version",
            HeaderValue::from_static("2026-07-28"),
        );
        assert_eq!(refuse_get_delete(&h).unwrap().status(), 405);
    }
}
