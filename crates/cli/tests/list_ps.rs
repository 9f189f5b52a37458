//! `snug list` shows the models in the cache; `snug ps` shows what a live `snug serve` holds,
//! and says how to start one when no server answers.

mod common;

use std::net::TcpListener;
use std::process::{Command, Output};

const SNUG: &str = env!("CARGO_BIN_EXE_snug");
const ALIAS: &str = "qwen2.5-coder-0.5b";

fn snug(args: &[&str], env: &[(&str, &std::ffi::OsStr)]) -> Output {
    let mut cmd = Command::new(SNUG);
    cmd.args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.env_remove("SNUG_API_KEY").output().expect("snug runs")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn list_shows_the_cached_models() {
    let model = common::model(ALIAS);
    let home = std::env::temp_dir().join(format!("snug-list-{}", std::process::id()));
    let models = home.join("models");
    std::fs::create_dir_all(&models).expect("a temp cache");
    // The real file, under its alias, beside a download in flight that is not a model yet.
    std::os::unix::fs::symlink(&model, models.join(format!("{ALIAS}.gguf"))).expect("a symlink");
    std::fs::write(models.join("other.gguf.partial"), b"GGUF").expect("a partial file");
    let out = snug(&["list"], &[("SNUG_HOME", home.as_os_str())]);
    let _ = std::fs::remove_dir_all(&home);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 2, "a header and one model:\n{stdout}");
    assert!(lines[0].starts_with("NAME") && lines[0].contains("SIZE"), "{stdout}");
    let size = std::fs::metadata(&model).expect("the model's size").len();
    let spec = hub::spec(ALIAS).expect("a known alias");
    let row = lines[1];
    assert!(row.starts_with(ALIAS), "{row}");
    assert!(row.contains(&spec.sha256[..12]), "{row}");
    assert!(row.contains(&runtime::fmt_bytes(size)), "{row}");
    assert!(!row.contains("incomplete"), "{row}");
}

#[test]
fn ps_shows_what_a_live_server_holds() {
    let model = common::model(ALIAS);
    let server = common::serve::Server::start(
        &model,
        &["--name", ALIAS, "--ctx", "512", "--parallel", "2", "--threads", "2", "--api-key", "k"],
    );
    let port = server.port.to_string();
    let out = snug(&["ps", "--port", &port, "--api-key", "k"], &[]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let row = stdout.lines().find(|l| l.starts_with(ALIAS)).unwrap_or_else(|| panic!("{stdout}"));
    let size = std::fs::metadata(&model).expect("the model's size").len();
    assert!(row.contains(&runtime::fmt_bytes(size)), "{row}");
    assert!(row.split_whitespace().any(|c| c == "512"), "the context per sequence:\n{row}");
    // The server's resident memory against its budget, from its /metrics.
    assert!(row.contains(" of "), "the memory column:\n{row}");
    // Without the key the server refuses, and ps says which key it needs.
    let out = snug(&["ps", "--port", &port], &[]);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(err.contains("API key") && err.contains("SNUG_API_KEY"), "{err}");
}

#[test]
fn ps_without_a_server_says_how_to_start_one() {
    // A port that was free a moment ago: nothing listens there.
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
        .to_string();
    let out = snug(&["ps", "--port", &port], &[]);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.contains(&format!("no snug server at 127.0.0.1:{port}"))
            && err.contains("snug serve MODEL"),
        "{err}"
    );
}
