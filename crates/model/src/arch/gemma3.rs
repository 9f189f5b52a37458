//! Gemma 3: Gemma 2 without soft-capping, plus per-head RMSNorm on q and k; five sliding-window
//! layers to one global, the local layers with their own RoPE base (10,000 unless the file says).

use super::{Activation, ArchSpec, AttnScale, RopeStyle, SwaPattern, BASE};

pub const SPEC: ArchSpec = ArchSpec {
    name: "gemma3",
    rope_style: RopeStyle::Neox,
    activation: Activation::GeluTanh,
    qk_norm: true,
    post_norms: true,
    scale_embd: true,
    swa_pattern: SwaPattern::LastOfEachIsGlobal(6),
    rope_base_swa_default: Some(10000.0),
    attn_scale_rule: AttnScale::GemmaLarge { n_layer_27b: 62 },
    ..BASE
};
