//! [4] Proxy → upstream, under the SSE stream: the HTTP/1.1 response of `GET {sse_url}`, read by
//! hand.
//!
//! hyper's client body hands over one HTTP chunk per poll, and SDK servers write one chunk per
//! event, so through hyper every upstream event paid a task hop, a wake-up and a batch of its own.
//! [`super::connect`] reads the connection itself instead: one socket read yields every event
//! waiting. This module is the part of that which does no I/O: [`parse_head`] reads the response
//! head, [`BodyDecoder`] removes the body's framing (RFC 9112 §6.3; chunked, §7.1). Both take bytes
//! in whatever pieces they arrive and give the same result however the input is split (unit tests
//! split at every byte; `fuzz/fuzz_targets/http1_body.rs` at arbitrary points).

use bytes::{Buf, BytesMut};
use http::StatusCode;

/// Largest response head (status line and fields), counted for each interim head too.
pub const MAX_HEAD: usize = 64 * 1024;
/// Most fields in one response head.
pub const MAX_FIELDS: usize = 100;
/// Longest chunk size line: the size, its extensions and the CR (the LF not counted).
pub const MAX_SIZE_LINE: usize = 4 * 1024;
/// Largest trailer section after the last chunk (its lines with their CRLFs).
pub const MAX_TRAILERS: usize = 64 * 1024;

/// Why a response could not be read. Each names what was wrong, never the bytes themselves.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The response head is not HTTP/1.x (httparse says where).
    #[error("malformed response head: {0}")]
    Head(httparse::Error),
    /// The response head is longer than [`MAX_HEAD`].
    #[error("response head over 64 KiB")]
    HeadTooLarge,
    /// `Content-Length` is not one decimal number (or its copies disagree).
    #[error("invalid Content-Length")]
    ContentLength,
    /// `Transfer-Encoding` is not exactly `chunked` (another coding cannot be decoded: none was
    /// offered), or it came on an HTTP/1.0 response, whose framing is then faulty (RFC 9112 §6.1).
    #[error("unsupported Transfer-Encoding (only a single `chunked` is read)")]
    TransferCoding,
    /// The chunked framing is broken; the value says how.
    #[error("malformed chunked body: {0}")]
    Chunked(&'static str),
    /// The connection closed before the body's framing said it was complete.
    #[error("the body ended early: {0}")]
    Truncated(&'static str),
}

/// How the response body is delimited (RFC 9112 §6.3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Framing {
    /// `Transfer-Encoding: chunked` (which overrides any `Content-Length`).
    Chunked,
    /// `Content-Length` bytes.
    Length(u64),
    /// Everything until the server closes the connection.
    Close,
}

/// A final response head.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Head {
    /// Its status (never 1xx other than 101).
    pub status: StatusCode,
    /// How its body is delimited. Read only for 200: any other status is refused whatever its
    /// framing, so it is [`Framing::Close`] then.
    pub framing: Framing,
}

/// Reads a response head from the start of `buf`, consuming it (and any interim 1xx heads before
/// it; a 101 is returned as final: the request asked for no upgrade). `Ok(None)`: more bytes are
/// needed, and nothing was consumed but interim heads.
///
/// # Errors
/// [`Error::Head`] when the head is not HTTP/1.x, [`Error::HeadTooLarge`] past [`MAX_HEAD`],
/// [`Error::ContentLength`] or [`Error::TransferCoding`] when a 200's framing is unusable.
pub fn parse_head(buf: &mut BytesMut) -> Result<Option<Head>, Error> {
    loop {
        // Only the first MAX_HEAD bytes are ever parsed: a longer head stays Partial and is
        // refused, the same whether it arrives whole or in pieces.
        let window = &buf[..buf.len().min(MAX_HEAD)];
        let mut fields = [httparse::EMPTY_HEADER; MAX_FIELDS];
        let mut resp = httparse::Response::new(&mut fields);
        let len = match resp.parse(window).map_err(Error::Head)? {
            httparse::Status::Complete(len) => len,
            httparse::Status::Partial if window.len() < MAX_HEAD => return Ok(None),
            httparse::Status::Partial => return Err(Error::HeadTooLarge),
        };
        let code = resp.code.ok_or(Error::Head(httparse::Error::Status))?;
        let status =
            StatusCode::from_u16(code).map_err(|_| Error::Head(httparse::Error::Status))?;
        if status.is_informational() && status != StatusCode::SWITCHING_PROTOCOLS {
            buf.advance(len);
            continue;
        }
        let framing = if status == StatusCode::OK {
            framing(resp.version == Some(0), resp.headers)?
        } else {
            Framing::Close
        };
        buf.advance(len);
        return Ok(Some(Head { status, framing }));
    }
}

