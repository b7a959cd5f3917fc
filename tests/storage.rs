//! Storage faults (issue 9, design.md §10 "Storage failure is loud", "Limits hold"): the data dir
//! on a small **tmpfs** that fills up and is then freed; on an **ext4** image (loop device) that
//! goes read-only; and the log's bound measured on disk with `du`. The proxy runs as its own
//! process (exit codes are part of the contract) in front of the embedded demo upstream, whose
//! `emit` tool floods a session on demand; everything is real: mounts, files, sockets.
//!
//! Issue 15 (design.md §10b) adds: `du` sampled through a sustained flood; a full disk that heals in
//! process by reclaiming dead segments; a disk that stays full, after which the process exits 74
//! at `log.store_error_exit_secs`; and the modes of the data dir and its files.
//!
//! Mounting needs root (every machine here, CI included, runs tests as root). Where a mount cannot
//! be made, the test fails with the reason; it never skips.

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use mcp_resume_proxy::demo::upstream::{Upstream, UpstreamOptions};
use serde_json::{json, Value};
use support::*;

// ---------------------------------------------------------------------------------------------
// Mounts

/// A file system mounted for one test; unmounted (and its loop device detached) on drop.
struct Mount {
    dir: PathBuf,
    loop_dev: Option<String>,
    image: Option<PathBuf>,
    _tmp: tempfile::TempDir,
}

fn run(cmd: &str, args: &[&str]) -> String {
    let out = Command::new(cmd).args(args).output().unwrap_or_else(|e| {
        panic!("cannot run {cmd}: {e} (the storage tests need root, mount and losetup)")
    });
    assert!(
        out.status.success(),
        "{cmd} {args:?} failed ({}): {} — the storage tests need root and a kernel that allows mounts",
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

impl Mount {
    fn tmpfs(size: &str) -> Mount {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("mnt");
        std::fs::create_dir(&dir).unwrap();
        run(
            "mount",
            &[
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size}"),
                "tmpfs",
                dir.to_str().unwrap(),
            ],
        );
        Mount {
            dir,
            loop_dev: None,
            image: None,
            _tmp: tmp,
        }
    }

    /// An ext4 image in a loop device, mounted `errors=remount-ro`.
    fn ext4(size: &str) -> Mount {
        let tmp = tempfile::tempdir().unwrap();
        let image = tmp.path().join("fs.img");
        let dir = tmp.path().join("mnt");
        std::fs::create_dir(&dir).unwrap();
        run("truncate", &["-s", size, image.to_str().unwrap()]);
        run("mkfs.ext4", &["-q", "-F", image.to_str().unwrap()]);
        let dev = run("losetup", &["-f", "--show", image.to_str().unwrap()]);
        let m = Mount {
            dir,
            loop_dev: Some(dev),
            image: Some(image),
            _tmp: tmp,
        };
        m.mount();
        m
    }

    fn mount(&self) {
        let dev = self.loop_dev.as_deref().expect("a loop device");
        run(
            "mount",
            &["-o", "errors=remount-ro", dev, self.dir.to_str().unwrap()],
        );
    }

    fn umount(&self) {
        run("umount", &[self.dir.to_str().unwrap()]);
    }

    /// Makes the ext4 file system hit an error: with `errors=remount-ro` it aborts its journal
    /// and turns read-only, so every later write fails with `EROFS`.
    fn fail_ext4(&self) {
        let dev = self.loop_dev.as_deref().expect("a loop device");
        let name = dev.rsplit('/').next().unwrap();
        std::fs::write(format!("/sys/fs/ext4/{name}/trigger_fs_error"), "1")
            .expect("trigger an ext4 error");
    }

    /// Bytes free, as `df` sees them.
    fn avail(&self) -> u64 {
        let out = run("df", &["--output=avail", "-B1", self.dir.to_str().unwrap()]);
        out.lines().last().unwrap().trim().parse().unwrap()
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.dir).status();
        if let Some(dev) = &self.loop_dev {
            let _ = Command::new("losetup").args(["-d", dev]).status();
        }
        if let Some(img) = &self.image {
            let _ = std::fs::remove_file(img);
        }
    }
}

/// Bytes the directory takes on disk (allocated blocks), as `du` reports them.
fn du(dir: &Path) -> u64 {
    // `du` fails when a file it listed is deleted before it stats it (compaction deletes
    // segments while the flood runs): measure again.
    for _ in 0..20 {
        let out = Command::new("du")
            .args(["-s", "-B1", dir.to_str().unwrap()])
            .output()
            .expect("run du");
        if out.status.success() {
            let text = String::from_utf8_lossy(&out.stdout);
            return text.split_whitespace().next().unwrap().parse().unwrap();
        }
    }
    panic!("du kept failing on {}", dir.display());
}

// ---------------------------------------------------------------------------------------------
// Helpers

async fn wait_until<F: std::future::Future<Output = bool>>(what: &str, mut f: impl FnMut() -> F) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while !f().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting: {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn readyz(p: &ProxyProc) -> u16 {
    http_get(&format!("http://127.0.0.1:{}/readyz", p.admin))
        .await
        .0
}

/// Everything a legacy stream delivers until it ends: (id, raw data).
async fn drain(sse: &mut Sse) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    while let Some(ev) = sse.next().await {
        if ev.event.as_deref() == Some("endpoint") {
            continue;
        }
        out.push((
            ev.id.clone().expect("logged events carry an id"),
            ev.data.to_vec(),
        ));
    }
    out
}

