//! The shared log's storage on Redis (design.md §13): what `log.backend = "redis"` writes, and the
//! only way it writes — fenced scripts.
//!
//! A session is four keys sharing the hash tag `{<session>}` (so a Redis Cluster keeps them on one
//! node and a script may touch them all):
//!
//! | key | type | holds |
//! |---|---|---|
//! | `<prefix>:{s}:m` | hash | `owner`, `epoch`, `head`, `lo` (the oldest retained seq), `state` (`live` / `ended`), `ep` (the epoch table, JSON), `bt` (the last batch token), `meta` (face, identity, protocol: JSON), `end_reason`, `ended_unix` |
//! | `<prefix>:{s}:ev` | stream | one entry per chunk of consecutive events of one epoch, id `<first seq>-0`; fields `e` epoch, `n` events, `b` the events (see below) |
//! | `<prefix>:{s}:in` | hash | request in flight (canonical id) → its stream tag |
//! | `<prefix>:{s}:ab` | hash | request answered -32091 by a takeover → the seq of that answer |
//!
//! A chunk is what one write adds at a time: an append's events (the writer turn's group commit),
//! cut at [`CHUNK_EVENTS`] events or [`CHUNK_BYTES`] bytes, or one event of a takeover or an end.
//! Its `b` is each event in turn as `<tag> <kind> <payload length>\n<payload>`: one `XADD` per
//! chunk, not per event, is what keeps Redis's CPU and its AOF per event small. (Entries of the
//! earlier form, one event with fields `e`, `t`, `k`, `d`, are still read.)
//!
//! and a doorbell, the shard channel `<prefix>:{s}:m:n`, rung with `<epoch>:<head>` after every
//! write: it only wakes readers, who read the stream (the truth), so a lost ring delays and never
//! skips.
//!
//! **The fence.** Every write script first checks that the caller is the record's owner *at the
//! current epoch* and that the session is live, and an append also that the head is the one the
//! caller expects (compare-and-append): a stale owner — paused past its lease, or whose record
//! Redis lost or rewound — gets [`Refused`] and must end the session loudly, never write around
//! it. A takeover is the same compare on the dead owner and its epoch: it seals that epoch at the
//! head, opens epoch + 1 with a -32091 for every request in flight and the end marker, and bumps
//! the epoch, so no late write of the old owner can land.
//!
//! Reads ([`Shared::read`]) take the record and a page of the stream in one read-only script, so
//! the resume check (§4: [`super::cursor::check_resume`] over [`Record::ranges`]) and the events it
//! serves come from one snapshot, on whichever replica runs it.

use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::Bytes;
use redis::aio::{ConnectionLike, ConnectionManager};
use redis::cluster_async::ClusterConnection;
use redis::{RedisFuture, Script, Value};

use super::cursor::{EpochRange, LogRanges, SessionId};
use super::event::{Event, Kind, NewEvent, StreamTag};

/// What a fenced write was refused for. Each means the caller must stop writing the session.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refused {
    /// The record is gone (Redis lost it: restart without persistence, `FLUSHALL`, eviction).
    NoSession,
    /// Another owner or a later epoch holds it (a takeover happened): the record's epoch and head.
    Fenced {
        /// The record's epoch.
        epoch: u32,
        /// The record's head.
        head: u64,
    },
    /// The session has ended: its epoch and head.
    Ended {
        /// The record's epoch.
        epoch: u32,
        /// The record's head.
        head: u64,
    },
    /// The head is not the one expected: the record's head and the token of the batch that set
    /// it (the caller's own token means its earlier write did land; any other, that Redis lost
    /// or rewound what the caller wrote).
    Head {
        /// The record's head.
        head: u64,
        /// The batch token of the write that set it.
        batch: String,
    },
}

/// A Redis error, or an answer this module cannot read.
#[derive(Debug, thiserror::Error)]
pub enum SharedError {
    /// The connection or the command failed.
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    /// The server answered something the scripts never return.
    #[error("redis answered an unexpected reply: {0}")]
    Reply(String),
}

impl SharedError {
    /// Whether asking again may get an answer: the connection failed or timed out, or the server
    /// is loading its data, or a Cluster is between states. A script's own error, or a reply of
    /// the wrong shape, is not.
    pub fn transient(&self) -> bool {
        use redis::{ErrorKind, ServerErrorKind as S};
        match self {
            SharedError::Redis(e) => {
                e.is_io_error()
                    || e.is_timeout()
                    || e.is_connection_dropped()
                    || e.is_connection_refusal()
                    || matches!(
                        e.kind(),
                        ErrorKind::Server(
                            S::BusyLoading | S::TryAgain | S::ClusterDown | S::MasterDown
                        )
                    )
            }
            SharedError::Reply(_) => false,
        }
    }
}

/// The result of a fenced write.
pub type Written<T> = Result<Result<T, Refused>, SharedError>;

/// One session's append of a writer turn (see [`Shared::append_turn`]).
#[derive(Debug)]
pub struct Append<'a> {
    /// The session.
    pub id: &'a SessionId,
    /// Its owner and epoch.
    pub fence: &'a Fence,
    /// The head the owner expects.
    pub expected_head: u64,
    /// The batch token.
    pub batch: &'a str,
    /// The events.
    pub evs: &'a [NewEvent],
    /// Events retained at most.
    pub maxlen: Option<u64>,
}

/// Who writes a session: the owner's name (`<replica>/<incarnation>`) and the epoch it writes in
/// (the fencing token; also the `{epoch}` of the event ids).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fence {
    /// The owner's name.
    pub owner: String,
    /// The epoch.
    pub epoch: u32,
}

/// A session's record, as one read saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    /// Who owns it, at which epoch.
    pub fence: Fence,
    /// Its epochs, oldest retained seq and head: what resumes are checked against.
    pub ranges: LogRanges,
    /// `None` while live; the end reason once ended.
    pub ended: Option<String>,
    /// The session's meta (JSON, as written at creation).
    pub meta: String,
}

/// A takeover's outcome.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Takeover {
    /// The epoch the taker wrote the end in.
    pub epoch: u32,
    /// The head after the end marker.
    pub head: u64,
    /// Requests that were in flight, each answered -32091.
    pub aborted: usize,
}

/// Redis's durability settings, as `CONFIG GET` reports them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Persistence {
    /// `appendonly`.
    pub appendonly: String,
    /// `appendfsync`.
    pub appendfsync: String,
}

impl Persistence {
    /// The setting that keeps `durability = "fsync"` from holding on this server, if any: an
    /// acknowledged write is on the server's disk only with `appendonly yes` and `appendfsync
    /// always` (Redis then fsyncs before it replies).
    pub fn fsync_refusal(&self) -> Option<String> {
        if self.appendonly != "yes" {
            return Some(format!(
                "appendonly is {:?}; durability = \"fsync\" needs appendonly yes",
                self.appendonly
            ));
        }
        if self.appendfsync != "always" {
            return Some(format!(
                "appendfsync is {:?}; durability = \"fsync\" needs appendfsync always",
                self.appendfsync
            ));
        }
        None
    }
}

/// How long a command may wait for its answer (the library's default is 500 ms): a writer turn
/// is one transaction (at most 4 MiB of events), and with `appendfsync always` its answer waits
/// for Redis's fsync; a slow disk must not turn every session of the turn into an unknown outcome.
const RESPONSE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// Events a chunk holds at most (an append of more is cut into several). The append script's
/// trim relies on it: a chunk starting before `oldest - CHUNK_EVENTS + 1` ends before `oldest`.
pub const CHUNK_EVENTS: usize = 256;
/// Payload bytes a chunk holds at most, unless its one event is larger (bounds what a read copies
/// beyond the events it was asked for). Below redis-server's 32 KiB "big argument" size: with
/// 1 MiB chunks the Redis path delivered 114–126k events/s against 175–231k with these, and
/// redis-server spent 7–7.8 s of CPU per million events against 3.5–4.9 (loadgen, 2026-12-05).
pub const CHUNK_BYTES: usize = 30 << 10;

/// The Lua every script that writes events shares: one chunk entry, one event of a chunk.
const CHUNK: &str = r#"
local function entry(stream, seq, epoch, n, blob)
  redis.call('XADD', stream, string.format('%d-0', seq), 'e', epoch, 'n', n, 'b', blob)
end
local function ev(tag, kind, body)
  return string.format('%s %s %d\n', tag, kind, #body) .. body
end
"#;

/// The Lua the write scripts share: the fence. Returns a refusal, or nil and the record's fields
/// (`owner`, `epoch`, `head`, `state`, `bt`, `lo`).
const FENCE: &str = r#"
local function fence(rec, owner, epoch)
  local m = redis.call('HMGET', rec, 'owner', 'epoch', 'head', 'state', 'bt', 'lo')
  if not m[1] then return {'NOSESSION'} end
  if m[1] ~= owner or m[2] ~= epoch then return {'FENCED', m[2], m[3]} end
  if m[4] ~= 'live' then return {'ENDED', m[2], m[3]} end
  return nil, m
end
-- Adds the chunks of ARGV (ARGV[7] of them from ARGV[8]: events, bytes) after `head`, in
-- `epoch`; the requests named after them (the ones these events answer) leave the in-flight
-- hash. Returns the new head.
local function add_chunks(stream, inflight, epoch, head)
  local i = 8
  for c = 1, tonumber(ARGV[7]) do
    entry(stream, head + 1, epoch, ARGV[i], ARGV[i + 1])
    head = head + tonumber(ARGV[i])
    i = i + 2
  end
  for j = i, #ARGV do redis.call('HDEL', inflight, ARGV[j]) end
  return head
end
"#;

/// `create`. KEYS: record. ARGV: owner, meta, epoch table.
const CREATE: &str = r#"
if redis.call('EXISTS', KEYS[1]) == 1 then return {'EXISTS'} end
redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'epoch', '1', 'head', '0', 'lo', '1',
           'state', 'live', 'ep', ARGV[3], 'meta', ARGV[2], 'bt', '')
