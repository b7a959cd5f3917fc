//! Unit tests of the log: order, reads from the window and from the segments, trimming, recovery,
//! epochs, torn tails, failed writes, compaction and the total bound. Write failures are injected
//! (`fail_next_writes`): a file system cannot be made to fail one chosen write on demand in a unit
//! test; the integration tests fill and break a real tmpfs.

use super::*;
use crate::config::{Durability, LogConfig};
use crate::log::cursor::{check_resume, Cursor, Refusal};
use bytes::Bytes;
use std::io::ErrorKind;

fn cfg(dir: &std::path::Path, durability: Durability) -> LogConfig {
    LogConfig {
        dir: dir.to_path_buf(),
        durability,
        max_events_per_session: 1000,
        max_bytes_per_session: 1 << 20,
        max_total_bytes: 1 << 30,
        store_error_exit_secs: 60,
        ..LogConfig::default()
    }
}

fn msg(i: u64) -> NewEvent {
    NewEvent::new(
        StreamTag::LEGACY,
        Kind::Message,
        Bytes::from(format!(
            "{{\"jsonrpc\":\"2.0\",\"method\":\"n\",\"params\":{{\"i\":{i}}}}}"
        )),
    )
}

/// The `i` of a [`msg`] payload.
fn msg_i(payload: &[u8]) -> u64 {
    let v: serde_json::Value = serde_json::from_slice(payload).unwrap();
    v["params"]["i"].as_u64().unwrap()
}

async fn open(c: &LogConfig) -> (Arc<Log>, Recovery, Vec<Interrupted>) {
    Log::open(c, Metrics::new()).await.expect("open log")
}

/// Ends what recovery handed back, as the proxy does.
async fn end_interrupted(log: &Log, interrupted: Vec<Interrupted>) {
    let m = Metrics::new();
    for i in interrupted {
        crate::session::end_log(log, &m, &i.log, EndReason::UpstreamLost, i.inflight).await;
    }
}

/// Every retained event of `sl` with its `i`, read from seq 0.
fn all(log: &Log, sl: &SessionLog) -> Vec<(u64, Kind)> {
    log.read_held(sl, 0, 1_000_000)
        .unwrap()
        .iter()
        .map(|e| (e.seq, e.kind))
        .collect()
}

#[tokio::test]
async fn appends_get_consecutive_seqs_and_read_back_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let (log, rec, live) = open(&cfg(dir.path(), Durability::Fsync)).await;
    assert_eq!((rec.sessions, live.len()), (0, 0));
    let sl = log
        .create(SessionId::random(), Facade::Legacy, None, None)
        .await
        .unwrap();
    for i in 1..=500 {
        log.append_nowait(&sl, msg(i)).await.unwrap();
    }
    log.flush().await.unwrap();
    assert_eq!(sl.head(), 500);
    // From the window (recent) and from the segment (older than the window): same answer.
    for after in [0u64, 10, 371, 499] {
        let evs = log.read_held(&sl, after, 1000).unwrap();
        let seqs: Vec<u64> = evs.iter().map(|e| e.seq).collect();
        assert_eq!(
            seqs,
            ((after + 1)..=500).collect::<Vec<_>>(),
            "after {after}"
        );
        assert!(evs.iter().all(|e| e.epoch == 1 && e.kind == Kind::Message));
        for e in &evs {
            assert_eq!(msg_i(&e.payload), e.seq);
        }
    }
    assert!(log.read_held(&sl, 500, 10).unwrap().is_empty());
    assert_eq!(
        log.read_held(&sl, 3, 4).unwrap().len(),
        4,
        "max is honoured"
    );
    log.close().await.unwrap();
}

