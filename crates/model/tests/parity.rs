//! snug's logits against llama.cpp's on the same files (`testdata/refdata`, llama.cpp commit
//! 0c1e57098). Every prompt is run teacher-forced with llama.cpp's prompt and continuation, so
//! every position is compared in the same context.
//!
//! - Tiny random models (one per architecture): the largest |Δlogit| over llama.cpp's top-10
//!   tokens must be within 2× of how far llama.cpp moves against itself (flash attention off,
//!   f32 KV) on the same model.
//! - Real models: greedy agreement up to the first near-tie (top-2 within 0.5 in llama.cpp),
//!   and KL(llama.cpp ‖ snug) over llama.cpp's top-10: mean ≤ 0.015, p99 ≤ 0.1 per model.

use std::path::PathBuf;
use std::sync::Arc;

use model::eval::evaluate_with;
use model::{Context, ContextParams, Model};
use serde_json::Value;

fn testdata(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata/refdata").join(rel)
}

fn load_json(path: &PathBuf) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

/// (token, logit) pairs of a reference row.
fn top10(row: &Value) -> Vec<(u32, f64)> {
    row["top10"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p[0].as_u64().unwrap() as u32, p[1].as_f64().unwrap()))
        .collect()
}

struct Compared {
    /// Per position: max |Δlogit| over the reference top-10.
    max_dlogit: f64,
    kl: Vec<f64>,
    /// Per prompt: did greedy agree up to the first near-tie?
    greedy_failures: Vec<String>,
    positions: usize,
}

fn compare_model(model_path: &PathBuf, reference: &Value, threads: usize) -> Compared {
    let model = Arc::new(
        Model::load(model_path).unwrap_or_else(|e| panic!("{}: {e}", model_path.display())),
    );
    let mut out =
        Compared { max_dlogit: 0.0, kl: Vec::new(), greedy_failures: Vec::new(), positions: 0 };
    for result in reference["results"].as_array().unwrap() {
        let name = result["name"].as_str().unwrap();
        let prompt = ids(&result["prompt_tokens"]);
        let gen = ids(&result["gen_tokens"]);
        let rows = result["positions"].as_array().unwrap();
        let n_ctx = prompt.len() + gen.len() + 8;
        let params = ContextParams {
            n_ctx,
            n_ubatch: 256,
            n_outputs_max: 256,
            n_seq_max: 1,
            n_threads: threads,
            ..ContextParams::default()
        };
        let mut ctx = Context::new(Arc::clone(&model), params);
        let mut snug_argmax = Vec::new();
        let mut i = 0;
        evaluate_with(&mut ctx, 0, &prompt, 0, 10, Some(&gen), |row, logits| {
            let r = &rows[i];
            assert_eq!(r["pos"].as_u64().unwrap() as usize, row.pos);
            let ref_top = top10(r);
            let ref_lse = r["lse"].as_f64().unwrap();
            let snug_lse = row.lse;
            let mut kl = 0.0;
            for &(tok, ref_logit) in &ref_top {
                let s = logits[tok as usize] as f64;
                out.max_dlogit = out.max_dlogit.max((s - ref_logit).abs());
                let lp = ref_logit - ref_lse;
                let lq = s - snug_lse;
                kl += lp.exp() * (lp - lq);
            }
            out.kl.push(kl);
            snug_argmax.push(row.top10[0].0);
            i += 1;
        })
        .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(i, rows.len(), "{name}: row count");
        out.positions += i;
        // Greedy: generated token j is the argmax of row n_prompt - 1 + j.
        for (j, &tok) in gen.iter().enumerate() {
            let r = &rows[prompt.len() - 1 + j];
            let t = top10(r);
            if t[0].1 - t[1].1 < 0.5 {
                break; // near-tie in llama.cpp: later tokens may legitimately differ
            }
            let mine = snug_argmax[prompt.len() - 1 + j];
            if mine != tok {
                out.greedy_failures
                    .push(format!("{name}: generated token {j}: llama.cpp {tok}, snug {mine}"));
                break;
            }
        }
    }
    out
}

