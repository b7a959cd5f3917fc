//! Chaos test with replicas (issue 17 point 10): one Redis (AOF `always`), three proxy binaries
//! with `log.backend = "redis"`, each beside its own demo upstream process, forwarding on, one
//! shared identity key and forwarding secret, leases of 2 s. Legacy clients open sessions on a
//! random pod, POST through random pods, cut and resume their newest event id on random pods,
//! while pods are SIGKILLed (restarted, or left dead a while), SIGSTOPped past their lease, and
//! Redis is SIGKILLed and restarted on its AOF. See `docs/chaos.md`.
//!
//! `cargo test --test chaos_replicas -- --nocapture` runs the short profile (CI);
//! `CHAOS_PROFILE=long cargo test --release --test chaos_replicas -- --nocapture` the long one;
//! `CHAOS_SEED=<n>` replays a seed's fault plan and client choices.

mod support;

#[allow(dead_code)]
#[path = "chaos/rng.rs"]
mod rng;

#[allow(dead_code)]
#[path = "chaos/wire.rs"]
mod wire;

#[path = "chaos/replicas.rs"]
mod replicas;

#[test]
fn chaos_with_replicas_has_no_gap_duplicate_hung_request_or_stale_owner_write() {
    let profile = replicas::Profile::from_env();
    let seed = replicas::seed_from_env();
    eprintln!(
        "chaos-replicas: profile={} seed={seed} workers={} duration={}s (replay with CHAOS_SEED={seed})",
        profile.name,
        profile.workers,
        profile.duration.as_secs()
    );
    let bin = std::path::PathBuf::from(env!("CARGO_BIN_EXE_mcp-resume-proxy"));
    let out = replicas::run(&profile, seed, bin);
    println!("{}", out.detail);
    for v in &out.violations {
        println!("violation: {v}");
    }
    println!("{}", out.summary);
    assert!(
        out.ok,
        "chaos-replicas found violations (seed {seed}; pod logs kept in {}):\n{}\n{}",
        out.dir.display(),
        out.violations.join("\n"),
        out.summary
    );
}
