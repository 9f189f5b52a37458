//! Fuzz the whole server in process: structured requests go through the real router (`guard`
//! with its Host, Origin, content-type and admin checks, the handlers, request decoding and
//! bounds) to the real scheduler, generating on the tiny qwen2 model
//! (`../shared/refdata/tiny/tiny-qwen2.gguf`, or `SNUG_FUZZ_MODEL`), two sequences, a queue of
//! two, a context of 128.
//!
//! An input is a request: a route, a few headers picked from a dictionary (Host, Origin,
//! Content-Type, Authorization, Expect), and a body that is either raw bytes or a JSON object
//! built from the fields the routes read (and a few they do not), with values that are huge,
//! negative, fractional, deeply nested, long lists or strings full of control-token texts.
//!
//! Oracle, after every input:
//! - the fuzzed request ends (its whole body is read) within 20 s, and its status is not a 5xx
//!   (a 503 is allowed only with `Retry-After`: a full queue);
//! - the next plain request (a 2-token greedy completion) is answered 200 within 10 s with
//!   text, and `GET /health` is 200: no request stops, stalls or corrupts service for others.

#![no_main]

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::Router;
use libfuzzer_sys::arbitrary::{self, Arbitrary};
use libfuzzer_sys::fuzz_target;
use model::{ContextParams, Model};
use serde_json::{json, Map, Value};
use tokenizer::Tokenizer;
use tower::ServiceExt;

const ROUTES: [(&str, &str); 23] = [
    ("POST", "/v1/chat/completions"),
    ("POST", "/v1/messages"),
    ("POST", "/v1/messages/count_tokens"),
    ("POST", "/v1/responses"),
    ("POST", "/v1/completions"),
    ("POST", "/v1/embeddings"),
    ("POST", "/api/embed"),
    ("POST", "/api/embeddings"),
    ("POST", "/infill"),
    ("POST", "/api/chat"),
    ("POST", "/api/generate"),
    ("POST", "/api/show"),
    ("POST", "/api/pull"),
    ("POST", "/v1/adapters"),
    ("DELETE", "/v1/adapters/x"),
    ("POST", "/lora-adapters"),
    ("GET", "/lora-adapters"),
    ("GET", "/v1/models"),
    ("GET", "/api/tags"),
    ("GET", "/api/ps"),
    ("GET", "/metrics"),
    ("GET", "/ui/memory"),
    ("POST", "/"),
];

/// Field names the routes read, top level and under Ollama's `options`, plus unknown ones.
const FIELDS: [&str; 67] = [
    "model",
    "prompt",
    "messages",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "stop",
    "stream",
    "stream_options",
    "logprobs",
    "top_logprobs",
    "n",
    "best_of",
    "echo",
    "suffix",
    "logit_bias",
    "presence_penalty",
    "frequency_penalty",
    "response_format",
    "tools",
    "tool_choice",
    "lora",
    "user",
    "format",
    "options",
    "raw",
    "system",
    "template",
    "context",
    "images",
    "keep_alive",
    "num_predict",
    "num_ctx",
    "repeat_last_n",
    "repeat_penalty",
    "mirostat",
    "typical_p",
    "tfs_z",
    "name",
    "file",
    "role",
    "content",
    "id",
    "scale",
    "input",
    "instructions",
    "max_output_tokens",
    "stop_sequences",
    "thinking",
    "text",
    "store",
    "previous_response_id",
    "tool_calls",
    "tool_call_id",
    "reasoning_content",
    "function",
    "arguments",
    "description",
    "parameters",
    "dimensions",
    "encoding_format",
    "input_prefix",
    "input_suffix",
];

/// Strings with meaning somewhere: control-token texts, template markup, names, schemas' words.
const WORDS: [&str; 19] = [
    "<|im_start|>",
    "<|im_end|>",
    "system",
    "user",
    "assistant",
    "hi",
    "json_object",
    "json_schema",
    "$ref",
    "#/$defs/a",
    "anyOf",
    "qwen2.5-coder-0.5b",
    "tiny:x",
    "../x.gguf",
    "\u{0}",
    "<|endoftext|>",
    "function",
    "tool",
    "<tool_call>",
];

#[derive(Arbitrary, Debug)]
enum Val {
    Int(i64),
    Big(u64),
    Float(f64),
    Bool(bool),
    Null,
    Word(u8),
    Text(String),
    /// The same value `n` times.
    List(u16, Box<Val>),
    Obj(Vec<(u8, Val)>),
    /// `depth` nested arrays around a value.
    Deep(u16, Box<Val>),
    /// A word repeated `n` times.
    Repeat(u16, u8),
}

