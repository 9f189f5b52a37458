//! `snug run` answers like `ollama run`: on a model with a chat template the prompt is one user
//! message and the answer is what `snug chat` gives for it; `--raw` continues the text instead;
//! stdin that is not a terminal is the prompt; a model without a template continues plainly and
//! says so once. The CLI and the server run one engine: greedy, they give the same text for the
//! same prompt, byte for byte, JSON mode included.

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

/// `snug serve` on `model` as the CLI runs it: one sequence, 2 threads.
fn serve(model: &Path) -> common::serve::Server {
    common::serve::Server::start(model, &["--name", ALIAS, "--parallel", "1", "--threads", "2"])
}

/// `POST path` with a JSON body on `server`; the answer parsed.
fn post(server: &common::serve::Server, path: &str, body: serde_json::Value) -> serde_json::Value {
    let (status, text) =
        server.send("POST", path, None, Some(&body.to_string())).expect("the server answers");
    assert_eq!(status, 200, "{path}: {text}");
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}: {text}"))
}

#[test]
fn the_cli_and_the_server_give_the_same_greedy_text() {
    let model = common::model(ALIAS);
    let server = serve(&model);
    let options = serde_json::json!({"temperature": 0, "num_predict": 24});
    let schema_path =
        std::env::temp_dir().join(format!("snug-run-schema-{}.json", std::process::id()));
    let schema = serde_json::json!({"type": "object", "properties": {
        "city": {"type": "string"}, "people": {"type": "integer"}}, "required": ["city", "people"]});
    std::fs::write(&schema_path, schema.to_string()).expect("the schema file is written");
    let schema_arg = schema_path.to_str().expect("a UTF-8 temp path");
    let cases: [(&[&str], serde_json::Value); 4] = [
        // The prompt as one user message through the template.
        (&[], serde_json::json!({"prompt": PROMPT})),
        // Plain continuation.
        (&["--raw"], serde_json::json!({"prompt": PROMPT, "raw": true})),
        // JSON mode, and a schema.
        (&["--format", "json"], serde_json::json!({"prompt": PROMPT, "format": "json"})),
        (&["--format", schema_arg], serde_json::json!({"prompt": PROMPT, "format": schema})),
    ];
    for (flags, mut body) in cases {
        let mut args = vec!["run"];
        args.extend_from_slice(flags);
        args.push(PROMPT);
        let (cli, err) = snug(&args, &model, None);
        body["model"] = ALIAS.into();
        body["stream"] = false.into();
        body["options"] = options.clone();
        let served = post(&server, "/api/generate", body);
        let served = served["response"].as_str().expect("a response");
        assert!(!served.trim().is_empty(), "{flags:?}: an empty answer");
        // The CLI ends its answer with a newline on stdout.
        assert_eq!(cli.strip_suffix('\n').unwrap_or(&cli), served, "{flags:?}; stderr:\n{err}");
        if flags.first() == Some(&"--format") {
            serde_json::from_str::<serde_json::Value>(served)
                .unwrap_or_else(|e| panic!("{flags:?} gave {served:?}, not JSON: {e}"));
        }
    }
    let _ = std::fs::remove_file(&schema_path);
}

#[test]
fn the_cli_reports_the_servers_logprobs() {
    let model = common::model(ALIAS);
    let server = serve(&model);
    let (_, err) = snug(&["run", "--raw", "--logprobs", "2", PROMPT], &model, None);
    // One line per answer token: its log-probability first, then the text and alternatives.
    let cli: Vec<f32> =
        err.lines().filter_map(|l| l.split_whitespace().next()?.parse().ok()).collect();
    let body = serde_json::json!({"model": ALIAS, "prompt": PROMPT, "max_tokens": 24,
                                  "temperature": 0, "logprobs": 2});
    let served = post(&server, "/v1/completions", body);
    let served: Vec<f32> = served["choices"][0]["logprobs"]["token_logprobs"]
        .as_array()
        .expect("token_logprobs")
        .iter()
        .map(|v| v.as_f64().expect("a number") as f32)
        .collect();
    assert!(!served.is_empty());
    assert_eq!(cli.len(), served.len(), "stderr:\n{err}");
    for (i, (c, s)) in cli.iter().zip(&served).enumerate() {
        // The CLI prints four decimals.
        assert!((c - s).abs() <= 6e-5 && *c <= 0.0, "token {i}: {c} against {s}");
    }
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
