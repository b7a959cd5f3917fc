//! The fast path of [`super::peek`], run on every upstream event (step 4 of the data path): a
//! byte scanner that finds the routing members of one message without building anything.
//!
//! [`super::peek_serde`] is the definition. The scanner answers only where it is sure to read the
//! message as serde does, and says "don't know" (`None`) otherwise, so that the caller asks
//! serde. It is sure of the common message: a JSON object whose keys have no escapes, whose
//! `method` is a string without escapes or `null`, with no routing key twice, nested at most
//! [`MAX_NEST`] deep, valid UTF-8 everywhere. Everything it skips it checks as serde_json does
//! (string escapes, control characters, number grammar, literals, structure), so that it never
//! answers an input serde refuses. The rest (arrays, invalid input, escaped keys, ...) is serde's,
//! at the cost of a second pass on messages that are rare or broken.
//!
//! The cost is two passes: one that vectorises (the lowest and highest byte: whether the
//! message is ASCII, else UTF-8 checked once for all its strings, and whether it holds a control
//! byte at all), then the scan, which searches strings eight bytes at a time and with `memchr2`
//! past their first 64.

use memchr::memchr2;

/// The deepest nesting the scanner follows: one bit per level of its stack. serde_json reads the
/// values it skips with no depth limit, so deeper input goes to it rather than being refused.
const MAX_NEST: u32 = 128;

/// The routing members of one message as serde reads them (a `null` one is absent), found by
/// [`scan`].
pub(super) struct Envelope<'a> {
    /// The raw `id`.
    pub id: Option<&'a str>,
    /// The `method` (a string without escapes; UTF-8, as the whole message is).
    pub method: Option<&'a [u8]>,
    /// Has `result` or `error`.
    pub is_response: bool,
    /// The raw `params`, checked JSON.
    params: Option<&'a [u8]>,
    /// The message holds a control byte ([`Scanner::ctrl`]).
    ctrl: bool,
}

/// The routing members of `bytes` when the scanner is sure to read them as serde does; `None`:
/// ask serde.
pub(super) fn scan(bytes: &[u8]) -> Option<Envelope<'_>> {
    // One pass that vectorises tells what the strings need checking for.
    let (lo, hi) = lowest_and_highest(bytes);
    // Not UTF-8: serde's, which does not check the strings it skips. Once the whole message is
    // UTF-8, so is every string in it.
    if hi >= 0x80 && std::str::from_utf8(bytes).is_err() {
        return None;
    }
    let mut s = Scanner {
        b: bytes,
        i: 0,
        ctrl: lo < 0x20,
    };
    let mut top = Top::default();
    s.ws();
    s.object(|key, s| match key {
        b"id" => once(&mut top.id, non_null(s.value()?)),
        b"result" => once(&mut top.result, non_null(s.value()?)),
        b"error" => once(&mut top.error, non_null(s.value()?)),
        b"params" => once(&mut top.params, non_null(s.value()?)),
        // serde reads an `Option<String>`: a string or null; anything else fails the whole
        // message, and so does an escape it would have to undo: serde's.
        b"method" if s.peek() == Some(b'"') => {
            s.i += 1;
            once(&mut top.method, Some(s.plain_str()?))
        }
        b"method" => match s.value()? {
            b"null" => once(&mut top.method, None),
            _ => None,
        },
        _ => s.value().map(drop),
    })?;
    s.ws();
    if s.i != bytes.len() {
        return None;
    }
    Some(Envelope {
        id: utf8(top.id.flatten())?,
        method: top.method.flatten(),
        // As `peek_serde` reads it: a `"result": null` without a method is a response too.
        is_response: top.result.flatten().is_some()
            || top.error.flatten().is_some()
            || (top.result.is_some() && top.method.flatten().is_none()),
        params: top.params.flatten(),
        ctrl: s.ctrl,
    })
}