fn js(data: &[u8]) -> Value {
    serde_json::from_slice(data).expect("JSON")
}

/// Ids are `session:epoch:seq` with seq +1 each, from `first_seq`.
fn assert_contiguous(evs: &[(String, Vec<u8>)], first_seq: u64) {
    for (k, (id, _)) in evs.iter().enumerate() {
        assert_eq!(seq_of(id), first_seq + k as u64, "event {k} of {evs:?}");
    }
}

/// `emit`'s per-session sequence number of a notification, if it is one.
fn emit_seq(m: &Value) -> Option<u64> {
    (m["params"]["logger"] == "emit").then(|| m["params"]["data"]["seq"].as_u64().unwrap())
}

// ---------------------------------------------------------------------------------------------
// Full disk: loud, then recovered in process

/// The data dir on an 8 MiB tmpfs, almost full. A session floods it. Then: the write that fails is
/// counted (`mcp_resume_store_errors_total`), `/readyz` answers 503 within a second, the session
/// ends `store_error` and its stream closes, new sessions and its resume get 503 `store_error`.
/// Once space is freed the log takes writes again without a restart: ready; the session's
/// in-flight request is answered -32091 in its log; a resume replays exactly what followed the
/// client's cursor, then the end; new sessions work. After a restart every event the client was
/// ever given is served again, byte for byte.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_disk_is_loud_and_recovers_when_space_returns() {
    let m = Mount::tmpfs("8m");
    let data = m.dir.join("data");
    let up = Upstream::spawn(UpstreamOptions::default()).await.unwrap();
    let mut proxy = ProxyProc::start(&up.sse_url(), &data, &[]).await;
    let base = proxy.base();
    let metrics = proxy.metrics_url();
    let (mut sse, url, first) = legacy_session(&base).await;
    let session = first.split(':').next().unwrap().to_string();
    // Leave about 1 MiB.
    let ballast = m.dir.join("ballast");
    let fill = m.avail().saturating_sub(1 << 20);
    std::fs::write(&ballast, vec![0u8; fill as usize]).unwrap();

    let flood = call(
        2,
        "emit",
        json!({"count": 100_000, "rate_per_sec": 0, "size": 2000}),
        None,
    );
    assert_eq!(post(&url, &flood).await.0, 202);
    // The client reads what it is given until the stream closes (it must: the session's events
    // are being lost).
    let mut got = vec![];
    let reader = async {
        got = drain(&mut sse).await;
    };
    let watcher = async {
        wait_until("a store error is counted", || async {
            metric(&metrics, "mcp_resume_store_errors_total").await > 0.0
        })
        .await;
        let seen = tokio::time::Instant::now();
        wait_until("/readyz answers 503", || async {
            readyz(&proxy).await == 503
        })
        .await;
        seen.elapsed()
    };
    let ((), to_unready) = tokio::join!(
        async {
            tokio::time::timeout(Duration::from_secs(60), reader)
                .await
                .expect("the flooding client's stream closes")
        },
        watcher
    );
    assert!(
        to_unready <= Duration::from_secs(1),
        "/readyz took {to_unready:?} to say 503"
    );
    assert!(!got.is_empty());
    assert_contiguous(&got, 2);
    wait_until("the session ends store_error", || async {
        metric(
            &metrics,
            "mcp_resume_sessions_ended_total{reason=\"store_error\"}",
        )
        .await
            >= 1.0
    })
    .await;
    // While full: no new session, no resume of the broken history.
    let (s, _, body) = request("GET", &format!("{base}/sse"), &[], "").await;
    assert_eq!(s, 503, "{body}");
    assert_eq!(
        js(body.as_bytes())["error"]["data"]["reason"],
        "store_error"
    );
    let is_answer = |d: &[u8]| {
        let m = js(d);
        m["id"] == 2
            && m["error"]["code"] == -32091
            && m["error"]["data"]["reason"] == "store_error"
    };
    // The stream closed either on the failure, or (when the log found room for the session's
    // small end at once, the failed write being cut off again) after the answer and the end.
    let answered = is_answer(&got.last().unwrap().1);
    let last = got.last().unwrap().0.clone();
    let resume = || async {
        request(
            "GET",
            &format!("{base}/sse"),
            &[("last-event-id", &last)],
            "",
        )
        .await
    };
    if !answered {
        // While full, a resume is refused as long as the end is not logged (503 store_error).
        let (s, _, body) = resume().await;
        if s != 200 {
            assert_eq!(s, 503, "{body}");
            assert_eq!(
                js(body.as_bytes())["error"]["data"]["reason"],
                "store_error"
            );
        }
    }
    assert_eq!(readyz(&proxy).await, 503, "not ready until space returns");

    // Space returns: the log recovers in process.
    std::fs::remove_file(&ballast).unwrap();
    wait_until("/readyz is 200 again", || async {
        readyz(&proxy).await == 200
    })
    .await;
    let rest = if answered {
        // Nothing after the answer but the end: the session is over.
        assert_eq!(resume().await.0, 404);
        Vec::new()
    } else {
        // The resume replays what followed the cursor, then the answer to the flood, then the end.
        let (mut again, err) = Sse::get(&format!("{base}/sse"), &[("last-event-id", &last)]).await;
        assert!(err.is_none(), "resume after recovery: {err:?}");
        let rest = drain(&mut again).await;
        assert_contiguous(&rest, seq_of(&last) + 1);
        assert!(
            is_answer(&rest.last().expect("at least the answer").1),
            "{rest:?}"
        );
        rest
    };
    // Nothing of the upstream's stream was skipped silently: what the client received is the
    // upstream's emit sequence without a hole, up to where the session ended.
    let seqs: Vec<u64> = got
        .iter()
        .chain(&rest)
        .filter_map(|(_, d)| emit_seq(&js(d)))
        .collect();
    assert_eq!(seqs, (1..=seqs.len() as u64).collect::<Vec<_>>());
    // New sessions work again.
    let (mut fresh, fresh_url, _) = legacy_session(&base).await;
    assert_eq!(
        post(&fresh_url, &call(2, "emit", json!({"count": 5}), None))
            .await
            .0,
        202
    );
    for _ in 0..6 {
        fresh.message().await;
    }

    // Across a restart, every event the client was given is still served, byte for byte.
    proxy.proc.signal("TERM");
    assert_eq!(proxy.proc.wait(), Some(0));
    let proxy = ProxyProc::start(&up.sse_url(), &data, &[]).await;
    let (mut replay, err) = Sse::get(
        &format!("{}/sse", proxy.base()),
        &[("last-event-id", &first)],
    )
    .await;
    assert!(err.is_none(), "{err:?}");
    let history = drain(&mut replay).await;
    let given: Vec<_> = got.iter().chain(&rest).cloned().collect();
    assert_eq!(
        history, given,
        "session {session}: the log serves what the client was given"
    );
}

