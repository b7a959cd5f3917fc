//! SSE frame encoders.
//!
//! The proxy re-emits upstream events under its own ids and adds priming and
//! keepalive frames. Every frame is built in one exactly pre-sized allocation
//! (a `Vec` whose length equals its capacity converts to [`Bytes`] without
//! reallocating), because this runs once per event on every stream.
//!
//! Values that must fit on one line (`id`, `event`, comment text) have CR/LF
//! replaced with spaces so a hostile or sloppy value cannot inject fields.

use super::decode::find_eol;
use bytes::Bytes;

/// `id: {id}\nevent: {event}\ndata: {line}\n...\n\n`; `event` line omitted when
/// None; data split into one `data:` line per line of `data` (split on CR, LF
/// and CRLF, so a payload that contains newlines round-trips through a WHATWG
/// decoder as the same bytes with '\n' joins). `id` None → no id line.
///
/// Empty `data` still yields one `data: ` line, so the event is dispatched.
/// CR/LF inside `id`/`event` become spaces; an id containing NUL would be
/// ignored by decoders, so callers must not produce one.
pub fn event(id: Option<&str>, event: Option<&str>, data: &[u8]) -> Bytes {
    let mut out = Vec::new();
    let size = event_into(&mut out, id, event, data);
    finish(out, size)
}

/// Appends the frame [`event`] builds to `out` (one exact reservation) and returns its length.
/// A client stream packs the frames of consecutive events into one buffer this way.
pub fn event_into(out: &mut Vec<u8>, id: Option<&str>, event: Option<&str>, data: &[u8]) -> usize {
    let mut size = 1; // final blank line
    if let Some(id) = id {
        size += ID.len() + id.len() + 1;
    }
    if let Some(ev) = event {
        size += EVENT.len() + ev.len() + 1;
    }
    // A payload without line breaks (compact JSON, the norm) is one `data:` line: scanned once.
    let one_line = find_eol(data).is_none();
    if one_line {
        size += DATA.len() + data.len() + 1;
    } else {
        for line in lines(data) {
            size += DATA.len() + line.len() + 1;
        }
    }
    reserve(out, size);
    if let Some(id) = id {
        push_field(out, ID, id.as_bytes());
    }
    if let Some(ev) = event {
        push_field(out, EVENT, ev.as_bytes());
    }
    if one_line {
        push_data(out, data);
    } else {
        for line in lines(data) {
            push_data(out, line);
        }
    }
    out.push(b'\n');
    size
}

/// Appends `data: {line}\n`.
fn push_data(out: &mut Vec<u8>, line: &[u8]) {
    out.extend_from_slice(DATA);
    out.extend_from_slice(line);
    out.push(b'\n');
}

/// `id: {id}\nevent: message\n` and the `data:` lines of `data` (as [`event_into`] writes them),
/// for an id the proxy built ([`crate::log::cursor::Cursor::write_id`]: hex digits and colons, no
/// line break to replace, so neither it nor the event type is searched for one). Every event a
/// client stream delivers is framed here.
pub fn message_into(out: &mut Vec<u8>, id: &[u8], data: &[u8]) -> usize {
    debug_assert!(find_eol(id).is_none(), "a built id has no line break");
    if find_eol(data).is_some() {
        return event_into(
            out,
            Some(std::str::from_utf8(id).expect("a built id is ASCII")),
            Some("message"),
            data,
        );
    }
    // `MESSAGE` holds the id's line end.
    let size = ID.len() + id.len() + MESSAGE.len() + DATA.len() + data.len() + MESSAGE_TAIL.len();
    reserve(out, size);
    out.extend_from_slice(ID);
    out.extend_from_slice(id);
    out.extend_from_slice(MESSAGE);
    out.extend_from_slice(DATA);
    out.extend_from_slice(data);
    out.extend_from_slice(MESSAGE_TAIL);
    size
}

