//! Ids and the contiguity check (design.md §3, §4).
//!
//! A session id is 128 random bits shown as 32 lowercase hex characters. An event id — the cursor a
//! client sends back as `Last-Event-ID` — is `{session}:{epoch}:{seq}`. [`check_resume`] decides,
//! from nothing but the log's ranges, whether a cursor can be served without a gap.

use std::fmt;

/// A proxy session id: 16 bytes from the OS CSPRNG.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SessionId(pub [u8; 16]);

impl SessionId {
    /// A fresh, unguessable id.
    pub fn random() -> Self {
        let mut b = [0u8; 16];
        getrandom::getrandom(&mut b).expect("OS random source");
        Self(b)
    }

    /// Parses exactly 32 lowercase hex characters.
    pub fn parse(s: &str) -> Option<Self> {
        let bytes = s.as_bytes();
        if bytes.len() != 32 {
            return None;
        }
        let mut out = [0u8; 16];
        for (i, pair) in bytes.chunks_exact(2).enumerate() {
            out[i] = (hex_val(pair[0])? << 4) | hex_val(pair[1])?;
        }
        Some(Self(out))
    }

    /// The 32 lowercase hex characters. Event ids are formatted once per delivered event, so
    /// this writes into an array rather than through the formatter.
    pub fn hex(&self) -> [u8; 32] {
        let mut out = [0u8; 32];
        hex::encode_to_slice(self.0, &mut out).expect("32 bytes hold 16 in hex");
        out
    }
}

fn hex_val(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    }
}

impl fmt::Display for SessionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(std::str::from_utf8(&self.hex()).expect("hex is ASCII"))
    }
}

impl fmt::Debug for SessionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SessionId({self})")
    }
}

/// A parsed event id `{session}:{epoch}:{seq}`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cursor {
    /// Session the event belongs to.
    pub session: SessionId,
    /// Epoch (from 1).
    pub epoch: u32,
    /// Sequence number in the session (from 1).
    pub seq: u64,
}

impl Cursor {
    /// Parses an event id. Leading/trailing whitespace is not accepted: ids are opaque tokens.
    pub fn parse(s: &str) -> Option<Self> {
        let mut parts = s.split(':');
        let session = SessionId::parse(parts.next()?)?;
        let epoch = parse_decimal(parts.next()?)?;
        let seq = parse_decimal(parts.next()?)?;
        if parts.next().is_some() || epoch == 0 || seq == 0 || epoch > u32::MAX as u64 {
            return None;
        }
        Some(Self {
            session,
            epoch: epoch as u32,
            seq,
        })
    }
}

fn parse_decimal(s: &str) -> Option<u64> {
    if s.is_empty() || s.len() > 20 || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    if s.len() > 1 && s.starts_with('0') {
        return None;
    }
    s.parse().ok()
}

/// Longest event id: 32 hex characters, `:`, a `u32` epoch, `:`, a `u64` seq.
pub const MAX_EVENT_ID_LEN: usize = 32 + 1 + 10 + 1 + 20;

impl Cursor {
    /// Writes the id into `buf` without allocating and returns it. Every delivered event gets
    /// its id built here, so this avoids the formatter machinery.
    pub fn write_to<'b>(&self, buf: &'b mut [u8; MAX_EVENT_ID_LEN]) -> &'b str {
        let id = Self::write_id(&self.session.hex(), self.epoch, self.seq, buf);
        std::str::from_utf8(id).expect("event ids are ASCII")
    }

    /// The bytes of the id of event `epoch`/`seq` of the session whose id is `session_hex`
    /// ([`SessionId::hex`]), written into `buf`: what [`Cursor::write_to`] writes, for a caller
    /// that writes many ids of one session (a client stream: the hex once per read, no UTF-8
    /// check per id; they are ASCII by construction).
    pub fn write_id<'b>(
        session_hex: &[u8; 32],
        epoch: u32,
        seq: u64,
        buf: &'b mut [u8; MAX_EVENT_ID_LEN],
    ) -> &'b [u8] {
        buf[..32].copy_from_slice(session_hex);
        let mut n = 32;
        for v in [u64::from(epoch), seq] {
            buf[n] = b':';
            n += 1;
            let mut digits = [0u8; 20];
            let mut i = digits.len();
            let mut v = v;
            loop {
                i -= 1;
                digits[i] = b'0' + (v % 10) as u8;
                v /= 10;
                if v == 0 {
                    break;
                }
            }
            let d = &digits[i..];
            buf[n..n + d.len()].copy_from_slice(d);
            n += d.len();
        }
        &buf[..n]
    }
}

impl fmt::Display for Cursor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.write_to(&mut [0u8; MAX_EVENT_ID_LEN]))
    }
}

/// One epoch's seq range. `last` is `None` for the open (current) epoch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct EpochRange {
    /// Epoch number.
    pub epoch: u32,
    /// First seq logged in this epoch (may be `head + 1` while the epoch is still empty).
    pub first: u64,
    /// Durable end of a sealed epoch; `None` while it is open.
    pub last: Option<u64>,
}

