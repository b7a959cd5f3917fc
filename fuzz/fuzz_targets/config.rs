//! The config loader on arbitrary text: `Config::from_toml(..).and_then(validate)`.
//!
//! Checks: no panic (errors are fine); an error is one line, as `ConfigError` promises (`main`
//! prints it as the single line before exit 64); a config that validates validates again
//! unchanged.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mcp_resume_proxy::config::Config;

fuzz_target!(|text: &str| {
    match Config::from_toml(text).and_then(Config::validate) {
        Ok(cfg) => {
            let again = cfg.clone().validate().expect("a valid config stays valid");
            assert_eq!(again, cfg);
        }
        Err(e) => {
            let msg = e.to_string();
            assert!(
                !msg.chars().any(char::is_control),
                "error is not one line: {msg:?}"
            );
        }
    }
});
