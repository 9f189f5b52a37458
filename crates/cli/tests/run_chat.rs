//! `snug run` answers like `ollama run`: on a model with a chat template the prompt is one user
//! message and the answer is what `snug chat` gives for it; `--raw` continues the text instead;
//! stdin that is not a terminal is the prompt; a model without a template continues plainly and
//! says so once.

mod common;

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

const SNUG: &str = env!("CARGO_BIN_EXE_snug");
const ALIAS: &str = "qwen2.5-coder-0.5b";
const PROMPT: &str = "What is the capital of France?";

/// Greedy, short, small context: the same computation for every run of a test.
const FLAGS: [&str; 8] = ["--temp", "0", "-n", "24", "--ctx", "512", "--threads", "2"];

/// Runs snug with `args` and `stdin` (None: no stdin at all); returns (stdout, stderr), failing
/// on a non-zero exit.
fn snug(args: &[&str], model: &Path, stdin: Option<&str>) -> (String, String) {
    let mut child = Command::new(SNUG)
        .arg(args[0])
        .arg(model)
        .args(FLAGS)
        .args(&args[1..])
        .stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("snug starts");
    if let (Some(text), Some(mut pipe)) = (stdin, child.stdin.take()) {
        pipe.write_all(text.as_bytes()).expect("stdin takes the prompt");
    }
    let out = child.wait_with_output().expect("snug finishes");
    let (so, se) =
        (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr).into_owned());
    assert!(out.status.success(), "snug {args:?} failed:\n{se}");
    (so.into_owned(), se)
}

#[test]
fn run_answers_as_chat_and_raw_continues() {
    let model = common::model(ALIAS);
    let (answer, err) = snug(&["run", PROMPT], &model, None);
    assert!(!answer.trim().is_empty(), "no answer; stderr:\n{err}");
    assert!(err.contains("stop: Eog"), "the answer ends at the template's end of turn:\n{err}");
    // The same message through the chat loop: the template and greedy decoding give one answer.
    let (chat, _) = snug(&["chat"], &model, Some(&format!("{PROMPT}\n")));
    assert_eq!(answer, chat, "snug run and snug chat answer the same message differently");
    // Piped in, the prompt is the same message.
    let (piped, _) = snug(&["run"], &model, Some(&format!("{PROMPT}\n")));
    assert_eq!(piped, answer);
    // --raw continues the text itself, which is not the chat answer.
    let (raw, _) = snug(&["run", "--raw", PROMPT], &model, None);
    assert!(!raw.trim().is_empty());
    assert_ne!(raw, answer, "--raw gave the chat answer");
}

#[test]
fn a_model_without_a_chat_template_continues_plainly_and_says_so_once() {
    let model = std::env::temp_dir().join(format!("snug-run-chat-{}.gguf", std::process::id()));
    let out = Command::new(SNUG)
        .args(["synth", "--shape", "tiny-llama", "-o"])
        .arg(&model)
        .output()
        .expect("snug synth runs");
    assert!(out.status.success(), "synth failed: {}", String::from_utf8_lossy(&out.stderr));
    let (plain, err) = snug(&["run", "Once upon a time"], &model, None);
    assert_eq!(err.matches("has no chat template").count(), 1, "{err}");
    let (raw, raw_err) = snug(&["run", "--raw", "Once upon a time"], &model, None);
    assert!(!raw_err.contains("has no chat template"), "{raw_err}");
    let _ = std::fs::remove_file(&model);
    assert_eq!(plain, raw);
}

#[test]
fn an_empty_piped_prompt_is_an_error_that_says_what_to_do() {
    let model = common::model(ALIAS);
    let out =
        Command::new(SNUG).arg("run").arg(&model).stdin(Stdio::null()).output().expect("snug runs");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no prompt") && err.contains("--prompt-file"), "{err}");
}