// ---------------------------------------------------------------------------------------------
// Read-only file system: exit 74, then recovery answers what was in flight

/// The data dir on ext4 (`errors=remount-ro`). Mid-call, the file system hits an error and turns
/// read-only: the proxy's next write fails with `EROFS`, it ends what it can and exits 74
/// (`EX_IOERR`). Remounted and restarted, recovery answers the in-flight request with -32091, and
/// the client's resume replays exactly what followed its cursor, then that answer, then the end;
/// everything it was given before is still there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_only_file_system_exits_74_and_the_restart_answers_what_was_in_flight() {
    let m = Mount::ext4("64M");
    let data = m.dir.join("data");
    let up = Upstream::spawn(UpstreamOptions::default()).await.unwrap();
    let mut proxy = ProxyProc::start(&up.sse_url(), &data, &[]).await;
    let base = proxy.base();
    let (mut sse, url, first) = legacy_session(&base).await;
    let paced = call(2, "emit", json!({"count": 2000, "rate_per_sec": 100}), None);
    assert_eq!(post(&url, &paced).await.0, 202);
    let mut got = vec![];
    while got.len() < 20 {
        let ev = sse.next().await.expect("events flow");
        got.push((ev.id.clone().unwrap(), ev.data.to_vec()));
    }
    m.fail_ext4();
    // The proxy must notice on its next write (within a few events at 100/s) and exit 74.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(s) = proxy.proc.child.try_wait().unwrap() {
            break s;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the proxy did not exit"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(status.code(), Some(74), "exit status {status}");
    // What the stream delivered before it closed.
    while let Ok(Some(ev)) = sse.next_within(Duration::from_secs(5)).await {
        got.push((ev.id.clone().unwrap(), ev.data.to_vec()));
    }
    assert_contiguous(&got, 2);

    m.umount();
    m.mount();
    let proxy = ProxyProc::start(&up.sse_url(), &data, &[]).await;
    let base = proxy.base();
    let last = got.last().unwrap().0.clone();
    let (mut again, err) = Sse::get(&format!("{base}/sse"), &[("last-event-id", &last)]).await;
    assert!(err.is_none(), "resume after the restart: {err:?}");
    let rest = drain(&mut again).await;
    assert_contiguous(&rest, seq_of(&last) + 1);
    let answer = js(&rest.last().expect("the answer").1);
    assert_eq!(answer["id"], 2, "{answer}");
    assert_eq!(answer["error"]["code"], -32091);
    let (mut replay, err) = Sse::get(&format!("{base}/sse"), &[("last-event-id", &first)]).await;
    assert!(err.is_none());
    let history = drain(&mut replay).await;
    let given: Vec<_> = got.iter().chain(&rest).cloned().collect();
    assert_eq!(history, given, "the log serves what the client was given");
}

// ---------------------------------------------------------------------------------------------
// The bound, on disk

/// `log.max_total_bytes` bounds what the data dir takes on disk, measured with `du` while sessions
/// flood it with large events (64 KiB–1 MiB) and come and go: at most 1.5 × the bound plus
/// 4 MiB (two segments and one writer turn; README "Durability and storage").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_total_bound_holds_on_disk() {
    const MAX: u64 = 16 << 20;
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let up = Upstream::spawn(UpstreamOptions::default()).await.unwrap();
    let proxy = ProxyProc::start(
        &up.sse_url(),
        &data,
        &[(
            "[log]",
            &format!(
                "max_total_bytes = {MAX}\nmax_bytes_per_session = {}",
                MAX / 2
            ),
        )],
    )
    .await;
    let base = proxy.base();
    let metrics = proxy.metrics_url();
    let mut peak = 0u64;
    for round in 0..12u64 {
        let mut sessions = Vec::new();
        for k in 0..3u64 {
            let (sse, url, _) = legacy_session(&base).await;
            let size = [64 << 10, 256 << 10, 1 << 20][((round + k) % 3) as usize];
            let flood = call(
                2,
                "emit",
                json!({"count": (6 << 20) / size, "rate_per_sec": 0, "size": size}),
                None,
            );
            assert_eq!(post(&url, &flood).await.0, 202);
            sessions.push((sse, url));
        }
        // Read each stream to its flood's answer; a reader that fell behind a trim (the three
        // floods are more than the bound) has its stream closed instead, which is fine here.
        for (sse, _) in &mut sessions {
            while let Ok(Some(ev)) = sse.next_within(Duration::from_secs(30)).await {
                peak = peak.max(du(&data));
                if ev.event.as_deref() == Some("message") && ev.json()["id"] == 2 {
                    break;
                }
            }
        }
        // The sessions end; their logs are the first to go when space is needed.
        for (_, url) in &sessions {
            post(url, &call(3, "misbehave", json!({"kind": "close"}), None)).await;
        }
        peak = peak.max(du(&data));
        assert!(
            metric(&metrics, "mcp_resume_log_bytes").await <= MAX as f64,
            "live records over the bound"
        );
    }
    let bound = MAX + MAX / 2 + (4 << 20);
    println!(
        "du peak {peak} B for log.max_total_bytes = {MAX} B ({:.2}x)",
        peak as f64 / MAX as f64
    );
    assert!(peak <= bound, "du peaked at {peak} B, over {bound} B");
    assert!(peak >= MAX / 2, "the test filled the log: {peak} B");
}

