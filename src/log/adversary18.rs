//! Adversarial review 18 (buffers kept across writer turns, batches recycled to the pumps).
//!
//! Each test writes events whose bytes say which session and which event they are, in turns that
//! mix sessions, chunk sizes on both sides of `CHUNK_BYTES` / `SPARE_CAP`, recycled batches and
//! injected write failures, then reads everything back from the segments after a restart and
//! compares byte for byte: a reused chunk or turn buffer that leaked bytes of another turn or
//! session, a stale recycled batch, or a failed turn's bytes rewritten later would show here.

use super::*;
use crate::config::{Durability, LogConfig};
use bytes::Bytes;
use std::io::ErrorKind;
use std::time::Duration;

fn cfg(dir: &std::path::Path, durability: Durability) -> LogConfig {
    LogConfig {
        dir: dir.to_path_buf(),
        durability,
        max_events_per_session: 10_000_000,
        max_bytes_per_session: 1 << 32,
        max_total_bytes: 1 << 34,
        store_error_exit_secs: 60,
        ..LogConfig::default()
    }
}

/// Payload of event `i` of session `s`: a header naming both, then a filler byte that differs
/// between neighbours, at sizes from 0 to past a chunk's byte bound.
fn payload(s: usize, i: u64) -> Bytes {
    let size = match (i * 7 + s as u64) % 11 {
        0 => 0,
        1 => 1,
        2 => 65_000 + (i as usize % 3) * 700, // about CHUNK_BYTES
        3 => 81_000 + (i as usize % 5) * 300, // past SPARE_CAP
        4 => 17,
        5 => 4_000 + (i as usize * 13) % 1_000,
        _ => 30 + (i as usize * 31) % 400,
    };
    let fill = b'a' + ((s as u64 * 7 + i) % 26) as u8;
    let mut v = format!("<{s}:{i}>").into_bytes();
    v.resize(v.len().max(size), fill);
    Bytes::from(v)
}

fn ev(s: usize, i: u64) -> NewEvent {
    NewEvent::new(StreamTag::LEGACY, Kind::Message, payload(s, i))
}

async fn wait_ok(log: &Log) {
    let mut health = log.health();
    tokio::time::timeout(
        Duration::from_secs(10),
        health.wait_for(|h| *h == Health::Ok),
    )
    .await
    .expect("health returns")
    .unwrap();
}

/// The Message events of `sl`, read from the start, as (seq, payload).
fn messages(log: &Log, sl: &SessionLog) -> Vec<(u64, Bytes)> {
    log.read_held(sl, 0, 10_000_000)
        .unwrap()
        .iter()
        .filter(|e| e.kind == Kind::Message)
        .map(|e| (e.seq, e.payload.clone()))
        .collect()
}

fn check(name: &str, got: &[(u64, Bytes)], want: &[Bytes]) {
    assert_eq!(
        got.len(),
        want.len(),
        "{name}: {} events read back, {} expected",
        got.len(),
        want.len()
    );
    for (k, ((seq, g), w)) in got.iter().zip(want).enumerate() {
        assert_eq!(*seq, k as u64 + 1, "{name}: seq of event {k}");
        if g != w {
            let at = g.iter().zip(w.iter()).position(|(a, b)| a != b);
            panic!(
                "{name}: event {k} (seq {seq}) differs: {} bytes, {} expected, first difference at {at:?}; starts {:?}",
                g.len(),
                w.len(),
                String::from_utf8_lossy(&g[..g.len().min(40)])
            );
        }
    }
}

/// Mixed turns over four sessions (batches from `Log::batch`, so recycled ones), a failed turn
/// of one session in the middle, a restart: every session reads back exactly what was logged of
/// it, the failed session nothing of its failed turn, and every batch handed out is empty.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adv18_reused_buffers_never_leak_across_turns_sessions_or_failures() {
    for durability in [Durability::Fsync, Durability::Relaxed] {
        let dir = tempfile::tempdir().unwrap();
        let c = cfg(dir.path(), durability);
        let (log, _, _) = Log::open(&c, Metrics::new()).await.expect("open");
        let _failures = log.take_failures().unwrap();
        let mut ids = Vec::new();
        let mut sls = Vec::new();
        for _ in 0..4 {
            let id = SessionId::random();
            ids.push(id);
            sls.push(log.create(id, Facade::Legacy, None, None).await.unwrap());
        }
        let mut want: Vec<Vec<Bytes>> = vec![Vec::new(); 4];
        let mut next = [1u64; 4];
        let round = |log: &Arc<Log>,
                     want: &mut Vec<Vec<Bytes>>,
                     next: &mut [u64; 4],
                     sessions: &[usize],
                     r: usize| {
            let mut ops = Vec::new();
            for &s in sessions {
                let mut b = log.batch();
                assert!(
                    b.is_empty(),
                    "a recycled batch holds {} stale events",
                    b.len()
                );
                let n = 1 + (r * 37 + s * 11) % 300;
                for _ in 0..n {
                    b.push(ev(s, next[s]));
                    want[s].push(payload(s, next[s]));
                    next[s] += 1;
                }
                ops.push((s, b));
            }
            ops
        };
        for r in 0..12 {
            for (s, b) in round(&log, &mut want, &mut next, &[0, 1, 2, 3], r) {
                log.append_many_nowait(&sls[s], b).await.unwrap();
            }
        }
        log.flush().await.unwrap();
        // A failed turn of session 0 alone: none of it may be read back, before or after the
        // restart, and nothing of it may end up in a later record.
        let before = want[0].len();
        log.fail_next_writes(&[ErrorKind::StorageFull]);
        let lost = round(&log, &mut want, &mut next, &[0], 99).pop().unwrap().1;
        assert!(log.append_many_nowait(&sls[0], lost).await.is_ok());
        let _ = log.flush().await;
        want[0].truncate(before);
        assert!(sls[0].failed(), "session 0's turn failed");
        wait_ok(&log).await;
        for r in 12..24 {
            for (s, b) in round(&log, &mut want, &mut next, &[1, 2, 3], r) {
                log.append_many_nowait(&sls[s], b).await.unwrap();
            }
        }
        log.flush().await.unwrap();
        for s in 0..4 {
            check(
                &format!("{durability:?} live s{s}"),
                &messages(&log, &sls[s]),
                &want[s],
            );
        }
        log.close().await.unwrap();
        drop(sls);
        drop(log);
        let (log, _, _) = Log::open(&c, Metrics::new()).await.expect("reopen");
        for (s, id) in ids.iter().enumerate() {
            let sl = log.get(id).expect("session recovered");
            check(
                &format!("{durability:?} recovered s{s}"),
                &messages(&log, &sl),
                &want[s],
            );
        }
        log.close().await.unwrap();
    }
}
