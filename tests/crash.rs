//! Crash-consistency test (design.md §10 "Proof"): the proxy binary with its data dir on a
//! loop-mounted ext4 image, the filesystem aborted (simulated power loss) at random moments
//! while legacy clients flood and read, remounted, the proxy restarted; an oracle checks every
//! event any client received against the log and the resumes. Needs root, `losetup`,
//! `mkfs.ext4` and `mount`; without them it fails (it never skips). See `docs/crash.md`.
//!
//! `cargo test --test crash -- --nocapture` runs the short profile (CI);
//! `CRASH_PROFILE=long cargo test --release --test crash -- --nocapture` the long one;
//! `CRASH_SEED=<n>` replays a seed's plan (modes, abort moments, client choices).

#[path = "crash/mod.rs"]
mod crash;

#[test]
fn acknowledged_events_survive_power_loss_and_lost_tails_are_refused() {
    let profile = crash::Profile::from_env();
    let seed = crash::seed_from_env();
    eprintln!(
        "crash: profile={} seed={seed} generations={} aborts_per_image={} clients={} (replay with CRASH_SEED={seed})",
        profile.name, profile.generations, profile.aborts_per_image, profile.clients
    );
    let bin = std::path::PathBuf::from(env!("CARGO_BIN_EXE_mcp-resume-proxy"));
    let out = crash::run(&profile, seed, bin);
    println!("{}", out.detail);
    for v in &out.violations {
        println!("violation: {v}");
    }
    println!("{}", out.summary);
    assert!(
        out.ok,
        "the crash harness found violations (seed {seed}; process logs and a copy of the first failing data dir kept in {}):\n{}\n{}",
        out.dir.display(),
        out.violations.join("\n"),
        out.summary
    );
}
