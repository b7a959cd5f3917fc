//! The resume check both faces share (design.md §4, §10, §11): one path from a `Last-Event-ID` to
//! either the session log and the seq to read after, or the answer that refuses it.
//!
//! In order: the cursor parses (else 400 `malformed_cursor`); it names the session the request
//! names, where the face names one (else 409 `foreign_session`); this proxy holds that session's
//! log and the caller may use it on this face (else 404 `unknown_session`, the same answer whether
//! the session does not exist or belongs to someone else); its history is complete (else 503
//! `store_error` while a storage failure's end is pending); the cursor is contiguous with what is
//! retained (else the §4 refusal); and an ended session has more than its end marker left after
//! the cursor (else 404, like any ended session: a stream that would end at once makes an
//! `EventSource` reconnect forever, and one whose cursor is the end marker would never end).

use std::sync::Arc;

use super::http::{error_response, refusal, Caller, Resp};
use super::Ctx;
use crate::domain::Facade;
use crate::error::{Error, StoreError};
use crate::log::cursor::{check_resume, Cursor, LogRanges, Refusal};
use crate::log::{Kind, SessionLog};

/// A resume that may be served.
pub struct Resumable {
    /// The cursor.
    pub cursor: Cursor,
    /// The session's log.
    pub sl: Arc<SessionLog>,
    /// Its ranges when checked.
    pub ranges: LogRanges,
    /// Deliver events after this seq.
    pub after: u64,
}

/// Checks a resume on `face`. `named` is the session the request names besides the cursor (the
/// Streamable face's `Mcp-Session-Id`). `need_cursor_event` asks that the cursor's own event be
/// retained (the Streamable face reads it to learn the cursor's stream).
///
/// # Errors
/// The answer that refuses the resume (counted and logged).
pub async fn check(
    ctx: &Ctx,
    caller: &Caller,
    face: Facade,
    last_event_id: &str,
    named: Option<&str>,
    need_cursor_event: bool,
) -> Result<Resumable, Box<Resp>> {
    let m = &ctx.reg.metrics;
    let log = &ctx.reg.log;
    let Some(cursor) = Cursor::parse(last_event_id) else {
        return Err(Box::new(refusal(
            m,
            Refusal::MalformedCursor,
            last_event_id,
            None,
            None,
        )));
    };
    if named.is_some_and(|n| cursor.session.to_string() != n) {
        return Err(Box::new(refusal(
            m,
            Refusal::ForeignSession,
            last_event_id,
            Some(cursor.session),
            None,
        )));
    }
    let found = match log.lookup(&cursor.session).await {
        Ok(f) => f,
        // Whether the session exists cannot be told: 503, never 404 (the client retries).
        Err(e) => return Err(Box::new(error_response(&e, None))),
    };
    let sl = found
        .filter(|sl| !sl.removed())
        .filter(|sl| ctx.admits(caller, sl.identity.as_ref(), sl.facade, face));
    let Some(sl) = sl else {
        return Err(Box::new(refusal(
            m,
            Refusal::UnknownSession,
            last_event_id,
            Some(cursor.session),
            None,
        )));
    };
    if sl.failed() {
        // Events of this session were lost to a storage failure and its end is not logged yet:
        // no history can be served as complete until it is.
        return Err(Box::new(error_response(
            &Error::Store(StoreError::Unavailable),
            None,
        )));
    }
    let mut ranges = sl.ranges();
    let mut checked = check_resume(&cursor, &ranges, need_cursor_event);
    if checked.is_err() && log.is_shared() {
        // This replica's view may be behind the shared record (another replica took the
        // session over, in a later epoch): the record decides, never a stale copy.
        match log.refresh(&sl).await {
            Ok(true) => {
                ranges = sl.ranges();
                checked = check_resume(&cursor, &ranges, need_cursor_event);
            }
            Ok(false) => {}
            Err(e) => return Err(Box::new(error_response(&e, None))),
        }
    }
    let after = match checked {
        Ok(a) => a,
        Err(r) => {
            return Err(Box::new(refusal(
                m,
                r,
                last_event_id,
                Some(cursor.session),
                Some((log, &sl)),
            )))
        }
    };
    if sl.ended().is_some() && nothing_left(ctx, &sl, after).await {
        return Err(Box::new(error_response(&Error::UnknownSession, None)));
    }
    Ok(Resumable {
        cursor,
        sl,
        ranges,
        after,
    })
}

/// Of an ended session: is nothing but the end marker left after `after` — the next event is the
/// end marker, or `after` is the end marker itself? (While the end is still being logged, neither
/// holds yet: the stream is served and ends at the marker.)
async fn nothing_left(ctx: &Ctx, sl: &SessionLog, after: u64) -> bool {
    let log = &ctx.reg.log;
    match log.read_after(sl, after, 1).await {
        Ok(evs) if !evs.is_empty() => evs[0].kind == Kind::End,
        Ok(_) => matches!(log.event_at(sl, after).await, Ok(Some(ev)) if ev.kind == Kind::End),
        Err(_) => false,
    }
}
