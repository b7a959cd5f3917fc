//! Adversarial review 19: the log writer's 8 MiB byte-bounded queue and 2 MiB turns (`be31b9e`)
//! under load through the proxy binary, on a data dir whose device is throttled (blk-throttle on
//! a loop device, as `tests/memory.rs`): the peak RSS (`VmHWM`) stays within the bound the queue
//! is meant to give, RSS stays flat once the queue is full, and the flood keeps reaching the disk
//! (no hang) — with events larger than the queue itself, and with sixteen sessions at once.
//! Root only (loop device, mount, cgroup v1 blkio).

mod support;

use std::time::Duration;

use support::slow_disk::{reset_peak, status_kib, SlowDisk};
use support::*;

/// Allowed above what the bounds account for (runtime, hyper, allocator arenas), as
/// `tests/memory.rs`'s `SLACK`.
const SLACK: u64 = 48 << 20;
const MIB: u64 = 1 << 20;

/// Floods `sessions` legacy sessions with `count` events of `size` bytes on a disk throttled to
/// `bps` (0: not throttled), their clients `connected` and reading nothing or gone once the flood
/// starts; samples RSS every second for `secs` s; returns (base, peak, samples in bytes, events
/// logged).
#[allow(clippy::too_many_arguments)]
async fn flood_on_a_slow_disk(
    connected: bool,
    durability: &str,
    sessions: usize,
    count: u64,
    size: u64,
    bps: u64,
    secs: u64,
    extra: &[(&str, &str)],
) -> (u64, u64, Vec<u64>, f64) {
    use mcp_resume_proxy::demo::upstream::{Upstream, UpstreamOptions};
    use serde_json::json;
    let disk = SlowDisk::new("2G");
    let up = Upstream::spawn(UpstreamOptions::default()).await.unwrap();
    let data = disk.dir.join("data");
    let durability = format!("durability = \"{durability}\"");
    let mut cfg = vec![
        ("[log]", "max_total_bytes = 536870912"),
        ("[log]", durability.as_str()),
    ];
    cfg.extend_from_slice(extra);
    let mut proxy = ProxyProc::start(&up.sse_url(), &data, &cfg).await;
    let pid = proxy.proc.pid();
    let mut streams = Vec::new();
    for _ in 0..sessions {
        streams.push(legacy_session(&proxy.base()).await);
    }
    if bps > 0 {
        disk.throttle(bps);
    }
    let metrics = proxy.metrics_url();
    let logged_before = metric(&metrics, "mcp_resume_events_logged_total").await;
    reset_peak(pid);
    let base = status_kib(pid, "VmRSS");
    for (_, url, _) in &streams {
        let flood = call(
            2,
            "emit",
            json!({"count": count, "rate_per_sec": 0, "size": size}),
            None,
        );
        assert_eq!(post(url, &flood).await.0, 202);
    }
    if !connected {
        // No client stream at all (the session stays, resumable): what the log side holds.
        streams.clear();
    }
    let mut samples = Vec::new();
    for _ in 0..secs {
        tokio::time::sleep(Duration::from_secs(1)).await;
        samples.push(status_kib(pid, "VmRSS"));
    }
    let peak = status_kib(pid, "VmHWM");
    let logged = metric(&metrics, "mcp_resume_events_logged_total").await - logged_before;
    proxy.proc.kill();
    drop(streams);
    (base, peak, samples, logged)
}

fn report(what: &str, base: u64, peak: u64, bound: u64, samples: &[u64], logged: f64) {
    eprintln!(
        "{what}: base {} MiB, peak {} MiB (+{} MiB, bound +{} MiB); {logged} events logged; RSS {}",
        base >> 20,
        peak >> 20,
        peak.saturating_sub(base) >> 20,
        bound >> 20,
        samples
            .iter()
            .enumerate()
            .map(|(i, s)| format!("{}s: {}", i + 1, s >> 20))
            .collect::<Vec<_>>()
            .join(", ")
    );
}

