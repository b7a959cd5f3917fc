//! The `inspect` subcommand: reads a data directory (while no proxy holds it) through the log's
//! read-only [`Image`] — the same scan recovery starts from — and prints its sessions (state,
//! epochs, retained range, head) or the events of one session.

use std::io::Write;
use std::path::Path;

use crate::log::cursor::{Cursor, SessionId};
use crate::log::image::Image;
use crate::log::segment;
use crate::log::{Event, Kind};

/// Prints the sessions of the log in `dir`, or the events of `session`.
///
/// # Errors
/// A message when the directory cannot be read (e.g. a running proxy holds it).
pub fn run(dir: &Path, session: Option<&str>, out: &mut dyn Write) -> Result<(), String> {
    if segment::has_sled_files(dir) {
        return Err(format!(
            "{} holds a log in the sled format of mcp-resume-proxy 0.1, which this version does not read",
            dir.display()
        ));
    }
    if !dir.join(segment::LOCK_FILE).exists() && segment::list(&crate::log::io::OsDir::new(dir)).map_or(true, |s| s.is_empty()) {
        return Err(format!(
            "{} is not a mcp-resume-proxy data directory",
            dir.display()
        ));
    }
    let _lock = segment::lock(dir, false)
        .map_err(|e| e.to_string())?
        .ok_or_else(|| format!("{} is in use (is a proxy running on it?)", dir.display()))?;
    let img = Image::scan(dir).map_err(|e| e.to_string())?;
    let w = |e: std::io::Error| e.to_string();
    match session {
        None => {
            writeln!(
                out,
                "{:<32}  {:<10}  {:<13}  {:>8}  {:>8}  {:>8}  epochs",
                "session", "facade", "state", "oldest", "head", "events"
            )
            .map_err(w)?;
            for (id, s) in &img.sessions {
                let Some((meta, _)) = &s.meta else { continue };
                let r = s.retained();
                let state = match meta.ended {
                    None => "live".to_string(),
                    Some(r) => format!("ended:{}", r.as_str()),
                };
                let epochs: Vec<String> = meta
                    .epochs
                    .iter()
                    .map(|e| match e.last {
                        Some(l) => format!("{}[{}..={}]", e.epoch, e.first, l),
                        None => format!("{}[{}..]", e.epoch, e.first),
                    })
                    .collect();
                let (oldest, head) = if r.chunks.is_empty() {
                    ("-".to_string(), "-".to_string())
                } else {
                    (r.oldest.to_string(), r.head.to_string())
                };
                writeln!(
                    out,
                    "{id}  {:<10}  {:<13}  {:>8}  {:>8}  {:>8}  {}",
                    meta.facade.as_str(),
                    state,
                    oldest,
                    head,
                    (r.head + 1).saturating_sub(r.oldest),
                    epochs.join(" ")
                )
                .map_err(w)?;
            }
            writeln!(
                out,
                "# {} segments, {} records; last stop {}",
                img.segments.len(),
                img.records,
                if img.clean { "clean" } else { "unclean" }
            )
            .map_err(w)?;
            if let Some(at) = img.torn_at {
                writeln!(out, "# the newest segment ends in a torn write at offset {at} (cut off when a proxy next opens the log)").map_err(w)?;
            }
            for d in &img.damage {
                writeln!(out, "# damage: {d}").map_err(w)?;
            }
        }
        Some(s) => {
            let id = SessionId::parse(s)
                .ok_or_else(|| format!("`{s}` is not a session id (32 lowercase hex)"))?;
            let sess = img
                .sessions
                .get(&id)
                .ok_or_else(|| format!("session {id} is not in this log"))?;
            let r = sess.retained();
            for c in &r.chunks {
                let evs = img.read_chunk(c).map_err(|e| e.to_string())?;
                for ev in evs.iter().filter(|e| e.seq >= r.oldest) {
                    print_event(out, &id, ev).map_err(w)?;
                }
            }
        }
    }
    Ok(())
}

fn print_event(out: &mut dyn Write, id: &SessionId, ev: &Event) -> std::io::Result<()> {
    let kind = match ev.kind {
        Kind::Message => "message",
        Kind::Priming => "priming",
        Kind::Final => "final",
        Kind::End => "end",
    };
    let stream = match ev.stream.0 {
        0 => "legacy".to_string(),
        1 => "standalone".to_string(),
        n => format!("post{}", n - 2),
    };
    let cursor = Cursor {
        session: *id,
        epoch: ev.epoch,
        seq: ev.seq,
    };
    writeln!(
        out,
        "{cursor}  {kind:<7}  {stream:<10}  {}",
        String::from_utf8_lossy(&ev.payload)
    )
}
