//! snug's next-token distributions against llama.cpp's on the architectures of issue 34
//! (qwen3, qwen3moe, Phi-4-mini's phi3 with partial rotary and LongRoPE, smollm3) and qwen2moe's
//! shared expert: top-1 agreement ≥ 99% and mean KL(llama.cpp ‖ snug) ≤ 0.01 over 765
//! positions each.
//!
//! Reference (`testdata/agreement/`, made by `scripts/agreement-refs.sh`): a tiny random-weight
//! GGUF per architecture written by `snug synth --exact --output-std 0.5` (peaked logits; see
//! the script) and llama.cpp's log-probabilities on `refdata/corpus_dev.txt` saved by
//! `llama-perplexity -c 512 -b 512 --chunks 3 --kl-divergence-base`, f16 KV cache. That file
//! holds the evaluation tokens and, per chunk of 512, the log-probabilities of its second half
//! (positions 256..510) quantized to 16 bits over the top 16 nats. `engine::kl_divergence`
//! reads and compares it, the code `snug perplexity --kl-divergence-base` runs on any file.

use std::path::PathBuf;
use std::sync::Arc;

use engine::KlBase;
use model::{Context, ContextParams, Model};

fn data(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata/agreement").join(name)
}

/// (top-1 agreement, mean KL, positions) of `shape`'s file against its llama.cpp logits, every
/// chunk in one batch (the scored rows as outputs).
fn agreement(shape: &str) -> (f64, f64, usize) {
    let path = data(&format!("{shape}.gguf"));
    let model = Arc::new(Model::load(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display())));
    let tok = tokenizer::Tokenizer::from_gguf(&model.file).expect("tokenizer");
    let mut base = KlBase::open(&data(&format!("{shape}.kld"))).expect("base logits");
    let n_ctx = base.n_ctx;
    let params = ContextParams {
        n_ctx,
        n_ubatch: n_ctx,
        n_outputs_max: n_ctx,
        n_threads: 2,
        ..ContextParams::default()
    };
    let mut ctx = Context::new(model, params);
    let bos = if tok.add_bos() { tok.bos() } else { None };
    let a = engine::kl_divergence(&mut ctx, &mut base, bos, None).expect("agreement");
    (a.top1, a.mean_kl, a.n_positions)
}

/// Checks mean KL ≤ 0.01 and top-1 agreement ≥ `min_top1`.
fn check(shape: &str, min_top1: f64) {
    let (top1, kl, n) = agreement(shape);
    eprintln!("{shape}: top-1 agreement {:.2}%, mean KL {kl:.5} over {n} positions", 100.0 * top1);
    assert!(n >= 512, "{n} positions");
    assert!(top1 >= min_top1, "{shape}: top-1 agreement {:.2}% too low", 100.0 * top1);
    assert!(kl <= 0.01, "{shape}: mean KL {kl:.5} > 0.01");
}

#[test]
fn qwen3_agrees_with_llama_cpp() {
    check("tiny-qwen3", 0.99);
}

#[test]
fn qwen3moe_agrees_with_llama_cpp() {
    check("tiny-qwen3moe", 0.99);
}

/// Routed experts without renormalised weights, and a shared expert gated per token (without
/// the shared expert snug lands at 51% / KL 1.47).
#[test]
fn qwen2moe_agrees_with_llama_cpp() {
    check("tiny-qwen2moe", 0.99);
}

#[test]
fn phi4_mini_longrope_agrees_with_llama_cpp() {
    check("tiny-phi4", 0.99);
}

/// SmolLM3's file (no q/k norms) has more near-ties than llama.cpp's own precision settles:
/// llama.cpp against itself with flash attention off agrees on 96.99% of the top-1 tokens
/// (KL 0.00117), snug on 98.2% (KL 0.0009). The bar is llama.cpp's own, rounded down.
#[test]
fn smollm3_agrees_with_llama_cpp() {
    check("tiny-smollm3", 0.97);
}

/// A control: llama, checked against llama.cpp elsewhere (`parity.rs`), through this harness.
#[test]
fn llama_control_agrees_with_llama_cpp() {
    check("tiny-llama", 0.99);
}
