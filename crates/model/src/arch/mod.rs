//! The supported architectures. Each one is a file holding one [`ArchSpec`] row: how it differs
//! from the others is data (rope style, norms, activation, sliding-window pattern, soft-capping),
//! read by the single forward pass in `forward.rs`. Adding an architecture = one file + one
//! variant here; the exhaustive matches below make the compiler list every place to touch.

mod gemma2;
mod gemma3;
mod llama;
mod phi3;
mod qwen2;
mod qwen2moe;
mod qwen3;
mod qwen3moe;
mod smollm3;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    Llama,
    Qwen2,
    Qwen2Moe,
    Gemma2,
    Gemma3,
    Phi3,
    Qwen3,
    Qwen3Moe,
    SmolLM3,
}

/// How rotary embeddings pair up the dimensions of a head.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeStyle {
    /// Adjacent pairs (2i, 2i+1) — llama.cpp's `LLAMA_ROPE_TYPE_NORM` (Llama, Mistral).
    Norm,
    /// Halves (i, i + n_rot/2) — `LLAMA_ROPE_TYPE_NEOX` (Qwen2, Gemma, Phi-3).
    Neox,
}

/// Feed-forward gate activation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    /// SwiGLU: silu(gate) * up.
    Silu,
    /// GeGLU with the tanh approximation of GELU: gelu(gate) * up.
    GeluTanh,
}

/// Which layers use the sliding window (when the model has one).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SwaPattern {
    /// No layer does.
    None,
    /// Every layer does.
    All,
    /// Of each group of `n` layers, the first `n - 1` do and the last is global
    /// (llama.cpp's `set_swa_pattern(n)`: gemma2 n = 2, gemma3 n = 6).
    LastOfEachIsGlobal(usize),
}

impl SwaPattern {
    pub fn is_swa(self, il: usize) -> bool {
        match self {
            SwaPattern::None => false,
            SwaPattern::All => true,
            SwaPattern::LastOfEachIsGlobal(n) => il % n < n - 1,
        }
    }
}

/// How the attention score scale is chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttnScale {
    /// 1 / sqrt(head_dim).
    InvSqrtHeadDim,
    /// Gemma: 1 / sqrt(n_embd / n_head) for the 27B model (identified by its layer count, as
    /// llama.cpp does), else 1 / sqrt(head_dim).
    GemmaLarge { n_layer_27b: usize },
}

/// How a mixture-of-experts router turns its logits into expert probabilities.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gating {
    /// Softmax over all experts, then top-k (Qwen3-MoE, Mixtral).
    Softmax,
    /// Independent sigmoids, then top-k (DeepSeek-V3 style).
    Sigmoid,
}

/// An architecture's mixture-of-experts defaults (the file's keys override them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MoeSpec {
    pub gating: Gating,
    /// Renormalise the chosen experts' weights to sum to 1 (`expert_weights_norm`).
    pub norm_weights: bool,
    /// Every layer also has a shared expert (`ffn_{gate,up,down}_shexp`, gated per token by
    /// the sigmoid of `ffn_gate_inp_shexp`), added to the routed experts' sum.
    pub shared_expert: bool,
}

/// One architecture's row of differences.
#[derive(Clone, Copy, Debug)]
pub struct ArchSpec {
    pub name: &'static str,
    pub rope_style: RopeStyle,
    pub activation: Activation,
    /// Q, K and V come from one `attn_qkv` matrix (rows: Q | K | V).
    pub fused_qkv: bool,
    /// Gate and up come from one `ffn_up` matrix (rows: gate | up).
    pub fused_gate_up: bool,
    /// Per-head RMSNorm on q and k before RoPE (`attn_q_norm`, `attn_k_norm`).
    pub qk_norm: bool,
    /// RMSNorm on the attention and FFN outputs before the residual add.
    pub post_norms: bool,
    /// Token embeddings multiplied by sqrt(n_embd).
    pub scale_embd: bool,
    /// Reads `attn_logit_softcapping` / `final_logit_softcapping`.
    pub softcapping: bool,
    pub swa_pattern: SwaPattern,
    /// RoPE base for sliding-window layers when the file does not say (`rope.freq_base_swa`).
    pub rope_base_swa_default: Option<f32>,
    pub attn_scale_rule: AttnScale,
    /// Every `n`-th layer (`il % n == n - 1`) skips RoPE (SmolLM3's NoPE layers).
    pub no_rope_every: Option<usize>,
    /// The FFN is a mixture of experts (`ffn_gate_inp`, `ffn_{gate,up,down}_exps`).
    pub moe: Option<MoeSpec>,
    /// Which of quantized keys and values are Hadamard-rotated by default (`kv::rotate`);
    /// chosen per architecture from perplexity and KL measurements (BENCHMARKS.md). Values
    /// only on every architecture measured (gemma3, qwen2): rotating 4-bit per-channel keys
    /// costs perplexity.
    pub kv_rotate: crate::params::KvRotate,
}