return {'OK'}
"#;

/// `append`. KEYS: record, stream, in-flight, doorbell. ARGV: owner, epoch, expected head, batch
/// token, max events retained (`''`: no bound), events a chunk holds at most, the number of
/// chunks, then per chunk its events and bytes, then the requests these events answer.
/// Retention keeps the newest `max` events: `lo` (what reads report as the oldest) moves exactly,
/// and whole chunks before it are trimmed (`MINID`; one that reaches `lo` stays).
const APPEND: &str = r#"
local refused, m = fence(KEYS[1], ARGV[1], ARGV[2])
if refused then return refused end
if m[3] ~= ARGV[3] then return {'HEAD', m[3], m[5] or ''} end
local head = add_chunks(KEYS[2], KEYS[3], ARGV[2], tonumber(m[3]))
redis.call('HSET', KEYS[1], 'head', string.format('%d', head), 'bt', ARGV[4])
if ARGV[5] ~= '' then
  local lo = tonumber(m[6])
  if not lo then
    -- A record of the earlier form (trimmed by MAXLEN, no `lo`): its first entry is its
    -- oldest event, and `lo` never goes below it.
    local first = redis.call('XRANGE', KEYS[2], '-', '+', 'COUNT', 1)
    lo = head + 1
    if first[1] then lo = tonumber(string.match(first[1][1], '^(%d+)')) end
    redis.call('HSET', KEYS[1], 'lo', string.format('%d', lo))
  end
  local keep = head - tonumber(ARGV[5]) + 1
  if keep > lo then
    redis.call('HSET', KEYS[1], 'lo', string.format('%d', keep))
    local before = keep - tonumber(ARGV[6]) + 1
    if before > 1 then redis.call('XTRIM', KEYS[2], 'MINID', string.format('%d-0', before)) end
  end
end
redis.call('SPUBLISH', KEYS[4], ARGV[2] .. ':' .. string.format('%d', head))
return {'OK', string.format('%d', head)}
"#;

/// `commit`: a watched turn's end for one session, in its `MULTI` after the session's plain
/// `XADD`s (see [`Shared::append_watched`]); sent whole (`EVAL`: a missing script inside the
/// transaction would leave the chunks written and the head not moved). KEYS: record, stream,
/// in-flight, doorbell. ARGV: the entries the stream must hold now (its length read under the
/// `WATCH` plus the chunks: an `XADD` that failed inside `MULTI`, which has no rollback, leaves
/// fewer, and then nothing moves), the new head, the batch token, max events retained (`''`:
/// no bound), events a chunk holds at most, the epoch, then the requests these events answer.
/// Retention as `append`. Small arguments only: no event byte goes through Lua.
const COMMIT: &str = r#"
if redis.call('XLEN', KEYS[2]) ~= tonumber(ARGV[1]) then return {'NOTADDED'} end
local head = tonumber(ARGV[2])
redis.call('HSET', KEYS[1], 'head', ARGV[2], 'bt', ARGV[3])
if ARGV[4] ~= '' then
  local lo = tonumber(redis.call('HGET', KEYS[1], 'lo'))
  local keep = head - tonumber(ARGV[4]) + 1
  if lo and keep > lo then
    redis.call('HSET', KEYS[1], 'lo', string.format('%d', keep))
    local before = keep - tonumber(ARGV[5]) + 1
    if before > 1 then redis.call('XTRIM', KEYS[2], 'MINID', string.format('%d-0', before)) end
  end
end
for j = 7, #ARGV do redis.call('HDEL', KEYS[3], ARGV[j]) end
redis.call('SPUBLISH', KEYS[4], ARGV[6] .. ':' .. ARGV[2])
return {'OK'}
"#;

/// `inflight_add`. KEYS: record, in-flight. ARGV: owner, epoch, request id, tag. A request id
/// already in flight answers `DUP` with its stream tag (a retried forward joins the first).
const INFLIGHT_ADD: &str = r#"
local refused = fence(KEYS[1], ARGV[1], ARGV[2])
if refused then return refused end
local existing = redis.call('HGET', KEYS[2], ARGV[3])
if existing then return {'DUP', existing} end
redis.call('HSET', KEYS[2], ARGV[3], ARGV[4])
return {'OK'}
"#;

/// `inflight_done`. KEYS: record, in-flight. ARGV: owner, epoch, request id. A request the
/// upstream refused leaves the in-flight hash (it will never be answered there).
const INFLIGHT_DONE: &str = r#"
local refused = fence(KEYS[1], ARGV[1], ARGV[2])
if refused then return refused end
redis.call('HDEL', KEYS[2], ARGV[3])
return {'OK'}
"#;

/// `end`. KEYS: record, stream, in-flight, doorbell. ARGV: owner, epoch, expected head, reason,
/// retain secs, events a chunk holds at most (unused), the number of chunks, then the chunks
/// and requests as for `append` (the answers the session owes). Then the end marker; the
/// session's keys expire after `retain secs`.
const END: &str = r#"
local refused, m = fence(KEYS[1], ARGV[1], ARGV[2])
if refused then return refused end
if m[3] ~= ARGV[3] then return {'HEAD', m[3], m[5] or ''} end
local head = add_chunks(KEYS[2], KEYS[3], ARGV[2], tonumber(m[3]))
head = head + 1
entry(KEYS[2], head, ARGV[2], '1', ev('0', '3', cjson.encode({reason = ARGV[4]})))
local now = redis.call('TIME')
redis.call('HSET', KEYS[1], 'head', string.format('%d', head), 'state', 'ended',
           'end_reason', ARGV[4], 'ended_unix', now[1])
redis.call('DEL', KEYS[3])
redis.call('EXPIRE', KEYS[1], ARGV[5])
redis.call('EXPIRE', KEYS[2], ARGV[5])
redis.call('SPUBLISH', KEYS[4], ARGV[2] .. ':' .. string.format('%d', head))
return {'OK', string.format('%d', head)}
"#;

