//! `snug serve` on a free loopback port, driven by the official Python clients (PyPI `openai`
//! and `ollama`, installed by scripts/test.sh): chat and completions, streaming and not, usage,
//! stop, seed, errors; Ollama chat, generate, list, show, ps. See `serve_clients.py`.

mod common;

use std::io::Read;
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const SNUG: &str = env!("CARGO_BIN_EXE_snug");
const ALIAS: &str = "qwen2.5-coder-0.5b";
const KEY: &str = "test-key";

/// The server process, stopped when the test ends (also on failure).
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free port").port()
}

/// Waits until `GET /health` answers (the model is loaded); fails with the server's stderr if
/// it exits first.
fn wait_ready(server: &mut Server, port: u16) {
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(120) {
        if let Ok(Some(status)) = server.0.try_wait() {
            let mut err = String::new();
            if let Some(e) = server.0.stderr.as_mut() {
                let _ = e.read_to_string(&mut err);
            }
            panic!("snug serve exited ({status}) before answering: {err}");
        }
        if let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) {
            use std::io::Write;
            let _ = s.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
            let mut resp = String::new();
            let _ = s.read_to_string(&mut resp);
            if resp.starts_with("HTTP/1.1 200") {
                return;
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("snug serve did not answer /health within 120 s");
}

#[test]
fn the_official_openai_and_ollama_clients_work_unchanged() {
    let model = common::model(ALIAS);
    let port = free_port();
    let mut server = Server(
        Command::new(SNUG)
            .arg("serve")
            .arg(&model)
            .args(["--name", ALIAS, "--port", &port.to_string(), "--api-key", KEY])
            .args(["--parallel", "2", "--queue", "1", "--ctx", "1024", "--threads", "2"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("snug serve starts"),
    );
    wait_ready(&mut server, port);
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/serve_clients.py");
    let out = Command::new("python3")
        .arg(script)
        .arg(format!("http://127.0.0.1:{port}"))
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
