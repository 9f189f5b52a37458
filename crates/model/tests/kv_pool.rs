//! The KV cache in the page pool it shares with the adapter store (issue 15): the prefix cache
//! is keyed by adapter set (another salt misses); past 90% full, cached blocks and then unpinned
//! adapters are shed down to 80%, blocks of running sequences and pinned adapters never.

mod lora_common;

use gguf::GgmlType;
use lora_common::{params, scratch_dir, tensors, tiny, write_file};
use model::kv::pool::PagePool;
use model::kv::{KvCache, BLOCK_TOKENS};
use model::lora::{AdapterStore, Tier};
use model::names;
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

#[test]
fn past_90_percent_cached_blocks_are_shed_to_80_and_running_ones_never() {
    let m = tiny();
    let cfg = &m.config;
    let l = cfg.n_layer;
    let mut kv = KvCache::new(cfg, &ContextParams { n_ctx: 512, ..params(2) });
    let pool = PagePool::new(kv.block_bytes(), 10 * l, 0);
    kv.attach_pool(pool.clone()).expect("attach");
    let b = BLOCK_TOKENS;
    // Four cached blocks per layer (40%), left by a finished sequence.
    let toks: Vec<u32> = (0..4 * b as u32 + 1).collect();
    fill(&mut kv, cfg, 0, 4 * b);
    kv.prefix_register(0, &toks, 0);
    kv.seq_clear(0);
    assert_eq!(pool.stats().kv, 4 * l);
    // A running sequence takes four more: 80%, below the start mark, nothing shed.
    fill(&mut kv, cfg, 1, 4 * b);
    assert_eq!((pool.stats().kv, pool.stats().evictions[0]), (8 * l, 0));
    // Its fifth block per layer crosses 90%: cached blocks go until 80%.
    fill(&mut kv, cfg, 1, 5 * b);
    let st = pool.stats();
    assert!(st.kv <= 8 * l, "{st:?}");
    assert!(st.evictions[0] >= l as u64, "{st:?}");
    assert_eq!(kv.prefix_adopt(0, &toks, 0), 3 * b, "the leaf went first");
    kv.seq_clear(0);
    // Up to the whole pool: every cached block goes, the running sequence keeps all of its.
    fill(&mut kv, cfg, 1, 10 * b);
    assert_eq!(pool.stats().kv, 10 * l);
    assert_eq!(kv.prefix_adopt(0, &toks, 0), 0);
    for pos in [0, 5 * b, 10 * b - 1] {
        assert!(kv.read_keys(1, 0, pos).is_some(), "position {pos} of the running sequence");
    }
    let e = kv.write(
        1,
        0,
        10 * b,
        &vec![0.0; cfg.n_head_kv * cfg.head_dim],
        &vec![0.0; cfg.n_head_kv * cfg.head_dim_v],
    );
    let e = e.unwrap_err().to_string();
    assert!(e.contains("pool full") && e.contains("give it more memory"), "{e}");
    kv.seq_clear(1);
    assert_eq!(pool.stats().kv, 0, "every page given back");
}

#[test]
fn under_pressure_the_kv_cache_drops_unpinned_adapters_and_keeps_pinned_ones() {
    let m = tiny();
    let cfg = &m.config;
    let l = cfg.n_layer;
    let dir = scratch_dir("kv-pool-adapters");
    let mut kv = KvCache::new(cfg, &ContextParams { n_ctx: 1024, ..params(1) });
    let t = |seed| tensors(&m, &[names::ATTN_K], 2, GgmlType::F32, seed);
    let probe = AdapterStore::new(cfg, 1 << 30);
    probe.register("p", &write_file(&dir, "p", &t(1))).unwrap();
    let per = probe.list()[0].bytes_hot.div_ceil(kv.block_bytes());
    let pool = PagePool::new(kv.block_bytes(), 20 * l, 2 * per);
    kv.attach_pool(pool.clone()).unwrap();
    let store = AdapterStore::with_pool(cfg, pool.clone());
    for n in ["pinned", "idle"] {
        store.register(n, &write_file(&dir, n, &t(2))).unwrap();
    }
    let pinned = store.acquire("pinned").unwrap();
    drop(store.acquire("idle").unwrap());
    assert_eq!(pool.stats().adapter, 2 * per);
    // KV past 90% of the whole pool: nothing cached to shed, so adapters go (to cold: the
    // scheduler's thread never quantizes), the pinned one stays.
    let need = (pool.capacity() * 9).div_ceil(10) - 2 * per;
    fill(&mut kv, cfg, 0, need.div_ceil(l) * BLOCK_TOKENS);
    let tier = |n: &str| store.list().into_iter().find(|i| i.name == n).unwrap().tier;
    assert_eq!((tier("pinned"), tier("idle")), (Tier::Hot, Tier::Cold));
    let st = store.stats();
    assert_eq!((st.evictions, st.pool.adapter), (1, per));
    drop(pinned);
}