/// `takeover`. KEYS: record, stream, in-flight, aborted, doorbell. ARGV: the dead owner, its
/// epoch, the taker, reason, message, retain secs, the error code (-32091). Compares the dead owner and epoch, seals that
/// epoch at the head, and in epoch + 1 answers every request in flight -32091 (kind `Final` on a
/// POST stream, tag >= 2) and writes the end marker.
const TAKEOVER: &str = r#"
local m = redis.call('HMGET', KEYS[1], 'owner', 'epoch', 'head', 'state', 'ep')
if not m[1] then return {'NOSESSION'} end
if m[1] ~= ARGV[1] or m[2] ~= ARGV[2] then return {'FENCED', m[2], m[3]} end
if m[4] ~= 'live' then return {'ENDED', m[2], m[3]} end
local head = tonumber(m[3])
local epoch = tonumber(m[2]) + 1
local e = string.format('%d', epoch)
local ep = cjson.decode(m[5])
ep[#ep]['last'] = head
ep[#ep + 1] = {epoch = epoch, first = head + 1, last = cjson.null}
local inflight = redis.call('HGETALL', KEYS[3])
local msg = cjson.encode(ARGV[5])
local data = cjson.encode({reason = ARGV[4]})
local aborted = 0
for i = 1, #inflight, 2 do
  head = head + 1
  local tag = inflight[i + 1]
  local kind = '0'
  if tonumber(tag) >= 2 then kind = '2' end
  local body = '{"jsonrpc":"2.0","id":' .. inflight[i] .. ',"error":{"code":' .. ARGV[7] .. ',"message":' ..
               msg .. ',"data":' .. data .. '}}'
  entry(KEYS[2], head, e, '1', ev(tag, kind, body))
  redis.call('HSET', KEYS[4], inflight[i], string.format('%d', head))
  aborted = aborted + 1
end
head = head + 1
entry(KEYS[2], head, e, '1', ev('0', '3', data))
local now = redis.call('TIME')
redis.call('HSET', KEYS[1], 'owner', ARGV[3], 'epoch', e, 'head', string.format('%d', head),
           'state', 'ended', 'ep', cjson.encode(ep), 'end_reason', ARGV[4], 'ended_unix', now[1])
redis.call('DEL', KEYS[3])
for i = 1, 4 do
  if i ~= 3 then redis.call('EXPIRE', KEYS[i], ARGV[6]) end
end
redis.call('SPUBLISH', KEYS[5], e .. ':' .. string.format('%d', head))
return {'OK', e, string.format('%d', head), string.format('%d', aborted)}
"#;

/// `read` (read-only). KEYS: record, stream. ARGV: after, count, bytes (optional). The record's
/// fields, the oldest retained seq (`''`: none), then the entries holding the events after seq
/// `after`, up to the head, until they hold `count` events or their values `bytes` (the first
/// may start before `after`, the last may hold more than asked: the caller cuts).
const READ: &str = r#"
local m = redis.call('HMGET', KEYS[1], 'owner', 'epoch', 'head', 'state', 'ep', 'meta', 'end_reason', 'lo')
if not m[1] then return {} end
local oldest = m[8]
if not oldest then
  -- A record of the earlier form: its first entry is its oldest event.
  local first = redis.call('XRANGE', KEYS[2], '-', '+', 'COUNT', 1)
  oldest = ''
  if first[1] then oldest = string.match(first[1][1], '^(%d+)') end
end
local function count(e)
  local f = e[2]
  for i = 1, #f, 2 do
    if f[i] == 'n' then return tonumber(f[i + 1]) end
  end
  return 1
end
local function size(e)
  local f, s = e[2], 0
  for i = 2, #f, 2 do s = s + #f[i] end
  return s
end
local evs = {}
local after = tonumber(ARGV[1])
local max = tonumber(ARGV[2])
local budget = tonumber(ARGV[3]) or math.huge
if after < tonumber(m[3]) then
  local start = string.format('%d-0', after + 1)
  local got, bytes = 0, 0
  -- The chunk that holds `after + 1` may start before it.
  local prev = redis.call('XREVRANGE', KEYS[2], start, '-', 'COUNT', 1)
  if prev[1] then
    local last = tonumber(string.match(prev[1][1], '^(%d+)')) + count(prev[1]) - 1
    if last > after then
      evs[1] = prev[1]
      got = last - after
      bytes = size(prev[1])
    end
    start = '(' .. prev[1][1]
  end
  local stop = m[3] .. '-0'
  while got < max and bytes < budget do
    local page = redis.call('XRANGE', KEYS[2], start, stop, 'COUNT', 16)
    for _, e in ipairs(page) do
      evs[#evs + 1] = e
      got = got + count(e)
      bytes = bytes + size(e)
      start = '(' .. e[1]
      if got >= max or bytes >= budget then break end
    end
    if #page < 16 then break end
  end
end
return {m[1], m[2], m[3], m[4], m[5], m[6] or '', m[7] or '', oldest, evs}
"#;

/// `recreate_lost`. KEYS: record, stream, doorbell. ARGV: owner, the epoch Redis lost, the head
/// the owner had, reason, message, code, retain secs, then per request the owner holds in
/// flight: its canonical id and tag. Only where the record is gone: a new record, ended, whose
/// one epoch (lost + 1) holds a -32091 for each of those requests and the end marker — every id
/// of the lost epochs now answers `unknown_epoch`, never another event.
const RECREATE_LOST: &str = r#"
if redis.call('EXISTS', KEYS[1]) == 1 then return {'EXISTS'} end
local epoch = tonumber(ARGV[2]) + 1
local e = string.format('%d', epoch)
local head = tonumber(ARGV[3])
local first = head + 1
local msg = cjson.encode(ARGV[5])
local data = cjson.encode({reason = ARGV[4]})
for i = 8, #ARGV, 2 do
  head = head + 1
  local kind = '0'
  if tonumber(ARGV[i + 1]) >= 2 then kind = '2' end
  local body = '{"jsonrpc":"2.0","id":' .. ARGV[i] .. ',"error":{"code":' .. ARGV[6] ..
               ',"message":' .. msg .. ',"data":' .. data .. '}}'
  entry(KEYS[2], head, e, '1', ev(ARGV[i + 1], kind, body))
end
head = head + 1
entry(KEYS[2], head, e, '1', ev('0', '3', data))
local now = redis.call('TIME')
local ep = cjson.encode({{epoch = epoch, first = first, last = cjson.null}})
redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'epoch', e, 'head', string.format('%d', head),
           'lo', string.format('%d', first), 'state', 'ended', 'ep', ep, 'meta', '{}', 'bt', '', 'lost', ARGV[2],
           'end_reason', ARGV[4], 'ended_unix', now[1])
redis.call('EXPIRE', KEYS[1], ARGV[7])
redis.call('EXPIRE', KEYS[2], ARGV[7])
redis.call('SPUBLISH', KEYS[3], e .. ':' .. string.format('%d', head))
return {'OK', e, string.format('%d', head)}
"#;

/// `heartbeat`. KEYS: the nodes' lease zset, their address hash. ARGV: the node
/// (`<replica>/<incarnation>`), lease ms, its internal address, `1` to register (first beat).
/// Extends the lease to Redis's now + lease; a node no longer listed (reaped) is told so
/// rather than listed again.
const HEARTBEAT: &str = r#"
if ARGV[4] ~= '1' and not redis.call('ZSCORE', KEYS[1], ARGV[1]) then return {'REAPED'} end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local expiry = now + tonumber(ARGV[2])
redis.call('ZADD', KEYS[1], string.format('%d', expiry), ARGV[1])
redis.call('HSET', KEYS[2], ARGV[1], ARGV[3])
return {'OK', string.format('%d', expiry)}
"#;

/// `claim`. KEYS: the nodes' lease zset, their address hash. ARGV: a node. Removes it only if its
/// lease has lapsed on Redis's clock: the one reaper that gets `OK` takes its sessions over.
const CLAIM: &str = r#"
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not score then return {'GONE'} end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if tonumber(score) > now then return {'ALIVE'} end
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
return {'OK'}
"#;

/// `lapsed` (read-only). KEYS: the nodes' lease zset. The nodes whose lease has lapsed.
const LAPSED: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
return redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', string.format('(%d', now))
"#;

/// The scripts, loaded once (`EVALSHA`, reloaded on `NOSCRIPT` after a Redis restart).
struct Scripts {
    create: Script,
    append: Script,
    inflight_add: Script,
    inflight_done: Script,
    end: Script,
    takeover: Script,
    read: Script,
    recreate_lost: Script,
    heartbeat: Script,
    claim: Script,
    lapsed: Script,
}

impl Scripts {
    fn new() -> Self {
        let fenced = |body: &str| Script::new(&format!("{CHUNK}\n{FENCE}\n{body}"));
        let chunked = |body: &str| Script::new(&format!("{CHUNK}\n{body}"));
        Scripts {
            create: Script::new(CREATE),
            append: fenced(APPEND),
            inflight_add: fenced(INFLIGHT_ADD),
            inflight_done: fenced(INFLIGHT_DONE),
            end: fenced(END),
            takeover: chunked(TAKEOVER),
            read: Script::new(READ),
            recreate_lost: chunked(RECREATE_LOST),
            heartbeat: Script::new(HEARTBEAT),
            claim: Script::new(CLAIM),
            lapsed: Script::new(LAPSED),
        }
    }
}

/// The keys of one session.
struct Keys {
    record: String,
    stream: String,
    inflight: String,
    aborted: String,
    doorbell: String,
}

/// One connection to a single Redis (reconnecting) or to a Redis Cluster (routing each command by
/// its first key's slot: a session's keys share one).
#[derive(Clone)]
enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a redis::Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Single(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Single(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
        }
    }
}

/// The connection of watched turns: `WATCH` holds per connection, so no other task may use it,
/// and it never reconnects by itself (a `WATCH` lost with a dropped connection must fail the turn,
/// not run its `EXEC` unwatched on a new one): a failed round trip drops it, the next turn opens
/// another.
struct Watched {
    client: redis::Client,
    conn: tokio::sync::Mutex<Option<redis::aio::MultiplexedConnection>>,
}

/// The shared log's client: one multiplexed connection to a Redis primary, or to a Cluster.
pub struct Shared {
    conn: Conn,
    /// A single Redis: the writer's own connection for watched turns (see
    /// [`Shared::append_watched`]); `None` on a Cluster.
    watched: Option<Watched>,
    /// The primaries' URLs (one for a single Redis), for what must be asked of each.
    primaries: Vec<String>,
    prefix: String,
    scripts: Scripts,
    /// Times each round trip by op (`mcp_resume_redis_seconds`), once set.
    timer: Option<prometheus::HistogramVec>,
}

/// What the last read of one session's entries saw ([`Shared::read_within`]): how many entries
/// the next read's first page asks for. Kept per session: a read sized from another session's
/// small entries would fetch sixteen of this one's large ones.
#[derive(Debug, Default)]
pub struct ReadHint {
    /// Events per entry (0: not read yet).
    per_entry: AtomicUsize,
    /// The largest entry's bytes (0: not read yet; a budgeted first read then asks for one).
    largest_entry: AtomicUsize,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("prefix", &self.prefix)
            .field("primaries", &self.primaries)
            .finish_non_exhaustive()
    }
}

impl Shared {
    /// Connects to `url` (`redis://` or `rediss://`); every key starts with `prefix`. Whether the
    /// server is one node of a Redis Cluster is asked of the server (`INFO cluster`): `url` may
    /// name any node.
    pub async fn connect(url: &str, prefix: &str) -> Result<Self, SharedError> {
        let client = redis::Client::open(url)?;
        let mut probe = client.get_multiplexed_async_connection().await?;
        let info: String = redis::cmd("INFO")
            .arg("cluster")
            .query_async(&mut probe)
            .await?;
        let cluster = info.lines().any(|l| l.trim() == "cluster_enabled:1");
        let watched = (!cluster).then(|| Watched {
            client: client.clone(),
            conn: tokio::sync::Mutex::new(None),
        });
        let (conn, primaries) = if cluster {
            let nodes: String = redis::cmd("CLUSTER")
                .arg("NODES")
                .query_async(&mut probe)
                .await?;
            let primaries = cluster_primaries(url, &nodes);
            let cluster = redis::cluster::ClusterClientBuilder::new(vec![url])
                .response_timeout(RESPONSE_TIMEOUT)
                .build()?;
            (
                Conn::Cluster(cluster.get_async_connection().await?),
                primaries,
            )
        } else {
            let cfg = redis::aio::ConnectionManagerConfig::new()
                .set_response_timeout(Some(RESPONSE_TIMEOUT));
            let single = ConnectionManager::new_with_config(client, cfg).await?;
            (Conn::Single(single), vec![url.to_string()])
        };
        Ok(Shared {
            conn,
            watched,
            primaries,
            prefix: prefix.to_string(),
            scripts: Scripts::new(),
            timer: None,
        })
    }

    /// Times every round trip from now on in `h` (labelled by op: [`crate::metrics::REDIS_OPS`]).
    pub fn time_with(&mut self, h: prometheus::HistogramVec) {
        self.timer = Some(h);
    }

    /// A timer of one round trip of `op`, observed when dropped.
    fn time(&self, op: &str) -> Option<prometheus::HistogramTimer> {
        self.timer
            .as_ref()
            .map(|h| h.with_label_values(&[op]).start_timer())
    }

    /// Whether this is a Redis Cluster.
    pub fn is_cluster(&self) -> bool {
        matches!(self.conn, Conn::Cluster(_))
    }

    fn keys(&self, id: &SessionId) -> Keys {
        let base = format!("{}:{{{id}}}", self.prefix);
        Keys {
            record: format!("{base}:m"),
            stream: format!("{base}:ev"),
            inflight: format!("{base}:in"),
            aborted: format!("{base}:ab"),
            doorbell: format!("{base}:m:n"),
        }
    }

    /// The doorbell channel of `id` (readers subscribe with `SSUBSCRIBE`).
    pub fn doorbell(&self, id: &SessionId) -> String {
        self.keys(id).doorbell
    }

    /// The persistence settings of each primary (one for a single Redis), with its URL.
    pub async fn persistence(&self) -> Result<Vec<(String, Persistence)>, SharedError> {
        let mut all = Vec::with_capacity(self.primaries.len());
        for url in &self.primaries {
            let mut c = redis::Client::open(url.as_str())?
                .get_multiplexed_async_connection()
                .await?;
            let mut get = async |name: &str| -> Result<String, SharedError> {
                let v: Vec<String> = redis::cmd("CONFIG")
                    .arg("GET")
                    .arg(name)
                    .query_async(&mut c)
                    .await?;
                Ok(v.get(1).cloned().unwrap_or_default())
            };
            let appendonly = get("appendonly").await?;
            let appendfsync = get("appendfsync").await?;
            all.push((
                url.clone(),
                Persistence {
                    appendonly,
                    appendfsync,
                },
            ));
        }
        Ok(all)
    }

    /// Why `durability = "fsync"` cannot hold on these servers, naming the first primary at
    /// fault and its setting; `None` when every primary fsyncs before it replies.
    pub async fn fsync_refusal(&self) -> Result<Option<String>, SharedError> {
        Ok(self.persistence().await?.into_iter().find_map(|(url, p)| {
            p.fsync_refusal()
                .map(|why| format!("{}: {why}", without_credentials(&url)))
        }))
    }

    /// Creates the record of `id`, owned by `owner` in epoch 1; `Ok(false)` when it exists.
    pub async fn create(
        &self,
        id: &SessionId,
        owner: &str,
        meta: &str,
    ) -> Result<bool, SharedError> {
        let _t = self.time("write");
        let k = self.keys(id);
        let ep = serde_json::to_string(&[EpochRange {
            epoch: 1,
            first: 1,
            last: None,
        }])
        .expect("serialisable");
        let r: Vec<String> = self
            .scripts
            .create
            .key(&k.record)
            .arg(owner)
            .arg(meta)
            .arg(ep)
            .invoke_async(&mut self.conn.clone())
            .await?;
        match r.first().map(String::as_str) {
            Some("OK") => Ok(true),
            Some("EXISTS") => Ok(false),
            _ => Err(SharedError::Reply(format!("{r:?}"))),
        }
    }

    /// Appends `evs` after `expected_head`, fenced by `fence`; `batch` names this write (a retry
    /// after a lost reply finds its own token in [`Refused::Head`]). `maxlen` caps the stream's
    /// length (`log.max_events_per_session`). The new head.
    pub async fn append(
        &self,
        id: &SessionId,
        fence: &Fence,
        expected_head: u64,
        batch: &str,
        evs: &[NewEvent],
        maxlen: Option<u64>,
    ) -> Written<u64> {
        let _t = self.time("append");
        let maxlen = maxlen.map(|m| m.to_string()).unwrap_or_default();
        let script = &self.scripts.append;
        self.write_events(script, id, fence, expected_head, (batch, maxlen), evs)
            .await
    }

    /// Records `request_id` as in flight on `stream`, fenced, before it is forwarded upstream.
    /// `Some(tag)` when it already was (on that stream).
    pub async fn inflight_add(
        &self,
        id: &SessionId,
        fence: &Fence,
        request_id: &str,
        stream: StreamTag,
    ) -> Written<Option<StreamTag>> {
        let _t = self.time("write");
        let k = self.keys(id);
        let r: Vec<String> = self
            .scripts
            .inflight_add
            .key(&k.record)
            .key(&k.inflight)
            .arg(&fence.owner)
            .arg(fence.epoch)
            .arg(request_id)
            .arg(stream.0)
            .invoke_async(&mut self.conn.clone())
            .await?;
        if r.first().map(String::as_str) == Some("DUP") {
            let tag = r
                .get(1)
                .and_then(|t| t.parse().ok())
                .ok_or_else(|| SharedError::Reply(format!("{r:?}")))?;
            return Ok(Ok(Some(StreamTag(tag))));
        }
        Ok(answer(&r)?.map(|_| None))
    }

    /// Forgets a request in flight that the upstream refused (fenced like every write).
    ///
    /// # Errors
    /// [`SharedError`] when Redis fails or answers something unexpected.
    pub async fn inflight_done(
        &self,
        id: &SessionId,
        fence: &Fence,
        request_id: &str,
    ) -> Written<()> {
        let _t = self.time("write");
        let k = self.keys(id);
        let r: Vec<String> = self
            .scripts
            .inflight_done
            .key(&k.record)
            .key(&k.inflight)
            .arg(&fence.owner)
            .arg(fence.epoch)
            .arg(request_id)
            .invoke_async(&mut self.conn.clone())
            .await?;
        Ok(answer(&r)?.map(|_| ()))
    }

    /// The requests of `id` in flight (canonical id, stream tag), as Redis holds them now.
    ///
    /// # Errors
    /// [`SharedError`] when Redis fails or answers something unexpected.
    pub async fn inflight(&self, id: &SessionId) -> Result<Vec<(String, StreamTag)>, SharedError> {
        let _t = self.time("read");
        let k = self.keys(id);
        let all: Vec<(String, u64)> = redis::cmd("HGETALL")
            .arg(&k.inflight)
            .query_async(&mut self.conn.clone())
            .await?;
        Ok(all.into_iter().map(|(r, t)| (r, StreamTag(t))).collect())
    }

    /// The owner's end of `id`: the answers it owes (`evs`), then the end marker with `reason`;
    /// the session's keys expire `retain_secs` later. The head after the marker.
    pub async fn end(
        &self,
        id: &SessionId,
        fence: &Fence,
        expected_head: u64,
        reason: &str,
        evs: &[NewEvent],
        retain_secs: u64,
    ) -> Written<u64> {
        let _t = self.time("write");
        let script = &self.scripts.end;
        let args = (reason, retain_secs.max(1));
        self.write_events(script, id, fence, expected_head, args, evs)
            .await
    }

    /// The appends of one writer turn, each as [`Shared::append`] would write it, and their
    /// outcomes in the same order.
    ///
    /// On a single Redis they go as one transaction (`MULTI`, a script per session, `EXEC`) in one
    /// pipeline: Redis runs them together and, with `appendfsync always`, fsyncs once for the
    /// turn — sent as separate commands, each usually completes in its own event-loop pass and
    /// pays its own fsync. Each script still fences its own session; one refused leaves the others
    /// written. A Redis Cluster cannot run one transaction across slots: there each is its own
    /// script, as with [`Shared::append`].
    pub async fn append_turn(&self, all: &[Append<'_>]) -> Vec<Written<u64>> {
        if self.watched.is_some() && !all.is_empty() {
            return self.append_watched(all).await;
        }
        self.append_scripted(all).await
    }

    /// [`Shared::append_turn`] with the events as arguments of the fenced script (a Cluster, and
    /// a single Redis when a watched turn cannot go ahead).
    async fn append_scripted(&self, all: &[Append<'_>]) -> Vec<Written<u64>> {
        if all.len() == 1 || self.is_cluster() {
            let mut out = Vec::with_capacity(all.len());
            for a in all {
                out.push(
                    self.append(a.id, a.fence, a.expected_head, a.batch, a.evs, a.maxlen)
                        .await,
                );
            }
            return out;
        }
        let _t = self.time("append");
        let script = &self.scripts.append;
        let invs: Vec<_> = all
            .iter()
            .map(|a| {
                let maxlen = a.maxlen.map(|m| m.to_string()).unwrap_or_default();
                let own = (a.batch, maxlen);
                self.invocation(script, a.id, a.fence, a.expected_head, own, a.evs)
            })
            .collect();
        let mut pipe = redis::pipe();
        pipe.atomic().ignore_errors();
        for inv in &invs {
            pipe.invoke_script(inv);
        }
        type Replies = Vec<redis::RedisResult<Vec<String>>>;
        let replies: Replies = match pipe.query_async::<Replies>(&mut self.conn.clone()).await {
            Ok(r) if r.len() == all.len() => r,
            Ok(r) => {
                let why = format!("{} replies to {} appends", r.len(), all.len());
                return all
                    .iter()
                    .map(|_| Err(SharedError::Reply(why.clone())))
                    .collect();
            }
            Err(e) => return all.iter().map(|_| Err(e.clone().into())).collect(),
        };
        let mut out = Vec::with_capacity(all.len());
        for (a, reply) in all.iter().zip(replies) {
            out.push(match reply {
                Ok(r) => with_head(&r),
                // Redis restarted and forgot the script: that script did not run. Once more on
                // its own (`invoke` loads it).
                Err(e)
                    if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) =>
                {
                    self.append(a.id, a.fence, a.expected_head, a.batch, a.evs, a.maxlen)
                        .await
                }
                Err(e) => Err(e.into()),
            });
        }
        out
    }

    /// A turn's appends on a single Redis with the events kept out of Lua (redis-server's Lua
    /// hashes every byte of every script argument: 43 % of its CPU in the benchmark, see
    /// docs/benchmarks.md round 6). Two round trips on the writer's own connection:
    ///
    /// 1. `WATCH` every session's record, stream and in-flight hash, and read the record
    ///    (`HMGET`) and the stream's length: the writer checks the fence itself (owner, epoch,
    ///    live, the head it expects, `lo` when it trims).
    /// 2. `MULTI`, per session its chunks' plain `XADD`s, then [`COMMIT`] (a small script: when
    ///    the stream grew by exactly those chunks, the head and batch token, retention, the
    ///    answered requests out of the in-flight hash, the doorbell), `EXEC`. `MULTI` has no
    ///    rollback: an `XADD` that fails (a stream whose last id is past the head: something
    ///    wrote around the scripts) must not let the head move, and that session's outcome is
    ///    unknown.
    ///
    /// Any write to a watched record in between (a takeover, an end, a rewind) makes `EXEC`
    /// run nothing. Then, and whenever a record does not read as expected or the first round
    /// trip fails (nothing was written either way), the turn goes as scripts
    /// ([`Shared::append_scripted`]), whose fence gives the exact refusal. A lost `EXEC` reply is
    /// an unknown outcome, as a lost script reply.
    async fn append_watched(&self, all: &[Append<'_>]) -> Vec<Written<u64>> {
        let Some(w) = &self.watched else {
            return self.append_scripted(all).await;
        };
        let mut guard = w.conn.lock().await;
        if guard.is_none() {
            let cfg = redis::AsyncConnectionConfig::new()
                .set_response_timeout(Some(RESPONSE_TIMEOUT))
                .set_connection_timeout(Some(RESPONSE_TIMEOUT));
            match w
                .client
                .get_multiplexed_async_connection_with_config(&cfg)
                .await
            {
                Ok(c) => *guard = Some(c),
                Err(_) => {
                    drop(guard);
                    return self.append_scripted(all).await;
                }
            }
        }
        let Some(conn) = guard.as_mut() else {
            drop(guard);
            return self.append_scripted(all).await;
        };
        let _t = self.time("append");
        let keys: Vec<Keys> = all.iter().map(|a| self.keys(a.id)).collect();
        // Round trip one. Every key the transaction writes is watched, and read under the watch:
        // the record's fields, the stream's length (which [`COMMIT`] checks grew by the chunks:
        // an `XADD` refused inside the transaction adds nothing), and the types of the stream and
        // the in-flight hash (a wrong one fails this pipeline).
        let mut read = redis::pipe();
        let mut watch = redis::cmd("WATCH");
        for k in &keys {
            watch.arg(&k.record).arg(&k.stream).arg(&k.inflight);
        }
        read.add_command(watch).ignore();
        for k in &keys {
            read.cmd("HMGET")
                .arg(&k.record)
                .arg(&["owner", "epoch", "head", "state", "lo"]);
        }
        for k in &keys {
            read.cmd("HLEN").arg(&k.inflight).ignore();
            read.cmd("XLEN").arg(&k.stream);
        }
        let seen: Vec<Value> = match read.query_async(conn).await {
            Ok(r) => r,
            Err(_) => {
                // Nothing was written: the scripts (on the reconnecting connection) take it.
                *guard = None;
                drop(guard);
                return self.append_scripted(all).await;
            }
        };
        let mut lens = Vec::with_capacity(all.len());
        let mut fits = seen.len() == 2 * all.len();
        if fits {
            let (fields, len) = seen.split_at(all.len());
            for ((a, f), l) in all.iter().zip(fields).zip(len) {
                match l {
                    Value::Int(l) if watched_fits(a, f) => lens.push(*l),
                    _ => fits = false,
                }
            }
        }
        if !fits {
            if redis::cmd("UNWATCH").query_async::<()>(conn).await.is_err() {
                *guard = None;
            }
            drop(guard);
            return self.append_scripted(all).await;
        }
        let mut tx = redis::pipe();
        tx.atomic().ignore_errors();
        // Per session: its replies in the transaction (its `XADD`s, then `commit`'s).
        let mut spans = Vec::with_capacity(all.len());
        for ((a, k), len) in all.iter().zip(&keys).zip(&lens) {
            let mut seq = a.expected_head + 1;
            let chunks = chunks(a.evs);
            let n_chunks = chunks.len();
            for (n, blob) in chunks {
                tx.cmd("XADD")
                    .arg(&k.stream)
                    .arg(format!("{seq}-0"))
                    .arg("e")
                    .arg(a.fence.epoch)
                    .arg("n")
                    .arg(n)
                    .arg("b")
                    .arg(blob);
                seq += n as u64;
            }
            let head = a.expected_head + a.evs.len() as u64;
            let commit = tx
                .cmd("EVAL")
                .arg(COMMIT)
                .arg(4)
                .arg(&k.record)
                .arg(&k.stream)
                .arg(&k.inflight)
                .arg(&k.doorbell)
                .arg(*len + n_chunks as i64)
                .arg(head)
                .arg(a.batch)
                .arg(a.maxlen.map(|m| m.to_string()).unwrap_or_default())
                .arg(CHUNK_EVENTS)
                .arg(a.fence.epoch);
            for ev in a.evs {
                if let Some(request) = &ev.completes {
                    commit.arg(request.as_str());
                }
            }
            spans.push(n_chunks + 1);
        }
        let done: Option<Vec<Value>> = match tx.query_async(conn).await {
            Ok(r) => r,
            Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::ExecAbort) => {
                // Refused while queued (out of memory, say): the transaction ran nothing.
                drop(guard);
                return self.append_scripted(all).await;
            }
            Err(e) => {
                *guard = None;
                return all.iter().map(|_| Err(e.clone().into())).collect();
            }
        };
        drop(guard);
        let Some(replies) = done else {
            // A watched record changed: nothing ran. The scripts fence each session.
            return self.append_scripted(all).await;
        };
        if replies.len() != spans.iter().sum::<usize>() {
            let why = format!("watched append: {} replies", replies.len());
            return all
                .iter()
                .map(|_| Err(SharedError::Reply(why.clone())))
                .collect();
        }
        let mut out = Vec::with_capacity(all.len());
        let mut at = 0;
        for (a, span) in all.iter().zip(spans) {
            let mine = &replies[at..at + span];
            at += span;
            let committed = matches!(
                mine.last(),
                Some(Value::Array(r)) if matches!(r.first(), Some(Value::BulkString(ok)) if ok == b"OK")
            );
            out.push(if committed {
                Ok(Ok(a.expected_head + a.evs.len() as u64))
            } else {
                // An `XADD` failed inside the transaction (the stream's last id is past the head:
                // something wrote around the scripts): the head did not move, and the session
                // ends as for any unknown outcome (the writer logs it).
                Err(SharedError::Reply(format!("watched append: {mine:?}")))
            });
        }
        out
    }

    /// `append` and `end`: the same keys and fence, two arguments of their own, then the events.
    async fn write_events(
        &self,
        script: &Script,
        id: &SessionId,
        fence: &Fence,
        expected_head: u64,
        own: impl redis::ToRedisArgs,
        evs: &[NewEvent],
    ) -> Written<u64> {
        let inv = self.invocation(script, id, fence, expected_head, own, evs);
        let r: Vec<String> = inv.invoke_async(&mut self.conn.clone()).await?;
        with_head(&r)
    }

    /// The invocation of `append` or `end` (see [`Shared::write_events`]).
    fn invocation<'a>(
        &self,
        script: &'a Script,
        id: &SessionId,
        fence: &Fence,
        expected_head: u64,
        own: impl redis::ToRedisArgs,
        evs: &[NewEvent],
    ) -> redis::ScriptInvocation<'a> {
        let k = self.keys(id);
        let chunks = chunks(evs);
        let mut inv = script.prepare_invoke();
        inv.key(&k.record)
            .key(&k.stream)
            .key(&k.inflight)
            .key(&k.doorbell)
            .arg(&fence.owner)
            .arg(fence.epoch)
            .arg(expected_head)
            .arg(own)
            .arg(CHUNK_EVENTS)
            .arg(chunks.len());
        for (n, blob) in &chunks {
            inv.arg(*n).arg(blob.as_slice());
        }
        for ev in evs {
            if let Some(request) = &ev.completes {
                inv.arg(request.as_str());
            }
        }
        inv
    }

    /// Takes `id` over from `dead` (its owner and epoch, as last read) for `taker`: the session
    /// ends in epoch + 1, every request in flight answered -32091 with `data.reason = reason`.
    pub async fn takeover(
        &self,
        id: &SessionId,
        dead: &Fence,
        taker: &str,
        reason: &str,
        message: &str,
        retain_secs: u64,
    ) -> Written<Takeover> {
        let _t = self.time("write");
        let k = self.keys(id);
        let r: Vec<String> = self
            .scripts
            .takeover
            .key(&k.record)
            .key(&k.stream)
            .key(&k.inflight)
            .key(&k.aborted)
            .key(&k.doorbell)
            .arg(&dead.owner)
            .arg(dead.epoch)
            .arg(taker)
            .arg(reason)
            .arg(message)
            .arg(retain_secs.max(1))
            .arg(crate::jsonrpc::INFLIGHT_ABORTED)
            .invoke_async(&mut self.conn.clone())
            .await?;
        let fields = match answer(&r)? {
            Ok(f) => f,
            Err(refused) => return Ok(Err(refused)),
        };
        let num = |i: usize| -> Result<u64, SharedError> {
            fields
                .get(i)
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| SharedError::Reply(format!("{r:?}")))
        };
        Ok(Ok(Takeover {
            epoch: num(0)? as u32,
            head: num(1)?,
            aborted: num(2)? as usize,
        }))
    }

    /// Where the record of `id` is gone but its owner still holds the session (Redis lost it):
    /// writes a new, ended record whose one epoch (`lost_epoch` + 1, after `head`) answers each
    /// request in `inflight` -32091 and holds the end marker. `Ok(false)` when a record exists.
    #[allow(clippy::too_many_arguments)]
    pub async fn recreate_lost(
        &self,
        id: &SessionId,
        owner: &str,
        lost_epoch: u32,
        head: u64,
        inflight: &[(String, StreamTag)],
        reason: &str,
        message: &str,
        retain_secs: u64,
    ) -> Result<bool, SharedError> {
        let _t = self.time("write");
        let k = self.keys(id);
        let mut inv = self.scripts.recreate_lost.prepare_invoke();
        inv.key(&k.record)
            .key(&k.stream)
            .key(&k.doorbell)
            .arg(owner)
            .arg(lost_epoch)
            .arg(head)
            .arg(reason)
            .arg(message)
            .arg(crate::jsonrpc::INFLIGHT_ABORTED)
            .arg(retain_secs.max(1));
        for (req, tag) in inflight {
            inv.arg(req).arg(tag.0);
        }
        let r: Vec<String> = inv.invoke_async(&mut self.conn.clone()).await?;
        match r.first().map(String::as_str) {
            Some("OK") => Ok(true),
            Some("EXISTS") => Ok(false),
            _ => Err(SharedError::Reply(format!("{r:?}"))),
        }
    }

    fn nodes(&self) -> (String, String) {
        let k = format!("{}:{{nodes}}", self.prefix);
        (k.clone(), format!("{k}:addr"))
    }

    /// Renews the lease of `node` (`<replica>/<incarnation>`) to Redis's now + `lease_ms`, with
    /// its internal `addr`; `register` for its first beat. `Ok(None)` when it was reaped (its
    /// sessions taken over): it must close its upstreams and come back as a new incarnation.
    /// Otherwise the lease's end, in Redis ms.
    pub async fn heartbeat(
        &self,
        node: &str,
        lease_ms: u64,
        addr: &str,
        register: bool,
    ) -> Result<Option<u64>, SharedError> {
        let _t = self.time("lease");
        let (zset, addrs) = self.nodes();
        let r: Vec<String> = self
            .scripts
            .heartbeat
            .key(&zset)
            .key(&addrs)
            .arg(node)
            .arg(lease_ms)
            .arg(addr)
            .arg(if register { "1" } else { "0" })
            .invoke_async(&mut self.conn.clone())
            .await?;
        match (r.first().map(String::as_str), r.get(1)) {
            (Some("REAPED"), _) => Ok(None),
            (Some("OK"), Some(t)) => t
                .parse()
                .map(Some)
                .map_err(|_| SharedError::Reply(format!("{r:?}"))),
            _ => Err(SharedError::Reply(format!("{r:?}"))),
        }
    }

    /// The nodes whose lease has lapsed on Redis's clock.
    pub async fn lapsed(&self) -> Result<Vec<String>, SharedError> {
        let _t = self.time("lease");
        let (zset, _) = self.nodes();
        Ok(self
            .scripts
            .lapsed
            .key(&zset)
            .invoke_async(&mut self.conn.clone())
            .await?)
    }

    /// Claims a node whose lease has lapsed, for the caller to take its sessions over: `true`
    /// for the one claimer that removed it, `false` when it is alive again or claimed already.
    pub async fn claim(&self, node: &str) -> Result<bool, SharedError> {
        let _t = self.time("lease");
        let (zset, addrs) = self.nodes();
        let r: Vec<String> = self
            .scripts
            .claim
            .key(&zset)
            .key(&addrs)
            .arg(node)
            .invoke_async(&mut self.conn.clone())
            .await?;
        match r.first().map(String::as_str) {
            Some("OK") => Ok(true),
            Some("ALIVE") | Some("GONE") => Ok(false),
            _ => Err(SharedError::Reply(format!("{r:?}"))),
        }
    }

    /// The internal address `node` last announced.
    pub async fn node_addr(&self, node: &str) -> Result<Option<String>, SharedError> {
        let _t = self.time("read");
        let (_, addrs) = self.nodes();
        Ok(redis::cmd("HGET")
            .arg(addrs)
            .arg(node)
            .query_async(&mut self.conn.clone())
            .await?)
    }

    fn owned_key(&self, node: &str) -> String {
        format!("{}:{{{node}}}:owned", self.prefix)
    }

    /// Notes that `node` owns `id` — before the record is created, so the set is a superset and
    /// a reaper finds every session a dead node may have left.
    pub async fn own(&self, node: &str, id: &SessionId) -> Result<(), SharedError> {
        let _t = self.time("write");
        let _: i64 = redis::cmd("SADD")
            .arg(self.owned_key(node))
            .arg(id.to_string())
            .query_async(&mut self.conn.clone())
            .await?;
        Ok(())
    }

    /// The sessions `node` noted as its own.
    pub async fn owned(&self, node: &str) -> Result<Vec<SessionId>, SharedError> {
        let _t = self.time("read");
        let ids: Vec<String> = redis::cmd("SMEMBERS")
            .arg(self.owned_key(node))
            .query_async(&mut self.conn.clone())
            .await?;
        Ok(ids.iter().filter_map(|i| SessionId::parse(i)).collect())
    }

    /// Whether `node` holds a lease entry (lapsed or not): `false` once it was reaped.
    ///
    /// # Errors
    /// [`SharedError`] when Redis fails.
    pub async fn listed(&self, node: &str) -> Result<bool, SharedError> {
        let _t = self.time("lease");
        let (zset, _) = self.nodes();
        let score: Option<f64> = redis::cmd("ZSCORE")
            .arg(zset)
            .arg(node)
            .query_async(&mut self.conn.clone())
            .await?;
        Ok(score.is_some())
    }

    /// Takes one session out of `node`'s owned set (after its takeover).
    ///
    /// # Errors
    /// [`SharedError`] when Redis fails.
    pub async fn disown(&self, node: &str, id: &SessionId) -> Result<(), SharedError> {
        let _t = self.time("write");
        let _: i64 = redis::cmd("SREM")
            .arg(self.owned_key(node))
            .arg(id.to_string())
            .query_async(&mut self.conn.clone())
            .await?;
        Ok(())
    }

    /// Forgets `node`'s set (after every session in it was taken over).
    pub async fn disown_all(&self, node: &str) -> Result<(), SharedError> {
        let _t = self.time("write");
        let _: i64 = redis::cmd("DEL")
            .arg(self.owned_key(node))
            .query_async(&mut self.conn.clone())
            .await?;
        Ok(())
    }

    /// The record of `id` and up to `max` of its events after seq `after` (up to the head), from
    /// one snapshot; `None` when there is no record.
    pub async fn read(
        &self,
        id: &SessionId,
        after: u64,
        max: usize,
    ) -> Result<Option<(Record, Vec<Event>)>, SharedError> {
        self.read_within(id, after, max, u64::MAX, &ReadHint::default())
            .await
    }

    /// [`Shared::read`], reading no more stream entries once their values reach `max_bytes`, and
    /// returning no more events once their payloads do (at least one entry and one event, which
    /// may be one large event). A reply holds about `max_bytes` plus one chunk, not `max`
    /// events of any size; fewer events than `max` are then no sign of the head. `hint` is the
    /// session's own ([`ReadHint`]): a first read asks for one entry past the cursor's, then
    /// pages sized from what it has seen. Only a read whose entries grew since the session's
    /// last read takes more: its first page holds at most 16 entries.
    pub async fn read_within(
        &self,
        id: &SessionId,
        after: u64,
        max: usize,
        max_bytes: u64,
        hint: &ReadHint,
    ) -> Result<Option<(Record, Vec<Event>)>, SharedError> {
        let _t = self.time("read");
        let max_bytes = max_bytes.max(1);
        let k = self.keys(id);
        let plain = if self.is_cluster() {
            None
        } else {
            self.read_plain(&k, after, max, max_bytes, hint).await?
        };
        let v: Value = match plain {
            Some(v) => v,
            None => self.read_scripted(&k, after, max, max_bytes).await?,
        };
        let Some((rec, mut evs)) = parse_read(v)? else {
            return Ok(None);
        };
        // The entries may start before `after` and hold more than `max` (whole chunks).
        let head = rec.ranges.head;
        evs.retain(|e| e.seq > after && e.seq <= head);
        // Consecutive seqs only: a stream that entries written around the proxy made overlap or
        // hole (the script reads whatever lies between the cursor and the head) is cut where it
        // stops being consecutive; the reader that reads on from there finds an event that is not
        // the one after its cursor, and ends its stream on the gap (never a silent one).
        let run = evs
            .iter()
            .zip(evs.first().map_or(0, |e| e.seq)..)
            .take_while(|(e, want)| e.seq == *want)
            .count();
        let within = within_budget(evs.iter().map(|e| e.payload.len() as u64), max_bytes);
        evs.truncate(run.min(max.max(1)).min(within.max(1)));
        Ok(Some((rec, evs)))
    }

    /// `read` without Lua on a single Redis (redis-server's Lua hashes every byte a script
    /// handles, the chunks it reads included): one `MULTI` with the record's fields, the entry at
    /// or before `after + 1` (the chunk that holds it, which may start before it) and the entries
    /// after that one, as many as `max` events are likely to need (from the events per entry of
    /// the last read; at most 16); further pages up to `max` events and the head. Only what holds
    /// `after + 1` on without a hole up to the head is kept (see [`contiguous`]): nothing past the
    /// head is parsed. The reply has the script's shape. `None` when the
    /// script must read it: a record of the earlier form (no `lo`), or entries that do not start
    /// at `after + 1` (a stream trimmed under the cursor: the script decides).
    async fn read_plain(
        &self,
        k: &Keys,
        after: u64,
        max: usize,
        max_bytes: u64,
        hint: &ReadHint,
    ) -> Result<Option<Value>, SharedError> {
        let mut tx = redis::pipe();
        tx.atomic();
        tx.cmd("HMGET").arg(&k.record).arg(&[
            "owner",
            "epoch",
            "head",
            "state",
            "ep",
            "meta",
            "end_reason",
            "lo",
        ]);
        let ranged = after < u64::MAX;
        let at = format!("{}-0", after.saturating_add(1));
        let by_bytes = match hint.largest_entry.load(Ordering::Relaxed) {
            _ if max_bytes == u64::MAX => u64::MAX,
            0 => 1,
            largest => max_bytes.div_ceil(largest as u64),
        };
        let count = max
            .div_ceil(hint.per_entry.load(Ordering::Relaxed).max(1))
            .min(usize::try_from(by_bytes).unwrap_or(usize::MAX))
            .clamp(1, 16);
        if ranged {
            tx.cmd("XREVRANGE")
                .arg(&k.stream)
                .arg(&at)
                .arg("-")
                .arg("COUNT")
                .arg(1);
            tx.cmd("XRANGE")
                .arg(&k.stream)
                .arg(format!("({at}"))
                .arg("+")
                .arg("COUNT")
                .arg(count);
        }
        let mut replies: Vec<Value> = tx.query_async(&mut self.conn.clone()).await?;
        let bad = |what: &str| SharedError::Reply(format!("read: {what}"));
        if replies.len() != if ranged { 3 } else { 1 } {
            return Err(bad("wrong number of replies"));
        }
        let (mut entries, full) = if ranged {
            let Some(Value::Array(rest)) = replies.pop() else {
                return Err(bad("a range is not an array"));
            };
            let Some(Value::Array(mut entries)) = replies.pop() else {
                return Err(bad("a range is not an array"));
            };
            let full = rest.len() == count;
            entries.extend(rest);
            (entries, full)
        } else {
            (Vec::new(), false)
        };
        let Some(Value::Array(fields)) = replies.pop() else {
            return Err(bad("the record's fields are not an array"));
        };
        if fields.len() != 8 {
            return Err(bad("wrong number of fields"));
        }
        if matches!(fields[0], Value::Nil) {
            return Ok(Some(Value::Array(Vec::new())));
        }
        if matches!(fields[7], Value::Nil) {
            return Ok(None);
        }
        let head: u64 = match &fields[2] {
            Value::BulkString(h) => std::str::from_utf8(h)
                .ok()
                .and_then(|h| h.parse().ok())
                .ok_or_else(|| bad("head")),
            _ => Err(bad("head")),
        }?;
        if !ranged || after >= head {
            // Nothing after the cursor up to the head: whatever the stream holds past the head
            // (a write in flight, a stray entry) is not read, not even parsed.
            entries.clear();
        } else {
            // One snapshot, but what is kept must hold `after + 1` (the entry before it is the
            // chunk that holds it only when it reaches it) and go on without a hole up to the
            // head: a stray entry, or one past the head, is never read past or parsed.
            let (skip, kept, mut next) = contiguous(&entries, after + 1, head);
            if kept == 0 {
                return Ok(None);
            }
            let mut more = full && skip + kept == entries.len();
            entries.truncate(skip + kept);
            entries.drain(..skip);
            // No more entries than hold `max_bytes` (the last one reaches it).
            let within = within_budget(entries.iter().map(entry_bytes), max_bytes);
            let taken = entries[..within].iter().map(entry_bytes);
            let (mut bytes, mut largest) =
                taken.fold((0, 0), |(sum, top), b| (sum + b, b.max(top)));
            if within < entries.len() {
                entries.truncate(within);
                next = entries
                    .last()
                    .and_then(entry_span)
                    .map_or(next, |(f, n)| f + n);
                more = false;
            }
            let per = ((next - (after + 1)) as usize)
                .div_ceil(entries.len())
                .max(1);
            hint.per_entry.store(per, Ordering::Relaxed);

            // Up to `max` events and `max_bytes`, as the script pages: further pages (up to the
            // head) while the last was full, each kept only as far as it goes on without a hole.
            while more && next <= head && bytes < max_bytes {
                let got = next - (after + 1);
                if got >= max as u64 {
                    break;
                }
                let by_bytes = (max_bytes - bytes).div_ceil(largest.max(1));
                let want = (max - got as usize)
                    .div_ceil(per)
                    .min(usize::try_from(by_bytes).unwrap_or(usize::MAX))
                    .clamp(1, 16);
                let page: Vec<Value> = redis::cmd("XRANGE")
                    .arg(&k.stream)
                    .arg(format!("{next}-0"))
                    .arg(format!("{head}-0"))
                    .arg("COUNT")
                    .arg(want)
                    .query_async(&mut self.conn.clone())
                    .await?;
                let (skip, kept, to) = contiguous(&page, next, head);
                more = page.len() == want && skip == 0 && kept == page.len();
                if skip > 0 {
                    break;
                }
                for e in page.into_iter().take(kept) {
                    if bytes >= max_bytes {
                        more = false;
                        break;
                    }
                    let b = entry_bytes(&e);
                    bytes += b;
                    largest = largest.max(b);
                    next = entry_span(&e).map_or(to, |(f, n)| f + n);
                    entries.push(e);
                }
            }
            let largest = usize::try_from(largest).unwrap_or(usize::MAX);
            hint.largest_entry.store(largest.max(1), Ordering::Relaxed);
        }
        let mut items: Vec<Value> = fields
            .into_iter()
            .map(|f| match f {
                Value::Nil => Value::BulkString(Vec::new()),
                other => other,
            })
            .collect();
        items.push(Value::Array(entries));
        Ok(Some(Value::Array(items)))
    }

    /// `read` as the script (a Cluster, a record of the earlier form).
    async fn read_scripted(
        &self,
        k: &Keys,
        after: u64,
        max: usize,
        max_bytes: u64,
    ) -> Result<Value, SharedError> {
        Ok(self
            .scripts
            .read
            .key(&k.record)
            .key(&k.stream)
            .arg(after)
            .arg(max.max(1))
            .arg(max_bytes)
            .invoke_async(&mut self.conn.clone())
            .await?)
    }
}