/// One session's events of 12 MiB (past the 8 MiB queue: each takes every permit and goes
/// alone, in a turn of its own) on a 4 MiB/s disk, both durability modes, its client gone once
/// the flood starts (a connected client that reads nothing holds more: see
/// [`adv19_a_stalled_client_of_big_events_holds_a_few_of_them`]): the flood keeps
/// reaching the disk (the big events do not wedge the queue), and the peak stays within one
/// event in the channel, one in the writer's turn with its encoding, one in the session's window
/// (it keeps at least one), two for the upstream read being decoded (`upstream.max_event_bytes`
/// 20 MiB), plus `SLACK`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adv19_events_past_the_queue_on_a_slow_disk_stay_within_the_bound() {
    const SIZE: u64 = 12 << 20;
    // ADV19_SECS / ADV19_MODES: a longer run, one mode (exploring, not the default).
    let secs: u64 = std::env::var("ADV19_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    let modes = std::env::var("ADV19_MODES").unwrap_or_else(|_| "fsync,relaxed".into());
    for durability in modes.split(',') {
        let (base, peak, samples, logged) = flood_on_a_slow_disk(
            false,
            durability,
            1,
            200,
            SIZE,
            4 * MIB,
            secs,
            &[("[upstream]", "max_event_bytes = 20971520")],
        )
        .await;
        let bound = 4 * SIZE + 2 * (20 * MIB) + SLACK;
        report(
            &format!("{durability}, 12 MiB events at 4 MiB/s"),
            base,
            peak,
            bound,
            &samples,
            logged,
        );
        // Two: the second event past the queue's bound goes through only once the first has
        // drained the channel and been written, so this is no wedge. (Three were asked for at
        // first: a CI run under load logged 2 in 16 s, the flood starting 5 s late.)
        assert!(
            logged >= 2.0,
            "{durability}: {logged} events logged in {secs} s (a hang?)"
        );
        assert!(
            peak <= base + bound,
            "{durability}: peak RSS {} MiB over base {} MiB + {} MiB",
            peak >> 20,
            base >> 20,
            bound >> 20
        );
        // (No flatness check here: 12-24 MiB allocations come and go, RSS swings by a few
        // events, e.g. 86-134 MiB from 14 s to 40 s, relaxed; the peak bound is the claim.)
    }
}

/// Sixteen sessions flood 256 KiB events on a 1 MiB/s disk (`fsync`): the peak stays within the
/// queue (8 MiB), a turn and its encoding (2 × 2 MiB), and per session its window (512 KiB) and
/// one upstream read being queued (4 MiB, `upstream.max_event_bytes`), plus `SLACK`; RSS is flat
/// after the first seconds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adv19_sixteen_sessions_on_a_slow_disk_keep_rss_flat() {
    const SESSIONS: u64 = 16;
    let (base, peak, samples, logged) = flood_on_a_slow_disk(
        true,
        "fsync",
        SESSIONS as usize,
        4000,
        256 << 10,
        MIB,
        14,
        &[],
    )
    .await;
    let bound = 8 * MIB + 2 * 2 * MIB + SESSIONS * (MIB / 2 + 4 * MIB) + SLACK;
    report(
        "16 sessions, 256 KiB events at 1 MiB/s",
        base,
        peak,
        bound,
        &samples,
        logged,
    );
    assert!(logged >= 8.0, "{logged} events logged in 14 s (a hang?)");
    assert!(
        peak <= base + bound,
        "peak RSS {} MiB over base {} MiB + {} MiB",
        peak >> 20,
        base >> 20,
        bound >> 20
    );
    let (mid, end) = (samples[4], *samples.last().unwrap());
    assert!(
        end <= mid + 16 * MIB,
        "RSS grew from {} MiB at 5 s to {} MiB at 14 s",
        mid >> 20,
        end >> 20
    );
}

/// A client stream that stopped reading held up to `CHANNEL_FRAMES` (8) packs between its
/// cursor task and the connection, counted in packs, and the cursor task a read batch of up to
/// 256 events besides, of any size: src/stream.rs said "about 128 KiB at most for a client that
/// stopped reading", which held only while events were smaller than a pack (16 KiB). Sixteen
/// sessions of 3.9 MiB events (under the default `upstream.max_event_bytes`, 4 MiB), clients
/// connected and reading nothing, disk not throttled (`relaxed`): found by the adversary of
/// round 9 at 995 MiB after 20 s and still growing. Now the channel is bounded in bytes (one pack
/// always fits) and a stream's read stops after about `READ_BYTES` (1 MiB) or one large event,
/// so a stalled stream holds about four events: the one read, its frame waiting for room, the
/// frame queued, and the frame the connection is writing. The bound: the writer's queue, a turn
/// and its encoding, and per session its window (one event), the upstream read of the next event
/// (a buffer grown to its size, and its own copy once whole: 2 × 4 MiB), those four frames and
/// two 4 MiB chunks the allocator keeps (freed large chunks stay in glibc's arenas), + `SLACK`.
/// Measured (debug build, 2 cores): +507, +526 and +564 MiB, flat from about the 8th second,
/// against a bound of +636 MiB. And flat: the old code was still growing at the 20th second.
/// Since payloads of 64 KiB and more go to the connection as they are (shared with the read,
/// not copied into a pack: `SHARED_PAYLOAD_BYTES` in src/stream.rs), +419 and +474 MiB.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adv19_a_stalled_client_of_big_events_holds_a_few_of_them() {
    const SESSIONS: u64 = 16;
    const SIZE: u64 = 4_000_000;
    let (base, peak, samples, logged) =
        flood_on_a_slow_disk(true, "relaxed", SESSIONS as usize, 40, SIZE, 0, 20, &[]).await;
    let bound = 8 * MIB
        + 2 * 2 * MIB
        + SESSIONS * (4 * MIB + 2 * 4 * MIB + 4 * 4 * MIB + 2 * 4 * MIB)
        + SLACK;
    report(
        "16 stalled clients, 3.9 MiB events, disk not throttled",
        base,
        peak,
        bound,
        &samples,
        logged,
    );
    assert!(
        peak <= base + bound,
        "peak RSS {} MiB over base {} MiB + {} MiB",
        peak >> 20,
        base >> 20,
        bound >> 20
    );
    // Flat once every stream has stalled: what grows with time is a queue without a bound.
    let (mid, end) = (samples[9], *samples.last().unwrap());
    assert!(
        end <= mid + 64 * MIB,
        "RSS grew from {} MiB at 10 s to {} MiB at 20 s",
        mid >> 20,
        end >> 20
    );
}

