//! Unit tests of the response head parser and the body decoder: every input is also fed split at
//! every byte boundary and byte by byte, and must give the same result as whole.

use super::*;

/// The payload and how the body ended (`Ok(true)` complete; `Ok(false)`: more was awaited when
/// the input ran out) for `body` fed in `pieces`, then an EOF when `eof`.
fn run(framing: Framing, pieces: &[&[u8]], eof: bool) -> (Vec<u8>, Result<bool, Error>) {
    let mut dec = BodyDecoder::new(framing);
    let mut input = BytesMut::new();
    let mut out = BytesMut::new();
    for piece in pieces {
        input.extend_from_slice(piece);
        match dec.decode(&mut input, &mut out) {
            Ok(true) => return (out.to_vec(), Ok(true)),
            Ok(false) => {}
            Err(e) => return (out.to_vec(), Err(e)),
        }
    }
    let end = if eof {
        dec.finish().map(|()| true)
    } else {
        Ok(false)
    };
    (out.to_vec(), end)
}

/// Decodes `body` whole, split at every byte boundary, and byte by byte; asserts they agree and
/// returns the result.
fn decode_all_ways(framing: Framing, body: &[u8], eof: bool) -> (Vec<u8>, Result<bool, Error>) {
    let whole = run(framing, &[body], eof);
    for i in 0..=body.len() {
        let (a, b) = body.split_at(i);
        assert_eq!(run(framing, &[a, b], eof), whole, "split at {i}");
    }
    let bytes: Vec<&[u8]> = body.chunks(1).collect();
    assert_eq!(run(framing, &bytes, eof), whole, "byte by byte");
    whole
}

const CHUNKED: &[u8] = b"7\r\ndata: a\r\n\
    4;name=value;x\r\n\n\nda\r\n\
    00000A ; ext=\"q\"\r\nta: bc\n\n\r\n\r\n\
    0;last\r\n\
    Expires: never\r\n\
    X-Trailer: 1\r\n\
    \r\n";

#[test]
fn chunked_body_with_extensions_and_trailers_decodes_however_split() {
    let (out, end) = decode_all_ways(Framing::Chunked, CHUNKED, false);
    assert_eq!(end, Ok(true));
    assert_eq!(out, b"data: a\n\ndata: bc\n\n\r\n");
}

#[test]
fn bytes_after_the_last_chunk_stay_unread() {
    let mut dec = BodyDecoder::new(Framing::Chunked);
    let mut input = BytesMut::from(&b"1\r\nx\r\n0\r\n\r\nHTTP/1.1 200"[..]);
    let mut out = BytesMut::new();
    assert_eq!(dec.decode(&mut input, &mut out), Ok(true));
    assert_eq!(&out[..], b"x");
    assert_eq!(&input[..], b"HTTP/1.1 200");
    assert_eq!(dec.finish(), Ok(()));
}

fn chunked_error(body: &[u8], eof: bool) -> Error {
    match decode_all_ways(Framing::Chunked, body, eof) {
        (_, Err(e)) => e,
        (out, ok) => panic!("{body:?} decoded to {out:?}, {ok:?}"),
    }
}

#[test]
fn bad_chunk_sizes_are_refused() {
    assert_eq!(
        chunked_error(b"zz\r\nab\r\n", false),
        Error::Chunked("chunk size is not hexadecimal")
    );
    assert_eq!(
        chunked_error(b"\r\n", false),
        Error::Chunked("chunk size is not hexadecimal")
    );
    assert_eq!(
        chunked_error(b"1x\r\na\r\n", false),
        Error::Chunked("chunk size is not hexadecimal")
    );
    assert_eq!(
        chunked_error(b"-1\r\n", false),
        Error::Chunked("chunk size is not hexadecimal")
    );
    assert_eq!(
        chunked_error(b"1\n", false),
        Error::Chunked("chunk size line not ended by CRLF")
    );
    assert_eq!(
        chunked_error(b"1;a\rb\r\n", false),
        Error::Chunked("control byte in a chunk extension")
    );
    // 17 hex digits: over u64 (leading zeros are not).
    assert_eq!(
        chunked_error(b"10000000000000000\r\n", false),
        Error::Chunked("chunk size over 64 bits")
    );
    let (out, end) = run(Framing::Chunked, &[b"0000000000000000000001\r\nz"], false);
    assert_eq!((out, end), (b"z".to_vec(), Ok(false)));
}

#[test]
fn a_huge_chunk_streams_without_overflow() {
    // The largest size there is: its data streams on, counted in u64 whatever usize is.
    let (out, end) = decode_all_ways(Framing::Chunked, b"ffffffffffffffff\r\nabc", false);
    assert_eq!((out, end), (b"abc".to_vec(), Ok(false)));
}