/// A stream entry's id, `<first seq>-0`.
fn entry_id(e: Option<&Value>) -> Option<String> {
    match e? {
        Value::Array(parts) => match parts.first()? {
            Value::BulkString(id) => String::from_utf8(id.clone()).ok(),
            _ => None,
        },
        _ => None,
    }
}

/// How many of the items whose sizes are `sizes` (in order) a read within `max_bytes` takes: each
/// while what it took before stays under the budget (so the last one reaches it).
fn within_budget(sizes: impl Iterator<Item = u64>, max_bytes: u64) -> usize {
    let mut taken = 0u64;
    sizes
        .take_while(|&b| {
            let take = taken < max_bytes;
            taken += b;
            take
        })
        .count()
}

/// The bytes of a stream entry's values (its chunk, and its count and tags).
fn entry_bytes(e: &Value) -> u64 {
    match e {
        Value::Array(parts) => match parts.get(1) {
            Some(Value::Array(f)) => f
                .iter()
                .skip(1)
                .step_by(2)
                .map(|v| match v {
                    Value::BulkString(b) => b.len() as u64,
                    _ => 0,
                })
                .sum(),
            _ => 0,
        },
        _ => 0,
    }
}

/// The first seq a stream entry holds, and how many events (`n`; 1 for an entry of the earlier
/// per-event form).
fn entry_span(e: &Value) -> Option<(u64, u64)> {
    let Value::Array(parts) = e else { return None };
    let id = entry_id(Some(e))?;
    let first = match id.split_once('-')? {
        (seq, "0") => seq.parse().ok()?,
        _ => return None,
    };
    let n = match parts.get(1) {
        Some(Value::Array(f)) => f
            .chunks(2)
            .find(|kv| matches!(&kv[0], Value::BulkString(k) if k == b"n"))
            .and_then(|kv| match kv.get(1) {
                Some(Value::BulkString(v)) => std::str::from_utf8(v).ok()?.parse().ok(),
                _ => None,
            })
            .unwrap_or(1),
        _ => return None,
    };
    Some((first, n))
}