impl<'a> Envelope<'a> {
    /// The raw progress token, as serde's `RawParams` reads it from `params`:
    /// `params.progressToken`, else `params._meta.progressToken`. Outer `None`: ask serde.
    pub fn progress_token(&self) -> Option<Option<&'a str>> {
        let Some(params) = self.params else {
            return Some(None);
        };
        // Only an object: serde reads an array as the fields in order, and fails on anything
        // else.
        if params[0] != b'{' {
            return None;
        }
        let (mut own, mut meta) = (None, None);
        let ctrl = self.ctrl;
        Scanner {
            b: params,
            i: 0,
            ctrl,
        }
        .object(|key, s| match key {
            b"progressToken" => once(&mut own, non_null(s.value()?)),
            b"_meta" => once(&mut meta, non_null(s.value()?)),
            _ => s.value().map(drop),
        })?;
        let meta_token = match meta.flatten() {
            Some(meta) if meta[0] == b'{' => {
                let mut token = None;
                Scanner {
                    b: meta,
                    i: 0,
                    ctrl,
                }
                .object(|key, s| match key {
                    b"progressToken" => once(&mut token, non_null(s.value()?)),
                    _ => s.value().map(drop),
                })?;
                token.flatten()
            }
            Some(_) => return None,
            None => None,
        };
        utf8(own.flatten().or(meta_token))
    }
}

/// The routing keys of the top-level object: outer `None`, not seen; inner `None`, `null` (which
/// serde reads as an absent `Option`).
#[derive(Default)]
struct Top<'a> {
    id: Option<Option<&'a [u8]>>,
    method: Option<Option<&'a [u8]>>,
    result: Option<Option<&'a [u8]>>,
    error: Option<Option<&'a [u8]>>,
    params: Option<Option<&'a [u8]>>,
}

/// Records the value of a key that must appear once. A second time is an error to serde (a
/// duplicate field): `None`, and serde says so.
fn once<'a>(slot: &mut Option<Option<&'a [u8]>>, value: Option<&'a [u8]>) -> Option<()> {
    if slot.is_some() {
        return None;
    }
    *slot = Some(value);
    Some(())
}

/// A raw value as serde reads an `Option<&RawValue>`: `null` is `None`.
fn non_null(raw: &[u8]) -> Option<&[u8]> {
    (raw != b"null").then_some(raw)
}

/// The text of a value the scan has checked (outer `None` only if it is not UTF-8, which the scan
/// has ruled out).
fn utf8(raw: Option<&[u8]>) -> Option<Option<&str>> {
    raw.map(std::str::from_utf8).transpose().ok()
}

/// A cursor over one message. Every method returns `None` on input it does not accept; the
/// position is then meaningless.
struct Scanner<'a> {
    b: &'a [u8],
    i: usize,
    /// `b` holds a byte below 0x20 (whitespace or not), so strings must be searched for control
    /// characters too; without one, only for their end and escapes.
    ctrl: bool,
}

impl<'a> Scanner<'a> {
    #[inline(always)]
    fn peek(&self) -> Option<u8> {
        self.b.get(self.i).copied()
    }

    #[inline(always)]
    fn next(&mut self) -> Option<u8> {
        let b = self.peek()?;
        self.i += 1;
        Some(b)
    }

    #[inline(always)]
    fn eat(&mut self, b: u8) -> Option<()> {
        (self.next()? == b).then_some(())
    }

    #[inline(always)]
    fn eat_if(&mut self, b: u8) -> bool {
        let hit = self.peek() == Some(b);
        self.i += usize::from(hit);
        hit
    }

    /// Skips JSON whitespace (serde_json's four bytes).
    #[inline(always)]
    fn ws(&mut self) {
        while let Some(b' ' | b'\n' | b'\t' | b'\r') = self.peek() {
            self.i += 1;
        }
    }

