//! The paged KV cache end to end on the tiny seeded models: exact bytes per token (the formula
//! the memory planner calls), quantized precisions close to f16, per-channel q4 keys staged in f16
//! until their block fills, copy-on-write forks, and sliding windows that free memory.

use std::sync::Arc;

use model::kv::kv_staged_bytes;
mod kv_common;
use kv_common::{params, tiny, tokens};

use model::{kv_bytes_per_token, Batch, Context, ContextParams, KvRotate, KvType, SeqId};

/// Log-softmax rows of every position of `toks` (teacher-forced, one sequence).
fn log_probs(ctx: &mut Context, toks: &[u32]) -> Vec<Vec<f32>> {
    log_probs_at(ctx, 0, 0, toks)
}

/// As [`log_probs`], for sequence `seq` with `toks` at positions `start..`.
fn log_probs_at(ctx: &mut Context, seq: SeqId, start: usize, toks: &[u32]) -> Vec<Vec<f32>> {
    let mut rows = Vec::new();
    let mut b = Batch::default();
    for (c, chunk) in toks.chunks(64).enumerate() {
        b.clear();
        for (i, &t) in chunk.iter().enumerate() {
            b.push(t, start + c * 64 + i, seq, true);
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
        .map(|(a, b)| a.iter().zip(b).map(|(&x, &y)| (x.exp() * (x - y)) as f64).sum::<f64>())
        .sum();
    kl / p.len() as f64
}

#[test]
fn bytes_per_token_is_exact_and_is_what_the_cache_uses() {
    for arch in ["llama", "qwen2", "gemma3"] {
        let m = tiny(arch);
        let c = &m.config;
        for k in KvType::ALL {
            for v in KvType::ALL {
                let ctx = Context::new(Arc::clone(&m), params(256, k, v));
                let bpt = kv_bytes_per_token(c, k, v);
                assert_eq!(ctx.kv.bytes_per_token(), bpt, "{arch} {k}/{v}");
                let value_head = |t: KvType, n: usize| match t {
                    KvType::F16 => 2 * n,
                    KvType::Q8 => n.div_ceil(32) * 34,
                    KvType::Q4 => n.div_ceil(32) * 18,
                };
                // Quantized keys: per 32-token block, d (q8) or d/2 (q4) code bytes per token +
                // d f16 scales + d f16 mins.
                let key_head = |t: KvType, d: usize| match t {
                    KvType::F16 => 2 * d,
                    KvType::Q8 => (32 * d + 4 * d).div_ceil(32),
                    KvType::Q4 => (32 * d.div_ceil(2) + 4 * d).div_ceil(32),
                };
                assert_eq!(
                    bpt,
                    c.n_layer
                        * c.n_head_kv
                        * (key_head(k, c.head_dim) + value_head(v, c.head_dim_v))
                );
            }
        }
        // 64 positions = exactly two blocks per layer (layers with a window may have freed some),
        // plus, with quantized keys, each layer's f16 block being filled.
        if c.layers.iter().any(|l| l.window.is_some()) {
            continue;
        }
        for (k, v) in [(KvType::Q8, KvType::Q4), (KvType::Q4, KvType::Q4)] {
            let mut ctx = Context::new(Arc::clone(&m), params(256, k, v));
            log_probs(&mut ctx, &tokens(64, c.n_vocab));
            assert_eq!(ctx.kv.bytes_used(), 64 * ctx.kv.bytes_per_token(), "{arch} {k}/{v}");
            assert_eq!(ctx.kv.bytes_staged(), kv_staged_bytes(c, k), "{arch} {k}/{v}");
            // 32 tokens of f16 keys per layer.
            let by_hand = c.n_layer * 32 * c.n_head_kv * c.head_dim * 2;
            assert_eq!(ctx.kv.bytes_staged(), by_hand, "{arch} {k}/{v}");
        }
    }
}

#[test]
fn quantized_keys_stay_f16_until_their_block_fills_then_are_quantized_per_channel() {
    let m = tiny("qwen2");
    let toks = tokens(72, m.config.n_vocab);
    for (kt, top) in [(KvType::Q8, 255.0), (KvType::Q4, 15.0)] {
        let mut exact = Context::new(Arc::clone(&m), params(256, KvType::F16, KvType::F16));
        // Unrotated, so the stored keys compare with the f16 cache's (`kv_rotate.rs` covers
        // rotated ones).
        let p = ContextParams { kv_rotate: Some(KvRotate::OFF), ..params(256, kt, KvType::F16) };
        let mut quant = Context::new(Arc::clone(&m), p);
        log_probs(&mut exact, &toks[..40]);
        log_probs(&mut quant, &toks[..40]);
        // Layer 0's keys depend only on the tokens, so the two caches were given the same keys.
        let key = |ctx: &Context, pos| ctx.kv.read_keys(0, 0, pos).unwrap();
        for pos in 32..40 {
            assert_eq!(
                key(&quant, pos),
                key(&exact, pos),
                "{kt}: pos {pos} is in the block being filled"
            );
        }
        // A full block: each channel within half a step (1/top of its range over the block) of
        // the exact key, and not exact.
        let check_block = |quant: &Context, exact: &Context, b: usize| {
            let (want, got): (Vec<_>, Vec<_>) =
                (32 * b..32 * (b + 1)).map(|p| (key(exact, p), key(quant, p))).unzip();
            let mut any_err = false;
            for c in 0..want[0].len() {
                let col = want.iter().map(|k| k[c]);
                let range = col.clone().fold(f32::NEG_INFINITY, f32::max)
                    - col.fold(f32::INFINITY, f32::min);
                for (w, g) in want.iter().zip(&got) {
                    let e = (w[c] - g[c]).abs();
                    assert!(
                        e <= range / (2.0 * top) * 1.02 + 1e-3,
                        "{kt} block {b} channel {c}: error {e}, range {range}"
                    );
                    any_err |= e > 0.0;
                }
            }
            assert!(any_err, "{kt}: block {b} is quantized");
        };
        check_block(&quant, &exact, 0);
        // Filling the block quantizes it; the next one starts in f16.
        log_probs_at(&mut exact, 0, 40, &toks[40..72]);
        log_probs_at(&mut quant, 0, 40, &toks[40..72]);
        check_block(&quant, &exact, 1);
        assert_eq!(key(&quant, 70), key(&exact, 70), "{kt}");
    }
}

#[test]
fn truncating_into_a_quantized_key_block_and_refilling_it_stays_close() {
    let m = tiny("llama");
    let toks = tokens(64, m.config.n_vocab);
    for kv in [KvType::Q8, KvType::Q4] {
        let mut ctx = Context::new(Arc::clone(&m), params(256, kv, kv));
        let first = log_probs(&mut ctx, &toks);
        let used = ctx.kv.bytes_used();
        ctx.kv.seq_truncate(0, 40);
        let again = log_probs_at(&mut ctx, 0, 40, &toks[40..]);
        assert_eq!(ctx.kv.bytes_used(), used, "{kv}");
        // Keys at positions 32..40 were quantized twice; the rest is as before.
        let kl = mean_kl(&first[40..], &again);
        assert!(kl < 1e-3, "{kv}: mean KL after refilling {kl}");
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
            (KvType::Q4, KvType::Q4, 2e-2),
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
    let base =
        log_probs(&mut Context::new(Arc::clone(&m), params(128, KvType::F16, KvType::F16)), &toks);
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
    for kv in [KvType::Q8, KvType::Q4] {
        let mut ctx = Context::new(Arc::clone(&m), params(256, kv, kv));
        let toks = tokens(64, c.n_vocab);
        log_probs(&mut ctx, &toks[..40]);
        let used = ctx.kv.bytes_used();
        let before = ctx.kv.read_keys(0, 0, 39).unwrap();
        ctx.kv.seq_fork(0, 1).unwrap();
        assert_eq!(ctx.kv.bytes_used(), used, "{kv}: a fork copies no KV bytes");
        assert_eq!(ctx.kv.read_keys(1, 0, 39).unwrap(), before);
        // Sequence 1 rewrites position 39 with another token: its last block (per layer) is copied.
        let mut b = Batch::default();
        b.push((toks[39] + 1) % c.n_vocab as u32, 39, 1, true);
        ctx.decode(&b).unwrap();
        let block_bytes = ctx.kv.bytes_per_token() * 32;
        assert_eq!(ctx.kv.bytes_used(), used + block_bytes, "{kv}");
        assert_eq!(
            ctx.kv.read_keys(0, 0, 39).unwrap(),
            before,
            "{kv}: the source sequence is untouched"
        );
        assert_ne!(ctx.kv.read_keys(1, 0, 39).unwrap(), before, "{kv}");
        // Sequence 1 fills (and, with q4 keys, quantizes) its copy of the block.
        log_probs_at(&mut ctx, 1, 40, &toks[40..]);
        assert_eq!(ctx.kv.read_keys(0, 0, 39).unwrap(), before, "{kv}: still untouched");
        ctx.kv.seq_clear(0);
        ctx.kv.seq_clear(1);
        assert_eq!(ctx.kv.bytes_used(), 0);
    }
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
        assert!(ctx.kv.read_keys(0, 0, 2).is_some(), "sink positions are kept");
    }
    // Sinks block + the window and the positions kept behind it for a draft's rollback
    // (64 + ROLLBACK_TOKENS = 80 positions span at most 4 blocks) per layer.
    assert_eq!(model::kv::ROLLBACK_TOKENS, 16);
    let bound = 5 * 32 * ctx.kv.bytes_per_token();
    assert!(peak <= bound, "{peak} > {bound}");
    assert!(ctx.kv.read_keys(0, 0, 500).is_none(), "positions outside the window are freed");
    assert!(ctx.kv.seq_evicted(0));
    let _ = c;
}

#[test]
fn native_sliding_window_layers_hold_at_most_the_window_plus_a_block() {
    let m = tiny("gemma3");
    let c = &m.config;
    let Some((il, w)) = c.layers.iter().enumerate().find_map(|(i, l)| l.window.map(|w| (i, w)))
    else {
        panic!("tiny-gemma3 has no sliding-window layer");
    };
    let n = (w + 100).min(1024);
    let mut ctx = Context::new(Arc::clone(&m), params(n + 8, KvType::F16, KvType::F16));
    log_probs(&mut ctx, &tokens(n, c.n_vocab));
    let held = (0..n).filter(|&p| ctx.kv.read_keys(0, il, p).is_some()).count();
    assert!(held <= w + 32 + 64, "layer {il} (window {w}) holds {held} positions");
    if n > w + 64 + 32 {
        assert!(held < n, "layer {il} freed nothing");
    }
}