/// Why a resume was refused (the `error.data.reason` of design.md §4).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Refusal {
    /// `Last-Event-ID` does not parse (400).
    MalformedCursor,
    /// The cursor's session is not the `Mcp-Session-Id` sent (409).
    ForeignSession,
    /// This proxy does not hold the session's log (404).
    UnknownSession,
    /// Events after the cursor were trimmed (409).
    CursorTrimmed,
    /// The cursor is beyond the head of its epoch (409).
    CursorAhead,
    /// The epoch is not known for this session (409).
    UnknownEpoch,
}

impl Refusal {
    /// Every reason, for registering metric label sets up front.
    pub const ALL: [Refusal; 6] = [
        Refusal::MalformedCursor,
        Refusal::ForeignSession,
        Refusal::UnknownSession,
        Refusal::CursorTrimmed,
        Refusal::CursorAhead,
        Refusal::UnknownEpoch,
    ];

    /// The fixed reason string.
    pub fn as_str(self) -> &'static str {
        match self {
            Refusal::MalformedCursor => "malformed_cursor",
            Refusal::ForeignSession => "foreign_session",
            Refusal::UnknownSession => "unknown_session",
            Refusal::CursorTrimmed => "cursor_trimmed",
            Refusal::CursorAhead => "cursor_ahead",
            Refusal::UnknownEpoch => "unknown_epoch",
        }
    }
}

/// The ranges of one session's log that the contiguity check needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogRanges {
    /// Epochs, ascending.
    pub epochs: Vec<EpochRange>,
    /// Oldest retained seq (`head + 1` when nothing is retained).
    pub oldest: u64,
    /// Newest durable seq (0 when empty).
    pub head: u64,
}

impl LogRanges {
    /// The epoch the next event (and the head) belongs to.
    pub fn current_epoch(&self) -> u32 {
        self.epochs.last().map(|e| e.epoch).unwrap_or(1)
    }

    /// The epoch an existing `seq` was logged in.
    pub fn epoch_of(&self, seq: u64) -> u32 {
        self.epochs
            .iter()
            .rev()
            .find(|e| e.first <= seq)
            .map(|e| e.epoch)
            .unwrap_or(1)
    }
}

