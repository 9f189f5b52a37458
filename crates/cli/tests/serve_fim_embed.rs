//! Fill-in-the-middle and embeddings over loopback against llama-server's own answers on
//! qwen2.5-coder-0.5b (`testdata/fim_embed/`, written by `scripts/fim-embed-refs.sh`):
//! greedy `/infill` text equal to llama-server's `/infill`; Ollama's `suffix` (and OpenAI's)
//! equal to llama-server's `/completion` on Ollama's FIM prompt; embeddings of a batch of 8
//! mixed-length inputs at cosine >= 0.999 to `llama-server --embeddings` with the same pooling
//! (mean and last), through `/v1/embeddings` (floats and base64), `/api/embed`, the legacy
//! `/api/embeddings`, the official Python clients and `snug embed`; and the 400s a model without
//! FIM tokens, an input past the context, or a bad body gets.

mod common;

use common::serve::Server;
use serde_json::{json, Value};

const ALIAS: &str = "qwen2.5-coder-0.5b";

fn refs() -> Value {
    let path =
        concat!(env!("CARGO_MANIFEST_DIR"), "/../../testdata/fim_embed/qwen2.5-coder-0.5b.json");
    serde_json::from_str(&std::fs::read_to_string(path).expect("reference file")).expect("JSON")
}

/// `POST path` with a JSON body: the status and the parsed answer.
fn post(server: &Server, path: &str, body: &Value) -> (u16, Value) {
    let (status, text) = server.send("POST", path, None, Some(&body.to_string())).expect("answer");
    let v = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}: {text}"));
    (status, v)
}

/// The server the parity tests need: llama-server's context (4096, one slot).
fn coder() -> Server {
    let model = common::model(ALIAS);
    Server::start(&model, &["--name", ALIAS, "--ctx", "4096", "--parallel", "1", "--threads", "2"])
}

#[test]
fn fill_in_the_middle_matches_llama_server_greedy() {
    let refs = refs();
    let server = coder();
    for case in refs["fim"]["infill"].as_array().unwrap() {
        let mut body = case["request"].clone();
        body["temperature"] = json!(0);
        body["n_predict"] = json!(32);
        let (status, v) = post(&server, "/infill", &body);
        assert_eq!(status, 200, "{v}");
        assert_eq!(v["content"], case["content"], "/infill on {}", case["request"]);
        assert_eq!(v["tokens_predicted"], case["tokens_predicted"]);
        assert_eq!(v["tokens_evaluated"], case["tokens_evaluated"], "the prompt's tokens");
        assert_eq!(v["stop"], json!(true));
    }
    for case in refs["fim"]["suffix"].as_array().unwrap() {
        let (prompt, suffix) = (&case["request"]["prompt"], &case["request"]["suffix"]);
        let body = json!({
            "model": ALIAS, "prompt": prompt, "suffix": suffix, "stream": false,
            "options": {"temperature": 0, "num_predict": 32},
        });
        let (status, v) = post(&server, "/api/generate", &body);
        assert_eq!(status, 200, "{v}");
        assert_eq!(v["response"], case["content"], "Ollama suffix on {}", case["request"]);
        assert_eq!(v["prompt_eval_count"], case["tokens_evaluated"], "the prompt's tokens");
        let body = json!({
            "model": ALIAS, "prompt": prompt, "suffix": suffix, "temperature": 0, "max_tokens": 32,
        });
        let (status, v) = post(&server, "/v1/completions", &body);
        assert_eq!(status, 200, "{v}");
        assert_eq!(
            v["choices"][0]["text"], case["content"],
            "OpenAI suffix on {}",
            case["request"]
        );
    }
    // Streamed: the same text in pieces, then a last record with `stop: true`.
    let case = &refs["fim"]["infill"][0];
    let mut body = case["request"].clone();
    body["temperature"] = json!(0);
    body["n_predict"] = json!(32);
    body["stream"] = json!(true);
    let (status, text) = server.send("POST", "/infill", None, Some(&body.to_string())).unwrap();
    assert_eq!(status, 200);
    let mut content = String::new();
    let mut last = Value::Null;
    for line in text.lines().filter_map(|l| l.strip_prefix("data: ")) {
        let v: Value = serde_json::from_str(line).unwrap();
        content += v["content"].as_str().unwrap();
        last = v;
    }
    assert_eq!(content, case["content"].as_str().unwrap());
    assert_eq!(last["stop"], json!(true), "{last}");
    // `/api/show` says the model can insert.
    let (_, show) = post(&server, "/api/show", &json!({"model": ALIAS}));
    let caps = show["capabilities"].as_array().unwrap();
    assert!(caps.contains(&json!("insert")) && caps.contains(&json!("completion")), "{show}");
}

