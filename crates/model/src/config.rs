//! Typed model configuration, read once from GGUF metadata and validated at load. No metadata
//! string keys are looked up outside this file; the forward pass reads only [`ModelConfig`].

use gguf::GgufFile;

use crate::arch::{Arch, ArchSpec, Gating};
use crate::ModelError;

/// Per-layer attention shape: gemma2/3 alternate sliding-window and global layers.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LayerAttn {
    /// Keys further back than this many positions are masked (`None`: full causal attention).
    pub window: Option<usize>,
    pub rope_base: f32,
    /// Position multiplier (1 / linear scaling factor).
    pub rope_freq_scale: f32,
    /// q and k are rotated (false on SmolLM3's NoPE layers).
    pub rope: bool,
}

/// A mixture-of-experts FFN's shape and router (`{arch}.expert_*` keys).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MoeConfig {
    pub n_expert: usize,
    /// Experts each token uses (top-k).
    pub n_expert_used: usize,
    /// Hidden width of one expert.
    pub n_ff_exp: usize,
    pub gating: Gating,
    /// Chosen experts' weights renormalised to sum to 1.
    pub norm_weights: bool,
    /// Multiplier on the chosen weights (1 when the file does not say).
    pub weights_scale: f32,
    /// Hidden width of the shared expert; 0 when the model has none.
    pub n_ff_shexp: usize,
}

#[derive(Clone, Debug)]
pub struct ModelConfig {
    pub arch: Arch,
    pub spec: ArchSpec,
    pub name: String,
    pub n_vocab: usize,
    pub n_embd: usize,
    pub n_layer: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    /// Query/key head size.
    pub head_dim: usize,
    /// Value head size (equal to `head_dim` in every supported architecture).
    pub head_dim_v: usize,
    pub n_ff: usize,
    /// Dimensions rotated by RoPE (≤ head_dim).
    pub n_rot: usize,
    pub n_ctx_train: usize,
    pub rms_eps: f32,
    /// Multiplier applied to q before q·k.
    pub attn_scale: f32,
    /// `cap * tanh(score / cap)` on attention scores.
    pub attn_softcap: Option<f32>,
    /// `cap * tanh(logit / cap)` on output logits.
    pub final_softcap: Option<f32>,
    /// Multiplier on the token embedding (gemma: sqrt(n_embd)).
    pub embd_scale: f32,
    /// Multiplier on RoPE's cos and sin, so on the rotated part of q and of k
    /// (`rope.scaling.attn_factor`: Phi-4-mini's LongRoPE attention factor).
    pub rope_attn_factor: f32,
    /// Context the model was trained at before long-context scaling
    /// (`rope.scaling.original_context_length`): past it, Phi's LongRoPE uses its long factors.
    pub n_ctx_orig: usize,
    pub layers: Vec<LayerAttn>,
    /// The FFN of every layer is a mixture of experts.
    pub moe: Option<MoeConfig>,
    /// How the file says to pool token states into one embedding (`{arch}.pooling_type`);
    /// `None` when it does not say (decoder models).
    pub pooling: Option<Pooling>,
}

/// llama.cpp's pooling types (`{arch}.pooling_type`: 0 none, 1 mean, 2 cls, 3 last, 4 rank).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pooling {
    /// One vector per token, no pooling.
    None,
    /// The mean of every token's state.
    Mean,
    /// The first token's state.
    Cls,
    /// The last token's state.
    Last,
    /// A reranker's score head.
    Rank,
}

