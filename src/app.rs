//! Wiring: open the log (recovering it), build the metrics and the registry, bind the listeners,
//! spawn the tasks — and take it all down again in the right order.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::admin::Admin;
use crate::config::{Backend, Config};
use crate::domain::EndReason;
use crate::facade::modern::{Modern, TaskSlots};
use crate::facade::{Ctx, FaceConfig};
use crate::listener;
use crate::log::{Health, Log, Recovery, SharedSettings};
use crate::metrics::Metrics;
use crate::session::Registry;
use crate::shutdown::Drain;
use crate::stream::StreamEnv;
use crate::upstream::UpstreamSettings;

// `config` is a leaf: it keeps its own copy of the log's event bound, held equal here.
const _: () = assert!(crate::config::MAX_EVENT_BYTES == crate::log::MAX_EVENT_BYTES);

/// A failure to start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// A listener could not be bound.
    #[error("cannot bind {what} {addr}: {source}")]
    Bind {
        /// Which listener.
        what: &'static str,
        /// Address.
        addr: String,
        /// Cause.
        source: std::io::Error,
    },
    /// TLS files are not usable: the listener's, or the upstream's roots.
    #[error("{0}")]
    Tls(#[source] crate::tls::TlsError),
    /// The log could not be opened.
    #[error("cannot open the log in {dir}: {source}")]
    Log {
        /// Directory.
        dir: String,
        /// Cause.
        source: crate::error::Error,
    },
}

/// Why [`run`] returned with an error.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The proxy could not start.
    #[error(transparent)]
    Start(#[from] StartError),
    /// The log's storage failed for good while serving (I/O error, read-only file system, failed
    /// sync): the proxy ended what it could and stopped, for the orchestrator to restart it.
    #[error("the log's storage failed; stopped (the next start recovers the log)")]
    StorageFailed,
}

impl RunError {
    /// The process exit code: 1 for a failed start, 74 (`EX_IOERR`) for failed storage.
    pub fn exit_code(&self) -> u8 {
        match self {
            RunError::Start(StartError::Log {
                source: crate::error::Error::Store(e),
                ..
            }) if e.raw_os_error().is_some() => 74,
            // A setting of the shared log's server that cannot keep the configured durability is
            // a configuration error, like a bad key.
            RunError::Start(StartError::Log {
                source: crate::error::Error::Store(crate::error::StoreError::Durability(_)),
                ..
            }) => 64,
            RunError::Start(_) => 1,
            RunError::StorageFailed => 74,
        }
    }
}

/// A running proxy.
pub struct Running {
    /// Client listener address.
    pub addr: SocketAddr,
    /// Admin listener address.
    pub admin_addr: SocketAddr,
    /// The client listener speaks TLS.
    pub tls: bool,
    /// What recovery found.
    pub recovery: Recovery,
    /// Metrics (for tests and the demo).
    pub metrics: Metrics,
    /// The registry (for tests and the demo).
    pub registry: Arc<Registry>,
    grace: Duration,
    ready: Arc<AtomicBool>,
    health: watch::Receiver<Health>,
    stop: watch::Sender<bool>,
    drain: Drain,
    client: JoinHandle<hyper_util::server::graceful::GracefulShutdown>,
    admin: JoinHandle<hyper_util::server::graceful::GracefulShutdown>,
    internal: Option<JoinHandle<hyper_util::server::graceful::GracefulShutdown>>,
    janitor: JoinHandle<()>,
    modern_janitor: JoinHandle<()>,
    log: Arc<Log>,
}

async fn bind(what: &'static str, addr: &str) -> Result<TcpListener, StartError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| StartError::Bind {
            what,
            addr: addr.to_string(),
            source,
        })
}