    /// Walks the object at the cursor, calling `member` with each key (escape-free: serde
    /// compares its keys unescaped) and the cursor on its value, which `member` must consume.
    fn object(&mut self, mut member: impl FnMut(&'a [u8], &mut Self) -> Option<()>) -> Option<()> {
        self.eat(b'{')?;
        self.ws();
        if self.eat_if(b'}') {
            return Some(());
        }
        loop {
            self.eat(b'"')?;
            let key = self.plain_str()?;
            self.ws();
            self.eat(b':')?;
            self.ws();
            member(key, self)?;
            self.ws();
            match self.next()? {
                b',' => self.ws(),
                b'}' => return Some(()),
                _ => return None,
            }
        }
    }

    /// Skips one value at the cursor (no whitespace before it) and returns its bytes.
    ///
    /// Iterative, with the open arrays and objects as bits of a `u128`: no recursion, no
    /// allocation.
    fn value(&mut self) -> Option<&'a [u8]> {
        let start = self.i;
        // Bit 0 is the innermost open container: set for an object.
        let (mut stack, mut depth) = (0u128, 0u32);
        'value: loop {
            match self.peek()? {
                open @ (b'{' | b'[') => {
                    if depth == MAX_NEST {
                        return None;
                    }
                    let object = open == b'{';
                    self.i += 1;
                    self.ws();
                    if !self.eat_if(if object { b'}' } else { b']' }) {
                        stack = stack << 1 | u128::from(object);
                        depth += 1;
                        if object {
                            self.member_key()?;
                        }
                        continue 'value;
                    }
                }
                b'"' => {
                    self.i += 1;
                    self.string()?;
                }
                b'-' | b'0'..=b'9' => self.number()?,
                b't' => self.literal(b"true")?,
                b'f' => self.literal(b"false")?,
                b'n' => self.literal(b"null")?,
                _ => return None,
            }
            // A value ended: close what it ends, or go on to the next item or member.
            loop {
                if depth == 0 {
                    return Some(&self.b[start..self.i]);
                }
                self.ws();
                let object = stack & 1 == 1;
                match self.next()? {
                    b',' => {
                        self.ws();
                        if object {
                            self.member_key()?;
                        }
                        continue 'value;
                    }
                    b'}' if object => {}
                    b']' if !object => {}
                    _ => return None,
                }
                stack >>= 1;
                depth -= 1;
            }
        }
    }

    /// Skips a key of a nested object, its colon and the whitespace up to its value.
    #[inline(always)]
    fn member_key(&mut self) -> Option<()> {
        self.eat(b'"')?;
        self.string()?;
        self.ws();
        self.eat(b':')?;
        self.ws();
        Some(())
    }

    /// Skips the rest of a string (its opening quote read), checking it as serde_json does:
    /// escapes well formed (`\u` takes any four hex digits: a lone surrogate passes), no control
    /// character. (Its UTF-8 [`scan`] has checked.)
    #[inline(always)]
    fn string(&mut self) -> Option<()> {
        loop {
            let stop = self.string_stop()?;
            self.i = stop + 1;
            match self.b[stop] {
                b'"' => return Some(()),
                b'\\' => match self.next()? {
                    b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => {}
                    b'u' => {
                        let hex = self.b.get(self.i..self.i + 4)?;
                        if !hex.iter().all(u8::is_ascii_hexdigit) {
                            return None;
                        }
                        self.i += 4;
                    }
                    _ => return None,
                },
                _ => return None,
            }
        }
    }

    /// The rest of a string without escapes (its opening quote read): its bytes.
    #[inline(always)]
    fn plain_str(&mut self) -> Option<&'a [u8]> {
        let (start, stop) = (self.i, self.string_stop()?);
        self.i = stop + 1;
        (self.b[stop] == b'"').then_some(&self.b[start..stop])
    }

    /// Where the string text at the cursor stops: its closing quote, a backslash, or a control
    /// character (refused).
    #[inline(always)]
    fn string_stop(&self) -> Option<usize> {
        let rest = &self.b[self.i..];
        let n = match self.ctrl {
            true => quote_backslash_or_control(rest),
            false => quote_or_backslash(rest),
        }?;
        Some(self.i + n)
    }

    /// Skips a number: `-`? (`0` | `[1-9][0-9]*`) (`.` digits)? (`e` sign? digits)?. What may
    /// follow it (not a digit after a leading `0`) is checked by the caller, who expects `,`, a
    /// closing bracket or the end.
    #[inline(always)]
    fn number(&mut self) -> Option<()> {
        self.eat_if(b'-');
        match self.next()? {
            b'0' => {}
            b'1'..=b'9' => {
                self.digits();
            }
            _ => return None,
        }
        if self.eat_if(b'.') && self.digits() == 0 {
            return None;
        }
        if let Some(b'e' | b'E') = self.peek() {
            self.i += 1;
            if let Some(b'+' | b'-') = self.peek() {
                self.i += 1;
            }
            if self.digits() == 0 {
                return None;
            }
        }
        Some(())
    }

    /// Skips ASCII digits; how many.
    #[inline(always)]
    fn digits(&mut self) -> usize {
        let start = self.i;
        while let Some(w) = self.b[self.i..].first_chunk::<8>() {
            let hit = bytes_not_digit(u64::from_le_bytes(*w));
            if hit != 0 {
                self.i += hit.trailing_zeros() as usize / 8;
                return self.i - start;
            }
            self.i += 8;
        }
        while let Some(b'0'..=b'9') = self.b.get(self.i) {
            self.i += 1;
        }
        self.i - start
    }

    #[inline(always)]
    fn literal(&mut self, word: &[u8]) -> Option<()> {
        self.b[self.i..]
            .starts_with(word)
            .then(|| self.i += word.len())
    }
}