impl Pooling {
    /// The GGUF value's pooling (`None` for a value llama.cpp does not know).
    pub fn from_gguf(v: u64) -> Option<Pooling> {
        Some(match v {
            0 => Pooling::None,
            1 => Pooling::Mean,
            2 => Pooling::Cls,
            3 => Pooling::Last,
            4 => Pooling::Rank,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Pooling::None => "none",
            Pooling::Mean => "mean",
            Pooling::Cls => "cls",
            Pooling::Last => "last",
            Pooling::Rank => "rank",
        }
    }
}

/// The longest context snug uses when none is asked for (the model's training context when
/// shorter): past it, the KV cache of a 7–9B model outgrows the memory of the boxes snug is for.
pub const DEFAULT_CTX_MAX: usize = 4096;

/// Most layers, heads and channels per head a file may declare (the largest real models have
/// 126 layers, 128 heads, head size 256): bounds every per-token product the runtime forms, and
/// keeps a hostile header from making the per-layer tables huge.
pub const MAX_LAYERS: usize = 4096;
pub const MAX_HEADS: usize = 4096;
pub const MAX_HEAD_DIM: usize = 4096;

impl ModelConfig {
    /// The context a run uses when none is asked for: the training context, at most
    /// [`DEFAULT_CTX_MAX`], and at least `needed` (the least context the job needs: its prompt
    /// and one more position). The one place this default is decided: the runtime's planner,
    /// its session and the CLI's drafter sizing all ask here.
    pub fn default_n_ctx(&self, needed: usize) -> usize {
        self.n_ctx_train.clamp(1, DEFAULT_CTX_MAX).max(needed)
    }

    /// The context of a run that asked for `asked` (`None`: [`ModelConfig::default_n_ctx`]).
    pub fn n_ctx_or_default(&self, asked: Option<usize>, needed: usize) -> usize {
        asked.unwrap_or_else(|| self.default_n_ctx(needed))
    }