#[test]
fn fill_in_the_middle_is_a_400_on_a_model_without_fim_tokens_and_on_bad_bodies() {
    let tiny = concat!(env!("CARGO_MANIFEST_DIR"), "/../../testdata/refdata/tiny/tiny-llama.gguf");
    let server = Server::start(
        std::path::Path::new(tiny),
        &["--name", "tiny", "--ctx", "256", "--threads", "1"],
    );
    let cases = [
        ("/infill", json!({"input_prefix": "a", "input_suffix": "b"}), "input_suffix"),
        ("/api/generate", json!({"prompt": "a", "suffix": "b", "stream": false}), "suffix"),
        ("/v1/completions", json!({"prompt": "a", "suffix": "b"}), "suffix"),
    ];
    for (path, body, field) in cases {
        let (status, v) = post(&server, path, &body);
        assert_eq!(status, 400, "{path}: {v}");
        let msg =
            v["error"].as_str().map_or_else(|| v["error"]["message"].to_string(), String::from);
        assert!(msg.contains("cannot fill in the middle") && msg.contains(field), "{path}: {msg}");
    }
    let (_, show) = post(&server, "/api/show", &json!({"model": "tiny"}));
    assert!(!show["capabilities"].as_array().unwrap().contains(&json!("insert")), "{show}");
    // Bad bodies name the field.
    let (status, v) = post(&server, "/infill", &json!({"input_prefix": "a"}));
    assert_eq!(status, 400);
    assert!(v["error"]["message"].as_str().unwrap().contains("input_suffix"), "{v}");
    let body = json!({"prompt": "a", "suffix": "b", "raw": true, "stream": false});
    let (status, v) = post(&server, "/api/generate", &body);
    assert_eq!(status, 400);
    assert!(v["error"].as_str().unwrap().contains("raw"), "{v}");
}

fn cosine(a: &[f32], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len(), "vector widths");
    let dot: f64 = a.iter().zip(b).map(|(&x, &y)| f64::from(x) * y).sum();
    let na: f64 = a.iter().map(|&x| f64::from(x).powi(2)).sum::<f64>().sqrt();
    let nb: f64 = b.iter().map(|y| y * y).sum::<f64>().sqrt();
    dot / (na * nb)
}

fn floats(v: &Value) -> Vec<f32> {
    v.as_array().expect("a vector").iter().map(|x| x.as_f64().unwrap() as f32).collect()
}

fn norm(v: &[f32]) -> f64 {
    v.iter().map(|&x| f64::from(x).powi(2)).sum::<f64>().sqrt()
}

/// Little-endian f32s from base64 (RFC 4648).
fn unbase64(s: &str) -> Vec<f32> {
    let val = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        _ => 63,
    };
    let mut bytes = Vec::new();
    for q in s.as_bytes().chunks(4) {
        let n =
            q.iter().take_while(|&&c| c != b'=').fold(0u32, |a, &c| (a << 6) | u32::from(val(c)));
        let k = q.iter().take_while(|&&c| c != b'=').count();
        let n = n << (6 * (4 - k));
        bytes.extend_from_slice(&n.to_be_bytes()[1..k]);
    }
    bytes.chunks(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect()
}

