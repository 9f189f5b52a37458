//! The tensor plan: every tensor of a shape, in llama.cpp converter order, with its kind,
//! dimensions and type.

use gguf::GgmlType;

use super::{Arch, Recipe, Shape};

/// What a tensor is, for the type recipe and its random values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    TokenEmbd,
    Output,
    AttnQ,
    AttnK,
    AttnV,
    /// q, k and v in one matrix (phi3).
    AttnQkv,
    AttnOutput,
    FfnGate,
    FfnUp,
    FfnDown,
    /// The mixture-of-experts router: stays f32 (llama-quantize never quantizes it).
    FfnGateInp,
    /// 3-D stacks of every expert's gate, up and down matrices.
    FfnGateExps,
    FfnUpExps,
    FfnDownExps,
    /// A shared expert's gate, up and down (qwen2moe).
    FfnGateShexp,
    FfnUpShexp,
    FfnDownShexp,
    /// The shared expert's 1-D gate vector: stays f32, N(0, 0.02).
    FfnGateInpShexp,
    /// 1-D f32 LongRoPE divisors (computed, not random).
    RopeFactorsLong,
    RopeFactorsShort,
    /// 1-D: stays f32. Norm weights are 1 + N(0, 0.02).
    Norm,
    /// 1-D: stays f32, N(0, 0.02).
    Bias,
    /// 1-D f32 llama3 rope frequency factors (computed, not random).
    RopeFreqs,
}

/// One tensor of the plan.
#[derive(Clone, Debug)]
pub struct PlannedTensor {
    pub name: String,
    pub kind: Kind,
    pub dims: Vec<u64>,
    pub ggml_type: GgmlType,
}

