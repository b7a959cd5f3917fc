//! The admin listener: `/metrics` (Prometheus text format), `/healthz` (the process runs) and
//! `/readyz` (the log is open, takes writes, and the client listener is bound; 503 while starting,
//! draining, or while the log's storage is failing).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use http::{Request, StatusCode};
use hyper::body::Incoming;

use crate::facade::http::{plain, Resp};
use crate::metrics::Metrics;

/// Admin state.
#[derive(Clone)]
pub struct Admin {
    /// Metrics to render.
    pub metrics: Metrics,
    /// Started and not draining.
    pub ready: Arc<AtomicBool>,
    /// The log takes writes.
    pub store_ok: Arc<AtomicBool>,
}

impl Admin {
    /// Serves one admin request.
    pub async fn handle(self, req: Request<Incoming>) -> Resp {
        match req.uri().path() {
            "/metrics" => plain(
                StatusCode::OK,
                "text/plain; version=0.0.4; charset=utf-8",
                self.metrics.render(),
            ),
            "/healthz" => plain(StatusCode::OK, "text/plain", "ok\n"),
            "/readyz" => {
                if self.ready.load(Ordering::Acquire) && self.store_ok.load(Ordering::Acquire) {
                    plain(StatusCode::OK, "text/plain", "ready\n")
                } else {
                    plain(StatusCode::SERVICE_UNAVAILABLE, "text/plain", "not ready\n")
                }
            }
            _ => plain(StatusCode::NOT_FOUND, "text/plain", "Not Found"),
        }
    }
}
