//! Phi-3: fused `attn_qkv` (rows Q | K | V) and fused `ffn_up` (rows gate | up), NEOX RoPE;
//! every layer uses the sliding window when the file declares one.

use super::{ArchSpec, RopeStyle, SwaPattern, BASE};

pub const SPEC: ArchSpec = ArchSpec {
    name: "phi3",
    rope_style: RopeStyle::Neox,
    fused_qkv: true,
    fused_gate_up: true,
    swa_pattern: SwaPattern::All,
    ..BASE
};