// ---------------------------------------------------------------------------------------------
// Issue 15 (design.md §10b): the bound under a sustained flood, a full disk that heals, the exit
// deadline of a log that cannot heal, private files

/// Samples [`du`] of a directory every `every` on its own thread until [`DuSampler::stop`].
struct DuSampler {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<Vec<(Duration, u64)>>,
}

impl DuSampler {
    fn start(dir: &Path, every: Duration) -> DuSampler {
        let stop = Arc::new(AtomicBool::new(false));
        let (dir, flag) = (dir.to_path_buf(), stop.clone());
        let thread = std::thread::spawn(move || {
            let t0 = std::time::Instant::now();
            let mut samples = Vec::new();
            while !flag.load(Ordering::Relaxed) {
                samples.push((t0.elapsed(), du(&dir)));
                std::thread::sleep(every);
            }
            samples
        });
        DuSampler { stop, thread }
    }

    /// Every sample taken: (time since the start, bytes).
    fn stop(self) -> Vec<(Duration, u64)> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().expect("the du sampler")
    }
}

/// What one client read of a flooded legacy session, checked as it went.
#[derive(Debug, Default)]
struct FloodRead {
    /// `emit` events received.
    events: u64,
    /// The last `emit` seq received (they are 1, 2, 3, ... with nothing missing).
    last_emit: u64,
    /// Times the stream closed and a resume continued it (200).
    resumed: u64,
    /// The refusal that ended the reading (`cursor_trimmed`), if the session did not end first.
    refused: Option<String>,
}

/// Where `emit`'s per-session seq sits in its event data (the frame is fixed up to it).
const EMIT_HEAD: &[u8] = br#"{"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info","logger":"emit","data":{"seq":"#;

