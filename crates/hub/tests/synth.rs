//! `synth` writes files that parse, carry the planned types, are reproducible from the seed
//! (whatever the thread count), hold weights with the asked statistics and, for every
//! architecture, load in snug's model crate and run a token.

use gguf::{GgmlType, GgufFile};
use hub::synth::{self, Recipe, SynthOptions};

fn tiny(name: &str, f: impl FnOnce(&mut SynthOptions)) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("m.gguf");
    let mut opts = SynthOptions::new(synth::shape(name).unwrap());
    f(&mut opts);
    synth::synth(&opts, None, &out).unwrap();
    (dir, out)
}

fn stats(f: &GgufFile, name: &str) -> (f64, f64) {
    let t = f.tensor(name).unwrap();
    let mut v = vec![0f32; t.n_elements() as usize];
    quant::dequantize_row(t.ggml_type, f.tensor_data(t), &mut v).unwrap();
    let mean = v.iter().map(|&x| x as f64).sum::<f64>() / v.len() as f64;
    let var = v.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / v.len() as f64;
    (mean, var.sqrt())
}

#[test]
fn a_tiny_qwen2_parses_with_the_planned_layout() {
    let (_d, out) = tiny("tiny-qwen2", |_| {});
    let f = GgufFile::open(&out).unwrap();
    assert_eq!(f.architecture(), Some("qwen2"));
    assert_eq!(f.get_u64("qwen2.block_count"), Some(2));
    assert_eq!(f.get_u64("general.file_type"), Some(15));
    assert_eq!(f.get_array("tokenizer.ggml.tokens").unwrap().len(), 257);
    let plan = synth::plan(synth::shape("tiny-qwen2").unwrap(), 257, Recipe::Q4KM);
    assert_eq!(f.tensors.len(), plan.len());
    for (t, p) in f.tensors.iter().zip(&plan) {
        assert_eq!((&t.name, &t.dims, t.ggml_type), (&p.name, &p.dims, p.ggml_type));
    }
    assert_eq!(f.tensor("output.weight").unwrap().ggml_type, GgmlType::Q6K);
    assert_eq!(f.tensor("blk.0.attn_q.bias").unwrap().dims, vec![256]);
    assert!(!out.with_extension("gguf.partial").exists());
}

#[test]
fn weights_and_norms_have_the_asked_statistics() {
    for exact in [false, true] {
        let (_d, out) = tiny("tiny-llama", |o| o.exact = exact);
        let f = GgufFile::open(&out).unwrap();
        let (m, s) = stats(&f, "blk.1.ffn_up.weight");
        assert!(m.abs() < 2e-3 && (0.015..0.025).contains(&s), "exact={exact}: mean {m} std {s}");
        let (m, s) = stats(&f, "blk.0.attn_norm.weight");
        assert!((m - 1.0).abs() < 0.01 && s < 0.03, "norm mean {m} std {s}");
        assert!(f.tensor("rope_freqs.weight").is_some());
    }
}

#[test]
fn conditioned_weights_are_scaled_by_fan_in_and_depth() {
    // tiny-qwen3moe: 256 wide, 2 layers, experts 128 wide (router f32, experts Q4_K / Q6_K).
    let (_d, out) = tiny("tiny-qwen3moe", |o| o.conditioned = true);
    let f = GgufFile::open(&out).unwrap();
    let near = |name: &str, want: f64| {
        let (m, s) = stats(&f, name);
        assert!(m.abs() < 0.05 * want && (s / want - 1.0).abs() < 0.1, "{name}: {m} {s} ≠ {want}");
    };
    near("token_embd.weight", 1.0);
    near("blk.0.attn_q.weight", 1.0 / 16.0);
    near("blk.1.ffn_gate_inp.weight", 1.0 / 16.0);
    near("blk.1.ffn_up_exps.weight", 1.0 / 16.0);
    near("blk.0.attn_output.weight", 1.0 / (256.0f64 * 4.0).sqrt());
    near("blk.1.ffn_down_exps.weight", 1.0 / (128.0f64 * 4.0).sqrt());
    near("output.weight", 4.0 / 16.0);
    assert_eq!(f.get("snug.synth.conditioned"), Some(&gguf::Value::Bool(true)));
}

#[test]
fn tiled_matrices_draw_every_block_apart() {
    // tiny-llama's ffn_down: 256 rows of 512 values, two K-quant blocks each, tiled from a pool of
    // 64 rows. Drawn whole, the rows would be at most 64 different ones (a matrix of rank 64,
    // its rows shared with every matrix of that type and width); drawn block by block, from
    // 128 blocks, nearly all 256 differ.
    let (_d, out) = tiny("tiny-llama", |_| {});
    let f = GgufFile::open(&out).unwrap();
    let t = f.tensor("blk.0.ffn_down.weight").unwrap();
    assert_eq!((t.dims[0], t.ggml_type.block_size()), (512, 256));
    let w = t.ggml_type.row_bytes(512).unwrap();
    let rows: std::collections::HashSet<&[u8]> = f.tensor_data(t).chunks(w).collect();
    assert!(rows.len() > 240, "{} different rows of 256", rows.len());
}

