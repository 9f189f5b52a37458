//! Schemathesis (PyPI, installed by scripts/test.sh) against `snug serve`'s own
//! `/openapi.json`, over loopback on gemma3-270m: requests generated from the spec, valid and
//! invalid, to every route; no response may be a 5xx, every response must match the spec
//! (documented status, content type, headers, body schema), a body that breaks the schema must
//! be refused (4xx), and a method a route does not take must be a 405.
//!
//! Bounded: 20 examples per route plus schemathesis' coverage phase (boundary values), a
//! context of 64 positions (so no answer runs long, whatever token limit a request names) and
//! the hooks in `serve_schema_hooks.py`, which cap the token limits it draws at 4. The seed is
//! fixed so a failure reproduces.

mod common;

use std::process::Command;

use common::serve::Server;

const ALIAS: &str = "gemma3-270m";

#[test]
fn every_response_matches_the_openapi_spec_and_none_is_a_5xx() {
    let model = common::model(ALIAS);
    let server = Server::start(
        &model,
        // --allow-admin: the admin routes are tested too (else they only answer 403).
        &[
            "--name",
            ALIAS,
            "--parallel",
            "2",
            "--queue",
            "8",
            "--ctx",
            "64",
            "--threads",
            "2",
            "--allow-admin",
        ],
    );
    let tests = concat!(env!("CARGO_MANIFEST_DIR"), "/tests");
    let report = std::env::temp_dir().join(format!("snug-schemathesis-{}", std::process::id()));
    let out = Command::new("python3")
        .args(["-m", "schemathesis.cli", "run", &format!("{}/openapi.json", server.url())])
        .args(["--checks", "not_a_server_error,status_code_conformance,content_type_conformance,response_headers_conformance,response_schema_conformance,negative_data_rejection,unsupported_method,missing_required_header"])
        .args(["--max-examples", "20", "--seed", "1", "--generation-database", "none"])
        .args(["--request-timeout", "30", "--no-color", "--report-dir"])
        .arg(&report)
        .env("SCHEMATHESIS_HOOKS", "serve_schema_hooks")
        .env("PYTHONPATH", tests)
        .output()
        .expect("python3 runs");
    let _ = std::fs::remove_dir_all(&report);
    let (stdout, stderr) =
        (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(
        !stderr.contains("No module named"),
        "schemathesis is missing: `python3 -m pip install schemathesis` (scripts/test.sh \
         installs it)\n{stderr}"
    );
    assert!(
        out.status.success(),
        "schemathesis found responses that break the spec:\n{stdout}\n{stderr}"
    );
    assert!(stdout.contains("passed"), "schemathesis ran no test:\n{stdout}");
    println!("{stdout}");
}