/// The body framing of a 200 answer to a GET (RFC 9112 §6.3 items 3 to 8).
fn framing(http10: bool, fields: &[httparse::Header<'_>]) -> Result<Framing, Error> {
    let mut transfer_coding = false;
    let mut chunked = false;
    let mut length = None;
    for field in fields {
        if field.name.eq_ignore_ascii_case("transfer-encoding") {
            transfer_coding = true;
            for coding in list(field.value) {
                // `chunked` must be the final coding, applied once; and no other coding can be
                // undone here (the request offered none: RFC 9112 §7.4).
                if chunked || !coding.eq_ignore_ascii_case(b"chunked") {
                    return Err(Error::TransferCoding);
                }
                chunked = true;
            }
        } else if field.name.eq_ignore_ascii_case("content-length") {
            // Copies (`42, 42`, or the field twice) are allowed if they agree (RFC 9110 §8.6).
            // A bad one is an error only if no Transfer-Encoding overrides it.
            let mut values = list(field.value).peekable();
            if values.peek().is_none() {
                length = Some(Err(Error::ContentLength));
            }
            for value in values {
                length = match (length, decimal(value)) {
                    (Some(Err(e)), _) => Some(Err(e)),
                    (None, Some(n)) => Some(Ok(n)),
                    (Some(Ok(l)), Some(n)) if l == n => Some(Ok(n)),
                    _ => Some(Err(Error::ContentLength)),
                };
            }
        }
    }
    if transfer_coding {
        // TE overrides Content-Length (§6.3 item 3). The message could be a smuggling attempt on a
        // connection that carries more; ours carries this one response (`Connection: close`).
        return if chunked && !http10 {
            Ok(Framing::Chunked)
        } else {
            Err(Error::TransferCoding)
        };
    }
    length.map_or(Ok(Framing::Close), |l| l.map(Framing::Length))
}

/// The non-empty elements of a comma-separated field value, without their surrounding whitespace.
fn list(value: &[u8]) -> impl Iterator<Item = &[u8]> {
    value
        .split(|&b| b == b',')
        .map(trim)
        .filter(|e| !e.is_empty())
}

fn trim(mut s: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = s {
        s = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = s {
        s = rest;
    }
    s
}

/// A decimal number of at least one digit that fits in a `u64`.
fn decimal(s: &[u8]) -> Option<u64> {
    if s.is_empty() {
        return None;
    }
    s.iter().try_fold(0u64, |n, &b| {
        let d = char::from(b).to_digit(10)?;
        n.checked_mul(10)?.checked_add(u64::from(d))
    })
}

// === impl BodyDecoder ===

/// Removes a response body's framing, incrementally: bytes in, payload out.
#[derive(Clone, Debug)]
pub struct BodyDecoder {
    state: State,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// `Content-Length`: this many bytes still to come.
    Length(u64),
    /// Until the connection closes.
    Close,
    /// Chunked: a chunk size line is next.
    Size,
    /// Chunked: this many bytes of the current chunk still to come.
    Data(u64),
    /// Chunked: the CRLF after a chunk's data is next.
    DataEnd,
    /// Chunked: in the trailer section after the last chunk, this many bytes read.
    Trailers(usize),
    /// The body is complete.
    Done,
}

impl BodyDecoder {
    /// A decoder for a body delimited as `framing` says.
    pub fn new(framing: Framing) -> Self {
        let state = match framing {
            Framing::Chunked => State::Size,
            Framing::Length(0) => State::Done,
            Framing::Length(n) => State::Length(n),
            Framing::Close => State::Close,
        };
        Self { state }
    }

    /// Moves the payload in `input` to `out`, consuming the framing around it; `Ok(true)` once the
    /// body is complete (bytes after its end stay in `input`, unread). A chunk size or trailer line
    /// not yet complete also stays in `input`: append to it and call again.
    ///
    /// # Errors
    /// [`Error::Chunked`] when the chunked framing is broken. The payload before the fault has been
    /// moved to `out`; the decoder must not be called again.
    pub fn decode(&mut self, input: &mut BytesMut, out: &mut BytesMut) -> Result<bool, Error> {
        loop {
            match self.state {
                State::Done => return Ok(true),
                State::Close => {
                    out.extend_from_slice(input);
                    input.clear();
                    return Ok(false);
                }
                State::Length(left) => {
                    let n = take(input, out, left);
                    self.state = match left - n {
                        0 => State::Done,
                        left => return self.wait(State::Length(left)),
                    };
                }
                State::Data(left) => {
                    let n = take(input, out, left);
                    self.state = match left - n {
                        0 => State::DataEnd,
                        left => return self.wait(State::Data(left)),
                    };
                }
                State::DataEnd => match input.get(..2) {
                    Some(b"\r\n") => {
                        input.advance(2);
                        self.state = State::Size;
                    }
                    // A wrong first byte is wrong however the rest arrives.
                    None if input.first().is_none_or(|&b| b == b'\r') => return Ok(false),
                    _ => return Err(Error::Chunked("chunk data not followed by CRLF")),
                },
                State::Size => {
                    let Some(lf) = line(input, MAX_SIZE_LINE)
                        .ok_or(Error::Chunked("chunk size line over 4 KiB"))?
                    else {
                        return Ok(false);
                    };
                    let size = chunk_size(&input[..lf])?;
                    input.advance(lf + 1);
                    self.state = match size {
                        0 => State::Trailers(0),
                        n => State::Data(n),
                    };
                }
                State::Trailers(read) => {
                    let Some(lf) = line(input, MAX_TRAILERS.saturating_sub(read))
                        .ok_or(Error::Chunked("trailer section over 64 KiB"))?
                    else {
                        return Ok(false);
                    };
                    // The fields are read past, not used.
                    if input[..lf].last() != Some(&b'\r') {
                        return Err(Error::Chunked("trailer line not ended by CRLF"));
                    }
                    input.advance(lf + 1);
                    self.state = match lf {
                        1 => State::Done,
                        _ => State::Trailers(read + lf + 1),
                    };
                }
            }
        }
    }

    /// Checks that the body may end here, where the connection closed.
    ///
    /// # Errors
    /// [`Error::Truncated`] when the framing says more was to come.
    pub fn finish(&self) -> Result<(), Error> {
        match self.state {
            State::Done | State::Close => Ok(()),
            State::Length(_) => Err(Error::Truncated("closed before Content-Length bytes")),
            State::Size => Err(Error::Truncated("closed before the last chunk")),
            State::Data(_) | State::DataEnd => Err(Error::Truncated("closed inside a chunk")),
            State::Trailers(_) => Err(Error::Truncated("closed inside the trailer section")),
        }
    }

    fn wait(&mut self, state: State) -> Result<bool, Error> {
        self.state = state;
        Ok(false)
    }
}

/// Moves up to `left` bytes from `input` to `out`; how many it moved.
fn take(input: &mut BytesMut, out: &mut BytesMut, left: u64) -> u64 {
    let n = usize::try_from(left).map_or(input.len(), |l| l.min(input.len()));
    out.extend_from_slice(&input[..n]);
    input.advance(n);
    n as u64
}

/// Where the line at the start of `input` ends (the index of its LF); `Some(None)` when no LF has
/// come yet, `None` when the line is (or already was) longer than `max` bytes.
fn line(input: &[u8], max: usize) -> Option<Option<usize>> {
    let window = &input[..input.len().min(max.saturating_add(1))];
    match memchr::memchr(b'\n', window) {
        Some(lf) => Some(Some(lf)),
        None if input.len() > max => None,
        None => Some(None),
    }
}

/// The size of a chunk from its size line (without the LF): hex digits, then optional extensions
/// (`;name=value`, read past), then CR.
fn chunk_size(line: &[u8]) -> Result<u64, Error> {
    let line = line
        .strip_suffix(b"\r")
        .ok_or(Error::Chunked("chunk size line not ended by CRLF"))?;
    let digits = line.iter().take_while(|b| b.is_ascii_hexdigit()).count();
    if digits == 0 {
        return Err(Error::Chunked("chunk size is not hexadecimal"));
    }
    let size = line[..digits].iter().try_fold(0u64, |n, &b| {
        let d = char::from(b).to_digit(16)?;
        n.checked_mul(16)?.checked_add(u64::from(d))
    });
    let size = size.ok_or(Error::Chunked("chunk size over 64 bits"))?;
    // Whitespace before the extensions is tolerated (as hyper did); anything else must be one.
    let rest = trim(&line[digits..]);
    if !rest.is_empty() && rest[0] != b';' {
        return Err(Error::Chunked("chunk size is not hexadecimal"));
    }
    if rest.iter().any(|&b| (b < b' ' && b != b'\t') || b == 0x7f) {
        return Err(Error::Chunked("control byte in a chunk extension"));
    }
    Ok(size)
}

#[cfg(test)]
mod tests;
