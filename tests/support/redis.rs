//! A real `redis-server` (Debian's package, installed by `scripts/install-peers`) on loopback, on a
//! port below 32768, with its data in a temporary directory: started, SIGKILLed, restarted.

#![allow(dead_code)]

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use super::{port, wait_port, Proc, WAIT};

/// How the server persists.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Persist {
    /// `appendonly yes`, `appendfsync always`: a reply leaves after its write is fsynced.
    AofAlways,
    /// `appendonly yes`, `appendfsync everysec` (Redis's default fsync policy).
    AofEverysec,
    /// No AOF, no snapshots: a restart loses everything.
    None,
}

/// A running `redis-server`.
pub struct RedisServer {
    pub port: u16,
    pub persist: Persist,
    dir: tempfile::TempDir,
    proc: Option<Proc>,
}

/// The `redis-server` binary: fails (never skips) when it is missing.
pub fn redis_server_bin() -> PathBuf {
    for p in ["/usr/bin/redis-server", "/usr/local/bin/redis-server"] {
        let p = PathBuf::from(p);
        if p.exists() {
            return p;
        }
    }
    panic!("test peer missing: redis-server — run scripts/install-peers");
}

impl RedisServer {
    /// Starts a server persisting as `persist`, and waits until it accepts.
    pub async fn start(persist: Persist) -> RedisServer {
        let mut s = RedisServer {
            port: port(),
            persist,
            dir: tempfile::tempdir().unwrap(),
            proc: None,
        };
        s.launch().await;
        s
    }

