//! Tool calls and reasoning over loopback (issue 31), driven by the official Python clients
//! (`serve_tools.py`): qwen2.5-coder-0.5b with its own Hermes template (calls, streamed and
//! not, `required`, a named tool, a tool result sent back, Ollama's whole calls), then with a
//! DeepSeek-R1 template that opens `<think>` in the prompt and a Qwen3 template whose prompt
//! does not (`--chat-template-file`): reasoning split off on both APIs, streamed and not. Llama
//! 3.1's, Mistral Nemo's and Qwen3's (thinking beside calls) templates: calls in their formats,
//! a tool result sent back.

mod common;

use common::serve::Server;

const ALIAS: &str = "qwen2.5-coder-0.5b";

fn run_script(extra: &[&str], mode: &str) {
    let model = common::model(ALIAS);
    let mut args = vec!["--name", ALIAS, "--parallel", "1", "--ctx", "2048", "--threads", "2"];
    args.extend_from_slice(extra);
    let server = Server::start(&model, &args);
    common::python("serve_tools.py", &[server.url().as_str(), ALIAS, mode], "openai ollama");
}

fn template(name: &str) -> String {
    format!("{}/../../testdata/templates/{name}", env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn tool_calls_through_the_openai_and_ollama_clients() {
    run_script(&[], "tools");
}

#[test]
fn reasoning_opened_by_the_prompt_is_split_off() {
    let t = template("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja");
    run_script(&["--chat-template-file", &t], "open");
}

#[test]
fn reasoning_the_output_would_open_is_only_split_at_the_start() {
    let t = template("Qwen-Qwen3-0.6B.jinja");
    run_script(&["--chat-template-file", &t], "tagged");
}

#[test]
fn llama3_calls_through_its_own_template() {
    let t = template("meta-llama-Llama-3.1-8B-Instruct.jinja");
    run_script(&["--chat-template-file", &t], "format");
}

#[test]
fn mistral_calls_through_its_own_template() {
    let t = template("mistralai-Mistral-Nemo-Instruct-2407.jinja");
    run_script(&["--chat-template-file", &t], "format");
}

#[test]
fn qwen3_calls_beside_its_thinking_section() {
    let t = template("Qwen-Qwen3-0.6B.jinja");
    run_script(&["--chat-template-file", &t], "format");
}