/// Of `entries` (stream order), how many lead in ending before `from` (at most one, the entry
/// before the chunk that holds `from`: it is skipped), then how many follow that hold `from` on
/// without a hole, each starting at or before `head`, and the seq after the last of those.
/// Entries of any other form end the run (a stray id, a missing or absurd count).
fn contiguous(entries: &[Value], from: u64, head: u64) -> (usize, usize, u64) {
    let mut skip = 0;
    let mut next = from;
    let mut kept = 0;
    for e in entries {
        let Some((first, n)) = entry_span(e) else {
            break;
        };
        let Some(end) = first.checked_add(n).filter(|_| n > 0) else {
            break;
        };
        if kept == 0 && skip == 0 && end <= from {
            skip = 1;
            continue;
        }
        let starts_right = first == next || (kept == 0 && first < next);
        if !starts_right || end <= next || first > head {
            break;
        }
        next = end;
        kept += 1;
    }
    (skip, kept, next)
}

/// Whether a watched turn may write `a` (see [`Shared::append_watched`]): the record as the
/// `append` script's fence wants it. Not when it has no `lo` and `a` trims (a record of the
/// earlier form: the script floors it).
fn watched_fits(a: &Append<'_>, fields: &Value) -> bool {
    let Value::Array(f) = fields else {
        return false;
    };
    let field = |i: usize| match f.get(i) {
        Some(Value::BulkString(b)) => std::str::from_utf8(b).ok(),
        _ => None,
    };
    field(0) == Some(a.fence.owner.as_str())
        && field(1) == Some(a.fence.epoch.to_string().as_str())
        && field(2) == Some(a.expected_head.to_string().as_str())
        && field(3) == Some("live")
        && (a.maxlen.is_none() || field(4).is_some_and(|v| v.parse::<u64>().is_ok()))
}