#[test]
fn the_same_seed_gives_the_same_bytes_whatever_the_thread_count() {
    for exact in [false, true] {
        let (_a, a) = tiny("tiny-qwen2", |o| {
            o.seed = 5;
            o.threads = 1;
            o.exact = exact;
        });
        let (_b, b) = tiny("tiny-qwen2", |o| {
            o.seed = 5;
            o.threads = 3;
            o.exact = exact;
        });
        let (_c, c) = tiny("tiny-qwen2", |o| {
            o.seed = 6;
            o.exact = exact;
        });
        let (a, b, c) =
            (std::fs::read(a).unwrap(), std::fs::read(b).unwrap(), std::fs::read(c).unwrap());
        assert!(a == b, "exact={exact}: thread count changed the file");
        assert!(a != c, "exact={exact}: seed did not change the file");
    }
}

#[test]
fn other_recipes_write_uniform_types() {
    for (recipe, ty) in [(Recipe::Q8_0, GgmlType::Q8_0), (Recipe::F16, GgmlType::F16)] {
        let (_d, out) = tiny("tiny-qwen2", |o| o.recipe = recipe);
        let f = GgufFile::open(&out).unwrap();
        for t in f.tensors.iter().filter(|t| t.dims.len() == 2) {
            assert_eq!(t.ggml_type, ty, "{}", t.name);
        }
    }
}

#[test]
fn the_tokenizer_is_copied_from_a_real_model() {
    let src = GgufFile::open(hub::ensure("qwen2.5-coder-0.5b").unwrap()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("m.gguf");
    let opts = SynthOptions::new(synth::shape("tiny-qwen2").unwrap());
    synth::synth(&opts, Some(&src), &out).unwrap();
    let f = GgufFile::open(&out).unwrap();
    for (k, v) in src.metadata.iter().filter(|(k, _)| k.starts_with("tokenizer.")) {
        assert_eq!(f.get(k), Some(v), "{k}");
    }
    assert_eq!(f.tensor("token_embd.weight").unwrap().dims, vec![256, 151936]);
}

#[test]
fn a_source_without_a_tokenizer_is_refused() {
    let mut w = gguf::GgufWriter::new(Vec::new());
    w.add_kv("general.architecture", gguf::Value::String("llama".into()));
    w.write_header().unwrap();
    let src = GgufFile::from_bytes(w.finish().unwrap()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let opts = SynthOptions::new(synth::shape("tiny-qwen2").unwrap());
    let e = synth::synth(&opts, Some(&src), &dir.path().join("m.gguf")).unwrap_err();
    assert!(matches!(e, synth::SynthError::NoTokenizer), "{e}");
    assert!(e.to_string().contains("a real model"));
}

#[test]
fn every_architecture_loads_in_snug_and_runs_a_token() {
    use std::sync::Arc;
    for name in
        ["tiny-llama", "tiny-qwen2", "tiny-gemma2", "tiny-gemma3", "tiny-phi3", "tiny-mistral"]
    {
        let (_d, out) = tiny(name, |_| {});
        let m = Arc::new(model::Model::load(&out).unwrap_or_else(|e| panic!("{name}: {e}")));
        let shape = synth::shape(name).unwrap();
        assert_eq!(m.config.head_dim, shape.head_dim(), "{name}");
        assert_eq!(m.config.n_vocab, shape.n_vocab.unwrap_or(257), "{name}");
        let p = model::ContextParams {
            n_ctx: 16,
            n_ubatch: 2,
            n_outputs_max: 2,
            n_threads: 2,
            ..model::ContextParams::default()
        };
        let mut ctx = model::Context::new(Arc::clone(&m), p);
        let mut b = model::Batch::default();
        b.push(1, 0, 0, false);
        b.push(2, 1, 0, true);
        ctx.decode(&b).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(ctx.logits(0).iter().all(|x| x.is_finite()), "{name}");
    }
}

#[test]
fn real_shapes_have_the_keys_and_tensors_llama_cpp_reads() {
    let (_d, out) = tiny("tiny-gemma2", |_| {});
    let f = GgufFile::open(&out).unwrap();
    assert_eq!(f.get_u64("gemma2.attention.key_length"), Some(256));
    assert_eq!(f.get_u64("gemma2.attention.sliding_window"), Some(4096));
    assert_eq!(f.get_f64("gemma2.attn_logit_softcapping"), Some(50.0));
    assert!(f.tensor("output.weight").is_none(), "gemma ties its embedding");
    assert_eq!(f.tensor("token_embd.weight").unwrap().ggml_type, GgmlType::Q6K);
    assert!(f.tensor("blk.1.post_ffw_norm.weight").is_some());
    let (_d, out) = tiny("tiny-phi3", |_| {});
    let f = GgufFile::open(&out).unwrap();
    assert_eq!(f.tensor("blk.0.attn_qkv.weight").unwrap().dims, vec![256, 768]);
    assert_eq!(f.tensor("blk.0.attn_qkv.weight").unwrap().ggml_type, GgmlType::Q5K);
    assert_eq!(f.tensor("blk.0.ffn_up.weight").unwrap().dims, vec![256, 1024]);
    assert!(f.tensor("blk.0.attn_q.weight").is_none());
}