fn percentile(v: &[f64], p: f64) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    s[((s.len() - 1) as f64 * p).round() as usize]
}

/// Largest |Δlogit| between llama.cpp's main run and its fa-off/f32-KV variant over tokens in
/// both top-10 lists.
fn llamacpp_self_distance(main: &Value, variant: &Value) -> f64 {
    let mut worst: f64 = 0.0;
    for (a, b) in
        main["results"].as_array().unwrap().iter().zip(variant["results"].as_array().unwrap())
    {
        for (ra, rb) in
            a["positions"].as_array().unwrap().iter().zip(b["positions"].as_array().unwrap())
        {
            let tb = top10(rb);
            for (tok, la) in top10(ra) {
                if let Some(&(_, lb)) = tb.iter().find(|(t, _)| *t == tok) {
                    worst = worst.max((la - lb).abs());
                }
            }
        }
    }
    worst
}

fn check_tiny(arch: &str) {
    let main = load_json(&testdata(&format!("tiny/tiny-{arch}.llamacpp.json")));
    let variant =
        load_json(&testdata(&format!("tiny/variants/tiny-{arch}.llamacpp.fa_off_kvf32.json")));
    let yardstick = llamacpp_self_distance(&main, &variant);
    let c = compare_model(&testdata(&format!("tiny/tiny-{arch}.gguf")), &main, 2);
    eprintln!(
        "tiny-{arch}: {} positions, max |dlogit| {:.5} (llama.cpp vs itself {:.5}), mean KL {:.2e}",
        c.positions,
        c.max_dlogit,
        yardstick,
        c.kl.iter().sum::<f64>() / c.kl.len() as f64
    );
    assert!(
        c.max_dlogit <= 2.0 * yardstick.max(1e-3),
        "tiny-{arch}: max |dlogit| {} > 2 × {}",
        c.max_dlogit,
        yardstick
    );
    assert!(c.greedy_failures.is_empty(), "{:?}", c.greedy_failures);
}

#[test]
fn tiny_llama_matches_llamacpp() {
    check_tiny("llama");
}

#[test]
fn tiny_qwen2_matches_llamacpp() {
    check_tiny("qwen2");
}

#[test]
fn tiny_gemma2_matches_llamacpp() {
    check_tiny("gemma2");
}

#[test]
fn tiny_gemma3_matches_llamacpp() {
    check_tiny("gemma3");
}

#[test]
fn tiny_phi3_matches_llamacpp() {
    check_tiny("phi3");
}

fn check_real(alias: &str, refname: &str) {
    let path = hub::model_path(alias);
    assert!(
        path.is_file(),
        "{} is missing: run `snug pull {alias}` (scripts/test.sh does this)",
        path.display()
    );
    let reference = load_json(&testdata(&format!("{refname}.llamacpp.json")));
    let c = compare_model(&path, &reference, 2);
    let mean = c.kl.iter().sum::<f64>() / c.kl.len() as f64;
    let p99 = percentile(&c.kl, 0.99);
    eprintln!(
        "{alias}: {} positions, KL mean {mean:.5} p99 {p99:.5} max {:.5}, max |dlogit| {:.3}",
        c.positions,
        percentile(&c.kl, 1.0),
        c.max_dlogit
    );
    assert!(
        c.greedy_failures.is_empty(),
        "{alias}: greedy disagreement before any near-tie: {:?}",
        c.greedy_failures
    );
    assert!(mean <= 0.015, "{alias}: mean KL {mean} > 0.015");
    assert!(p99 <= 0.1, "{alias}: p99 KL {p99} > 0.1");
}

#[test]
fn gemma3_270m_matches_llamacpp() {
    check_real("gemma3-270m", "gemma3-270m");
}

#[test]
fn qwen_coder_05b_matches_llamacpp() {
    check_real("qwen2.5-coder-0.5b", "qwen05");
}

#[test]
fn qwen_coder_15b_matches_llamacpp() {
    check_real("qwen2.5-coder-1.5b", "qwen15");
}