#[tokio::test]
async fn retention_trims_oldest_by_count_and_bytes_never_the_head() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = cfg(dir.path(), Durability::Relaxed);
    c.max_events_per_session = 100;
    let (log, _, _) = open(&c).await;
    let sl = log
        .create(SessionId::random(), Facade::Legacy, None, None)
        .await
        .unwrap();
    for i in 1..=250 {
        log.append(&sl, msg(i)).await.unwrap();
    }
    let r = sl.ranges();
    assert_eq!(r.head, 250);
    assert!(r.head + 1 - r.oldest <= 100, "{r:?}");
    assert!(r.oldest > 150);
    // Reading from before the retained window returns the oldest retained first: a gap the
    // caller must see.
    let evs = log.read_held(&sl, 10, 5).unwrap();
    assert_eq!(evs[0].seq, r.oldest);
    let cur = Cursor {
        session: sl.id,
        epoch: 1,
        seq: 10,
    };
    assert_eq!(check_resume(&cur, &r, false), Err(Refusal::CursorTrimmed));
    // Byte bound: one large event pushes out older ones.
    let big = NewEvent::new(
        StreamTag::LEGACY,
        Kind::Message,
        Bytes::from(vec![b'x'; 2 << 20]),
    );
    log.append(&sl, big).await.unwrap();
    let r = sl.ranges();
    assert_eq!(r.oldest, r.head, "only the (oversized) head is left: {r:?}");
    assert_eq!(sl.bytes(), 2 << 20);
    log.close().await.unwrap();
}

#[tokio::test]
async fn chunked_turns_trim_exactly_and_read_back_from_every_cursor() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = cfg(dir.path(), Durability::Fsync);
    c.max_events_per_session = 300;
    let (log, _, _) = open(&c).await;
    let id = SessionId::random();
    let sl = log.create(id, Facade::Legacy, None, None).await.unwrap();
    // One op, so one turn, stored as chunks of up to 256 events. Trimming to 90% of 300 keeps
    // 731..=1000, which starts inside the third chunk (513..=768).
    let evs: Vec<NewEvent> = (1..=1000).map(msg).collect();
    log.append_many_nowait(&sl, evs).await.unwrap();
    log.flush().await.unwrap();
    let r = sl.ranges();
    assert_eq!((r.oldest, r.head), (731, 1000));
    let bytes: u64 = (731..=1000).map(|i| msg(i).payload.len() as u64).sum();
    assert_eq!(sl.bytes(), bytes);
    let check = |log: &Log, sl: &SessionLog, head: u64| {
        for after in 700..=head {
            let evs = log.read_held(sl, after, 10_000).unwrap();
            let first = (after + 1).max(731);
            let seqs: Vec<u64> = evs.iter().map(|e| e.seq).collect();
            assert_eq!(seqs, (first..=head).collect::<Vec<_>>(), "after {after}");
            for e in evs.iter().filter(|e| e.kind == Kind::Message) {
                assert_eq!(msg_i(&e.payload), e.seq, "payload of {}", e.seq);
            }
        }
    };
    check(&log, &sl, 1000);
    log.close().await.unwrap();
    drop((log, sl));

    // Recovery reads the trim record: same range, same bytes (the boundary chunk counted exactly).
    let (log, rec, live) = open(&c).await;
    assert_eq!(rec.events, 270);
    assert_eq!(live.len(), 1);
    let sl = log.get(&id).unwrap();
    assert_eq!(sl.bytes(), bytes);
    end_interrupted(&log, live).await;
    let r = sl.ranges();
    assert_eq!((r.oldest, r.head), (731, 1001), "plus the end marker");
    check(&log, &sl, 1001);
    log.close().await.unwrap();
}

