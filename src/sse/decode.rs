//! Incremental WHATWG `text/event-stream` decoder.
//!
//! Implements the "event stream interpretation" algorithm of the HTML spec
//! (<https://html.spec.whatwg.org/multipage/server-sent-events.html#event-stream-interpretation>)
//! over a growing [`BytesMut`], so it works directly on whatever chunking the
//! network delivers: events and even CRLF pairs or the BOM may be split at any
//! byte. Design points:
//!
//! * Zero-copy hot path: an event with one `data:` line (the MCP norm) gets its
//!   payload as a slice of the input buffer, never copied.
//! * Each byte is scanned for a line end once, even when a line arrives in
//!   many chunks.
//! * Memory is bounded by `max_event_bytes`: an oversized event is streamed
//!   through and discarded (keeping only 512-byte snippets of its data for
//!   error reporting) instead of being buffered.
//!
//! An incomplete event at end of stream is never returned (the spec discards
//! it too), so there is no EOF flush.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use std::borrow::Cow;
use std::fmt;

/// UTF-8 byte order mark, stripped once at the very start of a stream.
const BOM: &[u8] = b"\xEF\xBB\xBF";

/// Bytes of an oversized event's data kept at each end for error reporting.
const SNIPPET: usize = 512;

/// Event types the proxy compares against, returned as these statics: nearly every upstream
/// event is `event: message`, and an owned copy of it was one heap allocation per event.
const KNOWN_TYPES: [&str; 2] = ["message", "endpoint"];

/// One dispatched SSE event.
///
/// `data` may be a slice of the decoder's input buffer; holding it keeps that
/// buffer's allocation alive, so don't hoard events indefinitely.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// `event:` field; None when absent or empty (WHATWG default type "message").
    /// Borrowed for the types the proxy knows (`message`, `endpoint`), so the
    /// common event allocates nothing for it; any other type is owned, as sent
    /// (lossy UTF-8).
    pub event: Option<Cow<'static, str>>,
    /// Data lines joined with '\n' (final newline removed). Zero-copy slice of
    /// the input when the event had exactly one `data:` line.
    pub data: Bytes,
    /// `id:` field as last set *within this event* (None if this event had no
    /// id line). Ids containing NUL are ignored per WHATWG.
    pub id: Option<String>,
    /// `retry:` field if it was all ASCII digits (else ignored).
    pub retry: Option<u64>,
}

/// Why [`Decoder::decode`] could not produce an event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DecodeError {
    /// An event's accumulated field bytes exceeded the cap. The decoder has
    /// discarded the event and resynchronised at the next blank line: calling
    /// `decode()` again continues with the next event.
    EventTooLarge {
        /// Total bytes of the event's lines (terminators and comment lines
        /// excluded); always more than the cap.
        len: usize,
        /// First up to 512 bytes of the event's data (lines joined with
        /// '\n'), so the caller can try to recover a JSON-RPC `id`.
        head: Bytes,
        /// Last up to 512 bytes of the event's data.
        tail: Bytes,
    },
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DecodeError::EventTooLarge { len, .. } => {
                write!(f, "SSE event too large ({len} bytes exceeds the limit)")
            }
        }
    }
}

impl std::error::Error for DecodeError {}

/// Data buffer of the event being assembled.
#[derive(Debug)]
enum Data {
    /// Exactly one `data:` line: zero-copy slice of the input.
    One(Bytes),
    /// Several lines, joined with '\n' (no trailing newline).
    Many(BytesMut),
}

impl Data {
    fn as_slice(&self) -> &[u8] {
        match self {
            Data::One(b) => b,
            Data::Many(b) => b,
        }
    }
}

/// State of an event that exceeded the cap and is being discarded.
#[derive(Debug, Default)]
struct Overflow {
    head: Vec<u8>,
    /// Recent data bytes; trimmed lazily to amortise the shifting.
    tail: Vec<u8>,
    /// Whether a data line was seen (the next one needs a '\n' separator).
    data_seen: bool,
}

impl Overflow {
    fn start_data_line(&mut self) {
        if self.data_seen {
            self.push(b"\n");
        }
        self.data_seen = true;
    }

    fn push(&mut self, bytes: &[u8]) {
        if self.head.len() < SNIPPET {
            let n = (SNIPPET - self.head.len()).min(bytes.len());
            self.head.extend_from_slice(&bytes[..n]);
        }
        if bytes.len() >= SNIPPET {
            self.tail.clear();
            self.tail.extend_from_slice(&bytes[bytes.len() - SNIPPET..]);
        } else {
            self.tail.extend_from_slice(bytes);
            if self.tail.len() > 2 * SNIPPET {
                self.tail.drain(..self.tail.len() - SNIPPET);
            }
        }
    }

    fn finish(self, len: usize) -> DecodeError {
        let start = self.tail.len().saturating_sub(SNIPPET);
        DecodeError::EventTooLarge {
            len,
            head: Bytes::from(self.head),
            tail: Bytes::copy_from_slice(&self.tail[start..]),
        }
    }
}

