//! The paged KV cache end to end on the tiny seeded models: exact bytes per token, quantized
//! precisions close to f16, copy-on-write forks, and sliding windows that free memory.

use std::path::PathBuf;
use std::sync::Arc;

use model::{kv_bytes_per_token, Batch, Context, ContextParams, KvType, Model};

fn tiny(arch: &str) -> Arc<Model> {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join(format!("../../testdata/refdata/tiny/tiny-{arch}.gguf"));
    Arc::new(Model::load(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display())))
}

fn params(n_ctx: usize, k: KvType, v: KvType) -> ContextParams {
    ContextParams {
        n_ctx,
        n_ubatch: 64,
        n_outputs_max: 64,
        n_seq_max: 2,
        n_threads: 2,
        kv_k: k,
        kv_v: v,
        ..ContextParams::default()
    }
}

/// Deterministic token stream.
fn tokens(n: usize, n_vocab: usize) -> Vec<u32> {
    (0..n)
        .map(|i| ((i as u64 * 2654435761 + 12345) % n_vocab as u64) as u32)
        .collect()
}

/// Log-softmax rows of every position of `toks` (teacher-forced, one sequence).
fn log_probs(ctx: &mut Context, toks: &[u32]) -> Vec<Vec<f32>> {
    let mut rows = Vec::new();
    let mut b = Batch::default();
    for (c, chunk) in toks.chunks(64).enumerate() {
        b.clear();
        for (i, &t) in chunk.iter().enumerate() {
            b.push(t, c * 64 + i, 0, true);
        }
        ctx.decode(&b).unwrap();
        for i in 0..chunk.len() {
            let l = ctx.logits(i);
            let max = l.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let lse = max + l.iter().map(|x| (x - max).exp()).sum::<f32>().ln();
            rows.push(l.iter().map(|x| x - lse).collect());
        }
    }
    rows
}

fn mean_kl(p: &[Vec<f32>], q: &[Vec<f32>]) -> f64 {
    let kl: f64 = p
        .iter()
        .zip(q)
        .map(|(a, b)| {
            a.iter()
                .zip(b)
                .map(|(&x, &y)| (x.exp() * (x - y)) as f64)
                .sum::<f64>()
        })
        .sum();
    kl / p.len() as f64
}

#[test]
fn bytes_per_token_is_exact_and_matches_the_planner_formula() {
    for arch in ["llama", "qwen2", "gemma3"] {
        let m = tiny(arch);
        let c = &m.config;
        for k in KvType::ALL {
            for v in KvType::ALL {
                let ctx = Context::new(Arc::clone(&m), params(256, k, v));
                let bpt = kv_bytes_per_token(c, k, v);
                assert_eq!(ctx.kv.bytes_per_token(), bpt, "{arch} {k}/{v}");
                let per_head = |t: KvType, n: usize| match t {
                    KvType::F16 => 2 * n,
                    KvType::Q8 => n.div_ceil(32) * 34,
                    KvType::Q4 => n.div_ceil(32) * 18,
                };
                assert_eq!(
                    bpt,
                    c.n_layer * c.n_head_kv * (per_head(k, c.head_dim) + per_head(v, c.head_dim_v))
                );
            }
        }
        // 64 positions = exactly two blocks per layer (layers with a window may have freed some).
        if c.layers.iter().any(|l| l.window.is_some()) {
            continue;
        }
        let mut ctx = Context::new(Arc::clone(&m), params(256, KvType::Q8, KvType::Q4));
        log_probs(&mut ctx, &tokens(64, c.n_vocab));
        assert_eq!(ctx.kv.bytes_used(), 64 * ctx.kv.bytes_per_token(), "{arch}");
    }
}

#[test]
fn quantized_kv_stays_close_to_f16_on_every_tiny_architecture() {
    for arch in ["llama", "qwen2", "gemma2", "gemma3", "phi3"] {
        let m = tiny(arch);
        let toks = tokens(150, m.config.n_vocab);
        let base = log_probs(
            &mut Context::new(Arc::clone(&m), params(256, KvType::F16, KvType::F16)),
            &toks,
        );
        for (k, v, budget) in [
            (KvType::Q8, KvType::Q8, 2e-3),
            (KvType::Q8, KvType::Q4, 2e-2),
            (KvType::Q4, KvType::Q4, 5e-2),
        ] {
            let lp = log_probs(&mut Context::new(Arc::clone(&m), params(256, k, v)), &toks);
            let kl = mean_kl(&base, &lp);
            eprintln!("tiny-{arch} {k}/{v}: mean KL vs f16 {kl:.2e}");
            assert!(kl < budget, "tiny-{arch} {k}/{v}: mean KL {kl} > {budget}");
        }
    }
}

