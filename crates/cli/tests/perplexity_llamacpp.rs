//! `snug perplexity` with an f16 KV cache agrees with llama.cpp's `llama-perplexity` on the same
//! text within 1% (issue 7), and with a LoRA adapter within 0.5% (issue 15).
//!
//! Reference (provenance): `../shared/BASELINES.md`, "KV-cache precision vs quality",
//! `llama-perplexity -c 512` on `refdata/corpus_dev.txt` (copied to `testdata/refdata/`), llama.cpp
//! commit 0c1e57098 (the copy vendored in PyPI `llama-cpp-python` 0.3.36), f16 KV, flash attention
//! off: gemma3-270m **12.035 ± 0.335**. That table's header says `--chunks 20`, but its standard
//! errors only fit 40 scored chunks for gemma3-270m and qwen2.5-coder-0.5b (20 chunks give ~1.43×
//! larger errors — √2 — and a higher perplexity: 12.168 ± 0.481 here), and 20 for
//! qwen2.5-coder-1.5b (5.636 ± 0.182, which snug reproduces at 20 chunks: 5.637 ± 0.182). At 40
//! chunks snug gives 12.069 ± 0.336 on gemma3-270m and 9.017 ± 0.238 on qwen2.5-coder-0.5b
//! (llama.cpp 9.018 ± 0.239). The standard error is checked too, so a run scoring a different
//! number of tokens cannot pass by accident.
//!
//! gemma3-270m is the cheapest of the three (its local layers attend over 512 positions, its
//! vocabulary is 262,144 — the logits dominate), ~2 minutes on 2 threads.

mod common;

use std::ffi::OsStr;
use std::path::PathBuf;

/// llama-perplexity, f16 KV, flash attention off (BASELINES.md).
const LLAMA_PPL: f64 = 12.035;
const LLAMA_PPL_STDERR: f64 = 0.335;

/// Runs `snug perplexity MODEL corpus_dev.txt --ctx 512 --chunks CHUNKS --kv f16` (plus `extra`)
/// and checks the perplexity within `tol` of llama.cpp's `(ppl, stderr)` and the standard error
/// within 5% (the same tokens scored).
fn agrees(alias: &str, extra: &[&OsStr], chunks: &str, (want, want_err): (f64, f64), tol: f64) {
    let model = common::model(alias);
    let data = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata/refdata");
    let corpus = data.join("corpus_dev.txt");
    let mut args = vec![OsStr::new("perplexity"), model.as_os_str(), corpus.as_os_str()];
    args.extend(extra);
    let flags = ["--ctx", "512", "--chunks", chunks, "--kv", "f16", "--threads", "2", "--json"];
    args.extend(flags.iter().map(OsStr::new));
    let j = common::snug_json(&args);
    let ppl = j["ppl"].as_f64().expect("ppl");
    let stderr = j["ppl_stderr"].as_f64().expect("ppl_stderr");
    let rel = ppl / want - 1.0;
    eprintln!(
        "{alias} {extra:?} f16, {chunks} chunks of 512: snug {ppl:.4} ± {stderr:.4}, llama.cpp \
         {want} ± {want_err} ({:+.2}%)",
        100.0 * rel
    );
    assert!(
        rel.abs() <= tol,
        "perplexity {ppl:.4} is {:+.2}% from llama.cpp's {want}",
        100.0 * rel
    );
    assert!(
        (stderr / want_err - 1.0).abs() <= 0.05,
        "standard error {stderr:.4} vs llama.cpp's {want_err}: a different number of tokens was scored"
    );
}

#[test]
fn f16_perplexity_agrees_with_llama_perplexity_within_1_percent_gemma3() {
    agrees("gemma3-270m", &[], "40", (LLAMA_PPL, LLAMA_PPL_STDERR), 0.01);
}

/// llama-perplexity with `--lora qwen05-qv-r8-s11.gguf` on qwen2.5-coder-0.5b, `-c 512 --chunks
/// 20`, f16 KV (`testdata/refdata/lora/README.md`, llama.cpp 0c1e57098).
const LORA_PPL: f64 = 10.2539;
const LORA_PPL_STDERR: f64 = 0.38502;

/// Issue 15: a LoRA adapter (rank 8 on attn_q and attn_v, f16, alpha 16) is applied as
/// llama.cpp applies it — within 0.5% of its perplexity; without the adapter llama.cpp gives
/// 9.2966 on the same chunks, so a missing or mis-scaled delta cannot pass. ~5 minutes on 2
/// threads.
#[test]
fn perplexity_with_a_lora_adapter_agrees_with_llama_perplexity_within_half_a_percent() {
    let adapter = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../testdata/refdata/lora/qwen05-qv-r8-s11.gguf");
    let extra = [OsStr::new("--lora"), adapter.as_os_str()];
    agrees("qwen2.5-coder-0.5b", &extra, "20", (LORA_PPL, LORA_PPL_STDERR), 0.005);
}

/// `--kl-divergence-base` reads llama-perplexity's saved logits (`testdata/agreement/`) and
/// scores every position it holds; a `--ctx` other than the file's is refused, naming both.
#[test]
fn kl_divergence_base_scores_the_positions_llama_perplexity_saved() {
    let data = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata/agreement");
    let (model, base) = (data.join("tiny-qwen3.gguf"), data.join("tiny-qwen3.kld"));
    let args = [
        OsStr::new("perplexity"),
        model.as_os_str(),
        OsStr::new("--kl-divergence-base"),
        base.as_os_str(),
        OsStr::new("--json"),
    ];
    let j = common::snug_json(&args);
    assert_eq!(j["n_positions"].as_u64(), Some(3 * 255), "{j}");
    assert!(j["top1"].as_f64().unwrap() >= 0.99, "{j}");
    assert!(j["mean_kl"].as_f64().unwrap() <= 0.01, "{j}");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_snug"))
        .args(&args[..4])
        .args(["--ctx", "256"])
        .output()
        .expect("snug runs");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("256") && err.contains("512"), "{err}");
}
