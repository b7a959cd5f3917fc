//! The harness's own `text/event-stream` parser, written from the WHATWG "event stream
//! interpretation" algorithm (<https://html.spec.whatwg.org/multipage/server-sent-events.html>)
//! and independent of the proxy's `sse::Decoder`, so the tests do not trust the code under test
//! to read its own output. Kept deliberately simple (byte at a time, no size cap, no zero-copy):
//! it reads test streams, not production traffic.
//!
//! Two departures from a browser, both so the tests can check more, never less:
//! - It works on bytes: data is not decoded as UTF-8 (the legacy face relays a malformed upstream
//!   message byte for byte, and tests compare those bytes).
//! - Besides the spec's persistent "last event ID", each event reports the `id` field set *within
//!   it* (`None` when it had none), so I5 ("only logged events carry an id") is checkable.
//!
//! Its own tests are in `tests/sse_parser.rs`.

use bytes::Bytes;

use super::Ev;

/// UTF-8 byte order mark, ignored once at the very start of a stream.
const BOM: &[u8] = b"\xEF\xBB\xBF";

/// An incremental parser: [`Parser::feed`] takes the body's chunks as they arrive, split anywhere.
#[derive(Debug, Default)]
pub struct Parser {
    /// Bytes seen at the start of the stream while it may still begin with a BOM.
    start: Vec<u8>,
    started: bool,
    line: Vec<u8>,
    /// The previous byte was a CR: a LF right after it ends nothing more.
    after_cr: bool,
    data: Vec<u8>,
    event: Vec<u8>,
    id: Option<String>,
    retry: Option<u64>,
    /// The spec's last event ID buffer (kept across events).
    pub last_event_id: String,
    /// The reconnection time last set by a `retry` field, in ms.
    pub reconnection_ms: Option<u64>,
}

impl Parser {
    /// A parser at the start of a stream.
    pub fn new() -> Self {
        Self::default()
    }

    /// Feeds the next chunk; returns the events it completed, in order.
    pub fn feed(&mut self, chunk: &[u8]) -> Vec<Ev> {
        let mut out = Vec::new();
        let mut rest = chunk;
        if !self.started {
            // The BOM may itself arrive split across chunks.
            let take = (BOM.len() - self.start.len()).min(rest.len());
            self.start.extend_from_slice(&rest[..take]);
            rest = &rest[take..];
            let n = self.start.len();
            if n < BOM.len() && BOM.starts_with(&self.start) {
                return out;
            }
            self.started = true;
            let start = std::mem::take(&mut self.start);
            let body = if start == BOM { &[][..] } else { &start[..] };
            for &b in body {
                self.byte(b, &mut out);
            }
        }
        for &b in rest {
            self.byte(b, &mut out);
        }
        out
    }

    fn byte(&mut self, b: u8, out: &mut Vec<Ev>) {
        let after_cr = std::mem::replace(&mut self.after_cr, false);
        match b {
            b'\n' if after_cr => {} // the LF of a CRLF pair
            b'\n' => self.end_line(out),
            b'\r' => {
                self.after_cr = true;
                self.end_line(out);
            }
            _ => self.line.push(b),
        }
    }

    fn end_line(&mut self, out: &mut Vec<Ev>) {
        let line = std::mem::take(&mut self.line);
        if line.is_empty() {
            self.dispatch(out);
            return;
        }
        if line[0] == b':' {
            return; // a comment
        }
        let (field, value) = match line.iter().position(|&c| c == b':') {
            Some(i) => {
                let v = &line[i + 1..];
                (&line[..i], v.strip_prefix(b" ").unwrap_or(v))
            }
            None => (&line[..], &[][..]),
        };
        match field {
            b"event" => self.event = value.to_vec(),
            b"data" => {
                self.data.extend_from_slice(value);
                self.data.push(b'\n');
            }
            b"id" if !value.contains(&0) => {
                let id = String::from_utf8_lossy(value).into_owned();
                self.last_event_id = id.clone();
                self.id = Some(id);
            }
            b"retry" if !value.is_empty() && value.iter().all(u8::is_ascii_digit) => {
                // Digits only, so this parses unless it overflows (then it is ignored).
                if let Ok(ms) = std::str::from_utf8(value).unwrap_or("x").parse() {
                    self.retry = Some(ms);
                    self.reconnection_ms = Some(ms);
                }
            }
            _ => {} // unknown fields (and a NUL-carrying id) are ignored
        }
    }

    fn dispatch(&mut self, out: &mut Vec<Ev>) {
        let mut data = std::mem::take(&mut self.data);
        let event = std::mem::take(&mut self.event);
        let id = self.id.take();
        let retry = self.retry.take();
        if data.is_empty() {
            // No data line: nothing is dispatched (the id, if any, still set the last event ID).
            return;
        }
        data.pop(); // the LF after the last data line
        out.push(Ev {
            id,
            event: (!event.is_empty()).then(|| String::from_utf8_lossy(&event).into_owned()),
            data: Bytes::from(data),
            retry,
        });
    }
}
