//! `snug serve` with LoRA adapters, on qwen2.5-coder-0.5b with two adapters: the real one in
//! `testdata/refdata/lora` (rank 8 on q and v) and one written here (rank 4 on q, v and up).
//!
//! - A request on `BASE:ADAPTER` answers what `snug run --lora ADAPTER` answers (greedy), which
//!   differs from the base's; the same through llama-server's `lora: [{id, scale}]` field, and
//!   through the PyPI `openai` client (`serve_lora_client.py`).
//! - Requests on different adapters and on none, at once, each answer what they answer alone.
//! - Adapters are listed (`/v1/models`, `/api/tags`, `/v1/adapters`, `/lora-adapters`), added
//!   from `--lora-dir` and removed over HTTP (one in use finishes its request), behind the API
//!   key; file names that leave the directory are refused; unknown adapters are 404s naming
//!   them, malformed `lora` lists 400s; `POST /lora-adapters` changes the default scales.
//! - `snug serve --lora FILE` applies FILE to requests that name no adapter.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::serve::Server;
use serde_json::{json, Value};

const SNUG: &str = env!("CARGO_BIN_EXE_snug");
const ALIAS: &str = "qwen2.5-coder-0.5b";
const KEY: &str = "lora-key";
const PROMPT: &str = "Write a haiku about the sea.";
const N: usize = 20;
const COMMON: [&str; 6] = ["--ctx", "512", "--threads", "2", "--name", ALIAS];

fn refdata_adapter() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../testdata/refdata/lora/qwen05-qv-r8-s11.gguf")
}