/// Starts the proxy: admin first (so `/healthz` answers during recovery), then the log, then the
/// client listener; ready once all three are up.
///
/// # Errors
/// [`StartError`] when a listener cannot be bound or the log cannot be opened.
pub async fn start(cfg: Config) -> Result<Running, StartError> {
    let metrics = Metrics::new();
    let ready = Arc::new(AtomicBool::new(false));
    let (stop, stop_rx) = watch::channel(false);

    let admin_listener = bind("admin listener", &cfg.admin.addr).await?;
    let admin_addr = admin_listener.local_addr().expect("bound");
    let store_ok = Arc::new(AtomicBool::new(true));
    let admin = Admin {
        metrics: metrics.clone(),
        ready: ready.clone(),
        store_ok: store_ok.clone(),
    };
    let admin = tokio::spawn(listener::serve(
        admin_listener,
        64,
        None,
        move |req| admin.clone().handle(req),
        stop_rx.clone(),
    ));

    let keys = match &cfg.auth.key_file {
        Some(f) => Some(
            crate::identity::Keyring::load_file(f).map_err(|r| StartError::Log {
                dir: cfg.log.dir.display().to_string(),
                source: crate::error::StoreError::Corrupt(format!("auth.key_file: {r}")).into(),
            })?,
        ),
        None => None,
    };
    let opened = match cfg.log.backend {
        Backend::Local => Log::open_keyed(&cfg.log, keys, metrics.clone()).await,
        Backend::Redis => {
            let settings = SharedSettings {
                replica_id: cfg.cluster.replica_id.clone(),
                // A task's log outlives the session retention when its TTL is longer.
                retain_secs: cfg.sessions.retain_ended_secs.max(cfg.tasks.ttl_secs),
                lease_ms: cfg.cluster.lease_ms,
                advertise: cfg.cluster.advertised(),
                keys,
            };
            Log::open_shared(&cfg.log, &settings, metrics.clone()).await
        }
    };
    let (log, recovery, interrupted) = opened.map_err(|source| StartError::Log {
        dir: cfg.log.dir.display().to_string(),
        source,
    })?;
    tracing::info!(?recovery, dir = %cfg.log.dir.display(), "log open");
    // Readiness follows the log's health from now on (503 within a second of a failed write).
    let health = log.health();
    tokio::spawn(follow_health(health.clone(), store_ok));

    let listener = bind("client listener", &cfg.listen.addr).await?;
    let addr = listener.local_addr().expect("bound");
    let upstream = UpstreamSettings::from_config(&cfg.upstream).map_err(StartError::Tls)?;
    let registry = Registry::new(
        cfg.sessions.clone(),
        upstream.clone(),
        log.clone(),
        metrics.clone(),
    );
    // The sessions the previous run left live are ended before anyone can resume them.
    registry.end_interrupted(interrupted).await;
    tokio::spawn(registry.clone().watch_store_failures());
    let drain = Drain::new();
    let env = StreamEnv {
        log: log.clone(),
        metrics: metrics.clone(),
        keepalive: cfg.sessions.keepalive(),
        drain: drain.watch(),
    };
    let sessions = registry.clone();
    let slots = TaskSlots {
        max: cfg.sessions.max_sessions,
        sessions: Arc::new(move || sessions.held()),
        running: registry.task_counter(),
    };
    let modern = Modern::new(cfg.modern.clone(), cfg.tasks.clone(), slots, upstream, &env);
    let modern_janitor = tokio::spawn(modern.clone().janitor(stop_rx.clone()));
    let faces = FaceConfig {
        listen: cfg.listen.clone(),
        legacy: cfg.legacy.clone(),
        streamable: cfg.streamable.clone(),
        auth: cfg.auth.clone(),
    };
    let mut ctx = Ctx::new(faces, registry.clone(), env, modern);
    // `cluster.listen`: requests for sessions live on another replica are forwarded there, and
    // this replica's own sessions are served to the others' forwards.
    let mut internal = None;
    if !cfg.cluster.listen.is_empty() {
        let secret = cfg
            .cluster
            .secret_file
            .as_deref()
            .map(crate::keyfile::read)
            .transpose()
            .map_err(|r| StartError::Log {
                dir: cfg.log.dir.display().to_string(),
                source: crate::error::StoreError::Corrupt(format!("cluster.secret_file: {r}"))
                    .into(),
            })?
            .unwrap_or_default();
        let timeout = Duration::from_millis(cfg.cluster.forward_timeout_ms);
        ctx = ctx.with_forwarder(Arc::new(crate::facade::forward::Forwarder::new(
            &secret,
            timeout,
            metrics.clone(),
        )));
        internal = Some(bind("internal listener", &cfg.cluster.listen).await?);
    }
    let ctx = Arc::new(ctx);
    let internal = internal.map(|l| {
        let ctx = ctx.clone();
        tokio::spawn(listener::serve(
            l,
            cfg.listen.max_connections,
            None,
            move |req| crate::facade::mcp::internal(ctx.clone(), req),
            stop_rx.clone(),
        ))
    });
    // Checked by the config's validation; a file that broke since is an error to start with.
    let tls = crate::tls::ServerTls::load(&cfg.tls).map_err(StartError::Tls)?;
    if let Some(t) = &tls {
        tokio::spawn(t.clone().watch(stop_rx.clone()));
    }
    let client = tokio::spawn(listener::serve(
        listener,
        cfg.listen.max_connections,
        tls.clone(),
        move |req| crate::facade::mcp::route(ctx.clone(), req),
        stop_rx.clone(),
    ));
    let janitor = tokio::spawn(registry.clone().janitor(stop_rx));
    ready.store(true, Ordering::Release);
    tracing::info!(%addr, %admin_addr, tls = tls.is_some(), mutual_tls = tls.as_ref().is_some_and(|t| t.mutual), "listening");
    Ok(Running {
        addr,
        admin_addr,
        tls: tls.is_some(),
        recovery,
        metrics,
        registry,
        grace: Duration::from_secs(cfg.shutdown.grace_secs),
        ready,
        health,
        stop,
        drain,
        client,
        admin,
        internal,
        janitor,
        modern_janitor,
        log,
    })
}