/// An `emit` event's (seq, pad length), checked to be the frame the demo upstream writes
/// (`..."pad":"xxx..."}}}`); `None` for any other event.
fn emit_frame(data: &[u8], pad: &[u8]) -> Option<(u64, usize)> {
    let rest = data.strip_prefix(EMIT_HEAD)?;
    let digits = rest.iter().take_while(|b| b.is_ascii_digit()).count();
    let seq = std::str::from_utf8(&rest[..digits])
        .unwrap()
        .parse()
        .unwrap();
    let at = rest
        .windows(7)
        .position(|w| w == br#""pad":""#)
        .unwrap_or_else(|| panic!("emit event {seq} without its pad"))
        + 7;
    let body = rest[at..]
        .strip_suffix(br#""}}}"#)
        .unwrap_or_else(|| panic!("emit event {seq} does not end its frame"));
    assert!(
        body.len() <= pad.len() && body == &pad[..body.len()],
        "emit event {seq}: its pad is not the {} bytes of 'x' written",
        body.len()
    );
    Some((seq, body.len()))
}

/// Reads a flooded legacy session from `sse` (last event read: `last_id`) until the session ends
/// or a resume is refused. Every event read is checked: its id is the next seq of the same
/// session and epoch, and every `emit` event is the next of the upstream's sequence, with its
/// `size` bytes of pad intact (nothing missing, duplicated, reordered or cut). A stream that
/// closes is resumed from the last id read: it must continue exactly, or be refused with
/// `409 cursor_trimmed` (the reader fell behind the retained window), or answer 404 once the
/// session has ended with nothing more to read.
async fn read_flood(base: String, mut sse: Sse, mut last_id: String, size: usize) -> FloodRead {
    let pad = vec![b'x'; size];
    let prefix = last_id.rsplit_once(':').unwrap().0.to_string();
    let mut r = FloodRead::default();
    loop {
        let ev = sse
            .next_within(Duration::from_secs(30))
            .await
            .unwrap_or_else(|()| panic!("{prefix}: no event for 30 s after {last_id}"));
        // The harness keeps every byte of a stream; a flood is far too much for that.
        sse.raw.clear();
        let Some(ev) = ev else {
            let (again, err) =
                Sse::get(&format!("{base}/sse"), &[("last-event-id", &last_id)]).await;
            match again.status {
                200 => {
                    r.resumed += 1;
                    sse = again;
                    continue;
                }
                404 => return r,
                409 => {
                    let body = js(err.unwrap().as_bytes());
                    assert_eq!(
                        body["error"]["data"]["reason"], "cursor_trimmed",
                        "{prefix}: resume from {last_id}: {body}"
                    );
                    r.refused = Some("cursor_trimmed".into());
                    return r;
                }
                s => panic!("{prefix}: resume from {last_id}: {s} {err:?}"),
            }
        };
        if ev.event.as_deref() == Some("endpoint") {
            continue;
        }
        let id = ev.id.clone().expect("logged events carry an id");
        assert_eq!(
            id,
            format!("{prefix}:{}", seq_of(&last_id) + 1),
            "{prefix}: the event after {last_id}"
        );
        last_id = id;
        if let Some((seq, len)) = emit_frame(&ev.data, &pad) {
            assert_eq!(
                seq,
                r.last_emit + 1,
                "{prefix}: emit seq after {}",
                r.last_emit
            );
            assert_eq!(len, size, "{prefix}: emit event {seq}'s pad");
            r.last_emit = seq;
            r.events += 1;
        }
    }
}

/// The bound under a sustained flood (design.md §10b "The disk bound holds under any load"):
/// `log.max_total_bytes` = 16 MiB; three sessions flood 64 KiB events at 160 per second each
/// (about 30 MB/s offered) for 25 s while a client reads each. `du` of the data dir, sampled every
/// 150 ms, stays within 1.5 × the bound + 4 MiB (README "Durability and storage") at every sample.
/// The proxy may slow the upstream down (backpressure) but not by much: at least 8 × the bound
/// must pass through the log. Nothing is dropped: each reader sees its session's events
/// contiguous and whole up to the end of the session, or is told that it fell behind
/// (`409 cursor_trimmed`) — never a stream with a hole in it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_total_bound_holds_on_disk_under_a_sustained_flood() {
    const MAX: u64 = 16 << 20;
    const SIZE: usize = 64 << 10;
    const RATE: u64 = 160;
    const FLOOD: Duration = Duration::from_secs(25);
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let up = Upstream::spawn(UpstreamOptions::default()).await.unwrap();
    let proxy = ProxyProc::start(
        &up.sse_url(),
        &data,
        &[(
            "[log]",
            &format!(
                "max_total_bytes = {MAX}\nmax_bytes_per_session = {}",
                MAX / 2
            ),
        )],
    )
    .await;
    let base = proxy.base();
    let metrics = proxy.metrics_url();
    let sampler = DuSampler::start(&data, Duration::from_millis(150));
    let mut readers = Vec::new();
    let mut urls = Vec::new();
    for _ in 0..3 {
        let (sse, url, last) = legacy_session(&base).await;
        let flood = call(
            2,
            "emit",
            json!({"count": 1_000_000, "rate_per_sec": RATE, "size": SIZE}),
            None,
        );
        assert_eq!(post(&url, &flood).await.0, 202);
        readers.push(tokio::spawn(read_flood(base.clone(), sse, last, SIZE)));
        urls.push(url);
    }
    tokio::time::sleep(FLOOD).await;
    // The floods stop with their upstream sessions: each session ends, and its reader with it.
    for url in &urls {
        post(url, &call(3, "misbehave", json!({"kind": "close"}), None)).await;
    }
    let mut reads = Vec::new();
    for r in readers {
        reads.push(
            tokio::time::timeout(Duration::from_secs(60), r)
                .await
                .expect("each reader ends once its session has")
                .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic())),
        );
    }
    let logged = metric(&metrics, "mcp_resume_events_logged_total").await;
    let samples = sampler.stop();
    let bound = MAX + MAX / 2 + (4 << 20);
    let peak = samples.iter().map(|s| s.1).max().unwrap();
    println!(
        "{} du samples, peak {peak} B for log.max_total_bytes = {MAX} B ({:.2}x); {logged} events logged ({:.1} MB/s); reads: {reads:?}",
        samples.len(),
        peak as f64 / MAX as f64,
        logged * SIZE as f64 / FLOOD.as_secs_f64() / 1e6,
    );
    let over: Vec<_> = samples.iter().filter(|s| s.1 > bound).collect();
    if let Some((t, b)) = over.first() {
        panic!(
            "du was {b} B at {t:?}, over {bound} B (1.5 × {MAX} + 4 MiB); {} of {} samples over, peak {peak} B",
            over.len(),
            samples.len()
        );
    }
    assert!(
        samples.len() as f64 >= FLOOD.as_secs_f64() / 0.25,
        "too few samples: {}",
        samples.len()
    );
    assert!(
        logged * SIZE as f64 >= 8.0 * MAX as f64,
        "only {logged} events of {SIZE} B went through the log in {FLOOD:?}: the flood was throttled to a trickle"
    );
    assert!(peak >= MAX / 2, "the flood filled the log: {peak} B");
    for (k, r) in reads.iter().enumerate() {
        assert!(r.events > 0, "reader {k} read nothing: {r:?}");
    }
}

/// Is `data` the -32091 answer to request `id` (with `error.data.reason` = `reason`, if given)?
fn is_aborted_answer(data: &[u8], id: u64, reason: Option<&str>) -> bool {
    let m = js(data);
    m["id"] == id
        && m["error"]["code"] == -32091
        && reason.is_none_or(|r| m["error"]["data"]["reason"] == r)
}

