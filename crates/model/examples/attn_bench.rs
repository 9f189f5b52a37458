//! Times `model::attention::attention` on random KV of a given shape: decode at a depth, or a
//! prefill batch; min and median per call are printed. Run it before and after a change,
//! alternating, to compare.
//!
//! `cargo run --release -p model --example attn_bench -- [decode|prefill] DEPTH_OR_N KV THREADS REPS [N_HEAD N_HEAD_KV HEAD_DIM]`

use std::sync::Arc;
use std::time::Instant;

use model::attention::{attention, one_layer_config, scratch_floats};
use model::kv::KvCache;
use model::{Batch, ContextParams, KvType, Model};
use quant::threads::ThreadPool;

fn main() {
    let a: Vec<String> = std::env::args().collect();
    let arg = |i: usize, d: &str| a.get(i).cloned().unwrap_or_else(|| d.to_string());
    let mode = arg(1, "decode");
    let depth: usize = arg(2, "4096").parse().unwrap();
    let kvt: KvType = arg(3, "f16").parse().unwrap();
    let nth: usize = arg(4, "1").parse().unwrap();
    let reps: usize = arg(5, "20").parse().unwrap();
    let (nh, nkv, hd): (usize, usize, usize) = (
        arg(6, "14").parse().unwrap(),
        arg(7, "2").parse().unwrap(),
        arg(8, "64").parse().unwrap(),
    );
    let p = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../testdata/refdata/tiny/tiny-qwen2.gguf");
    let m = Arc::new(Model::load(&p).unwrap());
    let c = one_layer_config(&m.config, nh, nkv, hd, None, None);
    let n_ctx = depth.next_multiple_of(32) + 32;
    let params =
        ContextParams { n_ctx, n_ubatch: 512, kv_k: kvt, kv_v: kvt, ..ContextParams::default() };
    let mut kv = KvCache::new(&c, &params);
    let mut s = 1u64;
    let mut r = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    };
    for p in 0..depth {
        let k: Vec<f32> = (0..c.kv_dim()).map(|_| r()).collect();
        let v: Vec<f32> = (0..c.kv_dim()).map(|_| r()).collect();
        kv.write(0, 0, p, &k, &v).unwrap();
    }
    let mut batch = Batch::default();
    if mode == "decode" {
        batch.push(0, depth - 1, 0, true);
    } else {
        (0..depth).for_each(|p| batch.push(0, p, 0, false));
    }
    let n = batch.len();
    let q: Vec<f32> = (0..n * c.q_dim()).map(|_| r()).collect();
    let pool = ThreadPool::new(nth);
    let mut tmp = vec![0.0; scratch_floats(&c, nth)];
    let mut out = vec![0.0; n * c.q_dim()];
    let mut t: Vec<f64> = (0..reps)
        .map(|_| {
            let t0 = Instant::now();
            attention(&pool, &c, &kv, 0, &batch, 0, n, &q, &mut out, &mut tmp);
            t0.elapsed().as_secs_f64()
        })
        .collect();
    t.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let keys = if mode == "decode" { depth as f64 } else { (depth * (depth + 1) / 2) as f64 };
    println!(
        "{mode} {depth} {kvt} threads {nth} ({}): min {:.3} ms median {:.3} ms ({:.0} ns per \
         key-head, min)",
        quant::kernels::isa(),
        t[0] * 1e3,
        t[t.len() / 2] * 1e3,
        t[0] * 1e9 / (keys * nkv as f64)
    );
}
