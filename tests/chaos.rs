//! Chaos test (issue 4, part 1): the proxy binary in front of the demo upstream process, with
//! client cuts, proxy SIGKILLs in both durability modes, upstream SIGKILLs and SIGTERMs under
//! load, checked by an oracle that knows what the upstream emitted. 2026-07-28 clients run beside
//! the legacy ones, polling durable tasks across the same faults (issue 11: no task lost, none
//! stuck in `working`, none visible to another identity). See `docs/chaos.md`.
//!
//! `cargo test --test chaos -- --nocapture` runs the short profile (CI);
//! `CHAOS_PROFILE=long cargo test --release --test chaos -- --nocapture` the long one;
//! `CHAOS_SEED=<n>` replays a seed's fault plan and client choices.

mod support;

#[path = "chaos/mod.rs"]
mod chaos;

#[test]
fn chaos_profile_has_no_silent_gap_duplicate_or_hung_request() {
    let profile = chaos::Profile::from_env();
    let seed = chaos::seed_from_env();
    eprintln!(
        "chaos: profile={} seed={seed} workers={} duration={}s (replay with CHAOS_SEED={seed})",
        profile.name,
        profile.workers,
        profile.duration.as_secs()
    );
    let ports = chaos::Ports {
        proxy: support::port(),
        admin: support::port(),
        upstream: support::port(),
    };
    let bin = std::path::PathBuf::from(env!("CARGO_BIN_EXE_mcp-resume-proxy"));
    let out = chaos::run(&profile, seed, bin, ports);
    println!("{}", out.detail);
    for v in &out.violations {
        println!("violation: {v}");
    }
    println!("{}", out.summary);
    assert!(
        out.ok,
        "chaos found violations (seed {seed}; logs and data dir kept in {}):\n{}\n{}",
        out.dir.display(),
        out.violations.join("\n"),
        out.summary
    );
}