#[test]
fn embeddings_match_llama_server_with_mean_and_last_pooling() {
    let refs = refs();
    let model = common::model(ALIAS);
    let mut all = Vec::new();
    for pooling in ["mean", "last"] {
        let r = &refs["embeddings"][pooling];
        let inputs = r["inputs"].clone();
        let server = Server::start(
            &model,
            &[
                "--name",
                ALIAS,
                "--ctx",
                "4096",
                "--parallel",
                "2",
                "--threads",
                "2",
                "--pooling",
                pooling,
            ],
        );
        let (status, v) =
            post(&server, "/v1/embeddings", &json!({"model": ALIAS, "input": inputs}));
        assert_eq!(status, 200, "{v}");
        assert_eq!(v["usage"]["prompt_tokens"], r["prompt_tokens"], "the inputs' tokens");
        let data = v["data"].as_array().unwrap();
        assert_eq!(data.len(), 8);
        let mut cos = Vec::new();
        for (i, d) in data.iter().enumerate() {
            assert_eq!(d["index"], json!(i));
            let got = floats(&d["embedding"]);
            assert!((norm(&got) - 1.0).abs() < 1e-4, "L2-normalised");
            let want: Vec<f64> =
                r["vectors"][i].as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect();
            let c = cosine(&got, &want);
            assert!(c >= 0.999, "{pooling} input {i}: cosine {c} to llama-server's");
            cos.push(c);
        }
        println!("{pooling}: cosines to llama-server {cos:?}");
        all.extend(cos);
        // Each input alone gives its vector from the batch (its own sequence, no cross-talk).
        let alone = post(&server, "/v1/embeddings", &json!({"input": inputs[3]})).1;
        let a = floats(&alone["data"][0]["embedding"]);
        let b: Vec<f64> = floats(&data[3]["embedding"]).iter().map(|&x| f64::from(x)).collect();
        assert!(cosine(&a, &b) > 0.99999, "input 3 alone and in the batch");
        // base64 is the same floats.
        let body = json!({"input": inputs, "encoding_format": "base64"});
        let v64 = post(&server, "/v1/embeddings", &body).1;
        for (i, d) in v64["data"].as_array().unwrap().iter().enumerate() {
            assert_eq!(unbase64(d["embedding"].as_str().unwrap()), floats(&data[i]["embedding"]));
        }
        // Ollama's /api/embed: the same vectors; `dimensions` keeps a normalised prefix.
        let (status, o) = post(&server, "/api/embed", &json!({"model": ALIAS, "input": inputs}));
        assert_eq!(status, 200, "{o}");
        assert_eq!(o["prompt_eval_count"], r["prompt_tokens"]);
        for (i, e) in o["embeddings"].as_array().unwrap().iter().enumerate() {
            assert_eq!(floats(e), floats(&data[i]["embedding"]), "/api/embed input {i}");
        }
        let body = json!({"input": inputs[1], "dimensions": 64});
        let cut = floats(&post(&server, "/api/embed", &body).1["embeddings"][0]);
        assert_eq!(cut.len(), 64);
        let full = floats(&data[1]["embedding"]);
        let n = norm(&full[..64]) as f32;
        for (x, y) in cut.iter().zip(&full[..64]) {
            assert!((x - y / n).abs() < 1e-5, "dimensions: the renormalised prefix");
        }
        // The legacy route: one vector, not normalised, in the same direction.
        let (status, l) =
            post(&server, "/api/embeddings", &json!({"model": ALIAS, "prompt": inputs[0]}));
        assert_eq!(status, 200, "{l}");
        let raw = floats(&l["embedding"]);
        let want: Vec<f64> = floats(&data[0]["embedding"]).iter().map(|&x| f64::from(x)).collect();
        assert!(cosine(&raw, &want) > 0.99999 && (norm(&raw) - 1.0).abs() > 1e-3, "legacy: raw");
        let (status, e) =
            post(&server, "/v1/embeddings", &json!({"input": "a", "dimensions": 100000}));
        assert_eq!(status, 400);
        assert!(e["error"]["message"].as_str().unwrap().contains("dimensions"), "{e}");
        if pooling == "mean" {
            python_clients(&server, &inputs, data);
            cli_embed(&model, &inputs[2], &r["vectors"][2]);
        }
    }
    all.sort_by(f64::total_cmp);
    println!("cosines: min {:.6}, median {:.6}", all[0], all[all.len() / 2]);
}