/// The rest of a legacy session that ended on a store error with request `id` in flight, read
/// once the log takes writes again (in process, or after a restart); `got` is what its client
/// read before its stream closed. If that already ended with the answer to `id`, a resume
/// answers 404 (nothing more); otherwise it replays exactly what followed the last event read,
/// then the answer, then the session's end.
async fn rest_after_store_error(
    base: &str,
    got: &[(String, Vec<u8>)],
    id: u64,
    reason: Option<&str>,
) -> Vec<(String, Vec<u8>)> {
    let last = &got.last().expect("the client read something").0;
    let (mut again, err) = Sse::get(&format!("{base}/sse"), &[("last-event-id", last)]).await;
    if is_aborted_answer(&got.last().unwrap().1, id, reason) {
        assert_eq!(again.status, 404, "resume after the answer: {err:?}");
        return Vec::new();
    }
    assert!(
        err.is_none(),
        "resume from {last}: {} {err:?}",
        again.status
    );
    let rest = drain(&mut again).await;
    assert_contiguous(&rest, seq_of(last) + 1);
    let answer = &rest.last().expect("at least the answer").1;
    assert!(
        is_aborted_answer(answer, id, reason),
        "the last event is the -32091 answer to {id}: {}",
        String::from_utf8_lossy(answer)
    );
    rest
}

/// Nothing of the upstream's `emit` stream was skipped: the seqs in `evs` are 1, 2, 3, ...
fn assert_emit_seqs(evs: &[(String, Vec<u8>)]) -> u64 {
    let seqs: Vec<u64> = evs.iter().filter_map(|(_, d)| emit_seq(&js(d))).collect();
    assert_eq!(seqs, (1..=seqs.len() as u64).collect::<Vec<_>>());
    seqs.len() as u64
}

/// A fresh legacy session works: 20 `emit` events exactly, then the answer.
async fn fresh_session_works(base: &str) {
    let (mut sse, url, first) = legacy_session(base).await;
    assert_eq!(
        post(
            &url,
            &call(2, "emit", json!({"count": 20, "size": 1000}), None)
        )
        .await
        .0,
        202
    );
    let mut prev = first;
    for k in 1..=21u64 {
        let (id, m) = sse.message().await;
        assert_eq!(seq_of(&id), seq_of(&prev) + 1, "{m}");
        if k <= 20 {
            assert_eq!(emit_seq(&m), Some(k), "{m}");
        } else {
            assert_eq!(m["id"], 2, "{m}");
            assert_eq!(m["result"]["content"][0]["text"], "emitted 20", "{m}");
        }
        prev = id;
    }
}

/// Waits for the first store error (`mcp_resume_store_errors_total` > 0) while `sse`'s client
/// reads everything its stream gives until it closes; the stream must close (the session's
/// events can no longer be logged). Returns what was read and when the error was first seen.
async fn read_until_store_error(
    sse: &mut Sse,
    metrics: &str,
) -> (Vec<(String, Vec<u8>)>, tokio::time::Instant) {
    let reader = async {
        tokio::time::timeout(Duration::from_secs(60), drain(sse))
            .await
            .expect("the flooding client's stream closes")
    };
    let watcher = async {
        wait_until("a store error is counted", || async {
            metric(metrics, "mcp_resume_store_errors_total").await > 0.0
        })
        .await;
        tokio::time::Instant::now()
    };
    tokio::join!(reader, watcher)
}