/// A directory with `qv.gguf` (the refdata adapter) and `mine.gguf` (written here: rank 4 on
/// q, v and up of every layer, f32, seeded values), plus `sub/` and a symlink leaving it.
fn adapter_dir(tag: &str) -> PathBuf {
    let root = std::env::temp_dir().join(format!("snug-serve-lora-{tag}-{}", std::process::id()));
    let dir = root.join("loras");
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(dir.join("sub")).unwrap();
    std::fs::copy(refdata_adapter(), dir.join("qv.gguf")).unwrap();
    std::fs::copy(refdata_adapter(), root.join("outside.gguf")).unwrap();
    std::os::unix::fs::symlink(root.join("outside.gguf"), dir.join("escape.gguf")).unwrap();
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut rnd = |scale: f32| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        ((seed >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
    };
    let rank = 4;
    let mut tensors = Vec::new();
    for il in 0..24 {
        for (m, n_in, n_out) in [("attn_q", 896, 896), ("attn_v", 896, 128), ("ffn_up", 896, 4864)]
        {
            let a = (0..rank * n_in).map(|_| rnd(0.06)).collect();
            let b = (0..n_out * rank).map(|_| rnd(0.05)).collect();
            tensors.push(model::lora::AdapterTensor {
                weight: format!("blk.{il}.{m}.weight"),
                ty: gguf::GgmlType::F32,
                rank,
                a,
                b,
            });
        }
    }
    let f = std::fs::File::create(dir.join("mine.gguf")).unwrap();
    model::lora::write_adapter(std::io::BufWriter::new(f), "qwen2", 8.0, &tensors).unwrap();
    dir
}

/// `snug run MODEL PROMPT` greedy (the prompt as one user message), with `extra` flags.
fn snug_run(model: &Path, extra: &[&str]) -> String {
    let out = Command::new(SNUG)
        .arg("run")
        .arg(model)
        .args(["--temp", "0", "-n", &N.to_string(), "--ctx", "512", "--threads", "2"])
        .args(extra)
        .arg(PROMPT)
        .output()
        .expect("snug runs");
    assert!(out.status.success(), "snug run failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// A greedy chat answer to PROMPT with `extra` fields in the body.
fn chat(s: &Server, extra: Value) -> (u16, Value) {
    let mut body = json!({
        "messages": [{"role": "user", "content": PROMPT}],
        "temperature": 0, "max_tokens": N,
    });
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    let (status, text) =
        s.send("POST", "/v1/chat/completions", Some(KEY), Some(&body.to_string())).unwrap();
    (status, serde_json::from_str(&text).unwrap_or(Value::String(text)))
}

fn answer(s: &Server, extra: Value) -> String {
    let (status, v) = chat(s, extra);
    assert_eq!(status, 200, "{v}");
    v["choices"][0]["message"]["content"].as_str().unwrap().trim().to_string()
}

/// The twenty most likely first answer tokens with their log-probabilities, ordered by token
/// text (so two answers compare entry by entry).
fn first_token_logprobs(s: &Server, extra: Value) -> Vec<(String, f64)> {
    let mut body = extra;
    body["logprobs"] = json!(true);
    body["top_logprobs"] = json!(20);
    let (status, v) = chat(s, body);
    assert_eq!(status, 200, "{v}");
    let top = v["choices"][0]["logprobs"]["content"][0]["top_logprobs"].as_array().unwrap().clone();
    let mut by_token: Vec<(String, f64)> = top
        .iter()
        .map(|t| (t["token"].as_str().unwrap().to_string(), t["logprob"].as_f64().unwrap()))
        .collect();
    by_token.sort_by(|a, b| a.0.cmp(&b.0));
    by_token
}

fn model(adapter: &str) -> Value {
    json!({ "model": format!("{ALIAS}:{adapter}") })
}

fn get_json(s: &Server, path: &str) -> Value {
    let (status, text) = s.send("GET", path, Some(KEY), None).unwrap();
    assert_eq!(status, 200, "{path}: {text}");
    serde_json::from_str(&text).unwrap()
}

fn error_message(v: &Value) -> String {
    match &v["error"] {
        Value::String(s) => s.clone(),
        e => e["message"].as_str().unwrap_or_default().to_string(),
    }
}

#[test]
fn adapter_answers_equal_snug_run_alone_and_in_a_mixed_batch() {
    let base_model = common::model(ALIAS);
    let dir = adapter_dir("answers");
    let (qv, mine) = (dir.join("qv.gguf"), dir.join("mine.gguf"));
    let run_base = snug_run(&base_model, &[]);
    let run_qv = snug_run(&base_model, &["--lora", qv.to_str().unwrap()]);
    let run_mine = snug_run(&base_model, &["--lora", mine.to_str().unwrap()]);
    assert_ne!(run_qv, run_base, "the adapter changes the greedy answer");
    assert_ne!(run_mine, run_base, "the adapter changes the greedy answer");

    let dir_arg = dir.to_str().unwrap();
    let mut args = vec!["--lora-dir", dir_arg, "--parallel", "5", "--api-key", KEY];
    args.extend(COMMON);
    let s = Server::start(&base_model, &args);

    let alone_base = answer(&s, json!({ "model": ALIAS }));
    let alone_qv = answer(&s, model("qv"));
    let alone_mine = answer(&s, model("mine"));
    assert_eq!(alone_base, run_base, "the base model's answer is snug run's");
    assert_eq!(alone_qv, run_qv, "BASE:qv answers what snug run --lora qv.gguf answers");
    assert_eq!(alone_mine, run_mine, "BASE:mine answers what snug run --lora mine.gguf answers");
    let (_, v) = chat(&s, model("qv"));
    assert_eq!(v["model"], format!("{ALIAS}:qv"), "the answer names the model asked for");

    // llama-server's form: ids index GET /lora-adapters (by name: mine = 0, qv = 1).
    let ids = get_json(&s, "/lora-adapters");
    assert_eq!(ids[0]["id"], 0);
    assert_eq!(ids[0]["name"], "mine");
    assert_eq!(ids[1]["path"], "qv.gguf");
    assert_eq!(ids[1]["scale"], 0.0);
    assert_eq!(answer(&s, json!({"lora": [{"id": 1, "scale": 1.0}]})), run_qv);
    assert_eq!(answer(&s, json!({"lora": [{"id": 0, "scale": 0.0}]})), run_base);

    // Four adapter sets and none, all at once (one batch), twice over: every answer is its
    // alone answer.
    let sets = [
        json!({ "model": ALIAS }),
        model("qv"),
        model("mine"),
        json!({"lora": [{"id": 1, "scale": 0.5}]}),
        json!({"lora": [{"id": 0, "scale": 2.0}, {"id": 1, "scale": 1.0}]}),
    ];
    let alone: Vec<String> = sets.iter().map(|b| answer(&s, b.clone())).collect();
    assert_eq!(alone[..3], [alone_base.clone(), alone_qv.clone(), alone_mine.clone()]);
    // Each set gives the model a different distribution at the first answer token. Two sets may
    // still share a greedy text (a tiny model on one prompt often does, and which ones do
    // depends on the kernels' summation order), so the check is on the distribution itself.
    let first: Vec<_> = sets.iter().map(|b| first_token_logprobs(&s, b.clone())).collect();
    for (i, a) in first.iter().enumerate() {
        for (j, b) in first[..i].iter().enumerate() {
            let same = a.len() == b.len()
                && a.iter().zip(b).all(|(x, y)| x.0 == y.0 && (x.1 - y.1).abs() <= 1e-3);
            assert!(!same, "sets {j} and {i} give the same first-token distribution: {a:?}");
        }
    }
    let url_s = &s;
    for _ in 0..2 {
        let together: Vec<String> = std::thread::scope(|sc| {
            let jobs: Vec<_> =
                sets.iter().map(|b| sc.spawn(move || answer(url_s, b.clone()))).collect();
            jobs.into_iter().map(|j| j.join().unwrap()).collect()
        });
        assert_eq!(together, alone, "requests in one batch answer as alone");
    }

    // Ollama's route takes BASE:ADAPTER too.
    let body = json!({"model": format!("{ALIAS}:qv"), "messages": [{"role": "user", "content": PROMPT}],
        "stream": false, "options": {"temperature": 0, "num_predict": N}});
    let (status, text) = s.send("POST", "/api/chat", Some(KEY), Some(&body.to_string())).unwrap();
    assert_eq!(status, 200, "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["message"]["content"].as_str().unwrap().trim(), run_qv);

    // The official OpenAI client, model="BASE:qv".
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/serve_lora_client.py");
    let out = Command::new("python3")
        .arg(script)
        .args([&format!("{}/v1", s.url()), KEY, ALIAS, "qv", PROMPT, &N.to_string(), &run_qv])
        .output()
        .expect("python3 runs");
    let (so, se) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(
        !se.contains("No module named"),
        "PyPI openai is missing (scripts/test.sh installs it)\n{se}"
    );
    assert!(out.status.success(), "the openai client script failed:\n{so}\n{se}");

    // Adapter metrics.
    let (_, metrics) = s.send("GET", "/metrics", Some(KEY), None).unwrap();
    for line in [
        "snug_adapter_requests_by_name_total{adapter=\"qv\"}",
        "snug_adapter_acquires_by_tier_total{tier=\"cold\"}",
        "snug_adapter_promotions_total",
        "snug_pool_pages{content=\"adapter\"}",
        "snug_pool_utilisation",
        "snug_pool_allocation_seconds_bucket{le=\"+Inf\"}",
        "snug_pool_allocation_seconds_sum",
        "# TYPE snug_pool_allocation_seconds histogram",
    ] {
        assert!(metrics.contains(line), "/metrics has {line}:\n{metrics}");
    }
    // A histogram's buckets are cumulative: they never decrease and +Inf is the count.
    let value = |line: &str| line.rsplit(' ').next().unwrap().parse::<f64>().unwrap();
    let buckets: Vec<f64> = metrics
        .lines()
        .filter(|l| l.starts_with("snug_pool_allocation_seconds_bucket"))
        .map(value)
        .collect();
    let count = metrics
        .lines()
        .find(|l| l.starts_with("snug_pool_allocation_seconds_count"))
        .map(value)
        .expect("the histogram has a count");
    assert!(count > 0.0, "no allocation was timed:\n{metrics}");
    assert!(buckets.windows(2).all(|w| w[0] <= w[1]), "buckets decrease: {buckets:?}");
    assert_eq!(buckets.last().copied(), Some(count), "+Inf bucket is not the count: {buckets:?}");
    let _ = std::fs::remove_dir_all(dir.parent().unwrap());
}

#[test]
fn adapters_are_listed_added_removed_and_confined_over_http() {
    let base_model = common::model(ALIAS);
    let dir = adapter_dir("routes");
    let dir_arg = dir.to_str().unwrap();
    // --allow-admin: key holders may add and remove adapters and set default scales.
    let mut args =
        vec!["--lora-dir", dir_arg, "--parallel", "2", "--api-key", KEY, "--allow-admin"];
    args.extend(COMMON);
    let s = Server::start(&base_model, &args);

    let ids = |v: &Value, list: &str, key: &str| -> Vec<String> {
        v[list].as_array().unwrap().iter().map(|m| m[key].as_str().unwrap().to_string()).collect()
    };
    let models = get_json(&s, "/v1/models");
    assert_eq!(
        ids(&models, "data", "id"),
        [ALIAS.to_string(), format!("{ALIAS}:mine"), format!("{ALIAS}:qv")]
    );
    let tags = get_json(&s, "/api/tags");
    assert_eq!(ids(&tags, "models", "name"), ids(&models, "data", "id"));
    let listed = get_json(&s, "/v1/adapters");
    assert_eq!(listed["data"][1]["rank"], 8);
    assert_eq!(listed["data"][1]["tier"], "cold");

    // The API key guards the new routes.
    assert_eq!(s.send("GET", "/v1/adapters", None, None).unwrap().0, 401);
    assert_eq!(s.send("DELETE", "/v1/adapters/qv", None, None).unwrap().0, 401);
    assert_eq!(s.send("GET", "/lora-adapters", None, None).unwrap().0, 401);

    // Adding: a file of the directory under a new name; a name in use is a conflict.
    let add = |body: Value| {
        let (st, text) =
            s.send("POST", "/v1/adapters", Some(KEY), Some(&body.to_string())).unwrap();
        (st, serde_json::from_str::<Value>(&text).unwrap_or(Value::String(text)))
    };
    let (st, v) = add(json!({"name": "extra", "file": "qv.gguf"}));
    assert_eq!(st, 201, "{v}");
    assert_eq!(
        (v["model"].as_str(), v["tier"].as_str()),
        (Some(&*format!("{ALIAS}:extra")), Some("cold"))
    );
    assert_eq!(add(json!({"name": "extra", "file": "mine.gguf"})).0, 409);
    assert_eq!(add(json!({"file": "qv.gguf"})).0, 409, "the default name is the stem, in use");
    let (base, extra) = (answer(&s, json!({})), answer(&s, model("extra")));
    assert_eq!(extra, answer(&s, model("qv")), "the same file answers the same");
    assert_ne!(extra, base);

    // Confinement: no path reaches the filesystem but a file name of the directory.
    for file in
        ["../outside.gguf", "/etc/passwd", "sub/../qv.gguf", "..", "escape.gguf", "a\\b.gguf", ""]
    {
        let (st, v) = add(json!({"name": "bad", "file": file}));
        assert_eq!(st, 400, "{file:?}: {v}");
    }
    assert_eq!(add(json!({"name": "bad", "file": "nope.gguf"})).0, 404);
    assert_eq!(add(json!({"name": "bad", "file": "sub"})).0, 404);
    assert_eq!(add(json!({"name": "a/b", "file": "qv.gguf"})).0, 400, "names are plain");
    assert_eq!(add(json!({"name": "x"})).0, 400, "file is required");
    std::fs::write(dir.join("junk.gguf"), b"not a gguf").unwrap();
    let (st, v) = add(json!({"file": "junk.gguf"}));
    assert_eq!(st, 400, "{v}");
    assert!(error_message(&v).contains("junk.gguf"), "{v}");

    // Unknown adapters: 404s naming them, in each API's shape.
    let (st, v) = chat(&s, model("nosuch"));
    assert_eq!(st, 404);
    assert!(v["error"]["message"].as_str().unwrap().contains("nosuch"), "{v}");
    let body = json!({"model": format!("{ALIAS}:nosuch"), "prompt": "hi", "stream": false});
    let (st, text) = s.send("POST", "/api/generate", Some(KEY), Some(&body.to_string())).unwrap();
    assert_eq!(st, 404);
    assert!(serde_json::from_str::<Value>(&text).unwrap()["error"]
        .as_str()
        .unwrap()
        .contains("nosuch"));
    for (m, want) in [("nosuch", 404), ("qv", 200)] {
        let body = json!({ "model": format!("{ALIAS}:{m}") }).to_string();
        assert_eq!(s.send("POST", "/api/show", Some(KEY), Some(&body)).unwrap().0, want, "{m}");
    }
    let (st, v) = chat(&s, json!({"lora": [{"id": 7, "scale": 1.0}]}));
    assert_eq!(st, 404);
    assert!(error_message(&v).contains("id 7"), "{v}");
    // Malformed lora lists: 400s.
    for bad in [
        json!("qv"),
        json!([{"id": -1, "scale": 1.0}]),
        json!([{"id": 0}]),
        json!([{"id": 0, "scale": 1}, {"id": 0, "scale": 2}]),
    ] {
        let (st, v) = chat(&s, json!({ "lora": bad }));
        assert_eq!(st, 400, "{bad}: {v}");
    }

    // Default scales (llama-server's POST /lora-adapters): requests that name no adapter get
    // them.
    let (st, text) =
        s.send("POST", "/lora-adapters", Some(KEY), Some(r#"[{"id": 2, "scale": 1.0}]"#)).unwrap();
    assert_eq!((st, text.as_str()), (200, r#"{"success":true}"#));
    assert_eq!(get_json(&s, "/lora-adapters")[2]["name"], "qv");
    assert_eq!(answer(&s, json!({})), extra, "the default adapter applies");
    assert_eq!(
        answer(&s, model("mine")),
        answer(&s, json!({"lora": [{"id": 1, "scale": 1.0}]})),
        "a named adapter replaces the defaults"
    );
    s.send("POST", "/lora-adapters", Some(KEY), Some(r#"[{"id": 2, "scale": 0}]"#)).unwrap();
    assert_eq!(answer(&s, json!({})), base);
    assert_eq!(
        s.send("POST", "/lora-adapters", Some(KEY), Some(r#"[{"id": 9, "scale": 1}]"#)).unwrap().0,
        404
    );

    // Removing an adapter in use: its request finishes on it; new ones get 404.
    // Qwen2.5's two end tokens are banned, so the answer runs its 64 tokens whatever text the
    // kernels' summation order makes the greedy path.
    let long = json!({"model": format!("{ALIAS}:extra"), "max_tokens": 64,
        "messages": [{"role": "user", "content": "Count from one to fifty in words."}], "temperature": 0,
        "logit_bias": {"151643": -100, "151645": -100}});
    std::thread::scope(|sc| {
        let running = sc.spawn(|| {
            s.send("POST", "/v1/chat/completions", Some(KEY), Some(&long.to_string())).unwrap()
        });
        let t0 = std::time::Instant::now();
        loop {
            let l = get_json(&s, "/v1/adapters");
            let leased = l["data"]
                .as_array()
                .unwrap()
                .iter()
                .any(|a| a["name"] == "extra" && a["leases"].as_u64() > Some(0));
            if leased {
                break;
            }
            assert!(t0.elapsed().as_secs() < 60, "the request never leased its adapter: {l}");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        assert_eq!(s.send("DELETE", "/v1/adapters/extra", Some(KEY), None).unwrap().0, 204);
        assert_eq!(chat(&s, model("extra")).0, 404, "a removed adapter is gone for new requests");
        let (st, text) = running.join().unwrap();
        assert_eq!(st, 200, "the running request finishes: {text}");
        let v: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["usage"]["completion_tokens"], 64, "{v}");
    });
    assert_eq!(s.send("DELETE", "/v1/adapters/extra", Some(KEY), None).unwrap().0, 404);
    let after = get_json(&s, "/v1/models");
    assert_eq!(ids(&after, "data", "id").len(), 3);
    let _ = std::fs::remove_dir_all(dir.parent().unwrap());
}

#[test]
fn serve_lora_applies_the_adapter_to_every_request_by_default() {
    let base_model = common::model(ALIAS);
    let qv = refdata_adapter();
    let run_qv = snug_run(&base_model, &["--lora", qv.to_str().unwrap()]);
    let mut args = vec!["--lora", qv.to_str().unwrap(), "--parallel", "1", "--api-key", KEY];
    args.push("--allow-admin");
    args.extend(COMMON);
    let s = Server::start(&base_model, &args);
    assert_eq!(answer(&s, json!({})), run_qv, "--lora applies by default");
    assert_eq!(answer(&s, model("qwen05-qv-r8-s11")), run_qv);
    let l = get_json(&s, "/lora-adapters");
    assert_eq!(
        l,
        json!([{"id": 0, "path": "qwen05-qv-r8-s11.gguf", "name": "qwen05-qv-r8-s11", "scale": 1.0}])
    );
    // Without --lora-dir nothing can be added.
    let (st, text) =
        s.send("POST", "/v1/adapters", Some(KEY), Some(r#"{"file": "x.gguf"}"#)).unwrap();
    assert_eq!(st, 400, "{text}");
    assert!(text.contains("--lora-dir"), "{text}");
}

/// `--max-loras 1`: the adapter share holds one adapter, so two requests on two adapters at
/// once cannot both have theirs hot; the second waits for the first to finish (no error) and
/// each answers what it answers alone.
#[test]
fn a_request_waits_for_room_when_the_adapter_share_is_full() {
    let base_model = common::model(ALIAS);
    let dir = adapter_dir("share");
    let dir_arg = dir.to_str().unwrap();
    let mut args = vec!["--lora-dir", dir_arg, "--max-loras", "1", "--parallel", "2"];
    args.extend(["--api-key", KEY]);
    args.extend(COMMON);
    let s = Server::start(&base_model, &args);
    let (alone_qv, alone_mine) = (answer(&s, model("qv")), answer(&s, model("mine")));
    let (qv, mine) = std::thread::scope(|sc| {
        let a = sc.spawn(|| answer(&s, model("qv")));
        let b = sc.spawn(|| answer(&s, model("mine")));
        (a.join().unwrap(), b.join().unwrap())
    });
    assert_eq!((qv, mine), (alone_qv, alone_mine));
    let (_, metrics) = s.send("GET", "/metrics", Some(KEY), None).unwrap();
    let evicted = metrics
        .lines()
        .find(|l| {
            l.starts_with("snug_adapter_evictions_total")
                || l.starts_with("snug_adapter_demotions_total")
        })
        .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .unwrap_or(0.0);
    assert!(evicted > 0.0, "one adapter made room for the other:\n{metrics}");
    let _ = std::fs::remove_dir_all(dir.parent().unwrap());
}

/// The prefix cache is keyed by adapter set: a prompt read under one adapter is reused under
/// the same adapter (and gives the same answer), never under the bare model or another.
#[test]
fn the_prefix_cache_is_keyed_by_adapter() {
    let base_model = common::model(ALIAS);
    let dir = adapter_dir("prefix");
    let dir_arg = dir.to_str().unwrap();
    let mut args = vec!["--lora-dir", dir_arg, "--parallel", "1", "--api-key", KEY];
    args.extend(COMMON);
    let s = Server::start(&base_model, &args);
    let prompt = "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n".repeat(8);
    let complete = |m: &str| {
        let body = json!({"model": m, "prompt": prompt, "max_tokens": 8, "temperature": 0});
        let (st, text) =
            s.send("POST", "/v1/completions", Some(KEY), Some(&body.to_string())).unwrap();
        assert_eq!(st, 200, "{text}");
        let v: Value = serde_json::from_str(&text).unwrap();
        v["choices"][0]["text"].as_str().unwrap().to_string()
    };
    let hits = || {
        let (_, m) = s.send("GET", "/metrics", Some(KEY), None).unwrap();
        let line = m.lines().find(|l| l.starts_with("snug_prefix_hit_tokens_total")).unwrap();
        line.rsplit(' ').next().unwrap().parse::<f64>().unwrap()
    };
    let qv = format!("{ALIAS}:qv");
    let first = complete(&qv);
    assert_eq!(hits(), 0.0);
    complete(ALIAS);
    assert_eq!(hits(), 0.0, "the bare model does not reuse KV computed under an adapter");
    complete(&format!("{ALIAS}:mine"));
    assert_eq!(hits(), 0.0, "another adapter does not either");
    assert_eq!(complete(&qv), first, "the cached prefix gives the same answer");
    assert!(hits() >= 64.0, "the same adapter reuses its prefix");
    let _ = std::fs::remove_dir_all(dir.parent().unwrap());
}
