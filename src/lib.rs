//! mcp-resume-proxy: a sidecar reverse proxy that retrofits durable, provably gap-free
//! resumption onto legacy HTTP+SSE MCP servers, without touching their code.
//!
//! # Data path
//!
//! ```text
//! client ─▶ [1] listener ─▶ [2] facade: router ─▶ legacy | streamable | modern
//!                                                               │
//!           [4] upstream link (SSE reader, POST forwarder) ◀── [3] session registry
//!                    │ every upstream event
//!                    ▼
//!           [5] log (append, group commit, trim) ─▶ [6] client stream (cursor: replay, then live)
//! ```
//!
//! - [`listener`]: the TCP/TLS listener: accept loop, connection limit.
//! - [`facade`]: three sibling faces behind one router (`facade/mcp.rs`: by path, then per
//!   request the era on `/mcp`) over a leaf of shared HTTP helpers (`facade/http.rs`: caller,
//!   bodies, responses, refusals): the legacy HTTP+SSE face (`facade/legacy.rs`), the sessionful
//!   Streamable HTTP face (`facade/streamable.rs`, with `facade/resume.rs`), and the 2026-07-28
//!   face ([`modern`], `facade/modern/`).
//! - [`session`]: session id → live session: upstream link, in-flight requests, attached streams.
//! - [`upstream`]: the proxy-owned upstream SSE stream and POST forwarding.
//! - [`log`]: the event log (segment files of checksummed records), its writer thread, ids and
//!   the contiguity check; inside, leaves first: the events (`log/event.rs`), records, segments
//!   and the scan of them (`image.rs`), the state the handle and the writer share (`store.rs`),
//!   the writer, and the handle (`log/mod.rs`) on top.
//! - [`stream`]: a client stream as a cursor over the log.
//! - [`modern`] (in [2], `facade/modern/`): the stateless MCP 2026-07-28 face, chosen per request
//!   by the router: a pool of proxy-opened upstream sessions partitioned by caller, MRTR,
//!   `Mcp-Param-*` checks, `subscriptions/listen`, and tasks kept in [5]; its parts share two
//!   leaves (`protocol.rs`: versions and keys; `who.rs`: who a caller is) and never name
//!   `modern/mod.rs`, which wires them.
//!
//! Components take their own config sections (the registry `[sessions]`, the upstream link
//! `[upstream]`, the faces `[listen]`, `[legacy]`, `[streamable]`, `[auth]`, the 2026-07-28 face
//! `[modern]` and `[tasks]`, the log `[log]`), never the whole [`config::Config`]; [`app`] hands
//! them out. `scripts/module-cycles` checks that no file module imports one that imports it back.
//!
//! Around it: [`domain`] (the vocabulary the others share), [`config`] (every section, the
//! 2026-07-28 face's and `[auth]` included: it imports no component, only the leaves [`tls`],
//! [`jwt`] and [`keyfile`] whose file checks its validation runs), [`metrics`], [`admin`],
//! [`shutdown`], [`app`] (wiring), [`sse`] (decoder/encoder), `queue` (queues bounded in items and
//! bytes), [`jsonrpc`] (routing fields, error
//! bodies, and the one answer table of all three faces: each JSON-RPC code, HTTP status and
//! reason the proxy answers with, `jsonrpc::Answer`; [`error`] and the faces draw from it),
//! [`identity`] and [`jwt`] (who a caller is), [`echo`] (client values cut before they are echoed), [`demo`] and [`inspect`].

#![forbid(unsafe_code)]
#![deny(rust_2018_idioms)]
#![deny(missing_docs)]

// The public API: what `main`, the integration tests and the benches use. The data path's
// internals stay private (`#[doc(hidden)]` where a bench or the fuzz targets need a piece).
mod admin;
pub mod app;
pub mod config;
pub mod demo;
pub mod domain;
mod echo;
pub mod error;
mod facade;
pub mod identity;
pub mod inspect;
pub mod jwt;
pub mod keyfile;
/// The HTTP faces' header parsers, gathered for the `headers` fuzz target.
#[doc(hidden)]
pub mod headers {
    pub use crate::config::{origin_of, parse_origin};
    pub use crate::facade::http::{host_allowed, is_json_content, origin_allowed, query_param};
    pub use crate::facade::modern::wire::{decode_value, media_refusal, validate, Checked};
    pub use crate::facade::streamable::{accepts, version_header, SUPPORTED_VERSIONS};
}
#[doc(hidden)]
pub mod jsonrpc;
mod listener;
pub mod log;
pub mod metrics;
pub use facade::modern;
mod queue;
#[doc(hidden)]
pub mod session;
pub mod shutdown;
pub mod sse;
#[doc(hidden)]
pub mod stream;
pub mod tls;
mod upstream;
/// The upstream SSE response's HTTP/1.1 reader (head and body framing), for the `http1_body`
/// fuzz target.
#[doc(hidden)]
pub use upstream::http1;
