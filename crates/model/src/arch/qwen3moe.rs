//! Qwen3 mixture of experts: Qwen3's attention, and in every layer a softmax router choosing
//! `expert_used_count` of `expert_count` SwiGLU experts, their weights renormalised to sum to 1
//! (llama.cpp hard-wires that for qwen3moe; the file's `expert_weights_norm` may say otherwise).
//! No shared expert.

use super::{ArchSpec, Gating, MoeSpec, RopeStyle, BASE};

pub const SPEC: ArchSpec = ArchSpec {
    name: "qwen3moe",
    rope_style: RopeStyle::Neox,
    qk_norm: true,
    moe: Some(MoeSpec { gating: Gating::Softmax, norm_weights: true, shared_expert: false }),
    ..BASE
};
