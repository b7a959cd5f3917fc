//! The harness's own SSE parser (`tests/support/sse.rs`) against the WHATWG examples and the
//! cases the spec calls out: the other tests read every proxy stream through it, so it must be
//! right on its own, without the proxy's decoder to compare with.

mod support;

use support::sse::Parser;
use support::Ev;

fn parse_chunks(chunks: &[&[u8]]) -> (Vec<Ev>, Parser) {
    let mut p = Parser::new();
    let mut out = Vec::new();
    for c in chunks {
        out.extend(p.feed(c));
    }
    (out, p)
}

fn parse(text: &[u8]) -> Vec<Ev> {
    parse_chunks(&[text]).0
}

fn data(evs: &[Ev]) -> Vec<&[u8]> {
    evs.iter().map(|e| &e.data[..]).collect()
}

#[test]
fn spec_examples() {
    // "data: YHOO\ndata: +2\ndata: 10" is one event, lines joined with LF.
    let evs = parse(b"data: YHOO\ndata: +2\ndata: 10\n\n");
    assert_eq!(data(&evs), vec![&b"YHOO\n+2\n10"[..]]);
    // Comments are ignored; an id persists as the last event ID; a block without data dispatches
    // nothing.
    let (evs, p) = parse_chunks(&[
        b": test stream\n\ndata: first event\nid: 1\n\ndata:second event\nid\n\ndata:  third event\n\n",
    ]);
    assert_eq!(
        data(&evs),
        vec![&b"first event"[..], b"second event", b" third event"]
    );
    assert_eq!(evs[0].id.as_deref(), Some("1"));
    assert_eq!(
        evs[1].id.as_deref(),
        Some(""),
        "`id` alone sets an empty id"
    );
    assert_eq!(evs[2].id, None, "no id field within the third event");
    assert_eq!(p.last_event_id, "");
    // "data\n\ndata\ndata\n\ndata:" → an empty event, one "\n" event, and nothing (no blank line).
    let evs = parse(b"data\n\ndata\ndata\n\ndata:");
    assert_eq!(data(&evs), vec![&b""[..], b"\n"]);
    // One leading space is removed, no more.
    let evs = parse(b"data:test\n\ndata: test\n\ndata:  test\n\n");
    assert_eq!(data(&evs), vec![&b"test"[..], b"test", b" test"]);
}

#[test]
fn line_ends_bom_and_any_split() {
    let text = b"\xEF\xBB\xBFevent: endpoint\r\ndata: /m?s=1\r\nretry: 1000\r\n\r\nid: a:1:2\rdata: {}\r\rdata: x\n\n";
    let whole = parse(text);
    assert_eq!(whole.len(), 3);
    assert_eq!(whole[0].event.as_deref(), Some("endpoint"));
    assert_eq!(&whole[0].data[..], b"/m?s=1");
    assert_eq!(whole[0].retry, Some(1000));
    assert_eq!(whole[0].id, None);
    assert_eq!(whole[1].id.as_deref(), Some("a:1:2"));
    assert_eq!(&whole[1].data[..], b"{}");
    assert_eq!(&whole[2].data[..], b"x");
    // Every split point, including inside the BOM and between CR and LF, gives the same events.
    for i in 0..text.len() {
        for j in i..text.len() {
            let (evs, _) = parse_chunks(&[&text[..i], &text[i..j], &text[j..]]);
            assert_eq!(evs, whole, "split at {i}, {j}");
        }
    }
    // Byte by byte.
    let bytes: Vec<&[u8]> = text.chunks(1).collect();
    assert_eq!(parse_chunks(&bytes).0, whole);
}

#[test]
fn only_a_leading_bom_is_ignored() {
    // A BOM later in the stream is data, and a stream's first bytes that merely start like a BOM
    // are not lost.
    let evs = parse(b"data: a\n\n\xEF\xBB\xBFdata: b\n\n");
    assert_eq!(
        evs.len(),
        1,
        "the second block's field name is BOM+data: unknown"
    );
    let evs = parse_chunks(&[b"\xEF", b"\xBBdata: x\n\n"]).0;
    assert!(
        evs.is_empty(),
        "EF BB then 'd' is no BOM: the line is an unknown field"
    );
    let evs = parse_chunks(&[b"\xEF\xBB\xBF\xEF\xBB\xBFdata: x\n\n"]).0;
    assert!(evs.is_empty(), "only one BOM is stripped");
}

#[test]
fn fields_the_spec_ignores() {
    // retry must be all digits; an id with NUL is ignored; unknown fields are ignored; an
    // incomplete event at the end of the stream is never dispatched.
    let (evs, p) = parse_chunks(&[
        b"retry: 10x\nid: ok\ndata: 1\n\nid: bad\0id\nfoo: bar\ndata: 2\n\ndata: never",
    ]);
    assert_eq!(evs.len(), 2);
    assert_eq!(evs[0].retry, None);
    assert_eq!(evs[1].id, None);
    assert_eq!(p.last_event_id, "ok");
    assert_eq!(p.reconnection_ms, None);
    // Data is kept as bytes, valid UTF-8 or not.
    let evs = parse(b"data: \xff\xfe\n\n");
    assert_eq!(&evs[0].data[..], b"\xff\xfe");
    // A priming event (id, retry, empty data line) is dispatched with empty data.
    let evs = parse(b"id: s:1:1\nretry: 1000\ndata: \n\n");
    assert_eq!(evs.len(), 1);
    assert!(evs[0].is_priming());
    assert_eq!(evs[0].retry, Some(1000));
}