#[test]
fn size_line_over_the_bound_is_refused_with_or_without_its_lf() {
    let mut long = b"1;".to_vec();
    long.resize(MAX_SIZE_LINE + 1, b'a');
    assert_eq!(
        run(Framing::Chunked, &[&long], false).1,
        Err(Error::Chunked("chunk size line over 4 KiB"))
    );
    let mut line = long.clone();
    line.extend_from_slice(b"\r\n");
    assert_eq!(
        chunked_error(&line, false),
        Error::Chunked("chunk size line over 4 KiB")
    );
    // At the bound exactly (CR included), it is read.
    let mut fits = b"1;".to_vec();
    fits.resize(MAX_SIZE_LINE - 1, b'a');
    fits.extend_from_slice(b"\r\nx");
    assert_eq!(
        run(Framing::Chunked, &[&fits], false),
        (b"x".to_vec(), Ok(false))
    );
}

#[test]
fn missing_crlf_after_chunk_data_is_refused() {
    let err = Error::Chunked("chunk data not followed by CRLF");
    assert_eq!(chunked_error(b"2\r\nabc\r\n", false), err);
    assert_eq!(chunked_error(b"2\r\nab\rX", false), err);
    assert_eq!(chunked_error(b"2\r\nab\n0\r\n\r\n", false), err);
    // The payload before the fault is out; the fault stops it.
    assert_eq!(run(Framing::Chunked, &[b"2\r\nabc"], false).0, b"ab");
}

#[test]
fn trailers_must_end_in_crlf_and_stay_bounded() {
    assert_eq!(
        chunked_error(b"0\r\nA: b\n\r\n", false),
        Error::Chunked("trailer line not ended by CRLF")
    );
    assert_eq!(
        chunked_error(b"0\r\n\n", false),
        Error::Chunked("trailer line not ended by CRLF")
    );
    let mut many = b"0\r\n".to_vec();
    while many.len() < MAX_TRAILERS + 100 {
        many.extend_from_slice(b"X-Pad: aaaaaaaaaaaaaaaaaaaaaaaa\r\n");
    }
    assert_eq!(
        run(Framing::Chunked, &[&many], false).1,
        Err(Error::Chunked("trailer section over 64 KiB"))
    );
}

#[test]
fn eof_inside_a_chunked_body_is_an_error_not_an_end() {
    let cases: [(&[u8], &str); 6] = [
        (b"", "closed before the last chunk"),
        (b"5\r", "closed before the last chunk"),
        (b"5\r\nab", "closed inside a chunk"),
        (b"2\r\nab", "closed inside a chunk"),
        (b"2\r\nab\r\n", "closed before the last chunk"),
        (b"0\r\nX: y\r\n", "closed inside the trailer section"),
    ];
    for (body, why) in cases {
        assert_eq!(
            decode_all_ways(Framing::Chunked, body, true).1,
            Err(Error::Truncated(why)),
            "{body:?}"
        );
    }
}

#[test]
fn content_length_bodies_end_at_their_length_and_not_before() {
    let (out, end) = decode_all_ways(Framing::Length(5), b"hello, and more", true);
    assert_eq!((out, end), (b"hello".to_vec(), Ok(true)));
    let (out, end) = decode_all_ways(Framing::Length(5), b"hel", true);
    assert_eq!(
        (out, end),
        (
            b"hel".to_vec(),
            Err(Error::Truncated("closed before Content-Length bytes"))
        )
    );
    assert_eq!(run(Framing::Length(0), &[b"x"], true), (vec![], Ok(true)));
}

#[test]
fn close_delimited_bodies_end_at_eof() {
    let (out, end) = decode_all_ways(Framing::Close, b"data: x\n\n", true);
    assert_eq!((out, end), (b"data: x\n\n".to_vec(), Ok(true)));
    assert_eq!(run(Framing::Close, &[], true), (vec![], Ok(true)));
}

// === the response head ===

/// Parses `input` fed in `pieces`: the head (if any) and the bytes after it (all the pieces'
/// bytes after the head's end).
fn head_in(pieces: &[&[u8]]) -> (Result<Option<Head>, Error>, Vec<u8>) {
    let mut buf = BytesMut::new();
    for (i, piece) in pieces.iter().enumerate() {
        buf.extend_from_slice(piece);
        match parse_head(&mut buf) {
            Ok(None) => {}
            done => {
                pieces[i + 1..]
                    .iter()
                    .for_each(|p| buf.extend_from_slice(p));
                return (done, buf.to_vec());
            }
        }
    }
    (Ok(None), buf.to_vec())
}

/// Whole, split at every byte, byte by byte: all the same.
fn head_all_ways(input: &[u8]) -> (Result<Option<Head>, Error>, Vec<u8>) {
    let whole = head_in(&[input]);
    for i in 0..=input.len() {
        let (a, b) = input.split_at(i);
        let split = head_in(&[a, b]);
        assert_eq!(split.0, whole.0, "split at {i}");
        if whole.0.as_ref().is_ok_and(Option::is_some) {
            assert_eq!(split.1, whole.1, "split at {i}: the body's start");
        }
    }
    let bytes: Vec<&[u8]> = input.chunks(1).collect();
    assert_eq!(head_in(&bytes).0, whole.0, "byte by byte");
    whole
}

