//! The `inspect` subcommand: reads a data directory (while no proxy holds it) and prints its
//! sessions — state, epochs, retained range, head — or the events of one session.

use std::io::Write;
use std::path::Path;

use bytes::Bytes;

use crate::log::cursor::{Cursor, SessionId};
use crate::log::{key, Event, Kind, SessionMeta};

/// Prints the sessions of the log in `dir`, or the events of `session`.
///
/// # Errors
/// A message when the directory cannot be opened (e.g. a running proxy holds it) or read.
pub fn run(dir: &Path, session: Option<&str>, out: &mut dyn Write) -> Result<(), String> {
    if !dir.join("conf").exists() && !dir.join("db").exists() {
        return Err(format!(
            "{} is not a mcp-resume-proxy data directory",
            dir.display()
        ));
    }
    let db = sled::Config::new().path(dir).open().map_err(|e| {
        format!(
            "cannot open {} (is a proxy running on it?): {e}",
            dir.display()
        )
    })?;
    let t = |name: &str| db.open_tree(name).map_err(|e| e.to_string());
    let (sessions, events) = (t("sessions")?, t("events")?);
    let w = |e: std::io::Error| e.to_string();
    match session {
        None => {
            writeln!(
                out,
                "{:<32}  {:<10}  {:<13}  {:>8}  {:>8}  {:>8}  epochs",
                "session", "facade", "state", "oldest", "head", "events"
            )
            .map_err(w)?;
            for item in sessions.iter() {
                let (k, v) = item.map_err(|e| e.to_string())?;
                let Ok(b) = <[u8; 16]>::try_from(&k[..]) else {
                    continue;
                };
                let id = SessionId(b);
                let meta: SessionMeta = serde_json::from_slice(&v).map_err(|e| e.to_string())?;
                let (mut first, mut last, mut count) = (None, None, 0u64);
                for item in events.scan_prefix(id.0) {
                    let (k, v) = item.map_err(|e| e.to_string())?;
                    let (Some((_, f)), Some((n, _))) =
                        (key::parse_event_key(&k), key::chunk_info(&v))
                    else {
                        return Err(format!("session {id}: corrupt chunk"));
                    };
                    first.get_or_insert(f);
                    last = Some(f + n - 1);
                    count += n;
                }
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
                writeln!(
                    out,
                    "{id}  {:<10}  {:<13}  {:>8}  {:>8}  {:>8}  {}",
                    meta.facade.as_str(),
                    state,
                    first.map(|f| f.to_string()).unwrap_or("-".into()),
                    last.map(|f| f.to_string()).unwrap_or("-".into()),
                    count,
                    epochs.join(" ")
                )
                .map_err(w)?;
            }
        }
        Some(s) => {
            let id = SessionId::parse(s)
                .ok_or_else(|| format!("`{s}` is not a session id (32 lowercase hex)"))?;
            if sessions.get(id.0).map_err(|e| e.to_string())?.is_none() {
                return Err(format!("session {id} is not in this log"));
            }
            for item in events.scan_prefix(id.0) {
                let (k, v) = item.map_err(|e| e.to_string())?;
                let Some((_, first)) = key::parse_event_key(&k) else {
                    continue;
                };
                let Some(chunk) = key::decode_chunk(first, Bytes::from_owner(v)) else {
                    writeln!(out, "{first}: <corrupt chunk>").map_err(w)?;
                    continue;
                };
                for ev in chunk {
                    print_event(out, &id, &ev).map_err(w)?;
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