/// `evs` as chunks (events, bytes): each at most [`CHUNK_EVENTS`] events and [`CHUNK_BYTES`] of
/// payload (or one larger event), every event `<tag> <kind> <length>\n<payload>`.
fn chunks(evs: &[NewEvent]) -> Vec<(usize, Vec<u8>)> {
    use std::io::Write as _;
    let mut out: Vec<(usize, Vec<u8>)> = Vec::new();
    let mut rest = evs;
    while !rest.is_empty() {
        let (mut n, mut bytes) = (0, 0);
        for ev in rest.iter().take(CHUNK_EVENTS) {
            if n > 0 && bytes + ev.payload.len() > CHUNK_BYTES {
                break;
            }
            n += 1;
            bytes += ev.payload.len();
        }
        let mut blob = Vec::with_capacity(bytes + n * 16);
        for ev in &rest[..n] {
            let _ = writeln!(
                blob,
                "{} {} {}",
                ev.stream.0,
                ev.kind as u8,
                ev.payload.len()
            );
            blob.extend_from_slice(&ev.payload);
        }
        out.push((n, blob));
        rest = &rest[n..];
    }
    out
}

/// The events of a chunk entry that starts at `first`, in `epoch`.
fn parse_chunk(first: u64, epoch: u32, n: usize, blob: Bytes) -> Option<Vec<Event>> {
    let mut events = Vec::with_capacity(n);
    let mut at = 0;
    while at < blob.len() {
        let (tag, next) = decimal(&blob, at, b' ')?;
        let (kind, next) = decimal(&blob, next, b' ')?;
        let kind = Kind::from_u8(u8::try_from(kind).ok()?)?;
        let (len, start) = decimal(&blob, next, b'\n')?;
        let len = usize::try_from(len).ok()?;
        let end = start.checked_add(len).filter(|&e| e <= blob.len())?;
        events.push(Event {
            seq: first + events.len() as u64,
            epoch,
            stream: StreamTag(tag),
            kind,
            payload: blob.slice(start..end),
        });
        at = end;
    }
    (events.len() == n && n > 0).then_some(events)
}

