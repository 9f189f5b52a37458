//! The model shapes synth knows: every hyper-parameter of a real checkpoint of that name (its
//! Hugging Face `config.json`, as llama.cpp's `convert_hf_to_gguf.py` writes it), with the
//! defaults of its family.

/// The architectures synth writes (llama.cpp's `general.architecture` names).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    Llama,
    Qwen2,
    /// Qwen2 with a mixture-of-experts FFN and a shared expert (`ffn_{gate,up,down}_shexp`,
    /// gated by `ffn_gate_inp_shexp`).
    Qwen2Moe,
    /// RMSNorm after attention and FFN too (`post_attention_norm`, `post_ffw_norm`).
    Gemma2,
    /// Gemma 2's layout plus per-head q/k norms (`attn_q_norm`, `attn_k_norm`).
    Gemma3,
    /// Fused `attn_qkv` (rows Q | K | V) and `ffn_up` (rows gate | up); Phi-4-mini adds
    /// partial rotary and LongRoPE factors.
    Phi3,
    /// Qwen2 without biases, with per-head q/k norms.
    Qwen3,
    /// Qwen3 with a mixture-of-experts FFN (`ffn_gate_inp`, `ffn_{gate,up,down}_exps`).
    Qwen3Moe,
    /// Llama with every fourth layer without RoPE (fixed by the architecture, no key).
    SmolLM3,
}

impl Arch {
    pub fn name(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Qwen2 => "qwen2",
            Arch::Qwen2Moe => "qwen2moe",
            Arch::Gemma2 => "gemma2",
            Arch::Gemma3 => "gemma3",
            Arch::Phi3 => "phi3",
            Arch::Qwen3 => "qwen3",
            Arch::Qwen3Moe => "qwen3moe",
            Arch::SmolLM3 => "smollm3",
        }
    }

    /// Per-head RMSNorm on q and k (`attn_q_norm`, `attn_k_norm`).
    pub fn qk_norm(self) -> bool {
        matches!(self, Arch::Gemma3 | Arch::Qwen3 | Arch::Qwen3Moe)
    }

    pub fn post_norms(self) -> bool {
        matches!(self, Arch::Gemma2 | Arch::Gemma3)
    }
}

/// A model shape: every hyper-parameter a real checkpoint of that name has.
#[derive(Clone, Debug, PartialEq)]
pub struct Shape {
    pub name: &'static str,
    pub arch: Arch,
    pub n_layer: usize,
    pub n_embd: usize,
    pub n_ff: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    /// Head size when it is not `n_embd / n_head` (gemma: 256), written as
    /// `attention.key_length` / `value_length`.
    pub key_length: Option<usize>,
    /// The real vocabulary size: the tokenizer's is cut or padded to it. `None`: the tokenizer's.
    pub n_vocab: Option<usize>,
    /// q/k/v projections carry biases (qwen2).
    pub qkv_bias: bool,
    /// No `output.weight`: the output projection is the token embedding.
    pub tied_embd: bool,
    pub n_ctx_train: usize,
    pub rope_freq_base: f32,
    pub rms_eps: f32,
    /// Llama 3.1 rope scaling: `(factor, low_freq_factor, high_freq_factor, original n_ctx)`,
    /// written as the `rope_freqs.weight` table llama.cpp's converter makes.
    pub llama3_rope: Option<(f32, f32, f32, usize)>,
    /// Linear rope scaling factor of the global layers (gemma-3 4B and larger: 8).
    pub rope_linear: Option<f32>,
    /// `attention.sliding_window`; which layers use it is the architecture's pattern.
    pub sliding_window: Option<usize>,
    /// `(attn_logit_softcapping, final_logit_softcapping)` (gemma2).
    pub softcaps: Option<(f32, f32)>,
    /// Dimensions of a head RoPE rotates when not all (Phi-4-mini: 96 of 128).
    pub n_rot: Option<usize>,
    /// LongRoPE (Phi-3.5/4): the original training context, written with
    /// `rope_factors_long`/`rope_factors_short` and the attention factor the converter derives.
    pub longrope_orig_ctx: Option<usize>,
    /// Mixture of experts: `(expert_count, expert_used_count, expert_feed_forward_length)`.
    pub moe: Option<(usize, usize, usize)>,
    /// The shared expert's width (`expert_shared_feed_forward_length`, qwen2moe).
    pub n_ff_shexp: Option<usize>,
}

impl Shape {
    pub fn head_dim(&self) -> usize {
        self.key_length.unwrap_or(self.n_embd / self.n_head)
    }

    /// `rope.dimension_count`.
    pub fn n_rot(&self) -> usize {
        self.n_rot.unwrap_or(self.head_dim())
    }

