//! Shutdown: the signal future and the drain signal every long-lived task watches.
//!
//! An HTTP/1 graceful shutdown waits for in-flight responses, and an SSE response never finishes on
//! its own, so client streams watch the drain signal and end themselves; clients then reconnect
//! (to another replica or after the restart) and resume from the log.

use tokio::sync::watch;

/// Completes on SIGTERM or SIGINT, whichever comes first, with a log line.
///
/// The handlers are installed when this is *called* (inside the runtime), not when the future is
/// first polled: a signal that arrives while the proxy is still starting — after `/readyz` turned
/// 200 but before the caller awaits this — is caught and drains, instead of killing the process
/// with the default action (found by the crash harness: an orchestrator's SIGTERM right after
/// readiness).
pub fn signal() -> impl std::future::Future<Output = ()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("SIGINT handler");
    async move {
        let name = tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
        };
        tracing::info!(signal = name, "shutdown requested; draining");
    }
}

/// The drain signal: `false` while serving, `true` once draining.
#[derive(Clone, Debug)]
pub struct Drain {
    tx: watch::Sender<bool>,
}

impl Drain {
    /// A new, not yet signalled drain.
    pub fn new() -> Self {
        Self {
            tx: watch::channel(false).0,
        }
    }

    /// A receiver that changes once, when draining starts.
    pub fn watch(&self) -> watch::Receiver<bool> {
        self.tx.subscribe()
    }

    /// Starts draining.
    pub fn start(&self) {
        self.tx.send_replace(true);
    }
}

impl Default for Drain {
    fn default() -> Self {
        Self::new()
    }
}
