//! What the hostile-request tests share: raw HTTP requests (bodies and headers no client library
//! would send), and the oracle a healthy server passes after each hostile request (the plain
//! greedy chat gives its unloaded answer within twice its unloaded latency, `/health` says 200
//! at once, and resident memory stays within `snug plan`'s prediction).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::serve::Server;

/// An answer: status, head (lowercase) and body as sent.
pub struct Answer {
    pub status: u16,
    pub head: String,
    pub body: String,
}

/// Opens a connection and sends a POST with `headers` (a `Host` of the loopback address unless
/// they name one) and as much of `body` as the server reads: a refusal may come before the
/// whole body is read, and the rest is then not needed.
pub fn send(port: u16, path: &str, headers: &[(&str, &str)], body: &[u8]) -> TcpStream {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connects");
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    let mut head = format!("POST {path} HTTP/1.1\r\nConnection: close\r\n");
    if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("host")) {
        head += &format!("Host: 127.0.0.1:{port}\r\n");
    }
    for (k, v) in headers {
        head += &format!("{k}: {v}\r\n");
    }
    head += &format!("Content-Length: {}\r\n\r\n", body.len());
    s.write_all(head.as_bytes()).unwrap();
    let _ = s.write_all(body);
    s
}

/// The JSON content type.
pub const JSON: (&str, &str) = ("Content-Type", "application/json");

/// [`send`] with a JSON body.
pub fn connect(port: u16, path: &str, body: &[u8]) -> TcpStream {
    send(port, path, &[JSON], body)
}

/// Reads a connection to its end.
pub fn read_answer(mut s: TcpStream) -> Answer {
    let mut raw = Vec::new();
    let _ = s.read_to_end(&mut raw);
    let raw = String::from_utf8_lossy(&raw).into_owned();
    let status = raw.get(9..12).and_then(|c| c.parse().ok()).unwrap_or(0);
    let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
    Answer { status, head: head.to_ascii_lowercase(), body: body.to_string() }
}

/// A JSON POST and its answer.
pub fn post(port: u16, path: &str, body: &[u8]) -> Answer {
    read_answer(connect(port, path, body))
}

/// The error message of an error body in either API's shape.
pub fn error_message(body: &str) -> String {
    let v: Value = serde_json::from_str(body).unwrap_or(Value::Null);
    match &v["error"] {
        Value::String(s) => s.clone(),
        e => e["message"].as_str().unwrap_or("").to_string(),
    }
}

/// The plain request: a short greedy chat.
pub const PLAIN: &str =
    r#"{"messages":[{"role":"user","content":"Say hi"}],"max_tokens":4,"temperature":0}"#;

/// The plain request's latency and text.
pub fn plain_chat(port: u16) -> (Duration, String) {
    let t0 = Instant::now();
    let a = post(port, "/v1/chat/completions", PLAIN.as_bytes());
    let took = t0.elapsed();
    assert_eq!(a.status, 200, "the plain chat request failed: {}", a.body);
    let v: Value = serde_json::from_str(&a.body).expect("a JSON answer");
    (took, v["choices"][0]["message"]["content"].as_str().expect("content").to_string())
}

/// Resident memory of process `pid`.
pub fn vm_rss(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("the server's status");
    let kb = s.lines().find_map(|l| l.strip_prefix("VmRSS:")).expect("VmRSS");
    kb.trim().trim_end_matches("kB").trim().parse::<u64>().expect("a number") * 1024
}

/// What a healthy server does after each hostile request.
pub struct Oracle {
    /// The plain request's unloaded latency.
    pub unloaded: Duration,
    /// Its unloaded greedy text.
    pub text: String,
    /// The resident memory it may not pass.
    pub rss_max: u64,
    /// The least slack on the latency (the test machine's 2 vCPUs are shared).
    pub floor: Duration,
}

impl Oracle {
    /// Measures the plain request on an unloaded `server`: the best of three (the first also
    /// warms up), whose greedy texts must agree.
    pub fn unloaded(server: &Server, rss_max: u64, floor: Duration) -> Oracle {
        let runs: Vec<(Duration, String)> = (0..3).map(|_| plain_chat(server.port)).collect();
        let text = runs[0].1.clone();
        assert!(runs.iter().all(|r| r.1 == text), "greedy answers differ: {runs:?}");
        assert!(!text.is_empty(), "the plain answer is empty");
        let unloaded = runs.iter().map(|r| r.0).min().unwrap();
        println!("unloaded plain chat {unloaded:?}, RSS at most {rss_max} bytes");
        Oracle { unloaded, text, rss_max, floor }
    }

    fn latency_budget(&self) -> Duration {
        (self.unloaded * 2).max(self.unloaded + self.floor)
    }

    /// Panics unless the server still serves the plain request as when unloaded, `/health`
    /// answers 200 within a second, and its resident memory is within `rss_max`.
    pub fn check(&self, server: &Server, after: &str) {
        let (took, text) = plain_chat(server.port);
        assert_eq!(text, self.text, "after {after}: the plain answer changed");
        assert!(
            took <= self.latency_budget(),
            "after {after}: the plain request took {took:?} (unloaded {:?})",
            self.unloaded
        );
        let t0 = Instant::now();
        let (status, body) = server.get("/health").expect("/health answers");
        assert_eq!(status, 200, "after {after}: /health says {body}");
        assert!(
            t0.elapsed() < Duration::from_secs(1),
            "after {after}: /health took {:?}",
            t0.elapsed()
        );
        let rss = vm_rss(server.pid());
        println!("after {after}: plain chat {took:?}, RSS {} MiB", rss >> 20);
        assert!(rss <= self.rss_max, "after {after}: RSS {rss} past the plan's {}", self.rss_max);
    }
}

/// `snug plan`'s predicted peak for a server of `model` at `ctx` with 2 slots on 2 threads,
/// plus a tenth for request bodies in flight.
pub fn planned_rss(model: &std::path::Path, ctx: usize) -> u64 {
    let ctx = ctx.to_string();
    let args = [
        "plan",
        model.to_str().unwrap(),
        "--ctx",
        &ctx,
        "--parallel",
        "2",
        "--threads",
        "2",
        "--serve",
        "--json",
    ];
    let args: Vec<&std::ffi::OsStr> = args.iter().map(std::ffi::OsStr::new).collect();
    let peak = super::snug_json(&args)["predicted_peak_rss_bytes"].as_u64().expect("a peak");
    peak + peak / 10
}
