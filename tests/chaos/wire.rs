//! A deliberately small HTTP/1.1 + SSE client over raw loopback sockets, written independently of
//! the proxy's own SSE code so the oracle does not share its bugs. It can cut a stream at any byte
//! of the body (the "byte budget"), which is how cuts land in the middle of an event.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::{timeout_at, Instant};

/// How long connecting may take.
const CONNECT: Duration = Duration::from_secs(3);

/// One dispatched SSE event.
#[derive(Debug, Clone)]
pub struct SseEvent {
    /// The `id:` field of this event, if it had one.
    pub id: Option<String>,
    /// The `event:` field.
    pub event: Option<String>,
    /// The `data:` lines joined with `\n`.
    pub data: Vec<u8>,
}

/// What opening a stream gave.
pub enum Opened {
    /// 200 and an SSE body.
    Stream(Box<SseConn>),
    /// Another status and its (small) body.
    Status(u16, String),
    /// No HTTP response at all (refused, reset, timed out).
    Failed,
}

/// What reading a stream gave.
pub enum Next {
    /// A complete event.
    Event(SseEvent),
    /// A comment line (keepalive).
    Comment,
    /// The server ended the body or the connection.
    End,
    /// The byte budget ran out: the client cut the connection here. `mid_event` is true when part
    /// of an event had been read.
    Cut {
        /// Part of an event was read and is now lost.
        mid_event: bool,
    },
    /// Nothing before the deadline.
    Timeout,
}

#[derive(Default)]
struct Partial {
    id: Option<String>,
    event: Option<String>,
    data: Option<Vec<u8>>,
    any: bool,
}

/// An open SSE response body.
pub struct SseConn {
    sock: TcpStream,
    raw: Vec<u8>,
    chunked: bool,
    chunk_left: usize,
    need_crlf: bool,
    body_done: bool,
    sock_eof: bool,
    sse: Vec<u8>,
    budget: Option<usize>,
    cur: Partial,
    /// Body bytes handed to the SSE parser so far.
    pub body_bytes: usize,
}

async fn connect(addr: SocketAddr) -> Result<TcpStream, String> {
    match tokio::time::timeout(CONNECT, TcpStream::connect(addr)).await {
        Ok(Ok(s)) => {
            let _ = s.set_nodelay(true);
            Ok(s)
        }
        Ok(Err(e)) => Err(format!("connect: {e}")),
        Err(_) => Err("connect timed out".into()),
    }
}

struct Head {
    status: u16,
    chunked: bool,
    content_length: Option<usize>,
    content_type: Option<String>,
}

/// Reads a response head; returns it and the bytes already read past it.
async fn read_head(sock: &mut TcpStream, deadline: Instant) -> Result<(Head, Vec<u8>), String> {
    let mut buf = Vec::with_capacity(1024);
    let mut tmp = [0u8; 4096];
    let end = loop {
        if let Some(p) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break p;
        }
        if buf.len() > 64 * 1024 {
            return Err("response head too large".into());
        }
        match timeout_at(deadline, sock.read(&mut tmp)).await {
            Err(_) => return Err("no response head in time".into()),
            Ok(Err(e)) => return Err(format!("read head: {e}")),
            Ok(Ok(0)) => return Err("connection closed before a response head".into()),
            Ok(Ok(n)) => buf.extend_from_slice(&tmp[..n]),
        }
    };
    let text = String::from_utf8_lossy(&buf[..end]).into_owned();
    let rest = buf[end + 4..].to_vec();
    let mut lines = text.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let status: u16 = status_line
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("bad status line {status_line:?}"))?;
    let mut head = Head {
        status,
        chunked: false,
        content_length: None,
        content_type: None,
    };
    for l in lines {
        let Some((k, v)) = l.split_once(':') else {
            continue;
        };
        let (k, v) = (k.trim().to_ascii_lowercase(), v.trim().to_ascii_lowercase());
        if k == "transfer-encoding" && v.contains("chunked") {
            head.chunked = true;
        } else if k == "content-length" {
            head.content_length = v.parse().ok();
        } else if k == "content-type" {
            head.content_type = Some(v);
        }
    }
    Ok((head, rest))
}

