//! The doorbell's subscriber (design.md §13, "live via a pub/sub doorbell"): one pub/sub
//! connection per process that wakes the followers of mirrored sessions when the owner writes.
//!
//! Every write script of the owner ends with `SPUBLISH <prefix>:{s}:m:n "<epoch>:<head>"`. A
//! follower ([`super::shared`]'s `follow`) registers the session's channel here ([`Doorbell::ring`])
//! *before* its first read of the record, so a write that lands between that read and the next
//! one rings it; a ring only makes the follower re-read the record now (the stream is the truth,
//! the message is not parsed). The last registration of a channel to go unsubscribes it.
//!
//! The connection is a RESP3 multiplexed connection whose push messages (`smessage`, and the
//! library's `disconnection`) come to this task. When it drops, the task reconnects with backoff,
//! subscribes every registered channel again and wakes every follower once (messages may have
//! been missed meanwhile); while it is down, followers poll fast ([`Doorbell::poll`]).
//!
//! On a Redis Cluster the connection is redis-rs's cluster connection, which subscribes each
//! shard channel on the primary owning its slot; a disconnection of any node is handled as the
//! whole connection's (a new one, every channel subscribed again).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use ::redis::aio::MultiplexedConnection;
use ::redis::cluster::ClusterClientBuilder;
use ::redis::cluster_async::ClusterConnection;
use ::redis::{
    AsyncConnectionConfig, Client, ConnectionInfo, IntoConnectionInfo, ProtocolVersion, PushInfo,
    PushKind, RedisResult, Value,
};
use tokio::sync::{mpsc, oneshot, Notify};

/// How often a follower re-reads its record while the doorbell is not connected.
pub(crate) const FAST_POLL: Duration = Duration::from_millis(100);
/// How often a follower re-reads its record while the doorbell is connected: a safety net only.
const SAFETY_POLL: Duration = Duration::from_secs(1);
/// Test hook (not part of the configuration contract): the safety poll in milliseconds.
const SAFETY_POLL_ENV: &str = "MCP_RESUME_PROXY_FOLLOW_POLL_MS";
/// How long a follower waits for its subscription to be confirmed before its first read.
const SUBSCRIBE_WAIT: Duration = Duration::from_secs(2);
/// Reconnect backoff: first and longest wait.
const BACKOFF: (Duration, Duration) = (Duration::from_millis(100), Duration::from_secs(5));
/// A connection attempt, or a subscription, that takes longer than this has failed.
const TIMEOUT: Duration = Duration::from_secs(5);
/// How often an idle connection is checked with a `PING` (a half-open connection delivers no
/// messages and reports no error).
const PING: Duration = Duration::from_secs(15);

/// The safety poll: [`SAFETY_POLL`] unless the test hook sets it (read once per process).
fn safety_poll() -> Duration {
    static POLL: OnceLock<Duration> = OnceLock::new();
    *POLL.get_or_init(|| {
        std::env::var(SAFETY_POLL_ENV)
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map_or(SAFETY_POLL, Duration::from_millis)
    })
}

/// The registered channels, each with its followers (registration id, what wakes it).
type Channels = HashMap<String, Vec<(u64, Arc<Notify>)>>;

/// A handle to the process's doorbell subscriber. Dropping it stops the subscriber task.
#[derive(Debug)]
pub(crate) struct Doorbell {
    inner: Arc<Inner>,
}

/// What followers and the subscriber task share.
#[derive(Debug)]
struct Inner {
    /// Registered channels and the followers woken by each. A `std` mutex: short critical
    /// sections, no await inside.
    channels: Mutex<Channels>,
    /// Whether the pub/sub connection is up (its channels subscribed).
    connected: AtomicBool,
    /// `mcp_resume_redis_doorbell_up`: `connected`, exported.
    up: prometheus::IntGauge,
    /// Registration ids.
    next: AtomicU64,
    /// To the subscriber task.
    cmds: mpsc::UnboundedSender<Cmd>,
}

/// A request to the subscriber task.
#[derive(Debug)]
enum Cmd {
    /// Subscribe a channel; answered `true` once the server confirmed it.
    Subscribe(String, oneshot::Sender<bool>),
    /// Unsubscribe a channel, unless it was registered again meanwhile.
    Unsubscribe(String),
}

