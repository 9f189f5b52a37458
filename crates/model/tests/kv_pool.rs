//! The KV cache in the shared page pool (issue 15): the prefix cache is keyed by adapter set
//! (another salt misses).

mod lora_common;

use lora_common::{params, tiny};
use model::kv::{KvCache, BLOCK_TOKENS};
use model::ContextParams;

/// Writes `n` positions of `seq` in every layer (values made from the position).
fn fill(kv: &mut KvCache, cfg: &model::ModelConfig, seq: usize, n: usize) {
    let (k_len, v_len) = (cfg.n_head_kv * cfg.head_dim, cfg.n_head_kv * cfg.head_dim_v);
    for pos in kv.seq_len(seq)..n {
        let k = vec![pos as f32 * 0.01; k_len];
        let v = vec![pos as f32 * -0.01; v_len];
        for il in 0..cfg.n_layer {
            kv.write(seq, il, pos, &k, &v).expect("write");
        }
    }
}

#[test]
fn a_prefix_cached_under_one_adapter_set_is_not_reused_under_another() {
    let m = tiny();
    let cfg = &m.config;
    let mut kv = KvCache::new(cfg, &ContextParams { n_ctx: 256, ..params(3) });
    let toks: Vec<u32> = (0..3 * BLOCK_TOKENS as u32 + 1).collect();
    fill(&mut kv, cfg, 0, toks.len());
    kv.prefix_register(0, &toks, 42);
    kv.seq_clear(0);
    assert_eq!(kv.prefix_adopt(1, &toks, 7), 0, "another adapter set");
    assert_eq!(kv.prefix_adopt(1, &toks, 0), 0, "the bare model");
    assert_eq!(kv.prefix_adopt(1, &toks, 42), 3 * BLOCK_TOKENS, "the same set");
    // The bare model's own prefix is found under 0 only.
    fill(&mut kv, cfg, 2, toks.len());
    kv.prefix_register(2, &toks, 0);
    assert_eq!(kv.prefix_adopt(0, &toks, 0), 3 * BLOCK_TOKENS);
    assert_eq!(kv.prefix_adopt(0, &toks, 9), 0);
}