/// With `log.backend = "redis"`, a stream reads from Redis what its session's window no longer
/// holds, and its first read (a resume's) asked for up to 256 events of any size: eight sessions
/// of 24 events of 3.9 MiB each, logged with their clients gone, then each resumed from its
/// start by a client that reads nothing. Now `Shared::read_within` stops at about `READ_BYTES`
/// (1 MiB) or one large entry, in what Redis sends and in what the stream keeps. The bound: per
/// session, the read's reply and its parsed events (2 × (1 MiB + one event)), the four frames of
/// a stalled stream and two 4 MiB chunks the allocator keeps, + `SLACK`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adv19_resumes_of_big_events_on_redis_read_a_few_of_them() {
    use mcp_resume_proxy::demo::upstream::{Upstream, UpstreamOptions};
    use serde_json::json;
    use support::redis::{Persist, RedisServer};
    const SESSIONS: u64 = 8;
    const COUNT: u64 = 24;
    const SIZE: u64 = 4_000_000;
    let redis = RedisServer::start(Persist::None).await;
    let up = Upstream::spawn(UpstreamOptions::default()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let url = format!("url = \"{}\"", redis.url());
    let extra = [
        ("[log]", "backend = \"redis\"\ndurability = \"relaxed\""),
        ("[log.redis]", url.as_str()),
    ];
    let mut proxy = ProxyProc::start(&up.sse_url(), &dir.path().join("data"), &extra).await;
    let pid = proxy.proc.pid();
    let metrics = proxy.metrics_url();
    let logged_before = metric(&metrics, "mcp_resume_events_logged_total").await;
    let mut starts = Vec::new();
    for _ in 0..SESSIONS {
        let (sse, url, id) = legacy_session(&proxy.base()).await;
        let flood = call(
            2,
            "emit",
            json!({"count": COUNT, "rate_per_sec": 0, "size": SIZE}),
            None,
        );
        assert_eq!(post(&url, &flood).await.0, 202);
        drop(sse);
        starts.push(id);
    }
    let want = (SESSIONS * (COUNT + 2)) as f64;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while metric(&metrics, "mcp_resume_events_logged_total").await - logged_before < want {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the floods never reached Redis"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    reset_peak(pid);
    let base = status_kib(pid, "VmRSS");
    let mut resumed = Vec::new();
    for id in &starts {
        let (sse, err) = Sse::get(&format!("{}/sse", proxy.base()), &[("last-event-id", id)]).await;
        assert!(err.is_none(), "resume refused: {} {err:?}", sse.status);
        resumed.push(sse);
    }
    let mut samples = Vec::new();
    for _ in 0..8 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        samples.push(status_kib(pid, "VmRSS"));
    }
    let peak = status_kib(pid, "VmHWM");
    proxy.proc.kill();
    drop(resumed);
    let bound = SESSIONS * (2 * (MIB + 4 * MIB) + 4 * 4 * MIB + 2 * 4 * MIB) + SLACK;
    report(
        "8 stalled resumes of 24 × 3.9 MiB events, on Redis",
        base,
        peak,
        bound,
        &samples,
        want,
    );
    assert!(
        peak <= base + bound,
        "peak RSS {} MiB over base {} MiB + {} MiB",
        peak >> 20,
        base >> 20,
        bound >> 20
    );
}