/// The decimal number at `b[at..]` up to `stop` (at least one digit, nothing else), and where
/// what follows `stop` starts.
fn decimal(b: &[u8], at: usize, stop: u8) -> Option<(u64, usize)> {
    let mut v: u64 = 0;
    let mut i = at;
    while let Some(&c) = b.get(i) {
        if c == stop && i > at {
            return Some((v, i + 1));
        }
        if !c.is_ascii_digit() {
            return None;
        }
        v = v.checked_mul(10)?.checked_add(u64::from(c - b'0'))?;
        i += 1;
    }
    None
}

/// A script's answer: `OK` and its fields, or the refusal.
fn answer(r: &[String]) -> Result<Result<&[String], Refused>, SharedError> {
    let bad = || SharedError::Reply(format!("{r:?}"));
    let num = |i: usize| -> Result<u64, SharedError> {
        r.get(i).and_then(|v| v.parse().ok()).ok_or_else(bad)
    };
    Ok(match r.first().map(String::as_str) {
        Some("OK") => Ok(&r[1..]),
        Some("NOSESSION") => Err(Refused::NoSession),
        Some("FENCED") => Err(Refused::Fenced {
            epoch: num(1)? as u32,
            head: num(2)?,
        }),
        Some("ENDED") => Err(Refused::Ended {
            epoch: num(1)? as u32,
            head: num(2)?,
        }),
        Some("HEAD") => Err(Refused::Head {
            head: num(1)?,
            batch: r.get(2).cloned().unwrap_or_default(),
        }),
        _ => return Err(bad()),
    })
}