/// What to do with the rest of a line that is being streamed through instead
/// of buffered (it is too long, or belongs to an oversized event).
#[derive(Debug, Clone, Copy)]
enum Skip {
    Comment,
    /// `strip_space`: the line so far ended right after the colon, so a
    /// leading space of the next bytes must still be removed.
    Data {
        strip_space: bool,
    },
    Other,
}

/// Field names the decoder acts on.
enum Field {
    Data,
    Event,
    Id,
    Retry,
    Other,
}

/// Incremental SSE decoder; feed it a growing buffer, pull events out.
#[derive(Debug)]
pub struct Decoder {
    max_event_bytes: usize,
    comments: u64,
    /// No byte consumed yet: a BOM may still have to be stripped.
    at_start: bool,
    /// The last line ended in a CR that was the last byte of the buffer; a
    /// leading LF of the next bytes belongs to that line end.
    skip_lf: bool,
    /// Prefix of the buffer already known to contain no CR/LF.
    scanned: usize,
    /// Set while the current (partial) line is being streamed through.
    skip: Option<Skip>,
    /// Bytes of the current event's non-comment lines.
    event_len: usize,
    event_type: Option<Cow<'static, str>>,
    id: Option<String>,
    retry: Option<u64>,
    data: Option<Data>,
    overflow: Option<Overflow>,
}

impl Decoder {
    /// `max_event_bytes`: cap on the total bytes of one event's lines (line
    /// terminators and comment lines excluded). It bounds the memory held per
    /// stream, whatever the upstream sends.
    pub fn new(max_event_bytes: usize) -> Self {
        Decoder {
            max_event_bytes,
            comments: 0,
            at_start: true,
            skip_lf: false,
            scanned: 0,
            skip: None,
            event_len: 0,
            event_type: None,
            id: None,
            retry: None,
            data: None,
            overflow: None,
        }
    }

    /// Number of comment lines (starting with ':') seen so far, e.g. keepalives.
    /// Lets the caller observe upstream liveness without seeing events.
    pub fn comments_seen(&self) -> u64 {
        self.comments
    }

    /// Consume complete lines from `buf` (advancing it) and return the next
    /// dispatched event.
    ///
    /// `Ok(None)` = need more bytes: everything consumable was consumed; partial
    /// line bytes stay in `buf` or in the decoder's state. Call in a loop until
    /// `Ok(None)`, then append more bytes to the *same* `buf` (the decoder
    /// remembers how far it already scanned it). After an error, just keep
    /// calling: the oversized event has been skipped.
    pub fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<Event>, DecodeError> {
        if self.at_start {
            let n = buf.len().min(BOM.len());
            if buf[..n] != BOM[..n] {
                self.at_start = false;
            } else if n == BOM.len() {
                buf.advance(n);
                self.at_start = false;
            } else {
                // Empty, or a possibly split BOM: wait to decide.
                return Ok(None);
            }
        }
        loop {
            if self.skip_lf {
                match buf.first() {
                    None => return Ok(None),
                    Some(&b) => {
                        if b == b'\n' {
                            buf.advance(1);
                        }
                        self.skip_lf = false;
                    }
                }
            }
            if self.skip.is_some() {
                if !self.stream_skipped(buf) {
                    return Ok(None);
                }
                // A streamed line is never blank, so it cannot dispatch.
                self.consume_eol(buf);
                continue;
            }
            let from = self.scanned.min(buf.len());
            let Some(end) = find_eol(&buf[from..]).map(|i| from + i) else {
                self.scanned = buf.len();
                if self.begin_skip(buf) {
                    continue;
                }
                return Ok(None);
            };
            self.scanned = 0;
            let result = self.line(buf, end);
            self.consume_eol(buf);
            if let Some(result) = result {
                return result.map(Some);
            }
        }
    }

    /// Consumes the line end at `buf[0]` (CR, LF or CRLF).
    fn consume_eol(&mut self, buf: &mut BytesMut) {
        if buf[0] == b'\r' {
            match buf.get(1) {
                Some(&b'\n') => buf.advance(2),
                Some(_) => buf.advance(1),
                None => {
                    buf.advance(1);
                    self.skip_lf = true;
                }
            }
        } else {
            buf.advance(1);
        }
    }

