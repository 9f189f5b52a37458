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

impl Need {
    /// What tests that run on any CPU need.
    pub const ALWAYS: Need = Need { have: true, why: "", require_var: "", lacking: "" };
}

/// Named tests, as a harness-less test file lists them.
pub type Tests<'a> = &'a [(&'a str, fn())];

/// Runs the `tests` whose names contain every command-line filter, as libtest would, and exits
/// with 101 if one failed.
pub fn run(need: Need, tests: Tests) {
    run_groups(&[(&need, tests)]);
}

/// [`run`] for groups of tests with different needs, one summary for all.
pub fn run_groups(groups: &[(&Need, Tests)]) {
    let filter: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with('-')).collect();
    let mut out = std::io::stdout();
    let count: usize =
        groups.iter().map(|(_, t)| t.iter().filter(|(n, _)| chosen(n, &filter)).count()).sum();
    let _ = writeln!(out, "\nrunning {count} tests");
    let (mut passed, mut failed, mut not_run) = (0, 0, 0);
    let mut lacking = Vec::new();
    for (need, tests) in groups {
        let required = !need.require_var.is_empty() && std::env::var_os(need.require_var).is_some();
        for (name, test) in tests.iter().filter(|(n, _)| chosen(n, &filter)) {
            if !need.have {
                let why = need.why;
                if required {
                    let _ = writeln!(
                        out,
                        "test {name} ... FAILED ({why}; {} is set)",
                        need.require_var
                    );
                    failed += 1;
                } else {
                    let _ = writeln!(out, "test {name} ... NOT RUN ({why})");
                    not_run += 1;
                    if !lacking.contains(&need.lacking) {
                        lacking.push(need.lacking);
                    }
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
    }
    let verdict = if failed == 0 { "ok" } else { "FAILED" };
    let why = if lacking.is_empty() { String::new() } else { format!(" ({})", lacking.join(", ")) };
    let _ = writeln!(
        out,
        "\ntest result: {verdict}. {passed} passed; {failed} failed; {not_run} not run{why}\n"
    );
    if failed > 0 {
        std::process::exit(101);
    }
}

/// Whether a test named `name` passes every command-line filter.
fn chosen(name: &str, filter: &[String]) -> bool {
    filter.iter().all(|f| name.contains(f.as_str()))
}
