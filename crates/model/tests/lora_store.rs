//! The adapter store (issue 15): registration checks and errors, listing, tiers (a cold adapter
//! is promoted on acquire, demoted when idle, a warm one gives output close to hot), leases pin
//! (a pinned adapter is never demoted, an unregistered one frees its pages when its last lease
//! drops), eviction order under a full pool, and the prefix salt.

mod lora_common;

use std::sync::Arc;
use std::time::Duration;

use gguf::GgmlType;
use lora_common::{alone, scratch_dir, tensors, tiny, write_file};
use model::lora::{salt, AdapterStore, Tier};
use model::{names, LoraError};

#[test]
fn register_list_unregister_and_their_errors() {
    let m = tiny();
    let dir = scratch_dir("store-register");
    let a = write_file(&dir, "a", &tensors(&m, &[names::ATTN_Q], 8, GgmlType::F16, 1));
    let b = write_file(&dir, "b", &tensors(&m, &[names::FFN_DOWN], 4, GgmlType::F32, 2));
    let store = AdapterStore::new(&m.config, 64 << 20);
    let info = store.register("zeta", &a).expect("register");
    assert_eq!((info.rank, info.tier, info.leases), (8, Tier::Cold, 0));
    assert_eq!(info.bytes_hot, 4 * 8 * 2 * m.config.n_embd * m.config.n_layer);
    store.register("alpha", &b).expect("register");
    let names: Vec<_> = store.list().into_iter().map(|i| i.name).collect();
    assert_eq!(names, ["alpha", "zeta"], "sorted by name");
    assert_eq!(store.stats().pool.adapter, 0, "registration loads nothing");

    assert!(matches!(store.register("zeta", &b), Err(LoraError::Duplicate(n)) if n == "zeta"));
    assert!(matches!(store.register("x", &dir.join("missing.gguf")), Err(LoraError::Gguf(_))));
    let mut bad = tensors(&m, &[names::ATTN_V], 4, GgmlType::F32, 3);
    bad[0].a.truncate(4 * 8);
    let bad = write_file(&dir, "bad", &bad);
    assert!(matches!(store.register("bad", &bad), Err(LoraError::BadShape { .. })));
    assert!(matches!(store.unregister("nope"), Err(LoraError::Unknown(_))));
    assert!(matches!(store.acquire("nope"), Err(LoraError::Unknown(_))));
    store.unregister("zeta").expect("unregister");
    assert_eq!(store.list().len(), 1);
    store.register("zeta", &a).expect("a name can be used again");
}

#[test]
fn acquire_promotes_idle_adapters_demote_and_warm_is_close_to_hot() {
    let m = tiny();
    let dir = scratch_dir("store-tiers");
    let t = tensors(&m, &[names::ATTN_Q, names::FFN_UP], 8, GgmlType::F16, 4);
    let path = write_file(&dir, "a", &t);
    let store = AdapterStore::new(&m.config, 64 << 20);
    store.register("a", &path).unwrap();
    let toks = [3, 1, 4, 1, 5];

    let lease = store.acquire("a").expect("acquire");
    let hot = alone(&m, &[(lease.lora().clone(), 1.0)], &toks);
    let bare = alone(&m, &[], &toks);
    assert_ne!(hot, bare);
    let st = store.stats();
    assert_eq!((st.hot, st.hits_cold, st.promotions), (1, 1, 1));
    let hot_pages = st.pool.adapter;
    assert!(hot_pages > 0);

    // Pinned: not demoted however idle.
    assert_eq!(store.demote_idle(Duration::ZERO), 0);
    drop(lease);
    assert_eq!(store.demote_idle(Duration::from_secs(3600)), 0, "not idle long enough");
    assert_eq!(store.demote_idle(Duration::ZERO), 1);
    let st = store.stats();
    assert_eq!((st.hot, st.warm, st.demotions), (0, 1, 1));
    assert!(st.pool.adapter < hot_pages, "warm takes fewer pages");

    // Warm → hot again: int8 rows, logits close to the f32 ones.
    let lease = store.acquire("a").unwrap();
    assert_eq!(store.stats().hits_warm, 1);
    let warm = alone(&m, &[(lease.lora().clone(), 1.0)], &toks);
    // The error int8 adds, against what the adapter changes.
    let dist = |x: &[Vec<f32>], y: &[Vec<f32>]| -> f32 {
        x.iter()
            .flatten()
            .zip(y.iter().flatten())
            .map(|(a, b)| (a - b) * (a - b))
            .sum::<f32>()
            .sqrt()
    };
    let (err, delta) = (dist(&warm, &hot), dist(&hot, &bare));
    eprintln!("warm vs hot: |warm - hot| = {err}, |hot - bare| = {delta}");
    assert!(err <= 0.05 * delta, "warm is off by {err}, the adapter moves logits by {delta}");
    assert_ne!(warm, hot, "int8 rows are not the f32 ones");
    assert_eq!(store.acquire("a").unwrap().lora().bytes(), lease.lora().bytes());
    assert_eq!(store.stats().hits_hot, 1);
    drop(lease);
    assert_eq!(store.demote_idle(Duration::ZERO), 1);
    assert_eq!(store.demote_idle(Duration::ZERO), 1, "warm → cold");
    let st = store.stats();
    assert_eq!((st.cold, st.pool.adapter, st.evictions), (1, 0, 1));
}

