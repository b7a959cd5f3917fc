//! Server-Sent Events wire format.
//!
//! The proxy sits between MCP clients and upstream servers that stream
//! `text/event-stream`; it must understand event boundaries and ids to make
//! streams resumable, so it needs its own spec-exact (WHATWG) decoder rather
//! than passing bytes through, and an encoder to re-emit events with the
//! proxy's own ids.

pub mod decode;
pub mod encode;

pub use decode::{DecodeError, Decoder, Event};