/// A full disk heals with no restart (design.md §10b "A full disk heals"). The data dir is on a
/// 12 MiB tmpfs. Three sessions log 1.5 MiB each and end; their logs are kept for
/// `sessions.retain_ended_secs` (20 s). 14 s later a file takes all but 256 KiB of the file
/// system, and a fourth session floods it: `ENOSPC`, `/readyz` 503, new sessions 503
/// `store_error`. Nobody frees any space: the file stays. When the ended sessions' logs are
/// deleted, the segments that held them are all dead, and the degraded log must reclaim them
/// itself; `/readyz` then returns to 200 in the same process (same pid, never exited). The
/// flooded session's resume (its own log is kept 20 s more) then replays exactly what followed
/// its client's cursor and the -32091 answer, and a new session works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_heals_in_process_by_reclaiming_dead_segments() {
    const RETAIN: u64 = 20;
    let m = Mount::tmpfs("12m");
    let data = m.dir.join("data");
    let up = Upstream::spawn(UpstreamOptions::default()).await.unwrap();
    let mut proxy = ProxyProc::start(
        &up.sse_url(),
        &data,
        &[
            (
                "[log]",
                // The total bound stays above what this test logs: no eviction, no trim.
                "max_total_bytes = 8388608\nmax_bytes_per_session = 4194304\nstore_error_exit_secs = 600",
            ),
            ("[sessions]", &format!("retain_ended_secs = {RETAIN}")),
        ],
    )
    .await;
    let base = proxy.base();
    let metrics = proxy.metrics_url();
    let pid = proxy.proc.pid();

    // Three sessions log 24 events of 64 KiB each, read exactly, then end.
    let mut ended = Vec::new();
    let mut first_end = None;
    for _ in 0..3 {
        let (mut sse, url, first) = legacy_session(&base).await;
        let flood = call(2, "emit", json!({"count": 24, "size": 64 << 10}), None);
        assert_eq!(post(&url, &flood).await.0, 202);
        let mut prev = first.clone();
        for k in 1..=25u64 {
            let (id, m) = sse.message().await;
            assert_eq!(seq_of(&id), seq_of(&prev) + 1);
            if k <= 24 {
                assert_eq!(emit_seq(&m), Some(k));
            } else {
                assert_eq!(m["result"]["content"][0]["text"], "emitted 24", "{m}");
            }
            prev = id;
        }
        post(&url, &call(3, "misbehave", json!({"kind": "close"}), None)).await;
        // The close itself is answered -32091 (in flight when the upstream went away).
        let rest = drain(&mut sse).await;
        assert_eq!(rest.len(), 1, "{rest:?}");
        assert_contiguous(&rest, seq_of(&prev) + 1);
        assert!(is_aborted_answer(&rest[0].1, 3, None), "{rest:?}");
        ended.push(first);
        first_end.get_or_insert_with(tokio::time::Instant::now);
    }
    let (first_end, last_end) = (first_end.unwrap(), tokio::time::Instant::now());
    wait_until("the three sessions have ended", || async {
        metric(
            &metrics,
            "mcp_resume_sessions_ended_total{reason=\"upstream_lost\"}",
        )
        .await
            >= 3.0
    })
    .await;

    // Later, but well before the first ended log is due for deletion: the fourth session, then
    // a file that leaves 1.25 MiB, then its flood.
    tokio::time::sleep_until(last_end + Duration::from_secs(RETAIN - 6)).await;
    let (mut sse, url, _) = legacy_session(&base).await;
    let ballast = m.dir.join("ballast");
    // Room for the writer's first turn of the flood (up to `max_total_bytes / 8` = 1 MiB) and
    // a little more: the client reads some of it before the disk fills (with only 256 KiB left,
    // a loaded machine's first turn could fail whole and leave it nothing: seen once in CI).
    let fill = m.avail().saturating_sub(1280 << 10);
    std::fs::write(&ballast, vec![0u8; fill as usize]).unwrap();
    let flood = call(
        2,
        "emit",
        json!({"count": 100_000, "rate_per_sec": 0, "size": 2000}),
        None,
    );
    assert_eq!(post(&url, &flood).await.0, 202);
    let (got, failed_at) = read_until_store_error(&mut sse, &metrics).await;
    // (`retain_ended_secs` counts whole seconds: a log may go up to a second early.)
    assert!(
        failed_at + Duration::from_secs(2) < first_end + Duration::from_secs(RETAIN),
        "the disk filled {:?} after the first session ended, when its log may already have \
         gone (sessions.retain_ended_secs = {RETAIN}): the setup was too slow for this test",
        failed_at - first_end
    );
    assert!(!got.is_empty());
    assert_contiguous(&got, 2);
    wait_until("/readyz answers 503", || async {
        readyz(&proxy).await == 503
    })
    .await;
    let (s, _, body) = request("GET", &format!("{base}/sse"), &[], "").await;
    assert_eq!(s, 503, "a new session while the disk is full: {body}");
    assert_eq!(
        js(body.as_bytes())["error"]["data"]["reason"],
        "store_error"
    );

    // The test frees nothing: the log must find the space itself, once the ended sessions' logs
    // are deleted (their retention, the janitor's second, the degraded log's retry).
    let due = last_end + Duration::from_secs(RETAIN);
    let deadline = due + Duration::from_secs(10);
    while readyz(&proxy).await != 200 {
        if let Some(s) = proxy.proc.child.try_wait().unwrap() {
            panic!("the proxy exited ({s}) instead of healing");
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "/readyz is still {} {:?} after the disk filled, {:?} after the ended sessions' \
             logs were due for deletion; nothing was reclaimed (df: {} B free)",
            readyz(&proxy).await,
            failed_at.elapsed(),
            tokio::time::Instant::now().saturating_duration_since(due),
            m.avail()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    println!(
        "ready again {:?} after the disk filled; {} B free",
        failed_at.elapsed(),
        m.avail()
    );
    assert_eq!(
        std::fs::metadata(&ballast).unwrap().len(),
        fill,
        "the ballast is untouched"
    );
    assert!(proxy.proc.child.try_wait().unwrap().is_none());
    assert_eq!(proxy.proc.pid(), pid);

    // What made the room: the first ended session's log is gone (the others may follow it a
    // little later). The flooded session ends exactly.
    let (s, _, body) = request(
        "GET",
        &format!("{base}/sse"),
        &[("last-event-id", &ended[0])],
        "",
    )
    .await;
    assert_eq!(
        s, 404,
        "resume of the first ended session, from {}: {body}",
        ended[0]
    );
    let rest = rest_after_store_error(&base, &got, 2, Some("store_error")).await;
    let all: Vec<_> = got.iter().chain(&rest).cloned().collect();
    assert!(assert_emit_seqs(&all) > 0);
    fresh_session_works(&base).await;
    assert!(proxy.proc.child.try_wait().unwrap().is_none());
    assert_eq!(proxy.proc.pid(), pid, "healed in the same process");
}

/// A disk that stays full (design.md §10b, `log.store_error_exit_secs`): the data dir is on an
/// 8 MiB tmpfs, a file takes all but 1 MiB and is never freed while the proxy runs, a session
/// floods it. With `store_error_exit_secs = 3` the degraded proxy exits with 74 (`EX_IOERR`) after
/// about 3 s (not before 2 s, within 15 s of the first store error). Then the space is freed and
/// the proxy restarted: nothing its client was given is lost — the resume replays exactly what
/// followed the client's cursor, then the -32091 answer to the in-flight request, and a replay
/// from the start serves every event the client was given, byte for byte.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disk_that_stays_full_exits_74_after_store_error_exit_secs() {
    const EXIT_SECS: u64 = 3;
    let m = Mount::tmpfs("8m");
    let data = m.dir.join("data");
    let up = Upstream::spawn(UpstreamOptions::default()).await.unwrap();
    let exit_key = format!("store_error_exit_secs = {EXIT_SECS}");
    let extra = [("[log]", exit_key.as_str())];
    let mut proxy = ProxyProc::start(&up.sse_url(), &data, &extra).await;
    let base = proxy.base();
    let metrics = proxy.metrics_url();
    let (mut sse, url, first) = legacy_session(&base).await;
    let ballast = m.dir.join("ballast");
    let fill = m.avail().saturating_sub(1 << 20);
    std::fs::write(&ballast, vec![0u8; fill as usize]).unwrap();
    let flood = call(
        2,
        "emit",
        json!({"count": 100_000, "rate_per_sec": 0, "size": 2000}),
        None,
    );
    assert_eq!(post(&url, &flood).await.0, 202);
    let (got, failed_at) = read_until_store_error(&mut sse, &metrics).await;
    assert!(!got.is_empty());
    assert_contiguous(&got, 2);

    let deadline = failed_at + Duration::from_secs(EXIT_SECS + 12);
    let status = loop {
        if let Some(s) = proxy.proc.child.try_wait().unwrap() {
            break s;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "still running {:?} after the first store error (log.store_error_exit_secs = \
             {EXIT_SECS}); /readyz {}",
            failed_at.elapsed(),
            readyz(&proxy).await
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let after = failed_at.elapsed();
    println!("exited {status} {after:?} after the first store error");
    assert_eq!(status.code(), Some(74), "exit status {status}");
    assert!(
        after >= Duration::from_secs(EXIT_SECS - 1),
        "exited {after:?} after the first store error, before log.store_error_exit_secs = {EXIT_SECS}"
    );

    // Space returns (the operator, or the restarted pod's fresh node); a restart recovers.
    std::fs::remove_file(&ballast).unwrap();
    let proxy = ProxyProc::start(&up.sse_url(), &data, &extra).await;
    let base = proxy.base();
    let rest = rest_after_store_error(&base, &got, 2, None).await;
    let given: Vec<_> = got.iter().chain(&rest).cloned().collect();
    assert!(assert_emit_seqs(&given) > 0);
    let (mut replay, err) = Sse::get(&format!("{base}/sse"), &[("last-event-id", &first)]).await;
    assert!(err.is_none(), "{err:?}");
    let history = drain(&mut replay).await;
    assert_eq!(history, given, "the log serves what the client was given");
    fresh_session_works(&base).await;
}

/// Every directory and file under `dir` (and `dir` itself) as (path, mode bits); files that
/// vanish while it walks (compaction deletes segments) are left out.
fn modes(dir: &Path) -> Vec<(PathBuf, u32, bool)> {
    use std::os::unix::fs::PermissionsExt;
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        let Ok(meta) = std::fs::symlink_metadata(&d) else {
            continue;
        };
        out.push((d.clone(), meta.permissions().mode() & 0o7777, true));
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let Ok(meta) = std::fs::symlink_metadata(e.path()) else {
                continue;
            };
            if meta.is_dir() {
                todo.push(e.path());
            } else {
                out.push((e.path(), meta.permissions().mode() & 0o7777, false));
            }
        }
    }
    out
}

