//! The `demo` subcommand and its embedded legacy upstream.

pub mod upstream;

/// Runs the narrated demo.
///
/// # Errors
/// A message when a step does not behave as narrated.
pub async fn run() -> Result<(), String> {
    Err("demo: not built yet".into())
}