/// The tensors of `shape` with `n_vocab` tokens, in llama.cpp converter order, typed by `recipe`.
pub fn plan(shape: &Shape, n_vocab: usize, recipe: Recipe) -> Vec<PlannedTensor> {
    let (n_embd, hd) = (shape.n_embd, shape.head_dim());
    let (q_dim, kv_dim) = (shape.n_head * hd, shape.n_head_kv * hd);
    let mut out = Vec::new();
    // attn_v, ffn_down, ffn_down_shexp: each counts layers, as llama-quantize's per-layer index
    let mut counters = [0usize; 3];
    let mut push = |name: String, kind: Kind, dims: Vec<u64>| {
        let ggml_type = match kind {
            Kind::Norm
            | Kind::Bias
            | Kind::RopeFreqs
            | Kind::RopeFactorsLong
            | Kind::RopeFactorsShort
            | Kind::FfnGateInp
            | Kind::FfnGateInpShexp => GgmlType::F32,
            _ => {
                let counter = match kind {
                    Kind::AttnV => Some(0),
                    Kind::FfnDown | Kind::FfnDownExps => Some(1),
                    Kind::FfnDownShexp => Some(2),
                    _ => None,
                };
                let i = counter.map_or(0, |c| {
                    counters[c] += 1;
                    counters[c] - 1
                });
                // A tied embedding is the output projection: llama.cpp types it as one.
                let as_kind =
                    if kind == Kind::TokenEmbd && shape.tied_embd { Kind::Output } else { kind };
                recipe.tensor_type(as_kind, i, shape.n_layer, dims[0] as usize)
            }
        };
        out.push(PlannedTensor { name, kind, dims, ggml_type });
    };
    let (e, v) = (n_embd as u64, n_vocab as u64);
    push("token_embd.weight".into(), Kind::TokenEmbd, vec![e, v]);
    if shape.llama3_rope.is_some() {
        push("rope_freqs.weight".into(), Kind::RopeFreqs, vec![hd as u64 / 2]);
    }
    if shape.longrope_orig_ctx.is_some() {
        let half = shape.n_rot() as u64 / 2;
        push("rope_factors_long.weight".into(), Kind::RopeFactorsLong, vec![half]);
        push("rope_factors_short.weight".into(), Kind::RopeFactorsShort, vec![half]);
    }
    let (ff, fused) = (shape.n_ff as u64, shape.arch == Arch::Phi3);
    for l in 0..shape.n_layer {
        let b = |t: &str| format!("blk.{l}.{t}");
        push(b("attn_norm.weight"), Kind::Norm, vec![e]);
        if fused {
            push(b("attn_qkv.weight"), Kind::AttnQkv, vec![e, (q_dim + 2 * kv_dim) as u64]);
        } else {
            for (t, kind, rows) in [
                ("attn_q", Kind::AttnQ, q_dim),
                ("attn_k", Kind::AttnK, kv_dim),
                ("attn_v", Kind::AttnV, kv_dim),
            ] {
                push(b(&format!("{t}.weight")), kind, vec![e, rows as u64]);
                if shape.qkv_bias {
                    push(b(&format!("{t}.bias")), Kind::Bias, vec![rows as u64]);
                }
            }
        }
        if shape.arch.qk_norm() {
            push(b("attn_q_norm.weight"), Kind::Norm, vec![hd as u64]);
            push(b("attn_k_norm.weight"), Kind::Norm, vec![hd as u64]);
        }
        push(b("attn_output.weight"), Kind::AttnOutput, vec![q_dim as u64, e]);
        if shape.arch.post_norms() {
            push(b("post_attention_norm.weight"), Kind::Norm, vec![e]);
        }
        push(b("ffn_norm.weight"), Kind::Norm, vec![e]);
        if let Some((n_exp, _, fe)) = shape.moe {
            let (n, fe) = (n_exp as u64, fe as u64);
            push(b("ffn_gate_inp.weight"), Kind::FfnGateInp, vec![e, n]);
            push(b("ffn_gate_exps.weight"), Kind::FfnGateExps, vec![e, fe, n]);
            push(b("ffn_down_exps.weight"), Kind::FfnDownExps, vec![fe, e, n]);
            push(b("ffn_up_exps.weight"), Kind::FfnUpExps, vec![e, fe, n]);
            if let Some(fs) = shape.n_ff_shexp {
                let fs = fs as u64;
                push(b("ffn_gate_inp_shexp.weight"), Kind::FfnGateInpShexp, vec![e]);
                push(b("ffn_gate_shexp.weight"), Kind::FfnGateShexp, vec![e, fs]);
                push(b("ffn_down_shexp.weight"), Kind::FfnDownShexp, vec![fs, e]);
                push(b("ffn_up_shexp.weight"), Kind::FfnUpShexp, vec![e, fs]);
            }
        } else if fused {
            push(b("ffn_up.weight"), Kind::FfnUp, vec![e, 2 * ff]);
        } else {
            push(b("ffn_gate.weight"), Kind::FfnGate, vec![e, ff]);
            push(b("ffn_up.weight"), Kind::FfnUp, vec![e, ff]);
        }
        if shape.moe.is_none() {
            push(b("ffn_down.weight"), Kind::FfnDown, vec![ff, e]);
        }
        if shape.arch.post_norms() {
            push(b("post_ffw_norm.weight"), Kind::Norm, vec![e]);
        }
    }
    push("output_norm.weight".into(), Kind::Norm, vec![e]);
    if !shape.tied_embd {
        push("output.weight".into(), Kind::Output, vec![e, v]);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::synth::shape;

    fn types_of(shape: &str, kind: Kind) -> Vec<GgmlType> {
        plan(shape_of(shape), 151936, Recipe::Q4KM)
            .into_iter()
            .filter(|t| t.kind == kind)
            .map(|t| t.ggml_type)
            .collect()
    }

    fn shape_of(name: &str) -> &'static Shape {
        shape(name).unwrap()
    }

    #[test]
    fn q4_k_m_mix_matches_the_real_qwen_1_5b_file() {
        // Layers with Q6_K attn_v / ffn_down in qwen2.5-coder-1.5b (tensor order 0..27).
        let v = types_of("qwen2.5-1.5b", Kind::AttnV);
        let six: Vec<usize> =
            v.iter().enumerate().filter(|(_, t)| **t == GgmlType::Q6K).map(|(i, _)| i).collect();
        assert_eq!(six, [0, 1, 2, 5, 8, 11, 14, 17, 20, 23, 24, 25, 26, 27]);
        assert_eq!(types_of("qwen2.5-1.5b", Kind::FfnDown), v);
        assert_eq!(types_of("qwen2.5-7b", Kind::Output), [GgmlType::Q6K]);
        assert_eq!(types_of("qwen2.5-7b", Kind::TokenEmbd), [GgmlType::Q4K]);
        assert!(types_of("qwen2.5-7b", Kind::FfnGate).iter().all(|t| *t == GgmlType::Q4K));
    }

    #[test]
    fn rows_that_are_not_whole_super_blocks_fall_back_like_llama_cpp() {
        // qwen2.5-0.5b (896 wide): the real file has Q5_0 where Q4_K would be, Q8_0 for Q6_K.
        assert_eq!(types_of("qwen2.5-0.5b", Kind::TokenEmbd), [GgmlType::Q5_0]);
        assert_eq!(types_of("qwen2.5-0.5b", Kind::Output), [GgmlType::Q8_0]);
        let v = types_of("qwen2.5-0.5b", Kind::AttnV);
        assert_eq!(v.iter().filter(|t| **t == GgmlType::Q8_0).count(), 12);
        assert_eq!(v.iter().filter(|t| **t == GgmlType::Q5_0).count(), 12);
        // ffn_down rows are 4864 = 19 × 256 wide: real K-quants.
        let d = types_of("qwen2.5-0.5b", Kind::FfnDown);
        assert_eq!(d.iter().filter(|t| **t == GgmlType::Q6K).count(), 12);
    }

    #[test]
    fn plans_have_the_real_tensor_counts_and_sizes() {
        let q = plan(shape_of("qwen2.5-7b"), 151936, Recipe::Q4KM);
        assert_eq!(q.len(), 28 * 12 + 3);
        let l = plan(shape_of("llama-3.1-8b"), 128256, Recipe::Q4KM);
        assert_eq!(l.len(), 32 * 9 + 4);
        let params: u64 = l.iter().map(|t| t.dims.iter().product::<u64>()).sum();
        assert!((8.0e9..8.1e9).contains(&(params as f64)), "{params}");
        let bytes: u64 =
            q.iter().map(|t| gguf::tensor_size(&t.name, &t.dims, t.ggml_type).unwrap()).sum();
        // Qwen2.5-7B-Instruct-Q4_K_M.gguf is 4.68 GB.
        assert!((4.55e9..4.75e9).contains(&(bytes as f64)), "{bytes}");
    }

    #[test]
    fn new_shapes_weigh_what_their_real_q4_k_m_files_do() {
        // Sizes of the Q4_K_M files people download (bartowski / ggml-org / TheBloke), GB.
        for (name, lo, hi) in [
            ("gemma-2-9b", 5.6e9, 5.9e9),
            ("gemma-2-2b", 1.6e9, 1.8e9),
            ("gemma-3-4b", 2.4e9, 2.6e9),
            ("llama-3.2-3b", 1.9e9, 2.1e9),
            ("phi-3-mini", 2.2e9, 2.45e9),
            ("mistral-7b", 4.25e9, 4.45e9),
            // Qwen3-8B-Q4_K_M 5.03 GB; Qwen3-0.6B-Q4_K_M 0.48 GB (its Q8_0 token embedding
            // aside, ~0.4); Phi-4-mini-instruct-Q4_K_M 2.49 GB; SmolLM3-3B-Q4_K_M 1.92 GB;
            // Qwen3-30B-A3B-Q4_K_M 18.6 GB.
            ("qwen3-8b", 4.8e9, 5.2e9),
            ("qwen3-0.6b", 0.35e9, 0.5e9),
            ("phi-4-mini", 2.3e9, 2.6e9),
            ("smollm3-3b", 1.8e9, 2.0e9),
            ("qwen3-30b-a3b", 17.0e9, 19.0e9),
        ] {
            let s = shape_of(name);
            let p = plan(s, s.n_vocab.unwrap(), Recipe::Q4KM);
            let bytes: u64 =
                p.iter().map(|t| gguf::tensor_size(&t.name, &t.dims, t.ggml_type).unwrap()).sum();
            assert!((lo..hi).contains(&(bytes as f64)), "{name}: {bytes}");
        }
    }
}
