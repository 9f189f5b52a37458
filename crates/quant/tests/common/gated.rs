//! A test harness for tests that need a CPU feature (`harness = false` test files call
//! [`run`]): where the feature is missing each test is listed as "NOT RUN", by name, with the
//! reason, and counted apart from the passed ones, never shown as "ok". Setting the feature's
//! `SNUG_REQUIRE_*` variable makes a missing feature a failure, for a machine known to have it.
//! Cost: tests run one after another on the main thread (no parallel runner), and a failure is
//! caught with `catch_unwind`, so a test that aborts the process takes the file down with it.

use std::io::Write;
use std::panic::{catch_unwind, AssertUnwindSafe};

/// The feature a file's tests need.
pub struct Need {
    /// Whether this CPU (and the kernel, for this process) gives it.
    pub have: bool,
    /// Why a test does not run where it is missing.
    pub why: &'static str,
    /// Set in the environment, a missing feature fails the tests instead.
    pub require_var: &'static str,
    /// The summary's name for it ("no AMX").
    pub lacking: &'static str,
}

/// Runs the `tests` whose names contain every command-line filter, as libtest would, and exits
/// with 101 if one failed.
pub fn run(need: Need, tests: &[(&str, fn())]) {
    let filter: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with('-')).collect();
    let chosen: Vec<_> =
        tests.iter().filter(|(n, _)| filter.iter().all(|f| n.contains(f.as_str()))).collect();
    let required = std::env::var_os(need.require_var).is_some();
    let mut out = std::io::stdout();
    let _ = writeln!(out, "\nrunning {} tests", chosen.len());
    let (mut passed, mut failed, mut not_run) = (0, 0, 0);
    for (name, test) in chosen {
        if !need.have {
            let why = need.why;
            if required {
                let _ =
                    writeln!(out, "test {name} ... FAILED ({why}; {} is set)", need.require_var);
                failed += 1;
            } else {
                let _ = writeln!(out, "test {name} ... NOT RUN ({why})");
                not_run += 1;
            }
            continue;
        }
        match catch_unwind(AssertUnwindSafe(test)) {
            Ok(()) => {
                let _ = writeln!(out, "test {name} ... ok");
                passed += 1;
            }
            Err(_) => {
                let _ = writeln!(out, "test {name} ... FAILED");
                failed += 1;
            }
        }
    }
    let verdict = if failed == 0 { "ok" } else { "FAILED" };
    let _ = writeln!(
        out,
        "\ntest result: {verdict}. {passed} passed; {failed} failed; {not_run} not run ({})\n",
        need.lacking
    );
    if failed > 0 {
        std::process::exit(101);
    }
}
