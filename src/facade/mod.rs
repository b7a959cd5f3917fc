//! [2] The client faces, three siblings: legacy HTTP+SSE ([`legacy`]), sessionful Streamable HTTP
//! ([`streamable`], resuming through [`resume`]) and the stateless 2026-07-28 face ([`modern`]).
//! [`mcp`], the router, picks one per request; [`http`] is the leaf they share (caller, bodies, responses,
//! refusals). This file holds what every handler is given: [`Ctx`].

pub mod forward;
pub mod http;
pub mod legacy;
pub mod mcp;
pub mod modern;
pub mod resume;
pub mod streamable;

use std::sync::Arc;

use ::http::{header, HeaderValue};
use bytes::Bytes;
use http_body::Body;

use crate::config::{AuthConfig, LegacyConfig, ListenConfig, StreamableConfig};
use crate::domain::Facade;
use crate::echo;
use crate::error::Error;
use crate::identity::Identity;
use crate::session::Registry;
use crate::stream::StreamEnv;
use http::{
    error_response, host_allowed, json_error, origin_allowed, read_body, BodyBudget, Caller,
    ClientCert, PeerAddr, Resp, StreamCaps, StreamSlot, MAX_BODY,
};

/// The config sections the faces read.
#[derive(Clone, Debug)]
pub struct FaceConfig {
    /// `[listen]`: bodies, origins, hosts.
    pub listen: ListenConfig,
    /// `[legacy]`: the legacy face's paths.
    pub legacy: LegacyConfig,
    /// `[streamable]`: the Streamable HTTP path (shared with the 2026-07-28 face).
    pub streamable: StreamableConfig,
    /// `[auth]`: who a caller is.
    pub auth: AuthConfig,
}

/// What every handler needs.
pub struct Ctx {
    /// The faces' config sections.
    pub cfg: FaceConfig,
    /// Sessions.
    pub reg: Arc<Registry>,
    /// Client stream environment.
    pub env: StreamEnv,
    /// Allowed origins, normalised (`listen.allowed_origins` and its old alias).
    origins: Vec<String>,
    /// Allowed hosts, lowercase (`listen.allowed_hosts`; empty: any).
    hosts: Vec<String>,
    /// Room for client bodies (`listen.max_body_bytes_in_flight`): see [`read_body`].
    bodies: BodyBudget,
    /// Requests and streams per caller (`listen.max_connections_per_identity`).
    streams: StreamCaps,
    /// The 2026-07-28 face (its janitor is the caller's to spawn: [`modern::Modern::janitor`]).
    pub modern: Arc<modern::Modern>,
    /// `auth.mode = "jwt"`: the token verifier.
    jwt: Option<Arc<crate::jwt::Verifier>>,
    /// `cluster.listen` (shared log): forwards requests for sessions live on another replica.
    pub forward: Option<Arc<forward::Forwarder>>,
}

impl Ctx {
    /// The handlers' context: the faces of `cfg` over the sessions of `reg` and the 2026-07-28
    /// face `modern`.
    pub fn new(
        cfg: FaceConfig,
        reg: Arc<Registry>,
        env: StreamEnv,
        modern: Arc<modern::Modern>,
    ) -> Self {
        let origins = cfg
            .listen
            .allowed_origins
            .iter()
            .chain(&cfg.streamable.allowed_origins)
            .filter_map(|o| crate::config::parse_origin(o).ok())
            .collect();
        let hosts = cfg
            .listen
            .allowed_hosts
            .iter()
            .map(|h| h.to_ascii_lowercase())
            .collect();
        let jwt = cfg
            .auth
            .jwt_rules()
            .map(|r| Arc::new(crate::jwt::Verifier::new(r)));
        let bodies = BodyBudget::new(cfg.listen.max_body_bytes_in_flight);
        let streams = StreamCaps::new(cfg.listen.per_identity_connections());
        Self {
            cfg,
            reg,
            env,
            origins,
            hosts,
            bodies,
            streams,
            modern,
            jwt,
            forward: None,
        }
    }