/// The head of [`message_into`]'s frame for a one-line `data` sent on its own (a large payload
/// goes to the client as it is, not copied into a frame): `id: {id}\nevent: message\ndata: `.
/// The payload and [`MESSAGE_TAIL`] follow.
pub fn message_head_into(out: &mut Vec<u8>, id: &[u8]) {
    debug_assert!(find_eol(id).is_none(), "a built id has no line break");
    out.reserve(ID.len() + id.len() + MESSAGE.len() + DATA.len());
    out.extend_from_slice(ID);
    out.extend_from_slice(id);
    out.extend_from_slice(MESSAGE);
    out.extend_from_slice(DATA);
}

/// Whether `data` is one line (no CR or LF): a frame's single `data:` line holds it as it is.
pub fn one_line(data: &[u8]) -> bool {
    find_eol(data).is_none()
}

/// What ends a frame after its one-line payload ([`message_head_into`]).
pub const MESSAGE_TAIL: &[u8] = b"\n\n";

/// Priming event: `id: {id}\n` then `retry: {ms}\n` if Some, then `data: \n\n`.
///
/// Gives the client a resumption point (and optionally a reconnect delay)
/// before the first real event; the empty `data:` line makes decoders
/// dispatch it.
pub fn priming(id: &str, retry_ms: Option<u64>) -> Bytes {
    let mut out = Vec::new();
    let size = priming_into(&mut out, id, retry_ms);
    finish(out, size)
}

/// Appends the frame [`priming`] builds to `out` and returns its length.
pub fn priming_into(out: &mut Vec<u8>, id: &str, retry_ms: Option<u64>) -> usize {
    let mut digits = [0u8; 20];
    let retry = retry_ms.map(|ms| format_u64(ms, &mut digits));
    let mut size = ID.len() + id.len() + 1 + PRIMING_TAIL.len();
    if let Some(r) = retry {
        size += RETRY.len() + r.len() + 1;
    }
    reserve(out, size);
    push_field(out, ID, id.as_bytes());
    if let Some(r) = retry {
        push_field(out, RETRY, r);
    }
    out.extend_from_slice(PRIMING_TAIL);
    size
}

/// Comment frame `: {text}\n\n` (keepalive). CR/LF in `text` are replaced with
/// spaces so the frame stays a single comment line.
pub fn comment(text: &str) -> Bytes {
    let size = COMMENT.len() + text.len() + 2;
    let mut out = Vec::with_capacity(size);
    push_field(&mut out, COMMENT, text.as_bytes());
    out.push(b'\n');
    finish(out, size)
}

const ID: &[u8] = b"id: ";
const EVENT: &[u8] = b"event: ";
/// The line ending an id and the event type of a message ([`message_into`]).
const MESSAGE: &[u8] = b"\nevent: message\n";
const DATA: &[u8] = b"data: ";
const RETRY: &[u8] = b"retry: ";
const COMMENT: &[u8] = b": ";
const PRIMING_TAIL: &[u8] = b"data: \n\n";

/// Appends `{prefix}{value}\n` with CR/LF in `value` replaced by spaces.
fn push_field(out: &mut Vec<u8>, prefix: &[u8], value: &[u8]) {
    out.extend_from_slice(prefix);
    let start = out.len();
    out.extend_from_slice(value);
    // Every delivered event's id comes through here and has no line break: one search rather
    // than a look at each byte (1.8 % of a flood's profile, docs/benchmarks.md round 9).
    if find_eol(value).is_some() {
        for b in &mut out[start..] {
            if *b == b'\r' || *b == b'\n' {
                *b = b' ';
            }
        }
    }
    out.push(b'\n');
}

/// Room for `size` more bytes: exact for a fresh frame (so it converts to [`Bytes`] without
/// spare capacity), amortised when frames are packed one after another.
fn reserve(out: &mut Vec<u8>, size: usize) {
    if out.is_empty() {
        out.reserve_exact(size);
    } else {
        out.reserve(size);
    }
}

fn finish(out: Vec<u8>, size: usize) -> Bytes {
    debug_assert_eq!(out.len(), size);
    debug_assert_eq!(out.len(), out.capacity());
    Bytes::from(out)
}