    /// LongRoPE's attention factor, as llama.cpp's converter computes it:
    /// `sqrt(1 + ln(n_ctx_train / orig) / ln(orig))`.
    pub fn longrope_attn_factor(&self) -> Option<f32> {
        let orig = self.longrope_orig_ctx? as f64;
        let scale = self.n_ctx_train as f64 / orig;
        Some(if scale > 1.0 { (1.0 + scale.ln() / orig.ln()).sqrt() as f32 } else { 1.0 })
    }
}

/// A shape with the defaults of its family: qwen2 has qkv biases and rope base 1e6; llama 3.x has
/// rope base 5e5 and llama3 rope scaling; the others start plain and are completed in [`SHAPES`].
#[allow(clippy::too_many_arguments)] // one row of the table below, in its column order
const fn family(
    arch: Arch,
    name: &'static str,
    n_layer: usize,
    n_embd: usize,
    n_ff: usize,
    n_head: usize,
    n_head_kv: usize,
    n_ctx_train: usize,
) -> Shape {
    let qwen = matches!(arch, Arch::Qwen2 | Arch::Qwen2Moe);
    let qwen3 = matches!(arch, Arch::Qwen3 | Arch::Qwen3Moe);
    let llama = matches!(arch, Arch::Llama);
    let gemma = matches!(arch, Arch::Gemma2 | Arch::Gemma3);
    Shape {
        name,
        arch,
        n_layer,
        n_embd,
        n_ff,
        n_head,
        n_head_kv,
        key_length: if gemma { Some(256) } else { None },
        n_vocab: None,
        qkv_bias: qwen,
        tied_embd: gemma,
        n_ctx_train,
        rope_freq_base: match arch {
            Arch::Qwen2 | Arch::Qwen2Moe | Arch::Gemma3 | Arch::Qwen3 | Arch::Qwen3Moe => {
                1_000_000.0
            }
            Arch::SmolLM3 => 5_000_000.0,
            Arch::Llama => 500_000.0,
            _ => 10_000.0,
        },
        rms_eps: if qwen || qwen3 || gemma || matches!(arch, Arch::SmolLM3) { 1e-6 } else { 1e-5 },
        llama3_rope: if llama { Some((8.0, 1.0, 4.0, 8192)) } else { None },
        rope_linear: None,
        sliding_window: match arch {
            Arch::Gemma2 => Some(4096),
            Arch::Gemma3 => Some(1024),
            _ => None,
        },
        softcaps: if matches!(arch, Arch::Gemma2) { Some((50.0, 30.0)) } else { None },
        n_rot: None,
        longrope_orig_ctx: None,
        moe: None,
        n_ff_shexp: None,
    }
}

