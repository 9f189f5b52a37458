//! Times `model::attention::attention` against the key-by-key implementation it replaced, on
//! random KV of a given shape: decode at a depth, or a prefill batch. Old and new alternate, so
//! a busy machine slows both alike; min and median per call are printed.
//!
//! `cargo run --release -p model --example attn_bench -- [decode|prefill] DEPTH_OR_N KV THREADS REPS [N_HEAD N_HEAD_KV HEAD_DIM]`

use std::sync::Arc;
use std::time::Instant;

use model::attention::{attention, one_layer_config, scratch_floats};
use model::kv::{kernels, key_scratch_floats, KvCache};
use model::{Batch, ContextParams, KvType, Model, ModelConfig};
use quant::threads::ThreadPool;

struct SendPtr(*mut f32);
// SAFETY: only dereferenced for disjoint per-item output chunks and per-thread scratch rows.
unsafe impl Sync for SendPtr {}
unsafe impl Send for SendPtr {}

/// The attention of commit 2cdd5cd: every key scored one at a time, scalar softmax, one axpy
/// per key and query head.
#[allow(clippy::too_many_arguments)]
fn old_attention(
    pool: &ThreadPool,
    c: &ModelConfig,
    kv: &KvCache,
    batch: &Batch,
    n: usize,
    q: &[f32],
    out: &mut [f32],
    tmp: &mut [f32],
) {
    let (hd, hdv) = (c.head_dim, c.head_dim_v);
    let group = c.n_head / c.n_head_kv;
    let lw = kv.layer_window(0);
    let max_keys = kv.max_keys();
    let tmp_stride = group * max_keys + key_scratch_floats(hd).max(hdv);
    let (vt, rot_v) = (kv.v_type, kv.rotate_v());
    let kern = kernels();
    let tmp_base = SendPtr(tmp.as_mut_ptr());
    let outp = SendPtr(out.as_mut_ptr());
    let n_items = n * c.n_head_kv;
    pool.run(|ith, nth| {
        let (tmp_base, outp) = (&tmp_base, &outp);
        let mut item = ith;
        while item < n_items {
            // SAFETY: item `item` owns its `group × hdv` output chunk (items are disjoint).
            let o = unsafe {
                std::slice::from_raw_parts_mut(outp.0.add(item * group * hdv), group * hdv)
            };
            let (t, kvh) = (item / c.n_head_kv, item % c.n_head_kv);
            let (seq, pos) = (batch.seq[t], batch.pos[t]);
            o.fill(0.0);
            let view = kv.layer(seq, 0).unwrap();
            let (sinks, recent) = lw.ranges(pos);
            let n_keys = sinks.len() + recent.clone().count();
            let q0 = t * c.q_dim() + kvh * group * hd;
            // SAFETY: scratch row `ith` is used by thread `ith` alone.
            let row = unsafe {
                std::slice::from_raw_parts_mut(tmp_base.0.add(ith * tmp_stride), tmp_stride)
            };
            let (scores, krow) = row.split_at_mut(group * max_keys);
            let qg = &q[q0..q0 + group * hd];
            let n_sinks = sinks.len();
            view.key_scores(kvh, sinks.clone(), qg, scores, n_keys, krow);
            view.key_scores(
                kvh,
                *recent.start()..pos + 1,
                qg,
                &mut scores[n_sinks..],
                n_keys,
                krow,
            );
            for g in 0..group {
                let sg = &mut scores[g * n_keys..(g + 1) * n_keys];
                for sc in sg.iter_mut().filter(|sc| sc.is_finite()) {
                    *sc *= c.attn_scale;
                }
                let max = sg.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let mut sum = 0.0;
                for sc in sg.iter_mut() {
                    *sc = (*sc - max).exp();
                    sum += *sc;
                }
                let inv = 1.0 / sum;
                sg.iter_mut().for_each(|sc| *sc *= inv);
            }
            for (jj, j) in sinks.chain(recent).enumerate() {
                let Some(vb) = view.value(j, kvh) else { continue };
                kern.dequant(vt, vb, &mut krow[..hdv]);
                for g in 0..group {
                    (kern.axpy)(
                        &mut o[g * hdv..(g + 1) * hdv],
                        scores[g * n_keys + jj],
                        &krow[..hdv],
                    );
                }
            }
            if rot_v {
                o.chunks_mut(hdv).for_each(model::kv::format::hadamard);
            }
            item += nth;
        }
    });
}

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
    let mut tmp_new = vec![0.0; scratch_floats(&c, nth)];
    let mut tmp_old = vec![0.0; nth * ((nh / nkv) * kv.max_keys() + 3 * hd)];
    let (mut o_new, mut o_old) = (vec![0.0; n * c.q_dim()], vec![0.0; n * c.q_dim()]);
    let (mut t_new, mut t_old) = (Vec::new(), Vec::new());
    for _ in 0..reps {
        let t = Instant::now();
        old_attention(&pool, &c, &kv, &batch, n, &q, &mut o_old, &mut tmp_old);
        t_old.push(t.elapsed().as_secs_f64());
        let t = Instant::now();
        attention(&pool, &c, &kv, 0, &batch, 0, n, &q, &mut o_new, &mut tmp_new);
        t_new.push(t.elapsed().as_secs_f64());
    }
    let err = o_new.iter().zip(&o_old).fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
    for v in [&mut t_old, &mut t_new] {
        v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    }
    let keys = if mode == "decode" { depth as f64 } else { (depth * (depth + 1) / 2) as f64 };
    for (name, t) in [("old", &t_old), ("new", &t_new)] {
        println!("{mode} {depth} {kvt} threads {nth}: {name} min {:.3} ms median {:.3} ms ({:.0} ns per key-head, min)", t[0] * 1e3, t[t.len() / 2] * 1e3, t[0] * 1e9 / (keys * nkv as f64));
    }
    println!(
        "speedup (median) {:.2}x; max |new - old| = {err:.2e}",
        t_old[t_old.len() / 2] / t_new[t_new.len() / 2]
    );
}
