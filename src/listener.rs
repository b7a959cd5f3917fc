//! [1] Client → proxy: the accept loop and the connection limit (the router to the faces is
//! [`crate::facade::mcp`]).
//! The admin listener uses the same loop with its own router.

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};

use crate::facade::http::{ClientCert, PeerAddr, ProxyBody};
use crate::tls::ServerTls;

/// Accepts connections until `stop` turns true, serving each with `handler` — over TLS when
/// `tls` is set (the handshake happens in the connection's own task, under a timeout, so a slow
/// handshake holds only its own slot); at most `max_connections` at once (further accepts wait
/// for a slot). Every request carries the client's [`PeerAddr`] and, with mutual TLS, its
/// [`ClientCert`]. Returns the graceful-shutdown tracker holding the open connections, for the
/// caller to drain.
pub async fn serve<H, F>(
    listener: TcpListener,
    max_connections: usize,
    tls: Option<Arc<ServerTls>>,
    handler: H,
    mut stop: watch::Receiver<bool>,
) -> GracefulShutdown
where
    H: Fn(Request<Incoming>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Response<ProxyBody>> + Send + 'static,
{
    let graceful = GracefulShutdown::new();
    let slots = Arc::new(Semaphore::new(max_connections));
    let mut backoff = Duration::from_millis(10);
    loop {
        let permit = tokio::select! {
            p = slots.clone().acquire_owned() => p.expect("semaphore never closed"),
            _ = stopped(&mut stop) => break,
        };
        let (tcp, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(c) => { backoff = Duration::from_millis(10); c }
                Err(e) => {
                    // EMFILE and friends: back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(1));
                    continue;
                }
            },
            _ = stopped(&mut stop) => break,
        };
        let _ = tcp.set_nodelay(true);
        let h = handler.clone();
        let watcher = graceful.watcher();
        let acceptor = tls.as_ref().map(|t| t.acceptor());
        tokio::spawn(async move {
            // The permit is held until the connection completes.
            let _permit = permit;
            match acceptor {
                None => serve_one(TokioIo::new(tcp), peer, None, h, watcher).await,
                Some(acceptor) => {
                    let tls =
                        match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                            Ok(Ok(s)) => s,
                            Ok(Err(e)) => {
                                // A wrong CA, an expired certificate, a missing client certificate,
                                // plain HTTP on the TLS port: refused in the handshake.
                                tracing::debug!(%peer, error = %e, "TLS handshake refused");
                                return;
                            }
                            Err(_) => {
                                tracing::debug!(%peer, "TLS handshake timed out");
                                return;
                            }
                        };
                    let cert = crate::tls::client_cert_digest(tls.get_ref().1).map(ClientCert);
                    serve_one(TokioIo::new(tls), peer, cert, h, watcher).await
                }
            }
        });
    }
    graceful
}

/// A TLS handshake must complete within this.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

async fn serve_one<I, H, F>(
    io: I,
    peer: std::net::SocketAddr,
    cert: Option<ClientCert>,
    handler: H,
    watcher: hyper_util::server::graceful::Watcher,
) where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
    H: Fn(Request<Incoming>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Response<ProxyBody>> + Send + 'static,
{
    let svc = service_fn(move |mut req: Request<Incoming>| {
        req.extensions_mut().insert(PeerAddr(peer));
        if let Some(c) = cert {
            req.extensions_mut().insert(c);
        }
        let h = handler.clone();
        async move { Ok::<_, Infallible>(h(req).await) }
    });
    // A client must send its request head within 30 s (slow-loris bound); streams themselves
    // have no timeout.
    let conn = http1::Builder::new()
        .keep_alive(true)
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(Duration::from_secs(30))
        .serve_connection(io, svc);
    if let Err(e) = watcher.watch(conn).await {
        tracing::debug!(error = %e, "client connection ended with an error");
    }
}

async fn stopped(stop: &mut watch::Receiver<bool>) {
    // The guard `wait_for` returns is not Send; drop it inside.
    let _ = stop.wait_for(|s| *s).await.map(|_| ());
}
