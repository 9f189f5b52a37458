//! Exact agreement with llama.cpp (commit 0c1e57098): the 40 reference strings under all four
//! flag combinations, and the prompt tokens of every reference run, for the three real models
//! and the five tiny ones.

mod common;

use common::{alias_of, load, real_model, refdata_dir};
use serde_json::Value;

fn ids(v: &Value) -> Vec<u32> {
    v.as_array().expect("id array").iter().map(|x| x.as_u64().expect("id") as u32).collect()
}

/// Returns (exact strings, total strings, first mismatches).
fn check_strings(tok: &tokenizer::Tokenizer, json: &Value) -> (usize, usize, Vec<String>) {
    let strings = json["strings"].as_array().expect("strings");
    let mut ok = 0;
    let mut bad = Vec::new();
    for s in strings {
        let text = s["text"].as_str().expect("text");
        let mut all = true;
        for (key, add, parse) in [
            ("ids_add_special_parse_special_false", true, false),
            ("ids_add_special_parse_special_true", true, true),
            ("ids_no_add_special_parse_special_false", false, false),
            ("ids_no_add_special_parse_special_true", false, true),
        ] {
            let want = ids(&s[key]);
            let got = tok.encode(text, add, parse);
            if got != want {
                all = false;
                if bad.len() < 6 {
                    bad.push(format!("{text:?} {key}:\n   want {want:?}\n    got {got:?}"));
                }
            }
        }
        ok += all as usize;
    }
    (ok, strings.len(), bad)
}

fn check_prompts(tok: &tokenizer::Tokenizer, json: &Value) -> (usize, usize, Vec<String>) {
    let results = json["results"].as_array().expect("results");
    let mut ok = 0;
    let mut bad = Vec::new();
    for r in results {
        let text = r["prompt"].as_str().expect("prompt");
        let parse = r["parse_special"].as_bool().unwrap_or(false);
        let want = ids(&r["prompt_tokens"]);
        let got = tok.encode(text, true, parse);
        if got == want {
            ok += 1;
        } else if bad.len() < 4 {
            bad.push(format!("{}: want {want:?}\n    got {got:?}", r["name"]));
        }
    }
    (ok, results.len(), bad)
}

fn read_json(path: &std::path::Path) -> Value {
    let s =
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    serde_json::from_str(&s).unwrap_or_else(|e| panic!("parse {}: {e}", path.display()))
}

fn run(
    name: &str,
    gguf: &std::path::Path,
    tokenize_json: &std::path::Path,
    llamacpp_json: &std::path::Path,
) {
    let (_f, tok) = load(gguf);
    let (s_ok, s_n, s_bad) = check_strings(&tok, &read_json(tokenize_json));
    let (p_ok, p_n, p_bad) = check_prompts(&tok, &read_json(llamacpp_json));
    println!("{name}: strings {s_ok}/{s_n} exact, prompts {p_ok}/{p_n} exact");
    for b in s_bad.iter().chain(&p_bad) {
        println!("  {b}");
    }
    assert!(
        s_ok == s_n && p_ok == p_n,
        "{name}: strings {s_ok}/{s_n}, prompts {p_ok}/{p_n} match llama.cpp"
    );
}

fn real(prefix: &str) {
    let d = refdata_dir();
    run(
        prefix,
        &real_model(alias_of(prefix)),
        &d.join(format!("{prefix}.tokenize.json")),
        &d.join(format!("{prefix}.llamacpp.json")),
    );
}

fn tiny(arch: &str) {
    let d = refdata_dir().join("tiny");
    run(
        arch,
        &d.join(format!("tiny-{arch}.gguf")),
        &d.join(format!("tiny-{arch}.tokenize.json")),
        &d.join(format!("tiny-{arch}.llamacpp.json")),
    );
}

#[test]
fn qwen05_matches_llama_cpp() {
    real("qwen05");
}

#[test]
fn qwen15_matches_llama_cpp() {
    real("qwen15");
}

#[test]
fn gemma3_270m_matches_llama_cpp() {
    real("gemma3-270m");
}

#[test]
fn tiny_llama_matches_llama_cpp() {
    tiny("llama");
}

#[test]
fn tiny_qwen2_matches_llama_cpp() {
    tiny("qwen2");
}

#[test]
fn tiny_gemma2_matches_llama_cpp() {
    tiny("gemma2");
}

#[test]
fn tiny_gemma3_matches_llama_cpp() {
    tiny("gemma3");
}

#[test]
fn tiny_phi3_matches_llama_cpp() {
    tiny("phi3");
}