/// The data dir and everything in it are private to the proxy's user (design.md §10b "Files are
/// private"): checked while sessions are logged, rotated, trimmed and ended, and after a clean
/// stop: the data dir (created by the proxy) and any directory in it 0700, every file — segments
/// (`*.seg`) and whatever else the log writes — 0600. The test runs the proxy with the harness's
/// umask (usually 022), so modes left to the umask would show.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_data_dir_and_its_files_are_private() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let up = Upstream::spawn(UpstreamOptions::default()).await.unwrap();
    let mut proxy = ProxyProc::start(
        &up.sse_url(),
        &data,
        &[(
            "[log]",
            "max_total_bytes = 2097152\nmax_bytes_per_session = 1048576",
        )],
    )
    .await;
    let base = proxy.base();
    let check = |when: &str| {
        let all = modes(&data);
        let bad: Vec<_> = all
            .iter()
            .filter(|(_, mode, is_dir)| *mode != if *is_dir { 0o700 } else { 0o600 })
            .map(|(p, mode, is_dir)| {
                format!(
                    "{} {:o} (want {:o})",
                    p.display(),
                    mode,
                    if *is_dir { 0o700 } else { 0o600 }
                )
            })
            .collect();
        assert!(bad.is_empty(), "{when}: not private: {bad:?}");
        let segs = all
            .iter()
            .filter(|(p, _, _)| p.extension().is_some_and(|e| e == "seg"))
            .count();
        assert!(segs > 0, "{when}: no segment in {all:?}");
        println!("{when}: {} entries private, {segs} segments", all.len());
    };
    // Sessions log 3 MiB each (segments rotate, the bounds trim, compaction runs) and end.
    for _ in 0..2 {
        let (mut sse, url, _) = legacy_session(&base).await;
        let flood = call(2, "emit", json!({"count": 48, "size": 64 << 10}), None);
        assert_eq!(post(&url, &flood).await.0, 202);
        // To the flood's answer, or to the stream's close if the bound trimmed past the reader.
        while let Some(ev) = sse.next().await {
            if ev.event.as_deref() == Some("message") && ev.json()["id"] == 2 {
                break;
            }
        }
        check("while running");
        post(&url, &call(3, "misbehave", json!({"kind": "close"}), None)).await;
        drain(&mut sse).await;
    }
    check("sessions ended");
    proxy.proc.signal("TERM");
    assert_eq!(proxy.proc.wait(), Some(0));
    check("after a clean stop");
}
