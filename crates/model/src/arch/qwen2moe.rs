//! Qwen1.5-MoE / Qwen2-MoE: Qwen2's attention (q/k/v biases, NEOX RoPE), and in every layer a
//! softmax router choosing `expert_used_count` of `expert_count` SwiGLU experts, their weights
//! used as they are (llama.cpp does not renormalise them for qwen2moe), plus a shared SwiGLU
//! expert every token takes, weighed by the sigmoid of its own one-row gate.

use super::{ArchSpec, Gating, MoeSpec, RopeStyle, BASE};

pub const SPEC: ArchSpec = ArchSpec {
    name: "qwen2moe",
    rope_style: RopeStyle::Neox,
    moe: Some(MoeSpec { gating: Gating::Softmax, norm_weights: false, shared_expert: true }),
    ..BASE
};