    /// Processes the complete line `buf[..end]` and consumes it (not its line
    /// end). Returns a result when the line was a dispatching blank line.
    fn line(&mut self, buf: &mut BytesMut, end: usize) -> Option<Result<Event, DecodeError>> {
        if end == 0 {
            return self.dispatch();
        }
        let line = &buf[..end];
        if line[0] == b':' {
            self.comments += 1;
            buf.advance(end);
            return None;
        }
        self.event_len = self.event_len.saturating_add(end);
        if self.overflow.is_none() && self.event_len > self.max_event_bytes {
            self.enter_overflow();
        }
        let (name_end, value_start) = match line.iter().position(|&b| b == b':') {
            Some(c) => (
                c,
                if line.get(c + 1) == Some(&b' ') {
                    c + 2
                } else {
                    c + 1
                },
            ),
            None => (end, end),
        };
        let field = match &line[..name_end] {
            b"data" => Field::Data,
            b"event" => Field::Event,
            b"id" => Field::Id,
            b"retry" => Field::Retry,
            _ => Field::Other,
        };
        let value = &line[value_start..];
        if let Some(ov) = &mut self.overflow {
            if let Field::Data = field {
                ov.start_data_line();
                ov.push(value);
            }
            buf.advance(end);
            return None;
        }
        match field {
            Field::Data => match self.data.take() {
                None => {
                    buf.advance(value_start);
                    let v = buf.split_to(end - value_start).freeze();
                    self.data = Some(Data::One(v));
                    return None;
                }
                Some(Data::One(first)) => {
                    let mut m = BytesMut::with_capacity(2 * (first.len() + 1 + value.len()));
                    m.extend_from_slice(&first);
                    m.put_u8(b'\n');
                    m.extend_from_slice(value);
                    self.data = Some(Data::Many(m));
                }
                Some(Data::Many(mut m)) => {
                    m.reserve(1 + value.len());
                    m.put_u8(b'\n');
                    m.extend_from_slice(value);
                    self.data = Some(Data::Many(m));
                }
            },
            Field::Event => self.event_type = Some(event_type(value)),
            Field::Id => {
                if !value.contains(&0) {
                    self.id = Some(lossy(value));
                }
            }
            Field::Retry => {
                if let Some(ms) = parse_digits(value) {
                    self.retry = Some(ms);
                }
            }
            Field::Other => {}
        }
        buf.advance(end);
        None
    }

    /// Blank line: dispatch the event (if it has data) and reset event state.
    fn dispatch(&mut self) -> Option<Result<Event, DecodeError>> {
        let len = std::mem::take(&mut self.event_len);
        let event_type = self.event_type.take();
        let id = self.id.take();
        let retry = self.retry.take();
        let data = self.data.take();
        if let Some(ov) = self.overflow.take() {
            return Some(Err(ov.finish(len)));
        }
        let data = match data? {
            Data::One(b) => b,
            Data::Many(m) => m.freeze(),
        };
        Some(Ok(Event {
            event: event_type.filter(|t| !t.is_empty()),
            data,
            id,
            retry,
        }))
    }

    /// The event exceeded the cap: drop what was kept, remember snippets.
    fn enter_overflow(&mut self) {
        let mut ov = Overflow {
            head: Vec::with_capacity(SNIPPET),
            ..Overflow::default()
        };
        if let Some(d) = self.data.take() {
            ov.data_seen = true;
            ov.push(d.as_slice());
        }
        self.event_type = None;
        self.id = None;
        self.retry = None;
        self.overflow = Some(ov);
    }

    /// `buf` holds only a partial line (no CR/LF). If keeping it would break
    /// the memory cap, consume it and switch to streaming the rest of the
    /// line; returns whether that happened.
    fn begin_skip(&mut self, buf: &mut BytesMut) -> bool {
        let Some(&first) = buf.first() else {
            return false;
        };
        let len = buf.len();
        if first == b':' {
            if self.overflow.is_none() && len <= self.max_event_bytes {
                return false;
            }
            self.comments += 1;
            self.skip = Some(Skip::Comment);
        } else {
            if self.overflow.is_none() && self.event_len.saturating_add(len) <= self.max_event_bytes
            {
                return false;
            }
            let skip = match buf.iter().position(|&b| b == b':') {
                Some(c) if &buf[..c] == b"data" => match buf.get(c + 1) {
                    None => Skip::Data { strip_space: true },
                    Some(_) => Skip::Data { strip_space: false },
                },
                Some(_) => Skip::Other,
                // Might still become a `data` line: wait (at most 4 bytes held).
                None if b"data".starts_with(buf) => return false,
                None => Skip::Other,
            };
            if self.overflow.is_none() {
                self.enter_overflow();
            }
            self.event_len = self.event_len.saturating_add(len);
            if let (Skip::Data { strip_space }, Some(ov)) = (skip, self.overflow.as_mut()) {
                ov.start_data_line();
                if !strip_space {
                    // `data:` is buf[..5] and at least one value byte follows.
                    ov.push(&buf[5 + usize::from(buf[5] == b' ')..]);
                }
            }
            self.skip = Some(skip);
        }
        buf.advance(len);
        self.scanned = 0;
        true
    }

    /// Streams the skipped line's bytes out of `buf`; returns true when its
    /// line end was reached (the CR/LF is then at `buf[0]`, not consumed).
    fn stream_skipped(&mut self, buf: &mut BytesMut) -> bool {
        let eol = find_eol(buf);
        let n = eol.unwrap_or(buf.len());
        let chunk = &buf[..n];
        match &mut self.skip {
            Some(Skip::Comment) | None => {}
            Some(Skip::Other) => self.event_len = self.event_len.saturating_add(n),
            Some(Skip::Data { strip_space }) => {
                self.event_len = self.event_len.saturating_add(n);
                let mut value = chunk;
                if *strip_space && !value.is_empty() {
                    if value[0] == b' ' {
                        value = &value[1..];
                    }
                    *strip_space = false;
                }
                if let Some(ov) = &mut self.overflow {
                    ov.push(value);
                }
            }
        }
        buf.advance(n);
        if eol.is_some() {
            self.skip = None;
        }
        eol.is_some()
    }
}