#[derive(Arbitrary, Debug)]
enum BodyIn {
    Raw(Vec<u8>),
    Fields(Vec<(u8, Val)>),
}

#[derive(Arbitrary, Debug)]
struct Input {
    route: u8,
    headers: Vec<(u8, u8)>,
    body: BodyIn,
}

fn value(v: &Val, budget: &mut usize) -> Value {
    // Every value costs one unit; a body is at most ~64k values (about the server's body size).
    if *budget == 0 {
        return Value::Null;
    }
    *budget -= 1;
    match v {
        Val::Int(i) => json!(i),
        Val::Big(u) => json!(u),
        Val::Float(f) => serde_json::Number::from_f64(*f).map_or(Value::Null, Value::Number),
        Val::Bool(b) => json!(b),
        Val::Null => Value::Null,
        Val::Word(w) => json!(WORDS[*w as usize % WORDS.len()]),
        Val::Text(s) => json!(s),
        Val::List(n, v) => {
            // Each copy costs as many units as the value copied, so a list of lists stays
            // within the budget (the body, not the harness, is what is being fuzzed).
            let before = *budget;
            let one = value(v, budget);
            let cost = (before - *budget).max(1);
            let n = (*n as usize).min(*budget / cost);
            *budget -= n * cost;
            Value::Array(vec![one; n])
        }
        Val::Obj(fields) => Value::Object(object(fields, budget)),
        Val::Deep(depth, v) => {
            // Each level costs a unit too: uncharged, a list of copies of a 200-deep value made
            // bodies of 10-17 MB and a harness of 750 MB (the 1,735 MB "growth" of issue 52's
            // long run), all of it before the server refused the body with a 413.
            let mut out = value(v, budget);
            let levels = (*depth as usize).min(*budget).min(200);
            *budget -= levels;
            for _ in 0..levels {
                out = Value::Array(vec![out]);
            }
            out
        }
        Val::Repeat(n, w) => {
            // A long string costs a unit per 16 bytes, so a list of copies of it stays within
            // the budget too (its second run ran the harness out of memory on 65,535 copies of
            // an 850 KB string, before any request was sent).
            let word = WORDS[*w as usize % WORDS.len()];
            let n = (*n as usize).min(*budget * 16 / word.len().max(1));
            *budget -= n * word.len() / 16;
            json!(word.repeat(n))
        }
    }
}

fn object(fields: &[(u8, Val)], budget: &mut usize) -> Map<String, Value> {
    fields
        .iter()
        .map(|(k, v)| (FIELDS[*k as usize % FIELDS.len()].to_string(), value(v, budget)))
        .collect()
}

fn header(pick: u8, choice: u8) -> (&'static str, &'static str) {
    const HOSTS: [&str; 4] = ["127.0.0.1", "localhost:8080", "attacker.example", "[::1]:1"];
    const ORIGINS: [&str; 3] = ["http://127.0.0.1", "http://attacker.example", "null"];
    const TYPES: [&str; 4] =
        ["application/json", "text/plain", "application/json; charset=utf-8", "multipart/x"];
    const AUTH: [&str; 3] = ["Bearer k", "bearer ", "Basic eA=="];
    match pick % 5 {
        0 => ("host", HOSTS[choice as usize % HOSTS.len()]),
        1 => ("origin", ORIGINS[choice as usize % ORIGINS.len()]),
        2 => ("content-type", TYPES[choice as usize % TYPES.len()]),
        3 => ("authorization", AUTH[choice as usize % AUTH.len()]),
        _ => ("expect", "100-continue"),
    }
}

struct Server {
    rt: tokio::runtime::Runtime,
    app: Router,
}

