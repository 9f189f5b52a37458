//! Shared by the CLI's integration tests.

use std::path::PathBuf;

/// The cached file of a known model, pulled if missing; a model that cannot be had is a failure
/// naming the command that fetches it, never a skip.
pub fn model(alias: &str) -> PathBuf {
    hub::resolve(alias)
        .unwrap_or_else(|e| panic!("{alias} is needed: {e} (fetch it with `snug pull {alias}`)"))
}

/// Runs the snug binary under test with `args` (which end in `--json`) and parses its stdout;
/// a non-zero exit fails with snug's stderr.
#[allow(dead_code)] // Not every test binary that includes this module calls it.
pub fn snug_json(args: &[&std::ffi::OsStr]) -> serde_json::Value {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_snug"))
        .args(args)
        .output()
        .expect("snug runs");
    assert!(
        out.status.success(),
        "snug {:?} failed: {}",
        args,
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("snug --json prints JSON")
}