#[test]
fn a_window_wider_than_the_text_changes_nothing() {
    let m = tiny("qwen2");
    let toks = tokens(100, m.config.n_vocab);
    let base = log_probs(
        &mut Context::new(Arc::clone(&m), params(128, KvType::F16, KvType::F16)),
        &toks,
    );
    let p = ContextParams {
        kv_window: Some(128),
        kv_sinks: 4,
        ..params(128, KvType::F16, KvType::F16)
    };
    let lp = log_probs(&mut Context::new(Arc::clone(&m), p), &toks);
    assert_eq!(base, lp);
}

#[test]
fn forked_sequences_share_blocks_and_copy_on_write() {
    let m = tiny("llama");
    let c = &m.config;
    let mut ctx = Context::new(Arc::clone(&m), params(256, KvType::Q8, KvType::Q8));
    let toks = tokens(40, c.n_vocab);
    log_probs(&mut ctx, &toks);
    let used = ctx.kv.bytes_used();
    let before = ctx.kv.read_keys(0, 0, 39).unwrap();
    ctx.kv.seq_fork(0, 1).unwrap();
    assert_eq!(ctx.kv.bytes_used(), used, "a fork copies no KV bytes");
    assert_eq!(ctx.kv.read_keys(1, 0, 39).unwrap(), before);
    // Sequence 1 rewrites position 39 with another token: its last block (per layer) is copied.
    let mut b = Batch::default();
    b.push((toks[39] + 1) % c.n_vocab as u32, 39, 1, true);
    ctx.decode(&b).unwrap();
    let block_bytes = ctx.kv.bytes_per_token() * 32;
    assert_eq!(ctx.kv.bytes_used(), used + block_bytes);
    assert_eq!(
        ctx.kv.read_keys(0, 0, 39).unwrap(),
        before,
        "the source sequence is untouched"
    );
    assert_ne!(ctx.kv.read_keys(1, 0, 39).unwrap(), before);
    ctx.kv.seq_clear(0);
    ctx.kv.seq_clear(1);
    assert_eq!(ctx.kv.bytes_used(), 0);
}

#[test]
fn a_sliding_window_with_sinks_runs_past_the_context_in_bounded_memory() {
    let m = tiny("qwen2");
    let c = &m.config;
    let p = ContextParams {
        n_ubatch: 1,
        n_outputs_max: 1,
        kv_window: Some(64),
        kv_sinks: 4,
        ..params(128, KvType::Q8, KvType::Q4)
    };
    let mut ctx = Context::new(Arc::clone(&m), p);
    let mut b = Batch::default();
    let mut tok = 1u32;
    let mut peak = 0;
    for pos in 0..1000 {
        b.clear();
        b.push(tok, pos, 0, true);
        ctx.decode(&b).unwrap();
        let l = ctx.logits(0);
        tok = (0..l.len()).max_by(|&i, &j| l[i].total_cmp(&l[j])).unwrap() as u32;
        if pos >= 200 {
            peak = peak.max(ctx.kv.bytes_used());
        }
        assert!(
            ctx.kv.read_keys(0, 0, 2).is_some(),
            "sink positions are kept"
        );
    }
    // Sinks block + the window (64 positions span at most 3 blocks) per layer.
    let bound = 4 * 32 * ctx.kv.bytes_per_token();
    assert!(peak <= bound, "{peak} > {bound}");
    assert!(
        ctx.kv.read_keys(0, 0, 500).is_none(),
        "positions outside the window are freed"
    );
    assert!(ctx.kv.seq_evicted(0));
    let _ = c;
}

#[test]
fn native_sliding_window_layers_hold_at_most_the_window_plus_a_block() {
    let m = tiny("gemma3");
    let c = &m.config;
    let Some((il, w)) = c
        .layers
        .iter()
        .enumerate()
        .find_map(|(i, l)| l.window.map(|w| (i, w)))
    else {
        panic!("tiny-gemma3 has no sliding-window layer");
    };
    let n = (w + 100).min(1024);
    let mut ctx = Context::new(Arc::clone(&m), params(n + 8, KvType::F16, KvType::F16));
    log_probs(&mut ctx, &tokens(n, c.n_vocab));
    let held = (0..n)
        .filter(|&p| ctx.kv.read_keys(0, il, p).is_some())
        .count();
    assert!(
        held <= w + 32 + 64,
        "layer {il} (window {w}) holds {held} positions"
    );
    if n > w + 64 + 32 {
        assert!(held < n, "layer {il} freed nothing");
    }
}