/// The lowest and the highest byte of `b` (`u8::MAX` and 0 when it is empty), in lanes of 32
/// that compile to vector minimum and maximum (a fold over the bytes did not vectorise: it was
/// a fifth of the scan's instructions).
fn lowest_and_highest(b: &[u8]) -> (u8, u8) {
    const LANES: usize = 32;
    let (mut lo, mut hi) = ([u8::MAX; LANES], [0u8; LANES]);
    let mut chunks = b.chunks_exact(LANES);
    for chunk in &mut chunks {
        for i in 0..LANES {
            lo[i] = lo[i].min(chunk[i]);
            hi[i] = hi[i].max(chunk[i]);
        }
    }
    for &x in chunks.remainder() {
        lo[0] = lo[0].min(x);
        hi[0] = hi[0].max(x);
    }
    (
        lo.iter().copied().min().unwrap_or(u8::MAX),
        hi.iter().copied().max().unwrap_or(0),
    )
}

// Eight bytes at a time in a `u64` (SWAR): for each byte the high bit says whether it is one
// looked for. A hit can set a false bit above it (a borrow), never below: the lowest is exact.
const ONES: u64 = u64::MAX / 255;
const HIGH: u64 = ONES << 7;

/// The bytes of `w` equal to `b` (high bits; exact up to the lowest).
fn bytes_eq(w: u64, b: u8) -> u64 {
    let x = w ^ (ONES * u64::from(b));
    x.wrapping_sub(ONES) & !x & HIGH
}

/// The bytes of `w` below 0x20 (high bits; exact up to the lowest).
fn bytes_control(w: u64) -> u64 {
    w.wrapping_sub(ONES * 0x20) & !w & HIGH
}

/// The bytes of `w` that are not ASCII digits (high bits; exact up to the lowest): below `0`
/// (a borrow only sets bits above a hit), or above `9` (a carry only leaves a byte of 0xba or
/// more, itself a hit, and sets bits above it).
fn bytes_not_digit(w: u64) -> u64 {
    let below = w.wrapping_sub(ONES * u64::from(b'0')) & !w;
    let above = w.wrapping_add(ONES * u64::from(127 - b'9')) | w;
    (below | above) & HIGH
}

/// Where the first `"` or `\` in `b` is.
///
/// Most strings are short (keys, methods, small values) and the runs between escapes in text are
/// too, so the first 64 bytes are looked at in place before paying for a `memchr2` call, which
/// then runs vectors over long text.
#[inline(always)]
fn quote_or_backslash(b: &[u8]) -> Option<usize> {
    let mut at = 0;
    while let Some(w) = b[at..].first_chunk::<8>().filter(|_| at < 64) {
        let w = u64::from_le_bytes(*w);
        let hit = bytes_eq(w, b'"') | bytes_eq(w, b'\\');
        if hit != 0 {
            return Some(at + hit.trailing_zeros() as usize / 8);
        }
        at += 8;
    }
    memchr2(b'"', b'\\', &b[at..]).map(|n| at + n)
}

/// Where the first `"`, `\` or control character in `b` is.
#[inline(always)]
fn quote_backslash_or_control(b: &[u8]) -> Option<usize> {
    let mut at = 0;
    while let Some(w) = b[at..].first_chunk::<8>() {
        let w = u64::from_le_bytes(*w);
        let hit = bytes_eq(w, b'"') | bytes_eq(w, b'\\') | bytes_control(w);
        if hit != 0 {
            return Some(at + hit.trailing_zeros() as usize / 8);
        }
        at += 8;
    }
    let stop = |&x: &u8| x == b'"' || x == b'\\' || x < 0x20;
    b[at..].iter().position(stop).map(|n| at + n)
}

#[cfg(test)]
mod tests;
