//! Event ids and the contiguity check.
//!
//! Input: `text ‖ \n ‖ cursor fields and ranges (arbitrary)`.
//!
//! * `Cursor::parse` / `SessionId::parse` on arbitrary strings never panic, and what parses is in
//!   canonical form: it displays back to exactly the input, which parses to the same value.
//! * `check_resume` on an arbitrary cursor and arbitrary ranges never panics and answers what its
//!   doc says, checked against the rule written out independently below.
#![no_main]

use arbitrary::{Arbitrary, Unstructured};
use libfuzzer_sys::fuzz_target;
use mcp_resume_proxy::log::cursor::{
    check_resume, Cursor, EpochRange, LogRanges, Refusal, SessionId,
};

/// What follows the text line of the input.
#[derive(Arbitrary, Debug)]
struct Input {
    epoch: u32,
    seq: u64,
    epochs: Vec<(u32, u64, Option<u64>)>,
    oldest: u64,
    head: u64,
    need_cursor_event: bool,
}

fuzz_target!(|bytes: &[u8]| {
    // The text is the input up to its first newline; the rest describes the ranges.
    let (text, rest) = match bytes.iter().position(|&b| b == b'\n') {
        Some(i) => (&bytes[..i], &bytes[i + 1..]),
        None => (bytes, &[][..]),
    };
    let text = String::from_utf8_lossy(text);
    let text = text.as_ref();
    let Ok(input) = Input::arbitrary_take_rest(Unstructured::new(rest)) else {
        return;
    };
    if let Some(id) = SessionId::parse(text) {
        assert_eq!(id.to_string(), text);
        assert_eq!(SessionId::parse(&id.to_string()), Some(id));
    }
    // The parsed cursor from the text, else one built from the structured fields.
    let parsed = Cursor::parse(text);
    if let Some(c) = parsed {
        let shown = c.to_string();
        assert_eq!(shown, text, "a parsed cursor displays as its input");
        assert_eq!(Cursor::parse(&shown), Some(c));
        assert!(c.epoch >= 1 && c.seq >= 1);
    }
    let cursor = parsed.unwrap_or(Cursor {
        session: SessionId([7; 16]),
        epoch: input.epoch,
        seq: input.seq,
    });
    // Any built cursor with epoch, seq >= 1 round-trips too.
    if cursor.epoch >= 1 && cursor.seq >= 1 {
        assert_eq!(Cursor::parse(&cursor.to_string()), Some(cursor));
    }

    let log = LogRanges {
        epochs: input
            .epochs
            .iter()
            .map(|&(epoch, first, last)| EpochRange { epoch, first, last })
            .collect(),
        oldest: input.oldest,
        head: input.head,
    };
    let got = check_resume(&cursor, &log, input.need_cursor_event);
    assert_eq!(got, expected(&cursor, &log, input.need_cursor_event));
});

/// The documented contract, spelled out: the cursor's epoch must be known (its first listed
/// range), the cursor must lie within that epoch's logged range (its durable end when sealed, the
/// head when open), and the first event the reader needs — the cursor's own when asked, else the
/// next — must not have been trimmed when it exists. Success hands back the cursor's seq.
fn expected(c: &Cursor, log: &LogRanges, need: bool) -> Result<u64, Refusal> {
    let Some(range) = log.epochs.iter().find(|e| e.epoch == c.epoch) else {
        return Err(Refusal::UnknownEpoch);
    };
    let end = range.last.unwrap_or(log.head);
    if c.seq > end {
        return Err(Refusal::CursorAhead);
    }
    if c.seq < range.first {
        return Err(Refusal::UnknownEpoch);
    }
    // In u128 so that "the event after u64::MAX" exists as a number and is never retained.
    let first_needed = u128::from(c.seq) + u128::from(!need);
    if first_needed < u128::from(log.oldest) && first_needed <= u128::from(log.head) {
        return Err(Refusal::CursorTrimmed);
    }
    Ok(c.seq)
}