/// Decides whether `cursor` (already known to name this session) can be resumed without a gap.
///
/// On success returns the seq to read after. `need_cursor_event` asks that the cursor's own event
/// still be retained (the Streamable HTTP face needs it to learn which stream the cursor is on).
///
/// # Errors
/// The [`Refusal`] that applies: `unknown_epoch`, `cursor_ahead` or `cursor_trimmed`.
pub fn check_resume(
    cursor: &Cursor,
    log: &LogRanges,
    need_cursor_event: bool,
) -> Result<u64, Refusal> {
    let Some(range) = log.epochs.iter().find(|e| e.epoch == cursor.epoch) else {
        return Err(Refusal::UnknownEpoch);
    };
    let end = range.last.unwrap_or(log.head);
    if cursor.seq > end {
        return Err(Refusal::CursorAhead);
    }
    if cursor.seq < range.first {
        // No event with this seq was ever logged in this epoch: the id was not issued by us.
        return Err(Refusal::UnknownEpoch);
    }
    // Saturating: after seq u64::MAX nothing can follow, so nothing is needed (found by fuzzing;
    // a real head never gets there, but the check must not panic on any id a client sends).
    let first_needed = if need_cursor_event {
        cursor.seq
    } else {
        cursor.seq.saturating_add(1)
    };
    if first_needed < log.oldest && first_needed <= log.head {
        return Err(Refusal::CursorTrimmed);
    }
    Ok(cursor.seq)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sid() -> SessionId {
        SessionId::parse("9f86d081884c7d659a2feaa0c55ad015").unwrap()
    }

    #[test]
    fn session_id_round_trip_and_rejects() {
        let id = SessionId::random();
        let s = id.to_string();
        assert_eq!(s.len(), 32);
        assert_eq!(SessionId::parse(&s), Some(id));
        assert_ne!(SessionId::random(), id);
        for bad in [
            "",
            "9f86d081884c7d659a2feaa0c55ad01",
            "9f86d081884c7d659a2feaa0c55ad0155",
            "9F86D081884C7D659A2FEAA0C55AD015",
            "9f86d081884c7d659a2feaa0c55ad01g",
        ] {
            assert_eq!(SessionId::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn cursor_parse_and_display() {
        let c = Cursor::parse("9f86d081884c7d659a2feaa0c55ad015:1:1043").unwrap();
        assert_eq!(c.session, sid());
        assert_eq!((c.epoch, c.seq), (1, 1043));
        assert_eq!(c.to_string(), "9f86d081884c7d659a2feaa0c55ad015:1:1043");
    }

    #[test]
    fn event_id_extremes_round_trip() {
        for (epoch, seq) in [(1, 1), (u32::MAX, u64::MAX), (10, 1_000_000_007)] {
            let c = Cursor {
                session: sid(),
                epoch,
                seq,
            };
            let s = c.to_string();
            assert_eq!(s, format!("9f86d081884c7d659a2feaa0c55ad015:{epoch}:{seq}"));
            assert_eq!(Cursor::parse(&s), Some(c));
        }
        assert_eq!(
            SessionId([0xab; 16]).to_string(),
            "abababababababababababababababab"
        );
    }

    #[test]
    fn malformed_cursors() {
        let s = "9f86d081884c7d659a2feaa0c55ad015";
        for bad in [
            String::new(),
            "garbage".into(),
            format!("{s}:1"),
            format!("{s}:1:"),
            format!("{s}::5"),
            format!("{s}:0:5"),
            format!("{s}:1:0"),
            format!("{s}:1:5:7"),
            format!("{s}:1:-5"),
            format!("{s}:1:+5"),
            format!("{s}:01:5"),
            format!("{s}: 1:5"),
            format!("{s}:1:5 "),
            format!("{s}:4294967296:5"),
            format!("{s}:1:99999999999999999999999"),
            format!("x{s}:1:5"),
        ] {
            assert_eq!(Cursor::parse(&bad), None, "{bad:?}");
        }
    }

    fn ranges(epochs: &[(u32, u64, Option<u64>)], oldest: u64, head: u64) -> LogRanges {
        LogRanges {
            epochs: epochs
                .iter()
                .map(|&(epoch, first, last)| EpochRange { epoch, first, last })
                .collect(),
            oldest,
            head,
        }
    }

    fn cur(epoch: u32, seq: u64) -> Cursor {
        Cursor {
            session: sid(),
            epoch,
            seq,
        }
    }

    #[test]
    fn contiguous_cases() {
        let log = ranges(&[(1, 1, None)], 1, 10);
        assert_eq!(check_resume(&cur(1, 1), &log, false), Ok(1));
        assert_eq!(check_resume(&cur(1, 10), &log, false), Ok(10), "at head");
        assert_eq!(check_resume(&cur(1, 10), &log, true), Ok(10));
        // Trimmed up to 5: a cursor at 4 still has 5.. retained.
        let log = ranges(&[(1, 1, None)], 5, 10);
        assert_eq!(check_resume(&cur(1, 4), &log, false), Ok(4));
        assert_eq!(check_resume(&cur(1, 5), &log, true), Ok(5));
    }

    #[test]
    fn trimmed() {
        let log = ranges(&[(1, 1, None)], 5, 10);
        assert_eq!(
            check_resume(&cur(1, 3), &log, false),
            Err(Refusal::CursorTrimmed)
        );
        assert_eq!(
            check_resume(&cur(1, 4), &log, true),
            Err(Refusal::CursorTrimmed),
            "cursor event itself gone"
        );
    }

    #[test]
    fn ahead_and_unknown_epoch() {
        let log = ranges(&[(1, 1, None)], 1, 10);
        assert_eq!(
            check_resume(&cur(1, 11), &log, false),
            Err(Refusal::CursorAhead)
        );
        assert_eq!(
            check_resume(&cur(2, 3), &log, false),
            Err(Refusal::UnknownEpoch)
        );
    }

    #[test]
    fn sealed_epoch_valid_only_to_its_durable_end() {
        // Epoch 1 sealed at 100 (events 101.. seen by clients were lost); epoch 2 from 101.
        let log = ranges(&[(1, 1, Some(100)), (2, 101, None)], 1, 103);
        assert_eq!(check_resume(&cur(1, 100), &log, false), Ok(100));
        assert_eq!(check_resume(&cur(1, 50), &log, false), Ok(50));
        assert_eq!(
            check_resume(&cur(1, 101), &log, false),
            Err(Refusal::CursorAhead),
            "an id the old process showed but never made durable"
        );
        assert_eq!(check_resume(&cur(2, 102), &log, false), Ok(102));
        assert_eq!(
            check_resume(&cur(2, 100), &log, false),
            Err(Refusal::UnknownEpoch),
            "seq 100 was never logged in epoch 2"
        );
        assert_eq!(
            check_resume(&cur(2, 104), &log, false),
            Err(Refusal::CursorAhead)
        );
    }

    #[test]
    fn cursor_at_u64_max_does_not_overflow() {
        // Found by fuzzing (fuzz/corpus/cursor/regression-seq-max): `seq + 1` overflowed.
        let log = ranges(&[(1, 1, None)], 1, u64::MAX);
        assert_eq!(check_resume(&cur(1, u64::MAX), &log, false), Ok(u64::MAX));
        assert_eq!(check_resume(&cur(1, u64::MAX), &log, true), Ok(u64::MAX));
        let log = ranges(&[(1, 1, None)], u64::MAX, u64::MAX);
        assert_eq!(
            check_resume(&cur(1, u64::MAX - 1), &log, true),
            Err(Refusal::CursorTrimmed)
        );
    }

    #[test]
    fn epoch_of() {
        let log = ranges(&[(1, 1, Some(100)), (2, 101, None)], 1, 103);
        assert_eq!(log.epoch_of(100), 1);
        assert_eq!(log.epoch_of(101), 2);
        assert_eq!(log.current_epoch(), 2);
    }
}
