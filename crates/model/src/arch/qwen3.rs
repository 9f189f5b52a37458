//! Qwen3 (dense): Qwen2 without q/k/v biases, plus per-head RMSNorm on q and k before RoPE.

use super::{ArchSpec, RopeStyle, BASE};

pub const SPEC: ArchSpec =
    ArchSpec { name: "qwen3", rope_style: RopeStyle::Neox, qk_norm: true, ..BASE };