fn ok(framing: Framing) -> Result<Option<Head>, Error> {
    Ok(Some(Head {
        status: StatusCode::OK,
        framing,
    }))
}

#[test]
fn head_of_a_chunked_stream_parses_however_split() {
    let input = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\
        Transfer-Encoding: chunked\r\n\r\n5\r\nevent";
    let (head, rest) = head_all_ways(input);
    assert_eq!(head, ok(Framing::Chunked));
    assert_eq!(rest, b"5\r\nevent");
}

#[test]
fn interim_heads_are_skipped() {
    let input = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </x>\r\n\r\n\
        HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nabc";
    let (head, rest) = head_all_ways(input);
    assert_eq!(head, ok(Framing::Length(3)));
    assert_eq!(rest, b"abc");
}

#[test]
fn other_statuses_are_returned_whatever_their_framing() {
    let (head, _) = head_all_ways(b"HTTP/1.1 404 Not Found\r\nTransfer-Encoding: gzip\r\n\r\n");
    assert_eq!(head.unwrap().unwrap().status, StatusCode::NOT_FOUND);
    let (head, _) = head_all_ways(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\n\r\n");
    assert_eq!(
        head.unwrap().unwrap().status,
        StatusCode::SWITCHING_PROTOCOLS
    );
}

#[test]
fn framing_follows_rfc_9112() {
    let head = |fields: &str| {
        let input = format!("HTTP/1.1 200 OK\r\n{fields}\r\n");
        head_all_ways(input.as_bytes()).0
    };
    assert_eq!(head(""), ok(Framing::Close));
    assert_eq!(head("Content-Length: 42\r\n"), ok(Framing::Length(42)));
    assert_eq!(
        head("Content-Length: 42, 42\r\ncontent-length: 42\r\n"),
        ok(Framing::Length(42))
    );
    // TE overrides CL, even an invalid one.
    assert_eq!(
        head("Content-Length: 42\r\nTransfer-Encoding: chunked\r\n"),
        ok(Framing::Chunked)
    );
    assert_eq!(
        head("Content-Length: x\r\nTransfer-Encoding: CHUNKED\r\n"),
        ok(Framing::Chunked)
    );
    assert_eq!(
        head("Transfer-Encoding: ,chunked,\r\n"),
        ok(Framing::Chunked)
    );
    for bad_te in [
        "Transfer-Encoding: gzip\r\n",
        "Transfer-Encoding: gzip, chunked\r\n",
        "Transfer-Encoding: chunked, gzip\r\n",
        "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n",
        "Transfer-Encoding: \r\n",
    ] {
        assert_eq!(head(bad_te), Err(Error::TransferCoding), "{bad_te}");
    }
    for bad_cl in [
        "Content-Length: 4x\r\n",
        "Content-Length: -1\r\n",
        "Content-Length: +1\r\n",
        "Content-Length: 1, 2\r\n",
        "Content-Length: 1\r\nContent-Length: 2\r\n",
        "Content-Length: 18446744073709551616\r\n",
        "Content-Length: \r\n",
    ] {
        assert_eq!(head(bad_cl), Err(Error::ContentLength), "{bad_cl}");
    }
    let http10 = head_all_ways(b"HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n").0;
    assert_eq!(http10, Err(Error::TransferCoding));
}

#[test]
fn malformed_and_oversized_heads_are_refused() {
    assert_eq!(
        head_all_ways(b"HTTP/2 200 OK\r\n\r\n").0,
        Err(Error::Head(httparse::Error::Version))
    );
    assert_eq!(
        head_all_ways(b"HTTP/1.1 2000 OK\r\n\r\n").0,
        Err(Error::Head(httparse::Error::Status))
    );
    assert_eq!(
        head_all_ways(b"HTTP/1.1 200 OK\r\nbad name: x\r\n\r\n").0,
        Err(Error::Head(httparse::Error::HeaderName))
    );
    let mut big = b"HTTP/1.1 200 OK\r\n".to_vec();
    while big.len() <= MAX_HEAD {
        big.extend_from_slice(b"X-Pad: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n");
    }
    // Too long whether it never ends or ends late (fields kept few: the count is its own bound).
    let mut few = b"HTTP/1.1 200 OK\r\nX-Pad: ".to_vec();
    few.resize(MAX_HEAD + 1, b'a');
    assert_eq!(head_in(&[&few]).0, Err(Error::HeadTooLarge));
    few.extend_from_slice(b"\r\n\r\n");
    assert_eq!(head_in(&[&few]).0, Err(Error::HeadTooLarge));
    let halves: Vec<&[u8]> = few.chunks(MAX_HEAD / 3).collect();
    assert_eq!(head_in(&halves).0, Err(Error::HeadTooLarge));
    assert!(head_in(&[&big]).0.is_err());
}