/// The official clients: `ollama.embed()` and `openai` `embeddings.create()` get the vectors.
fn python_clients(server: &Server, inputs: &Value, data: &[Value]) {
    let expected: Vec<Value> = data.iter().map(|d| d["embedding"].clone()).collect();
    let dir = std::env::temp_dir().join(format!("snug-embed-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("expected.json");
    std::fs::write(&file, json!({"inputs": inputs, "vectors": expected}).to_string()).unwrap();
    let file = file.to_str().unwrap();
    common::python(
        "serve_embed_clients.py",
        &[server.url().as_str(), ALIAS, file],
        "openai ollama",
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// `snug embed MODEL TEXT` prints the vector as a JSON array, as the server pools it.
fn cli_embed(model: &std::path::Path, text: &Value, want: &Value) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_snug"))
        .arg("embed")
        .arg(model)
        .arg(text.as_str().unwrap())
        .args(["--pooling", "mean", "--threads", "2"])
        .output()
        .expect("snug runs");
    assert!(out.status.success(), "snug embed: {}", String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).expect("a JSON array");
    let got = floats(&v);
    let want: Vec<f64> = want.as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect();
    let c = cosine(&got, &want);
    assert!(c >= 0.999 && (norm(&got) - 1.0).abs() < 1e-4, "snug embed: cosine {c}");
}

#[test]
fn an_input_past_the_context_is_a_400_unless_truncated() {
    let tiny = concat!(env!("CARGO_MANIFEST_DIR"), "/../../testdata/refdata/tiny/tiny-llama.gguf");
    let server = Server::start(
        std::path::Path::new(tiny),
        &["--name", "tiny", "--ctx", "64", "--threads", "1"],
    );
    let long = "a b c d e f g h ".repeat(40);
    let (status, v) = post(&server, "/v1/embeddings", &json!({"input": ["short", long]}));
    assert_eq!(status, 400, "{v}");
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(msg.contains("input[1]") && msg.contains("tokens"), "{msg}");
    let (status, v) = post(&server, "/api/embed", &json!({"input": long, "truncate": false}));
    assert_eq!(status, 400, "{v}");
    assert!(v["error"].as_str().unwrap().contains("truncate"), "{v}");
    let (status, v) = post(&server, "/api/embed", &json!({"input": [long, "short"]}));
    assert_eq!(status, 200, "Ollama truncates by default: {v}");
    assert_eq!(v["embeddings"].as_array().unwrap().len(), 2);
    assert_eq!(
        v["prompt_eval_count"].as_u64().unwrap(),
        63 + post(&server, "/api/embed", &json!({"input": "short"})).1["prompt_eval_count"]
            .as_u64()
            .unwrap()
    );
    for (path, body, field) in [
        ("/v1/embeddings", json!({"input": [1, "a"]}), "input"),
        ("/v1/embeddings", json!({"input": "a", "encoding_format": "hex"}), "encoding_format"),
        ("/v1/embeddings", json!({"input": [[99999999]]}), "vocabulary"),
        ("/v1/embeddings", json!({"input": [[]]}), "input[0] is empty"),
        ("/api/embeddings", json!({}), "prompt"),
    ] {
        let (status, v) = post(&server, path, &body);
        assert_eq!(status, 400, "{path} {body}: {v}");
        let msg =
            v["error"].as_str().map_or_else(|| v["error"]["message"].to_string(), String::from);
        assert!(msg.contains(field), "{path} {body}: {msg}");
    }
}
