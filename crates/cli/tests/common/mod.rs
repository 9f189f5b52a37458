//! Shared by the CLI's integration tests.
//!
//! Some tests need privileges a developer's laptop may not grant (root, the cgroup-v1 memory
//! controller, a large `RLIMIT_MEMLOCK`). Without them such a test says what is missing and
//! skips; with [`REQUIRE_PRIVILEGED`] set (scripts/test.sh sets it: CI runs as root with cgroup
//! v1) a missing privilege is a failure, so CI can never skip them silently.

use std::io::Write;
use std::path::{Path, PathBuf};

#[allow(dead_code)] // Only the serve tests start a server.
pub mod serve;

#[allow(dead_code)] // Only the hostile-request tests send raw HTTP.
pub mod hostile;

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

/// Runs `tests/SCRIPT` with `args` and returns its stdout (also printed); a missing Python
/// package fails naming `packages` (what scripts/test.sh installs), and a failing script fails
/// with both its outputs.
#[allow(dead_code)] // Only the tests that drive the real Python clients call it.
pub fn python<S: AsRef<std::ffi::OsStr>>(script: &str, args: &[S], packages: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests").join(script);
    let out =
        std::process::Command::new("python3").arg(path).args(args).output().expect("python3 runs");
    let (stdout, stderr) =
        (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(
        !stderr.contains("No module named"),
        "PyPI packages are missing: `python3 -m pip install {packages}` (scripts/test.sh \
         installs them)\n{stderr}"
    );
    assert!(out.status.success(), "{script} {:?} failed:\n{stdout}\n{stderr}", out.status);
    println!("{stdout}");
    stdout.into_owned()
}

/// Set (to anything) to make a missing privilege fail the tests that need it instead of skipping
/// them.
pub const REQUIRE_PRIVILEGED: &str = "SNUG_REQUIRE_PRIVILEGED";

/// Where the cgroup-v1 memory controller is expected.
#[allow(dead_code)]
pub const CGROUP_V1: &str = "/sys/fs/cgroup/memory";

/// Whether `test`, which needs what `have` checked, runs: `have` is `Err(what is missing)`. A
/// missing privilege prints a skip line (or fails under [`REQUIRE_PRIVILEGED`]).
#[allow(dead_code)]
pub fn may_run(test: &str, have: Result<(), String>) -> bool {
    let Err(missing) = have else {
        return true;
    };
    assert!(
        std::env::var_os(REQUIRE_PRIVILEGED).is_none(),
        "{test}: {missing} ({REQUIRE_PRIVILEGED} is set, so this test must run)"
    );
    // Straight to the stderr handle: libtest captures `eprintln!` of a passing test, which would
    // hide the skip.
    let _ = writeln!(
        std::io::stderr(),
        "SKIPPED {test}: {missing} (set {REQUIRE_PRIVILEGED}=1 to make this a failure)"
    );
    false
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Whether this process can create memory cgroups under [`CGROUP_V1`] and move processes into
/// them: root, and the controller mounted there.
#[allow(dead_code)]
pub fn cgroup_v1_memory() -> Result<(), String> {
    if !is_root() {
        return Err("needs root to create a memory cgroup".into());
    }
    if !Path::new(CGROUP_V1).join("memory.limit_in_bytes").exists() {
        return Err(format!(
            "needs the cgroup-v1 memory controller at {CGROUP_V1} (e.g. `mount -t cgroup -o memory memory {CGROUP_V1}`)"
        ));
    }
    Ok(())
}

/// Whether this process may `mlock` `bytes`: root, or an `RLIMIT_MEMLOCK` at least that large.
#[allow(dead_code)]
pub fn can_mlock(bytes: u64) -> Result<(), String> {
    let mut r = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes into the rlimit we own.
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut r) };
    if is_root() || (rc == 0 && (r.rlim_cur == libc::RLIM_INFINITY || r.rlim_cur >= bytes)) {
        return Ok(());
    }
    Err(format!(
        "needs root or `ulimit -l` of at least {} KiB to lock {bytes} bytes",
        bytes.div_ceil(1024)
    ))
}
