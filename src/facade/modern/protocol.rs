//! The names of the 2026-07-28 protocol this face uses: versions, extension and `_meta` keys, log
//! levels. A leaf of the face: its siblings name these, it names none of them.

/// The protocol version this face speaks.
pub const MODERN_VERSION: &str = "2026-07-28";
/// Every version served on `/mcp`, the modern one first (`-32022`'s `data.supported`).
pub const SERVED_VERSIONS: [&str; 4] = ["2026-07-28", "2025-11-25", "2025-06-18", "2025-03-26"];
/// The tasks extension id.
pub const TASKS_EXT: &str = "io.modelcontextprotocol/tasks";
/// The `_meta` key of the server's identity on results.
pub const SERVER_INFO: &str = "io.modelcontextprotocol/serverInfo";

/// The rank of a `logging/setLevel` level (`debug` lowest), `None` for an unknown one.
pub fn level_rank(l: &str) -> Option<u8> {
    [
        "debug",
        "info",
        "notice",
        "warning",
        "error",
        "critical",
        "alert",
        "emergency",
    ]
    .iter()
    .position(|x| *x == l)
    .map(|p| p as u8)
}