fn lossy(v: &[u8]) -> String {
    String::from_utf8_lossy(v).into_owned()
}

/// An `event:` value: one of [`KNOWN_TYPES`] when it is exactly that (borrowed), else its lossy
/// UTF-8 text (owned; empty stays empty, dispatch turns it into `None`).
fn event_type(v: &[u8]) -> Cow<'static, str> {
    match KNOWN_TYPES.iter().find(|t| t.as_bytes() == v) {
        Some(&t) => Cow::Borrowed(t),
        None => Cow::Owned(lossy(v)),
    }
}

/// Parses a non-empty all-ASCII-digit value; None otherwise or on overflow.
fn parse_digits(v: &[u8]) -> Option<u64> {
    if v.is_empty() {
        return None;
    }
    v.iter().try_fold(0u64, |acc, &d| {
        if !d.is_ascii_digit() {
            return None;
        }
        acc.checked_mul(10)?.checked_add(u64::from(d - b'0'))
    })
}

/// Index of the first CR or LF in `hay` (`memchr2`: vectorised with the widest instructions
/// the CPU has, chosen at run time). Looking at the first bytes in place before calling it, as
/// the envelope scan does for strings, measured no better (docs/benchmarks.md round 10).
#[inline]
pub(super) fn find_eol(hay: &[u8]) -> Option<usize> {
    memchr::memchr2(b'\n', b'\r', hay)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    type Item = Result<Event, DecodeError>;

    fn ev(event: Option<&str>, data: &[u8], id: Option<&str>, retry: Option<u64>) -> Event {
        Event {
            event: event.map(|e| Cow::Owned(e.to_owned())),
            data: Bytes::copy_from_slice(data),
            id: id.map(str::to_owned),
            retry,
        }
    }

    fn data(d: &[u8]) -> Event {
        ev(None, d, None, None)
    }

    /// Appends `chunk` and drains all events.
    fn feed(dec: &mut Decoder, buf: &mut BytesMut, chunk: &[u8], out: &mut Vec<Item>) {
        buf.extend_from_slice(chunk);
        loop {
            match dec.decode(buf) {
                Ok(Some(e)) => out.push(Ok(e)),
                Ok(None) => break,
                Err(e) => out.push(Err(e)),
            }
        }
    }

    /// Decodes `input` fed as the given chunks; returns items and comment count.
    fn run_chunks(chunks: &[&[u8]], max: usize) -> (Vec<Item>, u64) {
        let mut dec = Decoder::new(max);
        let mut buf = BytesMut::new();
        let mut out = Vec::new();
        for c in chunks {
            feed(&mut dec, &mut buf, c, &mut out);
        }
        (out, dec.comments_seen())
    }

    fn run(input: &[u8]) -> Vec<Item> {
        run_chunks(&[input], 1 << 20).0
    }

    fn run_sized(input: &[u8], chunk: usize, max: usize) -> (Vec<Item>, u64) {
        let chunks: Vec<&[u8]> = input.chunks(chunk).collect();
        run_chunks(&chunks, max)
    }

    fn oks(events: Vec<Event>) -> Vec<Item> {
        events.into_iter().map(Ok).collect()
    }

    #[test]
    fn lf_crlf_cr_line_endings() {
        let expect = oks(vec![ev(Some("message"), br#"{"a":1}"#, Some("7"), None)]);
        for nl in ["\n", "\r\n", "\r"] {
            let s = format!("event: message{nl}id: 7{nl}data: {{\"a\":1}}{nl}{nl}");
            assert_eq!(run(s.as_bytes()), expect, "line ending {nl:?}");
            for chunk in [1, 2, 3, 5] {
                assert_eq!(run_sized(s.as_bytes(), chunk, 1 << 20).0, expect);
            }
        }
    }

    #[test]
    fn mixed_line_endings() {
        let input = b"data: a\r\ndata: b\rdata: c\n\r\ndata: d\r\r";
        assert_eq!(run(input), oks(vec![data(b"a\nb\nc"), data(b"d")]));
    }

    #[test]
    fn crlf_split_across_chunks_is_one_line_end() {
        // If "\r" | "\n" counted twice, "a" would be dispatched on its own.
        let (out, _) = run_chunks(&[b"data: a\r", b"\ndata: b\r", b"\n\r", b"\n"], 1024);
        assert_eq!(out, oks(vec![data(b"a\nb")]));
        // CR then CR is two line ends even across chunks.
        let (out, _) = run_chunks(&[b"data: x\r", b"\r", b"data: y\r", b"\r"], 1024);
        assert_eq!(out, oks(vec![data(b"x"), data(b"y")]));
        // A trailing CR dispatches without waiting for a possible LF.
        let (out, _) = run_chunks(&[b"data: z\r\r"], 1024);
        assert_eq!(out, oks(vec![data(b"z")]));
    }

    #[test]
    fn every_split_point_matches_whole() {
        let input: &[u8] = b"\xEF\xBB\xBF: hi\r\nevent: e\r\nid: 1\r\ndata: a\r\ndata:b\r\n\r\n\
            retry: 5\rdata: c\r\rdata\n\n:x\n";
        let whole = run(input);
        assert_eq!(
            whole,
            oks(vec![
                ev(Some("e"), b"a\nb", Some("1"), None),
                ev(None, b"c", None, Some(5)),
                data(b""),
            ])
        );
        for i in 0..=input.len() {
            for j in i..=input.len() {
                let (out, comments) =
                    run_chunks(&[&input[..i], &input[i..j], &input[j..]], 1 << 20);
                assert_eq!(out, whole, "split at {i},{j}");
                assert_eq!(comments, 2);
            }
        }
    }

    #[test]
    fn bom_stripped_only_at_start() {
        let input = b"\xEF\xBB\xBFdata: a\n\n\xEF\xBB\xBFdata: b\n\ndata: c\n\n";
        let expect = oks(vec![data(b"a"), data(b"c")]);
        assert_eq!(run(input), expect);
        for chunk in 1..4 {
            assert_eq!(run_sized(input, chunk, 1024).0, expect);
        }
        let (out, _) = run_chunks(&[b"", b"\xEF", b"", b"\xBB", b"\xBF", b"data: a\n\n"], 1024);
        assert_eq!(out, oks(vec![data(b"a")]));
        // Not a BOM: the bytes are part of the first field name (unknown field).
        assert_eq!(
            run(b"\xEF\xBBdata: a\n\ndata: b\n\n"),
            oks(vec![data(b"b")])
        );
        // No BOM at all.
        assert_eq!(run(b"data: a\n\n"), oks(vec![data(b"a")]));
    }

    #[test]
    fn multi_line_data_and_space_handling() {
        let input = b"data: a\ndata:b\ndata:  c\ndata\ndata:\n\n";
        assert_eq!(run(input), oks(vec![data(b"a\nb\n c\n\n")]));
    }

    #[test]
    fn comments_counted_and_ignored() {
        let input = b": ping\n\n:\n\ndata: a\n: inside\ndata: b\n\n";
        let (out, comments) = run_chunks(&[input], 1024);
        assert_eq!(out, oks(vec![data(b"a\nb")]));
        assert_eq!(comments, 3);
    }

    #[test]
    fn empty_data_priming_event_is_dispatched() {
        assert_eq!(
            run(b"id: 42\ndata: \n\n"),
            oks(vec![ev(None, b"", Some("42"), None)])
        );
        assert_eq!(run(b"data:\n\n"), oks(vec![data(b"")]));
        assert_eq!(run(b"data\n\n"), oks(vec![data(b"")]));
        assert_eq!(
            run(b"id: 1\r\nretry: 3000\r\ndata: \r\n\r\n"),
            oks(vec![ev(None, b"", Some("1"), Some(3000))])
        );
    }

    #[test]
    fn no_data_means_no_dispatch_and_state_reset() {
        let input = b"id: 1\nevent: x\nretry: 5\n\ndata: y\n\n";
        assert_eq!(run(input), oks(vec![data(b"y")]));
    }

    #[test]
    fn event_type_reset_after_dispatch() {
        let input = b"event: foo\ndata: a\n\ndata: b\n\nevent: \ndata: c\n\nevent\ndata: d\n\n";
        assert_eq!(
            run(input),
            oks(vec![
                ev(Some("foo"), b"a", None, None),
                data(b"b"),
                data(b"c"),
                data(b"d")
            ])
        );
    }

    #[test]
    fn known_event_types_are_borrowed_others_exact() {
        let types = |input: &[u8]| -> Vec<Option<Cow<'static, str>>> {
            run(input)
                .into_iter()
                .map(|item| item.unwrap().event)
                .collect()
        };
        let got = types(b"event: message\ndata: a\n\nevent:endpoint\ndata: b\n\n");
        assert!(matches!(got[0], Some(Cow::Borrowed("message"))), "{got:?}");
        assert!(matches!(got[1], Some(Cow::Borrowed("endpoint"))), "{got:?}");
        // Near misses of a known type come through exactly as sent, owned.
        let input = b"event: messages\ndata: a\n\nevent: Message\ndata: a\n\n\
            event: messag\ndata: a\n\nevent:  message\ndata: a\n\nevent: mess\0age\ndata: a\n\n\
            event: \xFFmessage\ndata: a\n\nevent: endpoint \ndata: a\n\n";
        let want = [
            "messages",
            "Message",
            "messag",
            " message",
            "mess\0age",
            "\u{FFFD}message",
            "endpoint ",
        ];
        let got = types(input);
        assert_eq!(got.len(), want.len());
        for (g, w) in got.iter().zip(want) {
            assert!(matches!(g, Some(Cow::Owned(s)) if s == w), "{g:?} vs {w:?}");
        }
        // Empty is None; a known type does not outlive its event; the last `event:` line wins.
        let got = types(
            b"event:\ndata: a\n\nevent: message\ndata: b\n\ndata: c\n\n\
            event: message\nevent: x\ndata: d\n\nevent: x\nevent: endpoint\ndata: e\n\n",
        );
        assert_eq!(
            got,
            [
                None,
                Some(Cow::Borrowed("message")),
                None,
                Some(Cow::Borrowed("x")),
                Some(Cow::Borrowed("endpoint"))
            ]
        );
        assert!(matches!(got[4], Some(Cow::Borrowed(_))));
        // A known type set before an event overflowed is dropped with it.
        let (out, _) = run_chunks(&[b"event: message\ndata: 0123456789\n\ndata: ok\n\n"], 12);
        assert_eq!(out[1], Ok(data(b"ok")));
    }

    #[test]
    fn retry_valid_and_invalid() {
        let cases: [(&[u8], Option<u64>); 7] = [
            (b"retry: 3000", Some(3000)),
            (b"retry:0", Some(0)),
            (b"retry: 30a", None),
            (b"retry: ", None),
            (b"retry: -1", None),
            (b"retry:  5", None),
            (b"retry: 99999999999999999999999", None),
        ];
        for (line, want) in cases {
            let mut input = line.to_vec();
            input.extend_from_slice(b"\ndata: x\n\n");
            assert_eq!(
                run(&input),
                oks(vec![ev(None, b"x", None, want)]),
                "{line:?}"
            );
        }
        // Last valid value wins; an invalid one does not clear it.
        assert_eq!(
            run(b"retry: 1\nretry: 2\nretry: x\ndata: x\n\n"),
            oks(vec![ev(None, b"x", None, Some(2))])
        );
    }

    #[test]
    fn id_with_nul_ignored() {
        assert_eq!(
            run(b"id: 1\nid: a\0b\ndata: x\n\n"),
            oks(vec![ev(None, b"x", Some("1"), None)])
        );
        assert_eq!(run(b"id: a\0\ndata: x\n\n"), oks(vec![data(b"x")]));
        assert_eq!(
            run(b"id\ndata: x\n\n"),
            oks(vec![ev(None, b"x", Some(""), None)])
        );
        // Ids are per event.
        assert_eq!(
            run(b"id: 1\ndata: x\n\ndata: y\n\n"),
            oks(vec![ev(None, b"x", Some("1"), None), data(b"y")])
        );
    }

    #[test]
    fn unknown_fields_ignored_and_lossy_utf8() {
        let input = b"foo: bar\nDATA: no\nevent: \xFFx\nid: \xC3\ndata: \xFF\xFE\n\n";
        assert_eq!(
            run(input),
            oks(vec![ev(
                Some("\u{FFFD}x"),
                b"\xFF\xFE",
                Some("\u{FFFD}"),
                None
            )])
        );
    }

    #[test]
    fn single_line_data_is_zero_copy() {
        let mut buf = BytesMut::from(&b"event: message\ndata: {\"jsonrpc\":\"2.0\"}\n\n"[..]);
        let range = buf.as_ptr() as usize..buf.as_ptr() as usize + buf.len();
        let e = Decoder::new(1024).decode(&mut buf).unwrap().unwrap();
        assert_eq!(&e.data[..], b"{\"jsonrpc\":\"2.0\"}");
        assert!(range.contains(&(e.data.as_ptr() as usize)));
        assert!(buf.is_empty());
    }

    #[test]
    fn incomplete_event_is_not_returned() {
        let mut dec = Decoder::new(1024);
        let mut buf = BytesMut::from(&b"data: a\n\ndata: b\ndata: c"[..]);
        assert_eq!(dec.decode(&mut buf), Ok(Some(data(b"a"))));
        assert_eq!(dec.decode(&mut buf), Ok(None));
        assert_eq!(&buf[..], b"data: c", "partial line stays in buf");
        buf.extend_from_slice(b"\n\n");
        assert_eq!(dec.decode(&mut buf), Ok(Some(data(b"b\nc"))));
        assert_eq!(dec.decode(&mut buf), Ok(None));
    }

    fn too_large(len: usize, head: &[u8], tail: &[u8]) -> Item {
        Err(DecodeError::EventTooLarge {
            len,
            head: Bytes::copy_from_slice(head),
            tail: Bytes::copy_from_slice(tail),
        })
    }

    #[test]
    fn oversized_event_then_normal_event() {
        let payload: Vec<u8> = (0..2000u32).map(|i| b'a' + (i % 26) as u8).collect();
        let mut input = b"event: big\nid: 7\ndata: ".to_vec();
        input.extend_from_slice(&payload);
        input.extend_from_slice(b"\r\n: c\ndata: second\n\nevent: ok\ndata: fine\n\n");
        let len = 10 + 5 + 6 + payload.len() + 12;
        let mut full = payload.clone();
        full.extend_from_slice(b"\nsecond");
        let expect = vec![
            too_large(len, &full[..512], &full[full.len() - 512..]),
            Ok(ev(Some("ok"), b"fine", None, None)),
        ];
        for chunk in [1, 7, 100, 1500, input.len()] {
            let (out, comments) = run_sized(&input, chunk, 100);
            assert_eq!(out, expect, "chunk {chunk}");
            assert_eq!(comments, 1);
        }
    }

    #[test]
    fn oversized_small_data_snippets_are_whole_data() {
        let input = b"data: abc\ndata: 0123456789012345678901234567890123456789\n\ndata: ok\n\n";
        let expect = vec![
            too_large(
                9 + 46,
                b"abc\n0123456789012345678901234567890123456789",
                b"abc\n0123456789012345678901234567890123456789",
            ),
            Ok(data(b"ok")),
        ];
        for chunk in [1, 3, 64] {
            assert_eq!(run_sized(input, chunk, 20).0, expect);
        }
        // Oversized without any data line still reports (with empty snippets).
        let input = b"event: xxxxxxxxxxxxxxxxxxxxxxxxx\n\ndata: ok\n\n";
        assert_eq!(run(input).len(), 1);
        assert_eq!(
            run_sized(input, 4, 20).0,
            vec![too_large(32, b"", b""), Ok(data(b"ok"))]
        );
    }

    #[test]
    fn oversized_line_is_streamed_not_buffered() {
        let cap = 1000;
        let mut dec = Decoder::new(cap);
        let mut buf = BytesMut::new();
        let mut out = Vec::new();
        feed(&mut dec, &mut buf, b"data:", &mut out);
        for _ in 0..1000 {
            feed(&mut dec, &mut buf, &[b'x'; 1024], &mut out);
            assert!(buf.len() <= cap, "buffered {}", buf.len());
        }
        feed(&mut dec, &mut buf, b"\n\ndata: next\n\n", &mut out);
        let x = [b'x'; 512];
        assert_eq!(
            out,
            vec![too_large(5 + 1024 * 1000, &x, &x), Ok(data(b"next"))]
        );
    }

    #[test]
    fn long_comment_is_skipped_without_error() {
        let mut input = b": ".to_vec();
        input.extend_from_slice(&[b'k'; 100]);
        input.extend_from_slice(b"\n\ndata: a\n\n");
        for chunk in [1, 8, input.len()] {
            assert_eq!(run_sized(&input, chunk, 16), (oks(vec![data(b"a")]), 1));
        }
    }

    #[test]
    fn error_display() {
        let e = DecodeError::EventTooLarge {
            len: 5,
            head: Bytes::new(),
            tail: Bytes::new(),
        };
        assert_eq!(
            e.to_string(),
            "SSE event too large (5 bytes exceeds the limit)"
        );
    }

    #[test]
    fn find_eol_positions() {
        for len in 0..100 {
            for pos in 0..len {
                for (eol, filler) in [
                    (b'\n', b'a'),
                    (b'\r', b'\t'),
                    (b'\n', 0u8),
                    (b'\n', 0x0b),
                    (b'\r', 0x8d),
                    (b'\r', 0x0c),
                    (b'\n', 0xff),
                ] {
                    let mut v = vec![filler; len];
                    v[pos] = eol;
                    assert_eq!(find_eol(&v), Some(pos));
                    // A second line end after the first does not move it.
                    for later in pos + 1..len.min(pos + 10) {
                        let mut w = v.clone();
                        w[later] = b'\r' ^ b'\n' ^ eol;
                        assert_eq!(find_eol(&w), Some(pos));
                    }
                }
            }
            assert_eq!(find_eol(&vec![b'\t'; len]), None);
        }
    }

    // ---- property tests ----

    /// A source event: fields plus noise, before encoding.
    #[derive(Debug, Clone)]
    struct Src {
        event: Option<String>,
        id: Option<String>,
        retry: Option<u64>,
        data: Vec<Vec<u8>>,
        unknown: bool,
        /// (insert position, text) of comment lines.
        comments: Vec<(usize, String)>,
    }

    fn no_eol_bytes(max: usize) -> impl Strategy<Value = Vec<u8>> {
        prop::collection::vec(
            any::<u8>().prop_map(|b| if b == b'\r' || b == b'\n' { b'x' } else { b }),
            0..max,
        )
    }

    fn src(max_data: usize) -> impl Strategy<Value = Src> {
        (
            prop::option::of("[^\r\n]{1,10}"),
            prop::option::of("[^\\x00\r\n]{0,10}"),
            prop::option::of(any::<u64>()),
            prop::collection::vec(no_eol_bytes(max_data), 0..4),
            any::<bool>(),
            prop::collection::vec((0..8usize, "[^\r\n]{0,10}"), 0..3),
        )
            .prop_map(|(event, id, retry, data, unknown, comments)| Src {
                event,
                id,
                retry,
                data,
                unknown,
                comments,
            })
    }

    impl Src {
        /// Encoded lines (without terminators); the last one is blank.
        fn lines(&self) -> Vec<Vec<u8>> {
            let mut lines = Vec::new();
            if self.unknown {
                lines.push(b"foo: bar".to_vec());
            }
            if let Some(e) = &self.event {
                lines.push(format!("event: {e}").into_bytes());
            }
            if let Some(id) = &self.id {
                lines.push(format!("id: {id}").into_bytes());
            }
            if let Some(r) = self.retry {
                lines.push(format!("retry: {r}").into_bytes());
            }
            for d in &self.data {
                let mut l = b"data: ".to_vec();
                l.extend_from_slice(d);
                lines.push(l);
            }
            for (pos, text) in &self.comments {
                lines.insert(pos % (lines.len() + 1), format!(":{text}").into_bytes());
            }
            lines.push(Vec::new());
            lines
        }

        /// Bytes of non-comment lines, as counted against the cap.
        fn len(&self) -> usize {
            self.lines()
                .iter()
                .filter(|l| !l.starts_with(b":"))
                .map(Vec::len)
                .sum()
        }

        fn joined_data(&self) -> Vec<u8> {
            self.data.join(&b'\n')
        }

        fn expected(&self, max: usize) -> Option<Item> {
            if self.len() > max {
                let d = self.joined_data();
                let n = d.len();
                return Some(too_large(
                    self.len(),
                    &d[..n.min(512)],
                    &d[n - n.min(512)..],
                ));
            }
            if self.data.is_empty() {
                return None;
            }
            Some(Ok(Event {
                event: self.event.clone().map(Cow::Owned),
                data: Bytes::from(self.joined_data()),
                id: self.id.clone(),
                retry: self.retry,
            }))
        }
    }

    /// Encodes events with per-line endings picked from `styles`.
    fn encode_stream(srcs: &[Src], styles: &[u8], bom: bool) -> Vec<u8> {
        let mut out = Vec::new();
        if bom {
            out.extend_from_slice(BOM);
        }
        let mut prev_cr = false;
        let mut i = 0;
        for s in srcs {
            for line in s.lines() {
                let mut style = styles[i % styles.len()] % 3;
                i += 1;
                // CR then an LF-terminated blank line would merge into CRLF.
                if prev_cr && line.is_empty() && style == 0 {
                    style = 1;
                }
                out.extend_from_slice(&line);
                out.extend_from_slice([&b"\n"[..], b"\r\n", b"\r"][style as usize]);
                prev_cr = style == 2;
            }
        }
        out
    }

    fn comment_count(srcs: &[Src]) -> u64 {
        srcs.iter().map(|s| s.comments.len() as u64).sum()
    }

    fn split_at_points<'a>(input: &'a [u8], points: &[prop::sample::Index]) -> Vec<&'a [u8]> {
        let mut cuts: Vec<usize> = points.iter().map(|p| p.index(input.len() + 1)).collect();
        cuts.sort_unstable();
        let mut chunks = Vec::new();
        let mut start = 0;
        for c in cuts {
            chunks.push(&input[start..c]);
            start = c;
        }
        chunks.push(&input[start..]);
        chunks
    }

    proptest! {
        #[test]
        fn prop_chunking_does_not_matter(
            srcs in prop::collection::vec(src(40), 0..8),
            styles in prop::collection::vec(0u8..3, 1..16),
            bom in any::<bool>(),
            points in prop::collection::vec(any::<prop::sample::Index>(), 0..12),
        ) {
            let input = encode_stream(&srcs, &styles, bom);
            let max = 1 << 20;
            let expected: Vec<Item> = srcs.iter().filter_map(|s| s.expected(max)).collect();
            let whole = run_chunks(&[&input], max);
            prop_assert_eq!(&whole.0, &expected);
            prop_assert_eq!(whole.1, comment_count(&srcs));
            let chunked = run_chunks(&split_at_points(&input, &points), max);
            prop_assert_eq!(chunked, whole.clone());
            prop_assert_eq!(run_sized(&input, 1, max), whole);
        }

        #[test]
        fn prop_oversized_events_are_skipped(
            srcs in prop::collection::vec(src(1500), 0..6),
            styles in prop::collection::vec(0u8..3, 1..8),
            max in 0usize..3000,
            chunk in 1usize..300,
        ) {
            let input = encode_stream(&srcs, &styles, false);
            let expected: Vec<Item> = srcs.iter().filter_map(|s| s.expected(max)).collect();
            prop_assert_eq!(&run_chunks(&[&input], max).0, &expected);
            // Chunked, checking the memory bound after every chunk.
            let mut dec = Decoder::new(max);
            let mut buf = BytesMut::new();
            let mut out = Vec::new();
            for c in input.chunks(chunk) {
                feed(&mut dec, &mut buf, c, &mut out);
                prop_assert!(buf.len() <= max.max(4), "buffered {} > cap {}", buf.len(), max);
            }
            prop_assert_eq!(out, expected);
            prop_assert_eq!(dec.comments_seen(), comment_count(&srcs));
        }
    }
}