/// One follower's registration on a channel: woken by each message; unregisters on drop.
#[derive(Debug)]
pub(crate) struct Ring {
    inner: Arc<Inner>,
    channel: String,
    id: u64,
    notify: Arc<Notify>,
}

// === impl Doorbell ===

impl Doorbell {
    /// Starts the subscriber task for the Redis at `url`, a single server or (`cluster`) any
    /// node of a Redis Cluster; it connects in the background.
    ///
    /// # Errors
    /// When `url` is not a Redis URL.
    pub(crate) fn start(
        url: &str,
        cluster: bool,
        up: prometheus::IntGauge,
    ) -> RedisResult<Doorbell> {
        let info = url.into_connection_info()?;
        let settings = info
            .redis_settings()
            .clone()
            .set_protocol(ProtocolVersion::RESP3);
        let info = info.set_redis_settings(settings);
        let target = if cluster {
            Target::Cluster(info)
        } else {
            Target::Single(Client::open(info)?)
        };
        let (tx, rx) = mpsc::unbounded_channel();
        let inner = Arc::new(Inner {
            channels: Mutex::new(HashMap::new()),
            connected: AtomicBool::new(false),
            up,
            next: AtomicU64::new(0),
            cmds: tx,
        });
        tokio::spawn(run(Arc::downgrade(&inner), target, rx));
        Ok(Doorbell { inner })
    }

    /// Registers a follower on `channel` and waits (bounded) until the subscription is
    /// confirmed, so that a write after this returns rings the follower.
    pub(crate) async fn ring(&self, channel: String) -> Ring {
        let id = self.inner.next.fetch_add(1, Ordering::Relaxed);
        let notify = Arc::new(Notify::new());
        self.inner
            .lock()
            .entry(channel.clone())
            .or_default()
            .push((id, notify.clone()));
        let (tx, rx) = oneshot::channel();
        if self
            .inner
            .cmds
            .send(Cmd::Subscribe(channel.clone(), tx))
            .is_ok()
        {
            // Not confirmed in time, or refused: the fast poll covers it until a reconnect
            // subscribes every registered channel again.
            match tokio::time::timeout(SUBSCRIBE_WAIT, rx).await {
                Ok(Ok(true)) => {}
                _ => {
                    tracing::debug!(channel = %channel, "the doorbell is not subscribed yet; following by polling")
                }
            }
        }
        Ring {
            inner: self.inner.clone(),
            channel,
            id,
            notify,
        }
    }
}

// === impl Inner ===

impl Inner {
    fn lock(&self) -> std::sync::MutexGuard<'_, Channels> {
        self.channels.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Wakes every follower of `channel`.
    fn wake(&self, channel: &[u8]) {
        let Ok(channel) = std::str::from_utf8(channel) else {
            return;
        };
        if let Some(fs) = self.lock().get(channel) {
            for (_, n) in fs {
                // A permit is kept when the follower is not waiting yet (it is reading).
                n.notify_one();
            }
        }
    }

    /// Wakes every follower (a reconnect or a disconnect: messages may have been missed).
    fn wake_all(&self) {
        for fs in self.lock().values() {
            for (_, n) in fs {
                n.notify_one();
            }
        }
    }
}

// === impl Ring ===

impl Ring {
    /// Completes when the doorbell rang for this channel (or the connection came back).
    pub(crate) async fn rung(&self) {
        self.notify.notified().await;
    }

    /// How long to wait for a ring before re-reading anyway: the safety poll while the doorbell
    /// is connected, [`FAST_POLL`] while it is not.
    pub(crate) fn poll(&self) -> Duration {
        if self.inner.connected.load(Ordering::Acquire) {
            safety_poll()
        } else {
            FAST_POLL
        }
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        let mut chans = self.inner.lock();
        let Some(fs) = chans.get_mut(&self.channel) else {
            return;
        };
        fs.retain(|(id, _)| *id != self.id);
        if fs.is_empty() {
            chans.remove(&self.channel);
            drop(chans);
            let _ = self
                .inner
                .cmds
                .send(Cmd::Unsubscribe(std::mem::take(&mut self.channel)));
        }
    }
}

