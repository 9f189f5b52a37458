//! Helpers of the KV tests: the tiny seeded models, a small context's parameters and a
//! deterministic token stream.
#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::Arc;

use model::{ContextParams, KvType, Model};

/// The tiny seeded model of `arch` (testdata/refdata/tiny).
pub fn tiny(arch: &str) -> Arc<Model> {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join(format!("../../testdata/refdata/tiny/tiny-{arch}.gguf"));
    Arc::new(Model::load(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display())))
}

/// A context of `n_ctx` tokens for two sequences on two threads, keys in `k` and values in `v`.
pub fn params(n_ctx: usize, k: KvType, v: KvType) -> ContextParams {
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
pub fn tokens(n: usize, n_vocab: usize) -> Vec<u32> {
    (0..n).map(|i| ((i as u64 * 2654435761 + 12345) % n_vocab as u64) as u32).collect()
}
