//! The multilingual sample (`testdata/tokenizer/multilingual.txt`: English, Chinese, Japanese,
//! Russian, Arabic, Hindi, Korean, Hebrew, Thai, Vietnamese, Greek, Turkish, German, emoji,
//! symbols, code and whitespace runs), whole and line by line, tokenized exactly as llama.cpp
//! does on the real models CI fetches (Qwen2's byte-level BPE, which Qwen3 shares, and Gemma 3's
//! SentencePiece). References: `testdata/tokenizer/multilingual.llamacpp.json`, llama-server's
//! `/tokenize`, written by `scripts/multilingual-refs.py`.

mod common;

use std::path::PathBuf;

use common::{load, real_model};
use serde_json::Value;

fn check(alias: &str) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../testdata/tokenizer/multilingual.llamacpp.json");
    let refs: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let cases = refs["models"][alias]["cases"].as_array().expect("cases");
    let (_f, tok) = load(&real_model(alias));
    let mut bad = Vec::new();
    for case in cases {
        let text = case["text"].as_str().unwrap();
        let special = case["parse_special"].as_bool().unwrap();
        let want: Vec<u32> =
            case["ids"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect();
        let got = tok.encode(text, true, special);
        if got != want {
            bad.push(format!(
                "{text:?} (parse_special {special}):\n  want {want:?}\n   got {got:?}"
            ));
        }
    }
    assert!(cases.len() > 20, "{} cases", cases.len());
    assert!(
        bad.is_empty(),
        "{alias}: {} of {} differ:\n{}",
        bad.len(),
        cases.len(),
        bad.join("\n")
    );
}

#[test]
fn qwen2_bpe_matches_llama_cpp_on_the_multilingual_sample() {
    check("qwen2.5-coder-0.5b");
}

#[test]
fn gemma3_spm_matches_llama_cpp_on_the_multilingual_sample() {
    check("gemma3-270m");
}
