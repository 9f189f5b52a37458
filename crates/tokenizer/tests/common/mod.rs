//! Shared helpers for the tokenizer's integration tests: where reference data and models live.

#![allow(dead_code)]

use std::path::PathBuf;

use tokenizer::Tokenizer;

/// The llama.cpp reference data: the repository's `testdata/refdata`, else the team's
/// `shared/refdata` beside the repository.
pub fn refdata_dir() -> PathBuf {
    let ws = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    for cand in [ws.join("testdata/refdata"), ws.join("../shared/refdata")] {
        if cand.join("tok_strings.json").is_file() {
            return cand;
        }
    }
    panic!("llama.cpp reference data not found: expected testdata/refdata/ in the repository (see testdata/README.md)");
}

/// Path of a real model by alias; fails loudly when it has not been fetched.
pub fn real_model(alias: &str) -> PathBuf {
    let p = hub::model_path(alias);
    assert!(
        p.is_file(),
        "model {alias} not found at {}: fetch the test models first (`snug pull {alias}` or scripts/test.sh)",
        p.display()
    );
    p
}

/// Loads a tokenizer from a GGUF path.
pub fn load(path: &std::path::Path) -> (gguf::GgufFile, Tokenizer) {
    let f = gguf::GgufFile::open(path).unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
    let t =
        Tokenizer::from_gguf(&f).unwrap_or_else(|e| panic!("tokenizer of {}: {e}", path.display()));
    (f, t)
}

/// The alias of a real model named by a refdata file prefix.
pub fn alias_of(prefix: &str) -> &'static str {
    match prefix {
        "qwen05" => "qwen2.5-coder-0.5b",
        "qwen15" => "qwen2.5-coder-1.5b",
        "gemma3-270m" => "gemma3-270m",
        other => panic!("unknown refdata model {other}"),
    }
}
