//! The Streamable HTTP face (`/mcp`).

use std::sync::Arc;

use http::Request;
use hyper::body::Incoming;

use super::{plain, Ctx, Resp};

/// Serves one request to the MCP endpoint.
pub async fn handle(_ctx: &Arc<Ctx>, _req: Request<Incoming>) -> Resp {
    plain(404, "text/plain", "Not Found")
}