/// Reads a whole (small) body after a head.
async fn read_body(sock: &mut TcpStream, head: &Head, got: Vec<u8>, deadline: Instant) -> String {
    read_body_checked(sock, head, got, deadline).await.0
}

/// Reads a whole (small) body after a head; also says whether it was complete (its length, or
/// its terminating chunk, reached) rather than cut short by the connection or the deadline.
async fn read_body_checked(
    sock: &mut TcpStream,
    head: &Head,
    mut got: Vec<u8>,
    deadline: Instant,
) -> (String, bool) {
    let mut tmp = [0u8; 4096];
    let complete = loop {
        if let Some(cl) = head.content_length {
            if got.len() >= cl {
                got.truncate(cl);
                break true;
            }
        }
        if head.chunked && got.ends_with(b"0\r\n\r\n") {
            break true;
        }
        match timeout_at(deadline, sock.read(&mut tmp)).await {
            Ok(Ok(n)) if n > 0 => got.extend_from_slice(&tmp[..n]),
            // EOF delimits a body that has neither a length nor chunks.
            Ok(Ok(_)) => break head.content_length.is_none() && !head.chunked,
            _ => break false,
        }
    };
    if head.chunked {
        got = dechunk(&got);
    }
    (String::from_utf8_lossy(&got).into_owned(), complete)
}

fn dechunk(mut b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(p) = b.windows(2).position(|w| w == b"\r\n") {
        let size = std::str::from_utf8(&b[..p])
            .ok()
            .and_then(|s| usize::from_str_radix(s.split(';').next()?.trim(), 16).ok())
            .unwrap_or(0);
        b = &b[p + 2..];
        if size == 0 || b.len() < size {
            break;
        }
        out.extend_from_slice(&b[..size]);
        b = &b[(size + 2).min(b.len())..];
    }
    out
}

/// `GET path` with an optional `Last-Event-ID`.
pub async fn open_sse(
    addr: SocketAddr,
    path: &str,
    last_event_id: Option<&str>,
    head_timeout: Duration,
) -> Opened {
    let mut sock = match connect(addr).await {
        Ok(s) => s,
        Err(_) => return Opened::Failed,
    };
    let mut req = format!(
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nAccept: text/event-stream\r\nCache-Control: no-cache\r\n"
    );
    if let Some(id) = last_event_id {
        req.push_str(&format!("Last-Event-ID: {id}\r\n"));
    }
    req.push_str("\r\n");
    if sock.write_all(req.as_bytes()).await.is_err() {
        return Opened::Failed;
    }
    let deadline = Instant::now() + head_timeout;
    let (head, rest) = match read_head(&mut sock, deadline).await {
        Ok(x) => x,
        Err(_) => return Opened::Failed,
    };
    if head.status != 200 {
        let body = read_body(&mut sock, &head, rest, Instant::now() + head_timeout).await;
        return Opened::Status(head.status, body);
    }
    Opened::Stream(SseConn::new(sock, rest, head.chunked))
}

/// What a POST gave.
pub enum Posted {
    /// A response: status and body.
    Status(u16, String),
    /// The request was certainly not delivered (no connection).
    NotSent,
    /// It may have been delivered, but no response came.
    Unknown,
}

/// `POST path` with a JSON body, `Connection: close`.
pub async fn post(addr: SocketAddr, path: &str, body: &[u8], wait: Duration) -> Posted {
    let mut sock = match connect(addr).await {
        Ok(s) => s,
        Err(_) => return Posted::NotSent,
    };
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    let mut msg = head.into_bytes();
    msg.extend_from_slice(body);
    if sock.write_all(&msg).await.is_err() {
        return Posted::Unknown;
    }
    let deadline = Instant::now() + wait;
    match read_head(&mut sock, deadline).await {
        Ok((head, rest)) => {
            let body = read_body(&mut sock, &head, rest, deadline).await;
            Posted::Status(head.status, body)
        }
        Err(_) => Posted::Unknown,
    }
}

