//! Which tools require a task. A legacy upstream speaking 2025-11-25 may mark a tool
//! `execution.taskSupport: "required"` in its `tools/list` (the tasks vocabulary of that
//! version). 2026-07-28 listings carry no such field (the proxy strips it from the listings it
//! relays), but the rule stands (SEP-2663, "Required Capabilities"): a call of such a tool from a
//! client that did not declare `io.modelcontextprotocol/tasks` is refused `-32021`. For a client
//! that did, nothing changes: the call becomes a task after `tasks.after_ms` as any other (a tool
//! that first asks the client something answers those rounds synchronously, before the task).
//!
//! Learnt from the `tools/list` results the proxy relays (the newest listing of a tool wins) and,
//! before the first `tools/call` when none was relayed yet, from one listing of the proxy's own
//! (its first page).

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use serde_json::Value;

/// The most tools remembered as requiring a task.
const MAX_TOOLS: usize = 4096;

/// The tools the upstream says require a task.
#[derive(Debug, Default)]
pub struct TaskSupport {
    required: Mutex<HashSet<String>>,
    listed: AtomicBool,
}

impl TaskSupport {
    /// Learns from a `tools/list` result.
    pub fn learn(&self, result: &Value) {
        let Some(tools) = result.get("tools").and_then(Value::as_array) else {
            return;
        };
        // Plain data, never held across an await.
        let mut req = self.required.lock().unwrap_or_else(|e| e.into_inner());
        for t in tools {
            let Some(name) = t.get("name").and_then(Value::as_str) else {
                continue;
            };
            if t.pointer("/execution/taskSupport").and_then(Value::as_str) == Some("required") {
                if req.len() < MAX_TOOLS {
                    req.insert(name.to_string());
                }
            } else {
                req.remove(name);
            }
        }
        self.listed.store(true, Ordering::Relaxed);
    }

    /// Has a listing been seen?
    pub fn listed(&self) -> bool {
        self.listed.load(Ordering::Relaxed)
    }

    /// Does `tool` require a task?
    pub fn required(&self, tool: &str) -> bool {
        self.required
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(tool)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn learns_required_tools_and_forgets_them_when_relisted() {
        let s = TaskSupport::default();
        assert!(!s.listed());
        s.learn(&json!({"tools": [
            {"name": "a", "execution": {"taskSupport": "required"}},
            {"name": "b", "execution": {"taskSupport": "optional"}},
            {"name": "c"}]}));
        assert!(s.listed());
        assert!(s.required("a"));
        assert!(!s.required("b") && !s.required("c") && !s.required("d"));
        s.learn(&json!({"tools": [{"name": "a", "execution": {"taskSupport": "forbidden"}}]}));
        assert!(!s.required("a"));
    }
}
