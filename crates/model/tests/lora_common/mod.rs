//! Helpers of the LoRA tests: the tiny seeded qwen2 model, adapters of seeded random weights
//! and a context run alone.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::Arc;

use gguf::{GgmlType, GgufFile};
use model::lora::{write_adapter, AdapterTensor};
use model::{names, Batch, Context, ContextParams, Lora, LoraError, Model};

pub fn tiny() -> Arc<Model> {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../testdata/refdata/tiny/tiny-qwen2.gguf");
    Arc::new(Model::load(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display())))
}

/// Deterministic values in [-amp, amp).
pub fn values(n: usize, seed: u64, amp: f32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * amp
        })
        .collect()
}

/// An adapter of rank `rank` on `suffixes` of every layer, its `B` large enough to move logits.
pub fn tensors(
    m: &Model,
    suffixes: &[&str],
    rank: usize,
    ty: GgmlType,
    seed: u64,
) -> Vec<AdapterTensor> {
    let c = &m.config;
    let mut out = Vec::new();
    for il in 0..c.n_layer {
        for (i, s) in suffixes.iter().enumerate() {
            let (n_in, n_out) = match *s {
                names::ATTN_Q => (c.n_embd, c.q_dim()),
                names::ATTN_K | names::ATTN_V => (c.n_embd, c.kv_dim()),
                names::ATTN_OUTPUT => (c.q_dim(), c.n_embd),
                names::FFN_GATE | names::FFN_UP => (c.n_embd, c.n_ff),
                _ => (c.n_ff, c.n_embd),
            };
            let seed = seed * 1000 + il as u64 * 10 + i as u64;
            out.push(AdapterTensor {
                weight: names::layer_tensor(il, s),
                ty,
                rank,
                a: values(rank * n_in, seed, 1.0 / (n_in as f32).sqrt()),
                b: values(n_out * rank, seed + 7, 0.5),
            });
        }
    }
    out
}

pub fn file(arch: &str, alpha: f32, t: &[AdapterTensor]) -> GgufFile {
    GgufFile::from_bytes(write_adapter(Vec::new(), arch, alpha, t).expect("write adapter"))
        .expect("parse adapter")
}

pub fn load(m: &Model, arch: &str, t: &[AdapterTensor]) -> Result<Lora, LoraError> {
    Lora::from_gguf(&file(arch, 16.0, t), &m.config, "test".into())
}

/// Writes an adapter (qwen2, alpha 16) to `dir/name.gguf` and returns its path.
pub fn write_file(dir: &Path, name: &str, t: &[AdapterTensor]) -> PathBuf {
    let p = dir.join(format!("{name}.gguf"));
    let f = std::fs::File::create(&p).expect("create adapter file");
    let w = write_adapter(std::io::BufWriter::new(f), "qwen2", 16.0, t).expect("write adapter");
    w.into_inner().expect("flush adapter file");
    p
}

/// A fresh directory for one test's files.
pub fn scratch_dir(test: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("snug-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("create scratch dir");
    d
}

/// Logits of every position of `toks` for sequence `seq` of a fresh context with `set` on it.
pub fn alone(m: &Arc<Model>, set: &[(Arc<Lora>, f32)], toks: &[u32]) -> Vec<Vec<f32>> {
    let mut ctx = Context::new(Arc::clone(m), params(1));
    ctx.set_adapters(0, set).expect("set adapters");
    let mut b = Batch::default();
    for (i, &t) in toks.iter().enumerate() {
        b.push(t, i, 0, true);
    }
    ctx.decode(&b).expect("decode");
    (0..toks.len()).map(|i| ctx.logits(i).to_vec()).collect()
}

pub fn params(n_seq: usize) -> ContextParams {
    ContextParams {
        n_ctx: 64,
        n_ubatch: 64,
        n_outputs_max: 64,
        n_seq_max: n_seq,
        n_threads: 2,
        ..ContextParams::default()
    }
}