/// How the client cuts a 2026-07-28 POST.
#[derive(Clone, Copy, Debug)]
pub enum Cut {
    /// It reads the whole answer.
    No,
    /// It drops the connection this long after sending the request, whatever has arrived.
    After(Duration),
    /// It drops the connection after this many body bytes (usually in the middle of the answer).
    AtByte(usize),
}

/// What a 2026-07-28 POST gave.
pub enum Reply {
    /// A JSON (or other non-SSE) body: status and text.
    Json(u16, String),
    /// An SSE body: its events until it ended (properly or with the connection).
    Sse(Vec<SseEvent>),
    /// The client cut it before the answer was complete.
    Cut,
    /// No connection: certainly not delivered.
    NotSent,
    /// Sent, but no complete answer came.
    Unknown,
}

/// `POST /mcp` with a JSON body, `extra` headers and `Connection: close`; reads a JSON or an SSE
/// answer, unless `cut` says otherwise.
pub async fn post_modern(
    addr: SocketAddr,
    extra: &[(&str, String)],
    body: &[u8],
    wait: Duration,
    cut: Cut,
) -> Reply {
    let mut sock = match connect(addr).await {
        Ok(s) => s,
        Err(_) => return Reply::NotSent,
    };
    let mut head = format!(
        "POST /mcp HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nContent-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    for (k, v) in extra {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    let mut msg = head.into_bytes();
    msg.extend_from_slice(body);
    if sock.write_all(&msg).await.is_err() {
        return Reply::Unknown;
    }
    let exchange = async move {
        let deadline = Instant::now() + wait;
        let (head, rest) = match read_head(&mut sock, deadline).await {
            Ok(x) => x,
            Err(_) => return Reply::Unknown,
        };
        let sse = head
            .content_type
            .as_deref()
            .is_some_and(|t| t.starts_with("text/event-stream"));
        if head.status == 200 && sse {
            let mut c = SseConn::new(sock, rest, head.chunked);
            if let Cut::AtByte(b) = cut {
                c.set_budget(b);
            }
            let mut evs = Vec::new();
            loop {
                match c.next(deadline).await {
                    Next::Event(e) => evs.push(e),
                    Next::Comment => {}
                    Next::End => return Reply::Sse(evs),
                    Next::Cut { .. } => return Reply::Cut,
                    Next::Timeout => return Reply::Unknown,
                }
            }
        }
        if let Cut::AtByte(b) = cut {
            if head.content_length.is_none_or(|cl| b < cl) {
                // Dropped with the answer half read.
                return Reply::Cut;
            }
        }
        match read_body_checked(&mut sock, &head, rest, deadline).await {
            (text, true) => Reply::Json(head.status, text),
            (_, false) => Reply::Unknown,
        }
    };
    match cut {
        Cut::After(d) => tokio::time::timeout(d, exchange)
            .await
            .unwrap_or(Reply::Cut),
        _ => exchange.await,
    }
}

/// `GET url` → status (0 when there is no answer).
pub async fn get_status(addr: SocketAddr, path: &str) -> u16 {
    let Ok(mut sock) = connect(addr).await else {
        return 0;
    };
    let req = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    if sock.write_all(req.as_bytes()).await.is_err() {
        return 0;
    }
    match read_head(&mut sock, Instant::now() + Duration::from_secs(3)).await {
        Ok((h, _)) => h.status,
        Err(_) => 0,
    }
}

impl SseConn {
    fn new(sock: TcpStream, rest: Vec<u8>, chunked: bool) -> Box<SseConn> {
        Box::new(SseConn {
            sock,
            raw: rest,
            chunked,
            chunk_left: 0,
            need_crlf: false,
            body_done: false,
            sock_eof: false,
            sse: Vec::new(),
            budget: None,
            cur: Partial::default(),
            body_bytes: 0,
        })
    }

    /// The client will cut the connection after `bytes` more body bytes.
    pub fn set_budget(&mut self, bytes: usize) {
        self.budget = Some(bytes);
    }

    /// Is part of an event buffered (read but not yet dispatched)?
    pub fn mid_event(&self) -> bool {
        self.cur.any || !self.sse.is_empty()
    }

    /// Moves decodable body bytes from `raw` to the SSE buffer, honouring the budget.
    fn decode(&mut self) {
        let mut out = Vec::new();
        if !self.chunked {
            out.append(&mut self.raw);
        } else {
            loop {
                if self.body_done {
                    self.raw.clear();
                    break;
                }
                if self.chunk_left > 0 {
                    let n = self.chunk_left.min(self.raw.len());
                    if n == 0 {
                        break;
                    }
                    out.extend(self.raw.drain(..n));
                    self.chunk_left -= n;
                    if self.chunk_left == 0 {
                        self.need_crlf = true;
                    }
                } else if self.need_crlf {
                    if self.raw.len() < 2 {
                        break;
                    }
                    self.raw.drain(..2);
                    self.need_crlf = false;
                } else {
                    let Some(p) = self.raw.windows(2).position(|w| w == b"\r\n") else {
                        break;
                    };
                    let line = String::from_utf8_lossy(&self.raw[..p]).into_owned();
                    self.raw.drain(..p + 2);
                    let size =
                        usize::from_str_radix(line.split(';').next().unwrap_or("").trim(), 16)
                            .unwrap_or(0);
                    if size == 0 {
                        self.body_done = true;
                    } else {
                        self.chunk_left = size;
                    }
                }
            }
        }
        if let Some(b) = self.budget.as_mut() {
            if out.len() > *b {
                out.truncate(*b);
            }
            *b -= out.len();
        }
        self.body_bytes += out.len();
        self.sse.extend_from_slice(&out);
    }

    /// Parses one line from the SSE buffer; `Some` when it completes something to report.
    fn line(&mut self) -> Option<Option<Next>> {
        let p = self.sse.iter().position(|&b| b == b'\n')?;
        let mut line: Vec<u8> = self.sse.drain(..=p).collect();
        line.pop();
        if line.last() == Some(&b'\r') {
            line.pop();
        }
        if line.is_empty() {
            if !self.cur.any {
                return Some(None);
            }
            let cur = std::mem::take(&mut self.cur);
            return Some(Some(Next::Event(SseEvent {
                id: cur.id,
                event: cur.event,
                data: cur.data.unwrap_or_default(),
            })));
        }
        if line[0] == b':' {
            return Some(Some(Next::Comment));
        }
        let (field, value) = match line.iter().position(|&b| b == b':') {
            Some(i) => {
                let v = &line[i + 1..];
                (&line[..i], v.strip_prefix(b" ").unwrap_or(v))
            }
            None => (&line[..], &b""[..]),
        };
        self.cur.any = true;
        match field {
            b"id" => self.cur.id = Some(String::from_utf8_lossy(value).into_owned()),
            b"event" => self.cur.event = Some(String::from_utf8_lossy(value).into_owned()),
            b"data" => match self.cur.data.as_mut() {
                Some(d) => {
                    d.push(b'\n');
                    d.extend_from_slice(value);
                }
                None => self.cur.data = Some(value.to_vec()),
            },
            _ => {}
        }
        Some(None)
    }

    /// The next thing on the stream, waiting at most until `deadline`.
    pub async fn next(&mut self, deadline: Instant) -> Next {
        let mut tmp = vec![0u8; 16 * 1024];
        loop {
            while let Some(r) = self.line() {
                if let Some(n) = r {
                    return n;
                }
            }
            if self.budget == Some(0) {
                return Next::Cut {
                    mid_event: self.mid_event(),
                };
            }
            let before = self.sse.len();
            self.decode();
            if self.sse.len() != before || self.budget == Some(0) {
                continue;
            }
            if self.body_done || self.sock_eof {
                return Next::End;
            }
            match timeout_at(deadline, self.sock.read(&mut tmp)).await {
                Err(_) => return Next::Timeout,
                Ok(Ok(0)) | Ok(Err(_)) => self.sock_eof = true,
                Ok(Ok(n)) => self.raw.extend_from_slice(&tmp[..n]),
            }
        }
    }
}