    /// With forwarding to the replicas that own sessions (`cluster.listen`).
    pub fn with_forwarder(mut self, f: Arc<forward::Forwarder>) -> Self {
        self.forward = Some(f);
        self
    }

    /// Where a request for session `id` (the raw header or query value), not live here, goes:
    /// the internal address of the replica that owns it — when forwarding is on, the session
    /// is live there, and `req` did not itself arrive forwarded.
    pub async fn owner_elsewhere<B>(&self, req: &::http::Request<B>, id: &str) -> Option<String> {
        self.forward.as_ref()?;
        if forward::carries_proof(req) {
            return None;
        }
        let id = crate::log::cursor::SessionId::parse(id.trim())?;
        if self.reg.live(&id).is_some() {
            return None;
        }
        self.reg.log.owner_addr(&id).await
    }

    /// Forwards `req` (its body already read: `body`) to the replica at `addr` (see
    /// [`forward`]).
    pub async fn forward_to<B>(
        &self,
        addr: &str,
        caller: &Caller,
        req: ::http::Request<B>,
        body: bytes::Bytes,
    ) -> Resp {
        let f = self.forward.as_ref().expect("forwarding is on");
        let pq = req
            .uri()
            .path_and_query()
            .map_or("/", |p| p.as_str())
            .to_string();
        f.send(addr, req.method().clone(), &pq, req.headers(), body, caller)
            .await
    }

    /// The caller of a request that may become a stream ([`Ctx::caller`]), and its slot of
    /// `listen.max_connections_per_identity`: 503 `capacity` when it holds them all.
    pub fn admit<B>(
        &self,
        req: &::http::Request<B>,
    ) -> Result<(Caller, Option<StreamSlot>), Box<Resp>> {
        let caller = self.caller(req)?;
        let slot = self.streams.take(caller.owner()).ok_or_else(|| {
            self.reg.metrics.request_rejected("capacity");
            Box::new(error_response(
                &Error::Capacity(
                    "this caller has listen.max_connections_per_identity requests and streams open"
                        .into(),
                ),
                None,
            ))
        })?;
        Ok((caller, slot))
    }

    /// The checks every request to either face passes first: a browser's `Origin` must be
    /// allowed (403 `origin_not_allowed`), and, when `listen.allowed_hosts` is set, so must `Host`
    /// (403 `host_not_allowed`: a DNS-rebinding page names its own host).
    pub fn gate<B>(&self, req: &::http::Request<B>) -> Result<(), Box<Resp>> {
        let h = req.headers();
        if let Some(origin) = h.get(header::ORIGIN) {
            // No implicit same-host rule: the proxy serves no pages, and a DNS-rebinding page's
            // Origin and Host agree.
            if !origin_allowed(&self.origins, origin) {
                let o = String::from_utf8_lossy(origin.as_bytes());
                tracing::warn!(
                    origin = echo::clip(&o),
                    "request from a foreign Origin refused"
                );
                self.reg.metrics.request_rejected("origin_not_allowed");
                let e = Error::OriginNotAllowed;
                let a = e.answer();
                return Err(Box::new(json_error(
                    a,
                    None,
                    &e.to_string(),
                    serde_json::json!({"reason": a.reason(), "origin": echo::clip(&o)}),
                )));
            }
        }
        if !self.hosts.is_empty() {
            let host = h
                .get(header::HOST)
                .and_then(|v| v.to_str().ok())
                .or_else(|| req.uri().authority().map(|a| a.as_str()))
                .unwrap_or("")
                .to_ascii_lowercase();
            if !host_allowed(&self.hosts, &host) {
                tracing::warn!(
                    host = echo::clip(&host),
                    "request for a host not in listen.allowed_hosts refused"
                );
                self.reg.metrics.request_rejected("host_not_allowed");
                return Err(Box::new(error_response(&Error::HostNotAllowed, None)));
            }
        }
        Ok(())
    }

