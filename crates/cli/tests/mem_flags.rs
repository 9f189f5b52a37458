//! `--ram`, `--load` and `--verbose` mean the same to `snug run`, `snug chat` and `snug bench`:
//! each verb plans within the same budget and residency for the same flags, makes the weights resident the way
//! `--load` says (streaming shows up as streamed-weight drops at exit) and, with `--verbose`, reports its
//! peak RSS against the prediction.

mod common;

use std::io::Write;
use std::process::{Command, Stdio};

const SNUG: &str = env!("CARGO_BIN_EXE_snug");
const ALIAS: &str = "qwen2.5-coder-0.5b";

/// Runs one verb with `mem` flags (and `stdin` for chat); returns its stderr, failing on a
/// non-zero exit.
fn verb(verb: &str, mem: &[&str]) -> String {
    let m = common::model(ALIAS);
    let mut cmd = Command::new(SNUG);
    cmd.arg(verb).arg(&m).args(["--ctx", "256", "--threads", "2"]).args(mem);
    match verb {
        "run" => cmd.args(["-n", "4", "--temp", "0", "Hello"]),
        "chat" => cmd.args(["-n", "4", "--temp", "0"]),
        "bench" => cmd.args(["-p", "16", "-n", "4", "-r", "1"]),
        other => panic!("no such verb in this test: {other}"),
    };
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("snug starts");
    if let Some(mut stdin) = child.stdin.take() {
        // Chat reads one message, answers it, then sees the end of input; the others ignore it.
        let _ = stdin.write_all(b"Hello\n");
    }
    let out = child.wait_with_output().expect("snug finishes");
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "snug {verb} {mem:?} failed:\n{err}");
    err
}

/// The `snug: ctx …, KV …, <residency> — reason; budget …` line.
fn plan_line(err: &str) -> String {
    err.lines()
        .find(|l| l.starts_with("snug: ctx "))
        .unwrap_or_else(|| panic!("no plan line in:\n{err}"))
        .to_string()
}

#[test]
fn chat_and_bench_stream_weights_under_ram_and_report_like_run() {
    let flags = ["--ram", "330M", "--load", "stream", "--verbose"];
    let lines: Vec<(String, String)> =
        ["run", "chat", "bench"].iter().map(|v| (v.to_string(), verb(v, &flags))).collect();
    for (v, err) in &lines {
        // The pinned count depends on how many positions each verb fills; the rest is the same.
        let line = plan_line(err);
        assert!(
            line.contains("ctx 256, KV f16")
                && line.contains(", stream (")
                && line.contains("budget 330.0 MiB from --ram"),
            "snug {v}: {line}"
        );
        assert!(
            err.contains("peak RSS (VmHWM)"),
            "snug {v} --verbose did not report peak RSS:\n{err}"
        );
        let drops = err
            .lines()
            .find(|l| l.contains("streamed-weight drops"))
            .unwrap_or_else(|| panic!("snug {v} did not stream:\n{err}"));
        assert!(!drops.contains(" 0 streamed-weight drops"), "snug {v}: {drops}");
    }
}

#[test]
fn chat_and_bench_honour_populate_and_mlock() {
    let size = std::fs::metadata(common::model(ALIAS)).expect("the model file").len();
    for load in ["populate", "mlock"] {
        if load == "mlock" && !common::may_run("mem_flags --load mlock", common::can_mlock(size)) {
            continue;
        }
        for v in ["run", "chat", "bench"] {
            // --ram bounds the buffer bench measures bandwidth with (at most half of what the
            // plan leaves free), which keeps this test quick.
            let line = plan_line(&verb(v, &["--load", load, "--ram", "700M"]));
            assert!(line.contains(&format!(", {load} —")), "snug {v} --load {load}: {line}");
        }
    }
}