    pub fn from_gguf(f: &GgufFile) -> Result<ModelConfig, ModelError> {
        let arch_name =
            f.architecture().ok_or(ModelError::MissingKey("general.architecture".into()))?;
        let arch = Arch::from_name(arch_name)
            .ok_or_else(|| ModelError::UnsupportedArch(arch_name.to_string()))?;
        let spec = arch.spec();
        let key = |k: &str| format!("{arch_name}.{k}");
        let req = |k: &str| -> Result<usize, ModelError> {
            let full = key(k);
            let v = f.get_u64(&full).ok_or_else(|| ModelError::MissingKey(full.clone()))?;
            usize::try_from(v)
                .ok()
                .filter(|&v| v > 0 && v < (1 << 31))
                .ok_or(ModelError::BadValue { key: full, value: v.to_string() })
        };
        let opt_f = |k: &str| f.get_f64(&key(k)).map(|v| v as f32);

        let n_embd = req("embedding_length")?;
        let n_layer = req("block_count")?;
        let n_head = req("attention.head_count")?;
        let n_head_kv = match f.get_u64(&key("attention.head_count_kv")) {
            Some(_) => req("attention.head_count_kv")?,
            None => n_head,
        };
        if n_head % n_head_kv != 0 {
            return Err(ModelError::BadValue {
                key: key("attention.head_count_kv"),
                value: format!("{n_head_kv} (does not divide head_count {n_head})"),
            });
        }
        let head_dim = match f.get_u64(&key("attention.key_length")) {
            Some(_) => req("attention.key_length")?,
            None => n_embd / n_head,
        };
        let head_dim_v = match f.get_u64(&key("attention.value_length")) {
            Some(_) => req("attention.value_length")?,
            None => head_dim,
        };
        for (k, v, max) in [
            ("block_count", n_layer, MAX_LAYERS),
            ("attention.head_count", n_head, MAX_HEADS),
            ("attention.key_length", head_dim, MAX_HEAD_DIM),
            ("attention.value_length", head_dim_v, MAX_HEAD_DIM),
        ] {
            if v > max {
                return Err(ModelError::BadValue {
                    key: key(k),
                    value: format!("{v} (more than {max}: no real model has that many)"),
                });
            }
        }
        if head_dim_v != head_dim {
            return Err(ModelError::Unsupported(format!(
                "value head size {head_dim_v} differs from key head size {head_dim}"
            )));
        }
        let n_ff = req("feed_forward_length")?;
        let n_rot = match f.get_u64(&key("rope.dimension_count")) {
            Some(_) => req("rope.dimension_count")?,
            None => head_dim,
        };
        if n_rot > head_dim || n_rot % 2 != 0 {
            return Err(ModelError::BadValue {
                key: key("rope.dimension_count"),
                value: n_rot.to_string(),
            });
        }
        let n_ctx_train = f.get_u64(&key("context_length")).unwrap_or(4096) as usize;
        let rms_eps = opt_f("attention.layer_norm_rms_epsilon").unwrap_or(1e-5);
        let rope_base = opt_f("rope.freq_base").unwrap_or(10000.0);
        let rope_base_swa =
            opt_f("rope.freq_base_swa").unwrap_or(spec.rope_base_swa_default.unwrap_or(rope_base));
        let rope_freq_scale = match f.get_str(&key("rope.scaling.type")) {
            None | Some("none") => 1.0,
            Some("linear") => {
                let factor = opt_f("rope.scaling.factor").unwrap_or(1.0);
                if factor.is_nan() || factor <= 0.0 {
                    return Err(ModelError::BadValue { key: key("rope.scaling.factor"), value: factor.to_string() });
                }
                1.0 / factor
            }
            Some(other) => return Err(ModelError::Unsupported(format!("rope scaling type {other:?} (snug supports none and linear; llama3-style scaling comes from the rope_freqs tensor)"))),
        };
        let window =
            f.get_u64(&key("attention.sliding_window")).map(|v| v as usize).filter(|&w| w > 0);
        let n_vocab = f
            .get_array("tokenizer.ggml.tokens")
            .map(|a| a.len())
            .or_else(|| f.get_u64(&key("vocab_size")).map(|v| v as usize))
            .ok_or_else(|| ModelError::MissingKey("tokenizer.ggml.tokens".into()))?;

        let attn_scale = match spec.attn_scale_rule {
            crate::arch::AttnScale::InvSqrtHeadDim => 1.0 / (head_dim as f32).sqrt(),
            crate::arch::AttnScale::GemmaLarge { n_layer_27b } if n_layer == n_layer_27b => {
                1.0 / ((n_embd / n_head) as f32).sqrt()
            }
            crate::arch::AttnScale::GemmaLarge { .. } => 1.0 / (head_dim as f32).sqrt(),
        };
        let softcap = |k: &str| opt_f(k).filter(|&c| c > 0.0);
        let attn_softcap = if spec.softcapping { softcap("attn_logit_softcapping") } else { None };
        let final_softcap =
            if spec.softcapping { softcap("final_logit_softcapping") } else { None };
        let embd_scale = if spec.scale_embd { (n_embd as f32).sqrt() } else { 1.0 };

        let rope_attn_factor = opt_f("rope.scaling.attn_factor").unwrap_or(1.0);
        if !(rope_attn_factor.is_finite() && rope_attn_factor > 0.0) {
            return Err(ModelError::BadValue {
                key: key("rope.scaling.attn_factor"),
                value: rope_attn_factor.to_string(),
            });
        }
        let n_ctx_orig = f
            .get_u64(&key("rope.scaling.original_context_length"))
            .map_or(n_ctx_train, |v| v as usize);
        let moe = match spec.moe {
            None => None,
            Some(m) => {
                let n_expert = req("expert_count")?;
                let n_expert_used = req("expert_used_count")?;
                if n_expert_used > n_expert || n_expert > 4096 {
                    return Err(ModelError::BadValue {
                        key: key("expert_used_count"),
                        value: format!("{n_expert_used} of {n_expert} experts"),
                    });
                }
                let n_ff_exp = match f.get_u64(&key("expert_feed_forward_length")) {
                    Some(_) => req("expert_feed_forward_length")?,
                    None => n_ff / n_expert_used,
                };
                let gating = match f.get_u64(&key("expert_gating_func")) {
                    None => m.gating,
                    Some(1) => Gating::Softmax,
                    Some(2) => Gating::Sigmoid,
                    Some(v) => {
                        return Err(ModelError::Unsupported(format!(
                            "expert gating function {v} (snug supports 1 softmax and 2 sigmoid)"
                        )))
                    }
                };
                Some(MoeConfig {
                    n_expert,
                    n_expert_used,
                    n_ff_exp,
                    gating,
                    norm_weights: f.get_bool(&key("expert_weights_norm")).unwrap_or(m.norm_weights),
                    weights_scale: opt_f("expert_weights_scale")
                        .filter(|&v| v != 0.0)
                        .unwrap_or(1.0),
                    // llama.cpp: 0 or absent means the dense width.
                    n_ff_shexp: match (
                        m.shared_expert,
                        f.get_u64(&key("expert_shared_feed_forward_length")),
                    ) {
                        (false, _) => 0,
                        (true, Some(0) | None) => n_ff,
                        (true, Some(_)) => req("expert_shared_feed_forward_length")?,
                    },
                })
            }
        };

        let layers = (0..n_layer)
            .map(|il| {
                let swa = window.is_some() && spec.swa_pattern.is_swa(il);
                LayerAttn {
                    window: if swa { window } else { None },
                    rope_base: if swa { rope_base_swa } else { rope_base },
                    rope_freq_scale: if swa { 1.0 } else { rope_freq_scale },
                    rope: spec.uses_rope(il),
                }
            })
            .collect();

        Ok(ModelConfig {
            arch,
            spec,
            name: f.get_str("general.name").unwrap_or(arch_name).to_string(),
            n_vocab,
            n_embd,
            n_layer,
            n_head,
            n_head_kv,
            head_dim,
            head_dim_v,
            n_ff,
            n_rot,
            n_ctx_train,
            rms_eps,
            attn_scale,
            attn_softcap,
            final_softcap,
            embd_scale,
            rope_attn_factor,
            n_ctx_orig,
            layers,
            moe,
            pooling: f.get_u64(&key("pooling_type")).and_then(Pooling::from_gguf),
        })
    }