#[test]
fn a_full_pool_demotes_the_least_recently_used_unpinned_adapter_first() {
    let m = tiny();
    let dir = scratch_dir("store-evict");
    let t = |seed| tensors(&m, &[names::ATTN_Q, names::FFN_DOWN], 16, GgmlType::F32, seed);
    let paths: Vec<_> = (0..4).map(|i| write_file(&dir, &format!("a{i}"), &t(i + 10))).collect();
    let probe = AdapterStore::new(&m.config, 64 << 20);
    probe.register("p", &paths[0]).unwrap();
    let hot = probe.list()[0].bytes_hot;
    // Room for two and a half hot adapters.
    let store = AdapterStore::new(&m.config, hot * 5 / 2 + (64 << 10));
    for (i, p) in paths.iter().enumerate() {
        store.register(&format!("a{i}"), p).unwrap();
    }
    let l0 = store.acquire("a0").unwrap();
    drop(store.acquire("a1").unwrap());
    std::thread::sleep(Duration::from_millis(2));
    drop(store.acquire("a2").unwrap_or_else(|e| panic!("{e}")));
    // a0 is pinned, a1 is the least recently used: it goes first.
    let tier = |n: &str| store.list().into_iter().find(|i| i.name == n).unwrap().tier;
    assert_eq!(tier("a0"), Tier::Hot);
    assert_ne!(tier("a1"), Tier::Hot, "{:?}", store.list());
    assert_eq!(tier("a2"), Tier::Hot);
    assert!(store.stats().demotions >= 1);

    // Every page pinned: a clear error, nothing loaded.
    let l2 = store.acquire("a2").unwrap();
    let e = store.acquire("a3").unwrap_err().to_string();
    assert!(e.contains("pool full") && e.contains("fewer adapters"), "{e}");
    assert_eq!(tier("a3"), Tier::Cold);

    // Unregistering a pinned adapter frees its pages with its last lease.
    let before = store.stats().pool.adapter;
    store.unregister("a0").unwrap();
    assert_eq!(store.stats().pool.adapter, before, "still leased");
    let l0b = l0.clone();
    drop(l0);
    assert_eq!(store.stats().pool.adapter, before);
    drop(l0b);
    assert!(store.stats().pool.adapter < before);
    drop(l2);
}

#[test]
fn the_salt_names_the_adapter_set() {
    let m = tiny();
    let dir = scratch_dir("store-salt");
    let store = AdapterStore::new(&m.config, 64 << 20);
    for (i, n) in ["x", "y"].iter().enumerate() {
        let p = write_file(&dir, n, &tensors(&m, &[names::ATTN_K], 4, GgmlType::F32, i as u64));
        store.register(n, &p).unwrap();
    }
    let (x, y) = (store.acquire("x").unwrap(), store.acquire("y").unwrap());
    assert_eq!(salt(&[]), 0);
    let sx = store.salt(&[(x.clone(), 1.0)]);
    assert_ne!(sx, 0);
    assert_eq!(sx, salt(&[(x.clone(), 1.0)]));
    assert_ne!(sx, salt(&[(y.clone(), 1.0)]));
    assert_ne!(sx, salt(&[(x.clone(), 0.5)]));
    assert_ne!(sx, salt(&[(x.clone(), 1.0), (y.clone(), 1.0)]));
    // A new registration under the same name is another adapter.
    let path = store.list()[0].path.clone();
    drop(x);
    store.unregister("x").unwrap();
    store.register("x", &path).unwrap();
    assert_ne!(sx, salt(&[(store.acquire("x").unwrap(), 1.0)]));
    let _ = Arc::clone(y.lora());
}

/// The plan's share for n adapters holds them in whole pages whatever KV precision sizes the
/// pages: `share_bytes` against the pool's own page arithmetic, for sizes on and off page edges.
#[test]
fn the_share_holds_its_adapters_in_whole_pages_of_any_kv_precision() {
    use model::kv::{block_bytes, pool::PagePool};
    use model::KvType;
    let c = &tiny().config;
    for t in [KvType::F16, KvType::Q8, KvType::Q4] {
        let page = block_bytes(c, t, t);
        for bytes in [1, page - 1, page, page + 1, 7 * page + 3] {
            for n in [1, 3, 10] {
                let share = model::lora::share_bytes(c, n, bytes);
                let pool = PagePool::new(page, 0, share / page);
                assert!(
                    n * pool.pages_for(bytes) <= pool.adapter_limit(),
                    "{n} adapters of {bytes} B need {} pages of {page} B, the share {share} B gives {}",
                    n * pool.pages_for(bytes),
                    pool.adapter_limit()
                );
            }
        }
    }
}
