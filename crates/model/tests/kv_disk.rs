//! The prefix cache's disk tier through `KvCache` (issue 49): blocks the cache took are found
//! again by a new cache on the same directory (a restart) with the same bytes, under the same
//! adapter salt, KV precision and model identity only; blocks evicted from RAM come back.

mod lora_common;

use std::sync::atomic::Ordering;
use std::sync::Arc;

use lora_common::{params, scratch_dir, tiny};
use model::kv::disk::{DiskConfig, DiskStats};
use model::kv::{KvCache, KvType, BLOCK_TOKENS};
use model::ContextParams;

/// Writes `n` positions of `seq` in every layer (values made from the position).
fn fill(kv: &mut KvCache, cfg: &model::ModelConfig, seq: usize, n: usize) {
    let (k_len, v_len) = (cfg.n_head_kv * cfg.head_dim, cfg.n_head_kv * cfg.head_dim_v);
    for pos in kv.seq_len(seq)..n {
        let k: Vec<f32> = (0..k_len).map(|i| (pos * 7 + i) as f32 * 0.01).collect();
        let v: Vec<f32> = (0..v_len).map(|i| (pos * 3 + i) as f32 * -0.01).collect();
        for il in 0..cfg.n_layer {
            kv.write(seq, il, pos, &k, &v).expect("write");
        }
    }
}

fn cache(
    cfg: &model::ModelConfig,
    p: &ContextParams,
    disk: &DiskConfig,
) -> (KvCache, Arc<DiskStats>) {
    let mut kv = KvCache::new(cfg, p);
    let stats = Arc::new(DiskStats::default());
    kv.attach_disk(disk, stats.clone()).expect("attach the disk tier");
    (kv, stats)
}

#[test]
fn blocks_come_back_after_a_restart_with_the_same_bytes_under_the_same_key_only() {
    let m = tiny();
    let cfg = &m.config;
    let dir = scratch_dir("kv-disk-restart");
    let disk = DiskConfig::new(dir.clone(), 1 << 30, 11);
    for (i, kv_type) in [KvType::F16, KvType::Q4].into_iter().enumerate() {
        let p = ContextParams { n_ctx: 256, kv_k: kv_type, kv_v: kv_type, ..params(2) };
        let toks: Vec<u32> = (0..3 * BLOCK_TOKENS as u32 + 5).collect();
        let (mut kv, stats) = cache(cfg, &p, &disk);
        fill(&mut kv, cfg, 0, toks.len());
        kv.prefix_register(0, &toks, 42);
        let want: Vec<_> = (0..3 * BLOCK_TOKENS).map(|pos| kv.read_keys(0, 1, pos)).collect();
        drop(kv);
        // Written at registration (beside the other precision's files).
        assert_eq!(stats.files.load(Ordering::Relaxed), 3 * (i as u64 + 1), "{kv_type:?}");
        // A restart: a new cache on the same directory.
        let (mut kv, stats) = cache(cfg, &p, &disk);
        assert_eq!(kv.prefix_adopt(1, &toks, 7), 0, "another adapter set");
        assert_eq!(kv.prefix_adopt(1, &toks, 42), 3 * BLOCK_TOKENS, "{kv_type:?}");
        let got: Vec<_> = (0..3 * BLOCK_TOKENS).map(|pos| kv.read_keys(1, 1, pos)).collect();
        assert_eq!(got, want, "{kv_type:?}: the same keys");
        assert_eq!(stats.hits.load(Ordering::Relaxed), 3);
        // Now in RAM too: a second sequence takes them without reading.
        assert_eq!(kv.prefix_adopt(0, &toks, 42), 3 * BLOCK_TOKENS);
        assert_eq!(stats.hits.load(Ordering::Relaxed), 3);
        // Another model file (identity): nothing.
        let other = DiskConfig { identity: 12, ..disk.clone() };
        let (mut kv, _) = cache(cfg, &p, &other);
        assert_eq!(kv.prefix_adopt(1, &toks, 42), 0);
    }
    // Another KV precision than the one written: nothing, although the files are there.
    let p = ContextParams { n_ctx: 256, kv_k: KvType::Q8, kv_v: KvType::Q8, ..params(2) };
    let (mut kv, stats) = cache(cfg, &p, &disk);
    let toks: Vec<u32> = (0..3 * BLOCK_TOKENS as u32 + 5).collect();
    assert_eq!(kv.prefix_adopt(1, &toks, 42), 0);
    assert_eq!(stats.misses.load(Ordering::Relaxed), 1);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn blocks_evicted_from_ram_are_read_back_from_disk() {
    let m = tiny();
    let cfg = &m.config;
    let dir = scratch_dir("kv-disk-evict");
    let disk = DiskConfig::new(dir.clone(), 1 << 30, 11);
    // One sequence of 256 positions: 8 blocks per layer (and a few spare).
    let p = ContextParams { n_ctx: 256, ..params(1) };
    let (mut kv, stats) = cache(cfg, &p, &disk);
    let b = BLOCK_TOKENS;
    let first: Vec<u32> = (0..4 * b as u32 + 1).collect();
    fill(&mut kv, cfg, 0, first.len());
    kv.prefix_register(0, &first, 0);
    let want: Vec<_> = (0..4 * b).map(|pos| kv.read_keys(0, 0, pos)).collect();
    kv.seq_clear(0);
    assert!(kv.prefix_disk_flush(std::time::Duration::from_secs(10)));
    // Another prompt fills the whole context: the cached blocks are evicted from RAM.
    let second: Vec<u32> = (1000..1000 + 8 * b as u32).collect();
    fill(&mut kv, cfg, 0, 8 * b - 1);
    kv.prefix_register(0, &second, 0);
    kv.seq_clear(0);
    assert!(kv.prefix_disk_flush(std::time::Duration::from_secs(10)));
    assert_eq!(kv.prefix_adopt(0, &first, 0), 4 * b, "all four blocks found");
    assert!(stats.hits.load(Ordering::Relaxed) > 0, "some of them came from disk");
    let got: Vec<_> = (0..4 * b).map(|pos| kv.read_keys(0, 0, pos)).collect();
    assert_eq!(got, want);
    let _ = std::fs::remove_dir_all(&dir);
}