impl ArchSpec {
    /// Whether layer `il` rotates q and k (all but SmolLM3's NoPE layers do).
    pub fn uses_rope(&self, il: usize) -> bool {
        self.no_rope_every.is_none_or(|n| il % n != n - 1)
    }
}

impl Arch {
    /// Every supported architecture.
    pub const ALL: [Arch; 9] = [
        Arch::Llama,
        Arch::Qwen2,
        Arch::Qwen2Moe,
        Arch::Gemma2,
        Arch::Gemma3,
        Arch::Phi3,
        Arch::Qwen3,
        Arch::Qwen3Moe,
        Arch::SmolLM3,
    ];

    pub fn from_name(name: &str) -> Option<Arch> {
        Some(match name {
            "llama" => Arch::Llama,
            "qwen2" => Arch::Qwen2,
            "qwen2moe" => Arch::Qwen2Moe,
            "gemma2" => Arch::Gemma2,
            "gemma3" => Arch::Gemma3,
            "phi3" => Arch::Phi3,
            "qwen3" => Arch::Qwen3,
            "qwen3moe" => Arch::Qwen3Moe,
            "smollm3" => Arch::SmolLM3,
            _ => return None,
        })
    }

    pub fn spec(self) -> ArchSpec {
        match self {
            Arch::Llama => llama::SPEC,
            Arch::Qwen2 => qwen2::SPEC,
            Arch::Qwen2Moe => qwen2moe::SPEC,
            Arch::Gemma2 => gemma2::SPEC,
            Arch::Gemma3 => gemma3::SPEC,
            Arch::Phi3 => phi3::SPEC,
            Arch::Qwen3 => qwen3::SPEC,
            Arch::Qwen3Moe => qwen3moe::SPEC,
            Arch::SmolLM3 => smollm3::SPEC,
        }
    }

    pub fn name(self) -> &'static str {
        self.spec().name
    }
}

/// The plain pre-norm transformer most architectures start from.
const BASE: ArchSpec = ArchSpec {
    name: "",
    rope_style: RopeStyle::Norm,
    activation: Activation::Silu,
    fused_qkv: false,
    fused_gate_up: false,
    qk_norm: false,
    post_norms: false,
    scale_embd: false,
    softcapping: false,
    swa_pattern: SwaPattern::None,
    rope_base_swa_default: None,
    attn_scale_rule: AttnScale::InvSqrtHeadDim,
    no_rope_every: None,
    moe: None,
    kv_rotate: crate::params::KvRotate::V,
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gemma3_has_five_local_layers_to_one_global() {
        let p = Arch::Gemma3.spec().swa_pattern;
        let swa: Vec<bool> = (0..12).map(|il| p.is_swa(il)).collect();
        assert_eq!(swa, [true, true, true, true, true, false, true, true, true, true, true, false]);
    }

    #[test]
    fn gemma2_alternates_starting_with_local() {
        let p = Arch::Gemma2.spec().swa_pattern;
        assert!(p.is_swa(0) && !p.is_swa(1) && p.is_swa(2));
    }

    #[test]
    fn smollm3_skips_rope_on_every_fourth_layer() {
        let s = Arch::SmolLM3.spec();
        let nope: Vec<usize> = (0..12).filter(|&il| !s.uses_rope(il)).collect();
        assert_eq!(nope, [3, 7, 11]);
        assert!((0..12).all(|il| Arch::Qwen3.spec().uses_rope(il)));
    }

    #[test]
    fn unknown_architectures_are_rejected() {
        assert_eq!(Arch::from_name("mamba"), None);
        for a in Arch::ALL {
            assert_eq!(Arch::from_name(a.name()), Some(a));
        }
    }
}