// === the subscriber task ===

/// Where the subscriber connects.
enum Target {
    /// A single Redis (a primary, behind Sentinel or not).
    Single(Client),
    /// Any node of a Redis Cluster: each channel is subscribed on the primary owning its slot.
    Cluster(ConnectionInfo),
}

/// One pub/sub connection (RESP3: its pushes come to the task's receiver).
enum Sub {
    Single(MultiplexedConnection),
    Cluster(ClusterConnection),
}

impl Target {
    async fn connect(&self, pushes: mpsc::UnboundedSender<PushInfo>) -> RedisResult<Sub> {
        match self {
            Target::Single(client) => {
                let cfg = AsyncConnectionConfig::new()
                    .set_push_sender(pushes)
                    .set_connection_timeout(Some(TIMEOUT))
                    .set_response_timeout(Some(TIMEOUT));
                Ok(Sub::Single(
                    client
                        .get_multiplexed_async_connection_with_config(&cfg)
                        .await?,
                ))
            }
            Target::Cluster(info) => {
                let client = ClusterClientBuilder::new(vec![info.clone()])
                    .use_protocol(ProtocolVersion::RESP3)
                    .push_sender(pushes)
                    .connection_timeout(TIMEOUT)
                    .response_timeout(TIMEOUT)
                    .build()?;
                Ok(Sub::Cluster(client.get_async_connection().await?))
            }
        }
    }
}

impl Sub {
    /// Subscribes (`on`) or unsubscribes one channel: its confirmation is the reply (RESP3).
    async fn set(&mut self, channel: &str, on: bool) -> RedisResult<()> {
        let r = match self {
            Sub::Single(c) => {
                let mut cmd = ::redis::cmd(if on { "SSUBSCRIBE" } else { "SUNSUBSCRIBE" });
                cmd.arg(channel);
                tokio::time::timeout(TIMEOUT, async {
                    cmd.query_async::<Value>(c).await.map(drop)
                })
                .await
            }
            Sub::Cluster(c) => {
                tokio::time::timeout(TIMEOUT, async {
                    if on {
                        c.ssubscribe(channel).await
                    } else {
                        c.sunsubscribe(channel).await
                    }
                })
                .await
            }
        };
        r.unwrap_or_else(|_| Err(timed_out()))
    }

    /// Whether the server still answers.
    async fn ping(&mut self) -> RedisResult<()> {
        let cmd = ::redis::cmd("PING");
        let r = match self {
            Sub::Single(c) => tokio::time::timeout(TIMEOUT, cmd.query_async::<Value>(c)).await,
            Sub::Cluster(c) => tokio::time::timeout(TIMEOUT, cmd.query_async::<Value>(c)).await,
        };
        r.map_or_else(|_| Err(timed_out()), |r| r.map(drop))
    }
}

/// The error of a pub/sub command that took longer than [`TIMEOUT`].
fn timed_out() -> ::redis::RedisError {
    ::redis::RedisError::from((::redis::ErrorKind::Io, "pub/sub command timed out"))
}

