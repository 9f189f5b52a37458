//! `snug serve` on a free loopback port, driven by the official Python clients (PyPI `openai`
//! and `ollama`, installed by scripts/test.sh): chat and completions, streaming and not, usage,
//! stop, seed, errors; Ollama chat, generate, list, show, ps. See `serve_clients.py`.

mod common;

use std::process::Command;

use common::serve::Server;

const ALIAS: &str = "qwen2.5-coder-0.5b";
const KEY: &str = "test-key";

#[test]
fn the_official_openai_and_ollama_clients_work_unchanged() {
    let model = common::model(ALIAS);
    let server = Server::start(
        &model,
        &[
            "--name",
            ALIAS,
            "--api-key",
            KEY,
            // The script pulls (an admin route) with the API key.
            "--allow-admin",
            "--parallel",
            "2",
            "--queue",
            "1",
            "--ctx",
            "1024",
            "--threads",
            "2",
        ],
    );
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/serve_clients.py");
    let out = Command::new("python3")
        .arg(script)
        .arg(server.url())
        .args([KEY, ALIAS])
        .output()
        .expect("python3 runs");
    let (stdout, stderr) =
        (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(
        !stderr.contains("No module named"),
        "the Python clients are missing: `python3 -m pip install openai ollama` \
         (scripts/test.sh installs them)\n{stderr}"
    );
    assert!(out.status.success(), "the client script failed:\n{stdout}\n{stderr}");
    println!("{stdout}");
}