fn server() -> &'static Server {
    static S: OnceLock<Server> = OnceLock::new();
    S.get_or_init(|| {
        let path = std::env::var_os("SNUG_FUZZ_MODEL").map(PathBuf::from).unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("../../shared/refdata/tiny/tiny-qwen2.gguf")
        });
        let model =
            Arc::new(Model::load(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display())));
        let tok = Arc::new(Tokenizer::from_gguf(&model.file).expect("its tokenizer loads"));
        let params = ContextParams {
            n_ctx: 256,
            n_seq_max: 2,
            // Two slots and the guesses speculative decoding may verify beside them.
            n_outputs_max: 2 + engine::draft::MAX_DRAFT,
            n_threads: 1,
            ..ContextParams::default()
        };
        let opts = server::ServeOptions {
            host: "127.0.0.1".into(),
            port: 0,
            api_key: None,
            admin_key: None,
            allow_admin: false,
            allowed_origins: Vec::new(),
            limits: Default::default(),
            max_body: 1 << 20,
            queue: 2,
            prefill_chunk: None,
            draft: true,
            name: "tiny".into(),
            budget: 1 << 30,
            lora_dir: None,
            loras: Vec::new(),
            adapter_budget: 1 << 20,
            plan: Default::default(),
            max_loras: 4,
            drain_timeout: std::time::Duration::from_secs(30),
            pooling: None,
            chat_template: None,
            prefix_disk: None,
        };
        let state = server::open(model, tok, &path, params, &opts, |_, _| Ok(()))
            .expect("the server opens");
        let access = server::access::Access::new(None, None, false, "127.0.0.1", true, &[]);
        let state = Arc::new(server::AppState { access, ..state });
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a runtime");
        Server { rt, app: server::router(state, opts.max_body) }
    })
}

/// Sends a request and reads its whole body; `None` if that takes longer than `limit`.
async fn send(
    app: &Router,
    req: Request<Body>,
    limit: Duration,
) -> Option<(StatusCode, bool, Vec<u8>)> {
    tokio::time::timeout(limit, async {
        let resp = app.clone().oneshot(req).await.expect("the router is infallible");
        let status = resp.status();
        let retry = resp.headers().contains_key("retry-after");
        let body = axum::body::to_bytes(resp.into_body(), 64 << 20).await.unwrap_or_default();
        (status, retry, body.to_vec())
    })
    .await
    .ok()
}

fn plain() -> Request<Body> {
    Request::post("/v1/completions")
        .header("host", "127.0.0.1")
        .header("content-type", "application/json")
        .body(Body::from(r#"{"prompt":"hi","max_tokens":2,"temperature":0}"#))
        .expect("a request")
}

fuzz_target!(|input: Input| {
    let s = server();
    let (method, path) = ROUTES[input.route as usize % ROUTES.len()];
    let mut req = Request::builder().method(method).uri(path);
    let mut has_host = false;
    let mut has_type = false;
    for (pick, choice) in input.headers.iter().take(6) {
        let (k, v) = header(*pick, *choice);
        has_host |= k == "host";
        has_type |= k == "content-type";
        req = req.header(k, v);
    }
    if !has_host {
        req = req.header("host", "127.0.0.1");
    }
    if !has_type {
        req = req.header("content-type", "application/json");
    }
    let body = match &input.body {
        BodyIn::Raw(b) => b.clone(),
        BodyIn::Fields(f) => serde_json::to_vec(&object(f, &mut 65_536)).expect("JSON encodes"),
    };
    if std::env::var_os("SNUG_FUZZ_SHOW").is_some() {
        // Replaying one input by hand: what it sends.
        let head = String::from_utf8_lossy(&body[..body.len().min(600)]).into_owned();
        eprintln!("{method} {path}: {} bytes: {head}", body.len());
    }
    let req = req.body(Body::from(body)).expect("a request");
    s.rt.block_on(async {
        let (status, retry, body) = send(&s.app, req, Duration::from_secs(20))
            .await
            .unwrap_or_else(|| panic!("{method} {path} did not end within 20 s"));
        let text = String::from_utf8_lossy(&body[..body.len().min(300)]).into_owned();
        assert!(
            !status.is_server_error() || (status == StatusCode::SERVICE_UNAVAILABLE && retry),
            "{method} {path}: {status} {text}"
        );
        let (status, _, body) = send(&s.app, plain(), Duration::from_secs(10))
            .await
            .expect("the next plain request is answered within 10 s");
        let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        assert_eq!(status, StatusCode::OK, "the next plain request: {v}");
        assert!(v["choices"][0]["text"].is_string(), "the next plain request: {v}");
        let health = Request::get("/health").header("host", "127.0.0.1").body(Body::empty());
        let (status, _, _) = send(&s.app, health.expect("a request"), Duration::from_secs(5))
            .await
            .expect("/health answers within 5 s");
        assert_eq!(status, StatusCode::OK, "/health after {method} {path}");
    });
});