    /// The caller of a request: the keyed identity of its identity headers and client
    /// certificate, or (`auth.mode = "jwt"`) of its verified token's issuer and subject. `Err` is
    /// the 401 answer when `auth.require_identity` is set and it has none, or when its token is
    /// missing or invalid (with `WWW-Authenticate`, RFC 6750 and RFC 9728).
    pub fn caller<B>(&self, req: &::http::Request<B>) -> Result<Caller, Box<Resp>> {
        let peer = req.extensions().get::<PeerAddr>().map(|p| p.0.ip());
        if let Some(v) = &self.jwt {
            let auth = req
                .headers()
                .get(header::AUTHORIZATION)
                .map(|h| h.as_bytes());
            return match v.verify(auth) {
                Ok(p) => {
                    let principal = self.reg.log.keys().principal(&p);
                    Ok(Caller {
                        identity: Some(principal),
                        verified: Some(principal),
                        peer,
                    })
                }
                Err(e) => {
                    let invalid = matches!(e, crate::jwt::TokenError::Invalid(_));
                    tracing::debug!(error = %e, "request without a valid bearer token: 401");
                    self.reg.metrics.request_rejected(if invalid {
                        "invalid_token"
                    } else {
                        "token_required"
                    });
                    let mut r = error_response(&Error::InvalidToken, None);
                    let mut challenge = String::from("Bearer");
                    if invalid {
                        challenge.push_str(" error=\"invalid_token\"");
                    }
                    let u = &self.cfg.auth.resource_metadata_url;
                    if !u.is_empty() {
                        challenge.push_str(if invalid { ", " } else { " " });
                        challenge.push_str(&format!("resource_metadata=\"{u}\""));
                    }
                    if let Ok(h) = HeaderValue::from_str(&challenge) {
                        r.headers_mut().insert(header::WWW_AUTHENTICATE, h);
                    }
                    Err(Box::new(r))
                }
            };
        }
        let cert = req.extensions().get::<ClientCert>().map(|c| &c.0);
        let identity = self
            .reg
            .log
            .keys()
            .identity(&self.cfg.auth, req.headers(), cert);
        if identity.is_none() && self.cfg.auth.require_identity {
            self.reg.metrics.request_rejected("identity_required");
            return Err(Box::new(error_response(&Error::IdentityRequired, None)));
        }
        let verified = cert.map(|c| self.reg.log.keys().certificate(c));
        Ok(Caller {
            identity,
            verified,
            peer,
        })
    }

    /// May `caller`, on face `face`, use a session opened on `opened` and bound to `bound`? A
    /// session belongs to the identity that opened it (a bearer session, opened without one, to
    /// whoever names it) and to its face. A refusal is counted; the caller is then answered
    /// exactly as for an unknown session, so that it learns nothing about the session.
    pub fn admits(
        &self,
        caller: &Caller,
        bound: Option<&Identity>,
        opened: Facade,
        face: Facade,
    ) -> bool {
        let same_identity = match bound {
            None => true,
            Some(b) => caller.identity.as_ref().is_some_and(|c| c.matches(b)),
        };
        let ok = same_identity && opened == face;
        if !ok {
            self.reg.metrics.auth_rejected(face);
            tracing::debug!(
                face = face.as_str(),
                opened = opened.as_str(),
                identity_matches = same_identity,
                "request for a session of another identity or face: answered as unknown"
            );
        }
        ok
    }
}

/// [`read_body`] with the proxy's limits ([`MAX_BODY`], `listen.body_timeout_secs`,
/// `listen.max_body_bytes_in_flight`), answering the failure.
///
/// # Errors
/// The response for the [`BodyError`].
pub async fn read_client_body<B>(ctx: &Ctx, caller: &Caller, body: B) -> Result<Bytes, Box<Resp>>
where
    B: Body<Data = Bytes>,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let timeout = ctx.cfg.listen.body_timeout();
    read_body(body, MAX_BODY, timeout, &ctx.bodies, caller.owner())
        .await
        .map_err(|e| Box::new(e.response()))
}
