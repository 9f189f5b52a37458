//! `snug serve` on a free loopback port, driven by the official Python clients (PyPI `openai`
//! and `ollama`, installed by scripts/test.sh): chat and completions, streaming and not, usage,
//! stop, seed, errors; Ollama chat, generate, list, show, ps. See `serve_clients.py`.

mod common;

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
    common::python("serve_clients.py", &[server.url().as_str(), KEY, ALIAS], "openai ollama");
}