/// Keeps `store_ok` in step with the log's health.
async fn follow_health(mut health: watch::Receiver<Health>, store_ok: Arc<AtomicBool>) {
    loop {
        let h = *health.borrow_and_update();
        store_ok.store(h == Health::Ok, Ordering::Release);
        if h != Health::Ok {
            tracing::error!(health = ?h, "log storage failing: not ready");
        }
        if health.changed().await.is_err() {
            return;
        }
    }
}

impl Running {
    /// Completes when the log's storage has failed for good (the process must stop).
    pub async fn storage_failed(&self) {
        let mut h = self.health.clone();
        let _ = h.wait_for(|h| *h == Health::Failed).await;
    }

    /// Drains and stops: not ready; stop accepting; end sessions (in-flight requests answered,
    /// upstreams closed); end client streams once they have delivered those answers; wait for
    /// connections (bounded by the grace period); flush the log and mark it clean.
    pub async fn stop(self) {
        self.stop_with(EndReason::Shutdown).await;
    }

    async fn stop_with(self, reason: EndReason) {
        self.ready.store(false, Ordering::Release);
        let _ = self.stop.send(true);
        let deadline = tokio::time::Instant::now() + self.grace;
        // Sessions first: their -32091 answers and end markers are then logged before any stream
        // is told to drain, so a connected client gets its answer rather than a cut stream (I6).
        let sessions = self.registry.end_all(reason);
        if tokio::time::timeout_at(deadline, sessions).await.is_err() {
            tracing::warn!("grace period over while ending sessions");
        }
        self.drain.start();
        for task in [Some(self.client), Some(self.admin), self.internal]
            .into_iter()
            .flatten()
        {
            if let Ok(graceful) = task.await {
                if tokio::time::timeout_at(deadline, graceful.shutdown())
                    .await
                    .is_err()
                {
                    tracing::warn!("grace period over with connections still open");
                }
            }
        }
        let _ = self.janitor.await;
        let _ = self.modern_janitor.await;
        match self.log.close().await {
            Ok(()) => tracing::info!("log flushed and marked clean"),
            Err(e) => tracing::error!(error = %e, "final log flush failed"),
        }
    }
}

/// Runs the proxy until `shutdown` completes, then drains. If the log's storage fails for good
/// first, ends what it can, stops, and reports it (the caller exits with 74).
///
/// # Errors
/// [`RunError`] when it cannot start, or when storage failed.
pub async fn run(cfg: Config, shutdown: impl Future<Output = ()>) -> Result<(), RunError> {
    let running = start(cfg).await?;
    println!(
        "mcp-resume-proxy listening on {}://{} (admin http://{})",
        if running.tls { "https" } else { "http" },
        running.addr,
        running.admin_addr
    );
    let failed = tokio::select! {
        _ = shutdown => false,
        _ = running.storage_failed() => true,
    };
    if failed {
        tracing::error!("log storage failed: ending sessions and stopping (the next start recovers the log and answers what was in flight)");
        running.stop_with(EndReason::StoreError).await;
        return Err(RunError::StorageFailed);
    }
    running.stop().await;
    Ok(())
}