/// Known shapes (HF `config.json` of the named checkpoint). The `tiny-*` ones are for fast tests
/// (row lengths are whole K-quant blocks).
pub const SHAPES: [Shape; 27] = [
    family(Arch::Qwen2, "qwen2.5-7b", 28, 3584, 18944, 28, 4, 32768),
    family(Arch::Llama, "llama-3.1-8b", 32, 4096, 14336, 32, 8, 131072),
    family(Arch::Qwen2, "qwen2.5-1.5b", 28, 1536, 8960, 12, 2, 32768),
    family(Arch::Qwen2, "qwen2.5-0.5b", 24, 896, 4864, 14, 2, 32768),
    // google/gemma-2-9b: head_dim 256, query_pre_attn_scalar 256, window 4096 on even layers.
    Shape {
        n_vocab: Some(256000),
        ..family(Arch::Gemma2, "gemma-2-9b", 42, 3584, 14336, 16, 8, 8192)
    },
    Shape {
        n_vocab: Some(256000),
        ..family(Arch::Gemma2, "gemma-2-2b", 26, 2304, 9216, 8, 4, 8192)
    },
    // google/gemma-3-4b-it text_config: rope 1e6 linear ×8 (global), 10,000 local; vocabulary
    // 262,144 (the converter's file; config.json's 262,208 counts the image tokens).
    Shape {
        n_vocab: Some(262144),
        rope_linear: Some(8.0),
        ..family(Arch::Gemma3, "gemma-3-4b", 34, 2560, 10240, 8, 4, 131072)
    },
    // meta-llama/Llama-3.2-3B: llama3 rope ×32, tied embedding, vocabulary 128,256.
    Shape {
        n_vocab: Some(128256),
        tied_embd: true,
        llama3_rope: Some((32.0, 1.0, 4.0, 8192)),
        ..family(Arch::Llama, "llama-3.2-3b", 28, 3072, 8192, 24, 8, 131072)
    },
    // microsoft/Phi-3-mini-4k-instruct: head 96, sliding window 2047, vocabulary 32,064.
    Shape {
        n_vocab: Some(32064),
        sliding_window: Some(2047),
        ..family(Arch::Phi3, "phi-3-mini", 32, 3072, 8192, 32, 32, 4096)
    },
    // mistralai/Mistral-7B-v0.3: rope 1e6, no sliding window, vocabulary 32,768.
    Shape {
        n_vocab: Some(32768),
        rope_freq_base: 1_000_000.0,
        llama3_rope: None,
        ..family(Arch::Llama, "mistral-7b", 32, 4096, 14336, 32, 8, 32768)
    },
    // Qwen/Qwen3-0.6B: head_dim 128 (not 1024 / 16), tied embedding, vocabulary 151,936.
    Shape {
        key_length: Some(128),
        n_vocab: Some(151936),
        tied_embd: true,
        ..family(Arch::Qwen3, "qwen3-0.6b", 28, 1024, 3072, 16, 8, 40960)
    },
    // Qwen/Qwen3-8B.
    Shape {
        key_length: Some(128),
        n_vocab: Some(151936),
        ..family(Arch::Qwen3, "qwen3-8b", 36, 4096, 12288, 32, 8, 40960)
    },
    // Qwen/Qwen3-30B-A3B: 128 experts of width 768, 8 used per token; head_dim 128.
    Shape {
        key_length: Some(128),
        n_vocab: Some(151936),
        moe: Some((128, 8, 768)),
        ..family(Arch::Qwen3Moe, "qwen3-30b-a3b", 48, 2048, 6144, 32, 4, 40960)
    },
    // Qwen/Qwen1.5-MoE-A2.7B: 60 experts of width 1,408, 4 used per token, not renormalised;
    // a shared expert of width 5,632; q/k/v biases; vocabulary 151,936.
    Shape {
        n_vocab: Some(151936),
        moe: Some((60, 4, 1408)),
        n_ff_shexp: Some(5632),
        n_ctx_train: 8192,
        ..family(Arch::Qwen2Moe, "qwen1.5-moe-a2.7b", 24, 2048, 5632, 16, 16, 8192)
    },
    // microsoft/Phi-4-mini-instruct: partial rotary 0.75 (96 of 128), LongRoPE from 4,096 to
    // 131,072, tied embedding, vocabulary 200,064; sliding_window 262,144 (llama.cpp ignores it).
    Shape {
        n_vocab: Some(200064),
        tied_embd: true,
        n_rot: Some(96),
        longrope_orig_ctx: Some(4096),
        sliding_window: Some(262144),
        ..family(Arch::Phi3, "phi-4-mini", 32, 3072, 8192, 24, 8, 131072)
    },
    // HuggingFaceTB/SmolLM3-3B: NoPE every fourth layer, rope 5e6, tied, vocabulary 128,256.
    Shape {
        n_vocab: Some(128256),
        tied_embd: true,
        ..family(Arch::SmolLM3, "smollm3-3b", 36, 2048, 11008, 16, 4, 65536)
    },
    family(Arch::Qwen2, "tiny-qwen2", 2, 256, 512, 4, 2, 2048),
    family(Arch::Llama, "tiny-llama", 2, 256, 512, 4, 2, 2048),
    Shape {
        softcaps: Some((50.0, 30.0)),
        ..family(Arch::Gemma2, "tiny-gemma2", 2, 256, 512, 2, 1, 2048)
    },
    Shape {
        sliding_window: Some(64),
        rope_linear: Some(8.0),
        ..family(Arch::Gemma3, "tiny-gemma3", 6, 256, 512, 2, 1, 2048)
    },
    Shape { sliding_window: Some(64), ..family(Arch::Phi3, "tiny-phi3", 2, 256, 512, 4, 4, 2048) },
    Shape { n_vocab: Some(300), ..family(Arch::Llama, "tiny-mistral", 2, 256, 512, 4, 2, 2048) },
    // Tiny twins of the new families, for the llama.cpp agreement tests (untied, so the output
    // alone can be scaled to peak the logits: `--output-std`).
    Shape { key_length: Some(64), ..family(Arch::Qwen3, "tiny-qwen3", 2, 256, 512, 4, 2, 2048) },
    Shape {
        key_length: Some(64),
        moe: Some((8, 4, 128)),
        ..family(Arch::Qwen3Moe, "tiny-qwen3moe", 2, 256, 1024, 4, 2, 2048)
    },
    Shape {
        moe: Some((8, 2, 128)),
        n_ff_shexp: Some(512),
        ..family(Arch::Qwen2Moe, "tiny-qwen2moe", 2, 256, 1024, 4, 2, 2048)
    },
    // LongRoPE from 256: a context of 512 or more takes the long factors.
    Shape {
        n_rot: Some(48),
        longrope_orig_ctx: Some(256),
        ..family(Arch::Phi3, "tiny-phi4", 2, 256, 512, 4, 2, 2048)
    },
    family(Arch::SmolLM3, "tiny-smollm3", 4, 256, 512, 4, 2, 2048),
];

pub fn shape(name: &str) -> Option<&'static Shape> {
    SHAPES.iter().find(|s| s.name == name)
}