/// The `redis://` URLs of the primaries a `CLUSTER NODES` answer lists, with the scheme and
/// credentials of `url` (the node it was asked of).
fn cluster_primaries(url: &str, nodes: &str) -> Vec<String> {
    let (scheme, rest) = url.split_once("://").unwrap_or(("redis", url));
    let auth = rest
        .split_once('@')
        .map(|(a, _)| format!("{a}@"))
        .unwrap_or_default();
    nodes
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let flags = f.get(2)?;
            if !flags.split(',').any(|x| x == "master") || flags.contains("fail") {
                return None;
            }
            // `ip:port@cport[,hostname]`
            let addr = f.get(1)?.split('@').next()?;
            Some(format!("{scheme}://{auth}{addr}"))
        })
        .collect()
}

/// `url` without its user and password (for messages).
fn without_credentials(url: &str) -> String {
    match url.split_once("://") {
        Some((scheme, rest)) => match rest.rsplit_once('@') {
            Some((_, host)) => format!("{scheme}://{host}"),
            None => url.to_string(),
        },
        None => url.to_string(),
    }
}

/// An answer whose `OK` carries the new head.
fn with_head(r: &[String]) -> Written<u64> {
    Ok(match answer(r)? {
        Ok(f) => Ok(f
            .first()
            .and_then(|h| h.parse().ok())
            .ok_or_else(|| SharedError::Reply(format!("{r:?}")))?),
        Err(refused) => Err(refused),
    })
}

/// Reads `read`'s answer.
fn parse_read(v: Value) -> Result<Option<(Record, Vec<Event>)>, SharedError> {
    let bad = |what: &str| SharedError::Reply(format!("read: {what}"));
    let Value::Array(items) = v else {
        return Err(bad("not an array"));
    };
    if items.is_empty() {
        return Ok(None);
    }
    if items.len() != 9 {
        return Err(bad("wrong length"));
    }
    let text = |i: usize| -> Result<String, SharedError> {
        match &items[i] {
            Value::BulkString(b) => String::from_utf8(b.clone()).map_err(|_| bad("not UTF-8")),
            Value::SimpleString(s) => Ok(s.clone()),
            Value::Int(n) => Ok(n.to_string()),
            _ => Err(bad("not a string")),
        }
    };
    let owner = text(0)?;
    let epoch: u32 = text(1)?.parse().map_err(|_| bad("epoch"))?;
    let head: u64 = text(2)?.parse().map_err(|_| bad("head"))?;
    let state = text(3)?;
    let epochs: Vec<EpochRange> =
        serde_json::from_str(&text(4)?).map_err(|_| bad("epoch table"))?;
    let meta = text(5)?;
    let end_reason = text(6)?;
    let oldest = match text(7)?.as_str() {
        "" => head + 1,
        seq => seq.parse().map_err(|_| bad("oldest"))?,
    };
    let Value::Array(entries) = items.into_iter().nth(8).expect("length checked") else {
        return Err(bad("entries"));
    };
    let mut events = Vec::with_capacity(entries.len());
    for e in entries {
        events.extend(parse_entry(e).ok_or_else(|| bad("entry"))?);
    }
    let record = Record {
        fence: Fence { owner, epoch },
        ranges: LogRanges {
            epochs,
            oldest,
            head,
        },
        ended: (state == "ended").then_some(end_reason),
        meta,
    };
    Ok(Some((record, events)))
}

/// The seq of a stream entry id `<seq>-0`.
fn entry_seq(id: &str) -> Option<u64> {
    id.strip_suffix("-0")?.parse().ok()
}

/// One stream entry, `[id, [field, value, ...]]`: a chunk, or one event of the earlier form.
fn parse_entry(e: Value) -> Option<Vec<Event>> {
    let Value::Array(pair) = e else { return None };
    let [Value::BulkString(id), Value::Array(fields)] = <[Value; 2]>::try_from(pair).ok()? else {
        return None;
    };
    let seq = entry_seq(std::str::from_utf8(&id).ok()?)?;
    let (mut epoch, mut n, mut blob) = (None, None, None);
    let (mut tag, mut kind, mut data) = (None, None, None);
    let mut fields = fields.into_iter();
    while let (Some(Value::BulkString(k)), Some(Value::BulkString(v))) =
        (fields.next(), fields.next())
    {
        let num = || std::str::from_utf8(&v).ok()?.parse::<u64>().ok();
        match k.as_slice() {
            b"e" => epoch = Some(u32::try_from(num()?).ok()?),
            b"n" => n = Some(usize::try_from(num()?).ok()?),
            b"t" => tag = Some(StreamTag(num()?)),
            b"k" => kind = Kind::from_u8(u8::try_from(num()?).ok()?),
            b"b" => blob = Some(Bytes::from(v)),
            b"d" => data = Some(Bytes::from(v)),
            _ => {}
        }
    }
    let epoch = epoch?;
    if let Some(blob) = blob {
        return parse_chunk(seq, epoch, n?, blob);
    }
    Some(vec![Event {
        seq,
        epoch,
        stream: tag?,
        kind: kind?,
        payload: data?,
    }])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(tag: u64, kind: Kind, payload: &[u8]) -> NewEvent {
        NewEvent::new(StreamTag(tag), kind, Bytes::copy_from_slice(payload))
    }

    #[test]
    fn chunks_parse_back_exactly() {
        let evs = vec![
            ev(0, Kind::Priming, b""),
            ev(7, Kind::Message, b"{\"a\":1}\n\n9 9 9\n"),
            ev(u64::MAX, Kind::Final, b"x"),
            ev(3, Kind::End, &[0xff, b'\n', b' ', 0]),
        ];
        let cs = chunks(&evs);
        assert_eq!(cs.len(), 1);
        let (n, blob) = cs.into_iter().next().unwrap();
        let got = parse_chunk(41, 2, n, Bytes::from(blob)).expect("parses");
        let got: Vec<_> = got
            .iter()
            .map(|e| (e.seq, e.epoch, e.stream.0, e.kind as u8, e.payload.to_vec()))
            .collect();
        let want: Vec<_> = evs
            .iter()
            .enumerate()
            .map(|(i, e)| {
                (
                    41 + i as u64,
                    2,
                    e.stream.0,
                    e.kind as u8,
                    e.payload.to_vec(),
                )
            })
            .collect();
        assert_eq!(got, want);
    }

    #[test]
    fn a_malformed_chunk_is_refused_whole() {
        for blob in [
            &b""[..],
            b"1 0 1\n",
            b"1 0 2\nx",
            b"1 0\nx",
            b"1 0 1 1\nx",
            b"+1 0 1\nx",
            b"1 -0 1\nx",
            b"1  0 1\nx",
            b"1 0 1x\nx",
            b" 1 0 1\nx",
            b"1 4 1\nx",
            b"1 256 1\nx",
            b"18446744073709551616 0 1\nx",
            b"1 0 18446744073709551615\nx",
            b"1 0 1\nx1 0 1\n",
        ] {
            assert!(
                parse_chunk(1, 1, 1, Bytes::from_static(blob)).is_none(),
                "{:?}",
                String::from_utf8_lossy(blob)
            );
        }
        // The count must match too.
        assert!(parse_chunk(1, 1, 2, Bytes::from_static(b"1 0 1\nx")).is_none());
        assert!(parse_chunk(1, 1, 1, Bytes::from_static(b"1 0 1\nx")).is_some());
    }
}
