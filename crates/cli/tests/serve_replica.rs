//! `snug serve` as a replica behind an inference gateway (issue 33), on qwen2.5-coder-0.5b with
//! copies of the refdata adapter:
//!
//! - `/metrics` carries the model-server protocol's gauges under vLLM's names, parsed by the
//!   Prometheus client's strict parser, and their values follow the scheduler under load
//!   (`serve_replica.py metrics`).
//! - `/ready` is 503 while the model loads (held back in this debug build by
//!   `SNUG_TEST_LOAD_DELAY_MS`) and 200 once it serves; `/health` is 200 throughout.
//! - vLLM's `/v1/load_lora_adapter` and `/v1/unload_lora_adapter` work with the admin key and
//!   are refused without it.
//! - SIGTERM under load: requests in flight finish or end well-formed within the grace period,
//!   new ones are refused 503, `/ready` says 503, and the process exits 0.
//! - Two replicas with different adapters: a script playing the picker's LoRA-affinity and
//!   queue scorers from their `/metrics` sends each request to the replica that has its adapter
//!   (`serve_replica.py route`).
//!
//! The tests take one lock so that at most one runs at a time (the timings are the server's).

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::Command;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use common::serve::Server;

const ALIAS: &str = "qwen2.5-coder-0.5b";
const ADMIN: &str = "replica-admin";
const KEY: &str = "replica-key";
const COMMON: [&str; 6] = ["--ctx", "1024", "--threads", "2", "--name", ALIAS];

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A fresh directory holding the refdata adapter under each of `names` (`NAME.gguf`).
fn adapter_dir(tag: &str, names: &[&str]) -> PathBuf {
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../testdata/refdata/lora/qwen05-qv-r8-s11.gguf");
    let dir = std::env::temp_dir().join(format!("snug-replica-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for n in names {
        std::fs::copy(&src, dir.join(format!("{n}.gguf"))).unwrap();
    }
    dir
}

fn python(args: &[&str]) {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/serve_replica.py");
    let t0 = Instant::now();
    let out = Command::new("python3").arg(script).args(args).output().expect("python3 runs");
    let (so, se) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(
        !se.contains("No module named"),
        "PyPI prometheus_client is missing (scripts/test.sh installs it)\n{se}"
    );
    assert!(out.status.success(), "serve_replica.py {args:?} failed:\n{so}\n{se}");
    eprintln!("serve_replica.py {} ({:.1} s):\n{so}", args[0], t0.elapsed().as_secs_f64());
}

#[test]
fn protocol_metrics_parse_strictly_and_follow_the_scheduler() {
    let _one = serial();
    let dir = adapter_dir("metrics", &["tuned"]);
    let mut args = COMMON.to_vec();
    args.extend(["--parallel", "1", "--lora-dir", dir.to_str().unwrap()]);
    let s = Server::start(&common::model(ALIAS), &args);
    python(&["metrics", &s.url(), "tuned"]);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn ready_is_503_until_the_model_is_loaded() {
    let _one = serial();
    let t0 = Instant::now();
    let env = [("SNUG_TEST_LOAD_DELAY_MS", "2500")];
    let mut s = Server::spawn(&common::model(ALIAS), &COMMON, &env);
    // The port answers while the model loads: alive, not ready, work refused with Retry-After.
    let mut loading = None;
    while t0.elapsed() < Duration::from_secs(20) && loading.is_none() {
        if let Ok((health, body)) = s.get("/health") {
            let (ready, _) = s.get("/ready").unwrap();
            loading = Some((health, body, ready));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let (health, body, ready) = loading.expect("the port answers while the model loads");
    assert_eq!((health, ready), (200, 503), "/health {health} {body}, /ready {ready}");
    assert!(body.contains("loading"), "{body}");
    let chat = r#"{"messages":[{"role":"user","content":"hi"}],"max_tokens":2}"#;
    let head = raw(s.port, "POST", "/v1/chat/completions", chat);
    assert!(head.starts_with("HTTP/1.1 503"), "{head}");
    assert!(head.to_ascii_lowercase().contains("retry-after: 1"), "{head}");
    s.wait_ready();
    let waited = t0.elapsed();
    assert!(waited >= Duration::from_millis(2500), "ready after {waited:?}, before the delay");
    let (status, body) = s.send("POST", "/v1/chat/completions", None, Some(chat)).unwrap();
    assert_eq!(status, 200, "{body}");
    let (status, body) = s.get("/ready").unwrap();
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"ready\""), "{body}");
}

/// The whole answer to `METHOD path` with a JSON `body`, as sent (head and body).
fn raw(port: u16, method: &str, path: &str, body: &str) -> String {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
}

#[test]
fn vllm_adapter_routes_need_the_admin_key() {
    let _one = serial();
    let dir = adapter_dir("routes", &["tuned"]);
    let mut args = COMMON.to_vec();
    let d = dir.to_str().unwrap().to_string();
    args.extend(["--lora-dir", &d, "--api-key", KEY, "--admin-key", ADMIN]);
    // --lora-dir registers its files at start: load it under another name.
    let s = Server::start(&common::model(ALIAS), &args);
    let load = r#"{"lora_name":"mine","lora_path":"tuned.gguf"}"#;
    let unload = r#"{"lora_name":"mine"}"#;
    let post =
        |key: Option<&str>, path: &str, body: &str| s.send("POST", path, key, Some(body)).unwrap();
    assert_eq!(post(None, "/v1/load_lora_adapter", load).0, 401);
    let (status, body) = post(Some(KEY), "/v1/load_lora_adapter", load);
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("admin"), "{body}");
    let (status, body) = post(Some(ADMIN), "/v1/load_lora_adapter", load);
    assert_eq!((status, body.as_str()), (200, "Success: LoRA adapter 'mine' added successfully."));
    // The syncer repeats itself: the same load again is fine.
    assert_eq!(post(Some(ADMIN), "/v1/load_lora_adapter", load).0, 200);
    // Loaded means in memory: listed as ready in the protocol metric.
    let (_, m) = s.send("GET", "/metrics", Some(KEY), None).unwrap();
    let info = m.lines().find(|l| l.starts_with("vllm:lora_requests_info{")).unwrap();
    assert!(info.contains("running_lora_adapters=\"mine\""), "{info}");
    // The bare adapter name as `model` (what a gateway sends) and BASE:NAME both run on it.
    for model in ["mine", "qwen2.5-coder-0.5b:mine"] {
        let chat = format!(
            r#"{{"model":"{model}","messages":[{{"role":"user","content":"hi"}}],"max_tokens":2}}"#
        );
        let (status, body) = post(Some(KEY), "/v1/chat/completions", &chat);
        assert_eq!(status, 200, "{model}: {body}");
    }
    // A path whose directory is --lora-dir is taken; any other directory is not.
    let by_path = format!(r#"{{"lora_name":"other","lora_path":"{d}/tuned.gguf"}}"#);
    assert_eq!(post(Some(ADMIN), "/v1/load_lora_adapter", &by_path).0, 200);
    let outside = r#"{"lora_name":"x","lora_path":"/etc/tuned.gguf"}"#;
    assert_eq!(post(Some(ADMIN), "/v1/load_lora_adapter", outside).0, 400);
    let missing = r#"{"lora_name":"x","lora_path":"nope.gguf"}"#;
    assert_eq!(post(Some(ADMIN), "/v1/load_lora_adapter", missing).0, 404);
    // Unload: the key holder may not, the admin may, once.
    assert_eq!(post(Some(KEY), "/v1/unload_lora_adapter", unload).0, 403);
    let (status, body) = post(Some(ADMIN), "/v1/unload_lora_adapter", unload);
    assert_eq!(
        (status, body.as_str()),
        (200, "Success: LoRA adapter 'mine' removed successfully.")
    );
    assert_eq!(post(Some(ADMIN), "/v1/unload_lora_adapter", unload).0, 404);
    let chat = r#"{"model":"mine","messages":[{"role":"user","content":"hi"}],"max_tokens":2}"#;
    assert_eq!(post(Some(KEY), "/v1/chat/completions", chat).0, 404);
    let _ = std::fs::remove_dir_all(dir);
}

/// A streamed request's whole answer, read on its own thread.
fn stream(port: u16, path: &'static str, body: String) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || raw(port, "POST", path, &body))
}

#[test]
fn sigterm_drains_in_flight_streams_and_exits_zero() {
    let _one = serial();
    let grace = 6.0;
    let mut args = COMMON.to_vec();
    let g = grace.to_string();
    args.extend(["--parallel", "1", "--drain-timeout", &g]);
    let mut s = Server::start(&common::model(ALIAS), &args);
    let chat = |n: usize| {
        format!(
            r#"{{"messages":[{{"role":"user","content":"Count from 1 to 500."}}],"max_tokens":{n},"temperature":0,"stream":true}}"#
        )
    };
    let ollama = r#"{"model":"qwen2.5-coder-0.5b","prompt":"Count from 1 to 500.","stream":true,"options":{"num_predict":400,"temperature":0}}"#;
    // One short request runs; a long one and an Ollama one wait behind it.
    let short = stream(s.port, "/v1/chat/completions", chat(24));
    let t0 = Instant::now();
    while !s.get("/metrics").unwrap().1.contains("vllm:num_requests_running 1") {
        assert!(t0.elapsed() < Duration::from_secs(30), "the first request never ran");
        std::thread::sleep(Duration::from_millis(20));
    }
    let long = stream(s.port, "/v1/chat/completions", chat(400));
    let nd = stream(s.port, "/api/generate", ollama.to_string());
    while !s.get("/metrics").unwrap().1.contains("vllm:num_requests_waiting 2") {
        assert!(t0.elapsed() < Duration::from_secs(30), "the others never queued");
        std::thread::sleep(Duration::from_millis(20));
    }
    let t_term = Instant::now();
    s.terminate();
    // Draining: not ready, new work refused with Retry-After; reads still answer.
    std::thread::sleep(Duration::from_millis(200));
    let (ready, _) = s.get("/ready").unwrap();
    assert_eq!(ready, 503);
    let refused = raw(s.port, "POST", "/v1/completions", r#"{"prompt":"hi","max_tokens":2}"#);
    assert!(refused.starts_with("HTTP/1.1 503"), "{refused}");
    assert!(refused.to_ascii_lowercase().contains("retry-after"), "{refused}");
    assert!(refused.contains("draining"), "{refused}");
    let (status, err) = s.wait_exit(Duration::from_secs_f64(grace + 15.0)).expect("snug exits");
    let took = t_term.elapsed();
    assert!(status.success(), "exit {status}: {err}");
    assert!(took < Duration::from_secs_f64(grace + 6.0), "took {took:?} to stop: {err}");
    assert!(err.contains("draining: ") && err.contains("grace ran out"), "{err}");
    // Every client got a whole HTTP answer (the chunked body's last chunk) and a well-formed
    // end of its stream; the short one finished, the rest were cut with "abort".
    let finish = |sse: &str| {
        let last = sse.lines().rfind(|l| l.contains("\"finish_reason\":\""))?;
        let i = last.find("\"finish_reason\":\"")? + 17;
        Some(last[i..].split('"').next()?.to_string())
    };
    let (short, long, nd) = (short.join().unwrap(), long.join().unwrap(), nd.join().unwrap());
    for (what, body) in [("short", &short), ("long", &long), ("ollama", &nd)] {
        assert!(body.starts_with("HTTP/1.1 200"), "{what}: {body}");
        assert!(body.ends_with("0\r\n\r\n"), "{what}: the chunked body did not end: {body}");
    }
    for (what, body) in [("short", &short), ("long", &long)] {
        assert!(body.contains("data: [DONE]"), "{what}: {body}");
    }
    assert_eq!(finish(&short).as_deref(), Some("length"), "{short}");
    assert_eq!(finish(&long).as_deref(), Some("abort"), "{long}");
    let last = nd.lines().rev().find(|l| l.starts_with('{')).unwrap();
    let v: serde_json::Value = serde_json::from_str(last).unwrap();
    assert_eq!(
        (v["done"].as_bool(), v["done_reason"].as_str()),
        (Some(true), Some("abort")),
        "{nd}"
    );
    eprintln!("stopped {took:?} after SIGTERM (grace {grace} s)");
}

#[test]
fn two_replicas_route_by_adapter_from_their_metrics() {
    let _one = serial();
    let (da, db) = (adapter_dir("ra", &["alpha"]), adapter_dir("rb", &["beta"]));
    let start = |d: &PathBuf| {
        let mut args = COMMON.to_vec();
        let d = d.to_str().unwrap();
        args.extend(["--parallel", "1", "--lora-dir", d, "--admin-key", ADMIN]);
        Server::start(&common::model(ALIAS), &args)
    };
    let (a, b) = (start(&da), start(&db));
    // What a gateway's adapter syncer does: load each replica's adapter.
    for (s, name) in [(&a, "alpha"), (&b, "beta")] {
        let body = format!(r#"{{"lora_name":"{name}","lora_path":"{name}.gguf"}}"#);
        let (status, text) =
            s.send("POST", "/v1/load_lora_adapter", Some(ADMIN), Some(&body)).unwrap();
        assert_eq!(status, 200, "{text}");
    }
    python(&["route", &a.url(), &b.url()]);
    let _ = (std::fs::remove_dir_all(da), std::fs::remove_dir_all(db));
}
