//! The reliability suite as CI runs it: every category on every available backend for about two
//! minutes (`TORSH_FUZZ_SECONDS`, default 100), from a fixed seed (`TORSH_FUZZ_SEED`, default 1), so
//! that a red run replays. A longer run: `cargo run --release -p torsh-fuzz -- --seconds 900`.

use std::process::Command;

#[test]
fn the_reliability_suite_finds_no_failure() {
    let seconds = std::env::var("TORSH_FUZZ_SECONDS").unwrap_or_else(|_| "100".into());
    let seed = std::env::var("TORSH_FUZZ_SEED").unwrap_or_else(|_| "1".into());
    let out = Command::new(env!("CARGO_BIN_EXE_torsh-fuzz"))
        .args(["--seconds", &seconds, "--seed", &seed])
        .output()
        .expect("torsh-fuzz runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{stdout}");
    eprintln!("{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        out.status.success(),
        "the reliability suite failed:\n{stdout}"
    );
    assert!(stdout.contains("no failures in"), "{stdout}");
}