    /// Width of one token's keys (or values) in one layer: n_head_kv × head_dim.
    pub fn kv_dim(&self) -> usize {
        self.n_head_kv * self.head_dim
    }

    pub fn q_dim(&self) -> usize {
        self.n_head * self.head_dim
    }

    /// Widest FFN hidden layer a token passes through: `n_ff`, or one expert's for a
    /// mixture of experts (whose `feed_forward_length` is a dense width no layer has).
    pub fn ff_dim(&self) -> usize {
        self.moe.map_or(self.n_ff, |m| m.n_ff_exp)
    }
}

#[cfg(test)]
mod tests {
    use gguf::{Array, GgufFile, GgufWriter, StrArray, Value};

    use super::*;

    fn header(n_layer: u32, head_dim: u32) -> GgufFile {
        let mut tokens = StrArray::default();
        tokens.try_push("a").expect("fits");
        let mut w = GgufWriter::new(Vec::new());
        w.add_kv("general.architecture", Value::String("llama".into()))
            .add_kv("llama.embedding_length", Value::U32(256))
            .add_kv("llama.block_count", Value::U32(n_layer))
            .add_kv("llama.attention.head_count", Value::U32(4))
            .add_kv("llama.attention.key_length", Value::U32(head_dim))
            .add_kv("llama.attention.value_length", Value::U32(head_dim))
            .add_kv("llama.feed_forward_length", Value::U32(512))
            .add_kv("tokenizer.ggml.tokens", Value::Array(Array::String(tokens)));
        w.write_header().expect("header");
        GgufFile::from_bytes(w.finish().expect("written")).expect("parses")
    }

    #[test]
    fn a_header_declaring_more_layers_or_channels_than_any_model_is_refused() {
        if let Err(e) = ModelConfig::from_gguf(&header(2, 64)) {
            panic!("a sane header is refused: {e}");
        }
        // Fuzz finding: 2^31 - 1 layers made a per-layer table of that length.
        let e = ModelConfig::from_gguf(&header((1 << 31) - 1, 64)).unwrap_err().to_string();
        assert!(e.contains("block_count") && e.contains("no real model"), "{e}");
        let e = ModelConfig::from_gguf(&header(2, 1 << 20)).unwrap_err().to_string();
        assert!(e.contains("key_length"), "{e}");
    }
}
