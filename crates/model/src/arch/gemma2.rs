//! Gemma 2: embeddings × sqrt(n_embd), GeGLU, RMSNorm after attention and FFN as well as
//! before, attention and final logit soft-capping, sliding window on every other layer.

use super::{Activation, ArchSpec, AttnScale, RopeStyle, SwaPattern, BASE};

pub const SPEC: ArchSpec = ArchSpec {
    name: "gemma2",
    rope_style: RopeStyle::Neox,
    activation: Activation::GeluTanh,
    post_norms: true,
    scale_embd: true,
    softcapping: true,
    swa_pattern: SwaPattern::LastOfEachIsGlobal(2),
    attn_scale_rule: AttnScale::GemmaLarge { n_layer_27b: 46 },
    ..BASE
};