/// Decimal digits of `n`, written at the end of `buf`.
fn format_u64(mut n: u64, buf: &mut [u8; 20]) -> &[u8] {
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            return &buf[i..];
        }
    }
}

/// Lines of `data` split on CR, LF and CRLF; always at least one (possibly
/// empty) line, and a trailing line end yields a final empty line.
fn lines(data: &[u8]) -> impl Iterator<Item = &[u8]> {
    let mut rest = Some(data);
    std::iter::from_fn(move || {
        let r = rest?;
        match find_eol(r) {
            Some(i) => {
                let eol = if r[i] == b'\r' && r.get(i + 1) == Some(&b'\n') {
                    2
                } else {
                    1
                };
                rest = Some(&r[i + eol..]);
                Some(&r[..i])
            }
            None => {
                rest = None;
                Some(r)
            }
        }
    })
}

#[cfg(test)]
mod adversary18;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sse::{Decoder, Event};
    use bytes::BytesMut;
    use proptest::prelude::*;

    fn decode_one(frame: &[u8]) -> Event {
        let mut dec = Decoder::new(1 << 20);
        let mut buf = BytesMut::from(frame);
        let ev = dec.decode(&mut buf).unwrap().expect("one event");
        assert_eq!(dec.decode(&mut buf), Ok(None));
        assert!(buf.is_empty());
        ev
    }

    #[test]
    fn event_exact_bytes() {
        assert_eq!(
            &event(Some("5"), Some("message"), b"{\"a\":1}")[..],
            b"id: 5\nevent: message\ndata: {\"a\":1}\n\n"
        );
        assert_eq!(&event(None, None, b"x")[..], b"data: x\n\n");
        assert_eq!(&event(None, None, b"")[..], b"data: \n\n");
        assert_eq!(
            &event(Some("1"), None, b"a\r\nb\rc\nd\n")[..],
            b"id: 1\ndata: a\ndata: b\ndata: c\ndata: d\ndata: \n\n"
        );
        assert_eq!(
            &event(Some("a\nb"), Some("x\ry"), b"")[..],
            b"id: a b\nevent: x y\ndata: \n\n"
        );
    }

    #[test]
    fn priming_exact_bytes() {
        assert_eq!(&priming("s1-0", None)[..], b"id: s1-0\ndata: \n\n");
        assert_eq!(
            &priming("7", Some(3000))[..],
            b"id: 7\nretry: 3000\ndata: \n\n"
        );
        assert_eq!(&priming("7", Some(0))[..], b"id: 7\nretry: 0\ndata: \n\n");
        assert_eq!(
            &priming("7", Some(u64::MAX))[..],
            b"id: 7\nretry: 18446744073709551615\ndata: \n\n"
        );
    }

    #[test]
    fn priming_decodes_with_empty_data() {
        let ev = decode_one(&priming("abc", Some(1500)));
        assert_eq!(
            ev,
            Event {
                event: None,
                data: Bytes::new(),
                id: Some("abc".into()),
                retry: Some(1500),
            }
        );
    }

    #[test]
    fn comment_frame() {
        assert_eq!(&comment("ping")[..], b": ping\n\n");
        assert_eq!(&comment("")[..], b": \n\n");
        assert_eq!(&comment("a\r\nb")[..], b": a  b\n\n");
        let mut dec = Decoder::new(64);
        let mut buf = BytesMut::from(&comment("a\nb")[..]);
        assert_eq!(dec.decode(&mut buf), Ok(None));
        assert_eq!(dec.comments_seen(), 1);
        assert!(buf.is_empty());
    }

    #[test]
    fn frames_are_exactly_sized() {
        for f in [
            event(Some("1"), Some("m"), b"a\r\nb"),
            priming("1", Some(9)),
            comment("x"),
        ] {
            // Bytes from a Vec with len == capacity: no spare capacity was allocated.
            let v: Vec<u8> = f.into();
            assert_eq!(v.len(), v.capacity());
        }
    }

    #[test]
    fn packed_frames_equal_single_frames() {
        let mut out = Vec::new();
        let a = event_into(&mut out, Some("1"), Some("message"), b"{\"a\":1}");
        let b = priming_into(&mut out, "2", Some(1000));
        let c = event_into(&mut out, Some("3"), Some("message"), b"x\ny");
        let expect = [
            event(Some("1"), Some("message"), b"{\"a\":1}"),
            priming("2", Some(1000)),
            event(Some("3"), Some("message"), b"x\ny"),
        ]
        .concat();
        assert_eq!(out, expect);
        assert_eq!(a + b + c, out.len());
    }

    /// What a WHATWG decoder yields for `data`: CRLF and CR become LF.
    fn normalize(data: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(data.len());
        let mut i = 0;
        while i < data.len() {
            match data[i] {
                b'\r' => {
                    out.push(b'\n');
                    if data.get(i + 1) == Some(&b'\n') {
                        i += 1;
                    }
                }
                b => out.push(b),
            }
            i += 1;
        }
        out
    }

    proptest! {
        #[test]
        fn prop_event_round_trips(
            id in prop::option::of("[^\\x00]{0,12}"),
            name in prop::option::of("[^\\x00]{1,12}"),
            data in prop::collection::vec(
                prop_oneof![Just(b'\r'), Just(b'\n'), any::<u8>()], 0..200),
        ) {
            let frame = event(id.as_deref(), name.as_deref(), &data);
            let ev = decode_one(&frame);
            let one_line = |s: &str| s.replace(['\r', '\n'], " ");
            prop_assert_eq!(ev, Event {
                event: name.as_deref().map(one_line).map(Into::into),
                data: Bytes::from(normalize(&data)),
                id: id.as_deref().map(one_line),
                retry: None,
            });
        }

        /// The head, a one-line payload and the tail are [`message_into`]'s frame.
        #[test]
        fn prop_message_head_payload_tail_is_message_into(
            id in "[0-9a-f]{32}:[0-9]{1,10}:[0-9]{1,20}",
            data in "[^\r\n]{0,200}",
        ) {
            let mut whole = Vec::new();
            message_into(&mut whole, id.as_bytes(), data.as_bytes());
            let mut parts = Vec::new();
            message_head_into(&mut parts, id.as_bytes());
            parts.extend_from_slice(data.as_bytes());
            parts.extend_from_slice(MESSAGE_TAIL);
            prop_assert_eq!(parts, whole);
        }

        /// The delivery path's frame is byte for byte the general one, packed after other
        /// frames or alone, one line or many.
        #[test]
        fn prop_message_into_is_event_into(
            id in "[0-9a-f]{32}:[0-9]{1,10}:[0-9]{1,20}",
            // Half one line (the common case, framed in place), half with line breaks.
            data in prop_oneof![
                prop::collection::vec(any::<u8>().prop_filter("one line", |b| *b != b'\r' && *b != b'\n'), 0..200),
                prop::collection::vec(prop_oneof![Just(b'\r'), Just(b'\n'), any::<u8>()], 0..200),
            ],
            before in prop::collection::vec(any::<u8>(), 0..3),
        ) {
            let (mut fast, mut general) = (before.clone(), before);
            let n = message_into(&mut fast, id.as_bytes(), &data);
            let m = event_into(&mut general, Some(&id), Some("message"), &data);
            prop_assert_eq!(n, m);
            prop_assert_eq!(fast, general);
        }

        #[test]
        fn prop_priming_round_trips(id in "[^\\x00\r\n]{0,12}", retry in prop::option::of(any::<u64>())) {
            let ev = decode_one(&priming(&id, retry));
            prop_assert_eq!(ev, Event { event: None, data: Bytes::new(), id: Some(id), retry });
        }

        #[test]
        fn prop_comment_is_one_comment(text in ".{0,30}") {
            let mut dec = Decoder::new(1 << 10);
            let mut buf = BytesMut::from(&comment(&text)[..]);
            buf.extend_from_slice(b"data: after\n\n");
            let ev = dec.decode(&mut buf).unwrap().expect("event after comment");
            prop_assert_eq!(&ev.data[..], b"after");
            prop_assert_eq!(dec.comments_seen(), 1);
        }
    }
}