/// Connects, subscribes what is registered, relays messages to followers; on a drop, reconnects
/// with backoff. Ends when the [`Doorbell`] is dropped.
async fn run(
    inner: std::sync::Weak<Inner>,
    target: Target,
    mut cmds: mpsc::UnboundedReceiver<Cmd>,
) {
    let mut backoff = BACKOFF.0;
    let mut dropped = false;
    loop {
        let (ptx, mut pushes) = mpsc::unbounded_channel::<PushInfo>();
        let conn = match target.connect(ptx).await {
            Ok(c) => Some(c),
            Err(e) => {
                tracing::debug!(error = %e, "the doorbell's pub/sub connection failed; mirrors poll meanwhile");
                None
            }
        };
        if let Some(mut conn) = conn {
            let registered: Vec<String> = match inner.upgrade() {
                Some(i) => i.lock().keys().cloned().collect(),
                None => return,
            };
            let mut ok = true;
            for ch in &registered {
                if let Err(e) = conn.set(ch, true).await {
                    tracing::debug!(error = %e, "subscribing the doorbell failed");
                    ok = false;
                    break;
                }
            }
            if ok {
                let Some(i) = inner.upgrade() else { return };
                i.connected.store(true, Ordering::Release);
                i.up.set(1);
                if dropped {
                    tracing::info!(
                        channels = registered.len(),
                        "the doorbell's pub/sub connection is back; its channels are subscribed again"
                    );
                }
                // Messages may have been missed while it was down: every follower re-reads.
                i.wake_all();
                drop(i);
                backoff = BACKOFF.0;
                if serve(&inner, &mut conn, &mut cmds, &mut pushes)
                    .await
                    .is_none()
                {
                    return;
                }
                let Some(i) = inner.upgrade() else { return };
                i.connected.store(false, Ordering::Release);
                i.up.set(0);
                // Followers switch to the fast poll now, not after their safety poll.
                i.wake_all();
                tracing::info!("the doorbell's pub/sub connection dropped; reconnecting");
            }
        }
        dropped = true;
        // Back off, answering subscriptions meanwhile (they are made on the reconnect).
        let sleep = tokio::time::sleep(backoff);
        tokio::pin!(sleep);
        loop {
            tokio::select! {
                () = &mut sleep => break,
                cmd = cmds.recv() => match cmd {
                    None => return,
                    Some(Cmd::Subscribe(_, done)) => {
                        let _ = done.send(false);
                    }
                    Some(Cmd::Unsubscribe(_)) => {}
                },
            }
        }
        backoff = (backoff * 2).min(BACKOFF.1);
    }
}

/// Serves one connection until it drops (`Some`) or the doorbell is dropped (`None`).
async fn serve(
    inner: &std::sync::Weak<Inner>,
    conn: &mut Sub,
    cmds: &mut mpsc::UnboundedReceiver<Cmd>,
    pushes: &mut mpsc::UnboundedReceiver<PushInfo>,
) -> Option<()> {
    let mut ping = tokio::time::interval_at(tokio::time::Instant::now() + PING, PING);
    ping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ping.tick() => {
                if let Err(e) = conn.ping().await {
                    tracing::debug!(error = %e, "the doorbell's connection does not answer");
                    return Some(());
                }
            }
            cmd = cmds.recv() => match cmd? {
                Cmd::Subscribe(ch, done) => {
                    let r = conn.set(&ch, true).await;
                    let _ = done.send(r.is_ok());
                    if let Err(e) = r {
                        tracing::debug!(error = %e, "subscribing the doorbell failed");
                        return Some(());
                    }
                }
                Cmd::Unsubscribe(ch) => {
                    let again = inner.upgrade()?.lock().contains_key(&ch);
                    if !again {
                        if let Err(e) = conn.set(&ch, false).await {
                            tracing::debug!(error = %e, "unsubscribing the doorbell failed");
                            return Some(());
                        }
                    }
                }
            },
            push = pushes.recv() => {
                let Some(push) = push else { return Some(()) };
                match push.kind {
                    PushKind::Disconnection => return Some(()),
                    PushKind::SMessage | PushKind::Message => {
                        if let Some(Value::BulkString(ch)) = push.data.first() {
                            inner.upgrade()?.wake(ch);
                        }
                    }
                    PushKind::SUnsubscribe => {
                        // The server drops a shard channel's subscribers when its slot moves (a
                        // Cluster's resharding or failover): a channel still registered is
                        // subscribed again (on the slot's new owner) and its followers re-read.
                        let Some(Value::BulkString(ch)) = push.data.first() else { continue };
                        let Ok(ch) = std::str::from_utf8(ch) else { continue };
                        let i = inner.upgrade()?;
                        if i.lock().contains_key(ch) {
                            let ch = ch.to_string();
                            if let Err(e) = conn.set(&ch, true).await {
                                tracing::debug!(error = %e, "subscribing the doorbell again failed");
                                return Some(());
                            }
                            i.wake(ch.as_bytes());
                        }
                    }
                    _ => {}
                }
            }
        }
    }
}