    async fn launch(&mut self) {
        let mut cmd = Command::new(redis_server_bin());
        cmd.arg("--port")
            .arg(self.port.to_string())
            .args(["--bind", "127.0.0.1", "--protected-mode", "yes"])
            .arg("--dir")
            .arg(self.dir.path())
            .args(["--save", "", "--daemonize", "no", "--loglevel", "warning"])
            .args(["--maxmemory-policy", "noeviction"]);
        match self.persist {
            Persist::AofAlways => cmd.args(["--appendonly", "yes", "--appendfsync", "always"]),
            Persist::AofEverysec => cmd.args(["--appendonly", "yes", "--appendfsync", "everysec"]),
            Persist::None => cmd.args(["--appendonly", "no"]),
        };
        self.proc = Some(Proc::spawn("redis-server", cmd));
        tokio::time::timeout(WAIT, wait_port(self.port))
            .await
            .expect("redis-server listens");
        // Accepting is not yet serving: a restart with an AOF loads it first (`LOADING`).
        let client = redis::Client::open(self.url()).unwrap();
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            if let Ok(mut c) = client.get_multiplexed_async_connection().await {
                let pong: redis::RedisResult<String> = redis::cmd("PING").query_async(&mut c).await;
                if pong.is_ok() {
                    return;
                }
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "redis-server never served"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// SIGKILL (the AOF stays as the kill left it).
    pub fn kill9(&mut self) {
        if let Some(mut p) = self.proc.take() {
            p.kill();
        }
    }

    /// SIGKILL, then start again on the same port and directory.
    pub async fn restart(&mut self) {
        self.kill9();
        self.launch().await;
    }

    /// A plain connection, for what a test does to the server itself (`FLUSHALL`, `CONFIG`).
    pub async fn admin(&self) -> redis::aio::MultiplexedConnection {
        redis::Client::open(self.url())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap()
    }
}

/// The bytes the Redis nodes at `urls` have sent their clients so far (`INFO stats`
/// `total_net_output_bytes`; the reply to this call counts, once it is sent, in the next).
pub async fn sent_bytes(urls: &[String]) -> u64 {
    let mut total = 0;
    for url in urls {
        let mut c = redis::Client::open(url.as_str())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        let info: String = redis::cmd("INFO")
            .arg("stats")
            .query_async(&mut c)
            .await
            .unwrap();
        total += info
            .lines()
            .find_map(|l| l.strip_prefix("total_net_output_bytes:"))
            .and_then(|v| v.trim().parse::<u64>().ok())
            .expect("INFO stats has total_net_output_bytes");
    }
    total
}

/// A port `p` below 22768 with its cluster bus port `p + 10000` free too (both below 32768).
fn cluster_port() -> u16 {
    loop {
        let p = port();
        if p < 22768 && std::net::TcpListener::bind(("127.0.0.1", p + 10000)).is_ok() {
            return p;
        }
    }
}

/// A Redis Cluster of three primaries on loopback (no replicas), each with `appendfsync always`.
pub struct RedisCluster {
    pub ports: Vec<u16>,
    dirs: Vec<tempfile::TempDir>,
    procs: Vec<Proc>,
}

impl RedisCluster {
    /// Starts three nodes, joins them (`redis-cli --cluster create`) and waits for `cluster_state:ok`.
    pub async fn start() -> RedisCluster {
        let mut c = RedisCluster {
            ports: Vec::new(),
            dirs: Vec::new(),
            procs: Vec::new(),
        };
        for _ in 0..3 {
            let port = cluster_port();
            let dir = tempfile::tempdir().unwrap();
            let mut cmd = Command::new(redis_server_bin());
            cmd.arg("--port")
                .arg(port.to_string())
                .args(["--bind", "127.0.0.1", "--protected-mode", "yes"])
                .arg("--dir")
                .arg(dir.path())
                .args(["--save", "", "--daemonize", "no", "--loglevel", "warning"])
                .args(["--appendonly", "yes", "--appendfsync", "always"])
                .args(["--cluster-enabled", "yes", "--cluster-node-timeout", "2000"]);
            c.procs.push(Proc::spawn("redis-server (cluster)", cmd));
            c.ports.push(port);
            c.dirs.push(dir);
        }
        for p in &c.ports {
            tokio::time::timeout(WAIT, wait_port(*p))
                .await
                .expect("cluster node listens");
        }
        let cli = ["/usr/bin/redis-cli", "/usr/local/bin/redis-cli"]
            .into_iter()
            .find(|p| std::path::Path::new(p).exists())
            .expect("test peer missing: redis-cli (redis-tools) — run scripts/install-peers");
        let mut create = Command::new(cli);
        create.args(["--cluster", "create"]);
        for p in &c.ports {
            create.arg(format!("127.0.0.1:{p}"));
        }
        create.args(["--cluster-replicas", "0", "--cluster-yes"]);
        let out = create.output().expect("redis-cli runs");
        assert!(
            out.status.success(),
            "redis-cli --cluster create failed: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let deadline = tokio::time::Instant::now() + WAIT;
        for p in &c.ports {
            let client = redis::Client::open(format!("redis://127.0.0.1:{p}")).unwrap();
            let mut con = client.get_multiplexed_async_connection().await.unwrap();
            loop {
                let info: String = redis::cmd("CLUSTER")
                    .arg("INFO")
                    .query_async(&mut con)
                    .await
                    .unwrap();
                if info.lines().any(|l| l.trim() == "cluster_state:ok") {
                    break;
                }
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "cluster never ok: {info}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        c
    }

    /// The URL of node `i`.
    pub fn url(&self, i: usize) -> String {
        format!("redis://127.0.0.1:{}", self.ports[i])
    }
}

/// What [`open_log`] opens: a `Log` on Redis at `url`, as the proxy opens it for replica
/// `replica` with its data dir (identity keys) at `dir`.
pub struct LogOn<'a> {
    pub url: &'a str,
    pub prefix: &'a str,
    pub replica: &'a str,
    pub dir: &'a std::path::Path,
    pub max_events: u64,
    pub lease_ms: u64,
    pub durability: mcp_resume_proxy::config::Durability,
}

/// Opens the shared log as [`LogOn`] says (`retain_secs` 600, no advertised address).
pub async fn open_log(o: LogOn<'_>) -> std::sync::Arc<mcp_resume_proxy::log::Log> {
    use mcp_resume_proxy::config::{Backend, LogConfig};
    use mcp_resume_proxy::log::{Log, SharedSettings};
    let mut cfg = LogConfig {
        dir: o.dir.to_path_buf(),
        max_events_per_session: o.max_events,
        durability: o.durability,
        backend: Backend::Redis,
        ..LogConfig::default()
    };
    cfg.redis.url = o.url.to_string();
    cfg.redis.key_prefix = o.prefix.to_string();
    let keys = mcp_resume_proxy::identity::Keyring::load_or_create(o.dir).unwrap();
    let settings = SharedSettings {
        replica_id: o.replica.to_string(),
        retain_secs: 600,
        lease_ms: o.lease_ms,
        advertise: String::new(),
        keys: Some(keys),
    };
    let metrics = mcp_resume_proxy::metrics::Metrics::new();
    Log::open_shared(&cfg, &settings, metrics).await.unwrap().0
}