#[tokio::test]
async fn clean_restart_keeps_the_epoch_and_hands_back_live_sessions_with_what_they_owe() {
    let dir = tempfile::tempdir().unwrap();
    let c = cfg(dir.path(), Durability::Relaxed);
    let (log, _, _) = open(&c).await;
    let id = SessionId::random();
    let sl = log.create(id, Facade::Legacy, None, None).await.unwrap();
    log.append(&sl, msg(1)).await.unwrap();
    log.inflight_add(&sl, "7", StreamTag::LEGACY).await.unwrap();
    log.inflight_add(&sl, "\"done\"", StreamTag::LEGACY)
        .await
        .unwrap();
    log.inflight_add(&sl, "9", StreamTag::LEGACY).await.unwrap();
    log.inflight_done(&sl, "9").await.unwrap();
    let mut answer = NewEvent::new(
        StreamTag::LEGACY,
        Kind::Message,
        Bytes::from_static(br#"{"jsonrpc":"2.0","id":"done","result":{}}"#),
    );
    answer.completes = Some("\"done\"".into());
    log.append(&sl, answer).await.unwrap();
    assert_eq!(
        log.inflight_on(&sl, StreamTag::LEGACY),
        vec!["7".to_string()]
    );
    log.close().await.unwrap();
    drop((log, sl));

    let (log, rec, live) = open(&c).await;
    assert!(rec.clean);
    assert_eq!(
        (rec.sessions, rec.live, rec.inflight, rec.sealed),
        (1, 1, 1, 0)
    );
    assert_eq!(live[0].inflight, vec![("7".to_string(), StreamTag::LEGACY)]);
    let sl = log.get(&id).unwrap();
    assert_eq!(sl.ended(), None, "ending it is the caller's job");
    end_interrupted(&log, live).await;
    assert_eq!(sl.ended(), Some(EndReason::UpstreamLost));
    assert!(sl.end_published());
    let r = sl.ranges();
    assert_eq!(r.epochs.len(), 1, "clean stop: no seal");
    let evs = log.read_held(&sl, 2, 10).unwrap();
    assert_eq!(evs.len(), 2, "abort for request 7, then the end marker");
    let abort: serde_json::Value = serde_json::from_slice(&evs[0].payload).unwrap();
    assert_eq!(abort["id"], 7);
    assert_eq!(abort["error"]["code"], crate::jsonrpc::INFLIGHT_ABORTED);
    assert_eq!(evs[1].kind, Kind::End);
    assert_eq!(evs[1].seq, 4);
    // An ended log takes no more events.
    assert!(log.append(&sl, msg(99)).await.is_err());
    assert!(log.inflight_on(&sl, StreamTag::LEGACY).is_empty());
    log.close().await.unwrap();
    drop((log, sl));

    // Ended sessions stay ended and owe nothing on the next start.
    let (log, rec, live) = open(&c).await;
    assert_eq!((rec.sessions, rec.live, live.len()), (1, 0, 0));
    assert_eq!(all(&log, &log.get(&id).unwrap()).len(), 4);
    log.close().await.unwrap();
}

/// After any unclean stop, in either durability mode, the epoch is sealed at what survived
/// (design.md §10b: a disk may drop what it acknowledged, so `fsync` is no proof either).
#[tokio::test]
async fn unclean_stop_seals_the_epoch_in_both_modes() {
    for (first, then) in [
        (Durability::Relaxed, Durability::Relaxed),
        (Durability::Relaxed, Durability::Fsync),
        (Durability::Fsync, Durability::Relaxed),
        (Durability::Fsync, Durability::Fsync),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let (log, _, _) = open(&cfg(dir.path(), first)).await;
        let id = SessionId::random();
        let sl = log.create(id, Facade::Legacy, None, None).await.unwrap();
        for i in 1..=20 {
            log.append(&sl, msg(i)).await.unwrap();
        }
        log.flush().await.unwrap();
        log.crash().await;
        drop(sl);

        let (log, rec, live) = open(&cfg(dir.path(), then)).await;
        assert!(!rec.clean);
        assert_eq!(rec.sealed, 1, "{first:?} then {then:?}");
        end_interrupted(&log, live).await;
        let sl = log.get(&id).unwrap();
        let r = sl.ranges();
        assert_eq!(r.head, 21, "the end marker follows the 20 events");
        let end = log.read_held(&sl, 20, 1).unwrap();
        assert_eq!(r.epochs[0].last, Some(20));
        assert_eq!((r.epochs[1].epoch, r.epochs[1].first), (2, 21));
        assert_eq!(end[0].epoch, 2, "events after the seal carry the new epoch");
        let ahead = Cursor {
            session: id,
            epoch: 1,
            seq: 21,
        };
        assert_eq!(check_resume(&ahead, &r, false), Err(Refusal::CursorAhead));
        let ok = Cursor {
            session: id,
            epoch: 1,
            seq: 20,
        };
        assert_eq!(check_resume(&ok, &r, false), Ok(20));
        log.close().await.unwrap();
    }
}

/// A clean stop keeps the epoch.
#[tokio::test]
async fn a_clean_stop_keeps_the_epoch() {
    let dir = tempfile::tempdir().unwrap();
    let c = cfg(dir.path(), Durability::Relaxed);
    let (log, _, _) = open(&c).await;
    let sl = log
        .create(SessionId::random(), Facade::Legacy, None, None)
        .await
        .unwrap();
    log.append(&sl, msg(1)).await.unwrap();
    log.close().await.unwrap();
    drop(log);
    let (log, rec, _) = open(&c).await;
    assert!(rec.clean);
    assert_eq!(rec.sealed, 0);
    assert_eq!(log.get(&sl.id).unwrap().ranges().epochs.len(), 1);
    log.close().await.unwrap();
}

/// A crash during recovery (here: right after it, before the interrupted sessions were ended)
/// loses no seal decision: the next start seals again, in an epoch of its own, and every id the
/// first epoch held is still refused past its durable end.
#[tokio::test]
async fn a_crash_after_recovery_seals_again() {
    let dir = tempfile::tempdir().unwrap();
    let (log, _, _) = open(&cfg(dir.path(), Durability::Relaxed)).await;
    let id = SessionId::random();
    let sl = log.create(id, Facade::Legacy, None, None).await.unwrap();
    for i in 1..=5 {
        log.append(&sl, msg(i)).await.unwrap();
    }
    log.flush().await.unwrap();
    log.crash().await;
    drop(sl);
    let (log, rec, _live) = open(&cfg(dir.path(), Durability::Fsync)).await;
    assert_eq!(rec.sealed, 1);
    assert_eq!(log.get(&id).unwrap().ranges().epochs[0].last, Some(5));
    // Crashed before ending the interrupted session.
    log.crash().await;
    let (log, rec, live) = open(&cfg(dir.path(), Durability::Fsync)).await;
    assert_eq!((rec.sealed, live.len()), (1, 1));
    let r = log.get(&id).unwrap().ranges();
    assert_eq!(r.epochs.len(), 3, "sealed again, in a new epoch");
    assert_eq!((r.epochs[1].first, r.epochs[1].last), (6, Some(5)));
    assert_eq!((r.epochs[2].epoch, r.epochs[2].first), (3, 6));
    log.close().await.unwrap();
}

#[tokio::test]
async fn remove_deletes_a_session_and_its_bytes_for_good() {
    let dir = tempfile::tempdir().unwrap();
    let c = cfg(dir.path(), Durability::Fsync);
    let (log, _, _) = open(&c).await;
    let keep = log
        .create(SessionId::random(), Facade::Legacy, None, None)
        .await
        .unwrap();
    log.append(&keep, msg(1)).await.unwrap();
    let base = log.total_bytes();
    let sl = log
        .create(SessionId::random(), Facade::Legacy, None, None)
        .await
        .unwrap();
    for i in 1..=10 {
        log.append_nowait(&sl, msg(i)).await.unwrap();
    }
    log.flush().await.unwrap();
    assert!(log.total_bytes() > base);
    log.remove(&sl.id).await.unwrap();
    assert_eq!(log.total_bytes(), base);
    assert!(log.get(&sl.id).is_none());
    assert!(sl.removed());
    log.crash().await;
    let (log, rec, _) = open(&c).await;
    assert_eq!(rec.sessions, 1);
    assert!(log.get(&sl.id).is_none() && log.get(&keep.id).is_some());
    log.close().await.unwrap();
}

/// A write cut off by a crash (the newest segment ends mid-record) is cut at recovery; records
/// before it are intact, and nothing after it is read.
#[tokio::test]
async fn a_torn_tail_is_cut_and_the_rest_survives() {
    let dir = tempfile::tempdir().unwrap();
    let c = cfg(dir.path(), Durability::Fsync);
    let (log, _, _) = open(&c).await;
    let id = SessionId::random();
    let sl = log.create(id, Facade::Legacy, None, None).await.unwrap();
    for i in 1..=30 {
        log.append(&sl, msg(i)).await.unwrap();
    }
    let newest = *log.segment_ids().last().unwrap();
    let path = dir.path().join(segment::file_name(newest));
    let good = std::fs::metadata(&path).unwrap().len();
    log.append(&sl, msg(31)).await.unwrap();
    log.crash().await;
    drop(sl);
    // Tear the last record: keep half of it, as a crash mid-write would.
    let full = std::fs::metadata(&path).unwrap().len();
    let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    f.set_len(good + (full - good) / 2).unwrap();
    drop(f);

    let (log, rec, live) = open(&c).await;
    assert!(rec.torn_bytes > 0);
    assert_eq!(
        std::fs::metadata(&path).unwrap().len(),
        good + record::MARK_LEN as u64,
        "cut back to the torn turn's mark"
    );
    let sl = log.get(&id).unwrap();
    assert_eq!(sl.head(), 30);
    end_interrupted(&log, live).await;
    let evs = all(&log, &sl);
    assert_eq!(evs.len(), 31);
    assert_eq!(
        evs[30],
        (31, Kind::End),
        "the end marker took seq 31 (never acknowledged before)"
    );
    log.close().await.unwrap();
}

/// The end marker survived but the meta saying "ended" (written after it) was torn off: the
/// session is ended, not interrupted.
#[tokio::test]
async fn an_end_marker_without_its_meta_still_ends_the_session() {
    let dir = tempfile::tempdir().unwrap();
    let c = cfg(dir.path(), Durability::Fsync);
    let (log, _, _) = open(&c).await;
    let id = SessionId::random();
    let sl = log.create(id, Facade::Legacy, None, None).await.unwrap();
    log.append(&sl, msg(1)).await.unwrap();
    let newest = *log.segment_ids().last().unwrap();
    let path = dir.path().join(segment::file_name(newest));
    log.end(&sl, EndReason::ClientDelete, Vec::new())
        .await
        .unwrap();
    log.crash().await;
    drop(sl);
    // Cut the last record (the ended meta).
    let img = Image::scan(dir.path()).unwrap();
    let meta_loc = img.sessions[&id].meta.as_ref().unwrap().1;
    assert_eq!(meta_loc.seg, newest);
    let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    f.set_len(meta_loc.off + 3).unwrap();
    drop(f);
    let (log, rec, live) = open(&c).await;
    assert_eq!((rec.live, live.len()), (0, 0));
    let sl = log.get(&id).unwrap();
    assert_eq!(sl.ended(), Some(EndReason::ClientDelete));
    assert!(sl.end_published());
    log.close().await.unwrap();
}

/// Out of space (injected ENOSPC, partly written): the turn is cut off and rejected, seqs roll
/// back (no hole), the session is reported and takes no more events, health is degraded; the end
/// is retried and written once writes succeed, and health returns. Nothing of the failed turn is
/// ever read, before or after a restart.
#[tokio::test]
async fn out_of_space_rejects_the_turn_reports_the_session_and_recovers() {
    let dir = tempfile::tempdir().unwrap();
    let c = cfg(dir.path(), Durability::Fsync);
    let (log, _, _) = open(&c).await;
    let mut failures = log.take_failures().unwrap();
    let mut health = log.health();
    let id = SessionId::random();
    let sl = log.create(id, Facade::Legacy, None, None).await.unwrap();
    let other = log
        .create(SessionId::random(), Facade::Legacy, None, None)
        .await
        .unwrap();
    for i in 1..=10 {
        log.append(&sl, msg(i)).await.unwrap();
    }
    log.inflight_add(&sl, "5", StreamTag::LEGACY).await.unwrap();
    log.fail_next_writes(&[ErrorKind::StorageFull, ErrorKind::StorageFull]);
    let evs: Vec<NewEvent> = (0..300).map(|i| msg(9000 + i)).collect();
    assert!(log
        .append(&sl, evs.into_iter().next().unwrap())
        .await
        .is_err());
    assert_eq!(failures.recv().await, Some(id));
    assert_eq!(*health.borrow_and_update(), Health::Degraded);
    assert!(sl.failed());
    assert_eq!(sl.head(), 10);
    // The session takes no more events (they would hide the lost ones behind contiguous ids).
    assert!(log.append(&sl, msg(11)).await.is_err());
    // Its end is kept: the second injected failure rejects it once, then the retry writes it.
    let m = Metrics::new();
    crate::session::end_log(
        &log,
        &m,
        &sl,
        EndReason::StoreError,
        vec![("5".into(), StreamTag::LEGACY)],
    )
    .await;
    tokio::time::timeout(
        std::time::Duration::from_secs(5),
        health.wait_for(|h| *h == Health::Ok),
    )
    .await
    .expect("health returns")
    .unwrap();
    tokio::time::timeout(std::time::Duration::from_secs(5), async {
        while !sl.end_published() {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the end is written");
    assert!(!sl.failed());
    let got = all(&log, &sl);
    assert_eq!(
        got.len(),
        12,
        "10 events, the abort of request 5, the end: {got:?}"
    );
    assert_eq!(got[10], (11, Kind::Message));
    assert_eq!(got[11], (12, Kind::End));
    // Other sessions go on.
    log.append(&other, msg(1)).await.unwrap();
    log.close().await.unwrap();
    drop((log, sl));
    let (log, rec, live) = open(&c).await;
    assert_eq!(
        (rec.live, live.len()),
        (1, 1),
        "only the other session was live"
    );
    let sl = log.get(&id).unwrap();
    let evs = log.read_held(&sl, 0, 100).unwrap();
    assert_eq!(evs.len(), 12);
    for e in evs.iter().take(10) {
        assert_eq!(msg_i(&e.payload), e.seq);
    }
    log.close().await.unwrap();
}

/// Any other write failure (an I/O error, a read-only file system) fails the log for good: no
/// more writes; the process is to exit and recover on restart.
#[tokio::test]
async fn an_io_error_fails_the_log_for_good() {
    for kind in [ErrorKind::ReadOnlyFilesystem, ErrorKind::Other] {
        let dir = tempfile::tempdir().unwrap();
        let c = cfg(dir.path(), Durability::Relaxed);
        let (log, _, _) = open(&c).await;
        let health = log.health();
        let sl = log
            .create(SessionId::random(), Facade::Legacy, None, None)
            .await
            .unwrap();
        log.append(&sl, msg(1)).await.unwrap();
        log.fail_next_writes(&[kind]);
        assert!(log.append(&sl, msg(2)).await.is_err());
        assert_eq!(*health.borrow(), Health::Failed);
        let e = log
            .create(SessionId::random(), Facade::Legacy, None, None)
            .await
            .unwrap_err();
        assert!(matches!(e, Error::Store(StoreError::Unavailable)), "{e:?}");
        log.crash().await;
        let (log, rec, _) = open(&c).await;
        assert_eq!(rec.events, 1, "{kind:?}");
        log.close().await.unwrap();
    }
}

/// Many sessions come and go: compaction copies the live records of old segments forward and
/// deletes them, so the files stay within a small factor of the live bytes; every retained event
/// reads back, before and after a restart.
#[tokio::test]
async fn compaction_keeps_the_files_near_the_live_records() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = cfg(dir.path(), Durability::Relaxed);
    c.max_total_bytes = 8 << 20; // 1 MiB segments
    c.max_events_per_session = 200;
    let (log, _, _) = open(&c).await;
    let keep = log
        .create(SessionId::random(), Facade::Legacy, None, None)
        .await
        .unwrap();
    let mut written = 0u64;
    for round in 0..150u64 {
        let sl = log
            .create(SessionId::random(), Facade::Legacy, None, None)
            .await
            .unwrap();
        let evs: Vec<NewEvent> = (1..=1500).map(|i| msg(round * 10_000 + i)).collect();
        written += evs.iter().map(|e| e.payload.len() as u64).sum::<u64>();
        log.append_many_nowait(&sl, evs).await.unwrap();
        log.append_many_nowait(&keep, (1..=20).map(|i| msg(round * 20 + i)).collect())
            .await
            .unwrap();
        log.end(&sl, EndReason::ClientDelete, Vec::new())
            .await
            .unwrap();
        log.remove(&sl.id).await.unwrap();
    }
    log.flush().await.unwrap();
    // Let the writer finish compacting.
    for _ in 0..200 {
        log.flush().await.unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    let (disk, live) = (log.disk_bytes(), log.total_bytes());
    assert!(
        written > 4 * disk,
        "dead data went: wrote ~{written} B, {disk} B on disk"
    );
    assert!(
        disk <= live + live / 3 + 3 * (1 << 20),
        "disk {disk} vs live {live}"
    );
    let on_disk: u64 = log
        .segment_ids()
        .iter()
        .map(|id| {
            std::fs::metadata(dir.path().join(segment::file_name(*id)))
                .unwrap()
                .len()
        })
        .sum();
    assert_eq!(on_disk, disk, "the gauge is what the files hold");
    let check = |log: &Log, sl: &SessionLog| {
        let r = sl.ranges();
        let evs = log.read_held(sl, r.oldest - 1, 10_000).unwrap();
        let seqs: Vec<u64> = evs.iter().map(|e| e.seq).collect();
        assert_eq!(seqs, (r.oldest..=r.head).collect::<Vec<_>>());
        for e in evs.iter().filter(|e| e.kind == Kind::Message) {
            assert_eq!(msg_i(&e.payload), e.seq);
        }
    };
    check(&log, &keep);
    log.crash().await;
    let (log, rec, _) = open(&c).await;
    assert_eq!(rec.sessions, 1, "removed sessions stay removed: {rec:?}");
    let keep2 = log.get(&keep.id).unwrap();
    assert_eq!(keep2.ranges().head, keep.ranges().head);
    assert_eq!(keep2.ranges().oldest, keep.ranges().oldest);
    check(&log, &keep2);
    log.close().await.unwrap();
}

/// `log.max_total_bytes` holds: ended sessions are evicted first (oldest end first), then the
/// largest live session is trimmed.
#[tokio::test]
async fn the_total_bound_evicts_ended_sessions_then_trims_live_ones() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = cfg(dir.path(), Durability::Relaxed);
    c.max_total_bytes = 128 * 1024;
    c.max_bytes_per_session = 256 * 1024;
    c.max_events_per_session = 100_000;
    let (log, _, _) = open(&c).await;
    let payload = |n: usize| {
        NewEvent::new(
            StreamTag::LEGACY,
            Kind::Message,
            Bytes::from(format!("{{\"pad\":\"{}\"}}", "x".repeat(n))),
        )
    };
    let ended = log
        .create(SessionId::random(), Facade::Legacy, None, None)
        .await
        .unwrap();
    for _ in 0..40 {
        log.append(&ended, payload(1000)).await.unwrap();
    }
    log.end(&ended, EndReason::ClientDelete, Vec::new())
        .await
        .unwrap();
    let live = log
        .create(SessionId::random(), Facade::Legacy, None, None)
        .await
        .unwrap();
    for _ in 0..150 {
        log.append(&live, payload(1000)).await.unwrap();
        assert!(
            log.total_bytes() <= c.max_total_bytes,
            "{}",
            log.total_bytes()
        );
    }
    assert!(log.get(&ended.id).is_none(), "the ended session went first");
    assert!(live.ranges().oldest > 1, "then the live one was trimmed");
    let r = live.ranges();
    let evs = log.read_held(&live, r.oldest - 1, 1000).unwrap();
    assert_eq!(evs.len() as u64, r.head + 1 - r.oldest);
    log.close().await.unwrap();
}

/// Readers racing the writer's trims and compaction on a multi-threaded runtime: every read is
/// contiguous, matches its payloads, and starts after its cursor unless the cursor's successor
/// was trimmed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_racing_trims_are_contiguous_or_report_the_trim() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = cfg(dir.path(), Durability::Relaxed);
    c.max_events_per_session = 200;
    c.max_total_bytes = 4 << 20;
    let (log, _, _) = open(&c).await;
    let sl = log
        .create(SessionId::random(), Facade::Legacy, None, None)
        .await
        .unwrap();
    const TOTAL: u64 = 60_000;
    let reader = {
        let (log, sl) = (log.clone(), sl.clone());
        std::thread::spawn(move || {
            let (mut reads, mut gaps) = (0u64, 0u64);
            let mut x = 0x9e37_79b9_7f4a_7c15u64;
            while sl.head() < TOTAL {
                let r = sl.ranges();
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                // Old cursors (often trimmed by the time the read runs) and ones in the window.
                let after = r.oldest.saturating_sub(20) + x % (r.head - r.oldest.min(r.head) + 21);
                let evs = log.read_held(&sl, after, 300).unwrap();
                reads += 1;
                let Some(first) = evs.first() else { continue };
                if first.seq != after + 1 {
                    assert!(first.seq > after + 1, "read after {after} went back");
                    assert!(
                        after + 1 < sl.ranges().oldest,
                        "read after {after} skipped to {} with nothing trimmed",
                        first.seq
                    );
                    gaps += 1;
                }
                for w in evs.windows(2) {
                    assert_eq!(w[1].seq, w[0].seq + 1, "hole in a read after {after}");
                }
                for e in &evs {
                    assert_eq!(msg_i(&e.payload), e.seq);
                }
            }
            (reads, gaps)
        })
    };
    for i in 1..=TOTAL {
        log.append_nowait(&sl, msg(i)).await.unwrap();
    }
    log.flush().await.unwrap();
    let (reads, gaps) = reader.join().unwrap();
    assert!(reads > 100, "the reader ran: {reads} reads, {gaps} trimmed");
    assert!(
        log.segment_ids().len() < 6,
        "compaction kept up: {:?}",
        log.segment_ids()
    );
    log.close().await.unwrap();
}

#[tokio::test]
async fn a_sled_data_dir_is_refused_with_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("conf"), b"segment_size: 524288").unwrap();
    std::fs::write(dir.path().join("db"), b"").unwrap();
    let e = Log::open(&cfg(dir.path(), Durability::Fsync), Metrics::new())
        .await
        .unwrap_err();
    assert!(e.to_string().contains("sled format"), "{e}");
}
